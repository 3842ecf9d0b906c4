//! A mock `Verbs` provider and a client model for the RTRS server tests.
//!
//! The mock keeps registered memory in a `verbs::memory::Arena`, records
//! every call the server makes (accepts, rejects, posted sends and
//! receives, disconnects, destroys) and lets the test inject connection
//! events and completions. The client model plays the Linux client's part
//! over it: CON_REQs, INFO_REQ, RDMA WRITEs into chunks (checked against the
//! chunk's current rkey through the arena), IO_REQ immediates.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rtrs::server::{Admission, Event, IoToken, PathRequest, ReadData, Server, ServerConfig};
use rtrs::wire::{
    BufferDesc, ConnReq, Imm, ImmLayout, InfoReq, InfoRsp, ReadFlags, ReadMsg, Uuid, WriteMsg,
};
use verbs::memory::Arena;
use verbs::{
    AccessError, AccessFlags, AllocError, CmEvent, ConnId, ConnParams, ConnectError, Lkey, Memory,
    MemoryHandle, MemoryRegion, PostError, PrivateData, RecvWr, RegError, Rkey, SendOp, SendWr,
    Verbs, WcOpcode, WcStatus, WorkCompletion,
};

#[path = "../common/provider.rs"]
mod provider;
#[allow(unused_imports)] // each test binary uses a different subset
pub use provider::{InProvider, Lcg, PROVIDER_DEPTH};

/// An accept the server made.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub conn: ConnId,
    pub private_data: Vec<u8>,
    pub send_queue_depth: u16,
    pub receive_queue_depth: u16,
    pub rnr_retry_count: u8,
}

/// The mock provider.
pub struct MockVerbs {
    pub arena: Arena<Vec<u8>, 4096>,
    keys: Lcg,
    /// Every posted send, in order.
    pub sends: Vec<(ConnId, SendWr)>,
    /// Sends not yet completed (signaled or not), in order.
    pub outstanding: VecDeque<(ConnId, SendWr)>,
    /// Posted receives per connection.
    pub recvs: HashMap<ConnId, VecDeque<RecvWr>>,
    pub accepted: Vec<Accepted>,
    pub rejected: Vec<(ConnId, Vec<u8>)>,
    pub disconnected: Vec<ConnId>,
    pub destroyed: Vec<ConnId>,
    pub cm_events: VecDeque<CmEvent>,
    pub cq: VecDeque<WorkCompletion>,
    pub listening: Option<u16>,
    /// Make `post_send` fail with `QueueFull`.
    pub queue_full: bool,
    /// Connections created by requests and not destroyed.
    pub live: HashSet<ConnId>,
    /// Connections accepted and not disconnected.
    pub connected: HashSet<ConnId>,
    pub rekeys: usize,
    /// Revoke rkeys at once ([`Verbs::revoke_remote`], as the software
    /// HCA does); off, the mock is a provider that invalidates only
    /// through the send queue.
    pub revoke_now: bool,
    /// Rkeys revoked at once.
    pub revokes: usize,
}

impl MockVerbs {
    pub fn new(pool_bytes: usize) -> Self {
        Self {
            arena: Arena::new(vec![0; pool_bytes]),
            keys: Lcg(7),
            sends: Vec::new(),
            outstanding: VecDeque::new(),
            recvs: HashMap::new(),
            accepted: Vec::new(),
            rejected: Vec::new(),
            disconnected: Vec::new(),
            destroyed: Vec::new(),
            cm_events: VecDeque::new(),
            cq: VecDeque::new(),
            listening: None,
            queue_full: false,
            live: HashSet::new(),
            connected: HashSet::new(),
            rekeys: 0,
            revoke_now: false,
            revokes: 0,
        }
    }

    /// Completes every outstanding send successfully (signaled ones produce
    /// a completion).
    pub fn complete_sends(&mut self) {
        while let Some((conn, wr)) = self.outstanding.pop_front() {
            if wr.signaled {
                self.cq.push_back(WorkCompletion::new(
                    wr.wr_id,
                    conn,
                    wr.op.completion_opcode(),
                    WcStatus::Success,
                ));
            }
        }
    }

    /// Consumes a posted receive on `conn` for an RDMA WRITE WITH IMM.
    pub fn deliver_imm(&mut self, conn: ConnId, imm: u32) {
        let recv = self
            .recvs
            .get_mut(&conn)
            .and_then(VecDeque::pop_front)
            .expect("a posted receive");
        let mut wc = WorkCompletion::new(
            recv.wr_id,
            conn,
            WcOpcode::RecvRdmaWithImm,
            WcStatus::Success,
        );
        wc.imm = Some(imm);
        self.cq.push_back(wc);
    }

    /// Consumes a posted receive on `conn` with a SEND of `payload`.
    pub fn deliver_send(&mut self, conn: ConnId, payload: &[u8]) {
        let recv = self
            .recvs
            .get_mut(&conn)
            .and_then(VecDeque::pop_front)
            .expect("a posted receive");
        let status = match recv.sgl.as_slice().first() {
            Some(sge) if sge.len as usize >= payload.len() => {
                let region = self.arena.region(sge.lkey).expect("receive region");
                self.arena
                    .write(region.handle, sge.offset, payload)
                    .expect("receive write");
                WcStatus::Success
            }
            _ if payload.is_empty() => WcStatus::Success,
            _ => WcStatus::LocLenErr,
        };
        let mut wc = WorkCompletion::new(recv.wr_id, conn, WcOpcode::Recv, status);
        wc.byte_len = payload.len() as u32;
        self.cq.push_back(wc);
    }

    /// The bytes a send gathers.
    pub fn gather(&self, wr: &SendWr) -> Vec<u8> {
        if let SendOp::SendInline { data, .. } = &wr.op {
            return data.as_slice().to_vec();
        }
        let sgl = wr.op.sgl();
        let len: u32 = sgl.iter().map(|s| s.len).sum();
        let mut out = vec![0; len as usize];
        self.arena.gather_into(sgl, 0, &mut out).expect("gather");
        out
    }

    /// The bytes posted send number `index` gathers.
    pub fn gather_send(&self, index: usize) -> Vec<u8> {
        self.gather(&self.sends[index].1)
    }

    /// A peer RDMA WRITE into registered memory, checked like a responder.
    pub fn remote_write(&mut self, rkey: Rkey, addr: u64, bytes: &[u8]) -> Result<(), AccessError> {
        let target =
            self.arena
                .resolve_remote(rkey, addr, bytes.len() as u32, AccessFlags::REMOTE_WRITE)?;
        self.arena.write(target, 0, bytes)
    }

    /// Sends posted on `conn` since index `from`.
    pub fn sends_since(&self, from: usize) -> Vec<(ConnId, SendWr)> {
        self.sends[from..].to_vec()
    }

    /// Number of receives posted and not consumed on `conn`.
    pub fn posted_receives(&self, conn: ConnId) -> usize {
        self.recvs.get(&conn).map_or(0, VecDeque::len)
    }
}

impl Memory for MockVerbs {
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError> {
        let _mock = InProvider::enter();
        self.arena.with_slice(handle, offset, len, f)
    }

    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError> {
        let _mock = InProvider::enter();
        self.arena.with_slice_mut(handle, offset, len, f)
    }
}

impl Verbs for MockVerbs {
    fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError> {
        let _mock = InProvider::enter();
        self.arena.alloc(len, align)
    }

    fn free(&mut self, buffer: MemoryHandle) -> Result<(), RegError> {
        let _mock = InProvider::enter();
        self.arena.free(buffer)
    }

    fn reg_mr(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError> {
        let _mock = InProvider::enter();
        self.arena.register(buffer, access, &mut self.keys)
    }

    fn rekey(&mut self, lkey: Lkey) -> Result<Rkey, RegError> {
        let _mock = InProvider::enter();
        self.rekeys += 1;
        self.arena.rekey(lkey, &mut self.keys)
    }

    fn revoke_remote(&mut self, rkey: Rkey) -> Result<(), RegError> {
        let _mock = InProvider::enter();
        if !self.revoke_now {
            return Err(RegError::Unsupported);
        }
        self.revokes += 1;
        self.arena.invalidate(rkey)
    }

    fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), RegError> {
        let _mock = InProvider::enter();
        self.arena.deregister(lkey)
    }

    fn post_send(&mut self, conn: ConnId, requests: &[SendWr]) -> Result<(), PostError> {
        let _mock = InProvider::enter();
        if !self.live.contains(&conn) {
            return Err(PostError::UnknownConnection);
        }
        if self.queue_full {
            return Err(PostError::QueueFull);
        }
        for wr in requests {
            self.arena.check_sgl(wr.op.sgl(), AccessFlags::EMPTY)?;
        }
        for wr in requests {
            if let SendOp::LocalInv { rkey } = wr.op {
                self.arena
                    .invalidate(rkey)
                    .map_err(|_| PostError::InvalidKey)?;
            }
            self.sends.push((conn, wr.clone()));
            self.outstanding.push_back((conn, wr.clone()));
        }
        Ok(())
    }

    fn post_recv(&mut self, conn: ConnId, requests: &[RecvWr]) -> Result<(), PostError> {
        let _mock = InProvider::enter();
        if !self.live.contains(&conn) {
            return Err(PostError::UnknownConnection);
        }
        for wr in requests {
            self.arena
                .check_sgl(wr.sgl.as_slice(), AccessFlags::LOCAL_WRITE)?;
        }
        self.recvs
            .entry(conn)
            .or_default()
            .extend(requests.iter().cloned());
        Ok(())
    }

    fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize {
        let _mock = InProvider::enter();
        let mut count = 0;
        while count < out.len() {
            let Some(wc) = self.cq.pop_front() else { break };
            out[count] = wc;
            count += 1;
        }
        count
    }

    fn listen(&mut self, port: u16) -> Result<(), ConnectError> {
        let _mock = InProvider::enter();
        self.listening = Some(port);
        Ok(())
    }

    fn connect(
        &mut self,
        _remote: SocketAddr,
        _params: &ConnParams<'_>,
    ) -> Result<ConnId, ConnectError> {
        let _mock = InProvider::enter();
        Err(ConnectError::AddressUnsupported)
    }

    fn accept(&mut self, conn: ConnId, params: &ConnParams<'_>) -> Result<(), ConnectError> {
        let _mock = InProvider::enter();
        if !self.live.contains(&conn) {
            return Err(ConnectError::UnknownConnection);
        }
        self.accepted.push(Accepted {
            conn,
            private_data: params.private_data.to_vec(),
            send_queue_depth: params.send_queue_depth,
            receive_queue_depth: params.receive_queue_depth,
            rnr_retry_count: params.rnr_retry_count,
        });
        self.connected.insert(conn);
        Ok(())
    }

    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), ConnectError> {
        let _mock = InProvider::enter();
        if !self.live.remove(&conn) {
            return Err(ConnectError::UnknownConnection);
        }
        self.recvs.remove(&conn);
        self.rejected.push((conn, private_data.to_vec()));
        Ok(())
    }

    fn disconnect(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let _mock = InProvider::enter();
        if !self.connected.remove(&conn) {
            return Err(ConnectError::InvalidState);
        }
        self.disconnected.push(conn);
        self.cm_events.push_back(CmEvent::Disconnected { conn });
        Ok(())
    }

    fn destroy(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let _mock = InProvider::enter();
        if !self.live.remove(&conn) {
            return Err(ConnectError::UnknownConnection);
        }
        self.connected.remove(&conn);
        self.recvs.remove(&conn);
        self.cq.retain(|wc| wc.conn != conn);
        self.outstanding.retain(|(c, _)| *c != conn);
        self.destroyed.push(conn);
        Ok(())
    }

    fn poll_cm_event(&mut self) -> Option<CmEvent> {
        let _mock = InProvider::enter();
        self.cm_events.pop_front()
    }
}

/// The small configuration most tests use: qd 8, 16 KiB chunks.
pub fn small_config() -> ServerConfig {
    let mut config = ServerConfig::brick_default();
    config.queue_depth = 8;
    config.chunk_size = 16 * 1024;
    config.max_hdr_size = 4096;
    config.max_sessions = 2;
    config.max_paths_per_session = 2;
    config.max_connections_per_path = 4;
    config
}

/// Nanoseconds per second.
pub const SECOND: u64 = 1_000_000_000;

/// The harness's access rules: with no rule every path is admitted;
/// otherwise a path is admitted if a rule names its session and either no
/// address or the path's client address. Every question is recorded.
#[derive(Default)]
pub struct Policy {
    pub rules: Vec<(String, Option<IpAddr>)>,
    /// (name, client address, the path joins an open session).
    pub asked: Vec<(String, SocketAddr, bool)>,
}

impl Admission for Policy {
    fn admit(&mut self, path: &PathRequest<'_>) -> bool {
        self.asked
            .push((path.name.to_owned(), path.remote, path.joins.is_some()));
        self.rules.is_empty()
            || self.rules.iter().any(|(name, source)| {
                name == path.name && source.is_none_or(|ip| ip == path.remote.ip())
            })
    }
}

/// Server + its one mock port + a clock.
pub struct Harness {
    pub server: Server<MockVerbs>,
    /// The ports the server is lent (one).
    pub ports: [MockVerbs; 1],
    pub now: u64,
    /// What `settle` admits.
    pub policy: Policy,
    next_conn: u32,
}

impl Harness {
    pub fn new(config: ServerConfig) -> Self {
        Self::with_pool(config, 8 << 20)
    }

    pub fn with_pool(config: ServerConfig, pool: usize) -> Self {
        let mut server = Server::new(config).expect("config");
        let mut ports = [MockVerbs::new(pool)];
        server.start(&mut ports).expect("listen");
        Self {
            server,
            ports,
            now: 1,
            policy: Policy::default(),
            next_conn: 100,
        }
    }

    pub fn mock(&mut self) -> &mut MockVerbs {
        &mut self.ports[0]
    }

    /// Polls until idle (bounded).
    pub fn settle(&mut self) {
        for _ in 0..64 {
            if !self
                .server
                .poll(self.now, &mut self.ports, &mut self.policy)
            {
                break;
            }
        }
    }

    pub fn drain_events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.server.next_event()).collect()
    }

    /// Injects a connect request with `private_data` from the client
    /// address of its path uuid (10.0.<byte 12>.2); returns the new id.
    pub fn request(&mut self, private_data: &[u8]) -> ConnId {
        let source = Ipv4Addr::new(10, 0, private_data.get(12).copied().unwrap_or(0), 2);
        self.request_from(source, private_data)
    }

    /// Injects a connect request with `private_data` from `source`.
    pub fn request_from(&mut self, source: Ipv4Addr, private_data: &[u8]) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        let mock = self.mock();
        mock.live.insert(conn);
        mock.cm_events.push_back(CmEvent::ConnectRequest {
            conn,
            local: SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1), 1234)),
            remote: SocketAddr::from((source, 40000 + conn.0 as u16)),
            private_data: PrivateData::try_from_slice(private_data).unwrap(),
        });
        self.settle();
        conn
    }

    /// Delivers an INFO_REQ naming `name` on `conn` (a path's cid 0).
    pub fn info_req(&mut self, conn: ConnId, name: &str) {
        let mut info = vec![0u8; InfoReq::LEN];
        InfoReq { session_name: name }.emit(&mut info).unwrap();
        self.mock().deliver_send(conn, &info);
        self.settle();
    }

    /// Lets the mock finish every send and disconnect, then settles.
    pub fn drain(&mut self) {
        for _ in 0..4 {
            self.mock().complete_sends();
            self.settle();
        }
    }

    /// Whether `conn` was accepted.
    pub fn was_accepted(&self, conn: ConnId) -> bool {
        self.ports[0].accepted.iter().any(|a| a.conn == conn)
    }

    /// The errno of the reject of `conn`, if rejected.
    pub fn reject_errno(&self, conn: ConnId) -> Option<i16> {
        self.ports[0]
            .rejected
            .iter()
            .find(|(c, _)| *c == conn)
            .map(|(_, pd)| rtrs::wire::ConnRsp::parse(pd).expect("CONN_RSP").errno)
    }
}

/// A CON_REQ.
pub fn con_req(cid: u16, cid_num: u16, path: u8, session: u8, recon_cnt: u16) -> Vec<u8> {
    let req = ConnReq {
        version: rtrs::wire::VERSION,
        cid,
        cid_num,
        recon_cnt,
        path_uuid: Uuid([path; 16]),
        session_uuid: Uuid([session; 16]),
        first_conn: true,
    };
    let mut buf = vec![0; ConnReq::LEN];
    req.emit(&mut buf).unwrap();
    buf
}

/// The client side of one path.
pub struct ClientPath {
    pub conns: Vec<ConnId>,
    pub chunks: Vec<BufferDesc>,
    pub layout: ImmLayout,
    pub chunk_size: u32,
}

impl ClientPath {
    /// Connects `cid_num` connections, sends INFO_REQ, parses INFO_RSP.
    pub fn open(h: &mut Harness, cid_num: u16, path: u8, session: u8, name: &str) -> Self {
        Self::open_recon(h, cid_num, path, session, name, 1)
    }

    pub fn open_recon(
        h: &mut Harness,
        cid_num: u16,
        path: u8,
        session: u8,
        name: &str,
        recon_cnt: u16,
    ) -> Self {
        let conns: Vec<ConnId> = (0..cid_num)
            .map(|cid| {
                let conn = h.request(&con_req(cid, cid_num, path, session, recon_cnt));
                assert!(h.was_accepted(conn), "cid {cid} accepted");
                conn
            })
            .collect();
        let mut info = vec![0u8; InfoReq::LEN];
        InfoReq { session_name: name }.emit(&mut info).unwrap();
        let from = h.mock().sends.len();
        h.mock().deliver_send(conns[0], &info);
        h.settle();
        let sends = h.mock().sends_since(from);
        let (conn, wr) = sends
            .iter()
            .find(|(_, wr)| matches!(wr.op, SendOp::Send { imm: None, .. }))
            .expect("INFO_RSP sent")
            .clone();
        assert_eq!(conn, conns[0], "INFO_RSP on cid 0");
        let bytes = h.mock().gather(&wr);
        let config = *h.server.config();
        let rsp = InfoRsp::parse(&bytes).expect("INFO_RSP parses");
        rsp.check_layout(config.queue_depth, config.chunk_size)
            .expect("INFO_RSP layout");
        let chunks = (0..u32::from(config.queue_depth))
            .map(|id| rsp.chunk(config.chunk_size, id).unwrap())
            .collect();
        h.mock().complete_sends();
        h.settle();
        Self {
            conns,
            chunks,
            layout: ImmLayout::for_queue_depth(config.queue_depth).unwrap(),
            chunk_size: config.chunk_size,
        }
    }

    /// Writes `data || header || WRITE msg` into chunk `id` and sends the
    /// IO_REQ immediate on connection `cid`.
    pub fn write(&self, h: &mut Harness, cid: usize, id: u32, header: &[u8], data: &[u8]) {
        let mut bytes = data.to_vec();
        bytes.extend_from_slice(header);
        let mut msg = [0u8; 4];
        WriteMsg {
            usr_len: header.len() as u16,
        }
        .emit(&mut msg)
        .unwrap();
        bytes.extend_from_slice(&msg);
        let chunk = self.chunks[id as usize];
        h.mock()
            .remote_write(chunk.rkey, chunk.addr, &bytes)
            .expect("client write with the current rkey");
        let offset = (data.len() + header.len()) as u32;
        let imm = Imm::IoReq {
            payload: self.layout.join(id, offset).unwrap(),
        }
        .encode()
        .unwrap();
        h.mock().deliver_imm(self.conns[cid], imm);
    }

    /// Writes `header || READ msg` at chunk offset `len` and sends the IO_REQ.
    #[allow(clippy::too_many_arguments)] // mirrors the READ message fields
    pub fn read(
        &self,
        h: &mut Harness,
        cid: usize,
        id: u32,
        header: &[u8],
        len: u32,
        client_rkey: Rkey,
        need_inval: bool,
    ) {
        let mut bytes = header.to_vec();
        let mut msg = [0u8; 24];
        let n = ReadMsg {
            usr_len: header.len() as u16,
            flags: if need_inval {
                ReadFlags::NEED_INVAL
            } else {
                ReadFlags(0)
            },
            desc: Some(BufferDesc {
                addr: 0x7000_0000,
                rkey: client_rkey,
                len,
            }),
        }
        .emit(&mut msg)
        .unwrap();
        bytes.extend_from_slice(&msg[..n]);
        let chunk = self.chunks[id as usize];
        h.mock()
            .remote_write(chunk.rkey, chunk.addr + u64::from(len), &bytes)
            .expect("client write with the current rkey");
        let imm = Imm::IoReq {
            payload: self.layout.join(id, len + header.len() as u32).unwrap(),
        }
        .encode()
        .unwrap();
        h.mock().deliver_imm(self.conns[cid], imm);
    }
}

/// Runs the server until an `Io` event appears (completing LOCAL_INVs).
pub fn next_io(h: &mut Harness) -> Option<Event> {
    for _ in 0..4 {
        h.settle();
        let at = h
            .server
            .events()
            .position(|e| matches!(e, Event::Io { .. }));
        if let Some(at) = at {
            let events = h.drain_events();
            return events.into_iter().nth(at);
        }
        h.mock().complete_sends();
    }
    None
}

/// The token of an `Io` event.
pub fn token(event: &Event) -> IoToken {
    match event {
        Event::Io { token, .. } => *token,
        other => panic!("not an Io event: {other:?}"),
    }
}

/// Completes a write successfully.
pub fn complete_ok(h: &mut Harness, token: IoToken) {
    let now = h.now;
    h.server
        .complete_io(token, 0, ReadData::Chunk, now, &mut h.ports)
        .expect("complete");
}

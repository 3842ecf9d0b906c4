//! A loopback `Verbs` pair for client-against-server tests.
//!
//! Two providers share one fabric: side 0 is the client, side 1 the server.
//! Each side has its own `verbs::memory::Arena`. Work requests posted on one
//! side queue on the connection and are executed by [`Fabric::run`] against
//! the peer's memory, checked like an RC responder (rkey, bounds, access),
//! in order, stalling (RNR) while the peer has no receive posted. Both sides
//! get their completions; CM events (request, REP, REJ, DREQ) are plumbed
//! between them. Faults: [`Fabric::kill`] disconnects every connection of a
//! server address, [`Fabric::blackhole`] silently stops them (and refuses
//! new connects), [`Fabric::corrupt_next`] lets a test rewrite what the
//! server sends.

#![allow(dead_code)] // each test binary uses a different subset

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;

use rtrs::client::{Client, ClientConfig, Event as ClientEvent};
use rtrs::server::{AdmitAll, Event as ServerEvent, IoDirection, ReadData, Server, ServerConfig};
use verbs::memory::Arena;
use verbs::{
    AccessError, AccessFlags, AllocError, CmEvent, ConnId, ConnParams, ConnectError, Lkey, Memory,
    MemoryHandle, MemoryRegion, PostError, PrivateData, RecvWr, RegError, RejectReason, Rkey,
    SendOp, SendWr, Verbs, WcOpcode, WcStatus, WorkCompletion,
};

#[path = "../common/provider.rs"]
mod provider;
#[allow(unused_imports)] // each test binary uses a different subset
pub use provider::{InProvider, Lcg, PROVIDER_DEPTH};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    Requested,
    Established,
    Error,
}

struct Conn {
    side: usize,
    id: ConnId,
    peer: Option<ConnId>,
    state: ConnState,
    sq: VecDeque<SendWr>,
    rq: VecDeque<RecvWr>,
    /// The server address of this connection (either side).
    server_ip: IpAddr,
    /// REQ private data (client side).
    req: Vec<u8>,
}

struct Side {
    arena: Arena<Vec<u8>, 4096>,
    keys: Lcg,
    cq: VecDeque<WorkCompletion>,
    cm: VecDeque<CmEvent>,
    next_conn: u32,
}

/// A rewrite applied to server → client traffic: `(send op) -> send op`.
pub type Corruptor = Box<dyn FnMut(&mut SendOp, &mut Vec<u8>) -> bool>;

/// The shared fabric.
pub struct Inner {
    sides: [Side; 2],
    conns: Vec<Conn>,
    listening: Option<u16>,
    server_ips: Vec<IpAddr>,
    blackholed: HashSet<IpAddr>,
    /// Every CON_REQ the client sent (private data).
    pub con_reqs: Vec<Vec<u8>>,
    corrupt: Option<Corruptor>,
}

impl Inner {
    fn conn(&mut self, side: usize, id: ConnId) -> Option<&mut Conn> {
        self.conns.iter_mut().find(|c| c.side == side && c.id == id)
    }

    fn index(&self, side: usize, id: ConnId) -> Option<usize> {
        self.conns.iter().position(|c| c.side == side && c.id == id)
    }

    /// Moves a connection pair to error: flush both queues, Disconnected on
    /// both sides.
    fn break_pair(&mut self, side: usize, id: ConnId) {
        let mut todo = vec![(side, id)];
        if let Some(peer) = self.conn(side, id).and_then(|c| c.peer) {
            todo.push((1 - side, peer));
        }
        for (s, c) in todo {
            let Some(at) = self.index(s, c) else { continue };
            let conn = &mut self.conns[at];
            if conn.state == ConnState::Error {
                continue;
            }
            let was = conn.state;
            conn.state = ConnState::Error;
            let mut flushed = Vec::new();
            for wr in conn.sq.drain(..) {
                flushed.push(WorkCompletion::new(
                    wr.wr_id,
                    c,
                    wr.op.completion_opcode(),
                    WcStatus::WrFlushErr,
                ));
            }
            for wr in conn.rq.drain(..) {
                flushed.push(WorkCompletion::new(
                    wr.wr_id,
                    c,
                    WcOpcode::Recv,
                    WcStatus::WrFlushErr,
                ));
            }
            self.sides[s].cq.extend(flushed);
            let event = if was == ConnState::Requested && s == 0 {
                CmEvent::Unreachable { conn: c }
            } else {
                CmEvent::Disconnected { conn: c }
            };
            self.sides[s].cm.push_back(event);
        }
    }

    /// Executes the head of one connection's send queue; whether it did.
    fn step(&mut self, at: usize) -> bool {
        let side = self.conns[at].side;
        let id = self.conns[at].id;
        if self.conns[at].state != ConnState::Established
            || self.blackholed.contains(&self.conns[at].server_ip)
        {
            return false;
        }
        let Some(mut wr) = self.conns[at].sq.front().cloned() else {
            return false;
        };
        let peer_id = self.conns[at].peer;
        let peer_at = peer_id.and_then(|p| self.index(1 - side, p));
        // Local-only operations.
        if let SendOp::LocalInv { rkey } = wr.op {
            self.conns[at].sq.pop_front();
            let status = match self.sides[side].arena.invalidate(rkey) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocProtErr,
            };
            if wr.signaled || !status.is_success() {
                self.sides[side].cq.push_back(WorkCompletion::new(
                    wr.wr_id,
                    id,
                    WcOpcode::LocalInv,
                    status,
                ));
            }
            return true;
        }
        let Some(peer_at) = peer_at else {
            self.break_pair(side, id);
            return true;
        };
        if self.conns[peer_at].state != ConnState::Established {
            return false;
        }
        let needs_recv = matches!(
            wr.op,
            SendOp::Send { .. }
                | SendOp::SendInline { .. }
                | SendOp::SendWithInv { .. }
                | SendOp::RdmaWrite { imm: Some(_), .. }
        );
        if needs_recv && self.conns[peer_at].rq.is_empty() {
            return false; // RNR: retried later
        }
        let sgl = wr.op.sgl().to_vec();
        let len: u32 = sgl.iter().map(|s| s.len).sum::<u32>() + wr.op.inline().len() as u32;
        let mut bytes = wr.op.inline().to_vec();
        bytes.resize(len as usize, 0);
        if wr.op.inline().is_empty()
            && self.sides[side]
                .arena
                .gather_into(&sgl, 0, &mut bytes)
                .is_err()
        {
            self.conns[at].sq.pop_front();
            self.sides[side].cq.push_back(WorkCompletion::new(
                wr.wr_id,
                id,
                wr.op.completion_opcode(),
                WcStatus::LocProtErr,
            ));
            self.break_pair(side, id);
            return true;
        }
        if side == 1 {
            if let Some(corrupt) = self.corrupt.as_mut() {
                if corrupt(&mut wr.op, &mut bytes) {
                    self.corrupt = None;
                }
            }
        }
        self.conns[at].sq.pop_front();
        let peer_side = 1 - side;
        let peer = self.conns[peer_at].id;
        let mut status = WcStatus::Success;
        let mut peer_wc: Option<WorkCompletion> = None;
        match &wr.op {
            SendOp::Send { .. } | SendOp::SendInline { .. } | SendOp::SendWithInv { .. } => {
                let recv = self.conns[peer_at].rq.pop_front().expect("checked");
                let mut wc =
                    WorkCompletion::new(recv.wr_id, peer, WcOpcode::Recv, WcStatus::Success);
                wc.byte_len = len;
                if let SendOp::Send { imm, .. } | SendOp::SendInline { imm, .. } = &wr.op {
                    wc.imm = *imm;
                }
                let room: u32 = recv.sgl.as_slice().iter().map(|s| s.len).sum();
                if len > room {
                    wc.status = WcStatus::LocLenErr;
                    status = WcStatus::RemOpErr;
                } else if len > 0
                    && self.sides[peer_side]
                        .arena
                        .scatter_from(recv.sgl.as_slice(), 0, &bytes)
                        .is_err()
                {
                    wc.status = WcStatus::LocProtErr;
                    status = WcStatus::RemOpErr;
                }
                if let SendOp::SendWithInv { invalidate, .. } = wr.op {
                    if self.sides[peer_side].arena.invalidate(invalidate).is_err() {
                        wc.status = WcStatus::RemInvReqErr;
                        status = WcStatus::RemInvReqErr;
                    }
                    wc.invalidated_rkey = Some(invalidate);
                }
                peer_wc = Some(wc);
            }
            SendOp::RdmaWrite {
                remote_addr,
                rkey,
                imm,
                ..
            } => {
                if len > 0 {
                    let target = self.sides[peer_side].arena.resolve_remote(
                        *rkey,
                        *remote_addr,
                        len,
                        AccessFlags::REMOTE_WRITE,
                    );
                    match target {
                        Ok(target) => {
                            self.sides[peer_side]
                                .arena
                                .write(target, 0, &bytes)
                                .expect("resolved");
                        }
                        Err(_) => status = WcStatus::RemAccessErr,
                    }
                }
                if status.is_success() {
                    if let Some(imm) = imm {
                        let recv = self.conns[peer_at].rq.pop_front().expect("checked");
                        let mut wc = WorkCompletion::new(
                            recv.wr_id,
                            peer,
                            WcOpcode::RecvRdmaWithImm,
                            WcStatus::Success,
                        );
                        wc.imm = Some(*imm);
                        wc.byte_len = len;
                        peer_wc = Some(wc);
                    }
                }
            }
            _ => status = WcStatus::RemOpErr,
        }
        if let Some(wc) = peer_wc {
            let failed = !wc.status.is_success();
            self.sides[peer_side].cq.push_back(wc);
            if failed {
                status = if status.is_success() {
                    WcStatus::RemOpErr
                } else {
                    status
                };
            }
        }
        if wr.signaled || !status.is_success() {
            self.sides[side].cq.push_back(WorkCompletion::new(
                wr.wr_id,
                id,
                wr.op.completion_opcode(),
                status,
            ));
        }
        if !status.is_success() {
            self.break_pair(side, id);
        }
        true
    }
}

/// The fabric handle the test keeps.
#[derive(Clone)]
pub struct Fabric(pub Rc<RefCell<Inner>>);

impl Fabric {
    /// A fabric whose server answers on `server_ips`.
    pub fn new(server_ips: &[IpAddr], pool: usize) -> Self {
        let side = |seed| Side {
            arena: Arena::new(vec![0; pool]),
            keys: Lcg(seed),
            cq: VecDeque::new(),
            cm: VecDeque::new(),
            next_conn: 1,
        };
        Self(Rc::new(RefCell::new(Inner {
            sides: [side(3), side(11)],
            conns: Vec::new(),
            listening: None,
            server_ips: server_ips.to_vec(),
            blackholed: HashSet::new(),
            con_reqs: Vec::new(),
            corrupt: None,
        })))
    }

    /// The provider of `side` (0 = client, 1 = server).
    pub fn verbs(&self, side: usize) -> LoopVerbs {
        LoopVerbs {
            side,
            fabric: self.0.clone(),
        }
    }

    /// Executes queued work requests until none can progress (bounded).
    pub fn run(&self) -> bool {
        let mut inner = self.0.borrow_mut();
        let mut any = false;
        for _ in 0..10_000 {
            let mut progressed = false;
            for at in 0..inner.conns.len() {
                progressed |= inner.step(at);
            }
            if !progressed {
                break;
            }
            any = true;
        }
        any
    }

    /// Disconnects every connection to server address `ip` (both sides see
    /// `Disconnected`; queued requests flush).
    pub fn kill(&self, ip: IpAddr) {
        let mut inner = self.0.borrow_mut();
        let victims: Vec<(usize, ConnId)> = inner
            .conns
            .iter()
            .filter(|c| c.server_ip == ip && c.side == 0 && c.state != ConnState::Error)
            .map(|c| (c.side, c.id))
            .collect();
        for (side, id) in victims {
            inner.break_pair(side, id);
        }
    }

    /// Silently stops all traffic to/from `ip` (and refuses connects) until
    /// `heal`.
    pub fn blackhole(&self, ip: IpAddr) {
        self.0.borrow_mut().blackholed.insert(ip);
    }

    /// Undoes `blackhole`.
    pub fn heal(&self, ip: IpAddr) {
        self.0.borrow_mut().blackholed.remove(&ip);
    }

    /// Rewrites server → client sends until the closure returns true.
    pub fn corrupt_next(&self, f: Corruptor) {
        self.0.borrow_mut().corrupt = Some(f);
    }

    /// Every CON_REQ the client sent.
    pub fn con_reqs(&self) -> Vec<Vec<u8>> {
        self.0.borrow().con_reqs.clone()
    }

    /// Connections alive (not destroyed) on `side`.
    pub fn live_conns(&self, side: usize) -> usize {
        self.0
            .borrow()
            .conns
            .iter()
            .filter(|c| c.side == side)
            .count()
    }

    /// Reads `len` bytes of the client's memory at `handle`.
    pub fn client_bytes(&self, handle: MemoryHandle) -> Vec<u8> {
        let inner = self.0.borrow();
        let mut out = vec![0; handle.len() as usize];
        inner.sides[0].arena.read(handle, 0, &mut out).unwrap();
        out
    }
}

/// One side's provider.
pub struct LoopVerbs {
    side: usize,
    fabric: Rc<RefCell<Inner>>,
}

impl Memory for LoopVerbs {
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError> {
        let _fabric = InProvider::enter();
        self.fabric.borrow().sides[self.side]
            .arena
            .with_slice(handle, offset, len, f)
    }

    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError> {
        let _fabric = InProvider::enter();
        self.fabric.borrow_mut().sides[self.side]
            .arena
            .with_slice_mut(handle, offset, len, f)
    }
}

impl Verbs for LoopVerbs {
    fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError> {
        let _fabric = InProvider::enter();
        self.fabric.borrow_mut().sides[self.side]
            .arena
            .alloc(len, align)
    }

    fn free(&mut self, buffer: MemoryHandle) -> Result<(), RegError> {
        let _fabric = InProvider::enter();
        self.fabric.borrow_mut().sides[self.side].arena.free(buffer)
    }

    fn reg_mr(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let side = &mut inner.sides[self.side];
        side.arena.register(buffer, access, &mut side.keys)
    }

    fn rekey(&mut self, lkey: Lkey) -> Result<Rkey, RegError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let side = &mut inner.sides[self.side];
        side.arena.rekey(lkey, &mut side.keys)
    }

    fn revoke_remote(&mut self, rkey: Rkey) -> Result<(), RegError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        inner.sides[self.side].arena.invalidate(rkey)
    }

    fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), RegError> {
        let _fabric = InProvider::enter();
        self.fabric.borrow_mut().sides[self.side]
            .arena
            .deregister(lkey)
    }

    fn post_send(&mut self, conn: ConnId, requests: &[SendWr]) -> Result<(), PostError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        for wr in requests {
            inner.sides[self.side]
                .arena
                .check_sgl(wr.op.sgl(), AccessFlags::EMPTY)?;
        }
        let c = inner
            .conn(self.side, conn)
            .ok_or(PostError::UnknownConnection)?;
        if c.state == ConnState::Error {
            // Verbs allows posting to a QP in error: it flushes.
            let side = self.side;
            for wr in requests {
                let wc = WorkCompletion::new(
                    wr.wr_id,
                    conn,
                    wr.op.completion_opcode(),
                    WcStatus::WrFlushErr,
                );
                inner.sides[side].cq.push_back(wc);
            }
            return Ok(());
        }
        c.sq.extend(requests.iter().cloned());
        Ok(())
    }

    fn post_recv(&mut self, conn: ConnId, requests: &[RecvWr]) -> Result<(), PostError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        for wr in requests {
            inner.sides[self.side]
                .arena
                .check_sgl(wr.sgl.as_slice(), AccessFlags::LOCAL_WRITE)?;
        }
        let c = inner
            .conn(self.side, conn)
            .ok_or(PostError::UnknownConnection)?;
        if c.state != ConnState::Error {
            c.rq.extend(requests.iter().cloned());
        }
        Ok(())
    }

    fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let cq = &mut inner.sides[self.side].cq;
        let mut count = 0;
        while count < out.len() {
            let Some(wc) = cq.pop_front() else { break };
            out[count] = wc;
            count += 1;
        }
        count
    }

    fn listen(&mut self, port: u16) -> Result<(), ConnectError> {
        let _fabric = InProvider::enter();
        self.fabric.borrow_mut().listening = Some(port);
        Ok(())
    }

    fn connect(
        &mut self,
        remote: SocketAddr,
        params: &ConnParams<'_>,
    ) -> Result<ConnId, ConnectError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let side = self.side;
        let id = ConnId(inner.sides[side].next_conn);
        inner.sides[side].next_conn += 1;
        inner.con_reqs.push(params.private_data.to_vec());
        let reachable = inner.listening == Some(remote.port())
            && inner.server_ips.contains(&remote.ip())
            && !inner.blackholed.contains(&remote.ip());
        let mut conn = Conn {
            side,
            id,
            peer: None,
            state: ConnState::Requested,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            server_ip: remote.ip(),
            req: params.private_data.to_vec(),
        };
        if !reachable {
            conn.state = ConnState::Error;
            inner.conns.push(conn);
            inner.sides[side]
                .cm
                .push_back(CmEvent::Unreachable { conn: id });
            return Ok(id);
        }
        let peer = ConnId(inner.sides[1 - side].next_conn);
        inner.sides[1 - side].next_conn += 1;
        conn.peer = Some(peer);
        inner.conns.push(conn);
        inner.conns.push(Conn {
            side: 1 - side,
            id: peer,
            peer: Some(id),
            state: ConnState::Requested,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            server_ip: remote.ip(),
            req: Vec::new(),
        });
        let octet = match remote.ip() {
            IpAddr::V4(v4) => v4.octets()[2],
            IpAddr::V6(_) => 0,
        };
        inner.sides[1 - side].cm.push_back(CmEvent::ConnectRequest {
            conn: peer,
            local: remote,
            remote: SocketAddr::from((Ipv4Addr::new(10, 0, octet, 2), 40000 + id.0 as u16)),
            private_data: PrivateData::try_from_slice(params.private_data)?,
        });
        Ok(id)
    }

    fn accept(&mut self, conn: ConnId, params: &ConnParams<'_>) -> Result<(), ConnectError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let side = self.side;
        let c = inner
            .conn(side, conn)
            .ok_or(ConnectError::UnknownConnection)?;
        if c.state != ConnState::Requested {
            return Err(ConnectError::InvalidState);
        }
        c.state = ConnState::Established;
        let peer = c.peer.ok_or(ConnectError::UnknownConnection)?;
        let p = inner
            .conn(1 - side, peer)
            .ok_or(ConnectError::UnknownConnection)?;
        if p.state != ConnState::Requested {
            return Err(ConnectError::InvalidState);
        }
        p.state = ConnState::Established;
        inner.sides[1 - side].cm.push_back(CmEvent::Established {
            conn: peer,
            private_data: PrivateData::try_from_slice(params.private_data)?,
        });
        inner.sides[side].cm.push_back(CmEvent::Established {
            conn,
            private_data: PrivateData::new(),
        });
        Ok(())
    }

    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), ConnectError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let side = self.side;
        let at = inner
            .index(side, conn)
            .ok_or(ConnectError::UnknownConnection)?;
        let c = inner.conns.remove(at);
        if let Some(peer) = c.peer {
            if let Some(p) = inner.conn(1 - side, peer) {
                p.state = ConnState::Error;
                p.peer = None;
            }
            inner.sides[1 - side].cm.push_back(CmEvent::Rejected {
                conn: peer,
                reason: RejectReason::CONSUMER_DEFINED,
                private_data: PrivateData::try_from_slice(private_data)?,
            });
        }
        Ok(())
    }

    fn disconnect(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let c = inner
            .conn(self.side, conn)
            .ok_or(ConnectError::UnknownConnection)?;
        if c.state != ConnState::Established {
            return Err(ConnectError::InvalidState);
        }
        inner.break_pair(self.side, conn);
        Ok(())
    }

    fn destroy(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let _fabric = InProvider::enter();
        let mut inner = self.fabric.borrow_mut();
        let side = self.side;
        let at = inner
            .index(side, conn)
            .ok_or(ConnectError::UnknownConnection)?;
        if inner.conns[at].state != ConnState::Error {
            inner.break_pair(side, conn);
        }
        let at = inner.index(side, conn).expect("still there");
        let c = inner.conns.remove(at);
        if let Some(peer) = c.peer {
            if let Some(p) = inner.conn(1 - side, peer) {
                p.peer = None;
            }
        }
        inner.sides[side].cq.retain(|wc| wc.conn != conn);
        inner.sides[side].cm.retain(|e| e.conn() != conn);
        Ok(())
    }

    fn poll_cm_event(&mut self) -> Option<CmEvent> {
        let _fabric = InProvider::enter();
        self.fabric.borrow_mut().sides[self.side].cm.pop_front()
    }
}

/// Nanoseconds per millisecond and second.
pub const MS: u64 = 1_000_000;
/// Nanoseconds per second.
pub const SECOND: u64 = 1_000_000_000;

/// Server addresses of the paths.
pub fn server_addr(path: u8) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, 0, path + 1, 1), 1234))
}

/// The test backend's header: 1 byte op, 7 pad, 8 bytes LE offset.
pub fn header(op: u8, offset: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = op;
    h[8..].copy_from_slice(&offset.to_le_bytes());
    h
}

/// A client and a server over a fabric, a fake clock and a RAM disk.
pub struct Pair {
    pub fabric: Fabric,
    pub client: Client<LoopVerbs>,
    pub server: Server<LoopVerbs>,
    /// The server's one port, lent to it on every call.
    pub ports: [LoopVerbs; 1],
    pub now: u64,
    pub disk: Vec<u8>,
    /// Completions seen by the test, in order.
    pub events: Vec<ClientEvent>,
    pub server_events: Vec<ServerEvent>,
    /// Serve IOs automatically in `settle`.
    pub serve: bool,
    /// Server IO tokens held back (when `serve` is false).
    pub held: Vec<ServerEvent>,
}

/// The small server configuration: qd 8, 16 KiB chunks.
pub fn server_config(always_invalidate: bool) -> ServerConfig {
    let mut config = ServerConfig::brick_default();
    config.queue_depth = 8;
    config.chunk_size = 16 * 1024;
    config.max_hdr_size = 4096;
    config.max_sessions = 2;
    config.max_paths_per_session = 2;
    config.max_connections_per_path = 4;
    config.always_invalidate = always_invalidate;
    config
}

/// The client configuration the tests use.
pub fn client_config() -> ClientConfig {
    let mut config = ClientConfig::default_with_seed([7; 16]);
    config.max_paths = 2;
    config.max_connections_per_path = 4;
    config.max_queue_depth = 16;
    config.max_header_len = 256;
    config
}

impl Pair {
    pub fn new(server: ServerConfig, client: ClientConfig) -> Self {
        Self::with_pool(server, client, 8 << 20)
    }

    /// As `new`, with `pool` bytes of memory per side.
    pub fn with_pool(server: ServerConfig, client: ClientConfig, pool: usize) -> Self {
        let ips = [server_addr(0).ip(), server_addr(1).ip()];
        let fabric = Fabric::new(&ips, pool);
        let mut server = Server::new(server).expect("server config");
        let mut ports = [fabric.verbs(1)];
        server.start(&mut ports).expect("listen");
        let client = Client::new(fabric.verbs(0), client).expect("client config");
        Self {
            fabric,
            client,
            server,
            ports,
            now: 1,
            disk: vec![0; 1 << 20],
            events: Vec::new(),
            server_events: Vec::new(),
            serve: true,
            held: Vec::new(),
        }
    }

    /// Runs both sides and the fabric until nothing moves (bounded).
    pub fn settle(&mut self) {
        for _ in 0..1000 {
            let mut busy = self.client.poll(self.now);
            busy |= self.server.poll(self.now, &mut self.ports, &mut AdmitAll);
            busy |= self.fabric.run();
            while let Some(event) = self.server.next_event() {
                busy = true;
                if let ServerEvent::Io { .. } = event {
                    if self.serve {
                        self.serve_io(&event);
                    } else {
                        self.held.push(event);
                    }
                } else {
                    self.server_events.push(event);
                }
            }
            while let Some(event) = self.client.next_event() {
                busy = true;
                self.events.push(event);
            }
            if !busy {
                return;
            }
        }
        panic!("did not settle");
    }

    /// Serves one server IO against the RAM disk.
    pub fn serve_io(&mut self, event: &ServerEvent) {
        let ServerEvent::Io {
            token,
            direction,
            header,
            data,
            ..
        } = event
        else {
            return;
        };
        let mut h = vec![0u8; header.len() as usize];
        self.ports[0].read(*header, 0, &mut h).unwrap();
        let offset = u64::from_le_bytes(h[8..16].try_into().unwrap()) as usize;
        let errno = match direction {
            IoDirection::Write => {
                let mut bytes = vec![0u8; data.len() as usize];
                self.ports[0].read(*data, 0, &mut bytes).unwrap();
                self.disk[offset..offset + bytes.len()].copy_from_slice(&bytes);
                if h[0] == b'E' {
                    5
                } else {
                    0
                }
            }
            IoDirection::Read { read_len } => {
                let bytes = self.disk[offset..offset + *read_len as usize].to_vec();
                self.ports[0].write(*data, 0, &bytes).unwrap();
                0
            }
        };
        let now = self.now;
        self.server
            .complete_io(*token, errno, ReadData::Chunk, now, &mut self.ports)
            .expect("complete");
    }

    /// Serves every held IO.
    pub fn serve_held(&mut self) {
        for event in std::mem::take(&mut self.held) {
            self.serve_io(&event);
        }
    }

    /// Advances the clock by `step` `times`, settling each time.
    pub fn advance(&mut self, step: u64, times: usize) {
        for _ in 0..times {
            self.now += step;
            self.settle();
        }
    }

    /// Connects a session over `paths` paths of `conns` connections.
    pub fn connect(&mut self, paths: u8, conns: u16) {
        let addrs: Vec<SocketAddr> = (0..paths).map(server_addr).collect();
        self.client
            .connect_session("brick", &addrs, conns, self.now)
            .expect("connect_session");
        self.settle();
    }

    /// Allocates and registers a client buffer.
    pub fn client_buffer(&mut self, len: u32, access: AccessFlags) -> MemoryRegion {
        let verbs = self.client.verbs_mut();
        let handle = verbs.alloc(len, 64).unwrap();
        verbs.reg_mr(handle, access).unwrap()
    }

    /// Drains the recorded client events.
    pub fn take_events(&mut self) -> Vec<ClientEvent> {
        std::mem::take(&mut self.events)
    }
}

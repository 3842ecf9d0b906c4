//! rdma-core `rping`'s application protocol over `verbs`, sans-IO.
//!
//! Per ping (tests/vectors/README.md, "rping application protocol"): the client
//! SENDs `struct rping_rdma_info { be64 buf; be32 rkey; be32 size; }` of its
//! source buffer; the server RDMA READs that many bytes, then SENDs 16 bytes
//! ("go ahead"); the client SENDs the info of its sink buffer; the server RDMA
//! WRITEs `strlen(data) + 1` bytes there and SENDs "go ahead" again. The
//! payload is `"rdma-ping-%d: "` followed by ASCII 65..122 cycling, starting
//! one character later each ping, the last byte 0. After `count` pings the
//! client disconnects (DREQ/DREP).
//!
//! [`Server`] and [`Client`] are driven by [`Server::step`] /
//! [`Client::step`], which consume the provider's connection events and
//! completions and post the next work requests; they never block or read a
//! clock. Everything they print goes through the `log` callback.

#![allow(dead_code)] // the example and the test use different parts

use std::net::SocketAddr;

use verbs::{
    AccessFlags, CmEvent, ConnId, ConnParams, MemoryRegion, RecvWr, SendOp, SendWr, Sge, Sgl,
    Verbs, WcOpcode, WcStatus, WorkCompletion, WrId,
};

/// Bytes of one `rping_rdma_info` message.
pub const INFO_LEN: u32 = 16;
/// The rping default (and the Linux server's buffer size limit here).
pub const DEFAULT_SIZE: u32 = 64;
/// The RDMA CM port rping uses by default.
pub const DEFAULT_PORT: u16 = 7174;
/// Smallest ping size rping allows (`RPING_MIN_BUFSIZE`-ish: the header must fit).
pub const MIN_SIZE: u32 = 16;
/// Largest ping size this tool serves.
pub const MAX_SIZE: u32 = 64 * 1024;

const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;
const READ_ID: u64 = 3;
const WRITE_ID: u64 = 4;

/// The ping payload of ping number `ping` and `size` bytes, as rping fills it.
pub fn ping_payload(ping: u32, size: usize) -> Vec<u8> {
    let mut data = format!("rdma-ping-{ping}: ").into_bytes();
    data.truncate(size);
    let mut c = 65 + (ping % 58) as u8;
    while data.len() < size {
        data.push(c);
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    if let Some(last) = data.last_mut() {
        *last = 0;
    }
    data
}

/// Encodes an `rping_rdma_info`.
pub fn encode_info(addr: u64, rkey: u32, size: u32) -> [u8; 16] {
    let mut info = [0u8; 16];
    info[..8].copy_from_slice(&addr.to_be_bytes());
    info[8..12].copy_from_slice(&rkey.to_be_bytes());
    info[12..].copy_from_slice(&size.to_be_bytes());
    info
}

/// Decodes an `rping_rdma_info`: (addr, rkey, size).
pub fn decode_info(info: &[u8; 16]) -> (u64, u32, u32) {
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&info[..8]);
    let mut rkey = [0u8; 4];
    rkey.copy_from_slice(&info[8..12]);
    let mut size = [0u8; 4];
    size.copy_from_slice(&info[12..]);
    (
        u64::from_be_bytes(addr),
        u32::from_be_bytes(rkey),
        u32::from_be_bytes(size),
    )
}

/// The printable part of a ping buffer (up to the first 0).
pub fn printable(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

/// Where a session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Still working.
    Running,
    /// Finished cleanly after this many pings.
    Done(u32),
    /// Failed; the message says why.
    Failed(String),
}

/// Connection parameters of both sides: rping's (1 READ each way).
fn conn_params(private_data: &[u8]) -> ConnParams<'_> {
    ConnParams {
        responder_resources: 1,
        initiator_depth: 1,
        ..ConnParams::new(private_data, 16, 4)
    }
}

fn alloc_region<V: Verbs>(
    hca: &mut V,
    len: u32,
    access: AccessFlags,
) -> Result<MemoryRegion, String> {
    let handle = hca
        .alloc(len, 64)
        .map_err(|e| format!("cannot allocate {len} bytes: {e}"))?;
    hca.reg_mr(handle, access)
        .map_err(|e| format!("cannot register memory: {e}"))
}

fn post_info_recv<V: Verbs>(hca: &mut V, conn: ConnId, recv: &MemoryRegion) -> Result<(), String> {
    hca.post_recv(
        conn,
        &[RecvWr {
            wr_id: WrId(RECV_ID),
            sgl: Sgl::single(Sge::new(recv.lkey, 0, INFO_LEN)),
        }],
    )
    .map_err(|e| format!("post_recv: {e}"))
}

fn post_send_info<V: Verbs>(
    hca: &mut V,
    conn: ConnId,
    send: &MemoryRegion,
    slot: u32,
    info: &[u8; 16],
) -> Result<(), String> {
    let offset = slot * INFO_LEN;
    hca.write(send.handle, offset, info)
        .map_err(|e| format!("send buffer: {e}"))?;
    hca.post_send(
        conn,
        &[SendWr {
            wr_id: WrId(SEND_ID),
            signaled: true,
            op: SendOp::Send {
                sgl: Sgl::single(Sge::new(send.lkey, offset, INFO_LEN)),
                imm: None,
            },
        }],
    )
    .map_err(|e| format!("post_send: {e}"))
}

fn read_info<V: Verbs>(hca: &V, recv: &MemoryRegion) -> Result<[u8; 16], String> {
    let mut info = [0u8; 16];
    hca.read(recv.handle, 0, &mut info)
        .map_err(|e| format!("receive buffer: {e}"))?;
    Ok(info)
}

fn drain_completions<V: Verbs>(hca: &mut V) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    loop {
        let count = hca.poll_cq(&mut wcs);
        out.extend_from_slice(&wcs[..count]);
        if count < wcs.len() {
            return out;
        }
    }
}

/// What the server waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerState {
    /// No connection yet.
    Listening,
    /// Connected: waiting for the client's source buffer info.
    WaitingForSource,
    /// RDMA READ of the client's source in flight.
    Reading,
    /// Waiting for the client's sink buffer info.
    WaitingForSink,
    /// RDMA WRITE to the client's sink in flight.
    Writing,
    /// The client disconnected.
    Closed,
}

/// The rping server: serves one client, then ends when it disconnects.
pub struct Server {
    state: ServerState,
    conn: Option<ConnId>,
    recv: MemoryRegion,
    send: MemoryRegion,
    rdma: MemoryRegion,
    /// Length of the current ping's data.
    len: u32,
    pings: u32,
    verbose: bool,
    status: Status,
}

impl Server {
    /// Listens on `port` with buffers for pings up to [`MAX_SIZE`] bytes.
    pub fn new<V: Verbs>(hca: &mut V, port: u16, verbose: bool) -> Result<Server, String> {
        let recv = alloc_region(hca, INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        let send = alloc_region(hca, INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        let rdma = alloc_region(hca, MAX_SIZE, AccessFlags::LOCAL_WRITE)?;
        hca.listen(port)
            .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
        Ok(Server {
            state: ServerState::Listening,
            conn: None,
            recv,
            send,
            rdma,
            len: 0,
            pings: 0,
            verbose,
            status: Status::Running,
        })
    }

    /// Pings served so far.
    pub fn pings(&self) -> u32 {
        self.pings
    }

    /// Handles what happened since the last call (bounded by what is queued).
    pub fn step<V: Verbs>(&mut self, hca: &mut V, log: &mut dyn FnMut(&str)) -> Status {
        if self.status == Status::Running {
            if let Err(message) = self.advance(hca, log) {
                if let Some(conn) = self.conn {
                    let _ = hca.disconnect(conn);
                }
                self.status = Status::Failed(message);
            }
        }
        self.status.clone()
    }

    fn advance<V: Verbs>(&mut self, hca: &mut V, log: &mut dyn FnMut(&str)) -> Result<(), String> {
        while let Some(event) = hca.poll_cm_event() {
            match event {
                CmEvent::ConnectRequest { conn, remote, .. } => {
                    if self.conn.is_some() {
                        let _ = hca.reject(conn, &[]);
                        continue;
                    }
                    log(&format!("connect request from {remote}"));
                    // The receive is posted before the REP leaves (rping does too).
                    post_info_recv(hca, conn, &self.recv)?;
                    hca.accept(conn, &conn_params(&[]))
                        .map_err(|e| format!("accept: {e}"))?;
                    self.conn = Some(conn);
                }
                CmEvent::Established { conn, .. } if Some(conn) == self.conn => {
                    log("connection established");
                    self.state = ServerState::WaitingForSource;
                }
                CmEvent::Disconnected { conn } if Some(conn) == self.conn => {
                    let _ = drain_completions(hca);
                    let _ = hca.destroy(conn);
                    self.state = ServerState::Closed;
                    log(&format!("client disconnected after {} pings", self.pings));
                    self.status = Status::Done(self.pings);
                    return Ok(());
                }
                _ => {}
            }
        }
        let Some(conn) = self.conn else {
            return Ok(());
        };
        for wc in drain_completions(hca) {
            if wc.conn != conn {
                continue;
            }
            if wc.status == WcStatus::WrFlushErr {
                continue; // the disconnect event follows
            }
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "completion {:?} failed: {:?}",
                    wc.opcode, wc.status
                ));
            }
            match (wc.opcode, self.state) {
                (WcOpcode::Recv, ServerState::WaitingForSource) => {
                    if wc.byte_len != INFO_LEN {
                        return Err(format!("received bogus data, size {}", wc.byte_len));
                    }
                    let (addr, rkey, size) = decode_info(&read_info(hca, &self.recv)?);
                    post_info_recv(hca, conn, &self.recv)?;
                    if !(1..=MAX_SIZE).contains(&size) {
                        return Err(format!("client buffer size {size} out of range"));
                    }
                    self.len = size;
                    hca.post_send(
                        conn,
                        &[SendWr {
                            wr_id: WrId(READ_ID),
                            signaled: true,
                            op: SendOp::RdmaRead {
                                sgl: Sgl::single(Sge::new(self.rdma.lkey, 0, size)),
                                remote_addr: addr,
                                rkey: verbs::Rkey(rkey),
                            },
                        }],
                    )
                    .map_err(|e| format!("post RDMA READ: {e}"))?;
                    self.state = ServerState::Reading;
                }
                (WcOpcode::RdmaRead, ServerState::Reading) => {
                    if self.verbose {
                        let mut data = vec![0u8; self.len as usize];
                        hca.read(self.rdma.handle, 0, &mut data)
                            .map_err(|e| format!("rdma buffer: {e}"))?;
                        log(&format!("server ping data: {}", printable(&data)));
                    }
                    post_send_info(hca, conn, &self.send, 0, &[0; 16])?;
                    self.state = ServerState::WaitingForSink;
                }
                (WcOpcode::Recv, ServerState::WaitingForSink) => {
                    if wc.byte_len != INFO_LEN {
                        return Err(format!("received bogus data, size {}", wc.byte_len));
                    }
                    let (addr, rkey, _size) = decode_info(&read_info(hca, &self.recv)?);
                    post_info_recv(hca, conn, &self.recv)?;
                    let mut data = vec![0u8; self.len as usize];
                    hca.read(self.rdma.handle, 0, &mut data)
                        .map_err(|e| format!("rdma buffer: {e}"))?;
                    // strlen(data) + 1, as rping writes.
                    let len = data
                        .iter()
                        .position(|&b| b == 0)
                        .map_or(self.len, |n| n as u32 + 1);
                    hca.post_send(
                        conn,
                        &[SendWr {
                            wr_id: WrId(WRITE_ID),
                            signaled: true,
                            op: SendOp::RdmaWrite {
                                sgl: Sgl::single(Sge::new(self.rdma.lkey, 0, len)),
                                remote_addr: addr,
                                rkey: verbs::Rkey(rkey),
                                imm: None,
                            },
                        }],
                    )
                    .map_err(|e| format!("post RDMA WRITE: {e}"))?;
                    self.state = ServerState::Writing;
                }
                (WcOpcode::RdmaWrite, ServerState::Writing) => {
                    post_send_info(hca, conn, &self.send, 0, &[0; 16])?;
                    self.pings += 1;
                    self.state = ServerState::WaitingForSource;
                }
                (WcOpcode::Send, _) => {}
                (opcode, state) => {
                    return Err(format!("unexpected {opcode:?} completion while {state:?}"));
                }
            }
        }
        Ok(())
    }
}

/// What the client waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    /// Connect sent, waiting for Established.
    Connecting,
    /// Source info sent, waiting for the first "go ahead".
    WaitingForRead,
    /// Sink info sent, waiting for the second "go ahead".
    WaitingForWrite,
    /// DREQ sent.
    Disconnecting,
    /// Done.
    Closed,
}

/// The rping client.
pub struct Client {
    state: ClientState,
    conn: ConnId,
    recv: MemoryRegion,
    send: MemoryRegion,
    start: MemoryRegion,
    sink: MemoryRegion,
    size: u32,
    count: u32,
    ping: u32,
    verify: bool,
    status: Status,
}

impl Client {
    /// Connects to `server` and will do `count` pings of `size` bytes.
    pub fn new<V: Verbs>(
        hca: &mut V,
        server: SocketAddr,
        size: u32,
        count: u32,
        verify: bool,
    ) -> Result<Client, String> {
        if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
            return Err(format!("size {size} outside {MIN_SIZE}..={MAX_SIZE}"));
        }
        let recv = alloc_region(hca, INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        let send = alloc_region(hca, 2 * INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        let start = alloc_region(
            hca,
            size,
            AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_READ),
        )?;
        let sink = alloc_region(
            hca,
            size,
            AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE),
        )?;
        let conn = hca
            .connect(server, &conn_params(&[]))
            .map_err(|e| format!("connect to {server}: {e}"))?;
        post_info_recv(hca, conn, &recv)?;
        Ok(Client {
            state: ClientState::Connecting,
            conn,
            recv,
            send,
            start,
            sink,
            size,
            count,
            ping: 0,
            verify,
            status: Status::Running,
        })
    }

    /// Pings completed so far.
    pub fn pings(&self) -> u32 {
        self.ping
    }

    /// Handles what happened since the last call.
    pub fn step<V: Verbs>(&mut self, hca: &mut V, log: &mut dyn FnMut(&str)) -> Status {
        if self.status == Status::Running {
            if let Err(message) = self.advance(hca, log) {
                let _ = hca.disconnect(self.conn);
                self.status = Status::Failed(message);
            }
        }
        self.status.clone()
    }

    fn start_ping<V: Verbs>(&mut self, hca: &mut V) -> Result<(), String> {
        let data = ping_payload(self.ping, self.size as usize);
        hca.write(self.start.handle, 0, &data)
            .map_err(|e| format!("start buffer: {e}"))?;
        hca.write(self.sink.handle, 0, &vec![0u8; self.size as usize])
            .map_err(|e| format!("sink buffer: {e}"))?;
        let info = encode_info(self.start.iova, self.start.rkey.0, self.size);
        post_send_info(hca, self.conn, &self.send, 0, &info)?;
        self.state = ClientState::WaitingForRead;
        Ok(())
    }

    fn finish_ping<V: Verbs>(
        &mut self,
        hca: &mut V,
        log: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        let mut got = vec![0u8; self.size as usize];
        hca.read(self.sink.handle, 0, &mut got)
            .map_err(|e| format!("sink buffer: {e}"))?;
        if self.verify {
            let want = ping_payload(self.ping, self.size as usize);
            if got != want {
                return Err(format!(
                    "ping {}: data mismatch: sent {:?}, got back {:?}",
                    self.ping,
                    printable(&want),
                    printable(&got)
                ));
            }
        }
        log(&format!("ping data: {}", printable(&got)));
        self.ping += 1;
        if self.ping >= self.count {
            hca.disconnect(self.conn)
                .map_err(|e| format!("disconnect: {e}"))?;
            self.state = ClientState::Disconnecting;
            Ok(())
        } else {
            self.start_ping(hca)
        }
    }

    fn advance<V: Verbs>(&mut self, hca: &mut V, log: &mut dyn FnMut(&str)) -> Result<(), String> {
        while let Some(event) = hca.poll_cm_event() {
            if event.conn() != self.conn {
                continue;
            }
            match event {
                CmEvent::Established { .. } if self.state == ClientState::Connecting => {
                    log("connection established");
                    if self.count == 0 {
                        hca.disconnect(self.conn)
                            .map_err(|e| format!("disconnect: {e}"))?;
                        self.state = ClientState::Disconnecting;
                    } else {
                        self.start_ping(hca)?;
                    }
                }
                CmEvent::Rejected { reason, .. } => {
                    return Err(format!(
                        "connection rejected by the server (reason {})",
                        reason.0
                    ));
                }
                CmEvent::Unreachable { .. } => {
                    return Err("server unreachable (no ARP answer, or no CM reply)".into());
                }
                CmEvent::Disconnected { .. } => {
                    let _ = drain_completions(hca);
                    let _ = hca.destroy(self.conn);
                    if self.state == ClientState::Disconnecting {
                        self.state = ClientState::Closed;
                        self.status = Status::Done(self.ping);
                        return Ok(());
                    }
                    return Err(format!("server disconnected after {} pings", self.ping));
                }
                _ => {}
            }
        }
        for wc in drain_completions(hca) {
            if wc.conn != self.conn || wc.status == WcStatus::WrFlushErr {
                continue;
            }
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "completion {:?} failed: {:?}",
                    wc.opcode, wc.status
                ));
            }
            match (wc.opcode, self.state) {
                (WcOpcode::Recv, ClientState::WaitingForRead) => {
                    post_info_recv(hca, self.conn, &self.recv)?;
                    let info = encode_info(self.sink.iova, self.sink.rkey.0, self.size);
                    post_send_info(hca, self.conn, &self.send, 1, &info)?;
                    self.state = ClientState::WaitingForWrite;
                }
                (WcOpcode::Recv, ClientState::WaitingForWrite) => {
                    post_info_recv(hca, self.conn, &self.recv)?;
                    self.finish_ping(hca, log)?;
                }
                (WcOpcode::Send, _) => {}
                (opcode, state) => {
                    return Err(format!("unexpected {opcode:?} completion while {state:?}"));
                }
            }
        }
        Ok(())
    }
}

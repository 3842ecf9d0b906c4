//! `hostile_probe`: hostile RTRS/RNBD clients against a running target.
//!
//! ```text
//! hostile_probe --link frame:connect:PATH --target 10.99.0.1 \
//!     --local 10.99.0.2/24 --mac 52:54:00:99:00:02 [--session-prefix probe] \
//!     [--refused-session denied-probe] [--ro-volume probe-ro] [--rw-volume probe-rw] \
//!     [--max-connections 65] [--max-sessions 16] [--wait 20]
//! ```
//!
//! The attacks of `tests/hostile.rs`, against a hosted `brick-target` (or any
//! RTRS/RNBD server) on an Ethernet link, while someone else, typically the
//! stock Linux client, uses the target: CON_REQs with a bad magic or
//! version, more connections per path and more sessions than the target is
//! configured for, a session name the access list refuses, IO_REQs naming
//! a chunk beyond the queue depth or an offset beyond the chunk, a user
//! header longer than the room before the message, READs with too many
//! descriptors or a length other than the room left, RNBD IO whose
//! `bi_size` exceeds the data, a write through a read-only open and IO for
//! a device id never opened. Each gets exactly the answer the host tests
//! assert.
//!
//! The probe is a few simulated hosts on one link: each client (Brick's
//! RTRS client, or a raw verbs client) owns a software HCA (Ethernet mode)
//! at its own address, `--local` + n and `--mac` + n, n = 0, 1, ...; the
//! clients, their attacks and the waits are `tests/common/clients.rs`,
//! shared with the engine tests, here over a `hal::hosted::FrameLink` and
//! the monotonic clock. Every wait is bounded by `--wait` seconds and names
//! what it waited for. The session case opens sessions until one is
//! refused (at most `--max-sessions` + 1), then closes them.
//!
//! The target must grant sessions named `PREFIX-*` read-only access to
//! `--ro-volume` and read-write access to `--rw-volume` (both at least
//! 64 KiB), refuse `--refused-session` everything, and have a queue depth
//! that is not a power of two (so a chunk id beyond it fits the
//! immediate). Prints one line per case, `case NAME ... ok (expected X, got
//! X)` or `case NAME ... FAIL: expected X, found Y`, then a summary. Exit
//! status 0 if every case passed, 1 if one failed, 2 on a usage or link
//! error.

#[path = "../tests/common/clients.rs"]
mod clients;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use hal::hosted::{wait_readable, FrameLink, Link, LinkSpec, MonotonicClock, OsRng};
use hal::{Clock, Nic, NicError, Rng};
use rnbd::wire::{AccessMode, Io, IoFlags, IoOp};
use rtrs::client::PathError;
use rtrs::server::errno as rtrs_errno;
use rtrs::wire::{BufferDesc, Uuid, WriteMsg};
use verbs::{RejectReason, Verbs};

use clients::{
    con_req, pattern, raw_read_message, Fabric, Node, RawNode, RawOutcome, RawRefusal,
    RAW_READ_DEST,
};

/// Frames taken from the link per step.
const RX_BURST: usize = 64;
/// Longest an idle step blocks on the link (the nodes' timers are checked
/// at least this often).
const IDLE_NAP_NS: u64 = 5_000_000;
/// Budget of the best-effort teardown after each case.
const CLEANUP_NS: u64 = 3_000_000_000;
/// Stack of the probe thread (the HCAs are built on it before moving).
const PROBE_STACK: usize = 256 << 20;
/// Queue depth the Brick-client nodes accept at most: RTRS's 512, or less
/// if the client's receives (`2 × qd + 8` per connection) would not fit the
/// software HCA's receive queue.
const CLIENT_QUEUE_DEPTH: u16 = {
    let fits = (roce::qp::config::RQ_DEPTH - 9) / 2;
    if fits < 512 {
        fits as u16
    } else {
        512
    }
};

/// Hostile RTRS/RNBD clients against a running target.
#[derive(Parser, Debug)]
#[command(name = "hostile_probe")]
struct Args {
    /// The link: frame:connect:PATH, frame:listen:PATH, tcp:connect:ADDR, ...
    #[arg(long)]
    link: LinkSpec,
    /// The target's address on the link.
    #[arg(long)]
    target: Ipv4Addr,
    /// The target's RDMA CM port.
    #[arg(long, default_value_t = 1234)]
    port: u16,
    /// The first client's address (A.B.C.D/LEN; the prefix is accepted and
    /// ignored: the target is on-link). Further clients take the next ones.
    #[arg(long)]
    local: String,
    /// The first client's MAC; further clients take the next ones.
    #[arg(long)]
    mac: String,
    /// Session names are PREFIX-CASE.
    #[arg(long, default_value = "probe")]
    session_prefix: String,
    /// A session name no access rule admits.
    #[arg(long, default_value = "denied-probe")]
    refused_session: String,
    /// A volume PREFIX-* sessions may open read-only.
    #[arg(long, default_value = "probe-ro")]
    ro_volume: String,
    /// A volume PREFIX-* sessions may open read-write.
    #[arg(long, default_value = "probe-rw")]
    rw_volume: String,
    /// The target's `max_connections_per_path`.
    #[arg(long, default_value_t = 65)]
    max_connections: u16,
    /// The target's `max_sessions` (bounds the session case).
    #[arg(long, default_value_t = 16)]
    max_sessions: u16,
    /// Seconds any one wait may take.
    #[arg(long, default_value_t = 20)]
    wait: u64,
}

/// The probe's fabric: its nodes on one Ethernet link, the monotonic clock.
struct Wire {
    link: FrameLink,
    clock: MonotonicClock,
    server: SocketAddr,
    clients: Vec<Node>,
    raws: Vec<RawNode>,
    /// Budget of one wait, nanoseconds.
    wait_ns: u64,
    /// Address and MAC of the first node.
    base_ip: [u8; 4],
    base_mac: [u8; 6],
    /// Nodes made so far (the next one's offset from the base address).
    hosts: u8,
    /// Seeds keys and uuids (per run, so two runs do not share uuids).
    seed: u64,
    /// Frames received and sent.
    frames_in: u64,
    frames_out: u64,
}

impl Wire {
    /// The address, MAC and seed of the next node.
    fn next_host(&mut self) -> ([u8; 4], [u8; 6], u64) {
        let n = self.hosts;
        self.hosts = self
            .hosts
            .checked_add(1)
            .expect("at most 255 nodes per run");
        let mut ip = self.base_ip;
        ip[3] = ip[3].checked_add(n).expect("node address beyond x.x.x.255");
        let mut mac = self.base_mac;
        mac[5] = mac[5].wrapping_add(n);
        (ip, mac, self.seed.wrapping_add(u64::from(n)))
    }

    /// Adds a Brick-client node; returns its index.
    fn add_client(&mut self) -> usize {
        let (ip, mac, seed) = self.next_host();
        self.clients
            .push(Node::new(mac, ip, CLIENT_QUEUE_DEPTH, seed));
        self.clients.len() - 1
    }

    /// Adds a raw node; returns its index.
    fn add_raw(&mut self) -> usize {
        let (ip, mac, seed) = self.next_host();
        self.raws.push(RawNode::new(mac, ip, seed));
        self.raws.len() - 1
    }

    /// Best effort after a case, passed or not: closes every session and
    /// connection the case left, waits (bounded) for them to go, and drops
    /// the nodes.
    fn reset(&mut self) {
        let now = self.clock.now();
        for node in &mut self.clients {
            if node.client.is_up() {
                node.client.close_session(now);
            }
        }
        for node in &mut self.raws {
            let down: Vec<verbs::ConnId> = node
                .cm_events
                .iter()
                .filter_map(|e| match e {
                    verbs::CmEvent::Disconnected { conn } => Some(*conn),
                    _ => None,
                })
                .collect();
            if let Some(session) = node.session.take() {
                for conn in session.conns.iter().filter(|c| !down.contains(c)) {
                    let _ = node.hca.disconnect(*conn);
                }
            }
        }
        let deadline = self.clock.now() + CLEANUP_NS;
        while self.clock.now() < deadline && self.clients.iter().any(|n| n.client.is_up()) {
            self.step();
        }
        // Let DREQs, DREPs and their retransmissions go out.
        let settle = self.clock.now() + 200_000_000;
        while self.clock.now() < settle {
            self.step();
        }
        self.clients.clear();
        self.raws.clear();
    }
}

/// Sends one HCA frame (headers + payload pieces + trailer) on `link`;
/// transmit errors are drops (the transport and CM retransmit).
fn transmit(link: &mut FrameLink, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) -> bool {
    let mut pieces: [&[u8]; 8] = [&[]; 8];
    let mut count = 0;
    for piece in payload.iter().copied().chain([trailer]) {
        if piece.is_empty() {
            continue;
        }
        let Some(slot) = pieces.get_mut(count) else {
            return false; // more pieces than any HCA frame has
        };
        *slot = piece;
        count += 1;
    }
    link.transmit(headers, &pieces[..count]).is_ok()
}

impl Fabric for Wire {
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn server(&self) -> SocketAddr {
        self.server
    }

    fn clients(&self) -> &[Node] {
        &self.clients
    }

    fn clients_mut(&mut self) -> &mut Vec<Node> {
        &mut self.clients
    }

    fn raws(&self) -> &[RawNode] {
        &self.raws
    }

    fn raws_mut(&mut self) -> &mut Vec<RawNode> {
        &mut self.raws
    }

    /// A bounded burst of frames in (routed by destination MAC, broadcasts
    /// to every node), every node polled; when nothing moved, blocks on the
    /// link until it is readable or the nodes' next deadline (at most
    /// [`IDLE_NAP_NS`]).
    fn step(&mut self) {
        let now = self.clock.now();
        let mut busy = false;
        let Self {
            link,
            clients,
            raws,
            frames_in,
            frames_out,
            ..
        } = self;
        for _ in 0..RX_BURST {
            let received = link.receive(|frame| {
                let Some(dest) = frame.get(..6) else {
                    return;
                };
                let broadcast = dest == [0xff; 6];
                for node in clients
                    .iter_mut()
                    .filter(|n| n.alive && (broadcast || n.mac == dest))
                {
                    node.receive(now, frame);
                }
                for node in raws
                    .iter_mut()
                    .filter(|n| n.alive && (broadcast || n.mac == dest))
                {
                    node.receive(now, frame);
                }
            });
            match received {
                Ok(Some(())) => {
                    busy = true;
                    *frames_in += 1;
                }
                Ok(None) | Err(NicError::LinkDown) => break,
                Err(error) => panic!("link receive: {error}"),
            }
        }
        let mut sent = 0u64;
        let mut sink = |h: &[u8], p: &[&[u8]], t: &[u8]| {
            if transmit(link, h, p, t) {
                sent += 1;
            }
        };
        for node in clients.iter_mut().filter(|n| n.alive) {
            node.poll(now, &mut sink);
        }
        for node in raws.iter_mut().filter(|n| n.alive) {
            node.poll(now, &mut sink);
        }
        *frames_out += sent;
        busy |= sent > 0;
        if link.has_pending_output() {
            let _ = link.flush();
        }
        if busy {
            return;
        }
        let now = self.clock.now();
        let wake = self
            .clients
            .iter()
            .filter(|n| n.alive)
            .filter_map(|n| n.poll_at(now))
            .chain(
                self.raws
                    .iter()
                    .filter(|n| n.alive)
                    .filter_map(|n| n.poll_at(now)),
            )
            .fold(now + IDLE_NAP_NS, u64::min);
        if wake <= now {
            return;
        }
        let fds: Vec<RawFd> = self.link.raw_fd().into_iter().collect();
        if fds.is_empty() {
            std::thread::sleep(Duration::from_nanos(wake - now));
        } else if let Err(error) = wait_readable(&fds, Some(wake)) {
            panic!("waiting on the link: {error}");
        }
    }

    /// Steps until `done`, at most `--wait` seconds.
    fn run_until(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        let deadline = self.clock.now() + self.wait_ns;
        loop {
            if done(self) {
                return;
            }
            if self.clock.now() >= deadline {
                panic!(
                    "timed out after {} s waiting for {what}",
                    self.wait_ns / 1_000_000_000
                );
            }
            self.step();
        }
    }
}

// ----- how outcomes read ------------------------------------------------------

/// An errno by name.
fn errno_name(errno: u16) -> String {
    match errno {
        0 => "0".to_string(),
        _ => rtrs::server::errno::Display(errno).to_string(),
    }
}

/// A CONN_RSP errno (negative) by name.
fn conn_errno(errno: i16) -> String {
    if errno < 0 {
        format!("-{}", errno_name(errno.unsigned_abs()))
    } else {
        format!("{errno}")
    }
}

fn raw_outcome(outcome: RawOutcome) -> String {
    match outcome {
        RawOutcome::Answered(errno) => format!("answered {}", errno_name(errno)),
        RawOutcome::Closed => "path closed".into(),
    }
}

fn refusal(result: Result<(verbs::ConnId, rtrs::wire::ConnRsp), RawRefusal>) -> String {
    match result {
        Ok(_) => "accepted".into(),
        Err(RawRefusal::Rejected(reason, Some(rsp))) => {
            let kind = if reason == RejectReason::CONSUMER_DEFINED {
                "consumer-defined".to_string()
            } else {
                format!("{reason:?}")
            };
            format!("REJ {kind} {}", conn_errno(rsp.errno))
        }
        Err(RawRefusal::Rejected(reason, None)) => format!("REJ {reason:?} without CONN_RSP"),
        Err(RawRefusal::Unreachable) => "unreachable".into(),
    }
}

fn connect_outcome(result: Result<(), PathError>) -> String {
    match result {
        Ok(()) => "session up".into(),
        Err(PathError::Rejected(errno)) => format!("rejected {}", conn_errno(errno)),
        Err(other) => format!("{other:?}"),
    }
}

// ----- the cases ----------------------------------------------------------------

/// A case's run: what it got, in the words of its expectation.
type Run = fn(&mut Wire, &Args) -> String;

/// A case: its name, what it expects, and the run that reports what it got.
struct Case {
    name: &'static str,
    expected: String,
    run: Run,
}

fn case(name: &'static str, expected: impl Into<String>, run: Run) -> Case {
    Case {
        name,
        expected: expected.into(),
        run,
    }
}

/// Fresh path and session uuids for a raw CON_REQ.
fn uuids(wire: &mut Wire) -> (Uuid, Uuid) {
    let mut path = [0u8; 16];
    let mut session = [0u8; 16];
    for byte in path.iter_mut().chain(session.iter_mut()) {
        wire.seed = wire
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        *byte = (wire.seed >> 56) as u8;
    }
    (Uuid(path), Uuid(session))
}

/// rtrs.md §2.4 step 1: a CON_REQ with `field` (bytes 2..4 magic, 4..6
/// version) set to `value`.
fn malformed_con_req(wire: &mut Wire, at: usize, value: u16) -> String {
    let r = wire.add_raw();
    let (path, session) = uuids(wire);
    let mut bytes = con_req(0, 2, path, session);
    bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
    refusal(wire.raw_connect(r, &bytes))
}

/// A raw node with an established session `PREFIX-NAME` of two connections.
fn raw_session(wire: &mut Wire, args: &Args, name: &str) -> usize {
    let r = wire.add_raw();
    wire.raw_establish(r, &format!("{}-{name}", args.session_prefix), 2);
    r
}

/// The raw session's queue depth and chunk size.
fn geometry(wire: &Wire, r: usize) -> (u16, u32) {
    let session = wire.raw_session(r);
    (session.queue_depth, session.chunk_size)
}

/// Posts a zero-length WRITE WITH IMM naming `chunk` at `offset` on cid 1
/// and waits for the outcome.
fn bare_immediate(wire: &mut Wire, r: usize, chunk: u32, offset: u32) -> String {
    let Some(payload) = wire.raw_session(r).layout.join(chunk, offset) else {
        let (qd, _) = geometry(wire, r);
        return format!("chunk {chunk} offset {offset} not representable (queue depth {qd})");
    };
    let imm = rtrs::wire::Imm::IoReq { payload }
        .encode()
        .expect("an IO_REQ immediate encodes");
    wire.raw_post(r, 1, &[(0, 0, &[], imm)]);
    let outcome = wire.raw_await(r, chunk);
    if outcome == RawOutcome::Closed {
        wire.run_until("raw path fully disconnected", |w| w.raw_all_disconnected(r));
    }
    raw_outcome(outcome)
}

/// After a request the path must survive: a valid SESS_INFO on `chunk`.
fn still_serves(wire: &mut Wire, r: usize, chunk: u16) -> String {
    match wire.raw_sess_info(r, chunk) {
        (RawOutcome::Answered(0), Some(version)) => format!("serves (protocol {version})"),
        (outcome, _) => format!("SESS_INFO {}", raw_outcome(outcome)),
    }
}

/// A Brick-client node with session `PREFIX-NAME` up.
fn client_session(wire: &mut Wire, args: &Args, name: &str) -> usize {
    let c = wire.add_client();
    let name = format!("{}-{name}", args.session_prefix);
    if let Err(error) = wire.connect(c, &name, 2) {
        panic!("session {name}: {error:?}");
    }
    c
}

fn cases() -> Vec<Case> {
    vec![
        case(
            "con_req_bad_magic",
            "REJ consumer-defined -ECONNRESET",
            |wire, _| malformed_con_req(wire, 2, 0xdead),
        ),
        case(
            "con_req_bad_version",
            "REJ consumer-defined -ECONNRESET",
            |wire, _| malformed_con_req(wire, 4, 0x0300),
        ),
        case(
            "too_many_connections",
            "REJ consumer-defined -ECONNRESET",
            // Refused at cid 0, on `cid_num` alone.
            |wire, args| {
                let r = wire.add_raw();
                let (path, session) = uuids(wire);
                let bytes = con_req(0, args.max_connections.saturating_add(1), path, session);
                refusal(wire.raw_connect(r, &bytes))
            },
        ),
        case(
            "too_many_sessions",
            "sessions admitted, then rejected -ENOMEM; the admitted ones serve",
            |wire, args| {
                let mut admitted = Vec::new();
                let mut refused = None;
                for n in 0..=args.max_sessions {
                    let c = wire.add_client();
                    let name = format!("{}-session{n}", args.session_prefix);
                    match wire.connect(c, &name, 2) {
                        Ok(()) => admitted.push(c),
                        Err(error) => {
                            wire.close_session(c);
                            refused = Some(error);
                            break;
                        }
                    }
                }
                let serving = admitted
                    .iter()
                    .enumerate()
                    .all(|(tag, &c)| wire.sess_info(c, tag as u64 + 1) == 2);
                for &c in &admitted {
                    wire.close_session(c);
                }
                eprintln!(
                    "hostile_probe: {} sessions admitted before the refusal",
                    admitted.len()
                );
                match refused {
                    Some(error) if !admitted.is_empty() && serving => format!(
                        "sessions admitted, then {}; the admitted ones serve",
                        connect_outcome(Err(error))
                    ),
                    Some(error) => format!(
                        "{} admitted (serving: {serving}), then {}",
                        admitted.len(),
                        connect_outcome(Err(error))
                    ),
                    None => format!("{} sessions admitted, none refused", admitted.len()),
                }
            },
        ),
        case(
            "session_name_refused",
            "path closed at INFO_REQ",
            // No access rule admits the name: the target closes the path
            // before it registers a chunk for it (no INFO_RSP).
            |wire, args| {
                let c = wire.add_client();
                let outcome = match wire.connect(c, &args.refused_session, 2) {
                    Err(PathError::Disconnected) => "path closed at INFO_REQ".to_owned(),
                    Err(error) => format!("session {}: {error:?}", args.refused_session),
                    Ok(()) => format!("session {} admitted", args.refused_session),
                };
                wire.close_session(c);
                outcome
            },
        ),
        case(
            "chunk_id_beyond_queue_depth",
            "path closed",
            |wire, args| {
                let r = raw_session(wire, args, "chunk-id");
                let (qd, _) = geometry(wire, r);
                bare_immediate(wire, r, u32::from(qd), 64)
            },
        ),
        case("offset_beyond_chunk", "path closed", |wire, args| {
            let r = raw_session(wire, args, "offset");
            let (_, chunk_size) = geometry(wire, r);
            bare_immediate(wire, r, 0, chunk_size + 8)
        }),
        case(
            "usr_len_beyond_chunk_start",
            "answered EINVAL; serves (protocol 2)",
            |wire, args| {
                let r = raw_session(wire, args, "usr-len");
                let mut msg = [0u8; 4];
                WriteMsg { usr_len: 512 }
                    .emit(&mut msg)
                    .expect("a WRITE message fits 4 bytes");
                let imm = wire.raw_imm(r, 3, 64);
                wire.raw_post(r, 1, &[(3, 64, &msg, imm)]);
                let outcome = raw_outcome(wire.raw_await(r, 3));
                format!("{outcome}; {}", still_serves(wire, r, 4))
            },
        ),
        case(
            "sg_cnt_too_large",
            format!(
                "sg_cnt 2 answered {e}, sg_cnt 65535 answered {e}; serves (protocol 2)",
                e = errno_name(rtrs_errno::EINVAL)
            ),
            |wire, args| {
                let r = raw_session(wire, args, "sg-cnt");
                let memory = wire.raws[r].memory;
                let desc = BufferDesc {
                    addr: memory.remote_addr(RAW_READ_DEST),
                    rkey: memory.rkey,
                    len: 4096,
                };
                let (bytes, offset) = raw_read_message(&[desc, desc], 4096);
                let imm = wire.raw_imm(r, 5, offset);
                wire.raw_post(r, 1, &[(5, 4096, &bytes, imm)]);
                let two = raw_outcome(wire.raw_await(r, 5));
                // sg_cnt = 0xffff: its descriptors would run far past the chunk.
                let (mut bytes, offset) = raw_read_message(&[desc], 4096);
                bytes[32 + 6..32 + 8].copy_from_slice(&u16::MAX.to_le_bytes());
                let imm = wire.raw_imm(r, 10, offset);
                wire.raw_post(r, 1, &[(10, 4096, &bytes, imm)]);
                let many = raw_outcome(wire.raw_await(r, 10));
                format!(
                    "sg_cnt 2 {two}, sg_cnt 65535 {many}; {}",
                    still_serves(wire, r, 6)
                )
            },
        ),
        case(
            "read_length_beyond_room",
            "answered EINVAL; serves (protocol 2)",
            |wire, args| {
                let r = raw_session(wire, args, "room");
                let memory = wire.raws[r].memory;
                let desc = BufferDesc {
                    addr: memory.remote_addr(RAW_READ_DEST),
                    rkey: memory.rkey,
                    len: 8192,
                };
                let (bytes, offset) = raw_read_message(&[desc], 4096);
                let imm = wire.raw_imm(r, 7, offset);
                wire.raw_post(r, 1, &[(7, 4096, &bytes, imm)]);
                let outcome = raw_outcome(wire.raw_await(r, 7));
                format!("{outcome}; {}", still_serves(wire, r, 8))
            },
        ),
        case(
            "bi_size_beyond_data",
            "write EINVAL, read EINVAL, valid IO 0",
            |wire, args| {
                let c = client_session(wire, args, "bi-size");
                let device = match wire.open(c, 1, &args.rw_volume, AccessMode::ReadWrite) {
                    Ok(device) => device,
                    Err(errno) => return format!("OPEN {} {}", args.rw_volume, errno_name(errno)),
                };
                let io = |op: IoOp, bi_size: u32| Io {
                    device_id: device.id,
                    sector: 8,
                    op,
                    flags: IoFlags::NONE,
                    bi_size,
                    prio: 0,
                };
                let mut header = [0u8; 64];
                // bi_size 8 KiB, 4 KiB of data.
                let len = io(IoOp::Write, 8192)
                    .emit(&mut header)
                    .expect("an IO message fits 64 bytes");
                let write = wire.write_request(c, 2, &header[..len], &pattern(31, 4096), false);
                // bi_size 8 KiB, a 4 KiB read buffer.
                let len = io(IoOp::Read, 8192)
                    .emit(&mut header)
                    .expect("an IO message fits 64 bytes");
                let (read, _) = wire.read_request(c, 3, &header[..len], 4096, false);
                // The session's own valid IO still works, byte for byte.
                let data = pattern(32, 8192);
                let valid = match wire.write(c, 4, &device, 4096, &data) {
                    0 => match wire.read(c, 5, &device, 4096, 8192) {
                        (0, back) if back == data => 0,
                        (0, _) => return "valid IO read back different data".into(),
                        (errno, _) => errno,
                    },
                    errno => errno,
                };
                wire.close_session(c);
                format!(
                    "write {}, read {}, valid IO {}",
                    errno_name(write),
                    errno_name(read),
                    errno_name(valid)
                )
            },
        ),
        case(
            "write_through_read_only_open",
            "read 0, write EPERM",
            |wire, args| {
                let c = client_session(wire, args, "read-only");
                let device = match wire.open(c, 1, &args.ro_volume, AccessMode::ReadOnly) {
                    Ok(device) => device,
                    Err(errno) => return format!("OPEN {} {}", args.ro_volume, errno_name(errno)),
                };
                let (read, _) = wire.read(c, 2, &device, 0, 4096);
                let mut forced = device;
                forced.mode = AccessMode::ReadWrite;
                let write = wire.write(c, 3, &forced, 0, &pattern(33, 16384));
                wire.close_session(c);
                format!("read {}, write {}", errno_name(read), errno_name(write))
            },
        ),
        case(
            "unknown_device_id",
            "write ENOTCONN, read ENOTCONN",
            |wire, args| {
                let c = client_session(wire, args, "device-id");
                let device = match wire.open(c, 1, &args.rw_volume, AccessMode::ReadWrite) {
                    Ok(device) => device,
                    Err(errno) => return format!("OPEN {} {}", args.rw_volume, errno_name(errno)),
                };
                let mut unknown = device;
                unknown.id = 999;
                let write = wire.write(c, 2, &unknown, 0, &[1; 4096]);
                let (read, _) = wire.read(c, 3, &unknown, 0, 4096);
                wire.close_session(c);
                format!("write {}, read {}", errno_name(write), errno_name(read))
            },
        ),
    ]
}

/// The text of a caught panic.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else {
        "panic".into()
    }
}

fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = text.split(':').collect();
    let mut mac = [0u8; 6];
    if parts.len() != 6 {
        return Err(format!("bad MAC address {text:?}"));
    }
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16).map_err(|_| format!("bad MAC address {text:?}"))?;
    }
    Ok(mac)
}

/// Opens the link and runs every case; `Ok(failed)` or a setup error.
fn probe(args: Args) -> Result<usize, String> {
    let address = args.local.split('/').next().unwrap_or(&args.local);
    let ip: Ipv4Addr = address
        .parse()
        .map_err(|_| format!("bad --local {:?}", args.local))?;
    let mac = parse_mac(&args.mac)?;
    let link = match args.link.open() {
        Ok(Link::Frame(link)) => link.with_mac(mac),
        Ok(Link::Udp(_)) => return Err("the probe needs an Ethernet link, not udp:".into()),
        Err(error) => return Err(format!("link {}: {error}", args.link)),
    };
    let mut wire = Wire {
        link,
        clock: MonotonicClock::new(),
        server: SocketAddr::V4(SocketAddrV4::new(args.target, args.port)),
        clients: Vec::new(),
        raws: Vec::new(),
        wait_ns: args.wait.saturating_mul(1_000_000_000),
        base_ip: ip.octets(),
        base_mac: mac,
        hosts: 0,
        seed: u64::from(OsRng.next_u32()) << 32 | u64::from(OsRng.next_u32()),
        frames_in: 0,
        frames_out: 0,
    };
    // Failures are reported per case, from the panic's message.
    std::panic::set_hook(Box::new(|_| {}));
    let cases = cases();
    let mut failed = 0;
    for case in &cases {
        let result = catch_unwind(AssertUnwindSafe(|| (case.run)(&mut wire, &args)));
        let cleanup = catch_unwind(AssertUnwindSafe(|| wire.reset()));
        if cleanup.is_err() {
            wire.clients.clear();
            wire.raws.clear();
        }
        match result {
            Ok(got) if got == case.expected => {
                println!("case {} ... ok (expected {got}, got {got})", case.name);
            }
            Ok(got) => {
                failed += 1;
                println!(
                    "case {} ... FAIL: expected {}, found {got}",
                    case.name, case.expected
                );
            }
            Err(payload) => {
                failed += 1;
                println!(
                    "case {} ... FAIL: expected {}, found {}",
                    case.name,
                    case.expected,
                    panic_text(payload.as_ref())
                );
            }
        }
    }
    println!(
        "hostile_probe: {} cases, {} passed, {failed} failed ({} frames in, {} out)",
        cases.len(),
        cases.len() - failed,
        wire.frames_in,
        wire.frames_out
    );
    Ok(failed)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let worker = std::thread::Builder::new()
        .name("hostile-probe".into())
        .stack_size(PROBE_STACK)
        .spawn(move || probe(args));
    match worker.map(|w| w.join()) {
        Ok(Ok(Ok(0))) => ExitCode::SUCCESS,
        Ok(Ok(Ok(_))) => ExitCode::from(1),
        Ok(Ok(Err(message))) => {
            eprintln!("hostile_probe: {message}");
            ExitCode::from(2)
        }
        _ => {
            eprintln!("hostile_probe: the probe thread failed");
            ExitCode::from(2)
        }
    }
}

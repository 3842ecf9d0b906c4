//! Client nodes of the engine tests and of the hostile probe, over any fabric.
//!
//! Two kinds of client:
//!
//! * [`Node`]: Brick's own RTRS client ([`rtrs::client::Client`]) speaking
//!   RNBD with [`rnbd::client`]; optionally running a background
//!   [`Workload`] (writes and read-backs checked byte for byte against a
//!   shadow copy) that advances on every poll, so it is in flight while a
//!   test does something else.
//! * [`RawNode`]: a bare HCA driven at the verbs level: raw CM connects with
//!   any CON_REQ bytes, and once a session is set up the Linux way
//!   (rtrs.md §2, §3) any RDMA WRITE WITH IMM into the server's chunks,
//!   built from `rtrs::wire` encoders (the approach of
//!   `rtrs/tests/server_support`, over a real HCA instead of a mock).
//!
//! What a node does is written once, as the provided methods of
//! [`Fabric`]; a fabric says only how frames move between the nodes and the
//! server and what the clock is. Two fabrics implement it: the engine
//! tests' `World` (`tests/common/mod.rs`: the engine in process, an
//! in-memory Ethernet segment, a fake clock, waits bounded in steps) and
//! `examples/hostile_probe/` (a hosted `brick-target` behind a
//! `hal::hosted::FrameLink`, the monotonic clock, waits bounded in
//! seconds). A wait that runs out of budget panics with what it waited
//! for; the tests let that fail the test, the probe catches it per case.
//!
//! Nothing here allocates per frame or per IO once a node is built (the
//! engine tests count allocations in a steady-state window).

#![allow(dead_code)] // the tests and the probe use different subsets

use std::collections::VecDeque;
use std::net::SocketAddr;

use rnbd::client::{self as rnbd_client, Device};
use rnbd::wire::{AccessMode, RtrsDirection};
use roce::hca::{Hca, HcaConfig};
use rtrs::client::{Client, ClientConfig, ClientIo, Direction, Event, PathError, ReadBuffer};
use rtrs::wire::{
    BufferDesc, ConnReq, ConnRsp, ConnRspFlags, Imm, ImmLayout, InfoReq, InfoRsp, ReadFlags,
    ReadMsg, RkeyRsp, Uuid,
};
use verbs::{
    AccessFlags, CmEvent, ConnId, ConnParams, KeySource, Memory, MemoryRegion, RecvWr,
    RejectReason, SendOp, SendWr, Sge, Sgl, Verbs, WorkCompletion, WrId,
};

/// Seeded key source (R_Keys, QPNs, PSNs, CM ids).
pub struct Keys(pub u64);

impl KeySource for Keys {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 32) as u32
    }
}

/// The client HCAs' type.
pub type ClientHca = Hca<Vec<u8>, Keys, 256, 16, 4096>;

/// Registered memory of a client HCA.
const CLIENT_POOL: usize = 4 << 20;
/// The registered data buffer of a [`Node`].
const NODE_BUFFER: u32 = 1 << 20;
/// Where ad-hoc IO of a [`Node`] lives in its buffer (the workload uses the
/// part below).
pub const ADHOC: u32 = 512 * 1024;

/// Workload tags carry this bit; tests use smaller tags.
const WORKLOAD_TAG: u64 = 1 << 63;

/// A deterministic byte pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    fill_pattern(seed, &mut out);
    out
}

/// Fills `out` with the pattern of `seed` (no allocation).
pub fn fill_pattern(seed: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// A client HCA (Ethernet mode) at `mac` / `ip`, its keys seeded with `seed`.
pub fn client_hca(mac: [u8; 6], ip: [u8; 4], seed: u64) -> ClientHca {
    Hca::new(vec![0u8; CLIENT_POOL], Keys(seed), HcaConfig { mac, ip })
}

/// A client host running Brick's RTRS client.
pub struct Node {
    /// The RTRS client over the node's HCA.
    pub client: Client<ClientHca>,
    /// The node's MAC (frames are routed by it).
    pub mac: [u8; 6],
    /// False: the host is gone; nothing is delivered either way.
    pub alive: bool,
    /// Client events not consumed by the workload.
    pub events: Vec<Event>,
    /// Frames waiting for the node (fabrics that queue them).
    pub inbox: VecDeque<Vec<u8>>,
    /// 1 MiB registered local+remote-write buffer (workload below
    /// [`ADHOC`], ad-hoc IO above).
    pub buffer: MemoryRegion,
    /// Background IO, if started.
    pub workload: Option<Workload>,
}

/// A client host driven at the verbs level.
pub struct RawNode {
    /// The HCA.
    pub hca: ClientHca,
    /// The node's MAC.
    pub mac: [u8; 6],
    /// False: the host is gone.
    pub alive: bool,
    /// Frames waiting for the node (fabrics that queue them).
    pub inbox: VecDeque<Vec<u8>>,
    /// Connection events seen, oldest first.
    pub cm_events: Vec<CmEvent>,
    /// Work completions not consumed, oldest first (receive slots are
    /// reposted and RKEY_RSPs applied before they land here).
    pub completions: Vec<WorkCompletion>,
    /// 256 KiB registered scratch memory (see the `RAW_*` offsets).
    pub memory: MemoryRegion,
    /// The session once [`Fabric::raw_establish`] set it up.
    pub session: Option<RawSession>,
    /// True: receive slots are not reposted once used (a client that
    /// stops taking the server's responses); false by default.
    pub hold_receives: bool,
    seed: u64,
    stage_next: u32,
}

/// A session a [`RawNode`] established.
#[derive(Clone, Debug)]
pub struct RawSession {
    /// Connections by cid.
    pub conns: Vec<ConnId>,
    /// The server's chunks (rkeys updated by RKEY_RSPs).
    pub chunks: Vec<BufferDesc>,
    /// Session queue depth.
    pub queue_depth: u16,
    /// Chunk stride.
    pub chunk_size: u32,
    /// IO_REQ immediate layout.
    pub layout: ImmLayout,
    /// NEW_RKEY_F was set in CONN_RSP.
    pub new_rkey: bool,
}

/// Scratch layout of a [`RawNode`].
const RAW_MEMORY: u32 = 256 * 1024;
const RAW_INFO_RSP: u32 = 0;
const RAW_SLOTS: u32 = 64 * 1024;
const RAW_SLOTS_PER_CONN: u32 = 64;
const RAW_STAGE: u32 = 128 * 1024;
const RAW_STAGE_LEN: u32 = 16 * 1024;
/// Where a [`RawNode`]'s RTRS READ data lands (64 KiB).
pub const RAW_READ_DEST: u32 = 192 * 1024;

const RAW_KIND_INFO: u64 = 1;
const RAW_KIND_SLOT: u64 = 2;
const RAW_KIND_SEND: u64 = 3;

fn raw_wr_id(kind: u64, conn_index: u32, slot: u32) -> WrId {
    WrId(kind << 56 | u64::from(conn_index) << 32 | u64::from(slot))
}

/// How a raw request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawOutcome {
    /// The server answered it with this errno.
    Answered(u16),
    /// The server closed the path (a connection got disconnected).
    Closed,
}

/// Why a raw connect failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawRefusal {
    /// REJ: its reason and the CONN_RSP of its private data, if any.
    Rejected(RejectReason, Option<ConnRsp>),
    /// No answer.
    Unreachable,
}

/// A CON_REQ (rtrs.md §2.3) as raw bytes.
pub fn con_req(cid: u16, cid_num: u16, path: Uuid, session: Uuid) -> [u8; ConnReq::LEN] {
    let mut buf = [0u8; ConnReq::LEN];
    ConnReq {
        version: rtrs::wire::VERSION,
        cid,
        cid_num,
        recon_cnt: 1,
        path_uuid: path,
        session_uuid: session,
        first_conn: true,
    }
    .emit(&mut buf)
    .unwrap();
    buf
}

/// INFO_REQ bytes (rtrs.md §3.1) naming `name` as is: type 0, the name
/// NUL-padded (or, at 255 bytes, unterminated), no validation.
pub fn info_req(name: &[u8]) -> [u8; InfoReq::LEN] {
    let mut out = [0u8; InfoReq::LEN];
    let len = name.len().min(rtrs::wire::PATHNAME_LEN);
    out[2..2 + len].copy_from_slice(&name[..len]);
    out
}

/// An RTRS READ request as a client leaves it in a chunk: 32 bytes of
/// user header, then the READ message with `descriptors` (`sg_cnt` = their
/// number), placed so the data room before it is `room` bytes. Returns
/// (bytes, message offset).
pub fn raw_read_message(descriptors: &[BufferDesc], room: u32) -> (Vec<u8>, u32) {
    let usr_len = 32u16;
    let mut bytes = vec![0u8; usize::from(usr_len)];
    let mut msg = [0u8; 24];
    ReadMsg {
        usr_len,
        flags: ReadFlags(0),
        desc: descriptors.first().copied(),
    }
    .emit(&mut msg)
    .unwrap();
    msg[6..8].copy_from_slice(&(descriptors.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&msg[..8]);
    for desc in descriptors {
        // struct rtrs_sg_desc: addr le64, key le32, len le32.
        bytes.extend_from_slice(&desc.addr.to_le_bytes());
        bytes.extend_from_slice(&desc.rkey.0.to_le_bytes());
        bytes.extend_from_slice(&desc.len.to_le_bytes());
    }
    (bytes, room + u32::from(usr_len))
}

/// State of one workload slot.
#[derive(Clone, Copy, Debug)]
enum SlotState {
    Idle,
    Writing { tag: u64, offset: u64, len: u32 },
    Reading { tag: u64, offset: u64, len: u32 },
}

/// Background IO of a [`Node`]: `slots` independent streams, each owning
/// [`Workload::AREA`] bytes of the device, alternating a patterned write and
/// a read of some block of its area (the one just written, or an older
/// one), every read checked byte for byte against a shadow copy. The read
/// buffer is scrubbed before each read, so a read that returns nothing
/// cannot pass. Never allocates after [`Fabric::start_workload`].
pub struct Workload {
    device: Device,
    slots: Vec<(SlotState, u64)>,
    shadow: Vec<u8>,
    base: u64,
    sizes: &'static [u32],
    rng: u64,
    next_tag: u64,
    /// Submit new IO (false: let what is in flight finish).
    pub running: bool,
    /// IOs completed (writes and reads).
    pub completed: u64,
    /// Reads completed and checked.
    pub reads_checked: u64,
    /// Completions with a non-zero errno: (tag, errno).
    pub errors: Vec<(u64, u16)>,
    /// Reads whose bytes differed from the shadow.
    pub mismatches: u64,
    /// Submissions the client refused.
    pub submit_failures: u64,
}

impl Workload {
    /// Bytes of the device each slot owns.
    pub const AREA: u64 = 64 * 1024;
    /// Bytes of the node buffer each slot uses.
    const BUFFER_STRIDE: u32 = 32 * 1024;

    fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|(s, _)| !matches!(s, SlotState::Idle))
            .count()
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Asserts the workload saw no error, no mismatch and no refused
    /// submission, and completed at least `at_least` IOs.
    pub fn assert_clean(&self, at_least: u64) {
        assert!(self.errors.is_empty(), "workload errors: {:?}", self.errors);
        assert_eq!(self.mismatches, 0, "workload read mismatches");
        assert_eq!(self.submit_failures, 0, "workload submissions refused");
        assert!(
            self.completed >= at_least,
            "workload completed only {} IOs (wanted {at_least})",
            self.completed
        );
    }
}

impl Node {
    /// A Brick-client host at `mac` / `ip` whose client accepts a server
    /// queue depth up to `max_queue_depth`; `seed` seeds its keys and, with
    /// the last byte of `ip`, its session and path uuids.
    pub fn new(mac: [u8; 6], ip: [u8; 4], max_queue_depth: u16, seed: u64) -> Self {
        let mut hca = client_hca(mac, ip, seed);
        let handle = hca.alloc(NODE_BUFFER, 4096).unwrap();
        let buffer = hca
            .reg_mr(
                handle,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        // The client derives its uuids from `first 8 bytes ^ last 8 bytes`:
        // keep that distinct per (seed, host), or two clients share a
        // session uuid (and the engine rightly refuses the second).
        let mut uuid_seed = [0u8; 16];
        uuid_seed[..8].copy_from_slice(&(seed << 8 | u64::from(ip[3])).to_le_bytes());
        uuid_seed[8..].copy_from_slice(&0x5555_0000_0000_0000u64.to_le_bytes());
        let mut config = ClientConfig::default_with_seed(uuid_seed);
        config.max_queue_depth = max_queue_depth;
        config.max_paths = 1;
        config.max_connections_per_path = 4;
        config.max_header_len = 1024;
        let client = Client::new(hca, config).expect("client");
        Node {
            client,
            mac,
            alive: true,
            events: Vec::with_capacity(256),
            inbox: VecDeque::with_capacity(1024),
            buffer,
            workload: None,
        }
    }

    /// Hands one received frame to the node's HCA.
    pub fn receive(&mut self, now: u64, frame: &[u8]) {
        self.client.verbs_mut().receive(now, frame);
    }

    /// Polls the client and its HCA (frames out through `transmit`), takes
    /// the client's events and advances the workload.
    pub fn poll(&mut self, now: u64, transmit: &mut impl FnMut(&[u8], &[&[u8]], &[u8])) {
        self.client.poll(now);
        self.client.verbs_mut().poll(now, transmit);
        while let Some(event) = self.client.next_event() {
            self.events.push(event);
        }
        pump_workload(self);
    }

    /// When the node next has work (its client's timers, its HCA's).
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        match (self.client.poll_at(), self.client.verbs().poll_at(now)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl RawNode {
    /// A raw host at `mac` / `ip`; `seed` seeds its keys and its session
    /// and path uuids (by its low byte).
    pub fn new(mac: [u8; 6], ip: [u8; 4], seed: u64) -> Self {
        let mut hca = client_hca(mac, ip, seed);
        let handle = hca.alloc(RAW_MEMORY, 4096).unwrap();
        let memory = hca
            .reg_mr(handle, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        RawNode {
            hca,
            mac,
            alive: true,
            inbox: VecDeque::new(),
            cm_events: Vec::new(),
            completions: Vec::new(),
            memory,
            session: None,
            hold_receives: false,
            seed,
            stage_next: 0,
        }
    }

    /// Hands one received frame to the node's HCA.
    pub fn receive(&mut self, now: u64, frame: &[u8]) {
        self.hca.receive(now, frame);
    }

    /// Polls the HCA (frames out through `transmit`), takes its connection
    /// events and completions (receive slots reposted, RKEY_RSPs applied).
    pub fn poll(&mut self, now: u64, transmit: &mut impl FnMut(&[u8], &[&[u8]], &[u8])) {
        self.hca.poll(now, transmit);
        while let Some(event) = self.hca.poll_cm_event() {
            self.cm_events.push(event);
        }
        raw_completions(self);
    }

    /// When the node's HCA next has work.
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        self.hca.poll_at(now)
    }
}

/// Where the nodes live: how frames move between them and the server, and
/// what the clock is. Everything a node does is a provided method.
pub trait Fabric: Sized {
    /// The clock, nanoseconds.
    fn now(&self) -> u64;
    /// The server's RTRS listener.
    fn server(&self) -> SocketAddr;
    /// Brick-client nodes.
    fn clients(&self) -> &[Node];
    /// Brick-client nodes, to change.
    fn clients_mut(&mut self) -> &mut Vec<Node>;
    /// Raw nodes.
    fn raws(&self) -> &[RawNode];
    /// Raw nodes, to change.
    fn raws_mut(&mut self) -> &mut Vec<RawNode>;
    /// Moves frames both ways and polls everything once.
    fn step(&mut self);
    /// Steps until `done(fabric)`; panics with "timed out waiting for
    /// {what}" (and whatever the fabric can say about the server) once the
    /// fabric's budget for one wait is spent.
    fn run_until(&mut self, what: &str, done: impl FnMut(&mut Self) -> bool);

    /// Steps `count` times.
    fn run_steps(&mut self, count: usize) {
        for _ in 0..count {
            self.step();
        }
    }

    // ----- Brick-client nodes ------------------------------------------------

    /// Connects node `i`'s session `name` with `connections` connections;
    /// waits for `SessionUp` (Ok) or the first failed attempt (Err).
    fn connect(&mut self, i: usize, name: &str, connections: u16) -> Result<(), PathError> {
        let now = self.now();
        let server = self.server();
        self.clients_mut()[i]
            .client
            .connect_session(name, &[server], connections, now)
            .expect("connect_session");
        let mut outcome = None;
        self.run_until("session up or connect failure", |w| {
            let events = &mut w.clients_mut()[i].events;
            if let Some(at) = events.iter().position(|e| {
                matches!(e, Event::SessionUp { .. } | Event::PathConnectFailed { .. })
            }) {
                outcome = Some(events.remove(at));
                return true;
            }
            false
        });
        match outcome {
            Some(Event::PathConnectFailed { reason, .. }) => Err(reason),
            _ => Ok(()),
        }
    }

    /// Closes node `i`'s session and waits until the client reports the
    /// path closed.
    fn close_session(&mut self, i: usize) {
        let now = self.now();
        self.clients_mut()[i].client.close_session(now);
        self.run_until("client path closed", |w| {
            w.clients_mut()[i]
                .events
                .iter()
                .any(|e| matches!(e, Event::PathClosed { .. }))
        });
        self.clients_mut()[i]
            .events
            .retain(|e| !matches!(e, Event::PathClosed { .. }));
    }

    /// Waits for node `i`'s completion of `tag`: (errno, read buffer).
    fn completion(&mut self, i: usize, tag: u64) -> (u16, Option<ReadBuffer>) {
        let mut found = None;
        self.run_until("IO completion", |w| {
            let events = &mut w.clients_mut()[i].events;
            if let Some(at) = events
                .iter()
                .position(|e| matches!(e, Event::IoCompleted { tag: t, .. } if *t == tag))
            {
                found = Some(events.remove(at));
                return true;
            }
            false
        });
        match found {
            Some(Event::IoCompleted { errno, read, .. }) => (errno, read),
            _ => unreachable!(),
        }
    }

    /// Submits an RTRS READ carrying `header`; the reply (`len` bytes) goes
    /// to node `i`'s ad-hoc buffer. Returns (errno, reply bytes).
    fn read_request(
        &mut self,
        i: usize,
        tag: u64,
        header: &[u8],
        len: u32,
        admin: bool,
    ) -> (u16, Vec<u8>) {
        let node = &mut self.clients_mut()[i];
        let region = node.buffer;
        node.client
            .verbs_mut()
            .with_slice_mut(region.handle, ADHOC, len.max(1), |b| b.fill(0xee))
            .unwrap();
        node.client
            .submit(ClientIo {
                tag,
                header,
                direction: Direction::Read {
                    dest: ReadBuffer {
                        region,
                        offset: ADHOC,
                        len,
                    },
                },
                admin,
                hint: None,
            })
            .expect("submit read");
        let (errno, read) = self.completion(i, tag);
        let mut out = vec![0; len as usize];
        if let Some(read) = read {
            self.clients_mut()[i]
                .client
                .read_response(&read, &mut out)
                .unwrap();
        }
        (errno, out)
    }

    /// Submits an RTRS WRITE carrying `header` and `data` (from node `i`'s
    /// ad-hoc buffer); returns the errno.
    fn write_request(
        &mut self,
        i: usize,
        tag: u64,
        header: &[u8],
        data: &[u8],
        admin: bool,
    ) -> u16 {
        let node = &mut self.clients_mut()[i];
        let region = node.buffer;
        node.client
            .verbs_mut()
            .write(region.handle, ADHOC, data)
            .unwrap();
        let mut sgl = Sgl::new();
        if !data.is_empty() {
            sgl = Sgl::single(Sge::new(region.lkey, ADHOC, data.len() as u32));
        }
        node.client
            .submit(ClientIo {
                tag,
                header,
                direction: Direction::Write { data: sgl },
                admin,
                hint: None,
            })
            .expect("submit write");
        self.completion(i, tag).0
    }

    /// SESS_INFO: the protocol version the server answers with.
    fn sess_info(&mut self, i: usize, tag: u64) -> u8 {
        let mut header = [0u8; 64];
        let out = rnbd_client::sess_info(&mut header).unwrap();
        let (errno, reply) =
            self.read_request(i, tag, &header[..out.user_header_len], out.data_len, true);
        rnbd_client::sess_info_rsp(errno, &reply).expect("SESS_INFO_RSP")
    }

    /// OPEN `path` with `mode`: the device or the errno.
    fn open(&mut self, i: usize, tag: u64, path: &str, mode: AccessMode) -> Result<Device, u16> {
        let mut header = [0u8; 1024];
        let out = rnbd_client::open(path, mode, &mut header).unwrap();
        let (errno, reply) =
            self.read_request(i, tag, &header[..out.user_header_len], out.data_len, true);
        if errno != 0 {
            return Err(errno);
        }
        Ok(Device::from_open_rsp(errno, &reply, mode).expect("OPEN_RSP"))
    }

    /// CLOSE `device`: the errno.
    fn close_device(&mut self, i: usize, tag: u64, device: &Device) -> u16 {
        let mut header = [0u8; 64];
        let out = device.close(&mut header).unwrap();
        self.write_request(i, tag, &header[..out.user_header_len], &[], true)
    }

    /// An RNBD WRITE of `data` at `offset`: the errno.
    fn write(&mut self, i: usize, tag: u64, device: &Device, offset: u64, data: &[u8]) -> u16 {
        let mut header = [0u8; 64];
        let out = device
            .write(offset, data.len() as u32, false, &mut header)
            .unwrap();
        assert_eq!(out.direction, RtrsDirection::Write);
        self.write_request(i, tag, &header[..out.user_header_len], data, false)
    }

    /// An RNBD READ of `len` bytes at `offset`: (errno, bytes).
    fn read(
        &mut self,
        i: usize,
        tag: u64,
        device: &Device,
        offset: u64,
        len: u32,
    ) -> (u16, Vec<u8>) {
        let mut header = [0u8; 64];
        let out = device.read(offset, len, &mut header).unwrap();
        self.read_request(i, tag, &header[..out.user_header_len], len, false)
    }

    /// Starts background IO on node `i` through `device` (open RW): `slots`
    /// streams from byte `base` of the device, IO sizes taken from `sizes`.
    fn start_workload(
        &mut self,
        i: usize,
        device: Device,
        base: u64,
        slots: usize,
        sizes: &'static [u32],
    ) {
        assert!(slots as u32 * Workload::BUFFER_STRIDE <= ADHOC);
        assert!(sizes
            .iter()
            .all(|&s| s <= Workload::BUFFER_STRIDE && s % 4096 == 0));
        self.clients_mut()[i].workload = Some(Workload {
            device,
            slots: vec![(SlotState::Idle, 0); slots],
            shadow: vec![0; slots * Workload::AREA as usize],
            base,
            sizes,
            rng: 0x1234_5678_9abc_def1 ^ base,
            next_tag: 0,
            running: true,
            completed: 0,
            reads_checked: 0,
            errors: Vec::with_capacity(64),
            mismatches: 0,
            submit_failures: 0,
        });
    }

    /// The workload of node `i`.
    fn workload(&self, i: usize) -> &Workload {
        self.clients()[i]
            .workload
            .as_ref()
            .expect("workload started")
    }

    /// IOs node `i`'s workload has in flight.
    fn workload_in_flight(&self, i: usize) -> usize {
        self.workload(i).in_flight()
    }

    /// Runs until node `i`'s workload completed `more` further IOs.
    fn workload_progress(&mut self, i: usize, more: u64) {
        let target = self.workload(i).completed + more;
        self.run_until("workload progress", |w| w.workload(i).completed >= target);
    }

    /// Stops submitting and waits until node `i`'s workload is idle.
    fn stop_workload(&mut self, i: usize) {
        self.clients_mut()[i].workload.as_mut().unwrap().running = false;
        self.run_until("workload drained", |w| w.workload(i).in_flight() == 0);
    }

    // ----- raw nodes -----------------------------------------------------------

    /// Sends a CM REQ carrying `private_data` from raw node `r`; waits for
    /// the REP (the connection and the CONN_RSP) or the REJ.
    fn raw_connect(
        &mut self,
        r: usize,
        private_data: &[u8],
    ) -> Result<(ConnId, ConnRsp), RawRefusal> {
        let server = self.server();
        let conn = self.raws_mut()[r]
            .hca
            .connect(server, &ConnParams::new(private_data, 128, 1024))
            .expect("connect");
        let mut outcome = None;
        self.run_until("raw connect outcome", |w| {
            let events = &mut w.raws_mut()[r].cm_events;
            if let Some(at) = events.iter().position(|e| {
                e.conn() == conn
                    && matches!(
                        e,
                        CmEvent::Established { .. }
                            | CmEvent::Rejected { .. }
                            | CmEvent::Unreachable { .. }
                    )
            }) {
                outcome = Some(events.remove(at));
                return true;
            }
            false
        });
        match outcome.unwrap() {
            CmEvent::Established { private_data, .. } => {
                let rsp = ConnRsp::parse(private_data.as_slice()).expect("CONN_RSP in REP");
                Ok((conn, rsp))
            }
            CmEvent::Rejected {
                reason,
                private_data,
                ..
            } => {
                let _ = self.raws_mut()[r].hca.destroy(conn);
                Err(RawRefusal::Rejected(
                    reason,
                    ConnRsp::parse(private_data.as_slice()).ok(),
                ))
            }
            _ => {
                let _ = self.raws_mut()[r].hca.destroy(conn);
                Err(RawRefusal::Unreachable)
            }
        }
    }

    /// Sets up a session the way Linux's client does (rtrs.md §2-§3):
    /// `cid_num` connections in order, INFO_RSP buffer and 8-byte receive
    /// slots posted, INFO_REQ named `name`, INFO_RSP parsed.
    fn raw_establish(&mut self, r: usize, name: &str, cid_num: u16) {
        self.raw_try_establish(r, &info_req(name.as_bytes()), cid_num, cid_num)
            .expect("the server closed the path instead of answering INFO_REQ");
    }

    /// As [`Fabric::raw_establish`], but with INFO_REQ bytes `info` sent
    /// once only the first `connect` of the `cid_num` connections are up.
    /// `Err(())` if the server closed the path instead of answering (the
    /// connections are then destroyed and no session is kept).
    fn raw_try_establish(
        &mut self,
        r: usize,
        info: &[u8],
        cid_num: u16,
        connect: u16,
    ) -> Result<(), ()> {
        let (path, session) = raw_uuids(&self.raws()[r]);
        self.raw_try_establish_as(r, info, cid_num, connect, path, session)
    }

    /// As [`Fabric::raw_try_establish`], with the path and session uuids
    /// given (a second path of a session, a session of another node's).
    fn raw_try_establish_as(
        &mut self,
        r: usize,
        info: &[u8],
        cid_num: u16,
        connect: u16,
        path: Uuid,
        session: Uuid,
    ) -> Result<(), ()> {
        let mut conns = Vec::new();
        let mut first = None;
        for cid in 0..connect {
            let (conn, rsp) = self
                .raw_connect(r, &con_req(cid, cid_num, path, session))
                .unwrap_or_else(|e| panic!("raw cid {cid} refused: {e:?}"));
            assert!(rsp.is_accept());
            first.get_or_insert(rsp);
            conns.push(conn);
        }
        let rsp = first.unwrap();
        let queue_depth = rsp.queue_depth;
        let chunk_size = rsp.chunk_size().unwrap();
        let node = &mut self.raws_mut()[r];
        let memory = node.memory;
        let info_len = 8 + 16 * u32::from(queue_depth);
        node.hca
            .post_recv(
                conns[0],
                &[RecvWr {
                    wr_id: raw_wr_id(RAW_KIND_INFO, 0, 0),
                    sgl: Sgl::single(memory.sge(RAW_INFO_RSP, info_len)),
                }],
            )
            .unwrap();
        for (index, conn) in conns.iter().enumerate() {
            for slot in 0..RAW_SLOTS_PER_CONN {
                let at = slot_offset(index as u32, slot);
                node.hca
                    .post_recv(
                        *conn,
                        &[RecvWr {
                            wr_id: raw_wr_id(RAW_KIND_SLOT, index as u32, slot),
                            sgl: Sgl::single(memory.sge(at, RkeyRsp::LEN as u32)),
                        }],
                    )
                    .unwrap();
            }
        }
        node.hca.write(memory.handle, RAW_STAGE, info).unwrap();
        node.hca
            .post_send(
                conns[0],
                &[SendWr {
                    wr_id: raw_wr_id(RAW_KIND_SEND, 0, 0),
                    signaled: true,
                    op: SendOp::Send {
                        sgl: Sgl::single(memory.sge(RAW_STAGE, info.len() as u32)),
                        imm: None,
                    },
                }],
            )
            .unwrap();
        let closed = |node: &RawNode| {
            node.cm_events
                .iter()
                .any(|e| matches!(e, CmEvent::Disconnected { conn } if conns.contains(conn)))
        };
        self.run_until("INFO_RSP or close", |w| {
            let node = &w.raws_mut()[r];
            closed(node)
                || node
                    .completions
                    .iter()
                    .any(|wc| wc.wr_id.0 >> 56 == RAW_KIND_INFO && wc.status.is_success())
        });
        if closed(&self.raws_mut()[r]) {
            self.run_until("every raw connection disconnected", |w| {
                conns.iter().all(|c| {
                    w.raws_mut()[r]
                        .cm_events
                        .iter()
                        .any(|e| matches!(e, CmEvent::Disconnected { conn } if conn == c))
                })
            });
            let node = &mut self.raws_mut()[r];
            for conn in conns {
                let _ = node.hca.destroy(conn);
            }
            node.cm_events.clear();
            node.completions.clear();
            return Err(());
        }
        let node = &mut self.raws_mut()[r];
        let at = node
            .completions
            .iter()
            .position(|wc| wc.wr_id.0 >> 56 == RAW_KIND_INFO)
            .unwrap();
        node.completions.remove(at);
        let mut bytes = vec![0u8; info_len as usize];
        node.hca
            .read(memory.handle, RAW_INFO_RSP, &mut bytes)
            .unwrap();
        let info = InfoRsp::parse(&bytes).expect("INFO_RSP");
        info.check_layout(queue_depth, chunk_size)
            .expect("INFO_RSP layout");
        let chunks = (0..u32::from(queue_depth))
            .map(|id| info.chunk(chunk_size, id).unwrap())
            .collect();
        node.session = Some(RawSession {
            conns,
            chunks,
            queue_depth,
            chunk_size,
            layout: ImmLayout::for_queue_depth(queue_depth).unwrap(),
            new_rkey: rsp.flags.contains(ConnRspFlags::NEW_RKEY),
        });
        // Let the send completion and any stragglers arrive.
        self.run_steps(20);
        self.raws_mut()[r].completions.clear();
        Ok(())
    }

    /// The established session of raw node `r`.
    fn raw_session(&self, r: usize) -> &RawSession {
        self.raws()[r].session.as_ref().expect("raw session")
    }

    /// Posts, in one `post_send` on cid `cid`, one RDMA WRITE WITH IMM per
    /// `(chunk, at, bytes, imm)`: `bytes` written at offset `at` of the
    /// server's chunk `chunk` (zero-length if empty: no address, rkey 0),
    /// carrying immediate `imm`.
    fn raw_post(&mut self, r: usize, cid: usize, requests: &[(u16, u32, &[u8], u32)]) {
        let node = &mut self.raws_mut()[r];
        let session = node.session.as_ref().expect("raw session");
        let conn = session.conns[cid];
        let memory = node.memory;
        let mut wrs = Vec::new();
        for &(chunk, at, bytes, imm) in requests {
            assert!(bytes.len() as u32 <= RAW_STAGE_LEN);
            let (sgl, remote_addr, rkey) = if bytes.is_empty() {
                (Sgl::new(), 0, verbs::Rkey(0))
            } else {
                let stage = RAW_STAGE + (node.stage_next % 4) * RAW_STAGE_LEN;
                node.stage_next += 1;
                node.hca.write(memory.handle, stage, bytes).unwrap();
                let desc = session.chunks[usize::from(chunk)];
                (
                    Sgl::single(memory.sge(stage, bytes.len() as u32)),
                    desc.addr + u64::from(at),
                    desc.rkey,
                )
            };
            wrs.push(SendWr {
                wr_id: raw_wr_id(RAW_KIND_SEND, cid as u32, 1),
                signaled: true,
                op: SendOp::RdmaWrite {
                    sgl,
                    remote_addr,
                    rkey,
                    imm: Some(imm),
                },
            });
        }
        node.hca.post_send(conn, &wrs).expect("raw post_send");
    }

    /// The IO_REQ immediate for `chunk` and message offset `offset`.
    fn raw_imm(&self, r: usize, chunk: u32, offset: u32) -> u32 {
        let payload = self
            .raw_session(r)
            .layout
            .join(chunk, offset)
            .expect("representable");
        Imm::IoReq { payload }.encode().unwrap()
    }

    /// Waits until the server answers `msg_id` (the errno) or closes the
    /// path (a connection of the session is disconnected).
    fn raw_await(&mut self, r: usize, msg_id: u32) -> RawOutcome {
        let mut outcome = None;
        self.run_until("raw answer or close", |w| {
            let node = &mut w.raws_mut()[r];
            let conns = &node.session.as_ref().unwrap().conns;
            let answer = node.completions.iter().position(|wc| {
                wc.opcode.is_receive()
                    && wc.status.is_success()
                    && matches!(
                        wc.imm.map(Imm::decode),
                        Some(Imm::IoRsp { msg_id: m, .. } | Imm::IoRspWithInvalidate { msg_id: m, .. }) if m == msg_id
                    )
            });
            if let Some(at) = answer {
                let wc = node.completions.remove(at);
                let errno = match wc.imm.map(Imm::decode) {
                    Some(Imm::IoRsp { errno, .. } | Imm::IoRspWithInvalidate { errno, .. }) => {
                        errno
                    }
                    _ => unreachable!(),
                };
                outcome = Some(RawOutcome::Answered(errno));
                return true;
            }
            if node.cm_events.iter().any(|e| {
                matches!(e, CmEvent::Disconnected { conn } if conns.contains(conn))
            }) {
                outcome = Some(RawOutcome::Closed);
                return true;
            }
            false
        });
        outcome.unwrap()
    }

    /// Sends a well-formed RNBD SESS_INFO as an RTRS READ from raw node `r`
    /// on chunk `chunk` (the reply lands at [`RAW_READ_DEST`]): how the
    /// server answered and, if it answered 0, the protocol version of the
    /// SESS_INFO_RSP.
    fn raw_sess_info(&mut self, r: usize, chunk: u16) -> (RawOutcome, Option<u8>) {
        let mut header = [0u8; 64];
        let out = rnbd_client::sess_info(&mut header).unwrap();
        let usr_len = out.user_header_len;
        let memory = self.raws()[r].memory;
        let mut bytes = header[..usr_len].to_vec();
        let mut msg = [0u8; 24];
        let n = ReadMsg {
            usr_len: usr_len as u16,
            flags: ReadFlags(0),
            desc: Some(BufferDesc {
                addr: memory.remote_addr(RAW_READ_DEST),
                rkey: memory.rkey,
                len: out.data_len,
            }),
        }
        .emit(&mut msg)
        .unwrap();
        bytes.extend_from_slice(&msg[..n]);
        let imm = self.raw_imm(r, u32::from(chunk), out.data_len + usr_len as u32);
        self.raw_post(r, 0, &[(chunk, out.data_len, &bytes, imm)]);
        let outcome = self.raw_await(r, u32::from(chunk));
        if outcome != RawOutcome::Answered(0) {
            return (outcome, None);
        }
        let mut reply = vec![0u8; out.data_len as usize];
        self.raws_mut()[r]
            .hca
            .read(memory.handle, RAW_READ_DEST, &mut reply)
            .unwrap();
        (outcome, rnbd_client::sess_info_rsp(0, &reply).ok())
    }

    /// Whether every connection of raw node `r`'s session is disconnected.
    fn raw_all_disconnected(&self, r: usize) -> bool {
        let node = &self.raws()[r];
        node.session.as_ref().unwrap().conns.iter().all(|c| {
            node.cm_events
                .iter()
                .any(|e| matches!(e, CmEvent::Disconnected { conn } if conn == c))
        })
    }

    /// Tears raw node `r`'s session down from its side (DREQ on every
    /// connection still up), waits for every connection to be
    /// disconnected, destroys them.
    fn raw_teardown(&mut self, r: usize) {
        let conns = self.raw_session(r).conns.clone();
        for conn in &conns {
            let down = self.raws_mut()[r]
                .cm_events
                .iter()
                .any(|e| matches!(e, CmEvent::Disconnected { conn: c } if c == conn));
            if !down {
                let _ = self.raws_mut()[r].hca.disconnect(*conn);
            }
        }
        self.run_until("raw connections disconnected", |w| {
            w.raw_all_disconnected(r)
        });
        for conn in conns {
            let _ = self.raws_mut()[r].hca.destroy(conn);
        }
        let node = &mut self.raws_mut()[r];
        node.session = None;
        node.cm_events.clear();
        node.completions.clear();
    }
}

/// The (path, session) uuids [`Fabric::raw_establish`] uses for `node`.
pub fn raw_uuids(node: &RawNode) -> (Uuid, Uuid) {
    (
        Uuid([(node.seed as u8) ^ 0xa5; 16]),
        Uuid([(node.seed as u8) ^ 0x5a; 16]),
    )
}

fn slot_offset(conn_index: u32, slot: u32) -> u32 {
    RAW_SLOTS + (conn_index * RAW_SLOTS_PER_CONN + slot) * RkeyRsp::LEN as u32
}

/// Reposts receive slots, applies RKEY_RSPs, keeps the rest.
fn raw_completions(node: &mut RawNode) {
    let mut batch = [WorkCompletion::default(); 16];
    loop {
        let count = node.hca.poll_cq(&mut batch);
        if count == 0 {
            break;
        }
        for wc in &batch[..count] {
            let kind = wc.wr_id.0 >> 56;
            if kind == RAW_KIND_SLOT && wc.status.is_success() {
                let conn_index = (wc.wr_id.0 >> 32) as u32 & 0xff_ffff;
                let slot = wc.wr_id.0 as u32;
                let at = slot_offset(conn_index, slot);
                if wc.byte_len as usize >= RkeyRsp::LEN {
                    let mut bytes = [0u8; RkeyRsp::LEN];
                    node.hca.read(node.memory.handle, at, &mut bytes).unwrap();
                    if let (Ok(rsp), Some(session)) =
                        (RkeyRsp::parse(&bytes), node.session.as_mut())
                    {
                        if let Some(chunk) = session.chunks.get_mut(usize::from(rsp.buf_id)) {
                            chunk.rkey = rsp.rkey;
                        }
                    }
                }
                if node.hold_receives {
                    node.completions.push(*wc);
                    continue;
                }
                let _ = node.hca.post_recv(
                    wc.conn,
                    &[RecvWr {
                        wr_id: wc.wr_id,
                        sgl: Sgl::single(node.memory.sge(at, RkeyRsp::LEN as u32)),
                    }],
                );
            }
            node.completions.push(*wc);
        }
    }
}

/// Advances node `node`'s workload: takes its completions, submits new IO.
fn pump_workload(node: &mut Node) {
    let Some(workload) = node.workload.as_mut() else {
        return;
    };
    let client = &mut node.client;
    let buffer = node.buffer;
    node.events.retain(|event| {
        let Event::IoCompleted { tag, errno, .. } = *event else {
            return true;
        };
        if tag & WORKLOAD_TAG == 0 {
            return true;
        }
        let slot = ((tag >> 32) & 0xffff) as usize;
        let (state, _) = workload.slots[slot];
        workload.completed += 1;
        if errno != 0 {
            workload.errors.push((tag, errno));
        }
        match state {
            SlotState::Reading {
                tag: t,
                offset,
                len,
            } if t == tag && errno == 0 => {
                let area = (offset - workload.base) as usize;
                let expected = &workload.shadow[area..area + len as usize];
                let at = slot as u32 * Workload::BUFFER_STRIDE;
                let same = client
                    .verbs()
                    .with_slice(buffer.handle, at, len, |bytes| bytes == expected)
                    .unwrap_or(false);
                workload.reads_checked += 1;
                if !same {
                    workload.mismatches += 1;
                }
            }
            _ => {}
        }
        workload.slots[slot].0 = SlotState::Idle;
        false
    });
    if !workload.running || !client.is_up() {
        return;
    }
    for slot in 0..workload.slots.len() {
        if !matches!(workload.slots[slot].0, SlotState::Idle) {
            continue;
        }
        let op = workload.slots[slot].1;
        workload.slots[slot].1 += 1;
        let len = workload.sizes[(workload.next_random() % workload.sizes.len() as u64) as usize];
        let blocks = (Workload::AREA - u64::from(len)) / 4096 + 1;
        let offset =
            workload.base + slot as u64 * Workload::AREA + (workload.next_random() % blocks) * 4096;
        let area = (offset - workload.base) as usize;
        let at = slot as u32 * Workload::BUFFER_STRIDE;
        workload.next_tag += 1;
        let tag = WORKLOAD_TAG | (slot as u64) << 32 | (workload.next_tag & 0xffff_ffff);
        let mut header = [0u8; 64];
        let write = op % 2 == 0;
        let (out, direction) = if write {
            let seed = workload.next_random();
            let shadow = &mut workload.shadow[area..area + len as usize];
            fill_pattern(seed, shadow);
            client.verbs_mut().write(buffer.handle, at, shadow).unwrap();
            let out = workload
                .device
                .write(offset, len, false, &mut header)
                .unwrap();
            (
                out,
                Direction::Write {
                    data: Sgl::single(Sge::new(buffer.lkey, at, len)),
                },
            )
        } else {
            client
                .verbs_mut()
                .with_slice_mut(buffer.handle, at, len, |b| b.fill(0xee))
                .unwrap();
            let out = workload.device.read(offset, len, &mut header).unwrap();
            (
                out,
                Direction::Read {
                    dest: ReadBuffer {
                        region: buffer,
                        offset: at,
                        len,
                    },
                },
            )
        };
        let submitted = client.submit(ClientIo {
            tag,
            header: &header[..out.user_header_len],
            direction,
            admin: false,
            hint: None,
        });
        if submitted.is_err() {
            workload.submit_failures += 1;
            continue;
        }
        workload.slots[slot].0 = if write {
            SlotState::Writing { tag, offset, len }
        } else {
            SlotState::Reading { tag, offset, len }
        };
    }
}

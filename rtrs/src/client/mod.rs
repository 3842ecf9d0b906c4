//! The RTRS client: a session of paths of connections, permits, IO
//! submission, heartbeats, failover and reconnect (Brick's userspace
//! initiator, issue 5).
//!
//! Sans-IO over the fabric seam ([`verbs::Verbs`]): the owner of the run loop
//! calls [`Client::poll`] with the time (nanoseconds), sleeps until
//! [`Client::poll_at`], reads [`Client::next_event`] and submits requests with
//! [`Client::submit`]. Behaviour follows `docs/protocol/rtrs.md` from the
//! client side: §2 establishment (one connection at a time in cid order,
//! CON_REQ with the shared session uuid and a per-path uuid, `first_conn` and
//! `recon_cnt` as Linux sets them, CONN_RSP checks), §3 INFO_REQ/INFO_RSP
//! (validated per §3.3), §4 the IO path (permits = chunks, WRITE and READ
//! layouts, IO_RSP immediates, RKEY_RSP in NEW_RKEY mode), §5 heartbeats,
//! §6.2 error recovery and reconnect, §7 multipath and failover.
//!
//! # Memory
//!
//! Every table (paths, connections, the permit table, chunk tables, the event
//! queue) is allocated once in [`Client::new`] from the [`ClientConfig`]
//! capacities, and so is the registered memory: one header buffer per permit
//! (the user header plus the RTRS message, copied in at submission) and, per
//! path slot, one control buffer (INFO_REQ, INFO_RSP and the 8-byte receive
//! slots). Nothing allocates afterwards.
//!
//! # Read buffers
//!
//! A READ names one consumer buffer already registered with remote-write
//! access ([`ReadBuffer`]). The client sends it with `flags = 0` (no
//! `NEED_INVAL`), as rtrs.md §9 recommends for a userspace client: the buffer
//! is pre-registered, not a per-IO fast-reg MR, so it cannot be invalidated
//! remotely. The server answers with RDMA WRITE + a type-1 completion. The
//! same applies to RNBD admin messages (SESS_INFO, OPEN), whose response the
//! server RDMA-writes into the read buffer: the completion event hands the
//! [`ReadBuffer`] back, and [`Client::read_response`] copies the bytes out.
//!
//! # State diagram
//!
//! ```text
//!  Pending ──(its turn: paths come up one at a time)──► Connecting{cid}
//!  Connecting{cid} ──Established + CONN_RSP ok──► Connecting{cid+1} … ──all up──►
//!  WaitingForInfoRsp ──INFO_RSP ok──► Connected ──► PathUp (+ SessionUp)
//!  any state ──CM error / WC error / heartbeat timeout / bad CONN_RSP or
//!              INFO_RSP / timeout──► Disconnecting ──all conns gone──►
//!  WaitingToReconnect{at} ──at──► Connecting{0} (recon_cnt + 1)
//!                         (or Closed when the attempts are exhausted)
//! ```
//!
//! Paths are brought up one at a time (as Linux's `rtrs_clt_open` does), so
//! a second path's cid 0 finds the server session the first one created
//! (`first_conn = 0` until the path has been up once, rtrs.md §2.3). A path
//! waiting for its connect timeout therefore delays the others' attempts.
//! [`Client::close_session`] moves every path to `Closed`.
//!
//! A request (one per permit) is `Free` or `InFlight { path, send_done,
//! response }`; it completes when both its send completion and its response
//! have arrived. When its path fails it is re-posted on another connected
//! path with the same permit (chunk id), or completed with `ECONNABORTED`.
//!
//! Every request work request is signalled (no selective signalling), so the
//! header buffer is known free when the request completes.
//!
//! # Using it
//!
//! ```text
//! let mut client = Client::new(verbs, ClientConfig::default_with_seed(entropy))?;
//! client.connect_session("sess", &[path_a, path_b], 1 + cpus, now)?;
//! loop {
//!     client.poll(now);
//!     while let Some(event) = client.next_event() { /* SessionUp, IoCompleted … */ }
//!     client.submit(ClientIo { tag, header: &rnbd_msg, direction, admin, hint })?;
//!     sleep_until(client.poll_at());
//! }
//! ```
//!
//! # Limits
//!
//! * Writes carry at most `MAX_SGE - 1` data SGEs (the last SGE is the
//!   header buffer); reads one contiguous registered buffer (`sg_cnt <= 1`,
//!   as the protocol allows).
//! * No per-IO fast registration and so no `NEED_INVAL` (see above); no
//!   min-latency multipath policy (the heartbeat RTT is in [`PathStats`]).
//! * A failed-over request reuses its permit, so its chunk id, on the other
//!   path (rtrs.md §7); Brick's server gives each path its own chunk memory,
//!   a Linux server shares it (the §7 hazard is the server's to handle).

use core::net::SocketAddr;

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use verbs::{
    AccessFlags, CmEvent, ConnId, ConnParams, MemoryRegion, PostError, RecvWr, SendOp, SendWr, Sgl,
    Verbs, WcOpcode, WcStatus, WorkCompletion, WrId,
};

use crate::link::{self, Beat, Heartbeat};
use crate::wire::{
    BufferDesc, ConnReq, ConnRsp, ConnRspFlags, Imm, ImmLayout, InfoReq, InfoRsp, ReadFlags,
    ReadMsg, RkeyRsp, Uuid, WriteMsg, PATHNAME_LEN, VERSION,
};

/// The errno values the client reports: EIO, and ECONNABORTED when no path
/// took a failed-over request (as Linux's client).
pub use ::errno;

/// Multipath policy (rtrs.md §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MultipathPolicy {
    /// Rotate over the connected paths.
    RoundRobin,
    /// The connected path with the fewest requests in flight (Linux default).
    MinInflight,
}

/// Configuration: table capacities, timers and policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Most paths in the session.
    pub max_paths: u16,
    /// Most connections per path (`cid_num`).
    pub max_connections_per_path: u16,
    /// Largest server queue depth accepted (permits allocated up front).
    pub max_queue_depth: u16,
    /// Largest user (RNBD) header a request may carry.
    pub max_header_len: u32,
    /// Multipath policy.
    pub policy: MultipathPolicy,
    /// Heartbeat interval (rtrs.md §5: 5 s).
    pub heartbeat_interval_ns: u64,
    /// Missed heartbeats tolerated before the path is declared dead.
    pub heartbeat_missed_max: u32,
    /// Budget for each connection's establishment and for INFO_RSP.
    pub connect_timeout_ns: u64,
    /// How long a failing path waits for its disconnects before destroying
    /// its connections anyway.
    pub disconnect_timeout_ns: u64,
    /// Delay before each reconnect attempt (Linux/RNBD: 30 s; here ~1 s).
    pub reconnect_delay_ns: u64,
    /// Reconnect attempts in a row before a path is closed; `None` = forever.
    pub max_reconnect_attempts: Option<u32>,
    /// Connection events handled per `poll`.
    pub cm_budget: usize,
    /// Work completions handled per `poll`.
    pub completion_budget: usize,
    /// Capacity of the event queue.
    pub event_capacity: usize,
    /// Entropy for the session and path uuids (the owner supplies it, e.g.
    /// from `getrandom`).
    pub uuid_seed: [u8; 16],
}

impl ClientConfig {
    /// Defaults for Linux/Brick servers: 4 paths, 8 connections, qd 512,
    /// 5 s heartbeats, 1 s reconnect delay.
    pub const fn default_with_seed(uuid_seed: [u8; 16]) -> Self {
        Self {
            max_paths: 4,
            max_connections_per_path: 8,
            max_queue_depth: 512,
            max_header_len: 2048,
            policy: MultipathPolicy::MinInflight,
            heartbeat_interval_ns: crate::wire::HEARTBEAT_INTERVAL_MS as u64 * 1_000_000,
            heartbeat_missed_max: crate::wire::HEARTBEAT_MISSED_MAX,
            connect_timeout_ns: crate::wire::CONNECT_TIMEOUT_MS as u64 * 1_000_000,
            disconnect_timeout_ns: 1_000_000_000,
            reconnect_delay_ns: 1_000_000_000,
            max_reconnect_attempts: None,
            cm_budget: 16,
            completion_budget: 64,
            event_capacity: 256,
            uuid_seed,
        }
    }
}

/// Why [`Client::new`] refused a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A capacity is 0 or out of range (paths ≤ 128, connections ≤ 4096,
    /// queue depth ≥ 2).
    Limits,
    /// The provider could not allocate or register the fixed buffers.
    Memory,
}

/// Why [`Client::connect_session`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionError {
    /// A session was already started.
    AlreadyStarted,
    /// The name is empty, too long, or contains `/` or `.` (rtrs.md §3.2).
    BadName,
    /// No paths, more than `max_paths`, or a bad connection count.
    BadPaths,
}

/// Why [`Client::submit`] refused a request (nothing was posted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// No path is connected.
    NotConnected,
    /// All `queue_depth` permits are in use.
    NoPermit,
    /// The user header exceeds `max_header_len` or the server's header room.
    HeaderTooLong,
    /// The request does not fit the chunk (Linux `EMSGSIZE`).
    TooLarge,
    /// The data SGL has more than `MAX_SGE - 1` entries or overflows.
    TooManySegments,
    /// Posting failed.
    Post(PostError),
}

/// A consumer buffer registered with remote-write access that the server
/// RDMA-writes the read data (or an RNBD admin response) into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBuffer {
    /// The registered region.
    pub region: MemoryRegion,
    /// Offset inside the region.
    pub offset: u32,
    /// Bytes to read (0 for a data-less read such as an RNBD FLUSH).
    pub len: u32,
}

/// Direction and buffers of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Direction {
    /// RTRS WRITE: `data` (local SGEs, at most `MAX_SGE - 1`) goes to the
    /// chunk.
    Write {
        /// The data to write.
        data: Sgl,
    },
    /// RTRS READ: the server writes into `dest`.
    Read {
        /// Where the data goes.
        dest: ReadBuffer,
    },
}

/// A request to submit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIo<'a> {
    /// The consumer's tag, returned in the completion.
    pub tag: u64,
    /// The user (RNBD) header, copied into the permit's header buffer.
    pub header: &'a [u8],
    /// Write or read.
    pub direction: Direction,
    /// Admin/control message: goes on cid 0 (RNBD SESS_INFO, OPEN, CLOSE).
    pub admin: bool,
    /// IO connection hint (e.g. the submitting CPU); `None` = round-robin.
    pub hint: Option<u16>,
}

/// Why a path went down or failed to come up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathError {
    /// The server rejected a connection: the (negative) errno of the REJ's
    /// CONN_RSP, 0 if it had none.
    Rejected(i16),
    /// No answer, no route, or the connection broke.
    Disconnected,
    /// Establishment or INFO_RSP took longer than `connect_timeout_ns`.
    Timeout,
    /// CONN_RSP was malformed or unacceptable.
    BadConnRsp,
    /// The queue depth differs from the session's (fatal, rtrs.md §2.5).
    QueueDepthChanged,
    /// INFO_RSP was malformed or failed the §3.3 checks.
    BadInfoRsp,
    /// A malformed RKEY_RSP or another fatal protocol violation.
    ProtocolViolation,
    /// A work completion failed.
    CompletionError,
    /// No sign of life for `heartbeat_missed_max` intervals.
    HeartbeatTimeout,
    /// Posting failed.
    PostFailed,
    /// The consumer asked for it ([`Client::disconnect_path`]).
    Local,
}

/// What the client tells its consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The first path is up (again): IO may be submitted. `reconnected` is
    /// true after a `SessionDown` (Linux LINK_EV_RECONNECTED: RNBD re-sends
    /// SESS_INFO and OPEN).
    SessionUp {
        /// Whether the session had been down.
        reconnected: bool,
        /// `min(max_io_size)` over the paths so far.
        max_io_size: u32,
    },
    /// The last connected path went down (LINK_EV_DISCONNECTED).
    SessionDown,
    /// A path finished INFO_REQ/INFO_RSP and carries IO.
    PathUp {
        /// Path index (order of `connect_session`).
        path: u16,
    },
    /// A connected path failed; its requests were failed over or failed.
    PathDown {
        /// Path index.
        path: u16,
        /// Why.
        reason: PathError,
    },
    /// A connect attempt of a path failed; it will retry after the delay.
    PathConnectFailed {
        /// Path index.
        path: u16,
        /// Why.
        reason: PathError,
    },
    /// A path gave up reconnecting (attempts exhausted or queue depth
    /// changed).
    PathClosed {
        /// Path index.
        path: u16,
    },
    /// A request completed.
    IoCompleted {
        /// The consumer's tag.
        tag: u64,
        /// 0 = success, else the positive errno.
        errno: u16,
        /// The path whose response completed it; `None` if it was completed
        /// locally: no path took it after a failover or the session was
        /// closing (`errno` is then `ECONNABORTED`, which a server never
        /// caused).
        answered_on: Option<u16>,
        /// For reads: the buffer the server wrote into.
        read: Option<ReadBuffer>,
    },
}

/// Counters of one path (sysfs `stats/rdma`, `stats/reconnects`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Reads completed.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Requests in flight now.
    pub inflight: u32,
    /// Requests the server answered with a non-zero errno on this path.
    pub errors: u64,
    /// Requests moved to this path from a failed one.
    pub failovers: u64,
    /// Successful reconnects.
    pub reconnects: u64,
    /// Failed connect attempts.
    pub connect_failures: u64,
    /// Heartbeats sent.
    pub heartbeats_sent: u64,
    /// Heartbeat acks received.
    pub heartbeats_acked: u64,
    /// Heartbeats answered.
    pub heartbeats_answered: u64,
    /// Ignored immediates or messages (unknown, stale, out of range).
    pub protocol_errors: u64,
    /// Last heartbeat round-trip time.
    pub latency_ns: u64,
}

/// A path's state as seen from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathStatus {
    /// Waiting for its turn to connect.
    Pending,
    /// Connections being established.
    Connecting,
    /// INFO_REQ sent, waiting for INFO_RSP.
    WaitingForInfoRsp,
    /// Carries IO.
    Connected,
    /// Tearing down.
    Disconnecting,
    /// Waiting for the reconnect delay.
    WaitingToReconnect,
    /// Given up.
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PathState {
    Unused,
    Pending,
    Connecting { cid: u16, deadline: u64 },
    WaitingForInfoRsp { deadline: u64 },
    Connected,
    Disconnecting { deadline: u64, close: bool },
    WaitingToReconnect { at: u64 },
    Closed,
}

/// Work request kinds in the top byte of a `WrId`.
const KIND_REQUEST: u8 = 1;
const KIND_RECV: u8 = 2;
const KIND_INFO_RSP: u8 = 3;
const KIND_CONTROL: u8 = 4;

/// A [`link::work_id`]: owner = `path:8 | cid:16`.
fn wr_id(kind: u8, path: u16, cid: u16, low: u32) -> WrId {
    link::work_id(kind, u32::from(path & 0xff) << 16 | u32::from(cid), low)
}

fn split_wr_id(id: WrId) -> (u8, u16, u16, u32) {
    let (kind, owner, low) = link::split_work_id(id);
    (kind, (owner >> 16) as u16, owner as u16, low)
}

/// Bytes of one receive slot (`sizeof(rtrs_msg_rkey_rsp)`, rtrs.md §9).
const RECV_SLOT: u32 = RkeyRsp::LEN as u32;
/// INFO_REQ area in a path's control buffer.
const INFO_REQ_AREA: u32 = 512;
/// READ message with one descriptor.
const READ_MSG_LEN: u32 = (ReadMsg::HEADER_LEN + 16) as u32;

struct PathSlot {
    state: PathState,
    remote: SocketAddr,
    uuid: Uuid,
    recon_cnt: u16,
    first_conn: bool,
    ever_up: bool,
    cid_num: u16,
    conns: Vec<Option<ConnId>>,
    chunks: Vec<BufferDesc>,
    chunk_size: u32,
    max_hdr_size: u32,
    max_io_size: u32,
    new_rkey: bool,
    /// Liveness (rtrs.md §5), while connected.
    heartbeat: Heartbeat,
    heartbeat_sent_at: u64,
    rr_cid: u16,
    attempts: u32,
    control: Option<MemoryRegion>,
    stats: PathStats,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RequestState {
    Free,
    InFlight {
        path: u16,
        send_done: bool,
        response: Option<u16>,
    },
}

struct RequestSlot {
    state: RequestState,
    generation: u16,
    tag: u64,
    /// Local SGL: data SGEs (writes) + the header SGE.
    sgl: Sgl,
    /// Where in the chunk the write starts (0 for writes, `len` for reads).
    remote_offset: u32,
    /// The IO_REQ offset (data + user header).
    imm_offset: u32,
    admin: bool,
    hint: Option<u16>,
    read: Option<ReadBuffer>,
    data_len: u32,
    /// User header + RTRS message bytes.
    header_len: u32,
}

struct Session {
    name: heapless::String<PATHNAME_LEN>,
    uuid: Uuid,
    queue_depth: Option<u16>,
    layout: Option<ImmLayout>,
    paths: u16,
    up: bool,
    was_up: bool,
    max_io_size: u32,
    /// `close_session` was called: no failover, no reconnect.
    closing: bool,
}

/// The RTRS client over a verbs provider `V`.
pub struct Client<V: Verbs> {
    verbs: V,
    config: ClientConfig,
    session: Option<Session>,
    paths: Vec<PathSlot>,
    requests: Vec<RequestSlot>,
    free_permits: Vec<u16>,
    headers: MemoryRegion,
    header_stride: u32,
    recv_per_conn: u32,
    events: VecDeque<Event>,
    events_dropped: u64,
    rr_path: u16,
    uuid_counter: u64,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl<V: Verbs> Client<V> {
    /// Builds a client: allocates every table and the registered header and
    /// control buffers from `config`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`].
    pub fn new(mut verbs: V, config: ClientConfig) -> Result<Self, ConfigError> {
        if config.max_paths == 0
            || usize::from(config.max_paths) > crate::wire::MAX_PATHS_NUM
            || config.max_connections_per_path == 0
            || config.max_connections_per_path > crate::wire::MAX_CID_NUM
            || config.max_queue_depth < 2
            || config.max_header_len == 0
            || config.max_header_len > 1 << 20
            || config.event_capacity == 0
        {
            return Err(ConfigError::Limits);
        }
        let qd = u32::from(config.max_queue_depth);
        let header_stride = (config.max_header_len + READ_MSG_LEN + 63) & !63;
        let headers_len = header_stride.checked_mul(qd).ok_or(ConfigError::Limits)?;
        let headers = Self::alloc_region(&mut verbs, headers_len)?;
        // Two receives per outstanding request, plus heartbeats and acks.
        let recv_per_conn = 2 * qd + 8;
        let control_len = u64::from(INFO_REQ_AREA)
            + 8
            + 16 * u64::from(qd)
            + u64::from(config.max_connections_per_path)
                * u64::from(recv_per_conn)
                * u64::from(RECV_SLOT);
        let control_len = u32::try_from(control_len).map_err(|_| ConfigError::Limits)?;
        let mut paths = Vec::with_capacity(usize::from(config.max_paths));
        for _ in 0..config.max_paths {
            let control = Self::alloc_region(&mut verbs, control_len)?;
            paths.push(PathSlot {
                state: PathState::Unused,
                remote: SocketAddr::from(([0, 0, 0, 0], 0)),
                uuid: Uuid([0; 16]),
                recon_cnt: 0,
                first_conn: false,
                ever_up: false,
                cid_num: 0,
                conns: alloc::vec![None; usize::from(config.max_connections_per_path)],
                chunks: alloc::vec![
                    BufferDesc {
                        addr: 0,
                        rkey: verbs::Rkey(0),
                        len: 0
                    };
                    usize::from(config.max_queue_depth)
                ],
                chunk_size: 0,
                max_hdr_size: 0,
                max_io_size: 0,
                new_rkey: false,
                heartbeat: Heartbeat::default(),
                heartbeat_sent_at: 0,
                rr_cid: 0,
                attempts: 0,
                control: Some(control),
                stats: PathStats::default(),
            });
        }
        let requests = (0..config.max_queue_depth)
            .map(|_| RequestSlot {
                state: RequestState::Free,
                generation: 0,
                tag: 0,
                sgl: Sgl::new(),
                remote_offset: 0,
                imm_offset: 0,
                admin: false,
                hint: None,
                read: None,
                data_len: 0,
                header_len: 0,
            })
            .collect();
        Ok(Self {
            verbs,
            config,
            session: None,
            paths,
            requests,
            free_permits: Vec::with_capacity(usize::from(config.max_queue_depth)),
            headers,
            header_stride,
            recv_per_conn,
            events: VecDeque::with_capacity(config.event_capacity),
            events_dropped: 0,
            rr_path: 0,
            uuid_counter: u64::from_le_bytes([
                config.uuid_seed[0],
                config.uuid_seed[1],
                config.uuid_seed[2],
                config.uuid_seed[3],
                config.uuid_seed[4],
                config.uuid_seed[5],
                config.uuid_seed[6],
                config.uuid_seed[7],
            ]) ^ u64::from_le_bytes([
                config.uuid_seed[8],
                config.uuid_seed[9],
                config.uuid_seed[10],
                config.uuid_seed[11],
                config.uuid_seed[12],
                config.uuid_seed[13],
                config.uuid_seed[14],
                config.uuid_seed[15],
            ]),
        })
    }

    fn alloc_region(verbs: &mut V, len: u32) -> Result<MemoryRegion, ConfigError> {
        let buffer = verbs.alloc(len, 64).map_err(|_| ConfigError::Memory)?;
        verbs
            .reg_mr(buffer, AccessFlags::LOCAL_WRITE)
            .map_err(|_| ConfigError::Memory)
    }

    fn next_uuid(&mut self) -> Uuid {
        let a = splitmix(&mut self.uuid_counter).to_le_bytes();
        let b = splitmix(&mut self.uuid_counter).to_le_bytes();
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&a);
        out[8..].copy_from_slice(&b);
        Uuid(out)
    }

    /// The provider (to read response buffers, or for tests).
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// The provider, mutably (to register consumer buffers).
    pub fn verbs_mut(&mut self) -> &mut V {
        &mut self.verbs
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The session uuid (`paths_uuid` of every CON_REQ), once started.
    pub fn session_uuid(&self) -> Option<Uuid> {
        self.session.as_ref().map(|s| s.uuid)
    }

    /// The path uuid (`sess_uuid` of its CON_REQs).
    pub fn path_uuid(&self, path: u16) -> Option<Uuid> {
        self.live_path(path).map(|p| p.uuid)
    }

    /// The session queue depth (permits), once the first CONN_RSP arrived.
    pub fn queue_depth(&self) -> Option<u16> {
        self.session.as_ref().and_then(|s| s.queue_depth)
    }

    /// Whether at least one path is connected.
    pub fn is_up(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.up)
    }

    /// The state of path `path`.
    pub fn path_status(&self, path: u16) -> Option<PathStatus> {
        self.live_path(path).map(|p| match p.state {
            PathState::Unused => PathStatus::Closed,
            PathState::Pending => PathStatus::Pending,
            PathState::Connecting { .. } => PathStatus::Connecting,
            PathState::WaitingForInfoRsp { .. } => PathStatus::WaitingForInfoRsp,
            PathState::Connected => PathStatus::Connected,
            PathState::Disconnecting { .. } => PathStatus::Disconnecting,
            PathState::WaitingToReconnect { .. } => PathStatus::WaitingToReconnect,
            PathState::Closed => PathStatus::Closed,
        })
    }

    /// Counters of path `path`.
    pub fn path_stats(&self, path: u16) -> Option<PathStats> {
        self.live_path(path).map(|p| p.stats)
    }

    /// The chunk table of a connected path (for tests and diagnostics).
    pub fn chunk(&self, path: u16, id: u16) -> Option<BufferDesc> {
        let q = self.queue_depth()?;
        if id >= q {
            return None;
        }
        self.live_path(path)
            .filter(|p| p.state == PathState::Connected)
            .and_then(|p| p.chunks.get(usize::from(id)).copied())
    }

    /// Events dropped because the queue was full.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.requests
            .iter()
            .filter(|r| r.state != RequestState::Free)
            .count()
    }

    fn live_path(&self, path: u16) -> Option<&PathSlot> {
        let count = self.session.as_ref()?.paths;
        if path >= count {
            return None;
        }
        self.paths.get(usize::from(path))
    }

    /// The next event, oldest first.
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn push_event(&mut self, event: Event) {
        if self.events.len() < self.config.event_capacity {
            self.events.push_back(event);
        } else {
            self.events_dropped += 1;
        }
    }

    /// Copies the bytes the server wrote into a read buffer (the READ data,
    /// or an RNBD admin response) into `dst` (at most `read.len` bytes).
    ///
    /// # Errors
    ///
    /// [`verbs::AccessError`] if the buffer is gone or `dst` is too long.
    pub fn read_response(
        &self,
        read: &ReadBuffer,
        dst: &mut [u8],
    ) -> Result<(), verbs::AccessError> {
        if dst.len() > read.len as usize {
            return Err(verbs::AccessError::OutOfBounds);
        }
        self.verbs.read(read.region.handle, read.offset, dst)
    }

    /// Starts session `name` over `paths` (server addresses), each with
    /// `connections_per_path` connections (cid 0 admin + IO cids). Paths come
    /// up one at a time, in order; watch for [`Event::SessionUp`]. `now`
    /// starts the first connect timeout. The session uuid is shared by all
    /// paths; each path gets its own uuid, kept across reconnects.
    ///
    /// # Errors
    ///
    /// [`SessionError`].
    pub fn connect_session(
        &mut self,
        name: &str,
        paths: &[SocketAddr],
        connections_per_path: u16,
        now: u64,
    ) -> Result<(), SessionError> {
        if self.session.is_some() {
            return Err(SessionError::AlreadyStarted);
        }
        if name.is_empty()
            || name.len() >= PATHNAME_LEN
            || name.contains('/')
            || name.contains('.')
            || name.contains('\0')
        {
            return Err(SessionError::BadName);
        }
        if paths.is_empty()
            || paths.len() > usize::from(self.config.max_paths)
            || connections_per_path == 0
            || connections_per_path > self.config.max_connections_per_path
        {
            return Err(SessionError::BadPaths);
        }
        let mut session_name = heapless::String::new();
        session_name
            .push_str(name)
            .map_err(|()| SessionError::BadName)?;
        let uuid = self.next_uuid();
        for (index, remote) in paths.iter().enumerate() {
            let path_uuid = self.next_uuid();
            let slot = &mut self.paths[index];
            slot.state = PathState::Pending;
            slot.remote = *remote;
            slot.uuid = path_uuid;
            slot.recon_cnt = 0;
            // rtrs.md §2.3: only the first path may create the server session.
            slot.first_conn = index == 0;
            slot.ever_up = false;
            slot.cid_num = connections_per_path;
            slot.stats = PathStats::default();
        }
        self.session = Some(Session {
            name: session_name,
            uuid,
            queue_depth: None,
            layout: None,
            paths: paths.len() as u16,
            up: false,
            was_up: false,
            max_io_size: 0,
            closing: false,
        });
        self.start_pending(now);
        Ok(())
    }

    /// Closes path `path` at once (as a failure, `PathError::Local`); it
    /// reconnects after the delay like any failed path.
    pub fn disconnect_path(&mut self, path: u16, now: u64) {
        if self.live_path(path).is_some() {
            self.fail_path(path, PathError::Local, now);
        }
    }

    /// Closes the session (rtrs.md §6.3): every path is disconnected and not
    /// reconnected, requests in flight complete with `ECONNABORTED`, and
    /// each path ends with [`Event::PathClosed`].
    pub fn close_session(&mut self, now: u64) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        session.closing = true;
        for path in 0..session.paths {
            match self.paths[usize::from(path)].state {
                PathState::Connected
                | PathState::Connecting { .. }
                | PathState::WaitingForInfoRsp { .. } => {
                    self.fail_path(path, PathError::Local, now);
                }
                PathState::Pending | PathState::WaitingToReconnect { .. } => {
                    self.paths[usize::from(path)].state = PathState::Closed;
                    self.push_event(Event::PathClosed { path });
                }
                _ => {}
            }
        }
    }

    // ----- establishment ----------------------------------------------------

    fn establishing(&self) -> bool {
        self.paths.iter().any(|p| {
            matches!(
                p.state,
                PathState::Connecting { .. } | PathState::WaitingForInfoRsp { .. }
            )
        })
    }

    fn start_pending(&mut self, now: u64) -> bool {
        if self.establishing() {
            return false;
        }
        let Some(index) = self
            .paths
            .iter()
            .position(|p| p.state == PathState::Pending)
        else {
            return false;
        };
        self.start_connect(index as u16, now);
        true
    }

    fn start_connect(&mut self, path: u16, now: u64) {
        let slot = &mut self.paths[usize::from(path)];
        slot.recon_cnt = slot.recon_cnt.wrapping_add(1);
        slot.heartbeat.alive();
        for conn in slot.conns.iter_mut() {
            *conn = None;
        }
        self.connect_cid(path, 0, now);
    }

    fn connect_cid(&mut self, path: u16, cid: u16, now: u64) {
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let slot = &self.paths[usize::from(path)];
        let req = ConnReq {
            version: VERSION,
            cid,
            cid_num: slot.cid_num,
            recon_cnt: slot.recon_cnt,
            path_uuid: slot.uuid,
            session_uuid: session.uuid,
            first_conn: slot.first_conn,
        };
        let mut buf = [0u8; ConnReq::LEN];
        if req.emit(&mut buf).is_err() {
            self.connect_failed(path, PathError::BadConnRsp, now);
            return;
        }
        let qd = u32::from(self.config.max_queue_depth);
        let send_depth = u16::try_from(4 * qd + 1).unwrap_or(u16::MAX);
        let recv_depth = u16::try_from(self.recv_per_conn + 1).unwrap_or(u16::MAX);
        let params = ConnParams::new(&buf, send_depth, recv_depth);
        let remote = slot.remote;
        match self.verbs.connect(remote, &params) {
            Ok(conn) => {
                let slot = &mut self.paths[usize::from(path)];
                slot.conns[usize::from(cid)] = Some(conn);
                slot.state = PathState::Connecting {
                    cid,
                    deadline: now.saturating_add(self.config.connect_timeout_ns),
                };
            }
            Err(_) => self.connect_failed(path, PathError::Disconnected, now),
        }
    }

    fn lookup_conn(&self, conn: ConnId) -> Option<(u16, u16)> {
        let count = self.session.as_ref().map_or(0, |s| s.paths);
        self.paths
            .iter()
            .take(usize::from(count))
            .enumerate()
            .find_map(|(p, slot)| {
                slot.conns
                    .iter()
                    .position(|c| *c == Some(conn))
                    .map(|cid| (p as u16, cid as u16))
            })
    }

    fn handle_cm_event(&mut self, event: CmEvent, now: u64) {
        let conn = event.conn();
        let Some((path, cid)) = self.lookup_conn(conn) else {
            // Not ours (any more): release it.
            let _ = self.verbs.destroy(conn);
            return;
        };
        match event {
            CmEvent::Established { private_data, .. } => {
                self.established(path, cid, private_data.as_slice(), now);
            }
            CmEvent::Rejected { private_data, .. } => {
                let errno = ConnRsp::parse(private_data.as_slice()).map_or(0, |r| r.errno);
                self.fail_path(path, PathError::Rejected(errno), now);
                self.forget_conn(path, cid);
            }
            CmEvent::Unreachable { .. } | CmEvent::Disconnected { .. } => {
                self.fail_path(path, PathError::Disconnected, now);
                self.forget_conn(path, cid);
            }
            _ => {}
        }
        self.maybe_disconnected(path, now);
    }

    fn forget_conn(&mut self, path: u16, cid: u16) {
        let slot = &mut self.paths[usize::from(path)];
        if let Some(conn) = slot.conns[usize::from(cid)].take() {
            let _ = self.verbs.destroy(conn);
        }
    }

    fn established(&mut self, path: u16, cid: u16, private_data: &[u8], now: u64) {
        let PathState::Connecting { cid: expected, .. } = self.paths[usize::from(path)].state
        else {
            return;
        };
        if expected != cid {
            self.fail_path(path, PathError::ProtocolViolation, now);
            return;
        }
        let rsp = match ConnRsp::parse(private_data) {
            Ok(rsp) if rsp.errno == 0 => rsp,
            Ok(rsp) => {
                self.fail_path(path, PathError::Rejected(rsp.errno), now);
                return;
            }
            Err(_) => {
                self.fail_path(path, PathError::BadConnRsp, now);
                return;
            }
        };
        if cid == 0 {
            if let Err(error) = self.accept_conn_rsp(path, &rsp) {
                self.fail_path(path, error, now);
                return;
            }
        }
        let slot = &mut self.paths[usize::from(path)];
        // rtrs.md §2.3: a path that reached cid 0 ESTABLISHED may create the
        // server session from now on.
        slot.first_conn = true;
        let next = cid + 1;
        if next < slot.cid_num {
            self.connect_cid(path, next, now);
            return;
        }
        self.send_info_req(path, now);
    }

    fn accept_conn_rsp(&mut self, path: u16, rsp: &ConnRsp) -> Result<(), PathError> {
        let max_qd = self.config.max_queue_depth;
        let session = self.session.as_mut().ok_or(PathError::Local)?;
        if let Some(qd) = session.queue_depth {
            if qd != rsp.queue_depth {
                return Err(PathError::QueueDepthChanged);
            }
        }
        if rsp.queue_depth < 2 || rsp.queue_depth > max_qd {
            return Err(PathError::BadConnRsp);
        }
        let chunk_size = rsp.chunk_size().ok_or(PathError::BadConnRsp)?;
        let layout =
            ImmLayout::for_queue_depth(rsp.queue_depth).map_err(|_| PathError::BadConnRsp)?;
        layout
            .check_chunk_size(chunk_size)
            .map_err(|_| PathError::BadConnRsp)?;
        // The header room must hold at least a WRITE message.
        if rsp.max_hdr_size < WriteMsg::LEN as u32 {
            return Err(PathError::BadConnRsp);
        }
        if session.queue_depth.is_none() {
            session.queue_depth = Some(rsp.queue_depth);
            session.layout = Some(layout);
            self.free_permits.clear();
            for permit in (0..rsp.queue_depth).rev() {
                self.free_permits.push(permit);
            }
        }
        let slot = &mut self.paths[usize::from(path)];
        slot.chunk_size = chunk_size;
        slot.max_hdr_size = rsp.max_hdr_size;
        slot.max_io_size = rsp.max_io_size;
        slot.new_rkey = rsp.flags.contains(ConnRspFlags::NEW_RKEY);
        Ok(())
    }

    fn send_info_req(&mut self, path: u16, now: u64) {
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let slot = &self.paths[usize::from(path)];
        let (Some(control), Some(conn)) = (slot.control, slot.conns[0]) else {
            return;
        };
        let qd = u32::from(session.queue_depth.unwrap_or(self.config.max_queue_depth));
        let mut info = [0u8; InfoReq::LEN];
        let result = InfoReq {
            session_name: session.name.as_str(),
        }
        .emit(&mut info);
        if result.is_err() || self.verbs.write(control.handle, 0, &info).is_err() {
            self.fail_path(path, PathError::PostFailed, now);
            return;
        }
        let recv = RecvWr {
            wr_id: wr_id(KIND_INFO_RSP, path, 0, 0),
            sgl: Sgl::single(control.sge(INFO_REQ_AREA, 8 + 16 * qd)),
        };
        let send = SendWr {
            wr_id: wr_id(KIND_CONTROL, path, 0, 0),
            signaled: true,
            op: SendOp::Send {
                sgl: Sgl::single(control.sge(0, InfoReq::LEN as u32)),
                imm: None,
            },
        };
        if self.verbs.post_recv(conn, &[recv]).is_err()
            || self.verbs.post_send(conn, &[send]).is_err()
        {
            self.fail_path(path, PathError::PostFailed, now);
            return;
        }
        self.paths[usize::from(path)].state = PathState::WaitingForInfoRsp {
            deadline: now.saturating_add(self.config.connect_timeout_ns),
        };
    }

    fn info_rsp(&mut self, path: u16, wc: &WorkCompletion, now: u64) {
        if !matches!(
            self.paths[usize::from(path)].state,
            PathState::WaitingForInfoRsp { .. }
        ) {
            return;
        }
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let qd = session.queue_depth.unwrap_or(0);
        let slot = &mut self.paths[usize::from(path)];
        let Some(control) = slot.control else {
            return;
        };
        let chunk_size = slot.chunk_size;
        let len = wc.byte_len.min(8 + 16 * u32::from(qd));
        let chunks = &mut slot.chunks;
        let result = self
            .verbs
            .with_slice(control.handle, INFO_REQ_AREA, len, |bytes| {
                let rsp = InfoRsp::parse(bytes).map_err(|_| PathError::BadInfoRsp)?;
                rsp.check_layout(qd, chunk_size)
                    .map_err(|_| PathError::BadInfoRsp)?;
                for id in 0..qd {
                    chunks[usize::from(id)] = rsp
                        .chunk(chunk_size, u32::from(id))
                        .ok_or(PathError::BadInfoRsp)?;
                }
                Ok(())
            })
            .unwrap_or(Err(PathError::BadInfoRsp));
        if let Err(error) = result {
            self.fail_path(path, error, now);
            return;
        }
        if let Err(error) = self.post_io_receives(path) {
            self.fail_path(path, error, now);
            return;
        }
        let interval = self.config.heartbeat_interval_ns;
        let slot = &mut self.paths[usize::from(path)];
        slot.state = PathState::Connected;
        slot.heartbeat.start(now, interval);
        slot.attempts = 0;
        if slot.ever_up {
            slot.stats.reconnects += 1;
        }
        slot.ever_up = true;
        let max_io = slot.max_io_size;
        self.push_event(Event::PathUp { path });
        if let Some(session) = self.session.as_mut() {
            session.max_io_size = if session.max_io_size == 0 {
                max_io
            } else {
                session.max_io_size.min(max_io)
            };
            if !session.up {
                session.up = true;
                let reconnected = session.was_up;
                session.was_up = true;
                let max_io_size = session.max_io_size;
                self.push_event(Event::SessionUp {
                    reconnected,
                    max_io_size,
                });
            }
        }
    }

    fn post_io_receives(&mut self, path: u16) -> Result<(), PathError> {
        let slot = &self.paths[usize::from(path)];
        let control = slot.control.ok_or(PathError::PostFailed)?;
        for cid in 0..slot.cid_num {
            let conn = slot.conns[usize::from(cid)].ok_or(PathError::PostFailed)?;
            for index in 0..self.recv_per_conn {
                let recv = self.recv_wr(control, path, cid, index);
                self.verbs
                    .post_recv(conn, &[recv])
                    .map_err(|_| PathError::PostFailed)?;
            }
        }
        Ok(())
    }

    fn recv_wr(&self, control: MemoryRegion, path: u16, cid: u16, index: u32) -> RecvWr {
        let qd = u32::from(self.config.max_queue_depth);
        let base = INFO_REQ_AREA + 8 + 16 * qd;
        let slot = u32::from(cid) * self.recv_per_conn + index;
        RecvWr {
            wr_id: wr_id(KIND_RECV, path, cid, index),
            sgl: Sgl::single(control.sge(base + slot * RECV_SLOT, RECV_SLOT)),
        }
    }

    fn repost(&mut self, path: u16, cid: u16, index: u32, now: u64) {
        let slot = &self.paths[usize::from(path)];
        let (Some(control), Some(Some(conn))) = (slot.control, slot.conns.get(usize::from(cid)))
        else {
            return;
        };
        let conn = *conn;
        if index >= self.recv_per_conn {
            return;
        }
        let recv = self.recv_wr(control, path, cid, index);
        if self.verbs.post_recv(conn, &[recv]).is_err() {
            self.fail_path(path, PathError::PostFailed, now);
        }
    }

    // ----- failure and reconnect -------------------------------------------

    fn connect_failed(&mut self, path: u16, reason: PathError, now: u64) {
        self.fail_path(path, reason, now);
    }

    fn fail_path(&mut self, path: u16, reason: PathError, now: u64) {
        let index = usize::from(path);
        let state = self.paths[index].state;
        let was_connected = match state {
            PathState::Connected => true,
            PathState::Connecting { .. } | PathState::WaitingForInfoRsp { .. } => false,
            _ => return,
        };
        let close = reason == PathError::QueueDepthChanged;
        for cid in 0..self.paths[index].conns.len() {
            if let Some(conn) = self.paths[index].conns[cid] {
                // A connection that never came up (or is already down) is
                // released at once; the others report `Disconnected`.
                if self.verbs.disconnect(conn).is_err() {
                    let _ = self.verbs.destroy(conn);
                    self.paths[index].conns[cid] = None;
                }
            }
        }
        self.paths[index].state = PathState::Disconnecting {
            deadline: now.saturating_add(self.config.disconnect_timeout_ns),
            close,
        };
        if was_connected {
            self.push_event(Event::PathDown { path, reason });
            self.fail_over(path, now);
            let any_up = self.paths.iter().any(|p| p.state == PathState::Connected);
            if let Some(session) = self.session.as_mut() {
                if session.up && !any_up {
                    session.up = false;
                    self.push_event(Event::SessionDown);
                }
            }
        } else {
            self.paths[index].stats.connect_failures += 1;
            self.push_event(Event::PathConnectFailed { path, reason });
        }
    }

    /// Moves every request of `path` to another connected path (same
    /// permit), or completes it with `ECONNABORTED`.
    fn fail_over(&mut self, path: u16, now: u64) {
        for permit in 0..self.requests.len() {
            let RequestState::InFlight {
                path: on, response, ..
            } = self.requests[permit].state
            else {
                continue;
            };
            if on != path {
                continue;
            }
            if let Some(errno) = response {
                // Answered already; only the local send completion was
                // missing, and the flush ends it.
                self.finish(permit as u16, errno, now);
                continue;
            }
            let slot = &mut self.paths[usize::from(path)];
            slot.stats.inflight = slot.stats.inflight.saturating_sub(1);
            self.requests[permit].state = RequestState::Free;
            let permit = permit as u16;
            if self.session.as_ref().is_some_and(|s| s.closing) {
                self.finish(permit, errno::ECONNABORTED, now);
                continue;
            }
            match self.choose_path(Some(path)) {
                Some(target) if self.post_request(permit, target).is_ok() => {
                    self.paths[usize::from(target)].stats.failovers += 1;
                }
                _ => self.finish(permit, errno::ECONNABORTED, now),
            }
        }
    }

    fn maybe_disconnected(&mut self, path: u16, now: u64) {
        let slot = &self.paths[usize::from(path)];
        let PathState::Disconnecting { close, .. } = slot.state else {
            return;
        };
        if slot.conns.iter().any(Option::is_some) {
            return;
        }
        self.after_teardown(path, close, now);
    }

    fn after_teardown(&mut self, path: u16, close: bool, now: u64) {
        let max = self.config.max_reconnect_attempts;
        let closing = self.session.as_ref().is_some_and(|s| s.closing);
        let slot = &mut self.paths[usize::from(path)];
        slot.attempts = slot.attempts.saturating_add(1);
        if close || closing || max.is_some_and(|max| slot.attempts > max) {
            slot.state = PathState::Closed;
            self.push_event(Event::PathClosed { path });
        } else {
            slot.state = PathState::WaitingToReconnect {
                at: now.saturating_add(self.config.reconnect_delay_ns),
            };
        }
        self.start_pending(now);
    }

    // ----- IO ---------------------------------------------------------------

    fn choose_path(&mut self, exclude: Option<u16>) -> Option<u16> {
        let count = self.session.as_ref()?.paths;
        let usable =
            |p: u16, slot: &PathSlot| slot.state == PathState::Connected && Some(p) != exclude;
        match self.config.policy {
            MultipathPolicy::MinInflight => (0..count)
                .filter(|&p| usable(p, &self.paths[usize::from(p)]))
                .min_by_key(|&p| self.paths[usize::from(p)].stats.inflight),
            MultipathPolicy::RoundRobin => {
                for step in 1..=count {
                    let p = (self.rr_path + step) % count;
                    if usable(p, &self.paths[usize::from(p)]) {
                        self.rr_path = p;
                        return Some(p);
                    }
                }
                None
            }
        }
    }

    /// Submits a request: takes a permit, lays the request out per rtrs.md
    /// §4.3 (write) or §4.4 (read), and posts it on a connected path chosen
    /// by the policy (cid 0 for admin, else the hint or round-robin over the
    /// IO cids). The completion arrives as [`Event::IoCompleted`].
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing is posted and no permit is held then.
    pub fn submit(&mut self, io: ClientIo<'_>) -> Result<(), SubmitError> {
        if !self.is_up() {
            return Err(SubmitError::NotConnected);
        }
        let usr_len = u32::try_from(io.header.len()).map_err(|_| SubmitError::HeaderTooLong)?;
        if usr_len > self.config.max_header_len || usr_len > u32::from(u16::MAX) {
            return Err(SubmitError::HeaderTooLong);
        }
        let path = self.choose_path(None).ok_or(SubmitError::NotConnected)?;
        let permit = *self.free_permits.last().ok_or(SubmitError::NoPermit)?;
        let header_offset = u32::from(permit) * self.header_stride;
        let mut sgl = Sgl::new();
        let (remote_offset, msg_len, data_len, read) = match &io.direction {
            Direction::Write { data } => {
                if data.len() >= verbs::MAX_SGE {
                    return Err(SubmitError::TooManySegments);
                }
                let data_len = data.total_len().ok_or(SubmitError::TooManySegments)?;
                for sge in data.as_slice() {
                    sgl.push(*sge).map_err(|_| SubmitError::TooManySegments)?;
                }
                let mut msg = [0u8; WriteMsg::LEN];
                let n = WriteMsg {
                    usr_len: usr_len as u16,
                }
                .emit(&mut msg)
                .map_err(|_| SubmitError::HeaderTooLong)?;
                self.write_header(header_offset, io.header, &msg[..n])?;
                (0, n as u32, data_len, None)
            }
            Direction::Read { dest } => {
                let end = dest.offset.checked_add(dest.len);
                if end.is_none_or(|end| end > dest.region.len()) {
                    return Err(SubmitError::TooLarge);
                }
                let desc = (dest.len > 0).then(|| BufferDesc {
                    addr: dest.region.iova.wrapping_add(u64::from(dest.offset)),
                    rkey: dest.region.rkey,
                    len: dest.len,
                });
                let mut msg = [0u8; READ_MSG_LEN as usize];
                let n = ReadMsg {
                    usr_len: usr_len as u16,
                    flags: ReadFlags(0),
                    desc,
                }
                .emit(&mut msg)
                .map_err(|_| SubmitError::HeaderTooLong)?;
                self.write_header(header_offset, io.header, &msg[..n])?;
                (dest.len, n as u32, dest.len, Some(*dest))
            }
        };
        sgl.push(self.headers.sge(header_offset, usr_len + msg_len))
            .map_err(|_| SubmitError::TooManySegments)?;
        let imm_offset = data_len.checked_add(usr_len).ok_or(SubmitError::TooLarge)?;
        let request = &mut self.requests[usize::from(permit)];
        request.tag = io.tag;
        request.sgl = sgl;
        request.remote_offset = remote_offset;
        request.imm_offset = imm_offset;
        request.admin = io.admin;
        request.hint = io.hint;
        request.read = read;
        request.data_len = data_len;
        request.header_len = usr_len + msg_len;
        self.check_fits(permit, path)?;
        self.post_request(permit, path)?;
        self.free_permits.pop();
        Ok(())
    }

    fn write_header(&mut self, offset: u32, header: &[u8], msg: &[u8]) -> Result<(), SubmitError> {
        let handle = self.headers.handle;
        self.verbs
            .write(handle, offset, header)
            .and_then(|()| self.verbs.write(handle, offset + header.len() as u32, msg))
            .map_err(|_| SubmitError::HeaderTooLong)
    }

    /// rtrs.md §4.3/§4.4 limits against the path's CONN_RSP:
    /// `usr_len + message <= max_hdr_size`,
    /// `data_len + usr_len + message <= chunk_size`, `data_len <= max_io_size`.
    fn check_fits(&self, permit: u16, path: u16) -> Result<(), SubmitError> {
        let request = &self.requests[usize::from(permit)];
        let slot = &self.paths[usize::from(path)];
        if request.header_len > slot.max_hdr_size {
            return Err(SubmitError::HeaderTooLong);
        }
        let end = request
            .data_len
            .checked_add(request.header_len)
            .ok_or(SubmitError::TooLarge)?;
        if end > slot.chunk_size || request.data_len > slot.max_io_size {
            return Err(SubmitError::TooLarge);
        }
        Ok(())
    }

    /// Posts request `permit` on `path` (first submission or failover).
    fn post_request(&mut self, permit: u16, path: u16) -> Result<(), SubmitError> {
        self.check_fits(permit, path)?;
        let layout = self
            .session
            .as_ref()
            .and_then(|s| s.layout)
            .ok_or(SubmitError::NotConnected)?;
        let request = &mut self.requests[usize::from(permit)];
        let slot = &mut self.paths[usize::from(path)];
        let cid = if request.admin || slot.cid_num == 1 {
            0
        } else {
            let io_cids = slot.cid_num - 1;
            match request.hint {
                Some(hint) => 1 + hint % io_cids,
                None => {
                    slot.rr_cid = (slot.rr_cid + 1) % io_cids;
                    1 + slot.rr_cid
                }
            }
        };
        let conn = slot.conns[usize::from(cid)].ok_or(SubmitError::NotConnected)?;
        let chunk = slot.chunks[usize::from(permit)];
        let payload = layout
            .join(u32::from(permit), request.imm_offset)
            .ok_or(SubmitError::TooLarge)?;
        let imm = Imm::IoReq { payload }
            .encode()
            .map_err(|_| SubmitError::TooLarge)?;
        let generation = request.generation.wrapping_add(1);
        let wr = SendWr {
            wr_id: wr_id(
                KIND_REQUEST,
                path,
                cid,
                u32::from(permit) | u32::from(generation) << 16,
            ),
            signaled: true,
            op: SendOp::RdmaWrite {
                sgl: request.sgl.clone(),
                remote_addr: chunk.addr.wrapping_add(u64::from(request.remote_offset)),
                rkey: chunk.rkey,
                imm: Some(imm),
            },
        };
        self.verbs
            .post_send(conn, core::slice::from_ref(&wr))
            .map_err(SubmitError::Post)?;
        request.generation = generation;
        request.state = RequestState::InFlight {
            path,
            send_done: false,
            response: None,
        };
        slot.stats.inflight += 1;
        Ok(())
    }

    /// Completes request `permit` to the consumer and frees the permit.
    fn finish(&mut self, permit: u16, errno: u16, _now: u64) {
        let request = &mut self.requests[usize::from(permit)];
        let mut answered_on = None;
        if let RequestState::InFlight { path, .. } = request.state {
            answered_on = Some(path);
            let slot = &mut self.paths[usize::from(path)];
            slot.stats.inflight = slot.stats.inflight.saturating_sub(1);
            if errno != 0 {
                slot.stats.errors += 1;
            }
            if errno == 0 {
                if request.read.is_some() {
                    slot.stats.reads += 1;
                    slot.stats.read_bytes += u64::from(request.data_len);
                } else {
                    slot.stats.writes += 1;
                    slot.stats.write_bytes += u64::from(request.data_len);
                }
            }
        }
        request.state = RequestState::Free;
        let event = Event::IoCompleted {
            tag: request.tag,
            errno,
            answered_on,
            read: request.read,
        };
        self.free_permits.push(permit);
        self.push_event(event);
    }

    /// Records a response for `msg_id` on `path`.
    fn response(&mut self, path: u16, msg_id: u32, errno: u16, now: u64) {
        let qd = u32::from(self.queue_depth().unwrap_or(0));
        let Some(request) = (msg_id < qd)
            .then(|| self.requests.get_mut(msg_id as usize))
            .flatten()
        else {
            self.paths[usize::from(path)].stats.protocol_errors += 1;
            return;
        };
        match request.state {
            RequestState::InFlight {
                path: on,
                send_done,
                response: None,
            } if on == path => {
                if send_done {
                    self.finish(msg_id as u16, errno, now);
                } else {
                    request.state = RequestState::InFlight {
                        path,
                        send_done,
                        response: Some(errno),
                    };
                }
            }
            // Not in flight on this path: ignored (rtrs.md §4.6).
            _ => self.paths[usize::from(path)].stats.protocol_errors += 1,
        }
    }

    fn send_done(&mut self, path: u16, low: u32, now: u64) {
        let permit = (low & 0xffff) as u16;
        let generation = (low >> 16) as u16;
        let Some(request) = self.requests.get_mut(usize::from(permit)) else {
            return;
        };
        if request.generation != generation {
            return;
        }
        if let RequestState::InFlight {
            path: on, response, ..
        } = request.state
        {
            if on != path {
                return;
            }
            match response {
                Some(errno) => self.finish(permit, errno, now),
                None => {
                    request.state = RequestState::InFlight {
                        path,
                        send_done: true,
                        response: None,
                    }
                }
            }
        }
    }

    // ----- completions ------------------------------------------------------

    fn handle_completion(&mut self, wc: WorkCompletion, now: u64) {
        let (kind, _, _, low) = split_wr_id(wc.wr_id);
        let Some((path, cid)) = self.lookup_conn(wc.conn) else {
            return;
        };
        let state = self.paths[usize::from(path)].state;
        if matches!(
            state,
            PathState::Disconnecting { .. } | PathState::WaitingToReconnect { .. }
        ) {
            return;
        }
        if !wc.status.is_success() {
            if wc.status != WcStatus::WrFlushErr {
                self.fail_path(path, PathError::CompletionError, now);
            }
            return;
        }
        match kind {
            KIND_REQUEST => self.send_done(path, low, now),
            KIND_CONTROL => {}
            KIND_INFO_RSP => {
                self.paths[usize::from(path)].heartbeat.alive();
                self.info_rsp(path, &wc, now);
            }
            KIND_RECV => {
                if state != PathState::Connected {
                    return;
                }
                self.paths[usize::from(path)].heartbeat.alive();
                self.receive(path, cid, low, &wc, now);
            }
            _ => {}
        }
    }

    fn receive(&mut self, path: u16, cid: u16, index: u32, wc: &WorkCompletion, now: u64) {
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                self.repost(path, cid, index, now);
                match Imm::decode(wc.imm.unwrap_or(u32::MAX)) {
                    Imm::HbMsg => self.send_heartbeat(path, Imm::HbAck, now),
                    Imm::HbAck => {
                        let slot = &mut self.paths[usize::from(path)];
                        slot.stats.heartbeats_acked += 1;
                        slot.stats.latency_ns = now.saturating_sub(slot.heartbeat_sent_at);
                    }
                    Imm::IoRsp { msg_id, errno } | Imm::IoRspWithInvalidate { msg_id, errno } => {
                        self.response(path, msg_id, errno, now);
                    }
                    Imm::IoReq { .. } | Imm::Unknown(_) => {
                        self.paths[usize::from(path)].stats.protocol_errors += 1;
                    }
                }
            }
            WcOpcode::Recv => {
                if wc.invalidated_rkey.is_some() || wc.byte_len == 0 {
                    // The SEND_WITH_INV half of a pair (we never ask for it).
                    self.repost(path, cid, index, now);
                    return;
                }
                let result = self.rkey_rsp(path, cid, index, wc);
                self.repost(path, cid, index, now);
                match result {
                    Ok((msg_id, errno)) => self.response(path, msg_id, errno, now),
                    Err(error) => self.fail_path(path, error, now),
                }
            }
            _ => {}
        }
    }

    /// RKEY_RSP (rtrs.md §4.6): new rkey for the chunk, then the response.
    fn rkey_rsp(
        &mut self,
        path: u16,
        cid: u16,
        index: u32,
        wc: &WorkCompletion,
    ) -> Result<(u32, u16), PathError> {
        let qd = self.queue_depth().unwrap_or(0);
        let slot = &self.paths[usize::from(path)];
        let control = slot.control.ok_or(PathError::ProtocolViolation)?;
        if !slot.new_rkey || wc.byte_len < RkeyRsp::LEN as u32 || index >= self.recv_per_conn {
            return Err(PathError::ProtocolViolation);
        }
        let sge = self.recv_wr(control, path, cid, index).sgl.as_slice()[0];
        let rsp = self
            .verbs
            .with_slice(control.handle, sge.offset, RECV_SLOT, RkeyRsp::parse)
            .map_err(|_| PathError::ProtocolViolation)?
            .map_err(|_| PathError::ProtocolViolation)?;
        if rsp.buf_id >= qd {
            return Err(PathError::ProtocolViolation);
        }
        let (msg_id, errno) = match wc.imm.map(Imm::decode) {
            Some(Imm::IoRsp { msg_id, errno } | Imm::IoRspWithInvalidate { msg_id, errno }) => {
                (msg_id, errno)
            }
            _ => return Err(PathError::ProtocolViolation),
        };
        if msg_id != u32::from(rsp.buf_id) {
            return Err(PathError::ProtocolViolation);
        }
        self.paths[usize::from(path)].chunks[usize::from(rsp.buf_id)].rkey = rsp.rkey;
        Ok((msg_id, errno))
    }

    fn send_heartbeat(&mut self, path: u16, imm: Imm, now: u64) {
        let Some(conn) = self.paths[usize::from(path)].conns[0] else {
            return;
        };
        let wr = link::heartbeat_wr(wr_id(KIND_CONTROL, path, 0, 1), imm);
        if self.verbs.post_send(conn, &[wr]).is_err() {
            self.fail_path(path, PathError::PostFailed, now);
            return;
        }
        let slot = &mut self.paths[usize::from(path)];
        if imm == Imm::HbMsg {
            slot.stats.heartbeats_sent += 1;
            slot.heartbeat_sent_at = now;
        } else {
            slot.stats.heartbeats_answered += 1;
        }
    }

    // ----- the run loop -----------------------------------------------------

    /// The earliest time `poll` has timer work to do, if any.
    pub fn poll_at(&self) -> Option<u64> {
        let count = self.session.as_ref().map_or(0, |s| s.paths);
        self.paths
            .iter()
            .take(usize::from(count))
            .filter_map(|p| match p.state {
                PathState::Connecting { deadline, .. }
                | PathState::WaitingForInfoRsp { deadline }
                | PathState::Disconnecting { deadline, .. } => Some(deadline),
                PathState::WaitingToReconnect { at } => Some(at),
                PathState::Connected => Some(p.heartbeat.next()),
                _ => None,
            })
            .min()
    }

    /// Does a bounded amount of work: at most `cm_budget` connection events,
    /// `completion_budget` work completions, and one timer pass over the
    /// paths. Returns whether anything was done.
    pub fn poll(&mut self, now: u64) -> bool {
        let mut busy = false;
        for _ in 0..self.config.cm_budget {
            let Some(event) = self.verbs.poll_cm_event() else {
                break;
            };
            busy = true;
            self.handle_cm_event(event, now);
        }
        let mut left = self.config.completion_budget;
        while left > 0 {
            let mut batch = [WorkCompletion::default(); 16];
            let want = left.min(batch.len());
            let n = self.verbs.poll_cq(&mut batch[..want]);
            if n == 0 {
                break;
            }
            busy = true;
            left -= n;
            for wc in &batch[..n] {
                self.handle_completion(*wc, now);
            }
        }
        busy |= self.timers(now);
        busy
    }

    fn timers(&mut self, now: u64) -> bool {
        let mut busy = false;
        let count = self.session.as_ref().map_or(0, |s| s.paths);
        for path in 0..count {
            let state = self.paths[usize::from(path)].state;
            match state {
                PathState::Connecting { deadline, .. }
                | PathState::WaitingForInfoRsp { deadline }
                    if now >= deadline =>
                {
                    busy = true;
                    self.fail_path(path, PathError::Timeout, now);
                }
                PathState::Disconnecting { deadline, close } if now >= deadline => {
                    busy = true;
                    for cid in 0..self.paths[usize::from(path)].conns.len() {
                        self.forget_conn(path, cid as u16);
                    }
                    self.after_teardown(path, close, now);
                }
                PathState::WaitingToReconnect { at } if now >= at => {
                    busy = true;
                    self.paths[usize::from(path)].state = PathState::Pending;
                }
                PathState::Connected if now >= self.paths[usize::from(path)].heartbeat.next() => {
                    busy = true;
                    self.heartbeat_tick(path, now);
                }
                _ => {}
            }
        }
        busy |= self.start_pending(now);
        busy
    }

    /// rtrs.md §5: at most one heartbeat outstanding; `missed` counts
    /// intervals without any sign of life.
    fn heartbeat_tick(&mut self, path: u16, now: u64) {
        let interval = self.config.heartbeat_interval_ns;
        let max = self.config.heartbeat_missed_max;
        match self.paths[usize::from(path)]
            .heartbeat
            .tick(now, interval, max)
        {
            Beat::Dead => self.fail_path(path, PathError::HeartbeatTimeout, now),
            Beat::Quiet => {}
            Beat::Send => self.send_heartbeat(path, Imm::HbMsg, now),
        }
    }
}

impl From<PostError> for SubmitError {
    fn from(error: PostError) -> Self {
        SubmitError::Post(error)
    }
}

//! The client's public types: configuration, requests, events, errors.

use super::*;

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

impl From<PostError> for SubmitError {
    fn from(error: PostError) -> Self {
        SubmitError::Post(error)
    }
}

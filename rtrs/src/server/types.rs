//! The server's public vocabulary: ids, IO directions, events, counters
//! and the reasons for refusals and closes.

use core::fmt;
use core::net::SocketAddr;

use verbs::MemoryHandle;

use super::{errno, PathRefusal};
use crate::wire::{ParseError, PATHNAME_LEN};

/// A session (all paths with one session uuid), by slot and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionId {
    /// Slot in the session table.
    pub index: u16,
    /// Generation of the slot, so a reused slot is a different id.
    pub generation: u16,
}

/// A path, by slot and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathId {
    /// Slot in the path table.
    pub index: u16,
    /// Generation of the slot.
    pub generation: u16,
}

/// Names one request handed to the consumer; answer it with
/// [`Server::complete_io`](super::Server::complete_io) exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoToken {
    /// The path the request arrived on.
    pub path: PathId,
    /// The chunk id (`buf_id`, also the response's `msg_id`).
    pub chunk: u16,
    /// Request generation of that chunk.
    pub generation: u32,
}

/// Direction of an IO request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoDirection {
    /// RTRS WRITE: the data is in the chunk (`data`).
    Write,
    /// RTRS READ: fill `data` (or give an SGL) with `read_len` bytes.
    Read {
        /// Bytes the client asked for (`desc[0].len`), 0 for a data-less
        /// read (RNBD FLUSH).
        read_len: u32,
    },
}

/// Why a path went down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseReason {
    /// A connection was disconnected (DREQ, or a provider error).
    Disconnected,
    /// A work completion failed (other than a flush).
    CompletionError,
    /// No sign of life for `heartbeat_missed_max` intervals.
    HeartbeatTimeout,
    /// The peer broke the protocol (bad immediate, chunk reuse, INFO_REQ).
    ProtocolViolation,
    /// A reconnect of the same path uuid (newer `recon_cnt`) replaced it.
    Replaced,
    /// Posting a work request failed other than for queue room.
    PostFailed,
    /// The server was asked to close it ([`Server::close_path`](super::Server::close_path)).
    Local,
    /// The path did not finish its setup (all connections and INFO_REQ)
    /// within `setup_timeout_ns`.
    SetupTimeout,
    /// A half-open path made room for a newer one (`max_half_open`).
    Evicted,
    /// Refused at INFO_REQ ([`Event::PathRefused`] says why).
    Refused,
}

/// What the server tells its consumer (RNBD).
// The session name makes `SessionOpened` large; events live in a queue
// allocated once, so the size costs memory, not allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The first path of a session came up (Linux LINK_EV_CONNECTED).
    SessionOpened {
        /// The session.
        session: SessionId,
        /// Its name from INFO_REQ.
        name: heapless::String<PATHNAME_LEN>,
    },
    /// The last up path of a session went down (LINK_EV_DISCONNECTED).
    SessionClosed {
        /// The session.
        session: SessionId,
    },
    /// A path finished INFO_REQ/INFO_RSP and carries IO.
    PathUp {
        /// The session.
        session: SessionId,
        /// The path.
        path: PathId,
        /// The client's address of the path's cid 0.
        remote: Option<SocketAddr>,
        /// The port the path's connections came in on (its memory lives
        /// there: the consumer's `ports[port]`).
        port: usize,
    },
    /// A path was refused at INFO_REQ (the admission hook, the session
    /// name, a limit or memory) and is being closed; it never came up and
    /// held no session slot or chunk pool.
    PathRefused {
        /// The session name the INFO_REQ carried.
        name: heapless::String<PATHNAME_LEN>,
        /// The client's address of the path's cid 0.
        remote: Option<SocketAddr>,
        /// The port the path came in on.
        port: usize,
        /// Why.
        reason: PathRefusal,
    },
    /// A path is closing; requests the consumer holds are still to be
    /// answered (the answers are dropped).
    PathDown {
        /// The session.
        session: SessionId,
        /// The path.
        path: PathId,
        /// Why.
        reason: CloseReason,
    },
    /// A request to serve.
    Io {
        /// The session.
        session: SessionId,
        /// Pass to [`Server::complete_io`](super::Server::complete_io).
        token: IoToken,
        /// Read or write.
        direction: IoDirection,
        /// The user (RNBD) header in the chunk, right behind `data` (the
        /// same region, at `data`'s end): read it from the consumer's
        /// `ports[port]` (`Memory::read`), or with `data` as one slice.
        header: MemoryHandle,
        /// The data area at the chunk start (`offset - usr_len` bytes): the
        /// write data, or the room for read data; in `port`'s memory.
        data: MemoryHandle,
        /// Whether it came on cid 0 (RNBD control messages do).
        admin: bool,
        /// The port of the request's path: `header` and `data` are handles
        /// of that provider's memory (the consumer's `ports[port]`, the
        /// port it lends the server at that index).
        port: usize,
    },
}

/// Counters of a session or a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Read requests answered.
    pub reads: u64,
    /// Bytes RDMA-written back to clients.
    pub read_bytes: u64,
    /// Write requests answered.
    pub writes: u64,
    /// Bytes received in write requests.
    pub write_bytes: u64,
    /// Requests answered with a non-zero errno.
    pub errors: u64,
    /// Paths replaced by a reconnect.
    pub reconnects: u64,
    /// Protocol violations seen.
    pub protocol_errors: u64,
    /// Heartbeats sent.
    pub heartbeats_sent: u64,
    /// Heartbeats answered (HB_ACK sent).
    pub heartbeats_acked: u64,
}

/// Server-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connect requests accepted.
    pub accepted: u64,
    /// Connect requests rejected.
    pub rejected: u64,
    /// Paths closed.
    pub paths_closed: u64,
    /// Unknown or unexpected immediates ignored.
    pub ignored_immediates: u64,
    /// Events lost to a full queue (the consumer answered requests without
    /// draining events; should stay 0).
    pub events_dropped: u64,
    /// Live paths replaced by a reconnect of the same path uuid (from the
    /// path's own address, the old path dead or stale).
    pub paths_replaced: u64,
    /// Reconnects refused because the live path they named was fresh or
    /// belonged to another client address.
    pub takeovers_refused: u64,
    /// Paths refused at INFO_REQ ([`Event::PathRefused`]).
    pub paths_refused: u64,
    /// Half-open paths evicted to make room for a newer one.
    pub half_open_evicted: u64,
    /// New paths refused because their address had
    /// `max_half_open_per_source` half-open paths.
    pub half_open_refused: u64,
    /// New paths refused because their address exceeded its setup rate.
    pub setup_rate_refused: u64,
}

/// How many table entries are in use: all zero when idle (leak checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Sessions allocated.
    pub sessions: usize,
    /// Paths allocated (any state but free).
    pub paths: usize,
    /// Connections known.
    pub connections: usize,
    /// Requests not idle.
    pub ios: usize,
    /// Registered buffers the server holds.
    pub buffers: usize,
}

/// Why [`Server::complete_io`](super::Server::complete_io) refused an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompleteError {
    /// The token names no request the consumer holds (answered twice, or
    /// the path is gone).
    UnknownRequest,
    /// A read SGL whose length is not the requested length.
    ReadLengthMismatch,
}

impl fmt::Display for CompleteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownRequest => "no such outstanding request",
            Self::ReadLengthMismatch => "read data length differs from the request",
        })
    }
}

impl core::error::Error for CompleteError {}

/// Why a connect request was refused (the CONN_RSP errno follows from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectRefusal {
    /// The CON_REQ did not parse (short, magic, version, cid/cid_num).
    Malformed(ParseError),
    /// No session with that uuid and `first_conn` clear.
    NoSession,
    /// `max_sessions` reached.
    TooManySessions,
    /// `max_paths_per_session` reached.
    TooManyPaths,
    /// `cid_num` above `max_connections_per_path`.
    TooManyConnections,
    /// The path exists and is up, and the request is no newer reconnect;
    /// or it is, but comes from another address than the path's, or the
    /// path is not stale (it answered within the last heartbeat interval).
    PathStillUp,
    /// `cid_num` differs from the path's, or the cid is already connected.
    ConnectionMismatch,
    /// The registered-memory pool could not hold the path's chunks.
    OutOfMemory,
    /// Another path of the session uses the same address pair.
    PathExists,
    /// The client address has `max_half_open_per_source` half-open paths.
    TooManyHalfOpen,
    /// The client address started more new paths than its setup rate
    /// allows (`setup_burst`, then one per `setup_interval_ns`).
    SetupRateExceeded,
}

impl ConnectRefusal {
    /// The errno the CONN_RSP carries (one mapping, rtrs.md §2.4).
    pub const fn errno(self) -> u16 {
        match self {
            Self::Malformed(_) | Self::PathStillUp | Self::ConnectionMismatch => errno::ECONNRESET,
            Self::TooManyConnections => errno::ECONNRESET,
            Self::NoSession => errno::ENXIO,
            Self::PathExists => errno::EEXIST,
            Self::TooManySessions
            | Self::TooManyPaths
            | Self::OutOfMemory
            | Self::TooManyHalfOpen
            | Self::SetupRateExceeded => errno::ENOMEM,
        }
    }
}

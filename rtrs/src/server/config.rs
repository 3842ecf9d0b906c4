//! The server's configuration: protocol parameters, table capacities,
//! budgets and the limits on half-open paths.

use core::fmt;

use crate::wire::{self, ImmLayout};

/// Configuration: protocol parameters and the table capacities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// RDMA CM port to listen on (rtrs.md §2.1).
    pub port: u16,
    /// Session queue depth: chunks per path (1 < qd; constant per client
    /// session, rtrs.md §2.5).
    pub queue_depth: u16,
    /// Chunk stride = `max_io_size + max_hdr_size`.
    pub chunk_size: u32,
    /// Header reserve advertised as `max_hdr_size`.
    pub max_hdr_size: u32,
    /// NEW_RKEY_F mode: revoke each chunk on a request, fresh rkey in the
    /// response (rtrs.md §4.9).
    pub always_invalidate: bool,
    /// Most sessions at once.
    pub max_sessions: u16,
    /// Most live paths per session (at most 128).
    pub max_paths_per_session: u16,
    /// Most connections (`cid_num`) per path.
    pub max_connections_per_path: u16,
    /// Heartbeat interval in nanoseconds (rtrs.md §5: 5 s).
    pub heartbeat_interval_ns: u64,
    /// Missed heartbeats tolerated (rtrs.md §5: 5).
    pub heartbeat_missed_max: u32,
    /// How long a closing path waits for its disconnects before destroying
    /// its connections anyway.
    pub close_timeout_ns: u64,
    /// How long a new path may take from its first CON_REQ to a complete
    /// INFO_REQ/INFO_RSP exchange; a half-open path is closed at this
    /// deadline so it cannot hold its connections forever (rnbd.md §8.1).
    /// Default 5 s: the client brings its connections up back to back.
    pub setup_timeout_ns: u64,
    /// Most half-open paths (connecting, INFO_REQ not yet admitted) at
    /// once, over all sessions and ports. When it is reached, a new path
    /// evicts the oldest half-open one ([`CloseReason::Evicted`](super::CloseReason::Evicted)).
    pub max_half_open: u16,
    /// Most half-open paths from one client IP address; a further new path
    /// from it is refused with ENOMEM ([`ConnectRefusal::TooManyHalfOpen`](super::ConnectRefusal::TooManyHalfOpen)).
    pub max_half_open_per_source: u16,
    /// New paths one client IP address may start at once before
    /// [`setup_interval_ns`](Self::setup_interval_ns) paces it (module
    /// `rate`); further ones are refused with ENOMEM
    /// ([`ConnectRefusal::SetupRateExceeded`](super::ConnectRefusal::SetupRateExceeded)).
    /// Default 32: a host reconnecting every path of many sessions at once.
    pub setup_burst: u32,
    /// One more new path per address per this many nanoseconds once the
    /// burst is spent. Default 25 ms (40 paths a second per address).
    pub setup_interval_ns: u64,
    /// Connection events handled per `poll`, in total over all ports.
    pub cm_budget: usize,
    /// Work completions handled per `poll`, in total over all ports.
    pub completion_budget: usize,
    /// Capacity of the event queue.
    pub event_capacity: usize,
}

impl ServerConfig {
    /// Linux's defaults (rtrs.md §0): qd 512, 128 KiB chunks, 4 KiB header
    /// reserve, always_invalidate on. 128 KiB IOs are split by the client
    /// with these (rtrs.md §10); use [`ServerConfig::brick_default`].
    pub const fn linux_default() -> Self {
        Self {
            port: wire::DEFAULT_PORT,
            queue_depth: 512,
            chunk_size: 128 * 1024,
            max_hdr_size: 4096,
            always_invalidate: true,
            max_sessions: 16,
            max_paths_per_session: 4,
            max_connections_per_path: 64,
            heartbeat_interval_ns: wire::HEARTBEAT_INTERVAL_MS as u64 * 1_000_000,
            heartbeat_missed_max: wire::HEARTBEAT_MISSED_MAX,
            close_timeout_ns: wire::CONNECT_TIMEOUT_MS as u64 * 1_000_000,
            setup_timeout_ns: 5_000_000_000,
            max_half_open: 16,
            max_half_open_per_source: 4,
            setup_burst: 32,
            setup_interval_ns: 25_000_000,
            cm_budget: 16,
            completion_budget: 64,
            event_capacity: 1024,
        }
    }

    /// Brick's default: as Linux, but 132 KiB chunks so a 128 KiB IO plus
    /// its header fits one chunk (`max_io_size` = 128 KiB).
    pub const fn brick_default() -> Self {
        let mut config = Self::linux_default();
        config.chunk_size = 128 * 1024 + 4096;
        config
    }

    /// `max_io_size` as advertised: `chunk_size - max_hdr_size`.
    pub const fn max_io_size(&self) -> u32 {
        self.chunk_size.saturating_sub(self.max_hdr_size)
    }

    /// Checks the parameters (rtrs.md §10).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the broken rule.
    pub fn check(&self) -> Result<ImmLayout, ConfigError> {
        if self.queue_depth < 2 {
            return Err(ConfigError::QueueDepth);
        }
        if self.max_hdr_size == 0 || self.max_io_size() == 0 {
            return Err(ConfigError::ChunkSize);
        }
        let layout =
            ImmLayout::for_queue_depth(self.queue_depth).map_err(|_| ConfigError::QueueDepth)?;
        layout
            .check_chunk_size(self.chunk_size)
            .map_err(|_| ConfigError::ChunkSize)?;
        if self.max_sessions == 0
            || self.max_paths_per_session == 0
            || usize::from(self.max_paths_per_session) > wire::MAX_PATHS_NUM
            || self.max_connections_per_path == 0
            || self.max_connections_per_path > wire::MAX_CID_NUM
        {
            return Err(ConfigError::Limits);
        }
        if self.cm_budget == 0 || self.completion_budget == 0 || self.event_capacity < 8 {
            return Err(ConfigError::Limits);
        }
        if self.max_half_open == 0
            || self.max_half_open_per_source == 0
            || self.max_half_open_per_source > self.max_half_open
            || self.setup_timeout_ns == 0
            || self.setup_burst == 0
            || self.setup_interval_ns == 0
        {
            return Err(ConfigError::Limits);
        }
        Ok(layout)
    }
}

/// Why a [`ServerConfig`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigError {
    /// `queue_depth` below 2.
    QueueDepth,
    /// `max_io_size` is zero, or chunk id + offset exceed 28 immediate bits.
    ChunkSize,
    /// A table capacity or budget is zero or beyond the protocol's limits.
    Limits,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::QueueDepth => "queue depth below 2",
            Self::ChunkSize => "chunk size does not fit the immediate or leaves no IO room",
            Self::Limits => "table capacity or budget out of range",
        })
    }
}

impl core::error::Error for ConfigError {}

/// Why [`Server::start`](super::Server::start) did not listen on every port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartError {
    /// It was given no port (verbs provider).
    NoPorts,
    /// A provider refused to listen; the ports before it listen.
    Listen(verbs::ConnectError),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPorts => f.write_str("expected at least one port (verbs provider), got none"),
            Self::Listen(error) => write!(f, "listen failed: {error}"),
        }
    }
}

impl core::error::Error for StartError {}

//! Initiator configuration: capacities, timers and the disconnect policy.
//!
//! All capacities are fixed at [`crate::Initiator::new`]: the IO slots
//! (the queue depth), the registered data pool (`queue_depth ×
//! max_transfer` bytes), the volume table and the RTRS client's tables.
//!
//! # Timing defaults, and why
//!
//! Linux's RNBD client notices a dead target 30–35 s after its last sign of
//! life (heartbeat every 5 s, 5 missed) and then waits 30 s before each
//! reconnect attempt (`rtrs.md` §5, §6.2). The initiator is a userspace
//! tool whose users wait for it, so [`InitiatorConfig::new`] shortens both:
//!
//! | Setting | Default | Effect |
//! |---|---|---|
//! | heartbeat interval | 1 s | one HB_MSG per idle second on cid 0 |
//! | missed heartbeats | 2 | path declared dead 3–4 s after the last sign of life (any completion counts) |
//! | connect timeout | 3 s | per connection and for INFO_RSP |
//! | disconnect timeout | 500 ms | a crashed target never answers the DREQ |
//! | reconnect delay | 500 ms | between attempts, forever |
//!
//! So a restarted target is back in use about 5 s after it died (if it is
//! up by then), well under the Linux client's ~60 s. The server's own
//! heartbeat (5 s × 5) is unaffected: the initiator answers HB_MSG at once.
//!
//! # IO while the session is down
//!
//! [`OnDisconnect::Hold`] (the default): IO submitted while the session (or
//! the volume's re-open) is not ready, and IO whose requests RTRS could not
//! fail over to another path, is held and re-issued once the volume is open
//! again, for at most `hold_timeout_ns` from the moment it was first held;
//! then it fails with [`crate::IoError::Disconnected`]. Re-issuing is safe for
//! block IO: a read or a write of the same bytes to the same place twice has
//! the effect of once, and requests in flight together have no order
//! (as with Linux dm-multipath's `queue_if_no_path`).
//! [`OnDisconnect::Fail`]: such IO fails at once, as Linux's RNBD client
//! does (`rnbd.md` §5.2).

use rtrs::client::{ClientConfig, MultipathPolicy};

/// What happens to IO while the session or a volume is not usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnDisconnect {
    /// Hold it and re-issue it once the volume is re-opened, for at most
    /// `hold_timeout_ns` (then [`crate::IoError::Disconnected`]).
    Hold {
        /// Longest time one IO stays held, in nanoseconds.
        hold_timeout_ns: u64,
    },
    /// Fail it at once with [`crate::IoError::Disconnected`] (Linux
    /// behaviour).
    Fail,
}

/// Configuration of an [`crate::Initiator`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitiatorConfig {
    /// IO slots: the most IOs submitted and not yet reaped.
    pub queue_depth: u16,
    /// Largest single IO in bytes (each slot owns a registered buffer this
    /// long). IOs longer than the session's `max_io_size` are split.
    pub max_transfer: u32,
    /// Most volumes open at once.
    pub max_volumes: u16,
    /// Connections per path: cid 0 (admin) plus IO connections.
    pub connections_per_path: u16,
    /// What happens to IO while the session is down.
    pub on_disconnect: OnDisconnect,
    /// The RTRS client's configuration (capacities, timers, policy).
    pub rtrs: ClientConfig,
}

impl InitiatorConfig {
    /// Heartbeat interval of [`InitiatorConfig::new`].
    pub const HEARTBEAT_INTERVAL_NS: u64 = 1_000_000_000;
    /// Missed heartbeats tolerated by [`InitiatorConfig::new`].
    pub const HEARTBEAT_MISSED_MAX: u32 = 2;
    /// Connect timeout of [`InitiatorConfig::new`].
    pub const CONNECT_TIMEOUT_NS: u64 = 3_000_000_000;
    /// Disconnect timeout of [`InitiatorConfig::new`].
    pub const DISCONNECT_TIMEOUT_NS: u64 = 500_000_000;
    /// Reconnect delay of [`InitiatorConfig::new`].
    pub const RECONNECT_DELAY_NS: u64 = 500_000_000;
    /// Largest server queue depth [`InitiatorConfig::new`] accepts: Linux's
    /// and Brick's default. The RTRS client posts `2 × max_queue_depth + 8`
    /// receives on every connection, which the software HCA's receive queue
    /// (`roce::qp::config::RQ_DEPTH`, 2048) holds; a server announcing more
    /// is refused with `PathError::BadConnRsp`.
    pub const MAX_SERVER_QUEUE_DEPTH: u16 = 512;
    /// Hold timeout of [`InitiatorConfig::new`].
    pub const HOLD_TIMEOUT_NS: u64 = 30_000_000_000;

    /// Defaults (see the module docs for the timing): queue depth 32,
    /// 1 MiB transfers, 16 volumes, 2 paths of 3 connections, IO held for up
    /// to 30 s while disconnected, min-inflight multipath. `uuid_seed` seeds
    /// the session and path uuids (give it 16 random bytes).
    pub const fn new(uuid_seed: [u8; 16]) -> Self {
        let mut rtrs = ClientConfig::default_with_seed(uuid_seed);
        rtrs.max_paths = 2;
        rtrs.max_connections_per_path = 3;
        rtrs.max_header_len = 512;
        rtrs.max_queue_depth = Self::MAX_SERVER_QUEUE_DEPTH;
        rtrs.policy = MultipathPolicy::MinInflight;
        rtrs.heartbeat_interval_ns = Self::HEARTBEAT_INTERVAL_NS;
        rtrs.heartbeat_missed_max = Self::HEARTBEAT_MISSED_MAX;
        rtrs.connect_timeout_ns = Self::CONNECT_TIMEOUT_NS;
        rtrs.disconnect_timeout_ns = Self::DISCONNECT_TIMEOUT_NS;
        rtrs.reconnect_delay_ns = Self::RECONNECT_DELAY_NS;
        rtrs.max_reconnect_attempts = None;
        Self {
            queue_depth: 32,
            max_transfer: 1 << 20,
            max_volumes: 16,
            connections_per_path: 3,
            on_disconnect: OnDisconnect::Hold {
                hold_timeout_ns: Self::HOLD_TIMEOUT_NS,
            },
            rtrs,
        }
    }

    /// Bytes of registered memory the initiator allocates itself (the IO
    /// data pool and the admin reply buffers), excluding the RTRS client's.
    pub const fn pool_bytes(&self) -> u64 {
        self.queue_depth as u64 * self.max_transfer as u64
            + (self.max_volumes as u64 + 1) * ADMIN_SLOT as u64
    }
}

/// Bytes of one admin reply slot (OPEN_RSP is 56 bytes, SESS_INFO_RSP 36).
pub(crate) const ADMIN_SLOT: u32 = 64;

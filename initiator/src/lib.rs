//! Brick's userspace RNBD initiator: sessions, volumes and block IO.
//!
//! The initiator maps Brick (or Linux `rnbd_server`) volumes from user
//! space: it opens an RTRS session over one or more paths
//! ([`rtrs::client::Client`], `docs/protocol/rtrs.md` §2–§7), speaks RNBD on
//! top of it ([`rnbd::client`], `docs/protocol/rnbd.md` §3, §5) and gives
//! its caller volumes to read, write (optionally FUA), flush and discard,
//! with a queue depth, statistics, and transparent recovery when paths or
//! the whole session go away.
//!
//! Two layers:
//!
//! * [`Initiator`] (module [`engine`]): the sans-IO core over any
//!   [`verbs::Verbs`] provider. Time is passed in, work is bounded per
//!   [`Initiator::poll`], [`Initiator::poll_at`] says when to come back,
//!   control events come from [`Initiator::next_event`] and IO completions
//!   from [`Initiator::next_completion`]. Everything it needs is allocated
//!   in [`Initiator::new`]; the IO path allocates nothing.
//! * [`hosted`]: a Linux process's view: one software HCA
//!   ([`roce::hca::Hca`]) on a link opened from a
//!   [`hal::hosted::LinkSpec`] (`frame:…` or `udp:…`), the run loop, and a
//!   blocking API ([`hosted::Session`], [`hosted::Volume`]) plus a
//!   submit/reap API with a queue depth for benchmarks.
//!
//! Configuration (queue depth, transfer size, heartbeat and reconnect
//! timing, what happens to IO while the session is down) is in [`config`];
//! the errors of every operation are in [`error`], the counters in
//! [`stats`].
//!
//! The crate has no `unsafe` (`#![forbid(unsafe_code)]`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod config;
pub mod crash_check;
pub mod engine;
pub mod error;
pub mod hosted;
mod hosted_port;
pub mod stats;

pub use config::{InitiatorConfig, OnDisconnect};
pub use engine::{Completion, Event, Initiator, IoKind, VolumeId, VolumeInfo, VolumeState};
pub use error::{CloseError, ConnectError, InitError, IoError, OpenError, SubmitError};
pub use rnbd::wire::AccessMode;
pub use stats::{LatencyHistogram, PathReport, SessionStats, VolumeStats};

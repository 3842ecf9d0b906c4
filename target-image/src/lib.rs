//! The Brick board: the target engine built from a boot manifest.
//!
//! [`Engine`] owns everything the target serves with (ARCHITECTURE.md §2, §3):
//! one software HCA ([`roce::hca::Hca`]) per manifest interface, one RTRS
//! server ([`rtrs::server::Server`]) over all of them (the engine lends it
//! the HCAs as its ports on every call, so a multipath client's paths over
//! several interfaces are one session, and the engine reads an IO's chunk
//! from its own HCA), one RNBD server ([`rnbd::server::Server`]) for all of
//! them, the volumes and the export table (the manifest's volumes,
//! `device_path` mapping and access list).
//! It is `no_std` + `alloc`, allocates only in [`Engine::new`], and is
//! sans-IO: frames come in through [`Engine::receive`], go out through the
//! [`Transmit`] sink of [`Engine::poll`], time is passed in.
//!
//! # The glue
//!
//! RTRS `Event::Io` -> the RNBD message is copied out of the chunk ->
//! [`rnbd::server::Server::process`] with the chunk's data area as the
//! response buffer (SESS_INFO_RSP / OPEN_RSP land at its start, as RTRS
//! expects for a READ answered from the chunk) -> `Respond` / `Refuse` are
//! answered at once with their errno; `Submit` is executed on the volume
//! (bytes copied between the registered chunk, through the checked
//! [`verbs::Memory`] accessors, and the volume), reported to
//! [`rnbd::server::Server::complete`], and answered with the completion's
//! errno (read data goes back from the chunk). A closed RTRS session ends the
//! RNBD session ([`rnbd::server::Server::end_session`]).
//!
//! # Run loop (STYLE.md §2)
//!
//! ```text
//! loop {
//!     for each interface: take up to a burst of frames -> engine.receive(i, now, frame)
//!     busy |= engine.poll(now, &mut sink)          // bounded
//!     if !busy { block until a frame or engine.poll_at(now) }  // never spin idle
//! }
//! ```
//!
//! # Volumes
//!
//! Every volume is a [`hal::block::BlockDevice`] over [`Chunk`] handles:
//! the engine submits a checked request naming the chunk that holds (or
//! receives) the data, parks it if the device queue is full, and answers
//! the RTRS request when the device's completion comes back from
//! [`Engine::poll`]. RAM volumes ([`RamVolume`]) complete within the same
//! poll; hosted files and block devices (`hosted::HostedVolume`) complete
//! from a worker pool. A session that closes with IO in flight stays in the
//! table until its last completion is reported to RNBD (its answers are
//! dropped by RTRS).
//!
//! # Reading order
//!
//! One file per concern: `engine` ([`Engine`]: construction from the
//! manifest, the HCAs it owns and lends to the RTRS server, the poll
//! loop), `sessions` (RTRS events, the session table, deferred CLOSE
//! answers, the access rules as admission hook and export table), `io`
//! (one request from its RTRS event to its answer) and `io_state` (the
//! state machine of a block request: received, parked, executing,
//! answered), `volumes` ([`Chunk`],
//! [`RamOr`], [`volume_info`], the chunk memory devices reach), `capacity`
//! (what the manifest's limits make every table hold: [`server_config`],
//! [`arena_bytes`], [`hca_capacity`], [`max_requests`]), `stats`
//! ([`StatsReport`]), `latency` (per-volume histograms, [`LatencyHistogram`]),
//! `metrics` and `metrics_sessions` ([`Engine::write_metrics`]: the
//! Prometheus text format), `admin_render` (what the admin endpoint
//! renders: metrics, extent lists), `admin_http` (its HTTP, shared by the
//! hosted target and the image), `admin` (hosted: the snapshot exchange
//! with the admin thread), `admin_tcp` (the image: the endpoint over
//! smoltcp TCP on one interface) and `admin_frames` (its frames and
//! smoltcp device; docs/ADMIN.md), `icmp` (echo replies) and `error`
//! ([`BuildError`]).
//!
//! # Limits of this version
//!
//! * ICMP echo requests to an interface address are answered (so a peer can
//!   `ping` the target up); one reply is held per interface.

#![no_std]
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

#[cfg(feature = "std")]
extern crate std;

/// Logs one line through the engine's logger (fields borrowed disjointly).
macro_rules! log {
    ($engine:expr, $($arg:tt)*) => {
        if let Some(logger) = $engine.logger.as_mut() {
            logger(format_args!($($arg)*));
        }
    };
}

#[cfg(feature = "std")]
pub mod admin;
mod admin_frames;
pub mod admin_http;
pub mod admin_render;
pub mod admin_tcp;
pub mod boot;
mod capacity;
mod engine;
mod error;
#[cfg(feature = "std")]
pub mod hosted;
#[cfg(feature = "std")]
pub mod hosted_thin;
#[cfg(feature = "std")]
pub mod ibv;
mod icmp;
mod io;
mod io_state;
mod latency;
mod metrics;
mod metrics_sessions;
mod port;
mod sessions;
mod stats;
mod volumes;

pub use capacity::{
    arena_bytes, hca_capacity, max_requests, path_pools, server_config, virtio_blk_config,
    virtio_net_config,
};
pub use engine::{Engine, EngineHca, HcaEngine, Transmit};
pub use error::BuildError;
pub use icmp::icmp_echo_reply;
pub use latency::{LatencyHistogram, LATENCY_BOUNDS_NS};
pub use metrics::{FixedText, Refusals, ThinGauges};
pub use port::Port;
pub use stats::StatsReport;
pub use volumes::{ram_volume, volume_info, Chunk, RamOr, RamVolume, VolumeCounters, RAM_QUEUE};

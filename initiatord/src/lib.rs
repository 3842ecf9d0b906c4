//! brick-initiatord: keeps the Linux rnbd client mapped as a config says.
//!
//! The daemon reads a TOML file of volumes ([`config`]), looks at the rnbd
//! and rtrs client sysfs ([`observe`], through the [`sysfs::Sysfs`] trait),
//! and reconciles the two ([`reconcile`]): it maps what is missing, adds
//! lost paths, kicks reconnects, reopens volumes the target lost, unmaps
//! what was removed (never an open device without `--force`) and keeps the
//! `/dev/brick/<name>` links right. Every action is logged with its reason.
//!
//! The kernel interface is described in `docs/protocol/rnbd.md` §5 and
//! `docs/protocol/rtrs.md` §8. The tests simulate it with a fake kernel
//! (module `fake`, a [`sysfs::Sysfs`] that reacts as rnbd and rtrs do),
//! so the reconciliation is tested without a kernel. That module is
//! compiled only for this crate's own tests (`#[cfg(test)]`): it is not
//! part of the library.
//!
//! Modules: [`config`] (TOML -> validated [`config::Config`], errors with
//! line and field), [`sysfs`] (the [`sysfs::Sysfs`] trait and the host
//! implementation), [`observe`] (sysfs -> [`observe::Observed`]),
//! [`reconcile`] (plan and apply), [`daemon`] (config in force, reload,
//! run-time volumes, the answers to control-socket requests) and
//! [`status`] (the report). The control socket itself (typed requests and
//! replies, one JSON object per line, the client and the server's framing)
//! is the `control` crate (`brick-control`), which the `brick` command
//! uses too. Volumes with `export = "nbd:…"` are not the kernel's:
//! [`userspace`] maps them with Brick's own initiator and serves them with
//! the [`nbd`] server (fixed-newstyle NBD over a unix socket or loopback
//! TCP). `examples/initiator.toml` is a commented config;
//! `brick-initiatord.service` the systemd unit.
//!
//! No unsafe code here; the signal handlers are `hal::hosted::signals`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod daemon;
#[cfg(test)]
mod fake;
pub mod nbd;
pub mod observe;
pub mod reconcile;
pub mod status;
pub mod sysfs;
pub mod userspace;

#[cfg(test)]
mod scenarios;

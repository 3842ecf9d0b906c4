//! RTRS, the RDMA transport under RNBD: wire messages and server (Linux 6.1).
//!
//! RTRS (formerly IBTRS) is the transport Linux's `rtrs-server`/`rtrs-client`
//! speak: a session of paths, each path a set of RC connections, requests
//! written with RDMA WRITE WITH IMM into server chunks, answers carried in the
//! 32-bit immediate. The full behaviour is in `docs/protocol/rtrs.md`. The
//! crate holds the wire layer, [`wire`], shared by Brick's server and its
//! userspace client, and the server state machine, [`server`] (sessions,
//! paths, chunk pools, IO dispatch, responses, heartbeats), sans-IO over the
//! `verbs` fabric seam, and the client state machine, [`client`] (a session
//! over several paths, permits, IO submission, heartbeats, failover and
//! reconnect), which Brick's userspace initiator drives.
//!
//! The crate is `no_std` (`std` only for host tests) and
//! `#![forbid(unsafe_code)]`. The wire layer never allocates; the server
//! and the client allocate their fixed tables once, in `Server::new` and
//! `Client::new` (they use `alloc`), and never afterwards.

#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
mod link;
pub mod server;
pub mod wire;

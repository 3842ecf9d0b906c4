//! RTRS, the RDMA transport under RNBD: wire messages (Linux 6.1 compatible).
//!
//! RTRS (formerly IBTRS) is the transport Linux's `rtrs-server`/`rtrs-client`
//! speak: a session of paths, each path a set of RC connections, requests
//! written with RDMA WRITE WITH IMM into server chunks, answers carried in the
//! 32-bit immediate. The full behaviour is in `docs/protocol/rtrs.md`; this
//! crate so far holds the wire layer, [`wire`], shared by Brick's server and
//! its userspace client. The session and path state machines come next.
//!
//! The crate is `no_std` (`std` only for host tests), allocation-free and
//! `#![forbid(unsafe_code)]`.

#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod wire;

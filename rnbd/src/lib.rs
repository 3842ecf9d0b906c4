//! RNBD, the block protocol over RTRS: wire messages (Linux 6.1 compatible).
//!
//! RNBD (formerly IBNBD) is what Linux's `rnbd-server`/`rnbd-client` speak on
//! top of RTRS: every RNBD message is the user header of an RTRS read or write
//! request, and the answer is the RTRS response (errno in the immediate, plus
//! RDMA-written data for reads). The full behaviour is in
//! `docs/protocol/rnbd.md`; this crate so far holds the wire layer, [`wire`].
//! The server and client logic come next.
//!
//! The crate is `no_std` (`std` only for host tests), allocation-free and
//! `#![forbid(unsafe_code)]`.

#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod wire;

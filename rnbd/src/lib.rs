//! RNBD, the block protocol over RTRS: messages, server and client logic.
//!
//! RNBD (formerly IBNBD) is what Linux's `rnbd-server`/`rnbd-client` speak on
//! top of RTRS: every RNBD message is the user header of an RTRS read or write
//! request, and the answer is the RTRS response (errno in the immediate, plus
//! RDMA-written data for reads). The full behaviour is in
//! `docs/protocol/rnbd.md`. Layers, all sans-IO:
//!
//! * [`wire`]: every message as zero-copy views and validated `Repr`s
//!   (rnbd.md §2);
//! * [`server`]: sessions, device tables, OPEN/CLOSE, IO checked into block
//!   requests, and the one errno mapping (rnbd.md §4, §8);
//! * [`client`]: what an initiator sends and how it reads the answers
//!   (rnbd.md §3, §5);
//! * [`errno`] and [`config`]: the errno values and the fixed capacities.
//!
//! The crate is `no_std` (`std` only for host tests), allocation-free and
//! `#![forbid(unsafe_code)]`.

#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod errno;
pub mod server;
pub mod wire;

//! The verbs provider over libibverbs and librdmacm: Brick's engine and
//! initiator on a real HCA (mlx5 through the kernel's mlx5_ib) or on Linux
//! rxe, with nothing in RTRS or RNBD knowing which provider runs.
//!
//! [`IbvDevice`] is one device port found through the IPv4 address it
//! serves (rdma_cm binds the address and names the device), with one
//! protection domain, one completion queue polled busily (no completion
//! channel on the data path), memory mapped once at open and carved by the
//! verbs crate's `Arena` (each buffer registered with `ibv_reg_mr` when RTRS
//! registers it), and RC queue pairs made by rdma_cm. Every queue pair
//! reserves its send and receive depth from the completion queue's
//! entries, so the queue cannot overflow. The rdma_cm event channel is
//! non-blocking: nothing here blocks or sleeps.
//!
//! The C layer (`shim/brick_ibv.c`) holds every use of libibverbs' and
//! librdmacm's structures and inline calls; Rust passes Brick's own flat
//! structures ([`ffi`]), so no libibverbs layout is written by hand.
//!
//! What userspace verbs cannot do: re-key a region (no fast-register work
//! request) and LOCAL_INV. The engine serves with `always_invalidate` off
//! on this provider (RTRS's CON_RSP then carries no NEW_RKEY flag and the
//! client keeps the chunk keys it learnt), as any userspace RTRS target
//! must; see docs/VERBS.md.

#![warn(missing_docs)]

mod conn;
mod cqs;
mod device;
mod dma;
pub mod ffi;
mod link;
mod provider;
mod queues;
mod translate;

pub use device::{IbvConfig, IbvDevice, OpenError};
pub use link::IbvLink;

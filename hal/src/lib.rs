//! The machine as the Brick engine sees it: NIC, clock, randomness, idling.
//!
//! Small traits that the protocol crates' owners (`roce`, the target image,
//! the initiator) drive: [`Nic`] and [`DatagramNic`] move frames with
//! scatter-gather transmit and zero-copy receive, [`Clock`] gives monotonic
//! nanoseconds, [`Rng`] random bytes, and [`Idle`] halts the loop until a
//! deadline or input. [`block`] has the asynchronous submit/poll
//! [`BlockDevice`] interface for volumes and the portable RAM disk.
//! `hal` knows nothing of RDMA.
//!
//! Behind the `std` feature, [`hosted`] has the drivers for a Linux process:
//! the QEMU stream-netdev frame link, a UDP socket on the RoCEv2 port, the
//! monotonic clock, OS randomness, link specifications, a ppoll(2) wait and
//! the file/block-device volume (a worker pool).
//! The image drivers (PVH boot, serial, PCI, virtio, TSC) come later.
//!
//! # Unsafe
//!
//! The crate root denies `unsafe_code`. Unsafe lives in: `hosted::sys`
//! (ppoll(2), sendmsg(2), fallocate(2) and the block-device ioctls
//! `BLKSSZGET`, `BLKPBSZGET`, `BLKDISCARD`, `BLKZEROOUT` through libc).
//! Every block carries a `// SAFETY:` line.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod block;
pub mod clock;
pub mod idle;
pub mod nic;
pub mod rng;

#[cfg(feature = "std")]
pub mod hosted;

pub use block::{BlockDevice, BufferAccess};
pub use clock::Clock;
pub use idle::Idle;
pub use nic::{DatagramNic, Nic, NicError, ETHERNET_HEADER_LEN};
pub use rng::Rng;

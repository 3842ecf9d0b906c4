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
//! The image drivers: [`virtio`] (polled split virtqueues, virtio-net as a
//! [`Nic`], virtio-blk as a [`BlockDevice`]) over [`dma`] memory, and
//! [`fw_cfg`] (QEMU's firmware configuration, DMA interface), and [`nvme`]
//! (a polled NVMe controller, each namespace a [`BlockDevice`]), over
//! [`pci`] configuration space (ECAM from ACPI MCFG, or the legacy
//! ports). They are
//! `no_std` + `alloc` (allocating at construction only) and are tested on
//! the host against mock devices. (PVH boot, serial and TSC live in the image.)
//!
//! # Unsafe
//!
//! The crate root denies `unsafe_code`. Unsafe lives in: `hosted::sys`
//! and `hosted::signals` (ppoll(2), sendmsg(2), fallocate(2), sigaction(2) and the block-device ioctls
//! `BLKSSZGET`, `BLKPBSZGET`, `BLKDISCARD`, `BLKZEROOUT` through libc);
//! [`dma`] (volatile access to device-shared memory); `virtio::transport`
//! (virtio PCI MMIO); `virtio::net` (lending a returned RX buffer to the
//! receive closure); `fw_cfg::port` (x86 port I/O); `nvme::regs` (NVMe
//! BAR0 MMIO); `pci::ecam` (configuration space MMIO) and `pci::legacy`
//! (ports 0xcf8/0xcfc).
//! Every block carries a `// SAFETY:` line.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod block;
pub mod clock;
#[allow(unsafe_code)]
pub mod dma;
pub mod fw_cfg;
pub mod idle;
pub mod nic;
pub mod nvme;
pub mod pci;
pub mod rng;
pub mod virtio;

#[cfg(feature = "std")]
pub mod hosted;

pub use block::{BlockDevice, BufferAccess};
pub use clock::Clock;
pub use idle::Idle;
pub use nic::{DatagramNic, Nic, NicError, ETHERNET_HEADER_LEN};
pub use rng::Rng;

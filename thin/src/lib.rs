//! Thin-provisioned volumes on 2 MiB extents over a shared pool device.
//!
//! A [`Pool`] is a block device (a file or block device hosted; virtio-blk
//! or NVMe in the image) carved into extents (2 MiB by default) behind a
//! small metadata area. Each [`ThinVolume`] of the pool is itself a
//! [`hal::block::BlockDevice`]: an extent is allocated on the first write
//! to it, reads of unallocated space return zeroes without touching the
//! pool, DISCARD and WRITE_ZEROES free the whole extents they cover and
//! zero the partial ones. Volumes share the pool's extents and may
//! overcommit it: a write that needs a new extent when none is free fails
//! with `ENOSPC`, and only that write.
//!
//! # On disk (docs/THIN.md)
//!
//! A versioned superblock (layout, the volume table) and map blocks (one
//! 16-byte entry per physical extent: owning volume, virtual extent,
//! generation), each 4 KiB with a CRC-32 and stored twice, A and B: a
//! write goes to the copy not holding the newest valid version, so a torn
//! write leaves the previous version. See [`format`].
//!
//! # Ordering
//!
//! A write to an unallocated extent writes its data and zeroes the rest of
//! the extent, flushes the pool (if it has a volatile cache), writes the
//! extent's map block (FUA, or write + flush), and only then completes: one
//! metadata write per allocation (allocations in the same map block whose
//! entries are ready together share it). Frees run the other way round:
//! wait for IO on the extent, discard or zero it on the pool, write the
//! map block, and only then is the extent reusable. A write to an
//! allocated extent costs no metadata IO. The map is the only record of
//! allocation — the free list is rebuilt from it at open — so a crash
//! leaks nothing an in-flight write took; [`Pool::open`]'s check reclaims
//! entries no volume can own (a virtual extent claimed twice: the newer
//! generation wins) and reports them.
//!
//! # Sharing and polling
//!
//! The pool's state is shared by its volumes (`Rc<RefCell<…>>`: the engine
//! is single-threaded). Every volume's `poll` collects every completion of
//! the pool device and moves every waiting request of every volume on;
//! the volume then delivers its own. So all volumes of a pool must be
//! driven with buffer accessors that resolve each other's handles (one
//! engine's chunk memory).
//!
//! # No allocation on the data path
//!
//! Tables (map, free list, request slots, completion queues, metadata
//! buffers) are sized when the pool and its volumes open.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

mod buffers;
pub mod format;
mod io;
mod open;
mod state;
mod volume;

pub use buffers::PoolBuf;
pub use state::PoolStats;
pub use volume::{OpenReport, Pool, PoolConfig, ThinError, ThinVolume, WeakPool};

//! Registered memory: handles, region descriptors and checked access.
//!
//! Memory lives in pools allocated once when the provider is built. A
//! consumer holds [`MemoryHandle`]s (buffer id + offset + length), never
//! pointers, and reaches the bytes only through the [`Memory`] accessors,
//! which check the handle's liveness and every bound and return
//! [`AccessError`] instead of panicking. So a portable crate can read an
//! RTRS header the peer placed into a chunk, or fill a chunk for a volume
//! read, without `unsafe`.
//!
//! Handle access is the CPU's own access and needs no key or access flag.
//! Keys and flags govern what the HCA does on a work request's behalf: local
//! SGEs name memory by [`Lkey`], peers by [`Rkey`] + address. [`Arena`] is
//! the reference pool that implements all of it; a software HCA builds on it.

mod arena;

pub use arena::{Arena, MAX_REGIONS};

use crate::access::AccessFlags;
use crate::error::AccessError;
use crate::key::{Lkey, Rkey};
use crate::wr::Sge;

/// Names a buffer of the pool: the slot index and the generation of the
/// allocation it belongs to, so a freed-and-reused slot is detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionId {
    index: u32,
    generation: u16,
}

impl RegionId {
    /// Id of slot `index` in its allocation `generation` (for providers).
    pub const fn new(index: u32, generation: u16) -> Self {
        Self { index, generation }
    }

    /// Slot index in the provider's table.
    pub const fn index(self) -> u32 {
        self.index
    }

    /// Allocation generation of the slot.
    pub const fn generation(self) -> u16 {
        self.generation
    }
}

/// A byte range of a buffer: buffer id + offset + length.
///
/// Plain data, freely copied. It grants nothing by itself: every access
/// checks that the buffer is still allocated and the range inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryHandle {
    region: RegionId,
    offset: u32,
    len: u32,
}

impl MemoryHandle {
    /// Handle of `len` bytes at `offset` in buffer `region` (for providers;
    /// consumers get handles from allocation and narrow them with
    /// [`slice`](Self::slice)).
    pub const fn new(region: RegionId, offset: u32, len: u32) -> Self {
        Self {
            region,
            offset,
            len,
        }
    }

    /// The buffer.
    pub const fn region(self) -> RegionId {
        self.region
    }

    /// Offset from the start of the buffer.
    pub const fn offset(self) -> u32 {
        self.offset
    }

    /// Length in bytes.
    pub const fn len(self) -> u32 {
        self.len
    }

    /// Whether the handle covers no bytes.
    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The sub-range of `len` bytes at `offset` within this handle, or
    /// `None` if it does not fit.
    pub fn slice(self, offset: u32, len: u32) -> Option<Self> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(Self {
            region: self.region,
            offset: self.offset + offset,
            len,
        })
    }
}

/// What registration returns: the keys and address a consumer uses and
/// advertises. The rkey is a snapshot: after a re-key, use the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryRegion {
    /// The whole registered buffer.
    pub handle: MemoryHandle,
    /// Key for this host's SGEs; stable until deregistration.
    pub lkey: Lkey,
    /// Key for peers; changes on every re-key.
    pub rkey: Rkey,
    /// The address peers use for the region's first byte (RETH VA, RTRS
    /// `desc.addr`).
    pub iova: u64,
    /// Rights granted.
    pub access: AccessFlags,
}

impl MemoryRegion {
    /// Length of the region in bytes.
    pub const fn len(&self) -> u32 {
        self.handle.len()
    }

    /// Whether the region is empty (never true for an `Arena` region).
    pub const fn is_empty(&self) -> bool {
        self.handle.is_empty()
    }

    /// An SGE for `len` bytes at `offset` of the region (checked when
    /// posted).
    pub const fn sge(&self, offset: u32, len: u32) -> Sge {
        Sge::new(self.lkey, offset, len)
    }

    /// The remote address of byte `offset` of the region.
    pub const fn remote_addr(&self, offset: u32) -> u64 {
        self.iova + offset as u64
    }
}

/// Checked access to registered memory through handles.
///
/// Implementors provide the two closure accessors; `read` and `write` copy
/// through them. The closures see the checked range only, for as long as
/// the call lasts, so no reference into registered memory outlives it.
pub trait Memory {
    /// Runs `f` on the `len` bytes at `offset` within `handle`.
    ///
    /// # Errors
    ///
    /// [`AccessError::StaleHandle`] if the buffer was freed,
    /// [`AccessError::OutOfBounds`] if the range does not fit the handle.
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError>;

    /// Runs `f` on the `len` bytes at `offset` within `handle`, writable.
    ///
    /// # Errors
    ///
    /// As [`with_slice`](Self::with_slice).
    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError>;

    /// Copies `dst.len()` bytes at `offset` within `handle` into `dst`.
    ///
    /// # Errors
    ///
    /// As [`with_slice`](Self::with_slice); nothing is copied on error.
    fn read(&self, handle: MemoryHandle, offset: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        let len = u32::try_from(dst.len()).map_err(|_| AccessError::OutOfBounds)?;
        self.with_slice(handle, offset, len, |src| dst.copy_from_slice(src))
    }

    /// Copies `src` to `offset` within `handle`.
    ///
    /// # Errors
    ///
    /// As [`with_slice`](Self::with_slice); nothing is copied on error.
    fn write(&mut self, handle: MemoryHandle, offset: u32, src: &[u8]) -> Result<(), AccessError> {
        let len = u32::try_from(src.len()).map_err(|_| AccessError::OutOfBounds)?;
        self.with_slice_mut(handle, offset, len, |dst| dst.copy_from_slice(src))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_slice() {
        let handle = MemoryHandle::new(RegionId::new(1, 2), 10, 100);
        let sub = handle.slice(20, 30).unwrap();
        assert_eq!((sub.offset(), sub.len()), (30, 30));
        assert_eq!(handle.slice(90, 10).map(MemoryHandle::len), Some(10));
        assert_eq!(handle.slice(90, 11), None);
        assert_eq!(handle.slice(u32::MAX, 2), None);
        assert_eq!(sub.region(), RegionId::new(1, 2));
    }
}

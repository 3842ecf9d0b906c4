//! `Arena`: the reference registered-memory pool, allocated once.
//!
//! One byte pool (any `AsRef<[u8]> + AsMut<[u8]>` storage: `Box<[u8]>`,
//! `Vec<u8>`, `&'static mut [u8]`) and a region table of `R` slots, `R`
//! chosen at construction ([`Arena::with_regions`]; [`Arena::new`] takes
//! the type's `N`). Buffers
//! are carved first-fit from the pool and zeroed on allocation, so a new
//! owner (or a peer with an rkey) never sees a previous owner's bytes. Each
//! buffer is registered at most once, as a whole, getting an lkey and an
//! rkey. The region table is allocated once, at construction; nothing
//! allocates after it.
//!
//! Keys: index (24 bits) + variant (8 bits). The index is the slot number
//! plus a random multiple of `R`, and the variant is random, non-zero and
//! never the previous one; both are redrawn on every re-key. A key finds its
//! slot in O(1) (`index % R`). A peer guessing
//! a current rkey succeeds with probability about `R / 2^32`, and a wrong
//! guess kills its connection (NAK, QP error).
//!
//! Contract: no method panics, whatever the handle, key, SGE or address;
//! every refusal is an error value.

use alloc::vec::Vec;
use core::ops::Range;

use crate::access::AccessFlags;
use crate::error::{AccessError, AllocError, RegError};
use crate::key::{KeySource, Lkey, Rkey};
use crate::memory::{Memory, MemoryHandle, MemoryRegion, RegionId};
use crate::wr::{Sge, MAX_SGE};

/// A registration: keys, rights and how many posted work requests use it.
#[derive(Clone, Copy, Debug)]
struct Registration {
    lkey: Lkey,
    rkey: Rkey,
    access: AccessFlags,
    /// False after invalidation, until the next re-key.
    remote_valid: bool,
    /// Posted work requests naming this region (see `Arena::pin`).
    pins: u32,
}

/// One slot of the region table.
#[derive(Clone, Copy, Debug)]
struct Slot {
    start: usize,
    len: u32,
    generation: u16,
    live: bool,
    registration: Option<Registration>,
}

/// Registered-memory pool with a fixed table of at most [`MAX_REGIONS`] buffers,
/// sized when built: [`Arena::with_regions`] takes the count at run time
/// (the type's `N` is then unused, `Arena<S>`), [`Arena::new`] takes `N`.
///
/// The table (about 40 bytes per slot) is allocated once, at construction.
///
/// ```
/// use verbs::memory::Arena;
/// use verbs::{AccessError, AccessFlags, KeySource, Memory};
///
/// struct Counter(u32); // a real provider passes its HAL random source
/// impl KeySource for Counter {
///     fn next_u32(&mut self) -> u32 {
///         self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
///         self.0
///     }
/// }
///
/// let mut arena: Arena<Vec<u8>, 16> = Arena::new(vec![0; 1 << 16]);
/// let mut keys = Counter(1);
/// let chunk = arena.alloc(4096, 64)?;
/// let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
/// let mr = arena.register(chunk, access, &mut keys)?;
///
/// // The responder places a peer's RDMA WRITE after checking key and range.
/// let target = arena.resolve_remote(mr.rkey, mr.remote_addr(100), 5, AccessFlags::REMOTE_WRITE)?;
/// arena.write(target, 0, b"hello")?;
/// let mut header = [0; 5];
/// arena.read(chunk, 100, &mut header)?;
/// assert_eq!(&header, b"hello");
///
/// // always_invalidate: revoke, serve the IO, hand back under a fresh key.
/// arena.invalidate(mr.rkey)?;
/// let denied = arena.resolve_remote(mr.rkey, mr.iova, 1, AccessFlags::REMOTE_WRITE);
/// assert_eq!(denied, Err(AccessError::InvalidKey));
/// let fresh = arena.rekey(mr.lkey, &mut keys)?;
/// assert_ne!(fresh, mr.rkey);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Arena<S, const N: usize = 0> {
    storage: S,
    /// Slot table; grows up to `regions` entries (capacity reserved at
    /// construction), freed slots are reused.
    slots: Vec<Slot>,
    /// Indices of live slots, sorted by start (first-fit allocation).
    order: Vec<u32>,
    /// Size of the region table (1..=[`MAX_REGIONS`]).
    regions: usize,
}

/// Most regions an arena's table holds: a key's 24-bit index part is the
/// slot plus a random multiple of the table size, so at least 16
/// multiples remain (a guessed key names a live region with probability
/// about `regions / 2^32`).
pub const MAX_REGIONS: usize = 1 << 20;

impl<S: AsRef<[u8]> + AsMut<[u8]>, const N: usize> Arena<S, N> {
    const TABLE_FITS: () = assert!(N > 0 && N <= MAX_REGIONS, "Arena: N must be in 1..=2^20");

    /// A pool over `storage` with a table of `N` regions (its current
    /// contents are irrelevant: buffers are zeroed on allocation).
    pub fn new(storage: S) -> Self {
        let () = Self::TABLE_FITS;
        Self::with_regions(storage, N)
    }

    /// A pool over `storage` with a table of `regions` regions, clamped to
    /// 1..=[`MAX_REGIONS`]; the table is allocated here, once.
    pub fn with_regions(storage: S, regions: usize) -> Self {
        let regions = regions.clamp(1, MAX_REGIONS);
        Self {
            storage,
            slots: Vec::with_capacity(regions),
            order: Vec::with_capacity(regions),
            regions,
        }
    }

    /// Bytes the region table of `regions` regions takes (what
    /// [`Arena::with_regions`] allocates besides the storage).
    pub const fn table_bytes(regions: usize) -> usize {
        regions * (core::mem::size_of::<Slot>() + core::mem::size_of::<u32>())
    }

    /// Size of the region table: most buffers the arena holds at once.
    pub fn regions(&self) -> usize {
        self.regions
    }

    /// Size of the pool in bytes.
    pub fn capacity(&self) -> usize {
        self.storage.as_ref().len()
    }

    /// The pool's bytes where they lie: a NIC driver that sends payloads
    /// from registered memory in place translates this range once.
    pub fn bytes(&self) -> &[u8] {
        self.storage.as_ref()
    }

    /// Number of live buffers.
    pub fn buffers(&self) -> usize {
        self.order.len()
    }

    /// Allocates a zeroed buffer of `len` bytes whose offset in the pool is
    /// a multiple of `align` (relative to the storage start: a provider that
    /// needs absolute alignment supplies aligned storage).
    ///
    /// # Errors
    ///
    /// [`AllocError::ZeroLength`], [`AllocError::BadAlignment`] (not a power
    /// of two), [`AllocError::TableFull`], [`AllocError::OutOfMemory`].
    pub fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError> {
        if len == 0 {
            return Err(AllocError::ZeroLength);
        }
        if !align.is_power_of_two() {
            return Err(AllocError::BadAlignment);
        }
        let slot_index = match self.slots.iter().position(|slot| !slot.live) {
            Some(index) => index,
            None if self.slots.len() < self.regions => self.slots.len(),
            None => return Err(AllocError::TableFull),
        };
        let (position, start) = self.find_gap(len as usize, align as usize)?;
        let end = start + len as usize;
        self.storage
            .as_mut()
            .get_mut(start..end)
            .ok_or(AllocError::OutOfMemory)?
            .fill(0);

        let generation = match self.slots.get(slot_index) {
            Some(old) => old.generation.wrapping_add(1),
            None => 0,
        };
        let slot = Slot {
            start,
            len,
            generation,
            live: true,
            registration: None,
        };
        let index = u32::try_from(slot_index).map_err(|_| AllocError::TableFull)?;
        // Both pushes stay within the capacity reserved at construction
        // (`slot_index < regions`; `order` holds one entry per live slot).
        if slot_index == self.slots.len() {
            self.slots.push(slot);
        } else {
            self.slots[slot_index] = slot;
        }
        self.order.insert(position, index);
        Ok(MemoryHandle::new(RegionId::new(index, generation), 0, len))
    }

    /// First-fit search: (position in `order`, start offset).
    fn find_gap(&self, len: usize, align: usize) -> Result<(usize, usize), AllocError> {
        let mut cursor = 0usize;
        for (position, &index) in self.order.iter().enumerate() {
            let slot = &self.slots[index as usize];
            if let Some(start) = fit(cursor, slot.start, len, align) {
                return Ok((position, start));
            }
            cursor = slot.start + slot.len as usize;
        }
        fit(cursor, self.capacity(), len, align)
            .map(|start| (self.order.len(), start))
            .ok_or(AllocError::OutOfMemory)
    }

    /// Frees the buffer `handle` covers, deregistering it first.
    ///
    /// # Errors
    ///
    /// [`RegError::StaleHandle`], [`RegError::PartialBuffer`] (the handle is
    /// only part of the buffer), [`RegError::Busy`] (pinned).
    pub fn free(&mut self, handle: MemoryHandle) -> Result<(), RegError> {
        let index = self.whole_buffer(handle)?;
        if self.slots[index]
            .registration
            .is_some_and(|reg| reg.pins > 0)
        {
            return Err(RegError::Busy);
        }
        let slot = &mut self.slots[index];
        slot.live = false;
        slot.registration = None;
        self.order.retain(|&live| live as usize != index);
        Ok(())
    }

    /// Registers the buffer `handle` covers with `access`, drawing fresh
    /// keys from `keys`. The iova is the buffer's offset in the pool.
    ///
    /// # Errors
    ///
    /// [`RegError::StaleHandle`], [`RegError::PartialBuffer`],
    /// [`RegError::AlreadyRegistered`], [`RegError::InvalidAccess`].
    pub fn register(
        &mut self,
        handle: MemoryHandle,
        access: AccessFlags,
        mut keys: impl KeySource,
    ) -> Result<MemoryRegion, RegError> {
        let index = self.whole_buffer(handle)?;
        if self.slots[index].registration.is_some() {
            return Err(RegError::AlreadyRegistered);
        }
        if !access.is_valid() {
            return Err(RegError::InvalidAccess);
        }
        let lkey = Lkey(new_key(self.regions, index, None, &mut keys));
        let rkey = Rkey(new_key(self.regions, index, None, &mut keys));
        let slot = &mut self.slots[index];
        slot.registration = Some(Registration {
            lkey,
            rkey,
            access,
            remote_valid: true,
            pins: 0,
        });
        Ok(describe(slot, handle.region(), lkey, rkey, access))
    }

    /// Deregisters the region of `lkey`; the buffer stays allocated.
    ///
    /// # Errors
    ///
    /// [`RegError::InvalidKey`], [`RegError::Busy`] (pinned).
    pub fn deregister(&mut self, lkey: Lkey) -> Result<(), RegError> {
        let index = self.lkey_slot(lkey).map_err(|_| RegError::InvalidKey)?;
        let slot = &mut self.slots[index];
        if slot.registration.is_some_and(|reg| reg.pins > 0) {
            return Err(RegError::Busy);
        }
        slot.registration = None;
        Ok(())
    }

    /// Gives the region of `lkey` a fresh rkey (valid again if it was
    /// invalidated) and returns it; the old rkey stops working. This is
    /// the `always_invalidate` step that hands a chunk back to the peer.
    ///
    /// # Errors
    ///
    /// [`RegError::InvalidKey`], [`RegError::Busy`]: posted work requests
    /// still use the memory, and a peer writing through the new key could
    /// change bytes a retransmission resends.
    pub fn rekey(&mut self, lkey: Lkey, mut keys: impl KeySource) -> Result<Rkey, RegError> {
        let index = self.lkey_slot(lkey).map_err(|_| RegError::InvalidKey)?;
        let Some(reg) = self.slots[index].registration.as_mut() else {
            return Err(RegError::InvalidKey);
        };
        if reg.pins > 0 {
            return Err(RegError::Busy);
        }
        reg.rkey = Rkey(new_key(
            self.regions,
            index,
            Some(reg.rkey.variant()),
            &mut keys,
        ));
        reg.remote_valid = true;
        Ok(reg.rkey)
    }

    /// Invalidates `rkey` (LOCAL_INV, or a received SEND_WITH_INV): peers
    /// can no longer use it. Local access through the lkey is unaffected,
    /// and pins do not prevent it (revoking remote access is always safe).
    ///
    /// # Errors
    ///
    /// [`RegError::InvalidKey`] if `rkey` is not a currently valid rkey
    /// (a SEND_WITH_INV naming it is then a remote invalid-request error).
    pub fn invalidate(&mut self, rkey: Rkey) -> Result<(), RegError> {
        let index = self.rkey_slot(rkey).map_err(|_| RegError::InvalidKey)?;
        if let Some(reg) = self.slots[index].registration.as_mut() {
            reg.remote_valid = false;
        }
        Ok(())
    }

    /// The current descriptor of the region of `lkey`.
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`].
    pub fn region(&self, lkey: Lkey) -> Result<MemoryRegion, AccessError> {
        let index = self.lkey_slot(lkey)?;
        let slot = &self.slots[index];
        let reg = slot.registration.ok_or(AccessError::InvalidKey)?;
        let id = RegionId::new(index as u32, slot.generation);
        Ok(describe(slot, id, reg.lkey, reg.rkey, reg.access))
    }

    /// Pins the region of `lkey` for a posted work request: until the
    /// matching [`unpin`](Self::unpin), re-key, deregistration and free are
    /// refused with [`RegError::Busy`].
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`].
    pub fn pin(&mut self, lkey: Lkey) -> Result<(), AccessError> {
        let reg = self.registration_mut(lkey)?;
        reg.pins = reg.pins.saturating_add(1);
        Ok(())
    }

    /// Releases one pin of the region of `lkey` (unpinning an unpinned
    /// region does nothing).
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`].
    pub fn unpin(&mut self, lkey: Lkey) -> Result<(), AccessError> {
        let reg = self.registration_mut(lkey)?;
        reg.pins = reg.pins.saturating_sub(1);
        Ok(())
    }

    /// Pins every region `sgl` names (once per entry), or none if an lkey
    /// is invalid.
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`].
    pub fn pin_sgl(&mut self, sgl: &[Sge]) -> Result<(), AccessError> {
        for sge in sgl {
            self.lkey_registration(sge.lkey)?;
        }
        for sge in sgl {
            self.pin(sge.lkey)?;
        }
        Ok(())
    }

    /// Releases the pins [`pin_sgl`](Self::pin_sgl) took.
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`]; the other entries are still unpinned.
    pub fn unpin_sgl(&mut self, sgl: &[Sge]) -> Result<(), AccessError> {
        let mut result = Ok(());
        for sge in sgl {
            if let Err(error) = self.unpin(sge.lkey) {
                result = Err(error);
            }
        }
        result
    }

    /// Number of pins on the region of `lkey`.
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`].
    pub fn pin_count(&self, lkey: Lkey) -> Result<u32, AccessError> {
        self.lkey_registration(lkey).map(|reg| reg.pins)
    }

    /// Checks a local SGE against its region and `access`, returning a
    /// handle to its bytes.
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`], [`AccessError::AccessDenied`],
    /// [`AccessError::OutOfBounds`].
    pub fn resolve_local(
        &self,
        sge: &Sge,
        access: AccessFlags,
    ) -> Result<MemoryHandle, AccessError> {
        let index = self.lkey_slot(sge.lkey)?;
        let slot = &self.slots[index];
        let reg = slot.registration.ok_or(AccessError::InvalidKey)?;
        if !reg.access.contains(access) {
            return Err(AccessError::AccessDenied);
        }
        let id = RegionId::new(index as u32, slot.generation);
        MemoryHandle::new(id, 0, slot.len)
            .slice(sge.offset, sge.len)
            .ok_or(AccessError::OutOfBounds)
    }

    /// Checks a peer's access of `len` bytes at `va` with `rkey` needing
    /// `access` (REMOTE_WRITE or REMOTE_READ), as the RC responder must
    /// (`roce-v2.md` §2.7), returning a handle to the bytes.
    ///
    /// The key is checked even for `len == 0`; a responder skips this call
    /// for zero-length RETHs, which carry arbitrary keys.
    ///
    /// # Errors
    ///
    /// [`AccessError::InvalidKey`] (unknown, stale or invalidated rkey),
    /// [`AccessError::AccessDenied`], [`AccessError::OutOfBounds`].
    pub fn resolve_remote(
        &self,
        rkey: Rkey,
        va: u64,
        len: u32,
        access: AccessFlags,
    ) -> Result<MemoryHandle, AccessError> {
        let index = self.rkey_slot(rkey)?;
        let slot = &self.slots[index];
        let reg = slot.registration.ok_or(AccessError::InvalidKey)?;
        if !reg.access.contains(access) {
            return Err(AccessError::AccessDenied);
        }
        let offset = va
            .checked_sub(slot.start as u64)
            .ok_or(AccessError::OutOfBounds)?;
        let offset = u32::try_from(offset).map_err(|_| AccessError::OutOfBounds)?;
        let id = RegionId::new(index as u32, slot.generation);
        MemoryHandle::new(id, 0, slot.len)
            .slice(offset, len)
            .ok_or(AccessError::OutOfBounds)
    }

    /// Checks every entry of `sgl` with [`resolve_local`](Self::resolve_local)
    /// and returns the total length: what a provider does at post time.
    ///
    /// # Errors
    ///
    /// As `resolve_local`; [`AccessError::OutOfBounds`] if the total
    /// overflows a `u32`.
    pub fn check_sgl(&self, sgl: &[Sge], access: AccessFlags) -> Result<u32, AccessError> {
        let mut total = 0u32;
        for sge in sgl {
            self.resolve_local(sge, access)?;
            total = total.checked_add(sge.len).ok_or(AccessError::OutOfBounds)?;
        }
        Ok(total)
    }

    /// The slices of bytes `offset .. offset + len` of the SGL's byte
    /// stream, in order, none empty: the zero-copy payload of one packet of
    /// a posted, pinned work request. One pass checks only the entries the
    /// range touches, each once (key, bounds).
    ///
    /// # Errors
    ///
    /// As [`resolve_local`](Self::resolve_local) for a touched entry;
    /// [`AccessError::OutOfBounds`] if the range exceeds the SGL.
    pub fn sgl_pieces<'a>(
        &'a self,
        sgl: &[Sge],
        offset: u32,
        len: u32,
    ) -> Result<heapless::Vec<&'a [u8], MAX_SGE>, AccessError> {
        let mut pieces = heapless::Vec::new();
        if len == 0 {
            // No entry touched; the range must still lie inside the SGL.
            let total = crate::wr::total_len(sgl).ok_or(AccessError::OutOfBounds)?;
            return if offset <= total {
                Ok(pieces)
            } else {
                Err(AccessError::OutOfBounds)
            };
        }
        let (mut skip, mut remaining) = (offset, len);
        for sge in sgl {
            if remaining == 0 {
                break;
            }
            if skip >= sge.len {
                skip -= sge.len;
                continue;
            }
            let take = (sge.len - skip).min(remaining);
            let index = self.lkey_slot(sge.lkey)?;
            let slot = &self.slots[index];
            let start = sge
                .offset
                .checked_add(skip)
                .filter(|start| start.checked_add(take).is_some_and(|end| end <= slot.len))
                .ok_or(AccessError::OutOfBounds)?;
            let start = slot.start + start as usize;
            let bytes = self
                .storage
                .as_ref()
                .get(start..start + take as usize)
                .ok_or(AccessError::OutOfBounds)?;
            // At most one piece per entry, and sgl has at most MAX_SGE.
            pieces.push(bytes).map_err(|_| AccessError::OutOfBounds)?;
            skip = 0;
            remaining -= take;
        }
        if remaining > 0 {
            return Err(AccessError::OutOfBounds);
        }
        Ok(pieces)
    }

    /// Copies bytes `offset .. offset + dst.len()` of the SGL's byte stream
    /// into `dst`.
    ///
    /// # Errors
    ///
    /// As [`check_sgl`](Self::check_sgl) for every entry, and as
    /// [`sgl_pieces`](Self::sgl_pieces); nothing is copied on error.
    pub fn gather_into(&self, sgl: &[Sge], offset: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        let len = u32::try_from(dst.len()).map_err(|_| AccessError::OutOfBounds)?;
        let mut done = 0;
        self.check_sgl(sgl, AccessFlags::EMPTY)?;
        for piece in self.sgl_pieces(sgl, offset, len)? {
            dst[done..done + piece.len()].copy_from_slice(piece);
            done += piece.len();
        }
        Ok(())
    }

    /// Copies `src` to bytes `offset .. offset + src.len()` of the SGL's byte
    /// stream (receive placement, RDMA READ responses). Every region needs
    /// LOCAL_WRITE.
    ///
    /// # Errors
    ///
    /// As [`check_sgl`](Self::check_sgl) with LOCAL_WRITE;
    /// [`AccessError::OutOfBounds`] if the range exceeds the SGL. Nothing is
    /// copied on error.
    pub fn scatter_from(
        &mut self,
        sgl: &[Sge],
        offset: u32,
        src: &[u8],
    ) -> Result<(), AccessError> {
        let total = self.check_sgl(sgl, AccessFlags::LOCAL_WRITE)?;
        let len = u32::try_from(src.len()).map_err(|_| AccessError::OutOfBounds)?;
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(AccessError::OutOfBounds);
        }
        let mut skip = offset;
        let mut src = src;
        for sge in sgl {
            if src.is_empty() {
                break;
            }
            if skip >= sge.len {
                skip -= sge.len;
                continue;
            }
            let take = (sge.len - skip).min(src.len() as u32);
            let piece = Sge::new(sge.lkey, sge.offset + skip, take);
            let range = self.sge_range(&piece)?;
            let (head, rest) = src.split_at(take as usize);
            self.storage
                .as_mut()
                .get_mut(range)
                .ok_or(AccessError::OutOfBounds)?
                .copy_from_slice(head);
            src = rest;
            skip = 0;
        }
        Ok(())
    }

    /// Pool range of an already-checked SGE.
    fn sge_range(&self, sge: &Sge) -> Result<Range<usize>, AccessError> {
        let handle = self.resolve_local(sge, AccessFlags::EMPTY)?;
        self.range(handle, 0, handle.len())
    }

    /// Pool range of `len` bytes at `offset` within `handle`.
    fn range(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
    ) -> Result<Range<usize>, AccessError> {
        let id = handle.region();
        let slot = self
            .slots
            .get(id.index() as usize)
            .ok_or(AccessError::StaleHandle)?;
        if !slot.live || slot.generation != id.generation() {
            return Err(AccessError::StaleHandle);
        }
        let handle_end = u64::from(handle.offset()) + u64::from(handle.len());
        if handle_end > u64::from(slot.len) {
            return Err(AccessError::OutOfBounds);
        }
        let inner = handle.slice(offset, len).ok_or(AccessError::OutOfBounds)?;
        let start = slot.start + inner.offset() as usize;
        Ok(start..start + len as usize)
    }

    /// Slot and generation check for a handle that must cover its buffer.
    fn whole_buffer(&self, handle: MemoryHandle) -> Result<usize, RegError> {
        let id = handle.region();
        let index = id.index() as usize;
        match self.slots.get(index) {
            Some(slot) if slot.live && slot.generation == id.generation() => {
                if handle.offset() == 0 && handle.len() == slot.len {
                    Ok(index)
                } else {
                    Err(RegError::PartialBuffer)
                }
            }
            _ => Err(RegError::StaleHandle),
        }
    }

    /// Slot whose registration has exactly this lkey.
    fn lkey_slot(&self, lkey: Lkey) -> Result<usize, AccessError> {
        let index = lkey.index() as usize % self.regions;
        match self.slots.get(index) {
            Some(Slot {
                live: true,
                registration: Some(reg),
                ..
            }) if reg.lkey == lkey => Ok(index),
            _ => Err(AccessError::InvalidKey),
        }
    }

    /// Slot whose registration has exactly this rkey, currently valid.
    fn rkey_slot(&self, rkey: Rkey) -> Result<usize, AccessError> {
        let index = rkey.index() as usize % self.regions;
        match self.slots.get(index) {
            Some(Slot {
                live: true,
                registration: Some(reg),
                ..
            }) if reg.rkey == rkey && reg.remote_valid => Ok(index),
            _ => Err(AccessError::InvalidKey),
        }
    }

    fn lkey_registration(&self, lkey: Lkey) -> Result<&Registration, AccessError> {
        let index = self.lkey_slot(lkey)?;
        self.slots[index]
            .registration
            .as_ref()
            .ok_or(AccessError::InvalidKey)
    }

    fn registration_mut(&mut self, lkey: Lkey) -> Result<&mut Registration, AccessError> {
        let index = self.lkey_slot(lkey)?;
        self.slots[index]
            .registration
            .as_mut()
            .ok_or(AccessError::InvalidKey)
    }
}

impl<S: AsRef<[u8]> + AsMut<[u8]>, const N: usize> Memory for Arena<S, N> {
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError> {
        let range = self.range(handle, offset, len)?;
        self.storage
            .as_ref()
            .get(range)
            .map(f)
            .ok_or(AccessError::OutOfBounds)
    }

    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError> {
        let range = self.range(handle, offset, len)?;
        self.storage
            .as_mut()
            .get_mut(range)
            .map(f)
            .ok_or(AccessError::OutOfBounds)
    }
}

/// Start of an aligned `len`-byte block in `[from, to)`, if one fits.
fn fit(from: usize, to: usize, len: usize, align: usize) -> Option<usize> {
    let start = from.checked_add(align - 1)? & !(align - 1);
    (start.checked_add(len)? <= to).then_some(start)
}

/// A fresh key for slot `index` of a table of `regions`: the index part
/// is the slot plus a random multiple of `regions` (so `index part %
/// regions` finds the slot), the variant random in 1..=255 and not
/// `avoid`. Never 0.
fn new_key(regions: usize, index: usize, avoid: Option<u8>, keys: &mut impl KeySource) -> u32 {
    // 1 ≤ regions ≤ 2^20: at least 16 multiples fit in 24 bits.
    let regions = regions as u32;
    let multiples = (1u32 << 24) / regions;
    let high = keys.next_u32() % multiples;
    let key_index = index as u32 + high * regions;
    let mut variant = (keys.next_u32() % 255 + 1) as u8;
    if Some(variant) == avoid {
        variant = variant % 255 + 1;
    }
    Lkey::from_parts(key_index, variant).0
}

fn describe(
    slot: &Slot,
    id: RegionId,
    lkey: Lkey,
    rkey: Rkey,
    access: AccessFlags,
) -> MemoryRegion {
    MemoryRegion {
        handle: MemoryHandle::new(id, 0, slot.len),
        lkey,
        rkey,
        iova: slot.start as u64,
        access,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::Sgl;

    /// SplitMix64: a deterministic key source for tests.
    struct TestKeys(u64);

    impl KeySource for TestKeys {
        fn next_u32(&mut self) -> u32 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z >> 32) as u32
        }
    }

    const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

    fn arena() -> (Arena<std::vec::Vec<u8>, 8>, TestKeys) {
        (Arena::new(std::vec![0xa5; 4096]), TestKeys(1))
    }

    #[test]
    fn alloc_is_zeroed_aligned_first_fit() {
        let (mut arena, _) = arena();
        let a = arena.alloc(100, 1).unwrap();
        let b = arena.alloc(100, 64).unwrap();
        let mut bytes = [0xff; 100];
        arena.read(a, 0, &mut bytes).unwrap();
        assert_eq!(bytes, [0; 100]);
        let mut keys = TestKeys(7);
        let region_b = arena.register(b, RW, &mut keys).unwrap();
        assert_eq!(region_b.iova, 128);
        arena.free(a).unwrap();
        // First fit reuses the hole before `b`.
        let c = arena.alloc(64, 1).unwrap();
        let region_c = arena.register(c, AccessFlags::EMPTY, &mut keys).unwrap();
        assert_eq!(region_c.iova, 0);
        assert_eq!(arena.alloc(5000, 1), Err(AllocError::OutOfMemory));
        assert_eq!(arena.alloc(0, 1), Err(AllocError::ZeroLength));
        assert_eq!(arena.alloc(1, 3), Err(AllocError::BadAlignment));
        assert_eq!(arena.buffers(), 2);
    }

    #[test]
    fn table_full_and_stale_handles() {
        let (mut arena, _) = arena();
        let handles: std::vec::Vec<_> = (0..8).map(|_| arena.alloc(8, 8).unwrap()).collect();
        assert_eq!(arena.alloc(8, 8), Err(AllocError::TableFull));
        arena.free(handles[3]).unwrap();
        let again = arena.alloc(8, 8).unwrap();
        assert_eq!(again.region().index(), 3);
        assert_eq!(
            arena.read(handles[3], 0, &mut [0; 1]),
            Err(AccessError::StaleHandle)
        );
        assert_eq!(arena.free(handles[3]), Err(RegError::StaleHandle));
        assert_eq!(
            arena.free(again.slice(0, 4).unwrap()),
            Err(RegError::PartialBuffer)
        );
    }

    #[test]
    fn checked_access() {
        let (mut arena, _) = arena();
        let h = arena.alloc(16, 1).unwrap();
        arena.write(h, 4, b"abcd").unwrap();
        let sub = h.slice(4, 4).unwrap();
        assert_eq!(arena.with_slice(sub, 0, 4, |s| s == b"abcd"), Ok(true));
        assert_eq!(arena.write(h, 13, b"abcd"), Err(AccessError::OutOfBounds));
        assert_eq!(
            arena.read(sub, 1, &mut [0; 4]),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            arena.with_slice(h, u32::MAX, 2, |_| ()),
            Err(AccessError::OutOfBounds)
        );
        // A forged handle reaching past its buffer is refused.
        let forged = MemoryHandle::new(h.region(), 8, 16);
        assert_eq!(
            arena.read(forged, 0, &mut [0; 1]),
            Err(AccessError::OutOfBounds)
        );
        arena
            .with_slice_mut(h, 0, 2, |s| s.copy_from_slice(b"xy"))
            .unwrap();
        let mut out = [0; 8];
        arena.read(h, 0, &mut out).unwrap();
        assert_eq!(&out, b"xy\0\0abcd");
    }

    #[test]
    fn keys_registration_and_remote_checks() {
        let (mut arena, mut keys) = arena();
        let h = arena.alloc(256, 8).unwrap();
        let mr = arena.register(h, RW, &mut keys).unwrap();
        assert_ne!(mr.rkey.0, 0);
        assert_eq!(mr.lkey.index() as usize % 8, h.region().index() as usize);
        assert_eq!(
            arena.register(h, RW, &mut keys),
            Err(RegError::AlreadyRegistered)
        );

        let ok = arena
            .resolve_remote(mr.rkey, mr.remote_addr(16), 32, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert_eq!((ok.offset(), ok.len()), (16, 32));
        let r = AccessFlags::REMOTE_READ;
        assert_eq!(
            arena.resolve_remote(mr.rkey, mr.iova, 1, r),
            Err(AccessError::AccessDenied)
        );
        let w = AccessFlags::REMOTE_WRITE;
        assert_eq!(
            arena.resolve_remote(mr.rkey, mr.iova + 250, 7, w),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            arena.resolve_remote(mr.rkey, mr.iova.wrapping_sub(1), 1, w),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            arena.resolve_remote(Rkey(mr.rkey.0 ^ 1), mr.iova, 1, w),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(
            arena
                .resolve_remote(Rkey(mr.lkey.0), mr.iova, 1, w)
                .is_err(),
            mr.lkey.0 != mr.rkey.0
        );

        // Invalidate: remote access stops, local access does not.
        arena.invalidate(mr.rkey).unwrap();
        assert_eq!(
            arena.resolve_remote(mr.rkey, mr.iova, 1, w),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(arena.invalidate(mr.rkey), Err(RegError::InvalidKey));
        assert!(arena
            .resolve_local(&mr.sge(0, 256), AccessFlags::LOCAL_WRITE)
            .is_ok());

        // Re-key: a fresh key works, the old one never again.
        let fresh = arena.rekey(mr.lkey, &mut keys).unwrap();
        assert_ne!(fresh, mr.rkey);
        assert_ne!(fresh.variant(), mr.rkey.variant());
        assert!(arena.resolve_remote(fresh, mr.iova, 256, w).is_ok());
        assert_eq!(
            arena.resolve_remote(mr.rkey, mr.iova, 1, w),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(arena.region(mr.lkey).unwrap().rkey, fresh);

        arena.deregister(mr.lkey).unwrap();
        assert_eq!(
            arena.resolve_remote(fresh, mr.iova, 1, w),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(arena.rekey(mr.lkey, &mut keys), Err(RegError::InvalidKey));
        assert_eq!(
            arena.register(h, AccessFlags::REMOTE_WRITE, &mut keys),
            Err(RegError::InvalidAccess)
        );
    }

    #[test]
    fn many_rekeys_stay_fresh() {
        let (mut arena, mut keys) = arena();
        let h = arena.alloc(8, 1).unwrap();
        let mr = arena.register(h, RW, &mut keys).unwrap();
        let mut previous = mr.rkey;
        for _ in 0..1000 {
            let next = arena.rekey(mr.lkey, &mut keys).unwrap();
            assert_ne!(next.variant(), previous.variant());
            assert_ne!(next.0, 0);
            assert_eq!(next.index() as usize % 8, h.region().index() as usize);
            previous = next;
        }
    }

    #[test]
    fn pins_block_rekey_dereg_free_but_not_invalidate() {
        let (mut arena, mut keys) = arena();
        let h = arena.alloc(64, 1).unwrap();
        let mr = arena.register(h, RW, &mut keys).unwrap();
        let sgl = [mr.sge(0, 8), mr.sge(8, 8)];
        arena.pin_sgl(&sgl).unwrap();
        assert_eq!(arena.pin_count(mr.lkey), Ok(2));
        assert_eq!(arena.rekey(mr.lkey, &mut keys), Err(RegError::Busy));
        assert_eq!(arena.deregister(mr.lkey), Err(RegError::Busy));
        assert_eq!(arena.free(h), Err(RegError::Busy));
        arena.invalidate(mr.rkey).unwrap();
        arena.unpin_sgl(&sgl).unwrap();
        assert_eq!(arena.pin_count(mr.lkey), Ok(0));
        arena.rekey(mr.lkey, &mut keys).unwrap();
        // Pinning is all or nothing.
        let bad = [mr.sge(0, 8), Sge::new(Lkey(12345), 0, 1)];
        assert_eq!(arena.pin_sgl(&bad), Err(AccessError::InvalidKey));
        assert_eq!(arena.pin_count(mr.lkey), Ok(0));
        arena.unpin(mr.lkey).unwrap();
        assert_eq!(arena.pin_count(mr.lkey), Ok(0));
        arena.free(h).unwrap();
        assert_eq!(arena.pin(mr.lkey), Err(AccessError::InvalidKey));
    }

    #[test]
    fn gather_scatter_and_slices() {
        let (mut arena, mut keys) = arena();
        let a = arena.alloc(16, 1).unwrap();
        let b = arena.alloc(16, 1).unwrap();
        let ma = arena
            .register(a, AccessFlags::LOCAL_WRITE, &mut keys)
            .unwrap();
        let mb = arena.register(b, AccessFlags::EMPTY, &mut keys).unwrap();
        arena.write(a, 0, b"0123456789abcdef").unwrap();
        arena.write(b, 0, b"ghijklmnopqrstuv").unwrap();
        let sgl =
            Sgl::try_from_slice(&[ma.sge(10, 6), Sge::new(ma.lkey, 0, 0), mb.sge(0, 4)]).unwrap();
        assert_eq!(arena.check_sgl(sgl.as_slice(), AccessFlags::EMPTY), Ok(10));

        let mut out = [0; 6];
        arena.gather_into(sgl.as_slice(), 3, &mut out).unwrap();
        assert_eq!(&out, b"defghi");
        assert_eq!(
            arena.sgl_pieces(sgl.as_slice(), 2, 8).unwrap(),
            [&b"cdef"[..], &b"ghij"[..]]
        );
        assert!(arena.sgl_pieces(sgl.as_slice(), 10, 0).unwrap().is_empty());
        assert_eq!(
            arena.sgl_pieces(sgl.as_slice(), 11, 0),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            arena.gather_into(sgl.as_slice(), 5, &mut out).err(),
            Some(AccessError::OutOfBounds)
        );

        // Scatter needs LOCAL_WRITE on every region.
        assert_eq!(
            arena.scatter_from(sgl.as_slice(), 0, b"xx"),
            Err(AccessError::AccessDenied)
        );
        let writable = [ma.sge(14, 2), ma.sge(0, 2)];
        arena.scatter_from(&writable, 1, b"XYZ").unwrap();
        let mut all = [0; 16];
        arena.read(a, 0, &mut all).unwrap();
        assert_eq!(&all, b"YZ23456789abcdeX");
        assert_eq!(
            arena.scatter_from(&writable, 2, b"XYZ"),
            Err(AccessError::OutOfBounds)
        );
        let past_end = [ma.sge(15, 2)];
        assert_eq!(
            arena.check_sgl(&past_end, AccessFlags::EMPTY),
            Err(AccessError::OutOfBounds)
        );
    }
}

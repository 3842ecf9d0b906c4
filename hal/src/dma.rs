//! DMA memory: regions a device reads and writes by bus address.
//!
//! A driver needs the bus (physical) address of everything a device
//! touches: virtqueue rings, packet buffers, request headers, fw_cfg access
//! structures. They all come from one caller-provided [`DmaRegion`] (a slice
//! of the image's boot-time pool, identity-mapped so `phys == virt`; in host
//! tests a plain `Vec` with made-up bus addresses that a mock device
//! translates back). A [`DmaPool`] carves it into [`DmaSlice`]s once, at
//! driver construction; nothing is allocated or freed afterwards.
//!
//! # The safety contract
//!
//! * **Who owns the memory.** [`DmaRegion::new`] is `unsafe`: its caller
//!   promises that the region is valid, writable memory that nothing else
//!   reads or writes through Rust references for as long as any slice carved
//!   from it lives (and as long as a device that was given its addresses may
//!   still use them: drivers in the image live forever and are never
//!   dropped while the device runs). Each [`DmaSlice`] is then owned by
//!   exactly one driver; slices never overlap.
//! * **When the device may touch it.** Between the moment a driver makes a
//!   buffer available (publishes a descriptor that points at it) and the
//!   moment the device returns it (a used-ring entry), the device may read
//!   it, or write it if the descriptor is device-writable. Because the
//!   device is concurrent with the CPU, a [`DmaSlice`] never hands out a
//!   long-lived `&`/`&mut` to its bytes: every access is a bounds-checked
//!   volatile load or store of a scalar, or a copy in or out. The one
//!   exception, [`DmaSlice::slice`], is `unsafe` and requires the caller to
//!   know the device is not writing that range (a received frame whose
//!   buffer the device has returned).
//! * **Ordering.** The CPU's view and the device's are ordered with fences
//!   at the points the virtio spec requires (see `virtio::queue`); x86 DMA
//!   is cache-coherent, so no cache maintenance is needed.
//!
//! [`DmaWindow`] is only an address translation (virtual range -> bus
//! address), for memory a driver does not own but may point a device at:
//! the engine's registered memory for zero-copy transmit. Giving a window to
//! a driver is `unsafe` at that driver (see `virtio::net`).

use core::ptr::NonNull;

/// The largest alignment [`DmaPool::alloc`] supports: a page. Virtual and
/// bus addresses of a region agree modulo this, so aligning one aligns both.
pub const MAX_ALIGN: usize = 4096;

/// Why DMA memory could not be set up or allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DmaError {
    /// The region's pointer is null or its end overflows.
    BadRegion,
    /// Virtual and bus addresses differ modulo [`MAX_ALIGN`].
    Misaligned,
    /// The pool has fewer bytes left than asked for.
    Exhausted,
    /// An alignment that is zero, not a power of two or above [`MAX_ALIGN`].
    BadAlignment,
}

impl core::fmt::Display for DmaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::BadRegion => f.write_str("DMA region is null or overflows"),
            Self::Misaligned => f.write_str("DMA region's virtual and bus addresses disagree"),
            Self::Exhausted => f.write_str("DMA pool exhausted"),
            Self::BadAlignment => f.write_str("bad DMA alignment"),
        }
    }
}

impl core::error::Error for DmaError {}

/// A range of memory devices can reach: virtual pointer, bus address,
/// length. Owned: see the module docs for the contract.
#[derive(Debug)]
pub struct DmaRegion {
    virt: NonNull<u8>,
    phys: u64,
    len: usize,
}

impl DmaRegion {
    /// The region of `len` bytes at `virt`, which devices reach at bus
    /// address `phys`.
    ///
    /// # Errors
    ///
    /// [`DmaError::BadRegion`] if `virt` is null or either end overflows,
    /// [`DmaError::Misaligned`] if `virt` and `phys` differ modulo
    /// [`MAX_ALIGN`].
    ///
    /// # Safety
    ///
    /// `virt..virt + len` must be valid for reads and writes, reachable by
    /// devices at `phys..phys + len`, and used by nothing else (no Rust
    /// references, no other region) for as long as the region, any slice
    /// carved from it, or any device given one of its addresses lives.
    pub unsafe fn new(virt: *mut u8, phys: u64, len: usize) -> Result<Self, DmaError> {
        let virt = NonNull::new(virt).ok_or(DmaError::BadRegion)?;
        let len_u64 = u64::try_from(len).map_err(|_| DmaError::BadRegion)?;
        phys.checked_add(len_u64).ok_or(DmaError::BadRegion)?;
        (virt.as_ptr() as usize)
            .checked_add(len)
            .ok_or(DmaError::BadRegion)?;
        if (virt.as_ptr() as usize) % MAX_ALIGN != (phys % MAX_ALIGN as u64) as usize {
            return Err(DmaError::Misaligned);
        }
        Ok(Self { virt, phys, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bus address of the first byte.
    pub fn phys(&self) -> u64 {
        self.phys
    }
}

/// A bump allocator over a [`DmaRegion`]: hands out non-overlapping,
/// zeroed [`DmaSlice`]s and never frees (drivers allocate once).
#[derive(Debug)]
pub struct DmaPool {
    region: DmaRegion,
    next: usize,
}

impl DmaPool {
    /// A pool over all of `region`.
    pub fn new(region: DmaRegion) -> Self {
        Self { region, next: 0 }
    }

    /// Bytes not yet handed out (before alignment padding).
    pub fn remaining(&self) -> usize {
        self.region.len - self.next
    }

    /// A zeroed slice of `len` bytes whose bus (and virtual) address is a
    /// multiple of `align`.
    ///
    /// # Errors
    ///
    /// [`DmaError::BadAlignment`] or [`DmaError::Exhausted`].
    pub fn alloc(&mut self, len: usize, align: usize) -> Result<DmaSlice, DmaError> {
        if align == 0 || !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(DmaError::BadAlignment);
        }
        // Virtual and bus addresses agree modulo MAX_ALIGN (checked in
        // `DmaRegion::new`), so aligning the bus address aligns both.
        let misalignment = ((self.region.phys + self.next as u64) % align as u64) as usize;
        let start = self
            .next
            .checked_add((align - misalignment) % align)
            .ok_or(DmaError::Exhausted)?;
        let end = start.checked_add(len).ok_or(DmaError::Exhausted)?;
        if end > self.region.len {
            return Err(DmaError::Exhausted);
        }
        self.next = end;
        // SAFETY: `start <= end <= region.len`, so the offset stays inside
        // the region (or one past its end for an empty slice), which
        // `DmaRegion::new`'s caller promised is one allocation.
        let ptr = unsafe { self.region.virt.add(start) };
        let slice = DmaSlice {
            ptr,
            phys: self.region.phys + start as u64,
            len,
        };
        slice.fill(0, len, 0);
        Ok(slice)
    }

    /// A translation for the whole region, for drivers that accept
    /// addresses inside it (its slices are still owned by whoever
    /// allocated them).
    pub fn window(&self) -> DmaWindow {
        DmaWindow {
            virt: self.region.virt.as_ptr() as usize,
            phys: self.region.phys,
            len: self.region.len,
        }
    }
}

/// A piece of DMA memory owned by one driver: bus address plus checked,
/// volatile accessors. Offsets are relative to the slice; multi-byte
/// values are little-endian (virtio's byte order).
///
/// # Panics
///
/// Every accessor panics if the range it touches is not inside the slice:
/// drivers compute offsets from their own layout and validate anything a
/// device supplied before using it, so an out-of-range offset is a driver
/// bug.
#[derive(Debug)]
pub struct DmaSlice {
    ptr: NonNull<u8>,
    phys: u64,
    len: usize,
}

// SAFETY: a `DmaSlice` is the only owner of its bytes (the `DmaRegion::new`
// contract plus non-overlapping allocation), like a `Box<[u8]>`; moving it
// to another thread moves that ownership.
unsafe impl Send for DmaSlice {}

impl DmaSlice {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bus address of the first byte.
    pub fn phys(&self) -> u64 {
        self.phys
    }

    /// The bus address of byte `offset` (`offset == len()` allowed).
    ///
    /// # Panics
    ///
    /// If `offset > len()`.
    pub fn phys_at(&self, offset: usize) -> u64 {
        assert!(offset <= self.len, "DMA offset out of range");
        self.phys + offset as u64
    }

    /// A translation for this slice.
    pub fn window(&self) -> DmaWindow {
        DmaWindow {
            virt: self.ptr.as_ptr() as usize,
            phys: self.phys,
            len: self.len,
        }
    }

    /// Pointer to `offset`, after checking `offset + size <= len` and the
    /// alignment of `align` (a power of two).
    fn at(&self, offset: usize, size: usize, align: usize) -> *mut u8 {
        let end = offset.checked_add(size);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "DMA access out of range"
        );
        // SAFETY: `offset + size <= len` (checked above), so the pointer
        // stays inside this slice's allocation.
        let ptr = unsafe { self.ptr.as_ptr().add(offset) };
        assert!((ptr as usize) % align == 0, "misaligned DMA access");
        ptr
    }

    /// Reads the byte at `offset`.
    pub fn read_u8(&self, offset: usize) -> u8 {
        let ptr = self.at(offset, 1, 1);
        // SAFETY: `at` checked the range; the slice owns the memory (module
        // contract) and a volatile read tolerates a concurrent device write.
        unsafe { ptr.read_volatile() }
    }

    /// Writes the byte at `offset`.
    pub fn write_u8(&self, offset: usize, value: u8) {
        let ptr = self.at(offset, 1, 1);
        // SAFETY: as in `read_u8`; no Rust reference to these bytes exists.
        unsafe { ptr.write_volatile(value) }
    }

    /// Reads the little-endian `u16` at `offset` (2-aligned).
    pub fn read_u16(&self, offset: usize) -> u16 {
        let ptr = self.at(offset, 2, 2).cast::<u16>();
        // SAFETY: `at` checked range and alignment; owned memory (module
        // contract); volatile because the device writes concurrently.
        u16::from_le(unsafe { ptr.read_volatile() })
    }

    /// Writes the little-endian `u16` at `offset` (2-aligned).
    pub fn write_u16(&self, offset: usize, value: u16) {
        let ptr = self.at(offset, 2, 2).cast::<u16>();
        // SAFETY: as in `read_u16`.
        unsafe { ptr.write_volatile(value.to_le()) }
    }

    /// Reads the little-endian `u32` at `offset` (4-aligned).
    pub fn read_u32(&self, offset: usize) -> u32 {
        let ptr = self.at(offset, 4, 4).cast::<u32>();
        // SAFETY: as in `read_u16`.
        u32::from_le(unsafe { ptr.read_volatile() })
    }

    /// Writes the little-endian `u32` at `offset` (4-aligned).
    pub fn write_u32(&self, offset: usize, value: u32) {
        let ptr = self.at(offset, 4, 4).cast::<u32>();
        // SAFETY: as in `read_u16`.
        unsafe { ptr.write_volatile(value.to_le()) }
    }

    /// Reads the little-endian `u64` at `offset` (8-aligned).
    pub fn read_u64(&self, offset: usize) -> u64 {
        let ptr = self.at(offset, 8, 8).cast::<u64>();
        // SAFETY: as in `read_u16`.
        u64::from_le(unsafe { ptr.read_volatile() })
    }

    /// Writes the little-endian `u64` at `offset` (8-aligned).
    pub fn write_u64(&self, offset: usize, value: u64) {
        let ptr = self.at(offset, 8, 8).cast::<u64>();
        // SAFETY: as in `read_u16`.
        unsafe { ptr.write_volatile(value.to_le()) }
    }

    /// Copies `bytes` to `offset`.
    pub fn write_bytes(&self, offset: usize, bytes: &[u8]) {
        let ptr = self.at(offset, bytes.len(), 1);
        // SAFETY: `at` checked that `bytes.len()` bytes from `ptr` are inside
        // the slice; `bytes` is a Rust borrow, so it cannot overlap memory
        // the slice owns exclusively.
        unsafe { bytes.as_ptr().copy_to_nonoverlapping(ptr, bytes.len()) }
    }

    /// Copies `target.len()` bytes from `offset` into `target`.
    pub fn read_bytes(&self, offset: usize, target: &mut [u8]) {
        let ptr = self.at(offset, target.len(), 1);
        // SAFETY: as in `write_bytes`, in the other direction.
        unsafe { ptr.copy_to_nonoverlapping(target.as_mut_ptr(), target.len()) }
    }

    /// Sets `len` bytes from `offset` to `value`.
    pub fn fill(&self, offset: usize, len: usize, value: u8) {
        let ptr = self.at(offset, len, 1);
        // SAFETY: `at` checked the range; owned memory, no references.
        unsafe { ptr.write_bytes(value, len) }
    }

    /// Borrows `len` bytes from `offset`.
    ///
    /// # Safety
    ///
    /// Nothing may write the range while the borrow lives: the device
    /// (it was never made available to it as writable, or the device has
    /// returned it through the used ring and it was not made available
    /// again) and the owner (no `write_*`/`fill` on the range meanwhile).
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        let ptr = self.at(offset, len, 1);
        // SAFETY: `at` checked the range; the caller promised that neither
        // the device nor the owner writes it while the borrow lives.
        unsafe { core::slice::from_raw_parts(ptr, len) }
    }
}

/// A translation from a virtual range to bus addresses, for memory a device
/// may be pointed at (it owns nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DmaWindow {
    /// The first virtual address.
    pub virt: usize,
    /// The bus address of `virt`.
    pub phys: u64,
    /// Length in bytes.
    pub len: usize,
}

impl DmaWindow {
    /// The bus address of `bytes` if it lies entirely inside the window.
    pub fn translate(&self, bytes: &[u8]) -> Option<u64> {
        let start = (bytes.as_ptr() as usize).checked_sub(self.virt)?;
        let end = start.checked_add(bytes.len())?;
        (end <= self.len).then(|| self.phys + start as u64)
    }
}

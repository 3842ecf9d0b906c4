//! Physical memory: boot-data reads, the global allocator, the pool.
//!
//! The entry code identity-maps 0–4 GiB, so a physical address below
//! [`IDENTITY_LIMIT`] is also a valid virtual address. [`Identity`] reads
//! the loader's data through that map for `target_image::boot::pvh`.
//! [`HEAP`] is the global allocator: a `FreeRanges` (host-tested in
//! `target_image::boot::memory`) over the heap ranges carved at boot,
//! behind a spin lock; blocks are rounded to [`GRANULE`] bytes.
//!
//! `alloc_zeroed` (every `vec![0; n]`: RAM volumes, registered arenas)
//! skips the memset for memory that was never handed out and was zero when
//! it joined the heap ([`Heap::add_zeroed`]): the heap keeps a second list
//! of such "pristine" ranges and takes every allocation out of it. Under
//! TCG zeroing ~1 GiB costs most of a second of boot; see `main` for the
//! assumption that makes fresh RAM zero.

#![allow(unsafe_code)]

use core::alloc::{GlobalAlloc, Layout};

use target_image::boot::memory::FreeRanges;
use target_image::boot::pvh::{OutOfRange, PhysRead};

use spin::Mutex;

/// End of the identity map built by the entry code.
pub const IDENTITY_LIMIT: u64 = 4 << 30;
/// Smallest block and alignment the heap hands out.
pub const GRANULE: u64 = 16;
/// Free ranges the heap can track (fragmentation beyond this leaks).
pub const HEAP_RANGES: usize = 512;

/// Guest-physical memory read through the identity map.
pub struct Identity;

impl PhysRead for Identity {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), OutOfRange> {
        let error = OutOfRange {
            address,
            len: buffer.len(),
        };
        let end = address.checked_add(buffer.len() as u64).ok_or(error)?;
        if address == 0 || end > IDENTITY_LIMIT {
            return Err(error);
        }
        for (i, byte) in buffer.iter_mut().enumerate() {
            let pointer = (address + i as u64) as *const u8;
            // SAFETY: `[address, end)` is inside the identity map (checked
            // above), so the pointer is mapped; the loader's data there is
            // plain RAM, read bytewise and volatile (no reference is made).
            *byte = unsafe { pointer.read_volatile() };
        }
        Ok(())
    }
}

/// Pristine ranges the heap can track (more splits drop pristine memory,
/// which then gets zeroed like any other: safe, only slower).
pub const PRISTINE_RANGES: usize = 64;

/// The heap's bookkeeping.
struct State {
    /// Free memory.
    free: FreeRanges<HEAP_RANGES>,
    /// Free memory never handed out and known to be zero (a subset of `free`).
    pristine: FreeRanges<PRISTINE_RANGES>,
}

/// The global allocator: first fit over the heap's free ranges.
pub struct Heap {
    state: Mutex<State>,
}

impl Heap {
    /// Gives `[start, start + len)` to the heap.
    ///
    /// # Safety
    ///
    /// The range is identity-mapped RAM that nothing else uses, now or
    /// later (it was carved from the boot memory map).
    pub unsafe fn add(&self, start: u64, len: u64) {
        self.state.lock().free.free(start, len);
    }

    /// Gives `[start, start + len)` to the heap as zero-filled memory:
    /// `alloc_zeroed` does not clear it again.
    ///
    /// # Safety
    ///
    /// As [`add`](Self::add), and every byte of the range is zero.
    pub unsafe fn add_zeroed(&self, start: u64, len: u64) {
        let mut state = self.state.lock();
        state.free.free(start, len);
        state.pristine.free(start, len);
    }

    /// Free bytes, free ranges and leaked bytes.
    pub fn stats(&self) -> (u64, usize, u64) {
        let state = self.state.lock();
        (
            state.free.total(),
            state.free.ranges().len(),
            state.free.leaked(),
        )
    }

    /// Bytes still pristine (never handed out, zero).
    pub fn pristine(&self) -> u64 {
        self.state.lock().pristine.total()
    }

    /// Carves a block for `layout`; with it, whether the block was
    /// pristine (all zero). Null when the heap has no room.
    fn carve(&self, layout: Layout) -> (*mut u8, bool) {
        let (size, align) = block(layout);
        let mut state = self.state.lock();
        match state.free.carve(size, align) {
            Ok(start) => {
                let end = start + size;
                let pristine = state.pristine.contains(start, end);
                // No longer pristine, whatever the caller writes (a split
                // the list cannot hold drops the rest: safe, see above).
                state.pristine.remove(start, end, 1);
                (start as *mut u8, pristine)
            }
            Err(_) => (core::ptr::null_mut(), false),
        }
    }
}

fn block(layout: Layout) -> (u64, u64) {
    let size = (layout.size() as u64).max(1).div_ceil(GRANULE) * GRANULE;
    (size, (layout.align() as u64).max(GRANULE))
}

// SAFETY: `alloc` returns ranges carved from memory given with `add`
// (owned, identity-mapped RAM), aligned as asked and never handed out twice
// until `dealloc` returns them; the spin lock serialises the bookkeeping.
// `alloc_zeroed` skips clearing only blocks wholly inside the pristine
// list, which holds memory vouched zero by `add_zeroed` minus everything
// ever carved (freed blocks never return to it).
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.carve(layout).0
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let (pointer, pristine) = self.carve(layout);
        if !pointer.is_null() && !pristine {
            // SAFETY: `pointer` is a fresh block of at least `layout.size()`
            // bytes that this call owns (carved above).
            unsafe { pointer.write_bytes(0, layout.size()) };
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        let (size, _) = block(layout);
        self.state.lock().free.free(pointer as u64, size);
    }
}

/// Counts the non-zero bytes of `[start, start + len)` (the `zero-check`
/// boot word: evidence for the fresh-RAM-is-zero assumption) and returns
/// the count and the first and last such words' addresses.
///
/// # Safety
///
/// The range is identity-mapped RAM that nothing writes meanwhile.
pub unsafe fn nonzero_bytes(start: u64, len: u64) -> (u64, Option<(u64, u64)>) {
    let mut count = 0;
    let mut found: Option<(u64, u64)> = None;
    let words = len / 8;
    for i in 0..words {
        let address = start + i * 8;
        // SAFETY: inside the range the caller vouches for; 8-aligned
        // (heap ranges are page-aligned); read volatile, no reference made.
        let word = unsafe { (address as *const u64).read_volatile() };
        if word != 0 {
            count += u64::from(word.to_le_bytes().iter().filter(|b| **b != 0).count() as u8);
            found = Some((found.map_or(address, |(first, _)| first), address));
        }
    }
    (count, found)
}

/// The image's heap (empty until `main` adds the boot heap).
#[global_allocator]
pub static HEAP: Heap = Heap {
    state: Mutex::new(State {
        free: FreeRanges::new(),
        pristine: FreeRanges::new(),
    }),
};

/// Makes `[start, start + len)` of device memory reachable at the same
/// virtual address: the boot identity map below 4 GiB, new uncached
/// mappings above it ([`crate::paging::map_mmio`]).
///
/// # Errors
///
/// Why the range cannot be mapped.
pub fn map_mmio(start: u64, len: u64) -> Result<(), crate::paging::MapError> {
    crate::paging::map_mmio(start, len)
}

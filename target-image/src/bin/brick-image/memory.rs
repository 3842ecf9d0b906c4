//! Physical memory: boot-data reads, the global allocator, the pool.
//!
//! The entry code identity-maps 0–4 GiB, so a physical address below
//! [`IDENTITY_LIMIT`] is also a valid virtual address. [`Identity`] reads
//! the loader's data through that map for `target_image::boot::pvh`.
//! [`HEAP`] is the global allocator: a `FreeRanges` (host-tested in
//! `target_image::boot::memory`) over the heap ranges carved at boot,
//! behind a spin lock; blocks are rounded to [`GRANULE`] bytes.

#![allow(unsafe_code)]

use core::alloc::{GlobalAlloc, Layout};

use target_image::boot::memory::FreeRanges;
use target_image::boot::pvh::{OutOfRange, PhysRead};

use crate::sync::SpinLock;

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

/// The global allocator: first fit over the heap's free ranges.
pub struct Heap {
    ranges: SpinLock<FreeRanges<HEAP_RANGES>>,
}

impl Heap {
    /// Gives `[start, start + len)` to the heap.
    ///
    /// # Safety
    ///
    /// The range is identity-mapped RAM that nothing else uses, now or
    /// later (it was carved from the boot memory map).
    pub unsafe fn add(&self, start: u64, len: u64) {
        self.ranges.lock().free(start, len);
    }

    /// Free bytes and free ranges.
    pub fn stats(&self) -> (u64, usize, u64) {
        let ranges = self.ranges.lock();
        (ranges.total(), ranges.ranges().len(), ranges.leaked())
    }
}

fn block(layout: Layout) -> (u64, u64) {
    let size = (layout.size() as u64).max(1).div_ceil(GRANULE) * GRANULE;
    (size, (layout.align() as u64).max(GRANULE))
}

// SAFETY: `alloc` returns ranges carved from memory given with `add`
// (owned, identity-mapped RAM), aligned as asked and never handed out twice
// until `dealloc` returns them; the spin lock serialises the bookkeeping.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let (size, align) = block(layout);
        match self.ranges.lock().carve(size, align) {
            Ok(start) => start as *mut u8,
            Err(_) => core::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        let (size, _) = block(layout);
        self.ranges.lock().free(pointer as u64, size);
    }
}

/// The image's heap (empty until `main` adds the boot heap).
#[global_allocator]
pub static HEAP: Heap = Heap {
    ranges: SpinLock::new(FreeRanges::new()),
};

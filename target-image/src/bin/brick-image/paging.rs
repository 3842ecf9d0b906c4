//! Page tables: the boot identity map, extended for device memory above
//! 4 GiB (the `x86_64` crate's `OffsetPageTable` over the live PML4).
//!
//! The entry code identity-maps 0-4 GiB with 2 MiB pages (`entry.rs`).
//! Under UEFI, the firmware places 64-bit BARs far above that (OVMF puts
//! an NVMe controller's BAR0 at 0xe0_0000_0000), so [`map_mmio`] maps such
//! ranges on demand, identity (virtual == physical), with 2 MiB pages that
//! are uncached (PCD | PWT: device registers must not be cached on real
//! hardware). The intermediate tables come from [`TABLES`], a pool of
//! zeroed page tables in `.bss` (identity-mapped, so their addresses are
//! physical); nothing else ever references that memory, and every access
//! to it goes through the mapper, under one lock.

#![allow(unsafe_code)]

use core::cell::UnsafeCell;

use x86_64::registers::control::Cr3;
use x86_64::structures::paging::mapper::MapToError;
use x86_64::structures::paging::{
    FrameAllocator, Mapper, OffsetPageTable, PageTable, PageTableFlags, PhysFrame, Size2MiB,
    Size4KiB,
};
use x86_64::{PhysAddr, VirtAddr};

use crate::memory::IDENTITY_LIMIT;

/// Page tables the pool holds (each maps 1 GiB at the PD level, 512 GiB
/// at the PDPT level: a few BAR windows need a handful).
const POOL_TABLES: usize = 16;

/// The pool's memory, handed out one table at a time.
#[repr(C, align(4096))]
struct TablePool(UnsafeCell<[PageTable; POOL_TABLES]>);

// SAFETY: the tables are only reached through `PoolAllocator::allocate_frame`
// (under the `MAPPER` lock) and then through the mapper, which takes the
// same lock: one CPU, one user at a time.
unsafe impl Sync for TablePool {}

static TABLES: TablePool = TablePool(UnsafeCell::new([const { PageTable::new() }; POOL_TABLES]));

/// Tables handed out so far.
static MAPPER: spin::Mutex<usize> = spin::Mutex::new(0);

/// Frames from [`TABLES`], in order.
struct PoolAllocator<'a> {
    next: &'a mut usize,
}

// SAFETY: each frame is a distinct, 4 KiB-aligned, zeroed page table of the
// pool (`.bss`, identity-mapped: its address is physical), handed out once.
unsafe impl FrameAllocator<Size4KiB> for PoolAllocator<'_> {
    fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
        if *self.next >= POOL_TABLES {
            return None;
        }
        let base = TABLES.0.get() as u64;
        let frame = PhysFrame::from_start_address(PhysAddr::new(base + 4096 * *self.next as u64));
        *self.next += 1;
        frame.ok()
    }
}

/// Why a range cannot be mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// The range overflows or lies beyond 48-bit physical addresses.
    OutOfRange,
    /// The table pool is used up.
    NoTables,
    /// Part of the range is mapped to something else already.
    Conflict,
}

impl core::fmt::Display for MapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::OutOfRange => "the range is beyond the 48-bit address space",
            Self::NoTables => "no page tables left in the pool",
            Self::Conflict => "part of the range is mapped elsewhere",
        })
    }
}

/// Identity-maps `[start, start + len)` of device memory, uncached, with
/// 2 MiB pages; ranges below 4 GiB are in the boot identity map already.
///
/// # Errors
///
/// [`MapError`].
pub fn map_mmio(start: u64, len: u64) -> Result<(), MapError> {
    let end = start.checked_add(len).ok_or(MapError::OutOfRange)?;
    if end <= IDENTITY_LIMIT {
        return Ok(());
    }
    if end > 1 << 47 {
        return Err(MapError::OutOfRange);
    }
    let mut next = MAPPER.lock();
    let (frame, _) = Cr3::read();
    let pml4 = frame.start_address().as_u64() as *mut PageTable;
    // SAFETY: CR3 holds the entry code's PML4 (`.bss`, identity-mapped:
    // its physical address is a valid pointer), which nothing else
    // references; the lock makes this the only reference while it lives.
    let pml4 = unsafe { &mut *pml4 };
    // SAFETY: every table the PML4 leads to is identity-mapped (the boot
    // tables in `.bss`, the pool's), so physical offset 0 is right.
    let mut mapper = unsafe { OffsetPageTable::new(pml4, VirtAddr::new(0)) };
    let mut allocator = PoolAllocator { next: &mut next };
    let flags = PageTableFlags::PRESENT
        | PageTableFlags::WRITABLE
        | PageTableFlags::NO_CACHE
        | PageTableFlags::WRITE_THROUGH;
    let mut page = start & !((2 << 20) - 1);
    while page < end {
        let frame = PhysFrame::<Size2MiB>::from_start_address(PhysAddr::new(page))
            .map_err(|_| MapError::OutOfRange)?;
        // SAFETY: the frame is device memory (a BAR the firmware assigned,
        // above all RAM the image uses) mapped at its own address; no Rust
        // object lives there, so no reference can alias it.
        match unsafe { mapper.identity_map(frame, flags, &mut allocator) } {
            Ok(flush) => flush.flush(),
            Err(MapToError::PageAlreadyMapped(existing)) if existing == frame => {}
            Err(MapToError::FrameAllocationFailed) => return Err(MapError::NoTables),
            Err(_) => return Err(MapError::Conflict),
        }
        page += 2 << 20;
    }
    Ok(())
}

//! The controller's registers as the driver sees them: `NvmeRegisters`, and
//! the memory-mapped implementation `MmioRegisters`.
//!
//! NVMe 1.4 §3.1: the controller registers live in BAR0 (64-bit memory):
//! capabilities, version, interrupt masks, configuration, status, admin
//! queue attributes and addresses, then the doorbells from 0x1000 on, one
//! submission-queue tail and one completion-queue head per queue, `4 <<
//! CAP.DSTRD` bytes apart. The trait is the few 32-bit accesses the driver
//! makes, so a host-side mock controller can stand behind it. Accesses take
//! `&self` and the type is `Clone`: every queue pair the controller creates
//! keeps its own handle for its two doorbells (distinct registers, so the
//! handles never contend).
//!
//! [`MmioRegisters`] is the one place with MMIO: volatile 32-bit loads and
//! stores at offsets checked against the BAR's length. Its constructor is
//! `unsafe` (the caller vouches for the address); every later access is
//! safe.

use core::ptr::NonNull;

/// Register offsets (NVMe 1.4 §3.1, Figure 78).
pub mod offset {
    /// Controller capabilities (64-bit).
    pub const CAP: usize = 0x00;
    /// Version.
    pub const VS: usize = 0x08;
    /// Interrupt mask set.
    pub const INTMS: usize = 0x0c;
    /// Controller configuration.
    pub const CC: usize = 0x14;
    /// Controller status.
    pub const CSTS: usize = 0x1c;
    /// Admin queue attributes.
    pub const AQA: usize = 0x24;
    /// Admin submission queue base address (64-bit).
    pub const ASQ: usize = 0x28;
    /// Admin completion queue base address (64-bit).
    pub const ACQ: usize = 0x30;
    /// The first doorbell (admin submission queue tail).
    pub const DOORBELLS: usize = 0x1000;
}

/// The registers of an NVMe controller, as the driver uses them.
pub trait NvmeRegisters: Clone {
    /// The 32-bit register at `offset` (4-aligned).
    fn read32(&self, offset: usize) -> u32;
    /// Writes the 32-bit register at `offset` (4-aligned).
    fn write32(&self, offset: usize, value: u32);

    /// The 64-bit register at `offset`, read as two 32-bit halves, low
    /// first (§3.1: the host may access 64-bit registers that way).
    fn read64(&self, offset: usize) -> u64 {
        let low = self.read32(offset);
        let high = self.read32(offset + 4);
        u64::from(low) | (u64::from(high) << 32)
    }

    /// Writes the 64-bit register at `offset` as two 32-bit halves, low
    /// first.
    fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

/// NVMe registers by volatile MMIO at a BAR's (identity-mapped) address.
#[derive(Clone, Copy, Debug)]
pub struct MmioRegisters {
    base: NonNull<u32>,
    len: usize,
}

impl MmioRegisters {
    /// The registers at virtual address `base`, `len` bytes of BAR0.
    /// `None` if `base` is null or not 4-aligned, or `len` is shorter than
    /// the admin doorbells (0x1008 bytes).
    ///
    /// # Safety
    ///
    /// `base..base + len` must be the controller's BAR0, mapped (uncached
    /// on real hardware) for as long as any copy of the value lives, and
    /// only NVMe drivers of this module may touch it.
    pub unsafe fn new(base: *mut u8, len: usize) -> Option<Self> {
        let base = NonNull::new(base.cast::<u32>())?;
        (base.as_ptr() as usize % 4 == 0 && len >= offset::DOORBELLS + 8)
            .then_some(Self { base, len })
    }

    fn at(&self, offset: usize) -> *mut u32 {
        assert!(
            offset % 4 == 0 && offset.checked_add(4).is_some_and(|end| end <= self.len),
            "NVMe register offset {offset:#x} outside BAR0 ({:#x} bytes)",
            self.len
        );
        // Inside BAR0 (checked above).
        self.base.as_ptr().wrapping_add(offset / 4)
    }
}

impl NvmeRegisters for MmioRegisters {
    fn read32(&self, offset: usize) -> u32 {
        let register = self.at(offset);
        // SAFETY: `at` checked the offset against BAR0, which `new`'s
        // caller vouched is mapped device memory; volatile, no reference.
        unsafe { register.read_volatile() }
    }

    fn write32(&self, offset: usize, value: u32) {
        let register = self.at(offset);
        // SAFETY: as in `read32`.
        unsafe { register.write_volatile(value) }
    }
}

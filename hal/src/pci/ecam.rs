//! PCI Express enhanced configuration access (ECAM): each function's 4 KiB
//! of configuration space at `base + (bus - start) << 20 | device << 15 |
//! function << 12` (PCI Express Base 4.0 §7.2.2), the window ACPI's MCFG
//! table names for a segment and bus range.

use core::ptr::NonNull;

use super::{Address, ConfigSpace};

/// One ECAM window: segment 0, buses `start_bus..=end_bus`.
#[derive(Clone, Copy, Debug)]
pub struct Ecam {
    base: NonNull<u32>,
    start_bus: u8,
    end_bus: u8,
}

impl Ecam {
    /// The window at virtual address `base` (identity-mapped: the MCFG
    /// entry's base address) for buses `start_bus..=end_bus`. `None` if
    /// `base` is null or not 1 MiB-aligned, or the range is empty.
    ///
    /// # Safety
    ///
    /// `base` must map the whole window (`(end_bus - start_bus + 1) << 20`
    /// bytes) of configuration space, uncached, for as long as the value
    /// lives, and nothing else may drive configuration space meanwhile.
    pub unsafe fn new(base: *mut u8, start_bus: u8, end_bus: u8) -> Option<Self> {
        let base = NonNull::new(base.cast::<u32>())?;
        (base.as_ptr() as usize % (1 << 20) == 0 && start_bus <= end_bus).then_some(Self {
            base,
            start_bus,
            end_bus,
        })
    }

    /// Bytes of the window.
    pub fn len(&self) -> u64 {
        (u64::from(self.end_bus - self.start_bus) + 1) << 20
    }

    /// Whether the window is empty (never: `new` refuses that).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The register's pointer, if `address` is in the window and `offset`
    /// in its 4 KiB.
    fn at(&self, address: Address, offset: u16) -> Option<*mut u32> {
        if address.bus < self.start_bus
            || address.bus > self.end_bus
            || address.device > 31
            || address.function > 7
            || offset >= 4096
        {
            return None;
        }
        let byte = (usize::from(address.bus - self.start_bus) << 20)
            | (usize::from(address.device) << 15)
            | (usize::from(address.function) << 12)
            | usize::from(offset & !3);
        // Inside the window (every part bounded above).
        Some(self.base.as_ptr().wrapping_add(byte / 4))
    }
}

impl ConfigSpace for Ecam {
    fn read32(&self, address: Address, offset: u16) -> u32 {
        match self.at(address, offset) {
            // SAFETY: inside the window `new`'s caller vouched is mapped
            // configuration space; volatile, no reference made.
            Some(register) => unsafe { register.read_volatile() },
            None => u32::MAX,
        }
    }

    fn write32(&self, address: Address, offset: u16, value: u32) {
        if let Some(register) = self.at(address, offset) {
            // SAFETY: as in `read32`; what the write does to the device is
            // the caller's claim on it (module docs).
            unsafe { register.write_volatile(value) }
        }
    }

    fn space_len(&self) -> u16 {
        4096
    }
}

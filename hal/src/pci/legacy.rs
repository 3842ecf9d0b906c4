//! PCI configuration mechanism #1: the address port 0xcf8 and the data
//! port 0xcfc (the `x86_64` crate's [`Port`]).

use x86_64::instructions::port::Port;

use super::{Address, ConfigSpace};

const CONFIG_ADDRESS: u16 = 0xcf8;
const CONFIG_DATA: u16 = 0xcfc;

/// Configuration space through ports 0xcf8/0xcfc (256 bytes per function,
/// segment 0).
#[derive(Debug)]
pub struct LegacyPorts(());

impl LegacyPorts {
    /// The mechanism.
    ///
    /// # Safety
    ///
    /// Ring 0 on a PC-compatible machine whose ports 0xcf8-0xcff are the
    /// PCI configuration mechanism, used through this value only, on one
    /// CPU (the address/data pair is not atomic).
    pub unsafe fn new() -> Self {
        LegacyPorts(())
    }

    fn select(&self, address: Address, offset: u16) {
        let selector = 0x8000_0000
            | (u32::from(address.bus) << 16)
            | (u32::from(address.device & 0x1f) << 11)
            | (u32::from(address.function & 0x7) << 8)
            | u32::from(offset & 0xfc);
        // SAFETY: `new`'s caller gave this value the mechanism; selecting a
        // register has no effect of its own.
        unsafe { Port::<u32>::new(CONFIG_ADDRESS).write(selector) };
    }
}

impl ConfigSpace for LegacyPorts {
    fn read32(&self, address: Address, offset: u16) -> u32 {
        if offset >= 256 {
            return u32::MAX;
        }
        self.select(address, offset);
        // SAFETY: as in `select`; a config read has no side effect (the
        // status register's write-1-to-clear bits are untouched by reads).
        unsafe { Port::<u32>::new(CONFIG_DATA).read() }
    }

    fn write32(&self, address: Address, offset: u16, value: u32) {
        if offset >= 256 {
            return;
        }
        self.select(address, offset);
        // SAFETY: as in `select`; what the write does to the device is the
        // caller's claim on it (module docs).
        unsafe { Port::<u32>::new(CONFIG_DATA).write(value) };
    }
}

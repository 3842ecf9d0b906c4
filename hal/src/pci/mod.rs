//! PCI configuration space: the walk, BARs, capabilities and command bits,
//! over either access mechanism.
//!
//! [`ConfigSpace`] is one function's 4-byte configuration registers by
//! address and offset. Two implementations: [`Ecam`] (PCI Express enhanced
//! configuration access, memory-mapped, from ACPI's MCFG table: PCI
//! Firmware Specification 3.2 §4.1.2) and, on x86, [`LegacyPorts`]
//! (configuration mechanism #1, ports 0xcf8/0xcfc), the fallback where
//! there is no MCFG (QEMU's `pc` machine). Everything else here is plain
//! logic over the trait and is tested on the host against a fake
//! configuration space:
//!
//! * [`enumerate`] walks bus 0 and every bus behind a PCI-to-PCI bridge
//!   the firmware numbered (a bridge's secondary bus is above its own, so
//!   one ascending pass finds them all), each device and function, and
//!   reports each function's ids, class and the BARs the firmware assigned
//!   (decoded, not sized);
//! * [`bar_size`] sizes a memory BAR (with decoding off while it does);
//! * [`enable_memory_and_bus_master`], [`legacy_irq`] and
//!   [`virtio_capabilities`] are what the drivers need when they claim a
//!   function.
//!
//! The implementations' constructors are `unsafe` (the caller vouches that
//! it owns the mechanism); reads and writes through the trait are then
//! safe, and what a write does to a device is the caller's business: only
//! a function the caller claimed is written.

#[allow(unsafe_code)]
pub mod ecam;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub mod legacy;

use core::fmt;

pub use ecam::Ecam;
#[cfg(target_arch = "x86_64")]
pub use legacy::LegacyPorts;

/// A PCI function's address (segment 0).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Address {
    /// Bus 0-255.
    pub bus: u8,
    /// Device 0-31.
    pub device: u8,
    /// Function 0-7.
    pub function: u8,
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x}:{:02x}.{}", self.bus, self.device, self.function)
    }
}

/// Configuration registers, 32 bits at a time.
pub trait ConfigSpace {
    /// The dword at `offset` (rounded down to 4) of `address`'s space; all
    /// ones where no function answers.
    fn read32(&self, address: Address, offset: u16) -> u32;
    /// Writes the dword at `offset` (rounded down to 4).
    fn write32(&self, address: Address, offset: u16, value: u32);
    /// Bytes of configuration space per function (256 legacy, 4096 ECAM).
    fn space_len(&self) -> u16 {
        256
    }
}

/// A decoded base address register.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bar {
    /// I/O ports from this base.
    Io(u32),
    /// Memory at this address.
    Memory {
        /// Base address.
        address: u64,
        /// A 64-bit BAR (takes two slots).
        wide: bool,
        /// Prefetchable.
        prefetchable: bool,
    },
}

impl fmt::Display for Bar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bar::Io(base) => write!(f, "io {base:#x}"),
            Bar::Memory {
                address,
                wide,
                prefetchable,
            } => write!(
                f,
                "mem{} {address:#x}{}",
                if *wide { "64" } else { "32" },
                if *prefetchable { " pref" } else { "" }
            ),
        }
    }
}

/// One PCI function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    /// Where it is.
    pub address: Address,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Class, subclass, programming interface.
    pub class: [u8; 3],
    /// BARs 0-5 (`None`: unimplemented, unassigned, or the upper half of a
    /// 64-bit BAR).
    pub bars: [Option<Bar>; 6],
}

impl Function {
    /// The memory address of BAR `index`, if it is an assigned memory BAR.
    pub fn memory_bar(&self, index: usize) -> Option<u64> {
        match self.bars.get(index).copied().flatten()? {
            Bar::Memory { address, .. } => Some(address),
            Bar::Io(_) => None,
        }
    }
}

fn bars<C: ConfigSpace + ?Sized>(config: &C, address: Address, count: u8) -> [Option<Bar>; 6] {
    let mut bars = [None; 6];
    let mut i = 0u8;
    while i < count {
        let raw = config.read32(address, 0x10 + 4 * u16::from(i));
        let slot = usize::from(i);
        i += 1;
        if raw & 1 == 1 {
            let base = raw & !0x3;
            bars[slot] = (base != 0).then_some(Bar::Io(base));
            continue;
        }
        let wide = (raw >> 1) & 0x3 == 0x2;
        let mut value = u64::from(raw & !0xf);
        if wide && i < count {
            value |= u64::from(config.read32(address, 0x10 + 4 * u16::from(i))) << 32;
            i += 1;
        }
        bars[slot] = (value != 0).then_some(Bar::Memory {
            address: value,
            wide,
            prefetchable: raw & 0x8 != 0,
        });
    }
    bars
}

/// Calls `found` for every present function, bus by bus in ascending
/// order.
pub fn enumerate<C: ConfigSpace + ?Sized>(config: &C, mut found: impl FnMut(&Function)) {
    let mut pending = [false; 256];
    pending[0] = true;
    for bus in 0..=255u8 {
        if !pending[usize::from(bus)] {
            continue;
        }
        for device in 0..32u8 {
            for function in 0..8u8 {
                let address = Address {
                    bus,
                    device,
                    function,
                };
                let ids = config.read32(address, 0);
                if ids & 0xffff == 0xffff {
                    if function == 0 {
                        break;
                    }
                    continue;
                }
                let class = config.read32(address, 0x08).to_le_bytes();
                let header = (config.read32(address, 0x0c) >> 16) as u8;
                let bar_count = match header & 0x7f {
                    0 => 6,
                    1 => {
                        // Bus numbers register: primary, secondary, subordinate.
                        let secondary = (config.read32(address, 0x18) >> 8) as u8;
                        if secondary > bus {
                            pending[usize::from(secondary)] = true;
                        }
                        2
                    }
                    _ => 0,
                };
                found(&Function {
                    address,
                    vendor: ids as u16,
                    device: (ids >> 16) as u16,
                    class: [class[3], class[2], class[1]],
                    bars: bars(config, address, bar_count),
                });
                if function == 0 && header & 0x80 == 0 {
                    break;
                }
            }
        }
    }
}

/// Command register bits: memory space decoding.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command register bits: bus master (the device may DMA).
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
/// Command register bits: INTx disable.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;

/// Whether a device the image drives may assert its INTx line.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Intx {
    /// It may (a NIC whose frames wake the idle CPU).
    Enabled,
    /// It may not (a polled disk: its line, maybe shared with a NIC's,
    /// then never stays asserted).
    Disabled,
}

/// Turns on memory space decoding and bus mastering for a function the
/// caller drives (a device cannot reach its rings without bus mastering)
/// and allows or forbids its INTx line. Returns the new command register.
pub fn enable_memory_and_bus_master<C: ConfigSpace + ?Sized>(
    config: &C,
    address: Address,
    intx: Intx,
) -> u16 {
    let command_status = config.read32(address, 0x04);
    // The status half (upper 16 bits) is write-1-to-clear: write zeros.
    let command = (command_status as u16) | COMMAND_MEMORY | COMMAND_BUS_MASTER;
    let command = match intx {
        Intx::Enabled => command & !COMMAND_INTX_DISABLE,
        Intx::Disabled => command | COMMAND_INTX_DISABLE,
    };
    config.write32(address, 0x04, u32::from(command));
    config.read32(address, 0x04) as u16
}

/// The size in bytes of memory BAR `index` of `address` (the standard
/// probe: all ones written, the read-back's writable bits give the size;
/// memory decoding is off meanwhile and everything is restored). `None`
/// for an I/O or unimplemented BAR.
pub fn bar_size<C: ConfigSpace + ?Sized>(config: &C, address: Address, index: u8) -> Option<u64> {
    if index > 5 {
        return None;
    }
    let offset = 0x10 + 4 * u16::from(index);
    let low = config.read32(address, offset);
    if low & 1 != 0 {
        return None;
    }
    let wide = (low >> 1) & 0x3 == 0x2 && index < 5;
    let command = config.read32(address, 0x04) as u16;
    config.write32(address, 0x04, u32::from(command & !COMMAND_MEMORY));
    config.write32(address, offset, u32::MAX);
    let mut mask = u64::from(config.read32(address, offset) & !0xf);
    config.write32(address, offset, low);
    if wide {
        let high = config.read32(address, offset + 4);
        config.write32(address, offset + 4, u32::MAX);
        mask |= u64::from(config.read32(address, offset + 4)) << 32;
        config.write32(address, offset + 4, high);
    } else {
        mask |= 0xffff_ffff_0000_0000;
    }
    config.write32(address, 0x04, u32::from(command));
    (mask & !0xf != 0).then(|| (!mask).wrapping_add(1))
}

/// The legacy (8259) IRQ of `address`'s INTx pin as the firmware routed
/// it (the Interrupt Line register, 0x3c), or `None` if the function has
/// no pin or the line is not a usable device IRQ (0, the cascade 2, 16 and
/// up, 0xff for "unknown").
pub fn legacy_irq<C: ConfigSpace + ?Sized>(config: &C, address: Address) -> Option<u8> {
    let [line, pin, ..] = config.read32(address, 0x3c).to_le_bytes();
    (matches!(pin, 1..=4) && line != 0 && line != 2 && line < 16).then_some(line)
}

/// Capability id of a vendor-specific capability (virtio uses it).
const CAPABILITY_VENDOR: u8 = 0x09;
/// Most capabilities walked (a looping list ends here).
const MAX_CAPABILITIES: usize = 48;

/// The virtio vendor capabilities (`struct virtio_pci_cap`, VIRTIO 1.1
/// §4.1.4) of `address`, in list order, at most `N`.
pub fn virtio_capabilities<C: ConfigSpace + ?Sized, const N: usize>(
    config: &C,
    address: Address,
) -> heapless::Vec<crate::virtio::transport::PciCapability, N> {
    use crate::virtio::transport::{CapabilityType, PciCapability};
    let mut found = heapless::Vec::new();
    // Status bit 4: the capabilities list exists.
    if config.read32(address, 0x04) & (1 << 20) == 0 {
        return found;
    }
    let mut pointer = (config.read32(address, 0x34) & 0xfc) as u8;
    for _ in 0..MAX_CAPABILITIES {
        if pointer < 0x40 {
            break;
        }
        let at = u16::from(pointer);
        let head = config.read32(address, at);
        let id = head as u8;
        let next = ((head >> 8) as u8) & 0xfc;
        // Byte 2: cap_len; byte 3: cfg_type. virtio_pci_cap is 16 bytes,
        // the notify capability 20; the whole structure must fit in the
        // 256-byte header.
        let length = (head >> 16) as u8;
        if id == CAPABILITY_VENDOR && length >= 16 && at + 16 <= 256 {
            let cfg_type = CapabilityType::from((head >> 24) as u8);
            let bar = config.read32(address, at + 4) as u8;
            let offset = config.read32(address, at + 8);
            let block_length = config.read32(address, at + 12);
            let notify_off_multiplier =
                if cfg_type == CapabilityType::Notify && length >= 20 && at <= 236 {
                    config.read32(address, at + 16)
                } else {
                    0
                };
            let capability = PciCapability {
                cfg_type,
                bar,
                offset,
                length: block_length,
                notify_off_multiplier,
            };
            if found.push(capability).is_err() {
                break;
            }
        }
        pointer = next;
    }
    found
}

/// The mechanism the image found: ECAM where ACPI names a window, else
/// the legacy ports.
#[derive(Debug)]
pub enum Mechanism {
    /// PCI Express ECAM (ACPI MCFG).
    Ecam(Ecam),
    /// Configuration mechanism #1.
    #[cfg(target_arch = "x86_64")]
    Legacy(LegacyPorts),
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ecam(_) => f.write_str("ECAM"),
            #[cfg(target_arch = "x86_64")]
            Self::Legacy(_) => f.write_str("legacy ports 0xcf8/0xcfc"),
        }
    }
}

impl ConfigSpace for Mechanism {
    fn read32(&self, address: Address, offset: u16) -> u32 {
        match self {
            Self::Ecam(ecam) => ecam.read32(address, offset),
            #[cfg(target_arch = "x86_64")]
            Self::Legacy(ports) => ports.read32(address, offset),
        }
    }

    fn write32(&self, address: Address, offset: u16, value: u32) {
        match self {
            Self::Ecam(ecam) => ecam.write32(address, offset, value),
            #[cfg(target_arch = "x86_64")]
            Self::Legacy(ports) => ports.write32(address, offset, value),
        }
    }

    fn space_len(&self) -> u16 {
        match self {
            Self::Ecam(ecam) => ecam.space_len(),
            #[cfg(target_arch = "x86_64")]
            Self::Legacy(ports) => ports.space_len(),
        }
    }
}

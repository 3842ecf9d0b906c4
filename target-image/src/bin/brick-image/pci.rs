//! PCI configuration space through the legacy ports 0xcf8/0xcfc.
//!
//! [`enumerate`] walks bus 0 and every bus behind a PCI-to-PCI bridge the
//! firmware numbered (a bridge's secondary bus is always above its own, so
//! one ascending pass finds them all), each device and function, and
//! reports each function's ids, class and the BARs the firmware (SeaBIOS)
//! assigned.
//! BARs are decoded, not sized (sizing writes the BAR; drivers do it when
//! they claim a device).

#![allow(unsafe_code)]

use core::fmt;

use crate::port::Port;

const CONFIG_ADDRESS: u16 = 0xcf8;
const CONFIG_DATA: u16 = 0xcfc;

/// A PCI function's address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
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

/// Reads the config dword at `offset` (rounded down to 4) of `address`.
pub fn read_config(address: Address, offset: u8) -> u32 {
    let selector = 0x8000_0000
        | (u32::from(address.bus) << 16)
        | (u32::from(address.device & 0x1f) << 11)
        | (u32::from(address.function & 0x7) << 8)
        | u32::from(offset & 0xfc);
    // SAFETY: the image owns the PCI configuration mechanism #1 ports;
    // selecting a register has no effect of its own.
    unsafe { Port::<u32>::new(CONFIG_ADDRESS).write(selector) };
    // SAFETY: as above; reading config registers has no side effects
    // (the status register's write-1-to-clear bits are untouched by reads).
    unsafe { Port::<u32>::new(CONFIG_DATA).read() }
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
#[derive(Clone, Copy, Debug)]
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

fn bars(address: Address, count: u8) -> [Option<Bar>; 6] {
    let mut bars = [None; 6];
    let mut i = 0u8;
    while i < count {
        let raw = read_config(address, 0x10 + 4 * i);
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
            value |= u64::from(read_config(address, 0x10 + 4 * i)) << 32;
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

/// Calls `found` for every present function.
pub fn enumerate(mut found: impl FnMut(&Function)) {
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
                let ids = read_config(address, 0);
                if ids & 0xffff == 0xffff {
                    if function == 0 {
                        break;
                    }
                    continue;
                }
                let class = read_config(address, 0x08).to_le_bytes();
                let header = (read_config(address, 0x0c) >> 16) as u8;
                let bar_count = match header & 0x7f {
                    0 => 6,
                    1 => {
                        // Bus numbers register: primary, secondary, subordinate.
                        let secondary = (read_config(address, 0x18) >> 8) as u8;
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
                    bars: bars(address, bar_count),
                });
                if function == 0 && header & 0x80 == 0 {
                    break;
                }
            }
        }
    }
}

/// Writes the config dword at `offset` (rounded down to 4) of `address`.
///
/// # Safety
///
/// Config writes change how the device decodes addresses and whether it
/// masters the bus: the caller must own `address` and know what the
/// register does.
unsafe fn write_config(address: Address, offset: u8, value: u32) {
    let selector = 0x8000_0000
        | (u32::from(address.bus) << 16)
        | (u32::from(address.device & 0x1f) << 11)
        | (u32::from(address.function & 0x7) << 8)
        | u32::from(offset & 0xfc);
    // SAFETY: the image owns the PCI configuration mechanism #1 ports;
    // selecting a register has no effect of its own.
    unsafe { Port::<u32>::new(CONFIG_ADDRESS).write(selector) };
    // SAFETY: the caller vouches for the register write (this function's
    // contract).
    unsafe { Port::<u32>::new(CONFIG_DATA).write(value) };
}

/// Command register bits: memory space decoding.
const COMMAND_MEMORY: u32 = 1 << 1;
/// Command register bits: bus master (the device may DMA).
const COMMAND_BUS_MASTER: u32 = 1 << 2;

/// Command register bits: INTx disable (the device may not assert its
/// interrupt pin).
const COMMAND_INTX_DISABLE: u32 = 1 << 10;

/// Whether a device the image drives may assert its INTx line.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Intx {
    /// It may (a NIC whose frames wake the idle CPU).
    Enabled,
    /// It may not (a polled disk: its line, maybe shared with a NIC's,
    /// then never stays asserted).
    Disabled,
}

/// Turns on memory space decoding and bus mastering for a device the
/// image drives (a virtio device cannot reach its rings without bus
/// mastering) and allows or forbids its INTx line. Returns the new
/// command register.
pub fn enable_memory_and_bus_master(address: Address, intx: Intx) -> u16 {
    let command_status = read_config(address, 0x04);
    // The status half (upper 16 bits) is write-1-to-clear: write zeros.
    let command = (command_status & 0xffff) | COMMAND_MEMORY | COMMAND_BUS_MASTER;
    let command = match intx {
        Intx::Enabled => command & !COMMAND_INTX_DISABLE,
        Intx::Disabled => command | COMMAND_INTX_DISABLE,
    };
    // SAFETY: the caller claimed this function (a virtio device found by
    // enumeration, driven only by the image); enabling its memory BARs,
    // which the firmware assigned, and bus mastering towards the
    // identity-mapped DMA pool is what driving it requires; its INTx pin
    // goes to a line the image masks unless it expects it.
    unsafe { write_config(address, 0x04, command) };
    read_config(address, 0x04) as u16
}

/// The legacy (8259) IRQ of `address`'s INTx pin as the firmware routed
/// it (the Interrupt Line register, 0x3c; SeaBIOS fills it in), or
/// `None` if the function has no pin or the line is not a usable device
/// IRQ (0, the cascade 2, 16 and up, 0xff for "unknown").
pub fn legacy_irq(address: Address) -> Option<u8> {
    let [line, pin, ..] = read_config(address, 0x3c).to_le_bytes();
    (matches!(pin, 1..=4) && line != 0 && line != 2 && line < 16).then_some(line)
}

/// Capability id of a vendor-specific capability (virtio uses it).
const CAPABILITY_VENDOR: u8 = 0x09;
/// Most capabilities walked (a looping list ends here).
const MAX_CAPABILITIES: usize = 48;

/// The virtio vendor capabilities (`struct virtio_pci_cap`, VIRTIO 1.1
/// §4.1.4) of `address`, in list order, at most `N`.
pub fn virtio_capabilities<const N: usize>(
    address: Address,
) -> heapless::Vec<hal::virtio::transport::PciCapability, N> {
    use hal::virtio::transport::{CapabilityType, PciCapability};
    let mut found = heapless::Vec::new();
    // Status bit 4: the capabilities list exists.
    if read_config(address, 0x04) & (1 << 20) == 0 {
        return found;
    }
    let mut pointer = (read_config(address, 0x34) & 0xfc) as u8;
    for _ in 0..MAX_CAPABILITIES {
        if pointer < 0x40 {
            break;
        }
        let head = read_config(address, pointer);
        let id = head as u8;
        let next = ((head >> 8) as u8) & 0xfc;
        // Byte 2: cap_len; byte 3: cfg_type. virtio_pci_cap is 16 bytes,
        // the notify capability 20; the whole structure must fit in the
        // 256-byte header.
        let length = (head >> 16) as u8;
        if id == CAPABILITY_VENDOR && length >= 16 && usize::from(pointer) + 16 <= 256 {
            let cfg_type = CapabilityType::from((head >> 24) as u8);
            let bar = read_config(address, pointer + 4) as u8;
            let offset = read_config(address, pointer + 8);
            let block_length = read_config(address, pointer + 12);
            let notify_off_multiplier =
                if cfg_type == CapabilityType::Notify && length >= 20 && pointer <= 236 {
                    read_config(address, pointer + 16)
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

//! The device's registers as drivers see them: `VirtioTransport`, and the
//! modern virtio PCI implementation `PciTransport`.
//!
//! A modern virtio PCI device (VIRTIO 1.1 §4.1.4) exposes four register
//! blocks through vendor capabilities, each somewhere in a BAR: common
//! configuration (features, status, queue setup), notification (one
//! doorbell per queue at `queue_notify_off * notify_off_multiplier`), ISR
//! status and device-specific configuration (MAC, capacity…). The trait
//! covers what the drivers use, at the level of the common-configuration
//! fields, so the mock in the tests stays small.
//!
//! Interrupts: drivers poll, and an interrupt only wakes a halted CPU.
//! MSI-X stays disabled (nothing sets its enable bit) and every MSI-X
//! vector is `VIRTIO_MSI_NO_VECTOR`, so a device that interrupts uses the
//! legacy INTx line (§4.1.5.3, §4.1.5.4): it asserts the line with ISR
//! bit 0 (a used buffer) or bit 1 (a configuration change), and reading
//! the ISR register ([`VirtioTransport::read_isr`]) clears the bits and
//! de-asserts the line.
//!
//! [`PciTransport`] is the one place with MMIO: volatile loads and stores
//! at addresses checked against each block's length. Its constructor is
//! `unsafe` (the caller vouches for the addresses); every later access is
//! safe. It compiles everywhere; only the image can construct it usefully.

use core::ptr::NonNull;

/// Where a virtqueue's three parts live (bus addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueAddresses {
    /// The descriptor table.
    pub descriptors: u64,
    /// The driver area (available ring).
    pub driver: u64,
    /// The device area (used ring).
    pub device: u64,
}

/// The registers of a virtio device, as the drivers use them.
pub trait VirtioTransport {
    /// All 64 device feature bits (both halves of `device_feature`).
    fn device_features(&mut self) -> u64;
    /// Writes all 64 driver feature bits.
    fn set_driver_features(&mut self, features: u64);
    /// The device status byte.
    fn status(&mut self) -> u8;
    /// Writes the device status byte (0 resets the device).
    fn set_status(&mut self, status: u8);
    /// The maximum size of queue `queue`; 0 if it does not exist.
    fn queue_max_size(&mut self, queue: u16) -> u16;
    /// Sets queue `queue`'s size and ring addresses, then enables it.
    fn enable_queue(&mut self, queue: u16, size: u16, addresses: QueueAddresses);
    /// Rings queue `queue`'s doorbell.
    fn notify(&mut self, queue: u16);
    /// The configuration generation counter.
    fn config_generation(&mut self) -> u8;
    /// Byte `offset` of the device-specific configuration (0 beyond its end).
    fn read_config_u8(&mut self, offset: usize) -> u8;
    /// The little-endian `u32` at `offset` (4-aligned) of the device-specific
    /// configuration, read with one 32-bit access as §4.1.3.1 requires for
    /// 32- and 64-bit fields (0 beyond its end).
    fn read_config_u32(&mut self, offset: usize) -> u32;
    /// Reads the ISR status (§4.1.4.5): bit 0 = a queue interrupt, bit 1 =
    /// a configuration change. The read clears it and de-asserts the
    /// device's INTx line. The default (a transport without an ISR
    /// register) reads 0.
    fn read_isr(&mut self) -> u8 {
        0
    }
}

/// The `cfg_type` of a virtio PCI vendor capability (§4.1.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapabilityType {
    /// `VIRTIO_PCI_CAP_COMMON_CFG` (1).
    Common,
    /// `VIRTIO_PCI_CAP_NOTIFY_CFG` (2).
    Notify,
    /// `VIRTIO_PCI_CAP_ISR_CFG` (3).
    Isr,
    /// `VIRTIO_PCI_CAP_DEVICE_CFG` (4).
    Device,
    /// `VIRTIO_PCI_CAP_PCI_CFG` (5) or another value: ignored.
    Other(u8),
}

impl From<u8> for CapabilityType {
    fn from(value: u8) -> Self {
        match value {
            1 => Self::Common,
            2 => Self::Notify,
            3 => Self::Isr,
            4 => Self::Device,
            other => Self::Other(other),
        }
    }
}

/// One virtio vendor capability as the PCI probe read it from config space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PciCapability {
    /// What the capability points at.
    pub cfg_type: CapabilityType,
    /// The BAR index (0–5).
    pub bar: u8,
    /// Offset of the block within the BAR.
    pub offset: u32,
    /// Length of the block.
    pub length: u32,
    /// `notify_off_multiplier` (notification capability only; else 0).
    pub notify_off_multiplier: u32,
}

/// The register blocks of a modern virtio PCI device: virtual addresses
/// (identity-mapped in the image) and lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PciRegions {
    /// Common configuration block.
    pub common: u64,
    /// Its length (at least 56 bytes).
    pub common_len: u32,
    /// Notification block.
    pub notify: u64,
    /// Its length.
    pub notify_len: u32,
    /// Bytes between the doorbells of consecutive `queue_notify_off`s.
    pub notify_off_multiplier: u32,
    /// Device-specific configuration block.
    pub device: u64,
    /// Its length.
    pub device_len: u32,
    /// ISR status register (one byte); 0 if the device has none.
    pub isr: u64,
    /// Its length (0 if there is none).
    pub isr_len: u32,
}

impl PciRegions {
    /// Finds the blocks among `capabilities` given the BARs' base
    /// addresses (`bars[i]` for BAR i; memory BARs, 64-bit ones already
    /// combined). The first capability of each type wins (§4.1.4: the
    /// driver should use the first one it can). `None` if the common,
    /// notification or device block is missing or lies outside the
    /// address space; a missing (or unusable) ISR block is left 0.
    pub fn from_capabilities(bars: &[u64; 6], capabilities: &[PciCapability]) -> Option<Self> {
        let find = |wanted: CapabilityType| {
            let capability = capabilities.iter().find(|c| c.cfg_type == wanted)?;
            let base = *bars.get(usize::from(capability.bar))?;
            let address = base.checked_add(u64::from(capability.offset))?;
            address.checked_add(u64::from(capability.length))?;
            Some((address, capability.length, capability.notify_off_multiplier))
        };
        let (common, common_len, _) = find(CapabilityType::Common)?;
        let (notify, notify_len, notify_off_multiplier) = find(CapabilityType::Notify)?;
        let (device, device_len, _) = find(CapabilityType::Device)?;
        let (isr, isr_len, _) = find(CapabilityType::Isr).unwrap_or((0, 0, 0));
        Some(Self {
            common,
            common_len,
            notify,
            notify_len,
            notify_off_multiplier,
            device,
            device_len,
            isr,
            isr_len,
        })
    }
}

/// Offsets in the common configuration block (`struct
/// virtio_pci_common_cfg`, §4.1.4.3).
mod common {
    pub const DEVICE_FEATURE_SELECT: usize = 0;
    pub const DEVICE_FEATURE: usize = 4;
    pub const DRIVER_FEATURE_SELECT: usize = 8;
    pub const DRIVER_FEATURE: usize = 12;
    pub const MSIX_CONFIG: usize = 16;
    pub const DEVICE_STATUS: usize = 20;
    pub const CONFIG_GENERATION: usize = 21;
    pub const QUEUE_SELECT: usize = 22;
    pub const QUEUE_SIZE: usize = 24;
    pub const QUEUE_MSIX_VECTOR: usize = 26;
    pub const QUEUE_ENABLE: usize = 28;
    pub const QUEUE_NOTIFY_OFF: usize = 30;
    pub const QUEUE_DESC: usize = 32;
    pub const QUEUE_DRIVER: usize = 40;
    pub const QUEUE_DEVICE: usize = 48;
    /// The block's length as far as we use it.
    pub const LEN: usize = 56;
}

/// `VIRTIO_MSI_NO_VECTOR`: no MSI-X message for this queue or for config
/// changes (MSI-X is never enabled: an interrupt, if any, is INTx).
const NO_VECTOR: u16 = 0xffff;

/// Queues whose notification offsets [`PciTransport`] remembers.
pub const MAX_QUEUES: usize = 8;

/// A modern virtio PCI device's registers through MMIO.
#[derive(Debug)]
pub struct PciTransport {
    common: NonNull<u8>,
    notify: NonNull<u8>,
    notify_len: usize,
    notify_off_multiplier: usize,
    device: NonNull<u8>,
    device_len: usize,
    /// The ISR status byte, if the device has one.
    isr: Option<NonNull<u8>>,
    /// `queue_notify_off` of each enabled queue (read at enable time).
    notify_offsets: [Option<u16>; MAX_QUEUES],
}

// SAFETY: the transport is the only user of the device's registers (the
// `new` contract); moving it to another thread moves that ownership.
unsafe impl Send for PciTransport {}

impl PciTransport {
    /// The device whose register blocks are at `regions`. `None` if an
    /// address is null or the common block is shorter than 56 bytes. An
    /// ISR block of length 0 (or at address 0) means no ISR register.
    ///
    /// # Safety
    ///
    /// `regions` must describe one device's virtio capabilities, mapped
    /// uncached at those virtual addresses with the PCI memory space enabled
    /// (and bus mastering, for the device to reach the rings), and nothing
    /// else may access these registers while the transport lives.
    pub unsafe fn new(regions: PciRegions) -> Option<Self> {
        if (regions.common_len as usize) < common::LEN {
            return None;
        }
        let pointer = |address: u64| NonNull::new(usize::try_from(address).ok()? as *mut u8);
        Some(Self {
            common: pointer(regions.common)?,
            notify: pointer(regions.notify)?,
            notify_len: regions.notify_len as usize,
            notify_off_multiplier: regions.notify_off_multiplier as usize,
            device: pointer(regions.device)?,
            device_len: regions.device_len as usize,
            isr: if regions.isr_len == 0 {
                None
            } else {
                pointer(regions.isr)
            },
            notify_offsets: [None; MAX_QUEUES],
        })
    }

    fn common_ptr<T>(&self, offset: usize) -> *mut T {
        debug_assert!(offset + core::mem::size_of::<T>() <= common::LEN);
        // SAFETY: every caller passes a field offset of the common block,
        // whose length `new` checked to be at least `common::LEN`.
        unsafe { self.common.as_ptr().add(offset) }.cast()
    }

    fn read8(&self, offset: usize) -> u8 {
        let ptr = self.common_ptr::<u8>(offset);
        // SAFETY: an in-range, naturally aligned register of the block the
        // `new` caller vouched for; MMIO needs volatile access.
        unsafe { ptr.read_volatile() }
    }

    fn write8(&self, offset: usize, value: u8) {
        let ptr = self.common_ptr::<u8>(offset);
        // SAFETY: as in `read8`.
        unsafe { ptr.write_volatile(value) }
    }

    fn read16(&self, offset: usize) -> u16 {
        let ptr = self.common_ptr::<u16>(offset);
        // SAFETY: as in `read8` (field offsets are 2-aligned for u16s).
        u16::from_le(unsafe { ptr.read_volatile() })
    }

    fn write16(&self, offset: usize, value: u16) {
        let ptr = self.common_ptr::<u16>(offset);
        // SAFETY: as in `read16`.
        unsafe { ptr.write_volatile(value.to_le()) }
    }

    fn read32(&self, offset: usize) -> u32 {
        let ptr = self.common_ptr::<u32>(offset);
        // SAFETY: as in `read8` (field offsets are 4-aligned for u32s).
        u32::from_le(unsafe { ptr.read_volatile() })
    }

    fn write32(&self, offset: usize, value: u32) {
        let ptr = self.common_ptr::<u32>(offset);
        // SAFETY: as in `read32`.
        unsafe { ptr.write_volatile(value.to_le()) }
    }

    /// 64-bit fields are written as two 32-bit halves, low first (§4.1.3.1).
    fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

impl VirtioTransport for PciTransport {
    fn device_features(&mut self) -> u64 {
        self.write32(common::DEVICE_FEATURE_SELECT, 0);
        let low = self.read32(common::DEVICE_FEATURE);
        self.write32(common::DEVICE_FEATURE_SELECT, 1);
        let high = self.read32(common::DEVICE_FEATURE);
        u64::from(low) | (u64::from(high) << 32)
    }

    fn set_driver_features(&mut self, features: u64) {
        self.write32(common::DRIVER_FEATURE_SELECT, 0);
        self.write32(common::DRIVER_FEATURE, features as u32);
        self.write32(common::DRIVER_FEATURE_SELECT, 1);
        self.write32(common::DRIVER_FEATURE, (features >> 32) as u32);
    }

    fn status(&mut self) -> u8 {
        self.read8(common::DEVICE_STATUS)
    }

    fn set_status(&mut self, status: u8) {
        if status == 0 {
            self.notify_offsets = [None; MAX_QUEUES];
        }
        self.write8(common::DEVICE_STATUS, status);
        if status == super::status::ACKNOWLEDGE {
            // No MSI-X message for config changes (INTx, if anything).
            self.write16(common::MSIX_CONFIG, NO_VECTOR);
        }
    }

    fn queue_max_size(&mut self, queue: u16) -> u16 {
        self.write16(common::QUEUE_SELECT, queue);
        self.read16(common::QUEUE_SIZE)
    }

    fn enable_queue(&mut self, queue: u16, size: u16, addresses: QueueAddresses) {
        self.write16(common::QUEUE_SELECT, queue);
        self.write16(common::QUEUE_SIZE, size);
        self.write16(common::QUEUE_MSIX_VECTOR, NO_VECTOR);
        self.write64(common::QUEUE_DESC, addresses.descriptors);
        self.write64(common::QUEUE_DRIVER, addresses.driver);
        self.write64(common::QUEUE_DEVICE, addresses.device);
        let notify_off = self.read16(common::QUEUE_NOTIFY_OFF);
        if let Some(slot) = self.notify_offsets.get_mut(usize::from(queue)) {
            *slot = Some(notify_off);
        }
        self.write16(common::QUEUE_ENABLE, 1);
    }

    fn notify(&mut self, queue: u16) {
        let Some(Some(notify_off)) = self.notify_offsets.get(usize::from(queue)).copied() else {
            return;
        };
        let offset = usize::from(notify_off) * self.notify_off_multiplier;
        if offset + 2 > self.notify_len || offset % 2 != 0 {
            return;
        }
        // SAFETY: `offset + 2 <= notify_len` (checked above): inside the
        // notification block the `new` caller vouched for.
        let ptr = unsafe { self.notify.as_ptr().add(offset) }.cast::<u16>();
        // SAFETY: an in-range, 2-aligned doorbell register; volatile MMIO.
        unsafe { ptr.write_volatile(queue.to_le()) }
    }

    fn config_generation(&mut self) -> u8 {
        self.read8(common::CONFIG_GENERATION)
    }

    fn read_config_u8(&mut self, offset: usize) -> u8 {
        if offset >= self.device_len {
            return 0;
        }
        // SAFETY: `offset < device_len`: inside the device configuration
        // block the `new` caller vouched for.
        let ptr = unsafe { self.device.as_ptr().add(offset) };
        // SAFETY: an in-range byte register; volatile MMIO.
        unsafe { ptr.read_volatile() }
    }

    fn read_config_u32(&mut self, offset: usize) -> u32 {
        if offset % 4 != 0 || offset.saturating_add(4) > self.device_len {
            return 0;
        }
        // SAFETY: `offset + 4 <= device_len`: inside the device
        // configuration block the `new` caller vouched for.
        let ptr = unsafe { self.device.as_ptr().add(offset) }.cast::<u32>();
        // SAFETY: an in-range register, 4-aligned (BAR blocks are page
        // aligned and `offset % 4 == 0`); volatile MMIO.
        u32::from_le(unsafe { ptr.read_volatile() })
    }

    fn read_isr(&mut self) -> u8 {
        let Some(isr) = self.isr else {
            return 0;
        };
        // SAFETY: the ISR block's first byte (its length is at least 1:
        // `new` keeps no pointer for a 0-length block), which the `new`
        // caller vouched for; a byte register, volatile MMIO (the read
        // clears it, §4.1.4.5).
        unsafe { isr.as_ptr().read_volatile() }
    }
}

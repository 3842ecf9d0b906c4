//! The virtio PCI transport's register offsets, against plain memory
//! standing in for the BAR, and capability parsing.

use hal::virtio::transport::{
    CapabilityType, PciCapability, PciRegions, PciTransport, QueueAddresses, VirtioTransport,
};

/// A fake BAR: common block at 0, notify at 0x1000, device at 0x2000.
struct Bar(Box<[u64]>);

impl Bar {
    fn new() -> Self {
        Self(vec![0u64; 0x3000 / 8].into_boxed_slice())
    }

    fn base(&mut self) -> u64 {
        self.0.as_mut_ptr() as u64
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: a `u64` slice viewed as bytes: same allocation, any bit
        // pattern is a valid `u8`, alignment 1.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.0.len() * 8) }
    }

    fn read_u16(&self, offset: usize) -> u16 {
        u16::from_le_bytes(self.bytes()[offset..offset + 2].try_into().unwrap())
    }

    fn read_u32(&self, offset: usize) -> u32 {
        u32::from_le_bytes(self.bytes()[offset..offset + 4].try_into().unwrap())
    }

    fn read_u64(&self, offset: usize) -> u64 {
        u64::from_le_bytes(self.bytes()[offset..offset + 8].try_into().unwrap())
    }
}

fn capabilities() -> Vec<PciCapability> {
    let cap = |cfg_type: u8, offset: u32, length: u32, multiplier: u32| PciCapability {
        cfg_type: CapabilityType::from(cfg_type),
        bar: 4,
        offset,
        length,
        notify_off_multiplier: multiplier,
    };
    vec![
        cap(5, 0, 4, 0), // PCI cfg access: ignored
        cap(1, 0, 0x38, 0),
        cap(3, 0x2800, 1, 0),
        cap(4, 0x2000, 0x100, 0),
        cap(2, 0x1000, 0x1000, 4),
        cap(1, 0x100, 0x38, 0), // a second common block: the first wins
    ]
}

#[test]
fn capabilities_locate_the_blocks() {
    let bars = [0, 0, 0, 0, 0xfe00_0000, 0];
    let regions = PciRegions::from_capabilities(&bars, &capabilities()).unwrap();
    assert_eq!(regions.common, 0xfe00_0000);
    assert_eq!(regions.notify, 0xfe00_1000);
    assert_eq!(regions.notify_off_multiplier, 4);
    assert_eq!(regions.device, 0xfe00_2000);
    assert_eq!(regions.device_len, 0x100);
    assert_eq!((regions.isr, regions.isr_len), (0xfe00_2800, 1));
    let without_isr: Vec<_> = capabilities()
        .into_iter()
        .filter(|c| c.cfg_type != CapabilityType::Isr)
        .collect();
    let regions = PciRegions::from_capabilities(&bars, &without_isr).unwrap();
    assert_eq!((regions.isr, regions.isr_len), (0, 0), "ISR is optional");
    let without_notify: Vec<_> = capabilities()
        .into_iter()
        .filter(|c| c.cfg_type != CapabilityType::Notify)
        .collect();
    assert_eq!(PciRegions::from_capabilities(&bars, &without_notify), None);
    let bad_bar = [PciCapability {
        bar: 9,
        ..capabilities()[1]
    }];
    assert_eq!(PciRegions::from_capabilities(&bars, &bad_bar), None);
}

#[test]
fn registers_are_written_at_the_spec_offsets() {
    let mut bar = Bar::new();
    let base = bar.base();
    let bars = [0, 0, 0, 0, base, 0];
    let regions = PciRegions::from_capabilities(&bars, &capabilities()).unwrap();
    // SAFETY: the regions point into `bar`, which outlives the transport
    // and is only read (through `bar.bytes()`) between transport calls.
    let mut transport = unsafe { PciTransport::new(regions) }.unwrap();

    transport.set_status(1);
    transport.set_driver_features(0x1_0000_0020);
    transport.enable_queue(
        1,
        256,
        QueueAddresses {
            descriptors: 0x1111_2222_3333_4444,
            driver: 0x5000,
            device: 0x6000,
        },
    );
    assert_eq!(bar.bytes()[20], 1, "device_status");
    assert_eq!(bar.read_u16(16), 0xffff, "msix_config: no vector");
    assert_eq!(
        bar.read_u32(8),
        1,
        "driver_feature_select (last: high half)"
    );
    assert_eq!(bar.read_u32(12), 1, "driver_feature (high half)");
    assert_eq!(bar.read_u16(22), 1, "queue_select");
    assert_eq!(bar.read_u16(24), 256, "queue_size");
    assert_eq!(bar.read_u16(26), 0xffff, "queue_msix_vector");
    assert_eq!(bar.read_u16(28), 1, "queue_enable");
    assert_eq!(bar.read_u64(32), 0x1111_2222_3333_4444, "queue_desc");
    assert_eq!(bar.read_u64(40), 0x5000, "queue_driver");
    assert_eq!(bar.read_u64(48), 0x6000, "queue_device");

    // queue_notify_off was 0 when queue 1 was enabled: doorbell at 0.
    transport.notify(1);
    assert_eq!(bar.read_u16(0x1000), 1);
    // An unknown queue rings nothing.
    transport.notify(5);
    assert_eq!(bar.read_u16(0x1000), 1);

    // The ISR byte at 0x2800: read (and, on a device, cleared) as is.
    bar.0[0x2800 / 8] = 3;
    assert_eq!(transport.read_isr(), 3);

    assert_eq!(transport.read_config_u32(0x10), 0);
    assert_eq!(transport.read_config_u32(0x100), 0, "beyond the block");
    assert_eq!(transport.read_config_u8(0x100), 0, "beyond the block");
}

#[test]
fn short_common_block_is_refused() {
    let regions = PciRegions {
        common: 0x1000,
        common_len: 0x20,
        notify: 0x2000,
        notify_len: 0x10,
        notify_off_multiplier: 4,
        device: 0x3000,
        device_len: 0x10,
        isr: 0x4000,
        isr_len: 1,
    };
    // SAFETY: refused before any access.
    assert!(unsafe { PciTransport::new(regions) }.is_none());
}

//! PCI enumeration, BAR decoding and sizing, command bits and the virtio
//! capability walk over a fake configuration space (a bridge, a
//! multi-function device, 64-bit BARs).

use std::cell::RefCell;
use std::collections::BTreeMap;

use hal::pci::{
    bar_size, enable_memory_and_bus_master, enumerate, legacy_irq, virtio_capabilities, Address,
    Bar, ConfigSpace, Intx,
};
use hal::virtio::transport::CapabilityType;

/// Functions by address: 64 dwords each, with each BAR's size mask
/// (writable bits) so sizing works as on hardware.
#[derive(Default)]
struct Fake {
    spaces: RefCell<BTreeMap<Address, [u32; 64]>>,
    bar_masks: BTreeMap<(Address, u16), u32>,
}

impl Fake {
    fn add(&mut self, address: Address, ids: u32, class: u32, header: u8) -> &mut [u32; 64] {
        let spaces = self.spaces.get_mut();
        let space = spaces.entry(address).or_insert([0; 64]);
        space[0] = ids;
        space[2] = class << 8;
        space[3] = u32::from(header) << 16;
        space
    }
}

impl ConfigSpace for Fake {
    fn read32(&self, address: Address, offset: u16) -> u32 {
        self.spaces
            .borrow()
            .get(&address)
            .map_or(u32::MAX, |space| space[usize::from(offset / 4)])
    }

    fn write32(&self, address: Address, offset: u16, value: u32) {
        let mut spaces = self.spaces.borrow_mut();
        let space = spaces
            .get_mut(&address)
            .expect("write to an absent function");
        let value = match self.bar_masks.get(&(address, offset)) {
            // A BAR keeps its type bits; only the writable address bits change.
            Some(mask) => (value & mask) | (space[usize::from(offset / 4)] & !mask),
            None => value,
        };
        space[usize::from(offset / 4)] = value;
    }
}

fn at(bus: u8, device: u8, function: u8) -> Address {
    Address {
        bus,
        device,
        function,
    }
}

fn machine() -> Fake {
    let mut fake = Fake::default();
    // 00:00.0 host bridge; 00:01.0 a PCI bridge to bus 1; 00:02.0/.1 a
    // multi-function device; 01:00.0 an NVMe controller behind the bridge.
    fake.add(at(0, 0, 0), 0x29c0_8086, 0x06_00_00, 0);
    fake.add(at(0, 1, 0), 0x0001_1b36, 0x06_04_00, 1)[6] = 0x00_01_01_00; // sub 1, sec 1, pri 0
    let nic = fake.add(at(0, 2, 0), 0x1041_1af4, 0x02_00_00, 0x80);
    nic[4] = 0xfebf_0000; // BAR0 mem32
    nic[8] = 0x0000_000c; // BAR4 mem64 pref, low
    nic[9] = 0x0000_0080; // BAR4 high: 0x80_0000_0000
    nic[1] = 1 << 20; // status: capabilities list
    nic[13] = 0x40;
    nic[15] = 0x0000_010b; // pin A, line 11
                           // A common (type 1) and a notify (type 2, 20 bytes) capability.
    nic[16] = 0x0110_5009; // id 9, next 0x50, len 16, type 1
    nic[17] = 4;
    nic[18] = 0x0000;
    nic[19] = 0x1000;
    nic[20] = 0x0214_0009; // id 9, next 0, len 20, type 2
    nic[21] = 4;
    nic[22] = 0x3000;
    nic[23] = 0x1000;
    nic[24] = 4;
    fake.add(at(0, 2, 1), 0x1042_1af4, 0x01_00_00, 0x80)[4] = 0x0000_c001; // io BAR0
    let nvme = fake.add(at(1, 0, 0), 0x0010_1b36, 0x01_08_02, 0);
    nvme[4] = 0xfe80_0004; // BAR0 mem64
    nvme[5] = 0;
    nvme[15] = 0x0000_0100; // pin A, line 0: no usable line
    fake.bar_masks.insert((at(1, 0, 0), 0x10), 0xffff_c000); // 16 KiB
    fake.bar_masks.insert((at(1, 0, 0), 0x14), 0xffff_ffff);
    fake.bar_masks.insert((at(0, 2, 0), 0x10), 0xffff_f000); // 4 KiB
    fake
}

#[test]
fn enumerate_finds_functions_behind_bridges_and_decodes_bars() {
    let fake = machine();
    let mut found = Vec::new();
    enumerate(&fake, |function| found.push(*function));
    let addresses: Vec<String> = found.iter().map(|f| f.address.to_string()).collect();
    assert_eq!(
        addresses,
        ["00:00.0", "00:01.0", "00:02.0", "00:02.1", "01:00.0"]
    );
    let nic = &found[2];
    assert_eq!((nic.vendor, nic.device), (0x1af4, 0x1041));
    assert_eq!(nic.class, [0x02, 0x00, 0x00]);
    assert_eq!(
        nic.bars[4],
        Some(Bar::Memory {
            address: 0x80_0000_0000,
            wide: true,
            prefetchable: true
        })
    );
    assert_eq!(nic.bars[5], None, "the upper half of a 64-bit BAR");
    assert_eq!(nic.memory_bar(0), Some(0xfebf_0000));
    assert_eq!(found[3].bars[0], Some(Bar::Io(0xc000)));
    assert_eq!(found[3].memory_bar(0), None);
    let nvme = &found[4];
    assert_eq!(nvme.class, [0x01, 0x08, 0x02]);
    assert_eq!(nvme.memory_bar(0), Some(0xfe80_0000));
}

#[test]
fn bars_are_sized_and_restored() {
    let fake = machine();
    let nvme = at(1, 0, 0);
    fake.write32(nvme, 0x04, 0x6);
    assert_eq!(bar_size(&fake, nvme, 0), Some(16 << 10));
    assert_eq!(fake.read32(nvme, 0x10), 0xfe80_0004, "BAR restored");
    assert_eq!(fake.read32(nvme, 0x04), 0x6, "command restored");
    assert_eq!(bar_size(&fake, at(0, 2, 0), 0), Some(4 << 10));
    assert_eq!(bar_size(&fake, at(0, 2, 1), 0), None, "an I/O BAR");
}

#[test]
fn claiming_sets_memory_and_bus_master_and_the_intx_choice() {
    let fake = machine();
    let nic = at(0, 2, 0);
    let command = enable_memory_and_bus_master(&fake, nic, Intx::Enabled);
    assert_eq!(command & 0x406, 0x006);
    let command = enable_memory_and_bus_master(&fake, nic, Intx::Disabled);
    assert_eq!(command & 0x406, 0x406);
    // The status half was written as zeros (write-1-to-clear).
    assert_eq!(fake.read32(nic, 0x04) >> 16, 0);
    assert_eq!(legacy_irq(&fake, nic), Some(11));
    assert_eq!(legacy_irq(&fake, at(1, 0, 0)), None);
}

#[test]
fn virtio_capabilities_are_walked_in_order() {
    let fake = machine();
    let caps = virtio_capabilities::<_, 8>(&fake, at(0, 2, 0));
    assert_eq!(caps.len(), 2);
    assert_eq!(caps[0].cfg_type, CapabilityType::Common);
    assert_eq!(
        (caps[0].bar, caps[0].offset, caps[0].length),
        (4, 0, 0x1000)
    );
    assert_eq!(caps[1].cfg_type, CapabilityType::Notify);
    assert_eq!(caps[1].notify_off_multiplier, 4);
    // No capabilities list bit: nothing is walked.
    assert!(virtio_capabilities::<_, 8>(&fake, at(1, 0, 0)).is_empty());
}

//! fw_cfg against a mock device: signature, file directory, DMA reads into
//! guest memory, the data-port fallback and failures.

#[path = "common/virtio_mock.rs"]
mod mock;

use std::rc::Rc;

use hal::fw_cfg::{FwCfg, FwCfgError, FwCfgFile, FwCfgPorts, MANIFEST_FILE};
use mock::Memory;

/// The device: items by key, a selected item with a read offset, and DMA
/// into guest memory.
struct MockFwCfg {
    memory: Rc<Memory>,
    items: Vec<(u16, Vec<u8>)>,
    selected: u16,
    offset: usize,
    dma_feature: bool,
    fail_dma: bool,
    dma_count: usize,
}

impl MockFwCfg {
    fn new(memory: Rc<Memory>, files: &[(&str, Vec<u8>)]) -> Self {
        let mut items = vec![
            (0x0000, b"QEMU".to_vec()),
            (0x0001, 3u32.to_le_bytes().to_vec()),
        ];
        let mut directory = (files.len() as u32).to_be_bytes().to_vec();
        for (index, (name, contents)) in files.iter().enumerate() {
            let select = 0x0020 + index as u16;
            directory.extend_from_slice(&(contents.len() as u32).to_be_bytes());
            directory.extend_from_slice(&select.to_be_bytes());
            directory.extend_from_slice(&[0, 0]);
            let mut field = [0u8; 56];
            field[..name.len()].copy_from_slice(name.as_bytes());
            directory.extend_from_slice(&field);
            items.push((select, contents.clone()));
        }
        items.push((0x0019, directory));
        Self {
            memory,
            items,
            selected: 0,
            offset: 0,
            dma_feature: true,
            fail_dma: false,
            dma_count: 0,
        }
    }

    fn item(&self) -> &[u8] {
        self.items
            .iter()
            .find(|(key, _)| *key == self.selected)
            .map_or(&[][..], |(_, bytes)| bytes)
    }
}

impl FwCfgPorts for MockFwCfg {
    fn select(&mut self, key: u16) {
        self.selected = key;
        self.offset = 0;
        if key == 1 && !self.dma_feature {
            self.items[1].1 = 1u32.to_le_bytes().to_vec();
        }
    }

    fn read_data(&mut self) -> u8 {
        let byte = self.item().get(self.offset).copied().unwrap_or(0);
        self.offset += 1;
        byte
    }

    fn start_dma(&mut self, access_address: u64) {
        self.dma_count += 1;
        let mut access = [0u8; 16];
        self.memory.read(access_address, &mut access);
        let control = u32::from_be_bytes(access[0..4].try_into().unwrap());
        let length = u32::from_be_bytes(access[4..8].try_into().unwrap()) as usize;
        let address = u64::from_be_bytes(access[8..16].try_into().unwrap());
        if self.fail_dma {
            self.memory.write(access_address, &1u32.to_be_bytes());
            return;
        }
        if control & 8 != 0 {
            self.select((control >> 16) as u16);
        }
        if control & 2 != 0 {
            let mut bytes = vec![0; length];
            let item = self.item();
            let available = item.len().saturating_sub(self.offset).min(length);
            bytes[..available].copy_from_slice(&item[self.offset..self.offset + available]);
            self.memory.write(address, &bytes);
            self.offset += length;
        }
        self.memory.write(access_address, &0u32.to_be_bytes());
    }
}

fn manifest() -> Vec<u8> {
    (0..100_000u32).map(|i| (i * 7 + i / 256) as u8).collect()
}

fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("etc/boot-menu-wait", vec![0, 0]),
        (MANIFEST_FILE, manifest()),
        ("opt/other", b"x".to_vec()),
    ]
}

#[test]
fn finds_the_manifest_and_reads_it_by_dma() {
    let memory = Memory::new(1 << 20);
    let mut pool = memory.pool(0, 1 << 20);
    let ports = MockFwCfg::new(memory.clone(), &files());
    let mut fw_cfg = FwCfg::new(ports, &mut pool).unwrap();
    assert!(fw_cfg.has_dma());
    let file = fw_cfg.find_file(MANIFEST_FILE).unwrap().unwrap();
    assert_eq!(
        file,
        FwCfgFile {
            select: 0x21,
            size: 100_000
        }
    );
    let target = pool.alloc(128 * 1024, 4096).unwrap();
    assert_eq!(fw_cfg.read_dma(file, &target).unwrap(), 100_000);
    let mut bytes = vec![0; 100_000];
    target.read_bytes(0, &mut bytes);
    assert_eq!(bytes, manifest());
    assert_eq!(fw_cfg.ports().dma_count, 1);

    // A short target gets the start of the file.
    let small = pool.alloc(1000, 8).unwrap();
    assert_eq!(fw_cfg.read_dma(file, &small).unwrap(), 1000);
    let mut start = vec![0; 1000];
    small.read_bytes(0, &mut start);
    assert_eq!(start, manifest()[..1000]);
}

#[test]
fn missing_file_and_names_that_cannot_match() {
    let memory = Memory::new(1 << 16);
    let mut pool = memory.pool(0, 1 << 16);
    let mut fw_cfg = FwCfg::new(MockFwCfg::new(memory.clone(), &files()), &mut pool).unwrap();
    assert_eq!(fw_cfg.find_file("opt/brick/other").unwrap(), None);
    assert_eq!(
        fw_cfg.find_file("opt/brick").unwrap(),
        None,
        "prefix is no match"
    );
    assert_eq!(fw_cfg.find_file(&"x".repeat(80)).unwrap(), None);
    assert!(fw_cfg.find_file("opt/other").unwrap().is_some());
}

#[test]
fn data_port_fallback_without_dma() {
    let memory = Memory::new(1 << 16);
    let mut pool = memory.pool(0, 1 << 16);
    let mut ports = MockFwCfg::new(memory.clone(), &files());
    ports.dma_feature = false;
    let mut fw_cfg = FwCfg::new(ports, &mut pool).unwrap();
    assert!(!fw_cfg.has_dma());
    let file = fw_cfg.find_file(MANIFEST_FILE).unwrap().unwrap();
    let target = pool.alloc(16, 8).unwrap();
    assert_eq!(fw_cfg.read_dma(file, &target), Err(FwCfgError::NoDma));
    let mut bytes = vec![0; 4096];
    assert_eq!(fw_cfg.read_bytes(file, &mut bytes), 4096);
    assert_eq!(bytes, manifest()[..4096]);
}

#[test]
fn no_device_and_dma_errors() {
    let memory = Memory::new(1 << 16);
    let mut pool = memory.pool(0, 1 << 16);
    let mut ports = MockFwCfg::new(memory.clone(), &files());
    ports.items[0].1 = b"\xff\xff\xff\xff".to_vec();
    assert!(matches!(
        FwCfg::new(ports, &mut pool),
        Err(FwCfgError::NotPresent)
    ));
    let mut ports = MockFwCfg::new(memory.clone(), &files());
    ports.fail_dma = true;
    let mut fw_cfg = FwCfg::new(ports, &mut pool).unwrap();
    let file = fw_cfg.find_file(MANIFEST_FILE).unwrap().unwrap();
    let target = pool.alloc(4096, 8).unwrap();
    assert_eq!(fw_cfg.read_dma(file, &target), Err(FwCfgError::DmaFailed));
}

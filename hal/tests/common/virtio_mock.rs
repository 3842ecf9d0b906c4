//! A mock virtio device for the driver tests: a register file behind
//! `VirtioTransport` and a device side that really processes the rings in
//! a fake guest memory (bus address -> pointer by offset).
//!
//! The device side reads the available ring, walks descriptor chains and
//! writes used entries exactly as a device would, with knobs to misbehave.
//! Addresses the driver hands out are checked against the memory: a bad
//! one panics (a driver bug is a test failure).
#![allow(dead_code)] // each test binary uses part of the mock

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{fence, Ordering};

use hal::dma::{DmaPool, DmaRegion, DmaWindow};
use hal::virtio::transport::{QueueAddresses, VirtioTransport};

/// The fake bus address of the first byte of guest memory.
pub const PHYS_BASE: u64 = 0x4000_0000;

/// Guest memory: a page-aligned heap block, reached only through the raw
/// pointer taken once at creation (by the driver's `DmaRegion` and by the
/// device side alike).
pub struct Memory {
    base: *mut u8,
    len: usize,
    _storage: Vec<u8>,
}

impl Memory {
    /// `len` zeroed bytes (page-aligned).
    pub fn new(len: usize) -> Rc<Self> {
        let mut storage = vec![0u8; len + 4096];
        let raw = storage.as_mut_ptr();
        let offset = raw.align_offset(4096);
        // SAFETY: `offset < 4096`, so `raw + offset .. + len` is inside the
        // `len + 4096`-byte allocation.
        let base = unsafe { raw.add(offset) };
        Rc::new(Self {
            base,
            len,
            _storage: storage,
        })
    }

    /// A DMA pool over `offset..offset + len` of this memory.
    pub fn pool(&self, offset: usize, len: usize) -> DmaPool {
        assert!(offset + len <= self.len && offset % 4096 == 0);
        // SAFETY: the range is inside the allocation (asserted), which lives
        // as long as the `Rc<Memory>` the test keeps until the driver is
        // dropped; the test touches it only through the device side, never
        // while a driver call runs.
        let region = unsafe {
            DmaRegion::new(
                self.base.wrapping_add(offset),
                PHYS_BASE + offset as u64,
                len,
            )
        };
        DmaPool::new(region.expect("aligned region"))
    }

    /// A translation for `offset..offset + len` (zero-copy windows).
    pub fn window(&self, offset: usize, len: usize) -> DmaWindow {
        assert!(offset + len <= self.len);
        DmaWindow {
            virt: self.base as usize + offset,
            phys: PHYS_BASE + offset as u64,
            len,
        }
    }

    /// Borrows `offset..offset + len` for the test to fill or read (e.g.
    /// registered memory sent zero-copy). The caller must not call the
    /// device side or a driver that touches this range while it lives.
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len);
        // SAFETY: inside the allocation (asserted); the tests keep such
        // borrows short and never overlapping the device's accesses.
        unsafe { std::slice::from_raw_parts_mut(self.base.wrapping_add(offset), len) }
    }

    /// Borrows `offset..offset + len` read-only (the device may read it
    /// meanwhile; nothing may write it).
    pub fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.len);
        // SAFETY: inside the allocation (asserted); the tests do not write
        // the range while the borrow lives.
        unsafe { std::slice::from_raw_parts(self.base.wrapping_add(offset), len) }
    }

    fn at(&self, phys: u64, len: usize) -> *mut u8 {
        let offset = phys
            .checked_sub(PHYS_BASE)
            .and_then(|offset| usize::try_from(offset).ok())
            .filter(|offset| offset.checked_add(len).is_some_and(|end| end <= self.len))
            .unwrap_or_else(|| panic!("device access outside guest memory: {phys:#x}+{len}"));
        // Inside the allocation (checked just above).
        self.base.wrapping_add(offset)
    }

    /// Reads bytes at a bus address.
    pub fn read(&self, phys: u64, target: &mut [u8]) {
        let ptr = self.at(phys, target.len());
        // SAFETY: `at` checked the range; single-threaded, no reference into
        // guest memory is live while the device side runs.
        unsafe { ptr.copy_to_nonoverlapping(target.as_mut_ptr(), target.len()) }
    }

    /// Writes bytes at a bus address.
    pub fn write(&self, phys: u64, bytes: &[u8]) {
        let ptr = self.at(phys, bytes.len());
        // SAFETY: as in `read`.
        unsafe { bytes.as_ptr().copy_to_nonoverlapping(ptr, bytes.len()) }
    }

    /// Reads a little-endian u16.
    pub fn read_u16(&self, phys: u64) -> u16 {
        let mut bytes = [0; 2];
        self.read(phys, &mut bytes);
        u16::from_le_bytes(bytes)
    }

    /// Reads a little-endian u32.
    pub fn read_u32(&self, phys: u64) -> u32 {
        let mut bytes = [0; 4];
        self.read(phys, &mut bytes);
        u32::from_le_bytes(bytes)
    }

    /// Reads a little-endian u64.
    pub fn read_u64(&self, phys: u64) -> u64 {
        let mut bytes = [0; 8];
        self.read(phys, &mut bytes);
        u64::from_le_bytes(bytes)
    }

    /// Writes a little-endian u16.
    pub fn write_u16(&self, phys: u64, value: u16) {
        self.write(phys, &value.to_le_bytes());
    }

    /// Writes a little-endian u32.
    pub fn write_u32(&self, phys: u64, value: u32) {
        self.write(phys, &value.to_le_bytes());
    }
}

/// One descriptor as the device read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub address: u64,
    pub len: u32,
    pub writable: bool,
}

/// The descriptor at `at` (16 bytes, §2.6.5): it, its flags and its next
/// index.
fn read_descriptor(memory: &Memory, at: u64) -> (Descriptor, u16, u16) {
    let flags = memory.read_u16(at + 12);
    let descriptor = Descriptor {
        address: memory.read_u64(at),
        len: memory.read_u32(at + 8),
        writable: flags & 2 != 0,
    };
    (descriptor, flags, memory.read_u16(at + 14))
}

/// The device's view of one queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceQueue {
    pub size: u16,
    pub addresses: Option<QueueAddresses>,
    pub last_avail: u16,
    pub used_idx: u16,
    /// Chains that came through an indirect table.
    pub indirect_chains: u64,
}

impl DeviceQueue {
    /// The next available chain: head id and descriptors.
    pub fn pop_avail(&mut self, memory: &Memory) -> Option<(u16, Vec<Descriptor>)> {
        let addresses = self.addresses?;
        let avail_idx = memory.read_u16(addresses.driver + 2);
        fence(Ordering::Acquire);
        if avail_idx == self.last_avail {
            return None;
        }
        let slot = u64::from(self.last_avail % self.size);
        let head = memory.read_u16(addresses.driver + 4 + 2 * slot);
        self.last_avail = self.last_avail.wrapping_add(1);
        assert!(
            head < self.size,
            "driver made an out-of-range head available"
        );
        let mut chain = Vec::new();
        let mut id = head;
        loop {
            assert!(chain.len() < usize::from(self.size), "descriptor loop");
            let at = addresses.descriptors + 16 * u64::from(id);
            let flags = memory.read_u16(at + 12);
            if flags & 4 != 0 {
                // An indirect table (§2.6.5.3): alone in its chain, neither
                // NEXT nor WRITE, a whole number of descriptors; its own
                // descriptors chain by index within the table.
                assert!(chain.is_empty(), "an indirect descriptor inside a chain");
                assert_eq!(flags, 4, "an indirect descriptor with NEXT or WRITE");
                let table = memory.read_u64(at);
                let len = memory.read_u32(at + 8);
                assert!(len >= 16 && len % 16 == 0, "indirect table of {len} bytes");
                self.indirect_chains += 1;
                let entries = (len / 16) as u16;
                let mut index = 0u16;
                loop {
                    assert!(chain.len() < usize::from(entries), "indirect loop");
                    let (descriptor, flags, next) =
                        read_descriptor(memory, table + 16 * u64::from(index));
                    assert_eq!(flags & 4, 0, "an indirect descriptor in a table");
                    chain.push(descriptor);
                    if flags & 1 == 0 {
                        break;
                    }
                    index = next;
                    assert!(index < entries, "indirect chain leaves its table");
                }
                break;
            }
            let (descriptor, _, next) = read_descriptor(memory, at);
            chain.push(descriptor);
            if flags & 1 == 0 {
                break;
            }
            id = next;
            assert!(id < self.size, "driver chained an out-of-range descriptor");
        }
        Some((head, chain))
    }

    /// Appends a used entry and publishes the used index.
    pub fn push_used(&mut self, memory: &Memory, id: u32, len: u32) {
        self.write_used_entry(memory, self.used_idx, id, len);
        self.used_idx = self.used_idx.wrapping_add(1);
        self.publish_used(memory, self.used_idx);
    }

    /// Writes a used entry at ring position `index % size` (no publish).
    pub fn write_used_entry(&self, memory: &Memory, index: u16, id: u32, len: u32) {
        let addresses = self.addresses.expect("queue enabled");
        let at = addresses.device + 4 + 8 * u64::from(index % self.size);
        memory.write_u32(at, id);
        memory.write_u32(at + 4, len);
    }

    /// Stores `index` as the used index.
    pub fn publish_used(&self, memory: &Memory, index: u16) {
        fence(Ordering::Release);
        let addresses = self.addresses.expect("queue enabled");
        memory.write_u16(addresses.device + 2, index);
    }

    /// Sets or clears `VIRTQ_USED_F_NO_NOTIFY`.
    pub fn set_no_notify(&self, memory: &Memory, on: bool) {
        let addresses = self.addresses.expect("queue enabled");
        memory.write_u16(addresses.device, u16::from(on));
    }

    /// Whether the driver wants used-buffer interrupts now
    /// (`VIRTQ_AVAIL_F_NO_INTERRUPT` clear).
    pub fn interrupts_wanted(&self, memory: &Memory) -> bool {
        let addresses = self.addresses.expect("queue enabled");
        memory.read_u16(addresses.driver) & 1 == 0
    }

    /// Chains made available and not yet taken.
    pub fn avail_pending(&self, memory: &Memory) -> u16 {
        let addresses = self.addresses.expect("queue enabled");
        memory
            .read_u16(addresses.driver + 2)
            .wrapping_sub(self.last_avail)
    }
}

/// The device's registers and queues.
#[derive(Debug, Default)]
pub struct DeviceState {
    pub offered: u64,
    pub driver_features: u64,
    pub status: u8,
    /// Cleared FEATURES_OK when set (a device rejecting the subset).
    pub reject_features: bool,
    pub queue_max: Vec<u16>,
    pub queues: Vec<DeviceQueue>,
    pub config: Vec<u8>,
    pub generation: u8,
    pub notifications: Vec<u64>,
    pub status_history: Vec<u8>,
    /// ISR status: bit 0 set by `interrupt_if_wanted` (the INTx line is
    /// asserted while it is non-zero), cleared by `read_isr`.
    pub isr: u8,
    /// Interrupts raised (ISR bit 0 set from clear) per queue.
    pub interrupts: Vec<u64>,
}

/// The driver's handle on the mock (shares the state with the test).
#[derive(Clone, Debug)]
pub struct MockTransport(pub Rc<RefCell<DeviceState>>);

impl MockTransport {
    /// A device offering `offered`, with queues of these maximum sizes and
    /// this configuration space.
    pub fn new(offered: u64, queue_max: &[u16], config: Vec<u8>) -> Self {
        Self(Rc::new(RefCell::new(DeviceState {
            offered,
            queue_max: queue_max.to_vec(),
            queues: vec![DeviceQueue::default(); queue_max.len()],
            notifications: vec![0; queue_max.len()],
            interrupts: vec![0; queue_max.len()],
            config,
            ..DeviceState::default()
        })))
    }
}

impl MockTransport {
    /// What a device does after returning buffers on `queue` (QEMU's
    /// `virtio_notify`): raises the interrupt (ISR bit 0, INTx asserted)
    /// unless the driver suppressed it. Returns whether it did.
    pub fn interrupt_if_wanted(&self, memory: &Memory, queue: u16) -> bool {
        let mut state = self.0.borrow_mut();
        if !state.queues[usize::from(queue)].interrupts_wanted(memory) {
            return false;
        }
        if state.isr & 1 == 0 {
            state.interrupts[usize::from(queue)] += 1;
        }
        state.isr |= 1;
        true
    }

    /// Whether the INTx line is asserted (ISR non-zero).
    pub fn line_asserted(&self) -> bool {
        self.0.borrow().isr != 0
    }
}

impl VirtioTransport for MockTransport {
    fn device_features(&mut self) -> u64 {
        self.0.borrow().offered
    }

    fn set_driver_features(&mut self, features: u64) {
        let mut state = self.0.borrow_mut();
        assert_eq!(
            features & !state.offered,
            0,
            "driver accepted unoffered features"
        );
        state.driver_features = features;
    }

    fn status(&mut self) -> u8 {
        self.0.borrow().status
    }

    fn set_status(&mut self, status: u8) {
        let mut state = self.0.borrow_mut();
        let status = if state.reject_features {
            status & !8
        } else {
            status
        };
        state.status = status;
        state.status_history.push(status);
        if status == 0 {
            let sizes = state.queue_max.len();
            state.queues = vec![DeviceQueue::default(); sizes];
        }
    }

    fn queue_max_size(&mut self, queue: u16) -> u16 {
        self.0
            .borrow()
            .queue_max
            .get(usize::from(queue))
            .copied()
            .unwrap_or(0)
    }

    fn enable_queue(&mut self, queue: u16, size: u16, addresses: QueueAddresses) {
        let mut state = self.0.borrow_mut();
        let max = state.queue_max[usize::from(queue)];
        assert!(size <= max && size.is_power_of_two());
        state.queues[usize::from(queue)] = DeviceQueue {
            size,
            addresses: Some(addresses),
            ..DeviceQueue::default()
        };
    }

    fn notify(&mut self, queue: u16) {
        self.0.borrow_mut().notifications[usize::from(queue)] += 1;
    }

    fn config_generation(&mut self) -> u8 {
        self.0.borrow().generation
    }

    fn read_config_u8(&mut self, offset: usize) -> u8 {
        self.0.borrow().config.get(offset).copied().unwrap_or(0)
    }

    fn read_config_u32(&mut self, offset: usize) -> u32 {
        assert_eq!(offset % 4, 0, "misaligned 32-bit config access");
        let state = self.0.borrow();
        let bytes = state.config.get(offset..offset + 4).unwrap_or(&[0; 4]);
        u32::from_le_bytes(bytes.try_into().unwrap())
    }

    fn read_isr(&mut self) -> u8 {
        core::mem::take(&mut self.0.borrow_mut().isr)
    }
}

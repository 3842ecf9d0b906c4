//! The split virtqueue (VIRTIO 1.1 §2.6): descriptor table, available ring,
//! used ring.
//!
//! The driver writes descriptor chains into the table, puts each chain's
//! head into the available ring and publishes the ring's index; the device
//! returns finished chains (head id and bytes written) in the used ring.
//!
//! # What the queue trusts
//!
//! Nothing the device writes. The free list and each chain's links live in
//! driver-private memory (the descriptor table is written, never read
//! back). From the used ring:
//!
//! * an index that moves by more than the queue size (backwards, or
//!   forwards past anything that could have been made available) is
//!   counted in [`QueueStats::bad_used_index`] and nothing is consumed;
//! * an id out of range or naming no chain in flight (never given, or
//!   returned twice) is counted in [`QueueStats::unknown_ids`] and skipped;
//! * a length above the chain's device-writable bytes is counted in
//!   [`QueueStats::bad_lengths`] and reported as `None`.
//!
//! No panic and no memory access depends on a device-supplied value. A
//! duplicate id whose head has meanwhile been reused for a new chain cannot
//! be told from a real completion (as in any virtio driver): the caller then
//! sees that chain finish early, with whatever the buffer holds.
//!
//! # Memory ordering
//!
//! * Publishing (§2.6.13): descriptors and ring entries are written, then a
//!   release fence, then the available index ([`SplitQueue::publish`]).
//! * Notifying (§2.6.13.4): a full fence between the index store and the
//!   load of the used ring's flags, so the device's "no notify" is read
//!   after it could have seen the new index ([`SplitQueue::kick`]).
//! * Consuming (§2.6.14): the used index is read, then an acquire fence,
//!   then the entries and the buffers.
//!
//! The 16-bit ring indices wrap freely; positions are `index % size`, with
//! the size a power of two (so the wrap at 65536 keeps positions
//! continuous).
//!
//! # Interrupts
//!
//! Drivers poll: a queue starts with used-buffer notifications suppressed
//! (`VIRTQ_AVAIL_F_NO_INTERRUPT`, §2.6.7). An owner that wants to sleep
//! until the device returns a buffer (the image's idle path, for RX)
//! calls [`SplitQueue::enable_interrupts`], which clears the flag, then
//! re-reads the used index after a full fence and reports entries that
//! are already waiting: a buffer the device returned before it could see
//! the cleared flag raised no interrupt, so the caller must not sleep on
//! it. [`SplitQueue::disable_interrupts`] suppresses them again once
//! awake, so the busy loop is not interrupted. The flag is a hint
//! (§2.6.7.2: with it set the device "SHOULD NOT send a notification"),
//! which is enough: an interrupt only wakes the loop, which polls anyway.
//! This is the re-check loop of §2.6.14, split between the two calls.
//!
//! # Indirect descriptors
//!
//! With `VIRTIO_F_INDIRECT_DESC` negotiated, a driver may give the queue a
//! table of indirect descriptors ([`SplitQueue::enable_indirect`], §2.6.5.3):
//! a chain of several segments is then written into the table slot of its
//! head and takes one ring descriptor (flags `INDIRECT`, pointing at the
//! slot), so a frame gathered from a header, a payload in registered memory
//! and a trailer costs one descriptor instead of three and the ring holds
//! as many frames as it has descriptors. The slot is the head's, so it is
//! rewritten only after the device returned the chain.
//!
//! Notifications honour `VIRTQ_USED_F_NO_NOTIFY`; event indices
//! (`VIRTIO_F_EVENT_IDX`) are not negotiated, so the flags are the whole
//! mechanism in both directions.

use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{fence, Ordering};

use super::transport::{QueueAddresses, VirtioTransport};
use crate::dma::{DmaPool, DmaSlice};

/// Descriptor flag: the chain continues at `next`.
const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
const DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is a table of indirect descriptors.
const DESC_F_INDIRECT: u16 = 4;
/// Available ring flag: do not interrupt us.
const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used ring flag: the device does not want notifications now.
const USED_F_NO_NOTIFY: u16 = 1;
/// The largest queue size (§2.6).
pub const MAX_SIZE: u16 = 32768;
/// Marks the end of the free list.
const NONE: u16 = u16::MAX;

/// One buffer of a descriptor chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Bus address.
    pub address: u64,
    /// Length in bytes.
    pub len: u32,
    /// Whether the device writes (rather than reads) it.
    pub device_writes: bool,
}

/// A chain the device finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UsedElement {
    /// The chain's head descriptor (as returned by [`SplitQueue::push`]).
    pub head: u16,
    /// Bytes the device says it wrote, if no more than the chain's
    /// device-writable bytes; `None` if it claimed more.
    pub len: Option<u32>,
}

/// Why [`SplitQueue::push`] refused a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PushError {
    /// Not enough free descriptors now.
    Full,
    /// An empty chain, or one longer than the queue.
    BadChain,
}

/// Counters of what the device did wrong (and of notifications).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QueueStats {
    /// Used entries whose id was out of range or not in flight.
    pub unknown_ids: u64,
    /// Used entries claiming more bytes than the chain could take.
    pub bad_lengths: u64,
    /// Times the used index moved by more than the queue size.
    pub bad_used_index: u64,
    /// Doorbells rung.
    pub notifications: u64,
    /// Doorbells skipped because the device set `VIRTQ_USED_F_NO_NOTIFY`.
    pub suppressed_notifications: u64,
}

/// Driver-private state of a chain in flight, by head id.
#[derive(Clone, Copy, Debug, Default)]
struct Chain {
    /// Descriptors in the chain; 0 = the head is not in flight.
    descriptors: u16,
    /// Device-writable bytes.
    writable: u32,
}

/// A split virtqueue in DMA memory.
#[derive(Debug)]
pub struct SplitQueue {
    index: u16,
    size: u16,
    /// 16 bytes per descriptor: addr u64, len u32, flags u16, next u16.
    descriptors: DmaSlice,
    /// flags u16, idx u16, ring[size] u16 (no used_event).
    avail: DmaSlice,
    /// flags u16, idx u16, ring[size] {id u32, len u32} (no avail_event).
    used: DmaSlice,
    /// Free list and chain links (driver-private, never read from DMA).
    next: Vec<u16>,
    chains: Vec<Chain>,
    free_head: u16,
    free_count: u16,
    /// The next available index to write (published or not).
    avail_idx: u16,
    /// The available index the device was last shown.
    published_idx: u16,
    /// Whether entries were published since the last doorbell.
    unnotified: bool,
    /// The next used index to consume.
    last_used: u16,
    /// Whether `VIRTQ_AVAIL_F_NO_INTERRUPT` is clear (interrupts wanted).
    interrupts: bool,
    /// Indirect tables, one slot of `indirect_len` descriptors per head.
    indirect: Option<DmaSlice>,
    indirect_len: u16,
    stats: QueueStats,
}

impl SplitQueue {
    /// A queue of `size` descriptors (a power of two, at most
    /// [`MAX_SIZE`]) for device queue `index`, with its rings allocated
    /// from `pool`. Call [`enable`](Self::enable) to hand it to the device.
    ///
    /// # Errors
    ///
    /// [`InitError::QueueTooSmall`](super::InitError::QueueTooSmall) for a
    /// bad size, [`InitError::Dma`](super::InitError::Dma) if the pool is
    /// short.
    pub fn new(pool: &mut DmaPool, index: u16, size: u16) -> Result<Self, super::InitError> {
        if size == 0 || !size.is_power_of_two() || size > MAX_SIZE {
            return Err(super::InitError::QueueTooSmall(index));
        }
        let count = usize::from(size);
        let descriptors = pool.alloc(16 * count, 16)?;
        let avail = pool.alloc(4 + 2 * count, 2)?;
        let used = pool.alloc(4 + 8 * count, 4)?;
        avail.write_u16(0, AVAIL_F_NO_INTERRUPT);
        let mut next = vec![NONE; count];
        for (id, link) in next.iter_mut().enumerate().take(count - 1) {
            *link = id as u16 + 1;
        }
        Ok(Self {
            index,
            size,
            descriptors,
            avail,
            used,
            next,
            chains: vec![Chain::default(); count],
            free_head: 0,
            free_count: size,
            avail_idx: 0,
            published_idx: 0,
            unnotified: false,
            last_used: 0,
            interrupts: false,
            indirect: None,
            indirect_len: 0,
            stats: QueueStats::default(),
        })
    }

    /// Bytes [`enable_indirect`](Self::enable_indirect) takes from the pool
    /// for a queue of `size` with chains of up to `segments` segments.
    pub const fn indirect_bytes(size: u16, segments: u16) -> usize {
        16 * size as usize * segments as usize
    }

    /// Allocates one indirect table of `segments` descriptors per head from
    /// `pool`: from then on [`push`](Self::push) writes chains of 2 to
    /// `segments` segments there and uses one ring descriptor each. Only
    /// for a device that negotiated `VIRTIO_F_INDIRECT_DESC`.
    ///
    /// # Errors
    ///
    /// [`InitError::BadConfig`](super::InitError::BadConfig) for fewer than
    /// 2 segments, [`InitError::Dma`](super::InitError::Dma) if the pool is
    /// short.
    pub fn enable_indirect(
        &mut self,
        pool: &mut DmaPool,
        segments: u16,
    ) -> Result<(), super::InitError> {
        if segments < 2 {
            return Err(super::InitError::BadConfig);
        }
        self.indirect = Some(pool.alloc(Self::indirect_bytes(self.size, segments), 16)?);
        self.indirect_len = segments;
        Ok(())
    }

    /// Whether chains go through indirect tables.
    pub fn uses_indirect(&self) -> bool {
        self.indirect.is_some()
    }

    /// Tells the device where the rings are and enables the queue.
    pub fn enable<T: VirtioTransport + ?Sized>(&self, transport: &mut T) {
        transport.enable_queue(
            self.index,
            self.size,
            QueueAddresses {
                descriptors: self.descriptors.phys(),
                driver: self.avail.phys(),
                device: self.used.phys(),
            },
        );
    }

    /// The device's index of this queue.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Descriptors in the table.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Descriptors not in any chain.
    pub fn free_descriptors(&self) -> u16 {
        self.free_count
    }

    /// The head id the next [`push`](Self::push) will use, if any
    /// descriptor is free (for drivers that key per-chain memory by head).
    pub fn peek_head(&self) -> Option<u16> {
        (self.free_count > 0).then_some(self.free_head)
    }

    /// The counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Writes `segments` as one chain and appends its head to the
    /// available ring (not yet visible to the device: see
    /// [`publish`](Self::publish)). Returns the head id.
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] if fewer than `segments.len()` descriptors are
    /// free (one, for a chain that goes through an indirect table),
    /// [`PushError::BadChain`] if `segments` is empty or longer than
    /// the queue. Nothing is written then.
    pub fn push(&mut self, segments: &[Segment]) -> Result<u16, PushError> {
        if segments.is_empty() || segments.len() > usize::from(self.size) {
            return Err(PushError::BadChain);
        }
        if segments.len() >= 2 && segments.len() <= usize::from(self.indirect_len) {
            if self.free_count == 0 {
                return Err(PushError::Full);
            }
            if let Some(table) = self.indirect.take() {
                let head = self.push_indirect(&table, segments);
                self.indirect = Some(table);
                return Ok(head);
            }
        }
        if segments.len() > usize::from(self.free_count) {
            return Err(PushError::Full);
        }
        let head = self.free_head;
        let mut id = head;
        let mut writable = 0u32;
        for (position, segment) in segments.iter().enumerate() {
            let last = position + 1 == segments.len();
            let next = self.next[usize::from(id)];
            let mut flags = if last { 0 } else { DESC_F_NEXT };
            if segment.device_writes {
                flags |= DESC_F_WRITE;
                writable = writable.saturating_add(segment.len);
            }
            let offset = 16 * usize::from(id);
            self.descriptors.write_u64(offset, segment.address);
            self.descriptors.write_u32(offset + 8, segment.len);
            self.descriptors.write_u16(offset + 12, flags);
            self.descriptors
                .write_u16(offset + 14, if last { 0 } else { next });
            if last {
                self.free_head = next;
            } else {
                id = next;
            }
        }
        self.free_count -= segments.len() as u16;
        self.chains[usize::from(head)] = Chain {
            descriptors: segments.len() as u16,
            writable,
        };
        let slot = usize::from(self.avail_idx % self.size);
        self.avail.write_u16(4 + 2 * slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Ok(head)
    }

    /// Writes `segments` (2..=`indirect_len`, checked by the caller) into
    /// the indirect slot of the next free head and makes that head one
    /// descriptor pointing at it (§2.6.5.3.1: the table's descriptors
    /// chain by index within the table, none is itself indirect, and the
    /// ring descriptor has neither NEXT nor WRITE).
    fn push_indirect(&mut self, table: &DmaSlice, segments: &[Segment]) -> u16 {
        let head = self.free_head;
        let base = usize::from(head) * usize::from(self.indirect_len) * 16;
        let mut writable = 0u32;
        for (position, segment) in segments.iter().enumerate() {
            let last = position + 1 == segments.len();
            let mut flags = if last { 0 } else { DESC_F_NEXT };
            if segment.device_writes {
                flags |= DESC_F_WRITE;
                writable = writable.saturating_add(segment.len);
            }
            let offset = base + 16 * position;
            table.write_u64(offset, segment.address);
            table.write_u32(offset + 8, segment.len);
            table.write_u16(offset + 12, flags);
            table.write_u16(offset + 14, if last { 0 } else { position as u16 + 1 });
        }
        let offset = 16 * usize::from(head);
        self.descriptors.write_u64(offset, table.phys_at(base));
        self.descriptors
            .write_u32(offset + 8, 16 * segments.len() as u32);
        self.descriptors.write_u16(offset + 12, DESC_F_INDIRECT);
        self.descriptors.write_u16(offset + 14, 0);
        self.free_head = self.next[usize::from(head)];
        self.free_count -= 1;
        self.chains[usize::from(head)] = Chain {
            descriptors: 1,
            writable,
        };
        let slot = usize::from(self.avail_idx % self.size);
        self.avail.write_u16(4 + 2 * slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        head
    }

    /// Makes every pushed chain visible to the device: a release fence,
    /// then the available index. Cheap (no device access); the doorbell is
    /// [`kick`](Self::kick), so a burst publishes often and rings once.
    pub fn publish(&mut self) {
        if self.published_idx == self.avail_idx {
            return;
        }
        fence(Ordering::Release);
        self.avail.write_u16(2, self.avail_idx);
        self.published_idx = self.avail_idx;
        self.unnotified = true;
    }

    /// Rings the doorbell if chains were published since the last one and
    /// the device has not set `VIRTQ_USED_F_NO_NOTIFY`. Returns whether it
    /// rang.
    pub fn kick<T: VirtioTransport + ?Sized>(&mut self, transport: &mut T) -> bool {
        if !self.unnotified {
            return false;
        }
        self.unnotified = false;
        // The index store must be visible before we read the flags
        // (store-load ordering: a full fence).
        fence(Ordering::SeqCst);
        if self.used.read_u16(0) & USED_F_NO_NOTIFY != 0 {
            self.stats.suppressed_notifications += 1;
            return false;
        }
        transport.notify(self.index);
        self.stats.notifications += 1;
        true
    }

    /// Whether published chains still await a doorbell.
    pub fn kick_pending(&self) -> bool {
        self.unnotified
    }

    /// Whether the used ring has entries not yet consumed (they may turn
    /// out to be bogus).
    pub fn has_used(&self) -> bool {
        self.used.read_u16(2) != self.last_used
    }

    /// Asks the device to interrupt when it returns a buffer (clears
    /// `VIRTQ_AVAIL_F_NO_INTERRUPT`), then checks the used ring again.
    /// Returns `true` if used entries are already waiting: the device may
    /// have returned them before it saw the flag, without an interrupt,
    /// so the caller must poll instead of sleeping. `false` means that
    /// the next buffer the device returns will interrupt (while the flag
    /// stays clear).
    ///
    /// A full fence orders the flag's store before the used index's load;
    /// the device stores the used index before it reads the flag, so
    /// either it sees the flag clear (and interrupts) or we see its entry
    /// (§2.6.14).
    #[must_use = "entries already waiting raised no interrupt: poll them before sleeping"]
    pub fn enable_interrupts(&mut self) -> bool {
        if !self.interrupts {
            self.avail.write_u16(0, 0);
            self.interrupts = true;
        }
        fence(Ordering::SeqCst);
        self.has_used()
    }

    /// Suppresses used-buffer interrupts again (sets
    /// `VIRTQ_AVAIL_F_NO_INTERRUPT`): the state after [`new`](Self::new).
    pub fn disable_interrupts(&mut self) {
        if self.interrupts {
            self.avail.write_u16(0, AVAIL_F_NO_INTERRUPT);
            self.interrupts = false;
        }
    }

    /// Whether used-buffer interrupts are enabled
    /// ([`enable_interrupts`](Self::enable_interrupts)).
    pub fn interrupts_enabled(&self) -> bool {
        self.interrupts
    }

    /// Takes the next finished chain from the used ring and frees its
    /// descriptors. Bogus entries are counted and skipped (see the module
    /// docs); at most `size` entries are looked at per call.
    pub fn pop_used(&mut self) -> Option<UsedElement> {
        for _ in 0..self.size {
            let used_idx = self.used.read_u16(2);
            fence(Ordering::Acquire);
            let pending = used_idx.wrapping_sub(self.last_used);
            if pending == 0 {
                return None;
            }
            if pending > self.size {
                self.stats.bad_used_index += 1;
                return None;
            }
            let slot = 4 + 8 * usize::from(self.last_used % self.size);
            let id = self.used.read_u32(slot);
            let len = self.used.read_u32(slot + 4);
            self.last_used = self.last_used.wrapping_add(1);
            let Some(chain) = usize::try_from(id)
                .ok()
                .and_then(|id| self.chains.get(id))
                .copied()
                .filter(|chain| chain.descriptors != 0)
            else {
                self.stats.unknown_ids += 1;
                continue;
            };
            let head = id as u16;
            self.free_chain(head, chain.descriptors);
            let len = if len > chain.writable {
                self.stats.bad_lengths += 1;
                None
            } else {
                Some(len)
            };
            return Some(UsedElement { head, len });
        }
        None
    }

    /// Returns the chain at `head` (of `descriptors` links, walked in the
    /// private link array) to the free list.
    fn free_chain(&mut self, head: u16, descriptors: u16) {
        self.chains[usize::from(head)] = Chain::default();
        let mut tail = head;
        for _ in 1..descriptors {
            tail = self.next[usize::from(tail)];
        }
        self.next[usize::from(tail)] = self.free_head;
        self.free_head = head;
        self.free_count += descriptors;
    }
}

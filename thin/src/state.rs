//! The pool's state, shared by its volumes: the pool device, the map in
//! memory, the free extents, the map writer, and the routing of pool
//! completions to the volume requests that wait for them.

use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;

use hal::block::{BlockDevice, BufferAccess, Completion, DeviceInfo, IoError, Op, Request};

use crate::buffers::{PoolBuf, Resolve};
use crate::format::{encode_map, Entry, Layout, Superblock, BLOCK, ENTRIES_PER_BLOCK};
use crate::io::Slot;

/// Pool request tags: the kind in the top byte.
pub(crate) const TAG_SLOT: u64 = 1 << 56;
pub(crate) const TAG_MAP: u64 = 2 << 56;
pub(crate) const TAG_MAP_FLUSH: u64 = 3 << 56;
pub(crate) const TAG_SYNC: u64 = 4 << 56;
const TAG_KIND: u64 = 0xff << 56;

/// Metadata buffer 0: the scratch buffer of the pool's own IO at open.
pub(crate) const SCRATCH: u16 = 0;

/// What a virtual extent is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ext {
    /// Not allocated: reads zeroes.
    Unmapped,
    /// Backed by this physical extent.
    Mapped(u32),
    /// A write is filling this physical extent; mapped once its map entry
    /// is durable. Other requests on the extent wait.
    Allocating(u32),
    /// A discard or write-zeroes is freeing this physical extent. Other
    /// requests on the extent wait.
    Freeing(u32),
}

/// One map block's write state. Versions count in-memory modifications.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MapBlock {
    /// Modifications made in memory.
    pub(crate) version: u64,
    /// Version known durable on disk.
    pub(crate) durable: u64,
    /// Version of the last write that failed (waiters up to it fail).
    pub(crate) failed: u64,
    /// Version being written, if a write is in flight.
    pub(crate) writing: Option<u64>,
    /// Sequence number of the newest valid copy on disk, and which copy.
    pub(crate) seq: u64,
    pub(crate) copy: u64,
    /// In the dirty list.
    pub(crate) queued: bool,
}

/// A volume's state inside the pool.
pub(crate) struct VolState<H> {
    pub(crate) name: String,
    /// Index in the superblock's volume table (map entries say index + 1).
    pub(crate) table: u16,
    pub(crate) info: DeviceInfo,
    pub(crate) map: Vec<Ext>,
    pub(crate) slots: Vec<Option<Slot<H>>>,
    pub(crate) done: VecDeque<Completion<H>>,
    /// Set while the volume's handle lives.
    pub(crate) open: bool,
}

impl<H> VolState<H> {
    /// Requests accepted and not yet delivered.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count() + self.done.len()
    }
}

/// Everything a pool's volumes share.
pub(crate) struct PoolState<D, H> {
    pub(crate) device: D,
    pub(crate) pool_info: DeviceInfo,
    pub(crate) layout: Layout,
    pub(crate) superblock: Superblock,
    /// Which superblock copy holds the newest version.
    pub(crate) super_copy: u64,
    /// Who owns each physical extent: what the map blocks say once
    /// written. An allocation is entered only after its data is durable,
    /// so the table may be written at any time.
    pub(crate) owners: Vec<Entry>,
    pub(crate) blocks: Vec<MapBlock>,
    pub(crate) dirty: Vec<u32>,
    /// Free physical extents (a stack, lowest on top at open).
    pub(crate) free: Vec<u32>,
    /// Pool requests in flight per physical extent (a freed extent is
    /// reused only when none are).
    pub(crate) io_count: Vec<u32>,
    pub(crate) next_generation: u64,
    /// Metadata buffers: 0 is the scratch buffer, the rest map writes.
    pub(crate) meta: Vec<Vec<u8>>,
    /// Free map-write buffers, and the block each busy one is writing.
    pub(crate) meta_free: Vec<u16>,
    /// Forward tables of volumes in the table not yet opened (built at
    /// open by the check).
    pub(crate) claims: Vec<Option<Vec<u32>>>,
    pub(crate) volumes: Vec<VolState<H>>,
    /// Result of the one synchronous request at open.
    pub(crate) sync_result: Option<Result<(), IoError>>,
    pub(crate) stats: PoolStats,
}

/// What a pool has done since it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Extents allocated (their map entries durable).
    pub allocations: u64,
    /// Extents freed (their cleared entries durable).
    pub frees: u64,
    /// Writes refused with ENOSPC for want of a free extent.
    pub enospc: u64,
    /// Map block writes completed.
    pub map_writes: u64,
}

impl<D: BlockDevice<PoolBuf<H>>, H: Copy> PoolState<D, H> {
    /// Extents in use.
    pub(crate) fn allocated(&self) -> u32 {
        self.layout.extent_count - self.free.len() as u32
    }

    /// Records a change of `physical`'s entry and returns the version of
    /// its map block a waiter needs durable.
    pub(crate) fn set_owner(&mut self, physical: u32, entry: Entry) -> (u32, u64) {
        self.owners[physical as usize] = entry;
        let block = physical / ENTRIES_PER_BLOCK;
        let state = &mut self.blocks[block as usize];
        state.version += 1;
        if !state.queued {
            state.queued = true;
            // Cannot exceed: capacity is the block count, each queued once.
            self.dirty.push(block);
        }
        (block, state.version)
    }

    /// Starts writes of dirty map blocks that have no write in flight, as
    /// far as map-write buffers and the pool queue allow. Each write goes
    /// to the copy not holding the newest valid version.
    pub(crate) fn write_maps<A: BufferAccess<H> + ?Sized>(&mut self, buffers: &mut A) {
        let mut index = 0;
        while index < self.dirty.len() {
            let block = self.dirty[index];
            let state = self.blocks[block as usize];
            if state.writing.is_some() || state.version <= state.durable.max(state.failed) {
                if state.writing.is_none() {
                    self.blocks[block as usize].queued = false;
                    self.dirty.swap_remove(index);
                } else {
                    index += 1;
                }
                continue;
            }
            let Some(&buffer) = self.meta_free.last() else {
                return;
            };
            let first = (block * ENTRIES_PER_BLOCK) as usize;
            let last = (first + ENTRIES_PER_BLOCK as usize).min(self.owners.len());
            let copy = state.copy ^ 1;
            encode_map(
                &mut self.meta[usize::from(buffer)],
                block,
                state.seq + 1,
                &self.owners[first..last],
            );
            let fua = self.pool_info.volatile_write_cache && self.pool_info.fua;
            let request = Request {
                tag: TAG_MAP | u64::from(block) << 16 | u64::from(buffer),
                op: Op::Write {
                    offset: self.layout.map_offset(block, copy),
                    len: BLOCK as u32,
                    buffer: PoolBuf::Meta(buffer),
                    fua,
                },
            };
            let mut resolve = Resolve::new(buffers, &mut self.meta);
            if self.device.submit(request, &mut resolve).is_err() {
                return; // queue full (or refused): retried on the next pass
            }
            self.meta_free.pop();
            self.blocks[block as usize].writing = Some(state.version);
            index += 1;
        }
    }

    /// A map write (or the flush after it) finished.
    fn map_written<A: BufferAccess<H> + ?Sized>(
        &mut self,
        tag: u64,
        result: Result<(), IoError>,
        buffers: &mut A,
    ) {
        let block = ((tag >> 16) & 0xffff_ffff) as u32;
        let buffer = (tag & 0xffff) as u16;
        let needs_flush = self.pool_info.volatile_write_cache && !self.pool_info.fua;
        if tag & TAG_KIND == TAG_MAP && result.is_ok() && needs_flush {
            let request = Request {
                tag: TAG_MAP_FLUSH | (tag & !TAG_KIND),
                op: Op::Flush,
            };
            let mut resolve = Resolve::new(buffers, &mut self.meta);
            if self.device.submit(request, &mut resolve).is_ok() {
                return;
            }
            // The flush could not start: report the write as failed.
            return self.map_done(block, buffer, Err(IoError::device()));
        }
        self.map_done(block, buffer, result);
    }

    fn map_done(&mut self, block: u32, buffer: u16, result: Result<(), IoError>) {
        self.meta_free.push(buffer);
        let state = &mut self.blocks[block as usize];
        let Some(version) = state.writing.take() else {
            return;
        };
        match result {
            Ok(()) => {
                self.stats.map_writes += 1;
                state.durable = version;
                state.seq += 1;
                state.copy ^= 1;
            }
            Err(_) => state.failed = version,
        }
        if state.version > state.durable && !state.queued {
            state.queued = true;
            self.dirty.push(block);
        }
    }

    /// Collects pool completions, moves every waiting request on, writes
    /// dirty map blocks. `now` is passed to the pool device.
    pub(crate) fn pump<A: BufferAccess<H> + ?Sized>(&mut self, now: u64, buffers: &mut A) {
        let mut finished: [(u64, Result<(), IoError>); 32] = [(0, Ok(())); 32];
        // Bounded: a few rounds while the pool has completions due now.
        for _ in 0..4 {
            let mut count = 0;
            let delivered = {
                let mut resolve = Resolve::new(&mut *buffers, &mut self.meta);
                let volumes = &mut self.volumes;
                let sync = &mut self.sync_result;
                self.device.poll(
                    now,
                    &mut resolve,
                    finished.len(),
                    &mut |done| match done.tag & TAG_KIND {
                        TAG_SLOT => {
                            let volume = ((done.tag >> 32) & 0xffff) as usize;
                            let slot = (done.tag & 0xffff_ffff) as usize;
                            if let Some(Some(slot)) =
                                volumes.get_mut(volume).and_then(|v| v.slots.get_mut(slot))
                            {
                                slot.pool_done(done.result);
                            }
                        }
                        TAG_SYNC => *sync = Some(done.result),
                        _ => {
                            finished[count] = (done.tag, done.result);
                            count += 1;
                        }
                    },
                )
            };
            for &(tag, result) in &finished[..count] {
                self.map_written(tag, result, buffers);
            }
            self.advance_all(buffers);
            self.write_maps(buffers);
            if delivered == 0 || self.device.poll_at().is_none_or(|t| t > now) {
                break;
            }
        }
    }

    /// Moves every active request of every volume on as far as it goes.
    pub(crate) fn advance_all<A: BufferAccess<H> + ?Sized>(&mut self, buffers: &mut A) {
        for volume in 0..self.volumes.len() {
            for slot in 0..self.volumes[volume].slots.len() {
                self.advance(volume, slot, buffers);
            }
        }
    }
}

//! Opening a pool: read (or format) the superblock, read every map block,
//! and the check that settles what a crash left: entries of unknown
//! volumes or beyond a volume's end, and a virtual extent claimed by two
//! physical extents (the newer generation wins), are reclaimed and
//! reported. Also registering a volume in the superblock. All of it runs
//! synchronously against the pool device before any volume IO.

use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use hal::block::{BlockDevice, Op, Request, SubmitError};

use crate::buffers::{NoCaller, PoolBuf, Resolve};
use crate::format::{
    decode_map, map_entry, newer, Entry, Layout, Superblock, VolumeEntry, BLOCK, ENTRIES_PER_BLOCK,
};
use crate::state::{Ext, MapBlock, PoolState, VolState, SCRATCH, TAG_SYNC};
use crate::{OpenReport, PoolConfig, ThinError};

/// Most bytes one metadata read at open moves.
const READ_CHUNK: u32 = 1 << 20;

impl<D: BlockDevice<PoolBuf<H>>, H: Copy> PoolState<D, H> {
    /// Runs one pool request to completion (open-time only: nothing else
    /// is in flight). Data moves through the scratch buffer.
    fn sync(&mut self, op: Op<PoolBuf<H>>) -> Result<(), ThinError> {
        let request = Request { tag: TAG_SYNC, op };
        self.sync_result = None;
        let mut none = NoCaller;
        loop {
            let mut resolve = Resolve::new(&mut none, &mut self.meta);
            match self.device.submit(request, &mut resolve) {
                Ok(()) => break,
                Err(SubmitError::QueueFull) => {
                    self.pump(0, &mut NoCaller);
                    core::hint::spin_loop();
                }
                Err(error) => return Err(ThinError::Device(format!("{:?}: {error}", op.kind()))),
            }
        }
        loop {
            self.pump(0, &mut NoCaller);
            if let Some(result) = self.sync_result.take() {
                return result
                    .map_err(|error| ThinError::Device(format!("{:?}: {error}", op.kind())));
            }
            core::hint::spin_loop();
        }
    }

    fn read_scratch(&mut self, offset: u64, len: u32) -> Result<(), ThinError> {
        self.sync(Op::Read {
            offset,
            len,
            buffer: PoolBuf::Meta(SCRATCH),
        })
    }

    /// Writes the superblock (sequence + 1) to the copy not holding the
    /// newest version, durably.
    pub(crate) fn write_superblock(&mut self) -> Result<(), ThinError> {
        let mut superblock = self.superblock.clone();
        superblock.seq += 1;
        superblock.encode(&mut self.meta[usize::from(SCRATCH)]);
        let copy = self.super_copy ^ 1;
        self.write_scratch_durably(Layout::super_offset(copy))?;
        self.superblock = superblock;
        self.super_copy = copy;
        Ok(())
    }

    fn write_scratch_durably(&mut self, offset: u64) -> Result<(), ThinError> {
        let fua = self.pool_info.fua;
        self.sync(Op::Write {
            offset,
            len: BLOCK as u32,
            buffer: PoolBuf::Meta(SCRATCH),
            fua,
        })?;
        if self.pool_info.volatile_write_cache && !fua {
            self.sync(Op::Flush)?;
        }
        Ok(())
    }

    /// Reads both copies of every map block, fills `owners` and the block
    /// states.
    fn read_map(&mut self) -> Result<(), ThinError> {
        let per_read = (READ_CHUNK.min(self.pool_info.max_transfer) / BLOCK as u32).max(1);
        let mut first = 0;
        while first < self.layout.map_blocks {
            let count = per_read.min(self.layout.map_blocks - first);
            let len = count * BLOCK as u32;
            let mut copies = [Vec::new(), Vec::new()];
            for (copy, bytes) in copies.iter_mut().enumerate() {
                self.read_scratch(self.layout.map_offset(first, copy as u64), len)?;
                bytes.extend_from_slice(&self.meta[usize::from(SCRATCH)][..len as usize]);
            }
            for index in 0..count {
                let block = first + index;
                let range = index as usize * BLOCK..(index as usize + 1) * BLOCK;
                let a = &copies[0][range.clone()];
                let b = &copies[1][range];
                let chosen = newer(decode_map(a, block), decode_map(b, block), |s| *s, true)
                    .map_err(|why| ThinError::Format(format!("map block {block}: {why}")))?;
                let Some((seq, copy)) = chosen else {
                    continue;
                };
                let bytes = if copy == 0 { a } else { b };
                let state = &mut self.blocks[block as usize];
                state.seq = seq;
                state.copy = copy;
                let base = block * ENTRIES_PER_BLOCK;
                for slot in 0..ENTRIES_PER_BLOCK {
                    let physical = base + slot;
                    if physical >= self.layout.extent_count {
                        break;
                    }
                    self.owners[physical as usize] = map_entry(bytes, slot as usize);
                }
            }
            first += count;
        }
        Ok(())
    }

    /// The check: builds every volume's forward table from the owners,
    /// reclaims what no live volume can own, writes the repaired blocks,
    /// builds the free list. Returns the extents reclaimed.
    fn check(&mut self) -> Result<u32, ThinError> {
        let extent = u64::from(self.layout.extent_size);
        let mut claims: Vec<Vec<u32>> = self
            .superblock
            .volumes
            .iter()
            .map(|v| vec![u32::MAX; v.size.div_ceil(extent) as usize])
            .collect();
        let mut reclaim = Vec::new();
        let mut max_generation = 0;
        for physical in 0..self.layout.extent_count {
            let entry = self.owners[physical as usize];
            if entry.volume == 0 {
                continue;
            }
            max_generation = max_generation.max(entry.generation);
            let slot = claims
                .get_mut(usize::from(entry.volume - 1))
                .and_then(|table| table.get_mut(entry.virtual_extent as usize));
            let Some(slot) = slot else {
                reclaim.push(physical);
                continue;
            };
            if *slot == u32::MAX {
                *slot = physical;
                continue;
            }
            let other = *slot;
            if self.owners[other as usize].generation < entry.generation {
                *slot = physical;
                reclaim.push(other);
            } else {
                reclaim.push(physical);
            }
        }
        for &physical in &reclaim {
            self.set_owner(physical, Entry::FREE);
        }
        self.next_generation = max_generation + 1;
        self.write_dirty_maps()?;
        self.free = (0..self.layout.extent_count)
            .rev()
            .filter(|&p| self.owners[p as usize].volume == 0)
            .collect();
        self.claims = claims.into_iter().map(Some).collect();
        Ok(reclaim.len() as u32)
    }

    /// Writes every dirty map block, synchronously.
    fn write_dirty_maps(&mut self) -> Result<(), ThinError> {
        while let Some(block) = self.dirty.pop() {
            let first = (block * ENTRIES_PER_BLOCK) as usize;
            let last = (first + ENTRIES_PER_BLOCK as usize).min(self.owners.len());
            let state = self.blocks[block as usize];
            crate::format::encode_map(
                &mut self.meta[usize::from(SCRATCH)],
                block,
                state.seq + 1,
                &self.owners[first..last],
            );
            self.write_scratch_durably(self.layout.map_offset(block, state.copy ^ 1))?;
            let state = &mut self.blocks[block as usize];
            state.seq += 1;
            state.copy ^= 1;
            state.durable = state.version;
            state.queued = false;
        }
        Ok(())
    }

    /// Opens (formatting a blank device) and checks a pool.
    pub(crate) fn open(device: D, config: &PoolConfig) -> Result<(Self, OpenReport), ThinError> {
        let pool_info = device.info();
        if BLOCK as u32 % pool_info.logical_block_size.max(1) != 0 {
            return Err(ThinError::Config(format!(
                "pool logical block size {} does not divide the 4096-byte metadata block",
                pool_info.logical_block_size
            )));
        }
        if !pool_info.write_zeroes || pool_info.read_only {
            return Err(ThinError::Config(
                "pool device must be writable and support write-zeroes".into(),
            ));
        }
        if pool_info.max_transfer < BLOCK as u32 {
            return Err(ThinError::Config("pool transfers under 4096 bytes".into()));
        }
        let scratch = READ_CHUNK.min(pool_info.max_transfer) as usize / BLOCK * BLOCK;
        let mut meta = vec![vec![0u8; scratch]];
        let writers = config.map_writers.clamp(1, 1024);
        meta.extend((0..writers).map(|_| vec![0u8; BLOCK]));
        let mut pool = Self {
            device,
            pool_info,
            layout: Layout {
                extent_size: config.extent_size,
                extent_count: 0,
                map_blocks: 0,
                data_start: 0,
            },
            superblock: Superblock {
                seq: 0,
                pool_size: pool_info.size,
                layout: Layout::for_pool(pool_info.size, config.extent_size).ok_or_else(|| {
                    ThinError::Config(format!(
                        "pool of {} bytes holds no {}-byte extent after its metadata",
                        pool_info.size, config.extent_size
                    ))
                })?,
                volumes: heapless::Vec::new(),
            },
            super_copy: 1,
            owners: Vec::new(),
            blocks: Vec::new(),
            dirty: Vec::new(),
            free: Vec::new(),
            io_count: Vec::new(),
            next_generation: 1,
            meta,
            meta_free: (1..=writers as u16).collect(),
            claims: Vec::new(),
            volumes: Vec::with_capacity(crate::format::MAX_VOLUMES),
            sync_result: None,
            stats: crate::state::PoolStats::default(),
        };
        pool.read_scratch(0, 2 * BLOCK as u32)?;
        let head = &pool.meta[usize::from(SCRATCH)];
        let chosen = newer(
            Superblock::decode(&head[..BLOCK]),
            Superblock::decode(&head[BLOCK..2 * BLOCK]),
            |s| s.seq,
            false,
        )
        .map_err(|why| ThinError::Format(format!("superblock: {why} (not a Brick pool?)")))?;
        let formatted = chosen.is_none();
        match chosen {
            Some((superblock, copy)) => {
                if superblock.pool_size > pool_info.size {
                    return Err(ThinError::Format(format!(
                        "pool was made for {} bytes, the device has {}",
                        superblock.pool_size, pool_info.size
                    )));
                }
                pool.superblock = superblock;
                pool.super_copy = copy;
            }
            None => pool.write_superblock()?,
        }
        pool.layout = pool.superblock.layout;
        let extents = pool.layout.extent_count as usize;
        pool.owners = vec![Entry::FREE; extents];
        pool.blocks = vec![MapBlock::default(); pool.layout.map_blocks as usize];
        pool.dirty = Vec::with_capacity(pool.layout.map_blocks as usize);
        pool.io_count = vec![0; extents];
        pool.free = Vec::with_capacity(extents);
        pool.read_map()?;
        let reclaimed = pool.check()?;
        let report = OpenReport {
            formatted,
            extents: pool.layout.extent_count,
            allocated: pool.allocated(),
            reclaimed,
        };
        Ok((pool, report))
    }

    /// Opens volume `name` of `size` bytes with `queue_depth` slots,
    /// registering it in the superblock if new (or grown). Returns its
    /// index.
    pub(crate) fn open_volume(
        &mut self,
        name: &str,
        size: u64,
        queue_depth: u32,
    ) -> Result<usize, ThinError> {
        let block = u64::from(self.pool_info.logical_block_size.max(1));
        if size == 0 || size % block != 0 {
            return Err(ThinError::Config(format!(
                "volume {name}: size {size} is not a non-zero multiple of the pool block {block}"
            )));
        }
        // Registering may write the superblock, which polls the pool
        // device with no caller buffers: no volume IO may be in flight.
        if self.volumes.iter().any(|v| v.in_flight() > 0) {
            return Err(ThinError::Config(format!(
                "volume {name}: open every volume of a pool before its IO starts \
                 (requests are in flight)"
            )));
        }
        if self.volumes.iter().any(|v| v.name == name && v.open) {
            return Err(ThinError::Config(format!("volume {name} is already open")));
        }
        let extent = u64::from(self.layout.extent_size);
        let extents = size.div_ceil(extent) as usize;
        let found = self
            .superblock
            .volumes
            .iter()
            .position(|v| v.name() == name.as_bytes());
        let live = self.volumes.iter().position(|v| v.name == name);
        let table = match (found, live) {
            (Some(index), Some(live)) => {
                // Opened before in this process: its map is the live one.
                let old = &self.volumes[live];
                if old.in_flight() > 0 {
                    return Err(ThinError::Config(format!(
                        "volume {name} still has requests in flight"
                    )));
                }
                if old.map.iter().skip(extents).any(|e| *e != Ext::Unmapped) {
                    return Err(ThinError::Config(format!(
                        "volume {name}: extents allocated beyond the new size {size}: \
                         shrinking it would lose data"
                    )));
                }
                let mut map = core::mem::take(&mut self.volumes[live].map);
                map.resize(extents, Ext::Unmapped);
                if self.superblock.volumes[index].size != size {
                    self.superblock.volumes[index].size = size;
                    self.write_superblock()?;
                }
                (index, map)
            }
            (Some(index), None) => {
                let table = self.claims[index].take().unwrap_or_default();
                if table.iter().skip(extents).any(|&p| p != u32::MAX) {
                    self.claims[index] = Some(table);
                    return Err(ThinError::Config(format!(
                        "volume {name}: extents allocated beyond the new size {size}: \
                         shrinking it would lose data"
                    )));
                }
                let old = self.superblock.volumes[index].size;
                if old != size {
                    self.superblock.volumes[index].size = size;
                    self.write_superblock()?;
                }
                let mut map: Vec<Ext> = table
                    .iter()
                    .take(extents)
                    .map(|&p| {
                        if p == u32::MAX {
                            Ext::Unmapped
                        } else {
                            Ext::Mapped(p)
                        }
                    })
                    .collect();
                map.resize(extents, Ext::Unmapped);
                (index, map)
            }
            (None, _) => {
                let entry = VolumeEntry::new(name, size).ok_or_else(|| {
                    ThinError::Config(format!(
                        "volume name {name:?} is empty or over {} bytes",
                        crate::format::MAX_NAME
                    ))
                })?;
                self.superblock.volumes.push(entry).map_err(|_| {
                    ThinError::Config(format!(
                        "pool holds {} volumes already",
                        crate::format::MAX_VOLUMES
                    ))
                })?;
                self.claims.push(None);
                self.write_superblock()?;
                (
                    self.superblock.volumes.len() - 1,
                    vec![Ext::Unmapped; extents],
                )
            }
        };
        let depth = queue_depth.clamp(1, 1 << 16);
        let max_transfer = self.pool_info.max_transfer.min(self.layout.extent_size);
        let info = hal::block::DeviceInfo {
            size,
            logical_block_size: self.pool_info.logical_block_size,
            physical_block_size: self.pool_info.physical_block_size,
            max_transfer: max_transfer - max_transfer % block as u32,
            queue_depth: depth,
            volatile_write_cache: self.pool_info.volatile_write_cache,
            fua: self.pool_info.fua,
            // Whole extents are freed, the rest of a range zeroed, so every
            // block of a discarded range reads zeroes: advertising the
            // extent as the granule would let the block layer (RNBD's
            // server trims to granules) drop the partial parts instead.
            discard: Some(hal::block::DiscardInfo {
                granularity: self.pool_info.logical_block_size,
                zeroes_data: true,
            }),
            write_zeroes: true,
            read_only: false,
        };
        let state = VolState {
            name: String::from(name),
            table: table.0 as u16,
            info,
            map: table.1,
            slots: vec![None; depth as usize],
            done: VecDeque::with_capacity(depth as usize),
            open: true,
        };
        if let Some(index) = self.volumes.iter().position(|v| v.name == name) {
            self.volumes[index] = state;
            Ok(index)
        } else {
            self.volumes.push(state);
            Ok(self.volumes.len() - 1)
        }
    }
}

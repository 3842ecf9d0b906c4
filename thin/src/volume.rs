//! The handles: [`Pool`] (open, check, add volumes) and [`ThinVolume`]
//! (a [`BlockDevice`] over the pool).

use alloc::rc::{Rc, Weak};
use alloc::string::String;
use core::cell::RefCell;

use hal::block::{BlockDevice, BufferAccess, Completion, DeviceInfo, Request, SubmitError};

use crate::buffers::PoolBuf;
use crate::format::DEFAULT_EXTENT;
use crate::io::Slot;
use crate::state::{Ext, PoolState, PoolStats};

/// How to open a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Extent size for a pool formatted now (an existing pool keeps its
    /// own): a multiple of 4096.
    pub extent_size: u32,
    /// Map blocks that may be written at once (a 4 KiB buffer each).
    pub map_writers: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            extent_size: DEFAULT_EXTENT,
            map_writers: 16,
        }
    }
}

/// What opening a pool found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenReport {
    /// The device was blank and has been formatted.
    pub formatted: bool,
    /// Data extents in the pool.
    pub extents: u32,
    /// Extents allocated after the check.
    pub allocated: u32,
    /// Extents the check reclaimed (owned by no volume that can hold them,
    /// or the older of two claims on one virtual extent).
    pub reclaimed: u32,
}

impl core::fmt::Display for OpenReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} extents, {} allocated, {} reclaimed by the check{}",
            self.extents,
            self.allocated,
            self.reclaimed,
            if self.formatted {
                ", newly formatted"
            } else {
                ""
            }
        )
    }
}

/// Why a pool or volume did not open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThinError {
    /// The pool device failed or refused a request.
    Device(String),
    /// The metadata on the pool is not valid.
    Format(String),
    /// The configuration or the device does not fit.
    Config(String),
}

impl core::fmt::Display for ThinError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Device(why) => write!(f, "pool device: {why}"),
            Self::Format(why) => write!(f, "pool metadata: {why}"),
            Self::Config(why) => write!(f, "{why}"),
        }
    }
}

impl core::error::Error for ThinError {}

/// A pool: the device and its map, shared by its volumes.
pub struct Pool<D, H> {
    state: Rc<RefCell<PoolState<D, H>>>,
}

/// A pool handle that does not keep the pool open (for a registry of open
/// pools that its volumes share).
pub struct WeakPool<D, H> {
    state: Weak<RefCell<PoolState<D, H>>>,
}

impl<D, H> WeakPool<D, H> {
    /// The pool, if a [`Pool`] or one of its volumes still holds it.
    pub fn upgrade(&self) -> Option<Pool<D, H>> {
        self.state.upgrade().map(|state| Pool { state })
    }
}

impl<D, H> Pool<D, H> {
    /// A handle that does not keep the pool open.
    pub fn downgrade(&self) -> WeakPool<D, H> {
        WeakPool {
            state: Rc::downgrade(&self.state),
        }
    }
}

impl<D, H> Clone for Pool<D, H> {
    fn clone(&self) -> Self {
        Self {
            state: Rc::clone(&self.state),
        }
    }
}

impl<D: BlockDevice<PoolBuf<H>>, H: Copy> Pool<D, H> {
    /// Opens the pool on `device`: formats a blank device, else reads the
    /// superblock and every map block and runs the check (module docs).
    ///
    /// # Errors
    /// [`ThinError`]: the device failed, is not a pool (a superblock that
    /// is neither blank nor valid), or its map is corrupt in both copies.
    pub fn open(device: D, config: &PoolConfig) -> Result<(Self, OpenReport), ThinError> {
        let (state, report) = PoolState::open(device, config)?;
        Ok((
            Self {
                state: Rc::new(RefCell::new(state)),
            },
            report,
        ))
    }

    /// Opens volume `name` of `size` bytes with room for `queue_depth`
    /// requests; a new name is registered in the superblock (a durable
    /// write). Growing a volume is allowed, shrinking only if nothing is
    /// allocated beyond the new end.
    ///
    /// # Errors
    /// [`ThinError::Config`] for a bad size or name, a full volume table,
    /// a volume already open; [`ThinError::Device`] if the superblock
    /// write fails.
    pub fn volume(
        &self,
        name: &str,
        size: u64,
        queue_depth: u32,
    ) -> Result<ThinVolume<D, H>, ThinError> {
        let index = self
            .state
            .try_borrow_mut()
            .map_err(|_| ThinError::Config("pool busy".into()))?
            .open_volume(name, size, queue_depth)?;
        Ok(ThinVolume {
            pool: self.clone(),
            index,
        })
    }

    /// Data extents in the pool.
    pub fn extent_count(&self) -> u32 {
        self.state.borrow().layout.extent_count
    }

    /// Free extents.
    pub fn free_extents(&self) -> u32 {
        self.state.borrow().free.len() as u32
    }

    /// What the pool has done since it opened.
    pub fn stats(&self) -> PoolStats {
        self.state.borrow().stats
    }

    /// The extent size in bytes.
    pub fn extent_size(&self) -> u32 {
        self.state.borrow().layout.extent_size
    }

    /// Runs `f` on the pool device (for inspection and tests).
    pub fn with_device<R>(&self, f: impl FnOnce(&D) -> R) -> R {
        f(&self.state.borrow().device)
    }
}

/// A thin volume: a [`BlockDevice`] whose extents come from its pool.
pub struct ThinVolume<D, H> {
    pool: Pool<D, H>,
    index: usize,
}

impl<D: BlockDevice<PoolBuf<H>>, H: Copy> ThinVolume<D, H> {
    /// The pool.
    pub fn pool(&self) -> &Pool<D, H> {
        &self.pool
    }

    /// Calls `f(virtual, physical)` for each allocated extent, in virtual
    /// order (extents being freed count as allocated until they are).
    pub fn extents(&self, mut f: impl FnMut(u32, u32)) {
        let state = self.pool.state.borrow();
        for (index, ext) in state.volumes[self.index].map.iter().enumerate() {
            if let Ext::Mapped(p) | Ext::Freeing(p) = *ext {
                f(index as u32, p);
            }
        }
    }

    /// Allocated extents.
    pub fn allocated(&self) -> u32 {
        let mut count = 0;
        self.extents(|_, _| count += 1);
        count
    }
}

impl<D, H> Drop for ThinVolume<D, H> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.pool.state.try_borrow_mut() {
            if let Some(volume) = state.volumes.get_mut(self.index) {
                volume.open = false;
            }
        }
    }
}

impl<D: BlockDevice<PoolBuf<H>>, H: Copy> BlockDevice<H> for ThinVolume<D, H> {
    fn info(&self) -> DeviceInfo {
        self.pool.state.borrow().volumes[self.index].info
    }

    fn submit<A: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        let mut state = self.pool.state.borrow_mut();
        let volume = &mut state.volumes[self.index];
        volume.info.check(&request.op)?;
        if volume.in_flight() >= volume.info.queue_depth as usize {
            return Err(SubmitError::QueueFull);
        }
        let Some(slot) = volume.slots.iter().position(Option::is_none) else {
            return Err(SubmitError::QueueFull);
        };
        volume.slots[slot] = Some(Slot::new(request));
        state.advance(self.index, slot, buffers);
        state.write_maps(buffers);
        Ok(())
    }

    fn poll<A: BufferAccess<H> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize {
        let mut state = self.pool.state.borrow_mut();
        state.pump(now, buffers);
        let done = &mut state.volumes[self.index].done;
        let mut delivered = 0;
        while delivered < max {
            let Some(completion) = done.pop_front() else {
                break;
            };
            on_completion(completion);
            delivered += 1;
        }
        delivered
    }

    fn poll_at(&self) -> Option<u64> {
        let state = self.pool.state.borrow();
        if !state.volumes[self.index].done.is_empty() {
            return Some(0);
        }
        state.device.poll_at()
    }

    fn in_flight(&self) -> usize {
        self.pool.state.borrow().volumes[self.index].in_flight()
    }

    fn readable_fd(&self) -> Option<i32> {
        self.pool.state.borrow().device.readable_fd()
    }
}

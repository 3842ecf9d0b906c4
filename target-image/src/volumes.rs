//! The volumes: every volume is a [`BlockDevice`] over [`Chunk`] handles
//! (a chunk's data area in the registered memory of one interface's HCA),
//! RAM ([`RamVolume`]) or a device ([`RamOr`]), what RNBD announces for it
//! ([`volume_info`]), the engine's per-volume counters and the
//! [`BufferAccess`] through which a device reaches the chunks of every HCA
//! (`ChunkMemory`).

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

use hal::block::ram::RamDisk;
use hal::block::{
    BlockDevice, BufferAccess, BufferError, Completion as DeviceCompletion, DeviceInfo,
    Request as DeviceRequest, SubmitError,
};
use manifest::binary::Backing;
use rnbd::server::{DiscardLimits, VolumeId, VolumeInfo};
use verbs::MemoryHandle;

use crate::io_state::ParkedQueue;
use crate::port::Port;
use crate::BuildError;

/// Completions a RAM volume holds between two polls (a batch bound: when
/// it is full the engine parks further requests, which have room for every
/// request the manifest admits, [`max_requests`](crate::max_requests)).
pub const RAM_QUEUE: usize = 1024;

/// Largest discard advertised, in 512-byte sectors (8 MiB: a RAM volume
/// zeroes it within one poll).
pub(crate) const MAX_DISCARD_SECTORS: u32 = 16 * 1024;

/// A chunk's data area as a volume sees it: the interface (RTRS port)
/// whose registered memory holds it and the memory handle. Volumes reach the bytes only
/// through the engine's [`BufferAccess`], which checks both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// Interface (HCA) index.
    pub port: usize,
    /// The chunk's data area.
    pub handle: MemoryHandle,
}

/// A RAM volume: zeroed at boot, completes within the poll that submits.
pub type RamVolume = RamDisk<Vec<u8>, Chunk, RAM_QUEUE>;

/// A volume that is RAM or a device `D` (files and block devices when
/// hosted, virtio-blk in the image): one type for all of an engine's
/// volumes, every call delegated.
pub enum RamOr<D> {
    /// Zeroed RAM (boxed: its completion queue is inline).
    Ram(Box<RamVolume>),
    /// The other kind.
    Device(D),
}

impl<D: BlockDevice<Chunk>> BlockDevice<Chunk> for RamOr<D> {
    fn info(&self) -> DeviceInfo {
        match self {
            Self::Ram(device) => device.info(),
            Self::Device(device) => device.info(),
        }
    }

    fn submit<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        request: DeviceRequest<Chunk>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        match self {
            Self::Ram(device) => device.submit(request, buffers),
            Self::Device(device) => device.submit(request, buffers),
        }
    }

    fn poll<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(DeviceCompletion<Chunk>),
    ) -> usize {
        match self {
            Self::Ram(device) => device.poll(now, buffers, max, on_completion),
            Self::Device(device) => device.poll(now, buffers, max, on_completion),
        }
    }

    fn poll_at(&self) -> Option<u64> {
        match self {
            Self::Ram(device) => device.poll_at(),
            Self::Device(device) => device.poll_at(),
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            Self::Ram(device) => device.in_flight(),
            Self::Device(device) => device.in_flight(),
        }
    }

    fn readable_fd(&self) -> Option<i32> {
        match self {
            Self::Ram(device) => device.readable_fd(),
            Self::Device(device) => device.readable_fd(),
        }
    }
}

/// Builds the RAM volume a manifest entry asks for; every other kind is
/// refused (the hosted runner and the image open theirs).
///
/// # Errors
/// [`BuildError::Volume`] for a kind that is not RAM or a size this machine
/// cannot hold.
pub fn ram_volume(volume: &manifest::binary::Volume<'_>) -> Result<RamVolume, BuildError> {
    let Backing::Ram { size } = volume.backing else {
        return Err(BuildError::Volume(
            volume.name.into(),
            alloc::format!(
                "kind {} is not served by this engine (RAM only)",
                volume.backing.kind().as_str()
            ),
        ));
    };
    let bytes = usize::try_from(size)
        .map_err(|_| BuildError::Volume(volume.name.into(), "does not fit in memory".into()))?;
    Ok(RamDisk::new(alloc::vec![0; bytes]))
}

/// What RNBD announces for a device: geometry from the device, write cache
/// and FUA as the device really has them, discard and write-zeroes if it
/// does them.
///
/// # Errors
/// [`BuildError::Geometry`] for block sizes RNBD cannot carry.
pub fn volume_info(
    id: VolumeId,
    name: &str,
    device: &DeviceInfo,
) -> Result<VolumeInfo, BuildError> {
    let geometry = |why| BuildError::Geometry(name.into(), why);
    let logical = u16::try_from(device.logical_block_size)
        .ok()
        .filter(|b| b.is_power_of_two() && (512..=4096).contains(b))
        .ok_or_else(|| geometry("logical block size is not a power of two in 512..=4096"))?;
    let physical = u16::try_from(device.physical_block_size.max(device.logical_block_size))
        .map_err(|_| geometry("physical block size over 32 KiB"))?;
    if device.size < u64::from(logical) {
        return Err(geometry("smaller than one block"));
    }
    let mut info = VolumeInfo::new(id, device.size / 512);
    info.logical_block_size = logical;
    info.physical_block_size = physical;
    info.write_cache = device.volatile_write_cache && !device.read_only;
    info.fua = info.write_cache && device.fua;
    if !device.read_only {
        info.discard = device.discard.map(|discard| DiscardLimits {
            max_sectors: MAX_DISCARD_SECTORS,
            granularity: discard.granularity.max(u32::from(logical)),
            alignment: 0,
        });
        info.secure_erase = device.write_zeroes && info.discard.is_some();
    }
    Ok(info)
}

/// Per-volume counters the engine keeps (RNBD keeps the per-op ones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeCounters {
    /// Requests that waited for room in the device queue.
    pub parked: u64,
    /// Requests the device refused or failed.
    pub device_errors: u64,
}

/// A served volume.
pub(crate) struct Served<D> {
    pub(crate) name: String,
    pub(crate) info: VolumeInfo,
    pub(crate) device: D,
    /// Requests waiting for room in the device queue (capacity: every
    /// request the engine can hold).
    pub(crate) parked: ParkedQueue,
    pub(crate) counters: VolumeCounters,
    /// Received-to-answered time of its block requests.
    pub(crate) latency: crate::LatencyHistogram,
}

/// The chunks of every port, as volumes reach them.
pub(crate) struct ChunkMemory<'a, P: Port> {
    /// The engine's HCAs (the RTRS server's ports).
    pub(crate) hcas: &'a mut [P],
    /// Chunk addresses are bus addresses ([`Engine::set_identity_dma`]).
    pub(crate) identity_dma: bool,
}

impl<P: Port> BufferAccess<Chunk> for ChunkMemory<'_, P> {
    fn with_slice<R>(
        &self,
        buffer: Chunk,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError> {
        if len > buffer.handle.len() {
            return Err(BufferError::TooShort);
        }
        self.hcas
            .get(buffer.port)
            .ok_or(BufferError::Stale)?
            .with_slice(buffer.handle, 0, len, f)
            .map_err(|_| BufferError::Stale)
    }

    fn with_slice_mut<R>(
        &mut self,
        buffer: Chunk,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        if len > buffer.handle.len() {
            return Err(BufferError::TooShort);
        }
        self.hcas
            .get_mut(buffer.port)
            .ok_or(BufferError::Stale)?
            .with_slice_mut(buffer.handle, 0, len, f)
            .map_err(|_| BufferError::Stale)
    }

    /// The chunk's address in its port's arena when the engine was told
    /// that addresses are bus addresses; the arena is allocated once and
    /// never moves, so the address stays valid while the IO is in flight.
    fn dma_address(&self, buffer: Chunk, len: u32) -> Option<u64> {
        if !self.identity_dma || len > buffer.handle.len() {
            return None;
        }
        self.hcas
            .get(buffer.port)?
            .with_slice(buffer.handle, 0, len, |bytes| bytes.as_ptr() as u64)
            .ok()
    }
}

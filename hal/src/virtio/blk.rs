//! virtio-blk (VIRTIO 1.1 §5.2) as a [`BlockDevice`]: polled, one queue.
//!
//! Features: `VIRTIO_F_VERSION_1` (mandatory), and when offered
//! `VIRTIO_BLK_F_FLUSH`, `BLK_SIZE`, `TOPOLOGY`, `SIZE_MAX`, `RO`,
//! `DISCARD`, `WRITE_ZEROES`.
//!
//! # Requests
//!
//! Each request owns a *slot* (there are [`DeviceInfo::queue_depth`]): 64
//! bytes of DMA memory holding the 16-byte request header (type, reserved,
//! sector), the 16-byte discard/write-zeroes segment and the status byte,
//! plus, if bouncing is enabled, a bounce buffer of `max_transfer` bytes.
//! A request is one chain: header (device-readable), data (if any) and
//! status (device-writable). The status byte is set to 0xff before
//! submission, so a device that never writes it yields an error, not a
//! false success.
//!
//! Data goes straight to the caller's buffer when
//! [`BufferAccess::dma_address`] gives its bus address (zero copy; the
//! ownership contract of [`crate::block`] makes that sound): one descriptor,
//! so the buffer must be contiguous in bus space, which `dma_address`
//! promises for the `len` bytes. Otherwise a write is copied into the
//! slot's bounce buffer during `submit` and a read is copied out during
//! `poll`, just before its completion is delivered.
//!
//! # Flush and FUA
//!
//! With `VIRTIO_BLK_F_FLUSH` the device has a volatile write cache
//! ([`DeviceInfo::volatile_write_cache`]) and [`Op::Flush`] becomes
//! `VIRTIO_BLK_T_FLUSH`. Without it the device is write-through (§5.2.6.2:
//! a device that does not offer FLUSH must not cache writes), so a flush
//! completes at once. virtio-blk has no FUA: a write with `fua` is sent as
//! a plain write and, once it succeeds, a flush in the same slot; the
//! completion is delivered after the flush (so the write is durable when it
//! is seen, at the cost of flushing everything else too).
//!
//! # Doorbells and polling
//!
//! `submit` publishes the chain; the doorbell is rung once per
//! [`poll`](BlockDevice::poll) (and `poll` is due at once while anything
//! is queued or in flight: [`BlockDevice::poll_at`] is `Some(0)`), so a
//! batch of submissions costs one notification. Without interrupts the
//! loop has to keep polling while IO is in flight.
//!
//! Status codes: `VIRTIO_BLK_S_OK` -> `Ok`, `IOERR` -> `EIO`, `UNSUPP` ->
//! `EOPNOTSUPP`, anything else -> `EIO` (counted).
//!
//! # The device ID (serial)
//!
//! [`VirtioBlk::read_device_id`] sends `VIRTIO_BLK_T_GET_ID` (§5.2.6) and
//! waits for it: a setup-time request, refused while IO is in flight, with
//! its own 64 bytes of DMA memory (header, the 20-byte device-writable ID
//! buffer, status) allocated with the slots, so nothing is allocated and no
//! slot is touched. The ID is a string of up to 20 bytes
//! (`VIRTIO_BLK_ID_BYTES`), NUL-padded when shorter (§5.2.6; QEMU
//! `strncpy`s its `serial=`): [`DeviceId`] is the bytes before the first
//! NUL, all 20 if there is none. The wait is bounded by a [`Clock`] deadline;
//! a device that never answers yields [`GetIdError::Timeout`] and keeps the
//! chain: its late completion lands in that private memory and is dropped
//! by [`poll`](BlockDevice::poll), so it cannot disturb IO.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::queue::{QueueStats, Segment, SplitQueue};
use super::transport::VirtioTransport;
use super::{feature, negotiate, read_config_bytes, read_config_u32, read_config_u64, InitError};
use crate::block::{
    BlockDevice, BufferAccess, Completion, DeviceInfo, DiscardInfo, IoError, Op, OpKind, Request,
    SubmitError,
};
use crate::dma::{DmaPool, DmaSlice};
use crate::Clock;

/// `VIRTIO_BLK_F_SIZE_MAX`: `size_max` bounds each segment.
pub const F_SIZE_MAX: u64 = 1 << 1;
/// `VIRTIO_BLK_F_SEG_MAX` (we use one data segment; not negotiated).
pub const F_SEG_MAX: u64 = 1 << 2;
/// `VIRTIO_BLK_F_RO`: read-only device.
pub const F_RO: u64 = 1 << 5;
/// `VIRTIO_BLK_F_BLK_SIZE`: `blk_size` is the logical block size.
pub const F_BLK_SIZE: u64 = 1 << 6;
/// `VIRTIO_BLK_F_FLUSH`: flush command (and a volatile cache).
pub const F_FLUSH: u64 = 1 << 9;
/// `VIRTIO_BLK_F_TOPOLOGY`: physical block exponent and I/O sizes.
pub const F_TOPOLOGY: u64 = 1 << 10;
/// `VIRTIO_BLK_F_DISCARD`: discard command.
pub const F_DISCARD: u64 = 1 << 13;
/// `VIRTIO_BLK_F_WRITE_ZEROES`: write-zeroes command.
pub const F_WRITE_ZEROES: u64 = 1 << 14;

/// Request types (§5.2.6).
mod request_type {
    pub const IN: u32 = 0;
    pub const OUT: u32 = 1;
    pub const FLUSH: u32 = 4;
    pub const GET_ID: u32 = 8;
    pub const DISCARD: u32 = 11;
    pub const WRITE_ZEROES: u32 = 13;
}

/// Status values (§5.2.6).
const STATUS_OK: u8 = 0;
const STATUS_IOERR: u8 = 1;
const STATUS_UNSUPP: u8 = 2;
/// Written before submission; no device writes it.
const STATUS_UNSET: u8 = 0xff;

/// Virtio sectors are always 512 bytes (§5.2.6), whatever `blk_size` says.
const SECTOR: u64 = 512;
/// Bytes of DMA memory per slot: header 0..16, segment 16..32, status 32.
const SLOT_BYTES: usize = 64;
const SEGMENT_OFFSET: usize = 16;
const STATUS_OFFSET: usize = 32;
const NO_SLOT: u16 = u16::MAX;
/// `VIRTIO_BLK_ID_BYTES`: the device ID's length (§5.2.6).
pub const ID_BYTES: usize = 20;
/// Bytes of DMA memory for the GET_ID request: header 0..16, ID 16..36,
/// status 48.
const ID_REQUEST_BYTES: usize = 64;
const ID_DATA_OFFSET: usize = 16;
const ID_STATUS_OFFSET: usize = 48;

/// Device configuration offsets (`struct virtio_blk_config`, §5.2.4).
mod config_offset {
    pub const CAPACITY: usize = 0;
    pub const SIZE_MAX: usize = 8;
    pub const BLK_SIZE: usize = 20;
    pub const PHYSICAL_BLOCK_EXP: usize = 24;
    pub const MAX_DISCARD_SECTORS: usize = 36;
    pub const DISCARD_SECTOR_ALIGNMENT: usize = 44;
    pub const MAX_WRITE_ZEROES_SECTORS: usize = 48;
}

/// Queue depth and transfer size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlkConfig {
    /// Requests in flight at most (capped by a third of the queue size).
    pub queue_depth: u16,
    /// Descriptors in the queue: a power of two, capped by the device.
    pub queue_size: u16,
    /// The longest read or write, bytes (rounded down to the block size,
    /// capped by the device's `size_max`).
    pub max_transfer: u32,
    /// Whether to allocate a bounce buffer per slot for buffers without a
    /// DMA address (`queue_depth * max_transfer` bytes). Without it such
    /// requests fail with [`SubmitError::Unsupported`].
    pub bounce: bool,
}

impl Default for BlkConfig {
    fn default() -> Self {
        Self {
            queue_depth: 32,
            queue_size: 128,
            max_transfer: 128 * 1024,
            bounce: true,
        }
    }
}

impl BlkConfig {
    /// DMA bytes [`VirtioBlk::new`] takes from the pool at most.
    pub fn dma_bytes(&self) -> usize {
        let size = usize::from(self.queue_size);
        let depth = usize::from(self.queue_depth);
        let bounce = if self.bounce {
            depth * self.max_transfer as usize + 4096
        } else {
            0
        };
        16 * size
            + 4
            + 2 * size
            + 4
            + 8 * size
            + 32
            + depth * SLOT_BYTES
            + 64
            + ID_REQUEST_BYTES
            + 64
            + bounce
    }
}

/// Counters of a [`VirtioBlk`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlkStats {
    /// Requests sent zero-copy.
    pub zero_copy: u64,
    /// Requests sent through a bounce buffer.
    pub bounced: u64,
    /// Completions with a status byte the spec does not define.
    pub bad_status: u64,
    /// FUA writes completed by a trailing flush.
    pub fua_flushes: u64,
    /// The queue's counters.
    pub queue: QueueStats,
}

/// A virtio-blk device ID (its serial): the bytes of the 20-byte
/// `VIRTIO_BLK_T_GET_ID` answer before the first NUL (§5.2.6); empty if
/// the device has none (QEMU without `serial=`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId {
    bytes: [u8; ID_BYTES],
    len: u8,
}

impl DeviceId {
    /// The ID in the 20 bytes the device wrote: up to the first NUL (all
    /// 20 if there is none).
    pub fn from_raw(raw: [u8; ID_BYTES]) -> Self {
        let len = raw.iter().position(|byte| *byte == 0).unwrap_or(ID_BYTES);
        let mut bytes = [0; ID_BYTES];
        bytes[..len].copy_from_slice(&raw[..len]);
        Self {
            bytes,
            len: len as u8,
        }
    }

    /// The ID's bytes, without the padding.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The ID as text, if it is UTF-8 (the spec does not say it is).
    pub fn as_str(&self) -> Option<&str> {
        core::str::from_utf8(self.as_bytes()).ok()
    }

    /// Whether the device reported an empty ID (no serial).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The ID with bytes outside printable ASCII escaped (`\xNN`): safe to log.
impl core::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.as_bytes().escape_ascii())
    }
}

impl core::fmt::Debug for DeviceId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DeviceId(\"{self}\")")
    }
}

/// Why [`VirtioBlk::read_device_id`] has no ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GetIdError {
    /// Requests are in flight, or an earlier GET_ID is still with the
    /// device: GET_ID is a setup-time request.
    Busy,
    /// The device answered `VIRTIO_BLK_S_UNSUPP`: it gives no ID.
    Unsupported,
    /// The device answered `VIRTIO_BLK_S_IOERR`.
    IoError,
    /// The device returned the request with a status the spec does not
    /// define (0xff: it never wrote one).
    BadStatus(u8),
    /// The device did not return the request before the deadline (it
    /// keeps it; see the module docs).
    Timeout,
}

impl core::fmt::Display for GetIdError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Busy => f.write_str("requests in flight: GET_ID is only sent when idle"),
            Self::Unsupported => f.write_str("the device does not support GET_ID (UNSUPP)"),
            Self::IoError => f.write_str("the device failed GET_ID (IOERR)"),
            Self::BadStatus(status) => write!(f, "GET_ID returned with bad status {status:#04x}"),
            Self::Timeout => f.write_str("the device did not answer GET_ID in time"),
        }
    }
}

impl core::error::Error for GetIdError {}

/// What a slot's request is waiting for.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// The slot is free.
    Free,
    /// The device has the chain.
    WaitingForDevice,
    /// A FUA write succeeded; its flush is with the device.
    WaitingForFuaFlush,
    /// Finished without the device (flush on a write-through device).
    Finished,
}

/// One request slot.
#[derive(Clone, Copy, Debug)]
struct Slot<H> {
    stage: Stage,
    tag: u64,
    kind: OpKind,
    buffer: Option<H>,
    len: u32,
    /// The data went through the bounce buffer.
    bounced: bool,
    /// A write with FUA on a device with a volatile cache.
    fua: bool,
}

/// A polled virtio-blk device; `H` is the caller's buffer handle.
#[derive(Debug)]
pub struct VirtioBlk<H: Copy, T: VirtioTransport> {
    transport: T,
    features: u64,
    info: DeviceInfo,
    max_discard: u64,
    max_write_zeroes: u64,
    queue: SplitQueue,
    slot_memory: DmaSlice,
    /// The GET_ID request's header, ID buffer and status.
    id_memory: DmaSlice,
    /// The head of a GET_ID chain the device kept past its deadline.
    id_head: Option<u16>,
    bounce: Option<DmaSlice>,
    slots: Vec<Slot<H>>,
    free_slots: Vec<u16>,
    /// Slot of each in-flight chain, by head id.
    head_slot: Vec<u16>,
    /// Slots finished without the device, in order.
    finished: VecDeque<u16>,
    stats: BlkStats,
}

impl<H: Copy, T: VirtioTransport> VirtioBlk<H, T> {
    /// Brings the device up: negotiates features, reads the geometry, sets
    /// up the queue and slots from `pool` and sets DRIVER_OK.
    ///
    /// # Errors
    ///
    /// [`InitError::MissingFeatures`] (no `VERSION_1`),
    /// [`InitError::FeaturesRejected`], [`InitError::QueueUnavailable`],
    /// [`InitError::QueueTooSmall`], [`InitError::Dma`],
    /// [`InitError::BadConfig`] (zero depth, a block size that is not a
    /// power of two of at least 512, a capacity that overflows).
    pub fn new(mut transport: T, pool: &mut DmaPool, config: BlkConfig) -> Result<Self, InitError> {
        let optional =
            F_FLUSH | F_BLK_SIZE | F_TOPOLOGY | F_SIZE_MAX | F_RO | F_DISCARD | F_WRITE_ZEROES;
        let features = negotiate(&mut transport, feature::VERSION_1, optional)?;
        match Self::set_up(&mut transport, pool, config, features) {
            Ok(parts) => {
                let device = Self::assemble(transport, features, parts);
                Ok(device)
            }
            Err(error) => {
                transport.set_status(super::status::FAILED);
                Err(error)
            }
        }
    }

    fn set_up(
        transport: &mut T,
        pool: &mut DmaPool,
        config: BlkConfig,
        features: u64,
    ) -> Result<Parts, InitError> {
        let u32_at = |transport: &mut T, offset| read_config_u32(transport, offset);
        let capacity = read_config_u64(transport, config_offset::CAPACITY);
        let size = capacity.checked_mul(SECTOR).ok_or(InitError::BadConfig)?;
        let logical = if features & F_BLK_SIZE != 0 {
            u32_at(transport, config_offset::BLK_SIZE)
        } else {
            SECTOR as u32
        };
        if logical < 512 || !logical.is_power_of_two() {
            return Err(InitError::BadConfig);
        }
        let physical = if features & F_TOPOLOGY != 0 {
            let exponent: [u8; 1] = read_config_bytes(transport, config_offset::PHYSICAL_BLOCK_EXP);
            logical
                .checked_shl(u32::from(exponent[0]))
                .unwrap_or(logical)
        } else {
            logical
        };
        let mut max_transfer = config.max_transfer;
        if features & F_SIZE_MAX != 0 {
            let size_max = u32_at(transport, config_offset::SIZE_MAX);
            if size_max > 0 {
                max_transfer = max_transfer.min(size_max);
            }
        }
        max_transfer -= max_transfer % logical;
        if max_transfer == 0 || config.queue_depth == 0 {
            return Err(InitError::BadConfig);
        }
        let max_queue = transport.queue_max_size(0);
        if max_queue == 0 {
            return Err(InitError::QueueUnavailable(0));
        }
        let queue_size = config.queue_size.min(max_queue);
        let queue_size = 1u16 << (15 - queue_size.max(1).leading_zeros());
        let queue_depth = config.queue_depth.min(queue_size / 3);
        if queue_depth == 0 {
            return Err(InitError::QueueTooSmall(0));
        }
        let discard = (features & F_DISCARD != 0).then(|| {
            let alignment = u32_at(transport, config_offset::DISCARD_SECTOR_ALIGNMENT);
            DiscardInfo {
                granularity: alignment.saturating_mul(SECTOR as u32).max(logical),
                zeroes_data: false,
            }
        });
        let max_discard = u64::from(u32_at(transport, config_offset::MAX_DISCARD_SECTORS)) * SECTOR;
        let max_write_zeroes =
            u64::from(u32_at(transport, config_offset::MAX_WRITE_ZEROES_SECTORS)) * SECTOR;
        let info = DeviceInfo {
            size: size - size % u64::from(logical),
            logical_block_size: logical,
            physical_block_size: physical,
            max_transfer,
            queue_depth: u32::from(queue_depth),
            volatile_write_cache: features & F_FLUSH != 0,
            fua: true,
            discard,
            write_zeroes: features & F_WRITE_ZEROES != 0,
            read_only: features & F_RO != 0,
        };
        let queue = SplitQueue::new(pool, 0, queue_size)?;
        let slot_memory = pool.alloc(usize::from(queue_depth) * SLOT_BYTES, 64)?;
        let id_memory = pool.alloc(ID_REQUEST_BYTES, 64)?;
        let bounce = if config.bounce {
            Some(pool.alloc(usize::from(queue_depth) * max_transfer as usize, 4096)?)
        } else {
            None
        };
        queue.enable(transport);
        super::driver_ok(transport);
        Ok(Parts {
            info,
            max_discard: if max_discard == 0 {
                u64::MAX
            } else {
                max_discard
            },
            max_write_zeroes: if max_write_zeroes == 0 {
                u64::MAX
            } else {
                max_write_zeroes
            },
            queue,
            slot_memory,
            id_memory,
            bounce,
        })
    }

    fn assemble(transport: T, features: u64, parts: Parts) -> Self {
        let depth = parts.info.queue_depth as usize;
        let empty = Slot {
            stage: Stage::Free,
            tag: 0,
            kind: OpKind::Flush,
            buffer: None,
            len: 0,
            bounced: false,
            fua: false,
        };
        let mut slots = Vec::new();
        slots.resize(depth, empty);
        let free_slots = (0..depth as u16).rev().collect();
        let mut head_slot = Vec::new();
        head_slot.resize(usize::from(parts.queue.size()), NO_SLOT);
        let mut finished = VecDeque::new();
        finished.reserve_exact(depth);
        Self {
            transport,
            features,
            info: parts.info,
            max_discard: parts.max_discard,
            max_write_zeroes: parts.max_write_zeroes,
            queue: parts.queue,
            slot_memory: parts.slot_memory,
            id_memory: parts.id_memory,
            id_head: None,
            bounce: parts.bounce,
            slots,
            free_slots,
            head_slot,
            finished,
            stats: BlkStats::default(),
        }
    }

    /// The negotiated feature bits.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The counters.
    pub fn stats(&self) -> BlkStats {
        BlkStats {
            queue: self.queue.stats(),
            ..self.stats
        }
    }

    /// The transport (for the owner's diagnostics).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Resets the device (§4.1.4.3.2: status 0; it then no longer uses
    /// the queue or the memory it was given, and drops what it still had,
    /// a timed-out GET_ID included) and returns the transport, so that the
    /// device can be brought up again (a probe before the real driver).
    /// The driver's DMA memory is not returned to the pool (it never
    /// frees).
    ///
    /// # Errors
    ///
    /// [`InitError::ResetTimeout`] if the status does not read back 0.
    pub fn reset(mut self) -> Result<T, InitError> {
        self.transport.set_status(0);
        let mut polls = 0;
        while self.transport.status() != 0 {
            polls += 1;
            if polls >= super::RESET_POLLS {
                return Err(InitError::ResetTimeout);
            }
            core::hint::spin_loop();
        }
        Ok(self.transport)
    }

    /// Reads the device ID (its serial) with `VIRTIO_BLK_T_GET_ID`,
    /// waiting for the answer until `timeout_ns` of `clock` have passed
    /// (the doorbell is rung at once). Meant for setup time, before the
    /// device serves IO; IO works as before afterwards.
    ///
    /// # Errors
    ///
    /// [`GetIdError::Busy`] if requests are in flight (or a timed-out
    /// GET_ID is still with the device); [`GetIdError::Unsupported`],
    /// [`GetIdError::IoError`] or [`GetIdError::BadStatus`] for the
    /// device's answer; [`GetIdError::Timeout`] if there is none in time.
    pub fn read_device_id<C: Clock + ?Sized>(
        &mut self,
        clock: &C,
        timeout_ns: u64,
    ) -> Result<DeviceId, GetIdError> {
        if self.in_flight() > 0 || !self.finished.is_empty() || self.id_head.is_some() {
            return Err(GetIdError::Busy);
        }
        let memory = &self.id_memory;
        memory.write_u32(0, request_type::GET_ID);
        memory.write_u32(4, 0);
        memory.write_u64(8, 0);
        memory.fill(ID_DATA_OFFSET, ID_BYTES, 0);
        memory.write_u8(ID_STATUS_OFFSET, STATUS_UNSET);
        let chain = [
            Segment {
                address: memory.phys_at(0),
                len: 16,
                device_writes: false,
            },
            Segment {
                address: memory.phys_at(ID_DATA_OFFSET),
                len: ID_BYTES as u32,
                device_writes: true,
            },
            Segment {
                address: memory.phys_at(ID_STATUS_OFFSET),
                len: 1,
                device_writes: true,
            },
        ];
        // Nothing is in flight, so every descriptor is free (a queue holds
        // at least three: `queue_depth` is at most a third of its size).
        let head = self.queue.push(&chain).map_err(|_| GetIdError::Busy)?;
        self.queue.publish();
        self.queue.kick(&mut self.transport);
        let start = clock.now();
        loop {
            // Only this chain is in flight and `pop_used` drops ids that
            // are not, so a used entry is its completion.
            if let Some(used) = self.queue.pop_used() {
                if used.head == head {
                    break;
                }
            }
            if clock.now().saturating_sub(start) >= timeout_ns {
                self.id_head = Some(head);
                return Err(GetIdError::Timeout);
            }
            core::hint::spin_loop();
        }
        match self.id_memory.read_u8(ID_STATUS_OFFSET) {
            STATUS_OK => {
                let mut raw = [0; ID_BYTES];
                self.id_memory.read_bytes(ID_DATA_OFFSET, &mut raw);
                Ok(DeviceId::from_raw(raw))
            }
            STATUS_IOERR => Err(GetIdError::IoError),
            STATUS_UNSUPP => Err(GetIdError::Unsupported),
            status => Err(GetIdError::BadStatus(status)),
        }
    }

    fn bounce_offset(&self, slot: u16) -> usize {
        usize::from(slot) * self.info.max_transfer as usize
    }

    /// Writes slot `slot`'s header and status byte and pushes the chain.
    fn push_chain(
        &mut self,
        slot: u16,
        request_type: u32,
        sector: u64,
        data: Option<Segment>,
    ) -> Result<(), SubmitError> {
        let base = usize::from(slot) * SLOT_BYTES;
        self.slot_memory.write_u32(base, request_type);
        self.slot_memory.write_u32(base + 4, 0);
        self.slot_memory.write_u64(base + 8, sector);
        self.slot_memory
            .write_u8(base + STATUS_OFFSET, STATUS_UNSET);
        let header = Segment {
            address: self.slot_memory.phys_at(base),
            len: 16,
            device_writes: false,
        };
        let status = Segment {
            address: self.slot_memory.phys_at(base + STATUS_OFFSET),
            len: 1,
            device_writes: true,
        };
        let chain = [header, data.unwrap_or(status), status];
        let chain = if data.is_some() {
            &chain[..]
        } else {
            &chain[..2]
        };
        let head = self.queue.push(chain).map_err(|_| SubmitError::QueueFull)?;
        self.head_slot[usize::from(head)] = slot;
        self.queue.publish();
        Ok(())
    }

    /// The data segment of a read or write: the buffer's own address, or
    /// the slot's bounce buffer (filled now for a write).
    fn data_segment<A: BufferAccess<H> + ?Sized>(
        &mut self,
        slot: u16,
        buffer: H,
        len: u32,
        device_writes: bool,
        buffers: &mut A,
    ) -> Result<(Segment, bool), SubmitError> {
        // Resolve the handle first: a stale handle fails here either way.
        buffers
            .with_slice(buffer, len, |_| ())
            .map_err(SubmitError::Buffer)?;
        if let Some(address) = buffers.dma_address(buffer, len) {
            let segment = Segment {
                address,
                len,
                device_writes,
            };
            return Ok((segment, false));
        }
        let offset = self.bounce_offset(slot);
        let Some(bounce) = &self.bounce else {
            return Err(SubmitError::Unsupported);
        };
        if !device_writes {
            buffers
                .with_slice(buffer, len, |bytes| bounce.write_bytes(offset, bytes))
                .map_err(SubmitError::Buffer)?;
        }
        let segment = Segment {
            address: bounce.phys_at(offset),
            len,
            device_writes,
        };
        Ok((segment, true))
    }

    fn start<A: BufferAccess<H> + ?Sized>(
        &mut self,
        slot: u16,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<Slot<H>, SubmitError> {
        let mut state = Slot {
            stage: Stage::WaitingForDevice,
            tag: request.tag,
            kind: request.op.kind(),
            buffer: request.op.buffer(),
            len: 0,
            bounced: false,
            fua: false,
        };
        match request.op {
            Op::Read {
                offset,
                len,
                buffer,
            } => {
                let (data, bounced) = self.data_segment(slot, buffer, len, true, buffers)?;
                self.push_chain(slot, request_type::IN, offset / SECTOR, Some(data))?;
                state.len = len;
                state.bounced = bounced;
            }
            Op::Write {
                offset,
                len,
                buffer,
                fua,
            } => {
                let (data, bounced) = self.data_segment(slot, buffer, len, false, buffers)?;
                self.push_chain(slot, request_type::OUT, offset / SECTOR, Some(data))?;
                state.len = len;
                state.bounced = bounced;
                state.fua = fua && self.info.volatile_write_cache;
            }
            Op::Flush if !self.info.volatile_write_cache => state.stage = Stage::Finished,
            Op::Flush => self.push_chain(slot, request_type::FLUSH, 0, None)?,
            Op::Discard { offset, len } | Op::WriteZeroes { offset, len } => {
                let (request_type, limit) = match request.op {
                    Op::Discard { .. } => (request_type::DISCARD, self.max_discard),
                    _ => (request_type::WRITE_ZEROES, self.max_write_zeroes),
                };
                if u64::from(len) > limit {
                    return Err(SubmitError::TooLong);
                }
                let segment = usize::from(slot) * SLOT_BYTES + SEGMENT_OFFSET;
                self.slot_memory.write_u64(segment, offset / SECTOR);
                self.slot_memory
                    .write_u32(segment + 8, (u64::from(len) / SECTOR) as u32);
                self.slot_memory.write_u32(segment + 12, 0);
                let data = Segment {
                    address: self.slot_memory.phys_at(segment),
                    len: 16,
                    device_writes: false,
                };
                self.push_chain(slot, request_type, offset / SECTOR, Some(data))?;
            }
        }
        if request.op.buffer().is_some() {
            if state.bounced {
                self.stats.bounced += 1;
            } else {
                self.stats.zero_copy += 1;
            }
        }
        Ok(state)
    }

    /// Delivers slot `slot` with `result` and frees it.
    fn deliver<A: BufferAccess<H> + ?Sized>(
        &mut self,
        slot: u16,
        mut result: Result<(), IoError>,
        buffers: &mut A,
        on_completion: &mut impl FnMut(Completion<H>),
    ) {
        let state = self.slots[usize::from(slot)];
        if let (Ok(()), OpKind::Read, true, Some(buffer)) =
            (result, state.kind, state.bounced, state.buffer)
        {
            let offset = self.bounce_offset(slot);
            if let Some(bounce) = &self.bounce {
                result = buffers
                    .with_slice_mut(buffer, state.len, |bytes| bounce.read_bytes(offset, bytes))
                    .map_err(IoError::Buffer);
            }
        }
        self.slots[usize::from(slot)].stage = Stage::Free;
        self.free_slots.push(slot);
        on_completion(Completion {
            tag: state.tag,
            kind: state.kind,
            buffer: state.buffer,
            result,
        });
    }

    fn status_result(&mut self, slot: u16) -> Result<(), IoError> {
        let status = self
            .slot_memory
            .read_u8(usize::from(slot) * SLOT_BYTES + STATUS_OFFSET);
        match status {
            STATUS_OK => Ok(()),
            STATUS_IOERR => Err(IoError::device()),
            STATUS_UNSUPP => Err(IoError::Io(i32::from(errno::EOPNOTSUPP))),
            _ => {
                self.stats.bad_status += 1;
                Err(IoError::device())
            }
        }
    }
}

/// What `set_up` builds before the device value exists.
struct Parts {
    info: DeviceInfo,
    max_discard: u64,
    max_write_zeroes: u64,
    queue: SplitQueue,
    slot_memory: DmaSlice,
    id_memory: DmaSlice,
    bounce: Option<DmaSlice>,
}

impl<H: Copy, T: VirtioTransport> BlockDevice<H> for VirtioBlk<H, T> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn submit<A: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        self.info.check(&request.op)?;
        let Some(&slot) = self.free_slots.last() else {
            return Err(SubmitError::QueueFull);
        };
        let state = self.start(slot, request, buffers)?;
        self.free_slots.pop();
        self.slots[usize::from(slot)] = state;
        if let Stage::Finished = state.stage {
            self.finished.push_back(slot);
        }
        Ok(())
    }

    /// Rings the doorbell once if submissions are pending, then delivers up
    /// to `max` completions: those finished without the device first, then
    /// the used ring's (bogus entries are skipped, at most a ring's worth).
    fn poll<A: BufferAccess<H> + ?Sized>(
        &mut self,
        _now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize {
        self.queue.kick(&mut self.transport);
        let mut delivered = 0;
        while delivered < max {
            if let Some(slot) = self.finished.pop_front() {
                self.deliver(slot, Ok(()), buffers, on_completion);
                delivered += 1;
                continue;
            }
            let Some(used) = self.queue.pop_used() else {
                break;
            };
            if self.id_head == Some(used.head) {
                // A timed-out GET_ID, answered late: nobody waits for it.
                self.id_head = None;
                continue;
            }
            let slot = core::mem::replace(&mut self.head_slot[usize::from(used.head)], NO_SLOT);
            let Some(state) = self.slots.get(usize::from(slot)).copied() else {
                continue;
            };
            let result = self.status_result(slot);
            match (state.stage, result) {
                (Stage::WaitingForDevice, Ok(())) if state.fua => {
                    self.slots[usize::from(slot)].stage = Stage::WaitingForFuaFlush;
                    self.stats.fua_flushes += 1;
                    // The write freed three descriptors: the flush's two fit.
                    if self.push_chain(slot, request_type::FLUSH, 0, None).is_err() {
                        self.deliver(slot, Err(IoError::device()), buffers, on_completion);
                        delivered += 1;
                    }
                }
                (Stage::WaitingForDevice | Stage::WaitingForFuaFlush, result) => {
                    self.deliver(slot, result, buffers, on_completion);
                    delivered += 1;
                }
                (Stage::Free | Stage::Finished, _) => {}
            }
        }
        self.queue.kick(&mut self.transport);
        delivered
    }

    fn poll_at(&self) -> Option<u64> {
        (self.in_flight() > 0 || self.queue.kick_pending()).then_some(0)
    }

    fn in_flight(&self) -> usize {
        self.info.queue_depth as usize - self.free_slots.len()
    }
}

//! Asynchronous block devices as the engine sees them: `BlockDevice`.
//!
//! A volume is a submit/poll device (ARCHITECTURE.md §6): the engine
//! [`submit`](BlockDevice::submit)s a [`Request`] and later collects its
//! [`Completion`] from [`poll`](BlockDevice::poll); nothing ever blocks the
//! loop. RAM ([`ram::RamDisk`]), hosted files and block devices
//! (`hosted::file::FileDevice`, a worker pool) and, later, virtio-blk all
//! implement the same trait.
//!
//! # Buffers: handles resolved through `BufferAccess`
//!
//! Data buffers live in the engine's registered-memory pool, allocated once
//! at boot; a request names one by a caller-defined, `Copy` handle `H` (for
//! the engine: a chunk's memory handle), never by a pointer or a borrow. A
//! device reaches the bytes only through the caller's [`BufferAccess`],
//! which checks the handle and the length and runs a closure on the slice
//! for the duration of one call, so no reference into registered memory
//! outlives a call and no `unsafe` is needed to share it.
//!
//! Ownership is by contract, made visible in the types: submitting a read or
//! a write hands the buffer to the device, and the [`Completion`] hands the
//! same handle back. Between the two the caller must not touch the buffer
//! (its IO state machine holds the handle only inside the completion it is
//! waiting for). When a device touches the bytes:
//!
//! * a write's data is read from the buffer during `submit` or while the IO
//!   is in flight (the hosted file device copies it into a per-slot bounce
//!   buffer during `submit`; RAM writes it straight to the disk);
//! * a read's data is in the buffer when its completion is delivered (the
//!   hosted file device copies it out of the bounce buffer in `poll`, just
//!   before calling back; RAM reads during `submit`).
//!
//! Both `submit` and `poll` therefore take the `BufferAccess`. A virtio-blk
//! driver asks for [`BufferAccess::dma_address`] and points descriptors
//! straight at the buffer (zero copy); the contract above is what makes that
//! sound, and a device that gets `None` bounces instead.
//!
//! Why not borrows (`&'a mut [u8]` held until completion)? The buffer would
//! pin a borrow of the whole pool for as long as any IO is in flight, which
//! the engine (many IOs over one pool, each finishing at a different time)
//! cannot express without `unsafe`. Why not raw pointers into the pool for
//! worker threads? Sharing them while the engine keeps `&mut` access to the
//! rest of the pool is aliasing the compiler does not check; the hosted
//! device copies instead (see `hosted::file`).
//!
//! # Ordering and durability
//!
//! In-flight requests are unordered, as on any block device: a read that
//! overlaps an in-flight write sees old or new data, and two overlapping
//! in-flight writes leave either. A [`Op::Flush`] makes every write that
//! *completed* before it was submitted durable; a write with `fua` is
//! durable when it completes. [`DeviceInfo::volatile_write_cache`] says
//! whether flushes matter at all.
//!
//! # No allocation
//!
//! Devices size every queue at construction; `submit` and `poll` never
//! allocate. `submit` refuses with [`SubmitError::QueueFull`] when
//! [`DeviceInfo::queue_depth`] requests are in flight (completions not yet
//! delivered by `poll` count as in flight).

pub mod ram;

/// Runs closures on a caller's data buffers, named by handles `H`.
///
/// The engine implements it over its registered-memory pool; tests over a
/// `Vec` of byte vectors. Accessors check the handle (still allocated?) and
/// the length and fail with [`BufferError`] rather than panicking.
pub trait BufferAccess<H> {
    /// Runs `f` on the first `len` bytes of `buffer`.
    ///
    /// # Errors
    ///
    /// [`BufferError::Stale`] if `buffer` names nothing live,
    /// [`BufferError::TooShort`] if it is shorter than `len`.
    fn with_slice<R>(
        &self,
        buffer: H,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError>;

    /// Runs `f` on the first `len` bytes of `buffer`, writable.
    ///
    /// # Errors
    ///
    /// As [`with_slice`](Self::with_slice).
    fn with_slice_mut<R>(
        &mut self,
        buffer: H,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError>;

    /// The bus address of the first `len` bytes of `buffer`, for a device
    /// that transfers straight from memory (virtio-blk in the image). The
    /// memory must stay where it is until the IO completes. `None` (the
    /// default, and always when hosted): the device copies.
    fn dma_address(&self, buffer: H, len: u32) -> Option<u64> {
        let _ = (buffer, len);
        None
    }
}

/// Why a buffer handle did not resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BufferError {
    /// The handle names no live buffer (freed, or never allocated).
    Stale,
    /// The buffer is shorter than the request's length.
    TooShort,
}

impl core::fmt::Display for BufferError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Stale => f.write_str("stale buffer handle"),
            Self::TooShort => f.write_str("buffer shorter than the request"),
        }
    }
}

impl core::error::Error for BufferError {}

/// What a request asks of the device. Offsets and lengths are bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op<H> {
    /// Read `len` bytes at `offset` into `buffer`.
    Read {
        /// Byte offset on the device.
        offset: u64,
        /// Bytes to read.
        len: u32,
        /// Where the data goes (owned by the device until completion).
        buffer: H,
    },
    /// Write the first `len` bytes of `buffer` at `offset`.
    Write {
        /// Byte offset on the device.
        offset: u64,
        /// Bytes to write.
        len: u32,
        /// Where the data comes from (owned by the device until completion).
        buffer: H,
        /// Force unit access: durable when the completion is delivered.
        fua: bool,
    },
    /// Make every write completed before this request durable.
    Flush,
    /// The range may be deallocated. Its contents afterwards are zeroes if
    /// [`DiscardInfo::zeroes_data`], else unspecified.
    Discard {
        /// Byte offset on the device.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Overwrite the range with zeroes.
    WriteZeroes {
        /// Byte offset on the device.
        offset: u64,
        /// Bytes.
        len: u32,
    },
}

impl<H: Copy> Op<H> {
    /// The kind of operation, without its data.
    pub fn kind(&self) -> OpKind {
        match self {
            Self::Read { .. } => OpKind::Read,
            Self::Write { .. } => OpKind::Write,
            Self::Flush => OpKind::Flush,
            Self::Discard { .. } => OpKind::Discard,
            Self::WriteZeroes { .. } => OpKind::WriteZeroes,
        }
    }

    /// The byte range, for the ops that have one.
    pub fn range(&self) -> Option<(u64, u32)> {
        match *self {
            Self::Read { offset, len, .. }
            | Self::Write { offset, len, .. }
            | Self::Discard { offset, len }
            | Self::WriteZeroes { offset, len } => Some((offset, len)),
            Self::Flush => None,
        }
    }

    /// The data buffer, for reads and writes.
    pub fn buffer(&self) -> Option<H> {
        match *self {
            Self::Read { buffer, .. } | Self::Write { buffer, .. } => Some(buffer),
            _ => None,
        }
    }
}

/// The kind of an [`Op`], for completions and statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Op::Read`].
    Read,
    /// [`Op::Write`].
    Write,
    /// [`Op::Flush`].
    Flush,
    /// [`Op::Discard`].
    Discard,
    /// [`Op::WriteZeroes`].
    WriteZeroes,
}

/// One IO: what to do and the caller's tag, returned in its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request<H> {
    /// The caller's name for the IO (e.g. its chunk id); never interpreted.
    pub tag: u64,
    /// What to do.
    pub op: Op<H>,
}

/// A finished IO, delivered by [`BlockDevice::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Completion<H> {
    /// The request's tag.
    pub tag: u64,
    /// The request's kind.
    pub kind: OpKind,
    /// The request's buffer, handed back to the caller (reads and writes).
    pub buffer: Option<H>,
    /// The outcome. A read's data is in the buffer if `Ok`.
    pub result: Result<(), IoError>,
}

/// Why an accepted IO failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoError {
    /// The device or OS reported an error (a positive `errno` when hosted).
    Io(i32),
    /// The buffer handle stopped resolving while the IO was in flight.
    Buffer(BufferError),
}

impl IoError {
    /// A device error without a better code: `EIO`.
    pub const fn device() -> Self {
        Self::Io(errno::EIO as i32)
    }

    /// A positive Linux `errno` for the error (what an RNBD response carries,
    /// negated).
    pub fn errno(&self) -> i32 {
        match self {
            Self::Io(code) if *code > 0 => *code,
            Self::Io(_) => i32::from(errno::EIO),
            Self::Buffer(_) => i32::from(errno::EFAULT),
        }
    }
}

impl core::fmt::Display for IoError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Io(code) => write!(f, "device error {code}"),
            Self::Buffer(error) => write!(f, "buffer: {error}"),
        }
    }
}

impl core::error::Error for IoError {}

/// Why [`BlockDevice::submit`] refused a request; nothing was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SubmitError {
    /// [`DeviceInfo::queue_depth`] requests are in flight; poll, then retry.
    QueueFull,
    /// `offset + len` overflows or exceeds [`DeviceInfo::size`].
    OutOfRange,
    /// Offset or length is not a multiple of the logical block size.
    Misaligned,
    /// A read or write longer than [`DeviceInfo::max_transfer`].
    TooLong,
    /// The device does not do this (discard, write-zeroes or FUA).
    Unsupported,
    /// A write, discard or write-zeroes on a read-only device.
    ReadOnly,
    /// The data buffer did not resolve.
    Buffer(BufferError),
}

impl core::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::QueueFull => f.write_str("device queue full"),
            Self::OutOfRange => f.write_str("range beyond the device"),
            Self::Misaligned => f.write_str("range not aligned to the logical block size"),
            Self::TooLong => f.write_str("transfer longer than the device maximum"),
            Self::Unsupported => f.write_str("operation not supported by the device"),
            Self::ReadOnly => f.write_str("device is read-only"),
            Self::Buffer(error) => write!(f, "buffer: {error}"),
        }
    }
}

impl core::error::Error for SubmitError {}

/// Discard support of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DiscardInfo {
    /// The unit the device deallocates in (bytes); smaller or unaligned
    /// parts of a range may stay allocated.
    pub granularity: u32,
    /// Whether a discarded range reads back as zeroes.
    pub zeroes_data: bool,
}

/// What a device is and does: geometry, caching and optional operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceInfo {
    /// Size in bytes (a multiple of `logical_block_size`).
    pub size: u64,
    /// The addressing unit: every offset and length is a multiple of it.
    pub logical_block_size: u32,
    /// The unit the device writes atomically and fastest.
    pub physical_block_size: u32,
    /// The longest read or write in bytes.
    pub max_transfer: u32,
    /// Requests that may be in flight at once.
    pub queue_depth: u32,
    /// Whether completed writes may sit in a volatile cache until a flush
    /// (if false, every completed write is durable and flush is a no-op).
    pub volatile_write_cache: bool,
    /// Whether writes honour `fua`.
    pub fua: bool,
    /// Discard support, if any.
    pub discard: Option<DiscardInfo>,
    /// Whether [`Op::WriteZeroes`] is supported.
    pub write_zeroes: bool,
    /// Whether the device refuses writes.
    pub read_only: bool,
}

impl DeviceInfo {
    /// Checks `op` against the geometry and capabilities: the checks every
    /// device makes before accepting a request (not the queue or buffer).
    ///
    /// # Errors
    ///
    /// [`SubmitError::OutOfRange`], [`Misaligned`](SubmitError::Misaligned),
    /// [`TooLong`](SubmitError::TooLong),
    /// [`Unsupported`](SubmitError::Unsupported) or
    /// [`ReadOnly`](SubmitError::ReadOnly).
    pub fn check<H: Copy>(&self, op: &Op<H>) -> Result<(), SubmitError> {
        let writes = !matches!(op, Op::Read { .. } | Op::Flush);
        if writes && self.read_only {
            return Err(SubmitError::ReadOnly);
        }
        match op {
            Op::Write { fua: true, .. } if !self.fua => return Err(SubmitError::Unsupported),
            Op::Discard { .. } if self.discard.is_none() => return Err(SubmitError::Unsupported),
            Op::WriteZeroes { .. } if !self.write_zeroes => return Err(SubmitError::Unsupported),
            Op::Read { len, .. } | Op::Write { len, .. } if *len > self.max_transfer => {
                return Err(SubmitError::TooLong)
            }
            _ => {}
        }
        let Some((offset, len)) = op.range() else {
            return Ok(());
        };
        let end = offset
            .checked_add(u64::from(len))
            .ok_or(SubmitError::OutOfRange)?;
        if end > self.size {
            return Err(SubmitError::OutOfRange);
        }
        let block = u64::from(self.logical_block_size.max(1));
        if offset % block != 0 || u64::from(len) % block != 0 {
            return Err(SubmitError::Misaligned);
        }
        Ok(())
    }
}

/// An asynchronous block device: submit requests, poll for completions.
///
/// `H` is the caller's buffer handle (see the module docs for the
/// ownership contract).
pub trait BlockDevice<H: Copy> {
    /// Geometry and capabilities (constant for the device's life).
    fn info(&self) -> DeviceInfo;

    /// Starts `request`. On `Ok` the device owns the request's buffer until
    /// its [`Completion`] is delivered by [`poll`](Self::poll). Never
    /// blocks and never allocates.
    ///
    /// # Errors
    ///
    /// [`SubmitError`]: the request was not started and the buffer is the
    /// caller's again.
    fn submit<A: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError>;

    /// Delivers at most `max` finished requests to `on_completion`, in the
    /// order they finished (not the order submitted), and returns how many.
    /// Bounded: at most `max` completions and no blocking. `now` is the
    /// loop's clock (for devices with timeouts; unused by RAM and files).
    fn poll<A: BufferAccess<H> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize;

    /// When [`poll`](Self::poll) next has work without an external wake-up:
    /// `Some(t)` (`t <= now` means at once), or `None` if nothing is due
    /// until the device's [`readable_fd`](Self::readable_fd) becomes
    /// readable (or ever, for a device without one).
    fn poll_at(&self) -> Option<u64>;

    /// Requests submitted and not yet delivered by `poll`.
    fn in_flight(&self) -> usize;

    /// For a hosted loop: a file descriptor that becomes readable when
    /// completions are ready, to wait on with the links' descriptors
    /// (`hosted::wait::PollIdle::watch_readable`). `None` for devices that
    /// need no wake-up (RAM) or are polled (virtio in the image).
    fn readable_fd(&self) -> Option<i32> {
        None
    }
}

/// A boxed device is a device (large devices are boxed to keep an enum of
/// volumes small).
impl<H: Copy, D: BlockDevice<H>> BlockDevice<H> for alloc::boxed::Box<D> {
    fn info(&self) -> DeviceInfo {
        (**self).info()
    }

    fn submit<A: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        (**self).submit(request, buffers)
    }

    fn poll<A: BufferAccess<H> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize {
        (**self).poll(now, buffers, max, on_completion)
    }

    fn poll_at(&self) -> Option<u64> {
        (**self).poll_at()
    }

    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }

    fn readable_fd(&self) -> Option<i32> {
        (**self).readable_fd()
    }
}

/// One of two device types as one device (an image serving virtio-blk
/// disks and NVMe namespaces side by side).
#[derive(Debug)]
pub enum Either<A, B> {
    /// The first kind.
    Left(A),
    /// The second kind.
    Right(B),
}

impl<H: Copy, A: BlockDevice<H>, B: BlockDevice<H>> BlockDevice<H> for Either<A, B> {
    fn info(&self) -> DeviceInfo {
        match self {
            Self::Left(device) => device.info(),
            Self::Right(device) => device.info(),
        }
    }

    fn submit<X: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut X,
    ) -> Result<(), SubmitError> {
        match self {
            Self::Left(device) => device.submit(request, buffers),
            Self::Right(device) => device.submit(request, buffers),
        }
    }

    fn poll<X: BufferAccess<H> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut X,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize {
        match self {
            Self::Left(device) => device.poll(now, buffers, max, on_completion),
            Self::Right(device) => device.poll(now, buffers, max, on_completion),
        }
    }

    fn poll_at(&self) -> Option<u64> {
        match self {
            Self::Left(device) => device.poll_at(),
            Self::Right(device) => device.poll_at(),
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            Self::Left(device) => device.in_flight(),
            Self::Right(device) => device.in_flight(),
        }
    }

    fn readable_fd(&self) -> Option<i32> {
        match self {
            Self::Left(device) => device.readable_fd(),
            Self::Right(device) => device.readable_fd(),
        }
    }
}

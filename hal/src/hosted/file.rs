//! Volumes on a hosted file or block device: `FileDevice` (a worker pool).
//!
//! The file (or `/dev/...` block device) is opened `O_RDWR` (optionally
//! `O_DIRECT`) and served by a small, fixed pool of worker threads created
//! at [`open`](FileDevice::open), so a slow read or an fdatasync never
//! stalls the loop (ARCHITECTURE.md §6). Everything a request needs is allocated
//! at open, so `submit` and `poll` never allocate:
//!
//! * `queue_depth` **slots**, each with a bounce buffer of `max_transfer`
//!   bytes (aligned to 4 KiB, so `O_DIRECT` works) behind its own mutex;
//! * two **index rings** of `queue_depth` entries (submitted, done), which
//!   can never overflow because there are only `queue_depth` slots;
//! * a non-blocking **Unix socket pair** as the wake-up: a worker that
//!   finishes a request writes one byte (only if no wake-up is pending) and
//!   the loop waits on the other end's [`readable_fd`](BlockDevice::readable_fd).
//!
//! # Buffers: copied through a per-slot bounce buffer
//!
//! The caller's buffer (in the engine's registered-memory pool) is reached
//! only through [`BufferAccess`] on the loop thread: `submit` copies a
//! write's data into the slot's bounce buffer, the worker does
//! pread/pwrite on the bounce buffer, and `poll` copies a read's data from
//! it into the caller's buffer right before delivering the completion.
//! Handing workers a pointer into the pool would save the copy but needs
//! `unsafe` and an aliasing argument across the whole pool (the engine keeps
//! `&mut` access to other chunks while a worker writes one); the copy costs
//! one memcpy per IO (at most `max_transfer` bytes, cheap next to a
//! syscall) and needs no `unsafe` at all. io_uring with registered buffers
//! is the zero-copy upgrade when it matters.
//!
//! # Operations
//!
//! | Request | System call |
//! | --- | --- |
//! | read | pread (all of it, retried on short reads) |
//! | write | pwrite; with FUA followed by fdatasync |
//! | flush | fdatasync |
//! | discard | file: fallocate(`PUNCH_HOLE \| KEEP_SIZE`); block device: `BLKDISCARD` |
//! | write-zeroes | file: fallocate(`ZERO_RANGE \| KEEP_SIZE`); block device: `BLKZEROOUT` |
//!
//! A file system without `ZERO_RANGE` (tmpfs) falls back to `PUNCH_HOLE`,
//! and without either to writing zeroes, so discarded and zeroed ranges of a
//! file always read back as zeroes. The size comes from fstat for a file
//! and from seeking to the end for a block device (the same as
//! `BLKGETSIZE64`), rounded down to the logical block size.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use super::sys;
use crate::block::{
    BlockDevice, BufferAccess, Completion, DeviceInfo, DiscardInfo, IoError, Op, OpKind, Request,
    SubmitError,
};

/// Alignment of the bounce buffers (enough for `O_DIRECT` on any device).
const BOUNCE_ALIGN: usize = 4096;

/// How to open a [`FileDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileConfig {
    /// Requests in flight at once (slots); at least 1.
    pub queue_depth: u32,
    /// Worker threads; at least 1.
    pub workers: usize,
    /// Longest read or write in bytes (each slot's bounce buffer); rounded
    /// down to the logical block size.
    pub max_transfer: u32,
    /// Open with `O_DIRECT` (bypass the page cache). Offsets and lengths are
    /// then multiples of the logical block size, which must be the device's
    /// (or the file system's) direct-IO alignment.
    pub direct: bool,
    /// Open read-only and refuse writes.
    pub read_only: bool,
    /// Logical block size of a regular file (a block device reports its
    /// own).
    pub file_block_size: u32,
}

impl Default for FileConfig {
    /// 64 slots, 4 workers, 128 KiB transfers, buffered, read-write, 512-byte
    /// blocks.
    fn default() -> Self {
        Self {
            queue_depth: 64,
            workers: 4,
            max_transfer: 128 * 1024,
            direct: false,
            read_only: false,
            file_block_size: 512,
        }
    }
}

/// What a worker does for one slot. `Op<()>`: the caller's buffer stays on
/// the loop side; the worker uses the slot's bounce buffer.
type SlotOp = Op<()>;

/// One request slot, shared between the loop and the workers.
struct Slot {
    op: SlotOp,
    /// `max_transfer + BOUNCE_ALIGN` bytes; the data starts at `align`.
    bounce: Box<[u8]>,
    align: usize,
    /// The worker's outcome: `Err(errno)`.
    result: Result<(), i32>,
}

impl Slot {
    fn data(&self, len: u32) -> &[u8] {
        &self.bounce[self.align..self.align + len as usize]
    }

    fn data_mut(&mut self, len: u32) -> &mut [u8] {
        &mut self.bounce[self.align..self.align + len as usize]
    }
}

/// A fixed-capacity FIFO of slot indices (capacity = queue depth).
struct IndexRing {
    entries: Box<[u32]>,
    head: usize,
    len: usize,
}

impl IndexRing {
    fn new(capacity: usize) -> Self {
        Self {
            entries: vec![0; capacity].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// Appends `index`; false if full (never, with one entry per slot).
    fn push(&mut self, index: u32) -> bool {
        if self.len == self.entries.len() {
            return false;
        }
        let tail = (self.head + self.len) % self.entries.len();
        self.entries[tail] = index;
        self.len += 1;
        true
    }

    fn pop(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let index = self.entries[self.head];
        self.head = (self.head + 1) % self.entries.len();
        self.len -= 1;
        Some(index)
    }
}

/// The submitted ring and the shutdown flag, under one mutex.
struct WorkQueue {
    submitted: IndexRing,
    shutdown: bool,
}

/// State shared by the loop and the workers.
struct Shared {
    file: File,
    block_device: bool,
    slots: Box<[Mutex<Slot>]>,
    work: Mutex<WorkQueue>,
    work_ready: Condvar,
    done: Mutex<IndexRing>,
    /// A wake-up byte is (about to be) in the socket and not yet drained.
    wake_pending: AtomicBool,
    wake_sender: UnixStream,
}

/// Locks `mutex`, ignoring poisoning: a worker that panicked mid-IO leaves
/// plain data (the slot's result stays an error or stale), never a broken
/// invariant.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The loop's record of an in-flight slot.
#[derive(Clone, Copy)]
struct Pending<H> {
    tag: u64,
    kind: OpKind,
    buffer: Option<H>,
    len: u32,
}

/// A hosted file or block device behind a worker pool. See the module docs.
pub struct FileDevice<H> {
    info: DeviceInfo,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Per slot: the request in flight there, if any.
    pending: Box<[Option<Pending<H>>]>,
    /// Free slot indices (a stack with capacity for all slots).
    free: Vec<u32>,
    wake_receiver: UnixStream,
}

impl<H: Copy> FileDevice<H> {
    /// Opens `path` (an existing file or block device) and starts the
    /// workers.
    ///
    /// # Errors
    ///
    /// The OS error from open, fstat or the block-size ioctls;
    /// `InvalidInput` for a zero queue depth, worker count or transfer size,
    /// or a device smaller than one block.
    pub fn open(path: impl AsRef<Path>, config: &FileConfig) -> io::Result<Self> {
        let invalid = |what| io::Error::new(io::ErrorKind::InvalidInput, what);
        if config.queue_depth == 0 || config.workers == 0 {
            return Err(invalid("queue depth and workers must be at least 1"));
        }
        let mut options = OpenOptions::new();
        options.read(true).write(!config.read_only);
        if config.direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let mut file = options.open(path)?;
        let block_device = file.metadata()?.file_type().is_block_device();
        let (logical, physical, raw_size) = if block_device {
            let (logical, physical) = sys::block_sizes(file.as_fd())?;
            (logical, physical, file.seek(SeekFrom::End(0))?)
        } else {
            let logical = config.file_block_size;
            (logical, logical.max(4096), file.metadata()?.len())
        };
        if logical == 0 || !logical.is_power_of_two() {
            return Err(invalid("logical block size must be a power of two"));
        }
        let size = raw_size - raw_size % u64::from(logical);
        let max_transfer = config.max_transfer - config.max_transfer % logical;
        if size == 0 || max_transfer == 0 {
            return Err(invalid("device or transfer size below one block"));
        }
        let info = DeviceInfo {
            size,
            logical_block_size: logical,
            physical_block_size: physical.max(logical),
            max_transfer,
            queue_depth: config.queue_depth,
            volatile_write_cache: true,
            fua: true,
            discard: Some(DiscardInfo {
                granularity: physical.max(logical),
                zeroes_data: !block_device,
            }),
            write_zeroes: true,
            read_only: config.read_only,
        };

        let depth = config.queue_depth as usize;
        let slots = (0..depth)
            .map(|_| {
                let bounce = vec![0u8; max_transfer as usize + BOUNCE_ALIGN].into_boxed_slice();
                let align = bounce.as_ptr().align_offset(BOUNCE_ALIGN);
                Mutex::new(Slot {
                    op: Op::Flush,
                    bounce,
                    align,
                    result: Ok(()),
                })
            })
            .collect();
        let (wake_sender, wake_receiver) = UnixStream::pair()?;
        wake_sender.set_nonblocking(true)?;
        wake_receiver.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            file,
            block_device,
            slots,
            work: Mutex::new(WorkQueue {
                submitted: IndexRing::new(depth),
                shutdown: false,
            }),
            work_ready: Condvar::new(),
            done: Mutex::new(IndexRing::new(depth)),
            wake_pending: AtomicBool::new(false),
            wake_sender,
        });
        let mut device = Self {
            info,
            shared,
            workers: Vec::with_capacity(config.workers),
            pending: vec![None; depth].into_boxed_slice(),
            free: (0..config.queue_depth).rev().collect(),
            wake_receiver,
        };
        for number in 0..config.workers {
            let shared = Arc::clone(&device.shared);
            let worker = std::thread::Builder::new()
                .name(format!("brick-blk-{number}"))
                .spawn(move || work(&shared))?;
            device.workers.push(worker);
        }
        Ok(device)
    }

    /// The wake-up descriptor (as [`BlockDevice::readable_fd`]).
    pub fn raw_fd(&self) -> RawFd {
        self.wake_receiver.as_raw_fd()
    }

    /// Empties the wake-up socket.
    fn drain_wake_ups(&self) {
        let mut sink = [0u8; 64];
        while matches!((&self.wake_receiver).read(&mut sink), Ok(n) if n > 0) {}
    }
}

impl<H: Copy> BlockDevice<H> for FileDevice<H> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    /// Claims a slot, copies a write's data into its bounce buffer and hands
    /// it to the workers.
    fn submit<A: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        self.info.check(&request.op)?;
        // The slot is taken off the free stack only once the request is
        // accepted, so a refusal leaves nothing to undo.
        let index = *self.free.last().ok_or(SubmitError::QueueFull)?;
        {
            // A free slot is in no ring, so no worker holds this lock.
            let mut slot = lock(&self.shared.slots[index as usize]);
            let op: SlotOp = match request.op {
                Op::Read {
                    offset,
                    len,
                    buffer,
                } => {
                    // Refuse a dead buffer now rather than after the IO.
                    buffers
                        .with_slice(buffer, len, |_| ())
                        .map_err(SubmitError::Buffer)?;
                    Op::Read {
                        offset,
                        len,
                        buffer: (),
                    }
                }
                Op::Write {
                    offset,
                    len,
                    buffer,
                    fua,
                } => {
                    let data = slot.data_mut(len);
                    buffers
                        .with_slice(buffer, len, |source| data.copy_from_slice(source))
                        .map_err(SubmitError::Buffer)?;
                    Op::Write {
                        offset,
                        len,
                        buffer: (),
                        fua,
                    }
                }
                Op::Flush => Op::Flush,
                Op::Discard { offset, len } => Op::Discard { offset, len },
                Op::WriteZeroes { offset, len } => Op::WriteZeroes { offset, len },
            };
            slot.op = op;
            slot.result = Err(i32::from(errno::EIO));
        }
        self.free.pop();
        let len = match request.op {
            Op::Read { len, .. } => len,
            _ => 0,
        };
        self.pending[index as usize] = Some(Pending {
            tag: request.tag,
            kind: request.op.kind(),
            buffer: request.op.buffer(),
            len,
        });
        // Cannot overflow: the ring holds one entry per slot.
        let _ = lock(&self.shared.work).submitted.push(index);
        self.shared.work_ready.notify_one();
        Ok(())
    }

    /// Delivers finished slots, copying read data into the caller's buffers.
    /// At most `max` completions; never blocks (the locks are held by
    /// workers only for a ring push or pop).
    fn poll<A: BufferAccess<H> + ?Sized>(
        &mut self,
        _now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize {
        // Drain, then clear the flag, then pop: a worker that finishes after
        // the clear writes a byte this poll does not drain, so a completion
        // left in the ring always leaves the descriptor readable (or, when
        // `max` stopped us, `poll_at` says so).
        self.drain_wake_ups();
        self.shared.wake_pending.store(false, Ordering::SeqCst);
        let mut delivered = 0;
        while delivered < max {
            let Some(index) = lock(&self.shared.done).pop() else {
                break;
            };
            let Some(pending) = self.pending[index as usize].take() else {
                continue; // unreachable: only submitted slots reach the ring
            };
            let result = {
                let slot = lock(&self.shared.slots[index as usize]);
                match (slot.result, pending.kind, pending.buffer) {
                    (Err(code), _, _) => Err(IoError::Io(code)),
                    (Ok(()), OpKind::Read, Some(buffer)) => buffers
                        .with_slice_mut(buffer, pending.len, |target| {
                            target.copy_from_slice(slot.data(pending.len));
                        })
                        .map_err(IoError::Buffer),
                    (Ok(()), _, _) => Ok(()),
                }
            };
            self.free.push(index);
            on_completion(Completion {
                tag: pending.tag,
                kind: pending.kind,
                buffer: pending.buffer,
                result,
            });
            delivered += 1;
        }
        delivered
    }

    fn poll_at(&self) -> Option<u64> {
        (lock(&self.shared.done).len > 0).then_some(0)
    }

    fn in_flight(&self) -> usize {
        self.pending.len() - self.free.len()
    }

    fn readable_fd(&self) -> Option<i32> {
        Some(self.raw_fd())
    }
}

/// A worker: takes submitted slots until shutdown and an empty queue.
fn work(shared: &Shared) {
    loop {
        let index = {
            let mut queue = lock(&shared.work);
            loop {
                if let Some(index) = queue.submitted.pop() {
                    break index;
                }
                if queue.shutdown {
                    return;
                }
                queue = shared
                    .work_ready
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        {
            let mut slot = lock(&shared.slots[index as usize]);
            let op = slot.op;
            slot.result = execute(shared, &mut slot, &op).map_err(|error| errno(&error));
        }
        lock(&shared.done).push(index);
        // One byte per batch: the loop clears the flag after draining.
        if !shared.wake_pending.swap(true, Ordering::AcqRel) {
            let _ = (&shared.wake_sender).write(&[1]);
        }
    }
}

/// The positive errno of an OS error (`EIO` without one).
fn errno(error: &io::Error) -> i32 {
    error
        .raw_os_error()
        .filter(|&code| code > 0)
        .unwrap_or(i32::from(errno::EIO))
}

/// Whether `error` means "this file system or device cannot do that".
fn not_supported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL | libc::ENOSYS)
    )
}

/// Runs one request on the worker.
fn execute(shared: &Shared, slot: &mut Slot, op: &SlotOp) -> io::Result<()> {
    let file = &shared.file;
    match *op {
        Op::Read { offset, len, .. } => file.read_exact_at(slot.data_mut(len), offset),
        Op::Write {
            offset, len, fua, ..
        } => {
            file.write_all_at(slot.data(len), offset)?;
            if fua {
                file.sync_data()?;
            }
            Ok(())
        }
        Op::Flush => file.sync_data(),
        Op::Discard { offset, len } => {
            let len = u64::from(len);
            if shared.block_device {
                return sys::block_discard(file.as_fd(), offset, len);
            }
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            match sys::fallocate(file.as_fd(), punch, offset, len) {
                Err(error) if not_supported(&error) => write_zeroes(file, slot, offset, len),
                other => other,
            }
        }
        Op::WriteZeroes { offset, len } => {
            let len = u64::from(len);
            if shared.block_device {
                return sys::block_zero_out(file.as_fd(), offset, len);
            }
            let zero = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            match sys::fallocate(file.as_fd(), zero, offset, len) {
                Err(error) if not_supported(&error) => {
                    match sys::fallocate(file.as_fd(), punch, offset, len) {
                        Err(error) if not_supported(&error) => {
                            write_zeroes(file, slot, offset, len)
                        }
                        other => other,
                    }
                }
                other => other,
            }
        }
    }
}

/// Writes zeroes over `len` bytes at `offset`, a bounce buffer at a time.
fn write_zeroes(file: &File, slot: &mut Slot, offset: u64, len: u64) -> io::Result<()> {
    let chunk = (slot.bounce.len() - BOUNCE_ALIGN) as u64;
    let mut done = 0;
    while done < len {
        let step = chunk.min(len - done) as u32;
        let zeroes = slot.data_mut(step);
        zeroes.fill(0);
        file.write_all_at(zeroes, offset + done)?;
        done += u64::from(step);
    }
    Ok(())
}

impl<H> Drop for FileDevice<H> {
    /// Lets the workers finish what was submitted, then joins them.
    fn drop(&mut self) {
        lock(&self.shared.work).shutdown = true;
        self.shared.work_ready.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_ring_is_a_bounded_fifo() {
        let mut ring = IndexRing::new(3);
        assert_eq!(ring.pop(), None);
        for round in 0..5 {
            assert!(ring.push(round));
            assert!(ring.push(round + 10));
            assert_eq!(ring.pop(), Some(round));
            assert!(ring.push(round + 20));
            assert!(ring.push(round + 30));
            assert!(!ring.push(99), "full at capacity");
            assert_eq!(ring.pop(), Some(round + 10));
            assert_eq!(ring.pop(), Some(round + 20));
            assert_eq!(ring.pop(), Some(round + 30));
            assert_eq!(ring.pop(), None);
        }
    }

    #[test]
    fn open_refuses_bad_configs() {
        let path = std::env::temp_dir().join(format!("brick-hal-file-{}", std::process::id()));
        File::create(&path).unwrap().set_len(100).unwrap();
        let open = |config: &FileConfig| FileDevice::<()>::open(&path, config).map(|_| ());
        let kind = |result: io::Result<()>| result.unwrap_err().kind();
        let zero_depth = FileConfig {
            queue_depth: 0,
            ..FileConfig::default()
        };
        assert_eq!(kind(open(&zero_depth)), io::ErrorKind::InvalidInput);
        // 100 bytes: less than one 512-byte block.
        assert_eq!(
            kind(open(&FileConfig::default())),
            io::ErrorKind::InvalidInput
        );
        let odd_block = FileConfig {
            file_block_size: 1000,
            ..FileConfig::default()
        };
        assert_eq!(kind(open(&odd_block)), io::ErrorKind::InvalidInput);
        let _ = std::fs::remove_file(&path);
        assert_eq!(kind(open(&FileConfig::default())), io::ErrorKind::NotFound);
    }
}

//! A volume in memory: `RamDisk`.
//!
//! Portable (`no_std`, no `unsafe`, no allocation): the disk is any
//! `AsRef<[u8]> + AsMut<[u8]>` storage the owner allocated once (a boxed
//! slice hosted, a boot-time pool region in the image). A request runs to
//! the end inside [`submit`](BlockDevice::submit) — a read fills the
//! caller's buffer, a write copies from it, discard and write-zeroes zero
//! the range — and its completion waits in a fixed queue of `QUEUE` entries
//! until the next [`poll`](BlockDevice::poll) delivers it. So the caller
//! sees the same submit-then-poll shape as with any other device, and a
//! full completion queue is the device's queue depth.
//!
//! RAM is never durable, but nothing is cached either: the device reports
//! no volatile write cache, honours FUA trivially and treats flush as a
//! no-op that completes.

use heapless::Deque;

use super::{
    BlockDevice, BufferAccess, Completion, DeviceInfo, DiscardInfo, IoError, Op, Request,
    SubmitError,
};

/// The logical block size a [`RamDisk`] uses unless told otherwise.
pub const DEFAULT_BLOCK_SIZE: u32 = 512;

/// A block device over memory, with room for `QUEUE` undelivered
/// completions.
///
/// ```
/// use hal::block::{ram::RamDisk, BlockDevice, BufferAccess, BufferError, Op, Request};
///
/// // The caller's buffers: here a plain array of byte vectors.
/// struct Buffers(Vec<Vec<u8>>);
/// impl BufferAccess<usize> for Buffers {
///     fn with_slice<R>(&self, b: usize, len: u32, f: impl FnOnce(&[u8]) -> R)
///         -> Result<R, BufferError> {
///         let buffer = self.0.get(b).ok_or(BufferError::Stale)?;
///         Ok(f(buffer.get(..len as usize).ok_or(BufferError::TooShort)?))
///     }
///     fn with_slice_mut<R>(&mut self, b: usize, len: u32, f: impl FnOnce(&mut [u8]) -> R)
///         -> Result<R, BufferError> {
///         let buffer = self.0.get_mut(b).ok_or(BufferError::Stale)?;
///         Ok(f(buffer.get_mut(..len as usize).ok_or(BufferError::TooShort)?))
///     }
/// }
///
/// let mut disk: RamDisk<_, usize, 8> = RamDisk::new(vec![0u8; 1 << 20]);
/// let mut buffers = Buffers(vec![vec![7; 4096], vec![0; 4096]]);
/// let write = Op::Write { offset: 8192, len: 4096, buffer: 0, fua: false };
/// disk.submit(Request { tag: 1, op: write }, &mut buffers)?;
/// let read = Op::Read { offset: 8192, len: 4096, buffer: 1 };
/// disk.submit(Request { tag: 2, op: read }, &mut buffers)?;
/// let mut tags = Vec::new();
/// disk.poll(0, &mut buffers, 16, &mut |done| tags.push((done.tag, done.result)));
/// assert_eq!(tags, [(1, Ok(())), (2, Ok(()))]);
/// assert_eq!(buffers.0[1], vec![7; 4096]);
/// # Ok::<(), hal::block::SubmitError>(())
/// ```
pub struct RamDisk<S, H, const QUEUE: usize> {
    storage: S,
    info: DeviceInfo,
    completions: Deque<Completion<H>, QUEUE>,
}

impl<S: AsRef<[u8]> + AsMut<[u8]>, H: Copy, const QUEUE: usize> RamDisk<S, H, QUEUE> {
    /// A disk over `storage` (contents kept) with 512-byte blocks; a
    /// trailing partial block is not used.
    pub fn new(storage: S) -> Self {
        Self::with_block_size(storage, DEFAULT_BLOCK_SIZE)
    }

    /// A disk over `storage` with `block_size`-byte logical and physical
    /// blocks.
    ///
    /// # Panics
    ///
    /// If `block_size` is zero (a programming error).
    pub fn with_block_size(storage: S, block_size: u32) -> Self {
        assert!(block_size > 0, "RamDisk: block size must be non-zero");
        let len = storage.as_ref().len() as u64;
        let size = len - len % u64::from(block_size);
        let info = DeviceInfo {
            size,
            logical_block_size: block_size,
            physical_block_size: block_size,
            max_transfer: u32::MAX - (u32::MAX % block_size),
            queue_depth: u32::try_from(QUEUE).unwrap_or(u32::MAX),
            volatile_write_cache: false,
            fua: true,
            discard: Some(DiscardInfo {
                granularity: block_size,
                zeroes_data: true,
            }),
            write_zeroes: true,
            read_only: false,
        };
        Self {
            storage,
            info,
            completions: Deque::new(),
        }
    }

    /// Makes the disk refuse writes, discards and write-zeroes.
    pub fn read_only(mut self) -> Self {
        self.info.read_only = true;
        self
    }

    /// The whole disk, for inspection.
    pub fn contents(&self) -> &[u8] {
        self.storage.as_ref()
    }

    /// Gives the storage back.
    pub fn into_inner(self) -> S {
        self.storage
    }

    /// Runs the checked `op` against the storage.
    fn execute<A: BufferAccess<H> + ?Sized>(
        &mut self,
        op: &Op<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        let Some((offset, len)) = op.range() else {
            return Ok(()); // flush: nothing cached
        };
        // `DeviceInfo::check` bounded `offset + len` by `size`, which is at
        // most the storage length, so both conversions and the range hold.
        let start = usize::try_from(offset).map_err(|_| SubmitError::OutOfRange)?;
        let end = start
            .checked_add(usize::try_from(len).map_err(|_| SubmitError::OutOfRange)?)
            .ok_or(SubmitError::OutOfRange)?;
        let disk = self
            .storage
            .as_mut()
            .get_mut(start..end)
            .ok_or(SubmitError::OutOfRange)?;
        match *op {
            Op::Read { buffer, len, .. } => buffers
                .with_slice_mut(buffer, len, |data| data.copy_from_slice(disk))
                .map_err(SubmitError::Buffer),
            Op::Write { buffer, len, .. } => buffers
                .with_slice(buffer, len, |data| disk.copy_from_slice(data))
                .map_err(SubmitError::Buffer),
            Op::Discard { .. } | Op::WriteZeroes { .. } => {
                disk.fill(0);
                Ok(())
            }
            Op::Flush => Ok(()),
        }
    }
}

impl<S: AsRef<[u8]> + AsMut<[u8]>, H: Copy, const QUEUE: usize> BlockDevice<H>
    for RamDisk<S, H, QUEUE>
{
    fn info(&self) -> DeviceInfo {
        self.info
    }

    /// Runs the request at once; its completion waits for the next `poll`.
    fn submit<A: BufferAccess<H> + ?Sized>(
        &mut self,
        request: Request<H>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        self.info.check(&request.op)?;
        if self.completions.is_full() {
            return Err(SubmitError::QueueFull);
        }
        self.execute(&request.op, buffers)?;
        let completion = Completion {
            tag: request.tag,
            kind: request.op.kind(),
            buffer: request.op.buffer(),
            result: Ok::<(), IoError>(()),
        };
        // Cannot fail: fullness was checked above.
        self.completions
            .push_back(completion)
            .map_err(|_| SubmitError::QueueFull)
    }

    fn poll<A: BufferAccess<H> + ?Sized>(
        &mut self,
        _now: u64,
        _buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<H>),
    ) -> usize {
        let mut delivered = 0;
        while delivered < max {
            let Some(completion) = self.completions.pop_front() else {
                break;
            };
            on_completion(completion);
            delivered += 1;
        }
        delivered
    }

    fn poll_at(&self) -> Option<u64> {
        (!self.completions.is_empty()).then_some(0)
    }

    fn in_flight(&self) -> usize {
        self.completions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BufferError;

    struct One(Vec<u8>);

    impl BufferAccess<()> for One {
        fn with_slice<R>(
            &self,
            (): (),
            len: u32,
            f: impl FnOnce(&[u8]) -> R,
        ) -> Result<R, BufferError> {
            Ok(f(self
                .0
                .get(..len as usize)
                .ok_or(BufferError::TooShort)?))
        }

        fn with_slice_mut<R>(
            &mut self,
            (): (),
            len: u32,
            f: impl FnOnce(&mut [u8]) -> R,
        ) -> Result<R, BufferError> {
            Ok(f(self
                .0
                .get_mut(..len as usize)
                .ok_or(BufferError::TooShort)?))
        }
    }

    #[test]
    fn refusals() {
        let mut disk: RamDisk<_, (), 2> = RamDisk::new([0u8; 4096 + 100]);
        let mut buffer = One(vec![1; 1024]);
        assert_eq!(disk.info().size, 4096);
        let write = |offset, len| Request {
            tag: 0,
            op: Op::Write {
                offset,
                len,
                buffer: (),
                fua: true,
            },
        };
        assert_eq!(
            disk.submit(write(4096, 512), &mut buffer),
            Err(SubmitError::OutOfRange)
        );
        assert_eq!(
            disk.submit(write(u64::MAX - 511, 512), &mut buffer),
            Err(SubmitError::OutOfRange)
        );
        assert_eq!(
            disk.submit(write(1, 512), &mut buffer),
            Err(SubmitError::Misaligned)
        );
        assert_eq!(
            disk.submit(write(0, 2048), &mut buffer),
            Err(SubmitError::Buffer(BufferError::TooShort))
        );
        disk.submit(write(0, 512), &mut buffer).unwrap();
        disk.submit(write(512, 512), &mut buffer).unwrap();
        assert_eq!(
            disk.submit(write(1024, 512), &mut buffer),
            Err(SubmitError::QueueFull)
        );
        assert_eq!(disk.poll_at(), Some(0));
        assert_eq!(disk.poll(0, &mut buffer, 1, &mut |_| {}), 1);
        assert_eq!(disk.in_flight(), 1);
        assert_eq!(disk.poll(0, &mut buffer, 8, &mut |_| {}), 1);
        assert_eq!(disk.poll_at(), None);
        assert_eq!(&disk.contents()[..1024], &[1; 1024][..]);

        let mut disk = disk.read_only();
        assert_eq!(
            disk.submit(write(0, 512), &mut buffer),
            Err(SubmitError::ReadOnly)
        );
        let zero = Request {
            tag: 0,
            op: Op::<()>::WriteZeroes {
                offset: 0,
                len: 512,
            },
        };
        assert_eq!(disk.submit(zero, &mut buffer), Err(SubmitError::ReadOnly));
    }
}

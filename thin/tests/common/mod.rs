//! A pool device for tests: RAM with a volatile write cache, completions
//! in random order, and a crash that keeps only what a real disk must keep
//! (flushed or FUA writes) plus any random subset of the rest (completed
//! or in flight), replayed in completion order.

#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;

use hal::block::{
    BlockDevice, BufferAccess, BufferError, Completion, DeviceInfo, DiscardInfo, IoError, Op,
    Request, SubmitError,
};
use thin::format::BLOCK;
use thin::PoolBuf;

/// A write the disk has seen: data `None` is zeroes.
#[derive(Clone)]
struct Logged {
    offset: u64,
    len: u32,
    data: Option<Vec<u8>>,
    durable: bool,
    /// Completion order (flushes cover what completed before them).
    seq: u64,
}

struct Pending<H> {
    request: Request<PoolBuf<H>>,
    data: Option<Vec<u8>>,
    /// For a flush: completions before its submission are covered.
    covers: u64,
}

/// Counters of what reached the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub reads: u64,
    pub writes: u64,
    /// Writes inside the metadata area (below `meta_end`).
    pub meta_writes: u64,
    pub flushes: u64,
    pub zeroes: u64,
}

pub struct Media {
    /// What is durable.
    durable: Vec<u8>,
    /// What reads see.
    visible: Vec<u8>,
    /// Completed writes since the last fold into `durable`.
    log: Vec<Logged>,
    completed: u64,
    pub counts: Counts,
    pub meta_end: u64,
}

/// The device; clone the `Rc` to crash it from outside.
pub struct CrashDisk<H> {
    pub media: Rc<RefCell<Media>>,
    queue: Vec<Pending<H>>,
    done: Vec<Completion<PoolBuf<H>>>,
    rng: u64,
    info: DeviceInfo,
}

pub fn rng_next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

impl<H: Copy> CrashDisk<H> {
    pub fn new(size: usize, seed: u64) -> Self {
        Self::from_image(vec![0; size], seed)
    }

    pub fn from_image(image: Vec<u8>, seed: u64) -> Self {
        let size = image.len() as u64;
        Self {
            media: Rc::new(RefCell::new(Media {
                visible: image.clone(),
                durable: image,
                log: Vec::new(),
                completed: 0,
                counts: Counts::default(),
                meta_end: 2 << 20,
            })),
            queue: Vec::new(),
            done: Vec::new(),
            rng: seed | 1,
            info: DeviceInfo {
                size,
                logical_block_size: BLOCK as u32,
                physical_block_size: BLOCK as u32,
                max_transfer: 256 << 10,
                queue_depth: 64,
                volatile_write_cache: true,
                fua: true,
                discard: Some(DiscardInfo {
                    granularity: BLOCK as u32,
                    zeroes_data: true,
                }),
                write_zeroes: true,
                read_only: false,
            },
        }
    }

    /// The same disk with room for `depth` requests in flight (a small
    /// queue makes the thin layer retry refused submissions).
    pub fn with_queue_depth(mut self, depth: u32) -> Self {
        self.info.queue_depth = depth;
        self
    }

    /// The image a power cut leaves: durable writes, plus for each other
    /// write (completed, then in flight) a coin toss, in order.
    pub fn crash(&self, seed: u64) -> Vec<u8> {
        let media = self.media.borrow();
        let mut image = media.durable.clone();
        let mut rng = seed | 1;
        let in_flight = self.queue.iter().filter_map(|p| match p.request.op {
            Op::Write { offset, len, .. } => Some(Logged {
                offset,
                len,
                data: p.data.clone(),
                durable: false,
                seq: 0,
            }),
            Op::WriteZeroes { offset, len } | Op::Discard { offset, len } => Some(Logged {
                offset,
                len,
                data: None,
                durable: false,
                seq: 0,
            }),
            _ => None,
        });
        let completed: Vec<Logged> = media.log.iter().cloned().chain(in_flight).collect();
        for entry in completed {
            if entry.durable || rng_next(&mut rng) % 2 == 0 {
                apply(&mut image, &entry);
            }
        }
        image
    }

    fn execute(
        &mut self,
        pending: Pending<H>,
        buffers: &mut impl BufferAccess<PoolBuf<H>>,
    ) -> Result<(), IoError> {
        let mut media = self.media.borrow_mut();
        let media = &mut *media;
        let seq = media.completed;
        media.completed += 1;
        match pending.request.op {
            Op::Read {
                offset,
                len,
                buffer,
            } => {
                media.counts.reads += 1;
                let from = &media.visible[offset as usize..(offset + u64::from(len)) as usize];
                buffers
                    .with_slice_mut(buffer, len, |b| b.copy_from_slice(from))
                    .map_err(IoError::Buffer)
            }
            Op::Write {
                offset, len, fua, ..
            } => {
                media.counts.writes += 1;
                if offset < media.meta_end {
                    media.counts.meta_writes += 1;
                }
                let entry = Logged {
                    offset,
                    len,
                    data: pending.data,
                    durable: fua,
                    seq,
                };
                apply(&mut media.visible, &entry);
                media.log.push(entry);
                Ok(())
            }
            Op::WriteZeroes { offset, len } | Op::Discard { offset, len } => {
                media.counts.zeroes += 1;
                let entry = Logged {
                    offset,
                    len,
                    data: None,
                    durable: false,
                    seq,
                };
                apply(&mut media.visible, &entry);
                media.log.push(entry);
                Ok(())
            }
            Op::Flush => {
                media.counts.flushes += 1;
                for entry in media.log.iter_mut().filter(|e| e.seq < pending.covers) {
                    entry.durable = true;
                }
                if media.log.iter().all(|e| e.durable) {
                    for entry in std::mem::take(&mut media.log) {
                        apply(&mut media.durable, &entry);
                    }
                }
                Ok(())
            }
        }
    }
}

fn apply(image: &mut [u8], entry: &Logged) {
    let range = entry.offset as usize..(entry.offset + u64::from(entry.len)) as usize;
    match &entry.data {
        Some(data) => image[range].copy_from_slice(data),
        None => image[range].fill(0),
    }
}

impl<H: Copy> BlockDevice<PoolBuf<H>> for CrashDisk<H> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn submit<A: BufferAccess<PoolBuf<H>> + ?Sized>(
        &mut self,
        request: Request<PoolBuf<H>>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        self.info.check(&request.op)?;
        if self.queue.len() + self.done.len() >= self.info.queue_depth as usize {
            return Err(SubmitError::QueueFull);
        }
        let data = match request.op {
            Op::Write { len, buffer, .. } => Some(
                buffers
                    .with_slice(buffer, len, <[u8]>::to_vec)
                    .map_err(SubmitError::Buffer)?,
            ),
            _ => None,
        };
        let covers = self.media.borrow().completed;
        self.queue.push(Pending {
            request,
            data,
            covers,
        });
        Ok(())
    }

    fn poll<A: BufferAccess<PoolBuf<H>> + ?Sized>(
        &mut self,
        _now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(Completion<PoolBuf<H>>),
    ) -> usize {
        // Finish a random number of the queued requests, in random order.
        if !self.queue.is_empty() {
            let count = 1 + rng_next(&mut self.rng) as usize % self.queue.len();
            for _ in 0..count {
                let index = rng_next(&mut self.rng) as usize % self.queue.len();
                let pending = self.queue.swap_remove(index);
                let request = pending.request;
                let mut wrapped = Wrap(buffers);
                let result = self.execute(pending, &mut wrapped);
                self.done.push(Completion {
                    tag: request.tag,
                    kind: request.op.kind(),
                    buffer: request.op.buffer(),
                    result,
                });
            }
        }
        let count = self.done.len().min(max);
        for completion in self.done.drain(..count) {
            on_completion(completion);
        }
        count
    }

    fn poll_at(&self) -> Option<u64> {
        (!self.queue.is_empty() || !self.done.is_empty()).then_some(0)
    }

    fn in_flight(&self) -> usize {
        self.queue.len() + self.done.len()
    }
}

/// A `?Sized` accessor as a sized one.
struct Wrap<'a, A: ?Sized>(&'a mut A);

impl<H, A: BufferAccess<H> + ?Sized> BufferAccess<H> for Wrap<'_, A> {
    fn with_slice<R>(&self, b: H, len: u32, f: impl FnOnce(&[u8]) -> R) -> Result<R, BufferError> {
        self.0.with_slice(b, len, f)
    }
    fn with_slice_mut<R>(
        &mut self,
        b: H,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        self.0.with_slice_mut(b, len, f)
    }
}

/// The caller's buffers: a vector of byte vectors, handle = index.
pub struct Buffers(pub Vec<Vec<u8>>);

impl BufferAccess<usize> for Buffers {
    fn with_slice<R>(
        &self,
        b: usize,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError> {
        let buffer = self.0.get(b).ok_or(BufferError::Stale)?;
        Ok(f(buffer
            .get(..len as usize)
            .ok_or(BufferError::TooShort)?))
    }
    fn with_slice_mut<R>(
        &mut self,
        b: usize,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        let buffer = self.0.get_mut(b).ok_or(BufferError::Stale)?;
        Ok(f(buffer
            .get_mut(..len as usize)
            .ok_or(BufferError::TooShort)?))
    }
}

pub type Disk = CrashDisk<usize>;
pub type Volume = thin::ThinVolume<Disk, usize>;

/// Runs one request on `volume` to completion, polling every volume of
/// the pool (`others`) as the engine would.
pub fn run(volume: &mut Volume, op: Op<usize>, buffers: &mut Buffers) -> Result<(), IoError> {
    if let Err(error) = volume.submit(Request { tag: 77, op }, buffers) {
        panic!("submit {op:?}: {error}");
    }
    for _ in 0..100_000 {
        let mut result = None;
        volume.poll(0, buffers, 16, &mut |done| {
            assert_eq!(done.tag, 77);
            result = Some(done.result);
        });
        if let Some(result) = result {
            return result;
        }
    }
    panic!("request {op:?} never completed");
}

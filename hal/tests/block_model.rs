//! Model-based tests of every `BlockDevice`: RAM and a hosted file.
//!
//! A random sequence of reads, writes (with and without FUA), flushes,
//! discards and write-zeroes runs with a random in-flight depth and random
//! poll budgets (so completions are collected late and, for the worker
//! pool, out of submission order) against the device and a `Vec<u8>`
//! model, which must agree: each read returns the model's bytes at submit
//! time and the whole device equals the model at the end. As on any block
//! device, overlapping in-flight requests are unordered, so the generator
//! never puts a request in flight that overlaps an in-flight one that
//! writes (or a write over an in-flight read).
//!
//! Also: the refusals (out of range, misaligned, too long, queue full,
//! stale buffer, read-only), the file device's durability across a reopen
//! (flush, FUA) and its fallbacks on tmpfs.

#[path = "common/buffers.rs"]
mod buffers;
use buffers::Buffers;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use hal::block::ram::RamDisk;
use hal::block::{BlockDevice, BufferError, Completion, IoError, Op, OpKind, Request, SubmitError};
use hal::hosted::{wait_readable, FileConfig, FileDevice, MonotonicClock};
use hal::Clock;
use proptest::prelude::*;

const BLOCK: u32 = 512;
const BLOCKS: u64 = 64;
const SIZE: u64 = BLOCKS * BLOCK as u64;
const MAX_BLOCKS: u32 = 16;
const QUEUE: usize = 8;

/// A file in the target's temporary directory (a real file system), removed
/// on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(dir: &Path, size: u64) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "brick-hal-block-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(size).unwrap();
        Self(path)
    }

    fn on_disk(size: u64) -> Self {
        Self::new(Path::new(env!("CARGO_TARGET_TMPDIR")), size)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn file_config(queue_depth: u32) -> FileConfig {
    FileConfig {
        queue_depth,
        workers: 3,
        max_transfer: MAX_BLOCKS * BLOCK,
        ..FileConfig::default()
    }
}

/// Polls until something completes (once, for `max == 0`): waits on the wake-up descriptor when
/// the device says nothing is due, failing on a lost wake-up.
fn poll_some<D: BlockDevice<usize>>(
    device: &mut D,
    buffers: &mut Buffers,
    max: usize,
    on_completion: &mut impl FnMut(Completion<usize>),
) -> usize {
    let clock = MonotonicClock::new();
    let give_up = clock.now() + 10_000_000_000;
    loop {
        let delivered = device.poll(clock.now(), buffers, max, on_completion);
        if delivered > 0 || max == 0 || device.in_flight() == 0 {
            return delivered;
        }
        if device.poll_at().is_none() {
            let fd = device
                .readable_fd()
                .expect("in flight, nothing due and no descriptor: stuck");
            let ready = wait_readable(&[fd], Some(give_up)).unwrap();
            assert!(ready || clock.now() < give_up, "lost wake-up");
        }
    }
}

/// One step of a generated sequence.
#[derive(Clone, Debug)]
enum Step {
    Read {
        block: u64,
        blocks: u32,
    },
    Write {
        block: u64,
        blocks: u32,
        fua: bool,
        seed: u8,
    },
    Flush,
    Discard {
        block: u64,
        blocks: u32,
    },
    WriteZeroes {
        block: u64,
        blocks: u32,
    },
    /// Poll with this budget (waiting if nothing is ready).
    Poll {
        max: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let range = (0..BLOCKS).prop_flat_map(|block| {
        let most = (BLOCKS - block).min(u64::from(MAX_BLOCKS)) as u32;
        (Just(block), 1..=most)
    });
    prop_oneof![
        3 => range.clone().prop_map(|(block, blocks)| Step::Read { block, blocks }),
        3 => (range.clone(), any::<bool>(), any::<u8>())
            .prop_map(|((block, blocks), fua, seed)| Step::Write { block, blocks, fua, seed }),
        1 => Just(Step::Flush),
        1 => range.clone().prop_map(|(block, blocks)| Step::Discard { block, blocks }),
        1 => range.prop_map(|(block, blocks)| Step::WriteZeroes { block, blocks }),
        2 => (0..4usize).prop_map(|max| Step::Poll { max }),
    ]
}

/// What the harness remembers of an in-flight request.
struct InFlight {
    kind: OpKind,
    range: Option<(u64, u64)>,
    buffer: Option<usize>,
    /// A read's expected bytes.
    expected: Option<Vec<u8>>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Runs `steps` against `device` and the model; `depth` caps the requests
/// the harness keeps in flight.
fn run_model<D: BlockDevice<usize>>(device: &mut D, steps: &[Step], depth: usize) {
    let info = device.info();
    assert_eq!(info.size, SIZE);
    assert!(info.discard.is_some_and(|discard| discard.zeroes_data));
    let mut buffers = Buffers::new(depth, (MAX_BLOCKS * BLOCK) as usize);
    let mut free_buffers: Vec<usize> = (0..depth).collect();
    let mut model = vec![0u8; SIZE as usize];
    let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
    let mut next_tag = 0u64;

    let check = |completion: Completion<usize>,
                 in_flight: &mut HashMap<u64, InFlight>,
                 buffers: &Buffers,
                 free_buffers: &mut Vec<usize>| {
        let request = in_flight
            .remove(&completion.tag)
            .expect("completion for an unknown tag");
        assert_eq!(completion.result, Ok(()), "tag {}", completion.tag);
        assert_eq!(completion.kind, request.kind);
        assert_eq!(completion.buffer, request.buffer);
        if let (Some(expected), Some(buffer)) = (request.expected, request.buffer) {
            assert_eq!(
                &buffers.0[buffer][..expected.len()],
                &expected[..],
                "read {:?}",
                request.range
            );
        }
        if let Some(buffer) = request.buffer {
            free_buffers.push(buffer);
        }
    };

    for step in steps {
        let (op, range): (Op<usize>, Option<(u64, u64)>) = match *step {
            Step::Poll { max } => {
                let mut done = Vec::new();
                poll_some(device, &mut buffers, max, &mut |c| done.push(c));
                for completion in done {
                    check(completion, &mut in_flight, &buffers, &mut free_buffers);
                }
                continue;
            }
            Step::Flush => (Op::Flush, None),
            Step::Read { block, blocks }
            | Step::Write { block, blocks, .. }
            | Step::Discard { block, blocks }
            | Step::WriteZeroes { block, blocks } => {
                let offset = block * u64::from(BLOCK);
                let len = blocks * BLOCK;
                let range = Some((offset, offset + u64::from(len)));
                let op = match *step {
                    Step::Read { .. } => Op::Read {
                        offset,
                        len,
                        buffer: usize::MAX,
                    },
                    Step::Write { fua, .. } => Op::Write {
                        offset,
                        len,
                        buffer: usize::MAX,
                        fua,
                    },
                    Step::Discard { .. } => Op::Discard { offset, len },
                    _ => Op::WriteZeroes { offset, len },
                };
                (op, range)
            }
        };
        // Respect the ordering contract: no overlap with an in-flight
        // request if either writes.
        let writes = !matches!(op, Op::Read { .. } | Op::Flush);
        let conflict = range.is_some_and(|range| {
            in_flight.values().any(|other| {
                (writes || other.kind != OpKind::Read)
                    && other.range.is_some_and(|o| overlaps(range, o))
            })
        });
        if conflict {
            continue;
        }
        // Make room: the harness's depth, and a buffer for data ops.
        while in_flight.len() >= depth || (op.buffer().is_some() && free_buffers.is_empty()) {
            let mut done = Vec::new();
            poll_some(device, &mut buffers, usize::MAX, &mut |c| done.push(c));
            for completion in done {
                check(completion, &mut in_flight, &buffers, &mut free_buffers);
            }
        }
        let op = match op {
            Op::Read { offset, len, .. } => Op::Read {
                offset,
                len,
                buffer: free_buffers.pop().unwrap(),
            },
            Op::Write {
                offset, len, fua, ..
            } => {
                let buffer = free_buffers.pop().unwrap();
                let Step::Write { seed, .. } = *step else {
                    unreachable!()
                };
                for (i, byte) in buffers.0[buffer][..len as usize].iter_mut().enumerate() {
                    *byte = seed.wrapping_add(i as u8).wrapping_mul(31) | 1;
                }
                Op::Write {
                    offset,
                    len,
                    buffer,
                    fua,
                }
            }
            other => other,
        };
        let expected = match op {
            Op::Read { offset, len, .. } => {
                Some(model[offset as usize..(offset + u64::from(len)) as usize].to_vec())
            }
            Op::Write {
                offset,
                len,
                buffer,
                ..
            } => {
                model[offset as usize..(offset + u64::from(len)) as usize]
                    .copy_from_slice(&buffers.0[buffer][..len as usize]);
                None
            }
            Op::Discard { offset, len } | Op::WriteZeroes { offset, len } => {
                model[offset as usize..(offset + u64::from(len)) as usize].fill(0);
                None
            }
            Op::Flush => None,
        };
        let tag = next_tag;
        next_tag += 1;
        device
            .submit(Request { tag, op }, &mut buffers)
            .expect("a valid request within the depth is accepted");
        in_flight.insert(
            tag,
            InFlight {
                kind: op.kind(),
                range,
                buffer: op.buffer(),
                expected,
            },
        );
    }
    // Drain, then compare the whole device with the model.
    while device.in_flight() > 0 {
        let mut done = Vec::new();
        poll_some(device, &mut buffers, usize::MAX, &mut |c| done.push(c));
        for completion in done {
            check(completion, &mut in_flight, &buffers, &mut free_buffers);
        }
    }
    assert!(in_flight.is_empty());
    assert_eq!(read_all(device, &mut buffers), model);
}

/// Reads the whole device through buffer 0.
fn read_all<D: BlockDevice<usize>>(device: &mut D, buffers: &mut Buffers) -> Vec<u8> {
    let size = device.info().size;
    let chunk = u64::from(MAX_BLOCKS * BLOCK);
    let mut contents = Vec::new();
    let mut offset = 0;
    while offset < size {
        let len = chunk.min(size - offset) as u32;
        let op = Op::Read {
            offset,
            len,
            buffer: 0,
        };
        device.submit(Request { tag: offset, op }, buffers).unwrap();
        let mut result = None;
        while result.is_none() {
            poll_some(device, buffers, 1, &mut |c| result = Some(c.result));
        }
        assert_eq!(result, Some(Ok(())));
        contents.extend_from_slice(&buffers.0[0][..len as usize]);
        offset += u64::from(len);
    }
    contents
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn ram_disk_matches_model(steps in prop::collection::vec(step(), 1..120), depth in 1..=QUEUE) {
        let mut disk: RamDisk<_, usize, QUEUE> =
            RamDisk::with_block_size(vec![0u8; SIZE as usize], BLOCK);
        run_model(&mut disk, &steps, depth);
    }

    #[test]
    fn file_device_matches_model(steps in prop::collection::vec(step(), 1..120), depth in 1..=QUEUE) {
        let file = TempFile::on_disk(SIZE);
        let mut device = FileDevice::open(&file.0, &file_config(QUEUE as u32)).unwrap();
        run_model(&mut device, &steps, depth);
    }
}

/// The refusals every device makes, and queue-full at its depth.
fn refusals<D: BlockDevice<usize>>(device: &mut D) {
    let info = device.info();
    let depth = info.queue_depth as usize;
    let mut buffers = Buffers::new(2, (MAX_BLOCKS * BLOCK) as usize);
    let submit =
        |device: &mut D, buffers: &mut Buffers, op| device.submit(Request { tag: 9, op }, buffers);
    let read = |offset, len| Op::Read {
        offset,
        len,
        buffer: 0,
    };
    assert_eq!(
        submit(device, &mut buffers, read(SIZE, BLOCK)),
        Err(SubmitError::OutOfRange)
    );
    assert_eq!(
        submit(
            device,
            &mut buffers,
            read(SIZE - u64::from(BLOCK), 2 * BLOCK)
        ),
        Err(SubmitError::OutOfRange)
    );
    assert_eq!(
        submit(
            device,
            &mut buffers,
            Op::Discard {
                offset: u64::MAX - 511,
                len: BLOCK
            }
        ),
        Err(SubmitError::OutOfRange)
    );
    assert_eq!(
        submit(
            device,
            &mut buffers,
            Op::WriteZeroes {
                offset: 0,
                len: u32::MAX - 511
            }
        ),
        Err(SubmitError::OutOfRange)
    );
    assert_eq!(
        submit(device, &mut buffers, read(1, BLOCK)),
        Err(SubmitError::Misaligned)
    );
    assert_eq!(
        submit(device, &mut buffers, read(0, 100)),
        Err(SubmitError::Misaligned)
    );
    if info.max_transfer < MAX_BLOCKS * BLOCK * 2 {
        assert_eq!(
            submit(device, &mut buffers, read(0, info.max_transfer + BLOCK)),
            Err(SubmitError::TooLong)
        );
    }
    assert_eq!(
        submit(
            device,
            &mut buffers,
            Op::Read {
                offset: 0,
                len: BLOCK,
                buffer: 7
            }
        ),
        Err(SubmitError::Buffer(BufferError::Stale))
    );
    assert_eq!(
        submit(
            device,
            &mut buffers,
            Op::Write {
                offset: 0,
                len: BLOCK,
                buffer: 7,
                fua: false
            }
        ),
        Err(SubmitError::Buffer(BufferError::Stale))
    );
    assert_eq!(device.in_flight(), 0, "refusals leave nothing in flight");
    for _ in 0..depth {
        submit(device, &mut buffers, Op::Flush).unwrap();
    }
    assert_eq!(
        submit(device, &mut buffers, Op::Flush),
        Err(SubmitError::QueueFull)
    );
    assert_eq!(device.in_flight(), depth);
    let mut delivered = 0;
    while delivered < depth {
        delivered += poll_some(device, &mut buffers, 1, &mut |c| {
            assert_eq!(
                (c.tag, c.kind, c.buffer, c.result),
                (9, OpKind::Flush, None, Ok(()))
            );
        });
    }
    assert_eq!(device.in_flight(), 0);
    assert_eq!(device.poll_at(), None);
    submit(device, &mut buffers, Op::Flush).unwrap();
    poll_some(device, &mut buffers, 1, &mut |_| {});
}

#[test]
fn ram_disk_refusals() {
    let mut disk: RamDisk<_, usize, QUEUE> =
        RamDisk::with_block_size(vec![0u8; SIZE as usize], BLOCK);
    refusals(&mut disk);
}

#[test]
fn file_device_refusals() {
    let file = TempFile::on_disk(SIZE);
    let mut device = FileDevice::open(&file.0, &file_config(QUEUE as u32)).unwrap();
    assert!(device.readable_fd().is_some());
    refusals(&mut device);

    let read_only = FileConfig {
        read_only: true,
        ..file_config(2)
    };
    let mut device: FileDevice<usize> = FileDevice::open(&file.0, &read_only).unwrap();
    let mut buffers = Buffers::new(1, BLOCK as usize);
    let write = Op::Write {
        offset: 0,
        len: BLOCK,
        buffer: 0,
        fua: false,
    };
    assert_eq!(
        device.submit(Request { tag: 0, op: write }, &mut buffers),
        Err(SubmitError::ReadOnly)
    );
    let discard = Op::Discard {
        offset: 0,
        len: BLOCK,
    };
    assert_eq!(
        device.submit(
            Request {
                tag: 0,
                op: discard
            },
            &mut buffers
        ),
        Err(SubmitError::ReadOnly)
    );
    assert!(device.info().read_only);
}

/// Submits one request and waits for its completion.
fn run_one(device: &mut FileDevice<usize>, buffers: &mut Buffers, op: Op<usize>) {
    device.submit(Request { tag: 1, op }, buffers).unwrap();
    let mut result = None;
    while result.is_none() {
        poll_some(device, buffers, 1, &mut |c| result = Some(c.result));
    }
    assert_eq!(result, Some(Ok::<(), IoError>(())));
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed ^ (i as u8).wrapping_mul(7)).collect()
}

#[test]
fn file_device_write_flush_survives_reopen() {
    let file = TempFile::on_disk(SIZE);
    let mut buffers = Buffers::new(1, 4096);
    {
        let mut device = FileDevice::open(&file.0, &file_config(4)).unwrap();
        buffers.0[0] = pattern(0x5a, 4096);
        let write = Op::Write {
            offset: 8192,
            len: 4096,
            buffer: 0,
            fua: false,
        };
        run_one(&mut device, &mut buffers, write);
        run_one(&mut device, &mut buffers, Op::Flush);
    }
    let mut device = FileDevice::open(&file.0, &file_config(4)).unwrap();
    buffers.0[0].fill(0);
    let read = Op::Read {
        offset: 8192,
        len: 4096,
        buffer: 0,
    };
    run_one(&mut device, &mut buffers, read);
    assert_eq!(buffers.0[0], pattern(0x5a, 4096));
    assert_eq!(
        std::fs::read(&file.0).unwrap()[8192..12288],
        pattern(0x5a, 4096)[..]
    );
}

#[test]
fn file_device_fua_write_survives_reopen_without_flush() {
    let file = TempFile::on_disk(SIZE);
    let mut buffers = Buffers::new(1, 1024);
    {
        let mut device = FileDevice::open(&file.0, &file_config(4)).unwrap();
        buffers.0[0] = pattern(0xc3, 1024);
        let write = Op::Write {
            offset: 512,
            len: 1024,
            buffer: 0,
            fua: true,
        };
        run_one(&mut device, &mut buffers, write);
    }
    let mut device = FileDevice::open(&file.0, &file_config(4)).unwrap();
    buffers.0[0].fill(0);
    let read = Op::Read {
        offset: 512,
        len: 1024,
        buffer: 0,
    };
    run_one(&mut device, &mut buffers, read);
    assert_eq!(buffers.0[0], pattern(0xc3, 1024));
}

/// tmpfs has neither `ZERO_RANGE` nor `O_DIRECT`: write-zeroes falls back
/// and still zeroes; a direct open is refused cleanly.
#[test]
fn file_device_on_tmpfs() {
    let dir = Path::new("/dev/shm");
    if !dir.is_dir() {
        return;
    }
    let file = TempFile::new(dir, SIZE);
    let mut device = FileDevice::open(&file.0, &file_config(4)).unwrap();
    let mut buffers = Buffers::new(1, 8192);
    buffers.0[0] = vec![0xff; 8192];
    let write = Op::Write {
        offset: 0,
        len: 8192,
        buffer: 0,
        fua: false,
    };
    run_one(&mut device, &mut buffers, write);
    run_one(
        &mut device,
        &mut buffers,
        Op::WriteZeroes {
            offset: 512,
            len: 1024,
        },
    );
    run_one(
        &mut device,
        &mut buffers,
        Op::Discard {
            offset: 4096,
            len: 2048,
        },
    );
    let read = Op::Read {
        offset: 0,
        len: 8192,
        buffer: 0,
    };
    run_one(&mut device, &mut buffers, read);
    let mut expected = vec![0xff; 8192];
    expected[512..1536].fill(0);
    expected[4096..6144].fill(0);
    assert_eq!(buffers.0[0], expected);
    assert_eq!(std::fs::metadata(&file.0).unwrap().len(), SIZE, "size kept");
}

/// `O_DIRECT` on the target directory's file system, when it supports it.
#[test]
fn file_device_direct() {
    let file = TempFile::on_disk(SIZE);
    let config = FileConfig {
        direct: true,
        file_block_size: 4096,
        ..file_config(4)
    };
    let Ok(mut device) = FileDevice::open(&file.0, &config) else {
        return; // no O_DIRECT here
    };
    let mut buffers = Buffers::new(1, 8192);
    buffers.0[0] = pattern(0x11, 8192);
    let write = Op::Write {
        offset: 4096,
        len: 8192,
        buffer: 0,
        fua: true,
    };
    run_one(&mut device, &mut buffers, write);
    buffers.0[0].fill(0);
    run_one(
        &mut device,
        &mut buffers,
        Op::Read {
            offset: 4096,
            len: 8192,
            buffer: 0,
        },
    );
    assert_eq!(buffers.0[0], pattern(0x11, 8192));
    assert_eq!(
        device.submit(
            Request {
                tag: 0,
                op: Op::Read {
                    offset: 512,
                    len: 4096,
                    buffer: 0
                }
            },
            &mut buffers
        ),
        Err(SubmitError::Misaligned)
    );
}

/// A read whose buffer disappears while in flight fails with the buffer
/// error instead of panicking.
#[test]
fn file_device_buffer_gone_at_completion() {
    let file = TempFile::on_disk(SIZE);
    let mut device = FileDevice::open(&file.0, &file_config(2)).unwrap();
    let mut buffers = Buffers::new(1, 512);
    let read = Op::Read {
        offset: 0,
        len: 512,
        buffer: 0,
    };
    device
        .submit(Request { tag: 3, op: read }, &mut buffers)
        .unwrap();
    buffers.0.clear();
    let mut result = None;
    while result.is_none() {
        poll_some(&mut device, &mut buffers, 1, &mut |c| {
            result = Some(c.result)
        });
    }
    let error = result.unwrap().unwrap_err();
    assert_eq!(error, IoError::Buffer(BufferError::Stale));
    assert_eq!(error.errno(), i32::from(errno::EFAULT));
}

/// The worker pool completes in finishing order, not submission order: a
/// FUA write (pwrite + fdatasync) submitted first is overtaken by reads
/// (tried a few times, since thread scheduling decides).
#[test]
fn file_device_completes_out_of_order() {
    let file = TempFile::on_disk(SIZE);
    let mut device = FileDevice::open(&file.0, &file_config(8)).unwrap();
    let mut buffers = Buffers::new(5, 4096);
    let overtaken = (0..50).any(|_| {
        let write = Op::Write {
            offset: 0,
            len: 4096,
            buffer: 0,
            fua: true,
        };
        device
            .submit(Request { tag: 0, op: write }, &mut buffers)
            .unwrap();
        for tag in 1..5u64 {
            let read = Op::Read {
                offset: tag * 4096,
                len: 4096,
                buffer: tag as usize,
            };
            device
                .submit(Request { tag, op: read }, &mut buffers)
                .unwrap();
        }
        let mut order = Vec::new();
        while order.len() < 5 {
            poll_some(&mut device, &mut buffers, 5, &mut |c| order.push(c.tag));
        }
        order[0] != 0
    });
    assert!(overtaken, "a FUA write was never overtaken by reads");
}

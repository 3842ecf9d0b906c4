//! No allocation on the data path: two thin volumes overcommitting one
//! pool run a mix of writes (into new and allocated extents), reads,
//! partial and whole-extent discards, write-zeroes and flushes — so
//! extents are allocated, freed and refused with ENOSPC — while a counting
//! global allocator must see nothing from the first request on (no
//! warm-up: every table is sized when the pool and volumes open).
//!
//! Its own binary without the libtest harness (`harness = false`), so no
//! harness thread allocates while the counter is armed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hal::block::ram::RamDisk;
use hal::block::{BlockDevice, BufferAccess, BufferError, Op, Request};
use thin::{Pool, PoolBuf, PoolConfig, ThinVolume};

static ARMED: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);

fn note() {
    if ARMED.load(Ordering::Relaxed) {
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: alloc_counter::Counting = alloc_counter::Counting::new(note);

const EXTENT: u64 = 2 << 20;
const VOLUME: u64 = 16 * EXTENT;
const DEPTH: usize = 8;

type Disk = RamDisk<Vec<u8>, PoolBuf<usize>, 64>;
type Volume = ThinVolume<Disk, usize>;

struct Buffers(Vec<Vec<u8>>);

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

/// The `n`th request of the mix for buffer `buffer`.
fn op(n: u64, buffer: usize) -> Op<usize> {
    // splitmix64: offsets independent of the op kind and the volume.
    let mut mix = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    mix = (mix ^ (mix >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mix = (mix ^ (mix >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mix ^= mix >> 31;
    let extent = (mix >> 8) % (VOLUME / EXTENT);
    let within = ((mix >> 20) % 448) * 4096;
    let offset = extent * EXTENT + within;
    let len = (1 + (mix >> 40) % 16) as u32 * 4096;
    match (mix >> 52) % 16 {
        0..=6 => Op::Write {
            offset,
            len,
            buffer,
            fua: mix % 7 == 0,
        },
        7..=10 => Op::Read {
            offset,
            len,
            buffer,
        },
        11 => Op::Discard {
            offset: extent * EXTENT,
            len: EXTENT as u32,
        },
        12 => Op::Discard { offset, len },
        13 => Op::WriteZeroes {
            offset: extent * EXTENT,
            len: EXTENT as u32,
        },
        14 => Op::WriteZeroes { offset, len },
        _ => Op::Flush,
    }
}

/// Runs `count` requests from number `first` at depth `DEPTH` per volume;
/// returns (ENOSPC answers, other failures).
fn run(volumes: &mut [Volume; 2], buffers: &mut Buffers, first: u64, count: u64) -> (u64, u64) {
    let mut busy = [[false; DEPTH]; 2];
    let (mut submitted, mut done, mut enospc, mut failed) = (0u64, 0u64, 0u64, 0u64);
    while done < count {
        for (v, volume) in volumes.iter_mut().enumerate() {
            for (slot, in_use) in busy[v].iter_mut().enumerate() {
                if *in_use || submitted >= count {
                    continue;
                }
                let buffer = v * DEPTH + slot;
                let request = Request {
                    tag: slot as u64,
                    op: op(first + submitted, buffer),
                };
                if volume.submit(request, buffers).is_ok() {
                    *in_use = true;
                    submitted += 1;
                }
            }
            volume.poll(0, buffers, 64, &mut |c| {
                busy[v][c.tag as usize] = false;
                done += 1;
                match c.result {
                    Ok(()) => {}
                    Err(e) if e.errno() == 28 => enospc += 1,
                    Err(_) => failed += 1,
                }
            });
        }
    }
    (enospc, failed)
}

fn main() {
    let disk: Disk = RamDisk::with_block_size(vec![0; (13 * EXTENT) as usize], 4096);
    let (pool, _) = Pool::open(disk, &PoolConfig::default()).unwrap();
    let mut volumes = [
        pool.volume("a", VOLUME, DEPTH as u32).unwrap(),
        pool.volume("b", VOLUME, DEPTH as u32).unwrap(),
    ];
    let mut buffers = Buffers(
        (0..2 * DEPTH)
            .map(|i| vec![i as u8 + 1; 64 << 10])
            .collect(),
    );
    let before = pool.stats();
    ARMED.store(true, Ordering::SeqCst);
    let (enospc, failed) = run(&mut volumes, &mut buffers, 0, 20_000);
    ARMED.store(false, Ordering::SeqCst);
    let allocations = COUNT.load(Ordering::SeqCst);
    let after = pool.stats();
    let (allocated, freed) = (
        after.allocations - before.allocations,
        after.frees - before.frees,
    );
    println!(
        "thin no_alloc: 20000 requests, {allocations} heap allocations; {allocated} extents \
         allocated, {freed} freed, {enospc} ENOSPC"
    );
    assert_eq!(failed, 0, "only ENOSPC may fail");
    assert_eq!(after.enospc - before.enospc, enospc);
    assert!(
        enospc > 0 && allocated > 0 && freed > 0,
        "the mix must fill, free and refill the pool"
    );
    assert_eq!(allocations, 0, "allocations on the data path");
    println!("test result: ok");
}

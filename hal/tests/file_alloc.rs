//! No allocation per IO (ARCHITECTURE.md §6): a `FileDevice` and a `RamDisk` run
//! 10,000 IOs after warm-up while a counting global allocator watches every
//! thread (the loop and the workers) and must see zero allocations.
//!
//! Its own test binary without the libtest harness (`harness = false`), so
//! no other test or harness thread allocates while the counter is armed.

#[path = "common/buffers.rs"]
mod buffers;
#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use buffers::Buffers;

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use hal::block::ram::RamDisk;
use hal::block::{BlockDevice, Op, Request};
use hal::hosted::{wait_readable, FileConfig, FileDevice};

use counting_alloc::{ARMED, COUNT};

const BLOCK: u32 = 4096;
const BLOCKS: u64 = 256;
const DEPTH: usize = 16;
const WARM_UP: u64 = 2_000;
const MEASURED: u64 = 10_000;

/// The `number`th IO of the steady-state mix, using buffer `buffer`.
fn op(number: u64, buffer: usize) -> Op<usize> {
    let offset = (number.wrapping_mul(2_654_435_761) % BLOCKS) * u64::from(BLOCK);
    match number % 10 {
        0..=3 => Op::Write {
            offset,
            len: BLOCK,
            buffer,
            fua: false,
        },
        4..=7 => Op::Read {
            offset,
            len: BLOCK,
            buffer,
        },
        8 => Op::WriteZeroes { offset, len: BLOCK },
        _ if number % 1000 == 9 => Op::Flush,
        _ => Op::Read {
            offset,
            len: BLOCK,
            buffer,
        },
    }
}

/// Keeps `DEPTH` IOs in flight until `count` have completed, starting at
/// IO number `first`. Returns the failed completions.
fn run<D: BlockDevice<usize>>(
    device: &mut D,
    buffers: &mut Buffers,
    free: &mut Vec<usize>,
    first: u64,
    count: u64,
) -> u64 {
    let mut next = first;
    let mut completed = 0;
    let mut failed = 0;
    while completed < count {
        while next < first + count {
            let Some(&buffer) = free.last() else { break };
            let request = Request {
                tag: buffer as u64,
                op: op(next, buffer),
            };
            if device.submit(request, buffers).is_err() {
                break;
            }
            free.pop();
            next += 1;
        }
        let delivered = device.poll(0, buffers, DEPTH, &mut |completion| {
            failed += u64::from(completion.result.is_err());
            free.push(completion.tag as usize);
        });
        completed += delivered as u64;
        if delivered == 0 && device.poll_at().is_none() {
            if let Some(fd) = device.readable_fd() {
                let _ = wait_readable(&[fd], None);
            }
        }
    }
    failed
}

fn measure<D: BlockDevice<usize>>(name: &str, device: &mut D) {
    let mut buffers = Buffers(vec![vec![0xa5; BLOCK as usize]; DEPTH]);
    let mut free: Vec<usize> = Vec::with_capacity(DEPTH);
    free.extend(0..DEPTH);
    assert_eq!(run(device, &mut buffers, &mut free, 0, WARM_UP), 0);
    COUNT.store(0, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    let failed = run(device, &mut buffers, &mut free, WARM_UP, MEASURED);
    ARMED.store(false, Ordering::SeqCst);
    let allocations = COUNT.load(Ordering::SeqCst);
    assert_eq!(failed, 0);
    assert_eq!(
        allocations, 0,
        "{name}: {allocations} allocations in {MEASURED} IOs"
    );
    println!("{name}: {MEASURED} IOs, 0 allocations");
}

fn main() {
    // The counter sees allocations at all (from any thread).
    ARMED.store(true, Ordering::SeqCst);
    std::thread::spawn(|| drop(std::hint::black_box(Box::new(1u64))))
        .join()
        .unwrap();
    ARMED.store(false, Ordering::SeqCst);
    assert!(
        COUNT.load(Ordering::SeqCst) > 0,
        "counting allocator inactive"
    );

    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("brick-hal-alloc-{}", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .set_len(BLOCKS * u64::from(BLOCK))
        .unwrap();
    let config = FileConfig {
        queue_depth: DEPTH as u32,
        workers: 4,
        max_transfer: BLOCK,
        ..FileConfig::default()
    };
    let mut device = FileDevice::open(&path, &config).unwrap();
    measure("FileDevice", &mut device);
    drop(device);
    let _ = std::fs::remove_file(&path);

    let mut disk: RamDisk<_, usize, DEPTH> =
        RamDisk::new(vec![0u8; (BLOCKS * u64::from(BLOCK)) as usize]);
    measure("RamDisk", &mut disk);
}

//! Thin volumes against the crash disk: allocation, zero reads, ENOSPC,
//! frees, metadata cost, reopen, and the check at open.

mod common;

use common::{run, Buffers, CrashDisk, Disk};
use hal::block::{BlockDevice, IoError, Op};
use thin::format::{encode_map, Layout, BLOCK, DEFAULT_EXTENT};
use thin::{Pool, PoolConfig};

const MIB: u64 = 1 << 20;
const EXTENT: u64 = DEFAULT_EXTENT as u64;

/// A pool with `extents` data extents (2 MiB of metadata area first).
fn pool(extents: u64, seed: u64) -> (Pool<Disk, usize>, thin::OpenReport) {
    Pool::open(
        CrashDisk::new(((extents + 1) * EXTENT) as usize, seed),
        &PoolConfig::default(),
    )
    .unwrap()
}

fn write(offset: u64, len: u32) -> Op<usize> {
    Op::Write {
        offset,
        len,
        buffer: 0,
        fua: false,
    }
}

fn read(offset: u64, len: u32) -> Op<usize> {
    Op::Read {
        offset,
        len,
        buffer: 1,
    }
}

fn buffers(fill: u8) -> Buffers {
    Buffers(vec![vec![fill; 256 << 10], vec![0xee; 256 << 10]])
}

#[test]
fn unallocated_reads_are_zero_without_pool_io() {
    let (pool, report) = pool(4, 1);
    assert!(report.formatted);
    assert_eq!(report.extents, 4);
    let mut volume = pool.volume("a", 64 * MIB, 8).unwrap();
    let mut bufs = buffers(5);
    let before = pool.with_device(|d| d.media.borrow().counts);
    run(&mut volume, read(10 * MIB, 65536), &mut bufs).unwrap();
    assert!(bufs.0[1][..65536].iter().all(|&b| b == 0));
    assert_eq!(pool.with_device(|d| d.media.borrow().counts), before);
    assert_eq!(volume.allocated(), 0);
}

#[test]
fn one_metadata_write_per_allocation_none_after() {
    let (pool, _) = pool(4, 2);
    let mut volume = pool.volume("a", 64 * MIB, 8).unwrap();
    let mut bufs = buffers(7);
    let counts = || pool.with_device(|d| d.media.borrow().counts);
    let before = counts();
    run(&mut volume, write(3 * MIB, 8192), &mut bufs).unwrap();
    let after = counts();
    assert_eq!(
        after.meta_writes - before.meta_writes,
        1,
        "map writes per allocation"
    );
    assert_eq!(
        after.writes - before.writes,
        2,
        "the data and the map block"
    );
    assert_eq!(
        after.flushes - before.flushes,
        1,
        "data durable before the map"
    );
    assert_eq!(volume.allocated(), 1);
    run(&mut volume, write(3 * MIB + 65536, 4096), &mut bufs).unwrap();
    let again = counts();
    assert_eq!(again.meta_writes, after.meta_writes);
    assert_eq!(again.writes - after.writes, 1);
    assert_eq!(again.flushes, after.flushes);
    // The rest of the new extent reads zeroes, the written part the data.
    run(&mut volume, read(2 * MIB, 256 << 10), &mut bufs).unwrap();
    assert!(bufs.0[1].iter().all(|&b| b == 0));
    run(&mut volume, read(3 * MIB, 8192), &mut bufs).unwrap();
    assert!(bufs.0[1][..8192].iter().all(|&b| b == 7));
}

#[test]
fn enospc_only_for_the_write_that_needs_an_extent() {
    let (pool, _) = pool(2, 3);
    let mut a = pool.volume("a", 16 * MIB, 8).unwrap();
    let mut b = pool.volume("b", 16 * MIB, 8).unwrap();
    let mut bufs = buffers(1);
    run(&mut a, write(0, 4096), &mut bufs).unwrap();
    run(&mut b, write(4 * MIB, 4096), &mut bufs).unwrap();
    assert_eq!(pool.free_extents(), 0);
    let full = run(&mut a, write(8 * MIB, 4096), &mut bufs);
    assert_eq!(full, Err(IoError::Io(28)));
    assert_eq!(full.unwrap_err().errno(), 28);
    // Allocated extents and reads keep working, on both volumes.
    run(&mut a, write(MIB, 4096), &mut bufs).unwrap();
    run(&mut b, write(5 * MIB, 4096), &mut bufs).unwrap();
    run(&mut b, read(8 * MIB, 4096), &mut bufs).unwrap();
    // A discard of a whole extent frees it for the other volume.
    run(
        &mut a,
        Op::Discard {
            offset: 0,
            len: EXTENT as u32,
        },
        &mut bufs,
    )
    .unwrap();
    assert_eq!(a.allocated(), 0);
    assert_eq!(pool.free_extents(), 1);
    run(&mut b, write(10 * MIB, 4096), &mut bufs).unwrap();
    assert_eq!(b.allocated(), 2);
    // The freed extent, reused, shows nothing of its old owner.
    run(&mut b, read(10 * MIB - 2 * MIB + 2 * MIB, 4096), &mut bufs).unwrap();
    assert!(bufs.0[1][..4096].iter().all(|&x| x == 1));
    run(&mut b, read(10 * MIB + 4096, 4096), &mut bufs).unwrap();
    assert!(bufs.0[1][..4096].iter().all(|&x| x == 0));
}

#[test]
fn partial_discards_zero_whole_ones_free() {
    let (pool, _) = pool(4, 4);
    let mut volume = pool.volume("a", 16 * MIB, 8).unwrap();
    let mut bufs = buffers(9);
    for offset in [0, 256 << 10, 2 * MIB, 2 * MIB + (256 << 10)] {
        run(&mut volume, write(offset, 256 << 10), &mut bufs).unwrap();
    }
    assert_eq!(volume.allocated(), 2);
    // 1 MiB into extent 0 through the end of extent 1: zeroes extent 0's
    // tail, frees extent 1.
    let op = Op::WriteZeroes {
        offset: MIB,
        len: (3 * MIB) as u32,
    };
    run(&mut volume, op, &mut bufs).unwrap();
    assert_eq!(volume.allocated(), 1);
    run(&mut volume, read(0, 256 << 10), &mut bufs).unwrap();
    assert!(bufs.0[1].iter().all(|&b| b == 9));
    run(&mut volume, read(2 * MIB, 256 << 10), &mut bufs).unwrap();
    assert!(bufs.0[1].iter().all(|&b| b == 0));
    let op = Op::Discard {
        offset: 0,
        len: (256 << 10) as u32,
    };
    run(&mut volume, op, &mut bufs).unwrap();
    run(&mut volume, read(0, 256 << 10), &mut bufs).unwrap();
    assert!(bufs.0[1].iter().all(|&b| b == 0));
    assert_eq!(volume.allocated(), 1);
}

#[test]
fn a_write_across_two_extents() {
    let (pool, _) = pool(4, 5);
    let mut volume = pool.volume("a", 16 * MIB, 8).unwrap();
    let mut bufs = buffers(0);
    for (i, b) in bufs.0[0].iter_mut().enumerate() {
        *b = (i / 4096) as u8 + 1;
    }
    run(&mut volume, write(2 * MIB - 65536, 128 << 10), &mut bufs).unwrap();
    assert_eq!(volume.allocated(), 2);
    run(&mut volume, read(2 * MIB - 65536, 128 << 10), &mut bufs).unwrap();
    assert_eq!(bufs.0[1][..128 << 10], bufs.0[0][..128 << 10]);
}

#[test]
fn reopen_keeps_volumes_and_extents() {
    let (pool, _) = pool(6, 6);
    let mut a = pool.volume("a", 16 * MIB, 8).unwrap();
    let mut b = pool.volume("b", 16 * MIB, 8).unwrap();
    let mut bufs = buffers(3);
    run(&mut a, write(4 * MIB, 4096), &mut bufs).unwrap();
    run(&mut b, write(0, 4096), &mut bufs).unwrap();
    run(&mut b, write(14 * MIB, 4096), &mut bufs).unwrap();
    let image = pool.with_device(|d| d.crash(0));
    drop((a, b, pool));
    let (pool, report) = Pool::open(
        CrashDisk::<usize>::from_image(image, 7),
        &PoolConfig::default(),
    )
    .unwrap();
    assert!(!report.formatted);
    assert_eq!((report.allocated, report.reclaimed), (3, 0));
    let b = pool.volume("b", 16 * MIB, 8).unwrap();
    let mut a = pool.volume("a", 16 * MIB, 8).unwrap();
    let mut extents = Vec::new();
    a.extents(|v, _| extents.push(("a", v)));
    b.extents(|v, _| extents.push(("b", v)));
    assert_eq!(extents, [("a", 2), ("b", 0), ("b", 7)]);
    assert!(pool.volume("a", 16 * MIB, 8).is_err(), "opened twice");
    // Volumes open before IO: a request in flight (its completion not yet
    // polled) refuses a new volume rather than poll it away.
    let mut bufs = buffers(1);
    a.submit(
        hal::block::Request {
            tag: 1,
            op: write(0, 4096),
        },
        &mut bufs,
    )
    .unwrap();
    let err = pool.volume("c", 16 * MIB, 8).err().unwrap();
    assert!(err.to_string().contains("before its IO starts"), "{err}");
    let mut done = 0;
    while done == 0 {
        done = a.poll(0, &mut bufs, 8, &mut |c| assert_eq!(c.result, Ok(())));
    }
    drop(b);
    // Shrinking below an allocated extent would lose data.
    let err = pool.volume("b", 8 * MIB, 8).err().unwrap();
    assert!(err.to_string().contains("shrinking"), "{err}");
}

#[test]
fn foreign_devices_are_refused() {
    let mut image = vec![0u8; (4 * EXTENT) as usize];
    image[..16].copy_from_slice(b"not a pool at al");
    let err = Pool::<_, usize>::open(
        CrashDisk::<usize>::from_image(image, 1),
        &PoolConfig::default(),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("superblock"), "{err}");
}

#[test]
fn check_reclaims_double_claims_and_torn_copies_fall_back() {
    let (pool, _) = pool(6, 8);
    let mut a = pool.volume("a", 16 * MIB, 8).unwrap();
    let mut bufs = buffers(4);
    run(&mut a, write(0, 4096), &mut bufs).unwrap();
    run(&mut a, write(2 * MIB, 4096), &mut bufs).unwrap();
    let mut image = pool.with_device(|d| d.crash(0));
    drop((a, pool));
    let layout = Layout::for_pool(image.len() as u64, DEFAULT_EXTENT).unwrap();
    // Find the newest valid copy of map block 0, make every extent after
    // the two allocated ones claim virtual extent 0 of volume "a" with an
    // older generation, and write it as a newer copy.
    let copy_at = |c: usize| layout.map_offset(0, c as u64) as usize;
    let seqs: Vec<u64> = (0..2)
        .map(|c| thin::format::decode_map(&image[copy_at(c)..copy_at(c) + BLOCK], 0).unwrap_or(0))
        .collect();
    let newest: usize = if seqs[1] > seqs[0] { 1 } else { 0 };
    let current = &image[copy_at(newest)..copy_at(newest) + BLOCK];
    let mut entries: Vec<_> = (0..layout.extent_count as usize)
        .map(|slot| thin::format::map_entry(current, slot))
        .collect();
    assert_eq!(entries.iter().filter(|e| e.volume != 0).count(), 2);
    let claimed = entries
        .iter()
        .find(|e| e.virtual_extent == 0 && e.volume != 0)
        .copied()
        .unwrap();
    entries[4] = thin::format::Entry {
        generation: 0,
        ..claimed
    };
    entries[5] = thin::format::Entry {
        virtual_extent: 1000,
        ..claimed
    };
    let mut block = vec![0u8; BLOCK];
    encode_map(&mut block, 0, seqs[newest] + 1, &entries);
    let other = 1 - newest;
    image[copy_at(other)..copy_at(other) + BLOCK].copy_from_slice(&block);
    let (pool, report) = Pool::<_, usize>::open(
        CrashDisk::<usize>::from_image(image.clone(), 9),
        &PoolConfig::default(),
    )
    .unwrap();
    assert_eq!((report.allocated, report.reclaimed), (2, 2), "{report}");
    drop(pool);
    // A torn newer copy: the older one is used.
    image[copy_at(other) + 100] ^= 0xff;
    let (_, report) = Pool::<_, usize>::open(
        CrashDisk::<usize>::from_image(image, 9),
        &PoolConfig::default(),
    )
    .unwrap();
    assert_eq!((report.allocated, report.reclaimed), (2, 0), "{report}");
}

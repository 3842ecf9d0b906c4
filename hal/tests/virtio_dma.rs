//! DMA regions and the pool: alignment, exhaustion, bounds, windows.

#[path = "common/virtio_mock.rs"]
mod mock;

use hal::dma::{DmaError, DmaRegion};
use mock::{Memory, PHYS_BASE};

#[test]
fn pool_aligns_and_runs_out() {
    let memory = Memory::new(16384);
    let mut pool = memory.pool(0, 16384);
    let a = pool.alloc(3, 1).unwrap();
    let b = pool.alloc(16, 16).unwrap();
    assert_eq!(a.phys(), PHYS_BASE);
    assert_eq!(b.phys(), PHYS_BASE + 16);
    let page = pool.alloc(4096, 4096).unwrap();
    assert_eq!(page.phys() % 4096, 0);
    assert_eq!(pool.alloc(1, 3).unwrap_err(), DmaError::BadAlignment);
    assert_eq!(pool.alloc(1, 8192).unwrap_err(), DmaError::BadAlignment);
    assert_eq!(pool.alloc(16384, 1).unwrap_err(), DmaError::Exhausted);
    assert_eq!(pool.alloc(usize::MAX, 1).unwrap_err(), DmaError::Exhausted);
    let rest = pool.remaining();
    pool.alloc(rest, 1).unwrap();
    assert_eq!(pool.remaining(), 0);
}

#[test]
fn slices_are_zeroed_little_endian_and_checked() {
    let memory = Memory::new(4096);
    let mut pool = memory.pool(0, 4096);
    let slice = pool.alloc(64, 8).unwrap();
    assert!((0..64).all(|i| slice.read_u8(i) == 0));
    slice.write_u64(8, 0x0102_0304_0506_0708);
    assert_eq!(memory.read_u64(PHYS_BASE + 8), 0x0102_0304_0506_0708);
    assert_eq!(memory.bytes(8, 1), [8]);
    assert_eq!(slice.read_u16(8), 0x0708);
    assert_eq!(slice.read_u32(12), 0x0102_0304);
    assert_eq!(slice.phys_at(64), PHYS_BASE + 64);
    let result = std::panic::catch_unwind(|| slice.read_u32(62));
    assert!(result.is_err(), "out-of-range access panics (a driver bug)");
    let result = std::panic::catch_unwind(|| slice.read_u32(2));
    assert!(result.is_err(), "misaligned access panics (a driver bug)");
}

#[test]
fn regions_are_validated_and_windows_translate() {
    let memory = Memory::new(8192);
    let window = memory.window(4096, 1024);
    let inside = memory.bytes(4096 + 10, 20);
    assert_eq!(window.translate(inside), Some(PHYS_BASE + 4096 + 10));
    assert_eq!(window.translate(memory.bytes(4096 + 1020, 8)), None);
    assert_eq!(window.translate(memory.bytes(0, 8)), None);
    assert_eq!(window.translate(&[1, 2, 3]), None);
    let base = memory.bytes(0, 1).as_ptr().cast_mut();
    // SAFETY: rejected before use (virtual and bus addresses disagree).
    let misaligned = unsafe { DmaRegion::new(base, PHYS_BASE + 8, 4096) };
    assert_eq!(misaligned.unwrap_err(), DmaError::Misaligned);
    // SAFETY: rejected before use (null).
    let null = unsafe { DmaRegion::new(std::ptr::null_mut(), 0, 16) };
    assert_eq!(null.unwrap_err(), DmaError::BadRegion);
    // SAFETY: rejected before use (the bus range overflows).
    let overflow = unsafe { DmaRegion::new(base, u64::MAX - 4095, 8192) };
    assert_eq!(overflow.unwrap_err(), DmaError::BadRegion);
}

//! Physical memory bookkeeping: a fixed-capacity free list of ranges.
//!
//! [`FreeRanges`] keeps sorted, disjoint, non-adjacent `[start, end)`
//! ranges in a `heapless::Vec` that lives *outside* the memory it manages,
//! so the bookkeeping needs no `unsafe` and is tested on the host. The
//! image uses it twice:
//!
//! 1. at boot, [`FreeRanges::from_memory_map`] turns the e820 map into the
//!    usable RAM below the identity-mapped limit, minus the image and the
//!    loader's data; the heap and the DMA/registered-memory pool are carved
//!    from it with [`FreeRanges::carve`] (first fit, lowest address);
//! 2. the global allocator is a `FreeRanges` over the heap ranges:
//!    [`FreeRanges::carve`] to allocate, [`FreeRanges::free`] (coalescing
//!    with both neighbours) to release.
//!
//! Every operation is O(capacity). When a free cannot be recorded (the
//! list is full and the range touches no free neighbour) the range is
//! leaked and counted in [`FreeRanges::leaked`]; the engine allocates at
//! boot and rarely frees, so this stays at zero in practice.

use core::fmt;

use super::pvh::{MemoryKind, MemoryRegion};

/// A physical range `[start, end)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Range {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl Range {
    /// Bytes in the range.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:#x}, {:#x}) {}",
            self.start,
            self.end,
            super::pvh::Bytes(self.len())
        )
    }
}

/// Why a carve fails.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CarveError {
    /// No free range holds `len` bytes at `align`.
    NoRoom {
        /// Bytes asked for.
        len: u64,
        /// The largest free range.
        largest: u64,
    },
    /// `align` is not a power of two, or `len` is zero.
    BadRequest,
    /// The list is full and the carve would split a range in two.
    ListFull,
}

impl fmt::Display for CarveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CarveError::NoRoom { len, largest } => write!(
                f,
                "no free range holds {} (largest free range: {})",
                super::pvh::Bytes(*len),
                super::pvh::Bytes(*largest)
            ),
            CarveError::BadRequest => f.write_str("zero length or alignment not a power of two"),
            CarveError::ListFull => f.write_str("free list full"),
        }
    }
}

impl core::error::Error for CarveError {}

/// Sorted, disjoint, non-adjacent free ranges, at most `N` of them.
#[derive(Clone, Debug, Default)]
pub struct FreeRanges<const N: usize> {
    ranges: heapless::Vec<Range, N>,
    leaked: u64,
}

impl<const N: usize> FreeRanges<N> {
    /// No free memory.
    pub const fn new() -> Self {
        FreeRanges {
            ranges: heapless::Vec::new(),
            leaked: 0,
        }
    }

    /// The usable RAM of `map` within `[floor, limit)`, minus every range
    /// of `in_use` (`[start, end)`), each range shrunk to `granule`
    /// alignment (a power of two, e.g. 4096). Overlapping RAM entries are
    /// merged; RAM ranges beyond the capacity are dropped.
    pub fn from_memory_map(
        map: &[MemoryRegion],
        in_use: impl Iterator<Item = (u64, u64)>,
        floor: u64,
        limit: u64,
        granule: u64,
    ) -> Self {
        let mut free = FreeRanges::new();
        for region in map.iter().filter(|r| r.kind == MemoryKind::Ram) {
            let start = align_up(region.start.max(floor), granule);
            let end = region.end().min(limit) & !(granule - 1);
            if let Some(start) = start {
                if start < end {
                    // Union: overlapping RAM entries merge.
                    free.remove(start, end, 1);
                    free.free(start, end - start);
                }
            }
        }
        // Anything a non-RAM entry covers is not RAM, even if a RAM entry
        // overlaps it.
        for region in map.iter().filter(|r| r.kind != MemoryKind::Ram) {
            free.remove(region.start, region.end(), granule);
        }
        for (start, end) in in_use {
            free.remove(start, end, granule);
        }
        free
    }

    /// Takes `[start, end)` (widened to `granule`) out of the free ranges.
    pub fn remove(&mut self, start: u64, end: u64, granule: u64) {
        let start = start & !(granule - 1);
        let end = align_up(end, granule).unwrap_or(u64::MAX);
        let mut i = 0;
        while i < self.ranges.len() {
            let range = self.ranges[i];
            if range.end <= start || range.start >= end {
                i += 1;
                continue;
            }
            let left = Range {
                start: range.start,
                end: start,
            };
            let right = Range {
                start: end,
                end: range.end,
            };
            match (left.start < left.end, right.start < right.end) {
                (false, false) => {
                    self.ranges.remove(i);
                }
                (true, false) => {
                    self.ranges[i] = left;
                    i += 1;
                }
                (false, true) => {
                    self.ranges[i] = right;
                    i += 1;
                }
                (true, true) => {
                    self.ranges[i] = left;
                    if self.ranges.insert(i + 1, right).is_err() {
                        self.leaked += right.len();
                    }
                    i += 2;
                }
            }
        }
    }

    /// Carves `len` bytes aligned to `align` (a power of two) from the
    /// lowest free range that holds them and returns the start.
    ///
    /// # Errors
    ///
    /// [`CarveError`]: no room, a bad request, or a full list (the carve
    /// would split a range and leave no slot for the second half).
    pub fn carve(&mut self, len: u64, align: u64) -> Result<u64, CarveError> {
        if len == 0 || !align.is_power_of_two() {
            return Err(CarveError::BadRequest);
        }
        for i in 0..self.ranges.len() {
            let range = self.ranges[i];
            let Some(start) = align_up(range.start, align) else {
                continue;
            };
            let Some(end) = start.checked_add(len) else {
                continue;
            };
            if end > range.end {
                continue;
            }
            let head = Range {
                start: range.start,
                end: start,
            };
            let tail = Range {
                start: end,
                end: range.end,
            };
            match (head.is_empty(), tail.is_empty()) {
                (true, true) => {
                    self.ranges.remove(i);
                }
                (true, false) => self.ranges[i] = tail,
                (false, true) => self.ranges[i] = head,
                (false, false) => {
                    if self.ranges.is_full() {
                        return Err(CarveError::ListFull);
                    }
                    self.ranges[i] = head;
                    // Cannot fail: checked not full above.
                    let _ = self.ranges.insert(i + 1, tail);
                }
            }
            return Ok(start);
        }
        Err(CarveError::NoRoom {
            len,
            largest: self.largest(),
        })
    }

    /// Returns `[start, start + len)` to the free ranges, merging it with
    /// free neighbours. Returns `false` (and counts the bytes as leaked) if
    /// the list is full and the range touches no neighbour.
    ///
    /// The range must not overlap a free range (a double free); if it does,
    /// it is leaked rather than corrupting the list.
    pub fn free(&mut self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len) else {
            self.leaked = self.leaked.saturating_add(len);
            return false;
        };
        if len == 0 {
            return true;
        }
        // First range that starts at or after `start`.
        let i = self.ranges.partition_point(|r| r.start < start);
        let overlaps_previous = i > 0 && self.ranges[i - 1].end > start;
        let overlaps_next = i < self.ranges.len() && self.ranges[i].start < end;
        if overlaps_previous || overlaps_next {
            self.leaked = self.leaked.saturating_add(len);
            return false;
        }
        let joins_previous = i > 0 && self.ranges[i - 1].end == start;
        let joins_next = i < self.ranges.len() && self.ranges[i].start == end;
        match (joins_previous, joins_next) {
            (true, true) => {
                self.ranges[i - 1].end = self.ranges[i].end;
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1].end = end,
            (false, true) => self.ranges[i].start = start,
            (false, false) => {
                if self.ranges.insert(i, Range { start, end }).is_err() {
                    self.leaked = self.leaked.saturating_add(len);
                    return false;
                }
            }
        }
        true
    }

    /// Whether `[start, end)` lies inside one free range (an empty range
    /// always does).
    pub fn contains(&self, start: u64, end: u64) -> bool {
        start >= end
            || self
                .ranges
                .iter()
                .any(|range| range.start <= start && end <= range.end)
    }

    /// The free ranges, lowest first.
    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// Free bytes in all ranges.
    pub fn total(&self) -> u64 {
        self.ranges.iter().map(Range::len).sum()
    }

    /// Bytes of the largest free range.
    pub fn largest(&self) -> u64 {
        self.ranges.iter().map(Range::len).max().unwrap_or(0)
    }

    /// Bytes freed that could not be recorded (see the module docs).
    pub fn leaked(&self) -> u64 {
        self.leaked
    }

    /// Moves every free range into `other` (to hand what is left after
    /// boot carving to the heap). Ranges `other` cannot hold are leaked
    /// there.
    pub fn drain_into<const M: usize>(&mut self, other: &mut FreeRanges<M>) {
        for range in self.ranges.iter() {
            other.free(range.start, range.len());
        }
        self.ranges.clear();
    }
}

/// `value` rounded up to a multiple of `align` (a power of two), `None` on
/// overflow.
pub fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    const MIB: u64 = 1 << 20;

    fn ram(start: u64, len: u64) -> MemoryRegion {
        MemoryRegion {
            start,
            len,
            kind: MemoryKind::Ram,
        }
    }

    fn reserved(start: u64, len: u64) -> MemoryRegion {
        MemoryRegion {
            start,
            len,
            kind: MemoryKind::Reserved,
        }
    }

    fn r(start: u64, end: u64) -> Range {
        Range { start, end }
    }

    /// QEMU's e820 for `-m 512`, the image at 1 MiB..1.2 MiB and an initrd
    /// near the top.
    #[test]
    fn test_from_memory_map_skips_image_and_modules() {
        let map = [
            ram(0, 0x9fc00),
            reserved(0x9fc00, 0x400),
            reserved(0xf0000, 0x10000),
            ram(MIB, 511 * MIB - 0x20000),
            reserved(0xfffc_0000, 0x40000),
        ];
        let in_use = [(MIB, MIB + 0x3_1234), (0x1fd0_0000, 0x1fd0_0800)];
        let free =
            FreeRanges::<16>::from_memory_map(&map, in_use.iter().copied(), MIB, 4 << 30, 4096);
        assert_eq!(
            free.ranges(),
            &[r(0x13_2000, 0x1fd0_0000), r(0x1fd0_1000, 0x1ffe_0000)]
        );
    }

    #[test]
    fn test_from_memory_map_limits_and_non_ram_wins() {
        let map = [
            ram(MIB, 3 * MIB),
            ram(2 * MIB, 3 * MIB),           // overlaps the first: merged
            reserved(3 * MIB, 4096),         // punches a hole
            ram(4 << 30, 1 << 30),           // above the identity map
            ram(0xc000_0000 - MIB, 2 * MIB), // clipped at the limit
        ];
        let free =
            FreeRanges::<16>::from_memory_map(&map, core::iter::empty(), MIB, 0xc000_0000, 4096);
        assert_eq!(free.leaked(), 0);
        assert_eq!(
            free.ranges(),
            &[
                r(MIB, 3 * MIB),
                r(3 * MIB + 4096, 5 * MIB),
                r(0xc000_0000 - MIB, 0xc000_0000)
            ]
        );
    }

    #[test]
    fn test_carve_aligned_first_fit() {
        let mut free = FreeRanges::<8>::new();
        free.free(0x1000, 0x5000);
        free.free(0x10_0000, 0x10_0000);
        // 0x2000 aligned to 0x4000 does not fit in [0x1000,0x6000) past 0x4000.
        assert_eq!(free.carve(0x3000, 0x4000), Ok(0x10_0000));
        assert_eq!(free.carve(0x2000, 0x4000), Ok(0x4000));
        assert_eq!(free.ranges(), &[r(0x1000, 0x4000), r(0x10_3000, 0x20_0000)]);
        assert_eq!(free.carve(0x3000, 1), Ok(0x1000));
        assert_eq!(free.ranges(), &[r(0x10_3000, 0x20_0000)]);
        assert_eq!(
            free.carve(0x20_0000, 8),
            Err(CarveError::NoRoom {
                len: 0x20_0000,
                largest: 0xf_d000
            })
        );
        assert_eq!(free.carve(0, 8), Err(CarveError::BadRequest));
        assert_eq!(free.carve(8, 3), Err(CarveError::BadRequest));
    }

    /// The image's heap keeps a second list of never-used (zero) memory
    /// and asks it whether an allocation lies wholly inside.
    #[test]
    fn test_contains() {
        let mut pristine = FreeRanges::<4>::new();
        pristine.free(0x1000, 0x3000);
        pristine.free(0x8000, 0x1000);
        assert!(pristine.contains(0x1000, 0x4000));
        assert!(pristine.contains(0x2000, 0x2010));
        assert!(pristine.contains(0x5000, 0x5000)); // empty
        assert!(!pristine.contains(0x3000, 0x9000)); // spans a gap
        assert!(!pristine.contains(0x800, 0x1800));
        pristine.remove(0x1000, 0x1010, 1);
        assert!(!pristine.contains(0x1000, 0x1010));
        assert!(pristine.contains(0x1010, 0x4000));
    }

    #[test]
    fn test_free_coalesces() {
        let mut free = FreeRanges::<4>::new();
        assert!(free.free(0x3000, 0x1000));
        assert!(free.free(0x1000, 0x1000));
        assert!(free.free(0x2000, 0x1000));
        assert_eq!(free.ranges(), &[r(0x1000, 0x4000)]);
        // A double free is leaked, not recorded.
        assert!(!free.free(0x1800, 0x100));
        assert_eq!(free.leaked(), 0x100);
        assert_eq!(free.ranges(), &[r(0x1000, 0x4000)]);
    }

    #[test]
    fn test_full_list_leaks_and_refuses_split() {
        let mut free = FreeRanges::<2>::new();
        assert!(free.free(0x1100, 0xf00));
        assert!(free.free(0x4000, 0x1000));
        assert!(!free.free(0x8000, 0x1000));
        assert_eq!(free.leaked(), 0x1000);
        // Carving at 0x1800 from [0x1100,0x2000) leaves a head and a tail:
        // a third slot is needed.
        assert_eq!(free.carve(0x100, 0x800), Err(CarveError::ListFull));
        // Touching a neighbour still works when full.
        assert!(free.free(0x2000, 0x2000));
        assert_eq!(free.ranges(), &[r(0x1100, 0x5000)]);
    }

    #[test]
    fn test_drain_into() {
        let mut boot = FreeRanges::<4>::new();
        boot.free(0x1000, 0x1000);
        boot.free(0x8000, 0x1000);
        let mut heap = FreeRanges::<4>::new();
        heap.free(0x2000, 0x1000);
        boot.drain_into(&mut heap);
        assert!(boot.ranges().is_empty());
        assert_eq!(heap.ranges(), &[r(0x1000, 0x3000), r(0x8000, 0x9000)]);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc(u64, u32),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..5000, 0u32..8).prop_map(|(len, align)| Op::Alloc(len, align)),
            any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        /// As an allocator: blocks never overlap, are aligned, stay inside
        /// the heap, and freeing everything restores the one range.
        #[test]
        fn prop_allocator(ops in proptest::collection::vec(op(), 1..200)) {
            const BASE: u64 = 0x10_0000;
            const LEN: u64 = 0x4_0000;
            let mut heap = FreeRanges::<256>::new();
            heap.free(BASE, LEN);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(len, align) => {
                        let align = 1u64 << (align + 3);
                        if let Ok(start) = heap.carve(len, align) {
                            prop_assert_eq!(start % align, 0);
                            prop_assert!(start >= BASE && start + len <= BASE + LEN);
                            for &(s, l) in &live {
                                prop_assert!(start + len <= s || s + l <= start);
                            }
                            live.push((start, len));
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (start, len) = live.swap_remove(i % live.len());
                        prop_assert!(heap.free(start, len));
                    }
                    Op::Free(_) => {}
                }
                let free = heap.total();
                let used: u64 = live.iter().map(|&(_, l)| l).sum();
                prop_assert_eq!(free + used, LEN);
                for pair in heap.ranges().windows(2) {
                    prop_assert!(pair[0].end < pair[1].start);
                }
            }
            for (start, len) in live.drain(..) {
                prop_assert!(heap.free(start, len));
            }
            prop_assert_eq!(heap.ranges(), &[r(BASE, BASE + LEN)]);
        }
    }
}

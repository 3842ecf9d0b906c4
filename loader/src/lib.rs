//! The UEFI loader's plain logic: the image's load plan, the memory map in
//! e820 terms and the PVH start info it hands over (host-tested).
//!
//! The loader (`src/main.rs`, a UEFI application) reads `\EFI\BRICK\KERNEL`
//! (the same `brick-image` ELF that QEMU boots with `-kernel`) and the two
//! manifest slots from the ESP it was started from, places the image's
//! segments at their physical addresses, exits boot services and enters
//! the image at its 64-bit entry (`e_entry`) with a PVH `hvm_start_info`
//! (the layout in `target_image::boot::pvh`): the e820 memory map
//! converted from the UEFI one, the ACPI RSDP from the firmware's
//! configuration table, the slots as modules 0 and 1, and a command line
//! with `manifest-slots` and `loader-tsc=N`. Everything here is pure:
//!
//! * [`LoadPlan`]: the `PT_LOAD` segments of an ELF64 x86-64 executable;
//! * [`e820_type`] and [`MemoryMap`]: UEFI memory types to e820 types, and
//!   a sorted, merged, bounded e820 table;
//! * [`Handoff`]: the start info, module list, command line and memory
//!   map table laid out in one region, with the slots' bytes after them.

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

use alloc::vec::Vec;
use core::fmt;

/// Why the image file cannot be loaded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ElfError {
    /// Not an ELF64 little-endian x86-64 file.
    NotElf64,
    /// Not a fixed-address executable (`ET_EXEC`).
    NotExecutable(u16),
    /// A header or segment lies outside the file.
    Truncated,
    /// No `PT_LOAD` segment.
    NothingToLoad,
    /// A segment's file part is longer than its memory part, or its end
    /// overflows, or it lies above 4 GiB.
    BadSegment(u64),
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotElf64 => f.write_str("not an ELF64 little-endian x86-64 file"),
            Self::NotExecutable(kind) => {
                write!(
                    f,
                    "ELF type {kind}, expected 2 (a fixed-address executable)"
                )
            }
            Self::Truncated => f.write_str("truncated ELF file"),
            Self::NothingToLoad => f.write_str("no PT_LOAD segment"),
            Self::BadSegment(at) => write!(f, "bad PT_LOAD segment at {at:#x}"),
        }
    }
}

/// One segment to place.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Segment {
    /// Physical address of its first byte.
    pub address: u64,
    /// Where its bytes start in the file.
    pub file_offset: usize,
    /// Bytes from the file.
    pub file_len: usize,
    /// Bytes in memory (the rest is zeroed).
    pub memory_len: u64,
}

/// The segments of an image and its entry point.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LoadPlan {
    /// `e_entry`: the 64-bit entry.
    pub entry: u64,
    /// The `PT_LOAD` segments, in file order.
    pub segments: Vec<Segment>,
}

impl LoadPlan {
    /// The plan of the ELF file `bytes`.
    ///
    /// # Errors
    ///
    /// [`ElfError`].
    pub fn parse(bytes: &[u8]) -> Result<Self, ElfError> {
        let field = |at: usize, len: usize| -> Result<u64, ElfError> {
            let raw = bytes.get(at..at + len).ok_or(ElfError::Truncated)?;
            Ok(raw.iter().rev().fold(0u64, |n, &b| n << 8 | u64::from(b)))
        };
        if bytes.get(..4) != Some(b"\x7fELF".as_slice())
            || bytes.get(4) != Some(&2)
            || bytes.get(5) != Some(&1)
            || field(18, 2)? != 62
        {
            return Err(ElfError::NotElf64);
        }
        let kind = field(16, 2)? as u16;
        if kind != 2 {
            return Err(ElfError::NotExecutable(kind));
        }
        let entry = field(24, 8)?;
        let phoff = usize::try_from(field(32, 8)?).map_err(|_| ElfError::Truncated)?;
        let phentsize = field(54, 2)? as usize;
        let phnum = field(56, 2)? as usize;
        let mut segments = Vec::new();
        for index in 0..phnum {
            let at = phoff
                .checked_add(index * phentsize)
                .ok_or(ElfError::Truncated)?;
            if field(at, 4)? != 1 {
                continue; // not PT_LOAD
            }
            let offset = field(at + 8, 8)?;
            let address = field(at + 24, 8)?; // p_paddr
            let file_len = field(at + 32, 8)?;
            let memory_len = field(at + 40, 8)?;
            let bad = ElfError::BadSegment(address);
            let end = address.checked_add(memory_len).ok_or(bad)?;
            if file_len > memory_len || end > 1 << 32 {
                return Err(bad);
            }
            let file_offset = usize::try_from(offset).map_err(|_| ElfError::Truncated)?;
            let file_len = usize::try_from(file_len).map_err(|_| ElfError::Truncated)?;
            if file_offset
                .checked_add(file_len)
                .is_none_or(|end| end > bytes.len())
            {
                return Err(ElfError::Truncated);
            }
            segments.push(Segment {
                address,
                file_offset,
                file_len,
                memory_len,
            });
        }
        if segments.is_empty() {
            return Err(ElfError::NothingToLoad);
        }
        Ok(Self { entry, segments })
    }

    /// The page-aligned physical range `[start, end)` covering every
    /// segment (the loader allocates it at once).
    pub fn range(&self) -> (u64, u64) {
        let start = self.segments.iter().map(|s| s.address).min().unwrap_or(0);
        let end = self
            .segments
            .iter()
            .map(|s| s.address + s.memory_len)
            .max()
            .unwrap_or(0);
        (start & !0xfff, end.next_multiple_of(4096))
    }
}

/// e820 RAM.
pub const E820_RAM: u32 = 1;
/// e820 reserved.
pub const E820_RESERVED: u32 = 2;
/// e820 ACPI reclaimable.
pub const E820_ACPI: u32 = 3;
/// e820 ACPI NVS.
pub const E820_NVS: u32 = 4;
/// e820 unusable.
pub const E820_UNUSABLE: u32 = 5;

/// The memory type (OS-defined range, UEFI 2.10 §7.2.1) of the loader's
/// handoff region: reported to the image as reserved, so nothing carves
/// it while the image still reads it.
pub const HANDOFF_MEMORY_TYPE: u32 = 0x8000_b41c;

/// The e820 type of a UEFI memory type once boot services are gone:
/// loader and boot-services memory and conventional memory are RAM, ACPI
/// tables reclaimable, ACPI NVS kept, unusable memory unusable, and
/// everything else (runtime services, MMIO, the handoff region, unknown
/// types) reserved.
pub fn e820_type(uefi_type: u32) -> u32 {
    match uefi_type {
        // LoaderCode, LoaderData, BootServicesCode, BootServicesData,
        // ConventionalMemory.
        1..=4 | 7 => E820_RAM,
        8 => E820_UNUSABLE,
        9 => E820_ACPI,
        10 => E820_NVS,
        _ => E820_RESERVED,
    }
}

/// A bounded e820 table: entries sorted by address, adjacent entries of
/// one type merged.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct MemoryMap {
    /// (start, length, e820 type).
    pub entries: Vec<(u64, u64, u32)>,
}

impl MemoryMap {
    /// Builds the table from (start, length, e820 type) ranges in any
    /// order, in `scratch`'s memory and without allocating (boot services
    /// are gone when the loader calls it): `None` if there are more ranges
    /// than `scratch` has capacity for, or more than `max` entries remain
    /// after merging.
    pub fn build_in(
        ranges: impl IntoIterator<Item = (u64, u64, u32)>,
        mut scratch: Vec<(u64, u64, u32)>,
        max: usize,
    ) -> Option<Self> {
        scratch.clear();
        for range in ranges.into_iter().filter(|(_, len, _)| *len > 0) {
            if scratch.len() == scratch.capacity() {
                return None;
            }
            scratch.push(range);
        }
        scratch.sort_unstable_by_key(|(start, _, _)| *start);
        let mut kept = 0usize;
        for index in 0..scratch.len() {
            let (start, len, kind) = scratch[index];
            if kept > 0 {
                let last = &mut scratch[kept - 1];
                if last.2 == kind && last.0 + last.1 == start {
                    last.1 += len;
                    continue;
                }
            }
            scratch[kept] = (start, len, kind);
            kept += 1;
        }
        scratch.truncate(kept);
        (kept <= max).then_some(Self { entries: scratch })
    }

    /// [`build_in`](Self::build_in) with a scratch table of its own.
    pub fn build(ranges: impl IntoIterator<Item = (u64, u64, u32)>, max: usize) -> Option<Self> {
        let ranges: Vec<(u64, u64, u32)> = ranges.into_iter().collect();
        let scratch = Vec::with_capacity(ranges.len());
        Self::build_in(ranges, scratch, max)
    }
}

/// `hvm_start_info.magic`.
const START_INFO_MAGIC: u32 = 0x336e_c578;
/// Bytes of the start info, one module entry, one memory map entry.
const START_INFO_LEN: usize = 56;
const MODULE_LEN: usize = 32;
const MEMMAP_LEN: usize = 24;
/// Room for the command line.
pub const CMDLINE_BYTES: usize = 256;
/// Memory map entries the handoff region holds (the image reads 64).
pub const MEMMAP_ENTRIES: usize = 64;

/// The handoff region: start info at 0, two module entries, the command
/// line, the memory map table, then the two slots' bytes (each at most
/// `slot_bytes`), all at offsets from the region's physical base.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Handoff {
    /// The region's physical address.
    pub base: u64,
    /// The most bytes of one slot.
    pub slot_bytes: usize,
}

impl Handoff {
    const MODULES: usize = START_INFO_LEN.next_multiple_of(64);
    const CMDLINE: usize = Self::MODULES + 2 * MODULE_LEN;
    const MEMMAP: usize = (Self::CMDLINE + CMDLINE_BYTES).next_multiple_of(64);
    const SLOTS: usize = (Self::MEMMAP + MEMMAP_ENTRIES * MEMMAP_LEN).next_multiple_of(4096);

    /// Bytes of the whole region.
    pub fn len(&self) -> usize {
        Self::SLOTS + 2 * self.slot_bytes
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The offset of slot `index` (0 = A, 1 = B) in the region.
    pub fn slot_offset(&self, index: usize) -> usize {
        Self::SLOTS + index * self.slot_bytes
    }

    /// Writes the start info, module list, command line and memory map
    /// into `region` (at least [`len`](Self::len) bytes; the slots' bytes
    /// are the caller's, at [`slot_offset`](Self::slot_offset)).
    /// `slot_lens` are the slots' lengths (0: missing), `cmdline` is cut
    /// to 255 bytes.
    ///
    /// # Panics
    ///
    /// If `region` is shorter than [`len`](Self::len), a slot is longer
    /// than `slot_bytes`, or `memmap` has more than [`MEMMAP_ENTRIES`]
    /// entries (the caller built it with that bound).
    pub fn write(
        &self,
        region: &mut [u8],
        slot_lens: [usize; 2],
        cmdline: &str,
        rsdp: u64,
        memmap: &MemoryMap,
    ) {
        assert!(region.len() >= self.len(), "handoff region too short");
        assert!(slot_lens.iter().all(|len| *len <= self.slot_bytes));
        assert!(memmap.entries.len() <= MEMMAP_ENTRIES);
        let put32 = |region: &mut [u8], at: usize, value: u32| {
            region[at..at + 4].copy_from_slice(&value.to_le_bytes())
        };
        let put64 = |region: &mut [u8], at: usize, value: u64| {
            region[at..at + 8].copy_from_slice(&value.to_le_bytes())
        };
        region[..Self::SLOTS].fill(0);
        let physical = |offset: usize| self.base + offset as u64;
        put32(region, 0, START_INFO_MAGIC);
        put32(region, 4, 1); // version
        put32(region, 12, 2); // nr_modules
        put64(region, 16, physical(Self::MODULES));
        put64(region, 24, physical(Self::CMDLINE));
        put64(region, 32, rsdp);
        put64(region, 40, physical(Self::MEMMAP));
        put32(region, 48, memmap.entries.len() as u32);
        for (index, len) in slot_lens.iter().enumerate() {
            let entry = Self::MODULES + index * MODULE_LEN;
            if *len > 0 {
                put64(region, entry, physical(self.slot_offset(index)));
                put64(region, entry + 8, *len as u64);
            }
        }
        let text = cmdline.as_bytes();
        let text = &text[..text.len().min(CMDLINE_BYTES - 1)];
        region[Self::CMDLINE..Self::CMDLINE + text.len()].copy_from_slice(text);
        for (index, (start, len, kind)) in memmap.entries.iter().enumerate() {
            let entry = Self::MEMMAP + index * MEMMAP_LEN;
            put64(region, entry, *start);
            put64(region, entry + 8, *len);
            put32(region, entry + 16, *kind);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use alloc::vec;
    use target_image::boot::pvh::{BootInfo, OutOfRange, PhysRead};

    /// A minimal ELF64 executable: two PT_LOAD segments and a PT_NOTE.
    fn elf() -> Vec<u8> {
        let mut bytes = vec![0u8; 0x3000];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2;
        bytes[5] = 1;
        bytes[16] = 2; // ET_EXEC
        bytes[18] = 62; // x86-64
        bytes[24..32].copy_from_slice(&0x10_00b3u64.to_le_bytes());
        bytes[32..40].copy_from_slice(&64u64.to_le_bytes());
        bytes[54] = 56;
        bytes[56] = 3;
        let mut header =
            |index: usize, kind: u32, offset: u64, address: u64, file: u64, mem: u64| {
                let at = 64 + index * 56;
                bytes[at..at + 4].copy_from_slice(&kind.to_le_bytes());
                bytes[at + 8..at + 16].copy_from_slice(&offset.to_le_bytes());
                bytes[at + 24..at + 32].copy_from_slice(&address.to_le_bytes());
                bytes[at + 32..at + 40].copy_from_slice(&file.to_le_bytes());
                bytes[at + 40..at + 48].copy_from_slice(&mem.to_le_bytes());
            };
        header(0, 1, 0x1000, 0x10_0000, 0x1000, 0x1000);
        header(1, 4, 0x2000, 0x10_1000, 0x20, 0x20); // PT_NOTE
        header(2, 1, 0x2000, 0x10_1000, 0x800, 0x4_0000); // data + bss
        bytes
    }

    #[test]
    fn the_load_plan_has_the_load_segments_and_entry() {
        let plan = LoadPlan::parse(&elf()).unwrap();
        assert_eq!(plan.entry, 0x10_00b3);
        assert_eq!(plan.segments.len(), 2);
        assert_eq!(
            plan.segments[1],
            Segment {
                address: 0x10_1000,
                file_offset: 0x2000,
                file_len: 0x800,
                memory_len: 0x4_0000
            }
        );
        assert_eq!(plan.range(), (0x10_0000, 0x14_1000));
        let mut bad = elf();
        bad[16] = 3;
        assert_eq!(LoadPlan::parse(&bad), Err(ElfError::NotExecutable(3)));
        assert_eq!(LoadPlan::parse(b"\x7fELF"), Err(ElfError::NotElf64));
        let mut short = elf();
        short.truncate(0x2100);
        assert_eq!(LoadPlan::parse(&short), Err(ElfError::Truncated));
    }

    #[test]
    fn uefi_memory_becomes_a_merged_e820_map() {
        // Conventional, boot services data, loader code: one RAM range;
        // ACPI tables; runtime data; the handoff region.
        let map = MemoryMap::build(
            [
                (0x10_0000, 0x10_0000, e820_type(7)),
                (0, 0xa_0000, e820_type(7)),
                (0x20_0000, 0x1000, e820_type(4)),
                (0x20_1000, 0x1000, e820_type(1)),
                (0x7f00_0000, 0x1_0000, e820_type(9)),
                (0x7f01_0000, 0x1000, e820_type(6)),
                (0x7f02_0000, 0x3000, e820_type(HANDOFF_MEMORY_TYPE)),
            ],
            64,
        )
        .unwrap();
        assert_eq!(
            map.entries,
            [
                (0, 0xa_0000, E820_RAM),
                (0x10_0000, 0x10_2000, E820_RAM),
                (0x7f00_0000, 0x1_0000, E820_ACPI),
                (0x7f01_0000, 0x1000, E820_RESERVED),
                (0x7f02_0000, 0x3000, E820_RESERVED),
            ]
        );
        let many = (0..10u64).map(|i| (i * 0x2000, 0x1000, E820_RAM));
        assert_eq!(MemoryMap::build(many.clone(), 9), None);
        // More ranges than the scratch table holds: refused, not grown.
        assert_eq!(MemoryMap::build_in(many, Vec::with_capacity(4), 64), None);
    }

    /// The region as guest memory at its base, for the image's reader.
    struct Region<'a>(u64, &'a [u8]);

    impl PhysRead for Region<'_> {
        fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), OutOfRange> {
            let error = OutOfRange {
                address,
                len: buffer.len(),
            };
            let start = address.checked_sub(self.0).ok_or(error)? as usize;
            let bytes = self.1.get(start..start + buffer.len()).ok_or(error)?;
            buffer.copy_from_slice(bytes);
            Ok(())
        }
    }

    #[test]
    fn the_image_reads_the_start_info_the_loader_writes() {
        let handoff = Handoff {
            base: 0x7e00_0000,
            slot_bytes: 1 << 20,
        };
        let mut region = vec![0u8; handoff.len()];
        let memmap = MemoryMap::build([(0, 0xa_0000, 1), (0x10_0000, 0x7000_0000, 1)], 64).unwrap();
        handoff.write(
            &mut region,
            [4096, 0],
            "manifest-slots loader-tsc=12345",
            0x7fbf_e014,
            &memmap,
        );
        let info = BootInfo::read(&Region(handoff.base, &region), handoff.base).unwrap();
        assert_eq!(info.cmdline.as_str(), "manifest-slots loader-tsc=12345");
        assert_eq!(info.rsdp, 0x7fbf_e014);
        assert_eq!(info.memory_map.len(), 2);
        assert_eq!(info.memory_map[1].start, 0x10_0000);
        assert_eq!(info.modules.len(), 2);
        assert_eq!(
            info.modules[0].start,
            handoff.base + handoff.slot_offset(0) as u64
        );
        assert_eq!(info.modules[0].len, 4096);
        assert_eq!((info.modules[1].start, info.modules[1].len), (0, 0));
    }
}

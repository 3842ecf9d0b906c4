//! The PVH start info: `hvm_start_info`, its module list and memory map.
//!
//! A PVH loader (QEMU `-kernel` with a `XEN_ELFNOTE_PHYS32_ENTRY` note)
//! enters the image in 32-bit protected mode with `%ebx` holding the
//! physical address of `struct hvm_start_info` (Xen
//! `xen/include/public/arch-x86/hvm/start_info.h`). All fields are
//! little-endian:
//!
//! ```text
//! hvm_start_info (56 bytes, version 1)     hvm_modlist_entry (32 bytes)
//!   0 u32 magic = 0x336ec578                 0 u64 paddr
//!   4 u32 version                            8 u64 size
//!   8 u32 flags                             16 u64 cmdline_paddr
//!  12 u32 nr_modules                        24 u64 reserved
//!  16 u64 modlist_paddr
//!  24 u64 cmdline_paddr                    hvm_memmap_table_entry (24 bytes)
//!  32 u64 rsdp_paddr                         0 u64 addr
//!  40 u64 memmap_paddr     (version >= 1)    8 u64 size
//!  48 u32 memmap_entries   (version >= 1)   16 u32 type (e820: 1 = RAM)
//!  52 u32 reserved                          20 u32 reserved
//! ```
//!
//! [`BootInfo::read`] copies what the image needs into fixed-capacity
//! tables, checking every count against them; the loader is trusted, but a
//! count beyond the tables is an error, not a truncation.

use core::fmt;

/// `hvm_start_info.magic`.
pub const START_INFO_MAGIC: u32 = 0x336e_c578;
/// Bytes of a version 1 `hvm_start_info`.
pub const START_INFO_LEN: usize = 56;
/// Bytes of one `hvm_modlist_entry`.
pub const MODULE_ENTRY_LEN: usize = 32;
/// Bytes of one `hvm_memmap_table_entry`.
pub const MEMMAP_ENTRY_LEN: usize = 24;
/// Memory map entries [`BootInfo`] holds (QEMU gives about 6).
pub const MAX_MEMMAP_ENTRIES: usize = 64;
/// Boot modules [`BootInfo`] holds (QEMU `-initrd` gives one).
pub const MAX_MODULES: usize = 8;
/// Longest command line kept, in bytes.
pub const MAX_CMDLINE: usize = 256;

mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const NR_MODULES: usize = 12;
    pub const MODLIST_PADDR: usize = 16;
    pub const CMDLINE_PADDR: usize = 24;
    pub const RSDP_PADDR: usize = 32;
    pub const MEMMAP_PADDR: usize = 40;
    pub const MEMMAP_ENTRIES: usize = 48;
}

/// Guest-physical memory as the boot code can read it.
pub trait PhysRead {
    /// Copies `buffer.len()` bytes starting at physical `address`.
    ///
    /// # Errors
    ///
    /// [`OutOfRange`] if any byte is outside readable memory.
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), OutOfRange>;
}

/// A physical read outside the memory the reader can reach.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OutOfRange {
    /// First byte asked for.
    pub address: u64,
    /// Bytes asked for.
    pub len: usize,
}

/// e820 memory types (`hvm_memmap_table_entry.type`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MemoryKind {
    /// 1: usable RAM.
    Ram,
    /// 2: reserved.
    Reserved,
    /// 3: ACPI tables, reclaimable once read.
    AcpiReclaimable,
    /// 4: ACPI non-volatile storage.
    AcpiNvs,
    /// 5: bad memory.
    Unusable,
    /// Any other type.
    Unknown(u32),
}

impl MemoryKind {
    /// The kind of an e820 type number.
    pub fn from_e820(kind: u32) -> MemoryKind {
        match kind {
            1 => MemoryKind::Ram,
            2 => MemoryKind::Reserved,
            3 => MemoryKind::AcpiReclaimable,
            4 => MemoryKind::AcpiNvs,
            5 => MemoryKind::Unusable,
            other => MemoryKind::Unknown(other),
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::Ram => f.write_str("ram"),
            MemoryKind::Reserved => f.write_str("reserved"),
            MemoryKind::AcpiReclaimable => f.write_str("acpi"),
            MemoryKind::AcpiNvs => f.write_str("acpi-nvs"),
            MemoryKind::Unusable => f.write_str("unusable"),
            MemoryKind::Unknown(kind) => write!(f, "type {kind}"),
        }
    }
}

/// One memory map entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemoryRegion {
    /// First byte.
    pub start: u64,
    /// Bytes.
    pub len: u64,
    /// What the memory is.
    pub kind: MemoryKind,
}

impl MemoryRegion {
    /// One past the last byte (saturating: a region running off the top of
    /// the address space ends there).
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }
}

/// `[0x0000000000100000, 0x000000001fffffff] ram (510 MiB)`, for the boot log.
impl fmt::Display for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:#018x}, {:#018x}] {} ({})",
            self.start,
            self.end().saturating_sub(1),
            self.kind,
            Bytes(self.len)
        )
    }
}

/// A byte count printed in the largest whole unit (`4 KiB`, `510 MiB`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (unit, name) in UNITS {
            if self.0 >= unit {
                return if self.0 % unit == 0 {
                    write!(f, "{} {name}", self.0 / unit)
                } else {
                    write!(
                        f,
                        "{}.{} {name}",
                        self.0 / unit,
                        (self.0 % unit) * 10 / unit
                    )
                };
            }
        }
        write!(f, "{} B", self.0)
    }
}

/// One boot module (QEMU `-initrd`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Module {
    /// First byte.
    pub start: u64,
    /// Bytes.
    pub len: u64,
    /// Physical address of its NUL-terminated command line, 0 if none.
    pub cmdline: u64,
}

/// Why the start info is refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum BootInfoError {
    /// `magic` is not [`START_INFO_MAGIC`]: not entered by a PVH loader.
    BadMagic(u32),
    /// Version 0 has no memory map, and the image needs one.
    NoMemoryMap {
        /// The start info's version.
        version: u32,
    },
    /// More memory map entries than [`MAX_MEMMAP_ENTRIES`].
    TooManyMemoryRegions(u32),
    /// More modules than [`MAX_MODULES`].
    TooManyModules(u32),
    /// The start info or a table it points to is outside readable memory.
    OutOfRange(OutOfRange),
}

impl From<OutOfRange> for BootInfoError {
    fn from(error: OutOfRange) -> Self {
        BootInfoError::OutOfRange(error)
    }
}

impl fmt::Display for BootInfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootInfoError::BadMagic(magic) => write!(
                f,
                "PVH start info magic {magic:#010x}, expected {START_INFO_MAGIC:#010x}"
            ),
            BootInfoError::NoMemoryMap { version } => {
                write!(f, "PVH start info version {version} has no memory map")
            }
            BootInfoError::TooManyMemoryRegions(n) => {
                write!(f, "{n} memory map entries, at most {MAX_MEMMAP_ENTRIES}")
            }
            BootInfoError::TooManyModules(n) => {
                write!(f, "{n} boot modules, at most {MAX_MODULES}")
            }
            BootInfoError::OutOfRange(OutOfRange { address, len }) => {
                write!(f, "boot data at {address:#x} (+{len}) is out of reach")
            }
        }
    }
}

impl core::error::Error for BootInfoError {}

/// The checked start info: everything the image uses of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootInfo {
    /// Physical address of the `hvm_start_info` itself.
    pub start_info: u64,
    /// `hvm_start_info.version`.
    pub version: u32,
    /// The e820 memory map, in the loader's order.
    pub memory_map: heapless::Vec<MemoryRegion, MAX_MEMMAP_ENTRIES>,
    /// Physical address of the memory map table (to keep it out of pools).
    pub memory_map_table: u64,
    /// Boot modules.
    pub modules: heapless::Vec<Module, MAX_MODULES>,
    /// Physical address of the module list (to keep it out of pools).
    pub module_table: u64,
    /// Physical address of the command line, 0 if none.
    pub cmdline_address: u64,
    /// The command line (up to its NUL, at most [`MAX_CMDLINE`] bytes,
    /// invalid UTF-8 replaced by nothing: it is cut at the first bad byte).
    pub cmdline: heapless::String<MAX_CMDLINE>,
    /// Physical address of the ACPI RSDP, 0 if none.
    pub rsdp: u64,
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(word)
}

impl BootInfo {
    /// Reads and checks the start info at `address`.
    ///
    /// # Errors
    ///
    /// [`BootInfoError`]: a bad magic, no memory map (version 0), a table
    /// larger than this reader holds, or memory `memory` cannot read.
    pub fn read(memory: &impl PhysRead, address: u64) -> Result<BootInfo, BootInfoError> {
        let mut header = [0u8; START_INFO_LEN];
        // A version 0 start info is 40 bytes; read that much first.
        memory.read(address, &mut header[..field::MEMMAP_PADDR])?;
        let magic = u32_at(&header, field::MAGIC);
        if magic != START_INFO_MAGIC {
            return Err(BootInfoError::BadMagic(magic));
        }
        let version = u32_at(&header, field::VERSION);
        if version < 1 {
            return Err(BootInfoError::NoMemoryMap { version });
        }
        memory.read(
            address + field::MEMMAP_PADDR as u64,
            &mut header[field::MEMMAP_PADDR..],
        )?;

        let memory_map_table = u64_at(&header, field::MEMMAP_PADDR);
        let entries = u32_at(&header, field::MEMMAP_ENTRIES);
        if entries as usize > MAX_MEMMAP_ENTRIES {
            return Err(BootInfoError::TooManyMemoryRegions(entries));
        }
        let mut memory_map = heapless::Vec::new();
        for i in 0..u64::from(entries) {
            let mut entry = [0u8; MEMMAP_ENTRY_LEN];
            memory.read(
                table_entry(memory_map_table, i, MEMMAP_ENTRY_LEN)?,
                &mut entry,
            )?;
            // Cannot fail: `entries` was checked against the capacity.
            let _ = memory_map.push(MemoryRegion {
                start: u64_at(&entry, 0),
                len: u64_at(&entry, 8),
                kind: MemoryKind::from_e820(u32_at(&entry, 16)),
            });
        }

        let module_table = u64_at(&header, field::MODLIST_PADDR);
        let count = u32_at(&header, field::NR_MODULES);
        if count as usize > MAX_MODULES {
            return Err(BootInfoError::TooManyModules(count));
        }
        let mut modules = heapless::Vec::new();
        for i in 0..u64::from(count) {
            let mut entry = [0u8; MODULE_ENTRY_LEN];
            memory.read(table_entry(module_table, i, MODULE_ENTRY_LEN)?, &mut entry)?;
            let _ = modules.push(Module {
                start: u64_at(&entry, 0),
                len: u64_at(&entry, 8),
                cmdline: u64_at(&entry, 16),
            });
        }

        let cmdline_address = u64_at(&header, field::CMDLINE_PADDR);
        let cmdline = read_c_string(memory, cmdline_address)?;
        Ok(BootInfo {
            start_info: address,
            version,
            memory_map,
            memory_map_table,
            modules,
            module_table,
            cmdline_address,
            cmdline,
            rsdp: u64_at(&header, field::RSDP_PADDR),
        })
    }

    /// Physical ranges the loader's data occupies (start info, its tables,
    /// the command line and every module), `[start, end)`; pools must not
    /// overlap them. Empty ranges are left out.
    pub fn in_use(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let tables = [
            (self.start_info, START_INFO_LEN as u64),
            (
                self.memory_map_table,
                (self.memory_map.len() * MEMMAP_ENTRY_LEN) as u64,
            ),
            (
                self.module_table,
                (self.modules.len() * MODULE_ENTRY_LEN) as u64,
            ),
            (
                self.cmdline_address,
                if self.cmdline_address == 0 {
                    0
                } else {
                    self.cmdline.len() as u64 + 1
                },
            ),
        ];
        tables
            .into_iter()
            .chain(self.modules.iter().map(|m| (m.start, m.len)))
            .filter(|&(start, len)| start != 0 && len != 0)
            .map(|(start, len)| (start, start.saturating_add(len)))
    }
}

fn table_entry(table: u64, index: u64, entry_len: usize) -> Result<u64, OutOfRange> {
    index
        .checked_mul(entry_len as u64)
        .and_then(|offset| table.checked_add(offset))
        .ok_or(OutOfRange {
            address: table,
            len: entry_len,
        })
}

/// Reads a NUL-terminated string of at most [`MAX_CMDLINE`] bytes; stops
/// at the first byte that is not valid UTF-8 (0 = no string).
fn read_c_string(
    memory: &impl PhysRead,
    address: u64,
) -> Result<heapless::String<MAX_CMDLINE>, OutOfRange> {
    let mut out = heapless::String::new();
    if address == 0 {
        return Ok(out);
    }
    let mut bytes = [0u8; MAX_CMDLINE];
    let mut len = 0;
    while len < MAX_CMDLINE {
        let mut byte = [0u8];
        memory.read(address + len as u64, &mut byte)?;
        if byte[0] == 0 {
            break;
        }
        bytes[len] = byte[0];
        len += 1;
    }
    let text = match core::str::from_utf8(&bytes[..len]) {
        Ok(text) => text,
        Err(error) => core::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or(""),
    };
    // Cannot fail: `text` is at most MAX_CMDLINE bytes.
    let _ = out.push_str(text);
    Ok(out)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// Guest memory as a byte vector starting at physical 0.
    struct FakeMemory(Vec<u8>);

    impl PhysRead for FakeMemory {
        fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), OutOfRange> {
            let error = OutOfRange {
                address,
                len: buffer.len(),
            };
            let start = usize::try_from(address).map_err(|_| error)?;
            let end = start.checked_add(buffer.len()).ok_or(error)?;
            buffer.copy_from_slice(self.0.get(start..end).ok_or(error)?);
            Ok(())
        }
    }

    impl FakeMemory {
        fn put(&mut self, address: usize, bytes: &[u8]) {
            self.0[address..address + bytes.len()].copy_from_slice(bytes);
        }
    }

    const START: usize = 0x1000;
    const MEMMAP: usize = 0x2000;
    const MODLIST: usize = 0x3000;
    const CMDLINE: usize = 0x4000;

    /// A start info as QEMU 7.2 builds it for `-m 512 -initrd x -append ...`.
    fn qemu_like(version: u32, entries: u32) -> FakeMemory {
        let mut memory = FakeMemory(std::vec![0; 0x5000]);
        let mut header = Vec::new();
        header.extend_from_slice(&START_INFO_MAGIC.to_le_bytes());
        header.extend_from_slice(&version.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes()); // flags
        header.extend_from_slice(&1u32.to_le_bytes()); // nr_modules
        header.extend_from_slice(&(MODLIST as u64).to_le_bytes());
        header.extend_from_slice(&(CMDLINE as u64).to_le_bytes());
        header.extend_from_slice(&0xf_5a40u64.to_le_bytes()); // rsdp
        header.extend_from_slice(&(MEMMAP as u64).to_le_bytes());
        header.extend_from_slice(&entries.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(header.len(), START_INFO_LEN);
        memory.put(START, &header);
        let map: [(u64, u64, u32); 4] = [
            (0, 0x9fc00, 1),
            (0x9fc00, 0x400, 2),
            (0xf0000, 0x10000, 2),
            (0x10_0000, 0x1fee_0000, 1),
        ];
        for (i, (start, len, kind)) in map.iter().enumerate() {
            let mut entry = Vec::new();
            entry.extend_from_slice(&start.to_le_bytes());
            entry.extend_from_slice(&len.to_le_bytes());
            entry.extend_from_slice(&kind.to_le_bytes());
            entry.extend_from_slice(&0u32.to_le_bytes());
            memory.put(MEMMAP + i * MEMMAP_ENTRY_LEN, &entry);
        }
        let mut module = Vec::new();
        module.extend_from_slice(&0x1fe0_0000u64.to_le_bytes());
        module.extend_from_slice(&0x1234u64.to_le_bytes());
        module.extend_from_slice(&0u64.to_le_bytes());
        module.extend_from_slice(&0u64.to_le_bytes());
        memory.put(MODLIST, &module);
        memory.put(CMDLINE, b"idle console=ttyS0\0");
        memory
    }

    #[test]
    fn test_parse() {
        let memory = qemu_like(1, 4);
        let info = BootInfo::read(&memory, START as u64).unwrap();
        assert_eq!(info.version, 1);
        assert_eq!(info.memory_map.len(), 4);
        assert_eq!(
            info.memory_map[3],
            MemoryRegion {
                start: 0x10_0000,
                len: 0x1fee_0000,
                kind: MemoryKind::Ram
            }
        );
        assert_eq!(info.memory_map[1].kind, MemoryKind::Reserved);
        assert_eq!(
            info.modules.as_slice(),
            &[Module {
                start: 0x1fe0_0000,
                len: 0x1234,
                cmdline: 0
            }]
        );
        assert_eq!(info.cmdline.as_str(), "idle console=ttyS0");
        assert_eq!(info.rsdp, 0xf_5a40);
    }

    #[test]
    fn test_in_use_covers_tables_and_modules() {
        let memory = qemu_like(1, 4);
        let info = BootInfo::read(&memory, START as u64).unwrap();
        let used: Vec<_> = info.in_use().collect();
        assert_eq!(
            used,
            [
                (0x1000, 0x1000 + 56),
                (0x2000, 0x2000 + 4 * 24),
                (0x3000, 0x3000 + 32),
                (0x4000, 0x4000 + 19),
                (0x1fe0_0000, 0x1fe0_1234),
            ]
        );
    }

    #[test]
    fn test_bad_magic() {
        let mut memory = qemu_like(1, 4);
        memory.put(START, &0x1bad_b002u32.to_le_bytes());
        assert_eq!(
            BootInfo::read(&memory, START as u64),
            Err(BootInfoError::BadMagic(0x1bad_b002))
        );
    }

    #[test]
    fn test_version_0_has_no_memory_map() {
        let memory = qemu_like(0, 4);
        assert_eq!(
            BootInfo::read(&memory, START as u64),
            Err(BootInfoError::NoMemoryMap { version: 0 })
        );
    }

    #[test]
    fn test_too_many_entries() {
        let memory = qemu_like(1, 65);
        assert_eq!(
            BootInfo::read(&memory, START as u64),
            Err(BootInfoError::TooManyMemoryRegions(65))
        );
    }

    #[test]
    fn test_table_out_of_range() {
        let mut memory = qemu_like(1, 4);
        memory.put(START + field::MEMMAP_PADDR, &0x10_0000u64.to_le_bytes());
        assert!(matches!(
            BootInfo::read(&memory, START as u64),
            Err(BootInfoError::OutOfRange(_))
        ));
        assert!(matches!(
            BootInfo::read(&memory, 0x4ff0),
            Err(BootInfoError::OutOfRange(_))
        ));
    }

    #[test]
    fn test_cmdline_cut_at_bad_utf8_and_capacity() {
        let mut memory = qemu_like(1, 4);
        memory.put(CMDLINE, b"ab\xffcd\0");
        let info = BootInfo::read(&memory, START as u64).unwrap();
        assert_eq!(info.cmdline.as_str(), "ab");
        memory.put(CMDLINE, &[b'x'; 300]);
        let info = BootInfo::read(&memory, START as u64).unwrap();
        assert_eq!(info.cmdline.len(), MAX_CMDLINE);
    }

    #[test]
    fn test_display() {
        let region = MemoryRegion {
            start: 0x10_0000,
            len: 0x1fee_0000,
            kind: MemoryKind::Ram,
        };
        assert_eq!(
            std::format!("{region}"),
            "[0x0000000000100000, 0x000000001ffdffff] ram (510.8 MiB)"
        );
        assert_eq!(std::format!("{}", Bytes(4096)), "4 KiB");
        assert_eq!(std::format!("{}", Bytes(17)), "17 B");
    }
}

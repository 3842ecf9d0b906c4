//! The binary boot manifest: a checked, borrowed, allocation-free reader.
//!
//! The image boots from this form (fw_cfg `opt/brick/manifest` or a PVH
//! module). [`Manifest::parse`] checks the whole blob once (header,
//! checksum, section table, every record, every string, every enum code,
//! cross references and duplicates); afterwards every accessor and iterator
//! borrows from the blob and cannot fail. The layout is documented in the
//! crate docs ("Binary format"). With the `std` feature, `encode` writes
//! the form from an owned `Config`.
//!
//! # Contract
//!
//! `parse` never panics and never allocates, for any input; it reads only
//! `bytes[..]` and returns the first problem found as a [`ReadError`]
//! whose `Display` is one line, fit for a serial console.

use core::fmt;
use core::net::Ipv4Addr;

mod admin;
mod pools;

pub use admin::{Admin, ADMIN_VERSION, MAX_ADMIN_SOURCES};
pub use pools::{Pool, PoolBacking, POOLS_VERSION};

use crate::types::{
    bounds, check_backing_path, check_device_path, check_name, check_serial, check_session_pattern,
    is_host_address, pattern_matches, AccessMode, Ipv4Cidr, LimitError, Limits, MacAddress,
    PciAddress, Size, TextError, VirtioSelector, VolumeKind, MAX_ACCESS_RULES, MAX_INTERFACES,
    MAX_VOLUMES, SIZE_ALIGN,
};

/// The first four bytes of every manifest: `BRKM`.
pub const MAGIC: [u8; 4] = *b"BRKM";
/// The format version this crate writes; it reads every version from
/// [`MIN_FORMAT_VERSION`] to this one.
pub const FORMAT_VERSION: u16 = 4;
/// The oldest format version this crate reads (version 1 has no NVMe
/// volumes; versions 1 and 2 have a 16-byte limits record without the
/// half-open limits and the setup timeout, which read as their defaults;
/// otherwise the layouts agree).
pub const MIN_FORMAT_VERSION: u16 = 1;
/// The last format version whose limits record is 16 bytes.
const SHORT_LIMITS_VERSION: u16 = 2;
/// Bytes before the section table.
pub const HEADER_LEN: usize = 24;
/// Bytes per section-table entry.
pub const SECTION_ENTRY_LEN: usize = 12;
/// Most sections a blob may declare.
pub const MAX_SECTIONS: u16 = 16;

/// Byte offsets inside the header (all little-endian).
pub mod field {
    use core::ops::Range;
    /// `BRKM`.
    pub const MAGIC: Range<usize> = 0..4;
    /// Format version, u16.
    pub const VERSION: Range<usize> = 4..6;
    /// Header flags, u16, must be zero.
    pub const FLAGS: Range<usize> = 6..8;
    /// Length of the whole blob, u32.
    pub const TOTAL_LEN: Range<usize> = 8..12;
    /// CRC-32 (IEEE) of every byte except these four, u32.
    pub const CRC: Range<usize> = 12..16;
    /// Number of section-table entries, u16.
    pub const SECTION_COUNT: Range<usize> = 16..18;
    /// Reserved, zero.
    pub const RESERVED: Range<usize> = 18..24;
}

/// Section identifiers and their record lengths.
pub mod section {
    /// Target identity and switches: one record.
    pub const TARGET: u16 = 1;
    /// Limits: one record.
    pub const LIMITS: u16 = 2;
    /// Network interfaces.
    pub const INTERFACES: u16 = 3;
    /// Volumes.
    pub const VOLUMES: u16 = 4;
    /// Access rules.
    pub const ACCESS_RULES: u16 = 5;
    /// Volume indexes (u16) referenced by access rules.
    pub const ACCESS_VOLUMES: u16 = 6;
    /// UTF-8 string bytes referenced by string refs.
    pub const STRINGS: u16 = 7;
    /// Thin pools (format version 4).
    pub const POOLS: u16 = 8;
    /// The admin endpoint (format version 4; 0 or 1 record).
    pub const ADMIN: u16 = 9;
    /// Every section, in the order the writer emits them (POOLS and ADMIN
    /// from version 4 only).
    pub const ALL: [u16; 9] = [
        TARGET,
        LIMITS,
        INTERFACES,
        POOLS,
        VOLUMES,
        ACCESS_RULES,
        ACCESS_VOLUMES,
        STRINGS,
        ADMIN,
    ];

    /// The record length of a section in the current format, `None` for
    /// an unknown id.
    pub fn record_len(id: u16) -> Option<u16> {
        record_len_in(id, super::FORMAT_VERSION)
    }

    /// The record length of a section in format `version`: the limits
    /// record is 16 bytes up to version 2, 28 from version 3.
    pub fn record_len_in(id: u16, version: u16) -> Option<u16> {
        Some(match id {
            TARGET => 32,
            LIMITS if version <= super::SHORT_LIMITS_VERSION => 16,
            LIMITS => 28,
            INTERFACES => 24,
            VOLUMES => 40,
            ACCESS_RULES => 24,
            ACCESS_VOLUMES => 2,
            STRINGS => 1,
            POOLS if version >= super::pools::POOLS_VERSION => super::pools::POOL_RECORD_LEN,
            ADMIN if version >= super::admin::ADMIN_VERSION => super::admin::ADMIN_RECORD_LEN,
            _ => return None,
        })
    }

    /// The section's name for messages.
    pub fn name(id: u16) -> &'static str {
        match id {
            TARGET => "target",
            LIMITS => "limits",
            INTERFACES => "interfaces",
            VOLUMES => "volumes",
            ACCESS_RULES => "access rules",
            ACCESS_VOLUMES => "access volume list",
            STRINGS => "strings",
            POOLS => "pools",
            ADMIN => "admin",
            _ => "unknown",
        }
    }
}

/// Target record flag: a UUID is present.
const TARGET_HAS_UUID: u16 = 1 << 0;
/// Target record flag: `always_invalidate` (fresh rkey per chunk after every IO).
const TARGET_ALWAYS_INVALIDATE: u16 = 1 << 1;
/// Access rule flag: a source address/prefix restricts the rule.
const RULE_HAS_SOURCE: u8 = 1 << 0;
/// Access rule flag: the rule covers every volume.
const RULE_ALL_VOLUMES: u8 = 1 << 1;
/// Volume selector codes.
const SELECTOR_NONE: u8 = 0;
const SELECTOR_PCI: u8 = 1;
const SELECTOR_SERIAL: u8 = 2;

/// A name copied into an error: at most 64 bytes, truncated with `...`.
pub type ErrorName = heapless::String<64>;

fn error_name(text: &str) -> ErrorName {
    let mut name = ErrorName::new();
    if text.len() <= name.capacity() {
        let _ = name.push_str(text);
        return name;
    }
    for c in text.chars() {
        if name.len() + c.len_utf8() > name.capacity() - 3 {
            break;
        }
        let _ = name.push(c);
    }
    let _ = name.push_str("...");
    name
}

/// Why a binary manifest is refused. Each variant is one broken rule.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum ReadError {
    /// Fewer bytes than the header or the header's length field needs.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        found: usize,
    },
    /// The first four bytes are not `BRKM`.
    BadMagic([u8; 4]),
    /// A format version this reader does not know.
    UnsupportedVersion {
        /// The blob's version.
        found: u16,
        /// The newest version this reader supports.
        supported: u16,
    },
    /// The header's length disagrees with the blob's (trailing bytes).
    LengthMismatch {
        /// The header's `total_len`.
        header: u32,
        /// The blob's length.
        actual: usize,
    },
    /// The CRC-32 over the blob does not match the header.
    ChecksumMismatch {
        /// The CRC stored in the header.
        expected: u32,
        /// The CRC computed over the blob.
        found: u32,
    },
    /// A reserved field or flag bit is not zero.
    ReservedNotZero(&'static str),
    /// More sections than [`MAX_SECTIONS`].
    TooManySections(u16),
    /// A section id this version does not define.
    UnknownSection(u16),
    /// A section appears twice.
    DuplicateSection(&'static str),
    /// A required section is absent.
    MissingSection(&'static str),
    /// A section's record length is not this version's.
    BadRecordLength {
        /// The section.
        section: &'static str,
        /// The length in the table.
        found: u16,
        /// The length this version defines.
        expected: u16,
    },
    /// A section's bytes lie outside the blob (or overlap the header).
    SectionOutOfBounds(&'static str),
    /// A section has too few or too many records.
    BadCount {
        /// The section.
        section: &'static str,
        /// Records present.
        count: u32,
        /// Fewest allowed.
        min: u32,
        /// Most allowed.
        max: u32,
    },
    /// A string reference points outside the string section.
    StringOutOfBounds(&'static str),
    /// A string is not UTF-8.
    StringNotUtf8(&'static str),
    /// A string contains a NUL byte.
    StringHasNul(&'static str),
    /// A string breaks its field's rules.
    BadText {
        /// The field.
        field: &'static str,
        /// The text (truncated).
        text: ErrorName,
        /// What is wrong.
        error: TextError,
    },
    /// A volume kind code this version does not define.
    UnknownVolumeKind(u8),
    /// A virtio-blk selector code this version does not define.
    UnknownVirtioSelector(u8),
    /// An access mode code this version does not define.
    UnknownAccessMode(u8),
    /// A volume's fields do not fit its kind.
    BadVolume {
        /// The volume.
        volume: ErrorName,
        /// What is wrong.
        reason: &'static str,
    },
    /// A volume size that is zero where required, or not a multiple of 4096.
    BadVolumeSize {
        /// The volume.
        volume: ErrorName,
        /// Its size in bytes.
        size: u64,
    },
    /// An interface MAC that is multicast or all zeros.
    BadMac(ErrorName),
    /// An interface address that is not a usable host address.
    BadAddress(ErrorName),
    /// An interface MTU outside [`bounds::MTU`].
    BadMtu {
        /// The interface.
        interface: ErrorName,
        /// The MTU.
        mtu: u16,
    },
    /// A prefix length over 32.
    BadPrefix(u8),
    /// Two interfaces with one name.
    DuplicateInterface(ErrorName),
    /// Two interfaces with one MAC.
    DuplicateMac(ErrorName),
    /// Two interfaces with one IPv4 address.
    DuplicateAddress(ErrorName),
    /// Two volumes with one name.
    DuplicateVolume(ErrorName),
    /// Two volumes answer to one `device_path`.
    DuplicateDevicePath(ErrorName),
    /// Two volumes on one file, block device, PCI slot or serial.
    DuplicateBacking(ErrorName),
    /// An access rule names a volume index past the volume table.
    VolumeIndexOutOfRange {
        /// The rule's index.
        rule: u32,
        /// The bad volume index.
        index: u16,
    },
    /// An access rule lists one volume twice.
    DuplicateRuleVolume {
        /// The rule's index.
        rule: u32,
        /// The volume.
        volume: ErrorName,
    },
    /// Two pools with one name.
    DuplicatePool(ErrorName),
    /// A thin volume (named) names a pool the manifest does not declare.
    UnknownPool(ErrorName),
    /// A pool's fields are not valid.
    BadPool {
        /// The pool.
        pool: ErrorName,
        /// What is wrong.
        reason: &'static str,
    },
    /// A limit outside its bounds.
    BadLimits(LimitError),
    /// The RAM volumes together exceed 2^64 bytes.
    RamOverflow,
    /// The target's listen port is 0.
    BadPort,
    /// The admin record is not valid (what is wrong).
    BadAdmin(&'static str),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ReadError::*;
        f.write_str("manifest: ")?;
        match self {
            Truncated { needed, found } => {
                write!(f, "truncated: {found} bytes, at least {needed} needed")
            }
            BadMagic(m) => write!(
                f,
                "bad magic {:02x}{:02x}{:02x}{:02x}, not a Brick manifest (expected \"BRKM\")",
                m[0], m[1], m[2], m[3]
            ),
            UnsupportedVersion { found, supported } => write!(
                f,
                "format version {found} is not supported (this build reads versions \
                 {MIN_FORMAT_VERSION} to {supported}){}",
                if found > supported {
                    ": the manifest is newer than this build"
                } else {
                    ""
                }
            ),
            LengthMismatch { header, actual } => {
                write!(f, "header says {header} bytes but the blob has {actual}")
            }
            ChecksumMismatch { expected, found } => write!(
                f,
                "checksum mismatch: header has crc32 {expected:#010x}, contents give {found:#010x}"
            ),
            ReservedNotZero(what) => write!(f, "reserved {what} is not zero"),
            TooManySections(n) => write!(f, "{n} sections, at most {MAX_SECTIONS} allowed"),
            UnknownSection(id) => write!(f, "unknown section id {id}"),
            DuplicateSection(s) => write!(f, "section {s} appears twice"),
            MissingSection(s) => write!(f, "section {s} is missing"),
            BadRecordLength {
                section,
                found,
                expected,
            } => write!(
                f,
                "section {section} has {found}-byte records, its format version uses {expected}"
            ),
            SectionOutOfBounds(s) => write!(f, "section {s} lies outside the blob"),
            BadCount {
                section,
                count,
                min,
                max,
            } => {
                write!(f, "{count} {section}, between {min} and {max} allowed")
            }
            StringOutOfBounds(field) => write!(f, "{field}: string lies outside the string table"),
            StringNotUtf8(field) => write!(f, "{field}: string is not UTF-8"),
            StringHasNul(field) => write!(f, "{field}: string contains a NUL byte"),
            BadText { field, text, error } => write!(f, "{field} {text:?} {error}"),
            UnknownVolumeKind(k) => write!(f, "unknown volume kind {k}"),
            UnknownVirtioSelector(s) => write!(f, "unknown virtio-blk selector {s}"),
            UnknownAccessMode(m) => write!(f, "unknown access mode {m}"),
            BadVolume { volume, reason } => write!(f, "volume {volume:?}: {reason}"),
            BadVolumeSize { volume, size } => write!(
                f,
                "volume {volume:?}: size {size} must be nonzero and a multiple of {SIZE_ALIGN}"
            ),
            BadMac(i) => write!(f, "interface {i:?}: MAC must be unicast and not zero"),
            BadAddress(i) => write!(f, "interface {i:?}: not a usable host address"),
            BadMtu { interface, mtu } => write!(
                f,
                "interface {interface:?}: MTU {mtu} is outside {}..={}",
                bounds::MTU.start(),
                bounds::MTU.end()
            ),
            BadPrefix(p) => write!(f, "prefix length {p} is over 32"),
            DuplicateInterface(n) => write!(f, "duplicate interface name {n:?}"),
            DuplicateMac(n) => write!(f, "interface {n:?} repeats another interface's MAC"),
            DuplicateAddress(n) => {
                write!(f, "interface {n:?} repeats another interface's address")
            }
            DuplicateVolume(n) => write!(f, "duplicate volume name {n:?}"),
            DuplicateDevicePath(n) => write!(f, "duplicate device_path {n:?}"),
            DuplicateBacking(n) => {
                write!(
                    f,
                    "{n:?} uses the same backing device as another volume or pool"
                )
            }
            VolumeIndexOutOfRange { rule, index } => {
                write!(
                    f,
                    "access rule {rule} names volume index {index}, past the volume table"
                )
            }
            DuplicateRuleVolume { rule, volume } => {
                write!(f, "access rule {rule} lists volume {volume:?} twice")
            }
            DuplicatePool(n) => write!(f, "duplicate pool name {n:?}"),
            UnknownPool(volume) => {
                write!(
                    f,
                    "thin volume {volume:?} names a pool that is not declared"
                )
            }
            BadPool { pool, reason } => write!(f, "pool {pool:?}: {reason}"),
            BadLimits(e) => write!(f, "limits: {e}"),
            RamOverflow => f.write_str("RAM volume sizes overflow 64 bits"),
            BadPort => f.write_str("target port 0 is not a listen port"),
            BadAdmin(reason) => write!(f, "admin endpoint: {reason}"),
        }
    }
}

impl core::error::Error for ReadError {}

/// A fixed-length record; every accessor is bounds-checked and never panics
/// (a short slice reads as zeros, which parse never hands out).
#[derive(Clone, Copy)]
struct Record<'a>(&'a [u8]);

impl<'a> Record<'a> {
    fn array<const N: usize>(&self, offset: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(bytes) = offset
            .checked_add(N)
            .and_then(|end| self.0.get(offset..end))
        {
            out.copy_from_slice(bytes);
        }
        out
    }
    fn u8(&self, offset: usize) -> u8 {
        self.0.get(offset).copied().unwrap_or(0)
    }
    fn u16(&self, offset: usize) -> u16 {
        u16::from_le_bytes(self.array(offset))
    }
    fn u32(&self, offset: usize) -> u32 {
        u32::from_le_bytes(self.array(offset))
    }
    fn u64(&self, offset: usize) -> u64 {
        u64::from_le_bytes(self.array(offset))
    }
    /// A string reference: `offset: u32, len: u32` into the string section.
    fn str_ref(&self, offset: usize) -> (u32, u32) {
        (self.u32(offset), self.u32(offset + 4))
    }
}

/// The checked target identity.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Target<'a> {
    /// The target's name (logged, reported to clients' logs).
    pub name: &'a str,
    /// An optional UUID.
    pub uuid: Option<[u8; 16]>,
    /// The RDMA CM port the target listens on (Linux's default 1234).
    pub port: u16,
    /// Fresh rkey per chunk after every IO (`NEW_RKEY_F`, rtrs.md §4.9).
    pub always_invalidate: bool,
}

/// A checked network interface.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Interface<'a> {
    /// The interface's name (for logs and the hosted `--link` order).
    pub name: &'a str,
    /// Its MAC; the image matches its virtio-net NICs by MAC.
    pub mac: MacAddress,
    /// Its IPv4 address and prefix.
    pub address: Ipv4Cidr,
    /// Its MTU (IP MTU; the RoCE path MTU is derived from it).
    pub mtu: u16,
}

/// `eth0 52:54:00:77:00:01 10.77.0.1/24 mtu 1500`, for the boot log.
impl fmt::Display for Interface<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} mtu {}",
            self.name, self.mac, self.address, self.mtu
        )
    }
}

/// Where a volume's blocks live.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backing<'a> {
    /// RAM of `size` bytes, zeroed at boot.
    Ram {
        /// Bytes, nonzero, a multiple of 4096.
        size: u64,
    },
    /// A file (hosted); `size` limits or creates it, `None` = the file's size.
    File {
        /// Absolute path.
        path: &'a str,
        /// Bytes, a multiple of 4096, if given.
        size: Option<u64>,
    },
    /// A host block device (hosted), whole.
    Block {
        /// Absolute path.
        path: &'a str,
    },
    /// A virtio-blk device (image), whole.
    VirtioBlk(VirtioSelector<'a>),
    /// A namespace of an NVMe controller (image), whole.
    Nvme {
        /// Which controller.
        controller: VirtioSelector<'a>,
        /// The namespace id (1 and up).
        namespace: u32,
    },
    /// A thin-provisioned volume of `size` bytes on a pool's extents
    /// (hosted; format version 4). The pool may hold less than its volumes
    /// promise.
    Thin {
        /// The pool.
        pool: Pool<'a>,
        /// Virtual bytes, nonzero, a multiple of 4096.
        size: u64,
    },
}

impl Backing<'_> {
    /// The volume kind.
    pub fn kind(&self) -> VolumeKind {
        match self {
            Backing::Ram { .. } => VolumeKind::Ram,
            Backing::File { .. } => VolumeKind::File,
            Backing::Block { .. } => VolumeKind::Block,
            Backing::VirtioBlk(_) => VolumeKind::VirtioBlk,
            Backing::Nvme { .. } => VolumeKind::Nvme,
            Backing::Thin { .. } => VolumeKind::Thin,
        }
    }
}

/// A checked volume.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Volume<'a> {
    /// The volume's name (access rules refer to it).
    pub name: &'a str,
    /// The `device_path` a client's OPEN names to reach it.
    pub device_path: &'a str,
    /// Its storage.
    pub backing: Backing<'a>,
}

/// `vol0 (ram 256MiB) as "vol0"`, for the boot log.
impl fmt::Display for Volume<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", self.name)?;
        match self.backing {
            Backing::Ram { size } => write!(f, "ram {}", Size(size))?,
            Backing::File {
                path,
                size: Some(size),
            } => write!(f, "file {path} {}", Size(size))?,
            Backing::File { path, size: None } => write!(f, "file {path}")?,
            Backing::Block { path } => write!(f, "block {path}")?,
            Backing::VirtioBlk(VirtioSelector::Pci(address)) => {
                write!(f, "virtio-blk pci {address}")?
            }
            Backing::VirtioBlk(VirtioSelector::Serial(serial)) => {
                write!(f, "virtio-blk serial {serial}")?
            }
            Backing::Nvme {
                controller: VirtioSelector::Pci(address),
                namespace,
            } => write!(f, "nvme pci {address} namespace {namespace}")?,
            Backing::Nvme {
                controller: VirtioSelector::Serial(serial),
                namespace,
            } => write!(f, "nvme serial {serial} namespace {namespace}")?,
            Backing::Thin { pool, size } => write!(f, "thin {} on pool {}", Size(size), pool.name)?,
        }
        write!(f, ") as {:?}", self.device_path)
    }
}

/// The volumes an access rule covers.
#[derive(Clone, Copy, Debug)]
pub enum RuleVolumes<'a> {
    /// Every volume.
    All,
    /// The listed volume indexes (checked: in range, no duplicates).
    Only(VolumeIndexes<'a>),
}

/// Iterator over the volume indexes of an access rule.
#[derive(Clone, Copy, Debug)]
pub struct VolumeIndexes<'a> {
    bytes: &'a [u8],
}

impl Iterator for VolumeIndexes<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let (head, rest) = self.bytes.split_first_chunk::<2>()?;
        self.bytes = rest;
        Some(usize::from(u16::from_le_bytes(*head)))
    }
}

/// A checked access rule.
#[derive(Clone, Copy, Debug)]
pub struct AccessRule<'a> {
    /// Session name, exact or glob (`*`, `?`).
    pub sessions: &'a str,
    /// Client source network, if restricted.
    pub source: Option<Ipv4Cidr>,
    /// The volumes covered.
    pub volumes: RuleVolumes<'a>,
    /// What the rule grants.
    pub mode: AccessMode,
}

impl AccessRule<'_> {
    /// True if this rule applies to `session` connecting from `source` and
    /// covers volume `volume_index`.
    pub fn matches(&self, session: &str, source: Ipv4Addr, volume_index: usize) -> bool {
        pattern_matches(self.sessions, session)
            && self.source.is_none_or(|net| net.contains(source))
            && match self.volumes {
                RuleVolumes::All => true,
                RuleVolumes::Only(mut indexes) => indexes.any(|i| i == volume_index),
            }
    }
}

/// The machine cannot hold what the manifest preallocates (the image's
/// boot check, [`Manifest::check_memory`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemoryError {
    /// Bytes of all RAM volumes.
    pub ram_volumes: u64,
    /// Bytes of the chunk pools with every session open.
    pub chunk_pools: u64,
    /// Bytes the image has for both.
    pub available: u64,
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: u64 = 1 << 20;
        write!(
            f,
            "manifest: RAM volumes ({} MiB) + chunk pools ({} MiB) need {} MiB, only {} MiB available",
            self.ram_volumes.div_ceil(MIB),
            self.chunk_pools.div_ceil(MIB),
            self.ram_volumes.saturating_add(self.chunk_pools).div_ceil(MIB),
            self.available / MIB
        )
    }
}

impl core::error::Error for MemoryError {}

/// One section's place in the blob.
#[derive(Clone, Copy, Default, Debug)]
struct Span {
    offset: usize,
    count: usize,
    record_len: usize,
}

/// A checked binary manifest borrowing its blob.
#[derive(Clone, Copy, Debug)]
pub struct Manifest<'a> {
    bytes: &'a [u8],
    target: Span,
    limits: Span,
    interfaces: Span,
    volumes: Span,
    rules: Span,
    rule_volumes: Span,
    strings: Span,
    /// Empty before format version 4.
    pools: Span,
    admin: Span,
}

fn read_u16(bytes: &[u8], range: core::ops::Range<usize>) -> u16 {
    Record(bytes).u16(range.start)
}

fn read_u32(bytes: &[u8], range: core::ops::Range<usize>) -> u32 {
    Record(bytes).u32(range.start)
}

/// CRC-32 of every byte except the CRC field.
fn checksum(blob: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(blob.get(..field::CRC.start).unwrap_or(&[]));
    hasher.update(blob.get(field::CRC.end..).unwrap_or(&[]));
    hasher.finalize()
}

impl<'a> Manifest<'a> {
    /// Checks `bytes` completely and returns the reader.
    ///
    /// # Errors
    ///
    /// The first broken rule, in this order: length, magic, version, total
    /// length, checksum, reserved fields, section table, limits, strings,
    /// target, interfaces, volumes, access rules.
    ///
    /// # Fuzzing
    ///
    /// Under `cfg(fuzzing)` a checksum mismatch is ignored, so fuzzers reach
    /// the section and record checks instead of stopping at the CRC.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ReadError> {
        if bytes.len() < field::TOTAL_LEN.end {
            return Err(ReadError::Truncated {
                needed: HEADER_LEN,
                found: bytes.len(),
            });
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&bytes[field::MAGIC]);
        if magic != MAGIC {
            return Err(ReadError::BadMagic(magic));
        }
        let version = read_u16(bytes, field::VERSION);
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(ReadError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let total_len = read_u32(bytes, field::TOTAL_LEN);
        let total = usize::try_from(total_len).unwrap_or(usize::MAX);
        if bytes.len() < HEADER_LEN || bytes.len() < total {
            return Err(ReadError::Truncated {
                needed: total.max(HEADER_LEN),
                found: bytes.len(),
            });
        }
        if bytes.len() != total {
            return Err(ReadError::LengthMismatch {
                header: total_len,
                actual: bytes.len(),
            });
        }
        let expected = read_u32(bytes, field::CRC);
        let found = checksum(bytes);
        if expected != found && !cfg!(fuzzing) {
            return Err(ReadError::ChecksumMismatch { expected, found });
        }
        if read_u16(bytes, field::FLAGS) != 0 {
            return Err(ReadError::ReservedNotZero("header flags"));
        }
        if bytes[field::RESERVED].iter().any(|&b| b != 0) {
            return Err(ReadError::ReservedNotZero("header bytes"));
        }
        let mut manifest = Self::read_sections(bytes)?;
        manifest.check_records()?;
        Ok(manifest)
    }

    fn read_sections(bytes: &'a [u8]) -> Result<Self, ReadError> {
        let version = read_u16(bytes, field::VERSION);
        let section_count = read_u16(bytes, field::SECTION_COUNT);
        if section_count > MAX_SECTIONS {
            return Err(ReadError::TooManySections(section_count));
        }
        let table_end = HEADER_LEN + usize::from(section_count) * SECTION_ENTRY_LEN;
        let table = bytes
            .get(HEADER_LEN..table_end)
            .ok_or(ReadError::SectionOutOfBounds("section table"))?;
        let mut spans: [Option<Span>; 9] = [None; 9];
        for entry in table.chunks_exact(SECTION_ENTRY_LEN) {
            let entry = Record(entry);
            let id = entry.u16(0);
            let expected =
                section::record_len_in(id, version).ok_or(ReadError::UnknownSection(id))?;
            let name = section::name(id);
            let record_len = entry.u16(2);
            if record_len != expected {
                return Err(ReadError::BadRecordLength {
                    section: name,
                    found: record_len,
                    expected,
                });
            }
            let count = usize::try_from(entry.u32(4)).unwrap_or(usize::MAX);
            let offset = usize::try_from(entry.u32(8)).unwrap_or(usize::MAX);
            let end = count
                .checked_mul(usize::from(record_len))
                .and_then(|len| len.checked_add(offset));
            match end {
                Some(end) if offset >= table_end && end <= bytes.len() => {}
                _ => return Err(ReadError::SectionOutOfBounds(name)),
            }
            let slot = &mut spans[usize::from(id - 1)];
            if slot.is_some() {
                return Err(ReadError::DuplicateSection(name));
            }
            *slot = Some(Span {
                offset,
                count,
                record_len: usize::from(record_len),
            });
        }
        let mut get = |id: u16| {
            spans[usize::from(id - 1)]
                .take()
                .ok_or(ReadError::MissingSection(section::name(id)))
        };
        Ok(Manifest {
            bytes,
            target: get(section::TARGET)?,
            limits: get(section::LIMITS)?,
            interfaces: get(section::INTERFACES)?,
            volumes: get(section::VOLUMES)?,
            rules: get(section::ACCESS_RULES)?,
            rule_volumes: get(section::ACCESS_VOLUMES)?,
            strings: get(section::STRINGS)?,
            pools: if version >= pools::POOLS_VERSION {
                get(section::POOLS)?
            } else {
                Span::default()
            },
            admin: if version >= admin::ADMIN_VERSION {
                get(section::ADMIN)?
            } else {
                Span::default()
            },
        })
    }

    /// The blob's format version ([`MIN_FORMAT_VERSION`]..=[`FORMAT_VERSION`]).
    pub fn version(&self) -> u16 {
        read_u16(self.bytes, field::VERSION)
    }

    fn record(&self, span: Span, index: usize) -> Record<'a> {
        let start = span.offset + index * span.record_len;
        Record(
            self.bytes
                .get(start..start + span.record_len)
                .unwrap_or(&[]),
        )
    }

    fn count_in(span: Span, id: u16, min: usize, max: usize) -> Result<(), ReadError> {
        if span.count < min || span.count > max {
            return Err(ReadError::BadCount {
                section: section::name(id),
                count: u32::try_from(span.count).unwrap_or(u32::MAX),
                min: min as u32,
                max: max as u32,
            });
        }
        Ok(())
    }

    /// A string from the string section, checked for bounds, UTF-8 and NUL.
    fn string(&self, (offset, len): (u32, u32), field: &'static str) -> Result<&'a str, ReadError> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(len)
            .filter(|&end| end <= self.strings.count)
            .and_then(|end| {
                self.bytes
                    .get(self.strings.offset + start..self.strings.offset + end)
            })
            .ok_or(ReadError::StringOutOfBounds(field))?;
        let text = core::str::from_utf8(bytes).map_err(|_| ReadError::StringNotUtf8(field))?;
        if text.contains('\0') {
            return Err(ReadError::StringHasNul(field));
        }
        Ok(text)
    }

    fn checked_text(
        &self,
        reference: (u32, u32),
        field: &'static str,
        rule: fn(&str) -> Result<(), TextError>,
    ) -> Result<&'a str, ReadError> {
        let text = self.string(reference, field)?;
        rule(text).map_err(|error| ReadError::BadText {
            field,
            text: error_name(text),
            error,
        })?;
        Ok(text)
    }

    fn check_records(&mut self) -> Result<(), ReadError> {
        Self::count_in(self.target, section::TARGET, 1, 1)?;
        Self::count_in(self.limits, section::LIMITS, 1, 1)?;
        Self::count_in(self.interfaces, section::INTERFACES, 1, MAX_INTERFACES)?;
        Self::count_in(self.volumes, section::VOLUMES, 1, MAX_VOLUMES)?;
        Self::count_in(self.rules, section::ACCESS_RULES, 1, MAX_ACCESS_RULES)?;
        Self::count_in(
            self.rule_volumes,
            section::ACCESS_VOLUMES,
            0,
            MAX_ACCESS_RULES * MAX_VOLUMES,
        )?;
        self.decode_limits()?
            .check()
            .map_err(ReadError::BadLimits)?;
        self.decode_target()?;
        for i in 0..self.interfaces.count {
            let interface = self.decode_interface(i)?;
            for j in 0..i {
                let other = self.decode_interface(j)?;
                let name = || error_name(interface.name);
                if other.name == interface.name {
                    return Err(ReadError::DuplicateInterface(name()));
                }
                if other.mac == interface.mac {
                    return Err(ReadError::DuplicateMac(name()));
                }
                if other.address.address == interface.address.address {
                    return Err(ReadError::DuplicateAddress(name()));
                }
            }
        }
        self.check_pools()?;
        self.check_admin()?;
        let mut ram: u64 = 0;
        for i in 0..self.volumes.count {
            let volume = self.decode_volume(i)?;
            if let Backing::Ram { size } = volume.backing {
                ram = ram.checked_add(size).ok_or(ReadError::RamOverflow)?;
            }
            for j in 0..i {
                let other = self.decode_volume(j)?;
                if other.name == volume.name {
                    return Err(ReadError::DuplicateVolume(error_name(volume.name)));
                }
                if other.device_path == volume.device_path {
                    return Err(ReadError::DuplicateDevicePath(error_name(
                        volume.device_path,
                    )));
                }
                if same_backing(&other.backing, &volume.backing) {
                    return Err(ReadError::DuplicateBacking(error_name(volume.name)));
                }
            }
        }
        self.check_pool_users()?;
        for i in 0..self.rules.count {
            self.decode_rule(i)?;
        }
        Ok(())
    }

    fn decode_limits(&self) -> Result<Limits, ReadError> {
        let r = self.record(self.limits, 0);
        if r.u16(10) != 0 {
            return Err(ReadError::ReservedNotZero("limits bytes"));
        }
        let defaults = Limits::default();
        // Format 3 appends the half-open limits and the setup timeout.
        let long = self.limits.record_len >= 28;
        if long && r.u16(26) != 0 {
            return Err(ReadError::ReservedNotZero("limits bytes"));
        }
        Ok(Limits {
            max_sessions: r.u32(0),
            max_paths_per_session: r.u16(4),
            max_connections_per_path: r.u16(6),
            queue_depth: r.u16(8),
            chunk_size: r.u32(12),
            max_half_open: if long {
                r.u32(16)
            } else {
                defaults.max_half_open
            },
            setup_timeout_ms: if long {
                r.u32(20)
            } else {
                defaults.setup_timeout_ms
            },
            max_half_open_per_source: if long {
                r.u16(24)
            } else {
                defaults.max_half_open_per_source
            },
        })
    }

    fn decode_target(&self) -> Result<Target<'a>, ReadError> {
        let r = self.record(self.target, 0);
        let name = self.checked_text(r.str_ref(0), "target.name", check_name)?;
        let flags = r.u16(26);
        if flags & !(TARGET_HAS_UUID | TARGET_ALWAYS_INVALIDATE) != 0 {
            return Err(ReadError::ReservedNotZero("target flags"));
        }
        if r.u32(28) != 0 {
            return Err(ReadError::ReservedNotZero("target bytes"));
        }
        if r.u16(24) == 0 {
            return Err(ReadError::BadPort);
        }
        let uuid: [u8; 16] = r.array(8);
        if flags & TARGET_HAS_UUID == 0 && uuid != [0; 16] {
            return Err(ReadError::ReservedNotZero("target uuid (flagged absent)"));
        }
        Ok(Target {
            name,
            uuid: (flags & TARGET_HAS_UUID != 0).then_some(uuid),
            port: r.u16(24),
            always_invalidate: flags & TARGET_ALWAYS_INVALIDATE != 0,
        })
    }

    fn decode_interface(&self, index: usize) -> Result<Interface<'a>, ReadError> {
        let r = self.record(self.interfaces, index);
        let name = self.checked_text(r.str_ref(0), "interface name", check_name)?;
        let address = Ipv4Addr::from(r.array::<4>(8));
        let mac = MacAddress(r.array(12));
        let prefix = r.u8(18);
        let mtu = r.u16(20);
        if r.u8(19) != 0 || r.u16(22) != 0 {
            return Err(ReadError::ReservedNotZero("interface bytes"));
        }
        if prefix > 32 {
            return Err(ReadError::BadPrefix(prefix));
        }
        let address = Ipv4Cidr { address, prefix };
        if !mac.is_unicast() {
            return Err(ReadError::BadMac(error_name(name)));
        }
        if !is_host_address(&address) {
            return Err(ReadError::BadAddress(error_name(name)));
        }
        if !bounds::MTU.contains(&mtu) {
            return Err(ReadError::BadMtu {
                interface: error_name(name),
                mtu,
            });
        }
        Ok(Interface {
            name,
            mac,
            address,
            mtu,
        })
    }

    fn decode_volume(&self, index: usize) -> Result<Volume<'a>, ReadError> {
        let r = self.record(self.volumes, index);
        let name = self.checked_text(r.str_ref(0), "volume name", check_name)?;
        let device_path =
            self.checked_text(r.str_ref(8), "volume device_path", check_device_path)?;
        let backing_ref = r.str_ref(16);
        let size = r.u64(24);
        let kind_code = r.u8(32);
        let selector = r.u8(33);
        let pci = r.u32(36);
        let namespace = r.u16(34);
        let kind = VolumeKind::from_code(kind_code)
            .filter(|kind| *kind != VolumeKind::Nvme || self.version() >= 2)
            .filter(|kind| *kind != VolumeKind::Thin || self.version() >= pools::POOLS_VERSION)
            .ok_or(ReadError::UnknownVolumeKind(kind_code))?;
        if namespace != 0 && kind != VolumeKind::Nvme {
            return Err(ReadError::ReservedNotZero("volume bytes"));
        }
        let bad = |reason| ReadError::BadVolume {
            volume: error_name(name),
            reason,
        };
        let bad_size = ReadError::BadVolumeSize {
            volume: error_name(name),
            size,
        };
        let has_device = matches!(kind, VolumeKind::VirtioBlk | VolumeKind::Nvme);
        if !has_device && (selector != SELECTOR_NONE || pci != 0) {
            return Err(bad(
                "only virtio-blk and NVMe volumes have a PCI slot or serial",
            ));
        }
        if size % SIZE_ALIGN != 0 {
            return Err(bad_size);
        }
        let backing = match kind {
            VolumeKind::Ram => {
                if backing_ref.1 != 0 {
                    return Err(bad("a RAM volume has no backing path"));
                }
                if size == 0 {
                    return Err(bad_size);
                }
                Backing::Ram { size }
            }
            VolumeKind::File => Backing::File {
                path: self.checked_text(backing_ref, "volume path", check_backing_path)?,
                size: (size != 0).then_some(size),
            },
            VolumeKind::Thin => {
                if size == 0 {
                    return Err(bad_size);
                }
                let pool = self.checked_text(backing_ref, "volume pool", check_name)?;
                Backing::Thin {
                    pool: self.thin_pool(name, pool)?,
                    size,
                }
            }
            VolumeKind::Block | VolumeKind::VirtioBlk | VolumeKind::Nvme if size != 0 => {
                return Err(bad(
                    "block, virtio-blk and NVMe volumes take the device's size",
                ));
            }
            VolumeKind::Nvme => {
                if namespace == 0 {
                    return Err(bad("an NVMe volume names a namespace (1 and up)"));
                }
                let selector = match selector {
                    SELECTOR_PCI if backing_ref.1 == 0 => {
                        let address = PciAddress::from_u32(pci);
                        if address.to_u32() != pci {
                            return Err(ReadError::ReservedNotZero("volume PCI address bits"));
                        }
                        VirtioSelector::Pci(address)
                    }
                    SELECTOR_PCI => return Err(bad("an NVMe volume by PCI address has no serial")),
                    SELECTOR_SERIAL if pci == 0 => VirtioSelector::Serial(self.checked_text(
                        backing_ref,
                        "volume serial",
                        check_serial,
                    )?),
                    SELECTOR_SERIAL => {
                        return Err(bad("an NVMe volume by serial has no PCI address"))
                    }
                    SELECTOR_NONE => {
                        return Err(bad("an NVMe volume needs a PCI address or serial"))
                    }
                    other => return Err(ReadError::UnknownVirtioSelector(other)),
                };
                Backing::Nvme {
                    controller: selector,
                    namespace: u32::from(namespace),
                }
            }
            VolumeKind::Block => Backing::Block {
                path: self.checked_text(backing_ref, "volume path", check_backing_path)?,
            },
            VolumeKind::VirtioBlk => match selector {
                SELECTOR_PCI => {
                    if backing_ref.1 != 0 {
                        return Err(bad("a virtio-blk volume by PCI slot has no serial"));
                    }
                    let address = PciAddress::from_u32(pci);
                    if address.to_u32() != pci {
                        return Err(ReadError::ReservedNotZero("volume PCI address bits"));
                    }
                    Backing::VirtioBlk(VirtioSelector::Pci(address))
                }
                SELECTOR_SERIAL => {
                    if pci != 0 {
                        return Err(bad("a virtio-blk volume by serial has no PCI slot"));
                    }
                    let serial = self.checked_text(backing_ref, "volume serial", check_serial)?;
                    Backing::VirtioBlk(VirtioSelector::Serial(serial))
                }
                SELECTOR_NONE => return Err(bad("a virtio-blk volume needs a PCI slot or serial")),
                other => return Err(ReadError::UnknownVirtioSelector(other)),
            },
        };
        Ok(Volume {
            name,
            device_path,
            backing,
        })
    }

    fn decode_rule(&self, index: usize) -> Result<AccessRule<'a>, ReadError> {
        let r = self.record(self.rules, index);
        let rule = u32::try_from(index).unwrap_or(u32::MAX);
        let sessions = self.checked_text(r.str_ref(0), "access sessions", check_session_pattern)?;
        let source_address = Ipv4Addr::from(r.array::<4>(8));
        let prefix = r.u8(12);
        let flags = r.u8(13);
        let mode_code = r.u8(14);
        if r.u8(15) != 0 || flags & !(RULE_HAS_SOURCE | RULE_ALL_VOLUMES) != 0 {
            return Err(ReadError::ReservedNotZero("access rule bytes"));
        }
        if prefix > 32 {
            return Err(ReadError::BadPrefix(prefix));
        }
        let source = if flags & RULE_HAS_SOURCE != 0 {
            Some(Ipv4Cidr {
                address: source_address,
                prefix,
            })
        } else {
            if prefix != 0 || source_address != Ipv4Addr::UNSPECIFIED {
                return Err(ReadError::ReservedNotZero(
                    "access rule source (flagged absent)",
                ));
            }
            None
        };
        let mode =
            AccessMode::from_code(mode_code).ok_or(ReadError::UnknownAccessMode(mode_code))?;
        let first = usize::try_from(r.u32(16)).unwrap_or(usize::MAX);
        let count = usize::try_from(r.u32(20)).unwrap_or(usize::MAX);
        let volumes = if flags & RULE_ALL_VOLUMES != 0 {
            if first != 0 || count != 0 {
                return Err(ReadError::ReservedNotZero(
                    "access rule volume list (all volumes)",
                ));
            }
            RuleVolumes::All
        } else {
            let bytes = first
                .checked_add(count)
                .filter(|&end| count != 0 && end <= self.rule_volumes.count)
                .and_then(|end| {
                    self.bytes.get(
                        self.rule_volumes.offset + first * 2..self.rule_volumes.offset + end * 2,
                    )
                })
                .ok_or(ReadError::SectionOutOfBounds("access volume list"))?;
            let indexes = VolumeIndexes { bytes };
            for (n, volume) in indexes.enumerate() {
                if volume >= self.volumes.count {
                    return Err(ReadError::VolumeIndexOutOfRange {
                        rule,
                        index: volume as u16,
                    });
                }
                if indexes.take(n).any(|earlier| earlier == volume) {
                    let name = self.decode_volume(volume)?.name;
                    return Err(ReadError::DuplicateRuleVolume {
                        rule,
                        volume: error_name(name),
                    });
                }
            }
            RuleVolumes::Only(indexes)
        };
        Ok(AccessRule {
            sessions,
            source,
            volumes,
            mode,
        })
    }

    /// The whole blob.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The target identity and switches.
    pub fn target(&self) -> Target<'a> {
        // Checked in parse: cannot fail.
        self.decode_target().unwrap_or(Target {
            name: "",
            uuid: None,
            port: 0,
            always_invalidate: true,
        })
    }

    /// The limits (checked against their bounds).
    pub fn limits(&self) -> Limits {
        self.decode_limits().unwrap_or_default()
    }

    /// Number of interfaces (1..=[`MAX_INTERFACES`]).
    pub fn interface_count(&self) -> usize {
        self.interfaces.count
    }

    /// Number of volumes (1..=[`MAX_VOLUMES`]).
    pub fn volume_count(&self) -> usize {
        self.volumes.count
    }

    /// Number of access rules (1..=[`MAX_ACCESS_RULES`]).
    pub fn access_rule_count(&self) -> usize {
        self.rules.count
    }

    /// The interfaces, in manifest order.
    pub fn interfaces(&self) -> impl Iterator<Item = Interface<'a>> + '_ {
        (0..self.interfaces.count).filter_map(|i| self.decode_interface(i).ok())
    }

    /// The volume at `index`, `None` past the end.
    pub fn volume(&self, index: usize) -> Option<Volume<'a>> {
        if index >= self.volumes.count {
            return None;
        }
        self.decode_volume(index).ok()
    }

    /// The volumes, in manifest order (access rules refer to these indexes).
    pub fn volumes(&self) -> impl Iterator<Item = Volume<'a>> + '_ {
        (0..self.volumes.count).filter_map(|i| self.decode_volume(i).ok())
    }

    /// The access rules, in manifest order.
    pub fn access_rules(&self) -> impl Iterator<Item = AccessRule<'a>> + '_ {
        (0..self.rules.count).filter_map(|i| self.decode_rule(i).ok())
    }

    /// The index and volume a client's `device_path` opens (exact match).
    pub fn volume_by_device_path(&self, device_path: &str) -> Option<(usize, Volume<'a>)> {
        self.volumes()
            .enumerate()
            .find(|(_, v)| v.device_path == device_path)
    }

    /// The index and volume with this name.
    pub fn volume_by_name(&self, name: &str) -> Option<(usize, Volume<'a>)> {
        self.volumes().enumerate().find(|(_, v)| v.name == name)
    }

    /// The most `session` from `source` may do with volume `volume_index`:
    /// read-write if any matching rule grants it, read-only if only
    /// read-only rules match, `None` if no rule matches (refuse the OPEN).
    pub fn access(
        &self,
        session: &str,
        source: Ipv4Addr,
        volume_index: usize,
    ) -> Option<AccessMode> {
        let mut best = None;
        for rule in self.access_rules() {
            if rule.matches(session, source, volume_index) {
                if rule.mode == AccessMode::ReadWrite {
                    return Some(AccessMode::ReadWrite);
                }
                best = Some(rule.mode);
            }
        }
        best
    }

    /// True if some rule lets `session` from `source` open anything at all
    /// (check at session establishment, before any OPEN).
    pub fn admits(&self, session: &str, source: Ipv4Addr) -> bool {
        self.access_rules().any(|rule| {
            pattern_matches(rule.sessions, session)
                && rule.source.is_none_or(|net| net.contains(source))
        })
    }

    /// Checks that `available` bytes hold the RAM volumes plus every
    /// session's chunk pool ([`Limits::max_chunk_pool_bytes`]): the image's
    /// "RAM larger than memory" check at boot.
    ///
    /// # Errors
    ///
    /// [`MemoryError`], whose `Display` is the one-line boot message.
    pub fn check_memory(&self, available: u64) -> Result<(), MemoryError> {
        let ram_volumes = self.ram_volume_bytes();
        let chunk_pools = self.limits().max_chunk_pool_bytes();
        if ram_volumes.saturating_add(chunk_pools) > available {
            return Err(MemoryError {
                ram_volumes,
                chunk_pools,
                available,
            });
        }
        Ok(())
    }

    /// Bytes of all RAM volumes together (checked not to overflow); the
    /// image compares this plus [`Limits::max_chunk_pool_bytes`] with its memory.
    pub fn ram_volume_bytes(&self) -> u64 {
        self.volumes()
            .map(|v| match v.backing {
                Backing::Ram { size } => size,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add)
    }
}

fn same_backing(a: &Backing<'_>, b: &Backing<'_>) -> bool {
    match (a, b) {
        (Backing::File { path: x, .. }, Backing::File { path: y, .. })
        | (Backing::Block { path: x }, Backing::Block { path: y }) => x == y,
        (Backing::VirtioBlk(x), Backing::VirtioBlk(y)) => x == y,
        (
            Backing::Nvme {
                controller: x,
                namespace: m,
            },
            Backing::Nvme {
                controller: y,
                namespace: n,
            },
        ) => x == y && m == n,
        _ => false,
    }
}

#[cfg(feature = "std")]
pub use writer::{encode, encode_version};

#[cfg(feature = "std")]
mod writer {
    use super::*;
    use crate::config::{
        Backing as OwnedBacking, Config, PoolBacking as OwnedPoolBacking, VolumeSet,
    };

    struct Strings {
        bytes: Vec<u8>,
    }

    impl Strings {
        fn add(&mut self, text: &str) -> [u8; 8] {
            if text.is_empty() {
                return [0; 8];
            }
            let offset = self.bytes.len() as u32;
            self.bytes.extend_from_slice(text.as_bytes());
            let mut out = [0u8; 8];
            out[..4].copy_from_slice(&offset.to_le_bytes());
            out[4..].copy_from_slice(&(text.len() as u32).to_le_bytes());
            out
        }
    }

    /// Writes `config` in the binary form, then reads it back with
    /// [`Manifest::parse`], so a blob this returns always boots.
    ///
    /// # Errors
    ///
    /// What the reader refuses (only possible for a [`Config`] built by
    /// hand; the TOML compiler checks the same rules with better messages).
    pub fn encode(config: &Config) -> Result<Vec<u8>, ReadError> {
        encode_version(config, FORMAT_VERSION)
    }

    /// [`encode`] in format `version` ([`MIN_FORMAT_VERSION`]..=
    /// [`FORMAT_VERSION`]), for targets that read only older formats:
    /// up to version 2 the limits record has no half-open limits or setup
    /// timeout (the reader takes their defaults), version 1 no NVMe
    /// volumes (refused by the read-back).
    ///
    /// # Errors
    ///
    /// [`ReadError::UnsupportedVersion`] for another version; what the
    /// reader refuses.
    pub fn encode_version(config: &Config, version: u16) -> Result<Vec<u8>, ReadError> {
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(ReadError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let mut strings = Strings { bytes: Vec::new() };
        let mut sections: Vec<(u16, Vec<u8>)> = Vec::new();

        let mut target = Vec::with_capacity(32);
        target.extend_from_slice(&strings.add(&config.target.name));
        target.extend_from_slice(&config.target.uuid.unwrap_or([0; 16]));
        target.extend_from_slice(&config.target.port.to_le_bytes());
        let mut flags = 0u16;
        if config.target.uuid.is_some() {
            flags |= TARGET_HAS_UUID;
        }
        if config.target.always_invalidate {
            flags |= TARGET_ALWAYS_INVALIDATE;
        }
        target.extend_from_slice(&flags.to_le_bytes());
        target.extend_from_slice(&[0; 4]);
        sections.push((section::TARGET, target));

        let l = &config.limits;
        let mut limits = Vec::with_capacity(28);
        limits.extend_from_slice(&l.max_sessions.to_le_bytes());
        limits.extend_from_slice(&l.max_paths_per_session.to_le_bytes());
        limits.extend_from_slice(&l.max_connections_per_path.to_le_bytes());
        limits.extend_from_slice(&l.queue_depth.to_le_bytes());
        limits.extend_from_slice(&[0; 2]);
        limits.extend_from_slice(&l.chunk_size.to_le_bytes());
        if version > SHORT_LIMITS_VERSION {
            limits.extend_from_slice(&l.max_half_open.to_le_bytes());
            limits.extend_from_slice(&l.setup_timeout_ms.to_le_bytes());
            limits.extend_from_slice(&l.max_half_open_per_source.to_le_bytes());
            limits.extend_from_slice(&[0; 2]);
        }
        sections.push((section::LIMITS, limits));

        let mut interfaces = Vec::new();
        for i in &config.interfaces {
            interfaces.extend_from_slice(&strings.add(&i.name));
            interfaces.extend_from_slice(&i.address.address.octets());
            interfaces.extend_from_slice(&i.mac.0);
            interfaces.push(i.address.prefix);
            interfaces.push(0);
            interfaces.extend_from_slice(&i.mtu.to_le_bytes());
            interfaces.extend_from_slice(&[0; 2]);
        }
        sections.push((section::INTERFACES, interfaces));

        if version >= POOLS_VERSION {
            let mut pools = Vec::new();
            for p in &config.pools {
                pools.extend_from_slice(&strings.add(&p.name));
                // Selector, namespace and PCI address as a volume's
                // (device pools; zero for files and block devices).
                let (path, size, kind, selector, namespace, pci) = match &p.backing {
                    OwnedPoolBacking::File { path, size } => {
                        (path.as_str(), size.unwrap_or(0), VolumeKind::File, 0, 0, 0)
                    }
                    OwnedPoolBacking::Block { path } => {
                        (path.as_str(), 0, VolumeKind::Block, 0, 0, 0)
                    }
                    OwnedPoolBacking::VirtioPci(pci) => (
                        "",
                        0,
                        VolumeKind::VirtioBlk,
                        SELECTOR_PCI,
                        0u16,
                        pci.to_u32(),
                    ),
                    OwnedPoolBacking::VirtioSerial(serial) => (
                        serial.as_str(),
                        0,
                        VolumeKind::VirtioBlk,
                        SELECTOR_SERIAL,
                        0,
                        0,
                    ),
                    // Out of range encodes as 0, which the read-back refuses.
                    OwnedPoolBacking::NvmePci { pci, namespace } => (
                        "",
                        0,
                        VolumeKind::Nvme,
                        SELECTOR_PCI,
                        u16::try_from(*namespace).unwrap_or(0),
                        pci.to_u32(),
                    ),
                    OwnedPoolBacking::NvmeSerial { serial, namespace } => (
                        serial.as_str(),
                        0,
                        VolumeKind::Nvme,
                        SELECTOR_SERIAL,
                        u16::try_from(*namespace).unwrap_or(0),
                        0,
                    ),
                };
                pools.extend_from_slice(&strings.add(path));
                pools.extend_from_slice(&size.to_le_bytes());
                pools.push(kind.code());
                pools.push(selector);
                pools.extend_from_slice(&namespace.to_le_bytes());
                pools.extend_from_slice(&pci.to_le_bytes());
            }
            sections.push((section::POOLS, pools));
        } else if !config.pools.is_empty() {
            return Err(ReadError::BadCount {
                section: section::name(section::POOLS),
                count: config.pools.len() as u32,
                min: 0,
                max: 0,
            });
        }

        let mut volumes = Vec::new();
        for v in &config.volumes {
            volumes.extend_from_slice(&strings.add(&v.name));
            volumes.extend_from_slice(&strings.add(&v.device_path));
            let mut namespace = 0u16;
            let (backing, size, selector, pci) = match &v.backing {
                OwnedBacking::Ram { size } => ("", *size, SELECTOR_NONE, 0),
                OwnedBacking::NvmePci { pci, namespace: n } => {
                    // Out of range encodes as 0, which the read-back refuses.
                    namespace = u16::try_from(*n).unwrap_or(0);
                    ("", 0, SELECTOR_PCI, pci.to_u32())
                }
                OwnedBacking::NvmeSerial {
                    serial,
                    namespace: n,
                } => {
                    namespace = u16::try_from(*n).unwrap_or(0);
                    (serial.as_str(), 0, SELECTOR_SERIAL, 0)
                }
                OwnedBacking::File { path, size } => {
                    (path.as_str(), size.unwrap_or(0), SELECTOR_NONE, 0)
                }
                OwnedBacking::Block { path } => (path.as_str(), 0, SELECTOR_NONE, 0),
                OwnedBacking::VirtioPci(address) => ("", 0, SELECTOR_PCI, address.to_u32()),
                OwnedBacking::VirtioSerial(serial) => (serial.as_str(), 0, SELECTOR_SERIAL, 0),
                OwnedBacking::Thin { pool, size } => (pool.as_str(), *size, SELECTOR_NONE, 0),
            };
            volumes.extend_from_slice(&strings.add(backing));
            volumes.extend_from_slice(&size.to_le_bytes());
            volumes.push(v.backing.kind().code());
            volumes.push(selector);
            volumes.extend_from_slice(&namespace.to_le_bytes());
            volumes.extend_from_slice(&pci.to_le_bytes());
        }
        sections.push((section::VOLUMES, volumes));

        let mut rules = Vec::new();
        let mut rule_volumes: Vec<u8> = Vec::new();
        for rule in &config.access {
            rules.extend_from_slice(&strings.add(&rule.sessions));
            let mut flags = 0u8;
            match rule.source {
                Some(source) => {
                    flags |= RULE_HAS_SOURCE;
                    rules.extend_from_slice(&source.address.octets());
                    rules.push(source.prefix);
                }
                None => rules.extend_from_slice(&[0; 5]),
            }
            let (first, count) = match &rule.volumes {
                VolumeSet::All => {
                    flags |= RULE_ALL_VOLUMES;
                    (0, 0)
                }
                VolumeSet::Only(names) => {
                    let first = rule_volumes.len() / 2;
                    for name in names {
                        // An unknown name encodes as an out-of-range index,
                        // which the read-back refuses.
                        let index = config
                            .volumes
                            .iter()
                            .position(|v| &v.name == name)
                            .unwrap_or(usize::from(u16::MAX));
                        rule_volumes.extend_from_slice(&(index as u16).to_le_bytes());
                    }
                    (first as u32, names.len() as u32)
                }
            };
            rules.push(flags);
            rules.push(rule.mode.code());
            rules.push(0);
            rules.extend_from_slice(&first.to_le_bytes());
            rules.extend_from_slice(&count.to_le_bytes());
        }
        sections.push((section::ACCESS_RULES, rules));
        sections.push((section::ACCESS_VOLUMES, rule_volumes));
        sections.push((section::STRINGS, strings.bytes));
        if version >= ADMIN_VERSION {
            let admin = config.admin.as_ref().map(admin::encode);
            sections.push((section::ADMIN, admin.map_or(Vec::new(), |r| r.to_vec())));
        } else if config.admin.is_some() {
            return Err(ReadError::BadCount {
                section: section::name(section::ADMIN),
                count: 1,
                min: 0,
                max: 0,
            });
        }

        let mut blob = vec![0u8; HEADER_LEN + sections.len() * SECTION_ENTRY_LEN];
        blob[field::MAGIC].copy_from_slice(&MAGIC);
        blob[field::VERSION].copy_from_slice(&version.to_le_bytes());
        blob[field::SECTION_COUNT].copy_from_slice(&(sections.len() as u16).to_le_bytes());
        for (n, (id, body)) in sections.iter().enumerate() {
            let record_len = section::record_len_in(*id, version).unwrap_or(1);
            let entry = HEADER_LEN + n * SECTION_ENTRY_LEN;
            let offset = blob.len() as u32;
            blob[entry..entry + 2].copy_from_slice(&id.to_le_bytes());
            blob[entry + 2..entry + 4].copy_from_slice(&record_len.to_le_bytes());
            let count = (body.len() / usize::from(record_len)) as u32;
            blob[entry + 4..entry + 8].copy_from_slice(&count.to_le_bytes());
            blob[entry + 8..entry + 12].copy_from_slice(&offset.to_le_bytes());
            blob.extend_from_slice(body);
        }
        let total = blob.len() as u32;
        blob[field::TOTAL_LEN].copy_from_slice(&total.to_le_bytes());
        let crc = checksum(&blob);
        blob[field::CRC].copy_from_slice(&crc.to_le_bytes());
        Manifest::parse(&blob)?;
        Ok(blob)
    }

    /// Recomputes the CRC of a blob in place (for tests that patch fields).
    pub fn fix_checksum(blob: &mut [u8]) {
        if blob.len() >= field::CRC.end {
            let crc = checksum(blob);
            blob[field::CRC].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

#[cfg(feature = "std")]
pub use writer::fix_checksum;

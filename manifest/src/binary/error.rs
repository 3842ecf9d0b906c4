//! Why a binary manifest is refused: [`ReadError`], one variant per broken
//! rule, with a one-line `Display` for the serial console, and the
//! fixed-capacity names ([`ErrorName`]) it carries instead of borrows.

use core::fmt;

use super::{MAX_SECTIONS, MIN_FORMAT_VERSION};
use crate::types::{bounds, LimitError, TextError, SIZE_ALIGN};

/// A name copied into an error: at most 64 bytes, truncated with `...`.
pub type ErrorName = heapless::String<64>;

pub(super) fn error_name(text: &str) -> ErrorName {
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

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

mod access;
mod admin;
mod error;
mod memory;
mod pools;
mod reader;
mod target;
mod views;
mod volumes;
#[cfg(feature = "std")]
mod writer;

pub use admin::{Admin, ADMIN_VERSION, MAX_ADMIN_SOURCES};
pub use error::{ErrorName, ReadError};
pub use memory::MemoryError;
pub use pools::{Pool, PoolBacking, POOLS_VERSION};
pub use reader::Manifest;
pub use views::{AccessRule, Backing, Interface, RuleVolumes, Target, Volume, VolumeIndexes};
#[cfg(feature = "std")]
pub use writer::{encode, encode_version, fix_checksum};

use error::error_name;
use reader::Record;

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

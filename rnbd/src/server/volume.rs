//! What the server serves: volumes, their ids and limits, and the
//! [`Exports`] a consumer answers lookups with.

use super::*;

/// Index of a volume in the engine's volume table (the manifest's volume
/// index). Always below [`MAX_VOLUMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VolumeId(u16);

impl VolumeId {
    /// The id of volume `index`, `None` if `index >= MAX_VOLUMES`.
    pub const fn try_new(index: usize) -> Option<VolumeId> {
        if index < MAX_VOLUMES {
            Some(VolumeId(index as u16))
        } else {
            None
        }
    }

    /// The volume index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// Discard support of a volume, as advertised in OPEN_RSP (rnbd.md §2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiscardLimits {
    /// Largest discard in 512-byte sectors; non-zero.
    pub max_sectors: u32,
    /// Discard granularity in bytes (0 or a multiple of the logical block
    /// size); discards are trimmed to whole granules.
    pub granularity: u32,
    /// Byte offset of the first granule boundary (usually 0).
    pub alignment: u32,
}

/// What the engine knows of a volume: identity, geometry and policy. The
/// OPEN_RSP is built from it, and every IO is checked against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VolumeInfo {
    /// The volume.
    pub id: VolumeId,
    /// Capacity in 512-byte sectors.
    pub nsectors: u64,
    /// Logical block size in bytes: a power of two in 512..=4096. IO must
    /// be aligned to it.
    pub logical_block_size: u16,
    /// Physical block size in bytes: a power of two, at least the logical.
    pub physical_block_size: u16,
    /// `max_hw_sectors` for OPEN_RSP (the 6.1 client ignores it).
    pub max_hw_sectors: u32,
    /// `max_segments` for OPEN_RSP (the 6.1 client ignores it).
    pub max_segments: u16,
    /// The volume has a volatile write cache: advertise `RNBD_WRITEBACK`
    /// and accept FLUSH.
    pub write_cache: bool,
    /// The volume honours FUA writes natively: advertise `RNBD_FUA` (only
    /// together with `write_cache`; without a volatile cache every write is
    /// durable and the client strips FUA anyway, rnbd.md §3).
    pub fua: bool,
    /// Discard support; `None` disables DISCARD (and SECURE_ERASE).
    pub discard: Option<DiscardLimits>,
    /// SECURE_ERASE supported (needs `discard`: the client uses
    /// `max_discard_sectors` as its limit). Executed as
    /// [`BlockOp::WriteZeroes`].
    pub secure_erase: bool,
}

impl VolumeInfo {
    /// A plain volume of `nsectors`: 512-byte logical and 4096-byte physical
    /// blocks, `max_hw_sectors` 255 and `max_segments` 128 (what Linux's
    /// brd reports), no volatile cache, no discard.
    pub const fn new(id: VolumeId, nsectors: u64) -> VolumeInfo {
        VolumeInfo {
            id,
            nsectors,
            logical_block_size: 512,
            physical_block_size: 4096,
            max_hw_sectors: 255,
            max_segments: 128,
            write_cache: false,
            fua: false,
            discard: None,
            secure_erase: false,
        }
    }

    /// The `cache_policy` byte: truthful write-back and FUA bits.
    pub const fn cache_policy(&self) -> CachePolicy {
        let mut bits = 0;
        if self.write_cache {
            bits |= CachePolicy::WRITEBACK.0;
            if self.fua {
                bits |= CachePolicy::FUA.0;
            }
        }
        CachePolicy(bits)
    }

    /// The OPEN_RSP announcing this volume as device `device_id`.
    pub const fn open_rsp(&self, device_id: u32) -> OpenRsp {
        let (max_discard_sectors, discard_granularity, discard_alignment) = match self.discard {
            Some(limits) => (limits.max_sectors, limits.granularity, limits.alignment),
            None => (0, 0, 0),
        };
        OpenRsp {
            device_id,
            nsectors: self.nsectors,
            max_hw_sectors: self.max_hw_sectors,
            max_write_same_sectors: 0,
            max_discard_sectors,
            discard_granularity,
            discard_alignment,
            physical_block_size: self.physical_block_size,
            logical_block_size: self.logical_block_size,
            max_segments: self.max_segments,
            secure_discard: (self.secure_erase && self.discard.is_some()) as u16,
            rotational: 0,
            cache_policy: self.cache_policy(),
        }
    }
}

/// The most a session may do with a volume (from the access list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Grant {
    /// Read-only opens only.
    ReadOnly,
    /// RO, RW and MIGRATION opens (writer limits still apply).
    ReadWrite,
}

/// Why [`Exports::lookup`] found nothing to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LookupError {
    /// No volume has this `device_path` (ENOENT).
    NotFound,
    /// The volume exists but no access rule admits this session (EACCES).
    Denied,
}

/// A volume an OPEN may map: its description and what this session may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Export {
    /// The volume.
    pub volume: VolumeInfo,
    /// The session's rights on it.
    pub grant: Grant,
}

/// The export table as one session sees it. The engine implements it from
/// the manifest for the session's name and source address.
pub trait Exports {
    /// The volume `device_path` names and this session's rights on it.
    ///
    /// # Errors
    /// [`LookupError::NotFound`] for an unknown path,
    /// [`LookupError::Denied`] if the access list refuses the session.
    fn lookup(&self, device_path: &str) -> Result<Export, LookupError>;
}

//! The POOLS section (format version 4): the devices thin volumes take
//! their extents from, and the checks that bind thin volumes to them.

use core::fmt;

use super::{error_name, section, Backing, Manifest, ReadError};
use crate::types::{
    check_backing_path, check_name, Size, VolumeKind, MAX_THIN_VOLUMES_PER_POOL, SIZE_ALIGN,
};

/// The first format version with pools and thin volumes.
pub const POOLS_VERSION: u16 = 4;
/// The POOLS record length.
pub const POOL_RECORD_LEN: u16 = 32;

/// A checked pool: a file or block device carved into extents that its
/// thin volumes share (and may overcommit).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Pool<'a> {
    /// The pool's name (thin volumes name it).
    pub name: &'a str,
    /// Where the extents live.
    pub backing: PoolBacking<'a>,
}

/// Where a pool's extents live (hosted target).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PoolBacking<'a> {
    /// A file; `size` creates or grows it, `None` = the file's own size.
    File {
        /// Absolute path.
        path: &'a str,
        /// Bytes, a multiple of 4096, if given.
        size: Option<u64>,
    },
    /// A whole host block device.
    Block {
        /// Absolute path.
        path: &'a str,
    },
}

impl PoolBacking<'_> {
    /// The path of the file or device.
    pub fn path(&self) -> &str {
        match self {
            Self::File { path, .. } | Self::Block { path } => path,
        }
    }
}

/// `pool0 (file /var/lib/brick/pool0.img 64GiB)`, for the boot log.
impl fmt::Display for Pool<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.backing {
            PoolBacking::File {
                path,
                size: Some(size),
            } => write!(f, "{} (file {path} {})", self.name, Size(size)),
            PoolBacking::File { path, size: None } => write!(f, "{} (file {path})", self.name),
            PoolBacking::Block { path } => write!(f, "{} (block {path})", self.name),
        }
    }
}

impl<'a> Manifest<'a> {
    pub(super) fn decode_pool(&self, index: usize) -> Result<Pool<'a>, ReadError> {
        let r = self.record(self.pools, index);
        let name = self.checked_text(r.str_ref(0), "pool name", check_name)?;
        let path = self.checked_text(r.str_ref(8), "pool path", check_backing_path)?;
        let size = r.u64(16);
        let kind = r.u8(24);
        if r.array::<7>(25) != [0; 7] {
            return Err(ReadError::ReservedNotZero("pool bytes"));
        }
        let bad = |reason| ReadError::BadPool {
            pool: error_name(name),
            reason,
        };
        if size % SIZE_ALIGN != 0 {
            return Err(bad("size is not a multiple of 4096"));
        }
        let backing = match VolumeKind::from_code(kind) {
            Some(VolumeKind::File) => PoolBacking::File {
                path,
                size: (size != 0).then_some(size),
            },
            Some(VolumeKind::Block) if size == 0 => PoolBacking::Block { path },
            Some(VolumeKind::Block) => return Err(bad("a block pool takes the device's size")),
            _ => return Err(bad("kind is neither file nor block")),
        };
        Ok(Pool { name, backing })
    }

    /// Pools: unique names and paths, no path shared with a file or block
    /// volume, at most [`MAX_THIN_VOLUMES_PER_POOL`] thin volumes each.
    /// Runs after the volumes are checked.
    pub(super) fn check_pools(&self) -> Result<(), ReadError> {
        Self::count_in(self.pools, section::POOLS, 0, crate::types::MAX_POOLS)?;
        for i in 0..self.pools.count {
            let pool = self.decode_pool(i)?;
            for j in 0..i {
                let other = self.decode_pool(j)?;
                if other.name == pool.name {
                    return Err(ReadError::DuplicatePool(error_name(pool.name)));
                }
                if other.backing.path() == pool.backing.path() {
                    return Err(ReadError::DuplicateBacking(error_name(pool.name)));
                }
            }
        }
        Ok(())
    }

    /// The pool a thin volume names, checked against the pool section.
    pub(super) fn thin_pool(&self, volume: &str, pool: &str) -> Result<Pool<'a>, ReadError> {
        (0..self.pools.count)
            .filter_map(|i| self.decode_pool(i).ok())
            .find(|p| p.name == pool)
            .ok_or_else(|| ReadError::UnknownPool(error_name(volume)))
    }

    /// Cross-checks of pools and volumes (after both are decoded).
    pub(super) fn check_pool_users(&self) -> Result<(), ReadError> {
        for i in 0..self.pools.count {
            let pool = self.decode_pool(i)?;
            let mut thin = 0;
            for volume in self.volumes() {
                match volume.backing {
                    Backing::File { path, .. } | Backing::Block { path }
                        if path == pool.backing.path() =>
                    {
                        return Err(ReadError::DuplicateBacking(error_name(volume.name)));
                    }
                    Backing::Thin { pool: p, .. } if p.name == pool.name => thin += 1,
                    _ => {}
                }
            }
            if thin > MAX_THIN_VOLUMES_PER_POOL {
                return Err(ReadError::BadPool {
                    pool: error_name(pool.name),
                    reason: "more thin volumes than a pool's volume table holds (50)",
                });
            }
        }
        Ok(())
    }

    /// Number of pools (0..=[`MAX_POOLS`](crate::types::MAX_POOLS); always
    /// 0 before format version 4).
    pub fn pool_count(&self) -> usize {
        self.pools.count
    }

    /// The pools, in manifest order.
    pub fn pools(&self) -> impl Iterator<Item = Pool<'a>> + '_ {
        (0..self.pools.count).filter_map(|i| self.decode_pool(i).ok())
    }
}

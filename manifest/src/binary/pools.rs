//! The POOLS section (format version 4): the devices thin volumes take
//! their extents from, and the checks that bind thin volumes to them.

use core::fmt;

use super::{error_name, section, Backing, Manifest, ReadError, SELECTOR_PCI, SELECTOR_SERIAL};
use crate::types::{
    check_backing_path, check_name, check_serial, PciAddress, Size, VirtioSelector, VolumeKind,
    MAX_THIN_VOLUMES_PER_POOL, SIZE_ALIGN,
};

/// The first format version with pools and thin volumes.
pub const POOLS_VERSION: u16 = 4;
/// The POOLS record length.
pub const POOL_RECORD_LEN: u16 = 32;

/// A checked pool: a file, block device (hosted), virtio-blk disk or NVMe
/// namespace (image) carved into extents that its thin volumes share (and
/// may overcommit).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Pool<'a> {
    /// The pool's name (thin volumes name it).
    pub name: &'a str,
    /// Where the extents live.
    pub backing: PoolBacking<'a>,
}

/// Where a pool's extents live: a file or block device (hosted target), a
/// virtio-blk disk or an NVMe namespace (image).
///
/// A device pool's record (32 bytes) keeps the file pools' layout: the
/// serial (by-serial selector) in the path's string, size 0, the kind, then
/// in the bytes the file pools leave zero the selector (byte 25), the
/// namespace (NVMe, u16 at 26) and the PCI address (u32 at 28), encoded as
/// a volume's are.
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
    /// A virtio-blk disk (image), by PCI address or serial.
    VirtioBlk(VirtioSelector<'a>),
    /// A namespace of an NVMe controller (image).
    Nvme {
        /// The controller, by PCI address or serial.
        controller: VirtioSelector<'a>,
        /// The namespace id (1 and up).
        namespace: u32,
    },
}

impl PoolBacking<'_> {
    /// The path of the file or block device (`""` for a device pool).
    pub fn path(&self) -> &str {
        match self {
            Self::File { path, .. } | Self::Block { path } => path,
            Self::VirtioBlk(_) | Self::Nvme { .. } => "",
        }
    }

    /// The pool's kind (`file`, `block`, `virtio-blk`, `nvme`).
    pub fn kind(&self) -> VolumeKind {
        match self {
            Self::File { .. } => VolumeKind::File,
            Self::Block { .. } => VolumeKind::Block,
            Self::VirtioBlk(_) => VolumeKind::VirtioBlk,
            Self::Nvme { .. } => VolumeKind::Nvme,
        }
    }

    /// Whether the image serves pools of this kind (virtio-blk, NVMe), not
    /// the hosted target (files, block devices).
    pub fn is_device(&self) -> bool {
        matches!(self, Self::VirtioBlk(_) | Self::Nvme { .. })
    }

    /// Whether `self` and `other` name the same storage.
    pub fn same_storage(&self, other: &PoolBacking<'_>) -> bool {
        match (self, other) {
            (Self::VirtioBlk(a), PoolBacking::VirtioBlk(b)) => a == b,
            (
                Self::Nvme {
                    controller: a,
                    namespace: m,
                },
                PoolBacking::Nvme {
                    controller: b,
                    namespace: n,
                },
            ) => a == b && m == n,
            (a, b) if !a.is_device() && !b.is_device() => a.path() == b.path(),
            _ => false,
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
            PoolBacking::VirtioBlk(VirtioSelector::Pci(address)) => {
                write!(f, "{} (virtio-blk pci {address})", self.name)
            }
            PoolBacking::VirtioBlk(VirtioSelector::Serial(serial)) => {
                write!(f, "{} (virtio-blk serial {serial:?})", self.name)
            }
            PoolBacking::Nvme {
                controller: VirtioSelector::Pci(address),
                namespace,
            } => write!(
                f,
                "{} (nvme pci {address} namespace {namespace})",
                self.name
            ),
            PoolBacking::Nvme {
                controller: VirtioSelector::Serial(serial),
                namespace,
            } => write!(
                f,
                "{} (nvme serial {serial:?} namespace {namespace})",
                self.name
            ),
        }
    }
}

impl<'a> Manifest<'a> {
    pub(super) fn decode_pool(&self, index: usize) -> Result<Pool<'a>, ReadError> {
        let r = self.record(self.pools, index);
        let name = self.checked_text(r.str_ref(0), "pool name", check_name)?;
        let size = r.u64(16);
        let kind = VolumeKind::from_code(r.u8(24));
        let bad = |reason| ReadError::BadPool {
            pool: error_name(name),
            reason,
        };
        if size % SIZE_ALIGN != 0 {
            return Err(bad("size is not a multiple of 4096"));
        }
        if let Some(kind @ (VolumeKind::VirtioBlk | VolumeKind::Nvme)) = kind {
            return self
                .decode_device_pool(name, kind, &r)
                .map_err(|error| match error {
                    ReadError::BadVolume { reason, .. } => bad(reason),
                    other => other,
                });
        }
        if r.array::<7>(25) != [0; 7] {
            return Err(ReadError::ReservedNotZero("pool bytes"));
        }
        let path = self.checked_text(r.str_ref(8), "pool path", check_backing_path)?;
        let backing = match kind {
            Some(VolumeKind::File) => PoolBacking::File {
                path,
                size: (size != 0).then_some(size),
            },
            Some(VolumeKind::Block) if size == 0 => PoolBacking::Block { path },
            Some(VolumeKind::Block) => return Err(bad("a block pool takes the device's size")),
            _ => return Err(bad("kind is not file, block, virtio-blk or nvme")),
        };
        Ok(Pool { name, backing })
    }

    /// A virtio-blk or NVMe pool's record (see [`PoolBacking`]).
    fn decode_device_pool(
        &self,
        name: &'a str,
        kind: VolumeKind,
        r: &super::Record<'_>,
    ) -> Result<Pool<'a>, ReadError> {
        let bad = |reason| ReadError::BadPool {
            pool: error_name(name),
            reason,
        };
        if r.u64(16) != 0 {
            return Err(bad("a virtio-blk or NVMe pool takes the device's size"));
        }
        let serial_ref = r.str_ref(8);
        let pci = r.u32(28);
        let namespace = r.u16(26);
        let controller = match r.u8(25) {
            SELECTOR_PCI if serial_ref.1 == 0 => {
                let address = PciAddress::from_u32(pci);
                if address.to_u32() != pci {
                    return Err(ReadError::ReservedNotZero("pool PCI address bits"));
                }
                VirtioSelector::Pci(address)
            }
            SELECTOR_PCI => return Err(bad("a pool by PCI address has no serial")),
            SELECTOR_SERIAL if pci == 0 => VirtioSelector::Serial(self.checked_text(
                serial_ref,
                "pool serial",
                check_serial,
            )?),
            SELECTOR_SERIAL => return Err(bad("a pool by serial has no PCI address")),
            _ => {
                return Err(bad(
                    "a virtio-blk or NVMe pool needs a PCI address or serial",
                ))
            }
        };
        let backing = if kind == VolumeKind::Nvme {
            if namespace == 0 {
                return Err(bad("an NVMe pool names a namespace (1 and up)"));
            }
            PoolBacking::Nvme {
                controller,
                namespace: u32::from(namespace),
            }
        } else {
            if namespace != 0 {
                return Err(ReadError::ReservedNotZero("pool bytes"));
            }
            PoolBacking::VirtioBlk(controller)
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
                if other.backing.same_storage(&pool.backing) {
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
                        if !pool.backing.is_device() && path == pool.backing.path() =>
                    {
                        return Err(ReadError::DuplicateBacking(error_name(volume.name)));
                    }
                    Backing::VirtioBlk(selector)
                        if pool.backing.same_storage(&PoolBacking::VirtioBlk(selector)) =>
                    {
                        return Err(ReadError::DuplicateBacking(error_name(volume.name)));
                    }
                    Backing::Nvme {
                        controller,
                        namespace,
                    } if pool.backing.same_storage(&PoolBacking::Nvme {
                        controller,
                        namespace,
                    }) =>
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

//! The checked views a [`Manifest`](super::Manifest) hands out: the target
//! identity, interfaces, volumes and their backing, access rules. Each
//! borrows its strings from the blob.

use core::fmt;
use core::net::Ipv4Addr;

use super::Pool;
use crate::types::{
    pattern_matches, AccessMode, Ipv4Cidr, MacAddress, Size, VirtioSelector, VolumeKind,
};

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
    pub(super) bytes: &'a [u8],
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

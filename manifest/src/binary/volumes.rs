//! The VOLUMES section: decoding a volume record and its backing (RAM,
//! file, block device, virtio-blk, NVMe, thin), the lookups by index, name
//! and `device_path`, and the same-backing test behind the duplicate check.

use super::{
    error_name, pools, Backing, Manifest, ReadError, Volume, SELECTOR_NONE, SELECTOR_PCI,
    SELECTOR_SERIAL,
};
#[cfg(doc)]
use crate::types::MAX_VOLUMES;
use crate::types::{
    check_backing_path, check_device_path, check_name, check_serial, PciAddress, VirtioSelector,
    VolumeKind, SIZE_ALIGN,
};

impl<'a> Manifest<'a> {
    pub(super) fn decode_volume(&self, index: usize) -> Result<Volume<'a>, ReadError> {
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

    /// Number of volumes (1..=[`MAX_VOLUMES`]).
    pub fn volume_count(&self) -> usize {
        self.volumes.count
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
}

pub(super) fn same_backing(a: &Backing<'_>, b: &Backing<'_>) -> bool {
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

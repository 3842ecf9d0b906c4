//! `[[pools]]`: the devices thin volumes take their extents from, and the
//! thin volumes' own fields.

use serde::Deserialize;
use toml::Spanned;

use super::{Compiler, RawSize, RawVolume, Result};
use crate::config::{Backing, Pool, PoolBacking, Volume};
use crate::types::{
    check_backing_path, check_name, check_serial, PciAddress, MAX_POOLS, MAX_THIN_VOLUMES_PER_POOL,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    name: Spanned<String>,
    kind: Spanned<String>,
    path: Option<Spanned<String>>,
    size: Option<Spanned<RawSize>>,
    pci: Option<Spanned<String>>,
    serial: Option<Spanned<String>>,
    namespace: Option<Spanned<i64>>,
}

/// A device pool's selector, before the kind makes it a backing.
enum Selector {
    Pci(PciAddress),
    Serial(String),
}

impl Compiler<'_> {
    /// The pools (none is fine: the table is optional).
    pub(super) fn pools(&self, raw: Option<&Spanned<Vec<Spanned<RawPool>>>>) -> Result<Vec<Pool>> {
        let Some(list) = raw else {
            return Ok(Vec::new());
        };
        let items = list.get_ref();
        if items.len() > MAX_POOLS {
            return Err(self.at(
                list,
                "pools",
                format!("{} entries, at most {MAX_POOLS} allowed", items.len()),
            ));
        }
        let mut out: Vec<Pool> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let raw = item.get_ref();
            let path = |field: &str| format!("pools[{i}].{field}");
            let name = self.text(&raw.name, &path("name"), check_name)?;
            let backing = self.pool_backing(item, i)?;
            for (j, other) in out.iter().enumerate() {
                if other.name == name {
                    return Err(self.at(
                        &raw.name,
                        path("name"),
                        format!("duplicate pool name {name:?} (also pools[{j}])"),
                    ));
                }
                if same_storage(&other.backing, &backing) {
                    return Err(self.at(
                        item,
                        format!("pools[{i}]"),
                        format!(
                            "same {} as pools[{j}] ({:?})",
                            if backing.path().is_some() {
                                "path"
                            } else {
                                "device"
                            },
                            other.name
                        ),
                    ));
                }
            }
            out.push(Pool { name, backing });
        }
        Ok(out)
    }

    /// A pool's storage: `path` (and `size`) for a file, `path` for a
    /// block device, `pci` or `serial` (and `namespace`) for a virtio-blk
    /// disk or an NVMe namespace; any other field is refused.
    fn pool_backing(&self, item: &Spanned<RawPool>, i: usize) -> Result<PoolBacking> {
        let raw = item.get_ref();
        let path = |field: &str| format!("pools[{i}].{field}");
        let kind = raw.kind.get_ref().as_str();
        let allowed: &[&str] = match kind {
            "file" => &["path", "size"],
            "block" => &["path"],
            "virtio-blk" => &["pci", "serial"],
            "nvme" => &["pci", "serial", "namespace"],
            other => {
                return Err(self.at(
                    &raw.kind,
                    path("kind"),
                    format!(
                        "unknown pool kind {other:?}; expected \"file\", \"block\" (hosted \
                         target), \"virtio-blk\" or \"nvme\" (image)"
                    ),
                ))
            }
        };
        let given = [
            ("path", raw.path.as_ref().map(Spanned::span)),
            ("size", raw.size.as_ref().map(Spanned::span)),
            ("pci", raw.pci.as_ref().map(Spanned::span)),
            ("serial", raw.serial.as_ref().map(Spanned::span)),
            ("namespace", raw.namespace.as_ref().map(Spanned::span)),
        ];
        for (field, span) in given {
            if let Some(span) = span {
                if !allowed.contains(&field) {
                    let why = if field == "size" && kind != "file" {
                        format!("not allowed for a {kind} pool (it takes the device's size)")
                    } else {
                        format!(
                            "not allowed for a {kind} pool (allowed: {})",
                            allowed.join(", ")
                        )
                    };
                    return Err(self.error(Some(span), path(field), why));
                }
            }
        }
        let file = || -> Result<String> {
            match &raw.path {
                Some(p) => self.text(p, &path("path"), check_backing_path),
                None => Err(self.at(
                    item,
                    format!("pools[{i}]"),
                    format!("a {kind} pool needs `path`"),
                )),
            }
        };
        let selector = || -> Result<Selector> {
            match (&raw.pci, &raw.serial) {
                (Some(pci), None) => PciAddress::parse(pci.get_ref())
                    .map(Selector::Pci)
                    .ok_or_else(|| {
                        self.at(
                            pci,
                            path("pci"),
                            format!(
                                "expected a PCI address like \"00:05.0\", found {:?}",
                                pci.get_ref()
                            ),
                        )
                    }),
                (None, Some(serial)) => self
                    .text(serial, &path("serial"), check_serial)
                    .map(Selector::Serial),
                (Some(_), Some(serial)) => Err(self.at(
                    serial,
                    path("serial"),
                    "give either `pci` or `serial`, not both",
                )),
                (None, None) => Err(self.at(
                    item,
                    format!("pools[{i}]"),
                    format!("a {kind} pool needs `pci` or `serial`"),
                )),
            }
        };
        Ok(match kind {
            "file" => PoolBacking::File {
                path: file()?,
                size: raw
                    .size
                    .as_ref()
                    .map(|s| self.block_size(s, &path("size")))
                    .transpose()?,
            },
            "block" => PoolBacking::Block { path: file()? },
            "virtio-blk" => match selector()? {
                Selector::Pci(pci) => PoolBacking::VirtioPci(pci),
                Selector::Serial(serial) => PoolBacking::VirtioSerial(serial),
            },
            _ => {
                let namespace = match &raw.namespace {
                    None => 1,
                    Some(n) => match u16::try_from(*n.get_ref()) {
                        Ok(value) if value > 0 => u32::from(value),
                        _ => {
                            return Err(self.at(
                                n,
                                path("namespace"),
                                format!(
                                    "expected a namespace id from 1 to 65535, found {}",
                                    n.get_ref()
                                ),
                            ))
                        }
                    },
                };
                match selector()? {
                    Selector::Pci(pci) => PoolBacking::NvmePci { pci, namespace },
                    Selector::Serial(serial) => PoolBacking::NvmeSerial { serial, namespace },
                }
            }
        })
    }

    /// A thin volume's backing: `pool` (declared) and `size` (required).
    pub(super) fn thin_backing(
        &self,
        item: &Spanned<RawVolume>,
        i: usize,
        pools: &[Pool],
    ) -> Result<Backing> {
        let raw = item.get_ref();
        let path = |field: &str| format!("volumes[{i}].{field}");
        let Some(pool) = &raw.pool else {
            return Err(self.at(item, format!("volumes[{i}]"), "a thin volume needs `pool`"));
        };
        if !pools.iter().any(|p| &p.name == pool.get_ref()) {
            let known: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            return Err(self.at(
                pool,
                path("pool"),
                format!(
                    "unknown pool {:?} (declared: {})",
                    pool.get_ref(),
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        let Some(size) = &raw.size else {
            return Err(self.at(
                item,
                format!("volumes[{i}]"),
                "a thin volume needs `size` (its virtual size; it may exceed the pool)",
            ));
        };
        Ok(Backing::Thin {
            pool: pool.get_ref().clone(),
            size: self.block_size(size, &path("size"))?,
        })
    }

    /// No volume on a pool's path; no pool with more thin volumes than
    /// its volume table holds.
    pub(super) fn check_pool_users(
        &self,
        raw: Option<&Spanned<Vec<Spanned<RawPool>>>>,
        pools: &[Pool],
        volumes: &[Volume],
    ) -> Result<()> {
        let Some(list) = raw else {
            return Ok(());
        };
        for (i, (pool, item)) in pools.iter().zip(list.get_ref()).enumerate() {
            for (j, volume) in volumes.iter().enumerate() {
                let same = match (&volume.backing, &pool.backing) {
                    (Backing::File { path, .. } | Backing::Block { path }, pool) => {
                        pool.path() == Some(path.as_str())
                    }
                    (Backing::VirtioPci(a), PoolBacking::VirtioPci(b)) => a == b,
                    (Backing::VirtioSerial(a), PoolBacking::VirtioSerial(b)) => a == b,
                    (
                        Backing::NvmePci {
                            pci: a,
                            namespace: m,
                        },
                        PoolBacking::NvmePci {
                            pci: b,
                            namespace: n,
                        },
                    ) => a == b && m == n,
                    (
                        Backing::NvmeSerial {
                            serial: a,
                            namespace: m,
                        },
                        PoolBacking::NvmeSerial {
                            serial: b,
                            namespace: n,
                        },
                    ) => a == b && m == n,
                    _ => false,
                };
                if same {
                    let (field, what) = if pool.backing.path().is_some() {
                        ("path", "path")
                    } else {
                        ("kind", "device")
                    };
                    return Err(self.at(
                        item,
                        format!("pools[{i}].{field}"),
                        format!("same {what} as volumes[{j}] ({:?})", volume.name),
                    ));
                }
            }
            let thin = volumes
                .iter()
                .filter(|v| matches!(&v.backing, Backing::Thin { pool: p, .. } if *p == pool.name))
                .count();
            if thin > MAX_THIN_VOLUMES_PER_POOL {
                return Err(self.at(
                    item,
                    format!("pools[{i}]"),
                    format!(
                        "{thin} thin volumes on pool {:?}, at most {MAX_THIN_VOLUMES_PER_POOL}",
                        pool.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Whether two pools name the same file, block device, disk or namespace.
fn same_storage(a: &PoolBacking, b: &PoolBacking) -> bool {
    match (a.path(), b.path()) {
        (Some(a), Some(b)) => a == b,
        (None, None) => a == b,
        _ => false,
    }
}

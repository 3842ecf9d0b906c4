//! `[[pools]]`: the devices thin volumes take their extents from, and the
//! thin volumes' own fields.

use serde::Deserialize;
use toml::Spanned;

use super::{Compiler, RawSize, RawVolume, Result};
use crate::config::{Backing, Pool, PoolBacking, Volume};
use crate::types::{check_backing_path, check_name, MAX_POOLS, MAX_THIN_VOLUMES_PER_POOL};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    name: Spanned<String>,
    kind: Spanned<String>,
    path: Spanned<String>,
    size: Option<Spanned<RawSize>>,
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
            let file = self.text(&raw.path, &path("path"), check_backing_path)?;
            let backing = match raw.kind.get_ref().as_str() {
                "file" => PoolBacking::File {
                    path: file,
                    size: raw
                        .size
                        .as_ref()
                        .map(|s| self.block_size(s, &path("size")))
                        .transpose()?,
                },
                "block" => {
                    if let Some(size) = &raw.size {
                        return Err(self.at(
                            size,
                            path("size"),
                            "not allowed for a block pool (it takes the device's size)",
                        ));
                    }
                    PoolBacking::Block { path: file }
                }
                other => {
                    return Err(self.at(
                        &raw.kind,
                        path("kind"),
                        format!("unknown pool kind {other:?}; expected \"file\" or \"block\""),
                    ))
                }
            };
            for (j, other) in out.iter().enumerate() {
                if other.name == name {
                    return Err(self.at(
                        &raw.name,
                        path("name"),
                        format!("duplicate pool name {name:?} (also pools[{j}])"),
                    ));
                }
                if pool_path(&other.backing) == pool_path(&backing) {
                    return Err(self.at(
                        &raw.path,
                        path("path"),
                        format!("same path as pools[{j}] ({:?})", other.name),
                    ));
                }
            }
            out.push(Pool { name, backing });
        }
        Ok(out)
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
                let path = match &volume.backing {
                    Backing::File { path, .. } | Backing::Block { path } => path,
                    _ => continue,
                };
                if path == pool_path(&pool.backing) {
                    return Err(self.at(
                        &item.get_ref().path,
                        format!("pools[{i}].path"),
                        format!("same path as volumes[{j}] ({:?})", volume.name),
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

fn pool_path(backing: &PoolBacking) -> &str {
    match backing {
        PoolBacking::File { path, .. } | PoolBacking::Block { path } => path,
    }
}

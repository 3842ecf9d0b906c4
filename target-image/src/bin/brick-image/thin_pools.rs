//! Thin volumes of the image (docs/THIN.md): pools on virtio-blk disks and
//! NVMe namespaces, shared by their thin volumes.
//!
//! The first thin volume of a pool opens the pool's disk ([`crate::disks::open_disk`],
//! the device [`crate::disks::choose_disks`] chose for "pool NAME"), checks
//! that the heap holds the pool's tables for the disk's size, and opens the
//! pool: [`thin::Pool::open`] formats a blank disk or reads and checks its
//! map, submitting to the disk and polling it until each request
//! completes (the engine is not running yet). What the check found —
//! extents, allocated, reclaimed — goes to the console. Later volumes of
//! the pool share it. Everything (map, free list, request slots, metadata
//! buffers) is allocated here, at boot: nothing on the data path.

use alloc::string::String;
use alloc::vec::Vec;

use ::thin::{Pool, PoolBuf, PoolConfig, ThinVolume};
use hal::block::BlockDevice;
use manifest::binary::{Backing, Pool as ManifestPool, PoolBacking};
use rtrs::server::ServerConfig;
use target_image::boot::pvh::Bytes;
use target_image::Chunk;

/// A pool's disk: its requests carry a piece of a chunk or one of the
/// pool's metadata buffers (bounced: they have no bus address).
pub type PoolDisk = crate::serve::DiskOf<PoolBuf<Chunk>>;
/// A thin volume of the image.
pub type Thin = ThinVolume<PoolDisk, Chunk>;

/// The key [`crate::disks::choose_disks`] and [`crate::disks::open_disk`]
/// know a pool's disk by.
pub fn pool_key(name: &str) -> String {
    alloc::format!("pool {name}")
}

/// The disk backing a virtio-blk or NVMe pool, as a volume's backing
/// (what [`crate::disks::choose_disks`] selects by); `None` for a file
/// or block pool (the hosted target's).
pub fn device_backing<'a>(pool: &ManifestPool<'a>) -> Option<Backing<'a>> {
    match pool.backing {
        PoolBacking::VirtioBlk(selector) => Some(Backing::VirtioBlk(selector)),
        PoolBacking::Nvme {
            controller,
            namespace,
        } => Some(Backing::Nvme {
            controller,
            namespace,
        }),
        PoolBacking::File { .. } | PoolBacking::Block { .. } => None,
    }
}

/// The open pools, by name.
#[derive(Default)]
pub struct Pools {
    open: Vec<(String, Pool<PoolDisk, Chunk>)>,
}

impl Pools {
    /// Opens thin volume `name` of `size` bytes on `pool`, opening the
    /// pool first (its disk through `open_disk(config, key, backing)`) if
    /// none of its volumes is open yet.
    ///
    /// # Errors
    /// Why the pool or the volume did not open (a file or block pool, the
    /// disk, too little heap for its tables, its metadata, the volume
    /// table).
    pub fn volume(
        &mut self,
        config: &ServerConfig,
        pool: &ManifestPool<'_>,
        name: &str,
        size: u64,
        open_disk: impl FnOnce(&ServerConfig, &str, &Backing<'_>) -> Result<PoolDisk, String>,
    ) -> Result<Thin, String> {
        let open = match self.open.iter().find(|(open, _)| open == pool.name) {
            Some((_, open)) => open.clone(),
            None => {
                let open = open_pool(config, pool, open_disk)?;
                self.open.push((String::from(pool.name), open.clone()));
                open
            }
        };
        let depth = target_image::virtio_blk_config(config).queue_depth;
        let thin = open
            .volume(name, size, u32::from(depth))
            .map_err(|error| alloc::format!("on pool {}: {error}", pool.name))?;
        log!(
            "thin: volume {name} on pool {}: {} virtual, {} extents allocated",
            pool.name,
            Bytes(size),
            thin.allocated()
        );
        Ok(thin)
    }
}

/// Opens `pool`'s disk and the pool on it (formatting a blank disk), and
/// logs the check's report.
fn open_pool(
    config: &ServerConfig,
    pool: &ManifestPool<'_>,
    open_disk: impl FnOnce(&ServerConfig, &str, &Backing<'_>) -> Result<PoolDisk, String>,
) -> Result<Pool<PoolDisk, Chunk>, String> {
    let Some(backing) = device_backing(pool) else {
        return Err(alloc::format!(
            "pool {} is a {} pool: the image takes thin volumes on virtio-blk and nvme pools",
            pool.name,
            pool.backing.kind().as_str()
        ));
    };
    let disk = open_disk(config, &pool_key(pool.name), &backing)?;
    let size = disk.info().size;
    // The tables sized by the disk (manifest::capacity::thin_bytes counts
    // the rest): refuse clearly rather than fail an allocation.
    let tables = (size >> 21)
        .saturating_mul(manifest::capacity::sizes::THIN_PHYSICAL_EXTENT)
        .saturating_add(manifest::capacity::sizes::THIN_POOL);
    let (heap_free, _, _) = crate::memory::HEAP.stats();
    if tables > heap_free {
        return Err(alloc::format!(
            "pool {}: the tables of a {} disk take {}, the heap has {} free: give the guest \
             more memory",
            pool.name,
            Bytes(size),
            Bytes(tables),
            Bytes(heap_free)
        ));
    }
    let (open, report) = Pool::open(disk, &PoolConfig::default())
        .map_err(|error| alloc::format!("pool {} ({}): {error}", pool.name, Bytes(size)))?;
    log!("pool {}: {report}", pool.name);
    Ok(open)
}

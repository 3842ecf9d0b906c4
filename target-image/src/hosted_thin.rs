//! Thin volumes of the hosted target: each manifest pool is a file or
//! block device behind a worker pool ([`FileDevice`]), opened (formatted
//! if blank, checked otherwise) by the first of its thin volumes and
//! shared by the rest ([`thin::Pool`]). The check's report — extents,
//! allocated, reclaimed — is logged when the pool opens.
//!
//! The engine opens volumes one after another on its own thread, so the
//! open pools are kept in a thread-local registry of weak handles: a pool
//! lives as long as one of its volumes does, and an engine built later
//! opens (and checks) it afresh.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::RefCell;
use std::path::Path;

use hal::hosted::{FileConfig, FileDevice};
use manifest::binary::{Pool as ManifestPool, PoolBacking, Volume};
use thin::{OpenReport, Pool, PoolBuf, PoolConfig, ThinVolume, WeakPool};

use crate::{BuildError, Chunk};

/// The pool device: a file or block device whose requests name either a
/// chunk (data) or one of the pool's metadata buffers.
pub type PoolDevice = FileDevice<PoolBuf<Chunk>>;
/// A thin volume of the hosted target.
pub type HostedThin = ThinVolume<PoolDevice, Chunk>;

std::thread_local! {
    /// Open pools by path, as weak handles.
    static POOLS: RefCell<Vec<(String, WeakPool<PoolDevice, Chunk>)>> =
        const { RefCell::new(Vec::new()) };
}

/// Opens thin volume `volume` of `size` bytes on `pool`, opening the pool
/// first if none of its volumes is open. `file_config` is the pool
/// device's (its queue is shared by the pool's volumes); `queue_depth`
/// the volume's own.
pub(crate) fn open_thin(
    volume: &Volume<'_>,
    pool: &ManifestPool<'_>,
    size: u64,
    file_config: &FileConfig,
    queue_depth: u32,
) -> Result<HostedThin, BuildError> {
    let fail = |why: String| BuildError::Volume(volume.name.into(), why);
    if pool.backing.is_device() {
        return Err(fail(format!(
            "pool {} is a {} pool, which the image serves; the hosted target takes file and \
             block pools",
            pool.name,
            pool.backing.kind().as_str()
        )));
    }
    let open = existing(pool.backing.path())
        .map_or_else(|| open_pool(pool, file_config).map_err(&fail), Ok)?;
    open.volume(volume.name, size, queue_depth)
        .map_err(|e| fail(format!("on pool {}: {e}", pool.name)))
}

fn existing(path: &str) -> Option<Pool<PoolDevice, Chunk>> {
    POOLS.with(|pools| {
        let mut pools = pools.borrow_mut();
        pools.retain(|(_, weak)| weak.upgrade().is_some());
        pools
            .iter()
            .find(|(open, _)| open == path)
            .and_then(|(_, weak)| weak.upgrade())
    })
}

fn open_pool(
    pool: &ManifestPool<'_>,
    file_config: &FileConfig,
) -> Result<Pool<PoolDevice, Chunk>, String> {
    let path = pool.backing.path();
    if let PoolBacking::File { size, .. } = pool.backing {
        crate::hosted::prepare_file(Path::new(path), size)
            .map_err(|e| format!("pool {}: {e}", pool.name))?;
    }
    let device = FileDevice::open(path, file_config)
        .map_err(|e| format!("pool {}: open {path}: {e}", pool.name))?;
    let (open, report): (_, OpenReport) = Pool::open(device, &PoolConfig::default())
        .map_err(|e| format!("pool {} ({path}): {e}", pool.name))?;
    std::eprintln!("brick-target: pool {}: {report}", pool.name);
    POOLS.with(|pools| {
        pools
            .borrow_mut()
            .push((String::from(path), open.downgrade()));
    });
    Ok(open)
}

//! Hosted volumes: what `brick-target` serves on Linux.
//!
//! [`HostedVolume`] is RAM ([`RamVolume`](crate::RamVolume)) or a file or block device
//! ([`hal::hosted::FileDevice`]: a worker pool doing `pread`/`pwrite`,
//! FLUSH -> `fdatasync`, FUA -> write + `fdatasync` before completion),
//! or a thin volume on a pool that is such a file or device
//! ([`HostedThin`](crate::hosted_thin::HostedThin), docs/THIN.md).
//! [`open_volume`] opens what a manifest entry names: a file with a
//! manifest size is created at that size if missing and grown to it if
//! smaller (a larger one is refused: serving part of it would hide data);
//! a file without a size, and a block device, are served whole.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use std::fs::OpenOptions;
use std::path::Path;

use hal::block::Either;
use hal::hosted::{FileConfig, FileDevice};
use manifest::binary::{Backing, Volume};
use rtrs::server::ServerConfig;

use crate::{ram_volume, BuildError, Chunk, RamOr};

/// Worker threads per file volume.
const FILE_WORKERS: usize = 4;
/// Most requests one file volume holds in flight (more wait parked in the
/// engine); each slot owns a bounce buffer of one chunk.
const FILE_QUEUE_DEPTH: u32 = 128;

/// A volume of the hosted target: RAM, a file or block device behind a
/// worker pool, or a thin volume on a pool.
pub type HostedVolume = RamOr<Either<FileDevice<Chunk>, crate::hosted_thin::HostedThin>>;

/// Opens the volume a manifest entry names (see the module docs).
/// `config` bounds the transfers: one chunk at most.
///
/// # Errors
/// [`BuildError::Volume`] naming the volume, the path and the OS error, or
/// the kind this build does not serve (virtio-blk is the image's).
pub fn open_volume(config: &ServerConfig, volume: &Volume<'_>) -> Result<HostedVolume, BuildError> {
    let fail = |why: String| BuildError::Volume(volume.name.into(), why);
    let file_config = FileConfig {
        queue_depth: FILE_QUEUE_DEPTH.min(u32::from(config.queue_depth).max(1)),
        workers: FILE_WORKERS,
        max_transfer: config.chunk_size.next_multiple_of(4096),
        ..FileConfig::default()
    };
    match volume.backing {
        Backing::Ram { .. } => ram_volume(volume).map(|ram| HostedVolume::Ram(Box::new(ram))),
        Backing::File { path, size } => {
            prepare_file(Path::new(path), size).map_err(&fail)?;
            FileDevice::open(path, &file_config)
                .map(|file| RamOr::Device(Either::Left(file)))
                .map_err(|e| fail(format!("open {path}: {e}")))
        }
        Backing::Block { path } => FileDevice::open(path, &file_config)
            .map(|file| RamOr::Device(Either::Left(file)))
            .map_err(|e| fail(format!("open {path}: {e}"))),
        Backing::Thin { pool, size } => {
            let pool_config = FileConfig {
                queue_depth: FILE_QUEUE_DEPTH,
                ..file_config
            };
            crate::hosted_thin::open_thin(
                volume,
                &pool,
                size,
                &pool_config,
                file_config.queue_depth,
            )
            .map(|thin| RamOr::Device(Either::Right(thin)))
        }
        Backing::VirtioBlk(_) => Err(fail(
            "virtio-blk volumes are served by the image, not the hosted target".into(),
        )),
        Backing::Nvme { .. } => Err(fail(
            "nvme volumes are served by the image, not the hosted target (serve the \
             namespace's /dev/nvmeXnY as a `block` volume)"
                .into(),
        )),
    }
}

/// Creates `path` at `size` if missing, grows it to `size` if smaller;
/// refuses a file larger than `size` (serving part of it would hide data).
pub(crate) fn prepare_file(path: &Path, size: Option<u64>) -> Result<(), String> {
    let shown = path.display();
    let Some(size) = size else {
        return std::fs::metadata(path)
            .map(|_| ())
            .map_err(|e| format!("{shown}: {e} (give a size to create it)"));
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("{shown}: {e}"))?;
    let current = file.metadata().map_err(|e| format!("{shown}: {e}"))?.len();
    if current > size {
        return Err(format!(
            "{shown} is {current} bytes, larger than the manifest size {size}: \
             refusing to serve part of it (raise the size or drop it)"
        ));
    }
    if current < size {
        file.set_len(size)
            .map_err(|e| format!("{shown}: grow to {size} bytes: {e}"))?;
        file.sync_all().map_err(|e| format!("{shown}: sync: {e}"))?;
    }
    Ok(())
}

//! The image's boot-time memory check: do the RAM volumes plus every
//! session's chunk pool fit in the memory it has ([`MemoryError`]).

use core::fmt;

use super::{Backing, Manifest};
#[cfg(doc)]
use crate::types::Limits;

/// The machine cannot hold what the manifest preallocates (the image's
/// boot check, [`Manifest::check_memory`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemoryError {
    /// Bytes of all RAM volumes.
    pub ram_volumes: u64,
    /// Bytes of the chunk pools with every session open.
    pub chunk_pools: u64,
    /// Bytes the image has for both.
    pub available: u64,
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: u64 = 1 << 20;
        write!(
            f,
            "manifest: RAM volumes ({} MiB) + chunk pools ({} MiB) need {} MiB, only {} MiB available",
            self.ram_volumes.div_ceil(MIB),
            self.chunk_pools.div_ceil(MIB),
            self.ram_volumes.saturating_add(self.chunk_pools).div_ceil(MIB),
            self.available / MIB
        )
    }
}

impl core::error::Error for MemoryError {}

impl<'a> Manifest<'a> {
    /// Checks that `available` bytes hold the RAM volumes plus every
    /// session's chunk pool ([`Limits::max_chunk_pool_bytes`]): the image's
    /// "RAM larger than memory" check at boot.
    ///
    /// # Errors
    ///
    /// [`MemoryError`], whose `Display` is the one-line boot message.
    pub fn check_memory(&self, available: u64) -> Result<(), MemoryError> {
        let ram_volumes = self.ram_volume_bytes();
        let chunk_pools = self.limits().max_chunk_pool_bytes();
        if ram_volumes.saturating_add(chunk_pools) > available {
            return Err(MemoryError {
                ram_volumes,
                chunk_pools,
                available,
            });
        }
        Ok(())
    }

    /// Bytes of all RAM volumes together (checked not to overflow); the
    /// image compares this plus [`Limits::max_chunk_pool_bytes`] with its memory.
    pub fn ram_volume_bytes(&self) -> u64 {
        self.volumes()
            .map(|v| match v.backing {
                Backing::Ram { size } => size,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add)
    }
}

//! The preallocated pool: one physical region for all DMA and registered
//! memory, sized from the manifest and carved once at boot.
//!
//! DESIGN.md §6: everything the target will ever use is allocated at boot.
//! The image carves, in this order, from the free RAM below 4 GiB
//! ([`super::memory::FreeRanges::from_memory_map`]):
//!
//! 1. a boot heap of [`BOOT_HEAP_BYTES`] (the manifest blob, boot tables);
//! 2. the pool, [`PoolPlan::bytes`] long, [`POOL_ALIGN`]-aligned: the
//!    registered chunk pools of every session the manifest allows
//!    ([`manifest::Limits::max_chunk_pool_bytes`]) plus
//!    [`RING_BYTES`] for NIC and block rings and frame buffers;
//! 3. every byte left over joins the heap (the engine's `alloc` use: RAM
//!    volumes are `Vec<u8>` in the engine today, so their bytes must be
//!    left over; [`PoolPlan::heap_bytes`] is the check).
//!
//! The pool is handed out as one `[start, end)` physical range; a
//! sub-allocator over it (chunks, rings) comes with the network issue.

use manifest::binary::Manifest;

/// The heap before the manifest is known.
pub const BOOT_HEAP_BYTES: u64 = 8 << 20;
/// Bytes reserved in the pool for virtio rings and frame buffers.
pub const RING_BYTES: u64 = 16 << 20;
/// Pool alignment (a 2 MiB page, so it can be mapped with large pages).
pub const POOL_ALIGN: u64 = 2 << 20;

/// What a manifest preallocates.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PoolPlan {
    /// Registered memory: the chunk pools of every session at once.
    pub chunk_pools: u64,
    /// Rings and frame buffers.
    pub rings: u64,
    /// RAM volumes (allocated from the heap).
    pub ram_volumes: u64,
}

impl PoolPlan {
    /// The plan for `manifest`.
    pub fn for_manifest(manifest: &Manifest<'_>) -> PoolPlan {
        PoolPlan {
            chunk_pools: manifest.limits().max_chunk_pool_bytes(),
            rings: RING_BYTES,
            ram_volumes: manifest.ram_volume_bytes(),
        }
    }

    /// Bytes of the pool (chunk pools and rings), rounded up to [`POOL_ALIGN`].
    pub fn bytes(&self) -> u64 {
        let bytes = self.chunk_pools.saturating_add(self.rings);
        super::memory::align_up(bytes, POOL_ALIGN).unwrap_or(u64::MAX)
    }

    /// Bytes the heap needs beyond the boot heap: the RAM volumes.
    pub fn heap_bytes(&self) -> u64 {
        self.ram_volumes
    }

    /// Guest memory (MiB) that holds the plan with `slack` MiB to spare for
    /// the image, firmware holes and the engine's tables: what
    /// `cargo xtask run-image` gives QEMU by default.
    pub fn guest_mib(&self, slack: u64) -> u64 {
        const MIB: u64 = 1 << 20;
        (self.bytes() + self.heap_bytes() + BOOT_HEAP_BYTES).div_ceil(MIB) + slack
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use manifest::binary::Manifest;

    #[test]
    fn test_plan_for_example_manifest() {
        let config = manifest::compile(
            include_str!("../../../examples/two-ram-volumes.toml"),
            "two-ram-volumes.toml",
        )
        .unwrap();
        let blob = config.to_binary().unwrap();
        let manifest = Manifest::parse(&blob).unwrap();
        let plan = PoolPlan::for_manifest(&manifest);
        assert_eq!(plan.ram_volumes, 512 << 20);
        assert_eq!(plan.chunk_pools, 16 * 512 * 132 * 1024);
        assert_eq!(plan.bytes(), (1056 + 16) << 20);
        assert_eq!(plan.guest_mib(64), 1072 + 512 + 8 + 64);
    }
}

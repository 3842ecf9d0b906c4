//! The preallocated pool: one physical region for the DMA memory the
//! virtio drivers need, sized at boot, plus the heap the engine needs.
//!
//! ARCHITECTURE.md §6: everything the target will ever use is allocated at boot.
//! The image carves, in this order, from the free RAM below 4 GiB
//! ([`super::memory::FreeRanges::from_memory_map`]):
//!
//! 1. a boot heap of [`BOOT_HEAP_BYTES`] (the manifest blob, boot tables);
//! 2. the pool, [`PoolPlan::bytes`] long, [`POOL_ALIGN`]-aligned:
//!    [`RING_BYTES`] for NIC rings and frame buffers (or what the
//!    interfaces' virtio-net drivers take, [`crate::virtio_net_config`], if
//!    that is more: jumbo frames need 9 KiB buffers), plus the rings and
//!    bounce slots of each virtio-blk volume ([`crate::virtio_blk_config`])
//!    and of each NVMe volume ([`nvme_queue_config`], plus
//!    [`NVME_CONTROLLER_BYTES`] for its controller's admin queue, counted
//!    per volume): the drivers' DMA memory;
//! 3. every byte left over joins the heap. The engine allocates its
//!    registered arenas there (one per interface,
//!    [`crate::arena_bytes`]) and the HCAs' and its own tables (QPs,
//!    CQs, region tables, requests: [`manifest::Capacity::memory`]), and
//!    RAM volumes are `Vec<u8>`s there too:
//!    [`PoolPlan::heap_bytes`] is the check, counted once. Registered memory
//!    is not reserved in the pool as well (it used to be, which made the
//!    default limits need twice the memory).

use manifest::binary::{Backing, Manifest, PoolBacking};

/// The heap before the manifest is known.
pub const BOOT_HEAP_BYTES: u64 = 8 << 20;
/// Bytes reserved in the pool for NIC rings and frame buffers, at least.
pub const RING_BYTES: u64 = 16 << 20;
/// Pool alignment (a 2 MiB page, so it can be mapped with large pages).
pub const POOL_ALIGN: u64 = 2 << 20;

/// The admin queues and identify page of one NVMe controller, rounded up
/// (counted once per NVMe volume: an upper bound).
pub const NVME_CONTROLLER_BYTES: u64 = 32 << 10;

/// The I/O queue geometry of an NVMe volume: the virtio-blk volumes'
/// depth, transfer size and bounce slots ([`crate::virtio_blk_config`]),
/// twice the depth in queue entries, and a 30 s request timeout.
pub fn nvme_queue_config(config: &rtrs::server::ServerConfig) -> hal::nvme::QueueConfig {
    let blk = crate::virtio_blk_config(config);
    hal::nvme::QueueConfig {
        queue_depth: blk.queue_depth,
        queue_size: blk.queue_depth.saturating_mul(2),
        max_transfer: blk.max_transfer,
        bounce: blk.bounce,
        timeout_ns: 30_000_000_000,
    }
}

/// What a manifest preallocates.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PoolPlan {
    /// Rings, frame buffers and bounce slots (the pool).
    pub rings: u64,
    /// Of `rings`, what the virtio-blk and NVMe volumes take.
    pub disks: u64,
    /// The engine's registered arenas, all interfaces (allocated from the
    /// heap).
    pub arenas: u64,
    /// The engine's tables: QPs and their queues, CQs, region tables, CM
    /// slots, request tables (allocated from the heap).
    pub tables: u64,
    /// RAM volumes (allocated from the heap).
    pub ram_volumes: u64,
}

impl PoolPlan {
    /// The plan for `manifest`.
    pub fn for_manifest(manifest: &Manifest<'_>) -> PoolPlan {
        let config = crate::server_config(manifest);
        let per_interface = crate::arena_bytes(&config) as u64;
        let memory = manifest::Capacity::of(manifest).memory();
        let per_disk = crate::virtio_blk_config(&config).dma_bytes() as u64;
        let per_namespace = nvme_queue_config(&config).dma_bytes() as u64 + NVME_CONTROLLER_BYTES;
        let disks = manifest
            .volumes()
            .map(|volume| match volume.backing {
                Backing::VirtioBlk(_) => per_disk,
                Backing::Nvme { .. } => per_namespace,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add)
            .saturating_add(
                manifest
                    .pools()
                    .map(|pool| match pool.backing {
                        PoolBacking::VirtioBlk(_) => per_disk,
                        PoolBacking::Nvme { .. } => per_namespace,
                        _ => 0,
                    })
                    .fold(0u64, u64::saturating_add),
            );
        let nics = manifest
            .interfaces()
            .map(|interface| crate::virtio_net_config(interface.mtu).dma_bytes() as u64)
            .fold(0u64, u64::saturating_add);
        PoolPlan {
            rings: RING_BYTES.max(nics).saturating_add(disks),
            disks,
            arenas: per_interface.saturating_mul(manifest.interface_count() as u64),
            tables: memory.total().saturating_sub(memory.chunks),
            ram_volumes: manifest.ram_volume_bytes(),
        }
    }

    /// Bytes of the pool (the rings), rounded up to [`POOL_ALIGN`].
    pub fn bytes(&self) -> u64 {
        super::memory::align_up(self.rings, POOL_ALIGN).unwrap_or(u64::MAX)
    }

    /// Bytes the heap needs beyond the boot heap: the registered arenas,
    /// the engine's tables and the RAM volumes.
    pub fn heap_bytes(&self) -> u64 {
        self.arenas
            .saturating_add(self.tables)
            .saturating_add(self.ram_volumes)
    }

    /// Guest memory (MiB) that holds the plan plus `carved` bytes carved
    /// besides it (the engine stack) with `slack` MiB to spare for the
    /// image, firmware holes and the engine's tables: what
    /// `cargo xtask run-image` gives QEMU by default.
    pub fn guest_mib(&self, carved: u64, slack: u64) -> u64 {
        const MIB: u64 = 1 << 20;
        self.bytes()
            .saturating_add(self.heap_bytes())
            .saturating_add(BOOT_HEAP_BYTES)
            .saturating_add(carved)
            .div_ceil(MIB)
            + slack
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use manifest::binary::Manifest;

    /// `examples/two-ram-volumes.toml`'s guest (xtask pins it too).
    const GUEST_MIB_EXAMPLE: u64 = 6607;

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
        // One interface, default limits: 16 sessions × 4 paths = 64 live
        // paths plus 16 replacements, each a pool of 512 chunks of 132 KiB
        // (+ 64 bytes each) plus 64 KiB of control buffers.
        let per_pool = 512 * (132 * 1024 + 64) + (1 << 16);
        assert_eq!(plan.arenas, 80 * per_pool);
        // 65 connections per path of the 80 pools' paths and of 16
        // half-open paths: 6,240 QPs of send depth 128 and receive depth
        // 513 and their CQ budgets, twice as many CM slots plus 16,
        // 80 × 514 + 16 regions; 40,960 requests, two volumes that can
        // park each.
        let qps = (80 + 16) * 65;
        let per_qp = 4096 + 128 * 128 + 513 * 96;
        let cq = qps * (128 + 513) * 64;
        let tables = (2 * qps + 16) * 1024 + (80 * 514 + 16) * 48;
        let requests = 80 * 512 * (64 + 2 * 128);
        // The HCA's 8 reorder buffers of 128 KiB and their headers; no
        // admin endpoint in this manifest.
        let reorder = 8 * ((128 << 10) + 128 * 256);
        assert_eq!(plan.tables, qps * per_qp + cq + tables + reorder + requests);
        assert_eq!(plan.bytes(), 16 << 20);
        assert_eq!(plan.disks, 0);
        let mib = ((16u64 + 512 + 8 + 32) << 20) + plan.arenas + plan.tables;
        assert_eq!(plan.guest_mib(32 << 20, 64), mib.div_ceil(1 << 20) + 64);
        // xtask's `guest_mib` counts the same way and pins the same number.
        assert_eq!(plan.guest_mib(32 << 20, 64), GUEST_MIB_EXAMPLE);
    }

    #[test]
    fn test_jumbo_interfaces_grow_the_nic_share() {
        let toml = include_str!("../../../examples/two-ram-volumes.toml");
        let plan = |toml: &str| {
            let blob = manifest::compile(toml, "m.toml")
                .unwrap()
                .to_binary()
                .unwrap();
            PoolPlan::for_manifest(&Manifest::parse(&blob).unwrap())
        };
        // One interface at 9000 fits the fixed share (4.7 MiB of buffers).
        let one = toml.replacen("[[interfaces]]", "[[interfaces]]\nmtu = 9000", 1);
        assert_eq!(plan(&one).rings, RING_BYTES);
        // Four take more than it: each NIC's rings and 512 buffers of
        // 9,088 bytes (and its indirect tables) are counted.
        let mut four = one.clone();
        for n in 1..4 {
            four += &std::format!(
                "\n[[interfaces]]\nname = \"eth{n}\"\nmac = \"52:54:00:00:00:1{n}\"\n\
                 address = \"10.9.{n}.1/24\"\nmtu = 9000\n"
            );
        }
        let per_nic = crate::virtio_net_config(9000).dma_bytes() as u64;
        assert!(per_nic > 512 * 9088, "{per_nic}");
        assert_eq!(plan(&four).rings, 4 * per_nic);
        assert!(plan(&four).bytes() > RING_BYTES);
    }
}

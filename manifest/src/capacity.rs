//! What a manifest's limits make the target hold: [`Capacity::of`].
//!
//! Every count the engine sizes its tables by at boot comes from here, so
//! nothing the manifest admits meets a hidden ceiling: per interface (one
//! software HCA each, and a client's paths may all land on one), the chunk
//! pools, QPs, CQ entries and memory regions; over all interfaces, the
//! block requests the engine can hold. [`Capacity::memory`] says what
//! they take; `brick manifest check` prints it and refuses an image
//! manifest that cannot fit [`IMAGE_RAM_LIMIT`].
//!
//! # How the counts follow from the limits
//!
//! - **Paths (chunk pools).** `max_sessions × max_paths_per_session` live
//!   paths, plus room for replacements (a reconnected path's new pool
//!   while the old one drains): a quarter more, at least one session's
//!   paths ([`Capacity::path_pools`]). (The RTRS server's path table holds
//!   twice the live paths; pools for all of them would double the memory
//!   and, with the default limits, need more regions than an HCA has.) A pool is `queue_depth` chunks of
//!   `chunk_size` (+[`CHUNK_CONTROL_BYTES`]) plus
//!   [`POOL_CONTROL_BYTES`] of control buffers, in
//!   `queue_depth` + [`CONTROL_REGIONS`] memory regions.
//! - **QPs.** `max_connections_per_path` per pool.
//! - **Depths.** Receive: the [`SERVICE_RECEIVES`] the RTRS server posts on
//!   a path's first connection, or `queue_depth` if more, plus one. Send:
//!   three WRs per request of the queue depth plus four, at most
//!   [`MAX_SEND_DEPTH`] (a fuller queue makes the server wait, it does not
//!   fail).
//! - **CQ.** Every QP's send plus receive depth: it cannot overflow.
//! - **CM connections.** Twice the QPs plus [`SPARE_CM_CONNECTIONS`]: a
//!   connection stays in timewait after its QP is gone.
//! - **Reorder buffers and admin.** Each interface's HCA holds a pool of
//!   reorder buffers for selective retransmission
//!   ([`sizes::REORDER_POOL`]); an `[admin]` endpoint holds its snapshot
//!   buffer ([`admin_snapshot_bytes`]) and its sockets.
//!
//! Byte counts use the per-item sizes of [`sizes`], upper bounds of the
//! engine's types (target-image pins them).

use crate::binary::{Backing, Manifest, PoolBacking};
use crate::types::Limits;

/// Receives the RTRS server posts on a path's first connection (Linux
/// `SERVICE_CON_QUEUE_DEPTH`).
pub const SERVICE_RECEIVES: u32 = 512;
/// Most send WRs (queued plus unconsumed completions) per QP.
pub const MAX_SEND_DEPTH: u32 = 128;
/// Memory regions of a path besides its chunks (INFO_REQ and INFO_RSP
/// buffers; RKEY_RSP is sent inline).
pub const CONTROL_REGIONS: u64 = 2;
/// Regions per interface beyond the paths' (slack for control buffers).
pub const SPARE_REGIONS: u64 = 16;
/// Registered bytes per chunk beyond `chunk_size` (alignment slack).
pub const CHUNK_CONTROL_BYTES: u64 = 64;
/// Registered bytes per path beyond its chunks (control buffers).
pub const POOL_CONTROL_BYTES: u64 = 64 << 10;
/// CM connection slots beyond twice the QPs.
pub const SPARE_CM_CONNECTIONS: u64 = 16;
/// Most QPs one HCA holds (a CM connection id keeps its slot in 16 bits).
pub const MAX_QPS: u64 = 1 << 16;
/// Most memory regions one HCA holds (verbs' region table).
pub const MAX_REGIONS: u64 = 1 << 20;
/// RAM the bare-metal image can use: it serves from RAM below 4 GiB, and
/// QEMU's `pc` machine puts at most 3 GiB of it there (the rest of the
/// first 4 GiB is the PCI hole).
pub const IMAGE_RAM_LIMIT: u64 = 3 << 30;
/// What the image carves besides the heap (boot heap, NIC ring pool,
/// engine stack), counted against [`IMAGE_RAM_LIMIT`] (IMAGE.md §4).
pub const IMAGE_FIXED_BYTES: u64 = (8 + 16 + 32) << 20;

/// Upper bounds of the bytes each table entry takes in the engine
/// (target-image's tests check them against the real types).
pub mod sizes {
    /// One QP slot: the QP (twice: table and spare) and its CM link,
    /// without its queues.
    pub const QP: u64 = 4096;
    /// One send-queue entry.
    pub const SEND_WQE: u64 = 128;
    /// One receive-queue entry.
    pub const RECV_WQE: u64 = 96;
    /// One completion-queue entry.
    pub const CQ_ENTRY: u64 = 64;
    /// One CM connection slot.
    pub const CM_SLOT: u64 = 1024;
    /// One memory-region table slot.
    pub const REGION: u64 = 48;
    /// One block request the engine holds (its pending entry).
    pub const REQUEST: u64 = 64;
    /// One parked block request, per volume (each volume can park all).
    pub const PARKED: u64 = 128;
    /// A thin volume's map entry per virtual extent (and its claim list
    /// at the pool's open).
    pub const THIN_VIRTUAL_EXTENT: u64 = 16;
    /// A pool's tables per physical extent: owner entry, IO count, free
    /// list slot and its share of the map blocks' state.
    pub const THIN_PHYSICAL_EXTENT: u64 = 32;
    /// A pool's fixed buffers: the 1 MiB scratch buffer of its open, 16
    /// map-write blocks of 4 KiB, the superblock and volume table.
    pub const THIN_POOL: u64 = (1 << 20) + (80 << 10);
    /// A thin volume's request slots and completion queue.
    pub const THIN_VOLUME: u64 = 32 << 10;
    /// One HCA's reorder buffers for selective retransmission: 8 of 128
    /// KiB, each with its 128 packet headers (of at most 256 bytes).
    pub const REORDER_POOL: u64 = 8 * ((128 << 10) + 128 * 256);
    /// The admin endpoint besides its snapshot buffer: on the image, its
    /// TCP sockets' buffers, frame rings and request heads.
    pub const ADMIN_ENDPOINT: u64 = 512 << 10;
}

/// The admin endpoint's snapshot buffer: room for every metric with every
/// session (open and draining) and path, and for long extent lists.
pub fn admin_snapshot_bytes(limits: &Limits, volumes: usize) -> u64 {
    let sessions = u64::from(limits.max_sessions) * 2;
    let paths = u64::from(limits.max_paths_per_session).min(8);
    (1u64 << 20)
        .saturating_add((volumes as u64).saturating_mul(8 << 10))
        .saturating_add(sessions.saturating_mul((4 << 10) + paths * (2 << 10)))
}

/// What the admin endpoint of `manifest` takes (0 without `[admin]`): its
/// snapshot buffer and [`sizes::ADMIN_ENDPOINT`].
pub fn admin_bytes(manifest: &Manifest<'_>) -> u64 {
    if manifest.admin().is_none() {
        return 0;
    }
    admin_snapshot_bytes(&manifest.limits(), manifest.volume_count())
        .saturating_add(sizes::ADMIN_ENDPOINT)
}

/// The thin volumes' tables of `manifest`: each volume's map (per virtual
/// extent of 2 MiB) and request slots, each pool's fixed buffers and, for
/// a file pool of a given size, its per-extent tables. A pool whose size
/// is the device's (block, virtio-blk, NVMe) adds
/// [`sizes::THIN_PHYSICAL_EXTENT`] per 2 MiB of the device, which the
/// target counts when it opens the pool.
pub fn thin_bytes(manifest: &Manifest<'_>) -> u64 {
    const EXTENT: u64 = 2 << 20;
    let volumes = manifest
        .volumes()
        .filter_map(|volume| match volume.backing {
            Backing::Thin { size, .. } => Some(
                size.div_ceil(EXTENT)
                    .saturating_mul(sizes::THIN_VIRTUAL_EXTENT)
                    .saturating_add(sizes::THIN_VOLUME),
            ),
            _ => None,
        })
        .fold(0u64, u64::saturating_add);
    let pools = manifest
        .pools()
        .map(|pool| match pool.backing {
            PoolBacking::File {
                size: Some(size), ..
            } => (size / EXTENT)
                .saturating_mul(sizes::THIN_PHYSICAL_EXTENT)
                .saturating_add(sizes::THIN_POOL),
            _ => sizes::THIN_POOL,
        })
        .fold(0u64, u64::saturating_add);
    volumes.saturating_add(pools)
}

/// The counts a manifest's limits make the engine hold (see the module
/// docs). Per-interface counts are for one HCA.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Capacity {
    /// The limits they come from.
    pub limits: Limits,
    /// Interfaces (HCAs).
    pub interfaces: u64,
    /// Volumes.
    pub volumes: u64,
    /// Chunk pools (paths) per interface.
    pub path_pools: u64,
    /// QPs per interface.
    pub qps: u64,
    /// Send depth of every QP.
    pub send_depth: u32,
    /// Receive depth of every QP.
    pub recv_depth: u32,
    /// CQ entries per interface.
    pub cq_entries: u64,
    /// CM connection slots per interface.
    pub cm_connections: u64,
    /// Memory regions per interface.
    pub regions: u64,
    /// Registered bytes of one path's pool.
    pub pool_bytes: u64,
    /// Block requests the engine holds at once, all interfaces.
    pub requests: u64,
    /// Bytes of thin volume maps and pool tables ([`thin_bytes`]; 0 from
    /// [`Capacity::for_limits`]).
    pub thin_bytes: u64,
    /// Bytes of the admin endpoint ([`admin_bytes`]; 0 from
    /// [`Capacity::for_limits`]).
    pub admin_bytes: u64,
}

/// Bytes a [`Capacity`] needs, by kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Memory {
    /// Registered chunk memory (pools and their control buffers).
    pub chunks: u64,
    /// QPs and their send and receive queues.
    pub qps: u64,
    /// Completion queues.
    pub cq: u64,
    /// Memory-region tables and CM connection slots.
    pub tables: u64,
    /// Reorder buffers for selective retransmission
    /// ([`sizes::REORDER_POOL`] per interface).
    pub reorder: u64,
    /// The engine's request tables (pending and parked requests).
    pub requests: u64,
    /// Thin volumes' maps and pools' tables ([`thin_bytes`]).
    pub thin: u64,
    /// The admin endpoint ([`admin_bytes`]).
    pub admin: u64,
}

impl Memory {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.chunks
            .saturating_add(self.qps)
            .saturating_add(self.cq)
            .saturating_add(self.tables)
            .saturating_add(self.reorder)
            .saturating_add(self.requests)
            .saturating_add(self.thin)
            .saturating_add(self.admin)
    }
}

/// Why a manifest does not fit the image ([`Capacity::check_image`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ImageFitError {
    /// What the engine needs.
    pub memory: Memory,
    /// RAM volumes.
    pub ram_volumes: u64,
    /// What the image carves besides ([`IMAGE_FIXED_BYTES`] and the DMA
    /// pool is not counted: an upper bound is not needed to refuse).
    pub fixed: u64,
    /// [`IMAGE_RAM_LIMIT`].
    pub limit: u64,
    /// A count over what one HCA can hold, if that is the reason:
    /// (what, count, most).
    pub over: Option<(&'static str, u64, u64)>,
}

impl core::fmt::Display for ImageFitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if let Some((what, count, most)) = self.over {
            return write!(
                f,
                "the limits need {count} {what} per interface, an HCA holds at most {most}: \
                 lower [limits] max_sessions / max_paths_per_session / max_connections_per_path / queue_depth"
            );
        }
        let need = self
            .memory
            .total()
            .saturating_add(self.ram_volumes)
            .saturating_add(self.fixed);
        write!(
            f,
            "the image needs {} MiB (engine {} MiB: chunks {} MiB, QPs {} MiB, CQs {} MiB, \
             tables {} MiB, reorder buffers {} MiB, requests {} MiB, thin maps {} MiB, admin {} MiB; \
             RAM volumes {} MiB; boot heap, rings and stack {} MiB), \
             it can use at most {} MiB below 4 GiB: lower [limits] max_sessions / queue_depth / \
             chunk_size / max_connections_per_path or the RAM volumes",
            mib(need),
            mib(self.memory.total()),
            mib(self.memory.chunks),
            mib(self.memory.qps),
            mib(self.memory.cq),
            mib(self.memory.tables),
            mib(self.memory.reorder),
            mib(self.memory.requests),
            mib(self.memory.thin),
            mib(self.memory.admin),
            mib(self.ram_volumes),
            mib(self.fixed),
            mib(self.limit)
        )
    }
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

impl Capacity {
    /// The capacity `manifest` asks for.
    pub fn of(manifest: &Manifest<'_>) -> Capacity {
        Capacity {
            thin_bytes: thin_bytes(manifest),
            admin_bytes: admin_bytes(manifest),
            ..Self::for_limits(
                &manifest.limits(),
                manifest.interface_count(),
                manifest.volume_count(),
            )
        }
    }

    /// The capacity of `limits` over `interfaces` interfaces serving
    /// `volumes` volumes (a queue depth below 2 counts as 2, as the RTRS
    /// server runs it).
    pub fn for_limits(limits: &Limits, interfaces: usize, volumes: usize) -> Capacity {
        let queue_depth = u64::from(limits.queue_depth.max(2));
        let live_paths = u64::from(limits.max_sessions) * u64::from(limits.max_paths_per_session);
        let replacements = live_paths
            .div_ceil(4)
            .max(u64::from(limits.max_paths_per_session));
        let path_pools = live_paths + replacements;
        // A half-open path holds its connections (no pool) until INFO_REQ:
        // the RTRS server bounds them by `max_half_open`, so their QPs are
        // counted on top of the admitted paths'.
        let qps = (path_pools + u64::from(limits.max_half_open))
            * u64::from(limits.max_connections_per_path);
        let recv_depth = SERVICE_RECEIVES.max(u32::from(limits.queue_depth)) + 1;
        let send_depth = (3 * queue_depth as u32 + 4).min(MAX_SEND_DEPTH);
        let interfaces = interfaces as u64;
        Capacity {
            limits: *limits,
            interfaces,
            volumes: volumes as u64,
            path_pools,
            qps,
            send_depth,
            recv_depth,
            cq_entries: qps * u64::from(send_depth + recv_depth),
            cm_connections: (2 * qps + SPARE_CM_CONNECTIONS).min(MAX_QPS),
            regions: path_pools * (queue_depth + CONTROL_REGIONS) + SPARE_REGIONS,
            pool_bytes: queue_depth * (u64::from(limits.chunk_size) + CHUNK_CONTROL_BYTES)
                + POOL_CONTROL_BYTES,
            requests: path_pools * queue_depth * interfaces,
            thin_bytes: 0,
            admin_bytes: 0,
        }
    }

    /// Registered memory of one interface: every pool.
    pub fn arena_bytes(&self) -> u64 {
        self.path_pools.saturating_mul(self.pool_bytes)
    }

    /// What one interface's HCA tables take for `qps` QPs, `cm` CM slots
    /// and `regions` regions.
    fn hca_memory(&self, qps: u64, cm: u64, regions: u64) -> Memory {
        let per_qp = sizes::QP
            + u64::from(self.send_depth) * sizes::SEND_WQE
            + u64::from(self.recv_depth) * sizes::RECV_WQE;
        Memory {
            chunks: 0,
            qps: qps.saturating_mul(per_qp),
            cq: qps
                .saturating_mul(u64::from(self.send_depth + self.recv_depth))
                .saturating_mul(sizes::CQ_ENTRY),
            tables: cm
                .saturating_mul(sizes::CM_SLOT)
                .saturating_add(regions.saturating_mul(sizes::REGION)),
            reorder: 0,
            requests: 0,
            thin: 0,
            admin: 0,
        }
    }

    /// What the whole engine needs: every interface's arena and HCA
    /// tables, and the request tables.
    pub fn memory(&self) -> Memory {
        let hca = self.hca_memory(self.qps, self.cm_connections, self.regions);
        let n = self.interfaces;
        Memory {
            chunks: self.arena_bytes().saturating_mul(n),
            qps: hca.qps.saturating_mul(n),
            cq: hca.cq.saturating_mul(n),
            tables: hca.tables.saturating_mul(n),
            reorder: sizes::REORDER_POOL.saturating_mul(n),
            requests: self
                .requests
                .saturating_mul(sizes::REQUEST + self.volumes * sizes::PARKED),
            thin: self.thin_bytes,
            admin: self.admin_bytes,
        }
    }

    /// What one session at the limits takes on the interface its paths
    /// use: `max_paths_per_session` pools, their connections' QPs and CQ
    /// entries and their regions.
    pub fn session_memory(&self) -> Memory {
        let paths = u64::from(self.limits.max_paths_per_session);
        let qps = paths * u64::from(self.limits.max_connections_per_path);
        let regions = paths * (u64::from(self.limits.queue_depth.max(2)) + CONTROL_REGIONS);
        Memory {
            chunks: paths.saturating_mul(self.pool_bytes),
            ..self.hca_memory(qps, 2 * qps, regions)
        }
    }

    /// Checks that the bare-metal image can hold this capacity and
    /// `ram_volumes` bytes of RAM volumes: per-HCA counts within what an
    /// HCA holds, and the memory within [`IMAGE_RAM_LIMIT`].
    ///
    /// # Errors
    /// [`ImageFitError`], whose `Display` names the numbers.
    pub fn check_image(&self, ram_volumes: u64) -> Result<(), ImageFitError> {
        let error = |over| ImageFitError {
            memory: self.memory(),
            ram_volumes,
            fixed: IMAGE_FIXED_BYTES,
            limit: IMAGE_RAM_LIMIT,
            over,
        };
        self.check_hca().map_err(|over| error(Some(over)))?;
        let need = self
            .memory()
            .total()
            .saturating_add(ram_volumes)
            .saturating_add(IMAGE_FIXED_BYTES);
        if need > IMAGE_RAM_LIMIT {
            return Err(error(None));
        }
        Ok(())
    }

    /// Checks the per-HCA counts against what one HCA holds: the count
    /// over its bound as (what, count, most).
    ///
    /// # Errors
    /// The first count over its bound.
    pub fn check_hca(&self) -> Result<(), (&'static str, u64, u64)> {
        if self.qps > MAX_QPS {
            return Err(("queue pairs", self.qps, MAX_QPS));
        }
        if self.regions > MAX_REGIONS {
            return Err(("memory regions", self.regions, MAX_REGIONS));
        }
        Ok(())
    }
}

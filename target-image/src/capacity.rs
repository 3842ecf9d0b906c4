//! What the manifest's limits make the engine hold: the RTRS
//! configuration ([`server_config`]), each HCA's arena and tables
//! ([`arena_bytes`], [`hca_capacity`]), the virtio-blk transfer size and
//! the number of requests in flight. Everything is counted here, before
//! anything is allocated (ARCHITECTURE.md, "No allocation after
//! construction").

use manifest::binary::Manifest;
use rtrs::server::ServerConfig;

use crate::BuildError;

/// The RTRS configuration a manifest asks for.
pub fn server_config(manifest: &Manifest<'_>) -> ServerConfig {
    let limits = manifest.limits();
    let target = manifest.target();
    let mut config = ServerConfig::brick_default();
    config.port = target.port;
    config.always_invalidate = target.always_invalidate;
    config.queue_depth = limits.queue_depth.max(2);
    config.chunk_size = limits.chunk_size;
    config.max_sessions = u16::try_from(limits.max_sessions).unwrap_or(u16::MAX);
    config.max_paths_per_session = limits.max_paths_per_session;
    config.max_connections_per_path = limits.max_connections_per_path;
    config.setup_timeout_ns = u64::from(limits.setup_timeout_ms) * 1_000_000;
    config.max_half_open = u16::try_from(limits.max_half_open).unwrap_or(u16::MAX);
    config.max_half_open_per_source = limits.max_half_open_per_source.min(config.max_half_open);
    config
}

/// The counts `config`'s limits make one interface hold
/// ([`manifest::Capacity`]; `interfaces` interfaces, no volumes).
pub(crate) fn capacity(config: &ServerConfig, interfaces: usize) -> manifest::Capacity {
    let limits = manifest::Limits {
        max_sessions: u32::from(config.max_sessions),
        max_paths_per_session: config.max_paths_per_session,
        max_connections_per_path: config.max_connections_per_path,
        queue_depth: config.queue_depth,
        chunk_size: config.chunk_size,
        max_half_open: u32::from(config.max_half_open),
        max_half_open_per_source: config.max_half_open_per_source,
        setup_timeout_ms: u32::try_from(config.setup_timeout_ns / 1_000_000).unwrap_or(u32::MAX),
    };
    manifest::Capacity::for_limits(&limits, interfaces, 0)
}

/// Registered memory each HCA (port) gets: a chunk pool, with its control
/// buffers, for every path the limits admit plus replacements
/// ([`manifest::Capacity::arena_bytes`]).
pub fn arena_bytes(config: &ServerConfig) -> usize {
    usize::try_from(capacity(config, 1).arena_bytes()).unwrap_or(usize::MAX)
}

/// The tables of each HCA for `config`: a QP for every connection of every
/// chunk pool, the regions of every pool, depths and CQ as
/// [`manifest::Capacity`] counts them.
///
/// # Errors
/// [`BuildError::Capacity`] when a count is over what an HCA holds.
pub fn hca_capacity(config: &ServerConfig) -> Result<roce::HcaCapacity, BuildError> {
    let counts = capacity(config, 1);
    counts.check_hca().map_err(|(what, count, most)| {
        BuildError::Capacity(alloc::format!(
            "the limits need {count} {what} per interface, an HCA holds at most {most}"
        ))
    })?;
    // Both counts are within 2^16 (checked above).
    roce::HcaCapacity::new(
        counts.qps as usize,
        counts.regions as usize,
        counts.send_depth as usize,
        counts.recv_depth as usize,
    )
    .map_err(|e| BuildError::Capacity(alloc::format!("{e}")))
}

/// How the image drives a virtio-blk volume for `config`: transfers up to
/// one chunk (an RNBD IO never exceeds it), the driver's default depth,
/// with bounce slots for chunks without a DMA address.
pub fn virtio_blk_config(config: &ServerConfig) -> hal::virtio::blk::BlkConfig {
    hal::virtio::blk::BlkConfig {
        max_transfer: config.chunk_size.next_multiple_of(4096),
        ..hal::virtio::blk::BlkConfig::default()
    }
}

/// How the image drives the virtio-net NIC of an interface of IP MTU
/// `mtu`: the driver's default rings, RX buffers and bounce slots sized for
/// the MTU (jumbo frames take 9 KiB buffers: a path MTU of 4096).
pub fn virtio_net_config(mtu: u16) -> hal::virtio::net::NetConfig {
    hal::virtio::net::NetConfig {
        mtu,
        ..hal::virtio::net::NetConfig::default()
    }
}

/// Path chunk pools one HCA holds ([`manifest::Capacity::path_pools`]).
pub fn path_pools(config: &ServerConfig) -> u64 {
    capacity(config, 1).path_pools
}

/// Requests the engine can hold at once over `interfaces` interfaces: every
/// chunk of every pool.
pub fn max_requests(config: &ServerConfig, interfaces: usize) -> usize {
    usize::try_from(capacity(config, interfaces).requests).unwrap_or(usize::MAX)
}

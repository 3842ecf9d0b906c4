//! The Brick board: the target engine built from a boot manifest.
//!
//! [`Engine`] owns everything the target serves with (ARCHITECTURE.md §2, §3):
//! one software HCA ([`roce::hca::Hca`]) per manifest interface, one RTRS
//! server ([`rtrs::server::Server`]) over all of them (the engine lends it
//! the HCAs as its ports on every call, so a multipath client's paths over
//! several interfaces are one session, and the engine reads an IO's chunk
//! from its own HCA), one RNBD server ([`rnbd::server::Server`]) for all of
//! them, the volumes and the export table (the manifest's volumes,
//! `device_path` mapping and access list).
//! It is `no_std` + `alloc`, allocates only in [`Engine::new`], and is
//! sans-IO: frames come in through [`Engine::receive`], go out through the
//! [`Transmit`] sink of [`Engine::poll`], time is passed in.
//!
//! # The glue
//!
//! RTRS `Event::Io` -> the RNBD message is copied out of the chunk ->
//! [`rnbd::server::Server::process`] with the chunk's data area as the
//! response buffer (SESS_INFO_RSP / OPEN_RSP land at its start, as RTRS
//! expects for a READ answered from the chunk) -> `Respond` / `Refuse` are
//! answered at once with their errno; `Submit` is executed on the volume
//! (bytes copied between the registered chunk, through the checked
//! [`verbs::Memory`] accessors, and the volume), reported to
//! [`rnbd::server::Server::complete`], and answered with the completion's
//! errno (read data goes back from the chunk). A closed RTRS session ends the
//! RNBD session ([`rnbd::server::Server::end_session`]).
//!
//! # Run loop (STYLE.md §2)
//!
//! ```text
//! loop {
//!     for each interface: take up to a burst of frames -> engine.receive(i, now, frame)
//!     busy |= engine.poll(now, &mut sink)          // bounded
//!     if !busy { block until a frame or engine.poll_at(now) }  // never spin idle
//! }
//! ```
//!
//! # Volumes
//!
//! Every volume is a [`hal::block::BlockDevice`] over [`Chunk`] handles:
//! the engine submits a checked request naming the chunk that holds (or
//! receives) the data, parks it if the device queue is full, and answers
//! the RTRS request when the device's completion comes back from
//! [`Engine::poll`]. RAM volumes ([`RamVolume`]) complete within the same
//! poll; hosted files and block devices (`hosted::HostedVolume`) complete
//! from a worker pool. A session that closes with IO in flight stays in the
//! table until its last completion is reported to RNBD (its answers are
//! dropped by RTRS).
//!
//! # Limits of this version
//!
//! * ICMP echo requests to an interface address are answered (so a peer can
//!   `ping` the target up); one reply is held per interface.

#![no_std]
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

#[cfg(feature = "std")]
extern crate std;

pub mod boot;
#[cfg(feature = "std")]
pub mod hosted;

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};

use hal::block::ram::RamDisk;
use hal::block::{
    BlockDevice, BufferAccess, BufferError, Completion as DeviceCompletion, DeviceInfo, Op,
    Request as DeviceRequest, SubmitError,
};
use manifest::binary::{Backing, Manifest};
use manifest::AccessMode;
use rnbd::server::{
    Action, BlockOp, DiscardLimits, Export, Exports, Grant, IoError, IoTicket, LookupError,
    Request, VolumeId, VolumeInfo,
};
use rnbd::wire::RtrsDirection;
use roce::hca::{Hca, HcaConfig, LinkMode};
use roce::types::Mtu;
use rtrs::server::{
    Admission, Event, IoDirection, IoToken, PathId, PathRefusal, PathRequest, ReadData, Server,
    ServerConfig, SessionId,
};
use verbs::{KeySource, Memory, MemoryHandle};

/// Logs one line through the engine's logger (fields borrowed disjointly).
macro_rules! log {
    ($engine:expr, $($arg:tt)*) => {
        if let Some(logger) = $engine.logger.as_mut() {
            logger(format_args!($($arg)*));
        }
    };
}

/// Completions a RAM volume holds between two polls (a batch bound: when
/// it is full the engine parks further requests, which have room for every
/// request the manifest admits, [`max_requests`]).
pub const RAM_QUEUE: usize = 1024;
/// Largest RNBD message copied out of a chunk (an OPEN is under 200 bytes).
const MAX_USER_HEADER: usize = 1024;
/// Frames of ICMP echo replies held per interface.
const ICMP_REPLY_LEN: usize = 1514;
/// Deferred CLOSE answers one session may hold at once; the table holds
/// this many for every session entry, so no session can use up another's.
const MAX_DEFERRED_PER_SESSION: usize = 16;
/// Device completions handled per volume per poll.
const COMPLETION_BURST: usize = 64;
/// Largest discard advertised, in 512-byte sectors (8 MiB: a RAM volume
/// zeroes it within one poll).
const MAX_DISCARD_SECTORS: u32 = 16 * 1024;

/// The engine's HCA type: sized at boot from the manifest
/// ([`hca_capacity`]).
pub type EngineHca<K> = Hca<Vec<u8>, K>;

/// A chunk's data area as a volume sees it: the interface (RTRS port)
/// whose registered memory holds it and the memory handle. Volumes reach the bytes only
/// through the engine's [`BufferAccess`], which checks both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// Interface (HCA) index.
    pub port: usize,
    /// The chunk's data area.
    pub handle: MemoryHandle,
}

/// A RAM volume: zeroed at boot, completes within the poll that submits.
pub type RamVolume = RamDisk<Vec<u8>, Chunk, RAM_QUEUE>;

/// A volume that is RAM or a device `D` (files and block devices when
/// hosted, virtio-blk in the image): one type for all of an engine's
/// volumes, every call delegated.
pub enum RamOr<D> {
    /// Zeroed RAM (boxed: its completion queue is inline).
    Ram(Box<RamVolume>),
    /// The other kind.
    Device(D),
}

impl<D: BlockDevice<Chunk>> BlockDevice<Chunk> for RamOr<D> {
    fn info(&self) -> DeviceInfo {
        match self {
            Self::Ram(device) => device.info(),
            Self::Device(device) => device.info(),
        }
    }

    fn submit<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        request: DeviceRequest<Chunk>,
        buffers: &mut A,
    ) -> Result<(), SubmitError> {
        match self {
            Self::Ram(device) => device.submit(request, buffers),
            Self::Device(device) => device.submit(request, buffers),
        }
    }

    fn poll<A: BufferAccess<Chunk> + ?Sized>(
        &mut self,
        now: u64,
        buffers: &mut A,
        max: usize,
        on_completion: &mut impl FnMut(DeviceCompletion<Chunk>),
    ) -> usize {
        match self {
            Self::Ram(device) => device.poll(now, buffers, max, on_completion),
            Self::Device(device) => device.poll(now, buffers, max, on_completion),
        }
    }

    fn poll_at(&self) -> Option<u64> {
        match self {
            Self::Ram(device) => device.poll_at(),
            Self::Device(device) => device.poll_at(),
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            Self::Ram(device) => device.in_flight(),
            Self::Device(device) => device.in_flight(),
        }
    }

    fn readable_fd(&self) -> Option<i32> {
        match self {
            Self::Ram(device) => device.readable_fd(),
            Self::Device(device) => device.readable_fd(),
        }
    }
}

/// Where the engine sends packets: interface index plus the HCA's
/// scatter-gather packet (headers, payload pieces, trailer).
pub trait Transmit {
    /// Sends one Ethernet frame on interface `interface`.
    fn transmit(&mut self, interface: usize, headers: &[u8], payload: &[&[u8]], trailer: &[u8]);

    /// Sends one datagram to `to` on interface `interface`, a UDP
    /// interface ([`LinkMode::Udp`]). A sink for an engine without UDP
    /// interfaces never sees one; the default drops it.
    fn transmit_datagram(
        &mut self,
        interface: usize,
        to: SocketAddrV4,
        header: &[u8],
        payload: &[&[u8]],
        trailer: &[u8],
    ) {
        let _ = (interface, to, header, payload, trailer);
    }
}

impl<F: FnMut(usize, &[u8], &[&[u8]], &[u8])> Transmit for F {
    fn transmit(&mut self, interface: usize, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
        self(interface, headers, payload, trailer)
    }
}

/// Why the engine could not be built from a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The manifest names no interface.
    NoInterface,
    /// An interface the HCA cannot serve (name, why).
    Interface(String, &'static str),
    /// A volume could not be opened or is not served by this build
    /// (name, why).
    Volume(String, String),
    /// More volumes than RNBD's table holds.
    TooManyVolumes,
    /// A volume's geometry cannot be announced over RNBD (name, why).
    Geometry(String, &'static str),
    /// The manifest limits do not make a valid RTRS configuration.
    Config(rtrs::server::ConfigError),
    /// The manifest limits need more than one HCA can hold (why).
    Capacity(String),
    /// The RTRS server could not listen.
    Listen(rtrs::server::StartError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoInterface => f.write_str("the manifest has no interface"),
            Self::Interface(name, why) => write!(f, "interface {name}: {why}"),
            Self::Volume(name, why) => write!(f, "volume {name}: {why}"),
            Self::TooManyVolumes => f.write_str("more volumes than RNBD can index"),
            Self::Geometry(name, why) => write!(f, "volume {name}: {why}"),
            Self::Config(e) => write!(f, "RTRS configuration: {e}"),
            Self::Capacity(why) => write!(f, "capacity: {why}"),
            Self::Listen(e) => write!(f, "listen: {e}"),
        }
    }
}

impl core::error::Error for BuildError {}

/// Builds the RAM volume a manifest entry asks for; every other kind is
/// refused (the hosted runner and the image open theirs).
///
/// # Errors
/// [`BuildError::Volume`] for a kind that is not RAM or a size this machine
/// cannot hold.
pub fn ram_volume(volume: &manifest::binary::Volume<'_>) -> Result<RamVolume, BuildError> {
    let Backing::Ram { size } = volume.backing else {
        return Err(BuildError::Volume(
            volume.name.into(),
            alloc::format!(
                "kind {} is not served by this engine (RAM only)",
                volume.backing.kind().as_str()
            ),
        ));
    };
    let bytes = usize::try_from(size)
        .map_err(|_| BuildError::Volume(volume.name.into(), "does not fit in memory".into()))?;
    Ok(RamDisk::new(alloc::vec![0; bytes]))
}

/// What RNBD announces for a device: geometry from the device, write cache
/// and FUA as the device really has them, discard and write-zeroes if it
/// does them.
///
/// # Errors
/// [`BuildError::Geometry`] for block sizes RNBD cannot carry.
pub fn volume_info(
    id: VolumeId,
    name: &str,
    device: &DeviceInfo,
) -> Result<VolumeInfo, BuildError> {
    let geometry = |why| BuildError::Geometry(name.into(), why);
    let logical = u16::try_from(device.logical_block_size)
        .ok()
        .filter(|b| b.is_power_of_two() && (512..=4096).contains(b))
        .ok_or_else(|| geometry("logical block size is not a power of two in 512..=4096"))?;
    let physical = u16::try_from(device.physical_block_size.max(device.logical_block_size))
        .map_err(|_| geometry("physical block size over 32 KiB"))?;
    if device.size < u64::from(logical) {
        return Err(geometry("smaller than one block"));
    }
    let mut info = VolumeInfo::new(id, device.size / 512);
    info.logical_block_size = logical;
    info.physical_block_size = physical;
    info.write_cache = device.volatile_write_cache && !device.read_only;
    info.fua = info.write_cache && device.fua;
    if !device.read_only {
        info.discard = device.discard.map(|discard| DiscardLimits {
            max_sectors: MAX_DISCARD_SECTORS,
            granularity: discard.granularity.max(u32::from(logical)),
            alignment: 0,
        });
        info.secure_erase = device.write_zeroes && info.discard.is_some();
    }
    Ok(info)
}

/// One served interface (its HCA is the RTRS server's port of the same
/// index) and a pending ICMP echo reply.
struct Interface {
    name: String,
    ip: Ipv4Addr,
    icmp: Box<[u8; ICMP_REPLY_LEN]>,
    icmp_len: usize,
}

/// One RNBD session (one RTRS session, its paths on any interfaces).
struct SessionEntry {
    id: SessionId,
    name: String,
    /// The client address of the session's first path (statistics).
    source: Option<Ipv4Addr>,
    /// The paths up and each one's client address: a request is checked
    /// against the access rules with the address of the path it came on.
    paths: heapless::Vec<(PathId, Ipv4Addr), 8>,
    rnbd: rnbd::server::Session,
    /// RTRS closed the session; the entry stays until its IO drains.
    closed: bool,
    /// Device IOs submitted and not completed.
    in_flight: u32,
}

/// A deferred CLOSE: its session, its tag and the request to answer.
#[derive(Clone, Copy)]
struct Deferred {
    session: SessionId,
    tag: u32,
    token: IoToken,
}

/// A block request handed to a volume, waiting for its completion.
struct PendingIo {
    session: SessionId,
    token: IoToken,
    ticket: IoTicket,
}

/// Per-volume counters the engine keeps (RNBD keeps the per-op ones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeCounters {
    /// Requests that waited for room in the device queue.
    pub parked: u64,
    /// Requests the device refused or failed.
    pub device_errors: u64,
}

/// A served volume.
struct Served<D> {
    name: String,
    info: VolumeInfo,
    device: D,
    /// Requests waiting for room in the device queue (capacity: every
    /// request the engine can hold).
    parked: VecDeque<DeviceRequest<Chunk>>,
    counters: VolumeCounters,
}

/// The export table as one session sees it (rnbd::server::Exports).
struct SessionExports<'e, 'm, D> {
    manifest: &'e Manifest<'m>,
    volumes: &'e [Served<D>],
    session: &'e str,
    source: Ipv4Addr,
}

impl<D> Exports for SessionExports<'_, '_, D> {
    fn lookup(&self, device_path: &str) -> Result<Export, LookupError> {
        let (index, _) = self
            .manifest
            .volume_by_device_path(device_path)
            .ok_or(LookupError::NotFound)?;
        let served = self.volumes.get(index).ok_or(LookupError::NotFound)?;
        let grant = match self.manifest.access(self.session, self.source, index) {
            Some(AccessMode::ReadWrite) => Grant::ReadWrite,
            Some(AccessMode::ReadOnly) => Grant::ReadOnly,
            None => return Err(LookupError::Denied),
        };
        Ok(Export {
            volume: served.info,
            grant,
        })
    }
}

/// The manifest's access rules as the RTRS server's admission hook: a
/// path may carry a session only if some rule admits the session name from
/// the path's client address (IPv4; the HCA speaks nothing else).
struct AccessRules<'e, 'm> {
    manifest: &'e Manifest<'m>,
}

impl Admission for AccessRules<'_, '_> {
    fn admit(&mut self, path: &PathRequest<'_>) -> bool {
        match path.remote.ip() {
            IpAddr::V4(source) => self.manifest.admits(path.name, source),
            IpAddr::V6(_) => false,
        }
    }
}

/// The chunks of every port, as volumes reach them.
struct ChunkMemory<'a, K: KeySource> {
    /// The engine's HCAs (the RTRS server's ports).
    hcas: &'a mut [EngineHca<K>],
    /// Chunk addresses are bus addresses ([`Engine::set_identity_dma`]).
    identity_dma: bool,
}

impl<K: KeySource> BufferAccess<Chunk> for ChunkMemory<'_, K> {
    fn with_slice<R>(
        &self,
        buffer: Chunk,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BufferError> {
        if len > buffer.handle.len() {
            return Err(BufferError::TooShort);
        }
        self.hcas
            .get(buffer.port)
            .ok_or(BufferError::Stale)?
            .with_slice(buffer.handle, 0, len, f)
            .map_err(|_| BufferError::Stale)
    }

    fn with_slice_mut<R>(
        &mut self,
        buffer: Chunk,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, BufferError> {
        if len > buffer.handle.len() {
            return Err(BufferError::TooShort);
        }
        self.hcas
            .get_mut(buffer.port)
            .ok_or(BufferError::Stale)?
            .with_slice_mut(buffer.handle, 0, len, f)
            .map_err(|_| BufferError::Stale)
    }

    /// The chunk's address in its port's arena when the engine was told
    /// that addresses are bus addresses; the arena is allocated once and
    /// never moves, so the address stays valid while the IO is in flight.
    fn dma_address(&self, buffer: Chunk, len: u32) -> Option<u64> {
        if !self.identity_dma || len > buffer.handle.len() {
            return None;
        }
        self.hcas
            .get(buffer.port)?
            .with_slice(buffer.handle, 0, len, |bytes| bytes.as_ptr() as u64)
            .ok()
    }
}

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
fn capacity(config: &ServerConfig, interfaces: usize) -> manifest::Capacity {
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

/// Path chunk pools one HCA holds ([`manifest::Capacity::path_pools`]).
pub fn path_pools(config: &ServerConfig) -> u64 {
    capacity(config, 1).path_pools
}

/// Requests the engine can hold at once over `interfaces` interfaces: every
/// chunk of every pool.
pub fn max_requests(config: &ServerConfig, interfaces: usize) -> usize {
    usize::try_from(capacity(config, interfaces).requests).unwrap_or(usize::MAX)
}

/// Where log lines go: one call per line.
type Logger<'m> = Box<dyn FnMut(fmt::Arguments<'_>) + 'm>;

/// The target engine. See the crate docs.
pub struct Engine<'m, K: KeySource, D: BlockDevice<Chunk> = RamVolume> {
    manifest: Manifest<'m>,
    interfaces: Vec<Interface>,
    /// One HCA per interface, lent to the RTRS server as its ports (HCA
    /// `i` is port `i`).
    hcas: Vec<EngineHca<K>>,
    server: Box<Server<EngineHca<K>>>,
    rnbd: rnbd::server::Server,
    sessions: Vec<SessionEntry>,
    session_capacity: usize,
    volumes: Vec<Served<D>>,
    deferred: Vec<Deferred>,
    /// Requests handed to volumes, by device tag.
    pending: Vec<Option<PendingIo>>,
    /// Free indices of `pending`.
    free_pending: Vec<u32>,
    next_tag: u32,
    logger: Option<Logger<'m>>,
    /// IO requests answered (all sessions).
    answered: u64,
    /// Devices may transfer straight to and from the arenas.
    identity_dma: bool,
}

impl<'m, K: KeySource> Engine<'m, K, RamVolume> {
    /// Builds an engine serving RAM volumes only (see
    /// [`with_volumes`](Engine::with_volumes)).
    ///
    /// # Errors
    /// [`BuildError`] for what the manifest asks and this engine cannot do
    /// (a volume kind other than RAM among them).
    pub fn new(manifest: Manifest<'m>, keys: impl FnMut(usize) -> K) -> Result<Self, BuildError> {
        Self::with_volumes(manifest, keys, |_, volume| ram_volume(volume))
    }
}

impl<'m, K: KeySource, D: BlockDevice<Chunk>> Engine<'m, K, D> {
    /// Builds the engine with every interface on Ethernet: see
    /// [`with_links`](Self::with_links).
    ///
    /// # Errors
    /// As [`with_links`](Self::with_links).
    pub fn with_volumes(
        manifest: Manifest<'m>,
        keys: impl FnMut(usize) -> K,
        open: impl FnMut(&ServerConfig, &manifest::binary::Volume<'_>) -> Result<D, BuildError>,
    ) -> Result<Self, BuildError> {
        Self::with_links(manifest, keys, &[], open)
    }

    /// Builds the engine from a checked manifest. `links[i]` says how
    /// interface `i` reaches its peers (missing entries: Ethernet): on
    /// [`LinkMode::Udp`] the HCA speaks RoCEv2 payloads over a host UDP
    /// socket bound to the interface's manifest address
    /// ([`receive_datagram`](Self::receive_datagram),
    /// [`Transmit::transmit_datagram`]). `open(config, volume)`
    /// opens each volume's device (`config` is the RTRS configuration the
    /// manifest makes: queue depth and chunk size bound what devices see),
    /// one HCA per interface (path MTU from the interface MTU), the RTRS
    /// server over all of them (listening), the RNBD server.
    /// `keys(i)` gives interface `i`'s random source (R_Keys, QPNs, PSNs, CM
    /// ids). All memory is allocated here.
    ///
    /// # Errors
    /// [`BuildError`] for what the manifest asks and this engine cannot do,
    /// and whatever `open` returns.
    pub fn with_links(
        manifest: Manifest<'m>,
        mut keys: impl FnMut(usize) -> K,
        links: &[LinkMode],
        mut open: impl FnMut(&ServerConfig, &manifest::binary::Volume<'_>) -> Result<D, BuildError>,
    ) -> Result<Self, BuildError> {
        if manifest.interface_count() == 0 {
            return Err(BuildError::NoInterface);
        }
        let config = server_config(&manifest);
        config.check().map_err(BuildError::Config)?;
        let requests = max_requests(&config, manifest.interface_count());
        let mut volumes = Vec::with_capacity(manifest.volume_count());
        for (index, volume) in manifest.volumes().enumerate() {
            let id = VolumeId::try_new(index).ok_or(BuildError::TooManyVolumes)?;
            let device = open(&config, &volume)?;
            let info = volume_info(id, volume.name, &device.info())?;
            volumes.push(Served {
                name: volume.name.into(),
                info,
                device,
                parked: VecDeque::with_capacity(requests),
                counters: VolumeCounters::default(),
            });
        }
        let arena = arena_bytes(&config);
        let hca_capacity = hca_capacity(&config)?;
        let mut interfaces = Vec::with_capacity(manifest.interface_count());
        let mut hcas = Vec::with_capacity(manifest.interface_count());
        for (index, iface) in manifest.interfaces().enumerate() {
            let ip = iface.address.address;
            let mut hca = Hca::with_capacity(
                alloc::vec![0u8; arena],
                keys(index),
                HcaConfig {
                    mac: iface.mac.0,
                    ip: ip.octets(),
                },
                links.get(index).copied().unwrap_or(LinkMode::Ethernet),
                hca_capacity,
            )
            .map_err(|e| BuildError::Capacity(alloc::format!("{e}")))?;
            let mtu = Mtu::for_ethernet_mtu(usize::from(iface.mtu)).ok_or_else(|| {
                BuildError::Interface(iface.name.into(), "MTU below 256 bytes of RoCE payload")
            })?;
            hca.set_path_mtu(mtu);
            hcas.push(hca);
            interfaces.push(Interface {
                name: iface.name.into(),
                ip,
                icmp: Box::new([0; ICMP_REPLY_LEN]),
                icmp_len: 0,
            });
        }
        let mut server = Box::new(Server::new(config).map_err(BuildError::Config)?);
        server.start(&mut hcas).map_err(BuildError::Listen)?;
        // Closed sessions linger while their IO drains: room for as many.
        let session_capacity = usize::from(config.max_sessions) * 2;
        let mut pending = Vec::with_capacity(requests);
        pending.resize_with(requests, || None);
        let free_pending = (0..u32::try_from(requests).unwrap_or(u32::MAX))
            .rev()
            .collect();
        Ok(Self {
            manifest,
            interfaces,
            hcas,
            server,
            rnbd: rnbd::server::Server::new(),
            sessions: Vec::with_capacity(session_capacity),
            session_capacity,
            volumes,
            deferred: Vec::with_capacity(session_capacity * MAX_DEFERRED_PER_SESSION),
            pending,
            free_pending,
            next_tag: 0,
            logger: None,
            answered: 0,
            identity_dma: false,
        })
    }

    /// Lets volumes transfer straight to and from the registered arenas
    /// ([`BufferAccess::dma_address`]: a chunk's address is its bus
    /// address), so virtio-blk needs no bounce copy. Off by default and
    /// hosted (devices copy).
    ///
    /// # Safety
    ///
    /// Every address of the engine's heap memory is the bus address of
    /// the same byte for every volume's device, and the memory is
    /// contiguous RAM: identity-mapped physical memory with no IOMMU (the
    /// image's heap).
    #[allow(unsafe_code)] // A promise about DMA addressing, see # Safety.
    pub unsafe fn set_identity_dma(&mut self) {
        self.identity_dma = true;
    }

    /// Sets where the engine's log lines go (one call per line, no newline).
    pub fn set_logger(&mut self, logger: impl FnMut(fmt::Arguments<'_>) + 'm) {
        self.logger = Some(Box::new(logger));
    }

    /// The manifest the engine was built from.
    pub fn manifest(&self) -> &Manifest<'m> {
        &self.manifest
    }

    /// Number of interfaces (the `interface` argument ranges over them).
    pub fn interface_count(&self) -> usize {
        self.interfaces.len()
    }

    /// The RTRS server, if `interface` exists: one server serves every
    /// interface (its port `interface`).
    pub fn rtrs(&self, interface: usize) -> Option<&Server<EngineHca<K>>> {
        (interface < self.interfaces.len()).then_some(&*self.server)
    }

    /// The RTRS server (all interfaces are its ports).
    pub fn server(&self) -> &Server<EngineHca<K>> {
        &self.server
    }

    /// Interface `interface`'s HCA (the RTRS server's port of the same
    /// index), if it exists.
    pub fn hca(&self, interface: usize) -> Option<&EngineHca<K>> {
        self.hcas.get(interface)
    }

    /// Open RNBD sessions (closed ones still draining IO not counted).
    pub fn session_count(&self) -> usize {
        self.sessions.iter().filter(|s| !s.closed).count()
    }

    /// IO requests answered so far.
    pub fn answered(&self) -> u64 {
        self.answered
    }

    /// Block requests handed to volumes and not completed yet (parked ones
    /// included).
    pub fn volume_requests_in_flight(&self) -> usize {
        self.pending.len() - self.free_pending.len()
    }

    /// Volume `index`'s device (tests, statistics).
    pub fn volume(&self, index: usize) -> Option<&D> {
        self.volumes.get(index).map(|v| &v.device)
    }

    /// Volume `index`'s engine counters.
    pub fn volume_counters(&self, index: usize) -> Option<VolumeCounters> {
        self.volumes.get(index).map(|v| v.counters)
    }

    /// Descriptors a hosted loop waits on besides its links: volumes that
    /// complete from other threads.
    pub fn volume_fds(&self) -> impl Iterator<Item = i32> + '_ {
        self.volumes.iter().filter_map(|v| v.device.readable_fd())
    }

    /// Hands one received Ethernet frame of interface `interface` to its
    /// HCA (ICMP echo requests to our address are answered by the engine).
    pub fn receive(&mut self, interface: usize, now: u64, frame: &[u8]) {
        let Some(iface) = self.interfaces.get_mut(interface) else {
            return;
        };
        if iface.icmp_len == 0 {
            if let Some(len) = icmp_echo_reply(frame, iface.ip.octets(), &mut iface.icmp[..]) {
                iface.icmp_len = len;
                return;
            }
        } else if is_icmp(frame) {
            return; // one reply at a time; the peer pings again
        }
        if let Some(hca) = self.hcas.get_mut(interface) {
            hca.receive(now, frame);
        }
    }

    /// Hands one datagram received from `from` on UDP interface
    /// `interface` to its HCA.
    pub fn receive_datagram(
        &mut self,
        interface: usize,
        now: u64,
        from: SocketAddr,
        datagram: &[u8],
    ) {
        if let Some(hca) = self.hcas.get_mut(interface) {
            hca.receive_datagram(now, from, datagram);
        }
    }

    /// Advances everything once: RTRS servers (bounded by their CM and
    /// completion budgets), every event they queued (bounded by the event
    /// queue capacity), volume completions (bounded per volume), then the
    /// HCAs' transmit side (bounded by [`roce::hca::MAX_TX_BURST`] frames
    /// each). Returns whether anything happened; if not, sleep until
    /// [`poll_at`](Self::poll_at), a frame or a volume descriptor.
    pub fn poll<T: Transmit + ?Sized>(&mut self, now: u64, sink: &mut T) -> bool {
        let mut busy = self.server.poll(
            now,
            &mut self.hcas,
            &mut AccessRules {
                manifest: &self.manifest,
            },
        );
        while let Some(event) = self.server.next_event() {
            busy = true;
            self.handle_event(event, now);
        }
        busy |= self.poll_volumes(now);
        for (index, (iface, hca)) in self.interfaces.iter_mut().zip(&mut self.hcas).enumerate() {
            if iface.icmp_len > 0 {
                sink.transmit(index, &iface.icmp[..iface.icmp_len], &[], &[]);
                iface.icmp_len = 0;
                busy = true;
            }
            if matches!(hca.link_mode(), LinkMode::Udp { .. }) {
                busy |= hca.poll_datagrams(
                    now,
                    &mut |to: SocketAddrV4, header: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                        sink.transmit_datagram(index, to, header, payload, trailer)
                    },
                );
                continue;
            }
            busy |= hca.poll(
                now,
                &mut |headers: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                    sink.transmit(index, headers, payload, trailer)
                },
            );
        }
        busy
    }

    /// When [`poll`](Self::poll) next has timed work (`now` or earlier:
    /// poll again at once); `None` if only a frame or a volume descriptor
    /// can cause work.
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        let volumes = self.volumes.iter().filter_map(|v| {
            if v.parked.is_empty() {
                v.device.poll_at()
            } else {
                Some(now)
            }
        });
        let icmp = self
            .interfaces
            .iter()
            .filter(|iface| iface.icmp_len > 0)
            .map(|_| now);
        let hcas = self.hcas.iter().filter_map(|hca| hca.poll_at(now));
        hcas.chain(self.server.poll_at())
            .chain(icmp)
            .chain(volumes)
            .min()
    }

    /// Starts closing every path (shutdown); keep polling until
    /// [`is_quiet`](Self::is_quiet) to let the disconnects out.
    pub fn close_all(&mut self, now: u64) {
        self.server.close_all(now, &mut self.hcas);
    }

    /// True when no RTRS path or session is left on any interface and no
    /// volume request is in flight.
    pub fn is_quiet(&self) -> bool {
        let usage = self.server.usage();
        self.volume_requests_in_flight() == 0 && usage.paths == 0 && usage.sessions == 0
    }

    /// True when nothing is held: no session (open or draining), no path,
    /// connection, request or registered buffer on any interface, no
    /// volume request. What a leak check expects between clients.
    pub fn is_idle(&self) -> bool {
        self.sessions.is_empty()
            && self.volume_requests_in_flight() == 0
            && self.deferred.is_empty()
            && self.server.usage() == rtrs::server::Usage::default()
    }

    /// A printable statistics report (per interface, session, path and
    /// volume).
    pub fn stats(&self) -> StatsReport<'_, 'm, K, D> {
        StatsReport { engine: self }
    }

    fn session_index(&self, id: SessionId) -> Option<usize> {
        self.sessions.iter().position(|s| s.id == id)
    }

    /// The name of interface `port`, for logs.
    fn interface_name(&self, port: usize) -> &str {
        self.interfaces.get(port).map_or("?", |i| i.name.as_str())
    }

    fn handle_event(&mut self, event: Event, now: u64) {
        match event {
            Event::SessionOpened { session, name } => {
                if self.sessions.len() >= self.session_capacity {
                    log!(
                        self,
                        "refuse: session {name:?}: session table full; closing it"
                    );
                    // Its paths will come up; close them as they do.
                    return;
                }
                let name: String = name.as_str().into();
                log!(self, "session {name:?} opened");
                self.sessions.push(SessionEntry {
                    id: session,
                    name,
                    source: None,
                    paths: heapless::Vec::new(),
                    rnbd: rnbd::server::Session::new(),
                    closed: false,
                    in_flight: 0,
                });
            }
            Event::PathUp {
                session,
                path,
                remote,
                port,
            } => {
                // The server asked the access rules before the path came up
                // (`AccessRules`); an address that is not IPv4 was refused.
                let (Some(index), Some(IpAddr::V4(source))) =
                    (self.session_index(session), remote.map(|r| r.ip()))
                else {
                    self.server.close_path(path, now, &mut self.hcas);
                    return;
                };
                let entry = &mut self.sessions[index];
                if entry.paths.push((path, source)).is_err() {
                    self.server.close_path(path, now, &mut self.hcas);
                    return;
                }
                entry.source.get_or_insert(source);
                let interface = self.interfaces.get(port).map_or("?", |i| i.name.as_str());
                log!(
                    self,
                    "path up: session {:?} from {source} on {interface} ({} paths)",
                    self.sessions[index].name,
                    self.sessions[index].paths.len()
                );
            }
            Event::PathRefused {
                name,
                remote,
                port,
                reason,
            } => {
                let shown = remote.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |r| r.ip());
                let interface = self.interfaces.get(port).map_or("?", |i| i.name.as_str());
                log!(
                    self,
                    "refuse: session {name:?} from {shown} on {interface}: {}",
                    match reason {
                        PathRefusal::NotAdmitted => "no access rule admits it",
                        PathRefusal::NameInUse => "the name is another session's",
                        PathRefusal::NameMismatch => "the name differs from its session's",
                        PathRefusal::NoSession => "no such session",
                        PathRefusal::TooManySessions => "session table full",
                        PathRefusal::TooManyPaths => "the session has its paths",
                        PathRefusal::OutOfMemory => "no memory for its chunks",
                        _ => "refused",
                    }
                );
            }
            Event::PathDown {
                session,
                path,
                reason,
            } => {
                if let Some(index) = self.session_index(session) {
                    self.sessions[index].paths.retain(|(p, _)| *p != path);
                    let name = self.sessions[index].name.clone();
                    log!(self, "path down: session {name:?}: {reason:?}");
                }
            }
            Event::SessionClosed { session } => {
                if let Some(index) = self.session_index(session) {
                    let entry = &mut self.sessions[index];
                    let draining = self.rnbd.end_session(&mut entry.rnbd);
                    entry.closed = true;
                    let stats = *entry.rnbd.stats();
                    log!(
                        self,
                        "session {:?} closed ({} opens, {} IOs{})",
                        self.sessions[index].name,
                        stats.opens,
                        stats.io.reads + stats.io.writes,
                        if draining > 0 { ", draining" } else { "" }
                    );
                    self.reap(index);
                }
            }
            Event::Io {
                session,
                token,
                direction,
                header,
                data,
                port,
                ..
            } => self.serve_io(port, session, token, direction, header, data, now),
            _ => {}
        }
    }

    /// Drops a closed session once nothing of it is in flight.
    fn reap(&mut self, index: usize) {
        let entry = &self.sessions[index];
        if entry.closed && entry.in_flight == 0 && entry.rnbd.is_idle() {
            self.sessions.swap_remove(index);
        }
    }

    fn answer(&mut self, token: IoToken, errno: u16, now: u64) {
        self.answered += 1;
        if let Err(error) =
            self.server
                .complete_io(token, errno, ReadData::Chunk, now, &mut self.hcas)
        {
            log!(self, "complete_io({token:?}): {error:?}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn serve_io(
        &mut self,
        port: usize,
        session: SessionId,
        token: IoToken,
        direction: IoDirection,
        header: MemoryHandle,
        data: MemoryHandle,
        now: u64,
    ) {
        let Some(index) = self
            .session_index(session)
            .filter(|&i| !self.sessions[i].closed)
        else {
            self.answer(token, rtrs::server::errno::ENXIO, now);
            return;
        };
        let mut user = [0u8; MAX_USER_HEADER];
        let header_len = (header.len() as usize).min(MAX_USER_HEADER);
        let copied = self
            .hcas
            .get(port)
            .map(|hca| hca.read(header, 0, &mut user[..header_len]));
        if !matches!(copied, Some(Ok(()))) || header.len() as usize > MAX_USER_HEADER {
            log!(self, "refuse: unreadable or oversized RNBD header");
            self.answer(token, rtrs::server::errno::EINVAL, now);
            return;
        }
        let (rtrs_direction, data_len) = match direction {
            IoDirection::Write => (RtrsDirection::Write, data.len() as usize),
            IoDirection::Read { read_len } => (RtrsDirection::Read, read_len as usize),
        };
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        let request = Request {
            user_header: &user[..header_len],
            data_len,
            direction: rtrs_direction,
            tag,
        };
        let Self {
            manifest,
            hcas,
            rnbd,
            sessions,
            volumes,
            ..
        } = self;
        let entry = &mut sessions[index];
        let opens_before = entry.rnbd.stats().opens;
        let exports = SessionExports {
            manifest,
            volumes,
            session: &entry.name,
            // The address of the path this request came on (every path was
            // admitted with its own); unknown paths match no rule.
            source: entry
                .paths
                .iter()
                .find(|(path, _)| *path == token.path)
                .map_or(Ipv4Addr::UNSPECIFIED, |(_, source)| *source),
        };
        let action = hcas.get_mut(port).map(|hca| {
            hca.with_slice_mut(data, 0, data.len(), |response| {
                rnbd.process(&mut entry.rnbd, &exports, &request, response)
            })
        });
        let Some(Ok(action)) = action else {
            log!(self, "refuse: chunk data area not accessible");
            self.answer(token, rtrs::server::errno::EIO, now);
            return;
        };
        match action {
            Action::Respond { .. } => {
                let entry = &self.sessions[index];
                if entry.rnbd.stats().opens > opens_before {
                    log!(
                        self,
                        "serve: session {:?} opened a device ({} in use)",
                        entry.name,
                        entry.rnbd.devices_in_use()
                    );
                }
                self.answer(token, 0, now);
            }
            Action::Refuse(error) => {
                let errno = rnbd::server::status_for(&error);
                // Disjoint fields: no copy of the name on the IO path.
                log!(
                    self,
                    "refuse: session {:?}: {error} (errno {errno})",
                    self.sessions[index].name
                );
                self.answer(token, errno, now);
            }
            Action::Submit { request, ticket } => {
                let Some(slot) = self.free_pending.pop() else {
                    // Cannot happen: one slot per chunk the engine can hold.
                    let entry = &mut self.sessions[index];
                    let completion =
                        self.rnbd
                            .complete(&mut entry.rnbd, ticket, Err(IoError::Resource));
                    self.answer(token, completion.status, now);
                    return;
                };
                let chunk = Chunk { port, handle: data };
                let op = match request.op {
                    BlockOp::Read { offset, len } => Op::Read {
                        offset,
                        len,
                        buffer: chunk,
                    },
                    BlockOp::Write { offset, len, fua } => Op::Write {
                        offset,
                        len,
                        buffer: chunk,
                        fua,
                    },
                    BlockOp::Flush => Op::Flush,
                    BlockOp::Discard { offset, len } => Op::Discard { offset, len },
                    BlockOp::WriteZeroes { offset, len } => Op::WriteZeroes { offset, len },
                };
                self.pending[slot as usize] = Some(PendingIo {
                    session,
                    token,
                    ticket,
                });
                self.sessions[index].in_flight += 1;
                self.submit(
                    request.volume.index(),
                    DeviceRequest {
                        tag: u64::from(slot),
                        op,
                    },
                    now,
                );
            }
            Action::CloseDeferred => {
                let held = self
                    .deferred
                    .iter()
                    .filter(|d| d.session == session)
                    .count();
                if held < MAX_DEFERRED_PER_SESSION && self.deferred.len() < self.deferred.capacity()
                {
                    self.deferred.push(Deferred {
                        session,
                        tag,
                        token,
                    });
                } else {
                    // This session holds its share: answer now (the device
                    // is gone for the client either way).
                    self.answer(token, 0, now);
                }
            }
        }
    }

    /// Hands `request` to volume `volume`, or parks it behind earlier
    /// parked requests if the device queue is full. A refusal completes it
    /// at once with the matching error.
    fn submit(&mut self, volume: usize, request: DeviceRequest<Chunk>, now: u64) {
        let Some(served) = self.volumes.get_mut(volume) else {
            self.finish(request.tag, Err(IoError::Media), now);
            return;
        };
        if !served.parked.is_empty() {
            served.counters.parked += 1;
            // Capacity: every request the engine can hold.
            if served.parked.len() < served.parked.capacity() {
                served.parked.push_back(request);
            } else {
                self.finish(request.tag, Err(IoError::Resource), now);
            }
            return;
        }
        let mut memory = ChunkMemory {
            hcas: &mut self.hcas,
            identity_dma: self.identity_dma,
        };
        match served.device.submit(request, &mut memory) {
            Ok(()) => {}
            Err(SubmitError::QueueFull) => {
                served.counters.parked += 1;
                if served.parked.len() < served.parked.capacity() {
                    served.parked.push_back(request);
                } else {
                    self.finish(request.tag, Err(IoError::Resource), now);
                }
            }
            Err(error) => {
                served.counters.device_errors += 1;
                log!(self, "volume {}: refused a request: {error}", served.name);
                self.finish(request.tag, Err(submit_error(error)), now);
            }
        }
    }

    /// Collects volume completions (bounded per volume) and answers them,
    /// then moves parked requests into the room that freed.
    fn poll_volumes(&mut self, now: u64) -> bool {
        let mut busy = false;
        for volume in 0..self.volumes.len() {
            let mut done: heapless::Vec<DeviceCompletion<Chunk>, COMPLETION_BURST> =
                heapless::Vec::new();
            let served = &mut self.volumes[volume];
            let mut memory = ChunkMemory {
                hcas: &mut self.hcas,
                identity_dma: self.identity_dma,
            };
            served
                .device
                .poll(now, &mut memory, COMPLETION_BURST, &mut |completion| {
                    // Cannot overflow: at most COMPLETION_BURST are delivered.
                    let _ = done.push(completion);
                });
            for completion in &done {
                busy = true;
                let result = completion.result.map_err(|error| {
                    self.volumes[volume].counters.device_errors += 1;
                    device_error(error)
                });
                self.finish(completion.tag, result, now);
            }
            while let Some(request) = self.volumes[volume].parked.pop_front() {
                let served = &mut self.volumes[volume];
                let mut memory = ChunkMemory {
                    hcas: &mut self.hcas,
                    identity_dma: self.identity_dma,
                };
                match served.device.submit(request, &mut memory) {
                    Ok(()) => busy = true,
                    Err(SubmitError::QueueFull) => {
                        served.parked.push_front(request);
                        break;
                    }
                    Err(error) => {
                        busy = true;
                        served.counters.device_errors += 1;
                        self.finish(request.tag, Err(submit_error(error)), now);
                    }
                }
            }
        }
        busy
    }

    /// Reports a volume request's outcome to RNBD and answers it.
    fn finish(&mut self, tag: u64, result: Result<(), IoError>, now: u64) {
        let Some(pending) = usize::try_from(tag)
            .ok()
            .and_then(|slot| self.pending.get_mut(slot))
            .and_then(Option::take)
        else {
            log!(self, "volume completion for unknown request {tag}");
            return;
        };
        // `tag` came from `free_pending`, so it fits.
        self.free_pending.push(tag as u32);
        let Some(index) = self.session_index(pending.session) else {
            // The session entry outlives its requests (see `reap`).
            return;
        };
        let entry = &mut self.sessions[index];
        entry.in_flight = entry.in_flight.saturating_sub(1);
        let completion = self.rnbd.complete(&mut entry.rnbd, pending.ticket, result);
        self.answer(pending.token, completion.status, now);
        if let Some(close_tag) = completion.close_done {
            if let Some(at) = self
                .deferred
                .iter()
                .position(|d| d.session == pending.session && d.tag == close_tag)
            {
                let deferred = self.deferred.swap_remove(at);
                self.answer(deferred.token, 0, now);
            }
        }
        self.reap(index);
    }
}

/// The RNBD error for a device refusal (RNBD's own checks make most of
/// these impossible).
fn submit_error(error: SubmitError) -> IoError {
    match error {
        SubmitError::QueueFull => IoError::Again,
        SubmitError::Unsupported => IoError::Unsupported,
        _ => IoError::Media,
    }
}

/// The RNBD error for a failed device request, by errno.
fn device_error(error: hal::block::IoError) -> IoError {
    match error.errno() {
        28 => IoError::NoSpace,
        110 => IoError::TimedOut,
        95 => IoError::Unsupported,
        12 => IoError::Resource,
        11 => IoError::Again,
        _ => IoError::Media,
    }
}

/// The engine's statistics, printable (`Display`, several lines).
pub struct StatsReport<'e, 'm, K: KeySource, D: BlockDevice<Chunk>> {
    engine: &'e Engine<'m, K, D>,
}

impl<K: KeySource, D: BlockDevice<Chunk>> fmt::Display for StatsReport<'_, '_, K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let engine = self.engine;
        let server = &engine.server;
        let s = server.stats();
        let u = server.usage();
        writeln!(
            f,
            "brick statistics: {} IO answers; rtrs accepted {} rejected {} paths_closed {} sessions {} paths {} connections {}",
            engine.answered, s.accepted, s.rejected, s.paths_closed, u.sessions, u.paths, u.connections
        )?;
        for (port, iface) in engine.interfaces.iter().enumerate() {
            if let Some(hca) = engine.hcas.get(port) {
                let c = hca.counters();
                writeln!(
                    f,
                    "interface {} {}: frames in {} out {} retransmissions {} timeouts {} (early {}) naks sent {} dropped malformed {} checksum {} out-of-sequence {}",
                    iface.name,
                    iface.ip,
                    c.frames_in,
                    c.frames_out,
                    c.retransmissions,
                    c.timeouts,
                    c.early_timeouts,
                    c.naks_sent,
                    c.drop_malformed,
                    c.drop_bad_checksum,
                    c.drop_out_of_sequence
                )?;
            }
        }
        for entry in &engine.sessions {
            let io = entry.rnbd.stats().io;
            write!(
                f,
                "session {:?} from {}{}: opens {} closes {} reads {} ({} B) writes {} ({} B) flushes {}",
                entry.name,
                entry.source.unwrap_or(Ipv4Addr::UNSPECIFIED),
                if entry.closed { " (closed, draining)" } else { "" },
                entry.rnbd.stats().opens,
                entry.rnbd.stats().closes,
                io.reads,
                io.read_bytes,
                io.writes,
                io.write_bytes,
                io.flushes,
            )?;
            if let Some(rt) = server.session_stats(entry.id) {
                write!(f, " rtrs_errors {} reconnects {}", rt.errors, rt.reconnects)?;
            }
            writeln!(f)?;
            for (path, _) in &entry.paths {
                if let Some(p) = server.path_stats(*path) {
                    let on = server
                        .path_port(*path)
                        .map_or("?", |port| engine.interface_name(port));
                    writeln!(
                        f,
                        "  path {} on {on}: reads {} ({} B) writes {} ({} B) errors {} heartbeats {}/{}",
                        path.index,
                        p.reads,
                        p.read_bytes,
                        p.writes,
                        p.write_bytes,
                        p.errors,
                        p.heartbeats_sent,
                        p.heartbeats_acked
                    )?;
                }
            }
        }
        for served in &engine.volumes {
            let v = engine.rnbd.volume_stats(served.info.id);
            let device = served.device.info();
            writeln!(
                f,
                "volume {} ({} B{}): opens {} writers {} reads {} ({} B) writes {} ({} B) flushes {} in_flight {} parked {} (total {}) device_errors {}",
                served.name,
                device.size,
                if device.volatile_write_cache { ", write-back" } else { "" },
                v.opens,
                engine.rnbd.writers(served.info.id),
                v.io.reads,
                v.io.read_bytes,
                v.io.writes,
                v.io.write_bytes,
                v.io.flushes,
                served.device.in_flight(),
                served.parked.len(),
                served.counters.parked,
                served.counters.device_errors,
            )?;
        }
        Ok(())
    }
}

fn is_icmp(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&[0x08, 0x00]) && frame.get(23) == Some(&1)
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], chunk.get(1).copied().unwrap_or(0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Writes into `out` the echo reply to `frame` if it is an ICMP echo
/// request to `ip` (no IP options, not fragmented, valid lengths) and
/// returns its length; `None` for anything else.
pub fn icmp_echo_reply(frame: &[u8], ip: [u8; 4], out: &mut [u8]) -> Option<usize> {
    let ip_header = frame.get(14..34)?;
    if frame.get(12..14)? != [0x08, 0x00] || ip_header[0] != 0x45 || ip_header[9] != 1 {
        return None;
    }
    if ip_header[16..20] != ip || ip_header[6] & 0x3f != 0 || ip_header[7] != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip_header[2], ip_header[3]]));
    let icmp = frame.get(34..14 + total)?;
    if total < 28 || icmp[0] != 8 || icmp[1] != 0 {
        return None;
    }
    let len = 14 + total;
    let reply = out.get_mut(..len)?;
    reply.copy_from_slice(&frame[..len]);
    reply.copy_within(6..12, 0);
    reply[6..12].copy_from_slice(&frame[0..6]);
    reply[20..22].fill(0);
    reply[22] = 64;
    reply[26..30].copy_from_slice(&ip);
    reply[30..34].copy_from_slice(&ip_header[12..16]);
    reply[24..26].fill(0);
    let ip_sum = checksum(&reply[14..34]);
    reply[24..26].copy_from_slice(&ip_sum.to_be_bytes());
    reply[34] = 0;
    reply[36..38].fill(0);
    let icmp_sum = checksum(&reply[34..]);
    reply[36..38].copy_from_slice(&icmp_sum.to_be_bytes());
    Some(len)
}

//! The Brick board: the target engine built from a boot manifest.
//!
//! [`Engine`] owns everything the target serves with (DESIGN.md §2, §3):
//! one software HCA ([`roce::hca::Hca`]) per manifest interface, an RTRS
//! server ([`rtrs::server::Server`]) over each HCA, one RNBD server
//! ([`rnbd::server::Server`]) for all of them, the volumes and the export
//! table (the manifest's volumes, `device_path` mapping and access list).
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
//! # Limits of this version
//!
//! * Volumes are RAM only, behind the small synchronous [`volume::Volume`]
//!   trait; `hal::block` will take its place (files, block devices,
//!   virtio-blk, asynchronous completion).
//! * Each interface has its own RTRS server, so a multipath client's paths
//!   over two interfaces are two sessions to the engine.
//! * ICMP echo requests to an interface address are answered (so a peer can
//!   `ping` the target up); one reply is held per interface.

#![no_std]
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod volume;

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::{IpAddr, Ipv4Addr};

use manifest::binary::{Backing, Manifest};
use manifest::AccessMode;
use rnbd::server::{
    Action, BlockOp, BlockRequest, Export, Exports, Grant, IoError, LookupError, Request, VolumeId,
    VolumeInfo,
};
use rnbd::wire::RtrsDirection;
use roce::hca::{Hca, HcaConfig};
use rtrs::server::{
    Event, IoDirection, IoToken, PathId, ReadData, Server, ServerConfig, SessionId,
};
use verbs::{KeySource, Memory, MemoryHandle};

use crate::volume::{RamVolume, Volume};

/// Logs one line through the engine's logger (fields borrowed disjointly).
macro_rules! log {
    ($engine:expr, $($arg:tt)*) => {
        if let Some(logger) = $engine.logger.as_mut() {
            logger(format_args!($($arg)*));
        }
    };
}

/// Memory regions per HCA: every chunk is registered on its own.
pub const HCA_REGIONS: usize = 4096;
/// Queue pairs per HCA (connections of all paths, including draining ones).
pub const HCA_QPS: usize = 64;
/// Completion queue entries per HCA.
pub const HCA_CQ: usize = 4096;
/// Registered-memory pools (one per path, replacements included) each HCA
/// can hold at most.
pub const MAX_PATH_POOLS: u64 = 8;
/// Largest RNBD message copied out of a chunk (an OPEN is under 200 bytes).
const MAX_USER_HEADER: usize = 1024;
/// Frames of ICMP echo replies held per interface.
const ICMP_REPLY_LEN: usize = 1514;
/// Deferred CLOSE answers held at once.
const MAX_DEFERRED: usize = 64;

/// The engine's HCA type.
pub type EngineHca<K> = Hca<Vec<u8>, K, HCA_REGIONS, HCA_QPS, HCA_CQ>;

/// Where the engine sends frames: interface index plus the HCA's
/// scatter-gather frame (headers, payload pieces, trailer).
pub trait Transmit {
    /// Sends one frame on interface `interface`.
    fn transmit(&mut self, interface: usize, headers: &[u8], payload: &[&[u8]], trailer: &[u8]);
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
    /// A volume kind this engine does not serve yet (name, kind).
    UnsupportedVolume(String, &'static str),
    /// More volumes than RNBD's table holds.
    TooManyVolumes,
    /// A volume does not fit this machine's address space.
    VolumeTooLarge(String),
    /// The manifest limits do not make a valid RTRS configuration.
    Config(rtrs::server::ConfigError),
    /// The RTRS server could not listen.
    Listen(verbs::ConnectError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoInterface => f.write_str("the manifest has no interface"),
            Self::UnsupportedVolume(name, kind) => {
                write!(f, "volume {name}: kind {kind} is not served yet (RAM only)")
            }
            Self::TooManyVolumes => f.write_str("more volumes than RNBD can index"),
            Self::VolumeTooLarge(name) => write!(f, "volume {name} does not fit in memory"),
            Self::Config(e) => write!(f, "RTRS configuration: {e}"),
            Self::Listen(e) => write!(f, "listen: {e:?}"),
        }
    }
}

impl core::error::Error for BuildError {}

/// One served interface: its HCA (inside the RTRS server) and a pending
/// ICMP echo reply.
struct Interface<K: KeySource> {
    name: String,
    ip: Ipv4Addr,
    server: Box<Server<EngineHca<K>>>,
    icmp: Box<[u8; ICMP_REPLY_LEN]>,
    icmp_len: usize,
}

/// One RNBD session (one RTRS session on one interface).
struct SessionEntry {
    interface: usize,
    id: SessionId,
    name: String,
    source: Option<Ipv4Addr>,
    paths: heapless::Vec<PathId, 8>,
    rnbd: rnbd::server::Session,
}

/// A deferred CLOSE: its tag and the request to answer.
#[derive(Clone, Copy)]
struct Deferred {
    tag: u32,
    interface: usize,
    token: IoToken,
}

/// A served volume.
struct Served {
    name: String,
    info: VolumeInfo,
    store: RamVolume,
}

/// The export table as one session sees it (rnbd::server::Exports).
struct SessionExports<'e, 'm> {
    manifest: &'e Manifest<'m>,
    volumes: &'e [Served],
    session: &'e str,
    source: Ipv4Addr,
}

impl Exports for SessionExports<'_, '_> {
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
    config
}

/// Registered memory each HCA gets: room for up to [`MAX_PATH_POOLS`] path
/// chunk pools (bounded by what the limits can use) plus control buffers.
pub fn arena_bytes(config: &ServerConfig) -> usize {
    let per_path = u64::from(config.queue_depth) * (u64::from(config.chunk_size) + 64) + (1 << 16);
    let pools = (u64::from(config.max_sessions) * u64::from(config.max_paths_per_session) * 2)
        .clamp(2, MAX_PATH_POOLS);
    usize::try_from(per_path * pools).unwrap_or(usize::MAX)
}

/// Where log lines go: one call per line.
type Logger<'m> = Box<dyn FnMut(fmt::Arguments<'_>) + 'm>;

/// The target engine. See the crate docs.
pub struct Engine<'m, K: KeySource> {
    manifest: Manifest<'m>,
    interfaces: Vec<Interface<K>>,
    rnbd: rnbd::server::Server,
    sessions: Vec<SessionEntry>,
    session_capacity: usize,
    volumes: Vec<Served>,
    deferred: Vec<Deferred>,
    next_tag: u32,
    logger: Option<Logger<'m>>,
    /// IO requests answered (all sessions).
    answered: u64,
}

impl<'m, K: KeySource> Engine<'m, K> {
    /// Builds the engine from a checked manifest: volumes, one HCA and RTRS
    /// server per interface (listening), the RNBD server. `keys(i)` gives
    /// interface `i`'s random source (R_Keys, QPNs, PSNs, CM ids). All
    /// memory is allocated here.
    ///
    /// # Errors
    /// [`BuildError`] for what the manifest asks and this engine cannot do.
    pub fn new(
        manifest: Manifest<'m>,
        mut keys: impl FnMut(usize) -> K,
    ) -> Result<Self, BuildError> {
        if manifest.interface_count() == 0 {
            return Err(BuildError::NoInterface);
        }
        let mut volumes = Vec::with_capacity(manifest.volume_count());
        for (index, volume) in manifest.volumes().enumerate() {
            let id = VolumeId::try_new(index).ok_or(BuildError::TooManyVolumes)?;
            let Backing::Ram { size } = volume.backing else {
                return Err(BuildError::UnsupportedVolume(
                    volume.name.into(),
                    volume.backing.kind().as_str(),
                ));
            };
            let bytes = usize::try_from(size)
                .map_err(|_| BuildError::VolumeTooLarge(volume.name.into()))?;
            volumes.push(Served {
                name: volume.name.into(),
                info: VolumeInfo::new(id, size / 512),
                store: RamVolume::new(bytes),
            });
        }
        let config = server_config(&manifest);
        config.check().map_err(BuildError::Config)?;
        let arena = arena_bytes(&config);
        let mut interfaces = Vec::with_capacity(manifest.interface_count());
        for (index, iface) in manifest.interfaces().enumerate() {
            let ip = iface.address.address;
            let hca = Hca::new(
                alloc::vec![0u8; arena],
                keys(index),
                HcaConfig {
                    mac: iface.mac.0,
                    ip: ip.octets(),
                },
            );
            let mut server = Box::new(Server::new(hca, config).map_err(BuildError::Config)?);
            server.start().map_err(BuildError::Listen)?;
            interfaces.push(Interface {
                name: iface.name.into(),
                ip,
                server,
                icmp: Box::new([0; ICMP_REPLY_LEN]),
                icmp_len: 0,
            });
        }
        let session_capacity = usize::from(config.max_sessions) * interfaces.len();
        let mut sessions = Vec::with_capacity(session_capacity);
        sessions.clear();
        Ok(Self {
            manifest,
            interfaces,
            rnbd: rnbd::server::Server::new(),
            sessions,
            session_capacity,
            volumes,
            deferred: Vec::with_capacity(MAX_DEFERRED),
            next_tag: 0,
            logger: None,
            answered: 0,
        })
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

    /// The RTRS server of interface `interface` (statistics, tests).
    pub fn rtrs(&self, interface: usize) -> Option<&Server<EngineHca<K>>> {
        self.interfaces.get(interface).map(|i| &*i.server)
    }

    /// Open RNBD sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// IO requests answered so far.
    pub fn answered(&self) -> u64 {
        self.answered
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
        iface.server.verbs_mut().receive(now, frame);
    }

    /// Advances everything once: RTRS servers (bounded by their CM and
    /// completion budgets), every event they queued (bounded by the event
    /// queue capacity; RAM IO completes inline), then the HCAs' transmit
    /// side (bounded by [`roce::hca::MAX_TX_BURST`] frames each). Returns
    /// whether anything happened; if not, sleep until
    /// [`poll_at`](Self::poll_at) or a frame.
    pub fn poll<T: Transmit + ?Sized>(&mut self, now: u64, sink: &mut T) -> bool {
        let mut busy = false;
        for index in 0..self.interfaces.len() {
            busy |= self.interfaces[index].server.poll(now);
            while let Some(event) = self.interfaces[index].server.next_event() {
                busy = true;
                self.handle_event(index, event, now);
            }
            let iface = &mut self.interfaces[index];
            if iface.icmp_len > 0 {
                sink.transmit(index, &iface.icmp[..iface.icmp_len], &[], &[]);
                iface.icmp_len = 0;
                busy = true;
            }
            busy |= iface.server.verbs_mut().poll(
                now,
                &mut |headers: &[u8], payload: &[&[u8]], trailer: &[u8]| {
                    sink.transmit(index, headers, payload, trailer)
                },
            );
        }
        busy
    }

    /// When [`poll`](Self::poll) next has timed work (`now` or earlier:
    /// poll again at once); `None` if only a frame can cause work.
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        self.interfaces
            .iter()
            .flat_map(|iface| {
                let pending = if iface.icmp_len > 0 { Some(now) } else { None };
                [
                    iface.server.verbs().poll_at(now),
                    iface.server.poll_at(),
                    pending,
                ]
            })
            .flatten()
            .min()
    }

    /// Starts closing every path (shutdown); keep polling until
    /// [`is_quiet`](Self::is_quiet) to let the disconnects out.
    pub fn close_all(&mut self, now: u64) {
        for iface in &mut self.interfaces {
            iface.server.close_all(now);
        }
    }

    /// True when no RTRS path or session is left on any interface.
    pub fn is_quiet(&self) -> bool {
        self.interfaces.iter().all(|iface| {
            let usage = iface.server.usage();
            usage.paths == 0 && usage.sessions == 0
        })
    }

    /// A printable statistics report (per interface, session, path and
    /// volume).
    pub fn stats(&self) -> StatsReport<'_, 'm, K> {
        StatsReport { engine: self }
    }

    fn session_index(&self, interface: usize, id: SessionId) -> Option<usize> {
        self.sessions
            .iter()
            .position(|s| s.interface == interface && s.id == id)
    }

    fn handle_event(&mut self, interface: usize, event: Event, now: u64) {
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
                log!(
                    self,
                    "session {name:?} opened on {}",
                    self.interfaces[interface].name
                );
                self.sessions.push(SessionEntry {
                    interface,
                    id: session,
                    name,
                    source: None,
                    paths: heapless::Vec::new(),
                    rnbd: rnbd::server::Session::new(),
                });
            }
            Event::PathUp {
                session,
                path,
                remote,
            } => {
                let Some(index) = self.session_index(interface, session) else {
                    self.interfaces[interface].server.close_path(path, now);
                    return;
                };
                let source = match remote.map(|r| r.ip()) {
                    Some(IpAddr::V4(ip)) => Some(ip),
                    _ => None,
                };
                let entry = &mut self.sessions[index];
                if entry.source.is_none() {
                    entry.source = source;
                }
                if entry.paths.push(path).is_err() {
                    self.interfaces[interface].server.close_path(path, now);
                    return;
                }
                let name = self.sessions[index].name.clone();
                let admitted = source.is_some_and(|ip| self.manifest.admits(&name, ip));
                let shown = source.unwrap_or(Ipv4Addr::UNSPECIFIED);
                log!(
                    self,
                    "path up: session {name:?} from {shown} on {}",
                    self.interfaces[interface].name
                );
                if !admitted {
                    log!(self,
                        "refuse: session {name:?} from {shown}: no access rule admits it; its OPENs get EACCES"
                    );
                }
            }
            Event::PathDown {
                session,
                path,
                reason,
            } => {
                if let Some(index) = self.session_index(interface, session) {
                    self.sessions[index].paths.retain(|p| *p != path);
                    let name = self.sessions[index].name.clone();
                    log!(self, "path down: session {name:?}: {reason:?}");
                }
            }
            Event::SessionClosed { session } => {
                if let Some(index) = self.session_index(interface, session) {
                    let mut entry = self.sessions.swap_remove(index);
                    let draining = self.rnbd.end_session(&mut entry.rnbd);
                    log!(
                        self,
                        "session {:?} closed ({} opens, {} IOs{})",
                        entry.name,
                        entry.rnbd.stats().opens,
                        entry.rnbd.stats().io.reads + entry.rnbd.stats().io.writes,
                        if draining > 0 { ", draining" } else { "" }
                    );
                }
            }
            Event::Io {
                session,
                token,
                direction,
                header,
                data,
                ..
            } => self.serve_io(interface, session, token, direction, header, data, now),
            _ => {}
        }
    }

    fn answer(&mut self, interface: usize, token: IoToken, errno: u16, now: u64) {
        self.answered += 1;
        if let Err(error) =
            self.interfaces[interface]
                .server
                .complete_io(token, errno, ReadData::Chunk, now)
        {
            log!(self, "complete_io({token:?}): {error:?}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn serve_io(
        &mut self,
        interface: usize,
        session: SessionId,
        token: IoToken,
        direction: IoDirection,
        header: MemoryHandle,
        data: MemoryHandle,
        now: u64,
    ) {
        let Some(index) = self.session_index(interface, session) else {
            self.answer(interface, token, rtrs::server::errno::ENXIO, now);
            return;
        };
        let mut user = [0u8; MAX_USER_HEADER];
        let header_len = (header.len() as usize).min(MAX_USER_HEADER);
        let copied =
            self.interfaces[interface]
                .server
                .verbs()
                .read(header, 0, &mut user[..header_len]);
        if copied.is_err() || header.len() as usize > MAX_USER_HEADER {
            log!(self, "refuse: unreadable or oversized RNBD header");
            self.answer(interface, token, rtrs::server::errno::EINVAL, now);
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
            interfaces,
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
            source: entry.source.unwrap_or(Ipv4Addr::UNSPECIFIED),
        };
        let action = interfaces[interface].server.verbs_mut().with_slice_mut(
            data,
            0,
            data.len(),
            |response| rnbd.process(&mut entry.rnbd, &exports, &request, response),
        );
        let action = match action {
            Ok(action) => action,
            Err(_) => {
                log!(self, "refuse: chunk data area not accessible");
                self.answer(interface, token, rtrs::server::errno::EIO, now);
                return;
            }
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
                self.answer(interface, token, 0, now);
            }
            Action::Refuse(error) => {
                let errno = rnbd::server::status_for(&error);
                let name = self.sessions[index].name.clone();
                log!(self, "refuse: session {name:?}: {error} (errno {errno})");
                self.answer(interface, token, errno, now);
            }
            Action::Submit { request, ticket } => {
                let result = self.execute(interface, request, data);
                let entry = &mut self.sessions[index];
                let completion = self.rnbd.complete(&mut entry.rnbd, ticket, result);
                self.answer(interface, token, completion.status, now);
                if let Some(close_tag) = completion.close_done {
                    if let Some(at) = self.deferred.iter().position(|d| d.tag == close_tag) {
                        let deferred = self.deferred.swap_remove(at);
                        self.answer(deferred.interface, deferred.token, 0, now);
                    }
                }
            }
            Action::CloseDeferred => {
                if self.deferred.len() < MAX_DEFERRED {
                    self.deferred.push(Deferred {
                        tag,
                        interface,
                        token,
                    });
                } else {
                    // No room to hold it: answer now (the device is gone
                    // for the client either way).
                    self.answer(interface, token, 0, now);
                }
            }
        }
    }

    /// Executes a checked block request between the chunk `data` and the
    /// volume (the one place that touches volumes).
    fn execute(
        &mut self,
        interface: usize,
        request: BlockRequest,
        data: MemoryHandle,
    ) -> Result<(), IoError> {
        let volume = &mut self
            .volumes
            .get_mut(request.volume.index())
            .ok_or(IoError::Media)?
            .store;
        let memory = self.interfaces[interface].server.verbs_mut();
        match request.op {
            BlockOp::Read { offset, len } => memory
                .with_slice_mut(data, 0, len, |chunk| volume.read(offset, chunk))
                .map_err(|_| IoError::Media)?,
            BlockOp::Write { offset, len, .. } => memory
                .with_slice(data, 0, len, |chunk| volume.write(offset, chunk))
                .map_err(|_| IoError::Media)?,
            BlockOp::Flush => volume.flush(),
            BlockOp::Discard { offset, len } | BlockOp::WriteZeroes { offset, len } => {
                volume.write_zeroes(offset, len)
            }
        }
    }
}

/// The engine's statistics, printable (`Display`, several lines).
pub struct StatsReport<'e, 'm, K: KeySource> {
    engine: &'e Engine<'m, K>,
}

impl<K: KeySource> fmt::Display for StatsReport<'_, '_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let engine = self.engine;
        writeln!(f, "brick statistics: {} IO answers", engine.answered)?;
        for iface in &engine.interfaces {
            let s = iface.server.stats();
            let u = iface.server.usage();
            writeln!(
                f,
                "interface {} {}: accepted {} rejected {} paths_closed {} sessions {} paths {} connections {}",
                iface.name, iface.ip, s.accepted, s.rejected, s.paths_closed, u.sessions, u.paths, u.connections
            )?;
        }
        for entry in &engine.sessions {
            let server = &engine.interfaces[entry.interface].server;
            let io = entry.rnbd.stats().io;
            write!(
                f,
                "session {:?} from {}: opens {} closes {} reads {} ({} B) writes {} ({} B) flushes {}",
                entry.name,
                entry.source.unwrap_or(Ipv4Addr::UNSPECIFIED),
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
            for path in &entry.paths {
                if let Some(p) = server.path_stats(*path) {
                    writeln!(
                        f,
                        "  path {}: reads {} ({} B) writes {} ({} B) errors {} heartbeats {}/{}",
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
            writeln!(
                f,
                "volume {} ({} B): opens {} writers {} reads {} ({} B) writes {} ({} B)",
                served.name,
                served.store.len(),
                v.opens,
                engine.rnbd.writers(served.info.id),
                v.io.reads,
                v.io.read_bytes,
                v.io.writes,
                v.io.write_bytes
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

//! The [`Engine`]: its construction from a manifest (one HCA per
//! interface, the RTRS server lent those HCAs, the RNBD server, the
//! volumes), its accessors and its poll loop. The glue it runs is in
//! `sessions` (RTRS events, access) and `io` (serving requests).

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use hal::block::BlockDevice;
use manifest::binary::Manifest;
use rnbd::server::VolumeId;
use roce::hca::{Hca, HcaConfig, LinkMode};
use roce::types::Mtu;
use rtrs::server::{Event, Server, ServerConfig};
use verbs::KeySource;

use crate::icmp::{icmp_echo_reply, is_icmp, ICMP_REPLY_LEN};
use crate::io_state::{IoSlots, ParkedQueue};
use crate::port::Port;
use crate::sessions::{AccessRules, Deferred, SessionEntry, MAX_DEFERRED_PER_SESSION};
use crate::volumes::Served;
use crate::{
    arena_bytes, hca_capacity, max_requests, ram_volume, server_config, volume_info, BuildError,
    Chunk, RamVolume, StatsReport, VolumeCounters,
};

/// The engine's software HCA: sized at boot from the manifest
/// ([`hca_capacity`]).
pub type EngineHca<K> = Hca<Vec<u8>, K>;

/// The engine on software HCAs, one per interface (the image, and the
/// hosted target on frame and UDP links).
pub type HcaEngine<'m, K, D = RamVolume> = Engine<'m, EngineHca<K>, D>;

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

/// One served interface (its HCA is the RTRS server's port of the same
/// index) and a pending ICMP echo reply.
pub(crate) struct Interface {
    pub(crate) name: String,
    pub(crate) ip: Ipv4Addr,
    pub(crate) icmp: Box<[u8; ICMP_REPLY_LEN]>,
    pub(crate) icmp_len: usize,
}

/// Where log lines go: one call per line.
pub(crate) type Logger<'m> = Box<dyn FnMut(fmt::Arguments<'_>) + 'm>;

/// The target engine over ports `P` (one per interface, [`Port`]). See
/// the crate docs.
pub struct Engine<'m, P: Port, D: BlockDevice<Chunk> = RamVolume> {
    pub(crate) manifest: Manifest<'m>,
    pub(crate) interfaces: Vec<Interface>,
    /// One HCA per interface, lent to the RTRS server as its ports (HCA
    /// `i` is port `i`).
    pub(crate) hcas: Vec<P>,
    pub(crate) server: Box<Server<P>>,
    pub(crate) rnbd: rnbd::server::Server,
    pub(crate) sessions: Vec<SessionEntry>,
    pub(crate) session_capacity: usize,
    pub(crate) volumes: Vec<Served<D>>,
    pub(crate) deferred: Vec<Deferred>,
    /// Every block request held, by device tag: its state machine.
    pub(crate) ios: IoSlots,
    pub(crate) next_tag: u32,
    pub(crate) logger: Option<Logger<'m>>,
    /// IO requests answered (all sessions).
    pub(crate) answered: u64,
    /// Devices may transfer straight to and from the arenas.
    pub(crate) identity_dma: bool,
    /// RNBD requests refused, by reason.
    pub(crate) refusals: crate::metrics::Refusals,
}

impl<'m, K: KeySource> Engine<'m, EngineHca<K>, RamVolume> {
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

impl<'m, K: KeySource, D: BlockDevice<Chunk>> Engine<'m, EngineHca<K>, D> {
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
        open: impl FnMut(&ServerConfig, &manifest::binary::Volume<'_>) -> Result<D, BuildError>,
    ) -> Result<Self, BuildError> {
        let config = server_config(&manifest);
        config.check().map_err(BuildError::Config)?;
        let arena = arena_bytes(&config);
        let hca_capacity = hca_capacity(&config)?;
        let mut hcas = Vec::with_capacity(manifest.interface_count());
        for (index, iface) in manifest.interfaces().enumerate() {
            let mut hca = Hca::with_capacity(
                alloc::vec![0u8; arena],
                keys(index),
                HcaConfig {
                    mac: iface.mac.0,
                    ip: iface.address.address.octets(),
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
        }
        Engine::with_ports(manifest, hcas, open)
    }

    /// Hands one received Ethernet frame of interface `interface` to its
    /// HCA (ICMP echo requests to our address are answered by the engine).
    pub fn receive(&mut self, interface: usize, now: u64, frame: &[u8]) {
        let Some(iface) = self.interfaces.get_mut(interface) else {
            return;
        };
        // Only ICMP needs the engine's look (RoCE frames go straight on).
        if is_icmp(frame) {
            if iface.icmp_len > 0 {
                return; // one reply at a time; the peer pings again
            }
            if let Some(len) = icmp_echo_reply(frame, iface.ip.octets(), &mut iface.icmp[..]) {
                iface.icmp_len = len;
                return;
            }
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
}

impl<'m, P: Port, D: BlockDevice<Chunk>> Engine<'m, P, D> {
    /// Builds the engine from a checked manifest over `ports`, one per
    /// manifest interface in order (each made for
    /// [`arena_bytes`]/[`hca_capacity`] of the manifest's configuration):
    /// `open(config, volume)` opens each volume's device (`config` is the
    /// RTRS configuration the manifest makes: queue depth and chunk size
    /// bound what devices see), then the RTRS server over all ports
    /// (listening) and the RNBD server. A port that cannot re-key regions
    /// ([`Port::can_rekey`]) serves with `always_invalidate` off, whatever
    /// the manifest asks (see [`always_invalidate`](Self::always_invalidate)).
    /// All memory is allocated here.
    ///
    /// # Errors
    /// [`BuildError`] for what the manifest asks and this engine cannot do,
    /// and whatever `open` returns.
    pub fn with_ports(
        manifest: Manifest<'m>,
        mut hcas: Vec<P>,
        mut open: impl FnMut(&ServerConfig, &manifest::binary::Volume<'_>) -> Result<D, BuildError>,
    ) -> Result<Self, BuildError> {
        if manifest.interface_count() == 0 {
            return Err(BuildError::NoInterface);
        }
        if hcas.len() != manifest.interface_count() {
            return Err(BuildError::Capacity(alloc::format!(
                "{} ports for {} manifest interfaces (one port per interface)",
                hcas.len(),
                manifest.interface_count()
            )));
        }
        let mut config = server_config(&manifest);
        if !hcas.iter().all(Port::can_rekey) {
            config.always_invalidate = false;
        }
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
                parked: ParkedQueue::default(),
                counters: VolumeCounters::default(),
                latency: crate::LatencyHistogram::default(),
            });
        }
        let interfaces = manifest
            .interfaces()
            .map(|iface| Interface {
                name: iface.name.into(),
                ip: iface.address.address,
                icmp: Box::new([0; ICMP_REPLY_LEN]),
                icmp_len: 0,
            })
            .collect();
        let mut server = Box::new(Server::new(config).map_err(BuildError::Config)?);
        server.start(&mut hcas).map_err(BuildError::Listen)?;
        // Closed sessions linger while their IO drains: room for as many.
        let session_capacity = usize::from(config.max_sessions) * 2;
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
            ios: IoSlots::new(requests),
            next_tag: 0,
            logger: None,
            answered: 0,
            identity_dma: false,
            refusals: crate::metrics::Refusals::default(),
        })
    }

    /// Whether the engine serves with `always_invalidate` (the manifest's
    /// switch, off on ports that cannot re-key).
    pub fn always_invalidate(&self) -> bool {
        self.server.config().always_invalidate
    }

    /// Lets volumes transfer straight to and from the registered arenas
    /// ([`BufferAccess::dma_address`](hal::block::BufferAccess::dma_address): a chunk's address is its bus
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
    pub fn rtrs(&self, interface: usize) -> Option<&Server<P>> {
        (interface < self.interfaces.len()).then_some(&*self.server)
    }

    /// The RTRS server (all interfaces are its ports).
    pub fn server(&self) -> &Server<P> {
        &self.server
    }

    /// Interface `interface`'s HCA (the RTRS server's port of the same
    /// index), if it exists.
    pub fn hca(&self, interface: usize) -> Option<&P> {
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
        self.ios.in_use()
    }

    /// Volume `index`'s device (tests, statistics).
    pub fn volume(&self, index: usize) -> Option<&D> {
        self.volumes.get(index).map(|v| &v.device)
    }

    /// Volume `index`'s latency histogram (received to answered).
    pub fn volume_latency(&self, index: usize) -> Option<&crate::LatencyHistogram> {
        self.volumes.get(index).map(|v| &v.latency)
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
        if self.server.peek_event().is_some() {
            busy = true;
            self.handle_events(now);
        }
        busy |= self.poll_volumes(now);
        for (index, (iface, hca)) in self.interfaces.iter_mut().zip(&mut self.hcas).enumerate() {
            if iface.icmp_len > 0 {
                sink.transmit(index, &iface.icmp[..iface.icmp_len], &[], &[]);
                iface.icmp_len = 0;
                busy = true;
            }
            busy |= hca.poll_link(now, index, sink);
        }
        busy
    }

    /// Handles every event the RTRS server queued. Out of line: `poll`
    /// runs every loop turn, most turns find no event, and serving one
    /// needs a large stack frame (RNBD's request, the volume's submission,
    /// the logs of refusals).
    #[inline(never)]
    fn handle_events(&mut self, now: u64) {
        while let Some(event) = self.server.peek_event() {
            // An IO (nearly every event) is read in place: its fields are
            // a small part of an `Event`, which is sized for session names.
            if let &Event::Io {
                session,
                token,
                direction,
                header,
                data,
                port,
                ..
            } = event
            {
                self.server.skip_event();
                self.serve_io(port, session, token, direction, header, data, now);
            } else if let Some(event) = self.server.next_event() {
                self.handle_session_event(event, now);
            }
        }
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
    pub fn stats(&self) -> StatsReport<'_, 'm, P, D> {
        StatsReport { engine: self }
    }

    /// The name of interface `port`, for logs.
    pub(crate) fn interface_name(&self, port: usize) -> &str {
        self.interfaces.get(port).map_or("?", |i| i.name.as_str())
    }
}

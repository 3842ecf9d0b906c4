//! The software HCA: registered memory, QP table, completions, CM, frame IO.
//!
//! [`Hca`] is one RoCEv2 device with one protection domain, as the `verbs`
//! crate models it: it owns the registered-memory [`Arena`], a table of RC
//! queue pairs ([`crate::qp::Qp`]), one completion queue, the connection
//! manager ([`crate::cm::Cm`], IB CM + RDMA CM on
//! QP1) and the neighbour table ([`crate::arp::Arp`]), and implements
//! [`verbs::Verbs`]. It is sans-IO like the rest of the crate: frames come in
//! through [`Hca::receive`] (ARP → [`Arp`]; RoCEv2: parse, ICRC check,
//! address/P_Key/QPN checks, dispatch — everything else is a counted silent
//! drop, roce-v2.md §1.10 and checklist.md B) and go out through
//! [`Hca::poll`] into a [`FrameSink`]; time is passed in as `now`
//! (nanoseconds) and [`Hca::poll_at`] says when to call again. Randomness
//! (QPN base, start PSNs, keys, CM comm IDs and TIDs, RDMA CM source ports)
//! comes from the key source given to [`Hca::new`].
//!
//! # Connection management
//!
//! - **QP1 (GSI).** A RoCEv2 frame for DestQP 1 must be UD SEND_ONLY with a
//!   DETH carrying Q_Key 0x80010000, the default P_Key, a good ICRC and a
//!   256-byte MAD (roce-v2.md §3); it goes to [`Cm::process_mad`] with the
//!   route it came over. MADs from [`Cm::dispatch`] are sent exactly as rxe
//!   sends them: UDP source port 0xD872, DF, TOS/TTL from the CM, BTH UD
//!   SEND_ONLY to QP 1 with AckReq set (rxe's GSI quirk) and a per-HCA PSN
//!   counting from 0, DETH Q_Key 0x80010000 / SrcQP 1.
//! - **Passive.** [`Verbs::listen`] → [`Cm::listen`]. A REQ for a listened
//!   port creates an RC QP in `Init` (its QPN avoids [`Cm::qpn_in_use`]) and
//!   surfaces [`CmEvent::ConnectRequest`]; the consumer posts receives and
//!   calls [`Verbs::accept`], which moves the QP to `Rtr` with the REQ's
//!   parameters and then sends the REP (ib-cm.md §6: the receive is posted
//!   before the REP leaves). The RTU, or the first valid RC packet
//!   ([`Cm::notify_data_received`]), moves it to `Rts` and surfaces
//!   [`CmEvent::Established`]. [`Verbs::reject`] sends a REJ (reason 28) and
//!   releases the QP.
//! - **Active.** [`Verbs::connect`] creates a QP, resolves the server's MAC
//!   by ARP (the connection waits, as a named state, until ARP answers or
//!   fails: [`CmEvent::Unreachable`]), then sends the REQ. The REP moves the
//!   QP to `Rts`, sends the RTU and surfaces [`CmEvent::Established`] with the
//!   REP's private data; a REJ surfaces [`CmEvent::Rejected`], no answer
//!   [`CmEvent::Unreachable`].
//! - **Disconnect.** [`Verbs::disconnect`] moves the QP to `Err` (its work
//!   requests flush) and sends a DREQ; the DREP (or the DREQ's last retry)
//!   surfaces [`CmEvent::Disconnected`]. A peer's DREQ is answered with a
//!   DREP, the QP flushed and [`CmEvent::Disconnected`] surfaced.
//!
//! UDP source ports of CM-made QPs follow rxe: the port folded from the RDMA
//! CM flow label `(src_port * 31 + dst_port) & 0xFFFFF` (roce-v2.md §1.3).
//! QPs made with [`Hca::create_qp`] + [`Hca::connect_qp`] (tests, or a CM
//! elsewhere) bypass all of this and see no CM events.
//!
//! # Capacity
//!
//! Every table is sized when the HCA is built, from an [`HcaCapacity`]
//! ([`Hca::with_capacity`]; [`Hca::new`] and [`Hca::with_link`] take it
//! from the type's const parameters, [`HcaCapacity::from_const`]), and
//! allocated then, once: QPs with their queues (a destroyed QP's memory is
//! reused by the next), CM slots, the region table, the CQ. Nothing
//! allocates afterwards. Lookups are O(1): a QPN is its slot plus a
//! multiple of the table size (`qpn % qps` is the slot), an R_Key or L_Key
//! holds its region's slot the same way ([`Arena`]).
//!
//! Each QP reserves its send plus receive depth of CQ entries when it is
//! created ([`QpError::CompletionQueueFull`] if the CQ cannot), and never
//! holds more WQEs plus unconsumed completions than that, so the CQ
//! cannot overflow however the consumer polls. A destroyed QP's completions
//! still in the CQ keep their entries reserved until consumed.
//!
//! QPN multiples start at a random per-instance value and count up,
//! skipping QPNs 0, 1, 0xFFFFFF and every QPN still in use.
//!
//! A CM-made QP that dies of a transport error (retries exhausted, a fatal
//! NAK) is reported as [`CmEvent::Disconnected`] (after its work requests
//! completed with the error) and a DREQ tells the peer.
//!
//! # Link modes
//!
//! [`LinkMode::Ethernet`] (the default, [`Hca::new`]): Ethernet frames in
//! and out, ARP included. [`LinkMode::Udp`] ([`Hca::with_link`]): UDP
//! payloads in ([`Hca::receive_datagram`]) and out ([`Hca::poll_datagrams`])
//! through a host UDP socket, no ARP, the ICRC over a canonical pseudo
//! IPv4/UDP header — Brick to Brick only; see [`crate::udp`].

use alloc::vec::Vec;
use core::net::{IpAddr, SocketAddr};

use heapless::Deque;
use verbs::memory::Arena;
use verbs::{
    AccessError, AccessFlags, AllocError, CmEvent, ConnId, ConnParams, ConnectError, KeySource,
    Lkey, Memory, MemoryHandle, MemoryRegion, PostError, PrivateData, RecvWr, RegError,
    RejectReason, Rkey, SendWr, Verbs, WorkCompletion,
};

use crate::arp::{self, Arp, ArpFrame, NeighborState};
use crate::capacity::{CapacityError, HcaCapacity};
use crate::cm::{
    self, guid_from_mac, Cm, CmError, ConnectParams, LocalQp, Outbound, PeerAddr, QpAttributes,
    Route, REQ_USER_DATA_LEN,
};
use crate::qp::selective::ReorderPool;
use crate::qp::{
    CompletionQueue, ConnectQpError, Context, Counters, CqReserveError, FrameSink, Path, Qp,
    QpParams, QpState,
};
use crate::slots::SlotSet;
use crate::types::{Mtu, Pkey, Psn, Qkey, Qpn};
use crate::udp::{parse_datagram, DatagramFrames, DatagramSink, PSEUDO_MAC};
use crate::wake::WakeSet;
use crate::wire::{
    bth, ipv4, udp, with_parsed_frame, BthRepr, DethRepr, EtherType, EthernetAddress, EthernetRepr,
    ExtHeaders, FrameHeaders, IcrcSeed, Ipv4Address, Ipv4Repr, Opcode, PacketView, ParseError,
    Trailer, Transport, UdpRepr, FIXED_HEADERS_LEN, MAX_HEADERS_LEN,
};

mod events;
mod poll;
mod provider;
mod receive;

/// Most frames one [`Hca::poll`] call sends (over all QPs, QP1 and ARP).
pub const MAX_TX_BURST: usize = 64;

/// Neighbours the HCA's ARP table holds.
pub const ARP_ENTRIES: usize = 16;

/// ARP frames (replies, requests) waiting for [`Hca::poll`]; more are dropped
/// (the peer retries).
pub const ARP_QUEUE_LEN: usize = 8;

/// Connection events waiting for [`Verbs::poll_cm_event`]. While the queue is
/// full, further CM events wait inside the CM (back-pressure, nothing lost).
pub const EVENT_QUEUE_LEN: usize = 16;

/// RNR timer code Brick puts into its RNR NAKs on CM-made QPs (12: 0.64 ms).
pub const MIN_RNR_TIMER: u8 = 12;

/// First RDMA CM source port [`Verbs::connect`] picks from (the IANA dynamic
/// range, 32768..=60999 as Linux uses).
const EPHEMERAL_PORT_BASE: u16 = 32_768;
/// Number of ports in the ephemeral range.
const EPHEMERAL_PORT_COUNT: u32 = 28_232;

/// How the HCA reaches its peers (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LinkMode {
    /// Ethernet frames: Brick does ARP, IPv4 and UDP ([`Hca::receive`],
    /// [`Hca::poll`]).
    #[default]
    Ethernet,
    /// UDP payloads through a host socket bound to `HcaConfig::ip:port`,
    /// every peer at the same `port` ([`Hca::receive_datagram`],
    /// [`Hca::poll_datagrams`]; [`crate::udp`]).
    Udp {
        /// The UDP port of every node (4791, [`udp::ROCE_V2_PORT`], outside tests).
        port: u16,
    },
}

/// The HCA's own addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HcaConfig {
    /// Our Ethernet MAC.
    pub mac: [u8; 6],
    /// Our IPv4 address; frames to any other address are dropped.
    pub ip: [u8; 4],
}

/// Why a QP could not be created or connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpError {
    /// The QP table is full.
    TableFull,
    /// The completion queue cannot reserve the new QP's entries.
    CompletionQueueFull(CqReserveError),
    /// No QP with that id.
    UnknownQp,
    /// [`Qp::connect`] refused.
    Connect(ConnectQpError),
}

impl core::fmt::Display for QpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::TableFull => f.write_str("queue pair table full"),
            Self::CompletionQueueFull(error) => write!(f, "new queue pair: {error}"),
            Self::UnknownQp => f.write_str("unknown queue pair"),
            Self::Connect(error) => write!(f, "connect: {error}"),
        }
    }
}

impl core::error::Error for QpError {}

/// Counters of the HCA's control path (QP1 and ARP), beside the transport's
/// [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ControlCounters {
    /// MADs handed to the CM.
    pub mads_in: u64,
    /// MADs sent.
    pub mads_out: u64,
    /// QP1 frames dropped: not UD SEND_ONLY, no DETH, wrong Q_Key, or a
    /// payload that is not one 256-byte MAD.
    pub drop_bad_gsi: u64,
    /// ARP frames handed to the ARP table.
    pub arp_in: u64,
    /// ARP frames sent.
    pub arp_out: u64,
    /// ARP frames dropped because their queue was full.
    pub arp_dropped: u64,
    /// Connect requests refused because the QP table was full.
    pub requests_refused: u64,
}

/// The key source as the CM's random source.
struct CmRandom<'a, K>(&'a mut K);

impl<K: KeySource> cm::Random for CmRandom<'_, K> {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
}

/// What an active connection asked for, kept until the REQ can be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ActiveRequest {
    /// The server's address.
    peer_ip: Ipv4Address,
    /// The server's RDMA CM port.
    port: u16,
    /// Our RDMA CM source port.
    src_port: u16,
    /// Our side of the QP as the REQ announces it.
    local: LocalQp,
    /// Transport retries asked for.
    retry_count: u8,
    /// The REQ's user private data.
    private_data: heapless::Vec<u8, REQ_USER_DATA_LEN>,
}

/// The CM side of one QP slot.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// Made with [`Hca::create_qp`]: no CM, no events.
    Manual,
    /// Passive, waiting for the consumer's accept/reject.
    Requested {
        /// The CM connection.
        cm: ConnId,
        /// The REQ's attributes.
        attributes: QpAttributes,
        /// The addresses the REQ came over.
        route: Route,
        /// UDP source port of the QP (from the flow label).
        udp_src_port: u16,
    },
    /// Active, waiting for ARP to resolve the server before the REQ.
    Resolving(ActiveRequest),
    /// Active, REQ sent, waiting for the REP.
    Requesting {
        /// The CM connection.
        cm: ConnId,
        /// The server's MAC and IP.
        peer: PeerAddr,
        /// Our side of the QP.
        local: LocalQp,
        /// UDP source port of the QP (from the flow label).
        udp_src_port: u16,
    },
    /// REP sent (passive) or RTU sent (active): the CM connection lives.
    Connected {
        /// The CM connection.
        cm: ConnId,
    },
    /// Our DREQ is out (consumer's `disconnect`): waiting for the DREP.
    Closing {
        /// The CM connection.
        cm: ConnId,
    },
    /// `Disconnected` (or `Unreachable`/`Rejected`) was surfaced; only
    /// `destroy` is left.
    Closed {
        /// The CM connection, if one was made (it may still be in timewait).
        cm: Option<ConnId>,
    },
}

impl Link {
    fn cm(&self) -> Option<ConnId> {
        match self {
            Link::Requested { cm, .. }
            | Link::Requesting { cm, .. }
            | Link::Connected { cm }
            | Link::Closing { cm } => Some(*cm),
            Link::Closed { cm } => *cm,
            Link::Manual | Link::Resolving(_) => None,
        }
    }
}

/// Bytes of one QP slot besides the spare QP and its queues
/// ([`Qp::bytes_for`]): the table entry, the CM link, generation, free list.
pub(crate) const SLOT_BYTES: usize = core::mem::size_of::<Option<Qp>>()
    + core::mem::size_of::<Link>()
    + core::mem::size_of::<u32>()
    + core::mem::size_of::<usize>();

/// The UDP source port rxe gives a CM-made RC QP: folded from the RDMA CM
/// flow label `(src_port * 31 + dst_port) & 0xFFFFF` (roce-v2.md §1.3).
pub const fn rdma_cm_udp_src_port(src_port: u16, dst_port: u16) -> u16 {
    let flow_label = (src_port as u32 * 31 + dst_port as u32) & 0xf_ffff;
    udp::source_port_from_flow_label(flow_label)
}

/// A software RoCEv2 HCA sized by an [`HcaCapacity`] (see the module docs).
///
/// `N`, `Q` and `C` only matter to [`Hca::new`] and [`Hca::with_link`]:
/// the capacity they give ([`HcaCapacity::from_const`]: `N` regions, `Q`
/// QPs, at least `C` CQ entries). An HCA built with [`Hca::with_capacity`]
/// is an `Hca<S, K>` whatever its size.
pub struct Hca<S, K, const N: usize = 0, const Q: usize = 0, const C: usize = 0> {
    arena: Arena<S, N>,
    keys: K,
    capacity: HcaCapacity,
    /// The QP table: slot `qpn % qps` holds QP `qpn` when it exists.
    qps: Vec<Option<Qp>>,
    /// QPs of free slots, their queues allocated (reused by `create`).
    spare: Vec<Qp>,
    /// Free slots (a stack: the lowest slot is used first).
    free_slots: Vec<usize>,
    /// Bumped whenever a slot gets a new QP: part of the QP's CQ tag.
    generations: Vec<u32>,
    links: Vec<Link>,
    /// Slots that hold a QP: what the per-poll walks visit.
    occupied: SlotSet,
    /// Slots whose link may be [`Link::Resolving`] (dropped once found
    /// otherwise): what [`Hca::resolve_pending`] visits.
    resolving: SlotSet,
    /// Slots whose QP went to `Err` and was not reaped yet (the QP was
    /// checked after each call that can fail it): what
    /// [`Hca::reap_failed_qps`] visits.
    failed: SlotSet,
    /// QPs with a frame to send or a timer running: what the data path of
    /// [`Hca::poll`] visits.
    wake: WakeSet,
    cq: CompletionQueue,
    /// Reorder buffers lent to selective-retransmission QPs.
    reorder: ReorderPool,
    counters: Counters,
    control: ControlCounters,
    config: HcaConfig,
    /// Counts QPN multiples (QPN = slot + multiple · qps).
    next_qpn: u32,
    /// Where the next `poll` starts (round robin over QPs).
    next_poll: usize,
    cm: Cm,
    arp: Arp<ARP_ENTRIES>,
    arp_out: Deque<ArpFrame, ARP_QUEUE_LEN>,
    /// A MAD taken from the CM that the last `poll` had no budget for.
    mad_out: Option<Outbound>,
    /// The CM may have MADs to dispatch.
    cm_dirty: bool,
    events: Deque<CmEvent, EVENT_QUEUE_LEN>,
    /// Where every received frame's ICRC check starts (see [`IcrcSeed`]).
    icrc: IcrcSeed,
    /// Whether [`Hca::receive`] takes its fast path for in-order WRITE
    /// continuations and the QPs send middle packets in runs (always, but
    /// for the equivalence tests).
    fast_paths: bool,
    /// BTH PSN of the next MAD sent on QP1.
    gsi_psn: Psn,
    path_mtu: Mtu,
    /// The latest `now` seen (for the verbs calls, which take no time).
    now: u64,
    link_mode: LinkMode,
}

impl<S, K, const N: usize, const Q: usize, const C: usize> Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    /// An HCA over registered-memory `storage`, drawing keys, the QPN base,
    /// start PSNs and CM identifiers from `keys` (a strong random source
    /// outside tests), sized by the type's const parameters
    /// ([`HcaCapacity::from_const`]). The CM uses Linux-compatible defaults
    /// ([`cm::Config::new`]) with a CA GUID derived from the MAC; the path
    /// MTU of outgoing connections is 1024 ([`Hca::set_path_mtu`]).
    pub fn new(storage: S, keys: K, config: HcaConfig) -> Self {
        Self::with_link(storage, keys, config, LinkMode::Ethernet)
    }

    /// An HCA as [`Hca::new`] makes it, reaching its peers as `link_mode`
    /// says. In [`LinkMode::Udp`] the MAC in `config` only names the CA (CM
    /// GUID) and `config.ip` must be the address the socket is bound to.
    pub fn with_link(storage: S, keys: K, config: HcaConfig, link_mode: LinkMode) -> Self {
        let capacity = HcaCapacity::from_const::<N, Q, C>();
        match Self::with_capacity(storage, keys, config, link_mode, capacity) {
            Ok(hca) => hca,
            // `from_const` clamps every count into range.
            Err(_) => unreachable!("HcaCapacity::from_const is always valid"),
        }
    }

    /// An HCA as [`Hca::with_link`] makes it, its tables sized by
    /// `capacity` and allocated here, once (see the module docs).
    ///
    /// # Errors
    /// [`CapacityError`] if `capacity` is out of range.
    pub fn with_capacity(
        storage: S,
        mut keys: K,
        config: HcaConfig,
        link_mode: LinkMode,
        capacity: HcaCapacity,
    ) -> Result<Self, CapacityError> {
        capacity.check()?;
        let next_qpn = keys.next_u32() & 0x00ff_ffff;
        let mac = EthernetAddress(config.mac);
        let mut arp = Arp::new(mac, arp::Config::default());
        // A non-unicast own address only means nobody can ARP for us.
        let _ = arp.add_address(Ipv4Address::from(config.ip));
        let qps = capacity.qps;
        let mut table = Vec::with_capacity(qps);
        table.resize_with(qps, || None);
        let mut links = Vec::with_capacity(qps);
        links.resize_with(qps, || Link::Manual);
        let spare = (0..qps)
            .map(|_| {
                Qp::with_depths(
                    ConnId(0),
                    Qpn::new(0),
                    capacity.send_depth,
                    capacity.recv_depth,
                )
            })
            .collect();
        Ok(Self {
            arena: Arena::with_regions(storage, capacity.regions),
            keys,
            capacity,
            qps: table,
            spare,
            free_slots: (0..qps).rev().collect(),
            generations: alloc::vec![0; qps],
            links,
            occupied: SlotSet::with_capacity(qps),
            resolving: SlotSet::with_capacity(qps),
            failed: SlotSet::with_capacity(qps),
            wake: WakeSet::with_capacity(qps),
            cq: CompletionQueue::with_capacity(capacity.cq_entries),
            reorder: ReorderPool::with_capacity(capacity.reorder_buffers),
            counters: Counters::default(),
            control: ControlCounters::default(),
            config,
            next_qpn,
            next_poll: 0,
            cm: Cm::with_capacity(
                cm::Config {
                    max_path_mtu: Mtu::Mtu1024,
                    ..cm::Config::new(guid_from_mac(mac))
                },
                capacity.cm_connections,
            ),
            arp,
            arp_out: Deque::new(),
            mad_out: None,
            cm_dirty: false,
            events: Deque::new(),
            icrc: IcrcSeed::new(),
            fast_paths: true,
            gsi_psn: Psn::new(0),
            path_mtu: Mtu::Mtu1024,
            now: 0,
            link_mode,
        })
    }

    /// The sizes of the HCA's tables.
    pub fn capacity(&self) -> HcaCapacity {
        self.capacity
    }

    /// QPs that exist now (at most `capacity().qps`).
    pub fn qp_count(&self) -> usize {
        self.capacity.qps - self.free_slots.len()
    }

    /// The completion queue (occupancy and reservations, for tests and
    /// statistics).
    pub fn completion_queue(&self) -> &CompletionQueue {
        &self.cq
    }

    /// How the HCA reaches its peers.
    pub fn link_mode(&self) -> LinkMode {
        self.link_mode
    }

    /// The UDP source port of our packets: `ethernet_port` (rxe's choice for
    /// the flow) on Ethernet, the socket's port in UDP mode.
    fn udp_source_port(&self, ethernet_port: u16) -> u16 {
        match self.link_mode {
            LinkMode::Ethernet => ethernet_port,
            LinkMode::Udp { port } => port,
        }
    }

    /// Our addresses.
    pub fn config(&self) -> HcaConfig {
        self.config
    }

    /// The transport counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The control-path (QP1, ARP) counters.
    pub fn control_counters(&self) -> &ControlCounters {
        &self.control
    }

    /// The connection manager (read-only: state and statistics).
    pub fn cm(&self) -> &Cm {
        &self.cm
    }

    /// Sets the path MTU: what [`Verbs::connect`] asks for and the largest a
    /// peer's REQ may ask for (larger ones are rejected with reason 26,
    /// checklist B). The default, 1024, is what rxe uses on a 1500-byte
    /// Ethernet ([`Mtu::for_ethernet_mtu`] gives it for other NIC MTUs).
    ///
    /// Call it before [`Verbs::listen`] / [`Verbs::connect`], while
    /// building: it resets the connection manager (listeners and CM state
    /// are forgotten; its slots are allocated again).
    pub fn set_path_mtu(&mut self, mtu: Mtu) {
        self.path_mtu = mtu;
        self.cm = Cm::with_capacity(
            cm::Config {
                max_path_mtu: mtu,
                ..*self.cm.config()
            },
            self.capacity.cm_connections,
        );
    }

    /// Turns the fast paths off or on (on by default): the receive path
    /// for in-order WRITE continuations and the QPs' runs of middle
    /// packets. Only for tests that show both ways do the same, frame for
    /// frame.
    #[doc(hidden)]
    pub fn set_fast_paths(&mut self, on: bool) {
        self.fast_paths = on;
        for qp in self.qps.iter_mut().flatten() {
            qp.set_fast_transmit(on);
        }
    }

    /// The path MTU (see [`Hca::set_path_mtu`]).
    pub fn path_mtu(&self) -> Mtu {
        self.path_mtu
    }

    /// The registered memory.
    pub fn arena(&self) -> &Arena<S, N> {
        &self.arena
    }

    /// The registered memory, writable (CPU access through handles).
    pub fn arena_mut(&mut self) -> &mut Arena<S, N> {
        &mut self.arena
    }

    /// A path to a peer for a QP numbered `qpn`: our addresses, the peer's,
    /// rxe's per-QP UDP source port (the socket's port in UDP mode, where
    /// `peer_mac` is not used), TOS 0, TTL 64.
    pub fn path_to(&self, qpn: Qpn, peer_mac: [u8; 6], peer_ip: [u8; 4]) -> Path {
        Path {
            local_mac: self.config.mac,
            peer_mac,
            local_ip: self.config.ip,
            peer_ip,
            udp_src_port: self.udp_source_port(udp::source_port_for_qpn(qpn)),
            tos: 0,
            ttl: 64,
        }
    }

    /// Creates an RC QP in `Init` (receives may be posted) and returns its
    /// connection id; its QPN is [`Hca::qpn`]. The QP is not known to the
    /// CM: connect it with [`Hca::connect_qp`].
    ///
    /// # Errors
    /// [`QpError::TableFull`], [`QpError::CompletionQueueFull`].
    pub fn create_qp(&mut self) -> Result<ConnId, QpError> {
        self.create_linked_qp(Link::Manual).map(|(conn, _)| conn)
    }

    /// Creates a QP in `Init` with CM link `link`; returns its id and slot.
    /// Reserves the QP's CQ entries; allocates nothing.
    fn create_linked_qp(&mut self, link: Link) -> Result<(ConnId, usize), QpError> {
        let &slot = self.free_slots.last().ok_or(QpError::TableFull)?;
        let qps = self.capacity.qps as u32;
        // QPN = slot + multiple · qps, below 0xFFFFFF.
        let multiples = (0x00ff_ffff - slot as u32).div_ceil(qps).max(1);
        // At most `qps` CM slots hold a QPN in timewait, so `qps` + 4
        // candidates find a free one unless the QPN space of the slot is
        // that small.
        let mut qpn = None;
        for _ in 0..multiples.min(qps + 4) {
            let multiple = self.next_qpn % multiples;
            self.next_qpn = self.next_qpn.wrapping_add(1);
            let candidate = slot as u32 + multiple * qps;
            let reserved = candidate <= 1 || candidate >= 0x00ff_ffff;
            if !reserved && !self.cm.qpn_in_use(Qpn::new_truncate(candidate)) {
                qpn = Some(candidate);
                break;
            }
        }
        let qpn = qpn.ok_or(QpError::TableFull)?;
        self.cq
            .reserve(self.capacity.cq_budget())
            .map_err(QpError::CompletionQueueFull)?;
        let Some(mut qp) = self.spare.pop() else {
            // One spare per free slot: cannot happen; give the entries back.
            self.cq.unreserve(self.capacity.cq_budget());
            return Err(QpError::TableFull);
        };
        self.free_slots.pop();
        self.generations[slot] = self.generations[slot].wrapping_add(1);
        let tag = u64::from(self.generations[slot]) << 32 | slot as u64;
        qp.reuse(ConnId(qpn), Qpn::new_truncate(qpn), tag);
        qp.set_fast_transmit(self.fast_paths);
        qp.init();
        self.qps[slot] = Some(qp);
        self.links[slot] = link;
        self.occupied.insert(slot);
        self.touched(slot);
        Ok((ConnId(qpn), slot))
    }

    /// Frees QP slot `slot` (reject, destroy): pins are dropped, the QP's
    /// memory goes back to the spares, its CQ entries are given back except
    /// those its unconsumed completions still hold (given back as they are
    /// consumed).
    fn free_slot(&mut self, slot: usize) {
        self.links[slot] = Link::Manual;
        self.resolving.remove(slot);
        self.failed.remove(slot);
        self.wake.set(slot, None);
        let Some(mut qp) = self.qps[slot].take() else {
            return;
        };
        self.occupied.remove(slot);
        qp.release_reorder(&mut self.reorder);
        qp.release(&mut self.arena);
        let held = qp.completions_held();
        self.cq
            .unreserve(self.capacity.cq_budget().saturating_sub(held));
        self.spare.push(qp);
        self.free_slots.push(slot);
    }

    /// Brings QP `conn` to `Rts` with `params` (what the CM negotiated).
    ///
    /// # Errors
    /// [`QpError::UnknownQp`], [`QpError::Connect`].
    pub fn connect_qp(&mut self, conn: ConnId, params: QpParams) -> Result<(), QpError> {
        let result = self
            .qp_mut(conn)
            .ok_or(QpError::UnknownQp)?
            .connect(params)
            .map_err(QpError::Connect);
        self.touched_conn(conn);
        result
    }

    /// Brings QP `conn` to `Rtr` only (the passive side before sending the
    /// CM REP); [`Hca::ready_to_send`] completes the step to `Rts`.
    ///
    /// # Errors
    /// [`QpError::UnknownQp`], [`QpError::Connect`].
    pub fn ready_to_receive(&mut self, conn: ConnId, params: QpParams) -> Result<(), QpError> {
        let result = self
            .qp_mut(conn)
            .ok_or(QpError::UnknownQp)?
            .ready_to_receive(params)
            .map_err(QpError::Connect);
        self.touched_conn(conn);
        result
    }

    /// Moves QP `conn` from `Rtr` to `Rts`.
    ///
    /// # Errors
    /// [`QpError::UnknownQp`], [`QpError::Connect`].
    pub fn ready_to_send(&mut self, conn: ConnId) -> Result<(), QpError> {
        let result = self
            .qp_mut(conn)
            .ok_or(QpError::UnknownQp)?
            .ready_to_send()
            .map_err(QpError::Connect);
        self.touched_conn(conn);
        result
    }

    /// The QP number of `conn`.
    pub fn qpn(&self, conn: ConnId) -> Option<Qpn> {
        self.qp(conn).map(Qp::qpn)
    }

    /// The QP of `conn`.
    pub fn qp(&self, conn: ConnId) -> Option<&Qp> {
        self.slot_of(conn).and_then(|slot| self.qps[slot].as_ref())
    }

    /// Reorder buffers of the selective-retransmission pool not lent to a
    /// QP now, and the pool's size.
    pub fn reorder_buffers(&self) -> (usize, usize) {
        (self.reorder.available(), self.reorder.capacity())
    }

    /// The state of QP `conn`.
    pub fn qp_state(&self, conn: ConnId) -> Option<QpState> {
        self.qp(conn).map(Qp::state)
    }

    /// Called after every call into slot `slot`'s QP that can change it:
    /// records when the QP next has work for [`Hca::poll`] and adds the
    /// slot to the failed set if the QP went to `Err`.
    fn touched(&mut self, slot: usize) {
        let Some(qp) = self.qps.get(slot).and_then(Option::as_ref) else {
            self.wake.set(slot, None);
            return;
        };
        if qp.state() == QpState::Err {
            self.failed.insert(slot);
        }
        self.wake.set(slot, qp.wake_at());
    }

    fn touched_conn(&mut self, conn: ConnId) {
        if let Some(slot) = self.slot_of(conn) {
            self.touched(slot);
        }
    }

    fn qp_mut(&mut self, conn: ConnId) -> Option<&mut Qp> {
        let slot = self.slot_of(conn)?;
        self.qps[slot].as_mut()
    }

    /// The slot of QP `conn`: O(1), the QPN names it.
    fn slot_of(&self, conn: ConnId) -> Option<usize> {
        let slot = conn.0 as usize % self.capacity.qps;
        self.qps[slot]
            .as_ref()
            .is_some_and(|qp| qp.conn() == conn)
            .then_some(slot)
    }

    /// The slot whose link names CM connection `cm` (control path: one
    /// scan of the QPs that exist).
    fn slot_of_cm(&self, cm: ConnId) -> Option<usize> {
        self.occupied
            .iter()
            .find(|&slot| self.links[slot].cm() == Some(cm))
    }
}

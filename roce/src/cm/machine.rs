//! The connection manager: message handling, consumer calls and timers.
//!
//! ib-cm.md §4 (messages, duplicates, timeouts, timewait), §5 (RDMA CM service IDs
//! and the CMA header), §6 (the sequence with a Linux client and its timers);
//! checklist.md A.4 and B (REJ reasons, silent drops). See the module docs of
//! [`crate::cm`] for how the HCA drives it.
//!
//! The [`Cm`] type, its construction and the demultiplexing of received MADs
//! live here; each job has its own file: the connection table (`table`),
//! event and MAD queues (`queues`), timers (`timers`), the passive and active
//! sides of the handshake (`passive`, `active`), REJ (`reject`) and closing
//! (`disconnect`).

mod active;
mod disconnect;
mod passive;
mod queues;
mod reject;
mod table;
mod timers;

use alloc::vec::Vec;
use heapless::Deque;

use super::state::{Conn, RequestInfo};
#[cfg(doc)]
use super::ConnId;
use super::{
    Config, Outbound, PrivateData, QpAttributes, Random, Route, Stats, MAD_LEN, MAX_LISTENERS,
    MILLISECOND, STATELESS_QUEUE_LEN,
};
use crate::slots::SlotSet;
use crate::types::{Mtu, Psn, Qpn};
use crate::wire::cm::{self as wire_cm, Message};
use crate::wire::{EthernetAddress, Ipv4Address};

/// Hop limit used when the peer's REQ says 0 (a TTL of 0 would never arrive).
const DEFAULT_HOP_LIMIT: u8 = 64;

/// How many random values [`Cm`] tries for a fresh, unused Local Comm ID.
const COMM_ID_ATTEMPTS: usize = 8;

/// The extra wait Linux adds to an MRA(REQ) service timeout (ib-cm.md §6.3).
const MRA_REQ_SLACK: u64 = 2_048 * MILLISECOND;

/// The resources an accepted connection ended up with (after clamping to the REQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// REP Responder Resources: RDMA READs from the peer we serve concurrently.
    pub responder_resources: u8,
    /// REP Initiator Depth: RDMA READs we may keep outstanding toward the peer.
    pub initiator_depth: u8,
}

/// IB CM + RDMA CM for up to `N` connections (passive and active), sans-IO;
/// [`Cm::with_capacity`] chooses the count at run time instead.
///
/// The count is at most 65 536 (a [`ConnId`] holds the slot in its low 16 bits and a
/// generation in the high 16, so an id stays dead until its slot has been reused
/// 65 536 times). Nothing allocates after [`Cm::new`] / [`Cm::with_capacity`];
/// a slot takes about 1 KiB (the last MAD sent, for retransmission, and the
/// received private data).
///
/// # Example
///
/// A client and a server CM, the HCA's part reduced to carrying the MADs:
///
/// ```
/// use roce::cm::{Cm, Config, ConnectParams, Event, LocalQp, PeerAddr, Route};
/// use roce::types::{Mtu, Psn, Qpn};
/// use roce::wire::{EthernetAddress, Ipv4Address};
///
/// let (client_ip, server_ip) = (Ipv4Address::new(10, 0, 0, 2), Ipv4Address::new(10, 0, 0, 1));
/// let (client_mac, server_mac) = (EthernetAddress([2, 0, 0, 0, 0, 2]), EthernetAddress([2, 0, 0, 0, 0, 1]));
/// let to_server = Route { local_ip: client_ip, peer: PeerAddr { mac: server_mac, ip: server_ip } };
/// let to_client = Route { local_ip: server_ip, peer: PeerAddr { mac: client_mac, ip: client_ip } };
/// let mut seed = 1u32;
/// let mut rng = move || {
///     seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
///     seed
/// };
/// let qp = |qpn| LocalQp {
///     qpn: Qpn::new(qpn),
///     starting_psn: Psn::new(7),
///     responder_resources: 0,
///     initiator_depth: 0,
///     rnr_retry_count: 7,
///     srq: false,
/// };
///
/// let mut server = Cm::<8>::new(Config::new(1));
/// server.listen(1234)?;
/// let mut client = Cm::<8>::new(Config::new(2));
/// let conn = client.connect(0, &mut rng, &ConnectParams {
///     route: to_server,
///     port: 1234,
///     src_port: 40_000,
///     qp: qp(0x11),
///     path_mtu: Mtu::Mtu1024,
///     retry_count: 7,
///     traffic_class: 0,
///     hop_limit: 64,
///     private_data: b"hi",
/// })?;
///
/// // REQ: the server reports the request; the HCA creates an RTR QP from
/// // `request.qp`, posts receives, and accepts.
/// server.process_mad(0, &mut rng, to_client, &client.dispatch().unwrap().mad);
/// let Some(Event::ConnectRequest { conn: accepted, request }) = server.poll_event() else {
///     panic!("no request")
/// };
/// assert_eq!(request.qp.remote_qpn, Qpn::new(0x11));
/// server.accept(0, accepted, qp(0x40), b"welcome")?;
///
/// // REP: the client's HCA moves its QP to RTS with `reply.qp`, then sends the RTU.
/// client.process_mad(0, &mut rng, to_server, &server.dispatch().unwrap().mad);
/// let Some(Event::Reply { reply, .. }) = client.poll_event() else { panic!("no reply") };
/// assert_eq!(reply.qp.remote_qpn, Qpn::new(0x40));
/// client.ready_to_use(conn)?;
///
/// // RTU: established on both sides.
/// server.process_mad(0, &mut rng, to_client, &client.dispatch().unwrap().mad);
/// assert_eq!(server.poll_event(), Some(Event::Established { conn: accepted }));
/// # Ok::<(), roce::cm::CmError>(())
/// ```
#[derive(Debug)]
pub struct Cm<const N: usize = 0> {
    config: Config,
    /// Connection slots, allocated once ([`Cm::new`]: `N`,
    /// [`Cm::with_capacity`]: chosen at run time).
    conns: Vec<Conn>,
    listeners: heapless::Vec<u16, MAX_LISTENERS>,
    stateless: Deque<Outbound, STATELESS_QUEUE_LEN>,
    next_event_seq: u64,
    next_tx: usize,
    stats: Stats,
    /// Slots whose `tx_pending` is set: what [`Cm::dispatch`] visits.
    tx_ready: SlotSet,
    /// Slots with unreported events: what [`Cm::poll_event`] visits.
    with_events: SlotSet,
    /// Slots whose timer may be running (a slot is added whenever its timer
    /// is set, dropped by [`Cm::poll`] once it finds the timer gone): what
    /// [`Cm::poll`] and [`Cm::poll_at`] visit.
    armed: SlotSet,
    /// At most the earliest deadline of the `armed` slots' timers
    /// (`u64::MAX`: none): [`Cm::poll`] returns at once before it.
    earliest: u64,
}

/// A zeroed [`QpAttributes`] for vacant slots and fresh active connections.
const NO_QP: QpAttributes = QpAttributes {
    remote_qpn: Qpn::new(0),
    send_psn: Psn::new(0),
    path_mtu: Mtu::Mtu256,
    ack_timeout: 0,
    retry_count: 0,
    rnr_retry_count: 0,
    max_initiator_depth: 0,
    peer_initiator_depth: 0,
    traffic_class: 0,
    hop_limit: DEFAULT_HOP_LIMIT,
    remote_ca_guid: 0,
    peer_srq: false,
    selective_retransmission: false,
};

const UNSPECIFIED: Ipv4Address = Ipv4Address::new(0, 0, 0, 0);

const NO_ROUTE: Route = Route {
    local_ip: UNSPECIFIED,
    peer: super::PeerAddr {
        mac: EthernetAddress([0; 6]),
        ip: UNSPECIFIED,
    },
};

const NO_REQUEST: RequestInfo = RequestInfo {
    port: 0,
    cma_src_addr: UNSPECIFIED,
    cma_src_port: 0,
    cma_dst_addr: UNSPECIFIED,
    responder_resources: 0,
    initiator_depth: 0,
    flow_control: false,
};

fn valid_qpn(qpn: Qpn) -> bool {
    qpn != Qpn::SMI && qpn != Qpn::GSI
}

fn copy_private_data(bytes: &[u8]) -> PrivateData {
    // Every CM private-data area is ≤ 196 bytes except RTU/DREQ/DREP/MRA, which are
    // never delivered; truncate defensively instead of failing.
    let len = bytes.len().min(verbs::cm::MAX_PRIVATE_DATA_LEN);
    PrivateData::try_from_slice(&bytes[..len]).unwrap_or_default()
}

/// A fresh transaction ID in the Linux form `(random << 32) | comm ID` (the comm ID
/// as a little-endian host stores it, ib-cm.md §4.1).
fn fresh_tid<R: Random + ?Sized>(rng: &mut R, local_comm_id: u32) -> u64 {
    u64::from(rng.next_u32()) << 32 | u64::from(local_comm_id.swap_bytes())
}

fn emit_mad(buf: &mut [u8; MAD_LEN], transaction_id: u64, message: Message<'_>) {
    wire_cm::Repr {
        transaction_id,
        attribute_modifier: 0,
        message,
    }
    .emit(buf);
}

impl<const N: usize> Cm<N> {
    /// A CM with no connections and no listeners.
    ///
    /// # Panics
    /// At compile time if `N` is 0 or above 65 536.
    pub fn new(config: Config) -> Cm<N> {
        const { assert!(N > 0 && N <= 0x1_0000, "Cm capacity must be 1..=65536") };
        Self::with_capacity(config, N)
    }

    /// A CM with room for `connections` connections (clamped to
    /// 1..=65 536), allocated here, once; the type's `N` is not used
    /// (`Cm<0>`, the default).
    pub fn with_capacity(config: Config, connections: usize) -> Cm<N> {
        let connections = connections.clamp(1, 0x1_0000);
        let mut conns = Vec::with_capacity(connections);
        conns.resize_with(connections, || Conn::vacant(NO_ROUTE, NO_QP, NO_REQUEST));
        Cm {
            config,
            conns,
            listeners: heapless::Vec::new(),
            stateless: Deque::new(),
            next_event_seq: 0,
            next_tx: 0,
            stats: Stats::default(),
            tx_ready: SlotSet::with_capacity(connections),
            with_events: SlotSet::with_capacity(connections),
            armed: SlotSet::with_capacity(connections),
            earliest: u64::MAX,
        }
    }

    /// Bytes one connection slot takes ([`Cm::with_capacity`] allocates
    /// this many per connection).
    pub const fn slot_bytes() -> usize {
        core::mem::size_of::<Conn>()
    }

    /// Connection slots.
    pub fn capacity(&self) -> usize {
        self.conns.len()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What was dropped or refused so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Handles one CM MAD as received on QP1 (the 256-byte UD payload). A MAD that
    /// does not parse as one of the seven CM messages is dropped silently and
    /// counted (checklist B); never panics.
    pub fn process_mad<R: Random + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        route: Route,
        mad: &[u8],
    ) {
        match wire_cm::Repr::parse(mad) {
            Ok(repr) => self.process(now, rng, route, &repr),
            Err(_) => self.stats.malformed += 1,
        }
    }

    /// Handles one parsed CM MAD received over `route`. Answers go to
    /// [`Cm::dispatch`], news to [`Cm::poll_event`]. Messages that match no
    /// connection or arrive in the wrong state are dropped (checklist B), except a
    /// DREQ, which is always answered (ib-cm.md §4.7).
    pub fn process<R: Random + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        route: Route,
        mad: &wire_cm::Repr<'_>,
    ) {
        let tid = mad.transaction_id;
        let handled = match &mad.message {
            Message::Req(req) => {
                self.on_req(now, rng, route, tid, req);
                true
            }
            Message::Rep(rep) => self.on_rep(route, rep),
            Message::Rtu(rtu) => self.on_rtu(route, rtu),
            Message::Mra(mra) => self.on_mra(now, route, mra),
            Message::Rej(rej) => self.on_rej(now, route, rej),
            Message::Dreq(dreq) => {
                self.on_dreq(now, route, tid, dreq);
                true
            }
            Message::Drep(drep) => self.on_drep(now, route, drep),
        };
        if !handled {
            self.stats.unmatched += 1;
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_footprint() {
        // One slot: a 256-byte MAD, two private-data buffers, state; documented on
        // `Cm`. Keep it under a kilobyte.
        let per_conn = core::mem::size_of::<Conn>();
        assert!(per_conn < 1024, "{per_conn} bytes per connection");
    }
}

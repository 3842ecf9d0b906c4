//! The connection manager: message handling, consumer calls and timers.
//!
//! ib-cm.md §4 (messages, duplicates, timeouts, timewait), §5 (RDMA CM service IDs
//! and the CMA header), §6 (the sequence with a Linux client and its timers);
//! checklist.md A.4 and B (REJ reasons, silent drops). See the module docs of
//! [`crate::cm`] for how the HCA drives it.

use alloc::vec::Vec;
use heapless::Deque;

use super::state::{Conn, EventKind, RequestInfo, Role, Timer};
use super::{
    ack_timeout, cm_timeout_ms, CmError, Config, ConnId, ConnectParams, ConnectRequest,
    DisconnectCause, Event, LocalQp, Outbound, PrivateData, QpAttributes, Random, RejectReason,
    Reply, Route, State, Stats, Waiting, MAD_LEN, MAX_LISTENERS, MILLISECOND, REQ_USER_DATA_LEN,
    STATELESS_QUEUE_LEN,
};
use crate::slots::SlotSet;
use crate::types::{Gid, Mtu, Pkey, Psn, Qkey, Qpn};
use crate::wire::cm::{
    self as wire_cm, rej, rep, req, DrepRepr, DreqRepr, Message, MessageKind, MraRepr, PathRepr,
    RejRepr, RepRepr, ReqRepr, RtuRepr, TransportType,
};
use crate::wire::rdma_cm::{self, PortSpace};
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

    // ----------------------------------------------------------------- listeners

    /// Accepts REQs for RDMA_PS_TCP `port` (service ID `0x0106 << 16 | port`,
    /// ib-cm.md §5.1).
    ///
    /// # Errors
    /// [`CmError::AlreadyListening`]; [`CmError::NoResources`] beyond
    /// [`MAX_LISTENERS`] ports.
    pub fn listen(&mut self, port: u16) -> Result<(), CmError> {
        if self.listeners.contains(&port) {
            return Err(CmError::AlreadyListening);
        }
        self.listeners.push(port).map_err(|_| CmError::NoResources)
    }

    /// Stops accepting REQs for `port`; existing connections are not affected.
    ///
    /// # Errors
    /// [`CmError::NotListening`].
    pub fn unlisten(&mut self, port: u16) -> Result<(), CmError> {
        let index = self
            .listeners
            .iter()
            .position(|&p| p == port)
            .ok_or(CmError::NotListening)?;
        self.listeners.swap_remove(index);
        Ok(())
    }

    /// Whether REQs for `port` are accepted.
    pub fn is_listening(&self, port: u16) -> bool {
        self.listeners.contains(&port)
    }

    // ----------------------------------------------------------------- lookups

    fn conn_id(&self, index: usize) -> ConnId {
        // `index < capacity ≤ 65536`: the truncation keeps all of it.
        ConnId(u32::from(self.conns[index].generation) << 16 | index as u32)
    }

    fn index_of(&self, conn: ConnId) -> Result<usize, CmError> {
        let index = (conn.0 & 0xffff) as usize;
        let generation = (conn.0 >> 16) as u16;
        match self.conns.get(index) {
            Some(c) if c.generation == generation && c.is_live() => Ok(index),
            _ => Err(CmError::UnknownConnection),
        }
    }

    /// The CM state of a connection, or `None` if the id names no live connection.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.index_of(conn).ok().map(|i| self.conns[i].state)
    }

    /// Our QPN on a connection, once known (after `accept` / `connect`).
    pub fn local_qpn(&self, conn: ConnId) -> Option<Qpn> {
        self.index_of(conn)
            .ok()
            .and_then(|i| self.conns[i].local_qpn)
    }

    /// Whether a connection (in any state, timewait included) still holds `qpn`:
    /// the HCA must not give that QPN to a new QP (ib-cm.md §4.9).
    pub fn qpn_in_use(&self, qpn: Qpn) -> bool {
        self.conns
            .iter()
            .any(|c| c.is_live() && c.local_qpn == Some(qpn))
    }

    /// The connection that uses our QPN `qpn` (not in timewait), for
    /// [`Cm::notify_data_received`].
    pub fn conn_by_qpn(&self, qpn: Qpn) -> Option<ConnId> {
        self.conns
            .iter()
            .position(|c| c.is_live() && c.state != State::Timewait && c.local_qpn == Some(qpn))
            .map(|i| self.conn_id(i))
    }

    fn find_by_ids(&self, local: u32, remote: u32) -> Option<usize> {
        self.conns.iter().position(|c| {
            c.is_live() && local != 0 && c.local_comm_id == local && c.remote_comm_id == remote
        })
    }

    fn find_local(&self, local: u32) -> Option<usize> {
        self.conns
            .iter()
            .position(|c| c.is_live() && local != 0 && c.local_comm_id == local)
    }

    fn fresh_comm_id<R: Random + ?Sized>(&self, rng: &mut R) -> Option<u32> {
        (0..COMM_ID_ATTEMPTS).find_map(|_| {
            let id = rng.next_u32();
            let taken = id == 0
                || self
                    .conns
                    .iter()
                    .any(|c| c.is_live() && c.local_comm_id == id);
            (!taken).then_some(id)
        })
    }

    /// A free slot; when none is, the timewait connection closest to its
    /// end is ended early to make one (timewait only guards against stray
    /// packets of a connection that is gone, a full table must not refuse
    /// new connections for it). Counted in [`Stats::timewaits_cut`].
    fn vacant_slot(&mut self) -> Option<usize> {
        if let Some(index) = self.conns.iter().position(Conn::is_reusable) {
            return Some(index);
        }
        let index = self
            .conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state == State::Timewait && !c.tx_pending && c.events.is_empty())
            .min_by_key(|(_, c)| c.timer.map_or(0, |t| t.deadline))
            .map(|(index, _)| index)?;
        let conn = &mut self.conns[index];
        conn.state = State::Idle;
        conn.timer = None;
        self.stats.timewaits_cut += 1;
        Some(index)
    }

    // ----------------------------------------------------------------- events

    fn push_event(&mut self, index: usize, kind: EventKind) {
        let seq = self.next_event_seq;
        self.next_event_seq += 1;
        // A lifetime produces at most three events and a slot is reused only once
        // its queue is empty, so this cannot overflow; if it ever did, dropping the
        // event is the bounded choice.
        let pushed = self.conns[index].events.push_back((seq, kind));
        debug_assert!(pushed.is_ok(), "more than EVENTS_PER_CONN events");
        self.with_events.insert(index);
    }

    /// Whether [`Cm::poll_event`] may have an event to report (O(1); false
    /// means it has none).
    pub fn has_events(&self) -> bool {
        !self.with_events.is_empty()
    }

    /// Whether [`Cm::dispatch`] may have a MAD to send (O(1); false means
    /// it has none).
    pub fn has_output(&self) -> bool {
        !self.stateless.is_empty() || !self.tx_ready.is_empty()
    }

    /// The oldest unreported event, or `None`. Bounded: one scan of the
    /// slots that have events (`None` at once when none has).
    pub fn poll_event(&mut self) -> Option<Event> {
        let mut oldest: Option<(u64, usize)> = None;
        let mut next = self.with_events.next_from(0);
        while let Some(index) = next {
            next = self.with_events.next_from(index + 1);
            match self.conns.get(index).and_then(|c| c.events.front()) {
                Some(&(seq, _)) => {
                    if oldest.is_none_or(|(first, _)| seq < first) {
                        oldest = Some((seq, index));
                    }
                }
                None => {
                    self.with_events.remove(index);
                }
            }
        }
        let (_, index) = oldest?;
        let conn = self.conn_id(index);
        let record = &mut self.conns[index];
        let (_, kind) = record.events.pop_front()?;
        if record.events.is_empty() {
            self.with_events.remove(index);
        }
        Some(match kind {
            EventKind::ConnectRequest => Event::ConnectRequest {
                conn,
                request: ConnectRequest {
                    route: record.route,
                    port: record.request.port,
                    cma_src_addr: record.request.cma_src_addr,
                    cma_src_port: record.request.cma_src_port,
                    cma_dst_addr: record.request.cma_dst_addr,
                    qp: record.qp,
                    private_data: record.peer_private_data.clone(),
                },
            },
            EventKind::Reply => Event::Reply {
                conn,
                reply: Reply {
                    qp: record.qp,
                    private_data: record.peer_private_data.clone(),
                },
            },
            EventKind::Established => Event::Established { conn },
            EventKind::Rejected(reason) => Event::Rejected {
                conn,
                reason,
                private_data: record.reject_private_data.clone(),
            },
            EventKind::TimedOut(waiting_for) => Event::TimedOut { conn, waiting_for },
            EventKind::Disconnected(cause) => Event::Disconnected { conn, cause },
        })
    }

    // ----------------------------------------------------------------- output

    fn send(&mut self, index: usize, transaction_id: u64, message: Message<'_>) {
        let conn = &mut self.conns[index];
        emit_mad(&mut conn.tx, transaction_id, message);
        self.mark_tx(index);
    }

    /// Queues slot `index`'s last MAD (`tx`) for [`Cm::dispatch`].
    fn mark_tx(&mut self, index: usize) {
        if let Some(conn) = self.conns.get_mut(index) {
            conn.tx_pending = true;
            self.tx_ready.insert(index);
        }
    }

    fn send_stateless(&mut self, route: Route, transaction_id: u64, message: Message<'_>) {
        self.send_stateless_with(route, 0, DEFAULT_HOP_LIMIT, transaction_id, message);
    }

    fn send_stateless_with(
        &mut self,
        route: Route,
        traffic_class: u8,
        hop_limit: u8,
        transaction_id: u64,
        message: Message<'_>,
    ) {
        let mut out = Outbound {
            route,
            traffic_class,
            hop_limit,
            mad: [0; MAD_LEN],
        };
        emit_mad(&mut out.mad, transaction_id, message);
        if self.stateless.push_back(out).is_err() {
            self.stats.stateless_dropped += 1;
        }
    }

    /// The next MAD to send, or `None`: the slots with one are served
    /// round robin. Bounded: one scan of the slots with a MAD to send
    /// (`None` at once when there is none).
    pub fn dispatch(&mut self) -> Option<Outbound> {
        if let Some(out) = self.stateless.pop_front() {
            return Some(out);
        }
        let slots = self.conns.len();
        while let Some(index) = self.tx_ready.next_cyclic(self.next_tx) {
            self.tx_ready.remove(index);
            let Some(conn) = self.conns.get_mut(index) else {
                continue;
            };
            if conn.tx_pending {
                conn.tx_pending = false;
                self.next_tx = (index + 1) % slots;
                return Some(Outbound {
                    route: conn.route,
                    traffic_class: conn.qp.traffic_class,
                    hop_limit: conn.qp.hop_limit,
                    mad: conn.tx,
                });
            }
        }
        None
    }

    // ----------------------------------------------------------------- timers

    /// When [`Cm::poll`] next has work (a retransmission, a timeout, the end of a
    /// timewait), or `None`. Outbound MADs are not timers: drain [`Cm::dispatch`]
    /// after every call.
    pub fn poll_at(&self) -> Option<u64> {
        if self.earliest == u64::MAX {
            return None;
        }
        self.armed
            .iter()
            .filter_map(|index| self.conns.get(index))
            .filter(|c| c.is_live())
            .filter_map(|c| c.timer.map(|t| t.deadline))
            .min()
    }

    /// Runs the timers due at `now`: retransmits REQ/REP/DREQ, gives up after the
    /// last retry (REJ reason 4 / timewait, with an event), ends timewaits and
    /// rejects requests the consumer left unanswered. Bounded: one pass over the
    /// slots whose timer runs, none before the earliest deadline. Returns whether
    /// anything happened.
    pub fn poll(&mut self, now: u64) -> bool {
        if now < self.earliest {
            return false;
        }
        let mut busy = false;
        // Recomputed over the timers left (and those `expire` sets).
        self.earliest = u64::MAX;
        let mut next = self.armed.next_from(0);
        while let Some(index) = next {
            next = self.armed.next_from(index + 1);
            let Some(conn) = self.conns.get(index) else {
                self.armed.remove(index);
                continue;
            };
            let Some(timer) = conn.timer else {
                self.armed.remove(index);
                continue;
            };
            if !conn.is_live() || timer.deadline > now {
                self.earliest = self.earliest.min(timer.deadline);
                continue;
            }
            busy = true;
            self.expire(now, index, timer);
            match self.conns[index].timer {
                Some(timer) => self.earliest = self.earliest.min(timer.deadline),
                None => {
                    self.armed.remove(index);
                }
            }
        }
        busy
    }

    /// Sets slot `index`'s timer (the only way a timer starts).
    fn arm(&mut self, index: usize, timer: Timer) {
        if let Some(conn) = self.conns.get_mut(index) {
            conn.timer = Some(timer);
            self.armed.insert(index);
            self.earliest = self.earliest.min(timer.deadline);
        }
    }

    fn expire(&mut self, now: u64, index: usize, timer: Timer) {
        let state = self.conns[index].state;
        let retransmits = matches!(
            state,
            State::RepSent
                | State::MraRepRcvd
                | State::ReqSent
                | State::MraReqRcvd
                | State::DreqSent
        );
        if retransmits && timer.retries_left > 0 {
            self.mark_tx(index);
            self.arm(
                index,
                Timer {
                    deadline: now.saturating_add(timer.interval),
                    interval: timer.interval,
                    retries_left: timer.retries_left - 1,
                },
            );
            self.stats.retransmissions += 1;
            return;
        }
        match state {
            State::ReqRcvd | State::MraReqSent => {
                self.reject_request(index, RejectReason::Timeout, &[]);
                self.push_event(index, EventKind::TimedOut(Waiting::ForConsumer));
            }
            State::RepSent | State::MraRepRcvd => {
                self.send_timeout_rej(index);
                self.enter_timewait(now, index);
                self.push_event(index, EventKind::TimedOut(Waiting::ForReadyToUse));
            }
            State::ReqSent | State::MraReqRcvd => {
                self.send_timeout_rej(index);
                self.enter_timewait(now, index);
                self.push_event(index, EventKind::TimedOut(Waiting::ForReply));
            }
            State::DreqSent => {
                self.enter_timewait(now, index);
                self.report_down(index, DisconnectCause::TimedOut);
            }
            State::Timewait => {
                let conn = &mut self.conns[index];
                conn.state = State::Idle;
                conn.timer = None;
            }
            State::Idle | State::RepRcvd | State::Established => {
                self.conns[index].timer = None;
            }
        }
    }

    fn enter_timewait(&mut self, now: u64, index: usize) {
        let timewait = self.config.timewait;
        self.conns[index].state = State::Timewait;
        self.arm(
            index,
            Timer {
                deadline: now.saturating_add(timewait),
                interval: timewait,
                retries_left: 0,
            },
        );
    }

    fn report_down(&mut self, index: usize, cause: DisconnectCause) {
        if !self.conns[index].down_reported {
            self.conns[index].down_reported = true;
            self.push_event(index, EventKind::Disconnected(cause));
        }
    }

    fn start_timer(&mut self, now: u64, index: usize, interval: u64, retries: u8) {
        self.arm(
            index,
            Timer {
                deadline: now.saturating_add(interval),
                interval,
                retries_left: retries,
            },
        );
    }

    /// A peer-supplied timer exponent, bounded by the configuration, in ns.
    fn peer_timeout(&self, exponent: u8) -> u64 {
        cm_timeout_ms(exponent.min(self.config.max_peer_timeout_exponent)) * MILLISECOND
    }

    // ----------------------------------------------------------------- messages out

    /// REJ of a received REQ (Local Comm ID 0, Message Rejected = REQ, REQ TID) and
    /// back to idle: the peer never learned our QPN.
    fn reject_request(&mut self, index: usize, reason: RejectReason, private_data: &[u8]) {
        let conn = &self.conns[index];
        let (remote, tid) = (conn.remote_comm_id, conn.req_tid);
        self.send(
            index,
            tid,
            Message::Rej(RejRepr {
                local_comm_id: 0,
                remote_comm_id: remote,
                message_rejected: MessageKind::Req,
                reason,
                ari: &[],
                private_data,
            }),
        );
        let conn = &mut self.conns[index];
        conn.state = State::Idle;
        conn.timer = None;
    }

    /// REJ reason 4 (we gave up waiting): Message Rejected = other, ARI = our GUID,
    /// as Linux sends it (ib-cm.md §4.6).
    fn send_timeout_rej(&mut self, index: usize) {
        let guid = self.config.local_ca_guid.to_be_bytes();
        let conn = &self.conns[index];
        let (local, remote, tid) = (conn.local_comm_id, conn.remote_comm_id, conn.req_tid);
        self.send(
            index,
            tid,
            Message::Rej(RejRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                message_rejected: MessageKind::Other,
                reason: RejectReason::Timeout,
                ari: &guid,
                private_data: &[],
            }),
        );
    }

    /// REJ of a REQ that never got a connection slot, sent with the REQ's
    /// traffic class and hop limit (ib-cm.md §6.1).
    fn reject_stateless(
        &mut self,
        route: Route,
        tid: u64,
        req: &ReqRepr<'_>,
        reason: RejectReason,
    ) {
        self.stats.rejected_requests += 1;
        let path = &req.primary_path;
        let hop_limit = if path.hop_limit == 0 {
            DEFAULT_HOP_LIMIT
        } else {
            path.hop_limit
        };
        self.send_stateless_with(
            route,
            path.traffic_class,
            hop_limit,
            tid,
            Message::Rej(RejRepr {
                local_comm_id: 0,
                remote_comm_id: req.local_comm_id,
                message_rejected: MessageKind::Req,
                reason,
                ari: &[],
                private_data: &[],
            }),
        );
    }

    fn send_dreq<R: Random + ?Sized>(&mut self, now: u64, rng: &mut R, index: usize) {
        let conn = &self.conns[index];
        let (local, remote, qpn) = (conn.local_comm_id, conn.remote_comm_id, conn.qp.remote_qpn);
        let interval = conn.cm_timeout;
        let tid = fresh_tid(rng, local);
        self.send(
            index,
            tid,
            Message::Dreq(DreqRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                remote_qpn: qpn,
                private_data: &[],
            }),
        );
        self.conns[index].state = State::DreqSent;
        let retries = self.config.max_cm_retries;
        self.start_timer(now, index, interval, retries);
    }

    fn send_drep(&mut self, index: usize, tid: u64) {
        let conn = &self.conns[index];
        let (local, remote) = (conn.local_comm_id, conn.remote_comm_id);
        self.send(
            index,
            tid,
            Message::Drep(DrepRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: &[],
            }),
        );
    }

    // ----------------------------------------------------------------- input

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
            Message::Rep(rep) => self.on_rep(rep),
            Message::Rtu(rtu) => self.on_rtu(rtu),
            Message::Mra(mra) => self.on_mra(now, mra),
            Message::Rej(rej) => self.on_rej(now, rej),
            Message::Dreq(dreq) => {
                self.on_dreq(now, route, tid, dreq);
                true
            }
            Message::Drep(drep) => self.on_drep(now, drep),
        };
        if !handled {
            self.stats.unmatched += 1;
        }
    }

    fn on_req<R: Random + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        route: Route,
        tid: u64,
        req: &ReqRepr<'_>,
    ) {
        // Duplicate: same client comm ID and CA GUID (ib-cm.md §4.8).
        if let Some(index) = self.conns.iter().position(|c| {
            c.is_live()
                && c.role == Role::Passive
                && c.remote_comm_id == req.local_comm_id
                && c.qp.remote_ca_guid == req.local_ca_guid
        }) {
            match self.conns[index].state {
                // Re-send the MRA or the REP (the REP also has its own timer).
                State::MraReqSent | State::RepSent | State::MraRepRcvd => {
                    self.mark_tx(index);
                }
                State::Timewait => {
                    let local = self.conns[index].local_comm_id;
                    self.stats.rejected_requests += 1;
                    self.send_stateless(
                        route,
                        tid,
                        Message::Rej(RejRepr {
                            local_comm_id: local,
                            remote_comm_id: req.local_comm_id,
                            message_rejected: MessageKind::Req,
                            reason: RejectReason::StaleConnection,
                            ari: &[],
                            private_data: &[],
                        }),
                    );
                }
                // Waiting for the consumer, or past the handshake: ignore.
                _ => {}
            }
            return;
        }

        let reject = |cm: &mut Self, reason| cm.reject_stateless(route, tid, req, reason);

        let Some(port) = rdma_cm::tcp_port(req.service_id).filter(|p| self.is_listening(*p)) else {
            return reject(self, RejectReason::InvalidServiceId);
        };
        if req.transport_type != TransportType::Rc {
            return reject(self, RejectReason::InvalidTransportType);
        }
        let max_mtu = self.config.max_path_mtu.bytes().unwrap_or(0);
        if req.path_mtu.bytes().is_none_or(|bytes| bytes > max_mtu) {
            return reject(self, RejectReason::InvalidMtu);
        }
        if !valid_qpn(req.local_qpn) {
            return reject(self, RejectReason::Unsupported);
        }
        let cma = match rdma_cm::Packet::new_checked(req.private_data)
            .and_then(|packet| rdma_cm::Repr::parse(&packet))
        {
            Ok(cma) => cma,
            // What a Linux rdma_cm listener answers to a bad CMA header.
            Err(_) => return reject(self, RejectReason::ConsumerDefined),
        };

        // Stale: the client's (GUID, QPN) belongs to a live connection: REJ 10 to the
        // new REQ and DREQ on the old connection (ib-cm.md §4.8, checklist B).
        if let Some(old) = self.conns.iter().position(|c| {
            c.is_live()
                && c.role == Role::Passive
                && c.state != State::Timewait
                && c.qp.remote_ca_guid == req.local_ca_guid
                && c.qp.remote_qpn == req.local_qpn
        }) {
            reject(self, RejectReason::StaleConnection);
            match self.conns[old].state {
                State::RepSent | State::MraRepRcvd | State::Established => {
                    self.send_dreq(now, rng, old);
                    self.report_down(old, DisconnectCause::Stale);
                }
                State::ReqRcvd | State::MraReqSent => {
                    self.reject_request(old, RejectReason::StaleConnection, &[]);
                    self.push_event(old, EventKind::Rejected(RejectReason::StaleConnection));
                }
                _ => {}
            }
            return;
        }

        let Some(index) = self.vacant_slot() else {
            return reject(self, RejectReason::NoResources);
        };
        let Some(local_comm_id) = self.fresh_comm_id(rng) else {
            return reject(self, RejectReason::NoResources);
        };

        let path = &req.primary_path;
        let qp = QpAttributes {
            remote_qpn: req.local_qpn,
            send_psn: req.starting_psn,
            path_mtu: req.path_mtu,
            ack_timeout: path.local_ack_timeout,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            max_initiator_depth: req.responder_resources,
            peer_initiator_depth: req.initiator_depth,
            traffic_class: path.traffic_class,
            hop_limit: if path.hop_limit == 0 {
                DEFAULT_HOP_LIMIT
            } else {
                path.hop_limit
            },
            remote_ca_guid: req.local_ca_guid,
            peer_srq: req.srq,
            selective_retransmission: req.brick_selective && self.config.selective_retransmission,
        };
        let user_data = req
            .private_data
            .get(rdma_cm::HEADER_LEN..)
            .unwrap_or_default();
        let cm_timeout = self.peer_timeout(req.local_cm_response_timeout);
        let accept_timeout = self.config.accept_timeout;

        let conn = &mut self.conns[index];
        conn.generation = conn.generation.wrapping_add(1);
        conn.state = State::ReqRcvd;
        conn.role = Role::Passive;
        conn.route = route;
        conn.local_comm_id = local_comm_id;
        conn.remote_comm_id = req.local_comm_id;
        conn.req_tid = tid;
        conn.local_qpn = None;
        conn.qp = qp;
        conn.request = RequestInfo {
            port,
            cma_src_addr: cma.src_addr,
            cma_src_port: cma.src_port,
            cma_dst_addr: cma.dst_addr,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            flow_control: req.end_to_end_flow_control,
        };
        conn.cm_timeout = cm_timeout;
        conn.cm_retries = req.max_cm_retries;
        conn.tx_pending = false;
        conn.events.clear();
        conn.peer_private_data =
            copy_private_data(&user_data[..user_data.len().min(REQ_USER_DATA_LEN)]);
        conn.reject_private_data = PrivateData::new();
        conn.established = false;
        conn.down_reported = false;
        self.start_timer(now, index, accept_timeout, 0);
        self.push_event(index, EventKind::ConnectRequest);
    }

    fn on_rep(&mut self, rep: &RepRepr<'_>) -> bool {
        let Some(index) = self.find_local(rep.remote_comm_id) else {
            return false;
        };
        let conn = &mut self.conns[index];
        if conn.role != Role::Active {
            return false;
        }
        match conn.state {
            State::ReqSent | State::MraReqRcvd => {
                if !valid_qpn(rep.local_qpn) || rep.local_comm_id == 0 {
                    return false;
                }
                conn.remote_comm_id = rep.local_comm_id;
                conn.qp.remote_qpn = rep.local_qpn;
                conn.qp.send_psn = rep.starting_psn;
                conn.qp.ack_timeout =
                    ack_timeout(rep.target_ack_delay, self.config.packet_life_time);
                conn.qp.rnr_retry_count = rep.rnr_retry_count;
                conn.qp.max_initiator_depth =
                    conn.qp.max_initiator_depth.min(rep.responder_resources);
                conn.qp.peer_initiator_depth = rep.initiator_depth;
                conn.qp.remote_ca_guid = rep.local_ca_guid;
                conn.qp.peer_srq = rep.srq;
                conn.qp.selective_retransmission =
                    rep.brick_selective && self.config.selective_retransmission;
                conn.peer_private_data = copy_private_data(rep.private_data);
                conn.state = State::RepRcvd;
                conn.timer = None;
                self.push_event(index, EventKind::Reply);
                true
            }
            // Our RTU was lost: the duplicate REP asks for it again (ib-cm.md §4.4).
            State::Established if conn.remote_comm_id == rep.local_comm_id => {
                self.mark_tx(index);
                true
            }
            // Duplicate while the HCA sets the QP up: nothing to add.
            State::RepRcvd => true,
            _ => false,
        }
    }

    fn establish(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        conn.state = State::Established;
        conn.timer = None;
        if !conn.established {
            conn.established = true;
            self.push_event(index, EventKind::Established);
        }
    }

    fn on_rtu(&mut self, rtu: &RtuRepr<'_>) -> bool {
        let Some(index) = self.find_by_ids(rtu.remote_comm_id, rtu.local_comm_id) else {
            return false;
        };
        match self.conns[index].state {
            State::RepSent | State::MraRepRcvd => {
                self.establish(index);
                true
            }
            // Duplicate RTU (ib-cm.md §4.8): ignore.
            State::Established => true,
            _ => false,
        }
    }

    fn on_mra(&mut self, now: u64, mra: &MraRepr<'_>) -> bool {
        let Some(index) = self.find_local(mra.remote_comm_id) else {
            return false;
        };
        let stretch = self.peer_timeout(mra.service_timeout);
        let conn = &self.conns[index];
        match (conn.state, mra.message_mraed) {
            (State::ReqSent | State::MraReqRcvd, MessageKind::Req) => {
                let retries = conn.timer.map_or(0, |t| t.retries_left);
                self.conns[index].state = State::MraReqRcvd;
                self.start_timer(now, index, stretch.saturating_add(MRA_REQ_SLACK), retries);
                true
            }
            (State::RepSent | State::MraRepRcvd, MessageKind::Rep)
                if conn.remote_comm_id == mra.local_comm_id =>
            {
                let retries = conn.timer.map_or(0, |t| t.retries_left);
                let interval = stretch.saturating_add(conn.cm_timeout);
                self.conns[index].state = State::MraRepRcvd;
                self.start_timer(now, index, interval, retries);
                true
            }
            _ => false,
        }
    }

    fn on_rej(&mut self, now: u64, rej: &RejRepr<'_>) -> bool {
        // How Linux finds the rejected connection (ib-cm.md §4.6): a timeout REJ by
        // (ARI GUID, sender's comm ID); a REJ of a REQ by our comm ID alone; any
        // other by both comm IDs.
        let found = if rej.reason == RejectReason::Timeout && rej.ari.len() >= 8 {
            let mut guid = [0u8; 8];
            guid.copy_from_slice(&rej.ari[..8]);
            let guid = u64::from_be_bytes(guid);
            self.conns.iter().position(|c| {
                c.is_live()
                    && rej.local_comm_id != 0
                    && c.remote_comm_id == rej.local_comm_id
                    && c.qp.remote_ca_guid == guid
            })
        } else {
            None
        };
        let found = found.or_else(|| {
            if rej.message_rejected == MessageKind::Req {
                self.find_local(rej.remote_comm_id)
                    .filter(|&i| matches!(self.conns[i].state, State::ReqSent | State::MraReqRcvd))
            } else {
                self.find_by_ids(rej.remote_comm_id, rej.local_comm_id)
            }
        });
        let Some(index) = found else {
            return false;
        };
        let state = self.conns[index].state;
        let next = match state {
            State::ReqRcvd | State::MraReqSent => State::Idle,
            State::ReqSent | State::MraReqRcvd if rej.reason != RejectReason::StaleConnection => {
                State::Idle
            }
            State::ReqSent
            | State::MraReqRcvd
            | State::RepSent
            | State::MraRepRcvd
            | State::RepRcvd => State::Timewait,
            _ => return false,
        };
        self.conns[index].reject_private_data = copy_private_data(rej.private_data);
        if next == State::Timewait {
            self.enter_timewait(now, index);
        } else {
            let conn = &mut self.conns[index];
            conn.state = State::Idle;
            conn.timer = None;
        }
        self.push_event(index, EventKind::Rejected(rej.reason));
        true
    }

    fn on_dreq(&mut self, now: u64, route: Route, tid: u64, dreq: &DreqRepr<'_>) {
        let Some(index) = self.find_by_ids(dreq.remote_comm_id, dreq.local_comm_id) else {
            // Unknown IDs: answer anyway with the IDs swapped (ib-cm.md §4.7).
            self.stats.unmatched += 1;
            return self.send_stateless(
                route,
                tid,
                Message::Drep(DrepRepr {
                    local_comm_id: dreq.remote_comm_id,
                    remote_comm_id: dreq.local_comm_id,
                    private_data: &[],
                }),
            );
        };
        if self.conns[index].local_qpn != Some(dreq.remote_qpn) {
            // Not addressed to our QP: silently ignored, as Linux does.
            self.stats.unmatched += 1;
            return;
        }
        match self.conns[index].state {
            State::RepSent
            | State::MraRepRcvd
            | State::RepRcvd
            | State::Established
            | State::DreqSent => {
                self.send_drep(index, tid);
                self.enter_timewait(now, index);
                self.report_down(index, DisconnectCause::PeerRequest);
            }
            // Our DREP was lost: answer the retransmitted DREQ again.
            State::Timewait => self.send_drep(index, tid),
            _ => self.stats.unmatched += 1,
        }
    }

    fn on_drep(&mut self, now: u64, drep: &DrepRepr<'_>) -> bool {
        let Some(index) = self.find_by_ids(drep.remote_comm_id, drep.local_comm_id) else {
            return false;
        };
        if self.conns[index].state != State::DreqSent {
            return false;
        }
        self.enter_timewait(now, index);
        self.report_down(index, DisconnectCause::Reply);
        true
    }

    // ----------------------------------------------------------------- consumer calls

    /// Passive: accepts a requested connection. The QP must already be able to
    /// receive (RTR, receives posted: a Linux client may send right after its RTU,
    /// ib-cm.md §5.4). Sends the REP (TID = the REQ's) and retransmits it every
    /// REQ Local CM Response Timeout, up to REQ Max CM Retries times, until the RTU
    /// or [`Cm::notify_data_received`]. Responder resources and initiator depth are
    /// clamped to what the REQ allows (checklist A.4); the result says what was sent.
    ///
    /// # Errors
    /// [`CmError::UnknownConnection`], [`CmError::InvalidState`] (not waiting for
    /// the consumer), [`CmError::PrivateDataTooLong`] (above 196 bytes),
    /// [`CmError::InvalidParameter`] (QPN 0 or 1).
    pub fn accept(
        &mut self,
        now: u64,
        conn: ConnId,
        local: LocalQp,
        private_data: &[u8],
    ) -> Result<Accepted, CmError> {
        let index = self.index_of(conn)?;
        if private_data.len() > rep::PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        if !valid_qpn(local.qpn) {
            return Err(CmError::InvalidParameter);
        }
        let record = &self.conns[index];
        if !matches!(record.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::InvalidState);
        }
        let accepted = Accepted {
            responder_resources: local
                .responder_resources
                .min(record.request.initiator_depth),
            initiator_depth: local
                .initiator_depth
                .min(record.request.responder_resources),
        };
        let repr = RepRepr {
            local_comm_id: record.local_comm_id,
            remote_comm_id: record.remote_comm_id,
            local_qkey: Qkey(0),
            local_qpn: local.qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: local.starting_psn,
            responder_resources: accepted.responder_resources,
            initiator_depth: accepted.initiator_depth,
            target_ack_delay: self.config.target_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: record.request.flow_control,
            rnr_retry_count: local.rnr_retry_count.min(7),
            srq: local.srq,
            brick_selective: record.qp.selective_retransmission,
            local_ca_guid: self.config.local_ca_guid,
            private_data,
        };
        let (tid, interval, retries) = (record.req_tid, record.cm_timeout, record.cm_retries);
        self.send(index, tid, Message::Rep(repr));
        let record = &mut self.conns[index];
        record.local_qpn = Some(local.qpn);
        record.qp.max_initiator_depth = accepted.initiator_depth;
        record.state = State::RepSent;
        self.start_timer(now, index, interval, retries);
        Ok(accepted)
    }

    /// Refuses a connection: a requested one (REJ of the REQ; reason 28 "consumer
    /// defined" is what `rdma_reject()` sends) or, on the active side, one whose REP
    /// the HCA cannot use (REJ of the REP, then timewait).
    ///
    /// # Errors
    /// [`CmError::UnknownConnection`], [`CmError::InvalidState`],
    /// [`CmError::PrivateDataTooLong`] (above 148 bytes).
    pub fn reject(
        &mut self,
        now: u64,
        conn: ConnId,
        reason: RejectReason,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let index = self.index_of(conn)?;
        if private_data.len() > rej::PRIVATE_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        match self.conns[index].state {
            State::ReqRcvd | State::MraReqSent => {
                self.reject_request(index, reason, private_data);
                Ok(())
            }
            State::RepRcvd => {
                let record = &self.conns[index];
                let repr = RejRepr {
                    local_comm_id: record.local_comm_id,
                    remote_comm_id: record.remote_comm_id,
                    message_rejected: MessageKind::Rep,
                    reason,
                    ari: &[],
                    private_data,
                };
                let tid = record.req_tid;
                self.send(index, tid, Message::Rej(repr));
                self.enter_timewait(now, index);
                Ok(())
            }
            _ => Err(CmError::InvalidState),
        }
    }

    /// Passive: asks the client for more time before accepting: MRA(REQ) with the
    /// given service timeout (IB time exponent; ib-cm.md §4.5). Restarts the
    /// consumer's accept timer with at least that long.
    ///
    /// # Errors
    /// [`CmError::UnknownConnection`], [`CmError::InvalidState`].
    pub fn delay(&mut self, now: u64, conn: ConnId, service_timeout: u8) -> Result<(), CmError> {
        let index = self.index_of(conn)?;
        let record = &self.conns[index];
        if !matches!(record.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::InvalidState);
        }
        let service_timeout = service_timeout.min(31);
        let repr = MraRepr {
            local_comm_id: record.local_comm_id,
            remote_comm_id: record.remote_comm_id,
            message_mraed: MessageKind::Req,
            service_timeout,
            private_data: &[],
        };
        let tid = record.req_tid;
        self.send(index, tid, Message::Mra(repr));
        self.conns[index].state = State::MraReqSent;
        let wait = self
            .config
            .accept_timeout
            .max(cm_timeout_ms(service_timeout) * MILLISECOND);
        self.start_timer(now, index, wait, 0);
        Ok(())
    }

    /// Passive: the HCA saw the first valid RC packet on the connection's QP before
    /// the RTU: that establishes the connection (ib-cm.md §4.8, §5.4). A no-op in
    /// any other state.
    ///
    /// # Errors
    /// [`CmError::UnknownConnection`].
    pub fn notify_data_received(&mut self, conn: ConnId) -> Result<(), CmError> {
        let index = self.index_of(conn)?;
        if matches!(self.conns[index].state, State::RepSent | State::MraRepRcvd) {
            self.establish(index);
        }
        Ok(())
    }

    /// Active: opens a connection to an RDMA CM listener: sends a REQ shaped like a
    /// Linux rdma_cm client's (ib-cm.md §4.2: service ID, CMA header, IPv4-mapped
    /// GIDs, flow label, CM timeouts 20, 15 retries), retransmitted every
    /// `2 × life time + response timeout` (6144 ms by default) until the REP,
    /// a REJ, or the last retry ([`Event::TimedOut`]).
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] (above 56 bytes), [`CmError::InvalidParameter`]
    /// (QPN 0/1, reserved MTU or one above [`Config::max_path_mtu`]), [`CmError::NoResources`] (no free slot or comm ID).
    pub fn connect<R: Random + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        params: &ConnectParams<'_>,
    ) -> Result<ConnId, CmError> {
        if params.private_data.len() > REQ_USER_DATA_LEN {
            return Err(CmError::PrivateDataTooLong);
        }
        let max_mtu = self.config.max_path_mtu.bytes().unwrap_or(0);
        if !valid_qpn(params.qp.qpn) || params.path_mtu.bytes().is_none_or(|b| b > max_mtu) {
            return Err(CmError::InvalidParameter);
        }
        let index = self.vacant_slot().ok_or(CmError::NoResources)?;
        let local_comm_id = self.fresh_comm_id(rng).ok_or(CmError::NoResources)?;
        let tid = fresh_tid(rng, local_comm_id);
        let config = self.config;
        let hop_limit = if params.hop_limit == 0 {
            DEFAULT_HOP_LIMIT
        } else {
            params.hop_limit
        };
        let local_ack_timeout = ack_timeout(config.local_ca_ack_delay, config.packet_life_time);

        let mut private_data = [0u8; req::PRIVATE_DATA_LEN];
        {
            let mut header = rdma_cm::Packet::new_unchecked(&mut private_data[..]);
            rdma_cm::Repr {
                src_port: params.src_port,
                src_addr: params.route.local_ip,
                dst_addr: params.route.peer.ip,
            }
            .emit(&mut header);
        }
        private_data[rdma_cm::HEADER_LEN..][..params.private_data.len()]
            .copy_from_slice(params.private_data);

        let primary_path = PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: Gid::from_ipv4(params.route.local_ip),
            remote_gid: Gid::from_ipv4(params.route.peer.ip),
            flow_label: (u32::from(params.src_port) * 31 + u32::from(params.port)) & 0xf_ffff,
            packet_rate: 0,
            traffic_class: params.traffic_class,
            hop_limit,
            sl: 0,
            subnet_local: hop_limit <= 1,
            local_ack_timeout,
        };
        let retry_count = params.retry_count.min(7);
        let repr = ReqRepr {
            local_comm_id,
            vendor_id: 0,
            service_id: rdma_cm::service_id(PortSpace::Tcp, params.port),
            local_ca_guid: config.local_ca_guid,
            local_qkey: Qkey(0),
            local_qpn: params.qp.qpn,
            responder_resources: params.qp.responder_resources,
            local_eecn: 0,
            initiator_depth: params.qp.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: config.cm_response_timeout.min(31),
            transport_type: TransportType::Rc,
            end_to_end_flow_control: false,
            starting_psn: params.qp.starting_psn,
            local_cm_response_timeout: config.cm_response_timeout.min(31),
            retry_count,
            pkey: Pkey::DEFAULT,
            path_mtu: params.path_mtu,
            rdc_exists: false,
            rnr_retry_count: params.qp.rnr_retry_count.min(7),
            max_cm_retries: config.max_cm_retries.min(15),
            srq: params.qp.srq,
            extended_transport_type: 0,
            brick_selective: config.selective_retransmission,
            primary_path,
            alternate_path: PathRepr::default(),
            private_data: &private_data,
        };

        let interval = (2 * cm_timeout_ms(config.packet_life_time)
            + cm_timeout_ms(config.cm_response_timeout))
            * MILLISECOND;
        let conn = &mut self.conns[index];
        conn.generation = conn.generation.wrapping_add(1);
        conn.state = State::ReqSent;
        conn.role = Role::Active;
        conn.route = params.route;
        conn.local_comm_id = local_comm_id;
        conn.remote_comm_id = 0;
        conn.req_tid = tid;
        conn.local_qpn = Some(params.qp.qpn);
        conn.qp = QpAttributes {
            path_mtu: params.path_mtu,
            retry_count,
            max_initiator_depth: params.qp.initiator_depth,
            traffic_class: params.traffic_class,
            hop_limit,
            ..NO_QP
        };
        conn.request = RequestInfo {
            port: params.port,
            cma_src_addr: params.route.local_ip,
            cma_src_port: params.src_port,
            cma_dst_addr: params.route.peer.ip,
            responder_resources: params.qp.responder_resources,
            initiator_depth: params.qp.initiator_depth,
            flow_control: false,
        };
        conn.cm_timeout = interval;
        conn.cm_retries = config.max_cm_retries;
        conn.events.clear();
        conn.peer_private_data = PrivateData::new();
        conn.reject_private_data = PrivateData::new();
        conn.established = false;
        conn.down_reported = false;
        self.send(index, tid, Message::Req(repr));
        self.start_timer(now, index, interval, config.max_cm_retries);
        Ok(self.conn_id(index))
    }

    /// Active: the QP is in RTS with the [`Event::Reply`] attributes: sends the RTU;
    /// the connection is established (Linux reports ESTABLISHED here too, ib-cm.md
    /// §5.4). A duplicate REP later re-sends the RTU.
    ///
    /// # Errors
    /// [`CmError::UnknownConnection`], [`CmError::InvalidState`] (no REP pending).
    pub fn ready_to_use(&mut self, conn: ConnId) -> Result<(), CmError> {
        let index = self.index_of(conn)?;
        let record = &self.conns[index];
        if record.state != State::RepRcvd {
            return Err(CmError::InvalidState);
        }
        let repr = RtuRepr {
            local_comm_id: record.local_comm_id,
            remote_comm_id: record.remote_comm_id,
            private_data: &[],
        };
        let tid = record.req_tid;
        self.send(index, tid, Message::Rtu(repr));
        let record = &mut self.conns[index];
        record.state = State::Established;
        record.established = true;
        record.timer = None;
        Ok(())
    }

    /// Closes a connection (move its QP to the error state first, ib-cm.md §5.5):
    /// - connected (or REP exchanged): DREQ with a fresh TID and the peer's QPN,
    ///   retransmitted until the DREP; then [`Event::Disconnected`] and timewait;
    /// - active, REQ not answered yet: REJ reason 4 (as Linux does when the id is
    ///   destroyed), timewait, no event;
    /// - passive, not accepted yet: REJ reason 28, no event;
    /// - already closing or in timewait: nothing.
    ///
    /// # Errors
    /// [`CmError::UnknownConnection`].
    pub fn disconnect<R: Random + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        conn: ConnId,
    ) -> Result<(), CmError> {
        let index = self.index_of(conn)?;
        match self.conns[index].state {
            State::Established | State::RepSent | State::MraRepRcvd | State::RepRcvd => {
                self.send_dreq(now, rng, index);
            }
            State::ReqSent | State::MraReqRcvd => {
                self.send_timeout_rej(index);
                self.enter_timewait(now, index);
            }
            State::ReqRcvd | State::MraReqSent => {
                self.reject_request(index, RejectReason::ConsumerDefined, &[]);
            }
            State::DreqSent | State::Timewait | State::Idle => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::cm::PeerAddr;

    fn route(local: [u8; 4], peer: [u8; 4]) -> Route {
        Route {
            local_ip: Ipv4Address::new(local[0], local[1], local[2], local[3]),
            peer: PeerAddr {
                mac: EthernetAddress([2, 0, 0, 0, 0, peer[3]]),
                ip: Ipv4Address::new(peer[0], peer[1], peer[2], peer[3]),
            },
        }
    }

    #[test]
    fn test_footprint() {
        // One slot: a 256-byte MAD, two private-data buffers, state; documented on
        // `Cm`. Keep it under a kilobyte.
        let per_conn = core::mem::size_of::<Conn>();
        assert!(per_conn < 1024, "{per_conn} bytes per connection");
    }

    #[test]
    fn test_listen() {
        let mut cm = Cm::<2>::new(Config::new(1));
        assert_eq!(cm.listen(1234), Ok(()));
        assert_eq!(cm.listen(1234), Err(CmError::AlreadyListening));
        assert!(cm.is_listening(1234));
        assert_eq!(cm.unlisten(1234), Ok(()));
        assert_eq!(cm.unlisten(1234), Err(CmError::NotListening));
        for port in 0..MAX_LISTENERS as u16 {
            cm.listen(port).unwrap();
        }
        assert_eq!(cm.listen(999), Err(CmError::NoResources));
    }

    #[test]
    fn test_stale_conn_id_is_unknown() {
        let mut cm = Cm::<2>::new(Config::new(1));
        assert_eq!(cm.state(ConnId(0)), None);
        assert_eq!(
            cm.notify_data_received(ConnId(0x0001_0000)),
            Err(CmError::UnknownConnection)
        );
        assert_eq!(cm.ready_to_use(ConnId(7)), Err(CmError::UnknownConnection));
    }

    #[test]
    fn test_connect_parameter_checks() {
        let mut cm = Cm::<1>::new(Config::new(1));
        let mut rng = || 5u32;
        let qp = LocalQp {
            qpn: Qpn::new(1),
            starting_psn: Psn::new(1),
            responder_resources: 0,
            initiator_depth: 0,
            rnr_retry_count: 7,
            srq: false,
        };
        let mut params = ConnectParams {
            route: route([10, 0, 0, 1], [10, 0, 0, 2]),
            port: 1234,
            src_port: 40000,
            qp,
            path_mtu: Mtu::Mtu1024,
            retry_count: 7,
            traffic_class: 0,
            hop_limit: 64,
            private_data: &[0; 57],
        };
        assert_eq!(
            cm.connect(0, &mut rng, &params),
            Err(CmError::PrivateDataTooLong)
        );
        params.private_data = &[];
        assert_eq!(
            cm.connect(0, &mut rng, &params),
            Err(CmError::InvalidParameter)
        );
        params.qp.qpn = Qpn::new(0x11);
        let conn = cm.connect(0, &mut rng, &params).unwrap();
        assert_eq!(cm.state(conn), Some(State::ReqSent));
        assert!(cm.qpn_in_use(Qpn::new(0x11)));
        // One slot: the second connect has none; the comm ID 5 is taken anyway.
        params.qp.qpn = Qpn::new(0x12);
        assert_eq!(cm.connect(0, &mut rng, &params), Err(CmError::NoResources));
        let out = cm.dispatch().unwrap();
        assert_eq!(out.mad[16..18], [0x00, 0x10]);
        assert!(cm.dispatch().is_none());
    }
}

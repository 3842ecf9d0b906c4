//! CM connection states and the per-connection record.
//!
//! The states are the IB CM's (IBTA Vol. 1 §12.9, Linux `enum ib_cm_state`,
//! ib-cm.md §4.8): each connection is in exactly one, and the data valid in it lives
//! in the [`Conn`] record next to it. Passive path: `ReqRcvd` (→ `MraReqSent`) →
//! `RepSent` (→ `MraRepRcvd`) → `Established` → (`DreqSent` →) `Timewait` → `Idle`.
//! Active path: `ReqSent` (→ `MraReqRcvd`) → `RepRcvd` → `Established` → ….

use heapless::Deque;

use super::{DisconnectCause, PrivateData, QpAttributes, RejectReason, Route, Waiting, MAD_LEN};
use crate::types::Qpn;
use crate::wire::Ipv4Address;

/// The CM state of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// The slot holds no connection (never returned by [`super::Cm::state`]).
    Idle,
    /// Passive: a REQ was reported; waiting for the consumer's accept or reject.
    ReqRcvd,
    /// Passive: the consumer asked for time; an MRA(REQ) was sent.
    MraReqSent,
    /// Passive: REP sent, waiting for the RTU or the first data packet (the REP is
    /// retransmitted).
    RepSent,
    /// Passive: the peer acknowledged our REP with an MRA; the REP timer is longer.
    MraRepRcvd,
    /// Active: REQ sent, waiting for the REP (the REQ is retransmitted).
    ReqSent,
    /// Active: the peer acknowledged our REQ with an MRA; the REQ timer is longer.
    MraReqRcvd,
    /// Active: a REP was reported; waiting for the HCA to set the QP up.
    RepRcvd,
    /// Connected: data flows.
    Established,
    /// We sent a DREQ and wait for the DREP (the DREQ is retransmitted).
    DreqSent,
    /// Closed, but the peer may still hold the old QPN / comm ID: they stay reserved
    /// until the timer expires.
    Timewait,
}

/// Which end opened the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// We received the REQ.
    Passive,
    /// We sent the REQ.
    Active,
}

/// An event waiting in a connection's queue; the data lives in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// A REQ was accepted into `ReqRcvd` (data: `route`, `request`, `qp`, REQ data).
    ConnectRequest,
    /// A REP moved an active connection to `RepRcvd` (data: `qp`, REP data).
    Reply,
    /// RTU or first data packet in `RepSent`/`MraRepRcvd`.
    Established,
    /// A REJ from the peer ended the connection (data: REJ private data).
    Rejected(RejectReason),
    /// The last retry (or the consumer's time) ran out.
    TimedOut(Waiting),
    /// DREQ received, DREP received, DREQ timed out, or found stale.
    Disconnected(DisconnectCause),
}

/// Most events one connection can produce before its slot is reused: a lifetime
/// yields at most three (request/reply, established, down), one spare.
pub(crate) const EVENTS_PER_CONN: usize = 4;

/// A retransmission (or wait) timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timer {
    /// When it fires (ns).
    pub deadline: u64,
    /// The interval between retransmissions (ns).
    pub interval: u64,
    /// Retransmissions left before the final timeout.
    pub retries_left: u8,
}

/// What the REQ told us, kept for the events and the answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestInfo {
    /// The listen port (service ID low 16 bits).
    pub port: u16,
    /// CMA header source address.
    pub cma_src_addr: Ipv4Address,
    /// CMA header source port.
    pub cma_src_port: u16,
    /// CMA header destination address.
    pub cma_dst_addr: Ipv4Address,
    /// REQ Responder Resources (caps our initiator depth).
    pub responder_resources: u8,
    /// REQ Initiator Depth (caps our responder resources).
    pub initiator_depth: u8,
    /// REQ End-to-End Flow Control (echoed in the REP, as Linux does).
    pub flow_control: bool,
}

/// One connection slot.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    /// Bumped whenever the slot takes a new connection.
    pub generation: u16,
    /// The state.
    pub state: State,
    /// Which end we are.
    pub role: Role,
    /// Addresses.
    pub route: Route,
    /// Our Local Comm ID (non-zero).
    pub local_comm_id: u32,
    /// The peer's comm ID (0 until known on the active side).
    pub remote_comm_id: u32,
    /// The TID of the REQ (passive: echoed by REP/MRA/REJ; active: ours).
    pub req_tid: u64,
    /// Our QPN once known (accept / connect).
    pub local_qpn: Option<Qpn>,
    /// The negotiated attributes (peer QPN, PSNs, …).
    pub qp: QpAttributes,
    /// Passive: what the REQ asked.
    pub request: RequestInfo,
    /// Timeout for REQ/REP/DREQ retransmission (ns).
    pub cm_timeout: u64,
    /// Retransmissions allowed for our REP/REQ (from REQ Max CM Retries or config).
    pub cm_retries: u8,
    /// The running timer, if any.
    pub timer: Option<Timer>,
    /// The last message sent on this connection (resent on timeouts/duplicates).
    pub tx: [u8; MAD_LEN],
    /// `tx` is waiting for [`super::Cm::dispatch`].
    pub tx_pending: bool,
    /// Events not yet polled, with their global sequence numbers.
    pub events: Deque<(u64, EventKind), EVENTS_PER_CONN>,
    /// REQ user data (passive) or REP private data (active).
    pub peer_private_data: PrivateData,
    /// Private data of a REJ received on this connection.
    pub reject_private_data: PrivateData,
    /// `Established` was reported (or is implied) already.
    pub established: bool,
    /// `Disconnected` was reported already.
    pub down_reported: bool,
}

impl Conn {
    /// An empty slot.
    pub fn vacant(zero_route: Route, zero_qp: QpAttributes, zero_request: RequestInfo) -> Conn {
        Conn {
            generation: 0,
            state: State::Idle,
            role: Role::Passive,
            route: zero_route,
            local_comm_id: 0,
            remote_comm_id: 0,
            req_tid: 0,
            local_qpn: None,
            qp: zero_qp,
            request: zero_request,
            cm_timeout: 0,
            cm_retries: 0,
            timer: None,
            tx: [0; MAD_LEN],
            tx_pending: false,
            events: Deque::new(),
            peer_private_data: PrivateData::new(),
            reject_private_data: PrivateData::new(),
            established: false,
            down_reported: false,
        }
    }

    /// The slot can take a new connection: idle, nothing left to send or report.
    pub fn is_reusable(&self) -> bool {
        self.state == State::Idle && !self.tx_pending && self.events.is_empty()
    }

    /// The connection holds its comm ID and QPN (any state but idle).
    pub fn is_live(&self) -> bool {
        self.state != State::Idle
    }
}

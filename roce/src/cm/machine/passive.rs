//! The passive side, REQ → REP → RTU (ib-cm.md §4.2-4.4, §4.8, checklist A.4
//! and B): a REQ's checks, duplicates and stale connections; the consumer's
//! [`Cm::accept`] and [`Cm::delay`] (MRA of the REQ); establishment on the
//! RTU or the first data packet.

use super::{copy_private_data, valid_qpn, Accepted, Cm, DEFAULT_HOP_LIMIT};
use crate::cm::state::{EventKind, RequestInfo, Role};
use crate::cm::{
    cm_timeout_ms, CmError, ConnId, DisconnectCause, LocalQp, PrivateData, QpAttributes, Random,
    RejectReason, Route, State, MILLISECOND, REQ_USER_DATA_LEN,
};
use crate::types::Qkey;
use crate::wire::cm::{
    rep, Message, MessageKind, MraRepr, RejRepr, RepRepr, ReqRepr, RtuRepr, TransportType,
};
use crate::wire::rdma_cm;

impl<const N: usize> Cm<N> {
    pub(super) fn on_req<R: Random + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        route: Route,
        tid: u64,
        req: &ReqRepr<'_>,
    ) {
        // Duplicate: same client comm ID and CA GUID (ib-cm.md §4.8), and,
        // where Linux stops there, from the same address: a host that copies
        // another's IDs gets a connection of its own, never a say over the
        // other's (a REQ of the other's IDs would otherwise hold its connect
        // off as a "duplicate").
        if let Some(index) = self.conns.iter().position(|c| {
            c.is_live()
                && c.role == Role::Passive
                && c.remote_comm_id == req.local_comm_id
                && c.qp.remote_ca_guid == req.local_ca_guid
                && c.route.peer.ip == route.peer.ip
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

        // Stale: the client's (GUID, QPN) belongs to a live connection from the
        // same address: REJ 10 to the new REQ and DREQ on the old connection
        // (ib-cm.md §4.8, checklist B). Only the connection's own peer can
        // declare it stale; the same pair from elsewhere is a new connection.
        if let Some(old) = self.conns.iter().position(|c| {
            c.is_live()
                && c.role == Role::Passive
                && c.state != State::Timewait
                && c.qp.remote_ca_guid == req.local_ca_guid
                && c.qp.remote_qpn == req.local_qpn
                && c.route.peer.ip == route.peer.ip
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

    pub(super) fn on_rtu(&mut self, route: Route, rtu: &RtuRepr<'_>) -> bool {
        let Some(index) = self.find_by_ids(rtu.remote_comm_id, rtu.local_comm_id, route.peer.ip)
        else {
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

    fn establish(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        conn.state = State::Established;
        conn.timer = None;
        if !conn.established {
            conn.established = true;
            self.push_event(index, EventKind::Established);
        }
    }
}

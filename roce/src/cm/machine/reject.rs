//! REJ (ib-cm.md §4.6, checklist B): rejecting a REQ with or without a slot,
//! the timeout REJ (reason 4), finding the connection a received REJ names,
//! and the consumer's [`Cm::reject`].

use super::{copy_private_data, Cm, DEFAULT_HOP_LIMIT};
use crate::cm::state::EventKind;
use crate::cm::{CmError, ConnId, RejectReason, Route, State};
use crate::wire::cm::{rej, Message, MessageKind, RejRepr, ReqRepr};

impl<const N: usize> Cm<N> {
    /// REJ of a received REQ (Local Comm ID 0, Message Rejected = REQ, REQ TID) and
    /// back to idle: the peer never learned our QPN.
    pub(super) fn reject_request(
        &mut self,
        index: usize,
        reason: RejectReason,
        private_data: &[u8],
    ) {
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
    pub(super) fn send_timeout_rej(&mut self, index: usize) {
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
    pub(super) fn reject_stateless(
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

    pub(super) fn on_rej(&mut self, now: u64, route: Route, rej: &RejRepr<'_>) -> bool {
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
                    && c.route.peer.ip == route.peer.ip
            })
        } else {
            None
        };
        let found = found.or_else(|| {
            if rej.message_rejected == MessageKind::Req {
                self.find_local(rej.remote_comm_id, route.peer.ip)
                    .filter(|&i| matches!(self.conns[i].state, State::ReqSent | State::MraReqRcvd))
            } else {
                self.find_by_ids(rej.remote_comm_id, rej.local_comm_id, route.peer.ip)
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
}

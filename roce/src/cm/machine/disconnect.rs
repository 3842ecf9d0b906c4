//! Closing (ib-cm.md §4.7, §4.9, §5.5): DREQ/DREP out and in, the consumer's
//! [`Cm::disconnect`], timewait and the one [`Event::Disconnected`] per
//! connection.

use super::{fresh_tid, Cm};
use crate::cm::state::{EventKind, Timer};
#[cfg(doc)]
use crate::cm::Event;
use crate::cm::{CmError, ConnId, DisconnectCause, Random, RejectReason, Route, State};
use crate::wire::cm::{DrepRepr, DreqRepr, Message};

impl<const N: usize> Cm<N> {
    pub(super) fn send_dreq<R: Random + ?Sized>(&mut self, now: u64, rng: &mut R, index: usize) {
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

    pub(super) fn on_dreq(&mut self, now: u64, route: Route, tid: u64, dreq: &DreqRepr<'_>) {
        let Some(index) = self.find_by_ids(dreq.remote_comm_id, dreq.local_comm_id, route.peer.ip)
        else {
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

    pub(super) fn on_drep(&mut self, now: u64, route: Route, drep: &DrepRepr<'_>) -> bool {
        let Some(index) = self.find_by_ids(drep.remote_comm_id, drep.local_comm_id, route.peer.ip)
        else {
            return false;
        };
        if self.conns[index].state != State::DreqSent {
            return false;
        }
        self.enter_timewait(now, index);
        self.report_down(index, DisconnectCause::Reply);
        true
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

    pub(super) fn enter_timewait(&mut self, now: u64, index: usize) {
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

    pub(super) fn report_down(&mut self, index: usize, cause: DisconnectCause) {
        if !self.conns[index].down_reported {
            self.conns[index].down_reported = true;
            self.push_event(index, EventKind::Disconnected(cause));
        }
    }
}

//! The timers (ib-cm.md §4.5, §6): [`Cm::poll_at`] and [`Cm::poll`] over the
//! armed slots, retransmission of REQ/REP/DREQ and what happens after the
//! last retry, the peer's timeout exponents, and the MRA that stretches a
//! running timer.

use super::{Cm, MRA_REQ_SLACK};
use crate::cm::state::{EventKind, Timer};
use crate::cm::{cm_timeout_ms, DisconnectCause, RejectReason, Route, State, Waiting, MILLISECOND};
use crate::wire::cm::{MessageKind, MraRepr};

impl<const N: usize> Cm<N> {
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

    /// Whether [`Cm::poll`] at `now` may have a timer to run (false: it
    /// would return at once). O(1).
    #[inline]
    pub fn timers_due(&self, now: u64) -> bool {
        now >= self.earliest
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
    pub(super) fn arm(&mut self, index: usize, timer: Timer) {
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

    pub(super) fn start_timer(&mut self, now: u64, index: usize, interval: u64, retries: u8) {
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
    pub(super) fn peer_timeout(&self, exponent: u8) -> u64 {
        cm_timeout_ms(exponent.min(self.config.max_peer_timeout_exponent)) * MILLISECOND
    }

    pub(super) fn on_mra(&mut self, now: u64, route: Route, mra: &MraRepr<'_>) -> bool {
        let Some(index) = self.find_local(mra.remote_comm_id, route.peer.ip) else {
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
}

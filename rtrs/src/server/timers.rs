//! Timed and parked work: heartbeats (rtrs.md §5), setup and close
//! deadlines, responses and acks waiting for send-queue room.

use verbs::{SendWr, Verbs};

use super::table::PathState;
use super::{wr_id, CloseReason, IoState, Lent, PathId, WrKind};
use crate::link::{self, Beat};
use crate::wire::Imm;

impl<V: Verbs> Lent<'_, V> {
    // ----- heartbeats and parked work ------------------------------------------

    #[cold]
    pub(super) fn send_heartbeat_ack(&mut self, path: u16) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let id = self.path_id(path);
        let Some(conn) = self.server.paths[index].conns.first().copied().flatten() else {
            return;
        };
        let wr = heartbeat_wr(id, Imm::HbAck);
        match self.ports[port].post_send(conn, &[wr]) {
            Ok(()) => {
                let slot = &mut self.server.paths[index];
                slot.ack_pending = false;
                slot.stats.heartbeats_acked += 1;
            }
            Err(_) => self.server.pending = true,
        }
    }

    pub(super) fn run_timers_and_parked(&mut self, now: u64) -> bool {
        if !self.server.pending && now < self.server.timers_due {
            return false;
        }
        let mut busy = false;
        let was_pending = core::mem::replace(&mut self.server.pending, false);
        // The earliest deadline of the paths as the walk leaves them; a
        // change of state on the way sets `timers_due` to 0 again.
        self.server.timers_due = u64::MAX;
        let mut due = u64::MAX;
        // The paths that are not free, in index order (a path freed on the
        // way drops out of the list; the walk goes on above it).
        let mut from = 0;
        while let Some(index) = self.server.next_live_path(from) {
            from = index + 1;
            let path = index as u16;
            match self.server.paths[index].state {
                PathState::Connected => {
                    if was_pending {
                        busy |= self.retry_parked(path, now);
                    }
                    if now >= self.server.paths[index].heartbeat.next() && self.event_room() {
                        busy = true;
                        self.heartbeat_tick(path, now);
                    }
                }
                PathState::Connecting if now >= self.server.paths[index].setup_deadline => {
                    busy = true;
                    self.begin_close(path, CloseReason::SetupTimeout, now);
                    self.maybe_free_path(path);
                }
                PathState::Closing { deadline } => {
                    if now >= deadline {
                        for cid in 0..self.server.paths[index].conns.len() {
                            if let Some(conn) = self.server.paths[index].conns[cid] {
                                self.detach_conn(path, conn);
                            }
                        }
                    }
                    // Otherwise a closing path advances on its CM events and
                    // the consumer's answers, or at the deadline: no spinning.
                    self.maybe_free_path(path);
                    if self.server.paths[index].state == PathState::Free {
                        busy = true;
                    }
                }
                _ => {}
            }
            let path_due = match self.server.paths[index].state {
                PathState::Connected => self.server.paths[index].heartbeat.next(),
                PathState::Connecting => self.server.paths[index].setup_deadline,
                // A closing path is looked at every call (see above).
                PathState::Closing { .. } => 0,
                PathState::Free => u64::MAX,
            };
            due = due.min(path_due);
        }
        self.server.timers_due = self.server.timers_due.min(due);
        busy
    }

    #[cold]
    pub(super) fn retry_parked(&mut self, path: u16, now: u64) -> bool {
        let index = usize::from(path);
        let mut busy = false;
        if self.server.paths[index].ack_pending {
            self.send_heartbeat_ack(path);
            busy = true;
        }
        for chunk in 0..self.server.paths[index].chunks.len() {
            if !matches!(self.server.paths[index].state, PathState::Connected) {
                break;
            }
            match self.server.paths[index].chunks[chunk].state {
                IoState::WaitingForSendQueue(_) | IoState::WaitingForPreviousCompletion(_) => {
                    busy = true;
                    self.try_respond(path, chunk as u16, now);
                }
                IoState::WaitingForSendQueueToInvalidate { .. } => {
                    busy = true;
                    self.try_invalidate(path, chunk as u16, now);
                }
                _ => {}
            }
        }
        busy
    }

    /// rtrs.md §5: one outstanding heartbeat; dead after `missed_max`.
    #[cold]
    pub(super) fn heartbeat_tick(&mut self, path: u16, now: u64) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let (interval, max) = (
            self.server.config.heartbeat_interval_ns,
            self.server.config.heartbeat_missed_max,
        );
        match self.server.paths[index].heartbeat.tick(now, interval, max) {
            Beat::Dead => self.begin_close(path, CloseReason::HeartbeatTimeout, now),
            Beat::Quiet => {}
            Beat::Send => {
                let id = self.path_id(path);
                let Some(conn) = self.server.paths[index].conns.first().copied().flatten() else {
                    return;
                };
                if self.ports[port]
                    .post_send(conn, &[heartbeat_wr(id, Imm::HbMsg)])
                    .is_ok()
                {
                    self.server.paths[index].stats.heartbeats_sent += 1;
                }
            }
        }
    }
}

/// A heartbeat or its ack on `path` ([`link::heartbeat_wr`]).
fn heartbeat_wr(path: PathId, imm: Imm) -> SendWr {
    link::heartbeat_wr(wr_id(WrKind::SendHeartbeat, path, 0), imm)
}

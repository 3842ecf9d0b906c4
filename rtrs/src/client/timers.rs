//! Heartbeats and deadlines (rtrs.md §5): the heartbeat sender, the
//! timers `poll` runs.

use super::*;

impl<V: Verbs> Client<V> {
    pub(super) fn send_heartbeat(&mut self, path: u16, imm: Imm, now: u64) {
        let Some(conn) = self.paths[usize::from(path)].conns[0] else {
            return;
        };
        let wr = link::heartbeat_wr(wr_id(KIND_CONTROL, path, 0, 1), imm);
        if self.verbs.post_send(conn, &[wr]).is_err() {
            self.fail_path(path, PathError::PostFailed, now);
            return;
        }
        let slot = &mut self.paths[usize::from(path)];
        if imm == Imm::HbMsg {
            slot.stats.heartbeats_sent += 1;
            slot.heartbeat_sent_at = now;
        } else {
            slot.stats.heartbeats_answered += 1;
        }
    }

    pub(super) fn timers(&mut self, now: u64) -> bool {
        let mut busy = false;
        let count = self.session.as_ref().map_or(0, |s| s.paths);
        for path in 0..count {
            let state = self.paths[usize::from(path)].state;
            match state {
                PathState::Connecting { deadline, .. }
                | PathState::WaitingForInfoRsp { deadline }
                    if now >= deadline =>
                {
                    busy = true;
                    self.fail_path(path, PathError::Timeout, now);
                }
                PathState::Disconnecting { deadline, close } if now >= deadline => {
                    busy = true;
                    for cid in 0..self.paths[usize::from(path)].conns.len() {
                        self.forget_conn(path, cid as u16);
                    }
                    self.after_teardown(path, close, now);
                }
                PathState::WaitingToReconnect { at } if now >= at => {
                    busy = true;
                    self.paths[usize::from(path)].state = PathState::Pending;
                }
                PathState::Connected if now >= self.paths[usize::from(path)].heartbeat.next() => {
                    busy = true;
                    self.heartbeat_tick(path, now);
                }
                _ => {}
            }
        }
        busy |= self.start_pending(now);
        busy
    }

    /// rtrs.md §5: at most one heartbeat outstanding; `missed` counts
    /// intervals without any sign of life.
    pub(super) fn heartbeat_tick(&mut self, path: u16, now: u64) {
        let interval = self.config.heartbeat_interval_ns;
        let max = self.config.heartbeat_missed_max;
        match self.paths[usize::from(path)]
            .heartbeat
            .tick(now, interval, max)
        {
            Beat::Dead => self.fail_path(path, PathError::HeartbeatTimeout, now),
            Beat::Quiet => {}
            Beat::Send => self.send_heartbeat(path, Imm::HbMsg, now),
        }
    }
}

//! Failure and reconnect (rtrs.md §6.2, §7): a failed path is torn down,
//! its requests fail over to another path, and it reconnects.

use super::*;

impl<V: Verbs> Client<V> {
    pub(super) fn connect_failed(&mut self, path: u16, reason: PathError, now: u64) {
        self.fail_path(path, reason, now);
    }

    pub(super) fn fail_path(&mut self, path: u16, reason: PathError, now: u64) {
        let index = usize::from(path);
        let state = self.paths[index].state;
        let was_connected = match state {
            PathState::Connected => true,
            PathState::Connecting { .. } | PathState::WaitingForInfoRsp { .. } => false,
            _ => return,
        };
        let close = reason == PathError::QueueDepthChanged;
        for cid in 0..self.paths[index].conns.len() {
            if let Some(conn) = self.paths[index].conns[cid] {
                // A connection that never came up (or is already down) is
                // released at once; the others report `Disconnected`.
                if self.verbs.disconnect(conn).is_err() {
                    let _ = self.verbs.destroy(conn);
                    self.paths[index].conns[cid] = None;
                }
            }
        }
        self.paths[index].state = PathState::Disconnecting {
            deadline: now.saturating_add(self.config.disconnect_timeout_ns),
            close,
        };
        if was_connected {
            self.push_event(Event::PathDown { path, reason });
            self.fail_over(path, now);
            let any_up = self.paths.iter().any(|p| p.state == PathState::Connected);
            if let Some(session) = self.session.as_mut() {
                if session.up && !any_up {
                    session.up = false;
                    self.push_event(Event::SessionDown);
                }
            }
        } else {
            self.paths[index].stats.connect_failures += 1;
            self.push_event(Event::PathConnectFailed { path, reason });
        }
    }

    /// Moves every request of `path` to another connected path (same
    /// permit), or completes it with `ECONNABORTED`.
    pub(super) fn fail_over(&mut self, path: u16, now: u64) {
        for permit in 0..self.requests.len() {
            let RequestState::InFlight {
                path: on, response, ..
            } = self.requests[permit].state
            else {
                continue;
            };
            if on != path {
                continue;
            }
            if let Some(errno) = response {
                // Answered already; only the local send completion was
                // missing, and the flush ends it.
                self.finish(permit as u16, errno, now);
                continue;
            }
            let slot = &mut self.paths[usize::from(path)];
            slot.stats.inflight = slot.stats.inflight.saturating_sub(1);
            self.requests[permit].state = RequestState::Free;
            let permit = permit as u16;
            if self.session.as_ref().is_some_and(|s| s.closing) {
                self.finish(permit, errno::ECONNABORTED, now);
                continue;
            }
            match self.choose_path(Some(path)) {
                Some(target) if self.post_request(permit, target).is_ok() => {
                    self.paths[usize::from(target)].stats.failovers += 1;
                }
                _ => self.finish(permit, errno::ECONNABORTED, now),
            }
        }
    }

    pub(super) fn maybe_disconnected(&mut self, path: u16, now: u64) {
        let slot = &self.paths[usize::from(path)];
        let PathState::Disconnecting { close, .. } = slot.state else {
            return;
        };
        if slot.conns.iter().any(Option::is_some) {
            return;
        }
        self.after_teardown(path, close, now);
    }

    pub(super) fn after_teardown(&mut self, path: u16, close: bool, now: u64) {
        let max = self.config.max_reconnect_attempts;
        let closing = self.session.as_ref().is_some_and(|s| s.closing);
        let slot = &mut self.paths[usize::from(path)];
        slot.attempts = slot.attempts.saturating_add(1);
        if close || closing || max.is_some_and(|max| slot.attempts > max) {
            slot.state = PathState::Closed;
            self.push_event(Event::PathClosed { path });
        } else {
            slot.state = PathState::WaitingToReconnect {
                at: now.saturating_add(self.config.reconnect_delay_ns),
            };
        }
        self.start_pending(now);
    }
}

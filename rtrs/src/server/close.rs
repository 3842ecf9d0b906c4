//! Closing paths (rtrs.md §6.1): disconnecting, freeing once nothing is
//! held, and freeing the session with its last path.

use verbs::{ConnId, Verbs};

use super::table::PathState;
use super::{CloseReason, Event, IoState, Lent};

impl<V: Verbs> Lent<'_, V> {
    #[cold]
    pub(super) fn detach_conn(&mut self, path: u16, conn: ConnId) {
        let port = self.port_of(path);
        let _ = self.ports[port].destroy(conn);
        self.forget_conn(port, conn);
        for entry in self.server.paths[usize::from(path)].conns.iter_mut() {
            if *entry == Some(conn) {
                *entry = None;
            }
        }
    }

    /// Connected/Connecting -> Closing: disconnect every connection, drop
    /// requests the consumer does not hold, raise PathDown/SessionClosed.
    #[cold]
    pub(super) fn begin_close(&mut self, path: u16, reason: CloseReason, now: u64) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let slot = &mut self.server.paths[index];
        if !matches!(slot.state, PathState::Connecting | PathState::Connected) {
            return;
        }
        let was_up = slot.state == PathState::Connected;
        slot.state = PathState::Closing {
            deadline: now.saturating_add(self.server.config.close_timeout_ns),
        };
        self.server.timers_due = 0;
        if reason == CloseReason::ProtocolViolation {
            slot.stats.protocol_errors += 1;
        }
        for chunk in slot.chunks.iter_mut() {
            if !matches!(chunk.state, IoState::WaitingForConsumer { .. }) {
                chunk.state = IoState::Idle;
            }
        }
        let session = slot.session;
        for cid in 0..slot.conns.len() {
            if let Some(conn) = self.server.paths[index].conns[cid] {
                if self.ports[port].disconnect(conn).is_err() {
                    // Not connected yet (or already down): release it now.
                    self.detach_conn(path, conn);
                }
            }
        }
        self.server.stats.paths_closed += 1;
        let Some(session) = session else {
            return; // half-open: no session to tell
        };
        let session_id = self.session_id(session);
        if was_up {
            let path_id = self.path_id(path);
            self.push_event(Event::PathDown {
                session: session_id,
                path: path_id,
                reason,
            });
            let slot = &mut self.server.sessions[usize::from(session)];
            slot.paths_up = slot.paths_up.saturating_sub(1);
            if slot.paths_up == 0 {
                self.push_event(Event::SessionClosed {
                    session: session_id,
                });
            }
        }
        // No path up: the session is over. It lingers, closed, until its
        // paths have drained; a new path of its uuid starts a new session.
        let slot = &mut self.server.sessions[usize::from(session)];
        if slot.paths_up == 0 {
            slot.open = false;
        }
    }

    /// Closing -> Free once no connection and no consumer-held IO remain.
    #[cold]
    pub(super) fn maybe_free_path(&mut self, path: u16) {
        let index = usize::from(path);
        let slot = &self.server.paths[index];
        if !matches!(slot.state, PathState::Closing { .. }) {
            return;
        }
        if slot.conns.iter().any(Option::is_some)
            || slot
                .chunks
                .iter()
                .any(|c| !matches!(c.state, IoState::Idle))
        {
            return;
        }
        if !self.release_pool(index) {
            return; // still pinned; retried from poll
        }
        let slot = &mut self.server.paths[index];
        slot.state = PathState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        let session = slot.session.take();
        self.server.path_freed(index);
        if let Some(session) = session {
            self.maybe_free_session(session);
        }
    }
}

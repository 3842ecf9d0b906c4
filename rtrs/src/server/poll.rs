//! The poll loop: rounds over the ports for connection events and
//! completions (bounded, from a start port that rotates every call), the
//! dispatch of each completion by its work request id, and the consumer's
//! answers ([`Server::complete_io`](super::Server::complete_io)).

use verbs::{Verbs, WcStatus, WorkCompletion};

use super::table::{PathState, Response};
use super::{
    errno, split_wr_id, Admission, CloseReason, CompleteError, IoState, IoToken, Lent, ReadData,
    WrKind, COMPLETION_BATCH, MAX_RESPONSE_ERRNO,
};

/// The port after `port` of `count`, round robin (`port < count`).
#[inline]
fn next_port(port: usize, count: usize) -> usize {
    if port + 1 < count {
        port + 1
    } else {
        0
    }
}

impl<V: Verbs> Lent<'_, V> {
    pub(super) fn poll(&mut self, now: u64, admission: &mut impl Admission) -> bool {
        let mut busy = false;
        let count = self.server.port_count;
        let start = match self.server.next_port {
            next if next < count => next,
            next => next % count,
        };
        self.server.next_port = next_port(start, count);
        let (mut handled, mut empty, mut port) = (0, 0, start);
        while empty < count && handled < self.server.config.cm_budget && self.event_room() {
            let visited = port;
            port = next_port(port, count);
            let Some(event) = self.ports[visited].poll_cm_event() else {
                empty += 1;
                continue;
            };
            empty = 0;
            handled += 1;
            busy = true;
            self.handle_cm_event(visited, event, now);
        }
        let (mut done, mut empty, mut next) = (0, 0, start);
        while empty < count && done < self.server.config.completion_budget && self.event_room() {
            let port = next;
            next = next_port(next, count);
            let want = COMPLETION_BATCH.min(self.server.config.completion_budget - done);
            // Keep room for two events per completion.
            let room = (self.server.config.event_capacity - self.server.events.len()) / 2;
            let want = want.min(room.max(1));
            let got = self.ports[port].poll_cq(&mut self.server.completions[..want]);
            if got == 0 {
                empty += 1;
                continue;
            }
            empty = 0;
            busy = true;
            done += got;
            for at in 0..got.min(want) {
                let wc = self.server.completions[at];
                self.handle_completion(port, wc, now, admission);
            }
        }
        busy |= self.run_timers_and_parked(now);
        busy
    }

    pub(super) fn complete_io(
        &mut self,
        token: IoToken,
        errno: u16,
        read_data: ReadData,
        now: u64,
    ) -> Result<(), CompleteError> {
        let index = usize::from(token.path.index);
        let path = self
            .path_mut(token.path)
            .ok_or(CompleteError::UnknownRequest)?;
        let closing = matches!(path.state, PathState::Closing { .. });
        let chunk = path
            .chunks
            .get_mut(usize::from(token.chunk))
            .ok_or(CompleteError::UnknownRequest)?;
        if chunk.generation != token.generation {
            return Err(CompleteError::UnknownRequest);
        }
        let IoState::WaitingForConsumer { cid, read } = chunk.state else {
            return Err(CompleteError::UnknownRequest);
        };
        let errno = if errno > MAX_RESPONSE_ERRNO {
            errno::EIO
        } else {
            errno
        };
        if let (ReadData::Sgl(sgl), Some(read)) = (&read_data, read) {
            if errno == 0 && sgl.total_len() != Some(read.len) {
                return Err(CompleteError::ReadLengthMismatch);
            }
        }
        if closing {
            chunk.state = IoState::Idle;
            self.maybe_free_path(token.path.index);
            return Ok(());
        }
        chunk.state = IoState::Idle;
        let response = Response {
            cid,
            errno,
            read,
            data: read_data,
            rekeyed: false,
        };
        self.respond(index as u16, token.chunk, response, now);
        Ok(())
    }

    // ----- completions ---------------------------------------------------------

    fn handle_completion(
        &mut self,
        port: usize,
        wc: WorkCompletion,
        now: u64,
        admission: &mut dyn Admission,
    ) {
        let Some((kind, id, chunk)) = split_wr_id(wc.wr_id) else {
            return;
        };
        let Some(path) = self.path(id).filter(|path| path.port == port) else {
            return; // a completion of a path already gone
        };
        let index = id.index;
        let closing = matches!(path.state, PathState::Closing { .. });
        if !wc.status.is_success() {
            if wc.status != WcStatus::WrFlushErr {
                self.begin_close(index, CloseReason::CompletionError, now);
            }
            if kind == WrKind::IoResponse {
                self.response_done(index, chunk, now);
            }
            self.maybe_free_path(index);
            return;
        }
        if closing {
            if kind == WrKind::IoResponse {
                self.response_done(index, chunk, now);
            }
            return;
        }
        match kind {
            WrKind::RecvInfo => self.handle_info_req(index, wc, now, admission),
            WrKind::RecvIo => self.handle_io_receive(index, wc, now),
            WrKind::LocalInv => self.invalidated(index, chunk, now),
            WrKind::IoResponse => self.response_done(index, chunk, now),
            WrKind::SendInfoRsp | WrKind::SendHeartbeat | WrKind::IoUnsignaled => {}
        }
    }
}

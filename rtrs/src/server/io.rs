//! The IO path (rtrs.md §4): IO_REQ immediates, LOCAL_INV and request
//! parsing with the checks of rnbd.md §8.2; the response chains of §4.6 are
//! module `respond`'s.

use verbs::{PostError, RecvWr, RegError, SendOp, SendWr, Sgl, Verbs, WorkCompletion};

use super::table::{ReadInfo, Response};
use super::{
    errno, wr_id, CloseReason, Event, IoDirection, IoState, IoToken, Lent, ReadData, WrKind,
};
use crate::wire::{Imm, IoMsg, IoRequest, ParseError, ReadMsg};

impl<V: Verbs> Lent<'_, V> {
    /// rtrs.md §4.5 step 1-2, §5.
    pub(super) fn handle_io_receive(&mut self, path: u16, wc: WorkCompletion, now: u64) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let id = self.path_id(path);
        let Some(cid) = self.server.paths[index]
            .conns
            .iter()
            .position(|c| *c == Some(wc.conn))
        else {
            return;
        };
        self.server.paths[index].heartbeat.alive();
        let recv = RecvWr {
            wr_id: wr_id(WrKind::RecvIo, id, 0),
            sgl: Sgl::new(),
        };
        if self.ports[port].post_recv(wc.conn, &[recv]).is_err() {
            self.begin_close(path, CloseReason::PostFailed, now);
            return;
        }
        let Some(imm) = wc.imm else {
            // A zero-length SEND into a zero-SGE receive: nothing to do.
            self.server.stats.ignored_immediates += 1;
            return;
        };
        match Imm::decode(imm) {
            Imm::IoReq { payload } => self.dispatch(path, cid as u16, payload, now),
            Imm::HbMsg => {
                self.server.paths[index].ack_pending = true;
                self.send_heartbeat_ack(path);
            }
            Imm::HbAck => {}
            _ => self.server.stats.ignored_immediates += 1,
        }
    }

    pub(super) fn dispatch(&mut self, path: u16, cid: u16, payload: u32, now: u64) {
        let (chunk, offset) = self.server.layout.split(payload);
        let index = usize::from(path);
        let qd = u32::from(self.server.config.queue_depth);
        if chunk >= qd || offset >= self.server.config.chunk_size {
            self.begin_close(path, CloseReason::ProtocolViolation, now); // #14
            return;
        }
        let chunk = chunk as u16;
        let Some(slot) = self.server.paths[index].chunks.get_mut(usize::from(chunk)) else {
            return;
        };
        if !matches!(slot.state, IoState::Idle) {
            self.begin_close(path, CloseReason::ProtocolViolation, now); // #20
            return;
        }
        slot.generation = slot.generation.wrapping_add(1);
        if !self.server.config.always_invalidate {
            self.parse_request(path, chunk, cid, offset, now);
            return;
        }
        // Revoke the client's access to the chunk before reading it: at
        // once where the provider can, else by a LOCAL_INV on the path's
        // send queue (parsed when it completes).
        let rkey = slot.region.rkey;
        let port = self.port_of(path);
        match self.ports[port].revoke_remote(rkey) {
            Ok(()) => self.parse_request(path, chunk, cid, offset, now),
            Err(RegError::Unsupported) => {
                self.server.paths[index].chunks[usize::from(chunk)].state =
                    IoState::WaitingForSendQueueToInvalidate { cid, offset };
                self.try_invalidate(path, chunk, now);
            }
            Err(_) => self.begin_close(path, CloseReason::PostFailed, now),
        }
    }

    pub(super) fn try_invalidate(&mut self, path: u16, chunk: u16, now: u64) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let id = self.path_id(path);
        let slot = &self.server.paths[index];
        let Some(chunk_slot) = slot.chunks.get(usize::from(chunk)) else {
            return;
        };
        let IoState::WaitingForSendQueueToInvalidate { cid, offset } = chunk_slot.state else {
            return;
        };
        let Some(conn) = slot.conns.get(usize::from(cid)).copied().flatten() else {
            return;
        };
        let wr = SendWr {
            wr_id: wr_id(WrKind::LocalInv, id, chunk),
            signaled: true,
            op: SendOp::LocalInv {
                rkey: chunk_slot.region.rkey,
            },
        };
        match self.ports[port].post_send(conn, &[wr]) {
            Ok(()) => {
                self.server.paths[index].chunks[usize::from(chunk)].state =
                    IoState::WaitingForInvalidate { cid, offset };
            }
            Err(PostError::QueueFull) => self.server.pending = true,
            Err(_) => self.begin_close(path, CloseReason::PostFailed, now),
        }
    }

    pub(super) fn invalidated(&mut self, path: u16, chunk: u16, now: u64) {
        let Some(slot) = self.server.paths[usize::from(path)]
            .chunks
            .get(usize::from(chunk))
        else {
            return;
        };
        if let IoState::WaitingForInvalidate { cid, offset } = slot.state {
            self.parse_request(path, chunk, cid, offset, now);
        }
    }

    /// rtrs.md §4.5 steps 4-7 with rnbd.md §8.2 #15-#19.
    pub(super) fn parse_request(&mut self, path: u16, chunk: u16, cid: u16, offset: u32, now: u64) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let chunk_size = self.server.config.chunk_size;
        let slot = &self.server.paths[index].chunks[usize::from(chunk)];
        let handle = slot.region.handle;
        let generation = slot.generation;
        let parsed = self.ports[port]
            .with_slice(handle, 0, handle.len(), |bytes| {
                match IoRequest::parse(bytes, offset as usize) {
                    Ok(request) => Ok((request.msg, request.data_len, request.user_header.len())),
                    Err(ParseError::UserHeaderBeyondChunkStart) => {
                        // Keep the read descriptor: an error answer still invalidates.
                        let read = bytes
                            .get(offset as usize..)
                            .and_then(|msg| ReadMsg::parse(msg).ok());
                        Err((ParseError::UserHeaderBeyondChunkStart, read))
                    }
                    Err(error) => Err((error, None)),
                }
            })
            .unwrap_or(Err((ParseError::OffsetBeyondChunk, None)));
        let einval = |read: Option<ReadMsg>| Response {
            cid,
            errno: errno::EINVAL,
            read: read.and_then(ReadInfo::from_msg),
            data: ReadData::Chunk,
            rekeyed: false,
        };
        let (msg, data_len, usr_len) = match parsed {
            Ok(found) => found,
            Err((ParseError::UserHeaderBeyondChunkStart, read)) => {
                // #17: Linux drops silently; Brick answers EINVAL.
                self.note_protocol_error(path);
                self.server.paths[index].chunks[usize::from(chunk)].state = IoState::Idle;
                self.respond(path, chunk, einval(read), now);
                return;
            }
            Err((ParseError::TooManyReadDescriptors, _)) => {
                // #18: answered EINVAL (no descriptor to invalidate).
                self.note_protocol_error(path);
                self.server.paths[index].chunks[usize::from(chunk)].state = IoState::Idle;
                self.respond(path, chunk, einval(None), now);
                return;
            }
            Err(_) => {
                // #15, #16: close.
                self.begin_close(path, CloseReason::ProtocolViolation, now);
                return;
            }
        };
        let data_len = data_len as u32;
        let (direction, read) = match msg {
            IoMsg::Write(_) => (IoDirection::Write, None),
            IoMsg::Read(read) => {
                let info = ReadInfo::from_msg(read);
                if let Some(desc) = read.desc {
                    // #19: 1..=chunk and equal to the room the client left.
                    if desc.len == 0 || desc.len > chunk_size || desc.len != data_len {
                        self.note_protocol_error(path);
                        self.server.paths[index].chunks[usize::from(chunk)].state = IoState::Idle;
                        self.respond(path, chunk, einval(Some(read)), now);
                        return;
                    }
                }
                let read_len = info.map_or(0, |i| i.len);
                (IoDirection::Read { read_len }, Some(info))
            }
        };
        let (Some(header), Some(data)) = (
            handle.slice(data_len, usr_len as u32),
            handle.slice(0, data_len),
        ) else {
            self.begin_close(path, CloseReason::ProtocolViolation, now);
            return;
        };
        self.server.paths[index].chunks[usize::from(chunk)].state = IoState::WaitingForConsumer {
            cid,
            read: read.flatten().or(match direction {
                IoDirection::Read { .. } => Some(ReadInfo::dataless()),
                IoDirection::Write => None,
            }),
        };
        // A path carries IO only once admitted, so it has its session.
        let Some(session) = self.server.paths[index].session else {
            return;
        };
        if let IoDirection::Write = direction {
            self.server.paths[index].stats.write_bytes += u64::from(data_len);
            self.server.sessions[usize::from(session)].stats.write_bytes += u64::from(data_len);
        }
        let session = self.session_id(session);
        let token = IoToken {
            path: self.path_id(path),
            chunk,
            generation,
        };
        let port = self.port_of(path);
        self.push_event(Event::Io {
            session,
            token,
            direction,
            header,
            data,
            admin: cid == 0,
            port,
        });
    }

    #[cold]
    pub(super) fn note_protocol_error(&mut self, path: u16) {
        let slot = &mut self.server.paths[usize::from(path)];
        slot.stats.protocol_errors += 1;
        if let Some(session) = slot.session {
            self.server.sessions[usize::from(session)]
                .stats
                .protocol_errors += 1;
        }
    }
}

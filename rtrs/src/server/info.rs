//! INFO_REQ / INFO_RSP (rtrs.md §3): a path's setup after all its
//! connections are up.

use verbs::{PostError, RecvWr, SendOp, SendWr, Sgl, Verbs, WcOpcode, WorkCompletion};
use zerocopy::little_endian::U16;
use zerocopy::IntoBytes;

use super::table::PathState;
use super::{wr_id, Admission, CloseReason, Event, Lent, PathRefusal, WrKind, RECV_BATCH};
use crate::wire::{self, BufferDesc, InfoReq, InfoRsp, RawInfoRspHeader, SgDesc, PATHNAME_LEN};

impl<V: Verbs> Lent<'_, V> {
    /// rtrs.md §3.2.
    ///
    /// The INFO_REQ is parsed and the path admitted (admission.rs) before
    /// its chunk pool is allocated; a refused path is closed.
    #[cold]
    pub(super) fn handle_info_req(
        &mut self,
        path: u16,
        wc: WorkCompletion,
        now: u64,
        admission: &mut dyn Admission,
    ) {
        let port = self.port_of(path);
        let index = usize::from(path);
        let slot = &self.server.paths[index];
        let Some(buffer) = slot.info_req else {
            return;
        };
        let mut name: heapless::String<PATHNAME_LEN> = heapless::String::new();
        let parsed = if wc.opcode == WcOpcode::Recv && wc.byte_len as usize >= InfoReq::LEN {
            self.ports[port]
                .with_slice(buffer.handle, 0, InfoReq::LEN as u32, |bytes| {
                    InfoReq::parse(bytes).map(|req| {
                        let _ = name.push_str(req.session_name);
                    })
                })
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        let all_up = slot.conns.iter().all(Option::is_some);
        if parsed.is_none() || !all_up || slot.state != PathState::Connecting {
            self.begin_close(path, CloseReason::ProtocolViolation, now);
            return;
        }
        let joins = match self.admit_path(path, &name, admission) {
            Ok(joins) => joins,
            Err(reason) => return self.refuse_path(path, name, reason, now),
        };
        let session = match joins {
            Some(session) => session,
            None => match self.create_session(self.server.paths[index].session_uuid) {
                Some(session) => session,
                None => return self.refuse_path(path, name, PathRefusal::TooManySessions, now),
            },
        };
        self.server.paths[index].session = Some(session);
        if joins.is_none() {
            self.server.sessions[usize::from(session)].name = name.clone();
        }
        // Only now, admitted, does the path get memory (admission.rs).
        if self.allocate_pool(index).is_err() {
            return self.refuse_path(path, name, PathRefusal::OutOfMemory, now);
        }
        if self.post_io_receives(path).is_err() {
            self.begin_close(path, CloseReason::PostFailed, now);
            return;
        }
        if self.send_info_rsp(path).is_err() {
            self.begin_close(path, CloseReason::PostFailed, now);
            return;
        }
        let interval = self.server.config.heartbeat_interval_ns;
        let slot = &mut self.server.paths[index];
        slot.state = PathState::Connected;
        slot.heartbeat.start(now, interval);
        self.server.timers_due = 0;
        let remote = slot.remote;
        let session_id = self.session_id(session);
        let path_id = self.path_id(path);
        let session_slot = &mut self.server.sessions[usize::from(session)];
        session_slot.paths_up += 1;
        if session_slot.paths_up == 1 {
            self.push_event(Event::SessionOpened {
                session: session_id,
                name,
            });
        }
        self.push_event(Event::PathUp {
            session: session_id,
            path: path_id,
            remote,
            port,
        });
    }

    /// 512 zero-SGE receives on cid 0, `qd` on every other cid.
    pub(super) fn post_io_receives(&mut self, path: u16) -> Result<(), PostError> {
        let port = self.port_of(path);
        let id = self.path_id(path);
        let recv = RecvWr {
            wr_id: wr_id(WrKind::RecvIo, id, 0),
            sgl: Sgl::new(),
        };
        let batch: [RecvWr; RECV_BATCH] = core::array::from_fn(|_| recv.clone());
        let slot = &self.server.paths[usize::from(path)];
        for (cid, conn) in slot.conns.iter().enumerate() {
            let conn = conn.ok_or(PostError::NotConnected)?;
            let mut remaining = if cid == 0 {
                usize::from(wire::SERVICE_CON_QUEUE_DEPTH)
            } else {
                usize::from(self.server.config.queue_depth)
            };
            while remaining > 0 {
                let count = remaining.min(RECV_BATCH);
                self.ports[port].post_recv(conn, &batch[..count])?;
                remaining -= count;
            }
        }
        Ok(())
    }

    /// INFO_RSP with one descriptor per chunk (rtrs.md §3.3).
    pub(super) fn send_info_rsp(&mut self, path: u16) -> Result<(), PostError> {
        let port = self.port_of(path);
        let id = self.path_id(path);
        let slot = &self.server.paths[usize::from(path)];
        let buffer = slot.info_rsp.ok_or(PostError::InvalidKey)?;
        let conn = slot
            .conns
            .first()
            .copied()
            .flatten()
            .ok_or(PostError::NotConnected)?;
        let count = slot.chunks.len();
        let len = (InfoRsp::HEADER_LEN + SgDesc::LEN * count) as u32;
        let chunk_size = self.server.config.chunk_size;
        // The header and one descriptor per chunk, each written through the
        // wire structs (rtrs.md §3.3: addr = iova, key = rkey, len = chunk).
        let mut written = Ok(());
        for (i, chunk) in slot.chunks.iter().enumerate() {
            let desc = SgDesc::new(BufferDesc {
                addr: chunk.region.iova,
                rkey: chunk.region.rkey,
                len: chunk_size,
            });
            let at = (InfoRsp::HEADER_LEN + SgDesc::LEN * i) as u32;
            written = written.and(self.ports[port].write(buffer.handle, at, desc.as_bytes()));
        }
        let header = RawInfoRspHeader {
            msg_type: U16::new(wire::MsgType::InfoRsp.into()),
            sg_cnt: U16::new(count as u16),
            reserved: [0; 4],
        };
        written = written.and(self.ports[port].write(buffer.handle, 0, header.as_bytes()));
        written.map_err(PostError::from)?;
        let send = SendWr {
            wr_id: wr_id(WrKind::SendInfoRsp, id, 0),
            signaled: true,
            op: SendOp::Send {
                sgl: Sgl::single(buffer.sge(0, len)),
                imm: None,
            },
        };
        self.ports[port].post_send(conn, &[send])
    }
}

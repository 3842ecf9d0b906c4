//! Establishment (rtrs.md §2, §3): one connection at a time in cid order,
//! CON_REQ and CONN_RSP, INFO_REQ/INFO_RSP, the receive queues.

use super::*;

impl<V: Verbs> Client<V> {
    pub(super) fn establishing(&self) -> bool {
        self.paths.iter().any(|p| {
            matches!(
                p.state,
                PathState::Connecting { .. } | PathState::WaitingForInfoRsp { .. }
            )
        })
    }

    pub(super) fn start_pending(&mut self, now: u64) -> bool {
        if self.establishing() {
            return false;
        }
        let Some(index) = self
            .paths
            .iter()
            .position(|p| p.state == PathState::Pending)
        else {
            return false;
        };
        self.start_connect(index as u16, now);
        true
    }

    pub(super) fn start_connect(&mut self, path: u16, now: u64) {
        let slot = &mut self.paths[usize::from(path)];
        slot.recon_cnt = slot.recon_cnt.wrapping_add(1);
        slot.heartbeat.alive();
        for conn in slot.conns.iter_mut() {
            *conn = None;
        }
        self.connect_cid(path, 0, now);
    }

    pub(super) fn connect_cid(&mut self, path: u16, cid: u16, now: u64) {
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let slot = &self.paths[usize::from(path)];
        let req = ConnReq {
            version: VERSION,
            cid,
            cid_num: slot.cid_num,
            recon_cnt: slot.recon_cnt,
            path_uuid: slot.uuid,
            session_uuid: session.uuid,
            first_conn: slot.first_conn,
        };
        let mut buf = [0u8; ConnReq::LEN];
        if req.emit(&mut buf).is_err() {
            self.connect_failed(path, PathError::BadConnRsp, now);
            return;
        }
        let qd = u32::from(self.config.max_queue_depth);
        let send_depth = u16::try_from(4 * qd + 1).unwrap_or(u16::MAX);
        let recv_depth = u16::try_from(self.recv_per_conn + 1).unwrap_or(u16::MAX);
        let params = ConnParams::new(&buf, send_depth, recv_depth);
        let remote = slot.remote;
        match self.verbs.connect(remote, &params) {
            Ok(conn) => {
                let slot = &mut self.paths[usize::from(path)];
                slot.conns[usize::from(cid)] = Some(conn);
                slot.state = PathState::Connecting {
                    cid,
                    deadline: now.saturating_add(self.config.connect_timeout_ns),
                };
            }
            Err(_) => self.connect_failed(path, PathError::Disconnected, now),
        }
    }

    pub(super) fn lookup_conn(&self, conn: ConnId) -> Option<(u16, u16)> {
        let count = self.session.as_ref().map_or(0, |s| s.paths);
        self.paths
            .iter()
            .take(usize::from(count))
            .enumerate()
            .find_map(|(p, slot)| {
                slot.conns
                    .iter()
                    .position(|c| *c == Some(conn))
                    .map(|cid| (p as u16, cid as u16))
            })
    }

    pub(super) fn handle_cm_event(&mut self, event: CmEvent, now: u64) {
        let conn = event.conn();
        let Some((path, cid)) = self.lookup_conn(conn) else {
            // Not ours (any more): release it.
            let _ = self.verbs.destroy(conn);
            return;
        };
        match event {
            CmEvent::Established { private_data, .. } => {
                self.established(path, cid, private_data.as_slice(), now);
            }
            CmEvent::Rejected { private_data, .. } => {
                let errno = ConnRsp::parse(private_data.as_slice()).map_or(0, |r| r.errno);
                self.fail_path(path, PathError::Rejected(errno), now);
                self.forget_conn(path, cid);
            }
            CmEvent::Unreachable { .. } | CmEvent::Disconnected { .. } => {
                self.fail_path(path, PathError::Disconnected, now);
                self.forget_conn(path, cid);
            }
            _ => {}
        }
        self.maybe_disconnected(path, now);
    }

    pub(super) fn forget_conn(&mut self, path: u16, cid: u16) {
        let slot = &mut self.paths[usize::from(path)];
        if let Some(conn) = slot.conns[usize::from(cid)].take() {
            let _ = self.verbs.destroy(conn);
        }
    }

    pub(super) fn established(&mut self, path: u16, cid: u16, private_data: &[u8], now: u64) {
        let PathState::Connecting { cid: expected, .. } = self.paths[usize::from(path)].state
        else {
            return;
        };
        if expected != cid {
            self.fail_path(path, PathError::ProtocolViolation, now);
            return;
        }
        let rsp = match ConnRsp::parse(private_data) {
            Ok(rsp) if rsp.errno == 0 => rsp,
            Ok(rsp) => {
                self.fail_path(path, PathError::Rejected(rsp.errno), now);
                return;
            }
            Err(_) => {
                self.fail_path(path, PathError::BadConnRsp, now);
                return;
            }
        };
        if cid == 0 {
            if let Err(error) = self.accept_conn_rsp(path, &rsp) {
                self.fail_path(path, error, now);
                return;
            }
        }
        let slot = &mut self.paths[usize::from(path)];
        // rtrs.md §2.3: a path that reached cid 0 ESTABLISHED may create the
        // server session from now on.
        slot.first_conn = true;
        let next = cid + 1;
        if next < slot.cid_num {
            self.connect_cid(path, next, now);
            return;
        }
        self.send_info_req(path, now);
    }

    pub(super) fn accept_conn_rsp(&mut self, path: u16, rsp: &ConnRsp) -> Result<(), PathError> {
        let max_qd = self.config.max_queue_depth;
        let session = self.session.as_mut().ok_or(PathError::Local)?;
        if let Some(qd) = session.queue_depth {
            if qd != rsp.queue_depth {
                return Err(PathError::QueueDepthChanged);
            }
        }
        if rsp.queue_depth < 2 || rsp.queue_depth > max_qd {
            return Err(PathError::BadConnRsp);
        }
        let chunk_size = rsp.chunk_size().ok_or(PathError::BadConnRsp)?;
        let layout =
            ImmLayout::for_queue_depth(rsp.queue_depth).map_err(|_| PathError::BadConnRsp)?;
        layout
            .check_chunk_size(chunk_size)
            .map_err(|_| PathError::BadConnRsp)?;
        // The header room must hold at least a WRITE message.
        if rsp.max_hdr_size < WriteMsg::LEN as u32 {
            return Err(PathError::BadConnRsp);
        }
        if session.queue_depth.is_none() {
            session.queue_depth = Some(rsp.queue_depth);
            session.layout = Some(layout);
            self.free_permits.clear();
            for permit in (0..rsp.queue_depth).rev() {
                self.free_permits.push(permit);
            }
        }
        let slot = &mut self.paths[usize::from(path)];
        slot.chunk_size = chunk_size;
        slot.max_hdr_size = rsp.max_hdr_size;
        slot.max_io_size = rsp.max_io_size;
        slot.new_rkey = rsp.flags.contains(ConnRspFlags::NEW_RKEY);
        Ok(())
    }

    pub(super) fn send_info_req(&mut self, path: u16, now: u64) {
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let slot = &self.paths[usize::from(path)];
        let (Some(control), Some(conn)) = (slot.control, slot.conns[0]) else {
            return;
        };
        let qd = u32::from(session.queue_depth.unwrap_or(self.config.max_queue_depth));
        let mut info = [0u8; InfoReq::LEN];
        let result = InfoReq {
            session_name: session.name.as_str(),
        }
        .emit(&mut info);
        if result.is_err() || self.verbs.write(control.handle, 0, &info).is_err() {
            self.fail_path(path, PathError::PostFailed, now);
            return;
        }
        let recv = RecvWr {
            wr_id: wr_id(KIND_INFO_RSP, path, 0, 0),
            sgl: Sgl::single(control.sge(INFO_REQ_AREA, 8 + 16 * qd)),
        };
        let send = SendWr {
            wr_id: wr_id(KIND_CONTROL, path, 0, 0),
            signaled: true,
            op: SendOp::Send {
                sgl: Sgl::single(control.sge(0, InfoReq::LEN as u32)),
                imm: None,
            },
        };
        if self.verbs.post_recv(conn, &[recv]).is_err()
            || self.verbs.post_send(conn, &[send]).is_err()
        {
            self.fail_path(path, PathError::PostFailed, now);
            return;
        }
        self.paths[usize::from(path)].state = PathState::WaitingForInfoRsp {
            deadline: now.saturating_add(self.config.connect_timeout_ns),
        };
    }

    pub(super) fn info_rsp(&mut self, path: u16, wc: &WorkCompletion, now: u64) {
        if !matches!(
            self.paths[usize::from(path)].state,
            PathState::WaitingForInfoRsp { .. }
        ) {
            return;
        }
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let qd = session.queue_depth.unwrap_or(0);
        let slot = &mut self.paths[usize::from(path)];
        let Some(control) = slot.control else {
            return;
        };
        let chunk_size = slot.chunk_size;
        let len = wc.byte_len.min(8 + 16 * u32::from(qd));
        let chunks = &mut slot.chunks;
        let result = self
            .verbs
            .with_slice(control.handle, INFO_REQ_AREA, len, |bytes| {
                let rsp = InfoRsp::parse(bytes).map_err(|_| PathError::BadInfoRsp)?;
                rsp.check_layout(qd, chunk_size)
                    .map_err(|_| PathError::BadInfoRsp)?;
                for id in 0..qd {
                    chunks[usize::from(id)] = rsp
                        .chunk(chunk_size, u32::from(id))
                        .ok_or(PathError::BadInfoRsp)?;
                }
                Ok(())
            })
            .unwrap_or(Err(PathError::BadInfoRsp));
        if let Err(error) = result {
            self.fail_path(path, error, now);
            return;
        }
        if let Err(error) = self.post_io_receives(path) {
            self.fail_path(path, error, now);
            return;
        }
        let interval = self.config.heartbeat_interval_ns;
        let slot = &mut self.paths[usize::from(path)];
        slot.state = PathState::Connected;
        slot.heartbeat.start(now, interval);
        slot.attempts = 0;
        if slot.ever_up {
            slot.stats.reconnects += 1;
        }
        slot.ever_up = true;
        let max_io = slot.max_io_size;
        self.push_event(Event::PathUp { path });
        if let Some(session) = self.session.as_mut() {
            session.max_io_size = if session.max_io_size == 0 {
                max_io
            } else {
                session.max_io_size.min(max_io)
            };
            if !session.up {
                session.up = true;
                let reconnected = session.was_up;
                session.was_up = true;
                let max_io_size = session.max_io_size;
                self.push_event(Event::SessionUp {
                    reconnected,
                    max_io_size,
                });
            }
        }
    }

    pub(super) fn post_io_receives(&mut self, path: u16) -> Result<(), PathError> {
        let slot = &self.paths[usize::from(path)];
        let control = slot.control.ok_or(PathError::PostFailed)?;
        for cid in 0..slot.cid_num {
            let conn = slot.conns[usize::from(cid)].ok_or(PathError::PostFailed)?;
            for index in 0..self.recv_per_conn {
                let recv = self.recv_wr(control, path, cid, index);
                self.verbs
                    .post_recv(conn, &[recv])
                    .map_err(|_| PathError::PostFailed)?;
            }
        }
        Ok(())
    }

    pub(super) fn recv_wr(&self, control: MemoryRegion, path: u16, cid: u16, index: u32) -> RecvWr {
        let qd = u32::from(self.config.max_queue_depth);
        let base = INFO_REQ_AREA + 8 + 16 * qd;
        let slot = u32::from(cid) * self.recv_per_conn + index;
        RecvWr {
            wr_id: wr_id(KIND_RECV, path, cid, index),
            sgl: Sgl::single(control.sge(base + slot * RECV_SLOT, RECV_SLOT)),
        }
    }

    pub(super) fn repost(&mut self, path: u16, cid: u16, index: u32, now: u64) {
        let slot = &self.paths[usize::from(path)];
        let (Some(control), Some(Some(conn))) = (slot.control, slot.conns.get(usize::from(cid)))
        else {
            return;
        };
        let conn = *conn;
        if index >= self.recv_per_conn {
            return;
        }
        let recv = self.recv_wr(control, path, cid, index);
        if self.verbs.post_recv(conn, &[recv]).is_err() {
            self.fail_path(path, PathError::PostFailed, now);
        }
    }
}

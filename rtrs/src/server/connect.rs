//! Connection requests (rtrs.md §2.4): finding or creating the session and
//! path a CON_REQ names, accepting or rejecting it, and the CM events of
//! accepted connections.

use super::*;

impl<V: Verbs> Server<V> {
    // ----- connection management ----------------------------------------------

    pub(super) fn handle_cm_event(&mut self, port: usize, event: CmEvent, now: u64) {
        match event {
            CmEvent::ConnectRequest {
                conn,
                local,
                remote,
                private_data,
            } => self.handle_connect_request(
                port,
                conn,
                (local, remote),
                private_data.as_slice(),
                now,
            ),
            CmEvent::Established { .. } => {} // Linux ignores it too (rtrs.md §2.7).
            CmEvent::Disconnected { conn }
            | CmEvent::Unreachable { conn }
            | CmEvent::Rejected { conn, .. } => {
                if let Some((path, _)) = self.lookup_conn(port, conn) {
                    self.begin_close(path, CloseReason::Disconnected, now);
                    self.detach_conn(path, conn);
                    self.maybe_free_path(path);
                } else {
                    let _ = self.ports[port].destroy(conn);
                }
            }
            _ => {}
        }
    }

    pub(super) fn reject(&mut self, port: usize, conn: ConnId, refusal: ConnectRefusal) {
        let mut buf = [0u8; ConnRsp::LEN];
        let rsp = ConnRsp::reject(refusal.errno() as i16);
        let len = rsp.emit(&mut buf).unwrap_or(0);
        // A failed reject leaves nothing of ours behind; the provider times it out.
        let _ = self.ports[port].reject(conn, &buf[..len]);
        self.stats.rejected += 1;
    }

    /// The CONN_RSP this server accepts with (rtrs.md §2.5).
    pub fn conn_rsp(&self) -> ConnRsp {
        let flags = if self.config.always_invalidate {
            ConnRspFlags::NEW_RKEY
        } else {
            ConnRspFlags(0)
        };
        ConnRsp::accept(
            self.config.queue_depth,
            self.config.max_io_size(),
            self.config.max_hdr_size,
            flags,
        )
    }

    pub(super) fn handle_connect_request(
        &mut self,
        port: usize,
        conn: ConnId,
        addresses: (SocketAddr, SocketAddr),
        private_data: &[u8],
        now: u64,
    ) {
        let remote = addresses.1;
        match self.admit(port, private_data, addresses, now) {
            Ok((path, cid)) => {
                if let Err(refusal) = self.accept(conn, remote, path, cid) {
                    self.reject(port, conn, refusal);
                    self.begin_close(path, CloseReason::PostFailed, now);
                    self.maybe_free_path(path);
                }
            }
            Err(refusal) => self.reject(port, conn, refusal),
        }
    }

    /// Steps 1-5 of rtrs.md §2.4: find or create session and path. The
    /// session is found by uuid whatever port the request came on; a new
    /// path lives on `port`, and a path's further connections must come on
    /// that port too.
    pub(super) fn admit(
        &mut self,
        port: usize,
        private_data: &[u8],
        addresses: (SocketAddr, SocketAddr),
        now: u64,
    ) -> Result<(u16, u16), ConnectRefusal> {
        let req = ConnReq::parse(private_data).map_err(ConnectRefusal::Malformed)?;
        if req.cid_num > self.config.max_connections_per_path {
            return Err(ConnectRefusal::TooManyConnections);
        }
        let session = match self.find_session(req.session_uuid) {
            Some(index) => index,
            None if !req.first_conn => return Err(ConnectRefusal::NoSession),
            None => self.create_session(req.session_uuid)?,
        };
        let existing = self.paths.iter().position(|p| {
            p.session == session
                && matches!(p.state, PathState::Connecting | PathState::Connected)
                && p.uuid == req.path_uuid
        });
        let path = match existing {
            Some(index) => {
                let path = &self.paths[index];
                let newer = is_newer(req.recon_cnt, path.recon_cnt);
                if newer {
                    // A reconnect: the client gave the old path up (rtrs.md §6.2).
                    let index = index as u16;
                    self.begin_close(index, CloseReason::Replaced, now);
                    self.sessions[usize::from(session)].stats.reconnects += 1;
                    self.maybe_free_path(index);
                    self.create_path(port, session, &req, addresses, now)?
                } else if path.state != PathState::Connecting {
                    return Err(ConnectRefusal::PathStillUp);
                } else if path.port != port
                    || path.cid_num != req.cid_num
                    || path
                        .conns
                        .get(usize::from(req.cid))
                        .is_none_or(Option::is_some)
                {
                    return Err(ConnectRefusal::ConnectionMismatch);
                } else {
                    index as u16
                }
            }
            None => {
                let result = self.create_path(port, session, &req, addresses, now);
                if result.is_err() {
                    self.maybe_free_session(session);
                }
                result?
            }
        };
        Ok((path, req.cid))
    }

    pub(super) fn find_session(&self, uuid: Uuid) -> Option<u16> {
        self.sessions
            .iter()
            .position(|s| s.live && s.uuid == uuid)
            .map(|i| i as u16)
    }

    pub(super) fn create_session(&mut self, uuid: Uuid) -> Result<u16, ConnectRefusal> {
        let index = self
            .sessions
            .iter()
            .position(|s| !s.live)
            .ok_or(ConnectRefusal::TooManySessions)?;
        let slot = &mut self.sessions[index];
        slot.live = true;
        slot.uuid = uuid;
        slot.generation = slot.generation.wrapping_add(1);
        slot.name.clear();
        slot.paths_up = 0;
        slot.stats = Stats::default();
        Ok(index as u16)
    }

    pub(super) fn maybe_free_session(&mut self, session: u16) {
        let used = self
            .paths
            .iter()
            .any(|p| p.state != PathState::Free && p.session == session);
        if !used {
            let slot = &mut self.sessions[usize::from(session)];
            slot.live = false;
            slot.name.clear();
        }
    }

    pub(super) fn create_path(
        &mut self,
        port: usize,
        session: u16,
        req: &ConnReq,
        addresses: (SocketAddr, SocketAddr),
        now: u64,
    ) -> Result<u16, ConnectRefusal> {
        let live = || {
            self.paths.iter().filter(|p| {
                p.session == session
                    && matches!(p.state, PathState::Connecting | PathState::Connected)
            })
        };
        // One path per (local, remote) address pair; ports differ per
        // connection, so only the addresses count (rtrs.md §2.4, §7).
        let same = |(a, b): (SocketAddr, SocketAddr)| {
            a.ip() == addresses.0.ip() && b.ip() == addresses.1.ip()
        };
        if live().any(|p| p.addresses.is_some_and(same)) {
            return Err(ConnectRefusal::PathExists);
        }
        let live = live().count();
        if live >= usize::from(self.config.max_paths_per_session) {
            return Err(ConnectRefusal::TooManyPaths);
        }
        let index = self
            .paths
            .iter()
            .position(|p| p.state == PathState::Free)
            .ok_or(ConnectRefusal::TooManyPaths)?;
        let path = &mut self.paths[index];
        path.reset(
            port,
            session,
            req,
            now.saturating_add(self.config.setup_timeout_ns),
        );
        path.addresses = Some(addresses);
        if let Err(refusal) = self.allocate_pool(index) {
            self.release_pool(index);
            self.paths[index].state = PathState::Free;
            return Err(refusal);
        }
        Ok(index as u16)
    }

    /// Allocates and registers the chunk pool and control buffers of a path
    /// on the path's port.

    /// Steps 6-7 of rtrs.md §2.4.
    pub(super) fn accept(
        &mut self,
        conn: ConnId,
        remote: SocketAddr,
        path: u16,
        cid: u16,
    ) -> Result<(), ConnectRefusal> {
        let port = self.port_of(path);
        let id = self.path_id(path);
        let qd = self.config.queue_depth;
        let (send_depth, recv_depth) = if cid == 0 {
            let depth = 2 * wire::SERVICE_CON_QUEUE_DEPTH + 2;
            (depth, depth)
        } else {
            let per = if self.config.always_invalidate { 5 } else { 3 };
            let send = u32::from(qd) * per + 1;
            (
                u16::try_from(send).unwrap_or(u16::MAX),
                qd.saturating_add(1),
            )
        };
        if cid == 0 {
            let Some(info) = self.paths[usize::from(path)].info_req else {
                return Err(ConnectRefusal::OutOfMemory);
            };
            let recv = RecvWr {
                wr_id: wr_id(WrKind::RecvInfo, id, 0),
                sgl: Sgl::single(info.sge(0, info.len())),
            };
            self.ports[port]
                .post_recv(conn, &[recv])
                .map_err(|_| ConnectRefusal::OutOfMemory)?;
        }
        let mut buf = [0u8; ConnRsp::LEN];
        let len = self.conn_rsp().emit(&mut buf).unwrap_or(0);
        let params = ConnParams::new(&buf[..len], send_depth, recv_depth);
        self.ports[port]
            .accept(conn, &params)
            .map_err(|_| ConnectRefusal::ConnectionMismatch)?;
        let slot = &mut self.paths[usize::from(path)];
        if let Some(entry) = slot.conns.get_mut(usize::from(cid)) {
            *entry = Some(conn);
        }
        if cid == 0 {
            slot.remote = Some(remote);
        }
        if self.connections.len() < self.connections.capacity() {
            self.connections.push(Connection {
                port,
                conn,
                path,
                cid,
            });
        }
        self.stats.accepted += 1;
        Ok(())
    }
}

/// Whether reconnect counter `new` is after `old` (wrapping le16).
pub(super) fn is_newer(new: u16, old: u16) -> bool {
    let diff = new.wrapping_sub(old);
    diff != 0 && diff < 0x8000
}

//! Connection requests (rtrs.md §2.4): finding or creating the session and
//! path a CON_REQ names, accepting or rejecting it, and the CM events of
//! accepted connections.

use core::net::SocketAddr;

use verbs::{CmEvent, ConnId, ConnParams, RecvWr, Sgl, Verbs};

use super::table::PathState;
use super::{wr_id, CloseReason, ConnectRefusal, Connection, Lent, Server, Stats, WrKind};
use crate::wire::{self, ConnReq, ConnRsp, ConnRspFlags, Uuid};

impl<V: Verbs> Lent<'_, V> {
    // ----- connection management ----------------------------------------------

    #[cold]
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
        self.server.stats.rejected += 1;
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

    /// Steps 1-5 of rtrs.md §2.4, without the memory: find the path a
    /// CON_REQ belongs to or create a half-open one. The session is only
    /// looked up here (by uuid, whatever port the request came on); it is
    /// joined or created when the path's INFO_REQ is admitted
    /// (admission.rs). A new path lives on `port`, and its further
    /// connections must come on that port and from the same address.
    pub(super) fn admit(
        &mut self,
        port: usize,
        private_data: &[u8],
        addresses: (SocketAddr, SocketAddr),
        now: u64,
    ) -> Result<(u16, u16), ConnectRefusal> {
        let req = ConnReq::parse(private_data).map_err(ConnectRefusal::Malformed)?;
        if req.cid_num > self.server.config.max_connections_per_path {
            return Err(ConnectRefusal::TooManyConnections);
        }
        let source = addresses.1.ip();
        let existing = self.server.paths.iter().position(|p| {
            p.is_live() && p.session_uuid == req.session_uuid && p.uuid == req.path_uuid
        });
        // The session is known if open, or if a half-open path asks for it
        // (Linux creates the session at the first CON_REQ, so a second path
        // with `first_conn = 0` finds it; here either path may create it
        // at INFO_REQ, whichever is admitted first).
        let known = self.find_session(req.session_uuid).is_some()
            || self
                .paths
                .iter()
                .any(|p| p.state == PathState::Connecting && p.session_uuid == req.session_uuid);
        let Some(index) = existing else {
            if !known {
                if !req.first_conn {
                    return Err(ConnectRefusal::NoSession);
                }
                let open = self.server.sessions.iter().filter(|s| s.open).count();
                if open >= usize::from(self.server.config.max_sessions) {
                    return Err(ConnectRefusal::TooManySessions);
                }
            }
            let path = self.create_path(port, &req, addresses, now)?;
            self.server.paths[usize::from(path)].first_conn |= known;
            return Ok((path, req.cid));
        };
        let path = &self.server.paths[index];
        if is_newer(req.recon_cnt, path.recon_cnt) {
            // A reconnect: the client gave the old path up (rtrs.md §6.2).
            // Only the path's own client may say so, and only when the old
            // path shows it: half-open, or silent for a heartbeat interval.
            let stale = path.state == PathState::Connecting || path.heartbeat.is_stale();
            if path.source() != Some(source) || !stale {
                self.server.stats.takeovers_refused += 1;
                return Err(ConnectRefusal::PathStillUp);
            }
            let session = path.session;
            let index = index as u16;
            self.begin_close(index, CloseReason::Replaced, now);
            self.server.stats.paths_replaced += 1;
            if let Some(session) = session {
                self.server.sessions[usize::from(session)].stats.reconnects += 1;
            }
            self.maybe_free_path(index);
            let path = self.create_path(port, &req, addresses, now)?;
            self.server.paths[usize::from(path)].first_conn |= known;
            return Ok((path, req.cid));
        }
        if path.state != PathState::Connecting {
            return Err(ConnectRefusal::PathStillUp);
        }
        if path.port != port
            || path.source() != Some(source)
            || path.cid_num != req.cid_num
            || path
                .conns
                .get(usize::from(req.cid))
                .is_none_or(Option::is_some)
        {
            return Err(ConnectRefusal::ConnectionMismatch);
        }
        Ok((index as u16, req.cid))
    }

    /// The open session with `uuid`.
    pub(super) fn find_session(&self, uuid: Uuid) -> Option<u16> {
        self.server
            .sessions
            .iter()
            .position(|s| s.live && s.open && s.uuid == uuid)
            .map(|i| i as u16)
    }

    /// Takes a free session slot for a newly admitted session.
    pub(super) fn create_session(&mut self, uuid: Uuid) -> Option<u16> {
        let index = self.server.sessions.iter().position(|s| !s.live)?;
        let slot = &mut self.server.sessions[index];
        slot.live = true;
        slot.open = true;
        slot.uuid = uuid;
        slot.generation = slot.generation.wrapping_add(1);
        slot.name.clear();
        slot.paths_up = 0;
        slot.stats = Stats::default();
        Some(index as u16)
    }

    /// Frees session slot `session` once no path belongs to it.
    pub(super) fn maybe_free_session(&mut self, session: u16) {
        let used = self
            .paths
            .iter()
            .any(|p| p.state != PathState::Free && p.session == Some(session));
        if !used {
            let slot = &mut self.server.sessions[usize::from(session)];
            slot.live = false;
            slot.open = false;
            slot.name.clear();
        }
    }

    /// A new half-open path for `req` from `addresses`, within the path and
    /// half-open limits: when `max_half_open` are, the oldest half-open
    /// path is evicted if it has been in setup a quarter of the deadline,
    /// else the newcomer is refused; a client address with
    /// `max_half_open_per_source` is refused. It holds its INFO_REQ
    /// receive buffer and, as they come, its connections; nothing else.
    pub(super) fn create_path(
        &mut self,
        port: usize,
        req: &ConnReq,
        addresses: (SocketAddr, SocketAddr),
        now: u64,
    ) -> Result<u16, ConnectRefusal> {
        let uuid = req.session_uuid;
        let live = || {
            self.server
                .paths
                .iter()
                .filter(move |p| p.is_live() && p.session_uuid == uuid)
        };
        // One path per (local, remote) address pair; ports differ per
        // connection, so only the addresses count (rtrs.md §2.4, §7).
        let same = |(a, b): (SocketAddr, SocketAddr)| {
            a.ip() == addresses.0.ip() && b.ip() == addresses.1.ip()
        };
        if live().any(|p| p.addresses.is_some_and(same)) {
            return Err(ConnectRefusal::PathExists);
        }
        if live().count() >= usize::from(self.server.config.max_paths_per_session) {
            return Err(ConnectRefusal::TooManyPaths);
        }
        let source = addresses.1.ip();
        let half_open = || {
            self.server
                .paths
                .iter()
                .filter(|p| p.state == PathState::Connecting)
        };
        let from_source = half_open().filter(|p| p.source() == Some(source)).count();
        if from_source >= usize::from(self.server.config.max_half_open_per_source) {
            self.server.stats.half_open_refused += 1;
            return Err(ConnectRefusal::TooManyHalfOpen);
        }
        if !self.server.setup_rate.take(source, now) {
            self.server.stats.setup_rate_refused += 1;
            return Err(ConnectRefusal::SetupRateExceeded);
        }
        if half_open().count() >= usize::from(self.server.config.max_half_open) {
            // The oldest half-open path has the earliest setup deadline. It
            // makes room only once it has been in setup for a quarter of
            // the deadline: a path that slow is stalling, while a rack of
            // hosts connecting at once sets each path up in milliseconds,
            // and evicting those would let none finish. Until then the
            // newcomer is refused (ENOMEM) and its client retries.
            let oldest = (0..self.server.paths.len())
                .filter(|&i| self.server.paths[i].state == PathState::Connecting)
                .min_by_key(|&i| self.server.paths[i].setup_deadline);
            let stalled_by = now.saturating_add(
                self.server.config.setup_timeout_ns - self.server.config.setup_timeout_ns / 4,
            );
            match oldest {
                Some(oldest) if self.server.paths[oldest].setup_deadline <= stalled_by => {
                    self.server.stats.half_open_evicted += 1;
                    self.begin_close(oldest as u16, CloseReason::Evicted, now);
                    self.maybe_free_path(oldest as u16);
                }
                _ => {
                    self.server.stats.half_open_refused += 1;
                    return Err(ConnectRefusal::TooManyHalfOpen);
                }
            }
        }
        let index = self
            .paths
            .iter()
            .position(|p| p.state == PathState::Free)
            .ok_or(ConnectRefusal::TooManyPaths)?;
        let path = &mut self.server.paths[index];
        path.reset(
            port,
            req,
            now.saturating_add(self.server.config.setup_timeout_ns),
        );
        path.addresses = Some(addresses);
        self.server.path_taken(index);
        if let Err(refusal) = self.allocate_info_req(index) {
            self.release_pool(index);
            self.server.paths[index].state = PathState::Free;
            self.server.path_freed(index);
            return Err(refusal);
        }
        Ok(index as u16)
    }

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
        let qd = self.server.config.queue_depth;
        let (send_depth, recv_depth) = if cid == 0 {
            let depth = 2 * wire::SERVICE_CON_QUEUE_DEPTH + 2;
            (depth, depth)
        } else {
            let per = if self.server.config.always_invalidate {
                5
            } else {
                3
            };
            let send = u32::from(qd) * per + 1;
            (
                u16::try_from(send).unwrap_or(u16::MAX),
                qd.saturating_add(1),
            )
        };
        if cid == 0 {
            let Some(info) = self.server.paths[usize::from(path)].info_req else {
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
        let slot = &mut self.server.paths[usize::from(path)];
        if let Some(entry) = slot.conns.get_mut(usize::from(cid)) {
            *entry = Some(conn);
        }
        if cid == 0 {
            slot.remote = Some(remote);
        }
        if self.server.connections.len() < self.server.connections.capacity() {
            self.server.connections.push(Connection {
                port,
                conn,
                path,
                cid,
            });
        }
        self.server.stats.accepted += 1;
        Ok(())
    }
}

/// Whether reconnect counter `new` is after `old` (wrapping le16).
pub(super) fn is_newer(new: u16, old: u16) -> bool {
    let diff = new.wrapping_sub(old);
    diff != 0 && diff < 0x8000
}

impl<V: Verbs> Server<V> {
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
}

//! The IO path (rtrs.md §4): path choice, request layout and posting,
//! responses, and the completions of every work request.

use super::*;

impl<V: Verbs> Client<V> {
    pub(super) fn choose_path(&mut self, exclude: Option<u16>) -> Option<u16> {
        let count = self.session.as_ref()?.paths;
        let usable =
            |p: u16, slot: &PathSlot| slot.state == PathState::Connected && Some(p) != exclude;
        match self.config.policy {
            MultipathPolicy::MinInflight => (0..count)
                .filter(|&p| usable(p, &self.paths[usize::from(p)]))
                .min_by_key(|&p| self.paths[usize::from(p)].stats.inflight),
            MultipathPolicy::RoundRobin => {
                for step in 1..=count {
                    let p = (self.rr_path + step) % count;
                    if usable(p, &self.paths[usize::from(p)]) {
                        self.rr_path = p;
                        return Some(p);
                    }
                }
                None
            }
        }
    }

    /// Submits a request: takes a permit, lays the request out per rtrs.md
    /// §4.3 (write) or §4.4 (read), and posts it on a connected path chosen
    /// by the policy (cid 0 for admin, else the hint or round-robin over the
    /// IO cids). The completion arrives as [`Event::IoCompleted`].
    ///
    /// # Errors
    ///
    /// [`SubmitError`]; nothing is posted and no permit is held then.
    pub fn submit(&mut self, io: ClientIo<'_>) -> Result<(), SubmitError> {
        if !self.is_up() {
            return Err(SubmitError::NotConnected);
        }
        let usr_len = u32::try_from(io.header.len()).map_err(|_| SubmitError::HeaderTooLong)?;
        if usr_len > self.config.max_header_len || usr_len > u32::from(u16::MAX) {
            return Err(SubmitError::HeaderTooLong);
        }
        let path = self.choose_path(None).ok_or(SubmitError::NotConnected)?;
        let permit = *self.free_permits.last().ok_or(SubmitError::NoPermit)?;
        let header_offset = u32::from(permit) * self.header_stride;
        let mut sgl = Sgl::new();
        let (remote_offset, msg_len, data_len, read) = match &io.direction {
            Direction::Write { data } => {
                if data.len() >= verbs::MAX_SGE {
                    return Err(SubmitError::TooManySegments);
                }
                let data_len = data.total_len().ok_or(SubmitError::TooManySegments)?;
                for sge in data.as_slice() {
                    sgl.push(*sge).map_err(|_| SubmitError::TooManySegments)?;
                }
                let mut msg = [0u8; WriteMsg::LEN];
                let n = WriteMsg {
                    usr_len: usr_len as u16,
                }
                .emit(&mut msg)
                .map_err(|_| SubmitError::HeaderTooLong)?;
                self.write_header(header_offset, io.header, &msg[..n])?;
                (0, n as u32, data_len, None)
            }
            Direction::Read { dest } => {
                let end = dest.offset.checked_add(dest.len);
                if end.is_none_or(|end| end > dest.region.len()) {
                    return Err(SubmitError::TooLarge);
                }
                let desc = (dest.len > 0).then(|| BufferDesc {
                    addr: dest.region.iova.wrapping_add(u64::from(dest.offset)),
                    rkey: dest.region.rkey,
                    len: dest.len,
                });
                let mut msg = [0u8; READ_MSG_LEN as usize];
                let n = ReadMsg {
                    usr_len: usr_len as u16,
                    flags: ReadFlags(0),
                    desc,
                }
                .emit(&mut msg)
                .map_err(|_| SubmitError::HeaderTooLong)?;
                self.write_header(header_offset, io.header, &msg[..n])?;
                (dest.len, n as u32, dest.len, Some(*dest))
            }
        };
        sgl.push(self.headers.sge(header_offset, usr_len + msg_len))
            .map_err(|_| SubmitError::TooManySegments)?;
        let imm_offset = data_len.checked_add(usr_len).ok_or(SubmitError::TooLarge)?;
        let request = &mut self.requests[usize::from(permit)];
        request.tag = io.tag;
        request.sgl = sgl;
        request.remote_offset = remote_offset;
        request.imm_offset = imm_offset;
        request.admin = io.admin;
        request.hint = io.hint;
        request.read = read;
        request.data_len = data_len;
        request.header_len = usr_len + msg_len;
        self.check_fits(permit, path)?;
        self.post_request(permit, path)?;
        self.free_permits.pop();
        Ok(())
    }

    pub(super) fn write_header(
        &mut self,
        offset: u32,
        header: &[u8],
        msg: &[u8],
    ) -> Result<(), SubmitError> {
        let handle = self.headers.handle;
        self.verbs
            .write(handle, offset, header)
            .and_then(|()| self.verbs.write(handle, offset + header.len() as u32, msg))
            .map_err(|_| SubmitError::HeaderTooLong)
    }

    /// rtrs.md §4.3/§4.4 limits against the path's CONN_RSP:
    /// `usr_len + message <= max_hdr_size`,
    /// `data_len + usr_len + message <= chunk_size`, `data_len <= max_io_size`.
    pub(super) fn check_fits(&self, permit: u16, path: u16) -> Result<(), SubmitError> {
        let request = &self.requests[usize::from(permit)];
        let slot = &self.paths[usize::from(path)];
        if request.header_len > slot.max_hdr_size {
            return Err(SubmitError::HeaderTooLong);
        }
        let end = request
            .data_len
            .checked_add(request.header_len)
            .ok_or(SubmitError::TooLarge)?;
        if end > slot.chunk_size || request.data_len > slot.max_io_size {
            return Err(SubmitError::TooLarge);
        }
        Ok(())
    }

    /// Posts request `permit` on `path` (first submission or failover).
    pub(super) fn post_request(&mut self, permit: u16, path: u16) -> Result<(), SubmitError> {
        self.check_fits(permit, path)?;
        let layout = self
            .session
            .as_ref()
            .and_then(|s| s.layout)
            .ok_or(SubmitError::NotConnected)?;
        let request = &mut self.requests[usize::from(permit)];
        let slot = &mut self.paths[usize::from(path)];
        let cid = if request.admin || slot.cid_num == 1 {
            0
        } else {
            let io_cids = slot.cid_num - 1;
            match request.hint {
                Some(hint) => 1 + hint % io_cids,
                None => {
                    slot.rr_cid = (slot.rr_cid + 1) % io_cids;
                    1 + slot.rr_cid
                }
            }
        };
        let conn = slot.conns[usize::from(cid)].ok_or(SubmitError::NotConnected)?;
        let chunk = slot.chunks[usize::from(permit)];
        let payload = layout
            .join(u32::from(permit), request.imm_offset)
            .ok_or(SubmitError::TooLarge)?;
        let imm = Imm::IoReq { payload }
            .encode()
            .map_err(|_| SubmitError::TooLarge)?;
        let generation = request.generation.wrapping_add(1);
        let wr = SendWr {
            wr_id: wr_id(
                KIND_REQUEST,
                path,
                cid,
                u32::from(permit) | u32::from(generation) << 16,
            ),
            signaled: true,
            op: SendOp::RdmaWrite {
                sgl: request.sgl.clone(),
                remote_addr: chunk.addr.wrapping_add(u64::from(request.remote_offset)),
                rkey: chunk.rkey,
                imm: Some(imm),
            },
        };
        self.verbs
            .post_send(conn, core::slice::from_ref(&wr))
            .map_err(SubmitError::Post)?;
        request.generation = generation;
        request.state = RequestState::InFlight {
            path,
            send_done: false,
            response: None,
        };
        slot.stats.inflight += 1;
        Ok(())
    }

    /// Completes request `permit` to the consumer and frees the permit.
    pub(super) fn finish(&mut self, permit: u16, errno: u16, _now: u64) {
        let request = &mut self.requests[usize::from(permit)];
        let mut answered_on = None;
        if let RequestState::InFlight { path, .. } = request.state {
            answered_on = Some(path);
            let slot = &mut self.paths[usize::from(path)];
            slot.stats.inflight = slot.stats.inflight.saturating_sub(1);
            if errno != 0 {
                slot.stats.errors += 1;
            }
            if errno == 0 {
                if request.read.is_some() {
                    slot.stats.reads += 1;
                    slot.stats.read_bytes += u64::from(request.data_len);
                } else {
                    slot.stats.writes += 1;
                    slot.stats.write_bytes += u64::from(request.data_len);
                }
            }
        }
        request.state = RequestState::Free;
        let event = Event::IoCompleted {
            tag: request.tag,
            errno,
            answered_on,
            read: request.read,
        };
        self.free_permits.push(permit);
        self.push_event(event);
    }

    /// Records a response for `msg_id` on `path`.
    pub(super) fn response(&mut self, path: u16, msg_id: u32, errno: u16, now: u64) {
        let qd = u32::from(self.queue_depth().unwrap_or(0));
        let Some(request) = (msg_id < qd)
            .then(|| self.requests.get_mut(msg_id as usize))
            .flatten()
        else {
            self.paths[usize::from(path)].stats.protocol_errors += 1;
            return;
        };
        match request.state {
            RequestState::InFlight {
                path: on,
                send_done,
                response: None,
            } if on == path => {
                if send_done {
                    self.finish(msg_id as u16, errno, now);
                } else {
                    request.state = RequestState::InFlight {
                        path,
                        send_done,
                        response: Some(errno),
                    };
                }
            }
            // Not in flight on this path: ignored (rtrs.md §4.6).
            _ => self.paths[usize::from(path)].stats.protocol_errors += 1,
        }
    }

    pub(super) fn send_done(&mut self, path: u16, low: u32, now: u64) {
        let permit = (low & 0xffff) as u16;
        let generation = (low >> 16) as u16;
        let Some(request) = self.requests.get_mut(usize::from(permit)) else {
            return;
        };
        if request.generation != generation {
            return;
        }
        if let RequestState::InFlight {
            path: on, response, ..
        } = request.state
        {
            if on != path {
                return;
            }
            match response {
                Some(errno) => self.finish(permit, errno, now),
                None => {
                    request.state = RequestState::InFlight {
                        path,
                        send_done: true,
                        response: None,
                    }
                }
            }
        }
    }

    // ----- completions ------------------------------------------------------

    pub(super) fn handle_completion(&mut self, wc: WorkCompletion, now: u64) {
        let (kind, _, _, low) = split_wr_id(wc.wr_id);
        let Some((path, cid)) = self.lookup_conn(wc.conn) else {
            return;
        };
        let state = self.paths[usize::from(path)].state;
        if matches!(
            state,
            PathState::Disconnecting { .. } | PathState::WaitingToReconnect { .. }
        ) {
            return;
        }
        if !wc.status.is_success() {
            if wc.status != WcStatus::WrFlushErr {
                self.fail_path(path, PathError::CompletionError, now);
            }
            return;
        }
        match kind {
            KIND_REQUEST => self.send_done(path, low, now),
            KIND_CONTROL => {}
            KIND_INFO_RSP => {
                self.paths[usize::from(path)].heartbeat.alive();
                self.info_rsp(path, &wc, now);
            }
            KIND_RECV => {
                if state != PathState::Connected {
                    return;
                }
                self.paths[usize::from(path)].heartbeat.alive();
                self.receive(path, cid, low, &wc, now);
            }
            _ => {}
        }
    }

    pub(super) fn receive(
        &mut self,
        path: u16,
        cid: u16,
        index: u32,
        wc: &WorkCompletion,
        now: u64,
    ) {
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                self.repost(path, cid, index, now);
                match Imm::decode(wc.imm.unwrap_or(u32::MAX)) {
                    Imm::HbMsg => self.send_heartbeat(path, Imm::HbAck, now),
                    Imm::HbAck => {
                        let slot = &mut self.paths[usize::from(path)];
                        slot.stats.heartbeats_acked += 1;
                        slot.stats.latency_ns = now.saturating_sub(slot.heartbeat_sent_at);
                    }
                    Imm::IoRsp { msg_id, errno } | Imm::IoRspWithInvalidate { msg_id, errno } => {
                        self.response(path, msg_id, errno, now);
                    }
                    Imm::IoReq { .. } | Imm::Unknown(_) => {
                        self.paths[usize::from(path)].stats.protocol_errors += 1;
                    }
                }
            }
            WcOpcode::Recv => {
                if wc.invalidated_rkey.is_some() || wc.byte_len == 0 {
                    // The SEND_WITH_INV half of a pair (we never ask for it).
                    self.repost(path, cid, index, now);
                    return;
                }
                let result = self.rkey_rsp(path, cid, index, wc);
                self.repost(path, cid, index, now);
                match result {
                    Ok((msg_id, errno)) => self.response(path, msg_id, errno, now),
                    Err(error) => self.fail_path(path, error, now),
                }
            }
            _ => {}
        }
    }

    /// RKEY_RSP (rtrs.md §4.6): new rkey for the chunk, then the response.
    pub(super) fn rkey_rsp(
        &mut self,
        path: u16,
        cid: u16,
        index: u32,
        wc: &WorkCompletion,
    ) -> Result<(u32, u16), PathError> {
        let qd = self.queue_depth().unwrap_or(0);
        let slot = &self.paths[usize::from(path)];
        let control = slot.control.ok_or(PathError::ProtocolViolation)?;
        if !slot.new_rkey || wc.byte_len < RkeyRsp::LEN as u32 || index >= self.recv_per_conn {
            return Err(PathError::ProtocolViolation);
        }
        let sge = self.recv_wr(control, path, cid, index).sgl.as_slice()[0];
        let rsp = self
            .verbs
            .with_slice(control.handle, sge.offset, RECV_SLOT, RkeyRsp::parse)
            .map_err(|_| PathError::ProtocolViolation)?
            .map_err(|_| PathError::ProtocolViolation)?;
        if rsp.buf_id >= qd {
            return Err(PathError::ProtocolViolation);
        }
        let (msg_id, errno) = match wc.imm.map(Imm::decode) {
            Some(Imm::IoRsp { msg_id, errno } | Imm::IoRspWithInvalidate { msg_id, errno }) => {
                (msg_id, errno)
            }
            _ => return Err(PathError::ProtocolViolation),
        };
        if msg_id != u32::from(rsp.buf_id) {
            return Err(PathError::ProtocolViolation);
        }
        self.paths[usize::from(path)].chunks[usize::from(rsp.buf_id)].rkey = rsp.rkey;
        Ok((msg_id, errno))
    }
}

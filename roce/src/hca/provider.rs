//! The HCA as a `verbs` provider: registered memory, posting, the
//! completion queue and connection management behind the `Memory` and
//! `Verbs` traits.
//!
//! Split from `hca.rs` (the device, its tables and QP management); see its
//! module docs.

use super::*;

impl<S, K, const N: usize, const Q: usize, const C: usize> Memory for Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    fn with_slice<R>(
        &self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, AccessError> {
        self.arena.with_slice(handle, offset, len, f)
    }

    fn with_slice_mut<R>(
        &mut self,
        handle: MemoryHandle,
        offset: u32,
        len: u32,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, AccessError> {
        self.arena.with_slice_mut(handle, offset, len, f)
    }
}

/// The verbs provider. Connections are made by the CM (see the module docs);
/// QPs made with [`Hca::create_qp`] also take `post_*`, `disconnect` (a flush,
/// no DREQ, no event) and `destroy`.
impl<S, K, const N: usize, const Q: usize, const C: usize> Verbs for Hca<S, K, N, Q, C>
where
    S: AsRef<[u8]> + AsMut<[u8]>,
    K: KeySource,
{
    fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError> {
        self.arena.alloc(len, align)
    }

    fn free(&mut self, buffer: MemoryHandle) -> Result<(), RegError> {
        self.arena.free(buffer)
    }

    fn reg_mr(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError> {
        self.arena.register(buffer, access, &mut self.keys)
    }

    fn rekey(&mut self, lkey: Lkey) -> Result<Rkey, RegError> {
        self.arena.rekey(lkey, &mut self.keys)
    }

    fn revoke_remote(&mut self, rkey: Rkey) -> Result<(), RegError> {
        self.arena.invalidate(rkey)
    }

    fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), RegError> {
        self.arena.deregister(lkey)
    }

    fn post_send(&mut self, conn: ConnId, requests: &[SendWr]) -> Result<(), PostError> {
        let slot = self.slot_of(conn).ok_or(PostError::UnknownConnection)?;
        let qp = self.qps[slot]
            .as_mut()
            .ok_or(PostError::UnknownConnection)?;
        let result = qp.post_send(requests, &mut self.arena);
        if result.is_ok() {
            let mut ctx = Context {
                arena: &mut self.arena,
                cq: &mut self.cq,
                reorder: &mut self.reorder,
                counters: &mut self.counters,
            };
            qp.run_posted_local(&mut ctx);
        }
        self.touched(slot);
        result
    }

    fn post_recv(&mut self, conn: ConnId, requests: &[RecvWr]) -> Result<(), PostError> {
        let slot = self.slot_of(conn).ok_or(PostError::UnknownConnection)?;
        let qp = self.qps[slot]
            .as_mut()
            .ok_or(PostError::UnknownConnection)?;
        let result = qp.post_recv(requests, &mut self.arena);
        self.touched(slot);
        result
    }

    #[inline]
    fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize {
        if self.cq.is_empty() {
            return 0;
        }
        let mut count = 0;
        for entry in out.iter_mut() {
            let Some((tag, completion)) = self.cq.pop() else {
                break;
            };
            // The QP that made it gets the entry back, O(1) by its tag; a
            // destroyed QP's entry goes back to the CQ.
            let slot = (tag & 0xffff_ffff) as usize;
            match self.qps.get_mut(slot).and_then(Option::as_mut) {
                Some(qp) if u64::from(self.generations[slot]) == tag >> 32 => {
                    qp.completion_consumed(completion.opcode);
                }
                _ => self.cq.unreserve(1),
            }
            *entry = completion;
            count += 1;
        }
        count
    }

    fn listen(&mut self, port: u16) -> Result<(), ConnectError> {
        self.cm.listen(port).map_err(|error| match error {
            CmError::AlreadyListening => ConnectError::PortInUse,
            _ => ConnectError::NoResources,
        })
    }

    fn connect(
        &mut self,
        remote: SocketAddr,
        params: &ConnParams<'_>,
    ) -> Result<ConnId, ConnectError> {
        let IpAddr::V4(peer_ip) = remote.ip() else {
            return Err(ConnectError::AddressUnsupported);
        };
        if peer_ip.is_unspecified()
            || peer_ip.is_broadcast()
            || peer_ip.is_multicast()
            || peer_ip.octets() == self.config.ip
        {
            return Err(ConnectError::AddressUnsupported);
        }
        let private_data = heapless::Vec::from_slice(params.private_data)
            .map_err(|()| ConnectError::PrivateDataTooLong)?;
        let src_port = EPHEMERAL_PORT_BASE
            + u16::try_from(self.keys.next_u32() % EPHEMERAL_PORT_COUNT).unwrap_or(0);
        let starting_psn = Psn::new_truncate(self.keys.next_u32());
        let (conn, slot) = self
            .create_linked_qp(Link::Manual)
            .map_err(|_| ConnectError::NoResources)?;
        let local = LocalQp {
            qpn: Qpn::new_truncate(conn.0),
            starting_psn,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            rnr_retry_count: params.rnr_retry_count.min(7),
            srq: false,
        };
        self.links[slot] = Link::Resolving(ActiveRequest {
            peer_ip,
            port: remote.port(),
            src_port,
            local,
            retry_count: params.retry_count.min(7),
            private_data,
        });
        self.resolving.insert(slot);
        // ARP and the REQ go out from the next `poll`, which has the time.
        self.cm_dirty = true;
        Ok(conn)
    }

    fn accept(&mut self, conn: ConnId, params: &ConnParams<'_>) -> Result<(), ConnectError> {
        let slot = self.slot_of(conn).ok_or(ConnectError::UnknownConnection)?;
        let Link::Requested {
            cm,
            attributes,
            route,
            udp_src_port,
        } = self.links[slot]
        else {
            return Err(ConnectError::InvalidState);
        };
        if params.private_data.len() > verbs::REP_PRIVATE_DATA_LEN {
            return Err(ConnectError::PrivateDataTooLong);
        }
        let local = LocalQp {
            qpn: Qpn::new_truncate(conn.0),
            starting_psn: Psn::new_truncate(self.keys.next_u32()),
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            rnr_retry_count: params.rnr_retry_count.min(7),
            srq: false,
        };
        let qp_params = self.qp_params(&attributes, local, route.peer, udp_src_port);
        // RTR (receives already posted) before the REP exists (ib-cm.md §6).
        let ready = self.qps[slot]
            .as_mut()
            .ok_or(ConnectError::UnknownConnection)?
            .ready_to_receive(qp_params);
        self.touched(slot);
        ready.map_err(|_| ConnectError::InvalidState)?;
        match self.cm.accept(self.now, cm, local, params.private_data) {
            Ok(_) => {
                self.links[slot] = Link::Connected { cm };
                self.cm_dirty = true;
                Ok(())
            }
            Err(error) => {
                // The request is gone (client withdrew, timeout): the event
                // that says so is on its way.
                self.flush_slot(slot);
                Err(match error {
                    CmError::PrivateDataTooLong => ConnectError::PrivateDataTooLong,
                    CmError::UnknownConnection => ConnectError::UnknownConnection,
                    _ => ConnectError::InvalidState,
                })
            }
        }
    }

    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), ConnectError> {
        let slot = self.slot_of(conn).ok_or(ConnectError::UnknownConnection)?;
        let Link::Requested { cm, .. } = self.links[slot] else {
            return Err(ConnectError::InvalidState);
        };
        if private_data.len() > verbs::REJ_PRIVATE_DATA_LEN {
            return Err(ConnectError::PrivateDataTooLong);
        }
        // A request the CM already dropped needs no REJ; release the QP anyway.
        let _ = self.cm.reject(
            self.now,
            cm,
            cm::RejectReason::ConsumerDefined,
            private_data,
        );
        self.cm_dirty = true;
        self.free_slot(slot);
        Ok(())
    }

    fn disconnect(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let slot = self.slot_of(conn).ok_or(ConnectError::UnknownConnection)?;
        self.flush_slot(slot);
        match &self.links[slot] {
            Link::Manual | Link::Closed { .. } | Link::Closing { .. } => {}
            Link::Resolving(_) => {
                if !self.events.is_full() {
                    self.close(slot, CmEvent::Disconnected { conn });
                }
            }
            Link::Requested { cm, .. } | Link::Requesting { cm, .. } | Link::Connected { cm } => {
                let cm = *cm;
                let _ = self
                    .cm
                    .disconnect(self.now, &mut CmRandom(&mut self.keys), cm);
                self.cm_dirty = true;
                // The DREP (or the DREQ's last retry) brings `Disconnected`;
                // a connection that was not established yet ends silently
                // (REJ), so say it here.
                if matches!(self.cm.state(cm), Some(cm::State::DreqSent)) {
                    self.links[slot] = Link::Closing { cm };
                } else {
                    self.drain_cm_events();
                    if !self.events.is_full() {
                        self.close(slot, CmEvent::Disconnected { conn });
                    }
                }
            }
        }
        Ok(())
    }

    fn destroy(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let slot = self.slot_of(conn).ok_or(ConnectError::UnknownConnection)?;
        if let Some(cm) = self.links[slot].cm() {
            if !matches!(self.links[slot], Link::Closed { .. }) {
                let _ = self
                    .cm
                    .disconnect(self.now, &mut CmRandom(&mut self.keys), cm);
                self.cm_dirty = true;
            }
        }
        self.free_slot(slot);
        Ok(())
    }

    #[inline]
    fn poll_cm_event(&mut self) -> Option<CmEvent> {
        if self.cm.has_events() {
            self.drain_cm_events();
        }
        self.events.pop_front()
    }
}

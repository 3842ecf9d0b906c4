//! `verbs::Verbs` for [`IbvDevice`]: memory, posting, completions and the
//! connection manager. Calls never block: the event channel is
//! non-blocking and the completion queue is polled.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use verbs::{
    AccessFlags, AllocError, CmEvent, ConnId, ConnParams, ConnectError, Lkey, MemoryHandle,
    MemoryRegion, PostError, PrivateData, RecvWr, RegError, RejectReason, Rkey, SendWr, Sge, Verbs,
    WcOpcode, WcStatus, WorkCompletion,
};

use crate::conn::{Dial, Removed, State, PENDING_RECV_PASSIVE};
use crate::device::{self, IbvDevice};
use crate::ffi::{self, BiConnParam, BiEvent, BiWc};
use crate::translate;

/// How long rdma_cm resolves an address or a route, in milliseconds.
const RESOLVE_TIMEOUT_MS: i32 = 2000;
/// Listen backlog of each port.
const BACKLOG: i32 = 128;

fn addr(ip_be: u32, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip_be.to_ne_bytes()), port))
}

fn private(event: &BiEvent) -> PrivateData {
    let len = usize::from(event.private_data_len).min(ffi::PRIVATE_DATA_MAX);
    PrivateData::try_from_slice(&event.private_data[..len]).unwrap_or_default()
}

fn param(data: &[u8], retry: u8, rnr: u8, rr: u8, depth: u8) -> BiConnParam {
    BiConnParam {
        private_data: data.as_ptr(),
        // Callers bound the data by the CM message sizes (at most 196).
        private_data_len: data.len().min(usize::from(u8::MAX)) as u8,
        responder_resources: rr,
        initiator_depth: depth,
        retry_count: retry,
        rnr_retry_count: rnr,
        pad: [0; 3],
    }
}

/// Posts `requests` in batches of at most [`ffi::POST_MAX`] in the C
/// layer's form. A list longer than one batch is translated whole first,
/// so a bad request refuses the list before any of it is posted;
/// `post(batch, len)` returns 0 or a negative errno. On a refusal by the
/// device, returns how many requests were posted before it.
fn post_batches<W, B: Copy + Default>(
    requests: &[W],
    translate: impl Fn(&W) -> Result<B, PostError>,
    post: impl Fn(*const B, i32) -> i32,
) -> Result<(), (usize, PostError)> {
    if requests.len() > ffi::POST_MAX {
        for wr in requests {
            translate(wr).map_err(|e| (0, e))?;
        }
    }
    let mut batch = [B::default(); ffi::POST_MAX];
    for (n, chunk) in requests.chunks(ffi::POST_MAX).enumerate() {
        for (slot, wr) in batch.iter_mut().zip(chunk) {
            *slot = translate(wr).map_err(|e| (0, e))?;
        }
        // At most POST_MAX (16) requests: fits an i32.
        let rc = post(batch.as_ptr(), chunk.len() as i32);
        if rc != 0 {
            let e = if rc == -libc::ENOMEM {
                PostError::QueueFull
            } else {
                PostError::NotConnected
            };
            return Err((n * ffi::POST_MAX, e));
        }
    }
    Ok(())
}

/// Which queue of a queue pair a post went to.
#[derive(Clone, Copy)]
enum Side {
    Send,
    Recv,
}

impl IbvDevice {
    /// Creates `conn`'s queue pair with the given depths (reserving their
    /// completion entries) and posts the receives it collected.
    fn create_qp(&mut self, conn: ConnId, send: u16, recv: u16) -> Result<(), ConnectError> {
        let send = u32::from(send.max(1)).min(self.limits.max_qp_wr);
        let recv = u32::from(recv.max(1)).min(self.limits.max_qp_wr);
        let id = self
            .conns
            .get(conn)
            .ok_or(ConnectError::UnknownConnection)?
            .id;
        let Some((cq_index, cq)) = self.cqs.reserve(send + recv) else {
            return Err(ConnectError::NoResources);
        };
        let mut qpn = 0;
        let sge = (ffi::MAX_SGE as u32).min(self.limits.max_sge.max(1));
        // SAFETY: `id`, `pd` and `cq` are live objects of this device.
        let rc = unsafe { ffi::bi_create_qp(id, self.pd, cq, send, recv, sge, &raw mut qpn) };
        if rc != 0 {
            self.cqs.release(cq_index, send + recv);
            return Err(ConnectError::NoResources);
        }
        self.conns
            .set_qp(conn, qpn, (cq_index, send + recv), (send, recv));
        let pending = core::mem::take(
            &mut self
                .conns
                .get_mut(conn)
                .ok_or(ConnectError::UnknownConnection)?
                .pending,
        );
        if !pending.is_empty() {
            self.post_recv(conn, &pending)
                .map_err(|_| ConnectError::NoResources)?;
        }
        Ok(())
    }

    /// One raw event: the consumer's event it means, if any (address and
    /// route resolution continue the dial here).
    fn translate(&mut self, event: &BiEvent) -> Option<CmEvent> {
        if event.event == ffi::EV_CONNECT_REQUEST {
            if !self.conns.is_listener(event.listen_id) {
                return None;
            }
            let Some(conn) = self
                .conns
                .insert(event.id, State::Requested, PENDING_RECV_PASSIVE)
            else {
                // SAFETY: the new id is not in the table; rejected and
                // destroyed here, once.
                unsafe { ffi::bi_reject(event.id, core::ptr::null(), 0) };
                // SAFETY: as above.
                unsafe { ffi::bi_destroy(event.id) };
                return None;
            };
            return Some(CmEvent::ConnectRequest {
                conn,
                local: addr(event.local_ip, event.local_port),
                remote: addr(event.remote_ip, event.remote_port),
                private_data: private(event),
            });
        }
        let conn = self.conns.by_id(event.id)?;
        let state = self.conns.get(conn)?.state;
        match event.event {
            ffi::EV_ADDR_RESOLVED => {
                // SAFETY: `event.id` is this connection's live id.
                let rc = unsafe { ffi::bi_resolve_route(event.id, RESOLVE_TIMEOUT_MS) };
                (rc != 0).then(|| self.down(conn, CmEvent::Unreachable { conn }))
            }
            ffi::EV_ROUTE_RESOLVED => {
                let dial = self.conns.get(conn)?.dial.clone()?;
                if self
                    .create_qp(conn, dial.send_depth, dial.recv_depth)
                    .is_err()
                {
                    return Some(self.down(conn, CmEvent::Unreachable { conn }));
                }
                let p = param(
                    dial.private_data.as_slice(),
                    dial.retry_count,
                    dial.rnr_retry_count,
                    dial.responder_resources,
                    dial.initiator_depth,
                );
                // SAFETY: `p` points into `dial`, alive for the call.
                let rc = unsafe { ffi::bi_connect(event.id, &raw const p) };
                if rc != 0 {
                    return Some(self.down(conn, CmEvent::Unreachable { conn }));
                }
                self.conns.get_mut(conn)?.state = State::Connecting;
                None
            }
            ffi::EV_ESTABLISHED => {
                self.conns.get_mut(conn)?.state = State::Established;
                Some(CmEvent::Established {
                    conn,
                    private_data: if state == State::Connecting {
                        private(event)
                    } else {
                        PrivateData::new()
                    },
                })
            }
            ffi::EV_REJECTED if matches!(state, State::Connecting | State::Resolving) => {
                let reason = RejectReason(u16::try_from(event.status).unwrap_or(0));
                let private_data = private(event);
                Some(self.down(
                    conn,
                    CmEvent::Rejected {
                        conn,
                        reason,
                        private_data,
                    },
                ))
            }
            ffi::EV_UNREACHABLE if matches!(state, State::Connecting | State::Resolving) => {
                Some(self.down(conn, CmEvent::Unreachable { conn }))
            }
            ffi::EV_DISCONNECTED
            | ffi::EV_DEVICE_REMOVAL
            | ffi::EV_REJECTED
            | ffi::EV_UNREACHABLE => {
                (state != State::Down).then(|| self.down(conn, CmEvent::Disconnected { conn }))
            }
            _ => None, // TIMEWAIT_EXIT and the rest: nothing for the consumer
        }
    }

    /// One raw completion: the consumer's, with its queue pair's room
    /// freed; `None` for a queue pair no longer in the table.
    fn deliver(&mut self, wc: &BiWc) -> Option<WorkCompletion> {
        let conn = self.conns.by_qpn(wc.qp_num)?;
        let out = translate::completion(wc, conn);
        let send = !matches!(out.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        let ok = out.status == WcStatus::Success;
        let regions = &mut self.regions;
        if let Some(c) = self.conns.get_mut(conn) {
            c.queues
                .completed(send, ok, wc.wr_id, |lkey| device::unpin(regions, lkey));
        }
        Some(out)
    }

    /// Destroys `conn` (queue pair and id), returns its completion entries
    /// and drains its queue of the completions it left (so that none is
    /// read as those of the next queue pair given the same number).
    fn remove(&mut self, conn: ConnId) -> bool {
        let Some(Removed {
            qpn,
            reserved,
            mut queues,
        }) = self.conns.remove(conn)
        else {
            return false;
        };
        let regions = &mut self.regions;
        queues.retire_all(|lkey| device::unpin(regions, lkey));
        self.cqs.release(reserved.0, reserved.1);
        if let Some(qpn) = qpn {
            // SAFETY: `out` has room for the `out.len()` entries asked
            // for; the queue is live.
            self.cqs
                .drain_after_destroy(reserved.0, qpn, |cq, out| unsafe {
                    ffi::bi_poll_cq(cq, out.as_mut_ptr(), out.len() as i32)
                });
        }
        true
    }

    /// After a post: counts and pins the requests the device took (all of
    /// them, or the prefix before a refusal) on `side` of `conn`. A
    /// translation error posted nothing and is answered as it is; a
    /// refusal by the device leaves the connection answering
    /// `NotConnected` (what it took cannot be taken back).
    fn record<'a>(
        &mut self,
        conn: ConnId,
        side: Side,
        requests: impl ExactSizeIterator<Item = (u64, bool, &'a [Sge])>,
        result: Result<(), (usize, PostError)>,
    ) -> Result<(), PostError> {
        let (taken, outcome) = match result {
            Ok(()) => (requests.len(), Ok(())),
            Err((0, e)) if !matches!(e, PostError::NotConnected | PostError::QueueFull) => {
                return Err(e)
            }
            Err((posted, _)) => (posted, Err(PostError::NotConnected)),
        };
        let regions = &mut self.regions;
        let c = self
            .conns
            .get_mut(conn)
            .ok_or(PostError::UnknownConnection)?;
        for (wr_id, signaled, sgl) in requests.take(taken) {
            match side {
                Side::Send => c.queues.posted_send(wr_id, signaled, sgl),
                Side::Recv => c.queues.posted_recv(wr_id, sgl),
            }
            for sge in sgl {
                device::pin(regions, sge.lkey.0);
            }
        }
        if outcome.is_err() {
            c.queues.refused();
        }
        outcome
    }

    fn down(&mut self, conn: ConnId, event: CmEvent) -> CmEvent {
        if let Some(c) = self.conns.get_mut(conn) {
            c.state = State::Down;
        }
        event
    }

    fn id_of(&self, conn: ConnId) -> Result<*mut ffi::CmId, ConnectError> {
        Ok(self
            .conns
            .get(conn)
            .ok_or(ConnectError::UnknownConnection)?
            .id)
    }
}

impl Verbs for IbvDevice {
    fn alloc(&mut self, len: u32, align: u32) -> Result<MemoryHandle, AllocError> {
        self.alloc_buffer(len, align)
    }

    fn free(&mut self, buffer: MemoryHandle) -> Result<(), RegError> {
        self.free_buffer(buffer)
    }

    fn reg_mr(
        &mut self,
        buffer: MemoryHandle,
        access: AccessFlags,
    ) -> Result<MemoryRegion, RegError> {
        self.register(buffer, access)
    }

    /// Userspace verbs have no fast-register work request: a region keeps
    /// its rkey for life. The engine runs with `always_invalidate` off on
    /// this provider and never asks.
    fn rekey(&mut self, _lkey: Lkey) -> Result<Rkey, RegError> {
        Err(RegError::Unsupported)
    }

    fn dereg_mr(&mut self, lkey: Lkey) -> Result<(), RegError> {
        self.deregister(lkey)
    }

    fn post_send(&mut self, conn: ConnId, requests: &[SendWr]) -> Result<(), PostError> {
        let c = self.conns.get(conn).ok_or(PostError::UnknownConnection)?;
        if c.qpn.is_none() || matches!(c.state, State::Requested | State::Resolving | State::Down) {
            return Err(PostError::NotConnected);
        }
        c.queues.check_sends(requests.len())?;
        let id = c.id;
        // SAFETY: each batch holds translated requests whose SGEs lie in
        // registered memory; `id` has a queue pair.
        let result = post_batches(
            requests,
            |wr| translate::send(self, wr),
            |batch, n| unsafe { ffi::bi_post_send(id, batch, n) },
        );
        let taken = requests
            .iter()
            .map(|wr| (wr.wr_id.0, wr.signaled, wr.op.sgl()));
        self.record(conn, Side::Send, taken, result)
    }

    fn post_recv(&mut self, conn: ConnId, requests: &[RecvWr]) -> Result<(), PostError> {
        let c = self.conns.get(conn).ok_or(PostError::UnknownConnection)?;
        if c.state == State::Down {
            return Err(PostError::NotConnected);
        }
        let id = c.id;
        if c.qpn.is_none() {
            for wr in requests {
                translate::recv(self, wr)?;
            }
            let c = self
                .conns
                .get_mut(conn)
                .ok_or(PostError::UnknownConnection)?;
            if c.pending.len() + requests.len() > c.pending.capacity() {
                return Err(PostError::QueueFull);
            }
            c.pending.extend_from_slice(requests);
            return Ok(());
        }
        c.queues.check_recvs(requests.len())?;
        // SAFETY: as in `post_send`.
        let result = post_batches(
            requests,
            |wr| translate::recv(self, wr),
            |batch, n| unsafe { ffi::bi_post_recv(id, batch, n) },
        );
        let taken = requests
            .iter()
            .map(|wr| (wr.wr_id.0, true, wr.sgl.as_slice()));
        self.record(conn, Side::Recv, taken, result)
    }

    fn poll_cq(&mut self, out: &mut [WorkCompletion]) -> usize {
        let mut filled = 0;
        while filled < out.len() {
            let Some(wc) = self.cqs.take_kept() else {
                break;
            };
            if let Some(done) = self.deliver(&wc) {
                out[filled] = done;
                filled += 1;
            }
        }
        let mut raw = [BiWc::default(); ffi::POLL_MAX];
        for index in 0..self.cqs.len() {
            let Some(cq) = self.cqs.get(index) else {
                break;
            };
            while filled < out.len() {
                let want = (out.len() - filled).min(ffi::POLL_MAX);
                // SAFETY: `raw` has room for `want` completions; `cq` is live.
                let got = unsafe { ffi::bi_poll_cq(cq, raw.as_mut_ptr(), want as i32) };
                if got <= 0 {
                    break;
                }
                for wc in &raw[..got as usize] {
                    // Completions of a destroyed connection are dropped.
                    if let Some(done) = self.deliver(wc) {
                        out[filled] = done;
                        filled += 1;
                    }
                }
                if (got as usize) < want {
                    break;
                }
            }
        }
        filled
    }

    fn listen(&mut self, port: u16) -> Result<(), ConnectError> {
        if self.conns.listeners.iter().any(|&(p, _)| p == port) {
            return Err(ConnectError::PortInUse);
        }
        let mut id = core::ptr::null_mut();
        let ip = u32::from_ne_bytes(self.config.address.octets());
        // SAFETY: `channel` is live; `id` receives the listener.
        let rc = unsafe { ffi::bi_listen(self.channel, ip, port, BACKLOG, &raw mut id) };
        if rc == -libc::EADDRINUSE {
            return Err(ConnectError::PortInUse);
        }
        if rc != 0 {
            return Err(ConnectError::NoResources);
        }
        self.conns.listeners.push((port, id));
        Ok(())
    }

    fn connect(
        &mut self,
        remote: SocketAddr,
        params: &ConnParams<'_>,
    ) -> Result<ConnId, ConnectError> {
        let SocketAddr::V4(remote) = remote else {
            return Err(ConnectError::AddressUnsupported);
        };
        if params.private_data.len() > verbs::REQ_PRIVATE_DATA_LEN {
            return Err(ConnectError::PrivateDataTooLong);
        }
        let mut id = core::ptr::null_mut();
        let src = u32::from_ne_bytes(self.config.address.octets());
        let dst = u32::from_ne_bytes(remote.ip().octets());
        // SAFETY: `channel` is live; `id` receives the new id.
        let rc = unsafe {
            ffi::bi_resolve(
                self.channel,
                src,
                dst,
                remote.port(),
                RESOLVE_TIMEOUT_MS,
                &raw mut id,
            )
        };
        if rc != 0 {
            return Err(ConnectError::AddressUnsupported);
        }
        let pending = usize::from(params.receive_queue_depth).max(1);
        let Some(conn) = self.conns.insert(id, State::Resolving, pending) else {
            // SAFETY: the id is not in the table; destroyed once, here.
            unsafe { ffi::bi_destroy(id) };
            return Err(ConnectError::NoResources);
        };
        if let Some(c) = self.conns.get_mut(conn) {
            c.dial = Some(Dial {
                private_data: PrivateData::try_from_slice(params.private_data)?,
                send_depth: params.send_queue_depth,
                recv_depth: params.receive_queue_depth,
                retry_count: params.retry_count,
                rnr_retry_count: params.rnr_retry_count,
                responder_resources: params.responder_resources,
                initiator_depth: params.initiator_depth,
            });
        }
        Ok(conn)
    }

    fn accept(&mut self, conn: ConnId, params: &ConnParams<'_>) -> Result<(), ConnectError> {
        let c = self
            .conns
            .get(conn)
            .ok_or(ConnectError::UnknownConnection)?;
        if c.state != State::Requested {
            return Err(ConnectError::InvalidState);
        }
        if params.private_data.len() > verbs::REP_PRIVATE_DATA_LEN {
            return Err(ConnectError::PrivateDataTooLong);
        }
        let id = c.id;
        self.create_qp(conn, params.send_queue_depth, params.receive_queue_depth)?;
        let p = param(
            params.private_data,
            params.retry_count,
            params.rnr_retry_count,
            params.responder_resources,
            params.initiator_depth,
        );
        // SAFETY: `p` points into `params`, alive for the call.
        let rc = unsafe { ffi::bi_accept(id, &raw const p) };
        if rc != 0 {
            return Err(ConnectError::InvalidState);
        }
        if let Some(c) = self.conns.get_mut(conn) {
            c.state = State::Accepted;
        }
        Ok(())
    }

    fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), ConnectError> {
        let c = self
            .conns
            .get(conn)
            .ok_or(ConnectError::UnknownConnection)?;
        if c.state != State::Requested {
            return Err(ConnectError::InvalidState);
        }
        if private_data.len() > verbs::REJ_PRIVATE_DATA_LEN {
            return Err(ConnectError::PrivateDataTooLong);
        }
        // SAFETY: `id` is a live, unanswered request; the data outlives the call.
        unsafe { ffi::bi_reject(c.id, private_data.as_ptr(), private_data.len() as u8) };
        self.remove(conn);
        Ok(())
    }

    fn disconnect(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        let id = self.id_of(conn)?;
        let state = self.conns.get(conn).map(|c| c.state);
        if matches!(
            state,
            Some(State::Requested | State::Resolving | State::Down)
        ) {
            return Err(ConnectError::InvalidState);
        }
        // SAFETY: `id` is live.
        let rc = unsafe { ffi::bi_disconnect(id) };
        if rc != 0 {
            return Err(ConnectError::InvalidState);
        }
        Ok(())
    }

    fn destroy(&mut self, conn: ConnId) -> Result<(), ConnectError> {
        if self.remove(conn) {
            Ok(())
        } else {
            Err(ConnectError::UnknownConnection)
        }
    }

    fn poll_cm_event(&mut self) -> Option<CmEvent> {
        let mut event = BiEvent::zeroed();
        loop {
            // SAFETY: `channel` is live; `event` is written by the call.
            let rc = unsafe { ffi::bi_get_event(self.channel, &raw mut event) };
            if rc <= 0 {
                return None;
            }
            if let Some(out) = self.translate(&event) {
                return Some(out);
            }
        }
    }
}

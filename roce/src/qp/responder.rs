//! The RC responder: PSN checks, placement, ACK/NAK, READ replies.
//!
//! roce-v2.md §2.4 (rxe's checks, in order: PSN, opcode sequence, QP access,
//! receive WQE, R_Key and range, lengths) and §2.5 (what a server must do),
//! checklist.md B (the wire reaction to each broken rule). Data is placed
//! straight into registered memory: SENDs through the posted receive SGL
//! ([`verbs::memory::Arena::scatter_from`]), RDMA WRITEs through the handle
//! the R_Key check returned.

use verbs::{AccessFlags, Memory, PostError, RecvWr, WcOpcode, WcStatus, WorkCompletion};

use super::{config, Context, FrameSink, Inbound, Qp, QpState, ReadResource, RecvWqe, Response};
use crate::types::Psn;
use crate::wire::{
    pad_len, AethRepr, BthRepr, ExtHeaders, NakCode, Opcode, RethRepr, RoceFrame, Syndrome,
};

/// The family of a request opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    Read,
}

/// What a request opcode says about its packet.
#[derive(Debug, Clone, Copy)]
struct RequestInfo {
    kind: Kind,
    first: bool,
    last: bool,
    imm: bool,
}

fn request_info(opcode: Opcode) -> Option<RequestInfo> {
    use Opcode::*;
    let info = |kind, first, last, imm| RequestInfo {
        kind,
        first,
        last,
        imm,
    };
    Some(match opcode {
        RcSendFirst => info(Kind::Send, true, false, false),
        RcSendMiddle => info(Kind::Send, false, false, false),
        RcSendLast | RcSendLastWithInvalidate => info(Kind::Send, false, true, false),
        RcSendLastWithImmediate => info(Kind::Send, false, true, true),
        RcSendOnly | RcSendOnlyWithInvalidate => info(Kind::Send, true, true, false),
        RcSendOnlyWithImmediate => info(Kind::Send, true, true, true),
        RcRdmaWriteFirst => info(Kind::Write, true, false, false),
        RcRdmaWriteMiddle => info(Kind::Write, false, false, false),
        RcRdmaWriteLast => info(Kind::Write, false, true, false),
        RcRdmaWriteLastWithImmediate => info(Kind::Write, false, true, true),
        RcRdmaWriteOnly => info(Kind::Write, true, true, false),
        RcRdmaWriteOnlyWithImmediate => info(Kind::Write, true, true, true),
        RcRdmaReadRequest => info(Kind::Read, true, true, false),
        _ => return None,
    })
}

/// What the responder reads of an RDMA WRITE packet.
#[derive(Debug, Clone, Copy)]
struct WriteSegment<'p> {
    psn: Psn,
    ack_req: bool,
    pad_count: u8,
    payload: &'p [u8],
    /// FIRST and ONLY: the RETH.
    reth: Option<RethRepr>,
    /// LAST and ONLY with immediate: the immediate.
    immediate: Option<u32>,
}

impl<'p> WriteSegment<'p> {
    fn of(frame: &RoceFrame<'p>) -> Self {
        WriteSegment {
            psn: frame.bth.psn,
            ack_req: frame.bth.ack_req,
            pad_count: frame.bth.pad_count,
            payload: frame.payload,
            reth: frame.ext.reth,
            immediate: frame.ext.immdt.map(|immdt| immdt.immediate),
        }
    }
}

impl Qp {
    /// Posts receive work requests, all or none (verbs `post_recv`).
    ///
    /// # Errors
    /// [`PostError::NotConnected`] in `Reset`/`Err`; [`PostError::QueueFull`];
    /// [`PostError::InvalidKey`], [`PostError::OutOfBounds`],
    /// [`PostError::AccessDenied`] (buffers need LOCAL_WRITE),
    /// [`PostError::LengthOverflow`].
    pub fn post_recv<S, const N: usize>(
        &mut self,
        requests: &[RecvWr],
        arena: &mut verbs::memory::Arena<S, N>,
    ) -> Result<(), PostError>
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if matches!(self.state, QpState::Reset | QpState::Err) {
            return Err(PostError::NotConnected);
        }
        if self.recv_room() < requests.len() {
            return Err(PostError::QueueFull);
        }
        for request in requests {
            request.sgl.total_len().ok_or(PostError::LengthOverflow)?;
            arena.check_sgl(request.sgl.as_slice(), AccessFlags::LOCAL_WRITE)?;
        }
        for request in requests {
            let _ = arena.pin_sgl(request.sgl.as_slice());
            let wqe = RecvWqe {
                wr_id: request.wr_id,
                sgl: request.sgl.clone(),
                len: request.sgl.total_len().unwrap_or(0),
            };
            // Room was checked above (never allocates).
            self.rq.push_back(wqe);
        }
        Ok(())
    }

    /// Queues an ACKNOWLEDGE; ACK-type syndromes coalesce with a queued ACK
    /// (a later ACK covers an earlier one). Returns false if it was dropped.
    fn queue_ack(&mut self, syndrome: Syndrome, psn: Psn, counters: &mut super::Counters) -> bool {
        let response = Response::Ack {
            psn,
            syndrome,
            msn: self.msn,
        };
        if syndrome.is_ack() {
            if let Some(Response::Ack {
                syndrome: queued, ..
            }) = self.out.back()
            {
                if queued.is_ack() {
                    if let Some(back) = self.out.back_mut() {
                        *back = response;
                    }
                    return true;
                }
            }
        }
        if self.out.push_back(response).is_err() {
            counters.responses_dropped += 1;
            return false;
        }
        true
    }

    /// A protocol or protection error: NAK `code` with the offending PSN,
    /// then `Err` (a SEND being received completes with `in_progress`).
    fn responder_error<S, const N: usize>(
        &mut self,
        psn: Psn,
        code: NakCode,
        in_progress: WcStatus,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if self.out.is_full() {
            // The NAK explains the error to the peer: it wins over anything queued.
            let _ = self.out.pop_back();
        }
        self.queue_ack(Syndrome::Nak(code), psn, ctx.counters);
        ctx.counters.naks_sent += 1;
        self.enter_error(ctx, in_progress);
    }

    /// Handles a request packet (SEND, WRITE, READ families).
    pub(super) fn handle_request<S, const N: usize>(
        &mut self,
        frame: &RoceFrame<'_>,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let Some(info) = request_info(frame.bth.opcode) else {
            let atomic = matches!(frame.bth.opcode, Opcode::RcCompareSwap | Opcode::RcFetchAdd);
            if atomic && frame.bth.psn == self.epsn {
                // Atomics are not supported: an operation the QP does not
                // permit (roce-v2.md §2.4, checklist B).
                self.responder_error(
                    frame.bth.psn,
                    NakCode::InvalidRequest,
                    WcStatus::WrFlushErr,
                    ctx,
                );
            } else {
                ctx.counters.drop_bad_opcode += 1;
            }
            return;
        };
        let Some(params) = self.params else {
            return;
        };
        let psn = frame.bth.psn;
        if psn != self.epsn {
            if psn.is_after(self.epsn) && self.selective() {
                self.keep_out_of_order(frame, ctx);
            } else if psn.is_after(self.epsn) {
                ctx.counters.drop_out_of_sequence += 1;
                if !self.nak_sent
                    && self.queue_ack(
                        Syndrome::Nak(NakCode::PsnSequenceError),
                        self.epsn,
                        ctx.counters,
                    )
                {
                    self.nak_sent = true;
                    ctx.counters.naks_sent += 1;
                }
            } else {
                ctx.counters.duplicates += 1;
                if info.kind == Kind::Read {
                    self.replay_read(frame);
                } else {
                    self.queue_ack(Syndrome::ACK_UNLIMITED, self.ack_psn, ctx.counters);
                }
            }
            return;
        }

        // Opcode sequence (roce-v2.md §2.4).
        let in_sequence = matches!(
            (&self.inbound, info.first, info.kind),
            (Inbound::Idle, true, _)
                | (Inbound::Send { .. }, false, Kind::Send)
                | (Inbound::Write { .. }, false, Kind::Write)
        );
        if !in_sequence {
            self.responder_error(psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr, ctx);
            return;
        }
        // QP access rights.
        let needed = match info.kind {
            Kind::Send => AccessFlags::EMPTY,
            Kind::Write => AccessFlags::REMOTE_WRITE,
            Kind::Read => AccessFlags::REMOTE_READ,
        };
        let read_refused = info.kind == Kind::Read && params.max_dest_rd_atomic == 0;
        if !params.remote_access.contains(needed) || read_refused {
            self.responder_error(psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr, ctx);
            return;
        }
        // A receive WQE for SEND_FIRST/ONLY and the last packet of WRITE_WITH_IMM.
        let needs_recv = match info.kind {
            Kind::Send => info.first,
            Kind::Write => info.last && info.imm,
            Kind::Read => false,
        };
        if needs_recv && self.rq.is_empty() {
            if self.queue_ack(
                Syndrome::RnrNak {
                    timer: params.min_rnr_timer,
                },
                psn,
                ctx.counters,
            ) {
                ctx.counters.rnr_naks_sent += 1;
            }
            return;
        }
        match info.kind {
            Kind::Send => self.receive_send(frame, info, ctx),
            Kind::Write => self.receive_write(WriteSegment::of(frame), info, ctx),
            Kind::Read => self.receive_read(frame, ctx),
        }
    }

    /// Accepts packet `psn`: next PSN, ACK if asked.
    fn accepted(&mut self, psn: Psn, ack_req: bool, counters: &mut super::Counters) {
        self.epsn = psn.wrapping_add(1);
        self.ack_psn = psn;
        self.nak_sent = false;
        if ack_req {
            self.queue_ack(Syndrome::ACK_UNLIMITED, psn, counters);
        }
    }

    fn receive_send<S, const N: usize>(
        &mut self,
        frame: &RoceFrame<'_>,
        info: RequestInfo,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let psn = frame.bth.psn;
        if info.first {
            let Some(recv) = self.rq.pop_front() else {
                return;
            };
            self.inbound = Inbound::Send { recv, offset: 0 };
        }
        let Inbound::Send { recv, offset } = &mut self.inbound else {
            return;
        };
        let payload = frame.payload;
        let length_ok = if info.last {
            payload.len() <= self.mtu as usize
        } else {
            payload.len() == self.mtu as usize
        };
        let end = u32::try_from(payload.len())
            .ok()
            .and_then(|len| offset.checked_add(len))
            .filter(|&end| end <= recv.len);
        let Some(end) = end.filter(|_| length_ok) else {
            self.responder_error(psn, NakCode::InvalidRequest, WcStatus::LocLenErr, ctx);
            return;
        };
        if !payload.is_empty()
            && ctx
                .arena
                .scatter_from(recv.sgl.as_slice(), *offset, payload)
                .is_err()
        {
            self.responder_error(psn, NakCode::InvalidRequest, WcStatus::LocProtErr, ctx);
            return;
        }
        *offset = end;
        if !info.last {
            self.accepted(psn, frame.bth.ack_req, ctx.counters);
            return;
        }
        let Inbound::Send { recv, offset } = core::mem::replace(&mut self.inbound, Inbound::Idle)
        else {
            return;
        };
        let _ = ctx.arena.unpin_sgl(recv.sgl.as_slice());
        let mut wc = WorkCompletion::new(recv.wr_id, self.conn, WcOpcode::Recv, WcStatus::Success);
        wc.byte_len = offset;
        wc.imm = frame.ext.immdt.map(|immdt| immdt.immediate);
        let mut invalidate_failed = false;
        if let Some(ieth) = frame.ext.ieth {
            if ctx.arena.invalidate(ieth.rkey).is_ok() {
                wc.invalidated_rkey = Some(ieth.rkey);
            } else {
                // rxe: no NAK (an ACK if asked), the receive fails, QP to error.
                wc.status = WcStatus::RemInvReqErr;
                invalidate_failed = true;
            }
        }
        self.msn = self.msn.wrapping_add(1);
        self.complete(ctx, wc);
        self.accepted(psn, frame.bth.ack_req, ctx.counters);
        if invalidate_failed {
            self.enter_error(ctx, WcStatus::WrFlushErr);
        }
    }

    /// An RDMA WRITE MIDDLE or LAST packet that continues the WRITE in
    /// progress, in order, on a QP in RTS with remote write access: the
    /// work [`Qp::receive`] does for it, read from the BTH and payload only
    /// (the HCA's receive fast path; [`crate::wire::PacketView`]). Anything
    /// else (another opcode, a PSN other than the expected one, no WRITE in
    /// progress, another state, no write access) returns `false` having
    /// changed nothing, and goes through [`Qp::receive`].
    pub fn receive_write_continuation<S, const N: usize>(
        &mut self,
        bth: &BthRepr,
        payload: &[u8],
        ctx: &mut Context<'_, S, N>,
    ) -> bool
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let last = match bth.opcode {
            Opcode::RcRdmaWriteMiddle => false,
            Opcode::RcRdmaWriteLast => true,
            _ => return false,
        };
        let writable = self
            .params
            .as_ref()
            .is_some_and(|params| params.remote_access.contains(AccessFlags::REMOTE_WRITE));
        if self.state != QpState::Rts
            || bth.psn != self.epsn
            || !matches!(self.inbound, Inbound::Write { .. })
            || !writable
        {
            return false;
        }
        let info = RequestInfo {
            kind: Kind::Write,
            first: false,
            last,
            imm: false,
        };
        let segment = WriteSegment {
            psn: bth.psn,
            ack_req: bth.ack_req,
            pad_count: bth.pad_count,
            payload,
            reth: None,
            immediate: None,
        };
        self.receive_write(segment, info, ctx);
        if self.selective() {
            self.drain_kept(ctx);
        }
        true
    }

    fn receive_write<S, const N: usize>(
        &mut self,
        segment: WriteSegment<'_>,
        info: RequestInfo,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let psn = segment.psn;
        if info.first {
            let Some(reth) = segment.reth else {
                return;
            };
            let target = if reth.dma_length == 0 {
                None
            } else {
                match ctx.arena.resolve_remote(
                    reth.rkey,
                    reth.virtual_address,
                    reth.dma_length,
                    AccessFlags::REMOTE_WRITE,
                ) {
                    Ok(handle) => Some(handle),
                    Err(_) => {
                        self.responder_error(
                            psn,
                            NakCode::RemoteAccessError,
                            WcStatus::WrFlushErr,
                            ctx,
                        );
                        return;
                    }
                }
            };
            self.inbound = Inbound::Write {
                target,
                offset: 0,
                len: reth.dma_length,
            };
        }
        let Inbound::Write {
            target,
            offset,
            len,
        } = self.inbound
        else {
            return;
        };
        // Length rules (roce-v2.md §1.7): full MTU with no pad before the
        // last packet, exactly the rest (and its pad) in the last one.
        let resid = len - offset;
        let payload = segment.payload;
        let mtu = self.mtu;
        let length_ok = if info.last {
            payload.len() == resid as usize
                && usize::from(segment.pad_count) == pad_len(resid as usize)
        } else {
            resid > mtu && payload.len() == mtu as usize && segment.pad_count == 0
        };
        if !length_ok {
            self.responder_error(psn, NakCode::InvalidRequest, WcStatus::WrFlushErr, ctx);
            return;
        }
        if let Some(target) = target.filter(|_| !payload.is_empty()) {
            // `payload.len() <= resid`, so this stays inside the checked range.
            let placed = ctx
                .arena
                .with_slice_mut(target, offset, payload.len() as u32, |bytes| {
                    bytes.copy_from_slice(payload)
                });
            if placed.is_err() {
                self.responder_error(psn, NakCode::RemoteAccessError, WcStatus::WrFlushErr, ctx);
                return;
            }
        }
        let offset = offset + payload.len() as u32;
        if !info.last {
            self.inbound = Inbound::Write {
                target,
                offset,
                len,
            };
            self.accepted(psn, segment.ack_req, ctx.counters);
            return;
        }
        self.inbound = Inbound::Idle;
        if info.imm {
            if let Some(recv) = self.rq.pop_front() {
                let _ = ctx.arena.unpin_sgl(recv.sgl.as_slice());
                let mut wc = WorkCompletion::new(
                    recv.wr_id,
                    self.conn,
                    WcOpcode::RecvRdmaWithImm,
                    WcStatus::Success,
                );
                wc.byte_len = len;
                wc.imm = segment.immediate;
                self.complete(ctx, wc);
            }
        }
        self.msn = self.msn.wrapping_add(1);
        self.accepted(psn, segment.ack_req, ctx.counters);
    }

    fn receive_read<S, const N: usize>(
        &mut self,
        frame: &RoceFrame<'_>,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let psn = frame.bth.psn;
        let Some(reth) = frame.ext.reth else {
            return;
        };
        if reth.dma_length > config::MAX_MESSAGE_LEN {
            self.responder_error(psn, NakCode::InvalidRequest, WcStatus::WrFlushErr, ctx);
            return;
        }
        let target = if reth.dma_length == 0 {
            None
        } else {
            match ctx.arena.resolve_remote(
                reth.rkey,
                reth.virtual_address,
                reth.dma_length,
                AccessFlags::REMOTE_READ,
            ) {
                Ok(handle) => Some(handle),
                Err(_) => {
                    self.responder_error(
                        psn,
                        NakCode::RemoteAccessError,
                        WcStatus::WrFlushErr,
                        ctx,
                    );
                    return;
                }
            }
        };
        if self.out.is_full() {
            // Cannot answer now: drop without a state change; the peer retries.
            ctx.counters.responses_dropped += 1;
            return;
        }
        let npkts = reth.dma_length.div_ceil(self.mtu).max(1);
        self.msn = self.msn.wrapping_add(1);
        let slot = self.read_next;
        self.read_next = (self.read_next + 1)
            % usize::from(
                self.params
                    .map_or(1, |params| params.max_dest_rd_atomic)
                    .clamp(1, config::READ_RESOURCES as u8),
            );
        self.read_seq = self.read_seq.wrapping_add(1);
        self.reads[slot] = Some(ReadResource {
            seq: self.read_seq,
            first_psn: psn,
            npkts,
            target,
            va: reth.virtual_address,
            len: reth.dma_length,
            rkey: reth.rkey,
            msn: self.msn,
        });
        let _ = self.out.push_back(Response::Read {
            slot: slot as u8,
            seq: self.read_seq,
            start_psn: psn,
            next_psn: psn,
        });
        self.epsn = psn.wrapping_add(npkts);
        self.nak_sent = false;
    }

    /// A duplicate READ request: replay from a remembered resource if it asks
    /// for the same key and a sub-range (rxe `duplicate_request()`), else drop.
    fn replay_read(&mut self, frame: &RoceFrame<'_>) {
        let psn = frame.bth.psn;
        let Some(reth) = frame.ext.reth else {
            return;
        };
        let found = self.reads.iter().enumerate().find_map(|(slot, resource)| {
            let resource = (*resource)?;
            let index = resource.first_psn.distance_to(psn);
            (index < resource.npkts).then_some((slot, resource, index))
        });
        let Some((slot, resource, index)) = found else {
            return;
        };
        let offset = u64::from(index) * u64::from(self.mtu);
        let same = resource.len == 0
            || (reth.rkey == resource.rkey
                && reth.virtual_address == resource.va.wrapping_add(offset)
                && u64::from(reth.dma_length) <= u64::from(resource.len).saturating_sub(offset));
        if !same || self.out.is_full() {
            return;
        }
        let _ = self.out.push_back(Response::Read {
            slot: slot as u8,
            seq: resource.seq,
            start_psn: psn,
            next_psn: psn,
        });
    }

    /// Sends queued responses, at most `budget` frames.
    pub(super) fn send_responses<S, K, const N: usize>(
        &mut self,
        ctx: &mut Context<'_, S, N>,
        sink: &mut K,
        budget: usize,
    ) -> usize
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
        K: FrameSink + ?Sized,
    {
        let mut sent = 0;
        while sent < budget {
            let Some(response) = self.out.front().copied() else {
                break;
            };
            match response {
                Response::Ack { psn, syndrome, msn } => {
                    let ext = ExtHeaders {
                        aeth: Some(AethRepr { syndrome, msn }),
                        ..ExtHeaders::default()
                    };
                    if self.emit(sink, Opcode::RcAcknowledge, psn, false, &ext, &[]) {
                        sent += 1;
                    }
                    let _ = self.out.pop_front();
                }
                Response::Read {
                    slot,
                    seq,
                    start_psn,
                    next_psn,
                } => {
                    let resource = self
                        .reads
                        .get(usize::from(slot))
                        .copied()
                        .flatten()
                        .filter(|resource| resource.seq == seq);
                    let Some(resource) = resource else {
                        let _ = self.out.pop_front();
                        continue;
                    };
                    if self.send_read_response(&resource, start_psn, next_psn, ctx, sink) {
                        sent += 1;
                    }
                    let last_psn = resource
                        .first_psn
                        .wrapping_add(resource.npkts.saturating_sub(1));
                    if next_psn == last_psn {
                        let _ = self.out.pop_front();
                    } else if let Some(Response::Read { next_psn, .. }) = self.out.front_mut() {
                        *next_psn = next_psn.wrapping_add(1);
                    }
                }
            }
        }
        sent
    }

    /// Emits READ response packet `psn` of `resource` (a run from `start`).
    fn send_read_response<S, K, const N: usize>(
        &self,
        resource: &ReadResource,
        start: Psn,
        psn: Psn,
        ctx: &mut Context<'_, S, N>,
        sink: &mut K,
    ) -> bool
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
        K: FrameSink + ?Sized,
    {
        let index = resource.first_psn.distance_to(psn);
        let offset = index.saturating_mul(self.mtu);
        let len = resource.len.saturating_sub(offset).min(self.mtu);
        let first = psn == start;
        let last = index + 1 >= resource.npkts;
        let opcode = match (first, last) {
            (true, true) => Opcode::RcRdmaReadResponseOnly,
            (true, false) => Opcode::RcRdmaReadResponseFirst,
            (false, false) => Opcode::RcRdmaReadResponseMiddle,
            (false, true) => Opcode::RcRdmaReadResponseLast,
        };
        let mut ext = ExtHeaders::default();
        if opcode != Opcode::RcRdmaReadResponseMiddle {
            ext.aeth = Some(AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: resource.msn,
            });
        }
        match resource.target {
            Some(target) if len > 0 => ctx
                .arena
                .with_slice(target, offset, len, |bytes| {
                    self.emit(sink, opcode, psn, false, &ext, &[bytes])
                })
                .unwrap_or(false),
            _ => self.emit(sink, opcode, psn, false, &ext, &[]),
        }
    }
}

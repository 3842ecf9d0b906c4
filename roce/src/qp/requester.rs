//! The RC requester: segmentation, window, sending and go-back-N.
//!
//! roce-v2.md §2.3 (what rxe does as requester) and §2.6 (what a server
//! must do): segment at the path MTU, AckReq on every last packet, keep
//! packets until cumulatively ACKed, go back N on NAK 0x60 / RNR NAK /
//! timeout, complete in order with the verbs statuses. The state is
//! described in the parent module's docs.
//!
//! The retransmit timer it arms is in the `timer` module; what the peer
//! answers (ACKs, NAKs, READ responses, completions) in `acks`.

use verbs::{AccessFlags, PostError, SendOp, SendWr, WcStatus};

use super::timer::RttSample;
use super::{config, Context, Counters, FrameSink, Payload, Qp, QpState, SendWqe, WqeOp};
use crate::types::Psn;
use crate::wire::{ExtHeaders, IethRepr, ImmDtRepr, Opcode, RethRepr};

impl Qp {
    /// Posts send work requests, all or none (verbs `post_send`): checks
    /// lengths and local keys, pins the memory and assigns PSN ranges.
    ///
    /// # Errors
    /// [`PostError::NotConnected`] unless in `Rts`; [`PostError::QueueFull`]
    /// when queued WQEs plus unconsumed send completions would exceed the
    /// send depth ([`Qp::send_room`]);
    /// [`PostError::LengthOverflow`] for a message over
    /// [`config::MAX_MESSAGE_LEN`]; [`PostError::InvalidKey`],
    /// [`PostError::OutOfBounds`], [`PostError::AccessDenied`] for bad SGEs
    /// (an RDMA READ destination needs LOCAL_WRITE; READs need
    /// `max_rd_atomic > 0`).
    pub fn post_send<S, const N: usize>(
        &mut self,
        requests: &[SendWr],
        arena: &mut verbs::memory::Arena<S, N>,
    ) -> Result<(), PostError>
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if self.state != QpState::Rts {
            return Err(PostError::NotConnected);
        }
        let Some(params) = self.params else {
            return Err(PostError::NotConnected);
        };
        if self.send_room() < requests.len() {
            return Err(PostError::QueueFull);
        }
        for request in requests {
            let sgl = request.op.sgl();
            let access = match request.op {
                SendOp::RdmaRead { .. } => {
                    if params.max_rd_atomic == 0 {
                        return Err(PostError::AccessDenied);
                    }
                    AccessFlags::LOCAL_WRITE
                }
                _ => AccessFlags::EMPTY,
            };
            let len = verbs::wr::total_len(sgl).ok_or(PostError::LengthOverflow)?;
            if len > config::MAX_MESSAGE_LEN {
                return Err(PostError::LengthOverflow);
            }
            arena.check_sgl(sgl, access)?;
        }
        for request in requests {
            let gather = |sgl: &verbs::Sgl| Payload::Gather(sgl.clone());
            let (op, payload) = match &request.op {
                SendOp::Send { sgl, imm } => (
                    WqeOp::Send {
                        imm: *imm,
                        invalidate: None,
                    },
                    gather(sgl),
                ),
                SendOp::SendInline { data, imm } => (
                    WqeOp::Send {
                        imm: *imm,
                        invalidate: None,
                    },
                    Payload::Inline(*data),
                ),
                SendOp::SendWithInv { sgl, invalidate } => (
                    WqeOp::Send {
                        imm: None,
                        invalidate: Some(*invalidate),
                    },
                    gather(sgl),
                ),
                SendOp::RdmaWrite {
                    sgl,
                    remote_addr,
                    rkey,
                    imm,
                } => (
                    WqeOp::Write {
                        remote_addr: *remote_addr,
                        rkey: *rkey,
                        imm: *imm,
                    },
                    gather(sgl),
                ),
                SendOp::RdmaRead {
                    sgl,
                    remote_addr,
                    rkey,
                } => (
                    WqeOp::Read {
                        remote_addr: *remote_addr,
                        rkey: *rkey,
                    },
                    gather(sgl),
                ),
                SendOp::LocalInv { rkey } => (
                    WqeOp::LocalInv { rkey: *rkey },
                    Payload::Gather(verbs::Sgl::new()),
                ),
            };
            // Checked above; the sum fits.
            let len = match &payload {
                Payload::Gather(sgl) => sgl.total_len().unwrap_or(0),
                Payload::Inline(data) => data.len(),
            };
            let npkts = match op {
                WqeOp::LocalInv { .. } => 0,
                _ => len.div_ceil(self.mtu).max(1),
            };
            // Pins cannot fail: every lkey was checked above.
            let _ = arena.pin_sgl(payload.sgl());
            let wqe = SendWqe {
                wr_id: request.wr_id,
                signaled: request.signaled,
                op,
                payload,
                len,
                first_psn: self.post_psn,
                npkts,
                executed: false,
            };
            self.post_psn = self.post_psn.wrapping_add(npkts);
            // Room was checked above: within the capacity allocated at
            // creation, so this never allocates.
            self.sq.push_back(wqe);
        }
        Ok(())
    }

    /// Executes and completes a just-posted LOCAL_INV at once when it is
    /// the oldest unfinished WQE and the cursor is on it: nothing before it
    /// is outstanding, so this is what the next [`Qp::poll`] would do, one
    /// loop turn earlier. A target that revokes a chunk before reading its
    /// request (RTRS `always_invalidate`) then answers in the same turn.
    pub fn run_posted_local<S, const N: usize>(&mut self, ctx: &mut Context<'_, S, N>)
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if self.state != QpState::Rts || self.rnr_until.is_some() || self.tx_seq != self.front_seq {
            return;
        }
        while let Some(&SendWqe {
            op: WqeOp::LocalInv { rkey },
            executed: false,
            ..
        }) = self.sq.front()
        {
            if ctx.arena.invalidate(rkey).is_err() {
                self.fail_at(0, WcStatus::LocProtErr, ctx);
                return;
            }
            if let Some(wqe) = self.sq.front_mut() {
                wqe.executed = true;
            }
            self.tx_seq += 1;
            self.retire(ctx);
            if self.tx_seq != self.front_seq {
                return;
            }
        }
    }

    /// Index in `sq` of the WQE with sequence number `seq`, if queued.
    fn sq_index(&self, seq: u64) -> Option<usize> {
        let index = usize::try_from(seq.checked_sub(self.front_seq)?).ok()?;
        (index < self.sq.len()).then_some(index)
    }

    pub(super) fn wqe_at(&self, index: usize) -> Option<&SendWqe> {
        self.sq.get(index)
    }

    fn wqe_at_mut(&mut self, index: usize) -> Option<&mut SendWqe> {
        self.sq.get_mut(index)
    }

    /// Whether selective resends are marked.
    fn resend_pending(&self) -> bool {
        self.resend.pending()
    }

    /// Whether the cursor has a packet the window allows right now.
    pub(super) fn can_send_now(&self) -> bool {
        if self.rnr_until.is_some() {
            return false;
        }
        if self.resend_pending() {
            return true;
        }
        let Some(index) = self.sq_index(self.tx_seq) else {
            return false;
        };
        match self.wqe_at(index) {
            Some(wqe) if matches!(wqe.op, WqeOp::LocalInv { .. }) => true,
            Some(wqe) => self.window_allows(index, wqe),
            None => false,
        }
    }

    /// How far past `una` a packet may be sent: [`config::MAX_UNACKED_PSNS`],
    /// or on a selective QP no more than the peer's reorder buffer keeps
    /// ([`super::selective::held_limit`]), so nothing sent is dropped there
    /// for lack of room.
    fn window(&self) -> u32 {
        if self.selective() {
            super::selective::held_limit(self.mtu).min(config::MAX_UNACKED_PSNS)
        } else {
            config::MAX_UNACKED_PSNS
        }
    }

    /// Non-final packets between AckReqs: rxe's [`config::ACK_REQ_INTERVAL`],
    /// or on a selective QP half its window, so ACKs open the window before
    /// it is full.
    fn ack_req_interval(&self) -> u32 {
        if self.selective() {
            (self.window() / 2).clamp(1, config::ACK_REQ_INTERVAL)
        } else {
            config::ACK_REQ_INTERVAL
        }
    }

    /// Window and READ-depth checks for sending `tx_psn` of WQE `index`.
    fn window_allows(&self, index: usize, wqe: &SendWqe) -> bool {
        // rxe: a packet may go while its PSN is at most 128 past the oldest
        // unacknowledged one (`rnbd-linux-srv-linux-clt.pcap` frame 360).
        if self.una.distance_to(self.tx_psn) > self.window() {
            return false;
        }
        if wqe.is_read() {
            let depth = self.params.map_or(1, |params| params.max_rd_atomic.max(1));
            let outstanding = self.sq.iter().take(index).filter(|w| w.is_read()).count();
            if outstanding >= usize::from(depth) {
                return false;
            }
        }
        true
    }

    /// Retransmit timer and RNR wait.
    pub(super) fn run_timers<S, const N: usize>(&mut self, now: u64, ctx: &mut Context<'_, S, N>)
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if self.rnr_until.is_some_and(|until| now >= until) {
            self.rnr_until = None;
        }
        let Some(deadline) = self.retransmit_deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        if self.una == self.sent_end {
            self.retransmit_deadline = None;
            return;
        }
        ctx.counters.timeouts += 1;
        let negotiated = self.negotiated_timeout();
        if now.saturating_sub(self.timer.retry_epoch) >= negotiated {
            // A whole negotiated timeout without progress: what rxe counts.
            if self.retry_left == 0 {
                self.fail_front(WcStatus::RetryExcErr, ctx);
                return;
            }
            if self.params.is_some_and(|params| params.retry_count < 7) {
                self.retry_left -= 1;
            }
            self.timer.retry_epoch = now;
        } else {
            ctx.counters.early_timeouts += 1;
        }
        self.timer.back_off(negotiated);
        if self.selective() {
            self.selective_timeout();
        } else {
            self.rewind(self.una);
        }
        self.arm_timer(now);
    }

    /// The negotiated Local ACK Timeout (ns): the timer's cap and the
    /// period that consumes a unit of the retry count.
    fn negotiated_timeout(&self) -> u64 {
        self.params
            .map_or(1 << 31, |params| params.ack_timeout_ns())
    }

    /// (Re)arms the retransmit deadline one current timeout after `now`.
    fn arm_timer(&mut self, now: u64) {
        let timeout = self.timer.timeout(self.negotiated_timeout());
        self.retransmit_deadline = Some(now.saturating_add(timeout));
    }

    /// Arms the timer from idle at `now` and starts a retry epoch there.
    pub(super) fn start_timer(&mut self, now: u64) {
        self.timer.retry_epoch = now;
        self.arm_timer(now);
    }

    /// Moves the transmit cursor to `psn` (inside `una ..= sent_end`).
    ///
    /// PSNs are assigned at post time, so `psn` may be the first PSN of a WQE
    /// the cursor never reached; a LOCAL_INV the cursor has not executed yet
    /// stops the search there, so it is never skipped.
    pub(super) fn rewind(&mut self, psn: Psn) {
        // Going back resends everything from `psn`: no mark is needed.
        self.resend.clear(self.una);
        // Karn's rule: a sampled packet about to be resent times nothing.
        if self
            .timer
            .sample
            .is_some_and(|sample| !sample.psn.is_before(psn))
        {
            self.timer.sample = None;
        }
        for (index, wqe) in self.sq.iter().enumerate() {
            let pending_local = matches!(wqe.op, WqeOp::LocalInv { .. }) && !wqe.executed;
            if wqe.contains(psn) || pending_local {
                self.tx_seq = self.front_seq + index as u64;
                self.tx_psn = psn;
                return;
            }
        }
    }

    /// Sends requester packets from the cursor, at most `budget`.
    pub(super) fn send_requests<S, K, const N: usize>(
        &mut self,
        now: u64,
        ctx: &mut Context<'_, S, N>,
        sink: &mut K,
        budget: usize,
    ) -> usize
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
        K: FrameSink + ?Sized,
    {
        let mut sent = 0;
        if self.resend_pending() && self.rnr_until.is_none() {
            sent += self.send_marked(ctx, sink, budget);
            if self.retransmit_deadline.is_none() && sent > 0 {
                self.start_timer(now);
            }
        }
        while sent < budget && self.state == QpState::Rts && self.rnr_until.is_none() {
            let Some(index) = self.sq_index(self.tx_seq) else {
                break;
            };
            let Some(wqe) = self.wqe_at(index) else {
                break;
            };
            if let WqeOp::LocalInv { rkey } = wqe.op {
                if !wqe.executed {
                    if ctx.arena.invalidate(rkey).is_err() {
                        self.fail_at(index, WcStatus::LocProtErr, ctx);
                        break;
                    }
                    if let Some(wqe) = self.wqe_at_mut(index) {
                        wqe.executed = true;
                    }
                }
                self.tx_seq += 1;
                self.retire(ctx);
                continue;
            }
            if !self.window_allows(index, wqe) {
                break;
            }
            // Only a message of three packets or more has middle packets.
            if self.fast_transmit && wqe.npkts > 2 {
                let run = self.send_middle_run(now, index, ctx, sink, budget - sent);
                if run > 0 {
                    sent += run;
                    continue;
                }
            }
            let Some(wqe) = self.wqe_at(index) else {
                break;
            };
            // The WQE is read in place (send_packet takes `&self`), not cloned.
            let (is_read, last_psn) = (wqe.is_read(), wqe.last_psn());
            let retransmission = self.tx_psn.is_before(self.sent_end);
            let final_packet = is_read || self.tx_psn == last_psn;
            let ack_req = final_packet || self.since_ack_req + 1 >= self.ack_req_interval();
            let emitted = self.send_packet(wqe, self.tx_psn, ack_req, ctx, sink);
            if !emitted {
                self.since_ack_req = if ack_req { 0 } else { self.since_ack_req + 1 };
                self.fail_at(index, WcStatus::LocProtErr, ctx);
                break;
            }
            sent += 1;
            let next = if is_read {
                last_psn.wrapping_add(1)
            } else {
                self.tx_psn.wrapping_add(1)
            };
            self.sent_one(
                now,
                ack_req,
                retransmission,
                final_packet,
                next,
                ctx.counters,
            );
        }
        sent
    }

    /// The requester's books after the packet at `tx_psn` went out: AckReq
    /// spacing, the retransmission count or an RTT sample, the cursor
    /// (`next`; the next WQE after a `final` packet), `sent_end`, the timer.
    fn sent_one(
        &mut self,
        now: u64,
        ack_req: bool,
        retransmission: bool,
        last: bool,
        next: Psn,
        counters: &mut Counters,
    ) {
        self.since_ack_req = if ack_req { 0 } else { self.since_ack_req + 1 };
        if retransmission {
            counters.retransmissions += 1;
            self.retransmitted += 1;
        } else if ack_req && self.timer.sample.is_none() {
            self.timer.sample = Some(RttSample {
                psn: self.tx_psn,
                sent_at: now,
            });
        }
        if next.is_after(self.sent_end) {
            self.sent_end = next;
        }
        if last {
            self.tx_seq += 1;
        }
        self.tx_psn = next;
        if self.retransmit_deadline.is_none() {
            self.start_timer(now);
        }
    }

    /// The middle packets of WQE `index` from `tx_psn` on, as one run: a
    /// SEND or WRITE whose payload is one registered range is resolved
    /// once, the packets' shape is taken once, and each packet is a slice
    /// of that range, its patched headers and trailer, and the books of
    /// [`Qp::sent_one`]; as many as the window and `budget` allow. The
    /// frames and the books are those the packet-by-packet path makes
    /// (`rc_sim`'s `fast_paths_change_nothing_on_the_wire`). Returns the
    /// packets sent; 0 (nothing done) where that path must go instead: a
    /// first or last packet, a READ, an inline or gathered payload, a range
    /// that does not resolve.
    fn send_middle_run<S, K, const N: usize>(
        &mut self,
        now: u64,
        index: usize,
        ctx: &mut Context<'_, S, N>,
        sink: &mut K,
        budget: usize,
    ) -> usize
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
        K: FrameSink + ?Sized,
    {
        let Some(wqe) = self.wqe_at(index) else {
            return 0;
        };
        let opcode = match wqe.op {
            WqeOp::Send { .. } => Opcode::RcSendMiddle,
            WqeOp::Write { .. } => Opcode::RcRdmaWriteMiddle,
            WqeOp::Read { .. } | WqeOp::LocalInv { .. } => return 0,
        };
        let sge = match &wqe.payload {
            Payload::Gather(sgl) => match sgl.as_slice() {
                [sge] => *sge,
                _ => return 0,
            },
            Payload::Inline(_) => return 0,
        };
        let packet = wqe.first_psn.distance_to(self.tx_psn);
        if packet == 0 || packet + 1 >= wqe.npkts {
            return 0;
        }
        // The packets before the last, within the window (`window_allows`:
        // at most `window` PSNs past `una`, which no ACK moves meanwhile).
        let room = (self.window() + 1).saturating_sub(self.una.distance_to(self.tx_psn));
        let count = (wqe.npkts - 1 - packet).min(room).min(budget as u32);
        let mtu = self.mtu;
        let Some(shape) = self.middle_shape(opcode, mtu as usize) else {
            return 0;
        };
        let Ok(pieces) =
            ctx.arena
                .sgl_pieces(core::slice::from_ref(&sge), packet * mtu, count * mtu)
        else {
            return 0;
        };
        let [range] = pieces.as_slice() else {
            return 0;
        };
        let interval = self.ack_req_interval();
        for piece in range.chunks_exact(mtu as usize) {
            let retransmission = self.tx_psn.is_before(self.sent_end);
            let ack_req = self.since_ack_req + 1 >= interval;
            let (headers, trailer) = shape.packet(self.tx_psn, ack_req, &[piece]);
            sink.transmit(&headers, &[piece], trailer.as_bytes());
            let next = self.tx_psn.wrapping_add(1);
            self.sent_one(now, ack_req, retransmission, false, next, ctx.counters);
        }
        count as usize
    }

    /// Builds and emits the packet at `psn` of `wqe` (AckReq as given;
    /// READ requests always ask). False if its local
    /// memory cannot be read (cannot happen while pinned).
    pub(super) fn send_packet<S, K, const N: usize>(
        &self,
        wqe: &SendWqe,
        psn: Psn,
        ack_req: bool,
        ctx: &mut Context<'_, S, N>,
        sink: &mut K,
    ) -> bool
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
        K: FrameSink + ?Sized,
    {
        let index = wqe.first_psn.distance_to(psn);
        let offset = index.saturating_mul(self.mtu);
        let first = index == 0;
        let last = index + 1 >= wqe.npkts;
        let mut ext = ExtHeaders::default();
        if let WqeOp::Read { remote_addr, rkey } = wqe.op {
            ext.reth = Some(RethRepr {
                virtual_address: remote_addr.wrapping_add(u64::from(offset)),
                rkey,
                dma_length: wqe.len.saturating_sub(offset),
            });
            return self.emit(sink, Opcode::RcRdmaReadRequest, psn, true, &ext, &[]);
        }
        let len = wqe.len.saturating_sub(offset).min(self.mtu);
        let opcode = match wqe.op {
            WqeOp::Send { imm, invalidate } => {
                if last {
                    if let Some(imm) = imm {
                        ext.immdt = Some(ImmDtRepr { immediate: imm });
                    }
                    if let Some(rkey) = invalidate {
                        ext.ieth = Some(IethRepr { rkey });
                    }
                }
                match (first, last, imm.is_some(), invalidate.is_some()) {
                    (true, true, _, true) => Opcode::RcSendOnlyWithInvalidate,
                    (true, true, true, _) => Opcode::RcSendOnlyWithImmediate,
                    (true, true, false, false) => Opcode::RcSendOnly,
                    (true, false, ..) => Opcode::RcSendFirst,
                    (false, false, ..) => Opcode::RcSendMiddle,
                    (false, true, _, true) => Opcode::RcSendLastWithInvalidate,
                    (false, true, true, _) => Opcode::RcSendLastWithImmediate,
                    (false, true, false, false) => Opcode::RcSendLast,
                }
            }
            WqeOp::Write {
                remote_addr,
                rkey,
                imm,
            } => {
                if first {
                    ext.reth = Some(RethRepr {
                        virtual_address: remote_addr,
                        rkey,
                        dma_length: wqe.len,
                    });
                }
                if last {
                    if let Some(imm) = imm {
                        ext.immdt = Some(ImmDtRepr { immediate: imm });
                    }
                }
                match (first, last, imm.is_some()) {
                    (true, true, true) => Opcode::RcRdmaWriteOnlyWithImmediate,
                    (true, true, false) => Opcode::RcRdmaWriteOnly,
                    (true, false, _) => Opcode::RcRdmaWriteFirst,
                    (false, false, _) => Opcode::RcRdmaWriteMiddle,
                    (false, true, true) => Opcode::RcRdmaWriteLastWithImmediate,
                    (false, true, false) => Opcode::RcRdmaWriteLast,
                }
            }
            WqeOp::Read { .. } | WqeOp::LocalInv { .. } => return false,
        };
        if let Payload::Inline(inline) = &wqe.payload {
            // MAX_INLINE (32) is below the smallest path MTU (256): one
            // packet, offset 0; a resend rebuilds it from the WQE.
            return self.emit(sink, opcode, psn, ack_req, &ext, &[inline.as_slice()]);
        }
        match ctx.arena.sgl_pieces(wqe.payload.sgl(), offset, len) {
            Ok(pieces) => self.emit(sink, opcode, psn, ack_req, &ext, &pieces),
            Err(_) => false,
        }
    }
}

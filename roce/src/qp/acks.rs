//! The requester's answers: ACKs, NAKs and READ responses move `una`,
//! retire and complete WQEs in order, or go back N; errors fail the send
//! queue. The sending side is in `requester.rs`.

use verbs::{WcStatus, WorkCompletion};

use super::{Context, Qp, QpState, WqeOp};
use crate::types::Psn;
use crate::wire::{NakCode, Opcode, RoceFrame, Syndrome};

/// What a cumulative ACK did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckOutcome {
    /// `una` moved forward.
    Progress,
    /// Nothing new (duplicate or stale ACK).
    NoProgress,
    /// The ACK covers a READ whose responses never arrived: go back.
    ReadLost,
}

impl Qp {
    /// Handles an ACKNOWLEDGE or READ response.
    pub(super) fn handle_response<S, const N: usize>(
        &mut self,
        now: u64,
        frame: &RoceFrame<'_>,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let psn = frame.bth.psn;
        let Some(aeth) = frame.ext.aeth else {
            if frame.bth.opcode == Opcode::RcRdmaReadResponseMiddle {
                self.handle_read_response(now, frame, ctx);
            } else {
                ctx.counters.drop_bad_opcode += 1;
            }
            return;
        };
        if frame.bth.opcode != Opcode::RcAcknowledge {
            if aeth.syndrome.is_ack() {
                self.handle_read_response(now, frame, ctx);
            } else {
                ctx.counters.drop_bad_opcode += 1;
            }
            return;
        }
        // A response must name a PSN we sent: `psn < sent_end`.
        if !psn.is_before(self.sent_end) {
            ctx.counters.stale_acks += 1;
            return;
        }
        let una_before = self.una;
        match aeth.syndrome {
            Syndrome::Ack { .. } => match self.apply_ack(psn, ctx) {
                AckOutcome::Progress => self.on_progress(now, ctx),
                AckOutcome::NoProgress => ctx.counters.stale_acks += 1,
                AckOutcome::ReadLost => {
                    // `apply_ack` may have moved `una` up to the READ.
                    if una_before != self.una {
                        self.on_progress(now, ctx);
                    }
                    self.go_back(self.una, false, ctx);
                }
            },
            Syndrome::RnrNak { timer } => {
                ctx.counters.rnr_naks_received += 1;
                if psn.is_before(self.una) {
                    ctx.counters.stale_acks += 1;
                    return;
                }
                if self.apply_ack(psn.wrapping_sub(1), ctx) == AckOutcome::Progress {
                    self.on_progress(now, ctx);
                }
                if self.rnr_left == 0 {
                    self.fail_front(WcStatus::RnrRetryExcErr, ctx);
                    return;
                }
                if self.params.is_some_and(|params| params.rnr_retry < 7) {
                    self.rnr_left -= 1;
                }
                if self.selective() {
                    // The packets after it are kept by the peer: resend
                    // only the refused one after the wait.
                    self.mark_resend(psn);
                } else {
                    self.rewind(psn);
                }
                let until = now.saturating_add(super::rnr_delay_ns(timer));
                self.rnr_until = Some(until);
                // The timer must not fire during the RNR wait: it starts
                // afresh (retry epoch included) when the wait ends.
                self.start_timer(until);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                ctx.counters.naks_received += 1;
                if psn.is_before(self.una) {
                    ctx.counters.stale_acks += 1;
                    return;
                }
                if self.apply_ack(psn.wrapping_sub(1), ctx) == AckOutcome::Progress {
                    self.on_progress(now, ctx);
                }
                if self.state != QpState::Rts {
                    return;
                }
                if self.selective() {
                    // Brick's selective NAK: the MSN field counts the
                    // missing PSNs from `psn`; resend those only.
                    self.selective_gap(psn, aeth.msn.value());
                    if self.retransmit_deadline.is_none() {
                        self.start_timer(now);
                    }
                    return;
                }
                self.go_back(psn, true, ctx);
                if self.retransmit_deadline.is_none() {
                    self.start_timer(now);
                }
            }
            Syndrome::Nak(code) => {
                ctx.counters.naks_received += 1;
                if psn.is_before(self.una) {
                    ctx.counters.stale_acks += 1;
                    return;
                }
                let _ = self.apply_ack(psn.wrapping_sub(1), ctx);
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail_front(status, ctx);
            }
            Syndrome::Reserved(_) => ctx.counters.drop_bad_opcode += 1,
        }
    }

    /// Go-back-N to `psn` on a NAK (counting a retry) or a detected loss.
    /// A NAK naming the PSN we already went back to, with no progress since,
    /// is a duplicate and ignored.
    fn go_back<S, const N: usize>(
        &mut self,
        psn: Psn,
        counts_retry: bool,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if self.last_nak == Some(psn) {
            return;
        }
        if counts_retry {
            if self.retry_left == 0 {
                self.fail_front(WcStatus::RetryExcErr, ctx);
                return;
            }
            if self.params.is_some_and(|params| params.retry_count < 7) {
                self.retry_left -= 1;
            }
        }
        self.last_nak = Some(psn);
        self.rewind(psn);
    }

    /// Progress seen: a sampled PSN now acknowledged updates the RTT
    /// estimate, retry budgets refill, the timer restarts with a new retry
    /// epoch (or stops when nothing is outstanding), the cursor never lags
    /// behind `una`.
    fn on_progress<S, const N: usize>(&mut self, now: u64, ctx: &mut Context<'_, S, N>)
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if let Some(sample) = self.timer.sample {
            if sample.psn.is_before(self.una) {
                self.timer.sample = None;
                self.timer.record(now.saturating_sub(sample.sent_at));
                ctx.counters.rtt_samples += 1;
            }
        }
        if let Some(params) = self.params {
            self.retry_left = params.retry_count.min(7);
            self.rnr_left = params.rnr_retry.min(7);
        }
        self.last_nak = None;
        if self.una == self.sent_end {
            self.retransmit_deadline = None;
        } else {
            self.start_timer(now);
        }
        if self.tx_psn.is_before(self.una) {
            self.rewind(self.una);
            if !self.sq.iter().any(|wqe| wqe.contains(self.una)) {
                self.tx_psn = self.una;
            }
        }
    }

    /// Cumulative ACK of every PSN up to and including `psn`.
    fn apply_ack<S, const N: usize>(&mut self, psn: Psn, ctx: &mut Context<'_, S, N>) -> AckOutcome
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let target = psn.wrapping_add(1);
        if !target.is_after(self.una) || target.is_after(self.sent_end) {
            return AckOutcome::NoProgress;
        }
        let mut new_una = self.una;
        let mut outcome = AckOutcome::Progress;
        for wqe in self.sq.iter() {
            if wqe.npkts == 0 || wqe.last_psn().is_before(new_una) {
                continue;
            }
            if wqe.first_psn.is_after(psn) {
                break;
            }
            if wqe.is_read() {
                outcome = AckOutcome::ReadLost;
                break;
            }
            if wqe.last_psn().is_before(target) {
                new_una = wqe.last_psn().wrapping_add(1);
            } else {
                new_una = target;
                break;
            }
        }
        if new_una == self.una {
            return if outcome == AckOutcome::ReadLost {
                AckOutcome::ReadLost
            } else {
                AckOutcome::NoProgress
            };
        }
        self.una = new_una;
        self.retire(ctx);
        outcome
    }

    /// A READ response packet: in order only; data goes straight into the
    /// WQE's SGL.
    fn handle_read_response<S, const N: usize>(
        &mut self,
        now: u64,
        frame: &RoceFrame<'_>,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        let psn = frame.bth.psn;
        let Some(index) = self
            .sq
            .iter()
            .position(|wqe| wqe.is_read() && wqe.contains(psn))
        else {
            ctx.counters.stale_acks += 1;
            return;
        };
        if !psn.is_before(self.sent_end) || psn.is_before(self.una) {
            ctx.counters.stale_acks += 1;
            return;
        }
        let Some(wqe) = self.wqe_at(index) else {
            return;
        };
        let first_psn = wqe.first_psn;
        // Everything before the READ was executed by the responder.
        if first_psn.is_after(self.una)
            && self.apply_ack(first_psn.wrapping_sub(1), ctx) == AckOutcome::Progress
        {
            self.on_progress(now, ctx);
        }
        if psn != self.una {
            // An earlier response was lost: ask again from the first missing.
            ctx.counters.stale_acks += 1;
            self.go_back(self.una, false, ctx);
            return;
        }
        let Some(index) = self.sq.iter().position(|wqe| wqe.contains(psn)) else {
            return;
        };
        let Some(wqe) = self.wqe_at(index) else {
            return;
        };
        let packet = wqe.first_psn.distance_to(psn);
        let offset = packet.saturating_mul(self.mtu);
        let expected = wqe.len.saturating_sub(offset).min(self.mtu);
        let last = psn == wqe.last_psn();
        let opcode_last = matches!(
            frame.bth.opcode,
            Opcode::RcRdmaReadResponseLast | Opcode::RcRdmaReadResponseOnly
        );
        if last != opcode_last || frame.payload.len() != expected as usize {
            ctx.counters.drop_bad_opcode += 1;
            return;
        }
        let scattered = ctx
            .arena
            .scatter_from(wqe.payload.sgl(), offset, frame.payload);
        if scattered.is_err() {
            self.fail_at(index, WcStatus::LocProtErr, ctx);
            return;
        }
        self.una = psn.wrapping_add(1);
        // A cursor waiting to re-request this READ from an older PSN is
        // moved up to `una` by `on_progress`.
        self.retire(ctx);
        self.on_progress(now, ctx);
    }

    /// Retires completed WQEs from the front, in order.
    pub(super) fn retire<S, const N: usize>(&mut self, ctx: &mut Context<'_, S, N>)
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        while let Some(wqe) = self.sq.front() {
            let done = match wqe.op {
                // Executed when the cursor passes it; a cursor that jumped
                // past it (go-back to a later PSN) executes it here.
                WqeOp::LocalInv { rkey } if !wqe.executed && self.tx_seq > self.front_seq => {
                    if ctx.arena.invalidate(rkey).is_err() {
                        self.fail_at(0, WcStatus::LocProtErr, ctx);
                        return;
                    }
                    true
                }
                WqeOp::LocalInv { .. } => wqe.executed,
                _ => wqe.last_psn().is_before(self.una),
            };
            if !done {
                break;
            }
            let Some(wqe) = self.sq.pop_front() else {
                break;
            };
            self.front_seq += 1;
            if self.tx_seq < self.front_seq {
                self.tx_seq = self.front_seq;
            }
            let _ = ctx.arena.unpin_sgl(wqe.payload.sgl());
            if wqe.signaled {
                let mut wc = WorkCompletion::new(
                    wqe.wr_id,
                    self.conn,
                    wqe.completion_opcode(),
                    WcStatus::Success,
                );
                if wqe.is_read() {
                    wc.byte_len = wqe.len;
                }
                self.complete(ctx, wc);
            }
        }
    }

    /// Fails the oldest unfinished WQE with `status`, then errors the QP.
    pub(super) fn fail_front<S, const N: usize>(
        &mut self,
        status: WcStatus,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        self.retire(ctx);
        self.fail_at(0, status, ctx);
    }

    /// Completes WQE `index` with `status` (unfinished WQEs before it with
    /// `WrFlushErr`, keeping completion order) and moves the QP to `Err`.
    pub(super) fn fail_at<S, const N: usize>(
        &mut self,
        index: usize,
        status: WcStatus,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        for position in 0..=index {
            let Some(wqe) = self.sq.pop_front() else {
                break;
            };
            self.front_seq += 1;
            let _ = ctx.arena.unpin_sgl(wqe.payload.sgl());
            let status = if position == index {
                status
            } else {
                WcStatus::WrFlushErr
            };
            let wc = WorkCompletion::new(wqe.wr_id, self.conn, wqe.completion_opcode(), status);
            self.complete(ctx, wc);
        }
        self.enter_error(ctx, WcStatus::WrFlushErr);
    }
}

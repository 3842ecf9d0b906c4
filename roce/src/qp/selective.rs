//! Selective retransmission between Brick peers (Brick's extension,
//! `docs/protocol/selective-retransmission.md`), in the spirit of IRN
//! ("Revisiting Network Support for RDMA", SIGCOMM 2018).
//!
//! Only on a QP whose [`QpParams::selective_retransmission`] is set, which
//! the CM sets only when both ends offered it (a Linux peer never does, so
//! it sees the standard go-back-N wire). The wire is the standard one; what
//! changes is what each end does with it:
//!
//! - **Responder.** A request packet up to [`WINDOW`] PSNs ahead of the
//!   expected PSN is kept in a bounded reorder buffer (allocated with the
//!   QP, [`REORDER_BYTES`] of payload and [`MAX_HELD`] entries) instead of
//!   being dropped. When the missing packet arrives, the kept ones are
//!   executed in PSN order by the ordinary in-order code, so placement,
//!   completions, ACKs and errors are exactly those of in-order arrival.
//!   What is missing is reported with a NAK PSN Sequence Error naming the
//!   expected PSN (as the standard does, an implied ACK of everything before
//!   it) whose MSN field carries the number of consecutive missing PSNs from
//!   there (up to the first kept packet). The NAK goes out when a gap opens,
//!   when the expected PSN moves to a new gap while packets are kept beyond
//!   it, and whenever a packet asking for an ACK (AckReq) arrives ahead of a
//!   gap (a lost NAK or a lost retransmission is asked about again).
//! - **Requester.** Such a NAK resends only the PSNs it names (a READ once,
//!   from its first named PSN), never the whole window, and does not consume
//!   the retry count. A retransmit timeout resends the oldest unacknowledged
//!   packet and the newest one sent (a tail probe; the responder's answer to
//!   it names any remaining gap) instead of going back N, and the timer's
//!   floor is [`config::SELECTIVE_MIN_RETRANSMIT_TIMEOUT_NS`], since an early
//!   expiry costs two packets rather than a window. Only the last packet of
//!   a batch of resends asks for an ACK. The window is at most what the
//!   peer's buffer keeps ([`held_limit`]: 128 PSNs at MTU 1024, 32 at 4096),
//!   so nothing is dropped for lack of room. An RNR NAK resends, after the
//!   RNR wait, the refused packet alone (the peer kept the ones after it).
//!   Lost READ responses still go back N as in the standard.

use alloc::vec::Vec;

use super::{config, Context, Qp, QpState, Response};
use crate::types::{Msn, Psn};
use crate::wire::{
    BthRepr, EthernetRepr, ExtHeaders, Ipv4Repr, NakCode, RoceFrame, Syndrome, UdpRepr,
};

/// Payload bytes a QP's reorder buffer holds (allocated once, with the QP).
pub const REORDER_BYTES: usize = 128 << 10;
/// Most packets kept out of order per QP.
pub const MAX_HELD: usize = 128;
/// How far ahead of the expected PSN a packet is kept, and the span of the
/// requester's resend marks: above the 129 PSNs a requester may have
/// outstanding ([`config::MAX_UNACKED_PSNS`]).
pub const WINDOW: u32 = 256;

/// Packets a reorder buffer keeps at path MTU `mtu` (both ends compute
/// it the same way: a selective requester sends at most this many PSNs past
/// its oldest unacknowledged one).
pub const fn held_limit(mtu: u32) -> u32 {
    let slots = REORDER_BYTES / if mtu == 0 { 1 } else { mtu as usize };
    if slots < MAX_HELD {
        slots as u32
    } else {
        MAX_HELD as u32
    }
}

/// A packet kept out of order: its headers (its payload is in the buffer).
#[derive(Debug, Clone, Copy)]
struct Held {
    eth: EthernetRepr,
    ip: Ipv4Repr,
    udp: UdpRepr,
    bth: BthRepr,
    ext: ExtHeaders,
    icrc: u32,
    len: u32,
}

/// The responder's reorder buffer.
pub(super) struct Reorder {
    /// Payload slots, `slot` bytes each (allocated once).
    buf: Vec<u8>,
    /// Headers per slot (allocated once).
    held: Vec<Option<Held>>,
    slot: usize,
    slots: usize,
    kept: usize,
    /// One past the highest PSN seen ahead of the expected one.
    seen_end: Option<Psn>,
    /// The expected PSN the last selective NAK named.
    naked: Option<Psn>,
}

impl Reorder {
    /// An empty buffer; allocates its memory (QP creation only).
    pub(super) fn new() -> Self {
        let mut held = Vec::with_capacity(MAX_HELD);
        held.resize(MAX_HELD, None);
        let mut buf = Vec::with_capacity(REORDER_BYTES);
        buf.resize(REORDER_BYTES, 0);
        Self {
            buf,
            held,
            slot: 1024,
            slots: 0,
            kept: 0,
            seen_end: None,
            naked: None,
        }
    }

    /// A buffer without memory, holding nothing (a placeholder while a QP
    /// is rebuilt around its buffer; never allocates).
    pub(super) fn empty() -> Self {
        Self {
            buf: Vec::new(),
            held: Vec::new(),
            slot: 1024,
            slots: 0,
            kept: 0,
            seen_end: None,
            naked: None,
        }
    }

    /// Sizes the slots for path MTU `mtu` and forgets everything.
    pub(super) fn configure(&mut self, mtu: u32) {
        self.slot = (mtu as usize).max(1);
        self.slots = (self.buf.len() / self.slot)
            .min(self.held.len())
            .min(held_limit(mtu) as usize);
        self.clear();
    }

    /// Forgets every kept packet.
    pub(super) fn clear(&mut self) {
        self.held.iter_mut().for_each(|entry| *entry = None);
        self.kept = 0;
        self.seen_end = None;
        self.naked = None;
    }

    /// Bytes allocated per QP besides the struct.
    pub(super) const fn heap_bytes() -> usize {
        REORDER_BYTES + MAX_HELD * core::mem::size_of::<Option<Held>>()
    }

    fn index_of(&self, psn: Psn) -> Option<usize> {
        if self.kept == 0 {
            return None;
        }
        self.held[..self.slots]
            .iter()
            .position(|entry| entry.is_some_and(|held| held.bth.psn == psn))
    }

    /// Keeps `frame`; false if it is already kept or there is no room.
    fn store(&mut self, frame: &RoceFrame<'_>) -> bool {
        let len = frame.payload.len();
        if len > self.slot || self.buf.len() < self.slot * self.slots {
            return false;
        }
        if self.index_of(frame.bth.psn).is_some() {
            return false;
        }
        let Some(index) = self.held[..self.slots].iter().position(Option::is_none) else {
            return false;
        };
        let start = index * self.slot;
        self.buf[start..start + len].copy_from_slice(frame.payload);
        self.held[index] = Some(Held {
            eth: frame.eth,
            ip: frame.ip,
            udp: frame.udp,
            bth: frame.bth,
            ext: frame.ext,
            icrc: frame.icrc,
            len: len as u32,
        });
        self.kept += 1;
        true
    }

    /// Drops kept packets behind `epsn` (executed meanwhile by a resend).
    fn discard_before(&mut self, epsn: Psn) {
        if self.kept == 0 {
            return;
        }
        for entry in self.held[..self.slots].iter_mut() {
            if entry.is_some_and(|held| held.bth.psn.is_before(epsn)) {
                *entry = None;
                self.kept -= 1;
            }
        }
    }

    /// Missing PSNs from `epsn` on: up to the first kept packet, or up to
    /// the highest PSN seen; `None` when nothing ahead is known.
    fn gap(&self, epsn: Psn) -> Option<u32> {
        let seen = self.seen_end.filter(|end| end.is_after(epsn))?;
        let mut count = epsn.distance_to(seen);
        for held in self.held[..self.slots].iter().flatten() {
            if held.bth.psn.is_after(epsn) {
                count = count.min(epsn.distance_to(held.bth.psn));
            }
        }
        Some(count)
    }
}

/// The requester's marks: PSNs to resend, one bit each, indexed by PSN
/// modulo [`WINDOW`] (every marked PSN is within `una .. una + 129`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Resend {
    bits: [u64; (WINDOW / 64) as usize],
    /// Marks behind this PSN are cleared.
    base: Psn,
    marked: u32,
}

impl Resend {
    pub(super) const fn new() -> Self {
        Self {
            bits: [0; (WINDOW / 64) as usize],
            base: Psn::new(0),
            marked: 0,
        }
    }

    /// Whether any PSN is marked.
    pub(super) fn pending(&self) -> bool {
        self.marked > 0
    }

    fn bit(psn: Psn) -> (usize, u64) {
        let index = psn.value() % WINDOW;
        ((index / 64) as usize, 1 << (index % 64))
    }

    fn is_marked(&self, psn: Psn) -> bool {
        let (word, mask) = Self::bit(psn);
        self.bits[word] & mask != 0
    }

    fn unmark(&mut self, psn: Psn) {
        let (word, mask) = Self::bit(psn);
        if self.bits[word] & mask != 0 {
            self.bits[word] &= !mask;
            self.marked -= 1;
        }
    }

    /// Clears every mark.
    pub(super) fn clear(&mut self, base: Psn) {
        self.bits = [0; (WINDOW / 64) as usize];
        self.marked = 0;
        self.base = base;
    }

    /// Clears the marks of PSNs behind `una` (acknowledged meanwhile).
    fn advance(&mut self, una: Psn) {
        if self.marked == 0 || self.base.distance_to(una) >= WINDOW {
            if self.marked != 0 {
                self.clear(una);
            }
            self.base = una;
            return;
        }
        while self.base.is_before(una) {
            self.unmark(self.base);
            self.base = self.base.wrapping_add(1);
        }
    }
}

impl Qp {
    /// Whether this QP runs the selective scheme.
    pub(super) fn selective(&self) -> bool {
        self.params
            .is_some_and(|params| params.selective_retransmission)
    }

    /// Responder: a request `distance` PSNs ahead of the expected one on a
    /// selective QP. Kept if it fits; the gap is NAKed when it is new or the
    /// packet asks for an ACK.
    pub(super) fn keep_out_of_order<S, const N: usize>(
        &mut self,
        frame: &RoceFrame<'_>,
        ctx: &mut Context<'_, S, N>,
    ) {
        let psn = frame.bth.psn;
        if self.epsn.distance_to(psn) >= WINDOW {
            ctx.counters.drop_out_of_sequence += 1;
            return;
        }
        let end = psn.wrapping_add(1);
        if self.reorder.seen_end.is_none_or(|seen| end.is_after(seen)) {
            self.reorder.seen_end = Some(end);
        }
        if self.reorder.index_of(psn).is_some() {
            ctx.counters.duplicates += 1;
        } else if self.reorder.store(frame) {
            ctx.counters.kept_out_of_order += 1;
        } else {
            ctx.counters.drop_out_of_sequence += 1;
        }
        if self.reorder.naked != Some(self.epsn) || frame.bth.ack_req {
            self.selective_nak(ctx);
        }
    }

    /// Queues the NAK naming the gap at the expected PSN, if there is one.
    fn selective_nak<S, const N: usize>(&mut self, ctx: &mut Context<'_, S, N>) {
        let Some(count) = self.reorder.gap(self.epsn) else {
            return;
        };
        let response = Response::Ack {
            psn: self.epsn,
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn: Msn::new_truncate(count.max(1)),
        };
        if self.out.push_back(response).is_err() {
            ctx.counters.responses_dropped += 1;
            return;
        }
        ctx.counters.naks_sent += 1;
        self.reorder.naked = Some(self.epsn);
    }

    /// Responder, after an in-order packet: executes kept packets that are
    /// now in order, then NAKs the next gap if packets are kept beyond it.
    pub(super) fn drain_kept<S, const N: usize>(&mut self, ctx: &mut Context<'_, S, N>)
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if self.reorder.seen_end.is_none() {
            return;
        }
        loop {
            if !matches!(self.state, QpState::Rtr | QpState::Rts) {
                self.reorder.clear();
                return;
            }
            self.reorder.discard_before(self.epsn);
            let Some(index) = self.reorder.index_of(self.epsn) else {
                break;
            };
            let Some(held) = self.reorder.held[index].take() else {
                break;
            };
            self.reorder.kept -= 1;
            let buf = core::mem::take(&mut self.reorder.buf);
            let start = index * self.reorder.slot;
            let payload = buf.get(start..start + held.len as usize).unwrap_or(&[]);
            let frame = RoceFrame {
                eth: held.eth,
                ip: held.ip,
                udp: held.udp,
                bth: held.bth,
                ext: held.ext,
                payload,
                icrc: held.icrc,
            };
            let before = self.epsn;
            self.handle_request(&frame, ctx);
            self.reorder.buf = buf;
            if self.epsn == before {
                // Not executed (RNR NAK, or an error): the requester resends
                // it after the RNR wait; nothing to NAK now.
                return;
            }
        }
        if self.reorder.gap(self.epsn).is_none() {
            self.reorder.seen_end = None;
            self.reorder.naked = None;
        } else if self.reorder.naked != Some(self.epsn) {
            self.selective_nak(ctx);
        }
    }

    /// Requester: marks `psn` for a selective resend (ignored outside
    /// `una .. sent_end`).
    pub(super) fn mark_resend(&mut self, psn: Psn) {
        self.resend.advance(self.una);
        if psn.is_before(self.una) || !psn.is_before(self.sent_end) {
            return;
        }
        if !self.resend.is_marked(psn) {
            let (word, mask) = Resend::bit(psn);
            self.resend.bits[word] |= mask;
            self.resend.marked += 1;
        }
    }

    /// Requester: a selective NAK named `count` missing PSNs from `psn`.
    pub(super) fn selective_gap(&mut self, psn: Psn, count: u32) {
        let count = count.clamp(1, config::MAX_UNACKED_PSNS + 1);
        for offset in 0..count {
            self.mark_resend(psn.wrapping_add(offset));
        }
    }

    /// Requester: a retransmit timeout on a selective QP resends the oldest
    /// unacknowledged packet and the newest one sent.
    pub(super) fn selective_timeout(&mut self) {
        let una = self.una;
        self.mark_resend(una);
        self.mark_resend(self.sent_end.wrapping_sub(1));
    }

    /// Requester: sends marked PSNs (AckReq set), oldest first, at most
    /// `budget`. A READ is asked again once, from its first marked PSN.
    pub(super) fn send_marked<S, K, const N: usize>(
        &mut self,
        ctx: &mut Context<'_, S, N>,
        sink: &mut K,
        budget: usize,
    ) -> usize
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
        K: super::FrameSink + ?Sized,
    {
        self.resend.advance(self.una);
        let mut sent = 0;
        let mut psn = self.una;
        while sent < budget && self.resend.marked > 0 && psn.is_before(self.sent_end) {
            if !self.resend.is_marked(psn) {
                psn = psn.wrapping_add(1);
                continue;
            }
            self.resend.unmark(psn);
            let Some(index) = self.sq.iter().position(|wqe| wqe.contains(psn)) else {
                psn = psn.wrapping_add(1);
                continue;
            };
            let Some(wqe) = self.wqe_at(index).cloned() else {
                break;
            };
            if wqe.is_read() {
                let mut rest = psn.wrapping_add(1);
                while !rest.is_after(wqe.last_psn()) {
                    self.resend.unmark(rest);
                    rest = rest.wrapping_add(1);
                }
            }
            // One AckReq per batch (its last packet; READ requests always
            // ask): the responder answers it with an ACK or the gap left.
            let ack_req = wqe.is_read() || self.resend.marked == 0 || sent + 1 == budget;
            if !self.send_packet(&wqe, psn, ack_req, ctx, sink) {
                self.fail_at(index, verbs::WcStatus::LocProtErr, ctx);
                break;
            }
            ctx.counters.retransmissions += 1;
            sent += 1;
            psn = psn.wrapping_add(1);
        }
        if !psn.is_before(self.sent_end) {
            self.resend.clear(self.una);
        }
        sent
    }
}

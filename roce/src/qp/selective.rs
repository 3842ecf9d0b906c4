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
//!   expected PSN is kept in a bounded reorder buffer ([`REORDER_BYTES`] of
//!   payload and [`MAX_HELD`] entries, lent by the HCA's [`ReorderPool`]
//!   while the gap lasts) instead of being dropped. When the missing packet
//!   arrives, the kept ones are executed in PSN order by the ordinary
//!   in-order code, so placement, completions, ACKs and errors are exactly
//!   those of in-order arrival. What is missing is reported with a NAK PSN
//!   Sequence Error naming the expected PSN (as the standard does, an
//!   implied ACK of everything before it) whose MSN field carries the
//!   number of consecutive missing PSNs from there (up to the first kept
//!   packet). The NAK goes out when a gap opens or the expected PSN moves
//!   past the PSNs the last NAK named onto a gap (never for PSNs the
//!   requester is resending already), and whenever a packet asking for an
//!   ACK (AckReq) arrives ahead of a gap (a lost NAK or a lost
//!   retransmission is asked about again).
//! - **Requester.** Such a NAK resends only the PSNs it names (a READ once,
//!   from its first named PSN), never the whole window, and does not consume
//!   the retry count. Only the last packet of a batch of resends asks for an
//!   ACK. A retransmit timeout resends the oldest unacknowledged packet and
//!   the newest one sent (a tail probe; the responder's answer to it names
//!   any remaining gap) instead of going back N. The timer's floor is
//!   [`config::SELECTIVE_MIN_RETRANSMIT_TIMEOUT_NS`], since an early expiry
//!   costs two packets rather than a window; for the same reason a single
//!   long delay (a held frame) moves the estimate little: a sample counts
//!   as at most 2·SRTT + G and the margin over SRTT is at most 2·G. The
//!   window is at most what the peer's buffer keeps ([`held_limit`]: 128
//!   PSNs at MTU 1024, 32 at 4096), so nothing is dropped for lack of room.
//!   An RNR NAK resends, after the RNR wait, the refused packet alone (the
//!   peer kept the ones after it). Lost READ responses still go back N as
//!   in the standard.
//!
//! [`QpParams::selective_retransmission`]: super::QpParams::selective_retransmission

use alloc::vec::Vec;

use super::{config, Context, Qp, QpState, Response};
use crate::types::{Msn, Psn};
use crate::wire::{
    BthRepr, EthernetRepr, ExtHeaders, Ipv4Repr, NakCode, RoceFrame, Syndrome, UdpRepr,
};

/// Payload bytes of one reorder buffer (allocated once, with the HCA).
pub const REORDER_BYTES: usize = 128 << 10;
/// Most packets one reorder buffer keeps.
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

/// One reorder buffer of the pool: payload slots and their headers.
struct Buffer {
    /// Payload slots (allocated once).
    bytes: Vec<u8>,
    /// Headers per slot (allocated once).
    held: Vec<Option<Held>>,
}

/// The reorder buffers of an HCA, lent to a selective QP's responder while
/// it has a gap and given back when the gap closes (or the QP fails or is
/// destroyed). Allocated once, with the HCA; a QP that finds none free
/// drops out-of-order packets as the standard does (its peer still resends
/// only what it is told is missing).
pub struct ReorderPool {
    buffers: Vec<Buffer>,
    free: Vec<u16>,
}

impl ReorderPool {
    /// `count` buffers (at most 65,536), allocated here.
    pub fn with_capacity(count: usize) -> Self {
        let count = count.min(1 << 16);
        let mut buffers = Vec::with_capacity(count);
        let mut free = Vec::with_capacity(count);
        for index in 0..count {
            let mut held = Vec::with_capacity(MAX_HELD);
            held.resize(MAX_HELD, None);
            let bytes = alloc::vec![0; REORDER_BYTES];
            buffers.push(Buffer { bytes, held });
            free.push((count - 1 - index) as u16);
        }
        Self { buffers, free }
    }

    /// Bytes a pool of `count` buffers takes.
    pub const fn bytes_for(count: usize) -> usize {
        count * (REORDER_BYTES + MAX_HELD * core::mem::size_of::<Option<Held>>())
    }

    /// Buffers not lent.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers of the pool.
    pub fn capacity(&self) -> usize {
        self.buffers.len()
    }
}

/// A selective responder's out-of-order state; the packets themselves are
/// in a buffer lent by the [`ReorderPool`].
pub(super) struct Reorder {
    lease: Option<u16>,
    slot: usize,
    slots: usize,
    kept: usize,
    /// One past the highest PSN seen ahead of the expected one.
    seen_end: Option<Psn>,
    /// One past the last PSN the last selective NAK named missing: up to
    /// there the requester is resending already.
    reported_end: Option<Psn>,
}

impl Reorder {
    /// Nothing kept, no buffer.
    pub(super) const fn new() -> Self {
        Self {
            lease: None,
            slot: 1024,
            slots: 0,
            kept: 0,
            seen_end: None,
            reported_end: None,
        }
    }

    /// Sizes the slots for path MTU `mtu`.
    pub(super) fn configure(&mut self, mtu: u32) {
        self.slot = (mtu as usize).max(1);
        self.slots = (REORDER_BYTES / self.slot)
            .min(MAX_HELD)
            .min(held_limit(mtu) as usize);
    }

    /// Forgets every kept packet and gives the buffer back.
    pub(super) fn release(&mut self, pool: &mut ReorderPool) {
        if let Some(lease) = self.lease.take() {
            if let Some(buffer) = pool.buffers.get_mut(usize::from(lease)) {
                buffer.held.iter_mut().for_each(|entry| *entry = None);
                // Never more than the pool's own buffers: no allocation.
                if pool.free.len() < pool.free.capacity() {
                    pool.free.push(lease);
                }
            }
        }
        self.kept = 0;
        self.seen_end = None;
        self.reported_end = None;
    }

    /// Whether the requester was told `epsn` is missing (and is resending).
    fn told(&self, epsn: Psn) -> bool {
        self.reported_end.is_some_and(|end| epsn.is_before(end))
    }

    /// Whether a buffer is lent (test and debugging aid).
    pub(super) fn leased(&self) -> bool {
        self.lease.is_some()
    }

    fn buffer<'p>(&self, pool: &'p ReorderPool) -> Option<&'p Buffer> {
        pool.buffers.get(usize::from(self.lease?))
    }

    fn index_of(&self, pool: &ReorderPool, psn: Psn) -> Option<usize> {
        if self.kept == 0 {
            return None;
        }
        self.buffer(pool)?.held[..self.slots]
            .iter()
            .position(|entry| entry.is_some_and(|held| held.bth.psn == psn))
    }

    /// Keeps `frame`; false if it is already kept or there is no room.
    fn store(&mut self, pool: &mut ReorderPool, frame: &RoceFrame<'_>) -> bool {
        let len = frame.payload.len();
        if len > self.slot || self.index_of(pool, frame.bth.psn).is_some() {
            return false;
        }
        if self.lease.is_none() {
            self.lease = pool.free.pop();
        }
        let slot = self.slot;
        let slots = self.slots;
        let Some(buffer) = self
            .lease
            .and_then(|lease| pool.buffers.get_mut(usize::from(lease)))
        else {
            return false;
        };
        if buffer.bytes.len() < slot * slots {
            return false;
        }
        let Some(index) = buffer.held[..slots].iter().position(Option::is_none) else {
            return false;
        };
        let start = index * slot;
        buffer.bytes[start..start + len].copy_from_slice(frame.payload);
        buffer.held[index] = Some(Held {
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
    fn discard_before(&mut self, pool: &mut ReorderPool, epsn: Psn) {
        if self.kept == 0 {
            return;
        }
        let slots = self.slots;
        let Some(buffer) = self
            .lease
            .and_then(|lease| pool.buffers.get_mut(usize::from(lease)))
        else {
            return;
        };
        for entry in buffer.held[..slots].iter_mut() {
            if entry.is_some_and(|held| held.bth.psn.is_before(epsn)) {
                *entry = None;
                self.kept -= 1;
            }
        }
    }

    /// Missing PSNs from `epsn` on: up to the first kept packet, or up to
    /// the highest PSN seen; `None` when nothing ahead is known.
    fn gap(&self, pool: &ReorderPool, epsn: Psn) -> Option<u32> {
        let seen = self.seen_end.filter(|end| end.is_after(epsn))?;
        let mut count = epsn.distance_to(seen);
        if let Some(buffer) = self.buffer(pool).filter(|_| self.kept > 0) {
            for held in buffer.held[..self.slots].iter().flatten() {
                if held.bth.psn.is_after(epsn) {
                    count = count.min(epsn.distance_to(held.bth.psn));
                }
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
        if self.reorder.index_of(ctx.reorder, psn).is_some() {
            ctx.counters.duplicates += 1;
        } else if self.reorder.store(ctx.reorder, frame) {
            ctx.counters.kept_out_of_order += 1;
        } else {
            ctx.counters.drop_out_of_sequence += 1;
        }
        if !self.reorder.told(self.epsn) || frame.bth.ack_req {
            self.selective_nak(ctx);
        }
    }

    /// Queues the NAK naming the gap at the expected PSN, if there is one.
    fn selective_nak<S, const N: usize>(&mut self, ctx: &mut Context<'_, S, N>) {
        let Some(count) = self.reorder.gap(ctx.reorder, self.epsn) else {
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
        self.reorder.reported_end = Some(self.epsn.wrapping_add(count.max(1)));
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
                self.reorder.release(ctx.reorder);
                return;
            }
            self.reorder.discard_before(ctx.reorder, self.epsn);
            let Some(index) = self.reorder.index_of(ctx.reorder, self.epsn) else {
                break;
            };
            let Some(lease) = self.reorder.lease.map(usize::from) else {
                break;
            };
            let Some(held) = ctx.reorder.buffers[lease].held[index].take() else {
                break;
            };
            self.reorder.kept -= 1;
            // The payload stays where it is: the buffer's bytes are moved out
            // of the pool (no copy, no allocation) while the packet runs.
            let bytes = core::mem::take(&mut ctx.reorder.buffers[lease].bytes);
            let start = index * self.reorder.slot;
            let payload = bytes.get(start..start + held.len as usize).unwrap_or(&[]);
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
            ctx.reorder.buffers[lease].bytes = bytes;
            if self.epsn == before {
                // Not executed (RNR NAK, or an error): the requester resends
                // it after the RNR wait; nothing to NAK now.
                return;
            }
        }
        if self.reorder.gap(ctx.reorder, self.epsn).is_none() {
            self.reorder.release(ctx.reorder);
        } else if !self.reorder.told(self.epsn) {
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
            self.timer.forget_sample(psn);
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
            self.retransmitted += 1;
            sent += 1;
            psn = psn.wrapping_add(1);
        }
        if !psn.is_before(self.sent_end) {
            self.resend.clear(self.una);
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::{held_limit, Reorder, ReorderPool, Resend, MAX_HELD, WINDOW};
    use crate::types::Psn;

    #[test]
    fn held_limit_follows_the_mtu() {
        assert_eq!(held_limit(256), MAX_HELD as u32);
        assert_eq!(held_limit(1024), 128);
        assert_eq!(held_limit(2048), 64);
        assert_eq!(held_limit(4096), 32);
        assert_eq!(held_limit(0), MAX_HELD as u32);
    }

    #[test]
    fn resend_marks_survive_the_psn_wrap_and_clear_behind_una() {
        let mut resend = Resend::new();
        let base = Psn::new(0x00ff_fff0);
        resend.clear(base);
        for offset in [0u32, 5, 20, 100] {
            let psn = base.wrapping_add(offset);
            let (word, mask) = Resend::bit(psn);
            resend.bits[word] |= mask;
            resend.marked += 1;
        }
        assert!(resend.is_marked(base.wrapping_add(20)));
        assert!(!resend.is_marked(base.wrapping_add(21)));
        // una moves past three marks (across the wrap): they are cleared.
        resend.advance(base.wrapping_add(21));
        assert_eq!(resend.marked, 1);
        assert!(!resend.is_marked(base));
        assert!(resend.is_marked(base.wrapping_add(100)));
        // A jump of a whole window or more clears everything.
        resend.advance(base.wrapping_add(21 + WINDOW));
        assert!(!resend.pending());
    }

    #[test]
    fn a_lease_is_given_back_once() {
        let mut pool = ReorderPool::with_capacity(2);
        assert_eq!((pool.available(), pool.capacity()), (2, 2));
        let mut reorder = Reorder::new();
        reorder.configure(1024);
        reorder.lease = pool.free.pop();
        assert_eq!(pool.available(), 1);
        reorder.kept = 3;
        reorder.release(&mut pool);
        assert_eq!(pool.available(), 2);
        assert!(!reorder.leased());
        assert_eq!(reorder.kept, 0);
        // Releasing again gives nothing back twice.
        reorder.release(&mut pool);
        assert_eq!(pool.available(), 2);
    }
}

//! RC queue pairs: requester and responder of the software HCA, sans-IO.
//!
//! One [`Qp`] is both ends of a Reliable Connected queue pair as Linux rxe
//! speaks it (`docs/protocol/roce-v2.md` §2): the *requester* turns posted
//! send work requests into packets, keeps them until the peer acknowledges
//! them and retransmits (go-back-N) on NAK or timeout; the *responder*
//! checks incoming requests (PSN order, opcode sequence, access, R_Key and
//! range, lengths), places payloads straight into registered memory,
//! acknowledges, answers RDMA READs and NAKs what it must refuse.
//!
//! The QP owns no memory and no clock. Every call gets the registered-memory
//! [`Arena`], the time `now` (nanoseconds, monotonic) and the place for
//! completions; frames leave through a [`FrameSink`] as headers + payload
//! slices of registered memory + trailer, so payloads are never copied on
//! the way out, and land through [`Arena::scatter_from`] / checked handles on
//! the way in. Nothing allocates; queues have the capacities in [`config`].
//!
//! # States (IBTA QP states, roce-v2.md §2.1)
//!
//! `Reset` → `Init` (receives may be posted) → `Rtr` (responder runs) →
//! `Rts` (requester runs) → `Err` (everything flushed; incoming packets are
//! dropped; only NAKs already queued still go out). `Sqd`/`Sqe` are not used.
//!
//! # Requester
//!
//! Work requests get their PSN range when posted (a READ takes one PSN per
//! response packet, a LOCAL_INV none). A transmit cursor (`tx_seq`, `tx_psn`)
//! walks the send queue; `una` is the oldest unacknowledged PSN and
//! `sent_end` one past the highest PSN ever sent. A packet may go out while
//! it is at most [`config::MAX_UNACKED_PSNS`] PSNs past `una` (and, for a
//! READ, while fewer than `max_rd_atomic` READs are outstanding). ACKs are
//! cumulative; an ACK older than `una` is stale and ignored, one past
//! `sent_end` is bogus and ignored, one covering a READ whose responses are
//! missing means they were lost and triggers a go-back. Go-back-N rewinds the
//! cursor to the NAK'd PSN (NAK 0x60, acted on whenever it names a new PSN:
//! unlike rxe a NAK during a retry is not ignored), to the RNR NAK'd PSN after
//! the RNR delay, or to `una` on timeout; every packet from there is resent
//! from the same registered memory (READs resume at the first missing
//! response with VA/length adjusted). The retransmit timer is armed
//! whenever anything sent is unacknowledged and re-armed on progress — never
//! left idle with packets outstanding, the rxe bug behind
//! `tests/vectors/rnbd-lossy-stall.pcap`. Unlike rxe's fixed 4.096 µs ·
//! 2^`local_ack_timeout` (2.15 s with the CM default), its period adapts to
//! the measured round-trip time, between
//! [`config::MIN_RETRANSMIT_TIMEOUT_NS`] and that negotiated timeout, which
//! alone still decides when the retry count runs out (the `timer`
//! module describes the timer; [`Qp::rtt_estimate`] shows it).
//!
//! # Selective retransmission
//!
//! Between two Brick ends that negotiated it (CM reserved bits,
//! [`QpParams::selective_retransmission`]) the go-back-N below is replaced
//! by the [`selective`] scheme: the responder keeps packets ahead of the
//! expected PSN in a buffer lent by the HCA's pool and NAKs only what is
//! missing; the requester resends only that. A QP with a Linux peer runs
//! exactly the standard transport described here.
//!
//! # Responder
//!
//! In-order PSNs only: a PSN ahead of the expected one gets one NAK 0x60
//! (expected PSN) per gap, then silence until the expected PSN arrives; a PSN
//! behind it is a duplicate, re-ACKed with the last acknowledged PSN and never
//! re-executed (duplicate READs are replayed from a ring of
//! [`config::READ_RESOURCES`] remembered reads). No receive posted → RNR NAK.
//! Bad R_Key/range/right → NAK 0x62, bad opcode sequence, lengths or
//! forbidden operation → NAK 0x61; both put the QP into `Err`.
//!
//! # Not implemented (yet)
//!
//! - Atomics (CmpSwap/FetchAdd, ATOMIC ACK): RTRS and rping do not use
//!   them; the responder answers one with NAK 0x61 (an operation the QP does
//!   not permit) and goes to `Err`.
//! - The solicited-event bit: `verbs::SendWr` has no flag for it, so SE is
//!   never set, and it is ignored on receive.
//! - UD and the GSI QP (CM MADs) belong to the CM module, not here.
//! - The completion queue cannot overflow: a QP's send and receive depths
//!   bound its WQEs plus its unconsumed completions, and each QP reserves
//!   that many CQ entries ([`CompletionQueue`]).
//! - Like rxe, ACK credits and MSN are not used by the requester, and the
//!   responder recycles its READ ring rather than NAKing a peer that exceeds
//!   `max_dest_rd_atomic`.

use alloc::collections::VecDeque;

use core::cell::Cell;

use heapless::Deque;
use verbs::memory::Arena;
use verbs::{ConnId, WcOpcode, WcStatus, WorkCompletion};

use crate::types::{Msn, Psn, Qpn};
use crate::wire::{
    ipv4, udp, EtherType, EthernetAddress, EthernetRepr, ExtHeaders, FrameHeaders, HeaderTemplate,
    IcrcSeed, Ipv4Address, Ipv4Repr, Opcode, RoceFrame, UdpRepr, MAX_HEADERS_LEN,
};
use crate::wire::{BthRepr, ExtSet, PacketShape, Trailer};

mod acks;
mod requester;
mod responder;
pub mod selective;
mod timer;

pub mod config;
mod env;
mod params;
mod wqe;

pub use env::{CompletionQueue, Context, Counters, CqReserveError, FrameSink};
pub use params::{rnr_delay_ns, Path, QpParams};
use wqe::{Inbound, Payload, ReadResource, RecvWqe, Response, SendWqe, WqeOp};

/// QP states, named after the IBTA's (roce-v2.md §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, nothing configured; packets are dropped.
    Reset,
    /// Receives may be posted; packets are still dropped.
    Init,
    /// Ready to receive: the responder runs, the requester does not.
    Rtr,
    /// Ready to send: requester and responder run.
    Rts,
    /// Error: work requests were flushed, incoming packets are dropped.
    Err,
}

/// One RC queue pair (see the module docs).
pub struct Qp {
    conn: ConnId,
    qpn: Qpn,
    state: QpState,
    params: Option<QpParams>,
    template: Option<HeaderTemplate>,
    /// The headers of the last middle packet built from `template`, for the
    /// next ones (see [`PacketShape`]); a cache, so behind a `Cell` for the
    /// `&self` emit path.
    middle: Cell<Option<PacketShape>>,
    /// Where every packet's ICRC starts (see [`IcrcSeed`]).
    icrc: IcrcSeed,
    mtu: u32,

    /// Completions carry this tag into the CQ (the HCA's slot and
    /// generation of the QP).
    cq_tag: u64,
    /// Send WQEs plus unconsumed send completions allowed (`sq` holds up
    /// to this many, allocated once).
    send_depth: usize,
    /// Receive WQEs (the one in progress included) plus unconsumed receive
    /// completions allowed.
    recv_depth: usize,
    /// Send completions in the CQ not yet consumed.
    held_send: usize,
    /// Receive completions in the CQ not yet consumed.
    held_recv: usize,

    // Requester.
    sq: VecDeque<SendWqe>,
    /// Sequence number of `sq.front()`.
    front_seq: u64,
    /// Sequence number of the WQE the cursor is in.
    tx_seq: u64,
    /// Next PSN the cursor sends.
    tx_psn: Psn,
    /// PSN the next posted WQE starts at.
    post_psn: Psn,
    /// Oldest unacknowledged PSN.
    una: Psn,
    /// One past the highest PSN sent.
    sent_end: Psn,
    retry_left: u8,
    rnr_left: u8,
    retransmit_deadline: Option<u64>,
    /// RTT estimate, backoff and retry-charging epoch of the timer.
    timer: timer::RetransmitTimer,
    rnr_until: Option<u64>,
    /// The PSN of the last go-back done on a NAK, until progress.
    last_nak: Option<Psn>,
    /// Non-final packets sent since the last AckReq.
    since_ack_req: u32,
    /// Packets this QP's requester sent again (its share of
    /// [`Counters::retransmissions`]).
    retransmitted: u64,
    /// Middle packets go out in runs (`requester::send_middle_run`);
    /// off only in the equivalence tests.
    fast_transmit: bool,

    // Responder.
    rq: VecDeque<RecvWqe>,
    epsn: Psn,
    /// PSN duplicates are re-ACKed with (last accepted SEND/WRITE packet).
    ack_psn: Psn,
    msn: Msn,
    /// A NAK 0x60 went out for the current gap.
    nak_sent: bool,
    inbound: Inbound,
    reads: [Option<ReadResource>; config::READ_RESOURCES],
    read_next: usize,
    read_seq: u32,
    out: Deque<Response, { config::RESPONSE_DEPTH }>,
    /// Selective retransmission: the responder's out-of-order packets.
    reorder: selective::Reorder,
    /// Selective retransmission: the requester's PSNs to resend.
    resend: selective::Resend,
}

impl Qp {
    /// A QP in `Reset` with number `qpn`, reported in completions as `conn`,
    /// with the default depths ([`config::SQ_DEPTH`], [`config::RQ_DEPTH`]).
    pub fn new(conn: ConnId, qpn: Qpn) -> Self {
        Self::with_depths(conn, qpn, config::SQ_DEPTH, config::RQ_DEPTH)
    }

    /// A QP in `Reset` whose queues hold `send_depth` send and
    /// `recv_depth` receive WQEs (allocated here, once; at least 1 each).
    /// Each depth bounds WQEs plus their completions not yet consumed, so
    /// the QP never has more than `send_depth + recv_depth` completions in
    /// the CQ: what it must reserve there.
    pub fn with_depths(conn: ConnId, qpn: Qpn, send_depth: usize, recv_depth: usize) -> Self {
        let send_depth = send_depth.max(1);
        let recv_depth = recv_depth.max(1);
        Self::from_queues(
            conn,
            qpn,
            VecDeque::with_capacity(send_depth),
            VecDeque::with_capacity(recv_depth),
            send_depth,
            recv_depth,
        )
    }

    /// Bytes a QP of these depths takes: the struct and its queues.
    pub const fn bytes_for(send_depth: usize, recv_depth: usize) -> usize {
        core::mem::size_of::<Qp>()
            + send_depth * core::mem::size_of::<SendWqe>()
            + recv_depth * core::mem::size_of::<RecvWqe>()
    }

    /// Sends middle packets in runs or one by one (see
    /// [`Hca::set_fast_paths`](crate::hca::Hca::set_fast_paths)); on by
    /// default and after [`Qp::reuse`].
    #[doc(hidden)]
    pub fn set_fast_transmit(&mut self, on: bool) {
        self.fast_transmit = on;
    }

    /// Makes this QP a new one in `Reset` numbered `qpn` (completions
    /// report `conn` and carry `cq_tag`), keeping its queue memory: the
    /// HCA reuses QPs instead of allocating. Drop pins first
    /// ([`Qp::release`]).
    pub fn reuse(&mut self, conn: ConnId, qpn: Qpn, cq_tag: u64) {
        let mut sq = core::mem::take(&mut self.sq);
        let mut rq = core::mem::take(&mut self.rq);
        sq.clear();
        rq.clear();
        let (send_depth, recv_depth) = (self.send_depth, self.recv_depth);
        *self = Self::from_queues(conn, qpn, sq, rq, send_depth, recv_depth);
        self.cq_tag = cq_tag;
    }

    fn from_queues(
        conn: ConnId,
        qpn: Qpn,
        sq: VecDeque<SendWqe>,
        rq: VecDeque<RecvWqe>,
        send_depth: usize,
        recv_depth: usize,
    ) -> Self {
        Self {
            conn,
            qpn,
            cq_tag: 0,
            send_depth,
            recv_depth,
            held_send: 0,
            held_recv: 0,
            state: QpState::Reset,
            params: None,
            template: None,
            middle: Cell::new(None),
            icrc: IcrcSeed::new(),
            mtu: 1024,
            sq,
            front_seq: 0,
            tx_seq: 0,
            tx_psn: Psn::new(0),
            post_psn: Psn::new(0),
            una: Psn::new(0),
            sent_end: Psn::new(0),
            retry_left: 0,
            rnr_left: 0,
            retransmit_deadline: None,
            timer: timer::RetransmitTimer::new(),
            rnr_until: None,
            last_nak: None,
            since_ack_req: 0,
            retransmitted: 0,
            fast_transmit: true,
            rq,
            epsn: Psn::new(0),
            ack_psn: Psn::new(0),
            msn: Msn::new(0),
            nak_sent: false,
            inbound: Inbound::Idle,
            reads: [None; config::READ_RESOURCES],
            read_next: 0,
            read_seq: 0,
            out: Deque::new(),
            reorder: selective::Reorder::new(),
            resend: selective::Resend::new(),
        }
    }

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The connection id completions carry.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// Packets this QP's requester sent again (go-back-N after a NAK, RNR
    /// or timeout, or a selective resend) since it was created.
    pub fn retransmissions(&self) -> u64 {
        self.retransmitted
    }

    /// Send and receive depths ([`Qp::with_depths`]): together, the CQ
    /// entries the QP needs.
    pub fn depths(&self) -> (usize, usize) {
        (self.send_depth, self.recv_depth)
    }

    /// Completions of this QP in the CQ not consumed yet.
    pub fn completions_held(&self) -> usize {
        self.held_send + self.held_recv
    }

    /// Send WQEs that may be posted now: the send depth less queued WQEs
    /// and unconsumed send completions.
    pub fn send_room(&self) -> usize {
        self.send_depth
            .saturating_sub(self.sq.len() + self.held_send)
    }

    /// Receive WQEs that may be posted now (as [`Qp::send_room`]).
    pub fn recv_room(&self) -> usize {
        let in_progress = usize::from(matches!(self.inbound, Inbound::Send { .. }));
        self.recv_depth
            .saturating_sub(self.rq.len() + in_progress + self.held_recv)
    }

    /// The consumer took one of this QP's completions out of the CQ.
    pub fn completion_consumed(&mut self, opcode: WcOpcode) {
        if opcode.is_receive() {
            self.held_recv = self.held_recv.saturating_sub(1);
        } else {
            self.held_send = self.held_send.saturating_sub(1);
        }
    }

    /// Puts a completion into the CQ, counted against the QP's depth until
    /// consumed.
    fn complete<S, const N: usize>(&mut self, ctx: &mut Context<'_, S, N>, wc: WorkCompletion) {
        if wc.opcode.is_receive() {
            self.held_recv += 1;
        } else {
            self.held_send += 1;
        }
        ctx.cq.push(self.cq_tag, wc, ctx.counters);
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The parameters given to [`Qp::connect`], if any.
    pub fn params(&self) -> Option<&QpParams> {
        self.params.as_ref()
    }

    /// The peer's IPv4 address once connected.
    pub fn peer_ip(&self) -> Option<[u8; 4]> {
        self.params.map(|params| params.path.peer_ip)
    }

    /// A snapshot of the transport state, for tests, counters and debugging.
    pub fn snapshot(&self) -> QpSnapshot {
        QpSnapshot {
            state: self.state,
            send_queue: self.sq.len(),
            receive_queue: self.rq.len(),
            una: self.una,
            sent_end: self.sent_end,
            tx_psn: self.tx_psn,
            tx_index: self.tx_seq.saturating_sub(self.front_seq),
            retransmit_deadline: self.retransmit_deadline,
            rnr_until: self.rnr_until,
            expected_psn: self.epsn,
            msn: self.msn,
            responses_queued: self.out.len(),
        }
    }

    /// The requester's round-trip estimate and the retransmit timeout it
    /// arms next (see [`RttEstimate`]). Before [`Qp::ready_to_receive`] the
    /// negotiated timeout is unknown and taken as the initial one.
    pub fn rtt_estimate(&self) -> RttEstimate {
        let negotiated = self
            .params
            .map_or(config::INITIAL_RETRANSMIT_TIMEOUT_NS, |params| {
                params.ack_timeout_ns()
            });
        self.timer.estimate(negotiated)
    }

    /// `Reset` → `Init`: receives may be posted from now on.
    pub fn init(&mut self) {
        if self.state == QpState::Reset {
            self.state = QpState::Init;
        }
    }

    /// `Reset`/`Init` → `Rts` with `params`: [`Qp::ready_to_receive`] then
    /// [`Qp::ready_to_send`].
    ///
    /// # Errors
    /// As [`Qp::ready_to_receive`].
    pub fn connect(&mut self, params: QpParams) -> Result<(), ConnectQpError> {
        self.ready_to_receive(params)?;
        self.ready_to_send()
    }

    /// `Rtr` → `Rts`: the requester may send (the active side after the REP,
    /// the passive side on RTU or the first packet, ib-cm.md §4).
    ///
    /// # Errors
    /// [`ConnectQpError::InvalidState`] unless in `Rtr`.
    pub fn ready_to_send(&mut self) -> Result<(), ConnectQpError> {
        if self.state != QpState::Rtr {
            return Err(ConnectQpError::InvalidState);
        }
        self.state = QpState::Rts;
        Ok(())
    }

    /// `Reset`/`Init` → `Rtr` with `params`: the responder accepts the peer's
    /// packets from `params.recv_psn` on (post receives first); nothing is
    /// sent but ACKs, NAKs and READ responses.
    ///
    /// # Errors
    /// [`ConnectQpError::InvalidState`] if the QP is past `Init`,
    /// [`ConnectQpError::InvalidMtu`] for a reserved MTU encoding.
    pub fn ready_to_receive(&mut self, params: QpParams) -> Result<(), ConnectQpError> {
        if !matches!(self.state, QpState::Reset | QpState::Init) {
            return Err(ConnectQpError::InvalidState);
        }
        let mtu = params.mtu.bytes().ok_or(ConnectQpError::InvalidMtu)?;
        self.mtu = mtu as u32;
        let path = params.path;
        self.middle.set(None);
        self.template = Some(HeaderTemplate::new(&FrameHeaders {
            eth: EthernetRepr {
                src_addr: EthernetAddress(path.local_mac),
                dst_addr: EthernetAddress(path.peer_mac),
                ethertype: EtherType::Ipv4,
            },
            ip: Ipv4Repr {
                src_addr: Ipv4Address::from(path.local_ip),
                dst_addr: Ipv4Address::from(path.peer_ip),
                protocol: ipv4::Protocol::Udp,
                payload_len: 0,
                ttl: path.ttl,
                tos: path.tos,
                ident: 0,
                dont_frag: true,
            },
            udp: UdpRepr {
                src_port: path.udp_src_port,
                dst_port: udp::ROCE_V2_PORT,
            },
            bth: BthRepr {
                opcode: Opcode::RcAcknowledge,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: crate::types::Pkey::DEFAULT,
                fecn: false,
                becn: false,
                dest_qp: params.peer_qpn,
                ack_req: false,
                psn: Psn::new(0),
            },
            ext: ExtHeaders::default(),
        }));
        self.post_psn = params.send_psn;
        self.tx_psn = params.send_psn;
        self.una = params.send_psn;
        self.sent_end = params.send_psn;
        self.tx_seq = self.front_seq;
        self.retry_left = params.retry_count.min(7);
        self.rnr_left = params.rnr_retry.min(7);
        self.epsn = params.recv_psn;
        self.ack_psn = params.recv_psn.wrapping_sub(1);
        self.reorder.configure(self.mtu);
        self.resend.clear(params.send_psn);
        self.timer.set_floor(if params.selective_retransmission {
            config::SELECTIVE_MIN_RETRANSMIT_TIMEOUT_NS
        } else {
            config::MIN_RETRANSMIT_TIMEOUT_NS
        });
        self.timer
            .set_outlier_limits(params.selective_retransmission);
        self.params = Some(params);
        self.state = QpState::Rtr;
        Ok(())
    }

    /// The earliest time (ns) from which [`Qp::poll`] has anything to do:
    /// `Some(0)` when it has now (a response queued, a request it may
    /// send), the earlier of its timers (RNR wait, retransmission)
    /// otherwise, `None` when nothing can happen until the QP is touched
    /// again (a frame, a post, a state change). Before that time `poll`
    /// sends nothing and changes nothing. Unlike [`Qp::poll_at`], the
    /// retransmission deadline counts during an RNR wait too.
    pub fn wake_at(&self) -> Option<u64> {
        if !self.out.is_empty() {
            return Some(0);
        }
        if self.state != QpState::Rts {
            return None;
        }
        if self.can_send_now() {
            return Some(0);
        }
        match (self.rnr_until, self.retransmit_deadline) {
            (Some(rnr), Some(retransmit)) => Some(rnr.min(retransmit)),
            (rnr, retransmit) => rnr.or(retransmit),
        }
    }

    /// The next deadline (ns) at which [`Qp::poll`] has timer work, or
    /// `Some(now)` if it has frames to send right away.
    pub fn poll_at(&self, now: u64) -> Option<u64> {
        if !self.out.is_empty() {
            return Some(now);
        }
        if self.state != QpState::Rts {
            return None;
        }
        if let Some(until) = self.rnr_until {
            return Some(until);
        }
        if self.can_send_now() {
            return Some(now);
        }
        self.retransmit_deadline
    }

    /// Runs timers and sends up to `budget` frames: queued responses (ACK,
    /// NAK, READ replies) first, then requester packets. Returns the number
    /// of frames sent. Bounded: at most `budget` frames and O(`SQ_DEPTH`)
    /// bookkeeping per frame.
    pub fn poll<S, K, const N: usize>(
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
        if self.state == QpState::Rts {
            self.run_timers(now, ctx);
        }
        let mut sent = self.send_responses(ctx, sink, budget);
        if self.state == QpState::Rts {
            sent += self.send_requests(now, ctx, sink, budget - sent);
        }
        ctx.counters.frames_out += sent as u64;
        sent
    }

    /// Handles one parsed, ICRC-checked frame addressed to this QP (the HCA
    /// checked addresses and P_Key). Requests go to the responder, ACKs and
    /// READ responses to the requester; anything else is dropped and counted.
    pub fn receive<S, const N: usize>(
        &mut self,
        now: u64,
        frame: &RoceFrame<'_>,
        ctx: &mut Context<'_, S, N>,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        match self.state {
            QpState::Rtr | QpState::Rts => {}
            _ => {
                ctx.counters.drop_unknown_qpn += 1;
                return;
            }
        }
        match frame.bth.opcode {
            Opcode::RcAcknowledge
            | Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly => {
                if self.state == QpState::Rts {
                    self.handle_response(now, frame, ctx);
                } else {
                    ctx.counters.drop_bad_opcode += 1;
                }
            }
            _ => {
                self.handle_request(frame, ctx);
                if self.selective() {
                    self.drain_kept(ctx);
                }
            }
        }
    }

    /// Moves the QP to `Err`: every send and receive WR completes with
    /// `WrFlushErr` (a SEND in the middle of arriving with `in_progress`),
    /// pins are released, timers stop. Already queued ACK/NAK packets still
    /// go out (the NAK that explains the error); READ replies are dropped.
    pub fn enter_error<S, const N: usize>(
        &mut self,
        ctx: &mut Context<'_, S, N>,
        in_progress: WcStatus,
    ) where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        self.retransmit_deadline = None;
        self.rnr_until = None;
        self.reorder.release(ctx.reorder);
        while let Some(wqe) = self.sq.pop_front() {
            let _ = ctx.arena.unpin_sgl(wqe.payload.sgl());
            let wc = WorkCompletion::new(
                wqe.wr_id,
                self.conn,
                wqe.completion_opcode(),
                WcStatus::WrFlushErr,
            );
            self.complete(ctx, wc);
            self.front_seq += 1;
        }
        if let Inbound::Send { recv, .. } = core::mem::replace(&mut self.inbound, Inbound::Idle) {
            let _ = ctx.arena.unpin_sgl(recv.sgl.as_slice());
            let wc = WorkCompletion::new(recv.wr_id, self.conn, WcOpcode::Recv, in_progress);
            self.complete(ctx, wc);
        }
        while let Some(recv) = self.rq.pop_front() {
            let _ = ctx.arena.unpin_sgl(recv.sgl.as_slice());
            let wc =
                WorkCompletion::new(recv.wr_id, self.conn, WcOpcode::Recv, WcStatus::WrFlushErr);
            self.complete(ctx, wc);
        }
        let mut kept: Deque<Response, { config::RESPONSE_DEPTH }> = Deque::new();
        while let Some(response) = self.out.pop_front() {
            if matches!(response, Response::Ack { .. }) {
                let _ = kept.push_back(response);
            }
        }
        self.out = kept;
    }

    /// Gives back a reorder buffer the QP holds (before destroying it).
    pub fn release_reorder(&mut self, pool: &mut selective::ReorderPool) {
        self.reorder.release(pool);
    }

    /// Whether the QP holds a reorder buffer now (a selective responder
    /// with a gap open).
    pub fn holds_reorder_buffer(&self) -> bool {
        self.reorder.leased()
    }

    /// Releases every pin the QP holds without generating completions (for
    /// destroying a QP whose completions the consumer no longer wants).
    pub fn release<S, const N: usize>(&mut self, arena: &mut Arena<S, N>)
    where
        S: AsRef<[u8]> + AsMut<[u8]>,
    {
        while let Some(wqe) = self.sq.pop_front() {
            let _ = arena.unpin_sgl(wqe.payload.sgl());
        }
        if let Inbound::Send { recv, .. } = core::mem::replace(&mut self.inbound, Inbound::Idle) {
            let _ = arena.unpin_sgl(recv.sgl.as_slice());
        }
        while let Some(recv) = self.rq.pop_front() {
            let _ = arena.unpin_sgl(recv.sgl.as_slice());
        }
        self.out.clear();
        self.state = QpState::Err;
    }

    /// Emits one packet through `sink` from the template: `opcode`, `psn`,
    /// AckReq, extended headers and payload pieces. Returns false (nothing
    /// sent) only if the headers cannot be emitted (a bug, not peer input).
    /// The shape of middle packets with `opcode` and `payload_len` (see
    /// [`PacketShape`]): the cached one, or one made from the template and
    /// cached. `None` before the QP has a template.
    fn middle_shape(&self, opcode: Opcode, payload_len: usize) -> Option<PacketShape> {
        match self.middle.get() {
            Some(shape) if shape.is(opcode, payload_len) => Some(shape),
            _ => {
                let shape = self
                    .template
                    .as_ref()?
                    .shape(&self.icrc, opcode, payload_len)
                    .ok()?;
                self.middle.set(Some(shape));
                Some(shape)
            }
        }
    }

    fn emit<K: FrameSink + ?Sized>(
        &self,
        sink: &mut K,
        opcode: Opcode,
        psn: Psn,
        ack_req: bool,
        ext: &ExtHeaders,
        pieces: &[&[u8]],
    ) -> bool {
        let Some(template) = &self.template else {
            return false;
        };
        let payload_len = pieces.iter().map(|piece| piece.len()).sum();
        let middle = matches!(
            opcode,
            Opcode::RcSendMiddle | Opcode::RcRdmaWriteMiddle | Opcode::RcRdmaReadResponseMiddle
        );
        if middle && ext.set() == ExtSet::NONE {
            // Middle packets carry no extended headers and one path MTU of
            // payload: all alike but for AckReq and PSN.
            let Some(shape) = self.middle_shape(opcode, payload_len) else {
                return false;
            };
            let (headers, trailer) = shape.packet(psn, ack_req, pieces);
            sink.transmit(&headers, pieces, trailer.as_bytes());
            return true;
        }
        let mut buf = [0u8; MAX_HEADERS_LEN];
        let Ok(len) = template.emit(&mut buf, opcode, psn, ack_req, ext, payload_len) else {
            return false;
        };
        let trailer = Trailer::from_seed(&self.icrc, &buf[..len], pieces);
        sink.transmit(&buf[..len], pieces, trailer.as_bytes());
        true
    }
}

/// The transport state of a QP at one moment (see [`Qp::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpSnapshot {
    /// QP state.
    pub state: QpState,
    /// Send WRs not yet completed.
    pub send_queue: usize,
    /// Receive WRs posted and not yet consumed.
    pub receive_queue: usize,
    /// Requester: oldest unacknowledged PSN.
    pub una: Psn,
    /// Requester: one past the highest PSN sent.
    pub sent_end: Psn,
    /// Requester: next PSN the transmit cursor sends.
    pub tx_psn: Psn,
    /// Requester: send-queue index of the cursor's WQE.
    pub tx_index: u64,
    /// Requester: retransmit deadline (ns), if armed.
    pub retransmit_deadline: Option<u64>,
    /// Requester: end of the RNR wait (ns), if waiting.
    pub rnr_until: Option<u64>,
    /// Responder: expected PSN.
    pub expected_psn: Psn,
    /// Responder: messages completed.
    pub msn: Msn,
    /// Responder: queued ACK/NAK/READ reply entries.
    pub responses_queued: usize,
}

/// The requester's round-trip estimate (see [`Qp::rtt_estimate`]), in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttEstimate {
    /// Smoothed round-trip time (RFC 6298 SRTT); `None` before the first
    /// sample.
    pub smoothed_rtt: Option<u64>,
    /// Round-trip time variation (RFC 6298 RTTVAR); 0 before the first
    /// sample.
    pub rtt_variation: u64,
    /// Timeouts since the last valid sample; each doubles the timeout.
    pub backoff: u32,
    /// The retransmit timeout the timer is armed with now: SRTT +
    /// max([`config::MIN_RETRANSMIT_TIMEOUT_NS`], 4·RTTVAR) (or the initial
    /// timeout), doubled `backoff` times, at most the negotiated Local ACK
    /// Timeout.
    pub retransmit_timeout: u64,
    /// The negotiated Local ACK Timeout (4.096 µs · 2^t): the cap of the
    /// timeout and the period that consumes one unit of the retry count.
    pub negotiated_timeout: u64,
}

/// Why [`Qp::connect`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectQpError {
    /// The QP is already connected or in error.
    InvalidState,
    /// The path MTU is a reserved encoding.
    InvalidMtu,
}

impl core::fmt::Display for ConnectQpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::InvalidState => "queue pair not in Reset or Init",
            Self::InvalidMtu => "reserved path MTU",
        })
    }
}

impl core::error::Error for ConnectQpError {}

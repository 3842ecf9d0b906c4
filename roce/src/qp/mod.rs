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
//! alone still decides when the retry count runs out (the `requester`
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
use verbs::{
    AccessFlags, ConnId, Inline, MemoryHandle, Rkey, Sgl, WcOpcode, WcStatus, WorkCompletion, WrId,
};

use crate::types::{Msn, Mtu, Psn, Qpn};
use crate::wire::{
    ipv4, udp, EtherType, EthernetAddress, EthernetRepr, ExtHeaders, FrameHeaders, HeaderTemplate,
    IcrcSeed, Ipv4Address, Ipv4Repr, Opcode, RoceFrame, UdpRepr, MAX_HEADERS_LEN,
};
use crate::wire::{BthRepr, ExtSet, PacketShape, Trailer};

mod requester;
mod responder;
pub mod selective;

pub mod config {
    //! Default depths of a queue pair, its fixed capacities and the
    //! transport constants.

    /// Default send depth per QP ([`super::Qp::new`]; an HCA sets its own,
    /// `HcaCapacity::send_depth`): posted, not yet completed send WRs plus
    /// their completions not yet consumed.
    pub const SQ_DEPTH: usize = 128;
    /// Default receive depth per QP, counted as [`SQ_DEPTH`] is. An RTRS server posts queue_depth + 1
    /// receives on cid 0 (512 + 1 with the Linux client's queue depth); an
    /// RTRS client posts two per request plus 8 on every connection (1032
    /// for the default queue depth of 512), so this must exceed 1032.
    pub const RQ_DEPTH: usize = 2048;
    /// Remembered incoming RDMA READs per QP, for duplicate replay; also the
    /// most READs the responder serves at once (`max_dest_rd_atomic` cap).
    pub const READ_RESOURCES: usize = 16;
    /// Queued responder output (ACK/NAK, READ reply streams) per QP.
    pub const RESPONSE_DEPTH: usize = 32;
    /// How far past the oldest unacknowledged PSN the requester may send
    /// (rxe `RXE_MAX_UNACKED_PSNS`, roce-v2.md §2.3.3: PSN `una + 128` is
    /// the last allowed, as in the captures).
    pub const MAX_UNACKED_PSNS: u32 = 128;
    /// AckReq is set on every message's last packet and on the this-many-th
    /// consecutive non-final packet since the last AckReq, exactly as rxe
    /// does (more than `RXE_MAX_PKT_PER_ACK` = 64, roce-v2.md §2.3.2; seen at
    /// the 66th in `rnbd-linux-srv-linux-clt.pcap`).
    pub const ACK_REQ_INTERVAL: u32 = 66;
    /// Largest message (rxe `RXE_PORT_MAX_MSG_SZ`); bounds the PSNs one WR
    /// takes, keeping every outstanding PSN within the 2^23 comparison window.
    pub const MAX_MESSAGE_LEN: u32 = 8 << 20;
    /// Local ACK timeout exponent used when the negotiated one is 0 (which IB
    /// defines as "no timer"): Brick never runs without a retransmit timer.
    pub const DEFAULT_ACK_TIMEOUT: u8 = 14;
    /// Floor of the adaptive retransmit timeout and of its margin over the
    /// smoothed RTT: 5 ms. The timeout is `SRTT + max(G, 4·RTTVAR)` with G
    /// this value (RFC 6298 §2.3, where G is the clock granularity), capped
    /// by the negotiated Local ACK Timeout (a QP negotiating less gets less).
    ///
    /// `4·RTTVAR` only covers delays the requester has seen; G covers those
    /// it has not. The peer's ACK is produced by software: Linux rxe builds it
    /// in its responder task, which a busy or descheduled (virtual) CPU can
    /// hold back for a scheduler tick (4 ms at HZ=250) on top of the usual
    /// round trip, before the RTT samples ever show it. 5 ms is above one
    /// tick, far above the tens to hundreds of µs of a LAN or a host-local
    /// relay, and still 400 times below the 2.15 s default timeout, so a
    /// lost tail packet costs milliseconds instead of seconds. A timer that
    /// fires too early is cheap for RC: the responder re-ACKs duplicate
    /// SEND/WRITE packets and replays READ responses (roce-v2.md §2.5 item
    /// 5), and such a timeout never consumes the retry count (see the
    /// requester).
    pub const MIN_RETRANSMIT_TIMEOUT_NS: u64 = 5_000_000;
    /// Retransmit timeout before the first RTT sample: 100 ms (capped by the
    /// negotiated Local ACK Timeout).
    ///
    /// Nothing is known about the path yet, and the first messages of a
    /// connection meet the slowest peer: a VM under TCG translating the code
    /// path for the first time, page faults on fresh buffers, a relay. 100 ms
    /// is well above the multi-millisecond round trips of TCG guests, yet
    /// 20 times below the 2.15 s default; one valid sample replaces it.
    pub const INITIAL_RETRANSMIT_TIMEOUT_NS: u64 = 100_000_000;
    /// Floor of the adaptive retransmit timeout on a QP with selective
    /// retransmission (both ends Brick, [`super::selective`]): 1 ms. An
    /// expiry there resends two packets (the oldest unacknowledged and the
    /// newest), not a window, so firing early is cheap, while a lost tail
    /// packet at queue depth 1 costs a millisecond instead of five.
    pub const SELECTIVE_MIN_RETRANSMIT_TIMEOUT_NS: u64 = 1_000_000;
}

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

/// Where the peer is: Ethernet and IPv4 addresses plus the IP/UDP fields of
/// every frame the QP sends (roce-v2.md §1.2-1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// Our MAC.
    pub local_mac: [u8; 6],
    /// The peer's MAC (from ARP).
    pub peer_mac: [u8; 6],
    /// Our IPv4 address.
    pub local_ip: [u8; 4],
    /// The peer's IPv4 address; packets from any other source are dropped.
    pub peer_ip: [u8; 4],
    /// UDP source port, constant per QP (rxe: ≥ 0xC000, see
    /// [`udp::source_port_for_qpn`]).
    pub udp_src_port: u16,
    /// IPv4 TOS (CM traffic class, normally 0).
    pub tos: u8,
    /// IPv4 TTL (CM hop limit, normally 64).
    pub ttl: u8,
}

/// Everything needed to bring an RC QP to RTS: what the CM negotiates
/// (roce-v2.md §2.1, ib-cm.md §4) or a test sets directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpParams {
    /// The peer's QPN (BTH DestQP of everything we send).
    pub peer_qpn: Qpn,
    /// Our first send PSN (the peer's expected PSN).
    pub send_psn: Psn,
    /// The first PSN we expect from the peer.
    pub recv_psn: Psn,
    /// Path MTU: payload bytes per packet.
    pub mtu: Mtu,
    /// Local ACK timeout exponent: retransmit after 4.096 µs · 2^t (0 is
    /// replaced by [`config::DEFAULT_ACK_TIMEOUT`]; values above 31 by 31).
    pub local_ack_timeout: u8,
    /// Retransmissions allowed on timeout/NAK 0x60 before `RetryExcErr`;
    /// 7 = infinite (as rxe).
    pub retry_count: u8,
    /// RNR retries allowed before `RnrRetryExcErr`; 7 = infinite.
    pub rnr_retry: u8,
    /// RNR timer code we put into our RNR NAKs (roce-v2.md §2.3.6).
    pub min_rnr_timer: u8,
    /// RDMA READs we may have outstanding at the peer (its responder
    /// resources); 0 forbids posting READs.
    pub max_rd_atomic: u8,
    /// RDMA READs we serve at once (our responder resources); 0 refuses
    /// incoming READs with NAK 0x61. Capped at [`config::READ_RESOURCES`].
    pub max_dest_rd_atomic: u8,
    /// Remote operations the peer may do on this QP: REMOTE_WRITE and/or
    /// REMOTE_READ (others NAK 0x61).
    pub remote_access: AccessFlags,
    /// Addressing.
    pub path: Path,
    /// Selective retransmission ([`selective`], Brick's extension): set
    /// only when both ends are Brick and said so in the CM exchange; off,
    /// the QP speaks standard go-back-N.
    pub selective_retransmission: bool,
}

impl QpParams {
    /// The retransmit timeout in nanoseconds (4.096 µs · 2^t).
    pub fn ack_timeout_ns(&self) -> u64 {
        let t = match self.local_ack_timeout {
            0 => config::DEFAULT_ACK_TIMEOUT,
            t => t.min(31),
        };
        4096u64 << t
    }
}

/// RNR NAK timer code → delay in nanoseconds (roce-v2.md §2.3.6).
pub fn rnr_delay_ns(code: u8) -> u64 {
    const MICROS: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    u64::from(MICROS[usize::from(code & 0x1f)]) * 1000
}

/// Where frames go: headers (Ethernet through extended headers), the payload
/// as slices of registered memory, and the trailer (pad + ICRC). A NIC
/// gathers the three (writev, descriptor chains).
///
/// Transmission is fire-and-forget: a sink that cannot send a frame drops it
/// and the transport recovers as from any loss (retransmission, duplicate
/// ACKs). Sinks that want back-pressure should stop `poll` calls instead.
pub trait FrameSink {
    /// Sends one frame made of `headers`, each `payload` piece, `trailer`.
    fn transmit(&mut self, headers: &[u8], payload: &[&[u8]], trailer: &[u8]);
}

impl<F: FnMut(&[u8], &[&[u8]], &[u8])> FrameSink for F {
    fn transmit(&mut self, headers: &[u8], payload: &[&[u8]], trailer: &[u8]) {
        self(headers, payload, trailer)
    }
}

/// Event and drop counters of an HCA (all QPs together). Plain numbers,
/// wrapping never expected in practice (`u64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Frames handed to `receive`.
    pub frames_in: u64,
    /// Frames sent through the sink.
    pub frames_out: u64,
    /// Dropped: did not parse (truncated, bad lengths, unsupported, ...).
    pub drop_malformed: u64,
    /// Dropped: bad ICRC (or IPv4 header checksum).
    pub drop_bad_checksum: u64,
    /// Dropped: not addressed to our IP, or not from the QP's peer.
    pub drop_bad_address: u64,
    /// Dropped: P_Key not the default partition.
    pub drop_bad_pkey: u64,
    /// Dropped: no QP with that number, or a QP that is not ready.
    pub drop_unknown_qpn: u64,
    /// Dropped: not an RC opcode, or a response nobody waits for.
    pub drop_bad_opcode: u64,
    /// Dropped by the responder: out-of-sequence packets after the NAK.
    pub drop_out_of_sequence: u64,
    /// Requests kept out of order by a selective responder (executed once
    /// the missing packets arrive).
    pub kept_out_of_order: u64,
    /// Duplicate requests seen (re-ACKed or replayed, never re-executed).
    pub duplicates: u64,
    /// Stale or bogus ACKs/responses ignored by the requester.
    pub stale_acks: u64,
    /// Packets sent again (go-back-N after NAK, RNR or timeout).
    pub retransmissions: u64,
    /// Retransmit timer expiries with packets outstanding (every expiry of
    /// the adaptive timer, [`Counters::early_timeouts`] included).
    pub timeouts: u64,
    /// Timer expiries before a whole negotiated Local ACK Timeout passed
    /// without progress: they go back N like any timeout but do not consume
    /// the retry count (a subset of [`Counters::timeouts`]).
    pub early_timeouts: u64,
    /// Round-trip time samples taken by requesters (AckReq'd packets sent
    /// once, acknowledged).
    pub rtt_samples: u64,
    /// NAKs (any code, RNR excluded) sent.
    pub naks_sent: u64,
    /// NAKs (any code, RNR excluded) received.
    pub naks_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// ACK/NAK/read responses not queued because the response queue was full.
    pub responses_dropped: u64,
    /// Completions lost because the completion queue was full.
    pub cq_overflows: u64,
}

/// The completion queue shared by all QPs of an HCA: completions in the
/// order they were generated, each with the tag of the QP that made it.
///
/// Its entries are allocated once ([`CompletionQueue::with_capacity`]).
/// It cannot overflow when used as the HCA uses it: every QP reserves its
/// send depth plus receive depth entries ([`CompletionQueue::reserve`])
/// before it exists, and a QP never holds more WQEs plus unconsumed
/// completions than it reserved (see [`Qp::post_send`]). A push beyond
/// the capacity would still be counted ([`Counters::cq_overflows`]) and
/// dropped rather than allocate.
pub struct CompletionQueue {
    entries: VecDeque<(u64, WorkCompletion)>,
    capacity: usize,
    reserved: usize,
}

/// Why [`CompletionQueue::reserve`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqReserveError {
    /// Entries asked for.
    pub needed: usize,
    /// Entries not reserved yet.
    pub free: usize,
    /// Entries of the queue.
    pub capacity: usize,
}

impl core::fmt::Display for CqReserveError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "completion queue cannot reserve {} entries: {} of {} unreserved",
            self.needed, self.free, self.capacity
        )
    }
}

impl CompletionQueue {
    /// Bytes a queue of `capacity` entries takes.
    pub const fn bytes_for(capacity: usize) -> usize {
        capacity * core::mem::size_of::<(u64, WorkCompletion)>()
    }

    /// An empty queue of `capacity` entries (allocated here, once).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity),
            capacity,
            reserved: 0,
        }
    }

    /// Sets `entries` aside for one QP.
    ///
    /// # Errors
    /// [`CqReserveError`] when fewer are unreserved.
    pub fn reserve(&mut self, entries: usize) -> Result<(), CqReserveError> {
        let free = self.capacity - self.reserved;
        if entries > free {
            return Err(CqReserveError {
                needed: entries,
                free,
                capacity: self.capacity,
            });
        }
        self.reserved += entries;
        Ok(())
    }

    /// Gives back `entries` reserved with [`CompletionQueue::reserve`].
    pub fn unreserve(&mut self, entries: usize) {
        self.reserved = self.reserved.saturating_sub(entries);
    }

    /// Appends a completion made by the QP tagged `tag`; counts an
    /// overflow (and drops it) when full, which reservations rule out.
    pub fn push(&mut self, tag: u64, completion: WorkCompletion, counters: &mut Counters) {
        if self.entries.len() >= self.capacity {
            counters.cq_overflows += 1;
            return;
        }
        self.entries.push_back((tag, completion));
    }

    /// The oldest completion and the tag of the QP that made it.
    pub fn pop(&mut self) -> Option<(u64, WorkCompletion)> {
        self.entries.pop_front()
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no completion waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries of the queue.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries reserved by QPs (and by completions of destroyed QPs not
    /// consumed yet).
    pub fn reserved(&self) -> usize {
        self.reserved
    }
}

/// What the QP needs from the HCA on every call: registered memory, the
/// completion queue and the counters.
pub struct Context<'a, S, const N: usize> {
    /// Registered memory.
    pub arena: &'a mut Arena<S, N>,
    /// Where completions go.
    pub cq: &'a mut CompletionQueue,
    /// Reorder buffers lent to selective QPs.
    pub reorder: &'a mut selective::ReorderPool,
    /// Counters to bump.
    pub counters: &'a mut Counters,
}

/// The operation of a send WQE, decoded from its [`verbs::SendOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WqeOp {
    Send {
        imm: Option<u32>,
        invalidate: Option<Rkey>,
    },
    Write {
        remote_addr: u64,
        rkey: Rkey,
        imm: Option<u32>,
    },
    Read {
        remote_addr: u64,
        rkey: Rkey,
    },
    LocalInv {
        rkey: Rkey,
    },
}

/// Where the bytes of a send-queue entry come from.
#[derive(Debug, Clone)]
enum Payload {
    /// Registered memory, pinned until completion, gathered each time a
    /// packet is built.
    Gather(Sgl),
    /// Copied into the entry at post time (`SendInline`).
    Inline(Inline),
}

impl Payload {
    /// The entries the WQE pins (none for an inline payload).
    fn sgl(&self) -> &[verbs::Sge] {
        match self {
            Self::Gather(sgl) => sgl.as_slice(),
            Self::Inline(_) => &[],
        }
    }
}

/// A send-queue entry: the request, its PSN range and progress.
#[derive(Debug, Clone)]
struct SendWqe {
    wr_id: WrId,
    signaled: bool,
    op: WqeOp,
    payload: Payload,
    len: u32,
    first_psn: Psn,
    /// PSNs taken: packets (READ: response packets); 0 for LOCAL_INV.
    npkts: u32,
    /// LOCAL_INV only: done when the cursor passed it.
    executed: bool,
}

impl SendWqe {
    fn last_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npkts.saturating_sub(1))
    }

    fn contains(&self, psn: Psn) -> bool {
        self.npkts > 0 && self.first_psn.distance_to(psn) < self.npkts
    }

    fn is_read(&self) -> bool {
        matches!(self.op, WqeOp::Read { .. })
    }

    fn completion_opcode(&self) -> WcOpcode {
        match self.op {
            WqeOp::Send { .. } => WcOpcode::Send,
            WqeOp::Write { .. } => WcOpcode::RdmaWrite,
            WqeOp::Read { .. } => WcOpcode::RdmaRead,
            WqeOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }
}

/// A receive-queue entry.
#[derive(Debug, Clone)]
struct RecvWqe {
    wr_id: WrId,
    sgl: Sgl,
    len: u32,
}

/// The message the responder is in the middle of (what MIDDLE/LAST continue).
#[derive(Debug, Clone)]
enum Inbound {
    /// Between messages: only FIRST/ONLY/READ may come.
    Idle,
    /// A multi-packet SEND: its receive WQE and the bytes placed so far.
    Send { recv: RecvWqe, offset: u32 },
    /// A multi-packet RDMA WRITE: target (None for zero length), bytes
    /// placed, total length from the RETH.
    Write {
        target: Option<MemoryHandle>,
        offset: u32,
        len: u32,
    },
}

/// A remembered incoming READ (for the reply stream and duplicates).
#[derive(Debug, Clone, Copy)]
struct ReadResource {
    /// Generation, so a queued reply notices its resource was recycled.
    seq: u32,
    first_psn: Psn,
    npkts: u32,
    target: Option<MemoryHandle>,
    va: u64,
    len: u32,
    rkey: Rkey,
    msn: Msn,
}

/// Queued responder output.
#[derive(Debug, Clone, Copy)]
enum Response {
    /// An ACKNOWLEDGE packet (ACK, NAK or RNR NAK).
    Ack {
        psn: Psn,
        syndrome: crate::wire::Syndrome,
        msn: Msn,
    },
    /// READ response packets `next_psn ..= last` of a resource; `start_psn`
    /// is where this reply run began (its FIRST/ONLY packet).
    Read {
        slot: u8,
        seq: u32,
        start_psn: Psn,
        next_psn: Psn,
    },
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
    timer: requester::RetransmitTimer,
    rnr_until: Option<u64>,
    /// The PSN of the last go-back done on a NAK, until progress.
    last_nak: Option<Psn>,
    /// Non-final packets sent since the last AckReq.
    since_ack_req: u32,
    /// Packets this QP's requester sent again (its share of
    /// [`Counters::retransmissions`]).
    retransmitted: u64,

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
            timer: requester::RetransmitTimer::new(),
            rnr_until: None,
            last_nak: None,
            since_ack_req: 0,
            retransmitted: 0,
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
            let shape = match self.middle.get() {
                Some(shape) if shape.is(opcode, payload_len) => shape,
                _ => {
                    let Ok(shape) = template.shape(&self.icrc, opcode, payload_len) else {
                        return false;
                    };
                    self.middle.set(Some(shape));
                    shape
                }
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

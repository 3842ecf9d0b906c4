//! What a QP works with and on: the frame sink, the HCA's counters and
//! completion queue, and the [`Context`] that lends them on every call.

use alloc::collections::VecDeque;

use verbs::memory::Arena;
use verbs::WorkCompletion;

use super::selective;

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
/// completions than it reserved (see [`super::Qp::post_send`]). A push beyond
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

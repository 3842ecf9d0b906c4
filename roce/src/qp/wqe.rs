//! The queue entries of a QP: send and receive WQEs, the responder's
//! inbound message, remembered READs and queued responses.

use verbs::{Inline, MemoryHandle, Rkey, Sgl, WcOpcode, WrId};

use crate::types::{Msn, Psn};

/// The operation of a send WQE, decoded from its [`verbs::SendOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WqeOp {
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
pub(super) enum Payload {
    /// Registered memory, pinned until completion, gathered each time a
    /// packet is built.
    Gather(Sgl),
    /// Copied into the entry at post time (`SendInline`).
    Inline(Inline),
}

impl Payload {
    /// The entries the WQE pins (none for an inline payload).
    pub(super) fn sgl(&self) -> &[verbs::Sge] {
        match self {
            Self::Gather(sgl) => sgl.as_slice(),
            Self::Inline(_) => &[],
        }
    }
}

/// A send-queue entry: the request, its PSN range and progress.
#[derive(Debug, Clone)]
pub(super) struct SendWqe {
    pub(super) wr_id: WrId,
    pub(super) signaled: bool,
    pub(super) op: WqeOp,
    pub(super) payload: Payload,
    pub(super) len: u32,
    pub(super) first_psn: Psn,
    /// PSNs taken: packets (READ: response packets); 0 for LOCAL_INV.
    pub(super) npkts: u32,
    /// LOCAL_INV only: done when the cursor passed it.
    pub(super) executed: bool,
}

impl SendWqe {
    pub(super) fn last_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npkts.saturating_sub(1))
    }

    pub(super) fn contains(&self, psn: Psn) -> bool {
        self.npkts > 0 && self.first_psn.distance_to(psn) < self.npkts
    }

    pub(super) fn is_read(&self) -> bool {
        matches!(self.op, WqeOp::Read { .. })
    }

    pub(super) fn completion_opcode(&self) -> WcOpcode {
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
pub(super) struct RecvWqe {
    pub(super) wr_id: WrId,
    pub(super) sgl: Sgl,
    pub(super) len: u32,
}

/// The message the responder is in the middle of (what MIDDLE/LAST continue).
#[derive(Debug, Clone)]
pub(super) enum Inbound {
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
pub(super) struct ReadResource {
    /// Generation, so a queued reply notices its resource was recycled.
    pub(super) seq: u32,
    pub(super) first_psn: Psn,
    pub(super) npkts: u32,
    pub(super) target: Option<MemoryHandle>,
    pub(super) va: u64,
    pub(super) len: u32,
    pub(super) rkey: Rkey,
    pub(super) msn: Msn,
}

/// Queued responder output.
#[derive(Debug, Clone, Copy)]
pub(super) enum Response {
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

//! Work completions: what finished, how, and with which immediate data.
//!
//! The vocabulary is libibverbs' (`ibv_wc`, `IBV_WC_*`), so a consumer
//! written against this crate reads like verbs code and an rdma-sys provider
//! maps one to one.

use crate::cm::ConnId;
use crate::key::Rkey;
use crate::wr::WrId;

/// Which kind of work request completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WcOpcode {
    /// A SEND, SEND_WITH_IMM or SEND_WITH_INV of ours.
    #[default]
    Send,
    /// An RDMA_WRITE or RDMA_WRITE_WITH_IMM of ours.
    RdmaWrite,
    /// An RDMA_READ of ours.
    RdmaRead,
    /// A LOCAL_INV of ours.
    LocalInv,
    /// A receive consumed by the peer's SEND (any flavour).
    Recv,
    /// A receive consumed by the peer's RDMA_WRITE_WITH_IMM; no data landed
    /// in the receive buffer.
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// Whether this completes a receive-queue request.
    pub const fn is_receive(self) -> bool {
        matches!(self, Self::Recv | Self::RecvRdmaWithImm)
    }
}

/// How a work request ended (`ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WcStatus {
    /// It completed.
    #[default]
    Success,
    /// An incoming SEND was longer than the receive buffer.
    LocLenErr,
    /// The local queue pair broke a rule (e.g. a bad opcode sequence).
    LocQpOpErr,
    /// A local SGE named an invalid lkey or lay outside its region.
    LocProtErr,
    /// A local SGE lacked the access right the operation needed.
    LocAccessErr,
    /// The connection went to error before this request executed; it was
    /// flushed and did nothing.
    WrFlushErr,
    /// The peer answered with an unexpected response.
    BadRespErr,
    /// The peer rejected the request as invalid (NAK 0x61), or a
    /// SEND_WITH_INV named an rkey we could not invalidate.
    RemInvReqErr,
    /// The peer refused an rkey, range or access right (NAK 0x62).
    RemAccessErr,
    /// The peer failed to execute the request (NAK 0x63 and others).
    RemOpErr,
    /// The peer did not acknowledge within the retry budget.
    RetryExcErr,
    /// The peer kept answering "receiver not ready" beyond the RNR budget.
    RnrRetryExcErr,
    /// Any other failure.
    GeneralErr,
}

impl WcStatus {
    /// Whether the request succeeded.
    pub const fn is_success(self) -> bool {
        matches!(self, Self::Success)
    }
}

/// One completion, as returned by `Verbs::poll_cq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The request's tag.
    pub wr_id: WrId,
    /// The connection the request was posted on.
    pub conn: ConnId,
    /// Which kind of request; valid for receives only when `status` is
    /// success (as in verbs).
    pub opcode: WcOpcode,
    /// Outcome.
    pub status: WcStatus,
    /// Receives: bytes placed in the buffer. RDMA READ: bytes read. Other
    /// sends: unspecified (0).
    pub byte_len: u32,
    /// Immediate data carried by the peer's SEND_WITH_IMM or
    /// RDMA_WRITE_WITH_IMM, host order.
    pub imm: Option<u32>,
    /// Receives of a SEND_WITH_INV: our rkey that was invalidated.
    pub invalidated_rkey: Option<Rkey>,
}

impl WorkCompletion {
    /// A completion with no immediate, no invalidation and zero length.
    pub const fn new(wr_id: WrId, conn: ConnId, opcode: WcOpcode, status: WcStatus) -> Self {
        Self {
            wr_id,
            conn,
            opcode,
            status,
            byte_len: 0,
            imm: None,
            invalidated_rkey: None,
        }
    }
}

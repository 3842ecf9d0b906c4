//! Work requests: scatter-gather lists, sends, RDMA operations and receives.
//!
//! A work request names memory only through scatter-gather entries
//! ([`Sge`]: lkey + offset + length inside the registered region), never by
//! pointer. Posting one hands the named bytes to the provider until the
//! request's completion (see the crate docs, "Sending without copies").
//!
//! Immediate data is the host-order `u32` the consumer means; the provider
//! puts it on the wire big-endian (IB ImmDt), so the consumer never swaps.

use crate::error::PostError;
use crate::key::{Lkey, Rkey};
use crate::wc::WcOpcode;

/// Most scatter-gather entries one work request may carry.
///
/// RTRS needs two (data + header, `rtrs.md` §2.8); four leaves room.
pub const MAX_SGE: usize = 4;

/// Most bytes a SEND may carry in the work request itself
/// ([`SendOp::SendInline`], verbs' `IBV_SEND_INLINE`).
///
/// RTRS's `always_invalidate` answer (`struct rtrs_msg_rkey_rsp`, 8 bytes)
/// is the payload it is sized for.
pub const MAX_INLINE: usize = 32;

/// The consumer's tag for a work request, returned in its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WrId(pub u64);

/// One scatter-gather entry: `len` bytes at `offset` inside the region
/// registered under `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Local key of the region.
    pub lkey: Lkey,
    /// Byte offset from the start of the region.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

impl Sge {
    /// Entry of `len` bytes at `offset` in the region of `lkey`.
    pub const fn new(lkey: Lkey, offset: u32, len: u32) -> Self {
        Self { lkey, offset, len }
    }
}

/// A scatter-gather list of at most [`MAX_SGE`] entries; may be empty (a
/// zero-length message or a zero-SGE receive).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Sgl(heapless::Vec<Sge, MAX_SGE>);

impl Sgl {
    /// The empty list.
    pub const fn new() -> Self {
        Self(heapless::Vec::new())
    }

    /// A list of one entry.
    pub fn single(sge: Sge) -> Self {
        let mut list = Self::new();
        // An empty list always has room for one entry.
        let _ = list.0.push(sge);
        list
    }

    /// A list copied from `entries`.
    ///
    /// # Errors
    ///
    /// [`PostError::TooManySge`] if there are more than [`MAX_SGE`].
    pub fn try_from_slice(entries: &[Sge]) -> Result<Self, PostError> {
        heapless::Vec::from_slice(entries)
            .map(Self)
            .map_err(|()| PostError::TooManySge)
    }

    /// Appends an entry.
    ///
    /// # Errors
    ///
    /// [`PostError::TooManySge`] if the list is full.
    pub fn push(&mut self, sge: Sge) -> Result<(), PostError> {
        self.0.push(sge).map_err(|_| PostError::TooManySge)
    }

    /// The entries, in order.
    pub fn as_slice(&self) -> &[Sge] {
        &self.0
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Total byte length, or `None` if it does not fit in a `u32`.
    pub fn total_len(&self) -> Option<u32> {
        total_len(&self.0)
    }
}

/// Total byte length of `entries`, or `None` if it overflows a `u32`.
pub fn total_len(entries: &[Sge]) -> Option<u32> {
    entries
        .iter()
        .try_fold(0u32, |sum, sge| sum.checked_add(sge.len))
}

/// Payload bytes copied into a work request at post time: no memory
/// region, no lkey check, nothing pinned until completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Inline {
    len: u8,
    bytes: [u8; MAX_INLINE],
}

impl Inline {
    /// The payload `bytes`.
    ///
    /// # Errors
    ///
    /// [`PostError::InlineTooLong`] if there are more than [`MAX_INLINE`].
    pub fn try_from_slice(bytes: &[u8]) -> Result<Self, PostError> {
        let mut inline = Self::default();
        inline
            .bytes
            .get_mut(..bytes.len())
            .ok_or(PostError::InlineTooLong)?
            .copy_from_slice(bytes);
        // At most MAX_INLINE (32): fits in a u8.
        inline.len = bytes.len() as u8;
        Ok(inline)
    }

    /// The payload.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Payload length in bytes.
    pub fn len(&self) -> u32 {
        u32::from(self.len)
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A send-queue work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: WrId,
    /// Whether a successful execution produces a completion. Errors always
    /// do. An unsignaled request is known complete when a later signaled
    /// request of the same connection completes (send queues complete in
    /// order).
    pub signaled: bool,
    /// What to do.
    pub op: SendOp,
}

/// The operation of a [`SendWr`], one per verbs opcode family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND, or SEND_WITH_IMM when `imm` is set: consumes one receive at the
    /// peer.
    Send {
        /// Payload.
        sgl: Sgl,
        /// Immediate data for the peer's receive completion.
        imm: Option<u32>,
    },
    /// SEND, or SEND_WITH_IMM when `imm` is set, of a few bytes carried in
    /// the request itself: the same message on the wire as [`Self::Send`],
    /// without a region to name, check, pin and gather from.
    SendInline {
        /// Payload.
        data: Inline,
        /// Immediate data for the peer's receive completion.
        imm: Option<u32>,
    },
    /// SEND_WITH_INV: a SEND that also invalidates `invalidate`, an rkey of
    /// the peer's, before the peer's receive completes.
    SendWithInv {
        /// Payload (often empty).
        sgl: Sgl,
        /// The peer's rkey to invalidate.
        invalidate: Rkey,
    },
    /// RDMA_WRITE, or RDMA_WRITE_WITH_IMM when `imm` is set (which consumes a
    /// receive at the peer). An empty `sgl` is a zero-length write; the peer
    /// skips the rkey check then, so `remote_addr` and `rkey` may be 0.
    RdmaWrite {
        /// Local source.
        sgl: Sgl,
        /// Peer virtual address (the region's advertised iova + offset).
        remote_addr: u64,
        /// Peer rkey, with remote-write access.
        rkey: Rkey,
        /// Immediate data for the peer's receive completion.
        imm: Option<u32>,
    },
    /// RDMA_READ: fetch `sgl.total_len()` bytes from the peer into `sgl`
    /// (regions need local-write access).
    RdmaRead {
        /// Local destination.
        sgl: Sgl,
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer rkey, with remote-read access.
        rkey: Rkey,
    },
    /// LOCAL_INV: invalidate one of this host's own rkeys, in send-queue
    /// order. Local access through the lkey is unaffected.
    LocalInv {
        /// The rkey to invalidate.
        rkey: Rkey,
    },
}

impl SendOp {
    /// The local scatter-gather entries (empty for `SendInline` and
    /// `LocalInv`).
    pub fn sgl(&self) -> &[Sge] {
        match self {
            Self::Send { sgl, .. }
            | Self::SendWithInv { sgl, .. }
            | Self::RdmaWrite { sgl, .. }
            | Self::RdmaRead { sgl, .. } => sgl.as_slice(),
            Self::SendInline { .. } | Self::LocalInv { .. } => &[],
        }
    }

    /// The bytes carried in the request itself (empty unless `SendInline`).
    pub fn inline(&self) -> &[u8] {
        match self {
            Self::SendInline { data, .. } => data.as_slice(),
            _ => &[],
        }
    }

    /// The opcode its completion carries.
    pub fn completion_opcode(&self) -> WcOpcode {
        match self {
            Self::Send { .. } | Self::SendInline { .. } | Self::SendWithInv { .. } => {
                WcOpcode::Send
            }
            Self::RdmaWrite { .. } => WcOpcode::RdmaWrite,
            Self::RdmaRead { .. } => WcOpcode::RdmaRead,
            Self::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }
}

/// A receive-queue work request: where the next incoming SEND lands. An
/// empty `sgl` can only absorb zero-length SENDs and RDMA_WRITE_WITH_IMM.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: WrId,
    /// Destination; regions need local-write access.
    pub sgl: Sgl,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_holds_up_to_max_inline_bytes() {
        let full = [7u8; MAX_INLINE];
        let inline = Inline::try_from_slice(&full).unwrap();
        assert_eq!(inline.as_slice(), &full[..]);
        assert_eq!(inline.len(), MAX_INLINE as u32);
        assert_eq!(
            Inline::try_from_slice(&[0; MAX_INLINE + 1]),
            Err(PostError::InlineTooLong)
        );
        let op = SendOp::SendInline {
            data: Inline::try_from_slice(&[1, 2, 3]).unwrap(),
            imm: Some(9),
        };
        assert_eq!(op.inline(), &[1, 2, 3]);
        assert!(op.sgl().is_empty());
        assert_eq!(op.completion_opcode(), WcOpcode::Send);
        assert!(Inline::default().is_empty());
    }

    #[test]
    fn sgl_capacity_and_length() {
        let sge = Sge::new(Lkey(0x100), 0, u32::MAX);
        let mut sgl = Sgl::single(sge);
        assert_eq!(sgl.total_len(), Some(u32::MAX));
        sgl.push(Sge::new(Lkey(0x100), 0, 1)).unwrap();
        assert_eq!(sgl.total_len(), None);
        sgl.push(sge).unwrap();
        sgl.push(sge).unwrap();
        assert_eq!(sgl.push(sge), Err(PostError::TooManySge));
        assert_eq!(
            Sgl::try_from_slice(&[sge; MAX_SGE + 1]),
            Err(PostError::TooManySge)
        );
        assert!(Sgl::new().is_empty());
    }

    #[test]
    fn opcodes() {
        let op = SendOp::LocalInv { rkey: Rkey(5) };
        assert!(op.sgl().is_empty());
        assert_eq!(op.completion_opcode(), WcOpcode::LocalInv);
        let write = SendOp::RdmaWrite {
            sgl: Sgl::new(),
            remote_addr: 0,
            rkey: Rkey(0),
            imm: Some(1),
        };
        assert_eq!(write.completion_opcode(), WcOpcode::RdmaWrite);
    }
}

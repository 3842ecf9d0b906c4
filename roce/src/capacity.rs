//! How big an HCA is: [`HcaCapacity`], chosen at run time.
//!
//! An HCA ([`crate::hca::Hca::with_capacity`]) allocates every table once,
//! when it is built, from its capacity: the QP table (`qps` queue pairs,
//! each with queues of `send_depth` and `recv_depth` entries), the CM
//! connection slots (`cm_connections`), the memory-region table (`regions`) and the completion
//! queue (`cq_entries`). Nothing grows afterwards.
//!
//! The completion queue cannot overflow: a QP's depths bound its queued
//! work requests plus its completions not yet consumed
//! ([`crate::qp::Qp::send_room`]), and every QP reserves
//! [`HcaCapacity::cq_budget`] entries when it is created, which is refused
//! ([`crate::hca::QpError::CompletionQueueFull`]) when the CQ cannot.
//! [`HcaCapacity::new`] makes the CQ hold the budget of every QP.

use crate::qp::selective::ReorderPool;
use core::fmt;

use verbs::memory::Arena;

use crate::cm::Cm;
use crate::qp::{CompletionQueue, Qp};

/// Most QPs (and CM connection slots) an HCA holds: a CM connection id
/// carries its slot in 16 bits.
pub const MAX_QPS: usize = 1 << 16;

/// Most memory regions an HCA holds ([`verbs::memory::MAX_REGIONS`]).
pub const MAX_REGIONS: usize = verbs::memory::MAX_REGIONS;

/// The sizes of an HCA's tables (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HcaCapacity {
    /// Queue pairs (and CM connection slots), 1..=[`MAX_QPS`].
    pub qps: usize,
    /// Memory regions (buffers of the arena), 1..=[`MAX_REGIONS`].
    pub regions: usize,
    /// Send depth of every QP: send WRs queued plus send completions not
    /// yet consumed.
    pub send_depth: usize,
    /// Receive depth of every QP, counted the same way.
    pub recv_depth: usize,
    /// Completion queue entries.
    pub cq_entries: usize,
    /// CM connection slots, 1..=[`MAX_QPS`]: a connection stays in the CM
    /// (timewait, a REJ's retries) after its QP is gone, so more than
    /// `qps` ([`HcaCapacity::new`]: twice, plus [`SPARE_CM_CONNECTIONS`]).
    pub cm_connections: usize,
    /// Reorder buffers for selective retransmission
    /// (`docs/protocol/selective-retransmission.md`), lent to a QP while it
    /// has a gap: [`HcaCapacity::new`] gives `min(qps,`
    /// [`REORDER_BUFFERS`]`)`.
    pub reorder_buffers: usize,
}

/// Reorder buffers [`HcaCapacity::new`] gives an HCA (at most one per QP):
/// a gap lasts about a round trip, so a few serve many QPs.
pub const REORDER_BUFFERS: usize = 8;

/// CM connection slots [`HcaCapacity::new`] adds to twice the QPs.
pub const SPARE_CM_CONNECTIONS: usize = 16;

/// Why an [`HcaCapacity`] cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CapacityError {
    /// `qps` outside 1..=[`MAX_QPS`].
    Qps(usize),
    /// `cm_connections` outside 1..=[`MAX_QPS`].
    CmConnections(usize),
    /// `regions` outside 1..=[`MAX_REGIONS`].
    Regions(usize),
    /// A depth of 0.
    Depth,
    /// Fewer CQ entries than one QP reserves.
    CompletionQueue {
        /// Entries of the CQ.
        entries: usize,
        /// Entries one QP reserves.
        per_qp: usize,
    },
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Qps(qps) => write!(f, "{qps} queue pairs: expected 1..={MAX_QPS}"),
            Self::CmConnections(n) => {
                write!(f, "{n} CM connection slots: expected 1..={MAX_QPS}")
            }
            Self::Regions(regions) => {
                write!(f, "{regions} memory regions: expected 1..={MAX_REGIONS}")
            }
            Self::Depth => f.write_str("queue pair depths must be at least 1"),
            Self::CompletionQueue { entries, per_qp } => write!(
                f,
                "{entries} completion queue entries cannot hold one queue pair's {per_qp}"
            ),
        }
    }
}

impl core::error::Error for CapacityError {}

/// What an HCA's tables take, in bytes (its registered-memory storage not
/// included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HcaMemory {
    /// The QP table: every QP and its send and receive queues.
    pub qps: usize,
    /// The CM connection slots.
    pub cm: usize,
    /// The completion queue.
    pub cq: usize,
    /// The memory-region table.
    pub regions: usize,
    /// The reorder buffers.
    pub reorder: usize,
}

impl HcaMemory {
    /// All of it.
    pub fn total(&self) -> usize {
        self.qps
            .saturating_add(self.cm)
            .saturating_add(self.cq)
            .saturating_add(self.regions)
            .saturating_add(self.reorder)
    }
}

impl HcaCapacity {
    /// A capacity of `qps` QPs of the given depths and `regions` memory
    /// regions, with a completion queue holding every QP's budget and
    /// `2 · qps + SPARE_CM_CONNECTIONS` CM slots (at most [`MAX_QPS`]).
    ///
    /// # Errors
    /// [`CapacityError`] for counts out of range.
    pub fn new(
        qps: usize,
        regions: usize,
        send_depth: usize,
        recv_depth: usize,
    ) -> Result<Self, CapacityError> {
        let capacity = Self {
            qps,
            regions,
            send_depth,
            recv_depth,
            cq_entries: qps.saturating_mul(send_depth.saturating_add(recv_depth)),
            cm_connections: qps
                .saturating_mul(2)
                .saturating_add(SPARE_CM_CONNECTIONS)
                .min(MAX_QPS),
            reorder_buffers: qps.min(REORDER_BUFFERS),
        };
        capacity.check()?;
        Ok(capacity)
    }

    /// The capacity the const parameters of [`crate::hca::Hca::new`] give:
    /// `N` regions, `Q` QPs of the default depths
    /// ([`crate::qp::config::SQ_DEPTH`], [`crate::qp::config::RQ_DEPTH`]),
    /// and a CQ of `C` entries or, if more, every QP's budget (the CQ never
    /// refuses a QP the table has room for). Counts are clamped into range.
    pub fn from_const<const N: usize, const Q: usize, const C: usize>() -> Self {
        let qps = Q.clamp(1, MAX_QPS);
        let send_depth = crate::qp::config::SQ_DEPTH;
        let recv_depth = crate::qp::config::RQ_DEPTH;
        Self {
            qps,
            regions: N.clamp(1, MAX_REGIONS),
            send_depth,
            recv_depth,
            cq_entries: C.max(qps * (send_depth + recv_depth)),
            cm_connections: qps,
            reorder_buffers: qps.min(REORDER_BUFFERS),
        }
    }

    /// Checks the counts (see [`CapacityError`]).
    ///
    /// # Errors
    /// [`CapacityError`].
    pub fn check(&self) -> Result<(), CapacityError> {
        if !(1..=MAX_QPS).contains(&self.qps) {
            return Err(CapacityError::Qps(self.qps));
        }
        if !(1..=MAX_QPS).contains(&self.cm_connections) {
            return Err(CapacityError::CmConnections(self.cm_connections));
        }
        if !(1..=MAX_REGIONS).contains(&self.regions) {
            return Err(CapacityError::Regions(self.regions));
        }
        if self.send_depth == 0 || self.recv_depth == 0 {
            return Err(CapacityError::Depth);
        }
        if self.cq_entries < self.cq_budget() {
            return Err(CapacityError::CompletionQueue {
                entries: self.cq_entries,
                per_qp: self.cq_budget(),
            });
        }
        Ok(())
    }

    /// CQ entries each QP reserves: its send plus receive depth.
    pub const fn cq_budget(&self) -> usize {
        self.send_depth.saturating_add(self.recv_depth)
    }

    /// What the tables of an HCA of this capacity take.
    pub fn memory(&self) -> HcaMemory {
        HcaMemory {
            qps: self.qps.saturating_mul(
                Qp::bytes_for(self.send_depth, self.recv_depth) + crate::hca::SLOT_BYTES,
            ),
            cm: self.cm_connections.saturating_mul(Cm::<0>::slot_bytes()),
            cq: CompletionQueue::bytes_for(self.cq_entries),
            regions: Arena::<&mut [u8]>::table_bytes(self.regions),
            reorder: ReorderPool::bytes_for(self.reorder_buffers),
        }
    }
}

//! What both ends of an RTRS path do alike: work request ids and the
//! heartbeat engine (rtrs.md §5), shared by [`server`](crate::server) and
//! [`client`](crate::client).

use verbs::{Rkey, SendOp, SendWr, Sgl, WrId};

use crate::wire::Imm;

/// A work request id: `kind:8 | owner:24 | low:32`. `kind` says what the
/// request is, `owner` names the table entry it belongs to (the server's
/// path slot; the client's path and cid), `low` what the owner needs back
/// (a chunk and its generation, a receive slot).
pub(crate) fn work_id(kind: u8, owner: u32, low: u32) -> WrId {
    WrId(u64::from(kind) << 56 | u64::from(owner & 0x00ff_ffff) << 32 | u64::from(low))
}

/// The (kind, owner, low) of a [`work_id`].
pub(crate) fn split_work_id(id: WrId) -> (u8, u32, u32) {
    (
        (id.0 >> 56) as u8,
        ((id.0 >> 32) & 0x00ff_ffff) as u32,
        id.0 as u32,
    )
}

/// What a heartbeat tick asks for (rtrs.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Beat {
    /// More than `missed_max` intervals without a sign of life: the path
    /// is dead.
    Dead,
    /// A heartbeat is outstanding; nothing to send.
    Quiet,
    /// Send HB_MSG now.
    Send,
}

/// One path's liveness: at most one heartbeat outstanding, `missed`
/// counting the intervals without any sign of life, as Linux's `hb_work`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Heartbeat {
    missed: u32,
    next: u64,
}

impl Heartbeat {
    /// Starts the heartbeat at `now`: the first tick one interval later.
    pub fn start(&mut self, now: u64, interval: u64) {
        self.missed = 0;
        self.next = now.saturating_add(interval);
    }

    /// A sign of life (any receive on the path).
    pub fn alive(&mut self) {
        self.missed = 0;
    }

    /// When the next tick is due.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// No sign of life for at least one whole interval: a heartbeat went
    /// out and a full interval passed without an answer or any traffic.
    pub fn is_stale(&self) -> bool {
        self.missed >= 2
    }

    /// The tick at `now` (call when `now >= next()`).
    pub fn tick(&mut self, now: u64, interval: u64, missed_max: u32) -> Beat {
        self.next = now.saturating_add(interval);
        if self.missed > missed_max {
            Beat::Dead
        } else if self.missed > 0 {
            self.missed += 1;
            Beat::Quiet
        } else {
            self.missed = 1;
            Beat::Send
        }
    }
}

/// A heartbeat (HB_MSG) or its answer (HB_ACK): a zero-length RDMA WRITE
/// WITH IMM, VA 0, rkey 0, signalled (rtrs.md §1, §5).
pub(crate) fn heartbeat_wr(wr_id: WrId, imm: Imm) -> SendWr {
    SendWr {
        wr_id,
        signaled: true,
        op: SendOp::RdmaWrite {
            sgl: Sgl::new(),
            remote_addr: 0,
            rkey: Rkey(0),
            imm: imm.encode().ok(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_ids_round_trip() {
        let id = work_id(7, 0x12_3456, 0xdead_beef);
        assert_eq!(split_work_id(id), (7, 0x12_3456, 0xdead_beef));
        // The owner is 24 bits: the top byte is the kind's.
        assert_eq!(split_work_id(work_id(1, 0xff12_3456, 0)), (1, 0x12_3456, 0));
    }

    #[test]
    fn heartbeat_follows_linux_hb_work() {
        let mut hb = Heartbeat::default();
        hb.start(0, 10);
        assert_eq!(hb.next(), 10);
        assert_eq!(hb.tick(10, 10, 2), Beat::Send);
        assert!(!hb.is_stale());
        assert_eq!(hb.tick(20, 10, 2), Beat::Quiet);
        assert!(hb.is_stale());
        hb.alive();
        assert!(!hb.is_stale());
        assert_eq!(hb.tick(30, 10, 2), Beat::Send);
        assert_eq!(hb.tick(40, 10, 2), Beat::Quiet); // 2
        assert_eq!(hb.tick(50, 10, 2), Beat::Quiet); // 3
        assert_eq!(hb.tick(60, 10, 2), Beat::Dead);
        assert_eq!(hb.next(), 70);
    }
}

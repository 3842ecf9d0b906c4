//! Which QPs [`crate::hca::Hca::poll`] must visit: those with a frame to
//! send now or a timer due.
//!
//! After every call into a QP (a frame, a post, a state change, its own
//! poll) the HCA records when the QP next has work ([`crate::qp::Qp::wake_at`]):
//! `None` takes it out of the set. A poll visits only the members whose
//! time has come and returns at once before the earliest of them, so an
//! idle HCA pays nothing per QP. Allocated once, for every QP slot.

use alloc::vec::Vec;

use crate::slots::SlotSet;

/// QP slots with work pending, each with the time its work is due.
#[derive(Debug, Clone)]
pub struct WakeSet {
    awake: SlotSet,
    /// Per slot: when its work is due (meaningful for members only).
    at: Vec<u64>,
    /// At most the earliest `at` of the members (`u64::MAX`: none).
    earliest: u64,
}

impl WakeSet {
    /// An empty set for slots `0..slots` (allocated here).
    pub fn with_capacity(slots: usize) -> Self {
        Self {
            awake: SlotSet::with_capacity(slots),
            at: alloc::vec![u64::MAX; slots],
            earliest: u64::MAX,
        }
    }

    /// Records that slot `slot` has work from `wake` on, or none (`None`).
    /// A slot out of range is ignored.
    pub fn set(&mut self, slot: usize, wake: Option<u64>) {
        match (wake, self.at.get_mut(slot)) {
            (Some(time), Some(at)) => {
                *at = time;
                self.awake.insert(slot);
                self.earliest = self.earliest.min(time);
            }
            _ => {
                self.awake.remove(slot);
            }
        }
    }

    /// Whether any member may be due at `now` (false: a poll can skip
    /// every QP).
    pub fn any_due(&self, now: u64) -> bool {
        !self.awake.is_empty() && self.earliest <= now
    }

    /// Whether slot `slot` is a member due at `now`.
    pub fn is_due(&self, slot: usize, now: u64) -> bool {
        self.awake.contains(slot) && self.at.get(slot).is_some_and(|&at| at <= now)
    }

    /// The smallest member at or above `start`.
    pub fn next_from(&self, start: usize) -> Option<usize> {
        self.awake.next_from(start)
    }

    /// Makes the earliest time exact again (one pass over the members):
    /// after a poll that visited every due member.
    pub fn settle(&mut self) {
        self.earliest = self
            .awake
            .iter()
            .filter_map(|slot| self.at.get(slot).copied())
            .min()
            .unwrap_or(u64::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_members_only() {
        let mut set = WakeSet::with_capacity(100);
        assert!(!set.any_due(u64::MAX));
        set.set(5, Some(0));
        set.set(70, Some(1_000));
        assert!(set.any_due(0));
        assert!(set.is_due(5, 0));
        assert!(!set.is_due(70, 999));
        assert!(set.is_due(70, 1_000));
        set.set(5, None);
        assert!(!set.is_due(5, 0));
        // The bound is stale until settled, then exact.
        assert!(set.any_due(0));
        set.settle();
        assert!(!set.any_due(999));
        assert!(set.any_due(1_000));
        assert_eq!(set.next_from(0), Some(70));
        set.set(70, None);
        set.settle();
        assert!(!set.any_due(u64::MAX));
        // Out of range: ignored, no panic.
        set.set(100, Some(0));
        set.set(usize::MAX, Some(0));
        assert!(!set.is_due(100, 0));
        assert_eq!(set.next_from(0), None);
    }
}

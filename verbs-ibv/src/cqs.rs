//! The completion queues: each with the entries its queue pairs reserved,
//! and the completions held back while a destroyed queue pair's entries
//! were taken out.
//!
//! A destroyed queue pair's completions may still wait in its queue, and
//! the device may give its number to the next queue pair: they would then
//! be read as the new connection's. So when a queue pair is destroyed its
//! queue is drained at once: its entries are dropped, every other entry is
//! kept (in order) and delivered before the queue is polled again.

use std::collections::VecDeque;

use crate::ffi::{self, BiWc};

/// One completion queue and its budget.
struct Slot {
    cq: *mut ffi::Cq,
    entries: u32,
    used: u32,
}

/// The device's completion queues.
pub(crate) struct CompletionQueues {
    slots: Vec<Slot>,
    /// Completions of live queue pairs read while draining, oldest first.
    kept: VecDeque<BiWc>,
}

impl CompletionQueues {
    pub(crate) fn new() -> Self {
        Self {
            slots: Vec::new(),
            kept: VecDeque::new(),
        }
    }

    /// Adds a completion queue of `entries` entries (at open; the kept
    /// list grows here to hold every entry it could ever keep).
    pub(crate) fn add(&mut self, cq: *mut ffi::Cq, entries: u32) {
        self.slots.push(Slot {
            cq,
            entries,
            used: 0,
        });
        self.kept.reserve(entries as usize);
    }

    /// Reserves `entries` entries of the first completion queue with room
    /// and returns it: a queue pair's completions can never overflow it.
    pub(crate) fn reserve(&mut self, entries: u32) -> Option<(usize, *mut ffi::Cq)> {
        let (index, slot) = self
            .slots
            .iter_mut()
            .enumerate()
            .find(|(_, slot)| slot.entries - slot.used >= entries)?;
        slot.used += entries;
        Some((index, slot.cq))
    }

    /// Returns entries reserved from completion queue `index`.
    pub(crate) fn release(&mut self, index: usize, entries: u32) {
        if let Some(slot) = self.slots.get_mut(index) {
            slot.used = slot.used.saturating_sub(entries);
        }
    }

    /// How many completion queues there are.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Completion queue `index`.
    pub(crate) fn get(&self, index: usize) -> Option<*mut ffi::Cq> {
        self.slots.get(index).map(|slot| slot.cq)
    }

    /// The completion queues, to poll, arm and destroy.
    pub(crate) fn iter(&self) -> impl Iterator<Item = *mut ffi::Cq> + '_ {
        self.slots.iter().map(|slot| slot.cq)
    }

    /// After queue pair `qpn` of queue `index` was destroyed: reads the
    /// queue empty with `poll(cq, out)` (returns how many it wrote, or a
    /// negative errno), drops the entries of `qpn` and keeps the others.
    pub(crate) fn drain_after_destroy(
        &mut self,
        index: usize,
        qpn: u32,
        mut poll: impl FnMut(*mut ffi::Cq, &mut [BiWc]) -> i32,
    ) {
        self.kept.retain(|wc| wc.qp_num != qpn);
        let Some(cq) = self.slots.get(index).map(|slot| slot.cq) else {
            return;
        };
        let mut raw = [BiWc::default(); ffi::POLL_MAX];
        loop {
            let got = usize::try_from(poll(cq, &mut raw)).unwrap_or(0);
            for wc in raw[..got.min(raw.len())]
                .iter()
                .filter(|wc| wc.qp_num != qpn)
            {
                // Every kept entry is an outstanding request of a live
                // queue pair, so the reservations bound them: never full.
                if self.kept.len() < self.kept.capacity() {
                    self.kept.push_back(*wc);
                }
            }
            if got < raw.len() {
                break;
            }
        }
    }

    /// The oldest kept completion, delivered before the queues are polled.
    pub(crate) fn take_kept(&mut self) -> Option<BiWc> {
        self.kept.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_pairs_reserve_from_the_first_completion_queue_with_room() {
        let mut cqs = CompletionQueues::new();
        let (a, b) = (4 as *mut ffi::Cq, 8 as *mut ffi::Cq);
        cqs.add(a, 100);
        cqs.add(b, 100);
        assert_eq!(cqs.reserve(60), Some((0, a)));
        assert_eq!(cqs.reserve(60), Some((1, b)), "40 left in the first");
        assert_eq!(cqs.reserve(40), Some((0, a)));
        assert_eq!(
            cqs.reserve(41),
            None,
            "no queue has 41 free: refused, never overflowed"
        );
        cqs.release(1, 60);
        assert_eq!(cqs.reserve(100), Some((1, b)));
        assert_eq!(cqs.iter().count(), 2);
    }

    fn wc(qpn: u32, wr_id: u64) -> BiWc {
        BiWc {
            qp_num: qpn,
            wr_id,
            ..BiWc::default()
        }
    }

    #[test]
    fn a_destroyed_queue_pairs_completions_are_dropped_and_the_rest_kept_in_order() {
        let mut cqs = CompletionQueues::new();
        cqs.add(4 as *mut ffi::Cq, 256);
        // More than one poll's worth, the destroyed QP 7 mixed with QP 9.
        let mut queue: VecDeque<BiWc> = (0..100u64)
            .map(|i| wc(if i % 3 == 0 { 7 } else { 9 }, i))
            .collect();
        let poll = |_: *mut ffi::Cq, out: &mut [BiWc]| {
            let n = out.len().min(queue.len());
            for slot in &mut out[..n] {
                *slot = queue.pop_front().unwrap();
            }
            n as i32
        };
        cqs.drain_after_destroy(0, 7, poll);
        let kept: Vec<BiWc> = core::iter::from_fn(|| cqs.take_kept()).collect();
        assert_eq!(kept.len(), 66);
        assert!(kept.iter().all(|wc| wc.qp_num == 9));
        assert!(kept.windows(2).all(|w| w[0].wr_id < w[1].wr_id), "in order");
    }

    #[test]
    fn kept_completions_of_a_queue_pair_destroyed_later_are_dropped_too() {
        let mut cqs = CompletionQueues::new();
        cqs.add(4 as *mut ffi::Cq, 16);
        let mut queue: VecDeque<BiWc> = [wc(1, 0), wc(2, 1), wc(3, 2)].into();
        cqs.drain_after_destroy(0, 1, |_, out| {
            let n = out.len().min(queue.len());
            for slot in &mut out[..n] {
                *slot = queue.pop_front().unwrap();
            }
            n as i32
        });
        cqs.drain_after_destroy(0, 2, |_, _| 0);
        assert_eq!(cqs.take_kept().map(|wc| wc.qp_num), Some(3));
        assert!(cqs.take_kept().is_none());
    }
}

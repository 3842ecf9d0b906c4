//! Fixed-capacity sets of table slots: which QPs exist, which CM
//! connections have a MAD to send, an event to report or a timer running.
//!
//! The HCA and the CM keep their connections in tables sized by the
//! manifest's capacity; a poll that visited every slot would cost in
//! proportion to that capacity even with nothing to do. A [`SlotSet`] is
//! kept up to date as slots change state, so a poll visits only its
//! members and returns at once when the set is empty. The set is a bitset
//! allocated once, at construction, with room for every slot: inserting
//! and removing never allocate. A summary bitset (one bit per word that
//! has a member) lets a walk skip 4,096 empty slots per step, so visiting
//! the members costs about one step per member even in a large table.
//! Slots out of range are ignored (never a panic): the tables that index a
//! set are sized by the same capacity.

use alloc::vec::Vec;

/// Bits per word of a [`SlotSet`].
const WORD_BITS: usize = u64::BITS as usize;

/// A set of slots `0..capacity`, members visited in increasing order.
#[derive(Debug, Clone)]
pub struct SlotSet {
    words: Vec<u64>,
    /// Bit `w` is set when `words[w]` is not zero.
    summary: Vec<u64>,
    capacity: usize,
    len: usize,
}

impl SlotSet {
    /// An empty set with room for slots `0..capacity` (allocated here).
    pub fn with_capacity(capacity: usize) -> Self {
        let words = capacity.div_ceil(WORD_BITS);
        Self {
            words: alloc::vec![0; words],
            summary: alloc::vec![0; words.div_ceil(WORD_BITS)],
            capacity,
            len: 0,
        }
    }

    /// Slots the set has room for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Members.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No members.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `slot` is a member.
    pub fn contains(&self, slot: usize) -> bool {
        self.words
            .get(slot / WORD_BITS)
            .is_some_and(|word| word & bit(slot) != 0)
    }

    /// Adds `slot`; returns whether it was not a member. A slot out of
    /// range is not added.
    pub fn insert(&mut self, slot: usize) -> bool {
        if slot >= self.capacity {
            return false;
        }
        let Some(word) = self.words.get_mut(slot / WORD_BITS) else {
            return false;
        };
        let added = *word & bit(slot) == 0;
        *word |= bit(slot);
        self.len += usize::from(added);
        let index = slot / WORD_BITS;
        if let Some(summary) = self.summary.get_mut(index / WORD_BITS) {
            *summary |= bit(index);
        }
        added
    }

    /// Removes `slot`; returns whether it was a member.
    pub fn remove(&mut self, slot: usize) -> bool {
        let Some(word) = self.words.get_mut(slot / WORD_BITS) else {
            return false;
        };
        let removed = *word & bit(slot) != 0;
        *word &= !bit(slot);
        self.len -= usize::from(removed);
        if *word == 0 {
            let index = slot / WORD_BITS;
            if let Some(summary) = self.summary.get_mut(index / WORD_BITS) {
                *summary &= !bit(index);
            }
        }
        removed
    }

    /// The smallest member at or above `start`, or `None`. Costs one step
    /// per 4,096 empty slots skipped; `None` at once when the set is empty.
    pub fn next_from(&self, start: usize) -> Option<usize> {
        if self.len == 0 || start >= self.capacity {
            return None;
        }
        let index = start / WORD_BITS;
        let word = self.words.get(index)? & (!0u64 << (start % WORD_BITS));
        if word != 0 {
            return Some(index * WORD_BITS + word.trailing_zeros() as usize);
        }
        let index = self.next_word(index + 1)?;
        let word = self.words.get(index)?;
        Some(index * WORD_BITS + word.trailing_zeros() as usize)
    }

    /// The first word at or above `from` that has a member.
    fn next_word(&self, from: usize) -> Option<usize> {
        let mut at = from / WORD_BITS;
        let mut summary = self.summary.get(at)? & (!0u64 << (from % WORD_BITS));
        loop {
            if summary != 0 {
                return Some(at * WORD_BITS + summary.trailing_zeros() as usize);
            }
            at += 1;
            summary = *self.summary.get(at)?;
        }
    }

    /// The first member met going up from `start` and wrapping around to
    /// 0 (round robin), or `None` if the set is empty.
    pub fn next_cyclic(&self, start: usize) -> Option<usize> {
        self.next_from(start).or_else(|| self.next_from(0))
    }

    /// The members in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let mut next = self.next_from(0);
        core::iter::from_fn(move || {
            let slot = next?;
            next = self.next_from(slot + 1);
            Some(slot)
        })
    }
}

/// The bit of `slot` within its word.
fn bit(slot: usize) -> u64 {
    1 << (slot % WORD_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn insert_remove_and_count() {
        let mut set = SlotSet::with_capacity(130);
        assert!(set.is_empty());
        assert!(set.insert(0));
        assert!(set.insert(64));
        assert!(set.insert(129));
        assert!(!set.insert(64), "a second insert adds nothing");
        assert!(!set.insert(130), "out of range");
        assert!(!set.insert(usize::MAX), "out of range");
        assert_eq!(set.len(), 3);
        assert!(set.contains(129) && !set.contains(128) && !set.contains(130));
        assert!(set.remove(64));
        assert!(!set.remove(64));
        assert!(!set.remove(usize::MAX));
        assert_eq!(set.len(), 2);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 129]);
    }

    #[test]
    fn next_from_crosses_words_and_wraps() {
        let mut set = SlotSet::with_capacity(200);
        for slot in [3, 63, 64, 190] {
            set.insert(slot);
        }
        assert_eq!(set.next_from(0), Some(3));
        assert_eq!(set.next_from(4), Some(63));
        assert_eq!(set.next_from(64), Some(64));
        assert_eq!(set.next_from(65), Some(190));
        assert_eq!(set.next_from(191), None);
        assert_eq!(set.next_from(10_000), None);
        assert_eq!(set.next_cyclic(191), Some(3));
        assert_eq!(set.next_cyclic(64), Some(64));
        set.remove(3);
        set.remove(63);
        set.remove(64);
        set.remove(190);
        assert_eq!(set.next_cyclic(0), None);
    }

    #[test]
    fn skips_empty_summary_words() {
        let mut set = SlotSet::with_capacity(20_000);
        set.insert(5);
        set.insert(4_095);
        set.insert(4_096);
        set.insert(19_999);
        assert_eq!(set.next_from(6), Some(4_095));
        assert_eq!(set.next_from(4_097), Some(19_999));
        set.remove(19_999);
        assert_eq!(set.next_from(4_097), None);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![5, 4_095, 4_096]);
    }

    #[test]
    fn matches_a_plain_model() {
        // A deterministic walk of inserts and removes against a Vec<bool>.
        for capacity in [300, 9_000] {
            check_against_model(capacity);
        }
    }

    fn check_against_model(capacity: usize) {
        let mut set = SlotSet::with_capacity(capacity);
        let mut model = vec![false; capacity];
        let mut seed = 12_345u32;
        for _ in 0..5_000 {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let slot = (seed >> 8) as usize % capacity;
            if (seed >> 16) & 3 != 0 {
                assert_eq!(set.insert(slot), !model[slot]);
                model[slot] = true;
            } else {
                assert_eq!(set.remove(slot), model[slot]);
                model[slot] = false;
            }
            let start = seed.rotate_left(13) as usize % capacity;
            let expected = (start..capacity).find(|&s| model[s]);
            assert_eq!(set.next_from(start), expected);
            assert_eq!(set.len(), model.iter().filter(|&&m| m).count());
        }
    }
}

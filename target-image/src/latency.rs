//! Per-volume latency histograms: the time from a block request's receipt
//! (its RTRS event handled, `io_state`'s `Received`) to its answer, counted
//! into fixed buckets. Inline arrays, no allocation: recording is a search
//! over [`LATENCY_BOUNDS_NS`] and two additions.

/// Upper bounds of the buckets, nanoseconds (Prometheus `le`, inclusive);
/// a last, unbounded bucket counts the rest.
pub const LATENCY_BOUNDS_NS: [u64; 15] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
];

/// One histogram: a count per bucket (not cumulative) and the sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Requests per bucket: `counts[i]` took at most
    /// `LATENCY_BOUNDS_NS[i]` and more than the bound before; the last
    /// counts those above every bound.
    pub counts: [u64; LATENCY_BOUNDS_NS.len() + 1],
    /// Sum of every recorded latency, nanoseconds.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// Counts one request that took `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        let bucket = LATENCY_BOUNDS_NS.partition_point(|&bound| bound < ns);
        if let Some(count) = self.counts.get_mut(bucket) {
            *count += 1;
        }
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// Requests recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive_and_the_last_bucket_takes_the_rest() {
        let mut h = LatencyHistogram::default();
        for ns in [0, 10_000, 10_001, 1_000_000_000, 1_000_000_001, u64::MAX] {
            h.record(ns);
        }
        assert_eq!(h.counts[0], 2, "0 and exactly 10 µs");
        assert_eq!(h.counts[1], 1, "just over 10 µs");
        assert_eq!(h.counts[LATENCY_BOUNDS_NS.len() - 1], 1, "exactly 1 s");
        assert_eq!(h.counts[LATENCY_BOUNDS_NS.len()], 2, "over 1 s");
        assert_eq!(h.count(), 6);
        assert_eq!(h.sum_ns, u64::MAX, "the sum saturates");
    }
}

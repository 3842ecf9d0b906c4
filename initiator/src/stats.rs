//! Counters: per volume, per path, per session, and a latency histogram.
//!
//! Everything is plain fixed-size data (no allocation), copied out by the
//! accessors of [`crate::Initiator`].

use rtrs::client::{PathStats, PathStatus};

/// Buckets of a [`LatencyHistogram`].
pub const LATENCY_BUCKETS: usize = 40;

/// IO latency in power-of-two buckets of nanoseconds: bucket `i` counts
/// latencies in `[2^i, 2^(i+1))` ns (bucket 0 also holds 0), up to about
/// 9 minutes in the last bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Counts per bucket.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// Samples recorded.
    pub count: u64,
    /// Sum of all samples, ns (saturating).
    pub sum_ns: u64,
    /// Smallest sample, ns (`u64::MAX` while empty).
    pub min_ns: u64,
    /// Largest sample, ns.
    pub max_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            buckets: [0; LATENCY_BUCKETS],
            count: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }
}

impl LatencyHistogram {
    /// Records one sample.
    pub fn record(&mut self, ns: u64) {
        let bucket = (63 - ns.max(1).leading_zeros() as usize).min(LATENCY_BUCKETS - 1);
        self.buckets[bucket] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Mean latency, ns (0 while empty).
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }

    /// An upper bound of the `percent` percentile (0..=100): the top of the
    /// bucket holding it, clamped to the largest sample; 0 while empty.
    pub fn percentile_ns(&self, percent: u32) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = (u128::from(self.count) * u128::from(percent.min(100))).div_ceil(100);
        let rank = u64::try_from(rank).unwrap_or(u64::MAX).max(1);
        let mut seen = 0u64;
        for (index, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let top = if index >= 63 {
                    u64::MAX
                } else {
                    (1u64 << (index + 1)) - 1
                };
                return top.min(self.max_ns);
            }
        }
        self.max_ns
    }
}

/// Counters of one volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// Reads completed successfully.
    pub reads: u64,
    /// Writes completed successfully.
    pub writes: u64,
    /// Flushes completed successfully (including local no-ops).
    pub flushes: u64,
    /// Discards completed successfully.
    pub discards: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub written_bytes: u64,
    /// Bytes discarded.
    pub discarded_bytes: u64,
    /// IOs completed with an error.
    pub errors: u64,
    /// RTRS requests (pieces) sent.
    pub requests: u64,
    /// IOs held because the session or the volume was not ready.
    pub held: u64,
    /// IOs re-issued after being held.
    pub reissued: u64,
    /// Successful re-opens after a reconnect.
    pub reopens: u64,
    /// Latency of successful IOs, submission to completion.
    pub latency: LatencyHistogram,
}

/// Counters of the session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Times the session came back after being down.
    pub reconnects: u64,
    /// Times the last path went down.
    pub disconnects: u64,
    /// RTRS completions whose tag matched nothing current (ignored).
    pub stale_completions: u64,
    /// RTRS events dropped because its queue was full.
    pub events_dropped: u64,
    /// IOs that waited for an RTRS permit at least once.
    pub permit_waits: u64,
}

/// One path as seen from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathReport {
    /// Its state.
    pub status: PathStatus,
    /// The RTRS client's counters (IOs, bytes, failovers, reconnects,
    /// heartbeat latency).
    pub stats: PathStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_percentiles() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.percentile_ns(50), 0);
        for ns in [0u64, 1, 1000, 1023, 1024, 5_000_000] {
            h.record(ns);
        }
        assert_eq!(h.count, 6);
        assert_eq!(h.buckets[0], 2);
        assert_eq!(h.buckets[9], 2);
        assert_eq!(h.buckets[10], 1);
        assert_eq!(h.min_ns, 0);
        assert_eq!(h.max_ns, 5_000_000);
        assert_eq!(h.percentile_ns(100), 5_000_000);
        assert_eq!(h.percentile_ns(50), 1023);
        h.record(u64::MAX);
        assert_eq!(h.buckets[LATENCY_BUCKETS - 1], 1);
    }
}

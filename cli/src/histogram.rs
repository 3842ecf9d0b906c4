//! A fixed-size log-linear latency histogram for `brick bench`.
//!
//! The initiator's own [`initiator::LatencyHistogram`] has one bucket per
//! power of two, so its percentiles can be off by up to 2×. A benchmark
//! wants better: this one splits every power of two into 16 linear
//! sub-buckets (the HdrHistogram idea with 4 significant bits), so a
//! reported percentile is at most 6.25 % above the true value. It is a
//! plain array (976 counters, ~8 KiB) filled without allocation.

/// Sub-buckets per power of two (`2^SUB_BITS`).
const SUB_BITS: u32 = 4;
/// Sub-buckets per power of two.
const SUB: usize = 1 << SUB_BITS;
/// Buckets: values below `SUB` exactly, then 16 per power of two up to 2^64.
const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// Latency samples in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: [u64; BUCKETS],
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: [0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

/// The bucket holding `value`.
fn bucket_of(value: u64) -> usize {
    if value < SUB as u64 {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros(); // >= SUB_BITS
    let sub = ((value >> (exponent - SUB_BITS)) as usize) & (SUB - 1);
    (exponent - SUB_BITS + 1) as usize * SUB + sub
}

/// The largest value bucket `index` holds.
fn bucket_top(index: usize) -> u64 {
    if index < SUB {
        return index as u64;
    }
    let exponent = (index / SUB) as u32 + SUB_BITS - 1;
    let sub = (index % SUB) as u64;
    let width = 1u64 << (exponent - SUB_BITS);
    ((SUB as u64 + sub) << (exponent - SUB_BITS)).saturating_add(width - 1)
}

impl Histogram {
    /// Records one sample.
    pub fn record(&mut self, ns: u64) {
        self.buckets[bucket_of(ns)] += 1;
        self.count += 1;
        self.sum += u128::from(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Mean, ns (0 while empty).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// Smallest sample, ns (0 while empty).
    pub fn min(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min
        }
    }

    /// Largest sample, ns.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The `fraction` quantile (0.0..=1.0): an upper bound at most 6.25 %
    /// above the true sample, clamped to the samples' range; 0 while empty.
    pub fn quantile(&self, fraction: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((self.count as f64) * fraction.clamp(0.0, 1.0)).ceil() as u64;
        let rank = rank.clamp(1, self.count);
        let mut seen = 0u64;
        for (index, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_top(index).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_u64_in_order() {
        let mut last = 0;
        for value in (0..5000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let bucket = bucket_of(value);
            assert!(bucket < BUCKETS, "{value}");
            assert!(bucket >= last, "{value}");
            assert!(bucket_top(bucket) >= value, "{value}");
            if bucket > 0 {
                assert!(bucket_top(bucket - 1) < value, "{value}");
            }
            last = bucket;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_top(BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn quantiles_are_close_and_ordered() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), 0);
        for ns in 1..=10_000u64 {
            h.record(ns * 1000);
        }
        let p50 = h.quantile(0.5);
        let p99 = h.quantile(0.99);
        let p999 = h.quantile(0.999);
        assert!(
            (5_000_000..=5_000_000 * 1063 / 1000).contains(&p50),
            "{p50}"
        );
        assert!(
            (9_900_000..=9_900_000 * 1063 / 1000).contains(&p99),
            "{p99}"
        );
        assert!(p50 <= p99 && p99 <= p999 && p999 <= h.max());
        assert_eq!(h.quantile(1.0), 10_000_000);
        assert_eq!(h.min(), 1000);
        assert!((h.mean() - 5_000_500.0).abs() < 1.0);
    }
}

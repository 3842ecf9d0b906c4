//! Path setups per client address: a token bucket per source.
//!
//! The half-open limits bound how many paths an address holds in setup at
//! once; they do not bound how fast it may start new ones. A client that
//! connects a path, lets it fail INFO_REQ or closes it at once and starts
//! again costs the server a QP, a receive buffer and a CM exchange each
//! time, as fast as it can send CM REQs. Each new path (the first CON_REQ
//! of a path, [`ServerConfig::setup_burst`] and
//! [`ServerConfig::setup_interval_ns`]) takes a token from its address's
//! bucket; an empty bucket refuses the path with ENOMEM
//! ([`ConnectRefusal::SetupRateExceeded`](super::ConnectRefusal::SetupRateExceeded)),
//! which a Linux client treats like any refused connect (it retries after
//! its reconnect delay). Connections joining a path and paths of a
//! session already up cost nothing.
//!
//! The table has a fixed number of entries (`max_half_open`), allocated
//! with the server. An address whose bucket has refilled carries no state
//! and its entry is reused first; if every entry is still refilling, the
//! one refilled longest ago is taken over. So an attacker with more
//! addresses than entries can wash out the state of others: the
//! per-address bound is best effort there, and the global half-open bound
//! ([`ServerConfig::max_half_open`]) still holds.

extern crate alloc;

use alloc::vec::Vec;
use core::net::IpAddr;

use super::ServerConfig;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    source: IpAddr,
    /// Tokens at `stamp`.
    tokens: u32,
    /// When `tokens` was last brought up to date (ns).
    stamp: u64,
}

/// The buckets of the addresses that started paths recently.
pub(super) struct SetupRate {
    buckets: Vec<Bucket>,
    capacity: usize,
    burst: u32,
    interval_ns: u64,
}

impl SetupRate {
    /// A table of `config.max_half_open` buckets (allocated here, once).
    pub(super) fn new(config: &ServerConfig) -> Self {
        let capacity = usize::from(config.max_half_open);
        Self {
            buckets: Vec::with_capacity(capacity),
            capacity,
            burst: config.setup_burst,
            interval_ns: config.setup_interval_ns,
        }
    }

    /// `bucket` refilled up to `now`.
    fn refill(&self, bucket: &mut Bucket, now: u64) {
        let elapsed = now.saturating_sub(bucket.stamp);
        let earned = elapsed / self.interval_ns;
        if earned == 0 {
            return;
        }
        let tokens = u64::from(bucket.tokens).saturating_add(earned);
        if tokens >= u64::from(self.burst) {
            bucket.tokens = self.burst;
            bucket.stamp = now;
        } else {
            // `tokens < burst <= u32::MAX`; keep the part of an interval
            // not yet earned.
            bucket.tokens = tokens as u32;
            bucket.stamp = bucket.stamp.saturating_add(earned * self.interval_ns);
        }
    }

    /// Takes a token for a new path from `source` at `now`: false if its
    /// bucket is empty.
    pub(super) fn take(&mut self, source: IpAddr, now: u64) -> bool {
        if let Some(i) = self.buckets.iter().position(|b| b.source == source) {
            let mut bucket = self.buckets[i];
            self.refill(&mut bucket, now);
            let granted = bucket.tokens > 0;
            bucket.tokens = bucket.tokens.saturating_sub(u32::from(granted));
            self.buckets[i] = bucket;
            return granted;
        }
        let fresh = Bucket {
            source,
            tokens: self.burst - 1,
            stamp: now,
        };
        if self.buckets.len() < self.capacity {
            self.buckets.push(fresh);
            return true;
        }
        // Reuse a bucket that has refilled (it says nothing), else the one
        // refilled longest ago.
        let mut victim = 0;
        let mut victim_stamp = u64::MAX;
        for i in 0..self.buckets.len() {
            let mut bucket = self.buckets[i];
            self.refill(&mut bucket, now);
            self.buckets[i] = bucket;
            if bucket.tokens == self.burst {
                victim = i;
                break;
            }
            if bucket.stamp < victim_stamp {
                victim = i;
                victim_stamp = bucket.stamp;
            }
        }
        self.buckets[victim] = fresh;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    const MS: u64 = 1_000_000;

    fn rate(burst: u32, interval_ms: u64, entries: u16) -> SetupRate {
        let mut config = ServerConfig::brick_default();
        config.setup_burst = burst;
        config.setup_interval_ns = interval_ms * MS;
        config.max_half_open = entries;
        SetupRate::new(&config)
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn a_burst_then_one_per_interval() {
        let mut rate = rate(4, 10, 4);
        for _ in 0..4 {
            assert!(rate.take(ip(1), 0));
        }
        assert!(!rate.take(ip(1), 0), "the fifth in the same instant");
        assert!(!rate.take(ip(1), 9 * MS), "before one interval");
        assert!(rate.take(ip(1), 10 * MS));
        assert!(!rate.take(ip(1), 15 * MS));
        // 25 ms later: two more intervals earned (the 5 ms remainder kept).
        assert!(rate.take(ip(1), 30 * MS));
        assert!(rate.take(ip(1), 30 * MS));
        assert!(!rate.take(ip(1), 30 * MS));
        // Long idle: back to the burst, not beyond.
        for _ in 0..4 {
            assert!(rate.take(ip(1), 10_000 * MS));
        }
        assert!(!rate.take(ip(1), 10_000 * MS));
    }

    #[test]
    fn addresses_have_their_own_buckets() {
        let mut rate = rate(2, 1000, 4);
        assert!(rate.take(ip(1), 0) && rate.take(ip(1), 0));
        assert!(!rate.take(ip(1), 0));
        assert!(
            rate.take(ip(2), 0),
            "another address is not limited by the first"
        );
        assert!(rate.take(ip(2), 0));
        assert!(!rate.take(ip(2), 0));
    }

    #[test]
    fn a_full_table_reuses_refilled_buckets_first() {
        let mut rate = rate(2, 100, 2);
        // ip 1 spends its burst; ip 2 takes one at 150 ms.
        assert!(rate.take(ip(1), 0) && rate.take(ip(1), 0));
        assert!(rate.take(ip(2), 150 * MS));
        // At 250 ms ip 2 has refilled (one interval since 150), ip 1 has
        // two tokens again too; a third address takes one entry.
        assert!(rate.take(ip(3), 250 * MS));
        assert_eq!(rate.buckets.len(), 2);
        // While ip 1 is still limited, a newcomer takes the oldest entry.
        let mut rate = self::rate(2, 1000, 2);
        assert!(rate.take(ip(1), 0) && rate.take(ip(1), 0));
        assert!(rate.take(ip(2), 10 * MS) && rate.take(ip(2), 10 * MS));
        assert!(rate.take(ip(3), 20 * MS));
        assert!(
            rate.buckets.iter().all(|b| b.source != ip(1)),
            "the entry refilled longest ago (ip 1) was taken over"
        );
        assert!(!rate.take(ip(2), 20 * MS), "ip 2 kept its empty bucket");
    }
}

//! The requester's adaptive retransmit timer.
//!
//! rxe retransmits only when the negotiated Local ACK Timeout (4.096 µs ·
//! 2^t, 2.15 s with the RDMA CM default t = 19) passes without progress
//! (roce-v2.md §2.3.5), so at queue depth 1, where no later packet provokes
//! a NAK 0x60, every lost tail packet or lost ACK stalls the QP for seconds.
//! Brick's timer adapts to the measured round-trip time as TCP's does
//! (RFC 6298), in integer nanoseconds ([`RetransmitTimer`]):
//!
//! - **Sampling.** One sample at a time. It starts when a packet with AckReq
//!   (the last of a message, every 66th, every READ request) leaves for the
//!   first time — never a retransmission (Karn's rule) — and ends when an
//!   ACK, a READ response or the implied ACK of a NAK moves `una` past its
//!   PSN. A go-back to that PSN or before discards it (it will be resent).
//! - **Estimate.** The first sample R sets SRTT = R, RTTVAR = R/2; later
//!   ones RTTVAR = ¾·RTTVAR + ¼·|SRTT − R|, SRTT = ⅞·SRTT + ⅛·R. The timeout
//!   is RFC 6298's SRTT + max(G, 4·RTTVAR) with G =
//!   [`config::MIN_RETRANSMIT_TIMEOUT_NS`], so never below G and always at
//!   least G above SRTT: on a link whose RTT hardly varies RTTVAR decays to
//!   nothing, and SRTT + 4·RTTVAR alone would fire just as the ACK is due.
//!   Before the first sample the timeout is
//!   [`config::INITIAL_RETRANSMIT_TIMEOUT_NS`]. The negotiated timeout caps
//!   both.
//! - **Backoff.** Every expiry doubles the timeout, up to the negotiated
//!   one. The doubling lasts until the next valid sample (Karn's algorithm,
//!   RFC 6298 §5.7), not just until the next progress: after an expiry that
//!   came too early, the next progress is the late ACK of the original
//!   packets, and going back to the short timeout would fire again at once
//!   when RTTs are long, as in a burst of 128 packets through a slow link.
//! - **Arming** is unchanged: armed at the first send while nothing was
//!   outstanding, re-armed on progress, stopped when everything is
//!   acknowledged, started at the end of the RNR wait after an RNR NAK. An
//!   expiry goes back N from `una` as before.
//! - **Retry count.** Only the negotiated timeout consumes it, so a QP never
//!   fails with `RetryExcErr` sooner than rxe's would. The *retry epoch* is
//!   the last progress, the first send from idle, the end of an RNR wait or
//!   the last expiry that consumed a unit. An expiry at least one negotiated
//!   timeout after the epoch consumes a unit (7 = infinite, never consumed;
//!   none left: `RetryExcErr`) and restarts the epoch; an earlier one only
//!   retransmits ([`Counters::early_timeouts`](super::Counters)). Once the
//!   backoff has reached the negotiated timeout, expiries come exactly one
//!   negotiated timeout apart, so with retry count n < 7 a dead peer fails
//!   the QP at the first expiry at least (n + 1) negotiated timeouts after
//!   the last progress — where rxe fails at exactly that time — and less
//!   than one negotiated timeout later. A NAK 0x60 consumes a unit as before.
//!
//! Early retransmissions are safe for RC: a responder (Brick's, rxe's)
//! re-ACKs duplicate SEND/WRITE packets without re-executing them and
//! replays duplicate READs from its remembered READ resources (roce-v2.md
//! §2.5 item 5).

use super::{config, RttEstimate};
use crate::types::Psn;

/// Largest RTT sample taken into account (ns): the largest negotiated
/// timeout (4.096 µs · 2^31, about 2.4 h), which keeps `7 · SRTT` far
/// from overflowing.
const MAX_RTT_SAMPLE_NS: u64 = 4096 << 31;

/// Most doublings of the timeout; it reaches the largest negotiated timeout
/// from 1 ns in 43, so this bound is never what stops it.
const MAX_BACKOFF: u32 = 48;

/// A round trip being timed: an AckReq'd packet sent once, at `sent_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RttSample {
    pub(super) psn: Psn,
    pub(super) sent_at: u64,
}

/// The adaptive retransmit timer's state (see the module docs): the RFC 6298
/// estimate, the backoff, the sample in flight and the retry epoch. The
/// deadline itself stays in [`Qp`]. All times are ns; no floating point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RetransmitTimer {
    /// SRTT; `None` before the first sample.
    pub(super) smoothed_rtt: Option<u64>,
    /// RTTVAR.
    pub(super) rtt_variation: u64,
    /// Expiries since the last valid sample (each doubles the timeout).
    pub(super) backoff: u32,
    pub(super) sample: Option<RttSample>,
    /// Start of the current negotiated-timeout period for the retry count.
    pub(super) retry_epoch: u64,
    /// G: the floor of the timeout and of its margin over SRTT.
    pub(super) floor: u64,
    /// See [`RetransmitTimer::set_outlier_limits`].
    pub(super) outlier_limits: bool,
}

impl RetransmitTimer {
    /// No sample, no backoff.
    pub(super) const fn new() -> Self {
        Self {
            smoothed_rtt: None,
            rtt_variation: 0,
            backoff: 0,
            sample: None,
            retry_epoch: 0,
            floor: config::MIN_RETRANSMIT_TIMEOUT_NS,
            outlier_limits: false,
        }
    }

    /// Sets G (the selective scheme lowers it).
    pub(super) fn set_floor(&mut self, floor: u64) {
        self.floor = floor;
    }

    /// Makes the estimate robust to rare long delays, for the selective
    /// scheme (where firing early costs two packets): a sample counts as at
    /// most 2·SRTT + G, and the margin over SRTT is at most 2·G.
    pub(super) fn set_outlier_limits(&mut self, on: bool) {
        self.outlier_limits = on;
    }

    /// The timeout without backoff: SRTT + max(G, 4·RTTVAR) with G the
    /// floor (or the initial timeout before any sample), at most
    /// `negotiated`.
    pub(super) fn base_timeout(&self, negotiated: u64) -> u64 {
        let estimate = match self.smoothed_rtt {
            Some(srtt) => {
                let mut margin = self.rtt_variation.saturating_mul(4).max(self.floor);
                if self.outlier_limits {
                    margin = margin.min(self.floor.saturating_mul(2));
                }
                srtt.saturating_add(margin)
            }
            None => config::INITIAL_RETRANSMIT_TIMEOUT_NS,
        };
        estimate.min(negotiated)
    }

    /// The timeout to arm now: the base timeout doubled `backoff` times, at
    /// most `negotiated`.
    pub(super) fn timeout(&self, negotiated: u64) -> u64 {
        let factor = 1u64 << self.backoff.min(MAX_BACKOFF);
        self.base_timeout(negotiated)
            .saturating_mul(factor)
            .min(negotiated)
    }

    /// Folds a round-trip time into SRTT/RTTVAR (RFC 6298 §2.2-2.3) and
    /// ends the backoff.
    pub(super) fn record(&mut self, rtt: u64) {
        let mut rtt = rtt.min(MAX_RTT_SAMPLE_NS);
        if let (true, Some(srtt)) = (self.outlier_limits, self.smoothed_rtt) {
            rtt = rtt.min(srtt.saturating_mul(2).saturating_add(self.floor));
        }
        match self.smoothed_rtt {
            None => {
                self.smoothed_rtt = Some(rtt);
                self.rtt_variation = rtt / 2;
            }
            Some(srtt) => {
                let error = srtt.abs_diff(rtt);
                self.rtt_variation = (3 * self.rtt_variation + error) / 4;
                self.smoothed_rtt = Some((7 * srtt + rtt) / 8);
            }
        }
        self.backoff = 0;
    }

    /// Karn's rule for a selective resend of `psn`: a sample timing it
    /// would not know which copy was acknowledged.
    pub(super) fn forget_sample(&mut self, psn: Psn) {
        if self.sample.is_some_and(|sample| sample.psn == psn) {
            self.sample = None;
        }
    }

    /// An expiry: the next timeout is twice this one, up to `negotiated`.
    pub(super) fn back_off(&mut self, negotiated: u64) {
        if self.timeout(negotiated) < negotiated {
            self.backoff += 1;
        }
    }

    /// The public view, for [`Qp::rtt_estimate`].
    pub(super) fn estimate(&self, negotiated: u64) -> RttEstimate {
        RttEstimate {
            smoothed_rtt: self.smoothed_rtt,
            rtt_variation: self.rtt_variation,
            backoff: self.backoff,
            retransmit_timeout: self.timeout(negotiated),
            negotiated_timeout: negotiated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{config, RetransmitTimer};

    const MS: u64 = 1_000_000;
    /// The RDMA CM default: 4.096 µs · 2^19.
    const NEGOTIATED: u64 = 4096 << 19;

    #[test]
    fn initial_timeout_is_capped_by_the_negotiated_one() {
        let timer = RetransmitTimer::new();
        assert_eq!(
            timer.timeout(NEGOTIATED),
            config::INITIAL_RETRANSMIT_TIMEOUT_NS
        );
        assert_eq!(timer.timeout(4096 << 10), 4096 << 10);
    }

    #[test]
    fn estimate_follows_rfc_6298() {
        let mut timer = RetransmitTimer::new();
        timer.record(8 * MS);
        assert_eq!(timer.smoothed_rtt, Some(8 * MS));
        assert_eq!(timer.rtt_variation, 4 * MS);
        assert_eq!(timer.timeout(NEGOTIATED), 24 * MS);
        timer.record(16 * MS);
        // RTTVAR = 3/4·4 + 1/4·|8 − 16| = 5; SRTT = 7/8·8 + 1/8·16 = 9.
        assert_eq!(timer.rtt_variation, 5 * MS);
        assert_eq!(timer.smoothed_rtt, Some(9 * MS));
        assert_eq!(timer.timeout(NEGOTIATED), 29 * MS);
    }

    #[test]
    fn floor_applies_to_the_margin_over_srtt() {
        let mut timer = RetransmitTimer::new();
        for _ in 0..100 {
            timer.record(20_000);
        }
        assert_eq!(timer.rtt_variation, 0);
        assert_eq!(
            timer.timeout(NEGOTIATED),
            20_000 + config::MIN_RETRANSMIT_TIMEOUT_NS
        );
        // A constant 50 ms RTT still leaves G of margin.
        for _ in 0..100 {
            timer.record(50 * MS);
        }
        // ⅞/⅛ smoothing in integers: within a µs after 100 samples.
        let srtt = timer.smoothed_rtt.unwrap();
        assert!((50 * MS - 1000..=50 * MS).contains(&srtt), "{srtt}");
        assert!(timer.timeout(NEGOTIATED) >= srtt + config::MIN_RETRANSMIT_TIMEOUT_NS);
        // The negotiated timeout caps everything, floor included.
        assert_eq!(timer.timeout(4096 << 10), 4096 << 10);
    }

    #[test]
    fn backoff_doubles_up_to_the_negotiated_timeout_and_ends_with_a_sample() {
        let mut timer = RetransmitTimer::new();
        timer.record(100_000);
        let base = timer.timeout(NEGOTIATED);
        timer.back_off(NEGOTIATED);
        assert_eq!(timer.timeout(NEGOTIATED), 2 * base);
        timer.back_off(NEGOTIATED);
        assert_eq!(timer.timeout(NEGOTIATED), 4 * base);
        for _ in 0..1000 {
            timer.back_off(NEGOTIATED);
        }
        assert_eq!(timer.timeout(NEGOTIATED), NEGOTIATED);
        // Doubling stops once the cap is reached: bounded.
        assert!(timer.backoff <= 10, "{}", timer.backoff);
        timer.record(100_000);
        assert_eq!(timer.backoff, 0);
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let largest = 4096u64 << 31;
        let mut timer = RetransmitTimer::new();
        timer.record(u64::MAX);
        timer.record(0);
        timer.record(u64::MAX);
        for _ in 0..100 {
            timer.back_off(largest);
        }
        assert_eq!(timer.timeout(largest), largest);
        // An absurd cap saturates instead of overflowing.
        assert!(timer.timeout(u64::MAX) >= largest);
    }
}

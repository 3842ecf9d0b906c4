//! `MonotonicClock`: `CLOCK_MONOTONIC` nanoseconds for a hosted engine.
//!
//! All instances share one start (the first use in the process), so
//! deadlines computed from one instance are valid for every other and for
//! [`wait`](super::wait).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::Clock;

static START: OnceLock<Instant> = OnceLock::new();

/// The process-wide monotonic clock (std `Instant`, `CLOCK_MONOTONIC`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MonotonicClock;

impl MonotonicClock {
    /// The clock; its start is fixed on first use in the process.
    pub fn new() -> Self {
        START.get_or_init(Instant::now);
        Self
    }

    /// Time from now until `deadline` (zero if it has passed).
    pub fn until(&self, deadline: u64) -> Duration {
        Duration::from_nanos(deadline.saturating_sub(self.now()))
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> u64 {
        let elapsed = START.get_or_init(Instant::now).elapsed();
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_shared() {
        let a = MonotonicClock::new();
        let t0 = a.now();
        std::thread::sleep(Duration::from_millis(2));
        let t1 = MonotonicClock::new().now();
        assert!(t1 >= t0 + 2_000_000);
        assert_eq!(a.until(0), Duration::ZERO);
        assert!(a.until(t1 + 1_000_000_000) > Duration::from_millis(900));
    }
}

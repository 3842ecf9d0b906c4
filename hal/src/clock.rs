//! Monotonic time for the engine: `Clock`.
//!
//! Time is a `u64` count of nanoseconds since an arbitrary start (boot),
//! never going backwards; about 584 years fit. Protocol crates never read
//! it themselves: the run loop reads it once per iteration and passes it in.

/// A monotonic nanosecond clock (the TSC in the image, `CLOCK_MONOTONIC`
/// hosted).
pub trait Clock {
    /// Nanoseconds since the clock's start.
    fn now(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

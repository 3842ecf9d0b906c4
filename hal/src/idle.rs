//! Halting when there is no work: `Idle`.
//!
//! The run loop spins while it has work and otherwise idles until its next
//! deadline or until input arrives (ARCHITECTURE.md §6): `hlt` with a timer and
//! NIC wake-up in the image, ppoll(2) on the link's file descriptors hosted.

/// Blocks the loop until a deadline or readiness.
pub trait Idle {
    /// Returns once `deadline` (on the [`Clock`](crate::Clock) scale) has
    /// passed or an event source is ready, whichever is first; `None` waits
    /// for an event only. May return early (a spurious wake-up): the caller
    /// polls everything again anyway.
    fn idle_until(&mut self, deadline: Option<u64>);
}

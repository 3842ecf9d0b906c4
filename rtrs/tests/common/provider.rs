//! What both test providers (the server tests' mock, the client tests'
//! loopback fabric) need: a per-thread nesting depth so allocation-counting
//! tests blame only the code under test, and a seeded key source.

use verbs::KeySource;

thread_local! {
    /// Depth of test-provider calls on this thread: allocation-counting
    /// tests count only the allocations of the code under test, not the
    /// provider's bookkeeping.
    pub static PROVIDER_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Marks the current thread as inside the test provider until dropped.
pub struct InProvider;

impl InProvider {
    pub fn enter() -> Self {
        PROVIDER_DEPTH.with(|depth| depth.set(depth.get() + 1));
        InProvider
    }
}

impl Drop for InProvider {
    fn drop(&mut self) {
        PROVIDER_DEPTH.with(|depth| depth.set(depth.get() - 1));
    }
}

/// Seeded key source.
pub struct Lcg(pub u32);

impl KeySource for Lcg {
    fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        self.0
    }
}

//! A counting global allocator for the no-allocation tests (ARCHITECTURE.md §6).
//!
//! `counting_allocator!(DEPTH)` installs it; allocations are counted in
//! `COUNT` only inside `armed(..)` and only while the thread-local `DEPTH`
//! (the test provider's own nesting counter, so its allocations are not
//! blamed on the code under test) is zero.

/// Installs the counting allocator; `$excluded` names a
/// `thread_local!` `Cell<u32>`-like depth whose non-zero value excludes
/// allocations from the count.
#[macro_export]
macro_rules! counting_allocator {
    ($excluded:ident) => {
        thread_local! {
            static ARMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
            static COUNT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        }

        fn note() {
            let _ = ARMED.try_with(|armed| {
                if armed.get() && $excluded.try_with(std::cell::Cell::get).unwrap_or(1) == 0 {
                    let _ = COUNT.try_with(|count| count.set(count.get() + 1));
                }
            });
        }

        #[global_allocator]
        static ALLOCATOR: alloc_counter::Counting = alloc_counter::Counting::new(note);

        /// Runs `f` with allocations counted.
        fn armed<R>(f: impl FnOnce() -> R) -> R {
            ARMED.with(|a| a.set(true));
            let result = f();
            ARMED.with(|a| a.set(false));
            result
        }
    };
}

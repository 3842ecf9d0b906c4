//! A counting global allocator for the no-allocation tests (ARCHITECTURE.md §6):
//! allocations are counted in [`COUNT`] while [`ARMED`] is set, on every
//! thread. Each test binary that includes this module installs it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Set while the code under test runs.
pub static ARMED: AtomicBool = AtomicBool::new(false);
/// Allocations seen while armed.
pub static COUNT: AtomicU64 = AtomicU64::new(0);

fn note() {
    if ARMED.load(Ordering::Relaxed) {
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: alloc_counter::Counting = alloc_counter::Counting::new(note);

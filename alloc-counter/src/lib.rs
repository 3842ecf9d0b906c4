//! The global allocator of the no-allocation tests (ARCHITECTURE.md,
//! "No allocation after construction"): the system allocator, calling a
//! hook on every allocation (`alloc`, `alloc_zeroed`, `realloc`; not
//! `dealloc`). Each test binary installs one with its own counting rule,
//! in safe code:
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! static COUNT: AtomicU64 = AtomicU64::new(0);
//!
//! fn note() {
//!     COUNT.fetch_add(1, Ordering::Relaxed);
//! }
//!
//! #[global_allocator]
//! static ALLOCATOR: alloc_counter::Counting = alloc_counter::Counting::new(note);
//!
//! let before = COUNT.load(Ordering::Relaxed);
//! let v = vec![1u8; 16];
//! assert!(COUNT.load(Ordering::Relaxed) > before);
//! drop(v);
//! ```
//!
//! The hook runs inside the allocator: it must not allocate (atomics and
//! const-initialised thread-local `Cell`s, read with `try_with`, are
//! fine).
//!
//! This is the one place the tests need `unsafe`: `GlobalAlloc` is an
//! unsafe trait.

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator with `hook` called on every allocation.
pub struct Counting {
    hook: fn(),
}

impl Counting {
    /// An allocator calling `hook` (which must not allocate) on every
    /// allocation.
    pub const fn new(hook: fn()) -> Self {
        Self { hook }
    }
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the hook only counts and allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        (self.hook)();
        // SAFETY: the caller's obligations for `layout` are passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        (self.hook)();
        // SAFETY: the caller's obligations for `layout` are passed through.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        (self.hook)();
        // SAFETY: forwarded as is; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

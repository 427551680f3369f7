//! Returning freed memory to the operating system right after large frees.
//!
//! Allocators such as mimalloc keep freed pages for a while (a second by
//! default) so that the next batch reuses them without page faults, and a
//! shorter delay costs the hot path up to half its speed. But an eviction
//! frees most of an operator's state at once, and a run's write frees its
//! rows; held for that second, the freed pages and the state rebuilt next
//! to them push resident memory well past the memory budget. So the
//! binary, which chose the allocator, registers how to return freed pages
//! now ([`on_release`]), and the store and the operators call
//! [`release_after`] when they have just freed a lot.

use std::sync::OnceLock;

/// Frees below this size wait for the allocator's own schedule.
const LARGE_FREE: usize = 32 << 20;

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Registers how to return freed pages to the operating system (with
/// mimalloc: `mi_collect(true)`); the first registration counts.
pub fn on_release(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Registers mimalloc's `mi_collect(true)` as the release ([`on_release`]),
/// for a binary whose global allocator is mimalloc.
#[cfg(feature = "mimalloc")]
pub fn release_with_mimalloc() {
    fn collect() {
        // SAFETY: mi_collect takes no pointers; it only walks mimalloc's heaps.
        unsafe { libmimalloc_sys::mi_collect(true) }
    }
    on_release(collect);
}

/// Returns freed pages to the operating system, if `freed` bytes were just
/// freed and a release was registered.
pub fn release_after(freed: usize) {
    if freed >= LARGE_FREE
        && let Some(release) = RELEASE.get()
    {
        release();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static CALLS: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn only_a_large_free_is_released_at_once() {
        release_after(usize::MAX);
        on_release(|| {
            CALLS.fetch_add(1, Ordering::SeqCst);
        });
        release_after(LARGE_FREE - 1);
        assert_eq!(CALLS.load(Ordering::SeqCst), 0);
        release_after(LARGE_FREE);
        assert_eq!(CALLS.load(Ordering::SeqCst), 1);
    }
}

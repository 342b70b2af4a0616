//! Counting the heap memory memsnap holds, so that hostile input is refused before it costs.
//!
//! [`Counting`] wraps the system allocator and keeps two tallies of live heap bytes: one for
//! the whole process (checked against `--max-memory`; each thread adds its changes in steps of
//! 256 KiB) and one per thread (the decoder compares
//! its own thread's growth with the bytes of pickle it has read, whatever other threads are
//! decoding at the same time). The binary installs it as the global allocator; a program that
//! uses the library without it sees zeros, and the checks that rely on it never fire.
//!
//! [`ahead`] faults in the pages past a growing array's end on another core, so that decoding
//! does not stop at each fresh page.
//!
//! Written here rather than taken from a crate: the per-thread tally has to be free of
//! allocation and destructors (it runs inside the allocator), which the published counting
//! allocators do not offer, and the whole of it is a few atomic additions.

pub mod ahead;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The system allocator, counting live bytes (install with `#[global_allocator]`).
pub struct Counting;

static PROCESS_BYTES: AtomicI64 = AtomicI64::new(0);

/// How far a thread's unreported change may drift before it is added to the process tally:
/// the common allocation then costs one thread-local addition, not an atomic operation.
const FLUSH_BYTES: i64 = 256 << 10;

thread_local! {
    /// This thread's net bytes since it started, and the part not yet in the process tally.
    static THREAD_BYTES: Cell<(i64, i64)> = const { Cell::new((0, 0)) };
}

#[inline]
fn note(delta: i64) {
    // `try_with`: during thread teardown the slot may be gone; then count directly.
    let counted = THREAD_BYTES.try_with(|c| {
        let (total, pending) = c.get();
        let pending = pending + delta;
        if pending.abs() >= FLUSH_BYTES {
            PROCESS_BYTES.fetch_add(pending, Ordering::Relaxed);
            c.set((total + delta, 0));
        } else {
            c.set((total + delta, pending));
        }
    });
    if counted.is_err() {
        PROCESS_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; the bookkeeping neither allocates nor
// unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// Heap bytes live in the whole process now, to within 256 KiB per thread (0 without
/// [`Counting`] installed).
pub fn process_bytes() -> u64 {
    PROCESS_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// Bytes this thread has allocated minus bytes it has freed, since it started. Differences of
/// two readings on one thread measure what the work between them kept.
pub fn thread_bytes() -> i64 {
    THREAD_BYTES.try_with(|c| c.get().0).unwrap_or(0)
}

/// The process's memory allowance (`--max-memory`), for every stage to check against.
static ALLOWANCE: AtomicU64 = AtomicU64::new(Caps::DEFAULT.max_memory);

/// Sets the whole process's memory allowance (`--max-memory`): what [`check`] compares with.
pub fn set_allowance(bytes: u64) {
    ALLOWANCE.store(bytes, Ordering::Relaxed);
}

/// The whole process's memory allowance.
pub fn allowance() -> u64 {
    ALLOWANCE.load(Ordering::Relaxed)
}

/// `Err(allowance)` when the process holds more than its allowance, or would after taking
/// `more` bytes: a stage about to build something large asks first, and any stage can ask as
/// what it holds grows.
pub fn check(more: u64) -> Result<(), u64> {
    let max = allowance();
    if process_bytes().saturating_add(more) > max {
        Err(max)
    } else {
        Ok(())
    }
}

/// The memory caps of one run, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The whole process's heap (`--max-memory`).
    pub max_memory: u64,
    /// The decompressed pickle (`--max-size`).
    pub max_size: u64,
}

impl Caps {
    /// 8 GiB of memory, 16 GiB of pickle.
    pub const DEFAULT: Caps = Caps {
        max_memory: 8 << 30,
        max_size: 16 << 30,
    };
}

impl Default for Caps {
    fn default() -> Self {
        Caps::DEFAULT
    }
}

/// What decoding may hold besides twice the pickle it has read: room for the tables every
/// snapshot needs, whatever its size.
pub const BASE_ALLOWANCE: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_tally_sees_what_it_keeps_and_frees() {
        let before = thread_bytes();
        let kept = vec![1u8; 1 << 20];
        assert!(thread_bytes() - before >= 1 << 20);
        assert!(process_bytes() >= 1 << 20);
        drop(kept);
        assert!(thread_bytes() - before < 1 << 10);
    }

    #[test]
    fn the_allowance_is_checked_with_what_a_stage_is_about_to_take() {
        assert_eq!(check(0), Ok(()));
        assert_eq!(check(u64::MAX), Err(allowance()));
    }

    #[test]
    fn caps_default_to_the_documented_sizes() {
        assert_eq!(Caps::default().max_memory, 8 * 1024 * 1024 * 1024);
        assert_eq!(Caps::default().max_size, 16 * 1024 * 1024 * 1024);
    }
}

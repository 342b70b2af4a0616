//! Faulting in the pages ahead of a growing array's end on another core.
//!
//! The first write to each fresh page of memory traps into the kernel, which finds and zeroes
//! a page for it: on the machines measured (`docs/speed.md`) that is about 0.4 ms per MiB,
//! paid by the thread that writes, page by page. Decoding a large snapshot writes its trace
//! rows and its memo into arrays that grow by tens of MiB while the second core has nothing
//! to do, so [`Ahead`] hands the next few MiB past an array's end to a helper thread, which
//! asks the kernel to fault them in at once (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14 and
//! later) before the writer gets there.
//!
//! The helper never reads or writes the memory: populating a range only maps pages, and a
//! range that has since been freed or reused is either refused by the kernel or mapped for
//! whoever holds it now, with its contents unchanged. So a request that arrives late is
//! harmless. Only the spare capacity an array already has is populated, at most
//! [`AHEAD_BYTES`] past its end, so the memory it adds is that much per array at worst. Where
//! the kernel does not know the advice, on one core, or on another system, nothing is sent
//! and the writer faults its pages in itself as before.
//!
//! Written here: the few lines of it depend on how the decoder's arrays grow, and no crate
//! prefaults on another thread.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

/// How far past an array's end pages are kept faulted in.
pub const AHEAD_BYTES: usize = 4 << 20;
/// How much the writer moves on before the next request: each asks for the pages from where
/// the last stopped up to [`AHEAD_BYTES`] past the end.
const STEP_BYTES: usize = 2 << 20;
const PAGE: usize = 4096;

/// The helper thread's queue of ranges to populate (address, length).
type Queue = Mutex<Sender<(usize, usize)>>;

/// The helper's queue, made on first use; `None` where there is no second core or the kernel
/// cannot populate.
static HELPER: OnceLock<Option<Queue>> = OnceLock::new();

fn helper() -> Option<&'static Queue> {
    HELPER
        .get_or_init(|| {
            if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 || !supported() {
                return None;
            }
            let (tx, rx) = channel::<(usize, usize)>();
            std::thread::Builder::new()
                .name("memsnap-prefault".into())
                .spawn(move || {
                    // a range refused (freed, or reused since) is simply passed over
                    while let Ok((addr, len)) = rx.recv() {
                        populate(addr, len);
                    }
                })
                .ok()?;
            Some(Mutex::new(tx))
        })
        .as_ref()
}

/// Whether the kernel populates a range on request: tried on a page of this thread's own.
fn supported() -> bool {
    let mut probe: Vec<u8> = Vec::with_capacity(2 * PAGE);
    let start = (probe.as_mut_ptr() as usize).next_multiple_of(PAGE);
    populate(start, PAGE)
}

/// Faults in the pages of `[addr, addr + len)` for writing; `false` when the kernel refuses
/// (a range not mapped or not writable, or a kernel without the advice).
#[cfg(target_os = "linux")]
fn populate(addr: usize, len: usize) -> bool {
    // SAFETY: MADV_POPULATE_WRITE maps pages without reading or writing them; the kernel
    // checks the range, and one not mapped (or not writable) is refused with an error.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn populate(_addr: usize, _len: usize) -> bool {
    false
}

/// Asks the helper to fault in the whole pages inside `[from, to)`; `false` when there is no
/// helper to ask.
fn request(from: usize, to: usize) -> bool {
    let Some(helper) = helper() else {
        return false;
    };
    let start = from.next_multiple_of(PAGE);
    let end = to & !(PAGE - 1);
    if end > start {
        let tx = helper.lock().unwrap_or_else(|e| e.into_inner());
        if tx.send((start, end - start)).is_err() {
            return false;
        }
    }
    true
}

/// Keeps the pages past one growing `Vec`'s end faulted in ahead of its writer. Call
/// [`Ahead::before_push`] before each push, after any growth the caller makes.
#[derive(Debug, Default, Clone)]
pub struct Ahead {
    /// The length at which to ask again.
    next: usize,
    /// Where the buffer was, and the length up to which its pages were asked for.
    asked: (usize, usize),
}

impl Ahead {
    /// Asks for the pages ahead of `v`'s end once its length has moved on far enough.
    #[inline(always)]
    pub fn before_push<T>(&mut self, v: &Vec<T>) {
        if v.len() >= self.next {
            self.ask(v);
        }
    }

    #[cold]
    #[inline(never)]
    fn ask<T>(&mut self, v: &Vec<T>) {
        let size = std::mem::size_of::<T>();
        if size == 0 {
            self.next = usize::MAX;
            return;
        }
        let (len, cap) = (v.len(), v.capacity());
        let base = v.as_ptr() as usize;
        let ahead = (AHEAD_BYTES / size).max(1);
        let step = (STEP_BYTES / size).max(1);
        let to = cap.min(len.saturating_add(ahead));
        // a buffer that moved keeps nothing asked for (a copy leaves fresh pages behind)
        let from = if self.asked.0 == base {
            self.asked.1.max(len)
        } else {
            len
        };
        if from < to && !request(base + from * size, base + to * size) {
            self.next = usize::MAX;
            return;
        }
        self.asked = (base, to.max(from));
        // ask again a step on, or when the capacity runs out (after the caller grows it)
        self.next = len.saturating_add(step).min(cap.max(len + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_follow_the_end_and_never_pass_the_capacity() {
        let mut v: Vec<u64> = Vec::with_capacity(3 << 20);
        let mut ahead = Ahead::default();
        ahead.before_push(&v);
        let base = v.as_ptr() as usize;
        let asked = ahead.asked;
        // on a machine with a helper, the first request covers AHEAD_BYTES from the start
        if ahead.next != usize::MAX {
            assert_eq!(asked, (base, AHEAD_BYTES / 8));
            assert_eq!(ahead.next, STEP_BYTES / 8);
        }
        for i in 0..(3u64 << 20) {
            ahead.before_push(&v);
            v.push(i);
            assert!(ahead.asked.1 <= v.capacity());
        }
        // the values are what was written: populating never changed memory
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }

    /// Pages of `[addr, addr + len)` the kernel has mapped in for this process.
    #[cfg(target_os = "linux")]
    fn resident(addr: usize, len: usize) -> usize {
        let mut pages = vec![0u8; len / PAGE];
        // SAFETY: the range is one mapping of `len` bytes held by the caller; `pages` has one
        // byte per page of it.
        let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, pages.as_mut_ptr()) };
        assert_eq!(rc, 0);
        pages.iter().filter(|&&p| p & 1 == 1).count()
    }

    /// A fresh anonymous mapping of `len` bytes, none of it touched.
    #[cfg(target_os = "linux")]
    fn fresh(len: usize) -> usize {
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn populating_maps_the_pages_in_and_a_closed_range_is_refused() {
        let len = 64 * PAGE;
        let addr = fresh(len);
        assert_eq!(resident(addr, len), 0);
        if populate(addr, len) {
            assert_eq!(resident(addr, len), 64);
        } else {
            // a kernel before 5.14 does not know the advice: nothing may have changed
            assert!(!supported());
            assert_eq!(resident(addr, len), 0);
        }
        // the pages read as zeros, as fresh memory does
        // SAFETY: the mapping is live and `len` bytes long.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        assert!(bytes.iter().all(|&b| b == 0));
        // SAFETY: the mapping is ours and no longer used.
        assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
        // a range that may not be written is refused, and not as an unknown advice
        let closed = closed(PAGE);
        assert!(!populate(closed, PAGE));
        // SAFETY: the mapping is ours and was never used.
        assert_eq!(
            unsafe { libc::munmap(closed as *mut libc::c_void, PAGE) },
            0
        );
    }

    /// A mapping of `len` bytes that may be neither read nor written.
    #[cfg(target_os = "linux")]
    fn closed(len: usize) -> usize {
        let addr = fresh(len);
        // SAFETY: the mapping is ours and was never used.
        assert_eq!(
            unsafe { libc::mprotect(addr as *mut libc::c_void, len, libc::PROT_NONE) },
            0
        );
        addr
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_helper_maps_in_the_pages_asked_for() {
        if helper().is_none() {
            eprintln!("skipped: no second core or no MADV_POPULATE_WRITE here");
            return;
        }
        let len = 256 * PAGE;
        let addr = fresh(len);
        assert!(request(addr, addr + len));
        // the helper works on its own thread: wait for it, a few seconds at most
        let start = std::time::Instant::now();
        while resident(addr, len) < 256 && start.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(resident(addr, len), 256);
        // SAFETY: the mapping is ours and no longer used.
        assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
    }
}

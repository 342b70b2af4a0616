//! The pickle VM alone, on any bytes: it must return a value or an error, never panic, and
//! stay within its limits.
#![no_main]

use libfuzzer_sys::fuzz_target;

// Counted as in the binary, so that the decoder's memory allowance is exercised too.
#[global_allocator]
static ALLOCATOR: memsnap::memory::Counting = memsnap::memory::Counting;
use memsnap::pickle::{decode, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_string_bytes: 1 << 20,
        ..Limits::default()
    };
    let _ = decode(data, limits);
});

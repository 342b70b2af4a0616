//! Trace entries read whole by the decoder's fast path, on any bytes: the snapshot, or the
//! error, must be exactly what decoding every dict opcode by opcode gives.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: memsnap::memory::Counting = memsnap::memory::Counting;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = memsnap::snapshot::flat_agrees(data) {
        panic!("{e}");
    }
});

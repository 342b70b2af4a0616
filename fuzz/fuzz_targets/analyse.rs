//! Decode, model, replay, attribution and every breakdown, on any bytes that decode to a
//! snapshot.
#![no_main]

use libfuzzer_sys::fuzz_target;

// Counted as in the binary, so that the decoder's memory allowance is exercised too.
#[global_allocator]
static ALLOCATOR: memsnap::memory::Counting = memsnap::memory::Counting;
use memsnap::pickle::Limits;

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = memsnap::snapshot::from_pickle(data, Limits::default()) else {
        return;
    };
    for analysis in memsnap::analysis::analyse(&snap, &Default::default()) {
        let _ = analysis.peak_place.summary();
    }
});

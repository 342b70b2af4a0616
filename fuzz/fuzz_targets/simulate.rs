//! The allocator simulation: the recorded settings (self-check, inferred cap), expandable
//! segments, and a split cap, on any bytes that decode to a snapshot with a trace.
#![no_main]

use libfuzzer_sys::fuzz_target;

// Counted as in the binary, so that the decoder's memory allowance is exercised too.
#[global_allocator]
static ALLOCATOR: memsnap::memory::Counting = memsnap::memory::Counting;
use memsnap::pickle::Limits;
use memsnap::simulate::{self, AllocConf, Program};

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = memsnap::snapshot::from_pickle(data, Limits::default()) else {
        return;
    };
    let recorded = AllocConf::recorded(&snap);
    for analysis in memsnap::analysis::analyse(&snap, &Default::default()) {
        let replay = &analysis.replay;
        let program = Program::new(&snap, replay);
        let _ = simulate::self_check(&snap, replay, &program, &recorded, None, None);
        for conf in ["expandable_segments:True", "max_split_size_mb:64,roundup_power2_divisions:4"] {
            let options = simulate::Options {
                conf: AllocConf::parse(conf).expect("valid settings"),
                cap: Some(1 << 30),
                device_total: None,
                recorded_addresses: false,
            };
            let _ = simulate::simulate(&snap, replay, &program, &recorded, &options);
        }
    }
});

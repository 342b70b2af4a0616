//! Decoding in parts on several threads, on any bytes: the parts must give exactly what one
//! piece gives (or give up), never something else, and never hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: memsnap::memory::Counting = memsnap::memory::Counting;

fuzz_target!(|data: &[u8]| {
    // the parts read a file: one per fuzzing process
    let path = std::env::temp_dir().join(format!("memsnap-fuzz-split-{}", std::process::id()));
    std::fs::write(&path, data).expect("temp file");
    let parts = 2 + data.len() % 3;
    if let Err(e) = memsnap::snapshot::parts_agree(&path, parts) {
        panic!("{e}");
    }
});

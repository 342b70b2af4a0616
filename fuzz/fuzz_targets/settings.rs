//! The text parsers a user types: allocator settings (`PYTORCH_CUDA_ALLOC_CONF`), sizes, and
//! rules files (TOML with regexes).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = memsnap::simulate::AllocConf::parse(text);
    let _ = memsnap::simulate::parse_size(text);
    let _ = memsnap::attribute::rules::RuleSet::parse(text);
});

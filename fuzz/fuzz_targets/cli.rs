//! Command lines: the input is split at NUL bytes into arguments after `memsnap`, parsed by the
//! command's own clap definition (the binary's `cli` module, compiled in here), and a refused
//! line is condensed to the one line the command prints. Neither may panic, and the line must
//! be one line with no control character.
#![no_main]

use clap::Parser;
use libfuzzer_sys::fuzz_target;

#[path = "../../src/cli/mod.rs"]
#[allow(dead_code, unused_imports, unused_macros)]
mod cli;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let args: Vec<String> = text.split('\0').map(str::to_string).collect();
    if args.len() > 64 {
        return;
    }
    let argv = std::iter::once("memsnap".to_string()).chain(args.iter().cloned());
    if let Err(e) = cli::Cli::try_parse_from(argv) {
        let rendered = e.render().to_string();
        let line = cli::one_line_usage(&rendered, &args);
        assert!(!line.contains('\n'), "one line: {line:?}");
        assert!(
            !line.chars().any(|c| c.is_control()),
            "no control character: {line:?}"
        );
    }
});

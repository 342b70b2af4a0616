//! The `memsnap` command: parses arguments and dispatches to the library.

mod cli;

use clap::Parser;

/// Heap bytes are counted so that hostile input is refused before it costs (`memsnap::memory`).
#[global_allocator]
static ALLOCATOR: memsnap::memory::Counting = memsnap::memory::Counting;

fn main() -> std::process::ExitCode {
    match cli::Cli::try_parse() {
        Ok(parsed) => cli::run(parsed),
        Err(e) => cli::command_line_error(e),
    }
}

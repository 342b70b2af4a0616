//! The `memsnap` command: parses arguments and dispatches to the library.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    cli::run(cli::Cli::parse())
}

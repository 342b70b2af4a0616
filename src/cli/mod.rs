//! Command-line arguments (clap) and one function per command. Arguments are turned into
//! library options here, once; the library never sees clap. Every command returns
//! `Result<(), Failure>`, and [`exit_code`] alone turns that into the process's exit code.

mod compare;
mod export;
mod flamegraph;
mod report;
mod summaries;
mod timeline;
mod trim;
mod ui;
mod whatif;

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use memsnap::replay::SizeModel;

/// Explains PyTorch CUDA memory snapshots: where every byte of GPU memory went.
#[derive(Debug, Parser)]
#[command(
    name = "memsnap",
    version,
    about,
    long_about = None,
    after_help = "Example:\n  memsnap report memory_snapshot_rank0_step0.pickle.xz"
)]
pub struct Cli {
    /// No progress bars.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Most memory memsnap may hold, e.g. `8GiB`; a file that needs more is refused with an error.
    #[arg(long, global = true, value_name = "SIZE", default_value = "8GiB", value_parser = parse_size_arg)]
    max_memory: u64,
    /// Longest decompressed pickle memsnap reads, e.g. `16GiB`.
    #[arg(long, global = true, value_name = "SIZE", default_value = "16GiB", value_parser = parse_size_arg)]
    max_size: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Summarise snapshots: memory at trace start, at the peak and at the end, and what the
    /// peak was made of.
    Report(report::ReportArgs),
    /// Draw memory over time as a PNG or SVG chart.
    Timeline(timeline::TimelineArgs),
    /// Compare two snapshots side by side, or a folder of ranks in one table.
    Compare(compare::CompareArgs),
    /// Simulate the caching allocator under other settings or memory caps: would it fit?
    Whatif(whatif::WhatIfArgs),
    /// Explain an out-of-memory error: figures, what was live, why, and what would fit.
    Oom(whatif::OomArgs),
    /// Draw the memory live at one moment as a flamegraph (SVG), or print its folded stacks.
    Flamegraph(flamegraph::FlamegraphArgs),
    /// Export the analysis as tables (events, blocks, steps, peak): Parquet, CSV or JSON lines.
    Export(export::ExportArgs),
    /// Cut a snapshot down to a window of its trace (around the peak, or between two moments).
    Trim(trim::TrimArgs),
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish).
    #[command(
        after_help = "Example:\n  memsnap completions bash > ~/.local/share/bash-completion/completions/memsnap"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Why a command did not fully succeed.
#[derive(Debug)]
pub enum Failure {
    /// One error, not yet printed.
    Error(memsnap::Error),
    /// A mistake on the command line that names no file.
    Usage(String),
    /// Errors already printed, one line each; the exit code they call for.
    Printed(u8),
    /// Writing the output failed.
    Output(io::Error),
}

impl From<memsnap::Error> for Failure {
    fn from(e: memsnap::Error) -> Failure {
        Failure::Error(e)
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Output(e)
    }
}

/// Exit code 2: the command line asks for something that cannot be done (a bad option value,
/// an unusable rules file, an output path that cannot be written, a device that is not there).
pub const EXIT_USAGE: u8 = 2;
/// Exit code 1: an input file could not be read or analysed (the others still were).
pub const EXIT_FILE: u8 = 1;

/// The exit code of an error: [`EXIT_USAGE`] or [`EXIT_FILE`].
fn code_of(e: &memsnap::Error) -> u8 {
    if e.is_usage() {
        EXIT_USAGE
    } else {
        EXIT_FILE
    }
}

/// The one place that turns a command's outcome into an exit code (0 when it succeeded),
/// printing what has not been printed yet.
pub fn exit_code(outcome: Result<(), Failure>) -> ExitCode {
    let code = match outcome {
        Ok(()) => 0,
        Err(Failure::Error(e)) => {
            complain(&e);
            code_of(&e)
        }
        Err(Failure::Usage(message)) => {
            let _ = writeln!(io::stderr(), "memsnap: {message}");
            EXIT_USAGE
        }
        Err(Failure::Printed(code)) => code,
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(Failure::Output(e)) => {
            let _ = writeln!(io::stderr(), "memsnap: cannot write the output: {e}");
            EXIT_FILE
        }
    };
    ExitCode::from(code)
}

/// Errors of a command that goes on after one file fails: each is printed at once, and the
/// worst one decides the exit code.
#[derive(Debug, Default)]
struct Tally {
    worst: u8,
}

impl Tally {
    /// Prints the error's line and remembers its exit code.
    fn complain(&mut self, e: &memsnap::Error) {
        complain(e);
        self.worst = self.worst.max(code_of(e));
    }

    /// Whether every file so far went through.
    fn all_ok(&self) -> bool {
        self.worst == 0
    }

    /// The outcome: success, or the errors printed.
    fn finish(self) -> Result<(), Failure> {
        match self.worst {
            0 => Ok(()),
            code => Err(Failure::Printed(code)),
        }
    }
}

/// How bytes are counted (`--sizes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Sizes {
    /// Block sizes, as torch.cuda.memory_allocated() counts them.
    Allocator,
    /// Each request rounded up to 512 bytes.
    Rounded,
}

impl From<Sizes> for SizeModel {
    fn from(s: Sizes) -> SizeModel {
        match s {
            Sizes::Allocator => SizeModel::Allocator,
            Sizes::Rounded => SizeModel::Rounded,
        }
    }
}

/// Rule sets for attribution (`--preset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PresetArg {
    /// Choose by the frames present.
    Auto,
    /// DualPipeV pipelines (pithtrain).
    Pithtrain,
    /// Any PyTorch program.
    Generic,
}

/// Common options for reading and attributing snapshot files.
#[derive(Debug, clap::Args)]
pub struct InputArgs {
    /// How bytes are counted.
    #[arg(long, value_enum, default_value_t = Sizes::Allocator)]
    sizes: Sizes,
    /// Folder holding the training program's source, to map lines to `# Step N` and
    /// `# Stage N.` regions (the recorded path's suffixes are tried below it).
    #[arg(long, value_name = "DIR")]
    source_root: Vec<std::path::PathBuf>,
    /// Attribution rule set.
    #[arg(long, value_enum, default_value_t = PresetArg::Auto)]
    preset: PresetArg,
    /// TOML file of custom labelling rules (see the README).
    #[arg(long, value_name = "FILE")]
    rules: Option<std::path::PathBuf>,
}

impl InputArgs {
    /// The analysis options these arguments ask for; a rules file that cannot be read or
    /// parsed is a usage error.
    pub fn analysis(&self) -> Result<memsnap::analysis::Options, memsnap::Error> {
        let rules = match &self.rules {
            Some(path) => {
                let fail = |kind| memsnap::Error::new(path, kind);
                let text = std::fs::read_to_string(path).map_err(|e| {
                    fail(memsnap::ErrorKind::Usage(format!(
                        "cannot read the rules: {e}"
                    )))
                })?;
                Some(
                    memsnap::attribute::rules::RuleSet::parse(&text)
                        .map_err(|e| fail(memsnap::ErrorKind::Rules(e)))?,
                )
            }
            None => None,
        };
        Ok(memsnap::analysis::Options {
            model: self.sizes.into(),
            attribution: memsnap::attribute::Options {
                source_roots: self.source_root.clone(),
                preset: match self.preset {
                    PresetArg::Auto => None,
                    PresetArg::Pithtrain => Some(memsnap::attribute::Preset::Pithtrain),
                    PresetArg::Generic => Some(memsnap::attribute::Preset::Generic),
                },
                rules,
            },
        })
    }
}

/// Runs a parsed command line; returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    if cli.quiet {
        ui::quiet();
    }
    let _ = CAPS.set(memsnap::memory::Caps {
        max_memory: cli.max_memory,
        max_size: cli.max_size,
    });
    exit_code(match cli.command {
        Command::Report(args) => report::run(args),
        Command::Timeline(args) => timeline::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Whatif(args) => whatif::run_whatif(args),
        Command::Oom(args) => whatif::run_oom(args),
        Command::Flamegraph(args) => flamegraph::run(args),
        Command::Trim(args) => trim::run(args),
        Command::Export(args) => export::run(args),
        Command::Completions { shell } => completions(shell),
    })
}

/// Writes the completion script of `shell` to stdout.
fn completions(shell: clap_complete::Shell) -> Result<(), Failure> {
    use clap::CommandFactory;
    let mut out = io::stdout().lock();
    clap_complete::generate(shell, &mut Cli::command(), "memsnap", &mut out);
    out.flush()?;
    Ok(())
}

/// Prints one error line for a file that could not be handled.
fn complain(e: &memsnap::Error) {
    let _ = writeln!(io::stderr(), "memsnap: {e}");
}

/// The memory and size caps of this run (`--max-memory`, `--max-size`).
static CAPS: std::sync::OnceLock<memsnap::memory::Caps> = std::sync::OnceLock::new();

/// Options for loading a snapshot under this run's caps, without a progress bar.
fn load_options() -> memsnap::snapshot::LoadOptions {
    let mut options = memsnap::snapshot::LoadOptions::default();
    options.limits.caps = CAPS.get().copied().unwrap_or_default();
    options
}

/// Leaves `value` to the end of the process, which is near: the memory goes back with the
/// process at once, where freeing a large snapshot's tables one by one takes 1-2% of a report.
fn keep_to_exit<T>(value: T) {
    std::mem::forget(value);
}

/// Reads a snapshot file, with a progress bar for large ones.
fn load(path: &Path) -> Result<memsnap::snapshot::Snapshot, memsnap::Error> {
    let progress = ui::LoadProgress::new(path);
    let options = memsnap::snapshot::LoadOptions {
        on_progress: progress.callback(),
        ..load_options()
    };
    memsnap::snapshot::load(path, &options)
}

/// Parses a size argument: bytes, or a number with KiB, MiB, GiB (`8GiB`).
fn parse_size_arg(text: &str) -> Result<u64, String> {
    memsnap::simulate::parse_size(text).ok_or_else(|| {
        format!("{text:?} is not a size (use bytes, or a number with KiB, MiB, GiB)")
    })
}

/// A file name without its folder and its `.pickle`/compression suffixes, for output names.
fn stem(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or("snapshot".into(), |n| n.to_string_lossy().into_owned());
    let mut stem = name.as_str();
    for suffix in [".xz", ".gz", ".zst", ".pickle", ".pkl"] {
        stem = stem.strip_suffix(suffix).unwrap_or(stem);
    }
    stem.to_string()
}

/// Parses a dimension name (`--by`).
fn parse_dimension(s: &str) -> Result<memsnap::analysis::Dimension, String> {
    memsnap::analysis::Dimension::parse(s).ok_or_else(|| {
        format!("unknown dimension {s:?}; use category, step, op, stage, site, phase or annotation")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn report_parses() {
        let cli = Cli::try_parse_from(["memsnap", "report", "a.pickle", "--json"]).unwrap();
        let Command::Report(args) = cli.command else {
            panic!("not report")
        };
        assert!(args.json);
        assert_eq!(args.files.len(), 1);
        assert!(Cli::try_parse_from(["memsnap", "report"]).is_err());
    }

    #[test]
    fn timeline_parses() {
        let cli = Cli::try_parse_from([
            "memsnap", "timeline", "a.pickle", "-o", "t.svg", "--by", "step", "--x", "events",
            "--width", "800",
        ])
        .unwrap();
        let Command::Timeline(args) = cli.command else {
            panic!("not timeline")
        };
        let o = args.chart_options();
        assert_eq!(o.width, 800);
        assert_eq!(o.by, memsnap::analysis::Dimension::Step);
        assert_eq!(o.x, memsnap::chart::XAxis::Events);
        assert!(
            Cli::try_parse_from(["memsnap", "timeline", "a", "-o", "t.png", "--by", "x"]).is_err()
        );
    }
}

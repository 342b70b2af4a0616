//! Command-line arguments (clap) and one function per command. Arguments are turned into
//! library options here, once; the library never sees clap. Every command returns
//! `Result<(), Failure>`, and [`exit_code`] alone turns that into the process's exit code.

/// One line on stderr; a closed or full stderr is no reason to stop (`eprintln!` would panic).
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod compare;
mod diff;
mod export;
mod flamegraph;
pub(crate) mod mcp;
mod report;
mod summaries;
mod timeline;
mod trim;
mod ui;
mod view;
mod whatif;

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use memsnap::error::UsageError;
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
    /// Write over existing files whose names memsnap chose itself (per-device images, charts
    /// in a --png folder, export tables, the default flamegraph.svg). Inputs are never written
    /// over.
    #[arg(long, global = true)]
    force: bool,
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
    /// Why one run used more (or less) memory than another: the two runs' requests aligned,
    /// each difference classified, its effect on the peak in exact bytes; a budget for CI.
    Diff(diff::DiffArgs),
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
    /// Write one self-contained interactive HTML page of snapshots: memory over time by
    /// category, step, phase, stage or site, what was live at any moment, steps, ranks, OOMs.
    View(view::ViewArgs),
    /// Serve the analyses as tools of a Model Context Protocol server on standard input and
    /// output, for coding agents.
    Mcp(mcp::McpArgs),
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
    Usage(memsnap::error::UsageError),
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
        Err(Failure::Usage(e)) => {
            note!("memsnap: {}", memsnap::units::printable(&e.to_string()));
            EXIT_USAGE
        }
        Err(Failure::Printed(code)) => code,
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(Failure::Output(e)) => {
            note!("memsnap: cannot write the output: {}", memsnap::io_text(&e));
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
#[derive(Clone, Debug, clap::Args)]
pub struct InputArgs {
    /// How bytes are counted.
    #[arg(long, value_enum, default_value_t = Sizes::Allocator)]
    sizes: Sizes,
    /// Folder holding the training program's source, to map lines to `# Step N` and
    /// `# Stage N.` regions (the recorded path's suffixes are tried below it).
    #[arg(long, value_name = "DIR")]
    source_root: Vec<std::path::PathBuf>,
    /// Also read source files at the paths the snapshot records, when they exist here (off by
    /// default: a snapshot may name any file). Only `.py` files of at most 4 MiB are read.
    #[arg(long)]
    recorded_sources: bool,
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
                let text = read_small_text(path, MAX_RULES_BYTES).map_err(|m| {
                    fail(memsnap::ErrorKind::Rules(
                        memsnap::attribute::rules::RulesError::Read(m),
                    ))
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
                recorded_sources: self.recorded_sources,
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

/// The largest rules file read.
const MAX_RULES_BYTES: u64 = 1 << 20;

/// The text of a rules file: a regular file of at most `max` bytes, in UTF-8
/// ([`memsnap::output::read_small`]).
fn read_small_text(path: &Path, max: u64) -> Result<String, String> {
    use memsnap::output::SmallFileError;
    let bytes = memsnap::output::read_small(path, max).map_err(|e| match e {
        SmallFileError::TooLarge(_) => format!("{e}, the most a rules file may hold"),
        other => other.to_string(),
    })?;
    String::from_utf8(bytes)
        .map_err(|e| format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()))
}

/// The devices a command works on: the one `--device` asks for, which must have trace events,
/// or every device with events (at least one). Every command chooses devices here.
fn devices(
    snap: &memsnap::snapshot::Snapshot,
    asked: Option<u32>,
    file: &Path,
) -> Result<Vec<u32>, memsnap::Error> {
    choose_devices(snap.devices_with_events().collect(), asked, file)
}

/// The one of `available` that `--device` asks for, or all of them (at least one).
fn choose_devices(
    available: Vec<u32>,
    asked: Option<u32>,
    file: &Path,
) -> Result<Vec<u32>, memsnap::Error> {
    let fail = |kind| memsnap::Error::new(file, kind);
    match asked {
        Some(device) if available.contains(&device) => Ok(vec![device]),
        Some(device) => Err(fail(
            UsageError::DeviceNotFound { device, available }.into(),
        )),
        None if available.is_empty() => Err(fail(memsnap::ErrorKind::NoDevice(
            "no device has trace events (memory history was not recorded)".into(),
        ))),
        None => Ok(available),
    }
}

/// The device a command of one device works on: the one asked for, or the first with events.
fn device(
    snap: &memsnap::snapshot::Snapshot,
    asked: Option<u32>,
    file: &Path,
) -> Result<u32, memsnap::Error> {
    devices(snap, asked, file).map(|d| d[0])
}

/// Runs a parsed command line; returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    if cli.quiet {
        ui::quiet();
    }
    FORCE.store(cli.force, std::sync::atomic::Ordering::Relaxed);
    note_inputs(&cli.command);
    let _ = CAPS.set(memsnap::memory::Caps {
        max_memory: cli.max_memory,
        max_size: cli.max_size,
    });
    memsnap::memory::set_allowance(cli.max_memory);
    exit_code(match cli.command {
        Command::Report(args) => report::run(args),
        Command::Timeline(args) => timeline::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Diff(args) => diff::run(args),
        Command::Whatif(args) => whatif::run_whatif(args),
        Command::Oom(args) => whatif::run_oom(args),
        Command::Flamegraph(args) => flamegraph::run(args),
        Command::Trim(args) => trim::run(args),
        Command::Export(args) => export::run(args),
        Command::View(args) => view::run(args),
        Command::Mcp(args) => mcp::run(args),
        Command::Completions { shell } => completions(shell),
    })
}

/// A command line clap refused: help and version as clap prints them, anything else as one
/// line (clap's first line, and where the options are listed) with exit code 2.
pub fn command_line_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind as K;
    if matches!(
        e.kind(),
        K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
    }
    // `args_os`: `args` panics on a name that is not UTF-8.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    note!(
        "memsnap: {}",
        one_line_usage(&e.render().to_string(), &args)
    );
    ExitCode::from(EXIT_USAGE)
}

/// `memsnap report` when `args` name that command, else `memsnap`.
fn command_of(args: &[String]) -> String {
    use clap::CommandFactory;
    let cli = Cli::command();
    args.iter()
        .find(|a| cli.get_subcommands().any(|c| c.get_name() == a.as_str()))
        .map_or_else(|| "memsnap".to_string(), |c| format!("memsnap {c}"))
}

/// clap's error text as one line: `unexpected argument '--x' found (memsnap report --help
/// lists the options)`. Its tips are left out: they suggest `-- --x`, which is rarely meant.
pub(crate) fn one_line_usage(text: &str, args: &[String]) -> String {
    // The first paragraph: "error: the following required arguments were not provided:" is
    // followed by the arguments, one per line.
    let first: Vec<&str> = text
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let first = first.join(" ");
    let first = if first.is_empty() {
        "invalid command line"
    } else {
        first.as_str()
    };
    let what = first.strip_prefix("error: ").unwrap_or(first);
    // clap's suggestion for a typo ("tip: a similar subcommand exists: 'report'") is kept
    let tips: String = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tip: "))
        .filter(|t| t.contains("similar"))
        .map(|t| format!("; {t}"))
        .collect();
    let what = format!("{what}{tips}");
    let command = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .map(|usage| {
            usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| command_of(args));
    memsnap::units::printable(&format!("{what} ({command} --help lists the options)"))
}

/// Writes the completion script of `shell` to stdout. The script is built in memory first:
/// clap_complete panics when its writer fails (a closed pipe, a full disk).
fn completions(shell: clap_complete::Shell) -> Result<(), Failure> {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "memsnap", &mut script);
    let mut out = io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(())
}

/// `--force`: existing files with names memsnap chose may be written over.
static FORCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Remembers every file the command line names as an input, so that no output of this run is
/// written over one (`memsnap::output`); files found later (in folders, named by rules) are
/// remembered when they are read.
fn note_inputs(command: &Command) {
    use memsnap::output::note_input;
    let (files, input): (Vec<&Path>, Option<&InputArgs>) = match command {
        Command::Report(a) => (
            a.files.iter().map(|p| p.as_path()).collect(),
            Some(&a.input),
        ),
        Command::Timeline(a) => (vec![a.file.as_path()], Some(&a.input)),
        Command::Compare(a) => (
            a.inputs.iter().map(|p| p.as_path()).collect(),
            Some(&a.input),
        ),
        Command::Diff(a) => {
            if let Some(b) = &a.budget {
                note_input(b);
            }
            (vec![a.base.as_path(), a.new.as_path()], Some(&a.input))
        }
        Command::Whatif(a) => {
            for s in &a.scale {
                if let Ok((path, _)) = whatif::scale_arg(s) {
                    note_input(&path);
                }
            }
            (
                a.files.iter().map(|p| p.as_path()).collect(),
                Some(&a.input),
            )
        }
        Command::Oom(a) => (
            a.files.iter().map(|p| p.as_path()).collect(),
            Some(&a.input),
        ),
        Command::Flamegraph(a) => (vec![a.file.as_path()], Some(&a.input)),
        Command::Export(a) => (
            a.files.iter().map(|p| p.as_path()).collect(),
            Some(&a.input),
        ),
        Command::Trim(a) => (vec![a.file.as_path()], None),
        Command::View(a) => (
            a.inputs.iter().map(|p| p.as_path()).collect(),
            Some(&a.input),
        ),
        Command::Mcp(a) => (Vec::new(), Some(&a.input)),
        Command::Completions { .. } => (Vec::new(), None),
    };
    for f in files {
        note_input(f);
    }
    if let Some(rules) = input.and_then(|i| i.rules.as_deref()) {
        note_input(rules);
    }
}

/// Checks before the work that `path` can be written (see [`memsnap::output::check`]).
fn check_output(path: &Path, naming: memsnap::output::Naming) -> Result<(), memsnap::Error> {
    let force = FORCE.load(std::sync::atomic::Ordering::Relaxed);
    memsnap::output::check(path, naming, force)
        .map(|_| ())
        .map_err(|e| memsnap::Error::new(path, e.into()))
}

/// Starts writing `path` through a temporary file (see [`memsnap::output::create`]).
fn create_output(
    path: &Path,
    naming: memsnap::output::Naming,
) -> Result<memsnap::output::Pending, memsnap::Error> {
    let force = FORCE.load(std::sync::atomic::Ordering::Relaxed);
    memsnap::output::create(path, naming, force).map_err(|e| memsnap::Error::new(path, e.into()))
}

/// Puts a finished output in place; errors name `path`, as the user gave it.
fn commit_output(pending: memsnap::output::Pending, path: &Path) -> Result<(), memsnap::Error> {
    pending
        .commit()
        .map_err(|e| memsnap::Error::new(path, e.into()))
}

/// A write error on `path`, for writers that report `io::Error`.
fn write_failed(path: &Path, e: io::Error) -> memsnap::Error {
    memsnap::Error::new(path, memsnap::output::OutputError::Io(e).into())
}

/// Prints one error line for a file that could not be handled.
fn complain(e: &memsnap::Error) {
    let _ = writeln!(io::stderr(), "memsnap: {e}");
}

/// The memory and size caps of this run (`--max-memory`, `--max-size`).
static CAPS: std::sync::OnceLock<memsnap::memory::Caps> = std::sync::OnceLock::new();

/// Stops work on `file` once the process holds more than `--max-memory`. The decoder checks as
/// it reads; the stages after it (analysis, tables, charts) are checked here at their ends, so
/// a file can pass the cap by at most one stage's growth before it is refused.
fn within_memory(file: &Path) -> Result<(), memsnap::Error> {
    memsnap::memory::check(0)
        .map_err(|max| memsnap::Error::new(file, memsnap::ErrorKind::MemoryLimit(max)))
}

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

/// Standard output, buffered and escaped for what is written to it ([`memsnap::escape`]): JSON
/// when `json`, else terminal text. Every command writes its stdout through here, so that no
/// control character of a snapshot's strings reaches the terminal whatever view printed it.
fn stdout(json: bool) -> Stdout {
    let out = io::BufWriter::new(io::stdout().lock());
    if json {
        memsnap::escape::Stream::json(out)
    } else {
        memsnap::escape::Stream::terminal(out)
    }
}

/// What [`stdout`] gives.
type Stdout = memsnap::escape::Stream<io::BufWriter<io::StdoutLock<'static>>>;

/// A path as notes print it: control characters escaped.
fn shown(path: &Path) -> String {
    memsnap::units::printable(&path.display().to_string())
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

/// A `--device` value: a CUDA device number, or `host` for pinned host memory.
pub(crate) fn parse_device(s: &str) -> Result<u32, String> {
    if s.eq_ignore_ascii_case("host") {
        return Ok(memsnap::snapshot::HOST_DEVICE);
    }
    s.parse::<u32>()
        .map_err(|_| format!("'{s}' is no device: a number, or 'host' for pinned host memory"))
}

/// How a device is named in a file name: `device1`, or `host` for pinned host memory.
pub(crate) fn device_slug(device: u32) -> String {
    if device == memsnap::snapshot::HOST_DEVICE {
        "host".to_string()
    } else {
        format!("device{device}")
    }
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
    fn command_line_errors_are_one_line() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let given = ["memsnap", "report", "a.pickle", "--colour", "1"];
        let e = Cli::try_parse_from(given).unwrap_err();
        let line = one_line_usage(&e.render().to_string(), &args(&given[1..]));
        assert_eq!(
            line,
            "unexpected argument '--colour' found (memsnap report --help lists the options)"
        );
        // clap's usage line names the options given; the command is the words before them
        let given = ["memsnap", "report", "--source-root", "x"];
        let e = Cli::try_parse_from(given).unwrap_err();
        let line = one_line_usage(&e.render().to_string(), &args(&given[1..]));
        assert!(
            line.ends_with("(memsnap report --help lists the options)"),
            "{line}"
        );
        let given = ["memsnap", "timeline", "a", "-o", "t.png", "--by", "x"];
        let e = Cli::try_parse_from(given).unwrap_err();
        let line = one_line_usage(&e.render().to_string(), &args(&given[1..]));
        assert!(
            !line.contains('\n') && line.starts_with("invalid value 'x'"),
            "{line}"
        );
        assert!(
            line.ends_with("(memsnap timeline --help lists the options)"),
            "{line}"
        );
        let given = ["memsnap", "report"];
        let e = Cli::try_parse_from(given).unwrap_err();
        let line = one_line_usage(&e.render().to_string(), &args(&given[1..]));
        assert!(line.contains("not provided: <FILES>..."), "{line}");
        assert!(
            line.ends_with("(memsnap report --help lists the options)"),
            "{line}"
        );
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

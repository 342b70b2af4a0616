//! Command-line arguments (clap) and one function per command. Arguments are turned into
//! library options here, once; the library never sees clap.

mod compare;
mod report;
mod timeline;

use std::io::{self, Write};

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use memsnap::replay::SizeModel;

/// Explains PyTorch CUDA memory snapshots: where every byte of GPU memory went.
#[derive(Debug, Parser)]
#[command(name = "memsnap", version, about, long_about = None)]
pub struct Cli {
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
    /// The attribution options these arguments ask for; when they cannot be had (a rules file
    /// that cannot be read or parsed), says why on stderr and gives the usage exit code.
    pub fn attribution(&self) -> Result<memsnap::attribute::Options, ExitCode> {
        self.attribution_options().map_err(|e| {
            complain(&e);
            ExitCode::from(2)
        })
    }

    fn attribution_options(&self) -> Result<memsnap::attribute::Options, memsnap::Error> {
        let rules = match &self.rules {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| memsnap::Error::new(path, memsnap::ErrorKind::Io(e)))?;
                Some(
                    memsnap::attribute::rules::RuleSet::parse(&text)
                        .map_err(|e| memsnap::Error::new(path, memsnap::ErrorKind::Usage(e)))?,
                )
            }
            None => None,
        };
        Ok(memsnap::attribute::Options {
            source_roots: self.source_root.clone(),
            preset: match self.preset {
                PresetArg::Auto => None,
                PresetArg::Pithtrain => Some(memsnap::attribute::Preset::Pithtrain),
                PresetArg::Generic => Some(memsnap::attribute::Preset::Generic),
            },
            rules,
        })
    }
}

/// Runs a parsed command line; returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Report(args) => report::run(args),
        Command::Timeline(args) => timeline::run(args),
        Command::Compare(args) => compare::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(io::stderr(), "memsnap: {e}");
            ExitCode::from(1)
        }
    }
}

/// Prints one error line for a file that could not be handled.
fn complain(e: &memsnap::Error) {
    let _ = writeln!(io::stderr(), "memsnap: {e}");
}

/// Reads every snapshot file given, with a progress bar for large ones.
fn load(path: &std::path::Path) -> Result<memsnap::snapshot::Snapshot, memsnap::Error> {
    let progress = memsnap::ui::LoadProgress::new(path);
    let options = memsnap::snapshot::LoadOptions {
        on_progress: progress.callback(),
        ..Default::default()
    };
    memsnap::snapshot::load(path, &options)
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
        assert_eq!(o.by, memsnap::report::breakdown::Dimension::Step);
        assert_eq!(o.x, memsnap::chart::XAxis::Events);
        assert!(
            Cli::try_parse_from(["memsnap", "timeline", "a", "-o", "t.png", "--by", "x"]).is_err()
        );
    }
}

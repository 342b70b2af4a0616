//! `memsnap flamegraph FILE`: the memory live at one moment as a flamegraph.

use std::io::Write;
use std::path::PathBuf;

use memsnap::chart::flamegraph::{self, Moment, Root};
use memsnap::output::Naming;
use memsnap::units;

use memsnap::error::UsageError;

use super::{load, Failure, InputArgs};

/// The level above the frames (`--root`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RootArg {
    /// Pipeline step (or phase), op and micro-batch.
    Step,
    /// Layer stage or module path.
    Stage,
    /// Memory category.
    Category,
    /// None.
    None,
}

/// Arguments of `memsnap flamegraph`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  memsnap flamegraph rank0.pickle.xz -o flame.svg --at peak --root step"
)]
pub struct FlamegraphArgs {
    /// Snapshot file (`-` reads standard input).
    pub file: PathBuf,
    /// Output SVG (default: flamegraph.svg, which is not written over without --force);
    /// ignored with --folded.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The moment: peak, end, #EVENT or SECONDS s (from the first event), e.g. 3.2s.
    #[arg(long, default_value = "peak", value_parser = parse_moment)]
    pub at: Moment,
    /// Print the folded stacks (`frames BYTES` per line) to stdout instead of drawing.
    #[arg(long)]
    pub folded: bool,
    /// The level above the program's frames.
    #[arg(long, value_enum, default_value_t = RootArg::Step)]
    pub root: RootArg,
    /// Device (default: the first with events).
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    #[command(flatten)]
    pub input: InputArgs,
}

fn parse_moment(s: &str) -> Result<Moment, String> {
    Moment::parse(s).ok_or_else(|| format!("{s:?}: use peak, end, #EVENT or SECONDS s (e.g. 3.2s)"))
}

pub fn run(args: FlamegraphArgs) -> Result<(), Failure> {
    let (output, naming) = match &args.output {
        Some(path) => (path.clone(), Naming::Named),
        None => (PathBuf::from("flamegraph.svg"), Naming::Chosen),
    };
    let fail = |e| memsnap::Error::new(&output, memsnap::ErrorKind::Chart(e));
    if !args.folded && output.extension().and_then(|e| e.to_str()) != Some("svg") {
        return Err(memsnap::Error::new(
            &output,
            UsageError::OutputKind {
                wants: "an SVG: give a file ending in .svg, or --folded",
            }
            .into(),
        )
        .into());
    }
    if !args.folded {
        super::check_output(&output, naming)?;
    }
    let options = args.input.analysis()?;
    let snap = load(&args.file)?;
    let device = super::device(&snap, args.device, &args.file)?;
    let a = memsnap::analysis::analyse_device(&snap, device, &options);
    super::within_memory(&args.file)?;
    let at = args.at.event(&a).map_err(|m| {
        memsnap::Error::new(&args.file, UsageError::Moment(format!("--at: {m}")).into())
    })?;
    let root = match args.root {
        RootArg::Step => Root::Step,
        RootArg::Stage => Root::Stage,
        RootArg::Category => Root::Category,
        RootArg::None => Root::None,
    };
    let lines = flamegraph::folded(&a, at, root);
    if args.folded {
        let mut out = super::stdout(false);
        flamegraph::write_folded(&mut out, &lines)?;
        out.flush()?;
        return Ok(());
    }
    let total: u64 = lines.iter().map(|l| l.1).sum();
    let moment = match (args.at, at) {
        (Moment::Peak, _) => "at the peak".to_string(),
        (_, None) => "before the first event".to_string(),
        (_, Some(i)) => format!("after event {}", units::count(i as u64)),
    };
    let name = args
        .file
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let title = format!(
        "{name} · {} · {moment} · {} allocated",
        memsnap::snapshot::device_name(device),
        units::bytes(total)
    );
    let mut pending = super::create_output(&output, naming)?;
    flamegraph::write_svg(pending.file(), &lines, &title).map_err(fail)?;
    super::commit_output(pending, &output)?;
    note!("memsnap: wrote {}", super::shown(&output));
    Ok(())
}

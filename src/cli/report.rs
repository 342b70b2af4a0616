//! `memsnap report FILE...`

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use memsnap::report::breakdown::Dimension;
use memsnap::report::{self, FileReport};

use super::{complain, load, InputArgs};

/// Arguments of `memsnap report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Snapshot files (.pickle, optionally .gz, .xz or .zst).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// One JSON object per file instead of text (schema in the README).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
    /// Peak breakdowns to show: category, step, op, stage, site, phase, annotation
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "category,step,stage", value_parser = parse_dimension)]
    pub by: Vec<Dimension>,
    /// Rows per table.
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    /// Also draw a timeline chart of each device into this folder (PNG).
    #[arg(long, value_name = "DIR")]
    pub png: Option<PathBuf>,
}

pub fn parse_dimension(s: &str) -> Result<Dimension, String> {
    Dimension::parse(s).ok_or_else(|| {
        format!("unknown dimension {s:?}; use category, step, op, stage, site, phase or annotation")
    })
}

pub fn run(args: ReportArgs) -> io::Result<ExitCode> {
    let attribution = match args.input.attribution() {
        Ok(a) => a,
        Err(e) => {
            complain(&e);
            return Ok(ExitCode::from(2));
        }
    };
    let options = report::Options {
        model: args.input.sizes.into(),
        attribution,
        by: args.by.clone(),
        top: args.top,
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut failed = false;
    for path in &args.files {
        let snap = match load(path) {
            Ok(s) => s,
            Err(e) => {
                complain(&e);
                failed = true;
                continue;
            }
        };
        let name = path.display().to_string();
        let rep = FileReport::new(&name, &snap, &options);
        if let Some(dir) = &args.png {
            failed |= !draw_charts(dir, path, &name, &snap, &options);
        }
        if args.json {
            report::json::write(&mut out, &rep)?;
        } else {
            report::text::write(&mut out, &rep)?;
        }
        out.flush()?;
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Draws one timeline per device next to the report; false if one could not be drawn.
fn draw_charts(
    dir: &std::path::Path,
    path: &std::path::Path,
    name: &str,
    snap: &memsnap::snapshot::Snapshot,
    options: &report::Options,
) -> bool {
    if let Err(e) = std::fs::create_dir_all(dir) {
        complain(&memsnap::Error::new(dir, memsnap::ErrorKind::Io(e)));
        return false;
    }
    let stem = path
        .file_name()
        .map_or("snapshot".into(), |n| n.to_string_lossy().into_owned());
    let stem = stem
        .trim_end_matches(".xz")
        .trim_end_matches(".gz")
        .trim_end_matches(".zst")
        .trim_end_matches(".pickle")
        .to_string();
    let chart_options = memsnap::chart::Options::default();
    let mut ok = true;
    for d in snap.devices_with_events() {
        let replay = memsnap::replay::replay(snap, d, options.model);
        let a = memsnap::attribute::attribute(snap, &replay, &options.attribution);
        let out = dir.join(format!("{stem}-device{d}-timeline.png"));
        match memsnap::chart::timeline(&out, name, snap, &replay, &a, &chart_options) {
            Ok(_) => eprintln!("memsnap: wrote {}", out.display()),
            Err(e) => {
                complain(&e);
                ok = false;
            }
        }
    }
    ok
}

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
}

fn parse_dimension(s: &str) -> Result<Dimension, String> {
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

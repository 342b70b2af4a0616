//! `memsnap report FILE...`

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

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
}

pub fn run(args: ReportArgs) -> io::Result<ExitCode> {
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
        let rep = FileReport::new(&name, &snap, args.input.sizes.into());
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

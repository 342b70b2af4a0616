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
        Err(code) => return Ok(code),
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
        let rep = match &args.png {
            Some(dir) => {
                let mut charts = Charts::new(dir, path, &name, &snap);
                let rep =
                    FileReport::with_each_device(&name, &snap, &options, |r, a| charts.draw(r, a));
                failed |= !charts.ok;
                rep
            }
            None => FileReport::new(&name, &snap, &options),
        };
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

/// Timelines drawn next to the report, one per device with events.
struct Charts<'a> {
    dir: &'a std::path::Path,
    stem: String,
    name: &'a str,
    snap: &'a memsnap::snapshot::Snapshot,
    /// Whether the folder exists to draw into.
    ready: bool,
    /// False once a chart (or the folder) could not be written.
    ok: bool,
}

impl<'a> Charts<'a> {
    fn new(
        dir: &'a std::path::Path,
        path: &std::path::Path,
        name: &'a str,
        snap: &'a memsnap::snapshot::Snapshot,
    ) -> Charts<'a> {
        let ready = match std::fs::create_dir_all(dir) {
            Ok(()) => true,
            Err(e) => {
                complain(&memsnap::Error::new(dir, memsnap::ErrorKind::Io(e)));
                false
            }
        };
        let stem = path
            .file_name()
            .map_or("snapshot".into(), |n| n.to_string_lossy().into_owned());
        let stem = stem
            .trim_end_matches(".xz")
            .trim_end_matches(".gz")
            .trim_end_matches(".zst")
            .trim_end_matches(".pickle")
            .to_string();
        Charts {
            dir,
            stem,
            name,
            snap,
            ready,
            ok: ready,
        }
    }

    fn draw(&mut self, replay: &memsnap::replay::Replay, a: &memsnap::attribute::Attribution) {
        if !self.ready || replay.is_empty() {
            return;
        }
        let out = self.dir.join(format!(
            "{}-device{}-timeline.png",
            self.stem, replay.device
        ));
        let options = memsnap::chart::Options::default();
        match memsnap::chart::timeline(&out, self.name, self.snap, replay, a, &options) {
            Ok(_) => eprintln!("memsnap: wrote {}", out.display()),
            Err(e) => {
                complain(&e);
                self.ok = false;
            }
        }
    }
}

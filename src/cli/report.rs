//! `memsnap report FILE...`

use memsnap::output::Naming;
use std::io::Write;
use std::path::{Path, PathBuf};

use memsnap::analysis::{self, DeviceAnalysis, Dimension};
use memsnap::report::{self, text::TextOptions, FileReport};

use memsnap::error::UsageError;

use super::{load, parse_dimension, stem, Failure, InputArgs, Tally};

/// Arguments of `memsnap report`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  memsnap report rank0.pickle.xz --by op,site --top 12")]
pub struct ReportArgs {
    /// Snapshot files (.pickle, optionally .gz, .xz or .zst; `-` reads standard input).
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
    /// GitHub-flavoured Markdown: the headline figures as a list, then the tables, ready to
    /// paste into a pull request.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Only this device (default: every device with trace events, or with segments when none
    /// has events).
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    /// Also draw a timeline chart of each device into this folder (PNG; created if needed).
    #[arg(long, value_name = "DIR")]
    pub png: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> Result<(), Failure> {
    let options = args.input.analysis()?;
    if let Some(dir) = &args.png {
        prepare_folder(dir)?;
    }
    let text = TextOptions {
        by: args.by.clone(),
        top: args.top,
        markdown: args.markdown,
    };
    let mut out = super::stdout(args.json);
    let mut tally = Tally::default();
    for (k, path) in args.files.iter().enumerate() {
        let snap = match load(path) {
            Ok(s) => s,
            Err(e) => {
                tally.complain(&e);
                continue;
            }
        };
        let name = path.display().to_string();
        let devices = match args.device {
            None => analysis::analyse(&snap, &options),
            Some(_) => match super::choose_devices(analysis::devices(&snap), args.device, path) {
                Ok(chosen) => chosen
                    .into_iter()
                    .map(|d| analysis::analyse_device(&snap, d, &options))
                    .collect(),
                Err(e) => {
                    tally.complain(&e);
                    continue;
                }
            },
        };
        if let Err(e) = super::within_memory(path) {
            tally.complain(&e);
            continue;
        }
        if devices.is_empty() {
            // nothing recorded: an error, as every command says it
            tally.complain(&memsnap::Error::new(
                path,
                memsnap::ErrorKind::NoDevice(
                    "no device has trace events or segments (nothing was recorded)".into(),
                ),
            ));
            continue;
        }
        let mut rep = FileReport::new(&name, &snap, &devices);
        match memsnap::snapshot::probes::read(path) {
            Ok(Some((_, probes))) => rep.probes = probes,
            Ok(None) => {}
            Err(why) => note!(
                "memsnap: {}: probes beside it left out: {why}",
                super::shown(path)
            ),
        }
        // the charts' names are checked before the report is printed: a refused one leaves
        // nothing on stdout
        if let Some(dir) = &args.png {
            let refused = devices
                .iter()
                .filter(|d| !d.replay.is_empty())
                .find_map(|d| super::check_output(&chart_path(dir, path, d), Naming::Chosen).err());
            if let Some(e) = refused {
                tally.complain(&e);
                continue;
            }
        }
        if args.json {
            report::json::write(&mut out, &rep)?;
        } else {
            report::text::write(&mut out, &rep, &text)?;
        }
        out.flush()?;
        if let Some(dir) = &args.png {
            for d in devices.iter().filter(|d| !d.replay.is_empty()) {
                if let Err(e) = draw(dir, path, &name, d) {
                    tally.complain(&e);
                }
            }
        }
        if k + 1 == args.files.len() {
            super::keep_to_exit(devices);
            super::keep_to_exit(snap);
        }
    }
    tally.finish()
}

/// Creates the chart folder, or says why it cannot be used.
fn prepare_folder(dir: &Path) -> Result<(), memsnap::Error> {
    if dir.exists() && !dir.is_dir() {
        return Err(memsnap::Error::new(
            dir,
            UsageError::NotAFolder { option: "--png" }.into(),
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| memsnap::Error::new(dir, UsageError::CreateFolder(e).into()))
}

/// The name of one device's timeline chart in `dir`.
fn chart_path(dir: &Path, path: &Path, d: &DeviceAnalysis) -> PathBuf {
    dir.join(format!(
        "{}-{}-timeline.png",
        stem(path),
        super::device_slug(d.device())
    ))
}

/// Draws one device's timeline next to the report.
fn draw(dir: &Path, path: &Path, name: &str, d: &DeviceAnalysis) -> Result<(), memsnap::Error> {
    let out = chart_path(dir, path, d);
    super::timeline::draw_to(&out, Naming::Chosen, |at| {
        memsnap::chart::timeline(at, name, d, &memsnap::chart::Options::default())
    })?;
    note!("memsnap: wrote {}", super::shown(&out));
    Ok(())
}

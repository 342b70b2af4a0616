//! `memsnap timeline FILE -o timeline.png`

use std::path::{Path, PathBuf};

use memsnap::analysis::Dimension;
use memsnap::chart::{self, XAxis};
use memsnap::output::Naming;

use super::{load, parse_dimension, Failure, InputArgs};

/// Horizontal axis (`--x`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XArg {
    /// Seconds, or the event index when one idle stretch is most of the trace's time.
    Auto,
    /// Seconds from the first event.
    Time,
    /// Event index.
    Events,
}

/// Arguments of `memsnap timeline`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  memsnap timeline rank0.pickle.xz -o steps.png --by step")]
pub struct TimelineArgs {
    /// Snapshot file (`-` reads standard input).
    pub file: PathBuf,
    /// Output image: .png or .svg. With several devices, one image each:
    /// `timeline.png` becomes `timeline-device0.png`, `timeline-device1.png`, ...
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// What the stacked area is grouped by: category, step, op, stage, site, phase, annotation.
    #[arg(long, default_value = "category", value_parser = parse_dimension)]
    pub by: Dimension,
    /// Horizontal axis.
    #[arg(long = "x", value_enum, default_value_t = XArg::Auto)]
    pub x: XArg,
    /// Image width in pixels (at least 600).
    #[arg(long, default_value_t = 1600)]
    pub width: u32,
    /// Image height in pixels (at least 400).
    #[arg(long, default_value_t = 900)]
    pub height: u32,
    /// Chart title (default: file, device and pipeline rank).
    #[arg(long)]
    pub title: Option<String>,
    /// Device to draw (default: every device with events, one image each).
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    #[command(flatten)]
    pub input: InputArgs,
}

impl TimelineArgs {
    /// The chart options these arguments ask for.
    pub fn chart_options(&self) -> chart::Options {
        chart::Options {
            by: self.by,
            x: match self.x {
                XArg::Auto => XAxis::Auto,
                XArg::Time => XAxis::Time,
                XArg::Events => XAxis::Events,
            },
            width: self.width,
            height: self.height,
            title: self.title.clone(),
            ..chart::Options::default()
        }
    }
}

/// `out` for one of several devices: `timeline.png` -> `timeline-device1.png`.
pub fn per_device(out: &Path, device: u32, several: bool) -> PathBuf {
    if !several {
        return out.to_path_buf();
    }
    // the name's own bytes, whether or not they are UTF-8
    let mut name = out
        .file_stem()
        .map_or_else(|| "timeline".into(), |s| s.to_os_string());
    name.push(format!("-{}.", super::device_slug(device)));
    name.push(out.extension().unwrap_or("png".as_ref()));
    out.with_file_name(name)
}

pub fn run(args: TimelineArgs) -> Result<(), Failure> {
    let fail = |e| memsnap::Error::new(&args.output, memsnap::ErrorKind::Chart(e));
    chart::check_output(&args.output).map_err(fail)?;
    let options = args.chart_options();
    options.check_size().map_err(fail)?;
    let analysis_options = args.input.analysis()?;
    let snap = load(&args.file)?;
    let devices = super::devices(&snap, args.device, &args.file)?;
    let name = args.file.display().to_string();
    let several = devices.len() > 1;
    // Names memsnap made up are checked before anything is drawn.
    let naming = if several {
        Naming::Chosen
    } else {
        Naming::Named
    };
    for &d in &devices {
        super::check_output(&per_device(&args.output, d, several), naming)?;
    }
    for &d in &devices {
        let analysis = memsnap::analysis::analyse_device(&snap, d, &analysis_options);
        super::within_memory(&args.file)?;
        let out = per_device(&args.output, d, several);
        draw_to(&out, naming, |at| {
            chart::timeline(at, &name, &analysis, &options)
        })?;
        note!("memsnap: wrote {}", super::shown(&out));
    }
    Ok(())
}

/// Draws a chart through a temporary file that becomes `out` once complete; errors name `out`.
pub fn draw_to<T>(
    out: &Path,
    naming: Naming,
    draw: impl FnOnce(&Path) -> Result<T, chart::ChartError>,
) -> Result<T, memsnap::Error> {
    let pending = super::create_output(out, naming)?;
    // the error names the output, not the temporary file drawn into
    let drawn =
        draw(pending.path()).map_err(|e| memsnap::Error::new(out, memsnap::ErrorKind::Chart(e)))?;
    super::commit_output(pending, out)?;
    Ok(drawn)
}

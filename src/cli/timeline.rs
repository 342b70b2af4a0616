//! `memsnap timeline FILE -o timeline.png`

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memsnap::chart::{self, XAxis};
use memsnap::report::breakdown::Dimension;

use super::{complain, load, InputArgs};

/// Horizontal axis (`--x`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XArg {
    /// Seconds from the first event.
    Time,
    /// Event index.
    Events,
}

/// Arguments of `memsnap timeline`.
#[derive(Debug, clap::Args)]
pub struct TimelineArgs {
    /// Snapshot file.
    pub file: PathBuf,
    /// Output image: .png or .svg.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// What the stacked area is grouped by: category, step, op, stage, site, phase, annotation.
    #[arg(long, default_value = "category", value_parser = super::report::parse_dimension)]
    pub by: Dimension,
    /// Horizontal axis.
    #[arg(long = "x", value_enum, default_value_t = XArg::Time)]
    pub x: XArg,
    /// Image width in pixels.
    #[arg(long, default_value_t = 1600)]
    pub width: u32,
    /// Image height in pixels.
    #[arg(long, default_value_t = 900)]
    pub height: u32,
    /// Chart title (default: file, device and pipeline rank).
    #[arg(long)]
    pub title: Option<String>,
    /// Device to draw (default: every device with events, one image each).
    #[arg(long)]
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
    let stem = out
        .file_stem()
        .map_or("timeline".into(), |s| s.to_string_lossy().into_owned());
    let ext = out
        .extension()
        .map_or("png".into(), |e| e.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}-device{device}.{ext}"))
}

pub fn run(args: TimelineArgs) -> std::io::Result<ExitCode> {
    if chart::Format::of(&args.output).is_none() {
        complain(&memsnap::Error::new(
            &args.output,
            memsnap::ErrorKind::Usage("the output must end in .png or .svg".into()),
        ));
        return Ok(ExitCode::from(2));
    }
    let attribution = match args.input.attribution() {
        Ok(a) => a,
        Err(code) => return Ok(code),
    };
    let snap = match load(&args.file) {
        Ok(s) => s,
        Err(e) => {
            complain(&e);
            return Ok(ExitCode::from(1));
        }
    };
    let mut devices: Vec<u32> = snap.devices_with_events().collect();
    if let Some(d) = args.device {
        if !devices.contains(&d) {
            complain(&memsnap::Error::new(
                &args.file,
                memsnap::ErrorKind::Usage(format!(
                    "device {d} has no events (devices with events: {devices:?})"
                )),
            ));
            return Ok(ExitCode::from(2));
        }
        devices = vec![d];
    }
    if devices.is_empty() {
        complain(&memsnap::Error::new(
            &args.file,
            memsnap::ErrorKind::Usage("no device has trace events to draw".into()),
        ));
        return Ok(ExitCode::from(1));
    }
    let options = args.chart_options();
    let name = args.file.display().to_string();
    for &d in &devices {
        let replay = memsnap::replay::replay(&snap, d, args.input.sizes.into());
        let a = memsnap::attribute::attribute(&snap, &replay, &attribution);
        let out = per_device(&args.output, d, devices.len() > 1);
        if let Err(e) = chart::timeline(&out, &name, &snap, &replay, &a, &options) {
            complain(&e);
            return Ok(ExitCode::from(1));
        }
        eprintln!("memsnap: wrote {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

//! `memsnap whatif FILE` and `memsnap oom FILE`: the allocator simulated under other settings.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use memsnap::analysis::{self, DeviceAnalysis};
use memsnap::report::oom::{self, DeviceOom, OomOptions, OomReport};
use memsnap::report::whatif::{
    self, DeviceWhatIf, ScaleReport, ScaleSample, WhatIfOptions, WhatIfReport,
};
use memsnap::report::{json, text};
use memsnap::simulate::scale::ScaleError;
use memsnap::simulate::{parse_size, AllocConf};

use memsnap::error::UsageError;

use super::{load, Failure, InputArgs, Tally};

/// The memory limit and device options shared by `whatif` and `oom`.
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// Per-process memory cap to simulate, e.g. `9.04GiB`, `9000MiB` or bytes
    /// (`torch.cuda.set_per_process_memory_fraction` times the device's memory).
    #[arg(long, value_name = "SIZE", conflicts_with = "cap_fraction")]
    pub cap: Option<String>,
    /// The cap as a fraction of the device's memory (needs --device-total).
    #[arg(long, value_name = "F", requires = "device_total")]
    pub cap_fraction: Option<f64>,
    /// The device's total memory (the snapshot does not record it), e.g. `139.80GiB`.
    #[arg(long, value_name = "SIZE")]
    pub device_total: Option<String>,
    /// The settings the snapshot was recorded with, when it has no `allocator_settings`
    /// (torch before 2.3).
    #[arg(long, value_name = "CONF")]
    pub recorded_conf: Option<String>,
    /// Only this device.
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    /// JSON instead of text (schema in the README).
    #[arg(long)]
    pub json: bool,
}

/// The figures of `LimitArgs`: the device, cap, device total, recorded settings.
struct Limits {
    device: Option<u32>,
    cap: Option<u64>,
    device_total: Option<u64>,
    recorded_conf: Option<AllocConf>,
}

impl LimitArgs {
    fn limits(&self) -> Result<Limits, Failure> {
        let size = |flag: &'static str, text: &str| {
            parse_size(text).ok_or_else(|| {
                Failure::Usage(UsageError::BadValue {
                    option: flag,
                    value: text.to_string(),
                    reason: "not a size (use bytes, or a number with KiB, MiB, GiB)".into(),
                })
            })
        };
        let device_total = match &self.device_total {
            Some(t) => Some(size("--device-total", t)?),
            None => None,
        };
        let cap = match (&self.cap, self.cap_fraction, device_total) {
            (Some(c), _, _) => Some(size("--cap", c)?),
            (None, Some(f), Some(total)) => {
                if !(0.0..=1.0).contains(&f) {
                    return Err(Failure::Usage(UsageError::BadValue {
                        option: "--cap-fraction",
                        value: f.to_string(),
                        reason: "a fraction from 0 to 1".into(),
                    }));
                }
                // as PyTorch: (size_t)(fraction * total), and 1.0 means no cap
                (f < 1.0).then_some((f * total as f64) as u64)
            }
            _ => None,
        };
        let recorded_conf = match &self.recorded_conf {
            Some(s) => Some(parse_conf("--recorded-conf", s)?),
            None => None,
        };
        Ok(Limits {
            cap,
            device: self.device,
            device_total,
            recorded_conf,
        })
    }
}

/// The most settings strings one run simulates (`--alloc-conf` and each `--try`).
const MAX_CONFS: usize = 64;
/// The longest settings string read (real ones are a few dozen bytes).
const MAX_CONF_BYTES: usize = 4096;

fn parse_conf(flag: &'static str, text: &str) -> Result<AllocConf, Failure> {
    if text.len() > MAX_CONF_BYTES {
        return Err(Failure::Usage(UsageError::BadValue {
            option: flag,
            value: format!("{}…", text.chars().take(40).collect::<String>()),
            reason: format!(
                "a settings string of {} is not read (at most {})",
                memsnap::units::bytes(text.len() as u64),
                memsnap::units::bytes(MAX_CONF_BYTES as u64)
            ),
        }));
    }
    AllocConf::parse(text).map_err(|e| {
        Failure::Usage(UsageError::BadValue {
            option: flag,
            value: text.to_string(),
            reason: e.to_string(),
        })
    })
}

/// Arguments of `memsnap whatif`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap whatif rank0.pickle.xz --cap 9.04GiB --try expandable_segments:True --try max_split_size_mb:256 --min-cap\n  memsnap whatif --scale b16.pickle.xz=16 b32.pickle.xz=32 --to 64 128 --cap 40GiB"
)]
pub struct WhatIfArgs {
    /// Snapshot files (`-` reads standard input).
    #[arg(required_unless_present = "scale", conflicts_with = "scale")]
    pub files: Vec<PathBuf>,
    /// Snapshots of one program at other sizes, each FILE=SIZE (the one size that differs:
    /// batch, sequence length, micro-batches); predicts the program at the sizes of --to.
    #[arg(long, num_args = 1.., value_name = "FILE=SIZE", requires = "to")]
    pub scale: Vec<String>,
    /// The sizes to predict with --scale.
    #[arg(long, num_args = 1.., value_name = "SIZE", requires = "scale")]
    pub to: Vec<u64>,
    /// Markdown instead of text (a pull-request comment).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Allocator settings to simulate (a PYTORCH_CUDA_ALLOC_CONF string); default: the
    /// recorded ones.
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// More settings to simulate, one row each (repeatable).
    #[arg(long = "try", value_name = "CONF")]
    pub tries: Vec<String>,
    /// Also find, by bisection, the smallest cap under which the recorded work fits.
    #[arg(long)]
    pub min_cap: bool,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub input: InputArgs,
}

/// Arguments of `memsnap oom`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  memsnap oom memory_snapshot_rank0_oom.pickle.xz --device-total 139.80GiB"
)]
pub struct OomArgs {
    /// Snapshot files (`-` reads standard input).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Rows per table.
    #[arg(long, default_value_t = 6)]
    pub top: usize,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub input: InputArgs,
}

/// The devices of a file to simulate: those with events, or the one asked for. A file recorded
/// with `backend:cudaMallocAsync` is refused unless `--recorded-conf` says otherwise: CUDA's own
/// allocator keeps no segments to replay, and a "reproduced" run would be a false claim.
fn devices<'s>(
    snap: &'s memsnap::snapshot::Snapshot,
    path: &Path,
    limits: &Limits,
    options: &analysis::Options,
) -> Result<Vec<DeviceAnalysis<'s>>, memsnap::Error> {
    let device = limits.device;
    if limits.recorded_conf.is_none() && snap.settings.as_ref().is_some_and(|s| s.async_backend()) {
        return Err(memsnap::Error::new(
            path,
            memsnap::ErrorKind::Unsupported(
                "recorded with backend:cudaMallocAsync, CUDA's own allocator, which has no \
                 caching-allocator segments to simulate (--recorded-conf names the settings to \
                 assume instead)"
                    .into(),
            ),
        ));
    }
    let host = memsnap::snapshot::HOST_DEVICE;
    if device == Some(host) {
        return Err(memsnap::Error::new(
            path,
            memsnap::ErrorKind::Unsupported(
                "host (pinned) memory comes from the pinned host allocator, not the CUDA \
                 caching allocator that whatif and oom simulate"
                    .into(),
            ),
        ));
    }
    let devices = match device {
        Some(_) => super::devices(snap, device, path)?,
        // pinned host memory is another allocator's, not simulated; a file without events has
        // nothing to simulate, an error as for every command that needs them
        None => super::choose_devices(
            snap.devices_with_events().filter(|&d| d != host).collect(),
            None,
            path,
        )?,
    };
    let analyses = devices
        .into_iter()
        .map(|d| analysis::analyse_device(snap, d, options))
        .collect();
    super::within_memory(path)?;
    Ok(analyses)
}

/// Builds one result per file and writes it, as JSON or text; a file that cannot be read
/// gets its one error line and the others go on.
fn each_file<R>(
    files: &[PathBuf],
    json: bool,
    build: impl Fn(&Path, &memsnap::snapshot::Snapshot) -> Result<R, memsnap::Error>,
    write: impl Fn(&mut dyn Write, &R) -> io::Result<()>,
) -> Result<(), Failure> {
    let mut out = super::stdout(json);
    let mut tally = Tally::default();
    for path in files {
        match load(path).and_then(|snap| build(path, &snap)) {
            Ok(r) => write(&mut out, &r)?,
            Err(e) => tally.complain(&e),
        }
        out.flush()?;
    }
    tally.finish()
}

pub fn run_whatif(args: WhatIfArgs) -> Result<(), Failure> {
    if !args.scale.is_empty() {
        return run_scale(args);
    }
    let limits = args.limits.limits()?;
    let confs = settings(&args)?;
    let options = args.input.analysis()?;
    let build = |path: &Path, snap: &memsnap::snapshot::Snapshot| {
        let analyses = devices(snap, path, &limits, &options)?;
        let devices = analyses
            .iter()
            .map(|a| DeviceWhatIf::new(a, &what_if_options(&args, &limits, &confs, a)))
            .collect();
        Ok(WhatIfReport {
            file: path.display().to_string(),
            devices,
        })
    };
    let json_out = args.limits.json;
    let markdown = args.markdown;
    each_file(&args.files, json_out, build, |out, r| {
        if json_out {
            json::write_whatif(out, r)
        } else {
            text::whatif::write_whatif(out, r, markdown)
        }
    })
}

/// The settings of `--alloc-conf` and each `--try`, in order.
fn settings(args: &WhatIfArgs) -> Result<Vec<AllocConf>, Failure> {
    let asked = args.tries.len() + usize::from(args.alloc_conf.is_some());
    if asked > MAX_CONFS {
        return Err(Failure::Usage(UsageError::TooMany {
            option: "--try",
            given: asked,
            most: MAX_CONFS,
        }));
    }
    let mut confs = Vec::new();
    if let Some(c) = &args.alloc_conf {
        confs.push(parse_conf("--alloc-conf", c)?);
    }
    for t in &args.tries {
        confs.push(parse_conf("--try", t)?);
    }
    Ok(confs)
}

/// What to simulate for the device `a`: the settings given, with the recorded ones first when
/// only `--try` rows were asked for.
fn what_if_options(
    args: &WhatIfArgs,
    limits: &Limits,
    confs: &[AllocConf],
    a: &DeviceAnalysis,
) -> WhatIfOptions {
    let mut confs = confs.to_vec();
    if args.alloc_conf.is_none() && !confs.is_empty() {
        confs.insert(0, whatif::recorded_conf(a, limits.recorded_conf.as_ref()).0);
    }
    WhatIfOptions {
        confs,
        cap: limits.cap,
        device_total: limits.device_total,
        recorded_conf: limits.recorded_conf.clone(),
        min_cap: args.min_cap,
    }
}

/// The most snapshots `--scale` reads.
const MAX_SCALE_FILES: usize = 16;
/// The most sizes `--to` predicts.
const MAX_TARGETS: usize = 64;

/// `FILE=SIZE` of `--scale`, split at the last `=`.
pub fn scale_arg(text: &str) -> Result<(PathBuf, u64), Failure> {
    let bad = |reason: &str| {
        Failure::Usage(UsageError::BadValue {
            option: "--scale",
            value: text.to_string(),
            reason: reason.to_string(),
        })
    };
    let (file, size) = text
        .rsplit_once('=')
        .ok_or_else(|| bad("give each snapshot as FILE=SIZE, e.g. b32.pickle.xz=32"))?;
    let size: u64 = size
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| bad("the size after = is a whole number above 0"))?;
    if file.is_empty() {
        return Err(bad("the file before = is missing"));
    }
    Ok((PathBuf::from(file), size))
}

/// `memsnap whatif --scale`: the program of the snapshots given, predicted at other sizes.
fn run_scale(args: WhatIfArgs) -> Result<(), Failure> {
    let limits = args.limits.limits()?;
    let too_many = |option: &'static str, given: usize, most: usize| {
        Failure::Usage(UsageError::TooMany {
            option,
            given,
            most,
        })
    };
    if args.scale.len() > MAX_SCALE_FILES {
        return Err(too_many("--scale", args.scale.len(), MAX_SCALE_FILES));
    }
    if args.to.len() > MAX_TARGETS {
        return Err(too_many("--to", args.to.len(), MAX_TARGETS));
    }
    if let Some(&zero) = args.to.iter().find(|&&t| t == 0) {
        return Err(Failure::Usage(UsageError::BadValue {
            option: "--to",
            value: zero.to_string(),
            reason: "a size is a whole number above 0".into(),
        }));
    }
    let inputs = args
        .scale
        .iter()
        .map(|s| scale_arg(s))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, (_, size)) in inputs.iter().enumerate() {
        if inputs[..i].iter().any(|(_, s)| s == size) {
            return Err(Failure::Usage(UsageError::BadValue {
                option: "--scale",
                value: args.scale[i].clone(),
                reason: format!("two snapshots at size {size}: each size once"),
            }));
        }
    }
    let confs = settings(&args)?;
    let options = args.input.analysis()?;
    let snaps = inputs
        .iter()
        .map(|(path, _)| load(path))
        .collect::<Result<Vec<_>, _>>()?;
    let mut analyses = Vec::new();
    for ((path, _), snap) in inputs.iter().zip(&snaps) {
        let mut devices = devices(snap, path, &limits, &options)?;
        if devices.is_empty() {
            return Err(Failure::Error(memsnap::Error::new(
                path,
                memsnap::ErrorKind::Unsupported(
                    "no device has trace events (memory history was not recorded)".into(),
                ),
            )));
        }
        analyses.push(devices.swap_remove(0));
    }
    let samples: Vec<ScaleSample> = inputs
        .iter()
        .zip(&analyses)
        .map(|((path, size), a)| ScaleSample {
            file: path.display().to_string(),
            size: *size,
            analysis: a,
        })
        .collect();
    let what = what_if_options(&args, &limits, &confs, &analyses[0]);
    let report = ScaleReport::new(&samples, &args.to, &what).map_err(|e| match e {
        // the memory allowance is a limit of the run, as when a file passes it
        ScaleError::Memory { .. } => Failure::Error(memsnap::Error::new(
            &inputs[0].0,
            memsnap::ErrorKind::Unsupported(e.to_string()),
        )),
        e => Failure::Usage(UsageError::BadValue {
            option: "--scale",
            value: args.scale.join(" "),
            reason: e.to_string(),
        }),
    })?;
    let mut out = super::stdout(args.limits.json);
    if args.limits.json {
        json::write_scale(&mut out, &report)?;
    } else {
        text::whatif::write_scale(&mut out, &report, args.markdown)?;
    }
    out.flush()?;
    Ok(())
}

pub fn run_oom(args: OomArgs) -> Result<(), Failure> {
    let limits = args.limits.limits()?;
    let options = args.input.analysis()?;
    let text_options = text::TextOptions {
        top: args.top,
        ..Default::default()
    };
    let oom_options = OomOptions {
        cap: limits.cap,
        device_total: limits.device_total,
        recorded_conf: limits.recorded_conf.clone(),
    };
    let build = |path: &Path, snap: &memsnap::snapshot::Snapshot| {
        let analyses = devices(snap, path, &limits, &options)?;
        Ok(OomReport {
            file: path.display().to_string(),
            devices: analyses
                .iter()
                .map(|a| DeviceOom {
                    device: a.device(),
                    oom: oom::explain(a, &oom_options),
                })
                .collect(),
        })
    };
    let json_out = args.limits.json;
    each_file(&args.files, json_out, build, |out, r| {
        if json_out {
            json::write_oom(out, r)
        } else {
            text::whatif::write_oom(out, r, &text_options)
        }
    })
}

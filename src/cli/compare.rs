//! `memsnap compare A B` and `memsnap compare DIR | FILES...`

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rayon::prelude::*;

use memsnap::chart;
use memsnap::report::compare::{self, Pair, Profile, Ranks};
use memsnap::report::{self, DeviceReport};

use super::{complain, InputArgs};

/// Arguments of `memsnap compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Two snapshot files to compare side by side; or a folder of snapshots, or three or more
    /// files, for one row per rank.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also draw the timelines as panels sharing one y axis (PNG or SVG).
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Rows per table.
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    #[command(flatten)]
    pub input: InputArgs,
}

fn is_snapshot_name(p: &Path) -> bool {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    name.contains(".pickle") || name.ends_with(".pkl")
}

/// The files to compare: folders are listed (snapshot files only, sorted), files kept.
fn expand(inputs: &[PathBuf]) -> io::Result<(Vec<PathBuf>, bool)> {
    let mut files = Vec::new();
    let mut any_dir = false;
    for input in inputs {
        if input.is_dir() {
            any_dir = true;
            let mut found: Vec<PathBuf> = std::fs::read_dir(input)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && is_snapshot_name(p))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(input.clone());
        }
    }
    Ok((files, any_dir))
}

struct Loaded {
    index: usize,
    profiles: Vec<Profile>,
    panels: Vec<chart::Panel>,
}

fn load_one(
    index: usize,
    path: &Path,
    options: &report::Options,
    chart_options: Option<&chart::Options>,
) -> Result<Loaded, memsnap::Error> {
    let snap = memsnap::snapshot::load(path, &Default::default())?;
    let name = path.display().to_string();
    let rank = compare::rank_from_name(&name);
    let mut profiles = Vec::new();
    let mut panels = Vec::new();
    for d in snap.devices_with_events() {
        let r = memsnap::replay::replay(&snap, d, options.model);
        let a = memsnap::attribute::attribute(&snap, &r, &options.attribution);
        profiles.push(Profile {
            file: name.clone(),
            rank,
            report: DeviceReport::new(&snap, &r, &a, options),
        });
        if let Some(co) = chart_options {
            let file = path
                .file_name()
                .map_or(name.clone(), |n| n.to_string_lossy().into_owned());
            let title = match rank {
                Some(k) => format!("rank {k} · {file} · device {d}"),
                None => format!("{file} · device {d}"),
            };
            panels.push(chart::panel(&snap, &r, &a, co, &title, 500));
        }
    }
    if profiles.is_empty() {
        return Err(memsnap::Error::new(
            path,
            memsnap::ErrorKind::Usage("no device has trace events to compare".into()),
        ));
    }
    Ok(Loaded {
        index,
        profiles,
        panels,
    })
}

pub fn run(args: CompareArgs) -> io::Result<ExitCode> {
    let attribution = match args.input.attribution() {
        Ok(a) => a,
        Err(code) => return Ok(code),
    };
    let (files, any_dir) = expand(&args.inputs)?;
    if files.is_empty() {
        complain(&memsnap::Error::new(
            &args.inputs[0],
            memsnap::ErrorKind::Usage("no snapshot files (.pickle, .pickle.xz, ...) found".into()),
        ));
        return Ok(ExitCode::from(2));
    }
    let pair_mode = files.len() == 2 && !any_dir;
    if files.len() == 1 && !any_dir {
        complain(&memsnap::Error::new(
            &files[0],
            memsnap::ErrorKind::Usage("give two files, or a folder, to compare".into()),
        ));
        return Ok(ExitCode::from(2));
    }
    let options = report::Options {
        model: args.input.sizes.into(),
        attribution,
        top: args.top.max(100),
        ..report::Options::default()
    };
    let chart_options = args.png.as_ref().map(|_| chart::Options::default());
    let progress = memsnap::ui::FilesProgress::new(files.len() as u64);
    let results: Vec<Result<Loaded, (usize, memsnap::Error)>> = files
        .par_iter()
        .enumerate()
        .map(|(i, f)| {
            let r = load_one(i, f, &options, chart_options.as_ref()).map_err(|e| (i, e));
            progress.done_one();
            r
        })
        .collect();
    drop(progress);
    let mut loaded = Vec::new();
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(l) => loaded.push(l),
            Err((i, e)) => {
                complain(&e);
                failures.push((i, e.file.display().to_string(), e.kind.to_string()));
            }
        }
    }
    loaded.sort_by_key(|l| l.index);
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut panels: Vec<chart::Panel> = Vec::new();
    if pair_mode {
        if !failures.is_empty() {
            return Ok(ExitCode::from(1));
        }
        let a = &loaded[0].profiles[0];
        let b = &loaded[1].profiles[0];
        let pair = Pair::new(a, b);
        if args.json {
            serde_json::to_writer(&mut out, &pair)?;
            writeln!(out)?;
        } else {
            compare::write_pair(&mut out, &pair, args.top)?;
        }
        for l in &mut loaded {
            if let Some(p) = l.panels.drain(..).next() {
                panels.push(p);
            }
        }
    } else {
        let mut profiles = Vec::new();
        for l in &mut loaded {
            for p in l.profiles.drain(..) {
                profiles.push((l.index, p));
            }
            panels.append(&mut l.panels);
        }
        let ranks = Ranks::new(profiles, failures.clone());
        if args.json {
            serde_json::to_writer(&mut out, &ranks)?;
            writeln!(out)?;
        } else {
            compare::write_ranks(&mut out, &ranks, args.top)?;
        }
        // panels by rank, as the table
        panels.sort_by_key(|p| {
            compare::rank_from_name(&p.title.replace(' ', "")).unwrap_or(u32::MAX)
        });
    }
    out.flush()?;
    if let (Some(png), Some(co)) = (&args.png, &chart_options) {
        let title = if pair_mode {
            "comparison".to_string()
        } else {
            format!("{} snapshots", panels.len())
        };
        if let Err(e) = chart::render_panels(png, &panels, co, &title) {
            complain(&memsnap::Error::new(png, memsnap::ErrorKind::Usage(e)));
            return Ok(ExitCode::from(1));
        }
        eprintln!("memsnap: wrote {}", png.display());
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

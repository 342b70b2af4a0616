//! `memsnap compare A B` and `memsnap compare DIR | FILES...`

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use memsnap::analysis;
use memsnap::chart;
use memsnap::report::compare::{self, Pair, Profile, Ranks};
use memsnap::report::{json, text, DeviceReport};

use memsnap::error::UsageError;

use super::{summaries, ui, Failure, InputArgs, Tally};

/// Arguments of `memsnap compare`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap compare rank0.pickle.xz rank1.pickle.xz\n  memsnap compare snapshots/ --png ranks.png"
)]
pub struct CompareArgs {
    /// Two snapshot files to compare side by side; or a folder of snapshots, or three or more
    /// files, for one row per rank.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// GitHub-flavoured Markdown tables, ready to paste into a pull request.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Also draw the timelines as panels sharing one y axis (PNG or SVG).
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Rows per table.
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    /// Also look for snapshots in the sub-folders of a folder given.
    #[arg(long, short = 'r')]
    pub recursive: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

/// A summary of `memsnap report --json` (one object per line), not a snapshot.
pub(super) fn is_summary_name(p: &Path) -> bool {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    name.ends_with(".jsonl") || name.ends_with(".json")
}

pub(super) fn is_snapshot_name(p: &Path) -> bool {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    name.contains(".pickle") || name.ends_with(".pkl")
}

/// The files to compare: folders are listed (snapshot files only, sorted; sub-folders too
/// with `recursive`), files kept. Also says whether a folder was given.
///
/// The walk follows links to folders but enters each folder once (a link loop ends there),
/// lists each file once however many paths reach it, and skips a folder it cannot read with a
/// note. Report summaries (`.jsonl`) met in folders beside snapshots are left out, with a note:
/// a folder of ranks often holds the summaries of an earlier run.
pub(super) fn expand(inputs: &[PathBuf], recursive: bool) -> (Vec<PathBuf>, bool) {
    // each file, and whether a folder listing found it
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    let mut any_dir = false;
    let mut seen_dirs = HashSet::new();
    let mut seen_files = HashSet::new();
    for input in inputs {
        if input.is_dir() {
            any_dir = true;
            let mut found = Vec::new();
            list_folder(input, recursive, &mut seen_dirs, &mut found);
            found.sort();
            for f in found {
                if first_time(&f, &mut seen_files) {
                    files.push((f, true));
                }
            }
        } else {
            files.push((input.clone(), false));
        }
    }
    use_fresh_summaries(&mut files);
    let left_out = |(f, listed): &(PathBuf, bool)| *listed && is_summary_name(f);
    if files.iter().any(|(f, _)| !is_summary_name(f)) {
        let summaries = files.iter().filter(|f| left_out(f)).count();
        if summaries > 0 {
            files.retain(|f| !left_out(f));
            note!(
                "memsnap: left out {} found beside the snapshots",
                memsnap::units::counted(summaries as u64, "report summary (.jsonl)")
            );
        }
    }
    (files.into_iter().map(|(f, _)| f).collect(), any_dir)
}

/// The summary `memsnap.Capture(summary=True)` (or `report --json > NAME.summary.json`)
/// writes beside a snapshot: `<snapshot>.summary.json`, the snapshot's name taken with or
/// without its compression suffix.
fn summary_key(p: &Path) -> Option<String> {
    let name = p.file_name()?.to_string_lossy().into_owned();
    let strip = |n: &str| -> String {
        let mut n = n;
        for suffix in [".xz", ".gz", ".zst"] {
            n = n.strip_suffix(suffix).unwrap_or(n);
        }
        n.to_string()
    };
    let dir = p.parent().map(|d| d.to_path_buf()).unwrap_or_default();
    let key = match name.strip_suffix(".summary.json") {
        Some(snapshot) => strip(snapshot),
        None if is_snapshot_name(p) && !is_summary_name(p) => strip(&name),
        None => return None,
    };
    Some(dir.join(key).display().to_string())
}

/// When every snapshot a folder listing found has a summary beside it that is newer than the
/// snapshot, the summaries stand for the snapshots (no pickle is read); otherwise the
/// snapshots are read, and a note says how many summaries were missing or older.
fn use_fresh_summaries(files: &mut Vec<(PathBuf, bool)>) {
    use std::collections::HashMap;
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let summaries: HashMap<String, PathBuf> = files
        .iter()
        .filter(|(f, listed)| *listed && is_summary_name(f))
        .filter_map(|(f, _)| {
            let name = f.file_name()?.to_string_lossy().into_owned();
            name.ends_with(".summary.json")
                .then(|| Some((summary_key(f)?, f.clone())))
                .flatten()
        })
        .collect();
    let snapshots: Vec<usize> = (0..files.len())
        .filter(|&k| files[k].1 && !is_summary_name(&files[k].0))
        .collect();
    if snapshots.is_empty() || summaries.is_empty() {
        return;
    }
    let fresh: Vec<Option<PathBuf>> = snapshots
        .iter()
        .map(|&k| {
            let snapshot = &files[k].0;
            let summary = summaries.get(&summary_key(snapshot)?)?;
            match (modified(snapshot), modified(summary)) {
                (Some(a), Some(b)) if b >= a => Some(summary.clone()),
                _ => None,
            }
        })
        .collect();
    let stale = fresh.iter().filter(|f| f.is_none()).count();
    if stale > 0 {
        note!(
            "memsnap: reading the pickles: {} of {} snapshots have no summary beside them newer than they are",
            stale,
            snapshots.len()
        );
        return;
    }
    note!(
        "memsnap: read the summaries written beside the {} snapshots (each newer than its pickle)",
        snapshots.len()
    );
    let chosen: HashSet<PathBuf> = fresh.into_iter().flatten().collect();
    files.retain(|(f, listed)| !*listed || chosen.contains(f));
}

/// The error for inputs that [`expand`] found no snapshot in.
pub(super) fn no_inputs(inputs: &[PathBuf], recursive: bool) -> memsnap::Error {
    let hint = if recursive {
        ""
    } else {
        " (sub-folders are not searched without --recursive)"
    };
    memsnap::Error::new(
        &inputs[0],
        UsageError::NoInputs { hint: hint.into() }.into(),
    )
}

/// Whether the file or folder at `path` is met for the first time (by device and inode, so
/// that links and other paths to it count as the same).
fn first_time(path: &Path, seen: &mut HashSet<(u64, u64)>) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let Ok(m) = std::fs::metadata(path) else {
            return true;
        };
        seen.insert((m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, seen);
        true
    }
}

/// The snapshots (and report summaries) in `root`, and with `recursive` in its sub-folders.
/// Each folder is read once, known by device and inode however it is reached (`ln -s . loop`,
/// links to each other); a link to a folder is followed only when the folder lies inside
/// `root` (a link to `..` or `/` would list the whole disk), and the links left out are said
/// once.
fn list_folder(
    root: &Path,
    recursive: bool,
    seen_dirs: &mut HashSet<(u64, u64)>,
    found: &mut Vec<PathBuf>,
) {
    let inside = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut outside = 0u64;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        if !first_time(&dir, seen_dirs) {
            continue;
        }
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                note!(
                    "memsnap: {}: cannot read the folder ({}); skipped",
                    super::shown(&dir),
                    memsnap::io_text(&e)
                );
                continue;
            }
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.is_dir() {
                if !recursive {
                    continue;
                }
                let link = entry.file_type().is_ok_and(|t| t.is_symlink());
                let within =
                    || std::fs::canonicalize(&p).is_ok_and(|real| real.starts_with(&inside));
                if link && !within() {
                    outside += 1;
                } else {
                    pending.push(p);
                }
            } else if p.is_file()
                && !memsnap::snapshot::probes::is_side_file(&p)
                && (is_snapshot_name(&p) || is_summary_name(&p))
            {
                found.push(p);
            }
        }
    }
    if outside > 0 {
        note!(
            "memsnap: {}: left out {} leading outside it",
            super::shown(root),
            memsnap::units::counted(outside, "folder link")
        );
    }
}

/// What one file gives the comparison: a profile and, when charts are drawn, a panel for each
/// device with events.
struct Loaded {
    index: usize,
    rank: Option<u32>,
    profiles: Vec<Profile>,
    panels: Vec<chart::Panel>,
}

fn load_one(
    index: usize,
    path: &Path,
    threads: usize,
    at_once: bool,
    options: &analysis::Options,
    chart_options: Option<&chart::Options>,
) -> Result<Loaded, memsnap::Error> {
    let load_options = memsnap::snapshot::LoadOptions {
        threads,
        ..super::load_options()
    };
    let snap = memsnap::snapshot::load(path, &load_options)?;
    let file = path.display().to_string();
    let rank = compare::rank_from_name(&file);
    let mut profiles = Vec::new();
    let mut panels = Vec::new();
    for d in snap.devices_with_events() {
        let a = analysis::analyse_device(&snap, d, options);
        super::within_memory(path)?;
        profiles.push(Profile::new(&file, rank, DeviceReport::new(&a)));
        if let Some(co) = chart_options {
            let title = match rank {
                Some(k) => format!("rank {k} · {}", memsnap::snapshot::device_name(d)),
                None => format!(
                    "{} · {}",
                    super::stem(path),
                    memsnap::snapshot::device_name(d)
                ),
            };
            panels.push(chart::panel(&a, co, &title, 500));
        }
        if at_once {
            super::keep_to_exit(a);
        }
    }
    if at_once {
        super::keep_to_exit(snap);
    }
    if profiles.is_empty() {
        return Err(memsnap::Error::new(
            path,
            memsnap::ErrorKind::NoDevice("no device has trace events to compare".into()),
        ));
    }
    Ok(Loaded {
        index,
        rank,
        profiles,
        panels,
    })
}

/// Reads every file in parallel with a progress bar; failures are printed and tallied.
fn load_all(
    files: &[PathBuf],
    options: &analysis::Options,
    chart_options: Option<&chart::Options>,
    tally: &mut Tally,
) -> (Vec<Loaded>, Vec<(usize, String, String)>) {
    let progress = ui::FilesProgress::new(files.len() as u64);
    // the files are read side by side: each may decode on its share of the cores
    let threads = (rayon::current_num_threads() / files.len().max(1)).max(1);
    // when all are read at once, all are in memory together anyway: what each holds can wait
    // for the process to end instead of being freed table by table
    let at_once = files.len() <= rayon::current_num_threads();
    let results: Vec<Result<Loaded, (usize, memsnap::Error)>> = files
        .par_iter()
        .enumerate()
        .map(|(i, f)| {
            let r = load_one(i, f, threads, at_once, options, chart_options).map_err(|e| (i, e));
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
                tally.complain(&e);
                failures.push((i, e.file.display().to_string(), e.kind.to_string()));
            }
        }
    }
    loaded.sort_by_key(|l| l.index);
    (loaded, failures)
}

pub fn run(args: CompareArgs) -> Result<(), Failure> {
    let options = args.input.analysis()?;
    let (files, any_dir) = expand(&args.inputs, args.recursive);
    if files.is_empty() {
        return Err(no_inputs(&args.inputs, args.recursive).into());
    }
    if files.len() == 1 && !any_dir && !is_summary_name(&files[0]) {
        return Err(memsnap::Error::new(&files[0], UsageError::OneInput.into()).into());
    }
    let chart_options = match &args.png {
        Some(png) => {
            chart::check_output(png)
                .map_err(|e| memsnap::Error::new(png, memsnap::ErrorKind::Chart(e)))?;
            super::check_output(png, memsnap::output::Naming::Named)?;
            Some(chart::Options::default())
        }
        None => None,
    };
    if files.iter().any(|f| is_summary_name(f)) {
        if let Some(summary) = files.iter().find(|f| is_summary_name(f)) {
            if files.iter().any(|f| !is_summary_name(f)) {
                return Err(memsnap::Error::new(summary, UsageError::MixedInputs.into()).into());
            }
        }
        let shown = summaries::Shown {
            json: args.json,
            markdown: args.markdown,
            top: args.top,
            png: args.png.as_deref(),
        };
        return summaries::run(&files, &shown);
    }
    let pair_mode = files.len() == 2 && !any_dir;
    let mut tally = Tally::default();
    let (mut loaded, failures) = load_all(&files, &options, chart_options.as_ref(), &mut tally);
    let mut out = super::stdout(args.json);
    let panels = if pair_mode {
        if !tally.all_ok() {
            return tally.finish();
        }
        let pair = Pair::new(&loaded[0].profiles[0], &loaded[1].profiles[0]);
        if args.json {
            json::write_pair(&mut out, &pair)?;
        } else {
            text::compare::write_pair(
                &mut text::Out::new(&mut out, args.markdown),
                &pair,
                args.top,
            )?;
        }
        loaded
            .iter_mut()
            .filter_map(|l| l.panels.drain(..).next())
            .collect()
    } else {
        // panels in the table's order: by rank, then as given
        loaded.sort_by_key(|l| (l.rank.unwrap_or(l.index as u32), l.index));
        let mut profiles = Vec::new();
        let mut panels = Vec::new();
        for l in &mut loaded {
            profiles.extend(l.profiles.drain(..).map(|p| (l.index, p)));
            panels.append(&mut l.panels);
        }
        let ranks = Ranks::new(profiles, failures);
        if args.json {
            json::write_ranks(&mut out, &ranks)?;
        } else {
            text::compare::write_ranks(
                &mut text::Out::new(&mut out, args.markdown),
                &ranks,
                args.top,
            )?;
        }
        panels
    };
    out.flush()?;
    if let (Some(png), Some(co)) = (&args.png, &chart_options) {
        let title = if pair_mode {
            "comparison".to_string()
        } else {
            format!("{} snapshots", panels.len())
        };
        super::timeline::draw_to(png, memsnap::output::Naming::Named, |at| {
            chart::render_panels(at, &panels, co, &title)
        })?;
        note!("memsnap: wrote {}", super::shown(png));
    }
    tally.finish()
}

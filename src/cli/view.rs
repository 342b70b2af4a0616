//! `memsnap view`: one self-contained interactive HTML page of one or more snapshots.

use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use memsnap::analysis::{self, DeviceAnalysis};
use memsnap::output::Naming;
use memsnap::page::{self, Budget, Page, Panel};
use memsnap::report::compare::{Pair, Profile, Ranks};
use memsnap::report::oom::{self, OomOptions};
use memsnap::report::{text, FileReport};

use super::{ui, Failure, InputArgs, Tally};

/// Arguments of `memsnap view`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap view rank0.pickle.xz -o rank0.html --open\n  \
                      memsnap view snapshots/ -o ranks.html   (every rank: one panel each)"
)]
pub struct ViewArgs {
    /// Snapshot files, or folders of them (`-` reads standard input).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The page to write (default: the snapshot's name with `.html` in the current folder,
    /// or `memsnap-view.html` for several; neither is written over without --force).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Open the page in the default browser once written.
    #[arg(long)]
    pub open: bool,
    /// Only this device of each file.
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    /// Also read the snapshots in sub-folders of the folders given.
    #[arg(long, short)]
    pub recursive: bool,
    /// The page's title.
    #[arg(long)]
    pub title: Option<String>,
    /// With report summaries: also write the pages of the N ranks farthest from the median
    /// peak whose snapshots are beside their summaries (beside the fleet page, named after
    /// it), and link them from the fleet page.
    #[arg(long, value_name = "N")]
    pub outliers: Option<usize>,
    #[command(flatten)]
    pub input: InputArgs,
}

/// What one file gives the page.
struct FilePart {
    index: usize,
    report: serde_json::Value,
    panels: Vec<(Panel, Profile)>,
}

pub fn run(args: ViewArgs) -> Result<(), Failure> {
    let options = args.input.analysis()?;
    let (files, _) = super::compare::expand(&args.inputs, args.recursive);
    if files.is_empty() {
        return Err(super::compare::no_inputs(&args.inputs, args.recursive).into());
    }
    if files.iter().all(|f| super::compare::is_summary_name(f)) {
        return fleet(&args, &files);
    }
    let (out, naming) = match &args.output {
        Some(o) => (o.clone(), Naming::Named),
        None if files.len() == 1 => (
            PathBuf::from(format!("{}.html", super::stem(&files[0]))),
            Naming::Chosen,
        ),
        None => (PathBuf::from("memsnap-view.html"), Naming::Chosen),
    };
    super::check_output(&out, naming)?;
    let budget = Budget::for_panels(files.len());
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let shown_names = page::names(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let progress = ui::FilesProgress::new(files.len() as u64);
    let threads = (rayon::current_num_threads() / files.len().max(1)).max(1);
    let results: Vec<Result<FilePart, memsnap::Error>> = files
        .par_iter()
        .enumerate()
        .map(|(i, path)| {
            let r = one_file(
                i,
                path,
                &shown_names[i],
                threads,
                &options,
                &budget,
                args.device,
            );
            progress.done_one();
            r
        })
        .collect();
    drop(progress);
    let mut tally = Tally::default();
    let mut parts = Vec::new();
    let mut failures = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(p) => parts.push(p),
            Err(e) => {
                tally.complain(&e);
                failures.push((i, e.file.display().to_string(), e.kind.to_string()));
            }
        }
    }
    if parts.is_empty() {
        return tally.finish();
    }
    // panels in rank order, as compare lists them
    parts.sort_by_key(|p| {
        let rank = p.panels.first().and_then(|(x, _)| x.rank);
        (rank.unwrap_or(p.index as u32), p.index)
    });
    let mut reports = Vec::new();
    let mut panels = Vec::new();
    let mut profiles = Vec::new();
    for part in parts {
        let r = reports.len();
        reports.push(part.report);
        for (mut panel, profile) in part.panels {
            panel.report = r;
            profiles.push((part.index, profile));
            panels.push(panel);
        }
    }
    let compare_text = compare_text(profiles, &failures);
    let title = args.title.clone().unwrap_or_else(|| match panels.len() {
        1 => format!(
            "memsnap · {}",
            files[0]
                .file_name()
                .map_or_else(|| names[0].clone(), |n| n.to_string_lossy().into_owned())
        ),
        n => format!("memsnap · {n} snapshots"),
    });
    let page = Page::new(page::Parts {
        command: command_line(),
        title,
        panels,
        reports,
        compare_text,
        failures: failures.into_iter().map(|(_, f, why)| (f, why)).collect(),
    });
    let mut pending = super::create_output(&out, naming)?;
    let written = {
        let mut w = std::io::BufWriter::new(pending.file());
        page::write(&mut w, &page).and_then(|()| w.flush())
    };
    written.map_err(|e| super::write_failed(&out, e))?;
    super::commit_output(pending, &out)?;
    note!("memsnap: wrote {}", super::shown(&out));
    if args.open {
        open(&out);
    }
    tally.finish()
}

/// Reads one file and builds a panel for each of its devices.
fn one_file(
    index: usize,
    path: &Path,
    (name, rank): &(String, Option<u32>),
    threads: usize,
    options: &analysis::Options,
    budget: &Budget,
    device: Option<u32>,
) -> Result<FilePart, memsnap::Error> {
    let load_options = memsnap::snapshot::LoadOptions {
        threads,
        ..super::load_options()
    };
    let snap = memsnap::snapshot::load(path, &load_options)?;
    // as report does: the devices with events, or those with segments when none has any
    let devices = super::choose_devices(analysis::devices(&snap), device, path)?;
    let file = path.display().to_string();
    let analyses: Vec<DeviceAnalysis> = devices
        .iter()
        .map(|&d| analysis::analyse_device(&snap, d, options))
        .collect();
    super::within_memory(path)?;
    let report = FileReport::new(&file, &snap, &analyses);
    // a report is plain data: it always becomes a JSON value
    let report_json = serde_json::to_value(&report).unwrap_or_default();
    let panels = analyses
        .iter()
        .zip(&report.devices)
        .enumerate()
        .map(|(k, (a, device))| {
            let text = oom_text(a);
            let panel = page::panel(a, &file, name, *rank, budget, text, (0, k));
            (panel, Profile::new(&file, *rank, device.clone()))
        })
        .collect();
    super::within_memory(path)?;
    Ok(FilePart {
        index,
        report: report_json,
        panels,
    })
}

/// What `memsnap oom` prints for a device that ran out of memory.
fn oom_text(a: &DeviceAnalysis) -> Option<String> {
    if a.replay.ooms.is_empty() {
        return None;
    }
    let e = oom::explain(a, &OomOptions::default())?;
    let mut buf = Vec::new();
    let options = text::TextOptions {
        top: 6,
        ..Default::default()
    };
    text::whatif::write_explanation(&mut text::Out::new(&mut buf, false), &e, &options).ok()?;
    String::from_utf8(buf).ok()
}

/// What `memsnap compare` prints for these profiles (none for one).
fn compare_text(
    profiles: Vec<(usize, Profile)>,
    failures: &[(usize, String, String)],
) -> Option<String> {
    let mut buf = Vec::new();
    let out = &mut text::Out::new(&mut buf, false);
    let written = match profiles.len() {
        0 | 1 => return None,
        2 if failures.is_empty() => {
            text::compare::write_pair(out, &Pair::new(&profiles[0].1, &profiles[1].1), 8)
        }
        _ => text::compare::write_ranks(out, &Ranks::new(profiles, failures.to_vec()), 8),
    };
    written.ok()?;
    String::from_utf8(buf).ok()
}

/// The command line that made the page, as one would type it again.
fn command_line() -> String {
    let mut words = vec!["memsnap".to_string()];
    words.extend(std::env::args_os().skip(1).map(|a| {
        let a = a.to_string_lossy().into_owned();
        let plain = !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
        if plain {
            a
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        }
    }));
    memsnap::units::printable(&words.join(" "))
}

/// Opens the page in the default browser; says so when it cannot.
fn open(page: &Path) {
    let program = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    let started = std::process::Command::new(program)
        .arg(page)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = started {
        note!(
            "memsnap: could not open {} with {program}: {}",
            super::shown(page),
            memsnap::io_text(&e)
        );
    }
}

/// `memsnap view` of report summaries: the fleet page, one row per rank.
fn fleet(args: &ViewArgs, files: &[PathBuf]) -> Result<(), Failure> {
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("memsnap-fleet.html"));
    let naming = if args.output.is_some() {
        Naming::Named
    } else {
        Naming::Chosen
    };
    super::check_output(&out, naming)?;
    let read: Vec<Result<Vec<FileReport>, memsnap::Error>> = files
        .par_iter()
        .map(|f| super::summaries::read_summary(f))
        .collect();
    let mut tally = Tally::default();
    let mut summaries = Vec::new();
    for (f, r) in files.iter().zip(read) {
        match r {
            Ok(reports) => summaries.push(memsnap::page::fleet::Summary {
                reports,
                snapshot: snapshot_beside(f),
                page: None,
            }),
            Err(e) => tally.complain(&e),
        }
    }
    let title = args.title.clone().unwrap_or_else(|| {
        let ranks: usize = summaries
            .iter()
            .flat_map(|s| &s.reports)
            .map(|r| r.devices.len())
            .sum();
        format!("memsnap · {ranks} ranks")
    });
    if let Some(n) = args.outliers {
        outlier_pages(args, &out, n, &mut summaries, &mut tally);
    }
    let mut pending = super::create_output(&out, naming)?;
    let written = {
        let mut w = std::io::BufWriter::new(pending.file());
        memsnap::page::fleet::write(&mut w, &title, &summaries).and_then(|()| w.flush())
    };
    written.map_err(|e| super::write_failed(&out, e))?;
    super::commit_output(pending, &out)?;
    note!("memsnap: wrote {}", super::shown(&out));
    tally.finish()
}

/// Writes the pages of the `n` summaries farthest from the median peak whose snapshots are at
/// hand, beside the fleet page `out` (`<fleet stem>-<snapshot stem>.html`), and notes each in
/// its summary for the fleet page to link.
fn outlier_pages(
    args: &ViewArgs,
    out: &Path,
    n: usize,
    summaries: &mut [memsnap::page::fleet::Summary],
    tally: &mut Tally,
) {
    let peak = |s: &memsnap::page::fleet::Summary| {
        s.reports
            .iter()
            .flat_map(|r| &r.devices)
            .map(|d| d.peak_allocated_bytes)
            .max()
            .unwrap_or(0)
    };
    let peaks: Vec<u64> = summaries.iter().map(peak).collect();
    let mut sorted = peaks.clone();
    sorted.sort_unstable();
    let median = sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0);
    let mut order: Vec<usize> = (0..summaries.len())
        .filter(|&i| summaries[i].snapshot.is_some())
        .collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(peaks[i].abs_diff(median)), i));
    let folder = out.parent().unwrap_or(Path::new(""));
    let fleet_stem = super::stem(out);
    for i in order.into_iter().take(n) {
        let Some(snapshot) = summaries[i].snapshot.clone() else {
            continue;
        };
        let name = format!("{fleet_stem}-{}.html", super::stem(Path::new(&snapshot)));
        let page = folder.join(&name);
        let one = ViewArgs {
            inputs: vec![PathBuf::from(&snapshot)],
            output: Some(page),
            open: false,
            device: None,
            recursive: false,
            title: None,
            outliers: None,
            input: args.input.clone(),
        };
        match run(one) {
            Ok(()) => summaries[i].page = Some(name),
            Err(Failure::Error(e)) => tally.complain(&e),
            Err(_) => {}
        }
    }
}

/// The snapshot a `<snapshot>.summary.json` was written for, when it is beside it (as written,
/// or compressed since).
fn snapshot_beside(summary: &std::path::Path) -> Option<String> {
    let name = summary.to_string_lossy();
    let snapshot = name.strip_suffix(".summary.json")?;
    ["", ".xz", ".gz", ".zst"]
        .iter()
        .map(|suffix| format!("{snapshot}{suffix}"))
        .find(|p| std::path::Path::new(p).is_file())
}

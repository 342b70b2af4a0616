//! `memsnap diff BASE NEW`: why the new run's memory differs from the base run's, cause by
//! cause, with a budget that fails a CI job when the peak grew too much.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use memsnap::analysis;
use memsnap::diff::Diff;
use memsnap::error::UsageError;
use memsnap::report::compare::rank_from_name;
use memsnap::report::text;
use memsnap::units;

use super::{Failure, InputArgs};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  memsnap diff main.pickle branch.pickle
  memsnap diff main/ branch/                       # folders of ranks, matched by rank
  memsnap diff main.pickle branch.pickle --max-increase 5% --markdown --png diff.png
  memsnap diff main.pickle branch.pickle --html diff.html   (click a cause to see its blocks)")]
pub struct DiffArgs {
    /// The base run: a snapshot, or a folder of one snapshot per rank.
    pub base: PathBuf,
    /// The new run: a snapshot, or a folder of ranks (matched to the base's by rank).
    pub new: PathBuf,
    /// One JSON object per pair of snapshots.
    #[arg(long)]
    pub json: bool,
    /// Markdown, for a pull-request comment.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Causes listed (the rest are summed in one row).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Only this device of each file.
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    /// Fail (exit 1) when the new peak allocated exceeds SIZE.
    #[arg(long, value_name = "SIZE", value_parser = super::parse_size_arg)]
    pub max_peak: Option<u64>,
    /// Fail (exit 1) when the peak allocated grew by more than PCT% or SIZE.
    #[arg(long, value_name = "PCT|SIZE", value_parser = parse_limit)]
    pub max_increase: Option<Limit>,
    /// Fail (exit 1) when the new peak reserved exceeds SIZE.
    #[arg(long, value_name = "SIZE", value_parser = super::parse_size_arg)]
    pub max_reserved_peak: Option<u64>,
    /// Fail (exit 1) when the peak reserved grew by more than PCT% or SIZE.
    #[arg(long, value_name = "PCT|SIZE", value_parser = parse_limit)]
    pub max_reserved_increase: Option<Limit>,
    /// A budget file (JSON: `{"max_peak": "40GiB", "max_increase": "5%", ...}`, the options'
    /// names with underscores); options given on the command line win.
    #[arg(long, value_name = "FILE")]
    pub budget: Option<PathBuf>,
    /// Also draw both runs' timelines on one y axis to this PNG or SVG file.
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Also write an interactive page: both runs on one time axis, the causes listed, a click
    /// on a cause shading its blocks (with folders: the rank whose peak changed most).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub input: InputArgs,
}

/// A limit on a growth: a share of the base, or bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// Percent of the base's figure.
    Percent(f64),
    /// Bytes.
    Bytes(u64),
}

impl Limit {
    /// The most bytes this limit allows a figure of `base` bytes to grow.
    fn allowed(self, base: u64) -> u64 {
        match self {
            Limit::Percent(p) => (base as f64 * p / 100.0).floor() as u64,
            Limit::Bytes(b) => b,
        }
    }

    fn text(self) -> String {
        match self {
            Limit::Percent(p) => format!("{p}%"),
            Limit::Bytes(b) => units::bytes(b),
        }
    }
}

fn parse_limit(text: &str) -> Result<Limit, String> {
    let t = text.trim();
    if let Some(p) = t.strip_suffix('%') {
        return match p.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(Limit::Percent(v)),
            _ => Err(format!("{text:?} is not a percentage (such as 5%)")),
        };
    }
    super::parse_size_arg(t)
        .map(Limit::Bytes)
        .map_err(|_| format!("{text:?} is neither a percentage (5%) nor a size (512MiB)"))
}

/// The budget: what the options and the budget file ask for.
#[derive(Clone, Copy, Debug, Default)]
struct Budget {
    max_peak: Option<u64>,
    max_increase: Option<Limit>,
    max_reserved_peak: Option<u64>,
    max_reserved_increase: Option<Limit>,
}

impl Budget {
    fn is_empty(&self) -> bool {
        self.max_peak.is_none()
            && self.max_increase.is_none()
            && self.max_reserved_peak.is_none()
            && self.max_reserved_increase.is_none()
    }

    /// Each part of the budget a diff breaks, in one line.
    fn broken(&self, d: &Diff) -> Vec<String> {
        let mut out = Vec::new();
        let peak = |what: &str, value: u64, limit: Option<u64>, option: &str| {
            limit.filter(|&l| value > l).map(|l| {
                format!(
                    "{what} {} is over {option} {} by {}",
                    units::bytes(value),
                    units::bytes(l),
                    units::bytes(value - l)
                )
            })
        };
        let growth = |what: &str, base: u64, new: u64, limit: Option<Limit>, option: &str| {
            let l = limit?;
            let grew = new.saturating_sub(base);
            let allowed = l.allowed(base);
            (grew > allowed).then(|| {
                format!(
                    "{what} grew by {} ({:+.1}%), over {option} {} ({}) by {}",
                    units::bytes(grew),
                    grew as f64 * 100.0 / base.max(1) as f64,
                    l.text(),
                    units::bytes(allowed),
                    units::bytes(grew - allowed)
                )
            })
        };
        let (b, n) = (&d.base, &d.new);
        out.extend(peak(
            "peak allocated",
            n.peak_allocated_bytes,
            self.max_peak,
            "--max-peak",
        ));
        out.extend(growth(
            "peak allocated",
            b.peak_allocated_bytes,
            n.peak_allocated_bytes,
            self.max_increase,
            "--max-increase",
        ));
        out.extend(peak(
            "peak reserved",
            n.peak_reserved_bytes,
            self.max_reserved_peak,
            "--max-reserved-peak",
        ));
        out.extend(growth(
            "peak reserved",
            b.peak_reserved_bytes,
            n.peak_reserved_bytes,
            self.max_reserved_increase,
            "--max-reserved-increase",
        ));
        out
    }
}

/// The budget of the options, over that of the budget file.
fn budget(args: &DiffArgs) -> Result<Budget, memsnap::Error> {
    let mut b = Budget::default();
    if let Some(path) = &args.budget {
        let bad = |reason: String| {
            memsnap::Error::new(
                path,
                UsageError::BadValue {
                    option: "--budget",
                    value: path.display().to_string(),
                    reason,
                }
                .into(),
            )
        };
        let text = super::read_small_text(path, 64 * 1024).map_err(&bad)?;
        let doc: BTreeMap<String, serde_json::Value> = serde_json::from_str(&text)
            .map_err(|e| bad(format!("not a JSON object of limits ({e})")))?;
        for (key, value) in doc {
            let v = match &value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => return Err(bad(format!("{key}: give a size or a percentage as text"))),
            };
            let size = || super::parse_size_arg(&v).map_err(|e| bad(format!("{key}: {e}")));
            let limit = || parse_limit(&v).map_err(|e| bad(format!("{key}: {e}")));
            match key.as_str() {
                "max_peak" => b.max_peak = Some(size()?),
                "max_increase" => b.max_increase = Some(limit()?),
                "max_reserved_peak" => b.max_reserved_peak = Some(size()?),
                "max_reserved_increase" => b.max_reserved_increase = Some(limit()?),
                _ => return Err(bad(format!("unknown limit {key:?} (max_peak, max_increase, max_reserved_peak, max_reserved_increase)"))),
            }
        }
    }
    b.max_peak = args.max_peak.or(b.max_peak);
    b.max_increase = args.max_increase.or(b.max_increase);
    b.max_reserved_peak = args.max_reserved_peak.or(b.max_reserved_peak);
    b.max_reserved_increase = args.max_reserved_increase.or(b.max_reserved_increase);
    Ok(b)
}

/// The pairs of files to diff: the two files, or the ranks both folders hold.
fn pairs(args: &DiffArgs) -> Result<Vec<(String, PathBuf, PathBuf)>, Failure> {
    let (b, n) = (&args.base, &args.new);
    match (b.is_dir(), n.is_dir()) {
        (false, false) => Ok(vec![(String::new(), b.clone(), n.clone())]),
        (true, true) => {
            let by_rank = |dir: &Path| -> Result<BTreeMap<u32, PathBuf>, Failure> {
                let (files, _) = super::compare::expand(&[dir.to_path_buf()], false);
                let mut m = BTreeMap::new();
                for f in files
                    .into_iter()
                    .filter(|f| super::compare::is_snapshot_name(f))
                {
                    memsnap::output::note_input(&f);
                    if let Some(r) = rank_from_name(&f.display().to_string()) {
                        m.entry(r).or_insert(f);
                    }
                }
                if m.is_empty() {
                    return Err(super::compare::no_inputs(&[dir.to_path_buf()], false).into());
                }
                Ok(m)
            };
            let (mb, mn) = (by_rank(b)?, by_rank(n)?);
            let missing: Vec<String> = mb
                .keys()
                .filter(|r| !mn.contains_key(r))
                .chain(mn.keys().filter(|r| !mb.contains_key(r)))
                .map(|r| r.to_string())
                .collect();
            if !missing.is_empty() {
                note!(
                    "memsnap: ranks in one folder only, left out: {}",
                    missing.join(", ")
                );
            }
            let out: Vec<_> = mb
                .into_iter()
                .filter_map(|(r, pb)| mn.get(&r).map(|pn| (format!("rank {r}"), pb, pn.clone())))
                .collect();
            if out.is_empty() {
                return Err(memsnap::Error::new(
                    n,
                    UsageError::BadValue {
                        option: "NEW",
                        value: n.display().to_string(),
                        reason: "no rank in both folders".into(),
                    }
                    .into(),
                )
                .into());
            }
            Ok(out)
        }
        _ => Err(memsnap::Error::new(
            if b.is_dir() { n } else { b },
            UsageError::BadValue {
                option: "BASE NEW",
                value: format!("{} {}", b.display(), n.display()),
                reason: "give two files or two folders".into(),
            }
            .into(),
        )
        .into()),
    }
}

/// Loads one file and analyses the device asked for (or its first with events).
fn load<'s>(
    snap: &'s memsnap::snapshot::Snapshot,
    path: &Path,
    device: Option<u32>,
    options: &analysis::Options,
    tables: bool,
) -> Result<analysis::DeviceAnalysis<'s>, memsnap::Error> {
    let d = super::device(snap, device, path)?;
    // the breakdowns and step tables only for the chart
    let a = if tables {
        analysis::analyse_device(snap, d, options)
    } else {
        analysis::analyse_events(snap, d, options)
    };
    super::within_memory(path)?;
    Ok(a)
}

pub fn run(args: DiffArgs) -> Result<(), Failure> {
    let options = args.input.analysis()?;
    let budget = budget(&args)?;
    let pairs = pairs(&args)?;
    if let Some(png) = &args.png {
        memsnap::chart::check_output(png)
            .map_err(|e| memsnap::Error::new(png, memsnap::ErrorKind::Chart(e)))?;
        super::check_output(png, memsnap::output::Naming::Named)?;
    }
    if let Some(html) = &args.html {
        super::check_output(html, memsnap::output::Naming::Named)?;
    }
    let mut diffs: Vec<(String, Diff)> = Vec::new();
    let mut panels = Vec::new();
    let chart_options = memsnap::chart::Options::default();
    for (name, pb, pn) in &pairs {
        let (sb, sn) = rayon::join(|| super::load(pb), || super::load(pn));
        let (sb, sn) = (sb?, sn?);
        let (ab, an) = rayon::join(
            || load(&sb, pb, args.device, &options, args.png.is_some()),
            || load(&sn, pn, args.device, &options, args.png.is_some()),
        );
        let (ab, an) = (ab?, an?);
        let d = memsnap::diff::diff(
            &ab,
            &an,
            (&pb.display().to_string(), &pn.display().to_string()),
        );
        super::within_memory(pn)?;
        if args.png.is_some() && panels.is_empty() {
            let title = |what: &str, p: &Path| format!("{what} · {}", super::stem(p));
            panels.push(memsnap::chart::panel(
                &ab,
                &chart_options,
                &title("base", pb),
                500,
            ));
            panels.push(memsnap::chart::panel(
                &an,
                &chart_options,
                &title("new", pn),
                500,
            ));
        }
        diffs.push((name.clone(), d));
    }
    let mut out = super::stdout(args.json);
    let chart_name = args.png.as_ref().map(|p| p.display().to_string());
    if args.json {
        for (name, d) in &diffs {
            let mut v = serde_json::to_value(d).map_err(std::io::Error::other)?;
            if !name.is_empty() {
                v["rank"] = serde_json::Value::String(name.clone());
            }
            serde_json::to_writer(&mut out, &v).map_err(std::io::Error::other)?;
            writeln!(out)?;
        }
    } else {
        let mut o = text::Out::new(&mut out, args.markdown);
        if diffs.len() == 1 {
            text::diff::write(&mut o, &diffs[0].1, args.top, chart_name.as_deref())?;
        } else {
            text::diff::write_many(&mut o, &diffs, args.top)?;
        }
    }
    out.flush()?;
    if let Some(png) = &args.png {
        let title = "base and new, one y axis";
        super::timeline::draw_to(png, memsnap::output::Naming::Named, |at| {
            memsnap::chart::render_panels(at, &panels, &chart_options, title)
        })?;
        note!("memsnap: wrote {}", super::shown(png));
    }
    if let Some(html) = &args.html {
        write_page(html, &diffs)?;
    }
    if budget.is_empty() {
        return Ok(());
    }
    let mut broken = 0;
    for (name, d) in &diffs {
        for line in budget.broken(d) {
            let who = if name.is_empty() {
                String::new()
            } else {
                format!("{name}: ")
            };
            note!("memsnap: budget broken: {who}{line}");
            broken += 1;
        }
    }
    if broken > 0 {
        return Err(Failure::Printed(super::EXIT_FILE));
    }
    note!("memsnap: within budget");
    Ok(())
}

/// Writes the diff page of one pair: the only one, or the rank whose peak changed most.
fn write_page(path: &Path, diffs: &[(String, Diff)]) -> Result<(), Failure> {
    let Some((name, d)) = diffs
        .iter()
        .max_by_key(|(_, d)| d.peak_allocated_delta_bytes.unsigned_abs())
    else {
        return Ok(());
    };
    let short = |f: &str| {
        Path::new(f)
            .file_name()
            .map_or(f.to_string(), |n| n.to_string_lossy().into_owned())
    };
    let mut title = format!(
        "memsnap diff · {} → {}",
        short(&d.base.file),
        short(&d.new.file)
    );
    if !name.is_empty() {
        title = format!("{title} · {name}");
        if diffs.len() > 1 {
            note!(
                "memsnap: the page shows {name}, whose peak changed most of the {} ranks",
                diffs.len()
            );
        }
    }
    let naming = memsnap::output::Naming::Named;
    let mut pending = super::create_output(path, naming)?;
    let written = {
        let mut w = std::io::BufWriter::new(pending.file());
        memsnap::page::diff::write(&mut w, &title, d).and_then(|()| w.flush())
    };
    written.map_err(|e| super::write_failed(path, e))?;
    super::commit_output(pending, path)?;
    note!("memsnap: wrote {}", super::shown(path));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_percentages_or_sizes() {
        assert_eq!(parse_limit("5%"), Ok(Limit::Percent(5.0)));
        assert_eq!(parse_limit(" 2.5 %"), Ok(Limit::Percent(2.5)));
        assert_eq!(parse_limit("512MiB"), Ok(Limit::Bytes(512 << 20)));
        assert!(parse_limit("-1%").is_err());
        assert!(parse_limit("lots").is_err());
        assert_eq!(Limit::Percent(5.0).allowed(1000), 50);
        assert_eq!(Limit::Bytes(7).allowed(1000), 7);
    }
}

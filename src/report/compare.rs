//! Comparison views: two snapshots side by side, or one row per rank.
//!
//! A [`Profile`] is everything the comparison needs from one snapshot (its [`DeviceReport`]
//! plus the file and rank), small enough to keep for many files at once. [`Pair`] explains the
//! difference between two profiles: peaks, then the difference of the memory live at each
//! peak by category, by step and op, by stage, by allocation site, and per step. [`Ranks`]
//! puts many profiles in one table and explains the highest against the lowest with a
//! [`Pair`].

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use super::breakdown::Share;
use super::text::{indented, table};
use super::{DeviceReport, PeakPlace};
use crate::units;

/// One snapshot (one device of it), summarised for comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// The file as given.
    pub file: String,
    /// Pipeline or data-parallel rank, from the file name when it says (`rank3`).
    pub rank: Option<u32>,
    /// The device's report.
    pub report: DeviceReport,
}

/// The rank a file name gives: `memory_snapshot_rank3_step0.pickle` (pithtrain),
/// `rank3_memory_snapshot.pickle` (torchtitan), `snapshot-rank-3.pickle`.
pub fn rank_from_name(name: &str) -> Option<u32> {
    let base = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    let at = base.find("rank")?;
    let rest = base[at + 4..].trim_start_matches(['_', '-', '=']);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// One label's bytes at both peaks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diff {
    /// Group name.
    pub label: String,
    /// Bytes live at the first snapshot's peak.
    pub a_bytes: u64,
    /// Bytes live at the second snapshot's peak.
    pub b_bytes: u64,
    /// `b_bytes - a_bytes`.
    pub diff_bytes: i64,
}

/// One pipeline step (or phase) in both snapshots.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPair {
    /// Step name.
    pub label: String,
    /// Allocated at the end of the step, first snapshot.
    pub a_end_bytes: Option<u64>,
    /// Allocated at the end of the step, second snapshot.
    pub b_end_bytes: Option<u64>,
    /// Peak inside the step, first snapshot.
    pub a_peak_bytes: Option<u64>,
    /// Peak inside the step, second snapshot.
    pub b_peak_bytes: Option<u64>,
}

/// The short identity of a compared snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    /// The file.
    pub file: String,
    /// Rank from the file name.
    pub rank: Option<u32>,
    /// Device.
    pub device: u32,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Where the peak was reached.
    pub peak: PeakPlace,
}

impl Side {
    fn of(p: &Profile) -> Side {
        Side {
            file: p.file.clone(),
            rank: p.rank,
            device: p.report.device,
            peak_allocated_bytes: p.report.peak_allocated_bytes,
            peak_reserved_bytes: p.report.peak_reserved_bytes,
            peak: p.report.peak.clone(),
        }
    }

    fn name(&self) -> String {
        match self.rank {
            Some(r) => format!("rank {r}"),
            None => std::path::Path::new(&self.file)
                .file_name()
                .map_or(self.file.clone(), |n| n.to_string_lossy().into_owned()),
        }
    }
}

/// Two snapshots compared.
#[derive(Clone, Debug, Serialize)]
pub struct Pair {
    /// The first snapshot.
    pub a: Side,
    /// The second snapshot.
    pub b: Side,
    /// `b - a` peak allocated bytes.
    pub peak_allocated_diff_bytes: i64,
    /// `b - a` peak reserved bytes.
    pub peak_reserved_diff_bytes: i64,
    /// Differences of the memory live at the peaks, per dimension (`category`, `step`, `op`,
    /// `stage`, `phase`), largest difference first.
    pub breakdown: BTreeMap<&'static str, Vec<Diff>>,
    /// Allocation sites with more bytes live at the second peak, largest first.
    pub sites_more_in_b: Vec<Diff>,
    /// Allocation sites with more bytes live at the first peak, largest first.
    pub sites_more_in_a: Vec<Diff>,
    /// Steps side by side, in order.
    pub steps: Vec<StepPair>,
}

fn diffs(a: &[Share], b: &[Share]) -> Vec<Diff> {
    let mut map: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for s in a {
        map.entry(&s.label).or_default().0 += s.bytes;
    }
    for s in b {
        map.entry(&s.label).or_default().1 += s.bytes;
    }
    let mut out: Vec<Diff> = map
        .into_iter()
        .map(|(label, (a, b))| Diff {
            label: label.to_string(),
            a_bytes: a,
            b_bytes: b,
            diff_bytes: b as i64 - a as i64,
        })
        .collect();
    out.sort_by(|x, y| {
        y.diff_bytes
            .unsigned_abs()
            .cmp(&x.diff_bytes.unsigned_abs())
            .then(x.label.cmp(&y.label))
    });
    out
}

impl Pair {
    /// Compares `b` against `a`.
    pub fn new(a: &Profile, b: &Profile) -> Pair {
        let mut breakdown = BTreeMap::new();
        for dim in ["category", "step", "op", "stage", "phase"] {
            let empty = Vec::new();
            let x = a.report.peak_breakdown.get(dim).unwrap_or(&empty);
            let y = b.report.peak_breakdown.get(dim).unwrap_or(&empty);
            breakdown.insert(dim, diffs(x, y));
        }
        let sites = diffs(&a.report.top_sites, &b.report.top_sites);
        let sites_more_in_b = sites.iter().filter(|d| d.diff_bytes > 0).cloned().collect();
        let sites_more_in_a = sites.iter().filter(|d| d.diff_bytes < 0).cloned().collect();
        let mut steps: Vec<StepPair> = Vec::new();
        for (row, first) in a
            .report
            .steps
            .iter()
            .map(|r| (r, true))
            .chain(b.report.steps.iter().map(|r| (r, false)))
        {
            let label = row.label.clone();
            let pair = match steps.iter_mut().find(|s| s.label == label) {
                Some(p) => p,
                None => {
                    steps.push(StepPair {
                        label,
                        a_end_bytes: None,
                        b_end_bytes: None,
                        a_peak_bytes: None,
                        b_peak_bytes: None,
                    });
                    steps.last_mut().expect("pushed")
                }
            };
            let (end, peak) = if first {
                (&mut pair.a_end_bytes, &mut pair.a_peak_bytes)
            } else {
                (&mut pair.b_end_bytes, &mut pair.b_peak_bytes)
            };
            *end = Some(row.end_allocated_bytes);
            *peak = Some(peak.unwrap_or(0).max(row.peak_allocated_bytes));
        }
        // pipeline steps in step order, the rest after
        steps.sort_by_key(|s| step_order(&s.label));
        Pair {
            a: Side::of(a),
            b: Side::of(b),
            peak_allocated_diff_bytes: b.report.peak_allocated_bytes as i64
                - a.report.peak_allocated_bytes as i64,
            peak_reserved_diff_bytes: b.report.peak_reserved_bytes as i64
                - a.report.peak_reserved_bytes as i64,
            breakdown,
            sites_more_in_b,
            sites_more_in_a,
            steps,
        }
    }
}

fn step_order(label: &str) -> (u32, u32, String) {
    let (train, rest) = match label.strip_prefix("train step ") {
        Some(r) => {
            let (n, rest) = r.split_once(" · ").unwrap_or((r, ""));
            (n.parse().unwrap_or(0), rest)
        }
        None => (0, label),
    };
    let step = match rest {
        "before step 1" => 0,
        s if s.starts_with("step ") => s[5..].parse().unwrap_or(50),
        "after step 8" => 9,
        _ => 20,
    };
    (train, step, rest.to_string())
}

/// Many snapshots, one row each.
#[derive(Clone, Debug, Serialize)]
pub struct Ranks {
    /// One row per file (and device), by rank.
    pub rows: Vec<RankRow>,
    /// Index of the row with the highest peak.
    pub highest: Option<usize>,
    /// Index of the row with the lowest peak.
    pub lowest: Option<usize>,
    /// Why the highest peaks above the lowest.
    pub why: Option<Pair>,
}

/// One rank of a [`Ranks`] table.
#[derive(Clone, Debug, Serialize)]
pub struct RankRow {
    /// Rank from the file name, or the position in the order given.
    pub rank: u32,
    /// Whether the rank came from the file name.
    pub rank_from_name: bool,
    /// The file.
    pub file: String,
    /// Device.
    pub device: Option<u32>,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: Option<u64>,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: Option<u64>,
    /// Where the peak was reached.
    pub peak: Option<PeakPlace>,
    /// The largest category at the peak.
    pub top_category: Option<Share>,
    /// Why the file could not be compared.
    pub error: Option<String>,
}

impl Ranks {
    /// Builds the table from profiles and failures `(file, position given, message)`.
    pub fn new(
        mut profiles: Vec<(usize, Profile)>,
        failures: Vec<(usize, String, String)>,
    ) -> Ranks {
        let mut rows: Vec<RankRow> = Vec::new();
        profiles.sort_by_key(|(i, p)| (p.rank.unwrap_or(*i as u32), *i, p.report.device));
        for (i, p) in &profiles {
            rows.push(RankRow {
                rank: p.rank.unwrap_or(*i as u32),
                rank_from_name: p.rank.is_some(),
                file: p.file.clone(),
                device: Some(p.report.device),
                peak_allocated_bytes: Some(p.report.peak_allocated_bytes),
                peak_reserved_bytes: Some(p.report.peak_reserved_bytes),
                peak: Some(p.report.peak.clone()),
                top_category: p
                    .report
                    .peak_breakdown
                    .get("category")
                    .and_then(|c| c.iter().find(|s| s.label != "pre-existing").or(c.first()))
                    .cloned(),
                error: None,
            });
        }
        for (i, file, message) in failures {
            rows.push(RankRow {
                rank: rank_from_name(&file).unwrap_or(i as u32),
                rank_from_name: rank_from_name(&file).is_some(),
                file,
                device: None,
                peak_allocated_bytes: None,
                peak_reserved_bytes: None,
                peak: None,
                top_category: None,
                error: Some(message),
            });
        }
        rows.sort_by_key(|r| (r.rank, r.error.is_some(), r.device));
        let by_peak = |best: fn(u64, u64) -> bool| {
            let mut pick: Option<usize> = None;
            for (i, r) in rows.iter().enumerate() {
                if let Some(p) = r.peak_allocated_bytes {
                    if pick.is_none_or(|j| best(p, rows[j].peak_allocated_bytes.unwrap_or(0))) {
                        pick = Some(i);
                    }
                }
            }
            pick
        };
        let highest = by_peak(|a, b| a > b);
        let lowest = by_peak(|a, b| a < b);
        let why = match (highest, lowest) {
            (Some(h), Some(l)) if h != l => {
                let find = |row: &RankRow| {
                    profiles
                        .iter()
                        .find(|(_, p)| p.file == row.file && Some(p.report.device) == row.device)
                        .map(|(_, p)| p)
                };
                match (find(&rows[l]), find(&rows[h])) {
                    (Some(lo), Some(hi)) => Some(Pair::new(lo, hi)),
                    _ => None,
                }
            }
            _ => None,
        };
        Ranks {
            rows,
            highest,
            lowest,
            why,
        }
    }
}

fn place(p: &PeakPlace) -> String {
    p.summary_parts().join(" · ")
}

/// Keeps the end of a long label (the innermost frames of a site).
fn shorten_left(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        let tail: String = s.chars().skip(n - (max - 1)).collect();
        format!("…{tail}")
    }
}

/// The largest increases of a breakdown, in words: `loss +0.98 GiB, ...`.
fn mostly(rows: &[Diff], n: usize) -> String {
    rows.iter()
        .filter(|d| d.diff_bytes > 0)
        .take(n)
        .map(|d| format!("{} {}", d.label, units::bytes_delta(d.diff_bytes as i128)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn write_diffs(
    out: &mut dyn Write,
    title: &str,
    a: &str,
    b: &str,
    rows: &[Diff],
    top: usize,
) -> io::Result<()> {
    let rows: Vec<&Diff> = rows
        .iter()
        .filter(|d| d.diff_bytes != 0)
        .take(top)
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    let mut t = table(&[title, a, b, "difference"]);
    for d in rows {
        t.add_row(vec![
            shorten_left(&d.label, 72),
            units::bytes(d.a_bytes),
            units::bytes(d.b_bytes),
            units::bytes_delta(d.diff_bytes as i128),
        ]);
    }
    writeln!(out)?;
    writeln!(out, "{}", indented(&t, "  "))
}

/// Writes a two-snapshot comparison.
pub fn write_pair(out: &mut dyn Write, pair: &Pair, top: usize) -> io::Result<()> {
    let (a, b) = (pair.a.name(), pair.b.name());
    let (a, b) = if a == b {
        ("first".to_string(), "second".to_string())
    } else {
        (a, b)
    };
    writeln!(out, "{a}: {} · device {}", pair.a.file, pair.a.device)?;
    writeln!(out, "{b}: {} · device {}", pair.b.file, pair.b.device)?;
    writeln!(out)?;
    let mut t = table(&["", &a, &b, "difference"]);
    t.add_row(vec![
        "peak allocated".to_string(),
        units::bytes(pair.a.peak_allocated_bytes),
        units::bytes(pair.b.peak_allocated_bytes),
        units::bytes_delta(pair.peak_allocated_diff_bytes as i128),
    ]);
    t.add_row(vec![
        "peak reserved".to_string(),
        units::bytes(pair.a.peak_reserved_bytes),
        units::bytes(pair.b.peak_reserved_bytes),
        units::bytes_delta(pair.peak_reserved_diff_bytes as i128),
    ]);
    writeln!(out, "{}", indented(&t, "  "))?;
    writeln!(out)?;
    writeln!(out, "  {a} peaks in {}", place(&pair.a.peak))?;
    writeln!(out, "  {b} peaks in {}", place(&pair.b.peak))?;
    if let Some(stages) = pair.breakdown.get("stage") {
        let (more_b, more_a) = (mostly(stages, 3), {
            let flipped: Vec<Diff> = stages
                .iter()
                .map(|d| Diff {
                    diff_bytes: -d.diff_bytes,
                    ..d.clone()
                })
                .collect();
            mostly(&flipped, 3)
        });
        if !more_b.is_empty() {
            writeln!(out, "  {b} holds more of: {more_b}")?;
        }
        if !more_a.is_empty() {
            writeln!(out, "  {a} holds more of: {more_a}")?;
        }
    }
    for (dim, title) in [
        ("category", "at the peaks, by category"),
        ("step", "at the peaks, by step"),
        ("stage", "at the peaks, by stage"),
    ] {
        if let Some(rows) = pair.breakdown.get(dim) {
            write_diffs(out, title, &a, &b, rows, top)?;
        }
    }
    write_diffs(
        out,
        &format!("sites with more at {b}'s peak"),
        &a,
        &b,
        &pair.sites_more_in_b,
        top.min(6),
    )?;
    write_diffs(
        out,
        &format!("sites with more at {a}'s peak"),
        &a,
        &b,
        &pair.sites_more_in_a,
        top.min(6),
    )?;
    if !pair.steps.is_empty() {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), units::bytes);
        let mut t = table(&[
            "steps",
            &format!("{a} end"),
            &format!("{b} end"),
            &format!("{a} peak"),
            &format!("{b} peak"),
        ]);
        for s in &pair.steps {
            t.add_row(vec![
                s.label.clone(),
                opt(s.a_end_bytes),
                opt(s.b_end_bytes),
                opt(s.a_peak_bytes),
                opt(s.b_peak_bytes),
            ]);
        }
        writeln!(out)?;
        writeln!(out, "{}", indented(&t, "  "))?;
    }
    Ok(())
}

/// Writes the table of ranks and why the highest is higher.
pub fn write_ranks(out: &mut dyn Write, ranks: &Ranks, top: usize) -> io::Result<()> {
    let mut t = table(&[
        "rank",
        "peak allocated",
        "peak reserved",
        "peak in",
        "largest at the peak",
        "file",
    ]);
    for c in [3, 4, 5] {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(comfy_table::CellAlignment::Left);
        }
    }
    for (i, r) in ranks.rows.iter().enumerate() {
        let mark = if Some(i) == ranks.highest && ranks.rows.len() > 1 {
            " ◀ highest"
        } else {
            ""
        };
        let rank = if r.rank_from_name {
            r.rank.to_string()
        } else {
            format!("#{}", r.rank)
        };
        let name = std::path::Path::new(&r.file)
            .file_name()
            .map_or(r.file.clone(), |n| n.to_string_lossy().into_owned());
        match &r.error {
            Some(e) => {
                t.add_row(vec![
                    rank,
                    "-".into(),
                    "-".into(),
                    format!("error: {e}"),
                    String::new(),
                    name,
                ]);
            }
            None => {
                t.add_row(vec![
                    rank,
                    format!(
                        "{}{mark}",
                        units::bytes(r.peak_allocated_bytes.unwrap_or(0))
                    ),
                    units::bytes(r.peak_reserved_bytes.unwrap_or(0)),
                    r.peak.as_ref().map(place).unwrap_or_default(),
                    r.top_category
                        .as_ref()
                        .map(|s| {
                            format!(
                                "{} {} ({})",
                                s.label,
                                units::bytes(s.bytes),
                                units::percent(s.bytes, r.peak_allocated_bytes.unwrap_or(0))
                            )
                        })
                        .unwrap_or_default(),
                    name,
                ]);
            }
        }
    }
    writeln!(out, "{}", indented(&t, "  "))?;
    if let Some(why) = &ranks.why {
        let (hi, lo) = (why.b.name(), why.a.name());
        writeln!(out)?;
        writeln!(
            out,
            "  why {hi} peaks {} above {lo}: at their peaks ({} vs {})",
            units::bytes(why.peak_allocated_diff_bytes.unsigned_abs()),
            place(&why.b.peak),
            place(&why.a.peak)
        )?;
        if let Some(stages) = why.breakdown.get("stage") {
            let more = mostly(stages, 3);
            if !more.is_empty() {
                writeln!(out, "  {hi} holds more of: {more}")?;
            }
        }
        for (dim, title) in [("category", "by category"), ("stage", "by stage")] {
            if let Some(rows) = why.breakdown.get(dim) {
                write_diffs(out, title, &lo, &hi, rows, top.min(6))?;
            }
        }
        write_diffs(
            out,
            &format!("sites with more at {hi}'s peak"),
            &lo,
            &hi,
            &why.sites_more_in_b,
            top.min(4),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_from_file_names() {
        assert_eq!(
            rank_from_name("runs/pp4/memory_snapshot_rank3_step0.pickle"),
            Some(3)
        );
        assert_eq!(rank_from_name("rank12_memory_snapshot.pickle"), Some(12));
        assert_eq!(rank_from_name("snapshot-rank-7.pickle.xz"), Some(7));
        assert_eq!(rank_from_name("RANK_2.pkl"), Some(2));
        assert_eq!(rank_from_name("dir/rank9/snap.pickle"), None);
        assert_eq!(rank_from_name("snapshot.pickle"), None);
    }

    #[test]
    fn diffs_cover_labels_on_either_side() {
        let s = |l: &str, b: u64| Share {
            label: l.into(),
            bytes: b,
            count: 1,
        };
        let d = diffs(&[s("x", 10), s("y", 5)], &[s("y", 20), s("z", 1)]);
        assert_eq!(d[0].label, "y");
        assert_eq!(d[0].diff_bytes, 15);
        assert_eq!(d[1].label, "x");
        assert_eq!(d[1].diff_bytes, -10);
        assert_eq!(d[2].label, "z");
    }

    #[test]
    fn steps_sort_in_pipeline_order() {
        let mut v = vec![
            "after step 8",
            "step 10",
            "step 2",
            "optimizer",
            "before step 1",
        ];
        v.sort_by_key(|l| step_order(l));
        assert_eq!(
            v,
            vec![
                "before step 1",
                "step 2",
                "after step 8",
                "step 10",
                "optimizer"
            ]
        );
    }
}

//! Comparison views: two snapshots side by side, or one row per rank.
//!
//! A [`Profile`] is everything the comparison needs from one snapshot (its [`DeviceReport`]
//! plus the file and rank), small enough to keep for many files at once. [`Pair`] explains the
//! difference between two profiles: peaks, then the difference of the memory live at each
//! peak by category, by step and op, by stage, by allocation site, and per step. [`Ranks`]
//! puts many profiles in one table and explains the highest against the lowest with a
//! [`Pair`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::DeviceReport;
use crate::analysis::{PeakPlace, Share};

/// One snapshot (one device of it), summarised for comparison.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Profile {
    /// The file as given.
    pub file: String,
    /// Pipeline or data-parallel rank, from the file name when it says (`rank3`).
    pub rank: Option<u32>,
    /// The device's report.
    pub report: DeviceReport,
}

impl Profile {
    /// The profile of one device of `file`.
    pub fn new(file: &str, rank: Option<u32>, report: DeviceReport) -> Profile {
        Profile {
            file: file.to_string(),
            rank,
            report,
        }
    }
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

/// Names that tell compared snapshots apart, one per profile: `rank 3`, or the file name when
/// the name gives no rank; `· device 1` added where one file gives several devices; the
/// shortest distinguishing end of the path added where two files would read the same.
pub fn display_names(profiles: &[&Profile]) -> Vec<String> {
    use std::collections::HashMap;
    let files: Vec<&str> = profiles.iter().map(|p| p.file.as_str()).collect();
    let short = short_paths(&files);
    let base: Vec<String> = profiles
        .iter()
        .zip(&short)
        .map(|(p, s)| match p.rank {
            Some(r) => format!("rank {r}"),
            None => s.clone(),
        })
        .collect();
    // profiles by base name: (files, devices of each file)
    let mut same: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, b) in base.iter().enumerate() {
        same.entry(b.as_str()).or_default().push(i);
    }
    let mut names = Vec::with_capacity(profiles.len());
    for (i, p) in profiles.iter().enumerate() {
        let twins = &same[base[i].as_str()];
        let mut name = base[i].clone();
        if p.rank.is_some() && twins.iter().any(|&j| profiles[j].file != p.file) {
            name = format!("{name} ({})", short[i]);
        }
        if twins.iter().any(|&j| {
            j != i && profiles[j].file == p.file && profiles[j].report.device != p.report.device
        }) {
            name = format!("{name} · {}", crate::snapshot::device_name(p.report.device));
        }
        names.push(name);
    }
    // the same file and device given more than once: number them
    let mut seen: HashMap<String, usize> = HashMap::new();
    for name in &mut names {
        let n = seen.entry(name.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            *name = format!("{name} #{n}");
        }
    }
    names
}

/// For each path, the fewest trailing components that no other (different) path ends with.
pub fn short_paths(files: &[&str]) -> Vec<String> {
    use std::collections::{HashMap, HashSet};
    let parts: Vec<Vec<&str>> = files
        .iter()
        .map(|f| f.split(['/', '\\']).filter(|c| !c.is_empty()).collect())
        .collect();
    let mut out = vec![String::new(); files.len()];
    let mut pending: Vec<usize> = (0..files.len()).collect();
    let mut n = 1;
    while !pending.is_empty() {
        // how many different files end with each tail of n components
        let mut tails: HashMap<String, HashSet<&str>> = HashMap::new();
        for (k, p) in parts.iter().enumerate() {
            let tail = p[p.len().saturating_sub(n)..].join("/");
            tails.entry(tail).or_default().insert(files[k]);
        }
        let mut still = Vec::new();
        for &k in &pending {
            let p = &parts[k];
            let tail = p[p.len().saturating_sub(n)..].join("/");
            if tails[&tail].len() == 1 || n >= p.len() {
                out[k] = if n >= p.len() && tails[&tail].len() > 1 {
                    files[k].to_string()
                } else {
                    tail
                };
            } else {
                still.push(k);
            }
        }
        pending = still;
        n += 1;
        if n > 64 {
            for &k in &pending {
                out[k] = files[k].to_string();
            }
            break;
        }
    }
    out
}

/// One label's bytes at both peaks.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Side {
    /// How the tables name it (see [`display_names`]).
    pub name: String,
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
    fn of(p: &Profile, name: String) -> Side {
        Side {
            name,
            file: p.file.clone(),
            rank: p.rank,
            device: p.report.device,
            peak_allocated_bytes: p.report.peak_allocated_bytes,
            peak_reserved_bytes: p.report.peak_reserved_bytes,
            peak: p.report.peak.clone(),
        }
    }
}

/// Two snapshots compared.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
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
    pub breakdown: BTreeMap<String, Vec<Diff>>,
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
            breakdown.insert(dim.to_string(), diffs(x, y));
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
        let mut names = display_names(&[a, b]).into_iter();
        let (mut name_a, mut name_b) = (
            names.next().unwrap_or_default(),
            names.next().unwrap_or_default(),
        );
        if name_a == name_b {
            (name_a, name_b) = ("first".to_string(), "second".to_string());
        }
        Pair {
            a: Side::of(a, name_a),
            b: Side::of(b, name_b),
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

impl Ranks {
    /// The peaks of the rows that have one, in row order.
    pub fn peaks(&self) -> Vec<u64> {
        self.rows
            .iter()
            .filter_map(|r| r.peak_allocated_bytes)
            .collect()
    }

    /// The same table with only the rows `keep` (indices, in order).
    pub fn subset(&self, keep: &[usize]) -> Ranks {
        let find = |i: Option<usize>| i.and_then(|i| keep.iter().position(|&k| k == i));
        Ranks {
            rows: keep.iter().map(|&k| self.rows[k].clone()).collect(),
            highest: find(self.highest),
            lowest: find(self.lowest),
            why: self.why.clone(),
        }
    }
}

impl Pair {
    /// The same comparison seen from the other side: `a` and `b` exchanged, differences
    /// negated.
    pub fn swapped(&self) -> Pair {
        let flip = |d: &Diff| Diff {
            label: d.label.clone(),
            a_bytes: d.b_bytes,
            b_bytes: d.a_bytes,
            diff_bytes: -d.diff_bytes,
        };
        Pair {
            a: self.b.clone(),
            b: self.a.clone(),
            peak_allocated_diff_bytes: -self.peak_allocated_diff_bytes,
            peak_reserved_diff_bytes: -self.peak_reserved_diff_bytes,
            breakdown: self
                .breakdown
                .iter()
                .map(|(k, v)| (k.clone(), v.iter().map(flip).collect()))
                .collect(),
            sites_more_in_b: self.sites_more_in_a.iter().map(flip).collect(),
            sites_more_in_a: self.sites_more_in_b.iter().map(flip).collect(),
            steps: self
                .steps
                .iter()
                .map(|s| StepPair {
                    label: s.label.clone(),
                    a_end_bytes: s.b_end_bytes,
                    b_end_bytes: s.a_end_bytes,
                    a_peak_bytes: s.b_peak_bytes,
                    b_peak_bytes: s.a_peak_bytes,
                })
                .collect(),
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
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Ranks {
    /// One row per file (and device), by rank.
    pub rows: Vec<RankRow>,
    /// Index of the row with the highest peak.
    pub highest: Option<usize>,
    /// Index of the row with the lowest peak.
    pub lowest: Option<usize>,
    /// Why the highest peaks above the lowest: the lowest compared against the highest
    /// (`a` is the lowest, `b` the highest).
    pub why: Option<Pair>,
}

/// One rank of a [`Ranks`] table.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct RankRow {
    /// Pipeline rank, when the pipeline's shape was found.
    #[serde(default)]
    pub pipeline_rank: Option<u32>,
    /// How the table names it (see [`display_names`]).
    pub name: String,
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
    /// Builds the table from profiles `(position given, profile)` and failures `(position
    /// given, file, message)`. Rows are in rank order (the position given where the file name
    /// has no rank), then by device. Only GPU devices with events and a peak above zero take part in
    /// highest and lowest.
    pub fn new(
        mut profiles: Vec<(usize, Profile)>,
        failures: Vec<(usize, String, String)>,
    ) -> Ranks {
        profiles.sort_by_key(|(i, p)| (p.rank.unwrap_or(*i as u32), *i, p.report.device));
        let refs: Vec<&Profile> = profiles.iter().map(|(_, p)| p).collect();
        let names = display_names(&refs);
        let mut rows: Vec<(RankRow, Option<usize>)> = Vec::new();
        for (k, ((i, p), name)) in profiles.iter().zip(names).enumerate() {
            let row = RankRow {
                pipeline_rank: p
                    .report
                    .attribution
                    .pipeline
                    .as_ref()
                    .and_then(|x| x.shape)
                    .map(|s| s.rank),
                name,
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
            };
            rows.push((row, Some(k)));
        }
        let failed_files: Vec<&str> = failures.iter().map(|f| f.1.as_str()).collect();
        let short = short_paths(&failed_files);
        for ((i, file, message), name) in failures.into_iter().zip(short) {
            let rank = rank_from_name(&file);
            let row = RankRow {
                pipeline_rank: None,
                name: rank.map_or(name, |r| format!("rank {r}")),
                rank: rank.unwrap_or(i as u32),
                rank_from_name: rank.is_some(),
                file,
                device: None,
                peak_allocated_bytes: None,
                peak_reserved_bytes: None,
                peak: None,
                top_category: None,
                error: Some(message),
            };
            rows.push((row, None));
        }
        rows.sort_by_key(|(r, _)| (r.rank, r.error.is_some(), r.device));
        // GPU devices with events and a peak take part: pinned host memory is another
        // allocator's, and a device that never held a byte explains nothing
        let with_events = |k: &Option<usize>| {
            k.is_some_and(|k| {
                let r = &profiles[k].1.report;
                r.events > 0 && r.device != crate::units::HOST_DEVICE && r.peak_allocated_bytes > 0
            })
        };
        let pick = |higher: bool| {
            let mut pick: Option<usize> = None;
            for (i, (r, k)) in rows.iter().enumerate() {
                let (Some(p), true) = (r.peak_allocated_bytes, with_events(k)) else {
                    continue;
                };
                let best = pick.and_then(|j| rows[j].0.peak_allocated_bytes);
                if best.is_none_or(|b| if higher { p > b } else { p < b }) {
                    pick = Some(i);
                }
            }
            pick
        };
        let (highest, lowest) = (pick(true), pick(false));
        let why = match (highest, lowest) {
            (Some(h), Some(l)) if h != l => match (rows[l].1, rows[h].1) {
                (Some(x), Some(y)) => Some(Pair::new(&profiles[x].1, &profiles[y].1)),
                _ => None,
            },
            _ => None,
        };
        Ranks {
            rows: rows.into_iter().map(|(r, _)| r).collect(),
            highest,
            lowest,
            why,
        }
    }
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
    fn short_paths_keep_what_tells_files_apart() {
        let got = short_paths(&[
            "runs/a/rank0.pickle",
            "runs/b/rank0.pickle",
            "x/rank1.pickle",
        ]);
        assert_eq!(
            got,
            vec!["a/rank0.pickle", "b/rank0.pickle", "rank1.pickle"]
        );
        assert_eq!(
            short_paths(&["same.pickle", "same.pickle"]),
            vec!["same.pickle"; 2]
        );
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

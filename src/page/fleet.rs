//! The fleet page: thousands of ranks on one page, from their report summaries (what
//! `memsnap report --json` or `memsnap.Capture(summary=True)` wrote where each rank ran).
//!
//! One row per rank and device: the peaks, the step of the peak and the categories at the
//! peak, a few numbers each (about 150 bytes a rank, so 4,096 ranks make well under 1 MB).
//! The page draws heat strips (one pixel column per rank) of each figure, and a table sorted
//! by distance from the median peak, outliers first, sortable by any column; a click names the
//! rank's own page (`memsnap view` of its snapshot) where the snapshot is beside its summary,
//! and links it where that page was written beside this one (`memsnap view --outliers N`).

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::{json, Value};

use crate::attribute::Category;
use crate::report::compare::rank_from_name;
use crate::report::FileReport;

const TEMPLATE: &str = include_str!("fleet.html");

/// One summary file's reports, and the snapshot beside it where there is one.
pub struct Summary {
    /// The reports the summary holds (one per snapshot it summarises).
    pub reports: Vec<FileReport>,
    /// The snapshot the summary was written for, when it is at hand.
    pub snapshot: Option<String>,
    /// Its own page, written beside the fleet page (a file name), when there is one.
    pub page: Option<String>,
}

/// Writes the fleet page of `summaries` to `out`.
pub fn write(out: &mut dyn Write, title: &str, summaries: &[Summary]) -> io::Result<()> {
    let categories: Vec<&str> = Category::ALL.iter().map(|c| c.as_str()).collect();
    let mut steps: Vec<String> = Vec::new();
    let mut step_index: HashMap<String, usize> = HashMap::new();
    let mut rows: Vec<Value> = Vec::new();
    for s in summaries {
        for r in &s.reports {
            let rank = rank_from_name(&r.file);
            for d in &r.devices {
                let step = d.peak.step.clone();
                let k = *step_index.entry(step.clone()).or_insert_with(|| {
                    steps.push(step);
                    steps.len() - 1
                });
                let mut mix = vec![0u64; categories.len()];
                if let Some(shares) = d.peak_breakdown.get("category") {
                    for share in shares {
                        if let Some(c) = categories.iter().position(|c| *c == share.label) {
                            mix[c] += share.bytes;
                        }
                    }
                }
                let position = rows.len();
                let name = match rank {
                    Some(n) if r.devices.len() == 1 => format!("rank {n}"),
                    Some(n) => format!("rank {n} · {}", crate::snapshot::device_name(d.device)),
                    None => format!("#{position} {}", short(&r.file)),
                };
                rows.push(json!([
                    rank.unwrap_or(position as u32),
                    name,
                    r.file,
                    d.device,
                    d.peak_allocated_bytes,
                    d.peak_reserved_bytes,
                    k,
                    mix,
                    s.snapshot,
                    s.page,
                ]));
            }
        }
    }
    let data = json!({
        "title": title,
        "categories": categories,
        "steps": steps,
        "rows": rows,
    });
    let text = serde_json::to_string(&data).map_err(io::Error::other)?;
    let text = crate::escape::json(&text).replace('<', "\\u003c");
    let title = super::escape_text(&crate::escape::printable(title));
    super::fill(out, TEMPLATE, &[("title", &title), ("data", &text)])
}

/// The file name of a path.
fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

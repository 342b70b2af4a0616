//! Comparisons as text: two snapshots side by side, or one row per rank.

use std::io::{self, Write};

use super::{shorten_left, table, Out};
use crate::analysis::PeakPlace;
use crate::report::compare::{short_paths, Diff, Pair, RankRow, Ranks};
use crate::units;

fn place(p: &PeakPlace) -> String {
    p.summary_parts().join(" · ")
}

/// The largest increases of a breakdown, in words: `loss +0.98 GiB, ...`.
/// At most `n` of them, and no more than fit in 90 characters (labels shortened to 40).
fn mostly(rows: &[Diff], n: usize) -> String {
    let mut out = String::new();
    for d in rows.iter().filter(|d| d.diff_bytes > 0).take(n) {
        let item = format!(
            "{} {}",
            shorten_left(&d.label, 40),
            units::bytes_delta(d.diff_bytes as i128)
        );
        if !out.is_empty() && out.chars().count() + 2 + item.chars().count() > 90 {
            break;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(&item);
    }
    out
}

fn write_diffs(
    out: &mut Out,
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
    writeln!(out, "{}", out.table(&t, "  "))
}

/// Writes a two-snapshot comparison.
pub fn write_pair(out: &mut Out, pair: &Pair, top: usize) -> io::Result<()> {
    if out.markdown {
        let d = pair.peak_allocated_diff_bytes;
        let (a, b) = (out.text(&pair.a.name), out.text(&pair.b.name));
        if d == 0 {
            writeln!(
                out,
                "- **{a}** and **{b}** peak at the same allocated bytes"
            )?;
        } else {
            writeln!(
                out,
                "- **{b}** peaks {} {} than **{a}**",
                units::bytes(d.unsigned_abs()),
                if d > 0 { "higher" } else { "lower" },
            )?;
        }
    }
    // long names are introduced once and the columns say `first` and `second`
    let long = pair.a.name.chars().count().max(pair.b.name.chars().count()) > 16;
    let (a, b) = if long {
        ("first".to_string(), "second".to_string())
    } else {
        (pair.a.name.clone(), pair.b.name.clone())
    };
    for (column, side) in [(&a, &pair.a), (&b, &pair.b)] {
        let rank = match side.rank {
            Some(r) if long => format!(" · rank {r}"),
            _ => String::new(),
        };
        let line = format!(
            "{column}: {} · {}{rank}",
            side.file,
            crate::snapshot::device_name(side.device)
        );
        if out.markdown {
            out.prose(&line)?;
        } else {
            let line = out.text(&line);
            writeln!(out, "{line}")?;
        }
    }
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
    writeln!(out, "{}", out.table(&t, "  "))?;
    writeln!(out)?;
    out.prose(&format!("{a} peaks in {}", place(&pair.a.peak)))?;
    out.prose(&format!("{b} peaks in {}", place(&pair.b.peak)))?;
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
            out.prose(&format!("{b} holds more of: {more_b}"))?;
        }
        if !more_a.is_empty() {
            out.prose(&format!("{a} holds more of: {more_a}"))?;
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
        writeln!(out, "{}", out.table(&t, "  "))?;
    }
    Ok(())
}

/// Writes the table of ranks and why the highest is higher.
pub fn write_ranks(out: &mut Out, ranks: &Ranks, top: usize) -> io::Result<()> {
    // Files named alike but for their rank are named once, as a pattern, above the table.
    let pattern = common_pattern(ranks);
    if let Some(p) = &pattern {
        out.prose(&format!("files: {p}"))?;
        writeln!(out)?;
    }
    let mut header = vec![
        "rank",
        "device",
        "peak allocated",
        "peak reserved",
        "peak in",
        "largest at the peak",
        "file",
    ];
    if pattern.is_some() {
        header.pop();
    }
    let mut t = table(&header);
    // on a terminal, the table wraps its text cells to the terminal's width
    t.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
    for c in 4..header.len() {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(comfy_table::CellAlignment::Left);
        }
    }
    let paths: Vec<&str> = ranks.rows.iter().map(|r| r.file.as_str()).collect();
    let files = short_paths(&paths);
    for (i, r) in ranks.rows.iter().enumerate() {
        let mut cells = row_cells(ranks, r, i, &files[i]);
        if pattern.is_some() {
            cells.pop();
        }
        t.add_row(cells);
    }
    writeln!(out, "{}", out.table(&t, "  "))?;
    if let (Some(why), Some(hi), Some(lo)) = (&ranks.why, ranks.highest, ranks.lowest) {
        // columns in the table's order
        if hi < lo {
            write_why(out, &why.swapped(), top)?;
        } else {
            write_why(out, why, top)?;
        }
    }
    Ok(())
}

/// `DIR/memory_snapshot_rank{rank}_step0.pickle.xz` when every row's file is that pattern with
/// its own rank, all in one folder.
fn common_pattern(ranks: &Ranks) -> Option<String> {
    let mut pattern: Option<String> = None;
    for r in &ranks.rows {
        if !r.rank_from_name {
            return None;
        }
        let (dir, base) = match r.file.rsplit_once('/') {
            Some((d, b)) => (format!("{d}/"), b),
            None => (String::new(), r.file.as_str()),
        };
        let lower = base.to_ascii_lowercase();
        let at = lower.find("rank")?;
        let digits = base[at + 4..]
            .trim_start_matches(['_', '-', '='])
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let start = base.len() - base[at + 4..].trim_start_matches(['_', '-', '=']).len();
        let p = format!("{dir}{}{{rank}}{}", &base[..start], &base[start + digits..]);
        match &pattern {
            Some(q) if *q != p => return None,
            _ => pattern = Some(p),
        }
    }
    pattern
}

/// One row of the rank table.
fn row_cells(ranks: &Ranks, r: &RankRow, i: usize, file: &str) -> Vec<String> {
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
    let device = r.device.map_or("-".to_string(), |d| {
        if d == crate::units::HOST_DEVICE {
            "host (pinned)".to_string()
        } else {
            d.to_string()
        }
    });
    match &r.error {
        Some(e) => vec![
            rank,
            device,
            "-".into(),
            "-".into(),
            middle(&format!("error: {e}"), 2 * CELL),
            String::new(),
            shorten_left(file, CELL),
        ],
        None => vec![
            rank,
            device,
            format!(
                "{}{mark}",
                units::bytes(r.peak_allocated_bytes.unwrap_or(0))
            ),
            units::bytes(r.peak_reserved_bytes.unwrap_or(0)),
            middle(&r.peak.as_ref().map(place).unwrap_or_default(), CELL),
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
            shorten_left(file, CELL),
        ],
    }
}

/// The most characters a text cell of the rank table shows, so that a table of any names
/// stays within a wide terminal.
const CELL: usize = 40;

/// `s` within `max` characters: its beginning and its end around an ellipsis, so that both a
/// step's name and a file's rank stay readable.
fn middle(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let head = (max - 1) / 2;
    let tail = max - 1 - head;
    let start: String = s.chars().take(head).collect();
    let end: String = s.chars().skip(n - tail).collect();
    format!("{start}…{end}")
}

/// Why the highest rank peaks above the lowest, with the two in table order.
fn write_why(out: &mut Out, why: &Pair, top: usize) -> io::Result<()> {
    let b_higher = why.peak_allocated_diff_bytes >= 0;
    let (hi, lo) = if b_higher {
        (&why.b, &why.a)
    } else {
        (&why.a, &why.b)
    };
    writeln!(out)?;
    out.prose(&format!(
        "why {} peaks {} above {}: at their peaks ({} vs {})",
        hi.name,
        units::bytes(why.peak_allocated_diff_bytes.unsigned_abs()),
        lo.name,
        place(&hi.peak),
        place(&lo.peak)
    ))?;
    if let Some(stages) = why.breakdown.get("stage") {
        let towards_hi: Vec<Diff> = stages
            .iter()
            .map(|d| Diff {
                diff_bytes: if b_higher {
                    d.diff_bytes
                } else {
                    -d.diff_bytes
                },
                ..d.clone()
            })
            .collect();
        let more = mostly(&towards_hi, 3);
        if !more.is_empty() {
            out.prose(&format!("{} holds more of: {more}", hi.name))?;
        }
    }
    // the tables read from the higher rank's side: its column first, the difference what it
    // holds more
    let toward_hi = |rows: &[Diff]| -> Vec<Diff> {
        rows.iter()
            .map(|d| {
                if b_higher {
                    Diff {
                        label: d.label.clone(),
                        a_bytes: d.b_bytes,
                        b_bytes: d.a_bytes,
                        diff_bytes: d.diff_bytes,
                    }
                } else {
                    Diff {
                        diff_bytes: -d.diff_bytes,
                        ..d.clone()
                    }
                }
            })
            .collect()
    };
    let (first, second) = (&hi.name, &lo.name);
    for (dim, title) in [("category", "by category"), ("stage", "by stage")] {
        if let Some(rows) = why.breakdown.get(dim) {
            write_diffs(out, title, first, second, &toward_hi(rows), top.min(6))?;
        }
    }
    let sites = if b_higher {
        &why.sites_more_in_b
    } else {
        &why.sites_more_in_a
    };
    write_diffs(
        out,
        &format!("sites with more at {}'s peak", hi.name),
        first,
        second,
        &toward_hi(sites),
        top.min(4),
    )
}

/// The most rows a rank table shows whole; beyond, the highest and lowest ten.
const MAX_ROWS: usize = 40;

/// Many ranks: the table (or, beyond 40 rows, its ten highest and ten lowest rows), the
/// spread of the peaks, the pipeline ranks' spread across replicas, and why the highest rank
/// peaks above the lowest.
pub fn write_many(out: &mut Out, ranks: &Ranks, top: usize) -> io::Result<()> {
    let peaks = ranks.peaks();
    if ranks.rows.len() > MAX_ROWS {
        let mut order: Vec<usize> = (0..ranks.rows.len())
            .filter(|&i| ranks.rows[i].peak_allocated_bytes.is_some())
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(ranks.rows[i].peak_allocated_bytes));
        let mut keep: Vec<usize> = order.iter().take(10).copied().collect();
        keep.extend(order.iter().rev().take(10).rev().copied());
        keep.extend((0..ranks.rows.len()).filter(|&i| ranks.rows[i].error.is_some()));
        keep.sort_unstable();
        keep.dedup();
        out.prose(&format!(
            "{} ranks; the ten highest and the ten lowest peaks (--json for all):",
            units::count(ranks.rows.len() as u64)
        ))?;
        writeln!(out)?;
        write_ranks(out, &ranks.subset(&keep), top)?;
    } else {
        write_ranks(out, ranks, top)?;
    }
    write_spread(out, &peaks)?;
    write_pipeline_groups(out, ranks)
}

/// A text histogram of the peaks.
fn write_spread(out: &mut Out, peaks: &[u64]) -> io::Result<()> {
    if peaks.len() < 3 {
        return Ok(());
    }
    let bins = crate::analysis::histogram(peaks, 10);
    let most = bins.iter().map(|b| b.2).max().unwrap_or(1).max(1);
    writeln!(out)?;
    out.prose(&format!(
        "peak allocated across {} ranks:",
        units::count(peaks.len() as u64)
    ))?;
    // in Markdown the bars are a code block: aligned, and not run together
    let markdown = out.markdown;
    if markdown {
        writeln!(out, "\n```text")?;
    }
    for (from, to, n) in bins {
        let bar = "█".repeat((n * 40).div_ceil(most));
        let line = format!(
            "  {:>10} – {:>10}  {:>6}  {bar}",
            units::bytes(from),
            units::bytes(to),
            units::count(n as u64)
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    if markdown {
        writeln!(out, "```")?;
    }
    Ok(())
}

/// Per pipeline rank (when shapes were found and more than one replica shares one): replicas,
/// lowest and highest peak.
fn write_pipeline_groups(out: &mut Out, ranks: &Ranks) -> io::Result<()> {
    use std::collections::BTreeMap;
    let mut by: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for r in &ranks.rows {
        if let (Some(p), Some(peak)) = (r.pipeline_rank, r.peak_allocated_bytes) {
            by.entry(p).or_default().push(peak);
        }
    }
    if by.len() < 2 || by.values().all(|v| v.len() < 2) {
        return Ok(());
    }
    let mut t = table(&[
        "pipeline rank",
        "replicas",
        "lowest peak",
        "highest peak",
        "spread",
    ]);
    for (p, peaks) in by {
        let (lo, hi) = (
            *peaks.iter().min().unwrap_or(&0),
            *peaks.iter().max().unwrap_or(&0),
        );
        t.add_row(vec![
            p.to_string(),
            units::count(peaks.len() as u64),
            units::bytes(lo),
            units::bytes(hi),
            units::bytes(hi - lo),
        ]);
    }
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))
}

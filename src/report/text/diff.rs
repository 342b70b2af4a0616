//! `memsnap diff` as text or Markdown: the two peaks, then the causes, largest effect first.

use std::io::{self, Write};

use super::{shorten_left, table, table_with_text, Out};
use crate::diff::{Diff, Kind};
use crate::units;

/// `+785.0 MiB (+63.8%)`: a change with its share of the base.
fn change(delta: i64, base: u64) -> String {
    let d = units::bytes_delta(delta as i128);
    if base == 0 || delta == 0 {
        d
    } else {
        format!("{d} ({:+.1}%)", delta as f64 * 100.0 / base as f64)
    }
}

/// Writes one diff; `top` causes at most, the rest summed in one row.
pub fn write(out: &mut Out, d: &Diff, top: usize, chart: Option<&str>) -> io::Result<()> {
    let (b, n) = (&d.base, &d.new);
    let head = format!(
        "base {} · new {} · {}",
        b.file,
        n.file,
        crate::snapshot::device_name(n.device)
    );
    if out.markdown {
        writeln!(out, "### memsnap diff: {}", out.text(&d.verdict))?;
        writeln!(out)?;
        out.prose(&head)?;
    } else {
        writeln!(out, "{}", out.text(&head))?;
    }
    let mut t = table(&["", "base", "new", "change"]);
    t.add_row(vec![
        "peak allocated".to_string(),
        units::bytes(b.peak_allocated_bytes),
        units::bytes(n.peak_allocated_bytes),
        change(d.peak_allocated_delta_bytes, b.peak_allocated_bytes),
    ]);
    t.add_row(vec![
        "peak reserved".to_string(),
        units::bytes(b.peak_reserved_bytes),
        units::bytes(n.peak_reserved_bytes),
        change(d.peak_reserved_delta_bytes, b.peak_reserved_bytes),
    ]);
    t.add_row(vec![
        "allocations".to_string(),
        units::count(b.requests as u64),
        units::count(n.requests as u64),
        format!("{} aligned", units::count(d.aligned_requests as u64)),
    ]);
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))?;
    writeln!(out)?;
    if let Some(png) = chart {
        if out.markdown {
            writeln!(out, "![base and new, one y axis]({})", out.text(png))?;
            writeln!(out)?;
        }
    }
    match d.verdict.as_str() {
        "no change" => {
            out.prose("No change: the same requests, sizes and lives in both runs.")?;
            if b.duration_us != n.duration_us {
                out.prose(&format!(
                    "Only in time: the recording lasted {} then {}.",
                    seconds(b.duration_us),
                    seconds(n.duration_us)
                ))?;
            }
            return Ok(());
        }
        "allocator only" => {
            out.prose("The same requests, sizes and lives: only the allocator differs.")?
        }
        _ => {}
    }
    for note in &d.notes {
        out.prose(note)?;
    }
    if let Some(s) = &d.scaling {
        out.prose(&format!(
            "Sizes scaled: {} aligned requests grew ×{:.2} ({:.0}% of the bytes that changed size): a larger batch or sequence?",
            units::count(s.requests),
            s.ratio,
            s.share * 100.0
        ))?;
    }
    let requests: Vec<_> = d
        .causes
        .iter()
        .filter(|c| c.kind != Kind::Allocator)
        .collect();
    if !requests.is_empty() {
        out.prose(&format!(
            "Why the peak changed: {} causes; their effects add up to {}.",
            requests.len(),
            units::bytes_delta(d.peak_allocated_delta_bytes as i128)
        ))?;
        writeln!(out)?;
        // two lines a cause in a terminal (where it was made under what happened); one
        // line in Markdown, whose table cells hold no line breaks
        let join = |a: &str, b: &str| {
            let (a, b) = (out.text(a), out.text(b));
            if b.is_empty() || a == b {
                a
            } else if out.markdown {
                format!("{a} · {b}")
            } else {
                format!("{a}\n{b}")
            }
        };
        let mut t = table_with_text(&["effect", "kind", "what", "where", "category", "when"], 6);
        if let Some(c) = t.column_mut(0) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
        let shown = requests.len().min(top.max(1));
        let row = |c: &crate::diff::Cause, part: bool| {
            let what = if out.markdown {
                out.text(&c.what)
            } else {
                wrap(&out.text(&c.what), 52, 2)
            };
            let effect = units::bytes_delta(c.peak_effect_bytes as i128);
            vec![
                if part {
                    format!("↳ {effect}")
                } else {
                    effect
                },
                c.kind.as_str().replace('_', " "),
                what,
                join(&shorten_left(&c.site, 44), &shorten_left(&c.module, 44)),
                out.text(&c.category),
                join(&shorten_right(&c.step, 24), &c.phase),
            ]
        };
        for c in &requests[..shown] {
            t.add_row(row(c, false));
            // a change of several causes: those that moved the peak, largest first, where
            // more than one did (one alone would repeat the change's own row); the
            // allocator's rounding that joined it always on its own row, last
            let (rounding, own): (Vec<_>, Vec<_>) = c
                .parts
                .iter()
                .filter(|p| p.peak_effect_bytes != 0)
                .partition(|p| p.kind == Kind::Allocator);
            if own.len() + rounding.len() < 2 {
                continue;
            }
            for p in own.iter().take(PARTS_SHOWN) {
                t.add_row(row(p, true));
            }
            let listed = own.len().min(PARTS_SHOWN) + rounding.len();
            let rest = c.parts.len() - listed;
            if rest > 0 {
                let effect: i64 = own
                    .iter()
                    .skip(PARTS_SHOWN)
                    .map(|p| p.peak_effect_bytes)
                    .sum();
                t.add_row(vec![
                    format!("↳ {}", units::bytes_delta(effect as i128)),
                    String::new(),
                    format!(
                        "{} in this change",
                        units::counted(rest as u64, "more cause")
                    ),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
            for p in rounding {
                t.add_row(row(p, true));
            }
        }
        if requests.len() > shown {
            let rest = &requests[shown..];
            let effect: i64 = rest.iter().map(|c| c.peak_effect_bytes).sum();
            t.add_row(vec![
                units::bytes_delta(effect as i128),
                String::new(),
                format!("{} more causes", rest.len()),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
        writeln!(out, "{}", out.table_of_escaped(&t, "  "))?;
        writeln!(out)?;
    }
    let r = &d.reserved;
    if let (Some(req), Some(set)) = (r.requests_effect_bytes, r.settings_effect_bytes) {
        out.prose(&format!(
            "Reserved {}: the settings {} ({} → {}), the requests {} (the new requests simulated under the base settings: {}).",
            units::bytes_delta(d.peak_reserved_delta_bytes as i128),
            units::bytes_delta(set as i128),
            conf(&b.alloc_conf),
            conf(&n.alloc_conf),
            units::bytes_delta(req as i128),
            r.new_requests_base_settings_bytes.map_or(String::new(), units::bytes)
        ))?;
    } else if r.settings_differ {
        out.prose(&format!(
            "Reserved {}: the settings differ ({} → {}).",
            units::bytes_delta(d.peak_reserved_delta_bytes as i128),
            conf(&b.alloc_conf),
            conf(&n.alloc_conf)
        ))?;
    } else if let Some(c) = d
        .causes
        .iter()
        .find(|c| c.kind == Kind::Allocator && c.reserved_effect_bytes.is_some())
    {
        out.prose(&format!(
            "Reserved {}: {}.",
            units::bytes_delta(d.peak_reserved_delta_bytes as i128),
            c.what
        ))?;
    }
    if let Some(c) = d
        .causes
        .iter()
        .find(|c| c.kind == Kind::Allocator && c.peak_effect_bytes != 0)
    {
        out.prose(&format!(
            "Allocated {} by the allocator alone: {}.",
            units::bytes_delta(c.peak_effect_bytes as i128),
            c.what
        ))?;
    }
    if !d.exact {
        out.prose("Note: a run's peak rebuilt from its blocks differs from its replayed peak; the effects add up to the rebuilt change.")?;
    }
    if !d.alignment_complete {
        out.prose(
            "Note: the runs differ so much that the alignment stopped early; causes are coarser.",
        )?;
    }
    Ok(())
}

/// Causes of one change listed under it (those that moved the peak).
const PARTS_SHOWN: usize = 3;

/// A text in lines of at most `width` characters, broken at spaces, `lines` at most (the last
/// shortened).
fn wrap(s: &str, width: usize, lines: usize) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in s.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push(line);
    if out.len() > lines {
        let rest = out[lines - 1..].join(" ");
        out.truncate(lines - 1);
        out.push(rest);
    }
    out.iter()
        .map(|l| shorten_right(l, width))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Keeps the start of a long text: `3 blocks of 294.00 MiB → 58…`.
fn shorten_right(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let head: String = s.chars().take(max - 1).collect();
        format!("{head}…")
    }
}

fn conf(c: &str) -> String {
    if c.is_empty() {
        "defaults".to_string()
    } else {
        c.to_string()
    }
}

fn seconds(us: i64) -> String {
    format!("{:.2} s", us as f64 / 1e6)
}

/// Writes the diffs of several ranks: one line per rank, then each rank's diff.
pub fn write_many(out: &mut Out, diffs: &[(String, Diff)], top: usize) -> io::Result<()> {
    let mut t = table(&["rank", "base peak", "new peak", "change", "verdict"]);
    for (name, d) in diffs {
        t.add_row(vec![
            name.clone(),
            units::bytes(d.base.peak_allocated_bytes),
            units::bytes(d.new.peak_allocated_bytes),
            change(d.peak_allocated_delta_bytes, d.base.peak_allocated_bytes),
            d.verdict.clone(),
        ]);
    }
    writeln!(out, "{}", out.table(&t, "  "))?;
    for (name, d) in diffs {
        writeln!(out)?;
        if out.markdown {
            writeln!(out, "## {}", out.text(name))?;
        } else {
            writeln!(out, "── {} ──", out.text(name))?;
        }
        write(out, d, top, None)?;
    }
    Ok(())
}

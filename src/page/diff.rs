//! The diff page: two runs on one time axis, the causes of the difference listed, and a click
//! on a cause drawing its blocks (what `memsnap diff BASE NEW --html PAGE` writes).
//!
//! The axis is the diff's merged timeline ([`crate::diff::Timeline`]): every allocation and
//! free of either run one position, the aligned requests of the two runs side by side, so the
//! same moment of the program is at the same place in both curves whatever each run's clock
//! said. Each curve is drawn in [`Timeline::COLUMNS`] columns (the highest allocated bytes in
//! each); each listed cause carries its own columns, base blocks and new blocks apart, cut to
//! the columns where it holds anything. The page stays well under 1 MB whatever the traces.

use std::io::{self, Write};

use serde_json::{json, Value};

use crate::diff::{Diff, Timeline};

const TEMPLATE: &str = include_str!("diff.html");

/// Most causes listed on the page (the rest are counted, with their summed effect).
pub const MAX_CAUSES: usize = 200;

/// A cause's columns cut to where they are non-zero: `[first column, values...]`, or `[]`.
fn trimmed(columns: &[u64]) -> Value {
    let Some(first) = columns.iter().position(|&v| v > 0) else {
        return json!([]);
    };
    let last = columns.iter().rposition(|&v| v > 0).unwrap_or(first);
    let mut out = vec![first as u64];
    out.extend_from_slice(&columns[first..=last]);
    json!(out)
}

/// The page's data: the two sides, the curves and the causes with their columns.
pub fn data(title: &str, d: &Diff) -> Value {
    let t: &Timeline = &d.timeline;
    let side = |s: &crate::diff::Side| {
        json!({
            "file": s.file,
            "peak_allocated_bytes": s.peak_allocated_bytes,
            "peak_reserved_bytes": s.peak_reserved_bytes,
            "requests": s.requests,
            "alloc_conf": s.alloc_conf,
        })
    };
    let causes: Vec<Value> = d
        .causes
        .iter()
        .take(MAX_CAUSES)
        .map(|c| {
            json!([
                c.kind.as_str(),
                c.site,
                c.module,
                c.category,
                c.step,
                c.phase,
                c.peak_effect_bytes,
                c.what,
                trimmed(&t.spans_by_column(&c.spans, -1)),
                trimmed(&t.spans_by_column(&c.spans, 1)),
            ])
        })
        .collect();
    let rest = d.causes.iter().skip(MAX_CAUSES);
    json!({
        "title": title,
        "base": side(&d.base),
        "new": side(&d.new),
        "delta": d.peak_allocated_delta_bytes,
        "delta_reserved": d.peak_reserved_delta_bytes,
        "verdict": d.verdict,
        "notes": d.notes,
        "exact": d.exact,
        "positions": t.positions,
        "curves": [t.base, t.new],
        "causes": causes,
        "more": [rest.clone().count(), rest.map(|c| c.peak_effect_bytes).sum::<i64>()],
    })
}

/// Writes the diff page of `d` to `out`.
pub fn write(out: &mut dyn Write, title: &str, d: &Diff) -> io::Result<()> {
    let text = serde_json::to_string(&data(title, d)).map_err(io::Error::other)?;
    let text = crate::escape::json(&text).replace('<', "\\u003c");
    let title = super::escape_text(&crate::escape::printable(title));
    super::fill(out, TEMPLATE, &[("title", &title), ("data", &text)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_cut_to_where_they_hold_bytes() {
        assert_eq!(trimmed(&[0, 0, 5, 0, 7, 0]), json!([2, 5, 0, 7]));
        assert_eq!(trimmed(&[0, 0]), json!([]));
        assert_eq!(trimmed(&[3]), json!([0, 3]));
    }
}

//! `memsnap whatif` and `memsnap oom` as text.

use std::io::{self, Write};

use comfy_table::{CellAlignment, Table};

use super::{table, write_shares, Out, TextOptions};
use crate::report::oom::{DeviceOom, OomExplanation, OomReport};
use crate::report::whatif::{
    CapFrom, CapKnown, DeviceWhatIf, ScaleCheck, ScaleReport, Scenario, SizePrediction, Verdict,
    WhatIfReport,
};
use crate::simulate::scale::{Growth, Method};
use crate::simulate::{SelfCheck, SimOom};
use crate::units;

/// Writes the what-if tables of one file.
pub fn write_whatif(out: &mut dyn Write, r: &WhatIfReport, markdown: bool) -> io::Result<()> {
    let out = &mut Out::new(out, markdown);
    if r.devices.is_empty() {
        writeln!(
            out,
            "{}: no device has trace events to simulate (memory history was not recorded)",
            out.text(&r.file)
        )?;
    }
    for d in &r.devices {
        write_device(out, &r.file, d)?;
    }
    Ok(())
}

fn write_device(out: &mut Out, file: &str, d: &DeviceWhatIf) -> io::Result<()> {
    let file = out.text(file);
    writeln!(out, "{file} · {}", crate::snapshot::device_name(d.device))?;
    let from = match d.recorded.settings_from {
        "snapshot" => "as the snapshot's allocator_settings say",
        "given" => "as given with --recorded-conf",
        _ => "inferred from the trace (the snapshot has no allocator_settings)",
    };
    writeln!(
        out,
        "  recorded with {} ({from}); {}",
        out.text(&d.recorded.alloc_conf),
        units::counted(d.events as u64, "event")
    )?;
    writeln!(out, "  {}", self_check_line(&d.self_check))?;
    if let Some(line) = cap_line(&d.cap, d.recorded.oom.is_some()) {
        writeln!(out, "  {line}")?;
    }
    let with_min_cap = d.simulated.iter().any(|s| s.min_cap_bytes.is_some());
    let header = scenario_header(with_min_cap);
    let mut t = table(&header);
    if let Some(c) = t.column_mut(header.len() - 1) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    let rec = &d.recorded;
    let mut row = vec![
        format!("recorded: {}", rec.alloc_conf),
        "-".to_string(),
        units::bytes(rec.peak_allocated_bytes),
        units::bytes(rec.peak_reserved_bytes),
        units::bytes(rec.fragmentation_at_peak_bytes),
        match &rec.oom {
            Some(o) => format!("OOM at event {}", units::count(o.event as u64)),
            None => "fits".to_string(),
        },
    ];
    if with_min_cap {
        row.insert(5, String::new());
    }
    t.add_row(row);
    for s in &d.simulated {
        t.add_row(scenario_row(s, with_min_cap));
    }
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))?;
    if let Some(o) = &rec.oom {
        writeln!(
            out,
            "  recorded: {} failed with {} allocated, {} reserved",
            units::bytes(o.requested_bytes),
            units::bytes(o.allocated_bytes),
            units::bytes(o.reserved_bytes)
        )?;
    }
    for s in &d.simulated {
        if let Some(o) = &s.outcome.oom {
            let conf = out.text(&s.outcome.alloc_conf);
            writeln!(out, "  {conf}: {}", failure_text(o))?;
        }
    }
    writeln!(out)
}

/// What the simulations assumed of the cap, when that needs saying.
fn cap_line(cap: &CapKnown, recorded_oom: bool) -> Option<String> {
    match (cap.from, cap.range, cap.bytes) {
        (CapFrom::Capture, _, Some(c)) => Some(format!(
            "cap {}: the allocator's own, as the program read it (memsnap.Capture)",
            units::bytes(c)
        )),
        (CapFrom::Trace, Some([lo, hi]), _) => Some(format!(
            "the cap is not recorded: between {} (the peak the run reserved) and {} (what its refusals allow); each outcome holds over that whole range, or names the cap it needs (--cap gives the real one)",
            units::bytes(lo),
            units::bytes(hi)
        )),
        (CapFrom::None, _, _) if recorded_oom => Some(
            "no cap applied: the trace does not bound one (--cap gives the real one)".to_string(),
        ),
        _ => None,
    }
}

/// A setting's outcome, judged against what is known of the cap.
fn verdict_text(s: &Scenario) -> String {
    match (s.verdict, s.verdict_cap_bytes) {
        (Verdict::FitsIfCapAtLeast, Some(c)) => {
            format!("fits if the cap is at least {}", units::bytes(c))
        }
        (Verdict::FitsIfCapAtLeast, None) => "fits under some caps of the range".to_string(),
        _ => outcome_text(s.outcome.oom.as_ref()),
    }
}

/// The columns of a simulated setting's row ([`scenario_row`]).
fn scenario_header(with_min_cap: bool) -> Vec<&'static str> {
    let mut header = vec![
        "settings",
        "cap",
        "peak allocated",
        "peak reserved",
        "fragmentation",
        "outcome",
    ];
    if with_min_cap {
        header.insert(5, "smallest cap");
    }
    header
}

/// A simulated failure in words.
fn failure_text(o: &SimOom) -> String {
    let what = if o.recorded_failure {
        "the request that failed in the recorded run".to_string()
    } else {
        format!("a request of {}", units::bytes(o.requested_bytes))
    };
    format!(
        "{what} fails at event {} with {} allocated, {} reserved (largest free block {})",
        units::count(o.event as u64),
        units::bytes(o.allocated_bytes),
        units::bytes(o.reserved_bytes),
        units::bytes(o.largest_free_block_bytes)
    )
}

/// One simulated setting as a table row.
fn scenario_row(s: &Scenario, with_min_cap: bool) -> Vec<String> {
    let o = &s.outcome;
    let mut row = vec![
        o.alloc_conf.clone(),
        o.cap_bytes.map_or("-".to_string(), units::bytes),
        units::bytes(o.peak_allocated_bytes),
        units::bytes(o.peak_reserved_bytes),
        units::bytes(o.fragmentation_at_peak_bytes),
        verdict_text(s),
    ];
    if with_min_cap {
        row.insert(
            5,
            s.min_cap_bytes
                .map_or("never fits".to_string(), units::bytes),
        );
    }
    row
}

fn outcome_text(oom: Option<&SimOom>) -> String {
    match oom {
        None => "fits".to_string(),
        Some(o) if o.recorded_failure => "OOM as recorded".to_string(),
        Some(o) => format!("OOM at event {}", units::count(o.event as u64)),
    }
}

/// "simulation reproduces the recorded run: ..." or how far it is off.
pub fn self_check_line(c: &SelfCheck) -> String {
    let segments = format!(
        "{} of {} segment events equal",
        units::count(c.segment_events_equal as u64),
        units::count(c.segment_events as u64)
    );
    let cap = match (c.cap_bytes, c.cap_inferred) {
        (Some(cap), true) => format!(
            " (cap taken as {}, the most the recorded refusals allow)",
            units::bytes(cap)
        ),
        _ => String::new(),
    };
    let mut line = if c.exact {
        format!("simulation reproduces the recorded run: peak reserved equal, {segments}{cap}")
    } else {
        let mut parts = vec![format!(
            "peak reserved {} simulated vs {} recorded",
            units::bytes(c.simulated_peak_reserved_bytes),
            units::bytes(c.recorded_peak_reserved_bytes)
        )];
        parts.push(segments);
        if c.simulated_segment_events != c.segment_events {
            parts.push(format!(
                "{} simulated",
                units::counted(c.simulated_segment_events as u64, "segment event")
            ));
        }
        if c.reserved_mismatches > 0 {
            parts.push(format!(
                "reserved differs after {} by up to {}",
                units::counted(c.reserved_mismatches as u64, "event"),
                units::bytes(c.max_reserved_diff_bytes)
            ));
        }
        if c.recorded_oom_event != c.simulated_oom_event {
            parts.push(format!(
                "failure at {} recorded, {} simulated",
                c.recorded_oom_event
                    .map_or("none".into(), |e| format!("event {e}")),
                c.simulated_oom_event
                    .map_or("none".into(), |e| format!("event {e}")),
            ));
        }
        format!(
            "simulation differs from the recorded run{cap}: {}",
            parts.join(", ")
        )
    };
    if let Some(note) = &c.note {
        line.push_str(&format!("; note: {note}"));
    }
    line
}

/// Writes `memsnap oom` for one file.
pub fn write_oom(out: &mut dyn Write, r: &OomReport, options: &TextOptions) -> io::Result<()> {
    let out = &mut Out::new(out, options.markdown);
    if r.devices.is_empty() {
        writeln!(
            out,
            "{}: no device has trace events (memory history was not recorded), so no failure to explain",
            out.text(&r.file)
        )?;
    }
    for DeviceOom { device, oom } in &r.devices {
        writeln!(
            out,
            "{} · {}",
            out.text(&r.file),
            crate::snapshot::device_name(*device)
        )?;
        match oom {
            Some(e) => write_explanation(out, e, options)?,
            None => writeln!(out, "  no out-of-memory error in this trace")?,
        }
        writeln!(out)?;
    }
    Ok(())
}

/// The failure's figures, verdict, what was live and the what-ifs.
pub fn write_explanation(
    out: &mut Out,
    e: &OomExplanation,
    options: &TextOptions,
) -> io::Result<()> {
    writeln!(
        out,
        "  OUT OF MEMORY at event {}: {} requested, which needed a {} segment",
        units::count(e.event as u64),
        units::bytes(e.requested_bytes),
        units::bytes(e.alloc_size_bytes)
    )?;
    if let Some(first) = e.survived.first() {
        let largest = e
            .survived
            .iter()
            .map(|o| o.requested_bytes)
            .max()
            .unwrap_or(0);
        writeln!(
            out,
            "  before it, {} failed request{} survived (caught by a library such as cuDNN, which falls back to a kernel with a smaller workspace, or by the program): the first {} at event {}, the largest {}",
            units::count(e.survived.len() as u64),
            if e.survived.len() == 1 { " was" } else { "s were" },
            units::bytes(first.requested_bytes),
            units::count(first.event as u64),
            units::bytes(largest)
        )?;
    }
    let allowed = match (e.cap_bytes, e.cap_inferred) {
        (Some(c), false) => format!(" {} allowed;", units::torch_size(c)),
        _ => String::new(),
    };
    writeln!(
        out,
        "  PyTorch's message: \"Tried to allocate {}. ...{allowed} Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.\"",
        units::torch_size(e.alloc_size_bytes),
        units::torch_size(e.allocated_bytes),
        units::torch_size(e.reserved_unallocated_bytes)
    )?;
    let mut facts = vec![
        format!("device free {}", units::bytes(e.device_free_bytes)),
        format!(
            "largest free cached block {}",
            units::bytes(e.largest_free_block_bytes)
        ),
    ];
    match (e.cap.bytes, e.cap.range) {
        (Some(c), _) if e.cap.from == CapFrom::Capture => {
            facts.push(format!("cap {} (the program's)", units::bytes(c)))
        }
        (Some(c), _) => facts.push(format!("cap {}", units::bytes(c))),
        (None, Some([lo, hi])) => facts.push(format!(
            "cap between {} and {} (not recorded)",
            units::bytes(lo),
            units::bytes(hi)
        )),
        (None, None) => {}
    }
    if let Some(n) = e.non_pytorch_bytes {
        facts.push(format!("outside PyTorch {}", units::bytes(n)));
    }
    writeln!(out, "  {}", facts.join(" · "))?;
    let verdict = out.text(&e.explanation);
    writeln!(out, "  verdict: {verdict}")?;
    if let Some(short) = e.short_by_bytes.filter(|&s| s > 0) {
        writeln!(out, "  short by {}", units::bytes(short))?;
    }
    for dim in ["category", "step", "stage"] {
        if let Some(shares) = e.live.get(dim) {
            write_shares(
                out,
                &format!("live at the failure, by {dim}"),
                shares,
                e.allocated_bytes,
                options.top,
            )?;
        }
    }
    write_shares(
        out,
        "top allocation sites live at the failure",
        &e.top_sites,
        e.allocated_bytes,
        options.top.min(5),
    )?;
    let title = match (e.cap.bytes, e.cap.range) {
        (Some(c), _) => format!("what if, cap {}", units::bytes(c)),
        (None, Some([lo, hi])) => {
            format!("what if, cap {} to {}", units::bytes(lo), units::bytes(hi))
        }
        (None, None) => "what if".to_string(),
    };
    let mut t = table(&[&title, "peak allocated", "peak reserved", "outcome"]);
    if let Some(c) = t.column_mut(3) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    for s in &e.whatif {
        let o = &s.outcome;
        t.add_row(vec![
            o.alloc_conf.clone(),
            units::bytes(o.peak_allocated_bytes),
            units::bytes(o.peak_reserved_bytes),
            verdict_text(s),
        ]);
    }
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))?;
    for s in &e.whatif {
        if let Some(o) = &s.outcome.oom {
            let conf = out.text(&s.outcome.alloc_conf);
            writeln!(out, "  {conf}: {}", failure_text(o))?;
        }
    }
    if e.cap.range.is_some() && e.cap.bytes.is_none() {
        writeln!(
            out,
            "  the snapshot does not record the cap: each outcome holds for every cap the trace allows, or names the cap it needs; give --cap for the real one"
        )?;
    }
    writeln!(
        out,
        "  {}",
        match e.min_cap_bytes {
            Some(c) => format!(
                "with the recorded settings, the recorded work fits under a cap of {}",
                units::bytes(c)
            ),
            None => "with the recorded settings, the recorded work does not fit under any cap"
                .to_string(),
        }
    )
}

/// Writes `memsnap whatif --scale`: the snapshots given, the prediction at each size asked for
/// under each setting, how the requests were fitted, and the check of the largest snapshot.
pub fn write_scale(out: &mut dyn Write, r: &ScaleReport, markdown: bool) -> io::Result<()> {
    let out = &mut Out::new(out, markdown);
    let what = match r.method {
        Method::Fit => "each request's size fitted across the snapshots",
        Method::Categories => "sizes scaled by category from one snapshot",
        Method::Schedule => "micro-batches added to one pipeline rank's schedule",
    };
    let device = r.inputs.first().map_or(0, |i| i.device);
    writeln!(
        out,
        "{} of one program · device {device} · {what}",
        units::counted(r.inputs.len() as u64, "snapshot")
    )?;
    let conf = out.text(&r.recorded_alloc_conf);
    writeln!(out, "  recorded with {conf}")?;
    let t = scale_table(r);
    // lines about one size, under its line (a list item of their own in Markdown)
    let sub = if out.markdown { "" } else { "  " };
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))?;
    for s in &r.sizes {
        write_size_notes(out, r, s, sub)?;
    }
    if let Some(c) = &r.check {
        write_scale_check(out, c)?;
    }
    for a in &r.assumptions {
        out.prose(&format!("assumed: {a}"))?;
    }
    writeln!(out)
}

/// The table of `memsnap whatif --scale`: each snapshot as recorded, then each size predicted
/// under each setting.
fn scale_table(r: &ScaleReport) -> Table {
    let with_min_cap = r
        .sizes
        .iter()
        .any(|s| s.simulated.iter().any(|x| x.min_cap_bytes.is_some()));
    let mut header = vec!["size", "from"];
    header.extend(scenario_header(with_min_cap));
    let mut t = table(&header);
    for c in [1, 2, header.len() - 1] {
        if let Some(c) = t.column_mut(c) {
            c.set_cell_alignment(CellAlignment::Left);
        }
    }
    for i in &r.inputs {
        let mut row = vec![
            units::count(i.size),
            "recorded".to_string(),
            String::new(),
            "-".to_string(),
            units::bytes(i.peak_allocated_bytes),
            units::bytes(i.peak_reserved_bytes),
            String::new(),
            if i.oom { "OOM" } else { "fits" }.to_string(),
        ];
        if with_min_cap {
            row.insert(7, String::new());
        }
        t.add_row(row);
    }
    for s in &r.sizes {
        for x in &s.simulated {
            let mut row = scenario_row(x, with_min_cap);
            row.insert(0, units::count(s.size));
            row.insert(1, "predicted".to_string());
            if x.outcome.oom.is_some() {
                // its place is in the predicted stream, said below
                *row.last_mut().expect("an outcome") = "OOM".to_string();
            }
            t.add_row(row);
        }
    }
    t
}

/// The lines under one predicted size: its growth, how its requests were fitted, the repeated
/// run, and where each setting ran out of memory.
fn write_size_notes(
    out: &mut Out,
    r: &ScaleReport,
    s: &SizePrediction,
    sub: &str,
) -> io::Result<()> {
    let growth = match s.growth_per_unit_bytes {
        Some(g) => format!(
            ": peak allocated {}{} per unit of size",
            if g < 0.0 { "-" } else { "+" },
            units::bytes(g.abs().round() as u64)
        ),
        None => String::new(),
    };
    // what does not grow: constant requests and blocks from before the trace
    let base_peak = r
        .inputs
        .iter()
        .find(|i| i.size == s.base_size)
        .map_or(0, |i| i.peak_allocated_bytes);
    let grows: u64 = s
        .fits
        .iter()
        .filter(|g| g.bytes_at_target != g.bytes_at_base_peak)
        .map(|g| g.bytes_at_base_peak)
        .sum();
    let fixed = if base_peak > 0 && s.growth_per_unit_bytes.is_some() && s.repeat.is_none() {
        format!(
            ", {:.1}% of its peak fixed",
            base_peak.saturating_sub(grows) as f64 / base_peak as f64 * 100.0
        )
    } else {
        String::new()
    };
    out.prose(&format!(
        "size {} from the snapshot at size {}{growth}{fixed}",
        units::count(s.size),
        units::count(s.base_size)
    ))?;
    let parts: Vec<String> = s
        .fits
        .iter()
        .map(|g| {
            let unverified = if g.unverified > 0 && r.method == Method::Fit {
                format!(", {} unverified", units::count(g.unverified as u64))
            } else {
                String::new()
            };
            let bytes = if g.growth == Growth::Constant || g.bytes_at_base_peak == g.bytes_at_target
            {
                format!("{} at the peak", units::bytes(g.bytes_at_base_peak))
            } else {
                format!(
                    "{} at the peak → {}",
                    units::bytes(g.bytes_at_base_peak),
                    units::bytes(g.bytes_at_target)
                )
            };
            format!(
                "{} {} ({bytes}{unverified})",
                units::count(g.requests as u64),
                g.growth.as_str()
            )
        })
        .collect();
    if parts.is_empty() {
        out.prose(&format!(
            "{sub}requests: none in the trace (blocks from before it stay as they were)"
        ))?;
    } else {
        out.prose(&format!("{sub}requests: {}", parts.join(", ")))?;
    }
    if let Some(rep) = &s.repeat {
        out.prose(&format!(
            "{sub}the stream grows by {:.1} requests per unit: a run of {} repeated to add {}{}",
            rep.requests_per_unit,
            units::count(rep.run_requests as u64),
            units::count(rep.added_requests as u64),
            if rep.unsteady_frees > 0 {
                format!(
                    " (the run also frees {} made before the loop: not a steady iteration, \
                     a less sure estimate; a snapshot with more iterations helps)",
                    units::count(rep.unsteady_frees as u64)
                )
            } else {
                String::new()
            }
        ))?;
    }
    for x in &s.simulated {
        if let Some(o) = &x.outcome.oom {
            out.prose(&format!(
                "{sub}{}: {}",
                x.outcome.alloc_conf,
                failure_text(o).replace(" at event ", " at op ")
            ))?;
        }
    }
    Ok(())
}

/// The check line: the largest snapshot predicted from the others, beside what it recorded.
fn write_scale_check(out: &mut Out, c: &ScaleCheck) -> io::Result<()> {
    let pct = |p: u64, q: u64| {
        if q == 0 {
            String::new()
        } else {
            format!(" ({:+.1}%)", (p as f64 - q as f64) / q as f64 * 100.0)
        }
    };
    let from: Vec<String> = c.from_sizes.iter().map(|&x| units::count(x)).collect();
    out.prose(&format!(
        "check: size {} predicted from {}: peak allocated {}, recorded {}{}; peak reserved {}, recorded {}{}",
        units::count(c.size),
        from.join(", "),
        units::bytes(c.predicted_peak_allocated_bytes),
        units::bytes(c.recorded_peak_allocated_bytes),
        pct(c.predicted_peak_allocated_bytes, c.recorded_peak_allocated_bytes),
        units::bytes(c.predicted_peak_reserved_bytes),
        units::bytes(c.recorded_peak_reserved_bytes),
        pct(c.predicted_peak_reserved_bytes, c.recorded_peak_reserved_bytes),
    ))?;
    Ok(())
}

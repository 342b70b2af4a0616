//! The human report: short sentences and aligned tables with units. [`compare`] renders
//! comparisons the same way.

pub mod compare;
pub mod diff;
pub mod whatif;

use std::io::{self, Write};

use comfy_table::{CellAlignment, ContentArrangement, LineStyle, Row, Table, TableStyle};

use super::{DeviceReport, FileReport};
use crate::analysis::{Dimension, Share};
use crate::{escape, units};

/// What the text shows (the data holds more).
#[derive(Clone, Debug)]
pub struct TextOptions {
    /// Peak breakdowns to show, in order.
    pub by: Vec<Dimension>,
    /// Rows per table.
    pub top: usize,
    /// GitHub-flavoured Markdown instead of terminal text.
    pub markdown: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            by: vec![Dimension::Category, Dimension::Step, Dimension::Stage],
            top: 8,
            markdown: false,
        }
    }
}

/// Where a view is written, and in which form: aligned text for a terminal, or GitHub-flavoured
/// Markdown for a pull request. Every writer of a view takes one, so a view's tables and lines
/// all follow its form.
pub struct Out<'a> {
    w: &'a mut dyn Write,
    /// Tables as Markdown tables, lines of prose as list items.
    pub markdown: bool,
    /// In Markdown, the spaces that opened the line being written, held until its first other
    /// byte (`None` once the line has begun).
    indent: Option<usize>,
}

impl<'a> Out<'a> {
    /// Writes to `w`, as Markdown when `markdown` is set.
    pub fn new(w: &'a mut dyn Write, markdown: bool) -> Out<'a> {
        Out {
            w,
            markdown,
            indent: Some(0),
        }
    }

    /// `s` as this form shows a name: on one line, its control characters escaped
    /// ([`escape::printable`]), and in Markdown its `|`, backticks and `<` too
    /// ([`escape::markdown`]). Every string of the snapshot or the command line that a view
    /// writes outside a table or [`Out::prose`] passes through here.
    pub fn text(&self, s: &str) -> String {
        if self.markdown {
            escape::markdown(s).into_owned()
        } else {
            escape::printable(s).into_owned()
        }
    }

    /// A line of prose between a view's tables: indented in text; in Markdown a list item,
    /// since lines in a row would otherwise run together into one paragraph. The line is
    /// escaped as [`Out::text`] escapes a name.
    pub fn prose(&mut self, text: &str) -> io::Result<()> {
        let text = self.text(text);
        if self.markdown {
            writeln!(self.w, "- {text}")
        } else {
            writeln!(self.w, "  {text}")
        }
    }

    /// A rendered table: every line indented by `by` in text; a Markdown table otherwise.
    /// Every cell is escaped as [`Out::text`] escapes a name, so that no name can end a row or
    /// a cell.
    pub fn table(&self, t: &Table, by: &str) -> String {
        self.table_of_escaped(&self.escaped(t), by)
    }

    /// [`Out::table`] of a table whose cells the caller escaped already, each part with
    /// [`Out::text`]: its own line breaks stay line breaks (several lines in one cell).
    pub fn table_of_escaped(&self, t: &Table, by: &str) -> String {
        if self.markdown {
            let mut md = t.clone();
            md.load_style(comfy_table::presets::ASCII_MARKDOWN);
            return md
                .to_string()
                .lines()
                .map(str::trim_end)
                .collect::<Vec<_>>()
                .join("\n");
        }
        t.to_string()
            .lines()
            .map(|l| format!("{by}{}", l.trim_end()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Out<'_> {
    /// `t` with every cell and header escaped for this form.
    fn escaped(&self, t: &Table) -> Table {
        let row = |r: &Row| {
            Row::from(
                r.cell_iter()
                    .map(|c| self.text(&c.content()))
                    .collect::<Vec<_>>(),
            )
        };
        let mut out = t.clone();
        if let Some(h) = t.header() {
            out.set_header(row(h));
        }
        for (i, r) in t.row_iter().enumerate() {
            if let Some(slot) = out.row_mut(i) {
                *slot = row(r);
            }
        }
        out
    }
}

/// In Markdown, a text view's indented lines (two spaces: a line of prose under the headline
/// figures; four: a detail of the line above) become list items and nested items: indented
/// under a list item they would run on into it as one paragraph.
impl Write for Out<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if !self.markdown {
            return self.w.write_all(buf);
        }
        let mut rest = buf;
        while !rest.is_empty() {
            match self.indent {
                Some(n) => {
                    let spaces = rest.iter().take_while(|&&b| b == b' ').count();
                    rest = &rest[spaces..];
                    let n = n + spaces;
                    match rest.first() {
                        None => self.indent = Some(n),
                        Some(b'\n') => {
                            self.indent = Some(0);
                            self.w.write_all(b"\n")?;
                            rest = &rest[1..];
                        }
                        Some(_) => {
                            self.indent = None;
                            let lead: &[u8] = match n {
                                0 => b"",
                                1..=3 => b"- ",
                                _ => b"  - ",
                            };
                            self.w.write_all(lead)?;
                        }
                    }
                }
                None => {
                    let end = rest.iter().position(|&b| b == b'\n');
                    let cut = end.map_or(rest.len(), |e| e + 1);
                    self.w.write_all(&rest[..cut])?;
                    if end.is_some() {
                        self.indent = Some(0);
                    }
                    rest = &rest[cut..];
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

const STYLE: TableStyle =
    TableStyle::new().header_separator(LineStyle::none().fill('─').junction('─'));

/// A table in memsnap's style: a header rule, right-aligned figures (all columns but the
/// first; see [`table_with_text`] for more text columns).
pub fn table(header: &[&str]) -> Table {
    table_with_text(header, 1)
}

/// A table whose first `text_columns` columns are left-aligned text.
pub fn table_with_text(header: &[&str], text_columns: usize) -> Table {
    let mut t = Table::new();
    t.load_style(STYLE)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for i in text_columns..header.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// The widest label a table shows; longer ones (allocation sites) keep their end, where the
/// innermost frames are, so the text stays within 120 columns. JSON keeps them whole.
pub const MAX_LABEL: usize = 72;

/// Keeps the end of a long label: `…forward:78;forward:64`.
pub fn shorten_left(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        let tail: String = s.chars().skip(n - (max - 1)).collect();
        format!("…{tail}")
    }
}

/// Writes the report of one file.
pub fn write(out: &mut dyn Write, report: &FileReport, options: &TextOptions) -> io::Result<()> {
    write_file(&mut Out::new(out, options.markdown), report, options)
}

fn write_file(out: &mut Out, report: &FileReport, options: &TextOptions) -> io::Result<()> {
    if report.devices.is_empty() {
        let file = out.text(&report.file);
        writeln!(out, "{file}: no devices with events or segments")?;
    }
    for d in &report.devices {
        write_device(out, report, d, options)?;
    }
    Ok(())
}

/// Joins parts with ` · ` into lines of at most `width` characters (a longer part stands
/// alone on its line).
fn wrap_parts(parts: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for part in parts {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 3 + part.chars().count() <= width => {
                line.push_str(" · ");
                line.push_str(part);
            }
            _ => lines.push(part.clone()),
        }
    }
    lines
}

/// The probes of one device in words: what was outside PyTorch at the first, then how much each
/// later one added, and the device's use beside PyTorch's reserved bytes at the last.
fn probe_lines(report: &FileReport, device: u32) -> Vec<String> {
    let probes: Vec<_> = report
        .probes
        .iter()
        .filter(|p| p.device == device)
        .collect();
    let Some(first) = probes.first() else {
        return Vec::new();
    };
    let mut parts = vec![format!(
        "{} at \"{}\"",
        units::bytes(first.outside_bytes),
        first.name
    )];
    let mut last = first.outside_bytes;
    for p in &probes[1..] {
        let (sign, delta) = if p.outside_bytes >= last {
            ("+", p.outside_bytes - last)
        } else {
            ("-", last - p.outside_bytes)
        };
        parts.push(format!("{sign}{} at \"{}\"", units::bytes(delta), p.name));
        last = p.outside_bytes;
    }
    let end = probes.last().expect("one probe");
    let mut lines = wrap_parts(&parts, 100);
    if let Some(l) = lines.first_mut() {
        *l = format!("outside PyTorch: {l}");
    }
    lines.push(format!(
        "at \"{}\": device used {} of {}, PyTorch reserved {}, outside PyTorch {}",
        end.name,
        units::bytes(end.device_used_bytes),
        units::bytes(end.device_total_bytes),
        units::bytes(end.reserved_bytes),
        units::bytes(end.outside_bytes)
    ));
    lines
}

fn status_line(d: &DeviceReport) -> Vec<String> {
    let mut parts = vec![format!(
        "{} over {}",
        units::counted(d.events as u64, "event"),
        units::duration_us(d.duration_us)
    )];
    parts.push(format!("stacks: {}", d.stacks.describe()));
    parts.push(if d.events == 0 {
        "no trace recorded (history off?)".to_string()
    } else if d.trace_complete {
        "trace complete".to_string()
    } else if d.trace_wrapped {
        format!(
            "ring buffer wrapped: the trace lost its beginning ({} of earlier allocations)",
            units::counted(d.frees_without_alloc, "free")
        )
    } else {
        format!(
            "{} of blocks allocated before recording started",
            units::counted(d.frees_without_alloc, "free")
        )
    });
    let odd =
        d.check.anomalies + d.unknown_actions + d.events_out_of_time_order + d.impossible_times;
    parts.push(if d.replay_consistent && odd == 0 {
        "replay matches the snapshot exactly".to_string()
    } else if d.replay_consistent {
        "replay matches the snapshot's blocks".to_string()
    } else {
        format!(
            "replay differs from the snapshot ({})",
            units::counted(d.check.block_mismatches, "block")
        )
    });
    if d.check.anomalies > 0 {
        parts.push(format!(
            "{} the replay could not place (frees of unknown blocks, allocations on no free \
             block, sizes no GPU holds)",
            units::counted(d.check.anomalies, "event")
        ));
        // the impossible sizes, by event index
        for example in d
            .check
            .examples
            .iter()
            .filter(|e| e.contains("more than any GPU"))
        {
            parts.push(example.clone());
        }
    }
    if d.unknown_actions > 0 {
        parts.push(format!(
            "{} of unknown actions passed over",
            units::counted(d.unknown_actions, "event")
        ));
    }
    if d.events_out_of_time_order > 0 {
        parts.push(format!(
            "{} earlier than the one before (clock went backwards)",
            units::counted(d.events_out_of_time_order, "event")
        ));
    }
    if d.impossible_times > 0 {
        parts.push(format!(
            "{} with a time no clock gives (negative, or centuries ahead), read as untimed",
            units::counted(d.impossible_times, "event")
        ));
    }
    parts
}

fn write_device(
    out: &mut Out,
    report: &FileReport,
    d: &DeviceReport,
    options: &TextOptions,
) -> io::Result<()> {
    if out.markdown {
        return write_markdown_device(out, report, d, options);
    }
    let file = out.text(&report.file);
    writeln!(out, "{file} · {}", crate::snapshot::device_name(d.device))?;
    let mut status = status_line(d);
    if let Some(conf) = report
        .allocator_settings
        .as_ref()
        .filter(|_| d.device != crate::snapshot::HOST_DEVICE)
    {
        status.push(format!("allocator: {conf}"));
    }
    for line in wrap_parts(&status, 116) {
        let line = out.text(&line);
        writeln!(out, "  {line}")?;
    }
    for line in probe_lines(report, d.device) {
        let line = out.text(&line);
        writeln!(out, "  {line}")?;
    }
    writeln!(out)?;
    let mut t = table(&["", "allocated", "requested", "reserved"]);
    t.add_row(vec![
        "trace start".to_string(),
        units::bytes(d.start_allocated_bytes),
        units::bytes(d.start_requested_bytes),
        units::bytes(d.start_reserved_bytes),
    ]);
    t.add_row(vec![
        "peak".to_string(),
        units::bytes(d.peak_allocated_bytes),
        units::bytes(d.peak_requested_bytes),
        units::bytes(d.peak_reserved_bytes),
    ]);
    t.add_row(vec![
        "end".to_string(),
        units::bytes(d.end_allocated_bytes),
        units::bytes(d.end_requested_bytes),
        units::bytes(d.end_reserved_bytes),
    ]);
    writeln!(out, "{}", out.table(&t, "  "))?;
    writeln!(out)?;
    match d.peak_event_index {
        Some(i) => writeln!(
            out,
            "  peak allocated after event {} ({} into the trace); reserved then {}",
            units::count(i as u64),
            units::duration_us(d.peak_time_offset_us),
            units::bytes(d.reserved_at_peak_bytes)
        )?,
        None => writeln!(out, "  peak allocated before the first recorded event")?,
    }
    writeln!(
        out,
        "  fragmentation (reserved - allocated): {} at the peak, {} at the end; largest free block {}",
        units::bytes(d.fragmentation_at_peak_bytes),
        units::bytes(d.fragmentation_at_end_bytes),
        units::bytes(d.largest_free_block_bytes)
    )?;
    write_pools(out, d)?;
    if let Some(e) = &d.oom_explanation {
        whatif::write_explanation(out, e, options)?;
        writeln!(out)?;
    }
    write_attribution(out, d, options)?;
    if !d.replay_consistent {
        writeln!(
            out,
            "  replay check: allocated {} vs snapshot {}, reserved {} vs {}",
            units::bytes(d.check.replayed_allocated),
            units::bytes(d.check.snapshot_allocated),
            units::bytes(d.check.replayed_reserved),
            units::bytes(d.check.snapshot_reserved)
        )?;
        for e in &d.check.examples {
            writeln!(out, "    {e}")?;
        }
    }
    writeln!(out)
}

pub(crate) fn write_shares(
    out: &mut Out,
    title: &str,
    shares: &[Share],
    total: u64,
    top: usize,
) -> io::Result<()> {
    if shares.is_empty() {
        return Ok(());
    }
    let mut t = table(&[title, "bytes", "share", "count"]);
    let mut rest = (0u64, 0u64, 0usize);
    for (i, s) in shares.iter().enumerate() {
        if i < top {
            t.add_row(vec![
                shorten_left(&s.label, MAX_LABEL),
                units::bytes(s.bytes),
                units::percent(s.bytes, total),
                units::count(s.count),
            ]);
        } else {
            rest.0 += s.bytes;
            rest.1 += s.count;
            rest.2 += 1;
        }
    }
    if rest.2 > 0 {
        t.add_row(vec![
            format!("({} more)", rest.2),
            units::bytes(rest.0),
            units::percent(rest.0, total),
            units::count(rest.1),
        ]);
    }
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))
}

/// The categories live at the peak, each with the bytes each kind of evidence decided
/// (`code path 1.20 GiB · lifetime 3.00 MiB`), from the `evidence` breakdown.
fn write_categories(
    out: &mut Out,
    title: &str,
    shares: &[Share],
    evidence: &[Share],
    total: u64,
    top: usize,
) -> io::Result<()> {
    if shares.is_empty() {
        return Ok(());
    }
    let mut t = table(&[title, "bytes", "share", "count", "decided by"]);
    if let Some(c) = t.column_mut(4) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    for s in shares.iter().take(top) {
        let prefix = format!("{} · ", s.label);
        let decided: Vec<String> = evidence
            .iter()
            .filter_map(|e| {
                e.label
                    .strip_prefix(&prefix)
                    .map(|kind| format!("{kind} {}", units::bytes(e.bytes)))
            })
            .collect();
        t.add_row(vec![
            shorten_left(&s.label, MAX_LABEL),
            units::bytes(s.bytes),
            units::percent(s.bytes, total),
            units::count(s.count),
            decided.join(" · "),
        ]);
    }
    if shares.len() > top {
        let rest = &shares[top..];
        let bytes: u64 = rest.iter().map(|s| s.bytes).sum();
        let count: u64 = rest.iter().map(|s| s.count).sum();
        t.add_row(vec![
            format!("({} more)", rest.len()),
            units::bytes(bytes),
            units::percent(bytes, total),
            units::count(count),
            String::new(),
        ]);
    }
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))
}

/// The reserved bytes of each pool, when private pools (CUDA graphs, `MemPool`s) were used.
fn write_pools(out: &mut dyn Write, d: &DeviceReport) -> io::Result<()> {
    if d.pools.is_empty() {
        return Ok(());
    }
    let list = |f: &dyn Fn(&crate::analysis::pools::PoolReserved) -> u64| {
        d.pools
            .iter()
            .map(|p| format!("{} {}", p.label, units::bytes(f(p))))
            .collect::<Vec<_>>()
            .join(" · ")
    };
    if d.pools.iter().all(|p| p.at_peak_bytes.is_some()) {
        writeln!(
            out,
            "  reserved by pool at the peak: {}",
            list(&|p| p.at_peak_bytes.unwrap_or(0))
        )?;
    }
    writeln!(
        out,
        "  reserved by pool at the end: {}",
        list(&|p| p.at_end_bytes)
    )
}

fn write_attribution(out: &mut Out, d: &DeviceReport, options: &TextOptions) -> io::Result<()> {
    let p = &d.peak;
    let mut place = vec![p.step.clone()];
    if !p.op.is_empty() && !p.step.ends_with(&p.op) {
        place.push(p.op.clone());
    }
    if !p.stage.is_empty() {
        place.push(p.stage.clone());
    }
    if let Some(layer) = p.layer {
        place.push(format!("layer {layer} of its chunk"));
    }
    if !p.detail.is_empty() {
        place.push(p.detail.clone());
    }
    if d.peak.is_before_trace() {
        writeln!(out, "  the peak was reached before the trace started")?;
    } else {
        let place = out.text(&place.join(" · "));
        writeln!(out, "  the peak was reached in {place}")?;
    }
    match &d.attribution.pipeline {
        None => write_evidence(out, d)?,
        Some(info) => write_pipeline(out, info)?,
    }
    let total = d.peak_allocated_bytes;
    for dim in &options.by {
        let name = dim.as_str();
        let shares = if *dim == Dimension::Site {
            &d.top_sites
        } else {
            match d.peak_breakdown.get(name) {
                Some(s) => s,
                None => continue,
            }
        };
        let title = format!("live at the peak, by {name}");
        match (dim, d.peak_breakdown.get(Dimension::Evidence.as_str())) {
            (Dimension::Category, Some(evidence)) => {
                write_categories(out, &title, shares, evidence, total, options.top)?
            }
            _ => write_shares(out, &title, shares, total, options.top)?,
        }
    }
    if !d.steps.is_empty() {
        write_steps(out, d)?;
    }
    if !options.by.contains(&Dimension::Site) {
        write_shares(
            out,
            "top allocation sites live at the peak",
            &d.top_sites,
            total,
            options.top,
        )?;
    }
    Ok(())
}

/// Where the phases and categories came from, and what the program's own capture named.
fn write_evidence(out: &mut Out, d: &DeviceReport) -> io::Result<()> {
    let s = &d.attribution.phase_sources;
    write_counts(
        out,
        "phases from",
        &[
            (s.frames, "stack frames"),
            (s.metadata, "memory metadata"),
            (s.annotation, "record_function"),
            (s.autograd_thread, "autograd thread"),
            (s.continued, "continued (frees)"),
            (s.none, "no evidence: other"),
        ],
    )?;
    let c = &d.attribution.category_sources;
    write_counts(
        out,
        "categories from",
        &[
            (c.capture, "the program's tensors (capture)"),
            (c.labels, "PyTorch's labels"),
            (c.code, "code paths"),
            (c.lifetime, "lifetime"),
            (c.rules, "rules"),
            (c.before_trace, "alive before the trace"),
            (c.conflicting, "conflicting evidence: unknown"),
            (c.none, "no evidence: unknown"),
        ],
    )?;
    if c.labels_disagreeing > 0 {
        writeln!(
            out,
            "  inference gave {} of the {} labelled allocations another category",
            c.labels_disagreeing, c.labels
        )?;
    }
    if let Some(k) = &d.attribution.capture {
        let cap = k
            .allowed_bytes
            .map_or(String::new(), |b| format!("; cap {}", units::bytes(b)));
        let missing = if k.unmatched > 0 {
            format!(
                ", {} listed storages not found",
                units::count(k.unmatched as u64)
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "  the program's own list of its tensors (memsnap.Capture) named {}{missing}{cap}",
            units::counted(k.blocks as u64, "block")
        )?;
    }
    Ok(())
}

/// How the DualPipeV steps were found, and the pipeline's shape.
fn write_pipeline(out: &mut Out, info: &crate::attribute::PipelineInfo) -> io::Result<()> {
    let from = match &info.steps_from {
        crate::attribute::StepSource::Source { file } => format!("from the source {file}"),
        crate::attribute::StepSource::Inferred => "inferred from the trace".to_string(),
    };
    let shape = info.shape.map_or(String::new(), |s| {
        let least = if info.chunks_known { "" } else { "at least " };
        format!(
            "; pipeline rank {} of {}, {least}{} micro-batches",
            s.rank, s.ranks, s.chunks
        )
    });
    let cut = info.cut_in.map_or(String::new(), |s| {
        format!("; cut short in step {s} by the out-of-memory error")
    });
    let from = out.text(&from);
    writeln!(out, "  DualPipeV steps {from}{shape}{cut}")?;
    if let Some(note) = &info.note {
        let note = out.text(note);
        writeln!(out, "  note: {note}")?;
    }
    Ok(())
}

/// The steps' table: start, end and peak of each, and what the peak mostly is.
fn write_steps(out: &mut Out, d: &DeviceReport) -> io::Result<()> {
    let with_iterations = d.steps.iter().any(|r| r.iterations.is_some());
    let mut header = vec!["steps", "loops", "start", "end", "peak", "peak is mostly"];
    if !with_iterations {
        header.remove(1);
    }
    let mut t = table(&header);
    if let Some(c) = t.column_mut(header.len() - 1) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    for row in &d.steps {
        let mostly = row
            .peak_categories
            .iter()
            .take(2)
            .map(|s| {
                format!(
                    "{} {}",
                    s.label,
                    units::percent(s.bytes, row.peak_allocated_bytes)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let mut cells = vec![
            row.label.clone(),
            row.iterations.map_or(String::new(), |n| n.to_string()),
            units::bytes(row.start_allocated_bytes),
            units::bytes(row.end_allocated_bytes),
            units::bytes(row.peak_allocated_bytes),
            mostly,
        ];
        if !with_iterations {
            cells.remove(1);
        }
        t.add_row(cells);
    }
    writeln!(out)?;
    writeln!(out, "{}", out.table(&t, "  "))?;
    Ok(())
}

/// A device's report as Markdown: a heading, the headline figures as a list, then the tables.
fn write_markdown_device(
    out: &mut Out,
    report: &FileReport,
    d: &DeviceReport,
    options: &TextOptions,
) -> io::Result<()> {
    writeln!(
        out,
        "### {} · {}",
        escape::code_span(&report.file),
        crate::snapshot::device_name(d.device)
    )?;
    writeln!(out)?;
    let place = if d.peak.is_before_trace() {
        "before the trace started".to_string()
    } else {
        format!("in {}", out.text(&d.peak.summary()))
    };
    writeln!(
        out,
        "- **peak allocated {}** {place}; reserved then {}",
        units::bytes(d.peak_allocated_bytes),
        units::bytes(d.reserved_at_peak_bytes)
    )?;
    writeln!(
        out,
        "- peak reserved {}; at the end {} allocated, {} reserved",
        units::bytes(d.peak_reserved_bytes),
        units::bytes(d.end_allocated_bytes),
        units::bytes(d.end_reserved_bytes)
    )?;
    for line in probe_lines(report, d.device) {
        let line = out.text(&line);
        writeln!(out, "- {line}")?;
    }
    if let Some(top) = d.peak_breakdown.get("category").and_then(|c| c.first()) {
        writeln!(
            out,
            "- mostly {}: {} ({})",
            out.text(&top.label),
            units::bytes(top.bytes),
            units::percent(top.bytes, d.peak_allocated_bytes)
        )?;
    }
    if let Some(e) = &d.oom_explanation {
        let why = out.text(&e.explanation);
        writeln!(out, "- **out of memory**: {why}")?;
    }
    let status = out.text(&status_line(d).join(" · "));
    writeln!(out, "- {status}")?;
    write_attribution(out, d, options)?;
    writeln!(out)
}

/// `  WHAT: a 12 · b 3`, the non-zero counts; nothing when all are zero.
fn write_counts(out: &mut Out, what: &str, counts: &[(u64, &str)]) -> io::Result<()> {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, label)| format!("{label} {}", units::count(*n)))
        .collect();
    if !parts.is_empty() {
        writeln!(out, "  {what}: {}", parts.join(" · "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Action, Snapshot, TraceEvent};

    fn event(action: Action, addr: u64, size: u64, time_us: i64) -> TraceEvent {
        TraceEvent::bare(action, addr, size, time_us)
    }

    /// A device that reserves one 2 MiB segment, allocates 512 B and 1 KiB, and frees the
    /// first: peak 1.50 KiB, end 1.00 KiB.
    fn small_report(snap: &mut Snapshot) -> FileReport {
        let seg = 0x7f00_0000_0000;
        snap.traces = vec![vec![
            event(Action::SegmentAlloc, seg, 2 << 20, 1_000),
            event(Action::Alloc, seg, 512, 1_010),
            event(Action::Alloc, seg + 512, 1024, 1_020),
            event(Action::FreeRequested, seg, 512, 1_030),
            event(Action::FreeCompleted, seg, 512, 1_031),
        ]];
        let devices = crate::analysis::analyse(snap, &Default::default());
        FileReport::new("small.pickle", snap, &devices)
    }

    fn rendered(report: &FileReport, markdown: bool) -> String {
        let mut bytes = Vec::new();
        let options = TextOptions {
            markdown,
            ..TextOptions::default()
        };
        write(&mut bytes, report, &options).unwrap();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn the_report_renders_its_figures_as_text_and_as_markdown() {
        let mut snap = Snapshot::default();
        let report = small_report(&mut snap);
        let text = rendered(&report, false);
        assert!(text.starts_with("small.pickle · device 0\n"), "{text}");
        let peak = text
            .lines()
            .find(|l| l.trim_start().starts_with("peak "))
            .unwrap();
        assert_eq!(
            peak.split_whitespace().collect::<Vec<_>>(),
            ["peak", "1.50", "KiB", "1.50", "KiB", "2.00", "MiB"],
            "allocated, requested and reserved at the peak"
        );
        let end = text
            .lines()
            .find(|l| l.trim_start().starts_with("end "))
            .unwrap();
        assert!(end.contains("1.00 KiB"), "{end}");
        assert!(text.contains('─'), "text tables have a rule");
        let md = rendered(&report, true);
        assert!(!md.contains('─'), "Markdown tables have no box rule:\n{md}");
        assert!(md.lines().any(|l| l.starts_with("|--")), "{md}");
        assert!(md.contains("1.50 KiB"), "{md}");
    }

    #[test]
    fn out_writes_prose_and_tables_in_its_form() {
        let mut t = table(&["label", "bytes"]);
        t.add_row(vec!["a".to_string(), "1 B".to_string()]);
        let mut bytes = Vec::new();
        let mut out = Out::new(&mut bytes, false);
        out.prose("a line").unwrap();
        let text = out.table(&t, "  ");
        assert_eq!(String::from_utf8(bytes).unwrap(), "  a line\n");
        assert!(text.lines().all(|l| l.starts_with("  ")), "{text}");
        let mut bytes = Vec::new();
        let mut out = Out::new(&mut bytes, true);
        out.prose("a line").unwrap();
        let md = out.table(&t, "  ");
        assert_eq!(String::from_utf8(bytes).unwrap(), "- a line\n");
        assert_eq!(md.lines().next(), Some("| label | bytes |"), "{md}");
    }

    #[test]
    fn long_labels_keep_their_end_and_parts_wrap() {
        assert_eq!(shorten_left("abcdef", 4), "…def");
        assert_eq!(shorten_left("abc", 4), "abc");
        let parts: Vec<String> = ["one", "two", "three"].map(String::from).to_vec();
        assert_eq!(wrap_parts(&parts, 9), ["one · two", "three"]);
        assert_eq!(wrap_parts(&parts, 100), ["one · two · three"]);
    }
}

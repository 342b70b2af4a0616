//! `memsnap export`: the analysis as four tables a notebook loads in one line.
//!
//! - `events`: one row per trace event, with the figures after it and every label;
//! - `blocks`: each allocation live at the end of the trace, with its labels;
//! - `steps`: the step table of the report;
//! - `peak`: the memory live at the peak, grouped by each dimension.
//!
//! The tables are built here as plain columns; [`write_jsonl`] writes them as JSON lines, and
//! with the `export` feature the `parquet` module writes Parquet and CSV through polars, a
//! part of the rows at a time ([`Table::parts`]). A text column holds each distinct text once
//! and a code per row ([`TextColumn`]): the frames and labels of a snapshot repeat over its
//! events, and a text per row would hold a long name as many times as it has events.

use std::io::{self, Write};

use rustc_hash::FxHashMap;

use crate::analysis::{DeviceAnalysis, Dimension};
use crate::attribute::{Label, NO_MB};
use crate::snapshot::{Action, StackId};

/// The values of one column.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Unsigned integers.
    U64(Vec<u64>),
    /// Unsigned integers with gaps (null).
    OptU64(Vec<Option<u64>>),
    /// Signed integers.
    I64(Vec<i64>),
    /// Text.
    Str(TextColumn),
}

/// A text column: each distinct text once, and for each row the index of its text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextColumn {
    /// The distinct texts, in the order they first came.
    pub texts: Vec<String>,
    /// Each row's text (index into `texts`).
    pub codes: Vec<u32>,
    /// The texts by their hash (the texts themselves are not held twice).
    index: FxHashMap<u64, Vec<u32>>,
}

impl TextColumn {
    /// Adds a row of text `s`; gives its code.
    pub fn push(&mut self, s: &str) -> u32 {
        use std::hash::BuildHasher;
        let hash = rustc_hash::FxBuildHasher.hash_one(s);
        let same = self.index.entry(hash).or_default();
        let code = match same.iter().find(|&&c| self.texts[c as usize] == s) {
            Some(&c) => c,
            None => {
                let c = self.texts.len() as u32;
                self.texts.push(s.to_string());
                same.push(c);
                c
            }
        };
        self.codes.push(code);
        code
    }

    /// Adds a row whose text has code `code` (given by [`TextColumn::push`]).
    pub fn push_code(&mut self, code: u32) {
        self.codes.push(code);
    }

    /// Row `i`'s text.
    pub fn get(&self, i: usize) -> &str {
        &self.texts[self.codes[i] as usize]
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// True without rows.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    fn extend(&mut self, more: TextColumn) {
        for &c in &more.codes {
            self.push(&more.texts[c as usize]);
        }
    }
}

impl<S: AsRef<str>> FromIterator<S> for TextColumn {
    fn from_iter<I: IntoIterator<Item = S>>(items: I) -> TextColumn {
        let mut c = TextColumn::default();
        for s in items {
            c.push(s.as_ref());
        }
        c
    }
}

impl Values {
    /// Rows in the column.
    pub fn len(&self) -> usize {
        match self {
            Values::U64(v) => v.len(),
            Values::OptU64(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::Str(v) => v.len(),
        }
    }

    /// True when the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `i` as JSON.
    fn json(&self, i: usize) -> serde_json::Value {
        match self {
            Values::U64(v) => v[i].into(),
            Values::OptU64(v) => v[i].map_or(serde_json::Value::Null, Into::into),
            Values::I64(v) => v[i].into(),
            Values::Str(v) => v.get(i).into(),
        }
    }

    /// Bytes of row `i`'s text (0 for numbers).
    fn text_bytes(&self, i: usize) -> usize {
        match self {
            Values::Str(v) => v.get(i).len(),
            _ => 0,
        }
    }
}

/// One table: named columns of equal length.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// File stem: `events`, `blocks`, `steps` or `peak`.
    pub name: &'static str,
    /// Columns in order.
    pub columns: Vec<(&'static str, Values)>,
}

impl Table {
    /// Rows in the table.
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.1.len())
    }

    /// The column called `name`.
    pub fn column(&self, name: &str) -> Option<&Values> {
        self.columns.iter().find(|c| c.0 == name).map(|c| &c.1)
    }

    /// The rows in consecutive parts, each holding at most [`PART_TEXT_BYTES`] of text (or
    /// one row) and at most [`PART_ROWS`] rows: a writer that copies a part's texts holds one
    /// part's at a time.
    pub fn parts(&self) -> Vec<std::ops::Range<usize>> {
        let mut parts = Vec::new();
        let (mut start, mut bytes) = (0, 0usize);
        for i in 0..self.rows() {
            let row: usize = self.columns.iter().map(|(_, v)| v.text_bytes(i)).sum();
            if i > start && (bytes + row > PART_TEXT_BYTES || i - start >= PART_ROWS) {
                parts.push(start..i);
                (start, bytes) = (i, 0);
            }
            bytes += row;
        }
        if start < self.rows() || parts.is_empty() {
            parts.push(start..self.rows());
        }
        parts
    }
}

/// Bytes of text in one part of a table's rows ([`Table::parts`]).
pub const PART_TEXT_BYTES: usize = 1 << 20;
/// Rows in one part of a table ([`Table::parts`]).
pub const PART_ROWS: usize = 1 << 15;

/// Label columns shared by `events` and `blocks`.
#[derive(Default)]
struct LabelColumns {
    /// Whether the trace spans several training steps (step texts then name theirs).
    multi_step: bool,
    train_step: Vec<u64>,
    step: TextColumn,
    op: TextColumn,
    micro_batch: Vec<Option<u64>>,
    micro_batch_backward: Vec<Option<u64>>,
    stage: TextColumn,
    layer: Vec<Option<u64>>,
    category: TextColumn,
    phase: TextColumn,
    annotation: TextColumn,
    site: TextColumn,
    /// The site code of each stack (and whether its label is backward's, which a block
    /// without frames names), so that a stack's site is made once.
    sites: FxHashMap<(StackId, bool), u32>,
}

impl LabelColumns {
    fn push(
        &mut self,
        a: &DeviceAnalysis,
        keyer: &mut crate::analysis::Keyer,
        l: &Label,
        stack: StackId,
    ) {
        let at = &a.attribution;
        let mb = |m: u16| (m != NO_MB).then_some(u64::from(m));
        self.train_step.push(u64::from(l.train_step));
        self.step.push(&at.step_text(l, self.multi_step));
        self.op.push(&at.op_text(l));
        self.micro_batch.push(mb(l.mb));
        self.micro_batch_backward.push(mb(l.mb_backward));
        self.stage.push(at.names.get(l.stage));
        self.layer
            .push((l.layer != u16::MAX).then_some(u64::from(l.layer)));
        self.category.push(l.category.as_str());
        self.phase.push(l.phase.as_str());
        self.annotation.push(at.names.get(l.annotation));
        // a site depends on the stack, and on the label only for a block without frames
        let key = (stack, l.phase == crate::attribute::Phase::Backward);
        match self.sites.get(&key) {
            Some(&code) if !l.is_before_trace() => self.site.push_code(code),
            _ => {
                let code = self.site.push(&keyer.key(Dimension::Site, l, stack));
                if !l.is_before_trace() {
                    self.sites.insert(key, code);
                }
            }
        }
    }

    fn into_columns(self, out: &mut Vec<(&'static str, Values)>) {
        out.extend([
            ("train_step", Values::U64(self.train_step)),
            ("step", Values::Str(self.step)),
            ("op", Values::Str(self.op)),
            ("micro_batch", Values::OptU64(self.micro_batch)),
            (
                "micro_batch_backward",
                Values::OptU64(self.micro_batch_backward),
            ),
            ("stage", Values::Str(self.stage)),
            ("layer", Values::OptU64(self.layer)),
            ("category", Values::Str(self.category)),
            ("phase", Values::Str(self.phase)),
            ("annotation", Values::Str(self.annotation)),
            ("site", Values::Str(self.site)),
        ]);
    }
}

/// The names of the four tables, in the order they are written.
pub const NAMES: [&str; 4] = ["events", "blocks", "steps", "peak"];

/// The four tables of every analysed device (rows of all devices together, with a `device`
/// column).
pub fn tables(devices: &[DeviceAnalysis]) -> Vec<Table> {
    NAMES.iter().map(|name| table(name, devices)).collect()
}

/// The table called `name` (one of [`NAMES`]) of every analysed device, rows of all devices
/// together.
pub fn table(name: &'static str, devices: &[DeviceAnalysis]) -> Table {
    let mut parts = table_parts(name, devices);
    let mut all = parts.next().unwrap_or(Table {
        name,
        columns: Vec::new(),
    });
    for t in parts {
        append(&mut all, t);
    }
    all
}

/// The table called `name` (one of [`NAMES`]) of every analysed device, made a part at a
/// time as it is read: the events [`PART_ROWS`] at a time, the other tables a device at a
/// time. A writer that lets each part go holds one part, not the table (the events of a long
/// trace would be tens of bytes a row, on top of the analysis).
pub fn table_parts<'a>(
    name: &'static str,
    devices: &'a [DeviceAnalysis],
) -> Box<dyn Iterator<Item = Table> + 'a> {
    match name {
        "events" => Box::new(devices.iter().flat_map(|a| {
            let n = a.snap.trace(a.device()).len();
            (0..n.max(1))
                .step_by(PART_ROWS)
                .map(move |start| events_of(a, start..(start + PART_ROWS).min(n)))
        })),
        "blocks" => Box::new(devices.iter().map(blocks)),
        "steps" => Box::new(devices.iter().map(steps)),
        _ => Box::new(devices.iter().map(peak)),
    }
}

fn append(all: &mut Table, more: Table) {
    for ((_, a), (_, b)) in all.columns.iter_mut().zip(more.columns) {
        match (a, b) {
            (Values::U64(a), Values::U64(b)) => a.extend(b),
            (Values::OptU64(a), Values::OptU64(b)) => a.extend(b),
            (Values::I64(a), Values::I64(b)) => a.extend(b),
            (Values::Str(a), Values::Str(b)) => a.extend(b),
            _ => unreachable!("tables of one kind have the same columns"),
        }
    }
}

/// One row per trace event.
pub fn events(a: &DeviceAnalysis) -> Table {
    events_of(a, 0..a.snap.trace(a.device()).len())
}

/// The rows of events `rows`.
fn events_of(a: &DeviceAnalysis, rows: std::ops::Range<usize>) -> Table {
    let r = &a.replay;
    let trace = &a.snap.trace(a.device())[rows.clone()];
    let n = trace.len();
    let mut keyer = a.keyer();
    let mut labels = LabelColumns {
        multi_step: a.attribution.multi_step(),
        ..LabelColumns::default()
    };
    let mut action = TextColumn::default();
    let (mut time, mut addr, mut size, mut stream) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut reserved = Vec::with_capacity(n);
    for (i, ev) in rows.clone().zip(trace) {
        time.push(ev.time_us);
        action.push(ev.action.as_str());
        addr.push(ev.addr);
        size.push(ev.size);
        stream.push(a.snap.stream(ev));
        reserved.push(r.reserved_at(Some(i)));
        labels.push(a, &mut keyer, &a.attribution.labels[i], ev.stack);
    }
    let mut columns = vec![
        ("device", Values::U64(vec![u64::from(a.device()); n])),
        (
            "index",
            Values::U64((rows.start as u64..rows.end as u64).collect()),
        ),
        ("time_us", Values::I64(time)),
        ("action", Values::Str(action)),
        ("addr", Values::U64(addr)),
        ("size", Values::U64(size)),
        ("stream", Values::I64(stream)),
        (
            "allocated_after_bytes",
            Values::U64(r.allocated[rows.clone()].to_vec()),
        ),
        (
            "requested_after_bytes",
            Values::U64(rows.map(|i| r.requested(i)).collect()),
        ),
        ("reserved_after_bytes", Values::U64(reserved)),
    ];
    labels.into_columns(&mut columns);
    Table {
        name: "events",
        columns,
    }
}

/// Each allocation live after the last event.
pub fn blocks(a: &DeviceAnalysis) -> Table {
    let r = &a.replay;
    let trace = a.snap.trace(a.device());
    let mut keyer = a.keyer();
    let mut labels = LabelColumns {
        multi_step: a.attribution.multi_step(),
        ..LabelColumns::default()
    };
    let (mut address, mut size, mut requested, mut event, mut time) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (k, p) in r.preexisting.iter().enumerate() {
        if p.live && p.freed_at == crate::replay::NONE {
            address.push(p.addr);
            size.push(p.size);
            requested.push(p.requested);
            event.push(None);
            time.push(None);
            labels.push(a, &mut keyer, &a.attribution.preexisting[k], p.stack);
        }
    }
    for (i, ev) in trace.iter().enumerate() {
        if ev.action == Action::Alloc && r.partner[i] == crate::replay::NONE {
            address.push(ev.addr);
            size.push(r.bytes(i));
            requested.push(ev.size);
            event.push(Some(i as u64));
            time.push(Some(ev.time_us.max(0) as u64));
            labels.push(a, &mut keyer, &a.attribution.labels[i], ev.stack);
        }
    }
    let n = address.len();
    let mut columns = vec![
        ("device", Values::U64(vec![u64::from(a.device()); n])),
        ("address", Values::U64(address)),
        ("size_bytes", Values::U64(size)),
        ("requested_bytes", Values::U64(requested)),
        ("alloc_event", Values::OptU64(event)),
        ("alloc_time_us", Values::OptU64(time)),
    ];
    labels.into_columns(&mut columns);
    Table {
        name: "blocks",
        columns,
    }
}

/// The step table.
pub fn steps(a: &DeviceAnalysis) -> Table {
    let s = &a.steps;
    let col = |f: &dyn Fn(&crate::analysis::StepRow) -> u64| Values::U64(s.iter().map(f).collect());
    Table {
        name: "steps",
        columns: vec![
            ("device", Values::U64(vec![u64::from(a.device()); s.len()])),
            ("train_step", col(&|r| u64::from(r.train_step))),
            ("step", col(&|r| u64::from(r.step))),
            (
                "label",
                Values::Str(s.iter().map(|r| r.label.clone()).collect()),
            ),
            (
                "iterations",
                Values::OptU64(s.iter().map(|r| r.iterations.map(u64::from)).collect()),
            ),
            ("first_event", col(&|r| r.first_event as u64)),
            ("last_event", col(&|r| r.last_event as u64)),
            ("start_allocated_bytes", col(&|r| r.start_allocated_bytes)),
            ("end_allocated_bytes", col(&|r| r.end_allocated_bytes)),
            ("peak_allocated_bytes", col(&|r| r.peak_allocated_bytes)),
            ("peak_event_index", col(&|r| r.peak_event_index as u64)),
        ],
    }
}

/// The memory live at the peak, one row per group of each dimension.
pub fn peak(a: &DeviceAnalysis) -> Table {
    let (mut dimension, mut label) = (TextColumn::default(), TextColumn::default());
    let (mut bytes, mut count) = (Vec::new(), Vec::new());
    for (d, shares) in &a.peak_breakdown {
        for s in shares {
            dimension.push(d.as_str());
            label.push(&s.label);
            bytes.push(s.bytes);
            count.push(s.count);
        }
    }
    let n = dimension.len();
    Table {
        name: "peak",
        columns: vec![
            ("device", Values::U64(vec![u64::from(a.device()); n])),
            ("dimension", Values::Str(dimension)),
            ("label", Values::Str(label)),
            ("bytes", Values::U64(bytes)),
            ("count", Values::U64(count)),
        ],
    }
}

/// Writes a table as JSON lines, one object per row, escaped as [`crate::escape`] says JSON is.
pub fn write_jsonl(out: &mut dyn Write, table: &Table) -> io::Result<()> {
    let mut out = crate::escape::Stream::json(out);
    for i in 0..table.rows() {
        let row: serde_json::Map<String, serde_json::Value> = table
            .columns
            .iter()
            .map(|(name, v)| (name.to_string(), v.json(i)))
            .collect();
        serde_json::to_writer(&mut out, &row)?;
        writeln!(out)?;
    }
    out.into_inner().map(drop)
}

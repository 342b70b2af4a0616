//! What memory was made of: the live blocks at a moment grouped by a label, the per-step
//! table, and the allocation sites live at the peak.

use std::collections::HashMap;

use serde::Serialize;

use crate::attribute::{frames, Attribution, Category, Label};
use crate::replay::{Replay, NONE, PREEXISTING};
use crate::snapshot::{Action, Snapshot, StackId};

/// A dimension to group memory by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Memory category.
    Category,
    /// Pipeline step (or generic phase) with the op and micro-batch.
    Step,
    /// Op and micro-batch alone.
    Op,
    /// Layer stage or model place.
    Stage,
    /// Allocation site (innermost program frames).
    Site,
    /// Forward / backward / optimizer.
    Phase,
    /// Innermost `record_function` range.
    Annotation,
    /// The category with the kind of evidence that decided it (`parameter · code path`).
    Evidence,
}

impl Dimension {
    /// Every dimension.
    pub const ALL: [Dimension; 8] = [
        Dimension::Category,
        Dimension::Step,
        Dimension::Op,
        Dimension::Stage,
        Dimension::Site,
        Dimension::Phase,
        Dimension::Annotation,
        Dimension::Evidence,
    ];

    /// Name as on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Category => "category",
            Dimension::Step => "step",
            Dimension::Op => "op",
            Dimension::Stage => "stage",
            Dimension::Site => "site",
            Dimension::Phase => "phase",
            Dimension::Annotation => "annotation",
            Dimension::Evidence => "evidence",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

/// Turns labels into group names for one dimension.
pub struct Keyer<'a> {
    snap: &'a Snapshot,
    attribution: &'a Attribution,
    multi: bool,
    sites: HashMap<StackId, String>,
    /// Steps whole: `--by step` keys drop the op and micro-batch ([`Keyer::whole_step`]).
    whole_steps: bool,
    /// What site and module keys pass through ([`Keyer::renaming`]).
    rename: Option<Box<dyn Fn(String) -> String + 'a>>,
}

impl<'a> Keyer<'a> {
    /// A keyer for one device.
    pub fn new(snap: &'a Snapshot, attribution: &'a Attribution) -> Keyer<'a> {
        Keyer {
            snap,
            attribution,
            multi: attribution.multi_step(),
            sites: HashMap::new(),
            whole_steps: false,
            rename: None,
        }
    }

    /// Site and module keys passed through `rename` from now on: a diff reads the generated
    /// files of one run by the other run's names (`diff::names`).
    pub fn renaming(mut self, rename: impl Fn(String) -> String + 'a) -> Keyer<'a> {
        self.rename = Some(Box::new(rename));
        self
    }

    /// Keys of [`Dimension::Step`] name whole steps from now on: a chart of a pipeline with
    /// dozens of micro-batches colours its steps rather than eight of its micro-batches.
    pub fn set_whole_steps(&mut self) {
        self.whole_steps = true;
    }

    /// The whole step a `--by step` key belongs to: `step 4` of `step 4 · F0&B1 mb 23/21`,
    /// `train step 1 · forward` of `train step 1 · forward mb 2`.
    pub fn whole_step(&self, key: &str) -> String {
        let keep = if self.multi { 2 } else { 1 };
        let parts: Vec<&str> = key.splitn(keep + 1, " · ").take(keep).collect();
        let step = parts.join(" · ");
        match step.find(" mb ") {
            Some(at) => step[..at].to_string(),
            None => step,
        }
    }

    /// The group of an allocation with label `l` and stack `stack` in dimension `d`.
    pub fn key(&mut self, d: Dimension, l: &Label, stack: StackId) -> String {
        let a = self.attribution;
        let before_trace = l.is_before_trace();
        // a block from before the trace that the program's own list named has its name
        let named = l.evidence == crate::attribute::Evidence::Capture;
        if before_trace
            && !matches!(
                d,
                Dimension::Category | Dimension::Site | Dimension::Evidence
            )
            && !(named && d == Dimension::Stage)
        {
            return super::BEFORE_TRACE.to_string();
        }
        let text = match d {
            Dimension::Category => l.category.as_str().to_string(),
            Dimension::Step => {
                let step = a.step_text(l, self.multi);
                let op = a.op_text(l);
                if op.is_empty() || op == l.phase.as_str() {
                    step
                } else {
                    format!("{step} · {op}")
                }
            }
            Dimension::Op => a.op_text(l),
            Dimension::Stage => a.names.get(l.stage).to_string(),
            Dimension::Site => {
                let snap = self.snap;
                let site = self
                    .sites
                    .entry(stack)
                    .or_insert_with(|| frames::site(snap, stack, 3))
                    .clone();
                if site == "<no frames>" {
                    without_frames(l).to_string()
                } else {
                    site
                }
            }
            Dimension::Phase => l.phase.as_str().to_string(),
            Dimension::Annotation => a.names.get(l.annotation).to_string(),
            Dimension::Evidence => format!("{} · {}", l.category.as_str(), l.evidence.as_str()),
        };
        let text = match &self.rename {
            Some(rename) if matches!(d, Dimension::Site | Dimension::Stage) => rename(text),
            _ => text,
        };
        if text.is_empty() {
            "(none)".to_string()
        } else if self.whole_steps && d == Dimension::Step {
            self.whole_step(&text)
        } else {
            text
        }
    }
}

/// One group of a breakdown.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Share {
    /// Group name.
    pub label: String,
    /// Bytes.
    pub bytes: u64,
    /// Allocations.
    pub count: u64,
}

/// Live allocations at one moment: `(bytes, label, stack)` for each.
pub fn live_at<'a>(
    snap: &Snapshot,
    replay: &Replay,
    attribution: &'a Attribution,
    at: Option<usize>,
) -> Vec<(u64, &'a Label, StackId)> {
    let events = snap.trace(replay.device);
    let mut out = Vec::new();
    for (k, p) in replay.preexisting.iter().enumerate() {
        let freed_before = p.freed_at != NONE && at.is_some_and(|i| (p.freed_at as usize) <= i);
        if p.live && !freed_before {
            out.push((p.size, &attribution.preexisting[k], p.stack));
        }
    }
    if let Some(at) = at {
        for (i, e) in events.iter().enumerate().take(at + 1) {
            if e.action != Action::Alloc {
                continue;
            }
            let free = replay.partner[i];
            if free == NONE || free as usize > at {
                out.push((replay.bytes(i), &attribution.labels[i], e.stack));
            }
        }
    }
    out
}

/// What [`group`] by category of [`live_at`] gives at each of `points` (event indices), from
/// one pass over the trace instead of one per point.
pub fn categories_at(
    snap: &Snapshot,
    replay: &Replay,
    attribution: &Attribution,
    points: &[usize],
) -> Vec<Vec<Share>> {
    let events = snap.trace(replay.device);
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&k| points[k]);
    let mut out = vec![Vec::new(); points.len()];
    let mut sums = [(0u64, 0u64); Category::ALL.len()];
    let slot = |c: Category| Category::ALL.iter().position(|&x| x == c).unwrap_or(0);
    for (k, p) in replay.preexisting.iter().enumerate() {
        if p.live {
            let s = &mut sums[slot(attribution.preexisting[k].category)];
            s.0 += p.size;
            s.1 += 1;
        }
    }
    // Old blocks leave at their frees, in time order.
    let mut old_ends: Vec<(usize, usize)> = replay
        .preexisting
        .iter()
        .enumerate()
        .filter(|(_, p)| p.live && p.freed_at != NONE)
        .map(|(k, p)| (p.freed_at as usize, k))
        .collect();
    old_ends.sort_unstable();
    let mut old_ends = old_ends.into_iter().peekable();
    let mut next = order.iter().peekable();
    for (e, ev) in events.iter().enumerate() {
        let Some(&&first) = next.peek() else { break };
        if points[first] < e {
            break;
        }
        // An allocation is live from its event until its free's event (exclusive of neither
        // moment it is looked at: freed at or before a point means gone).
        let partner = replay.partner[e];
        if ev.action == Action::Alloc && (partner == NONE || partner as usize > e) {
            let s = &mut sums[slot(attribution.labels[e].category)];
            s.0 += replay.bytes(e);
            s.1 += 1;
        } else if ev.action != Action::Alloc && partner != NONE && partner & PREEXISTING == 0 {
            let alloc = partner as usize;
            if alloc < e
                && events[alloc].action == Action::Alloc
                && replay.partner[alloc] as usize == e
            {
                let s = &mut sums[slot(attribution.labels[alloc].category)];
                s.0 = s.0.saturating_sub(replay.bytes(alloc));
                s.1 = s.1.saturating_sub(1);
            }
        }
        while let Some((_, k)) = old_ends.next_if(|&(at, _)| at == e) {
            let s = &mut sums[slot(attribution.preexisting[k].category)];
            s.0 = s.0.saturating_sub(replay.preexisting[k].size);
            s.1 = s.1.saturating_sub(1);
        }
        while let Some(&&k) = next.peek() {
            if points[k] != e {
                break;
            }
            let mut shares: Vec<Share> = Category::ALL
                .iter()
                .zip(sums)
                .filter(|(_, (_, count))| *count > 0)
                .map(|(c, (bytes, count))| Share {
                    label: c.as_str().to_string(),
                    bytes,
                    count,
                })
                .collect();
            shares.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
            out[k] = shares;
            next.next();
        }
    }
    out
}

/// Groups live allocations by a dimension, largest first.
pub fn group(keyer: &mut Keyer, d: Dimension, live: &[(u64, &Label, StackId)]) -> Vec<Share> {
    let mut by: HashMap<String, (u64, u64)> = HashMap::new();
    for &(bytes, l, stack) in live {
        let e = by.entry(keyer.key(d, l, stack)).or_default();
        e.0 += bytes;
        e.1 += 1;
    }
    let mut out: Vec<Share> = by
        .into_iter()
        .map(|(label, (bytes, count))| Share {
            label,
            bytes,
            count,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
    out
}

/// One row of the per-step table: a contiguous stretch of the trace in one pipeline step (or,
/// outside a pipeline, one phase of one training step).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct StepRow {
    /// Training step, from 0.
    pub train_step: u16,
    /// Pipeline step 1..=8 (0 outside a pipeline; 9 before step 1; 10 after step 8).
    pub step: u8,
    /// Display name: `step 4`, `optimizer`, ...
    pub label: String,
    /// Loop iterations the schedule gives this step, when known.
    pub iterations: Option<u32>,
    /// First and last event (inclusive).
    pub first_event: usize,
    /// Last event of the row.
    pub last_event: usize,
    /// Allocated bytes just before the first event.
    pub start_allocated_bytes: u64,
    /// Allocated bytes after the last event.
    pub end_allocated_bytes: u64,
    /// Highest allocated bytes inside the row.
    pub peak_allocated_bytes: u64,
    /// Event at that peak.
    pub peak_event_index: usize,
    /// Allocated bytes at the end of each loop iteration, when iterations can be told apart.
    pub iteration_end_allocated_bytes: Vec<u64>,
    /// Categories of the memory live at the row's peak, largest first.
    pub peak_categories: Vec<Share>,
    /// An optimizer update that ran (its `record_function` range is in the trace) but
    /// allocated and freed nothing: its first and last event are the event before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiet: bool,
}

/// Builds the per-step table.
pub fn step_table(snap: &Snapshot, replay: &Replay, a: &Attribution) -> Vec<StepRow> {
    let n = replay.len();
    let multi = a.multi_step();
    let mut rows: Vec<StepRow> = Vec::new();
    let mut i = 0;
    // A row: one pipeline step, or outside a pipeline one phase, of one training step.
    // `zero_grad` is a row of its own among the events outside the phases
    let zero_grad = a.names.find("zero_grad");
    let key = |l: &Label| {
        let (phase, mb) = if l.pipe_step == 0 {
            (l.phase, l.mb)
        } else {
            (Default::default(), crate::attribute::NO_MB)
        };
        let dropping = l.pipe_step == 0 && Some(l.op) == zero_grad;
        (l.train_step, l.pipe_step, phase, mb, dropping)
    };
    let mut quiet = a.quiet.iter().peekable();
    while i < n {
        let l = a.labels[i];
        let k = key(&l);
        let mut j = i;
        // a quiet phase after an event ends that event's row
        while quiet.peek().is_some_and(|q| q.after < i) {
            quiet.next();
        }
        let stop = quiet.peek().map_or(usize::MAX, |q| q.after);
        while j + 1 < n && key(&a.labels[j + 1]) == k && j != stop {
            j += 1;
        }
        // A pipeline row ends at the last event of its step; stray events outside the pipeline
        // (another thread) inside it are absorbed.
        let start = if i == 0 {
            replay.start.allocated
        } else {
            replay.allocated[i - 1]
        };
        let (mut peak, mut peak_at) = (replay.allocated[i], i);
        for (e, &v) in replay.allocated.iter().enumerate().take(j + 1).skip(i) {
            if v > peak {
                peak = v;
                peak_at = e;
            }
        }
        let label = a.step_text(&l, multi);
        let iterations = match (&a.pipeline, l.pipe_step) {
            (Some(p), 1..=8) => p.iterations[l.pipe_step as usize - 1],
            _ => None,
        };
        rows.push(StepRow {
            train_step: l.train_step,
            step: l.pipe_step,
            label,
            iterations,
            first_event: i,
            last_event: j,
            start_allocated_bytes: start,
            end_allocated_bytes: replay.allocated[j],
            peak_allocated_bytes: peak,
            peak_event_index: peak_at,
            iteration_end_allocated_bytes: iteration_ends(replay, a, i, j),
            peak_categories: Vec::new(),
            quiet: false,
        });
        while quiet.next_if(|q| q.after == j).is_some() {
            let mut ql = a.labels[j];
            if (1..=8).contains(&ql.pipe_step) {
                continue;
            }
            ql.pipe_step = crate::attribute::STEP_NONE;
            ql.phase = crate::attribute::Phase::Optimizer;
            ql.mb = crate::attribute::NO_MB;
            let at = replay.allocated[j];
            rows.push(StepRow {
                train_step: ql.train_step,
                step: ql.pipe_step,
                label: a.step_text(&ql, multi),
                iterations: None,
                first_event: j,
                last_event: j,
                start_allocated_bytes: at,
                end_allocated_bytes: at,
                peak_allocated_bytes: at,
                peak_event_index: j,
                iteration_end_allocated_bytes: Vec::new(),
                peak_categories: Vec::new(),
                quiet: true,
            });
        }
        i = j + 1;
    }
    let peaks: Vec<usize> = rows.iter().map(|r| r.peak_event_index).collect();
    for (row, shares) in rows.iter_mut().zip(categories_at(snap, replay, a, &peaks)) {
        row.peak_categories = shares;
    }
    // rows of a forward, backward or optimizer phase that only free
    let events = snap.trace(a.device);
    let frees_only: Vec<bool> = rows
        .iter()
        .map(|r| {
            use crate::attribute::Phase;
            let phase = a.labels.get(r.first_event).map(|l| l.phase);
            !r.quiet
                && r.step == crate::attribute::STEP_NONE
                && matches!(
                    phase,
                    Some(Phase::Forward | Phase::Backward | Phase::Optimizer)
                )
                && events.get(r.first_event..=r.last_event).is_some_and(|es| {
                    es.iter()
                        .all(|e| e.action != crate::snapshot::Action::Alloc)
                })
        })
        .collect();
    merge_small_rows(rows, &frees_only)
}

/// Rows of a few events between two rows of the same step (a stray free from another thread)
/// are folded into their neighbours so the table reads as one row per step.
///
/// A forward, backward or optimizer row that only frees, after a row of the same phase and
/// training step, is a label left set (memory metadata naming a phase that has ended): it
/// joins the row before it.
fn merge_small_rows(rows: Vec<StepRow>, frees_only: &[bool]) -> Vec<StepRow> {
    let mut out: Vec<StepRow> = Vec::new();
    let mut seen: std::collections::HashSet<(u16, String)> = Default::default();
    for (row, &frees_only) in rows.into_iter().zip(frees_only) {
        let again = frees_only && seen.contains(&(row.train_step, row.label.clone()));
        seen.insert((row.train_step, row.label.clone()));
        if let Some(last) = out.last_mut() {
            let same = last.step == row.step
                && last.train_step == row.train_step
                && (last.label == row.label || again);
            // a quiet range beside a row of its own phase adds nothing to it
            if same && row.quiet {
                continue;
            }
            if same && last.quiet {
                // the row takes the quiet range's place, and goes on with the row before it
                // when that one reads the same (never one label twice in a row)
                out.pop();
                match out.last_mut() {
                    Some(before)
                        if !before.quiet
                            && before.step == row.step
                            && before.train_step == row.train_step
                            && before.label == row.label =>
                    {
                        absorb(before, row)
                    }
                    _ => out.push(row),
                }
                continue;
            }
            if same {
                absorb(last, row);
                continue;
            }
        }
        out.push(row);
    }
    out
}

/// Extends `last` by the row after it: its events, its end, and its peak where higher.
fn absorb(last: &mut StepRow, row: StepRow) {
    if row.peak_allocated_bytes > last.peak_allocated_bytes {
        last.peak_allocated_bytes = row.peak_allocated_bytes;
        last.peak_event_index = row.peak_event_index;
        last.peak_categories = row.peak_categories;
    }
    last.last_event = row.last_event;
    last.end_allocated_bytes = row.end_allocated_bytes;
    last.iteration_end_allocated_bytes
        .extend(row.iteration_end_allocated_bytes);
}

/// Allocated bytes at the end of each loop iteration of a pipeline step: an iteration ends
/// with the last call of the step's last call site.
fn iteration_ends(replay: &Replay, a: &Attribution, first: usize, last: usize) -> Vec<u64> {
    if a.labels[first].pipe_step == 0 || a.labels[first].pipe_step > 8 {
        return Vec::new();
    }
    // calls in order, and the op of the last call site
    let mut calls: Vec<(u32, usize, usize)> = Vec::new();
    for i in first..=last {
        let c = a.labels[i].call;
        match calls.last_mut() {
            Some(x) if x.0 == c => x.2 = i,
            _ => calls.push((c, i, i)),
        }
    }
    let Some(&(_, last_call_start, _)) = calls.last() else {
        return Vec::new();
    };
    let last_op = a.labels[last_call_start].op;
    calls
        .iter()
        .filter(|c| a.labels[c.1].op == last_op)
        .map(|c| replay.allocated[c.2])
        .collect()
}

/// What a block without program frames is called in every view (report, flamegraph): why it
/// has none, where that is known.
pub fn without_frames(label: &Label) -> &'static str {
    if label.phase == crate::attribute::Phase::Backward {
        "<no frames: backward on the autograd thread>"
    } else if label.is_before_trace() {
        "<no frames: allocated before recording>"
    } else {
        "<no frames>"
    }
}

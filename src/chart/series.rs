//! Memory over time grouped by a label, downsampled for drawing.
//!
//! A trace of millions of events is drawn with one value per pixel column. Each column keeps
//! the moment with the *highest* allocated bytes inside it, with the composition of that
//! moment, so the drawn curve reaches the true peak and the stack at the peak is exact.

use std::collections::HashMap;

use crate::analysis::{DeviceAnalysis, Dimension, Keyer};
use crate::attribute::Label;
use crate::replay::{Replay, NONE, PREEXISTING};
use crate::snapshot::{Action, StackId, TraceEvent};

/// Horizontal axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XAxis {
    /// Seconds, unless one idle stretch (no events) takes more than half of the trace's time:
    /// then the event index, so the work is not crammed into a sliver of the width.
    #[default]
    Auto,
    /// Seconds from the first event (event index when the trace has no times).
    Time,
    /// Event index.
    Events,
}

/// The share of the trace's time one stretch without events may take before
/// [`XAxis::Auto`] draws event indices.
const IDLE_SHARE: f64 = 0.5;

/// One drawn column.
#[derive(Clone, Debug, Default)]
pub struct Column {
    /// Position on the x axis.
    pub x: f64,
    /// Allocated bytes per group (same order as [`Series::groups`]).
    pub groups: Vec<u64>,
    /// Highest reserved bytes in the column.
    pub reserved: u64,
    /// The event the column shows.
    pub event: usize,
}

/// A downsampled, grouped timeline.
#[derive(Clone, Debug)]
pub struct Series {
    /// Group names, bottom band first; the last is [`OTHER`], the smaller groups together.
    pub groups: Vec<String>,
    /// How many distinct labels the [`OTHER`] band holds.
    pub folded: usize,
    /// `--by step` grouped whole steps, their micro-batches together: there were more of
    /// them than bands.
    pub whole_steps: bool,
    /// Columns in x order.
    pub columns: Vec<Column>,
    /// x of every event (for markers).
    pub x_of_event: Vec<f64>,
    /// x at trace start and end.
    pub x_range: (f64, f64),
    /// Axis unit: [`XAxis::Time`] or [`XAxis::Events`].
    pub axis: XAxis,
    /// With [`XAxis::Auto`] drawn as events: the longest idle stretch and the trace's span,
    /// in seconds.
    pub idle: Option<(f64, f64)>,
}

/// Builds the grouped series: the `max_groups` largest groups at the peak get their own band,
/// the rest are folded into `other`.
pub fn build(
    a: &DeviceAnalysis,
    by: Dimension,
    axis: XAxis,
    columns: usize,
    max_groups: usize,
) -> Series {
    let (snap, replay) = (a.snap, &a.replay);
    let events = snap.trace(replay.device);
    let mut keyer = a.keyer();
    let (groups, whole_steps) = choose_groups(a, &mut keyer, by, max_groups);
    let other = groups.len() - 1;
    let index: HashMap<&str, usize> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (g.as_str(), i))
        .collect();
    // group of each allocation, cached by label (and stack, for sites)
    let mut by_label: HashMap<(Label, u32), usize> = HashMap::new();
    let mut folded: std::collections::HashSet<String> = Default::default();
    let mut group_of = |keyer: &mut Keyer, l: &Label, stack: StackId| -> usize {
        let key = (*l, if by == Dimension::Site { stack.0 } else { 0 });
        *by_label.entry(key).or_insert_with(|| {
            let name = keyer.key(by, l, stack);
            match index.get(name.as_str()) {
                Some(&g) => g,
                None => {
                    folded.insert(name);
                    other
                }
            }
        })
    };
    let Across {
        x_of_event,
        x_range,
        axis,
        idle,
    } = x_positions(events, replay, axis);

    // running totals per group
    let mut totals = vec![0i128; groups.len()];
    for (k, p) in replay.preexisting.iter().enumerate() {
        if p.live {
            let g = group_of(&mut keyer, &a.attribution.preexisting[k], p.stack);
            totals[g] += p.size as i128;
        }
    }
    // with rounded sizes the anchoring offset belongs to the memory before the trace
    let start_sum: i128 = totals.iter().sum();
    totals[0] += replay.start.allocated as i128 - start_sum;
    let mut sweep = ColumnSweep::new(columns, x_range, replay.start.reserved);
    for (i, e) in events.iter().enumerate() {
        if let Some((origin, sign)) = ended_or_started(replay, e.action, i) {
            let g = match origin {
                Origin::Event(k) => group_of(&mut keyer, &a.attribution.labels[k], events[k].stack),
                Origin::Preexisting(k) => group_of(
                    &mut keyer,
                    &a.attribution.preexisting[k],
                    replay.preexisting[k].stack,
                ),
            };
            totals[g] += sign * origin_bytes(replay, origin) as i128;
        }
        sweep.add(replay, i, x_of_event[i], &totals);
    }
    Series {
        folded: folded.len(),
        whole_steps,
        groups,
        columns: sweep.finish(),
        x_of_event,
        x_range,
        axis,
        idle,
    }
}

/// The bands: memory from before the trace first (when there is any), then the largest groups
/// at the peak, then the largest elsewhere in time, and `other` last. By step, when there are
/// more steps and micro-batches than bands, whole steps (the `bool`): with dozens of
/// micro-batches, eight of them coloured and the rest grey show only what the peak held.
fn choose_groups(
    a: &DeviceAnalysis,
    keyer: &mut Keyer,
    by: Dimension,
    max_groups: usize,
) -> (Vec<String>, bool) {
    let before = keyer.key(by, &Label::BEFORE_TRACE, StackId::EMPTY);
    let mut elsewhere = largest_over_time(a, keyer, by);
    let mut at_peak: Vec<String> = a.peak_shares(by).iter().map(|s| s.label.clone()).collect();
    let whole = by == Dimension::Step && elsewhere.len() > max_groups;
    if whole {
        keyer.set_whole_steps();
        elsewhere = largest_over_time(a, keyer, by);
        let mut seen = std::collections::HashSet::new();
        at_peak = at_peak
            .iter()
            .map(|l| keyer.whole_step(l))
            .filter(|l| seen.insert(l.clone()))
            .collect();
    }
    let mut groups = bands(
        a,
        before,
        at_peak.into_iter(),
        elsewhere.into_iter(),
        max_groups,
    );
    groups.push(OTHER.to_string());
    (groups, whole)
}

/// The bands of grouping `by`, without [`OTHER`]: `before` (the group of memory from before
/// the trace) first when there is any, then the largest groups at the peak, then `elsewhere`
/// (the largest at other times, largest first), at most `max_groups` in all. The PNG
/// timelines and the page choose their bands here.
pub(crate) fn bands(
    a: &DeviceAnalysis,
    before: String,
    at_peak: impl Iterator<Item = String>,
    elsewhere: impl Iterator<Item = String>,
    max_groups: usize,
) -> Vec<String> {
    let replay = &a.replay;
    let mut groups: Vec<String> = Vec::new();
    if replay.start.allocated > 0 || !replay.preexisting.is_empty() {
        groups.push(before.clone());
    }
    // the largest at the peak first, then the largest at other times; what does not fit is
    // the band of smaller groups, whose legend says how large it gets
    for label in at_peak.chain(elsewhere) {
        if groups.len() >= max_groups {
            break;
        }
        if label != before && !groups.contains(&label) {
            groups.push(label);
        }
    }
    if groups.is_empty() {
        groups.push(before);
    }
    groups
}

/// The key of the band that gathers the smaller groups: not a label any dimension gives (a
/// phase or step may be called `other`), so a real group never lands in it.
pub const OTHER: &str = "(smaller groups)";

impl Series {
    /// The largest the [`OTHER`] band is at any column.
    pub fn other_max(&self) -> u64 {
        let g = self.groups.len() - 1;
        self.columns.iter().map(|c| c.groups[g]).max().unwrap_or(0)
    }

    /// The legend's name of the [`OTHER`] band: how many groups it holds and the most they
    /// reach together, since the band can be large away from the peak.
    pub fn other_name(&self) -> String {
        // short: the legend keeps a long name's end, and the count must survive
        format!(
            "{} more, up to {}",
            crate::units::count(self.folded as u64),
            crate::units::bytes(self.other_max())
        )
    }
}

/// The longest stretch between two consecutive events' times and the trace's span, in
/// microseconds (a clock going back counts no stretch).
fn longest_idle(events: &[TraceEvent], replay: &Replay) -> (i64, i64) {
    let (first, last) = replay.time_span_us;
    let longest = events
        .windows(2)
        .filter(|w| w[0].time_us != 0 && w[1].time_us != 0)
        .map(|w| w[1].time_us.saturating_sub(w[0].time_us))
        .max()
        .unwrap_or(0);
    (longest.max(0), last.saturating_sub(first).max(0))
}

/// Where events go across: x of each event, the x range, the axis actually used (events when
/// there are no times) and, when [`XAxis::Auto`] chose events, the idle stretch that made it
/// (seconds, of the span).
struct Across {
    x_of_event: Vec<f64>,
    x_range: (f64, f64),
    axis: XAxis,
    idle: Option<(f64, f64)>,
}

/// The x positions of a trace's events on `axis`.
fn x_positions(events: &[TraceEvent], replay: &Replay, axis: XAxis) -> Across {
    let mut idle = None;
    if axis == XAxis::Auto && replay.time_span_us.0 != 0 {
        let (longest, span) = longest_idle(events, replay);
        if span > 0 && longest as f64 > IDLE_SHARE * span as f64 {
            idle = Some((longest as f64 / 1e6, span as f64 / 1e6));
        }
    }
    let wants_time = matches!(axis, XAxis::Time) || (axis == XAxis::Auto && idle.is_none());
    let has_time = replay.time_span_us.0 != 0 && wants_time;
    let x_of_event: Vec<f64> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            if has_time {
                e.time_us.saturating_sub(replay.time_span_us.0).max(0) as f64 / 1e6
            } else {
                i as f64
            }
        })
        .collect();
    let x_range = (0.0, x_of_event.last().copied().unwrap_or(1.0).max(1e-9));
    let axis = if has_time { XAxis::Time } else { XAxis::Events };
    Across {
        x_of_event,
        x_range,
        axis,
        idle,
    }
}

/// Where an allocation's bytes came from: an `alloc` event, or a block from before the trace.
#[derive(Clone, Copy)]
enum Origin {
    Event(usize),
    Preexisting(usize),
}

/// The allocation that event `i` starts (+1) or ends (-1), if any.
fn ended_or_started(replay: &Replay, action: Action, i: usize) -> Option<(Origin, i128)> {
    match action {
        Action::Alloc => Some((Origin::Event(i), 1)),
        Action::FreeRequested | Action::FreeCompleted => {
            // The event that ended the allocation is the one its alloc links back to.
            let p = replay.partner[i];
            if p == NONE {
                None
            } else if p & PREEXISTING != 0 {
                let k = (p & !PREEXISTING) as usize;
                (replay.preexisting[k].freed_at as usize == i)
                    .then_some((Origin::Preexisting(k), -1))
            } else {
                (replay.partner[p as usize] as usize == i)
                    .then_some((Origin::Event(p as usize), -1))
            }
        }
        _ => None,
    }
}

fn origin_bytes(replay: &Replay, origin: Origin) -> u64 {
    match origin {
        Origin::Event(k) => replay.bytes(k),
        Origin::Preexisting(k) => replay.preexisting[k].size,
    }
}

/// Columns filled event by event, each keeping its highest moment.
struct ColumnSweep {
    cols: Vec<Option<Column>>,
    x_range: (f64, f64),
    reserved: u64,
    reserved_change: usize,
}

impl ColumnSweep {
    fn new(columns: usize, x_range: (f64, f64), reserved: u64) -> ColumnSweep {
        ColumnSweep {
            cols: vec![None; columns.max(1)],
            x_range,
            reserved,
            reserved_change: 0,
        }
    }

    fn add(&mut self, replay: &Replay, i: usize, x: f64, totals: &[i128]) {
        while let Some(&(at, bytes)) = replay.reserved_changes.get(self.reserved_change) {
            if at as usize > i {
                break;
            }
            self.reserved = bytes;
            self.reserved_change += 1;
        }
        let width = (self.x_range.1 - self.x_range.0).max(1e-12);
        let last_col = self.cols.len() - 1;
        let b = (((x - self.x_range.0) / width) * last_col as f64).round() as usize;
        let b = b.min(last_col);
        let total = replay.allocated[i];
        let now = || totals.iter().map(|&t| t.max(0) as u64).collect();
        match &mut self.cols[b] {
            Some(c) => {
                c.reserved = c.reserved.max(self.reserved);
                if total > c.groups.iter().sum() {
                    c.groups = now();
                    c.event = i;
                }
            }
            slot @ None => {
                *slot = Some(Column {
                    x: self.x_range.0 + width * b as f64 / last_col.max(1) as f64,
                    groups: now(),
                    reserved: self.reserved,
                    event: i,
                })
            }
        }
    }

    fn finish(self) -> Vec<Column> {
        self.cols.into_iter().flatten().collect()
    }
}

/// Groups ordered by the most bytes they ever held at once.
fn largest_over_time(a: &DeviceAnalysis, keyer: &mut Keyer, by: Dimension) -> Vec<String> {
    let (snap, replay) = (a.snap, &a.replay);
    let events = snap.trace(replay.device);
    let mut ids: HashMap<(Label, u32), usize> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    // by name, so that many distinct labels of one name cost a lookup each, not a scan
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut id_of = |keyer: &mut Keyer, l: &Label, stack: StackId| -> usize {
        let key = (*l, if by == Dimension::Site { stack.0 } else { 0 });
        *ids.entry(key).or_insert_with(|| {
            let name = keyer.key(by, l, stack);
            *by_name.entry(name.clone()).or_insert_with(|| {
                names.push(name);
                names.len() - 1
            })
        })
    };
    let mut now: Vec<i128> = Vec::new();
    let mut max: Vec<i128> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let Some((Origin::Event(k), sign)) = ended_or_started(replay, e.action, i) else {
            continue;
        };
        let g = id_of(keyer, &a.attribution.labels[k], events[k].stack);
        if g >= now.len() {
            now.resize(g + 1, 0);
            max.resize(g + 1, 0);
        }
        now[g] += sign * replay.bytes(k) as i128;
        max[g] = max[g].max(now[g]);
    }
    let mut order: Vec<usize> = (0..max.len()).collect();
    order.sort_by_key(|&g| std::cmp::Reverse(max[g]));
    order
        .into_iter()
        .filter(|&g| max[g] > 0)
        .map(|g| names[g].clone())
        .collect()
}

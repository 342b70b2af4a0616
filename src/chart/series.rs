//! Memory over time grouped by a label, downsampled for drawing.
//!
//! A trace of millions of events is drawn with one value per pixel column. Each column keeps
//! the moment with the *highest* allocated bytes inside it, with the composition of that
//! moment, so the drawn curve reaches the true peak and the stack at the peak is exact.

use std::collections::HashMap;

use crate::attribute::{Attribution, Category, Label};
use crate::replay::{Replay, NONE};
use crate::report::breakdown::{self, Dimension, Keyer};
use crate::snapshot::{Action, Snapshot};

/// Horizontal axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XAxis {
    /// Seconds from the first event (event index when the trace has no times).
    #[default]
    Time,
    /// Event index.
    Events,
}

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
    /// Group names, bottom band first; the last may be `other`.
    pub groups: Vec<String>,
    /// Columns in x order.
    pub columns: Vec<Column>,
    /// x of every event (for markers).
    pub x_of_event: Vec<f64>,
    /// x at trace start and end.
    pub x_range: (f64, f64),
    /// Axis unit.
    pub axis: XAxis,
}

/// Builds the grouped series: the `max_groups` largest groups at the peak get their own band,
/// the rest are folded into `other`.
pub fn build(
    snap: &Snapshot,
    replay: &Replay,
    a: &Attribution,
    by: Dimension,
    axis: XAxis,
    columns: usize,
    max_groups: usize,
) -> Series {
    let events = snap.trace(replay.device);
    let n = events.len();
    let mut keyer = Keyer::new(snap, a);
    // groups by size at the peak
    let live = breakdown::live_at(snap, replay, a, replay.peaks.allocated.event);
    let ranked = breakdown::group(&mut keyer, by, &live);
    let before = keyer.key(
        by,
        &Label {
            category: Category::PreExisting,
            call: u32::MAX,
            ..Label::default()
        },
        crate::snapshot::StackId::EMPTY,
    );
    // Largest at the peak first, then the largest elsewhere in time.
    let elsewhere = largest_over_time(snap, replay, a, &mut keyer, by);
    let mut groups: Vec<String> = Vec::new();
    if replay.start.allocated > 0 || !replay.preexisting.is_empty() {
        groups.push(before.clone());
    }
    let candidates = ranked.iter().map(|s| s.label.clone()).chain(elsewhere);
    for label in candidates {
        if groups.len() >= max_groups {
            break;
        }
        if label != before && !groups.contains(&label) {
            groups.push(label);
        }
    }
    let other = groups.len();
    groups.push("other".to_string());
    let index: HashMap<String, usize> = groups
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, g)| (g, i))
        .collect();

    // group of each allocation, cached by label (and stack, for sites)
    let mut by_label: HashMap<(Label, u32), usize> = HashMap::new();
    let mut group_of = |keyer: &mut Keyer, l: &Label, stack: crate::snapshot::StackId| -> usize {
        let key = (*l, if by == Dimension::Site { stack.0 } else { 0 });
        *by_label.entry(key).or_insert_with(|| {
            index
                .get(&keyer.key(by, l, stack))
                .copied()
                .unwrap_or(other)
        })
    };

    // x of each event
    let has_time = replay.time_span_us.0 != 0 && axis == XAxis::Time;
    let x_of_event: Vec<f64> = (0..n)
        .map(|i| {
            if has_time {
                (events[i].time_us - replay.time_span_us.0).max(0) as f64 / 1e6
            } else {
                i as f64
            }
        })
        .collect();
    let x_range = (0.0, x_of_event.last().copied().unwrap_or(1.0).max(1e-9));
    let axis = if has_time { XAxis::Time } else { XAxis::Events };

    // running totals per group
    let mut totals = vec![0i128; groups.len()];
    for (k, p) in replay.preexisting.iter().enumerate() {
        if p.live {
            let g = group_of(&mut keyer, &a.preexisting[k], p.stack);
            totals[g] += p.size as i128;
        }
    }
    // with rounded sizes the anchoring offset belongs to the memory before the trace
    let start_sum: i128 = totals.iter().sum();
    totals[0] += replay.start.allocated as i128 - start_sum;
    let mut cols: Vec<Option<Column>> = vec![None; columns.max(1)];
    let width = (x_range.1 - x_range.0).max(1e-12);
    let mut reserved_change = 0;
    let mut reserved = replay.start.reserved;
    for i in 0..n {
        let e = &events[i];
        match e.action {
            Action::Alloc => {
                let g = group_of(&mut keyer, &a.labels[i], e.stack);
                totals[g] += replay.bytes[i] as i128;
            }
            Action::FreeRequested | Action::FreeCompleted => {
                // The event that ended the allocation is the one its alloc links back to.
                let p = replay.partner[i];
                if p == NONE {
                } else if p & crate::replay::PREEXISTING != 0 {
                    let k = (p & !crate::replay::PREEXISTING) as usize;
                    let pre = &replay.preexisting[k];
                    if pre.freed_at as usize == i {
                        let g = group_of(&mut keyer, &a.preexisting[k], pre.stack);
                        totals[g] -= pre.size as i128;
                    }
                } else if replay.partner[p as usize] as usize == i {
                    let g = group_of(&mut keyer, &a.labels[p as usize], events[p as usize].stack);
                    totals[g] -= replay.bytes[p as usize] as i128;
                }
            }
            _ => {}
        }
        while reserved_change < replay.reserved_changes.len()
            && replay.reserved_changes[reserved_change].0 as usize <= i
        {
            reserved = replay.reserved_changes[reserved_change].1;
            reserved_change += 1;
        }
        let last_col = cols.len() - 1;
        let b = (((x_of_event[i] - x_range.0) / width) * last_col as f64).round() as usize;
        let b = b.min(last_col);
        let total = replay.allocated[i];
        match &mut cols[b] {
            Some(c) => {
                c.reserved = c.reserved.max(reserved);
                let current: u64 = c.groups.iter().sum();
                if total > current {
                    c.groups = totals.iter().map(|&t| t.max(0) as u64).collect();
                    c.event = i;
                }
            }
            slot @ None => {
                *slot = Some(Column {
                    x: x_range.0 + width * b as f64 / last_col.max(1) as f64,
                    groups: totals.iter().map(|&t| t.max(0) as u64).collect(),
                    reserved,
                    event: i,
                })
            }
        }
    }
    let columns: Vec<Column> = cols.into_iter().flatten().collect();
    Series {
        groups,
        columns,
        x_of_event,
        x_range,
        axis,
    }
}

/// Groups ordered by the most bytes they ever held at once.
fn largest_over_time(
    snap: &Snapshot,
    replay: &Replay,
    a: &Attribution,
    keyer: &mut Keyer,
    by: Dimension,
) -> Vec<String> {
    let events = snap.trace(replay.device);
    let mut ids: HashMap<(Label, u32), usize> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut id_of = |keyer: &mut Keyer, l: &Label, stack: crate::snapshot::StackId| -> usize {
        let key = (*l, if by == Dimension::Site { stack.0 } else { 0 });
        *ids.entry(key).or_insert_with(|| {
            let name = keyer.key(by, l, stack);
            match names.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    names.push(name);
                    names.len() - 1
                }
            }
        })
    };
    let mut now: Vec<i128> = Vec::new();
    let mut max: Vec<i128> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let (g, delta) = match e.action {
            Action::Alloc => (id_of(keyer, &a.labels[i], e.stack), replay.bytes[i] as i128),
            Action::FreeRequested | Action::FreeCompleted => {
                let p = replay.partner[i];
                if p == NONE
                    || p & crate::replay::PREEXISTING != 0
                    || replay.partner[p as usize] as usize != i
                {
                    continue;
                }
                let p = p as usize;
                (
                    id_of(keyer, &a.labels[p], events[p].stack),
                    -(replay.bytes[p] as i128),
                )
            }
            _ => continue,
        };
        if g >= now.len() {
            now.resize(g + 1, 0);
            max.resize(g + 1, 0);
        }
        now[g] += delta;
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

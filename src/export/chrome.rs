//! The analysis as a Chrome trace (the JSON object format of the Trace Event Format, which
//! Perfetto and `chrome://tracing` open), to read memory next to the profiler's own trace.
//!
//! Each run (a rank, or a device of a file) is one process. Its counter tracks are `memory`
//! (allocated and reserved bytes) and `allocated by category` (one series per category); the
//! rows of the step table are slices on the `steps` thread, whole training steps on `train
//! steps`, and each out-of-memory error an instant event. Times are the recorded wall clock in
//! microseconds, as the PyTorch profiler's traces keep them, so both line up in one viewer;
//! a trace without times counts events instead.
//!
//! Counters change at every allocation and free; a long trace is cut into at most
//! `max_samples / 2` stretches of events, and each stretch gives its lowest and its highest
//! point in their order, so that every peak (the run's own peak included) keeps its exact
//! value. Written by hand: the format is a few kinds of JSON objects, which `serde_json`
//! writes.

use std::io::{self, Write};

use serde_json::{json, Value};

use crate::analysis::DeviceAnalysis;
use crate::attribute::Category;
use crate::replay::{NONE, PREEXISTING};
use crate::snapshot::Action;

/// One run of the trace: its process name and id, and its analysis.
pub struct Run<'a, 's> {
    /// The process's name (`rank 3 · cuda:0`).
    pub name: String,
    /// The process id (the rank where known).
    pub pid: u32,
    /// The device's analysis.
    pub analysis: &'a DeviceAnalysis<'s>,
}

/// Counter samples per run, at most (the default).
pub const MAX_SAMPLES: usize = 200_000;

fn category_index(c: Category) -> usize {
    Category::ALL.iter().position(|x| *x == c).unwrap_or(0)
}

/// The events a run's counters are written at: every event of a short trace; for a long one,
/// the lowest and highest allocated point of each stretch, in order.
fn sample_points(allocated: &[u64], max_samples: usize) -> Vec<usize> {
    let n = allocated.len();
    let stretches = (max_samples / 2).max(1);
    if n <= max_samples {
        return (0..n).collect();
    }
    let mut out = Vec::with_capacity(2 * stretches + 1);
    for k in 0..stretches {
        let (a, b) = (k * n / stretches, (k + 1) * n / stretches);
        if a >= b {
            continue;
        }
        let lo = (a..b).min_by_key(|&i| allocated[i]).unwrap_or(a);
        // the first of equal highs: the run's peak event is where it was first reached
        let hi = (a..b).rev().max_by_key(|&i| allocated[i]).unwrap_or(a);
        out.push(lo.min(hi));
        if lo != hi {
            out.push(lo.max(hi));
        }
    }
    out.push(n - 1);
    out.dedup();
    out
}

/// Writes the trace of `runs` as one JSON object.
pub fn write(out: &mut dyn Write, runs: &[Run], max_samples: usize) -> io::Result<()> {
    let mut events: Vec<Value> = Vec::new();
    for run in runs {
        run_events(run, max_samples, &mut events);
    }
    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": format!("memsnap {}", env!("CARGO_PKG_VERSION"))},
    });
    serde_json::to_writer(&mut *out, &doc)?;
    writeln!(out)
}

fn run_events(run: &Run, max_samples: usize, events: &mut Vec<Value>) {
    let a = run.analysis;
    let r = &a.replay;
    let trace = a.snap.trace(a.device());
    let pid = run.pid;
    let timed = trace.iter().any(|e| e.time_us != 0);
    let ts = |i: usize| -> i64 {
        if timed {
            trace[i].time_us
        } else {
            i as i64
        }
    };
    events.push(
        json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": run.name}}),
    );
    events.push(
        json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}}),
    );
    for (tid, name) in [(1, "train steps"), (2, "steps"), (3, "out of memory")] {
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": name}}),
        );
    }

    // allocated bytes by category after every event
    let labels = &a.attribution.labels;
    let mut by_category = [0i64; Category::ALL.len()];
    for (k, p) in r.preexisting.iter().enumerate() {
        if p.live {
            let c = a
                .attribution
                .preexisting
                .get(k)
                .map_or(Category::PreExisting, |l| l.category);
            by_category[category_index(c)] += p.size as i64;
        }
    }
    let points = sample_points(&r.allocated, max_samples);
    // the categories that ever hold a byte get a series; the others none
    let mut used = by_category.map(|b| b > 0);
    for (i, e) in trace.iter().enumerate() {
        if e.action == Action::Alloc && r.bytes(i) > 0 {
            used[category_index(labels[i].category)] = true;
        }
    }
    let mut next = 0;
    let reserved_at = |i: usize| r.reserved_at(Some(i));
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => by_category[category_index(labels[i].category)] += r.bytes(i) as i64,
            Action::FreeRequested | Action::FreeCompleted => {
                let origin = r.partner[i];
                // only the free that ended the block's count: its alloc names this free
                if origin != NONE && origin & PREEXISTING == 0 {
                    let o = origin as usize;
                    if o < trace.len() && r.partner[o] as usize == i {
                        by_category[category_index(labels[o].category)] -= r.bytes(o) as i64;
                    }
                } else if origin != NONE {
                    let k = (origin & !PREEXISTING) as usize;
                    if let Some(p) = r.preexisting.get(k) {
                        if p.live && p.freed_at as usize == i {
                            let c = a
                                .attribution
                                .preexisting
                                .get(k)
                                .map_or(Category::PreExisting, |l| l.category);
                            by_category[category_index(c)] -= p.size as i64;
                        }
                    }
                }
            }
            _ => {}
        }
        if next < points.len() && points[next] == i {
            next += 1;
            events.push(
                json!({"ph": "C", "name": "memory", "pid": pid, "tid": 0, "ts": ts(i),
                               "args": {"allocated": r.allocated[i], "reserved": reserved_at(i)}}),
            );
            let mut args = serde_json::Map::new();
            for ((c, &bytes), _) in Category::ALL
                .iter()
                .zip(&by_category)
                .zip(&used)
                .filter(|(_, u)| **u)
            {
                args.insert(c.as_str().to_string(), json!(bytes.max(0)));
            }
            events.push(
                json!({"ph": "C", "name": "allocated by category", "pid": pid,
                               "tid": 0, "ts": ts(i), "args": args}),
            );
        }
    }

    // the step table's rows, and whole training steps
    let multi = a.attribution.multi_step();
    let mut train: Vec<(u16, usize, usize)> = Vec::new();
    for row in &a.steps {
        if row.quiet || row.first_event >= trace.len() {
            continue;
        }
        let (s, e) = (ts(row.first_event), ts(row.last_event.min(trace.len() - 1)));
        let name = if multi {
            format!(
                "train step {} · {}",
                a.attribution.step_number(row.train_step),
                row.label
            )
        } else {
            row.label.clone()
        };
        events.push(
            json!({"ph": "X", "name": name, "pid": pid, "tid": 2, "ts": s,
                           "dur": (e - s).max(1),
                           "args": {"peak_allocated": row.peak_allocated_bytes,
                                    "start_allocated": row.start_allocated_bytes,
                                    "end_allocated": row.end_allocated_bytes}}),
        );
        match train.last_mut() {
            Some(t) if t.0 == row.train_step => t.2 = t.2.max(row.last_event),
            _ => train.push((row.train_step, row.first_event, row.last_event)),
        }
    }
    if multi {
        for (step, first, last) in train {
            let (s, e) = (ts(first), ts(last.min(trace.len() - 1)));
            events.push(
                json!({"ph": "X", "name": format!("train step {}", a.attribution.step_number(step)),
                               "pid": pid, "tid": 1, "ts": s, "dur": (e - s).max(1)}),
            );
        }
    }
    for o in &r.ooms {
        if o.event < trace.len() {
            events.push(
                json!({"ph": "i", "s": "p", "name": "out of memory", "pid": pid,
                               "tid": 3, "ts": ts(o.event),
                               "args": {"requested": o.requested, "allocated": o.allocated,
                                        "reserved": o.reserved, "device_free": o.device_free}}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_keep_every_stretch_extreme() {
        let allocated: Vec<u64> = (0..1000u64).map(|i| (i * 7919) % 1009).collect();
        let points = sample_points(&allocated, 100);
        assert!(points.len() <= 101 + 1);
        assert!(points.windows(2).all(|w| w[0] < w[1]), "in order");
        let peak = allocated.iter().max().unwrap();
        assert!(
            points.iter().any(|&i| allocated[i] == *peak),
            "the peak is kept"
        );
        assert_eq!(
            sample_points(&allocated[..50], 100),
            (0..50).collect::<Vec<_>>()
        );
    }
}

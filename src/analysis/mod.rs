//! Analysis: everything memsnap knows about one device, computed once for every view.
//!
//! [`analyse`] runs the per-device pipeline (replay, attribution, then the summaries that every
//! view needs: where the peak was reached, what was live at the peak in each [`Dimension`], and
//! the per-step table) and returns one [`DeviceAnalysis`] per device. Reports, charts,
//! comparisons and every later command read that value; none of them replays or attributes
//! again, and none of them imports another view.
//!
//! The replay and the labelling of events run side by side where a core is free for it: the
//! labels need only what the replay knows before its first event ([`crate::replay::Preview`]),
//! and that only after their first pass, so they start while the replay rebuilds the state at
//! trace start ([`crate::replay::PreviewSoon`]); the categories, which need the replay's
//! lifetimes, come after both.
//!
//! The grouping vocabulary lives in [`breakdown`]: a [`Dimension`] to group by, a [`Keyer`]
//! that turns labels into group names, [`Share`]s of bytes, and the [`StepRow`]s of the step
//! table.

pub mod breakdown;
pub mod pools;

use serde::Serialize;

use crate::attribute::{self, frames, Attribution};
use crate::replay::{self, Replay, SizeModel};
use crate::snapshot::{Action, Snapshot};
pub use breakdown::{Dimension, Keyer, Share, StepRow};

/// What to compute.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// How bytes are counted.
    pub model: SizeModel,
    /// Attribution options (source roots, preset, custom rules).
    pub attribution: attribute::Options,
}

/// Where the peak happened: the labels of the allocation that reached it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct PeakPlace {
    /// Pipeline step (or phase) text.
    pub step: String,
    /// Op with micro-batches.
    pub op: String,
    /// Layer stage or model place.
    pub stage: String,
    /// Category of that allocation.
    pub category: String,
    /// Layer ordinal within its chunk, if known.
    pub layer: Option<u16>,
    /// Allocation site.
    pub site: String,
    /// Autograd node or other detail.
    pub detail: String,
}

impl PeakPlace {
    /// The place in a few words: step, op (unless the step already names it), then the stage,
    /// or for a backward stage its autograd node.
    pub fn summary_parts(&self) -> Vec<String> {
        let mut parts = vec![self.step.clone()];
        if !self.op.is_empty() && !self.step.ends_with(&self.op) {
            parts.push(self.op.clone());
        }
        if self.stage.starts_with("backward (") {
            if !self.detail.is_empty() {
                parts.push(self.detail.clone());
            }
        } else if !self.stage.is_empty() {
            parts.push(self.stage.clone());
        }
        parts
    }

    /// [`PeakPlace::summary_parts`] joined: `step 4 · F0&B1 mb 4/2 · LogSoftmaxBackward0`.
    pub fn summary(&self) -> String {
        self.summary_parts().join(" · ")
    }

    /// Whether the peak was reached before the first recorded event.
    pub fn is_before_trace(&self) -> bool {
        self.step == BEFORE_TRACE
    }
}

/// The group name of memory that was alive before the first recorded event.
pub const BEFORE_TRACE: &str = "before the trace";

/// Everything computed for one device of a snapshot.
#[derive(Clone, Debug)]
pub struct DeviceAnalysis<'s> {
    /// The snapshot the device belongs to.
    pub snap: &'s Snapshot,
    /// Memory over time.
    pub replay: Replay,
    /// Labels of every event.
    pub attribution: Attribution,
    /// Where the allocated peak was reached.
    pub peak_place: PeakPlace,
    /// Bytes live at the allocated peak grouped by each dimension (in [`Dimension::ALL`]
    /// order), largest first; each adds up to the peak.
    pub peak_breakdown: Vec<(Dimension, Vec<Share>)>,
    /// One row per pipeline step (or phase of a training step), in time order.
    pub steps: Vec<StepRow>,
}

impl DeviceAnalysis<'_> {
    /// Device ordinal.
    pub fn device(&self) -> u32 {
        self.replay.device
    }

    /// The memory live at the peak grouped by `d`, largest first.
    pub fn peak_shares(&self, d: Dimension) -> &[Share] {
        self.peak_breakdown
            .iter()
            .find(|(x, _)| *x == d)
            .map_or(&[], |(_, s)| s.as_slice())
    }

    /// A keyer over this device's labels.
    pub fn keyer(&self) -> Keyer<'_> {
        Keyer::new(self.snap, &self.attribution)
    }
}

/// The devices a snapshot is analysed for: those with trace events, or, when none has any,
/// every device that owns a segment.
pub fn devices(snap: &Snapshot) -> Vec<u32> {
    let with_events: Vec<u32> = snap.devices_with_events().collect();
    if with_events.is_empty() {
        snap.devices()
    } else {
        with_events
    }
}

/// Analyses every device of [`devices`].
pub fn analyse<'s>(snap: &'s Snapshot, options: &Options) -> Vec<DeviceAnalysis<'s>> {
    devices(snap)
        .into_iter()
        .map(|d| analyse_device(snap, d, options))
        .collect()
}

/// Replays, attributes and summarises one device.
pub fn analyse_device<'s>(
    snap: &'s Snapshot,
    device: u32,
    options: &Options,
) -> DeviceAnalysis<'s> {
    analyse_one(snap, device, options, true)
}

/// A device's replay and labels, without the peak's breakdown and the step table (left
/// empty): for what reads the events alone, such as a diff.
pub fn analyse_events<'s>(
    snap: &'s Snapshot,
    device: u32,
    options: &Options,
) -> DeviceAnalysis<'s> {
    analyse_one(snap, device, options, false)
}

fn analyse_one<'s>(
    snap: &'s Snapshot,
    device: u32,
    options: &Options,
    tables: bool,
) -> DeviceAnalysis<'s> {
    // The events are labelled (all but their categories) on another core, where one is free,
    // while the replay runs: the labels need only what the replay knows before it starts, and
    // that only after their first pass, so they start while the replay's start is rebuilt.
    let (send, preview) = replay::PreviewSoon::coming(device);
    let (replay, labelled) = rayon::join(
        move || {
            let prepared = replay::prepare(snap, device, options.model);
            let _ = send.send(prepared.preview());
            prepared.run()
        },
        move || attribute::label(snap, &preview, &options.attribution),
    );
    let attribution = labelled.finish(snap, &replay, &options.attribution);
    if !tables {
        return DeviceAnalysis {
            snap,
            peak_place: peak_place(snap, &replay, &attribution),
            peak_breakdown: Vec::new(),
            steps: Vec::new(),
            replay,
            attribution,
        };
    }
    // the peak's breakdown and the step table each read the whole trace: side by side too
    let ((peak_breakdown, peak_place), steps) = rayon::join(
        || {
            (
                peak_breakdown(snap, &replay, &attribution),
                peak_place(snap, &replay, &attribution),
            )
        },
        || breakdown::step_table(snap, &replay, &attribution),
    );
    DeviceAnalysis {
        snap,
        peak_place,
        peak_breakdown,
        steps,
        replay,
        attribution,
    }
}

/// What was live at the allocated peak, grouped by each dimension, and reconciled with the
/// peak's bytes.
fn peak_breakdown(snap: &Snapshot, r: &Replay, a: &Attribution) -> Vec<(Dimension, Vec<Share>)> {
    let peak = r.peaks.allocated;
    let live = breakdown::live_at(snap, r, a, peak.event);
    let mut keyer = Keyer::new(snap, a);
    Dimension::ALL
        .into_iter()
        .map(|d| {
            let mut shares = breakdown::group(&mut keyer, d, &live);
            let before = keyer.key(d, &attribute::Label::BEFORE_TRACE, Default::default());
            reconcile(&mut shares, peak.bytes, &before);
            (d, shares)
        })
        .collect()
}

/// Where the allocated peak was reached: the labels of the allocation that reached it (the
/// event itself, or the newest allocation before it when the peak event is a free).
fn peak_place(snap: &Snapshot, r: &Replay, a: &Attribution) -> PeakPlace {
    let Some(i) = r.peaks.allocated.event else {
        return PeakPlace {
            step: BEFORE_TRACE.into(),
            ..PeakPlace::default()
        };
    };
    let events = snap.trace(r.device);
    let owner = (0..=i)
        .rev()
        .find(|&k| events[k].action == Action::Alloc)
        .unwrap_or(i);
    let l = &a.labels[owner];
    PeakPlace {
        step: a.step_text(l, a.multi_step()),
        op: a.op_text(l),
        stage: a.names.get(l.stage).to_string(),
        category: l.category.as_str().to_string(),
        layer: (l.layer != u16::MAX).then_some(l.layer),
        site: frames::site(snap, events[owner].stack, 4),
        detail: a.names.get(l.detail).to_string(),
    }
}

/// `bins` equal ranges from the lowest to the highest value: `(from, to, count)`.
pub fn histogram(values: &[u64], bins: usize) -> Vec<(u64, u64, usize)> {
    let (Some(&lo), Some(&hi)) = (values.iter().min(), values.iter().max()) else {
        return Vec::new();
    };
    let bins = bins.max(1);
    let width = ((hi - lo) / bins as u64).max(1);
    let mut out: Vec<(u64, u64, usize)> = (0..bins as u64)
        .map(|b| (lo + b * width, lo + (b + 1) * width, 0))
        .collect();
    if let Some(last) = out.last_mut() {
        last.1 = hi;
    }
    for &v in values {
        let b = (((v - lo) / width) as usize).min(bins - 1);
        out[b].2 += 1;
    }
    out
}

/// Makes a breakdown add up to `total`: with rounded sizes the series is anchored at the
/// snapshot's end, and the difference belongs to the memory that was there before the trace
/// (group `before`).
fn reconcile(shares: &mut Vec<Share>, total: u64, before: &str) {
    let sum: u64 = shares.iter().map(|s| s.bytes).sum();
    if sum == total {
        return;
    }
    let diff = total as i128 - sum as i128;
    match shares.iter_mut().find(|s| s.label == before) {
        Some(s) => s.bytes = (s.bytes as i128 + diff).max(0) as u64,
        None if diff > 0 => shares.push(Share {
            label: before.to_string(),
            bytes: diff as u64,
            count: 0,
        }),
        None => {}
    }
    shares.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
}

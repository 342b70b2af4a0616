//! Report: what `memsnap report` says about a snapshot, computed once as plain data.
//!
//! [`FileReport`] and [`DeviceReport`] hold every figure the report shows; [`text`] renders
//! them as aligned tables for people and [`json`] as one JSON object per file for machines.
//! Nothing here reads the terminal or formats numbers outside [`crate::units`].

pub mod breakdown;
pub mod compare;
pub mod json;
pub mod text;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::attribute::{self, Attribution, PipelineInfo, Preset};
use crate::replay::{self, EndCheck, Oom, Replay, SizeModel};
use crate::snapshot::{BlockState, Snapshot, SourceInfo};
use breakdown::{Dimension, Keyer, Share, StepRow};

/// What to compute and show.
#[derive(Clone, Debug)]
pub struct Options {
    /// How bytes are counted.
    pub model: SizeModel,
    /// Attribution options (source roots, preset, custom rules).
    pub attribution: attribute::Options,
    /// Dimensions of the peak breakdown to show (the JSON always has them all).
    pub by: Vec<Dimension>,
    /// Rows per breakdown table.
    pub top: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            model: SizeModel::Allocator,
            attribution: attribute::Options::default(),
            by: vec![Dimension::Category, Dimension::Step, Dimension::Stage],
            top: 8,
        }
    }
}

/// Where the peak happened: the labels of the allocation that reached it.
#[derive(Clone, Debug, Default, Serialize)]
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
}

/// How the trace was labelled.
#[derive(Clone, Debug, Serialize)]
pub struct AttributionSummary {
    /// The preset used.
    pub preset: Preset,
    /// Pipeline details (pithtrain preset).
    pub pipeline: Option<PipelineInfo>,
}

/// Which stacks the recording kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StackKind {
    /// No event has frames (`context=None`, or `enabled="state"`).
    None,
    /// Python frames only (`stacks="python"`).
    Python,
    /// Python and C++ frames (`stacks="all"`, the default).
    PythonAndCpp,
    /// C++ frames only.
    Cpp,
}

impl StackKind {
    /// Words for the text report.
    pub fn describe(self) -> &'static str {
        match self {
            StackKind::None => "none",
            StackKind::Python => "Python",
            StackKind::PythonAndCpp => "Python + C++",
            StackKind::Cpp => "C++",
        }
    }
}

/// Everything the report says about one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    /// Device ordinal (a pipeline rank records on its own GPU: rank 1 is device 1).
    pub device: u32,
    /// Trace events recorded.
    pub events: usize,
    /// Time from the first to the last event, in microseconds.
    pub duration_us: i64,
    /// Which stacks were recorded.
    pub stacks: StackKind,
    /// Every free in the trace has its allocation in the trace.
    pub trace_complete: bool,
    /// Frees of blocks allocated before the first recorded event.
    pub frees_without_alloc: u64,
    /// The history ring buffer most likely dropped its oldest events.
    pub trace_wrapped: bool,
    /// The replay ended exactly at the snapshot's blocks and segments.
    pub replay_consistent: bool,
    /// How bytes are counted.
    pub size_model: SizeModel,
    /// Allocated bytes before the first event.
    pub start_allocated_bytes: u64,
    /// Requested bytes before the first event.
    pub start_requested_bytes: u64,
    /// Reserved bytes before the first event.
    pub start_reserved_bytes: u64,
    /// Highest allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Highest requested bytes.
    pub peak_requested_bytes: u64,
    /// Highest active bytes (allocated + pending frees).
    pub peak_active_bytes: u64,
    /// Highest reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Event after which allocated bytes first reached their peak (`null`: before the trace).
    pub peak_event_index: Option<usize>,
    /// Microseconds from the first event to the allocated peak.
    pub peak_time_offset_us: i64,
    /// Reserved bytes at the allocated peak.
    pub reserved_at_peak_bytes: u64,
    /// Allocated bytes after the last event.
    pub end_allocated_bytes: u64,
    /// Requested bytes after the last event.
    pub end_requested_bytes: u64,
    /// Reserved bytes after the last event.
    pub end_reserved_bytes: u64,
    /// Reserved minus allocated at the allocated peak.
    pub fragmentation_at_peak_bytes: u64,
    /// Reserved minus allocated at the end.
    pub fragmentation_at_end_bytes: u64,
    /// Largest cached free block at snapshot time.
    pub largest_free_block_bytes: u64,
    /// Failed allocations.
    pub ooms: Vec<Oom>,
    /// Details of the end-of-replay check.
    pub check: EndCheck,
    /// How events were labelled.
    pub attribution: AttributionSummary,
    /// Where the allocated peak happened.
    pub peak: PeakPlace,
    /// Bytes live at the peak, per dimension (`category`, `step`, `op`, `stage`, `phase`,
    /// `annotation`), largest first.
    pub peak_breakdown: BTreeMap<&'static str, Vec<Share>>,
    /// Allocation sites live at the peak, largest first.
    pub top_sites: Vec<Share>,
    /// One row per pipeline step (or phase) in time order.
    pub steps: Vec<StepRow>,
    /// Dimensions the text report shows.
    #[serde(skip)]
    pub show: Vec<Dimension>,
    /// Rows per table in the text report.
    #[serde(skip)]
    pub top: usize,
}

/// Everything the report says about one file.
#[derive(Clone, Debug, Serialize)]
pub struct FileReport {
    /// The file as given on the command line.
    pub file: String,
    /// Encoding details.
    pub source: SourceInfo,
    /// Devices with trace events, or with segments when no device has events.
    pub devices: Vec<DeviceReport>,
}

/// Which stacks a device's events carry.
pub fn stack_kind(snap: &Snapshot, device: u32) -> StackKind {
    let mut python = false;
    let mut cpp = false;
    for e in snap.trace(device) {
        for frame in snap.stacks.frames(e.stack) {
            if frame.line > 0 {
                python = true;
            } else {
                cpp = true;
            }
        }
        if python && cpp {
            break;
        }
    }
    match (python, cpp) {
        (false, false) => StackKind::None,
        (true, false) => StackKind::Python,
        (true, true) => StackKind::PythonAndCpp,
        (false, true) => StackKind::Cpp,
    }
}

fn largest_free_block(snap: &Snapshot, device: u32) -> u64 {
    snap.segments_of(device)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::Inactive)
        .map(|b| b.size)
        .max()
        .unwrap_or(0)
}

impl DeviceReport {
    /// Summarises a replayed, attributed device.
    pub fn new(snap: &Snapshot, r: &Replay, a: &Attribution, options: &Options) -> DeviceReport {
        let peak = r.peaks.allocated;
        let live = breakdown::live_at(snap, r, a, peak.event);
        let mut keyer = Keyer::new(snap, a);
        let mut peak_breakdown = BTreeMap::new();
        for d in Dimension::ALL {
            if d == Dimension::Site {
                continue;
            }
            let mut shares = breakdown::group(&mut keyer, d, &live);
            reconcile(
                &mut shares,
                peak.bytes,
                d,
                &keyer_preexisting_label(&mut keyer, a, d),
            );
            peak_breakdown.insert(d.as_str(), shares);
        }
        let top_sites: Vec<Share> = breakdown::group(&mut keyer, Dimension::Site, &live)
            .into_iter()
            .take(options.top.max(1) * 3)
            .collect();
        let place = Self::peak_place(snap, r, a);
        let reserved_at_peak = r.reserved_at(peak.event);
        DeviceReport {
            device: r.device,
            events: r.len(),
            duration_us: r.time_span_us.1 - r.time_span_us.0,
            stacks: stack_kind(snap, r.device),
            trace_complete: r.history.complete,
            frees_without_alloc: r.history.frees_without_alloc,
            trace_wrapped: r.history.wrapped,
            replay_consistent: r.check.consistent,
            size_model: r.model,
            start_allocated_bytes: r.start.allocated,
            start_requested_bytes: r.start.requested,
            start_reserved_bytes: r.start.reserved,
            peak_allocated_bytes: peak.bytes,
            peak_requested_bytes: r.peaks.requested.bytes,
            peak_active_bytes: r.peaks.active.bytes,
            peak_reserved_bytes: r.peaks.reserved.bytes,
            peak_event_index: peak.event,
            peak_time_offset_us: peak.time_offset_us,
            reserved_at_peak_bytes: reserved_at_peak,
            end_allocated_bytes: r.end.allocated,
            end_requested_bytes: r.end.requested,
            end_reserved_bytes: r.end.reserved,
            fragmentation_at_peak_bytes: reserved_at_peak.saturating_sub(peak.bytes),
            fragmentation_at_end_bytes: r.end.reserved.saturating_sub(r.end.allocated),
            largest_free_block_bytes: largest_free_block(snap, r.device),
            ooms: r.ooms.clone(),
            check: r.check.clone(),
            attribution: AttributionSummary {
                preset: a.preset,
                pipeline: a.pipeline.clone(),
            },
            peak: place,
            peak_breakdown,
            top_sites,
            steps: breakdown::step_table(snap, r, a),
            show: options.by.clone(),
            top: options.top,
        }
    }
}

impl DeviceReport {
    /// Where the allocated peak was reached: the labels of the allocation that reached it (the
    /// event itself, or the newest allocation before it when the peak event is a free).
    pub fn peak_place(snap: &Snapshot, r: &Replay, a: &Attribution) -> PeakPlace {
        let Some(i) = r.peaks.allocated.event else {
            return PeakPlace {
                step: "before the trace".into(),
                ..PeakPlace::default()
            };
        };
        let events = snap.trace(r.device);
        let owner = (0..=i)
            .rev()
            .find(|&k| events[k].action == crate::snapshot::Action::Alloc)
            .unwrap_or(i);
        let l = &a.labels[owner];
        PeakPlace {
            step: a.step_text(l, a.multi_step()),
            op: a.op_text(l),
            stage: a.names.get(l.stage).to_string(),
            category: l.category.as_str().to_string(),
            layer: (l.layer != u16::MAX).then_some(l.layer),
            site: attribute::frames::site(snap, events[owner].stack, 4),
            detail: a.names.get(l.detail).to_string(),
        }
    }
}

fn keyer_preexisting_label(keyer: &mut Keyer, a: &Attribution, d: Dimension) -> String {
    let l = attribute::Label {
        category: attribute::Category::PreExisting,
        call: u32::MAX,
        mb: attribute::NO_MB,
        mb_backward: attribute::NO_MB,
        ..Default::default()
    };
    let _ = a;
    keyer.key(d, &l, crate::snapshot::StackId::EMPTY)
}

/// Makes a breakdown add up to `total`: with rounded sizes the series is anchored at the
/// snapshot's end, and the difference belongs to the memory that was there before the trace.
fn reconcile(shares: &mut Vec<Share>, total: u64, _d: Dimension, pre_label: &str) {
    let sum: u64 = shares.iter().map(|s| s.bytes).sum();
    if sum == total {
        return;
    }
    let diff = total as i128 - sum as i128;
    match shares.iter_mut().find(|s| s.label == pre_label) {
        Some(s) => s.bytes = (s.bytes as i128 + diff).max(0) as u64,
        None if diff > 0 => shares.push(Share {
            label: pre_label.to_string(),
            bytes: diff as u64,
            count: 0,
        }),
        None => {}
    }
    shares.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
}

impl FileReport {
    /// Replays, attributes and summarises every device of a snapshot.
    pub fn new(file: &str, snap: &Snapshot, options: &Options) -> FileReport {
        Self::with_each_device(file, snap, options, |_, _| {})
    }

    /// [`FileReport::new`], handing each device's replay and attribution to `also` (to draw
    /// it, say) so they are computed once.
    pub fn with_each_device(
        file: &str,
        snap: &Snapshot,
        options: &Options,
        mut also: impl FnMut(&Replay, &Attribution),
    ) -> FileReport {
        let mut devices: Vec<u32> = snap.devices_with_events().collect();
        if devices.is_empty() {
            devices = snap.devices();
        }
        let devices = devices
            .into_iter()
            .map(|d| {
                let r = replay::replay(snap, d, options.model);
                let a = attribute::attribute(snap, &r, &options.attribution);
                also(&r, &a);
                DeviceReport::new(snap, &r, &a, options)
            })
            .collect();
        FileReport {
            file: file.to_string(),
            source: snap.source.clone(),
            devices,
        }
    }
}

//! Report: what `memsnap report` says about a snapshot, computed once as plain data.
//!
//! [`FileReport`] and [`DeviceReport`] hold every figure the report shows; [`text`] renders
//! them as aligned tables for people and [`json`] as one JSON object per file for machines.
//! Nothing here reads the terminal or formats numbers outside [`crate::units`].

pub mod compare;
pub mod json;
pub mod oom;
pub mod text;
pub mod whatif;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::analysis::{DeviceAnalysis, Dimension, PeakPlace, Share, StepRow};
use crate::attribute::{PipelineInfo, Preset};
use crate::replay::{EndCheck, Oom, SizeModel};
use crate::snapshot::{BlockState, Snapshot, SourceInfo};

/// Allocation sites kept in a report (the text shows fewer).
pub const TOP_SITES: usize = 50;

/// How the trace was labelled.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct AttributionSummary {
    /// The preset used.
    pub preset: Preset,
    /// Pipeline details (pithtrain preset).
    pub pipeline: Option<PipelineInfo>,
    /// Where the phases of events outside a pipeline came from (counts of events).
    pub phase_sources: crate::attribute::generic::PhaseSources,
}

/// Which stacks the recording kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct DeviceReport {
    /// Device ordinal (a pipeline rank records on its own GPU: rank 1 is device 1).
    pub device: u32,
    /// Trace events recorded.
    pub events: usize,
    /// Time from the first to the last event, in microseconds.
    pub duration_us: i64,
    /// Events recorded earlier than the event before them (a clock going backwards); the
    /// duration then counts from the earliest to the latest time.
    pub events_out_of_time_order: u64,
    /// Trace entries whose action memsnap does not know (passed over).
    pub unknown_actions: u64,
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
    /// The first failure explained (as `memsnap oom` does, without a cap or device total).
    pub oom_explanation: Option<oom::OomExplanation>,
    /// Details of the end-of-replay check.
    pub check: EndCheck,
    /// How events were labelled.
    pub attribution: AttributionSummary,
    /// Where the allocated peak happened.
    pub peak: PeakPlace,
    /// Bytes live at the peak, per dimension (`category`, `step`, `op`, `stage`, `phase`,
    /// `annotation`), largest first.
    pub peak_breakdown: BTreeMap<String, Vec<Share>>,
    /// Allocation sites live at the peak, largest first.
    pub top_sites: Vec<Share>,
    /// One row per pipeline step (or phase) in time order.
    pub steps: Vec<StepRow>,
}

/// Everything the report says about one file.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct FileReport {
    /// The file as given on the command line.
    pub file: String,
    /// Encoding details.
    pub source: SourceInfo,
    /// The allocator settings the snapshot recorded, as a `PYTORCH_CUDA_ALLOC_CONF` string
    /// (`defaults` when none was set); `null` for snapshots before torch 2.3.
    pub allocator_settings: Option<String>,
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

/// Microseconds from the earliest to the latest recorded time (0 without times); never
/// negative, even when the clock went backwards.
fn time_span(snap: &Snapshot, device: u32) -> i64 {
    let times = snap
        .trace(device)
        .iter()
        .map(|e| e.time_us)
        .filter(|&t| t != 0);
    let (lo, hi) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    if lo > hi {
        0
    } else {
        hi.saturating_sub(lo)
    }
}

/// Events whose time is earlier than that of the event before them.
fn out_of_order(snap: &Snapshot, device: u32) -> u64 {
    let mut last = i64::MIN;
    let mut n = 0;
    for e in snap.trace(device).iter().filter(|e| e.time_us != 0) {
        if e.time_us < last {
            n += 1;
        }
        last = e.time_us;
    }
    n
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
    /// Summarises an analysed device.
    pub fn new(a: &DeviceAnalysis) -> DeviceReport {
        let (snap, r) = (a.snap, &a.replay);
        let peak = r.peaks.allocated;
        let peak_breakdown = a
            .peak_breakdown
            .iter()
            .filter(|(d, _)| *d != Dimension::Site)
            .map(|(d, shares)| (d.as_str().to_string(), shares.clone()))
            .collect();
        let top_sites = a
            .peak_shares(Dimension::Site)
            .iter()
            .take(TOP_SITES)
            .cloned()
            .collect();
        let reserved_at_peak = r.reserved_at(peak.event);
        DeviceReport {
            device: r.device,
            events: r.len(),
            duration_us: time_span(snap, r.device),
            events_out_of_time_order: out_of_order(snap, r.device),
            unknown_actions: snap
                .trace(r.device)
                .iter()
                .filter(|e| e.action == crate::snapshot::Action::Unknown)
                .count() as u64,
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
            oom_explanation: oom::explain(a, &Default::default()),
            check: r.check.clone(),
            attribution: AttributionSummary {
                preset: a.attribution.preset,
                pipeline: a.attribution.pipeline.clone(),
                phase_sources: a.attribution.phase_sources,
            },
            peak: a.peak_place.clone(),
            peak_breakdown,
            top_sites,
            steps: a.steps.clone(),
        }
    }
}

impl FileReport {
    /// The report of a file from the analyses of its devices.
    pub fn new(file: &str, snap: &Snapshot, devices: &[DeviceAnalysis]) -> FileReport {
        FileReport {
            file: file.to_string(),
            source: snap.source.clone(),
            allocator_settings: snap
                .settings
                .as_ref()
                .map(|s| crate::simulate::AllocConf::from_settings(s).to_string()),
            devices: devices.iter().map(DeviceReport::new).collect(),
        }
    }
}

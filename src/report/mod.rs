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
use crate::snapshot::{BlockState, Snapshot, SourceInfo, StackId};

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
    /// What decided the categories of allocations (counts of allocations, by the kind of
    /// evidence; the bytes at the peak are in `peak_breakdown.evidence`).
    #[serde(default)]
    pub category_sources: crate::attribute::category::CategorySources,
    /// What the program's own list of its tensors (`memsnap.Capture`'s `.tensors.json`)
    /// gave, when one lay beside the file.
    #[serde(default)]
    pub capture: Option<crate::attribute::CaptureInfo>,
    /// The program's own number of each training step (index: the rows' `train_step`), when
    /// that list gave them; empty otherwise.
    #[serde(default)]
    pub step_numbers: Vec<i64>,
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
    /// Trace entries whose time no clock gave (negative, or past the year 2255), read as
    /// entries without a time.
    #[serde(default)]
    pub impossible_times: u64,
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
    /// Reserved bytes per memory pool (default, CUDA graphs, `MemPool`s) at the allocated
    /// peak and at the end; empty when only the default pool was used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<crate::analysis::pools::PoolReserved>,
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
    /// The device's memory at named points of the program (`memsnap.Capture` probes, from
    /// `<snapshot>.probes.json`), with what was outside PyTorch at each; absent without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<crate::snapshot::probes::Probe>,
}

/// What the report reads off a device's events, in one pass over them.
struct TraceFacts {
    /// Microseconds from the earliest to the latest recorded time (0 without times); never
    /// negative, even when the clock went backwards.
    span_us: i64,
    /// Events whose time is earlier than that of the event before them (events without a
    /// time left out).
    out_of_order: u64,
    unknown_actions: u64,
    stacks: StackKind,
}

impl TraceFacts {
    fn of(snap: &Snapshot, device: u32) -> TraceFacts {
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        let mut last = i64::MIN;
        let (mut out_of_order, mut unknown_actions) = (0, 0);
        // each stack's frames are looked at once, however many events carry it
        let mut used = vec![false; snap.stacks.stack_count()];
        for e in snap.trace(device) {
            if e.time_us != 0 {
                lo = lo.min(e.time_us);
                hi = hi.max(e.time_us);
                out_of_order += u64::from(e.time_us < last);
                last = e.time_us;
            }
            unknown_actions += u64::from(e.action == crate::snapshot::Action::Unknown);
            if let Some(u) = used.get_mut(e.stack.0 as usize) {
                *u = true;
            }
        }
        let (mut python, mut cpp) = (false, false);
        let used_stacks = used.iter().enumerate().filter(|(_, &u)| u);
        for (id, _) in used_stacks {
            for frame in snap.stacks.frames(StackId(id as u32)) {
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
        TraceFacts {
            span_us: if lo > hi { 0 } else { hi.saturating_sub(lo) },
            out_of_order,
            unknown_actions,
            stacks: match (python, cpp) {
                (false, false) => StackKind::None,
                (true, false) => StackKind::Python,
                (true, true) => StackKind::PythonAndCpp,
                (false, true) => StackKind::Cpp,
            },
        }
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
        let facts = TraceFacts::of(snap, r.device);
        DeviceReport {
            device: r.device,
            events: r.len(),
            duration_us: facts.span_us,
            events_out_of_time_order: facts.out_of_order,
            unknown_actions: facts.unknown_actions,
            impossible_times: snap
                .impossible_times
                .get(r.device as usize)
                .copied()
                .unwrap_or(0),
            stacks: facts.stacks,
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
                category_sources: a.attribution.category_sources,
                capture: a.attribution.capture,
                step_numbers: a.attribution.step_numbers.clone(),
            },
            peak: a.peak_place.clone(),
            peak_breakdown,
            top_sites,
            steps: a.steps.clone(),
            pools: crate::analysis::pools::reserved_by_pool(snap, r),
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
            probes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Action, Frame, StrId, TraceEvent};

    fn event(action: Action, time_us: i64, stack: StackId) -> TraceEvent {
        TraceEvent {
            addr: 0x1000,
            size: 512,
            time_us,
            stream: crate::snapshot::StreamId(0),
            stack,
            extra: 0,
            pool: crate::snapshot::PoolId::UNKNOWN,
            action,
        }
    }

    /// The span, the clock going back, unknown actions and the kinds of stack, from one pass:
    /// only the stacks that the device's events carry count, each however often it is used.
    #[test]
    fn trace_facts_count_what_the_events_carry() {
        let mut snap = Snapshot::default();
        let python = snap.stacks.intern_frame(Frame {
            name: StrId(1),
            filename: StrId(2),
            line: 7,
        });
        let cpp = snap.stacks.intern_frame(Frame {
            name: StrId(1),
            filename: StrId(0),
            line: 0,
        });
        let python_only = snap.stacks.intern_stack(&[python]);
        let cpp_only = snap.stacks.intern_stack(&[cpp]);
        snap.traces = vec![
            vec![
                event(Action::Alloc, 100, python_only),
                event(Action::Unknown, 0, python_only),
                event(Action::FreeRequested, 90, python_only),
                event(Action::FreeCompleted, 130, StackId(u32::MAX)),
            ],
            vec![event(Action::Alloc, 5, cpp_only)],
            vec![event(Action::Alloc, 0, StackId::EMPTY)],
        ];
        let facts = TraceFacts::of(&snap, 0);
        assert_eq!(
            facts.span_us, 40,
            "from the earliest time to the latest, 0 left out"
        );
        assert_eq!(facts.out_of_order, 1);
        assert_eq!(facts.unknown_actions, 1);
        // device 1's C++ stack is not device 0's
        assert_eq!(facts.stacks, StackKind::Python);
        assert_eq!(TraceFacts::of(&snap, 1).stacks, StackKind::Cpp);
        assert_eq!(TraceFacts::of(&snap, 2).stacks, StackKind::None);
        assert_eq!(TraceFacts::of(&snap, 2).span_us, 0, "no times, no span");
        snap.traces[0].push(event(Action::Alloc, 140, cpp_only));
        assert_eq!(TraceFacts::of(&snap, 0).stacks, StackKind::PythonAndCpp);
    }
}

//! Simulate: the program's requests replayed through a model of the caching allocator under
//! any settings, to answer "would it fit?" and "why did it run out of memory?".
//!
//! [`replay`](crate::replay) follows what the recorded allocator did, event by event.
//! This stage keeps only what the *program* asked for ([`Program`]: allocations, frees,
//! `empty_cache()`, the request that failed) and lets a [`model`] of PyTorch's allocator decide
//! the rest again: which cached block serves a request, when a segment is created, released or
//! mapped, and whether the request fails. Under the settings the snapshot was recorded with,
//! the simulation must reproduce the recorded run; [`self_check`] measures how closely it does.
//!
//! [`scale`] builds the program at another problem size (batch, sequence length,
//! micro-batches) from snapshots at other sizes, for the same model to run.
//!
//! Two starts are possible. Under settings that lay blocks out as the recorded ones did, the
//! simulation starts from the segments and blocks the replay rebuilt for trace start. Under
//! others (expandable segments on or off, another `max_split_size` or rounding) that layout
//! would not have existed, so the blocks alive before the trace are allocated afresh, in
//! address order, before the first event.

pub mod conf;
pub mod model;
pub mod program;
pub mod scale;

use serde::Serialize;

pub use conf::{parse_size, AllocConf, ConfError};
pub use program::{Op, Program, SegmentEvent};

use crate::replay::Replay;
use crate::snapshot::{Action, Snapshot};
use model::Model;

/// Address space of an expandable segment when the device's memory is not known: 9/8 of an
/// H200's 140 GiB.
const DEFAULT_VIRTUAL_BYTES: u64 = 9 * (140 << 30) / 8;

/// What to simulate.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The allocator settings.
    pub conf: AllocConf,
    /// The per-process memory cap in bytes (`set_per_process_memory_fraction`), if any.
    pub cap: Option<u64>,
    /// The device's total memory, when known (sizes expandable segments' address space).
    pub device_total: Option<u64>,
    /// Reuse the recorded run's segment addresses while the simulation makes the same
    /// segments (for the self-check); otherwise new segments get invented addresses.
    pub recorded_addresses: bool,
}

/// An allocation that failed in the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SimOom {
    /// The trace event of the request (`null` in JSON never: before the trace is event 0).
    pub event: usize,
    /// The request, rounded as the allocator rounds it.
    pub requested_bytes: u64,
    /// The segment it needed: PyTorch's "Tried to allocate".
    pub alloc_size_bytes: u64,
    /// Allocated bytes when it failed.
    pub allocated_bytes: u64,
    /// Reserved bytes when it failed (after releasing the cache).
    pub reserved_bytes: u64,
    /// The largest cached free block then.
    pub largest_free_block_bytes: u64,
    /// Whether this is the request that failed in the recorded run.
    pub recorded_failure: bool,
}

/// The result of one simulation.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Outcome {
    /// Settings simulated, as a `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: String,
    /// The cap, if any.
    pub cap_bytes: Option<u64>,
    /// Highest allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Highest reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Reserved minus allocated when allocated peaked.
    pub fragmentation_at_peak_bytes: u64,
    /// The first failure; `None` when every request was served.
    pub oom: Option<SimOom>,
    /// Whether the simulation started from the recorded layout (else the blocks alive
    /// before the trace were allocated again).
    pub from_recorded_layout: bool,
    /// Allocations retried after releasing the whole cache.
    pub alloc_retries: u64,
    /// Segment events, in order.
    #[serde(skip)]
    pub segments: Vec<SegmentEvent>,
    /// Reserved bytes after each trace event (up to the failure).
    #[serde(skip)]
    pub reserved_after: Vec<u64>,
}

impl Outcome {
    /// Whether every request was served (the recorded failing one included).
    pub fn fits(&self) -> bool {
        self.oom.is_none()
    }
}

/// Runs the program through the allocator model.
pub fn simulate(
    snap: &Snapshot,
    replay: &Replay,
    program: &Program,
    recorded: &AllocConf,
    options: &Options,
) -> Outcome {
    let virtual_bytes = options
        .device_total
        .map_or(DEFAULT_VIRTUAL_BYTES, |t| t + t / 8);
    let lowest = snap
        .segments_of(replay.device)
        .map(|s| s.address)
        .chain(replay.start_layout.iter().map(|s| s.address))
        .chain(
            snap.trace(replay.device)
                .iter()
                .filter(|e| e.action == Action::SegmentAlloc)
                .map(|e| e.addr),
        )
        .min()
        .unwrap_or(1 << 47);
    let addresses = options.recorded_addresses.then(|| {
        snap.trace(replay.device)
            .iter()
            .filter(|e| e.action == Action::SegmentAlloc)
            .map(|e| (e.size, e.addr))
            .collect()
    });
    let mut m = Model::new(&options.conf, options.cap, virtual_bytes, lowest, addresses);
    for (k, id) in program.pools.iter().enumerate().skip(1) {
        m.add_pool(k as u16, id.is_graph());
    }
    let from_recorded = options.conf.same_layout(recorded);
    let mut out = Outcome {
        alloc_conf: options.conf.to_string(),
        cap_bytes: options.cap,
        peak_allocated_bytes: 0,
        peak_reserved_bytes: 0,
        fragmentation_at_peak_bytes: 0,
        oom: None,
        from_recorded_layout: from_recorded,
        alloc_retries: 0,
        segments: Vec::new(),
        reserved_after: Vec::with_capacity(program.events),
    };
    if from_recorded {
        m.load(
            &replay.start_layout,
            &program.start_streams,
            program.events as u32,
        );
    } else {
        for b in &program.before {
            if let Err(f) = m.malloc_in(b.req, b.size, b.stream, b.pool) {
                out.oom = Some(failure(&m, 0, f, false));
                break;
            }
        }
    }
    note_peak(&m, &mut out);
    if out.oom.is_none() {
        run_ops(&mut m, program, &mut out);
    }
    out.alloc_retries = m.retries;
    out.segments = std::mem::take(&mut m.log);
    out
}

fn failure(m: &Model, event: usize, f: model::Failure, recorded: bool) -> SimOom {
    SimOom {
        event,
        requested_bytes: f.rounded,
        alloc_size_bytes: f.alloc_size,
        allocated_bytes: m.allocated,
        reserved_bytes: m.reserved,
        largest_free_block_bytes: m.largest_free_block(),
        recorded_failure: recorded,
    }
}

fn note_peak(m: &Model, out: &mut Outcome) {
    if m.allocated > out.peak_allocated_bytes {
        out.peak_allocated_bytes = m.allocated;
        out.fragmentation_at_peak_bytes = m.reserved.saturating_sub(m.allocated);
    }
    out.peak_reserved_bytes = out.peak_reserved_bytes.max(m.reserved);
}

fn run_ops(m: &mut Model, program: &Program, out: &mut Outcome) {
    let mut next_event = 0;
    for &(event, op) in &program.ops {
        while next_event < event {
            out.reserved_after.push(m.reserved);
            next_event += 1;
        }
        m.event = event;
        let result = match op {
            Op::Alloc {
                req,
                size,
                stream,
                pool,
            } => m
                .malloc_in(req, size, stream, pool)
                .err()
                .map(|f| (f, false)),
            Op::Fail { size, stream, pool } => m
                .malloc_in(u32::MAX, size, stream, pool)
                .err()
                .map(|f| (f, true)),
            Op::ReleasePool { pool, now } => {
                m.release_pool(pool, now);
                None
            }
            Op::Free { req, now } => {
                m.free(req, now);
                None
            }
            Op::Complete { req } => {
                m.complete(req);
                None
            }
            Op::EmptyCache => {
                m.release_cached();
                None
            }
        };
        note_peak(m, out);
        if let Some((f, recorded)) = result {
            out.oom = Some(failure(m, event, f, recorded));
            return;
        }
    }
    while next_event < program.events {
        out.reserved_after.push(m.reserved);
        next_event += 1;
    }
}

/// How closely the simulation under the recorded settings reproduces the recorded run.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct SelfCheck {
    /// Simulation equal to the recorded run in every figure compared.
    pub exact: bool,
    /// Recorded segment events (`segment_alloc`, `segment_free`, `segment_map`,
    /// `segment_unmap`).
    pub segment_events: usize,
    /// Of those, how many the simulation made alike (same action and size, in the same order).
    pub segment_events_equal: usize,
    /// Segment events the simulation made.
    pub simulated_segment_events: usize,
    /// Peak reserved of the recorded run.
    pub recorded_peak_reserved_bytes: u64,
    /// Peak reserved of the simulation.
    pub simulated_peak_reserved_bytes: u64,
    /// Trace events after which reserved bytes differ.
    pub reserved_mismatches: usize,
    /// The largest difference of reserved bytes after an event.
    pub max_reserved_diff_bytes: u64,
    /// The recorded failure's event, if any.
    pub recorded_oom_event: Option<usize>,
    /// The simulated failure's event, if any.
    pub simulated_oom_event: Option<usize>,
    /// The cap simulated: given, or inferred from the recorded failure.
    pub cap_bytes: Option<u64>,
    /// Whether the cap was inferred from the recorded failure.
    pub cap_inferred: bool,
    /// Why the comparison may not hold (private pools).
    pub note: Option<String>,
}

/// The largest cap consistent with the recorded run: wherever the recorded allocator released
/// its cache to retry an allocation, the cap (or the device) had refused that allocation's
/// segment, so the cap is below the reserved bytes then plus the segment. At a failure, the
/// device's free memory bounds it too. `None` when the run was never refused memory.
///
/// The run reserved its peak, so no cap below it can be right: a bound under the peak reserved
/// bytes comes from cache released for another reason (`garbage_collection_threshold`
/// reclaiming blocks before a request, `empty_cache()`) and is not evidence of a refusal.
pub fn inferred_cap(replay: &Replay, program: &Program, recorded: &AllocConf) -> Option<u64> {
    let rules = recorded.size_rules();
    let reserved_before = |i: usize| replay.reserved_at(i.checked_sub(1));
    let floor = replay.peaks.reserved.bytes;
    let mut bound: Option<u64> = None;
    let mut tighten = |b: u64| {
        if b >= floor {
            bound = Some(bound.map_or(b, |x: u64| x.min(b)));
        }
    };
    for &(at, size, rounded) in &program.refusals {
        let rounded = if rounded { size } else { rules.round(size) };
        tighten(reserved_before(at) + model::allocation_size(rounded) - 1);
    }
    for oom in &replay.ooms {
        let alloc_size = model::allocation_size(oom.requested);
        tighten(oom.reserved + oom.device_free.min(alloc_size.saturating_sub(1)));
    }
    bound
}

/// Simulates the recorded settings and compares with the recorded run.
pub fn self_check(
    snap: &Snapshot,
    replay: &Replay,
    program: &Program,
    recorded: &AllocConf,
    cap: Option<u64>,
    device_total: Option<u64>,
) -> (SelfCheck, Outcome) {
    let (cap, cap_inferred) = match cap {
        Some(c) => (Some(c), false),
        None => match inferred_cap(replay, program, recorded) {
            Some(c) => (Some(c), true),
            None => (None, false),
        },
    };
    let options = Options {
        conf: recorded.clone(),
        cap,
        device_total,
        recorded_addresses: true,
    };
    let sim = simulate(snap, replay, program, recorded, &options);
    let rec = &program.recorded_segments;
    let equal = rec
        .iter()
        .zip(&sim.segments)
        .filter(|(a, b)| a.action == b.action && a.size == b.size)
        .count();
    let mut reserved = replay.start.reserved;
    let mut changes = replay.reserved_changes.iter().peekable();
    let (mut mismatches, mut max_diff) = (0usize, 0u64);
    let events = snap.trace(replay.device);
    for (i, &simulated) in sim.reserved_after.iter().enumerate() {
        while let Some(&&(at, bytes)) = changes.peek() {
            if at as usize > i {
                break;
            }
            reserved = bytes;
            changes.next();
        }
        // The recorded run changes reserved bytes at its segment events, one at a time; the
        // simulation at the request that caused them. Compare between requests only.
        let segment_event = matches!(
            events[i].action,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        );
        if !segment_event && simulated != reserved {
            mismatches += 1;
            max_diff = max_diff.max(simulated.abs_diff(reserved));
        }
    }
    let recorded_oom = replay.ooms.first().map(|o| o.event);
    let simulated_oom = sim.oom.map(|o| o.event);
    let check = SelfCheck {
        exact: equal == rec.len()
            && sim.segments.len() == rec.len()
            && mismatches == 0
            && recorded_oom == simulated_oom
            && sim.peak_reserved_bytes == replay.peaks.reserved.bytes,
        segment_events: rec.len(),
        segment_events_equal: equal,
        simulated_segment_events: sim.segments.len(),
        recorded_peak_reserved_bytes: replay.peaks.reserved.bytes,
        simulated_peak_reserved_bytes: sim.peak_reserved_bytes,
        reserved_mismatches: mismatches,
        max_reserved_diff_bytes: max_diff,
        recorded_oom_event: recorded_oom,
        simulated_oom_event: simulated_oom,
        cap_bytes: cap,
        cap_inferred,
        note: program.private_pools.then(|| {
            "private pools (CUDA graphs, MemPool) were in use; their requests carry no pool id in the trace, so they are simulated in the default pools".to_string()
        }),
    };
    (check, sim)
}

/// The smallest cap (to 2 MiB) under which the recorded work fits, found by bisection;
/// `None` when it does not fit even without a cap.
pub fn min_cap(
    snap: &Snapshot,
    replay: &Replay,
    program: &Program,
    recorded: &AllocConf,
    options: &Options,
) -> Option<u64> {
    const STEP: u64 = 2 << 20;
    let run = |cap: Option<u64>| {
        let o = Options {
            cap,
            ..options.clone()
        };
        simulate(snap, replay, program, recorded, &o)
    };
    let free = run(None);
    if !free.fits() {
        return None;
    }
    // both ends multiples of STEP, `lo` below `hi` whatever the figures (a hostile trace can
    // claim more allocated than reserved)
    let mut hi = free.peak_reserved_bytes.div_ceil(STEP).saturating_mul(STEP);
    let mut lo = (free.peak_allocated_bytes / STEP * STEP)
        .saturating_sub(STEP)
        .min(hi.saturating_sub(STEP));
    if !run(Some(hi)).fits() {
        // Releasing under a cap can need more than the free run reserved: widen.
        let mut widen = hi;
        loop {
            widen = widen.saturating_mul(2).max(STEP);
            if run(Some(widen)).fits() {
                lo = hi;
                hi = widen;
                break;
            }
            if widen > free.peak_reserved_bytes.saturating_mul(8) || widen == u64::MAX {
                return None;
            }
        }
    }
    while hi - lo > STEP {
        let mid = (lo + (hi - lo) / 2) / STEP * STEP;
        let mid = mid.clamp(lo + STEP, hi - STEP);
        if run(Some(mid)).fits() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

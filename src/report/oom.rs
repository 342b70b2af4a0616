//! What `memsnap oom` (and `memsnap report`, for a trace that holds a failure) says about an
//! out-of-memory error: the failed request and the memory at that moment, in the figures of
//! PyTorch's own message, what was live, why it failed, and what would have fit.

use std::collections::BTreeMap;

use serde::Serialize;

use super::whatif::{judged, recorded_conf, CapKnown, Scenario};
use crate::analysis::{breakdown, DeviceAnalysis, Dimension, Share};
use crate::simulate::{self, model::allocation_size, AllocConf, Options, Program};

/// Why the allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The cache held enough free bytes, but in pieces too small for the request.
    Fragmentation,
    /// The device itself had too little memory left.
    Capacity,
    /// The device had room; the per-process cap refused it.
    Cap,
}

impl Verdict {
    /// The verdict's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fragmentation => "fragmentation",
            Verdict::Capacity => "capacity",
            Verdict::Cap => "cap",
        }
    }
}

/// Options of the explanation.
#[derive(Clone, Debug, Default)]
pub struct OomOptions {
    /// The cap the run had, when known (else inferred from the failure).
    pub cap: Option<u64>,
    /// The device's total memory, when known.
    pub device_total: Option<u64>,
    /// The settings the snapshot was recorded with, when it does not say.
    pub recorded_conf: Option<AllocConf>,
}

/// A failed request the program went on after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SurvivedOom {
    /// The `oom` trace event.
    pub event: usize,
    /// The request, rounded as the allocator rounds it.
    pub requested_bytes: u64,
}

/// One failure explained: the last of the trace, the one that raised.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct OomExplanation {
    /// The `oom` trace event.
    pub event: usize,
    /// Earlier failures of the trace, which the program survived (caught by a library or by
    /// the program), in order.
    #[serde(default)]
    pub survived: Vec<SurvivedOom>,
    /// The request, rounded as the allocator rounds it.
    pub requested_bytes: u64,
    /// The segment the allocator tried to get: PyTorch's "Tried to allocate".
    pub alloc_size_bytes: u64,
    /// "is allocated by PyTorch".
    pub allocated_bytes: u64,
    /// Reserved bytes at the failure.
    pub reserved_bytes: u64,
    /// "is reserved by PyTorch but unallocated".
    pub reserved_unallocated_bytes: u64,
    /// Free device memory the driver reported.
    pub device_free_bytes: u64,
    /// The cap: given, written by `memsnap.Capture`, or (`cap_inferred`) the most the run can
    /// have had.
    pub cap_bytes: Option<u64>,
    /// Whether `cap_bytes` was inferred.
    pub cap_inferred: bool,
    /// What is known of the cap: where it came from and, when only bounded, the range the
    /// trace allows (the what-ifs are judged over all of it).
    pub cap: CapKnown,
    /// The device's total memory, when given.
    pub device_total_bytes: Option<u64>,
    /// Memory in use on the device outside PyTorch's cache (total − free − reserved), when
    /// the total is known.
    pub non_pytorch_bytes: Option<u64>,
    /// The largest cached free block at the failure.
    pub largest_free_block_bytes: u64,
    /// Why it failed.
    pub verdict: Verdict,
    /// The verdict in a sentence.
    pub explanation: String,
    /// How many more bytes the allocator needed than it could get; `null` when that depends
    /// on a cap the snapshot does not record.
    pub short_by_bytes: Option<u64>,
    /// Bytes live at the failure by category, step, op and stage, largest first.
    pub live: BTreeMap<String, Vec<Share>>,
    /// Allocation sites live at the failure, largest first.
    pub top_sites: Vec<Share>,
    /// Simulations under other settings, with the same cap.
    pub whatif: Vec<Scenario>,
    /// The smallest cap under which the recorded work fits with the recorded settings.
    pub min_cap_bytes: Option<u64>,
}

/// The figures and what-ifs for one device's failure; `None` when its trace has none.
pub fn explain(a: &DeviceAnalysis, options: &OomOptions) -> Option<OomExplanation> {
    let (snap, replay) = (a.snap, &a.replay);
    // The failure that raised is the last: earlier ones were caught and survived (cuDNN
    // trying a smaller workspace, a program that retries with a smaller batch).
    let oom = *replay.ooms.last()?;
    let survived: Vec<SurvivedOom> = replay.ooms[..replay.ooms.len() - 1]
        .iter()
        .map(|o| SurvivedOom {
            event: o.event,
            requested_bytes: o.requested,
        })
        .collect();
    let program = Program::new(snap, replay);
    let (recorded, _) = recorded_conf(a, options.recorded_conf.as_ref());
    // the cap given, else the one the program wrote beside the snapshot
    let captured = snap.capture.as_ref().and_then(|c| c.allowed_bytes);
    let (check, sim) = simulate::self_check(
        snap,
        replay,
        &program,
        &recorded,
        options.cap.or(captured),
        options.device_total,
    );
    let cap = check.cap_bytes;
    let known = CapKnown::of(a, options.cap, cap.filter(|_| check.cap_inferred));
    let alloc_size = allocation_size(oom.requested);
    let unallocated = oom.reserved.saturating_sub(oom.allocated);
    let largest = sim
        .oom
        .filter(|o| o.recorded_failure)
        .map_or(0, |o| o.largest_free_block_bytes);
    let device_room = oom.device_free >= alloc_size;
    let (verdict, short_by, explanation) = if oom.requested <= unallocated {
        (
            Verdict::Fragmentation,
            Some(oom.requested.saturating_sub(largest)),
            format!(
                "fragmentation: {} of the cache was free, more than the {} requested, but no free block was large enough (the largest was {})",
                crate::units::bytes(unallocated),
                crate::units::bytes(oom.requested),
                crate::units::bytes(largest)
            ),
        )
    } else if device_room {
        let given = known.bytes;
        let limit = match (given, known.range) {
            (Some(c), _) if known.from == super::whatif::CapFrom::Capture => format!(
                " of {} (set_per_process_memory_fraction, as the program read it)",
                crate::units::bytes(c)
            ),
            (Some(c), _) => format!(" of {}", crate::units::bytes(c)),
            (None, Some([lo, hi])) => format!(
                " (set_per_process_memory_fraction; between {} and {} by what the trace shows)",
                crate::units::bytes(lo),
                crate::units::bytes(hi)
            ),
            (None, None) => String::new(),
        };
        (
            Verdict::Cap,
            given.map(|c| (oom.reserved + alloc_size).saturating_sub(c)),
            format!(
                "cap: the device had {} free, but the per-process limit{limit} refused a {} segment",
                crate::units::bytes(oom.device_free),
                crate::units::bytes(alloc_size)
            ),
        )
    } else {
        let short = alloc_size - oom.device_free;
        (
            Verdict::Capacity,
            Some(short),
            format!(
                "capacity: the device had only {} free for a {} segment, after PyTorch released its cache",
                crate::units::bytes(oom.device_free),
                crate::units::bytes(alloc_size)
            ),
        )
    };
    let live = breakdown::live_at(snap, replay, &a.attribution, Some(oom.event));
    let mut keyer = a.keyer();
    let mut by = BTreeMap::new();
    for d in [
        Dimension::Category,
        Dimension::Step,
        Dimension::Op,
        Dimension::Stage,
    ] {
        by.insert(
            d.as_str().to_string(),
            breakdown::group(&mut keyer, d, &live),
        );
    }
    let mut top_sites = breakdown::group(&mut keyer, Dimension::Site, &live);
    top_sites.truncate(super::TOP_SITES);
    let base = Options {
        conf: recorded.clone(),
        cap,
        device_total: options.device_total,
        recorded_addresses: false,
    };
    let whatif = alternatives(&recorded)
        .into_iter()
        .map(|conf| {
            let o = Options {
                conf,
                ..base.clone()
            };
            let (outcome, verdict, verdict_cap_bytes) =
                judged(snap, replay, &program, &recorded, &o, &known);
            Scenario {
                outcome,
                min_cap_bytes: None,
                verdict,
                verdict_cap_bytes,
            }
        })
        .collect();
    let min_cap_bytes = simulate::min_cap(snap, replay, &program, &recorded, &base);
    Some(OomExplanation {
        event: oom.event,
        survived,
        requested_bytes: oom.requested,
        alloc_size_bytes: alloc_size,
        allocated_bytes: oom.allocated,
        reserved_bytes: oom.reserved,
        reserved_unallocated_bytes: unallocated,
        device_free_bytes: oom.device_free,
        cap_bytes: cap,
        cap_inferred: check.cap_inferred,
        cap: known,
        device_total_bytes: options.device_total,
        non_pytorch_bytes: options.device_total.map(|t| {
            t.saturating_sub(oom.device_free)
                .saturating_sub(oom.reserved)
        }),
        largest_free_block_bytes: largest,
        verdict,
        explanation,
        short_by_bytes: short_by,
        live: by,
        top_sites,
        whatif,
        min_cap_bytes,
    })
}

/// The settings worth trying against a failure: expandable segments on (or off), and a few
/// `max_split_size_mb` values, each on top of the recorded settings.
fn alternatives(recorded: &AllocConf) -> Vec<AllocConf> {
    let base = AllocConf {
        text: String::new(),
        ..recorded.clone()
    };
    let mut out = vec![AllocConf {
        expandable_segments: !recorded.expandable_segments,
        ..base.clone()
    }];
    for mb in [64u64, 256, 1024] {
        let size = mb << 20;
        if recorded.max_split_size != Some(size) {
            out.push(AllocConf {
                max_split_size: Some(size),
                ..base.clone()
            });
        }
    }
    out
}

/// `memsnap oom` for one file.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct OomReport {
    /// The file as given.
    pub file: String,
    /// Devices with trace events; `oom` is `null` where the trace holds no failure.
    pub devices: Vec<DeviceOom>,
}

/// One device's failure, if any.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct DeviceOom {
    /// Device ordinal.
    pub device: u32,
    /// The explanation.
    pub oom: Option<OomExplanation>,
}

//! What `memsnap whatif` says: for each device, the recorded run's figures, how closely the
//! simulation reproduces it, and the simulated figures under each setting tried.

use serde::Serialize;

use crate::analysis::DeviceAnalysis;
use crate::simulate::{self, AllocConf, Options, Outcome, Program, SelfCheck};

/// What to try.
#[derive(Clone, Debug, Default)]
pub struct WhatIfOptions {
    /// Settings to simulate, in order; empty: the recorded settings.
    pub confs: Vec<AllocConf>,
    /// The cap for every simulation.
    pub cap: Option<u64>,
    /// The device's total memory, when known.
    pub device_total: Option<u64>,
    /// The settings the snapshot was recorded with, when it does not say.
    pub recorded_conf: Option<AllocConf>,
    /// Also find the smallest cap that fits, for each setting.
    pub min_cap: bool,
}

/// The recorded run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Recorded {
    /// The recorded settings as a `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: String,
    /// Where they came from: `snapshot` (`allocator_settings`), `trace` (inferred), `given`.
    pub settings_from: &'static str,
    /// Highest allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Highest reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Reserved minus allocated when allocated peaked.
    pub fragmentation_at_peak_bytes: u64,
    /// The recorded failure.
    pub oom: Option<RecordedOom>,
}

/// A failure in the recorded run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RecordedOom {
    /// The `oom` trace event.
    pub event: usize,
    /// The request, rounded.
    pub requested_bytes: u64,
    /// Allocated bytes then.
    pub allocated_bytes: u64,
    /// Reserved bytes then (after the allocator released its cache).
    pub reserved_bytes: u64,
}

/// One setting simulated.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Scenario {
    /// The simulation's figures.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The smallest cap under which the recorded work fits (with `--min-cap`); `None` also
    /// when it never fits.
    pub min_cap_bytes: Option<u64>,
}

/// One device's answers.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceWhatIf {
    /// Device ordinal.
    pub device: u32,
    /// Trace events.
    pub events: usize,
    /// The recorded run.
    pub recorded: Recorded,
    /// The simulation under the recorded settings against the recorded run.
    pub self_check: SelfCheck,
    /// Each setting tried, in order.
    pub simulated: Vec<Scenario>,
}

/// The recorded settings of a device's snapshot, and where they came from.
pub fn recorded_conf(a: &DeviceAnalysis, given: Option<&AllocConf>) -> (AllocConf, &'static str) {
    match (given, &a.snap.settings) {
        (Some(c), _) => (c.clone(), "given"),
        (None, Some(_)) => (AllocConf::recorded(a.snap), "snapshot"),
        (None, None) => (AllocConf::recorded(a.snap), "trace"),
    }
}

impl DeviceWhatIf {
    /// Simulates one analysed device under each setting of `options`.
    pub fn new(a: &DeviceAnalysis, options: &WhatIfOptions) -> DeviceWhatIf {
        let (snap, replay) = (a.snap, &a.replay);
        let program = Program::new(snap, replay);
        let (recorded_conf, settings_from) = recorded_conf(a, options.recorded_conf.as_ref());
        let (self_check, _) = simulate::self_check(
            snap,
            replay,
            &program,
            &recorded_conf,
            None,
            options.device_total,
        );
        let confs = if options.confs.is_empty() {
            vec![recorded_conf.clone()]
        } else {
            options.confs.clone()
        };
        let simulated = confs
            .into_iter()
            .map(|conf| {
                let o = Options {
                    conf,
                    cap: options.cap,
                    device_total: options.device_total,
                    recorded_addresses: false,
                };
                let outcome = simulate::simulate(snap, replay, &program, &recorded_conf, &o);
                let min_cap_bytes = options
                    .min_cap
                    .then(|| simulate::min_cap(snap, replay, &program, &recorded_conf, &o))
                    .flatten();
                Scenario {
                    outcome,
                    min_cap_bytes,
                }
            })
            .collect();
        let peak = replay.peaks.allocated;
        let reserved_at_peak = replay.reserved_at(peak.event);
        DeviceWhatIf {
            device: replay.device,
            events: replay.len(),
            recorded: Recorded {
                alloc_conf: recorded_conf.to_string(),
                settings_from,
                peak_allocated_bytes: peak.bytes,
                peak_reserved_bytes: replay.peaks.reserved.bytes,
                fragmentation_at_peak_bytes: reserved_at_peak.saturating_sub(peak.bytes),
                oom: replay.ooms.last().map(|o| RecordedOom {
                    event: o.event,
                    requested_bytes: o.requested,
                    allocated_bytes: o.allocated,
                    reserved_bytes: o.reserved,
                }),
            },
            self_check,
            simulated,
        }
    }
}

/// `memsnap whatif` for one file.
#[derive(Clone, Debug, Serialize)]
pub struct WhatIfReport {
    /// The file as given.
    pub file: String,
    /// Devices with trace events.
    pub devices: Vec<DeviceWhatIf>,
}

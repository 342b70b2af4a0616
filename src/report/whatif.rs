//! What `memsnap whatif` says: for each device, the recorded run's figures, how closely the
//! simulation reproduces it, and the simulated figures under each setting tried.

use serde::Serialize;

use crate::analysis::DeviceAnalysis;
use crate::simulate::scale::{self, FitGroup, Method, Repeat, Sample, ScaleError, Scaled};
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
    /// Whether the work fits under the run's cap, as far as the cap is known: `fits`,
    /// `fails`, or `fits_if_cap_at_least` (`verdict_cap_bytes`) where the trace only bounds
    /// the cap and the answer depends on where in that range it was.
    #[serde(default = "Verdict::unjudged")]
    pub verdict: Verdict,
    /// The least cap it fits under, for `fits_if_cap_at_least`.
    #[serde(default)]
    pub verdict_cap_bytes: Option<u64>,
}

/// Whether a setting fits, as far as the run's cap is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// It fits under the cap (known), or under every cap the trace allows.
    Fits,
    /// It fails under the cap (known), or under every cap the trace allows.
    Fails,
    /// It fits only if the cap was at least `verdict_cap_bytes`, which the trace cannot say.
    FitsIfCapAtLeast,
}

impl Verdict {
    fn unjudged() -> Verdict {
        Verdict::Fits
    }
}

/// Where a run's cap is known from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapFrom {
    /// `--cap`.
    Given,
    /// The program's `.tensors.json` (`memsnap.Capture`), the allocator's own figure.
    Capture,
    /// Only bounded by what the trace shows (`range`).
    Trace,
    /// Nothing says there was one.
    None,
}

/// What is known of the per-process cap a run had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CapKnown {
    /// The cap, when known: given, or written by `memsnap.Capture` as the allocator's own.
    pub bytes: Option<u64>,
    /// Where it is known from.
    pub from: CapFrom,
    /// Where the trace puts an unknown cap: at least the peak the run reserved, at most what
    /// its refusals allow.
    pub range: Option<[u64; 2]>,
}

impl CapKnown {
    /// The cap of `a`'s run: `given` if set, else the capture's, else bounded by the trace
    /// (`inferred`, the most the recorded refusals allow).
    pub fn of(a: &DeviceAnalysis, given: Option<u64>, inferred: Option<u64>) -> CapKnown {
        let captured = a.snap.capture.as_ref().and_then(|c| c.allowed_bytes);
        match (given, captured, inferred) {
            (Some(c), _, _) => CapKnown {
                bytes: Some(c),
                from: CapFrom::Given,
                range: None,
            },
            (None, Some(c), _) => CapKnown {
                bytes: Some(c),
                from: CapFrom::Capture,
                range: None,
            },
            (None, None, Some(hi)) => CapKnown {
                bytes: None,
                from: CapFrom::Trace,
                range: Some([a.replay.peaks.reserved.bytes.min(hi), hi]),
            },
            (None, None, None) => CapKnown {
                bytes: None,
                from: CapFrom::None,
                range: None,
            },
        }
    }

    /// The cap a simulation runs under: the known one, or the most the trace allows.
    pub fn simulated(&self) -> Option<u64> {
        self.bytes.or(self.range.map(|r| r[1]))
    }
}

/// Simulates `conf` and judges it against what is known of the cap: a verdict that holds over
/// the whole range the trace allows, or the least cap it needs within that range.
pub(crate) fn judged(
    snap: &crate::snapshot::Snapshot,
    replay: &crate::replay::Replay,
    program: &Program,
    recorded: &AllocConf,
    o: &Options,
    cap: &CapKnown,
) -> (Outcome, Verdict, Option<u64>) {
    let outcome = simulate::simulate(snap, replay, program, recorded, o);
    let Some([lo, _]) = cap.range.filter(|_| cap.bytes.is_none()) else {
        let verdict = if outcome.fits() {
            Verdict::Fits
        } else {
            Verdict::Fails
        };
        return (outcome, verdict, None);
    };
    // `outcome` ran under the most the trace allows
    if !outcome.fits() {
        return (outcome, Verdict::Fails, None);
    }
    let least = Options {
        cap: Some(lo),
        ..o.clone()
    };
    let tight = simulate::simulate(snap, replay, program, recorded, &least);
    if tight.fits() {
        // its figures under the least cap the trace allows, where it fits too
        return (tight, Verdict::Fits, None);
    }
    let needs = simulate::min_cap(snap, replay, program, recorded, o);
    (outcome, Verdict::FitsIfCapAtLeast, needs)
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
    /// What is known of the run's cap, which every setting is judged against.
    pub cap: CapKnown,
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
        let inferred = self_check.cap_bytes.filter(|_| self_check.cap_inferred);
        let cap = CapKnown::of(a, options.cap, inferred);
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
                    cap: cap.simulated(),
                    device_total: options.device_total,
                    recorded_addresses: false,
                };
                let (outcome, verdict, verdict_cap_bytes) =
                    judged(snap, replay, &program, &recorded_conf, &o, &cap);
                let min_cap_bytes = options
                    .min_cap
                    .then(|| simulate::min_cap(snap, replay, &program, &recorded_conf, &o))
                    .flatten();
                Scenario {
                    outcome,
                    min_cap_bytes,
                    verdict,
                    verdict_cap_bytes,
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
            cap,
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

/// One snapshot given to `memsnap whatif --scale`, with its recorded figures.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleInput {
    /// The file as given.
    pub file: String,
    /// The size parameter's value in that run.
    pub size: u64,
    /// The device read.
    pub device: u32,
    /// Trace events.
    pub events: usize,
    /// Highest allocated bytes of the recorded run.
    pub peak_allocated_bytes: u64,
    /// Highest reserved bytes of the recorded run.
    pub peak_reserved_bytes: u64,
    /// Whether the recorded run failed to allocate.
    pub oom: bool,
}

/// The prediction at one size.
#[derive(Clone, Debug, Serialize)]
pub struct SizePrediction {
    /// The size asked for.
    pub size: u64,
    /// The snapshot the requests were taken from (the nearest size; the largest when the stream
    /// grows).
    pub base_file: String,
    /// Its size.
    pub base_size: u64,
    /// Predicted peak allocated bytes (recorded settings, no cap) minus the base's recorded peak,
    /// per unit of size; `None` at the base's own size.
    pub growth_per_unit_bytes: Option<f64>,
    /// The requests by how their size was fitted, with their bytes alive at the base's peak.
    pub fits: Vec<FitGroup>,
    /// How the stream was extended, when it grows with the size.
    pub repeat: Option<Repeat>,
    /// Each setting simulated, in order (as `whatif`'s `simulated`).
    pub simulated: Vec<Scenario>,
}

/// The largest snapshot predicted from the others, compared with what it recorded.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleCheck {
    /// The size held out.
    pub size: u64,
    /// The sizes it was predicted from.
    pub from_sizes: Vec<u64>,
    /// Predicted peak allocated bytes.
    pub predicted_peak_allocated_bytes: u64,
    /// Recorded peak allocated bytes.
    pub recorded_peak_allocated_bytes: u64,
    /// Predicted peak reserved bytes.
    pub predicted_peak_reserved_bytes: u64,
    /// Recorded peak reserved bytes.
    pub recorded_peak_reserved_bytes: u64,
}

/// `memsnap whatif --scale`: a program predicted at other sizes.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    /// How sizes were predicted: `fit` (across snapshots) or `categories` (one snapshot).
    pub method: Method,
    /// The snapshots, smallest size first.
    pub inputs: Vec<ScaleInput>,
    /// The settings the largest snapshot was recorded with.
    pub recorded_alloc_conf: String,
    /// What the prediction assumed, in words.
    pub assumptions: Vec<String>,
    /// One prediction per size asked for.
    pub sizes: Vec<SizePrediction>,
    /// With three or more snapshots: the largest predicted from the others.
    pub check: Option<ScaleCheck>,
}

/// One snapshot for [`ScaleReport::new`]: its file, size and analysed device.
pub struct ScaleSample<'a, 's> {
    /// The file as given.
    pub file: String,
    /// The size parameter's value.
    pub size: u64,
    /// The analysed device.
    pub analysis: &'a DeviceAnalysis<'s>,
}

impl ScaleReport {
    /// Predicts the program of `samples` at each size of `targets`, simulated under the
    /// settings of `options` (the recorded ones when it names none).
    pub fn new(
        samples: &[ScaleSample],
        targets: &[u64],
        options: &WhatIfOptions,
    ) -> Result<ScaleReport, ScaleError> {
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by_key(|&i| samples[i].size);
        let all: Vec<Sample> = (0..samples.len()).map(|i| sample(samples, i)).collect();
        let largest = samples[*order.last().expect("one sample")].analysis;
        let (recorded, _) = recorded_conf(largest, options.recorded_conf.as_ref());
        let confs = if options.confs.is_empty() {
            vec![recorded.clone()]
        } else {
            options.confs.clone()
        };
        // each size predicted, simulated and let go before the next is built
        let mut sizes = Vec::new();
        let mut repeated = false;
        let method = scale::scale(&all, targets, |s| {
            repeated |= s.repeat.is_some();
            sizes.push(predict_size(samples, options, &confs, &recorded, s));
            Ok(())
        })?;
        let check = (method == Method::Fit && samples.len() >= 3)
            .then(|| hold_out_the_largest(samples, &order, options))
            .flatten();
        Ok(ScaleReport {
            method,
            inputs: inputs(samples, &order),
            recorded_alloc_conf: recorded.to_string(),
            assumptions: assumptions(samples, &order, method, repeated),
            sizes,
            check,
        })
    }
}

/// Sample `i` as the scaling reads it.
fn sample<'a, 's>(samples: &[ScaleSample<'a, 's>], i: usize) -> Sample<'a, 's> {
    Sample {
        size: samples[i].size,
        analysis: samples[i].analysis,
    }
}

/// The program `s` predicts, simulated under `conf` and `cap` from its base sample's recording:
/// the outcome, the options simulated and the base's recorded settings.
fn run_scaled(
    samples: &[ScaleSample],
    options: &WhatIfOptions,
    s: &Scaled,
    conf: &AllocConf,
    cap: Option<u64>,
) -> (Outcome, Options, AllocConf) {
    let a = samples[s.base].analysis;
    let (base_conf, _) = recorded_conf(a, options.recorded_conf.as_ref());
    let o = Options {
        conf: conf.clone(),
        cap,
        device_total: options.device_total,
        recorded_addresses: false,
    };
    let outcome = simulate::simulate(a.snap, &a.replay, &s.program, &base_conf, &o);
    (outcome, o, base_conf)
}

/// One predicted size: each of `confs` simulated (with its smallest cap when asked), and the
/// growth per unit of size from the base sample under the recorded settings.
fn predict_size(
    samples: &[ScaleSample],
    options: &WhatIfOptions,
    confs: &[AllocConf],
    recorded: &AllocConf,
    s: Scaled,
) -> SizePrediction {
    let base = &samples[s.base];
    let simulated: Vec<Scenario> = confs
        .iter()
        .map(|conf| {
            let (mut outcome, o, base_conf) = run_scaled(samples, options, &s, conf, options.cap);
            // the per-event series are as long as the predicted stream and nothing here draws
            // them: each size holds only its figures
            outcome.reserved_after = Vec::new();
            outcome.segments = Vec::new();
            let min_cap_bytes = options
                .min_cap
                .then(|| {
                    let a = base.analysis;
                    simulate::min_cap(a.snap, &a.replay, &s.program, &base_conf, &o)
                })
                .flatten();
            let verdict = if outcome.fits() {
                Verdict::Fits
            } else {
                Verdict::Fails
            };
            Scenario {
                outcome,
                min_cap_bytes,
                verdict,
                verdict_cap_bytes: None,
            }
        })
        .collect();
    let growth_per_unit_bytes = (s.size != base.size).then(|| {
        // the recorded settings without a cap: a row already simulated, or run now
        let uncapped = simulated
            .iter()
            .map(|x| &x.outcome)
            .find(|o| o.cap_bytes.is_none() && o.alloc_conf == recorded.to_string())
            .map(|o| o.peak_allocated_bytes);
        let free = uncapped.unwrap_or_else(|| {
            run_scaled(samples, options, &s, recorded, None)
                .0
                .peak_allocated_bytes
        });
        let recorded_peak = base.analysis.replay.peaks.allocated.bytes;
        (free as f64 - recorded_peak as f64) / (s.size as f64 - base.size as f64)
    });
    SizePrediction {
        size: s.size,
        base_file: base.file.clone(),
        base_size: base.size,
        growth_per_unit_bytes,
        fits: s.groups,
        repeat: s.repeat,
        simulated,
    }
}

/// The largest sample predicted from the others and set beside what it recorded.
fn hold_out_the_largest(
    samples: &[ScaleSample],
    order: &[usize],
    options: &WhatIfOptions,
) -> Option<ScaleCheck> {
    let held = *order.last().expect("one sample");
    let rest: Vec<Sample> = order[..order.len() - 1]
        .iter()
        .map(|&i| sample(samples, i))
        .collect();
    let mut out = None;
    scale::scale(&rest, &[samples[held].size], |mut s| {
        s.base = order[s.base]; // an index into `rest`, which is `order` less the last
        let (base_conf, _) =
            recorded_conf(samples[s.base].analysis, options.recorded_conf.as_ref());
        out = Some(run_scaled(samples, options, &s, &base_conf, None).0);
        Ok(())
    })
    .ok()?;
    let out = out?;
    let h = &samples[held].analysis.replay.peaks;
    Some(ScaleCheck {
        size: samples[held].size,
        from_sizes: rest.iter().map(|r| r.size).collect(),
        predicted_peak_allocated_bytes: out.peak_allocated_bytes,
        recorded_peak_allocated_bytes: h.allocated.bytes,
        predicted_peak_reserved_bytes: out.peak_reserved_bytes,
        recorded_peak_reserved_bytes: h.reserved.bytes,
    })
}

/// What the prediction assumes, in words: the method's, the repeated stream's, and a run cut
/// short by an out-of-memory error.
fn assumptions(
    samples: &[ScaleSample],
    order: &[usize],
    method: Method,
    repeated: bool,
) -> Vec<String> {
    let mut assumptions = Vec::new();
    match method {
        Method::Categories => assumptions.push(
            "one snapshot: activations, temporaries and inputs grow in proportion to the \
             size, everything else stays as recorded (the weaker estimate: give a second \
             snapshot at another size to fit each request)"
                .to_string(),
        ),
        Method::Schedule => assumptions.push(
            "one DualPipeV rank, the size its number of micro-batches: each micro-batch more \
             is one more iteration of the main loop (step 4), repeated from the snapshot; \
             the batch's inputs grow in proportion, everything else is as recorded"
                .to_string(),
        ),
        Method::Fit => assumptions.push(
            "every snapshot is the same program with one size changed: requests are aligned \
             by call site and each is fitted by the simplest exact form"
                .to_string(),
        ),
    }
    if method == Method::Fit && repeated {
        assumptions.push(
            "the request stream grows with the size: the requests the largest snapshot has \
             and the next one lacks are repeated; sizes that differ without an exact form \
             are kept as the largest snapshot has them"
                .to_string(),
        );
    }
    if let Some(i) = order
        .iter()
        .find(|&&i| !samples[i].analysis.replay.ooms.is_empty())
    {
        assumptions.push(format!(
            "the run at size {} ended in an out-of-memory error: only what it asked for \
             before the failed request is predicted",
            samples[*i].size
        ));
    }
    assumptions
}

/// The snapshots, smallest size first.
fn inputs(samples: &[ScaleSample], order: &[usize]) -> Vec<ScaleInput> {
    order
        .iter()
        .map(|&i| {
            let s = &samples[i];
            let r = &s.analysis.replay;
            ScaleInput {
                file: s.file.clone(),
                size: s.size,
                device: r.device,
                events: r.len(),
                peak_allocated_bytes: r.peaks.allocated.bytes,
                peak_reserved_bytes: r.peaks.reserved.bytes,
                oom: !r.ooms.is_empty(),
            }
        })
        .collect()
}

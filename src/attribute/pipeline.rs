//! The pithtrain preset: DualPipeV pipeline steps, ops, phases, micro-batches, layer stages.
//!
//! 1. Every stack is read once: does it hold the `step` frame of `DualPipeV` (in a file named
//!    `dualpipev.py`)? At which line, calling which chunk function? Is it the main thread
//!    (its outermost Python frame is `<module>`)?
//! 2. Events are walked in time order. Consecutive events at the same call-site line of
//!    `step()` form a *call*; events of other threads (backward on the autograd thread) join
//!    the call running at the time; main-thread events outside `step()` end an invocation
//!    (the optimizer runs between training steps).
//! 3. Call-site lines map to steps through the `# Step N` comments of the source (when it can
//!    be read) or, without it, inferred from the order of call sites (module `infer`).
//! 4. Iteration counts of steps 2, 3 and 4 give the pipeline shape (ranks, rank,
//!    micro-batches); with it a step that repeats one call site (step 1's forwards, step 8's
//!    weight chunks) is cut into its calls where the stack below `step` starts over.
//! 5. The schedule then names each call's phase and micro-batch, counting per (op, phase).

use std::collections::{HashMap, VecDeque};

use regex::Regex;

use super::frames;
use super::infer;
use super::schedule::{self, CallKind, Shape};
use super::source::{self, SourceFiles};
use super::{
    Labels, Names, Phase, PipelineInfo, StepSource, NO_MB, STEP_AFTER, STEP_BEFORE, STEP_NONE,
};
use crate::replay::PreviewSoon;
use crate::snapshot::{Snapshot, StackId};

/// What one stack says about the pipeline.
#[derive(Clone, Copy, Debug, Default)]
struct StackFacts {
    /// Line of the `step` frame, its file, and the kind of function it calls.
    step: Option<(u32, crate::snapshot::StrId, CallKind)>,
    /// Name of the function `step` calls (empty when `step` allocates itself).
    callee: crate::snapshot::StrId,
    /// Outermost Python frame is a module: the main thread.
    main_thread: bool,
}

fn is_step_frame(snap: &Snapshot, f: &crate::snapshot::Frame) -> bool {
    f.line > 0 && snap.str(f.name) == "step" && {
        let file = snap.str(f.filename);
        file.ends_with("dualpipev.py") || file.ends_with("dualpipe.py")
    }
}

fn facts(snap: &Snapshot, stack: StackId) -> StackFacts {
    let mut out = StackFacts::default();
    let mut inner_python: Option<crate::snapshot::Frame> = None;
    for f in snap.stacks.frames(stack) {
        if !frames::is_python(&f) {
            continue;
        }
        if out.step.is_none() && is_step_frame(snap, &f) {
            let kind = inner_python.map_or(CallKind::Other, |c| CallKind::of(snap.str(c.name)));
            out.step = Some((f.line, f.filename, kind));
            out.callee = inner_python.map_or(crate::snapshot::StrId(0), |c| c.name);
        }
        if snap.str(f.name) == "<module>" {
            out.main_thread = true;
        }
        inner_python = Some(f);
    }
    out
}

#[derive(Clone, Debug)]
struct Call {
    site: u32,
    kind: CallKind,
    callee: crate::snapshot::StrId,
    invocation: u16,
    /// First event of the call.
    first: usize,
    step: u8,
}

/// The program's frames below `step` as `(function, line)`, outermost first.
fn below_step(snap: &Snapshot, stack: StackId) -> Vec<(crate::snapshot::StrId, u32)> {
    let mut out = Vec::new();
    for &id in snap.stacks.stack(stack) {
        let f = snap.stacks.frame(id);
        if is_step_frame(snap, &f) {
            break;
        }
        if frames::is_program_frame(snap, id) {
            out.push((f.name, f.line));
        }
    }
    out.reverse();
    out
}

/// Where consecutive main-thread events of one call site start over: `(event, depth)` pairs,
/// depth being the first frame below `step` that went back to an earlier line. Each distinct
/// stack is read once: a loop's events repeat a few stacks thousands of times.
fn restarts(
    snap: &Snapshot,
    events: &[crate::snapshot::TraceEvent],
    main: &[usize],
) -> Vec<(usize, usize)> {
    let mut index: frames::PerStack<usize> = frames::PerStack::new(snap);
    let mut lists: Vec<Vec<(crate::snapshot::StrId, u32)>> = Vec::new();
    let below: Vec<usize> = main
        .iter()
        .map(|&e| {
            let stack = events[e].stack;
            index.get(stack, || {
                lists.push(below_step(snap, stack));
                lists.len() - 1
            })
        })
        .collect();
    let mut out = Vec::new();
    for (w, b) in main.windows(2).zip(below.windows(2)) {
        if b[0] == b[1] {
            continue;
        }
        let (a, b) = (&lists[b[0]], &lists[b[1]]);
        for (d, (x, y)) in a.iter().zip(b).enumerate() {
            if x == y {
                continue;
            }
            if x.0 == y.0 && y.1 < x.1 {
                out.push((w[1], d));
            }
            break;
        }
    }
    out
}

/// How many restarts happen at each depth or above it: entry `d` counts those at depths
/// `0..=d`.
fn restart_profile(restarts: &[(usize, usize)]) -> Vec<u32> {
    let deepest = restarts.iter().map(|r| r.1).max();
    let mut out = vec![0u32; deepest.map_or(1, |d| d + 1)];
    for &(_, d) in restarts {
        out[d] += 1;
    }
    for d in 1..out.len() {
        out[d] += out[d - 1];
    }
    out
}

/// Stage regions of one function: `(n, first line, last line, name)`.
type StageRegions = Vec<(u32, u32, u32, String)>;

/// Layer-stage names and regions, from the source of `layer_forward` when it can be read.
struct Stages {
    marker: Regex,
    /// (file, function) -> its regions.
    regions: HashMap<(crate::snapshot::StrId, crate::snapshot::StrId), StageRegions>,
}

impl Stages {
    fn new() -> Stages {
        Stages {
            marker: Regex::new(r"^\s*#\s*Stage\s+(\d+)\.?\s*(.*)$").expect("valid"),
            regions: HashMap::new(),
        }
    }

    fn region(
        &mut self,
        snap: &Snapshot,
        sources: &mut SourceFiles,
        f: &crate::snapshot::Frame,
        callee: Option<&str>,
    ) -> Option<(u32, String)> {
        // A source of another version would name the wrong stage: the line must call what
        // the trace says it called.
        if let Some(callee) = callee {
            let line = sources
                .lines(snap.str(f.filename))?
                .get(f.line as usize - 1)?
                .clone();
            if !line.contains(callee) {
                return None;
            }
        }
        let key = (f.filename, f.name);
        if !self.regions.contains_key(&key) {
            let mut found = Vec::new();
            if let Some(lines) = sources.lines(snap.str(f.filename)) {
                for (n, a, b) in
                    source::marker_regions(lines, snap.str(f.name), f.line, &self.marker)
                {
                    let text = lines
                        .get(a as usize - 1)
                        .and_then(|l| self.marker.captures(l))
                        .and_then(|c| c.get(2))
                        .map(|m| m.as_str().trim().to_string())
                        .unwrap_or_default();
                    found.push((n, a, b, text));
                }
            }
            self.regions.insert(key, found);
        }
        self.regions[&key]
            .iter()
            .find(|r| r.1 <= f.line && f.line <= r.2)
            .map(|r| (r.0, r.3.clone()))
    }
}

/// Built-in stage names, by the function `layer_forward` calls.
fn stage_of_callee(name: &str) -> Option<(u32, &'static str)> {
    let n = match name {
        "forward_stage1" | "forward_stage1_compute" | "prepare_dispatch" => 1,
        "dispatch_a2a" => 2,
        "forward_stage3" => 3,
        "combine_a2a" => 4,
        "forward_stage5" => 5,
        _ => return None,
    };
    Some((n, stage_name(n)?))
}

/// The names of the five layer stages. The same names are used whether the stage number came
/// from the source's `# Stage N.` comments or from the function called, so that a report
/// reads the same with and without `--source-root`.
fn stage_name(n: u32) -> Option<&'static str> {
    Some(match n {
        1 => "attention + gate",
        2 => "dispatch all-to-all",
        3 => "experts",
        4 => "combine all-to-all",
        5 => "combine + residual",
        _ => return None,
    })
}

/// The model place of a stack: layer stage, prolog, epilog or loss; `(text, is stage 1)`.
fn stage_of_stack(
    snap: &Snapshot,
    stack: StackId,
    sources: &mut SourceFiles,
    stages: &mut Stages,
) -> Option<(String, bool)> {
    // Program frames, outermost first.
    let user: Vec<crate::snapshot::Frame> = {
        let mut v: Vec<_> = frames::user_frames(snap, stack).collect();
        v.reverse();
        v
    };
    let all: Vec<crate::snapshot::Frame> = snap.stacks.frames(stack).collect();
    let names: Vec<&str> = user.iter().map(|f| snap.str(f.name)).collect();
    if names.contains(&"forward_prolog") {
        return Some(("embedding (prolog)".into(), false));
    }
    if names.contains(&"forward_epilog") {
        return Some(("norm + lm_head (epilog)".into(), false));
    }
    let loss_frame = names
        .iter()
        .any(|n| matches!(*n, "objective" | "criterion" | "loss_fn"))
        || all.iter().any(|f| {
            let n = snap.str(f.name);
            f.line > 0 && matches!(n, "cross_entropy" | "nll_loss")
        });
    if loss_frame {
        return Some(("loss".into(), false));
    }
    if names
        .iter()
        .any(|n| matches!(*n, "_recv_forward" | "_recv_backward" | "append_irecv"))
    {
        return Some(("p2p receive buffer".into(), false));
    }
    if names
        .iter()
        .any(|n| matches!(*n, "_weight_chunk" | "grad_weight_fn"))
    {
        return Some(("weight gradients".into(), false));
    }
    let lf = user
        .iter()
        .position(|f| snap.str(f.name) == "layer_forward")?;
    let frame = user[lf];
    let callee = user.get(lf + 1).map(|f| snap.str(f.name));
    let (n, mut text) = match stages.region(snap, sources, &frame, callee) {
        Some((n, text)) if !text.is_empty() => (n, stage_name(n).map_or(text, str::to_string)),
        _ => {
            let (n, text) = callee.and_then(stage_of_callee)?;
            (n, text.to_string())
        }
    };
    if n == 3 {
        // Inside the experts: name the projection from the source line or the function.
        if let Some(inner) = user[lf + 1..]
            .iter()
            .rev()
            .find(|f| snap.str(f.name) != "forward" || f.line > 0)
        {
            let fname = snap.str(inner.name);
            if fname == "silu_mul" {
                text = format!("{text}: silu_mul");
            } else if let Some(line) = user[lf + 1..]
                .iter()
                .rfind(|f| snap.str(f.name) == "forward")
                .and_then(|f| {
                    sources
                        .lines(snap.str(f.filename))
                        .and_then(|l| l.get(f.line as usize - 1).cloned())
                })
            {
                let re = Regex::new(r"\b(\w+_proj)\b").expect("valid");
                if let Some(c) = re.captures(&line) {
                    text = format!("{text}: {}", &c[1]);
                }
            }
        }
    }
    Some((format!("stage {n}: {text}"), n == 1))
}

/// Labels a device's events with the pithtrain preset. Returns `None` when the trace holds no
/// DualPipeV call at all.
pub(crate) fn label(
    snap: &Snapshot,
    preview: &PreviewSoon,
    sources: &mut SourceFiles,
    names: &mut Names,
    labels: &mut Labels,
) -> Option<PipelineInfo> {
    let events = snap.trace(preview.device());
    let mut facts = frames::PerStack::new(snap);
    // 1. the calls made by `step()`'s call sites, and its invocations
    let mut scan = scan_calls(snap, events, &mut facts)?;
    let path = snap.str(scan.file).to_string();
    // 2. the `# Step N` regions of `step()`, from the source or inferred
    let found = step_regions(snap, preview, sources, &scan, &path, &mut facts)?;
    for c in &mut scan.calls {
        c.step = step_of_line(&found.regions, c.site);
    }
    // 3. the pipeline's shape and the counts of the steps that ran to their end; calls
    // repeating one site split into their iterations
    let has_oom = preview.get().has_oom;
    let shape = found
        .shape
        .or_else(|| (!has_oom).then(|| shape_from_calls(&scan.calls)).flatten());
    let last_step = scan
        .calls
        .iter()
        .map(|c| c.step)
        .filter(|s| (1..=8).contains(s))
        .max()
        .unwrap_or(0);
    // An out-of-memory error ended the trace inside `step()`: its last step did not finish.
    let cut_in = (has_oom && last_step > 0 && !scan.calls.iter().any(|c| c.step == STEP_AFTER))
        .then_some(last_step);
    let mut iterations = [None; 8];
    for (k, slot) in iterations.iter_mut().enumerate() {
        let step = k as u8 + 1;
        if cut_in.is_some_and(|c| step >= c) {
            continue;
        }
        *slot = found.counts[k].or(shape.map(|s| s.iterations()[k]));
    }
    // Cut short before step 4 ended, a trace shows only some of step 4's iterations.
    let chunks_known = !has_oom || last_step > 4;
    if !chunks_known {
        iterations[3] = None;
    }
    split_iterations(snap, events, &mut scan, &iterations, cut_in);
    // 4. each call's op, phase and micro-batches
    let call_labels = label_calls(&scan.calls, shape.as_ref(), names);
    // 5. each event's labels
    label_events(
        snap,
        events,
        &scan,
        &call_labels,
        sources,
        names,
        labels,
        &mut facts,
    );
    Some(PipelineInfo {
        note: found.note,
        steps_from: found.steps_from,
        shape,
        chunks_known,
        iterations,
        cut_in,
        regions: found
            .regions
            .iter()
            .filter(|r| (1..=8).contains(&r.0))
            .copied()
            .collect(),
        file: path,
    })
}

/// The facts of a stack, computed once per distinct stack.
#[inline]
fn fact(cache: &mut frames::PerStack<StackFacts>, snap: &Snapshot, s: StackId) -> StackFacts {
    cache.get(s, || facts(snap, s))
}

/// The calls made by `DualPipeV.step`'s call sites, in order.
struct CallScan {
    calls: Vec<Call>,
    /// For each event, the call it ran in (`u32::MAX`: none).
    call_of: Vec<u32>,
    /// For each call, its events on the main thread.
    main_of_call: Vec<Vec<usize>>,
    /// For each event, the invocation of `step()` (training step) it belongs to.
    train_step: Vec<u16>,
    /// The file defining `step()`.
    file: crate::snapshot::StrId,
    /// The line of the first call site seen, inside `step()`.
    anchor: u32,
}

fn scan_calls(
    snap: &Snapshot,
    events: &[crate::snapshot::TraceEvent],
    cache: &mut frames::PerStack<StackFacts>,
) -> Option<CallScan> {
    let mut calls: Vec<Call> = Vec::new();
    let mut call_of = vec![u32::MAX; events.len()];
    let mut main_of_call: Vec<Vec<usize>> = Vec::new();
    let mut invocation: u16 = 0;
    let mut outside = false;
    let mut file = None;
    let mut anchor = 0;
    let mut train_step = vec![0u16; events.len()];
    for (i, e) in events.iter().enumerate() {
        let f = fact(cache, snap, e.stack);
        match f.step {
            Some((line, path, kind)) => {
                if outside && !calls.is_empty() {
                    invocation += 1;
                }
                outside = false;
                file.get_or_insert(path);
                if anchor == 0 {
                    anchor = line;
                }
                let new = match calls.last() {
                    Some(c) => c.site != line || c.invocation != invocation,
                    None => true,
                };
                if new {
                    calls.push(Call {
                        site: line,
                        kind,
                        callee: f.callee,
                        invocation,
                        first: i,
                        step: STEP_NONE,
                    });
                    main_of_call.push(Vec::new());
                }
                let c = calls.len() - 1;
                call_of[i] = c as u32;
                main_of_call[c].push(i);
            }
            None if f.main_thread => {
                outside = true;
            }
            None => {
                if !outside && !calls.is_empty() {
                    call_of[i] = (calls.len() - 1) as u32;
                }
            }
        }
        train_step[i] = invocation;
    }
    Some(CallScan {
        calls,
        call_of,
        main_of_call,
        train_step,
        file: file?,
        anchor,
    })
}

/// Where the steps of `step()` are, and how that was found.
struct FoundRegions {
    /// `(step, first line, last line)`, including the regions before step 1 and after step 8.
    regions: Vec<(u8, u32, u32)>,
    steps_from: StepSource,
    /// The shape, when the schedule fits one.
    shape: Option<Shape>,
    /// Iterations of the steps that ran to their end ([`infer::Fit::counts`]).
    counts: [Option<u32>; 8],
    note: Option<String>,
}

/// Whether the source's lines call, at the recorded call sites, the functions the trace shows
/// (nine in ten at least).
fn source_matches_trace(snap: &Snapshot, calls: &[Call], lines: &[String]) -> bool {
    let mut sites: Vec<(u32, crate::snapshot::StrId)> =
        calls.iter().map(|c| (c.site, c.callee)).collect();
    sites.sort_unstable();
    sites.dedup();
    let named: Vec<_> = sites.iter().filter(|s| !snap.str(s.1).is_empty()).collect();
    let ok = named
        .iter()
        .filter(|(line, callee)| {
            lines
                .get(*line as usize - 1)
                .is_some_and(|t| t.contains(snap.str(*callee)))
        })
        .count();
    ok * 10 >= named.len() * 9
}

fn step_regions(
    snap: &Snapshot,
    preview: &PreviewSoon,
    sources: &mut SourceFiles,
    scan: &CallScan,
    path: &str,
    cache: &mut frames::PerStack<StackFacts>,
) -> Option<FoundRegions> {
    let step_marker = Regex::new(r"^\s*#\s*Step\s+(\d+)").expect("valid");
    let calls = &scan.calls;
    let source_ok = sources
        .lines(path)
        .map(|lines| source_matches_trace(snap, calls, lines));
    let note = (source_ok == Some(false)).then(|| {
        format!(
            "the source found for {path} does not match the trace (other line numbers); steps were inferred instead"
        )
    });
    let source_regions: Option<Vec<(u8, u32, u32)>> = sources
        .lines(path)
        .filter(|_| source_ok == Some(true))
        .map(|lines| {
            let r = source::marker_regions(lines, "step", scan.anchor, &step_marker);
            let mut out: Vec<(u8, u32, u32)> =
                r.iter().map(|&(n, a, b)| (n.min(8) as u8, a, b)).collect();
            if let (Some(first), Some(last)) = (r.first(), r.last()) {
                out.insert(0, (STEP_BEFORE, 1, first.1.saturating_sub(1)));
                out.push((STEP_AFTER, last.2 + 1, u32::MAX));
            }
            out
        });
    let first_rank = Some(
        frames::distinct_stacks(snap, preview.device())
            .into_iter()
            .any(|s| frames::user_frames(snap, s).any(|f| snap.str(f.name) == "forward_prolog")),
    )
    .filter(|&b| b);
    let first: Vec<(u32, CallKind)> = calls
        .iter()
        .filter(|c| c.invocation == 0)
        .map(|c| (c.site, c.kind))
        .collect();
    let events = snap.trace(preview.device());
    // a site called once in the first invocation may be a whole loop of one call: how its
    // stacks start over tells how many iterations it can be
    let mut visits: HashMap<u32, u32> = HashMap::new();
    for &(site, _) in &first {
        *visits.entry(site).or_default() += 1;
    }
    let profiles: Vec<Vec<u32>> = calls
        .iter()
        .enumerate()
        .filter(|(_, c)| c.invocation == 0)
        .map(|(k, c)| {
            if visits[&c.site] == 1 {
                restart_profile(&restarts(snap, events, &scan.main_of_call[k]))
            } else {
                Vec::new()
            }
        })
        .collect();
    let started_outside = calls
        .first()
        .is_some_and(|c| (0..c.first).any(|i| fact(cache, snap, events[i].stack).main_thread));
    let known = preview.get();
    let cut = infer::Cut {
        head: !known.history.complete && !started_outside,
        tail: known.has_oom,
    };
    if let Some(regions) = source_regions.filter(|r| r.len() > 2) {
        let (shape, counts) = infer::fit_known(&first, &profiles, first_rank, cut, |line| {
            step_of_line(&regions, line)
        })
        .unwrap_or((None, [None; 8]));
        return Some(FoundRegions {
            regions,
            steps_from: StepSource::Source {
                file: sources.resolved(path).unwrap_or(path).to_string(),
            },
            shape,
            counts,
            note,
        });
    }
    let fit = infer::infer(&first, &profiles, first_rank, cut)?;
    Some(FoundRegions {
        regions: fit.regions,
        steps_from: StepSource::Inferred,
        shape: fit.shape,
        counts: fit.counts,
        note,
    })
}

/// The step of a line: regions cover the function; between inferred regions a line belongs to
/// the region that starts at or before it.
fn step_of_line(regions: &[(u8, u32, u32)], line: u32) -> u8 {
    let mut best = STEP_BEFORE;
    for &(s, a, b) in regions {
        if a <= line && line <= b {
            return s;
        }
        if a <= line {
            best = s;
        }
    }
    best
}

/// Splits each call that stands for a whole loop of one site into the loop's iterations: as
/// many as `counts` gives its step, or, in the step a cut trace stopped in, as many as its
/// stacks show starting over at the outermost depth that does.
fn split_iterations(
    snap: &Snapshot,
    events: &[crate::snapshot::TraceEvent],
    scan: &mut CallScan,
    counts: &[Option<u32>; 8],
    cut_in: Option<u8>,
) {
    let calls = &mut scan.calls;
    let mut k = 0;
    while k < calls.len() {
        let step = calls[k].step;
        let inv = calls[k].invocation;
        let same_step = (k..calls.len())
            .take_while(|&j| calls[j].step == step && calls[j].invocation == inv)
            .count();
        let one_site = same_step == 1;
        if (1..=8).contains(&step) && one_site {
            let found = restarts(snap, events, &scan.main_of_call[k]);
            let want = match counts[step as usize - 1] {
                Some(c) => c as usize,
                None if cut_in == Some(step) && inv == 0 => {
                    let outermost = found.iter().map(|r| r.1).min();
                    1 + found.iter().filter(|r| Some(r.1) == outermost).count()
                }
                None => 0,
            };
            if want >= 2 {
                let cuts = choose_cuts(&found, &scan.main_of_call[k], want - 1);
                split_call(calls, &mut scan.call_of, &mut scan.main_of_call, k, &cuts);
                k += cuts.len() + 1;
                continue;
            }
        }
        k += same_step;
    }
}

/// What a call is: its op, micro-batches and phase.
#[derive(Clone, Copy, Debug)]
struct CallLabel {
    op: super::NameId,
    mb: u16,
    mb_backward: u16,
    phase: Phase,
}

/// Names each call's op and micro-batches from the schedule: the i-th call site of a step's
/// kind runs that step's i-th chunk phase, and each phase counts its own micro-batches.
fn label_calls(calls: &[Call], shape: Option<&Shape>, names: &mut Names) -> Vec<CallLabel> {
    let mut sites_by: HashMap<(u8, CallKind), Vec<u32>> = HashMap::new();
    for c in calls {
        let v = sites_by.entry((c.step, c.kind)).or_default();
        if !v.contains(&c.site) {
            v.push(c.site);
        }
    }
    for v in sites_by.values_mut() {
        v.sort_unstable();
    }
    let mut out = Vec::with_capacity(calls.len());
    let mut counters: HashMap<(u16, bool, u8), u16> = HashMap::new();
    let mut deferred: HashMap<u16, VecDeque<(u8, u16)>> = HashMap::new();
    let mut iteration: HashMap<(u16, u8, u32), u32> = HashMap::new();
    for c in calls {
        let sites = &sites_by[&(c.step, c.kind)];
        let i = sites.iter().position(|&s| s == c.site).unwrap_or(0);
        let (pf, pb) = schedule::phases(c.step, c.kind, i, sites.len());
        let it = {
            let n = iteration.entry((c.invocation, c.step, c.site)).or_insert(0);
            *n += 1;
            *n - 1
        };
        let mut next = |fwd: bool, phase: u8| {
            let n = counters.entry((c.invocation, fwd, phase)).or_insert(0);
            *n += 1;
            *n - 1
        };
        let (op, mb, mb_backward, phase) = match c.kind {
            CallKind::Forward => {
                let p = pf.unwrap_or(0);
                (format!("F{p}"), next(true, p), NO_MB, Phase::Forward)
            }
            CallKind::Backward => {
                let p = pb.unwrap_or(0);
                let mb = next(false, p);
                if shape.is_some_and(|shape| schedule::zero_bubble(c.step, p, it, shape)) {
                    deferred.entry(c.invocation).or_default().push_back((p, mb));
                }
                (format!("B{p}"), mb, NO_MB, Phase::Backward)
            }
            CallKind::ForwardBackward => {
                let (p0, p1) = (pf.unwrap_or(0), pb.unwrap_or(1));
                let f = next(true, p0);
                let b = next(false, p1);
                (format!("F{p0}&B{p1}"), f, b, Phase::Forward)
            }
            CallKind::Weight => match deferred.entry(c.invocation).or_default().pop_front() {
                Some((p, mb)) => (format!("W{p}"), mb, NO_MB, Phase::Backward),
                None => ("W".to_string(), NO_MB, NO_MB, Phase::Backward),
            },
            CallKind::Recv => {
                let p = pf.unwrap_or(0);
                let mb = counters.get(&(c.invocation, true, p)).copied().unwrap_or(0);
                ("recv".to_string(), mb, NO_MB, Phase::Communication)
            }
            CallKind::Send => ("send".to_string(), NO_MB, NO_MB, Phase::Communication),
            CallKind::Other => ("other".to_string(), NO_MB, NO_MB, Phase::Other),
        };
        out.push(CallLabel {
            op: names.intern(&op),
            mb,
            mb_backward,
            phase,
        });
    }
    out
}

/// Gives every event its call's step, op, micro-batches and phase, and its own stage, layer
/// and (on the autograd thread) autograd node.
#[allow(clippy::too_many_arguments)]
fn label_events(
    snap: &Snapshot,
    events: &[crate::snapshot::TraceEvent],
    scan: &CallScan,
    call_labels: &[CallLabel],
    sources: &mut SourceFiles,
    names: &mut Names,
    labels: &mut Labels,
    cache: &mut frames::PerStack<StackFacts>,
) {
    let mut stages = Stages::new();
    let mut stage_cache: frames::PerStack<Option<(super::NameId, bool)>> =
        frames::PerStack::new(snap);
    let mut node_cache: frames::PerStack<Option<super::NameId>> = frames::PerStack::new(snap);
    let autograd_thread = names.intern(super::AUTOGRAD_THREAD);
    let mut layer: Vec<(u16, bool)> = vec![(0, false); scan.calls.len()];
    for (i, e) in events.iter().enumerate() {
        labels.update(i, |l| {
            l.train_step = scan.train_step[i];
            let c = scan.call_of[i];
            if c == u32::MAX {
                return;
            }
            let call = &scan.calls[c as usize];
            let cl = call_labels[c as usize];
            l.call = c;
            l.pipe_step = call.step;
            l.op = cl.op;
            l.mb = cl.mb;
            l.mb_backward = cl.mb_backward;
            let main = fact(cache, snap, e.stack).step.is_some();
            l.phase = match call.kind {
                CallKind::ForwardBackward if !main => Phase::Backward,
                CallKind::Forward | CallKind::Backward | CallKind::Weight if !main => {
                    Phase::Backward
                }
                _ => cl.phase,
            };
            let stage = stage_cache.get(e.stack, || {
                stage_of_stack(snap, e.stack, sources, &mut stages)
                    .map(|(t, s1)| (names.intern(&t), s1))
            });
            if let Some((stage, is_stage1)) = stage {
                l.stage = stage;
                if main {
                    let entry = &mut layer[c as usize];
                    if is_stage1 && !entry.1 {
                        entry.0 += 1;
                    }
                    entry.1 = is_stage1;
                    l.layer = entry.0.saturating_sub(1);
                }
            } else if !main {
                if let Some(node) = node_cache.get(e.stack, || {
                    frames::autograd_node(snap, e.stack).map(|n| names.intern(&n))
                }) {
                    l.detail = node;
                }
                if l.phase == Phase::Backward {
                    l.stage = autograd_thread;
                }
            }
        });
    }
}

/// Shape from the iteration counts of steps 2, 3 and 4 in the first invocation.
fn shape_from_calls(calls: &[Call]) -> Option<Shape> {
    let count = |step: u8| -> Option<u32> {
        let sites: Vec<u32> = calls
            .iter()
            .filter(|c| c.invocation == 0 && c.step == step)
            .map(|c| c.site)
            .collect();
        if sites.is_empty() {
            return Some(0);
        }
        let distinct: std::collections::BTreeSet<u32> = sites.iter().copied().collect();
        if distinct.len() < 2 {
            return None;
        }
        // The first iteration may take a branch of its own (step 4 on the first call): count
        // how often the loop's last site is reached.
        let last = *distinct.iter().next_back().expect("non-empty");
        Some(sites.iter().filter(|&&s| s == last).count() as u32)
    };
    Shape::from_counts(count(2)?, count(3)?, count(4)?)
}

/// Picks `n` cut points (events starting a new call) among restarts, shallowest first; falls
/// back to equal shares of the main-thread events when the stacks do not show enough.
fn choose_cuts(restarts: &[(usize, usize)], main: &[usize], n: usize) -> Vec<usize> {
    let mut by_depth: Vec<(usize, usize)> = restarts.to_vec();
    by_depth.sort_by_key(|&(e, d)| (d, e));
    let mut depths: Vec<usize> = by_depth.iter().map(|r| r.1).collect();
    depths.dedup();
    for &d in &depths {
        let cuts: Vec<usize> = restarts.iter().filter(|r| r.1 <= d).map(|r| r.0).collect();
        if cuts.len() == n {
            return cuts;
        }
        if cuts.len() > n {
            break;
        }
    }
    (1..=n).map(|k| main[k * main.len() / (n + 1)]).collect()
}

/// Cuts call `k` at the given events (sorted), renumbering the calls after it.
fn split_call(
    calls: &mut Vec<Call>,
    call_of: &mut [u32],
    main_of_call: &mut Vec<Vec<usize>>,
    k: usize,
    cuts: &[usize],
) {
    if cuts.is_empty() {
        return;
    }
    let mut cuts = cuts.to_vec();
    cuts.sort_unstable();
    let extra = cuts.len();
    for c in call_of.iter_mut() {
        if *c != u32::MAX && *c as usize > k {
            *c += extra as u32;
        }
    }
    let template = calls[k].clone();
    let mains = std::mem::take(&mut main_of_call[k]);
    let mut parts: Vec<Vec<usize>> = vec![Vec::new(); extra + 1];
    for &m in &mains {
        let part = cuts.iter().filter(|&&c| c <= m).count();
        parts[part].push(m);
    }
    let start = calls[k].first;
    let end = calls.get(k + 1).map_or(call_of.len(), |c| c.first);
    for (i, slot) in call_of.iter_mut().enumerate().take(end).skip(start) {
        if *slot as usize == k {
            *slot = (k + cuts.iter().filter(|&&c| c <= i).count()) as u32;
        }
    }
    main_of_call[k] = parts.remove(0);
    for (j, (&cut, part)) in cuts.iter().zip(parts).enumerate() {
        let call = Call {
            first: cut,
            ..template.clone()
        };
        calls.insert(k + 1 + j, call);
        main_of_call.insert(k + 1 + j, part);
    }
}

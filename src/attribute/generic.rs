//! The generic preset: phases of any PyTorch training loop from PyTorch's own frames and
//! `record_function` annotations.
//!
//! Per stack, the innermost frame that names a phase decides: `zero_grad`; frames under
//! `torch/optim/` mean the optimizer (unless the optimizer has called back into other code, a
//! closure); `torch.autograd.backward`, `Tensor.backward`, the loops' `backward` and
//! `manual_backward` entry points, `GradScaler.scale` and the autograd engine's C++ frames
//! mean backward; the rest of `GradScaler` means the optimizer; module calls
//! (`Module.__call__`) mean forward, while `Module.to`, `_apply`, initialisation and
//! `load_state_dict` set the model up and data loaders' and loops' `to_device` helpers move
//! a batch (hints for the categories); frames of `torch/distributed/fsdp` name FSDP's
//! all-gather and reduce-scatter; `torch/utils/checkpoint.py` names activation recomputation.
//! Python frames of another thread are backward's (hooks, recomputation) unless they run an
//! optimizer. What the program computes between a forward and its backward outside any
//! module (the loss) continues the forward.
//! An event with no frames takes the phase of the main-thread event before it when that was a
//! backward call (the main thread waits in `backward()` while the autograd thread allocates).
//! An active `record_function` range named like a phase (`forward`, `backward`, `optimizer`)
//! decides over frames, except that an optimizer range holds the forward and backward its
//! closure runs (the innermost evidence wins). `user_metadata` that names no phase (a
//! module's name, set by a forward pre-hook) is the event's stage. Training steps are
//! counted at `ProfilerStep#N`/`step_N` ranges, or from the phases (a step starts at the
//! first forward after a backward and its update).

use super::source::SourceFiles;
use super::{frames, modules};
use super::{Label, Labels, Names, Phase, STEP_NONE};
use crate::replay::PreviewSoon;
use crate::snapshot::{Action, Snapshot, StackId, Stage, StrId, TraceEvent};

#[derive(Clone, Copy, Debug, Default)]
struct Facts {
    /// The phase the stack itself shows, when it shows one.
    phase: Option<Phase>,
    in_backward_call: bool,
    main_thread: bool,
    /// Python frames without the main script at the bottom: another thread.
    other_thread: bool,
    /// Module calls on the stack.
    module: bool,
    /// Activation recomputation (`torch.utils.checkpoint`) on another thread.
    recompute: bool,
    /// `zero_grad()`.
    zero_grad: bool,
    /// Setting the model up (`Module.to`, `_apply`, `load_state_dict`, initialisation) with
    /// no phase on the stack.
    setup: bool,
    /// Moving a batch to the device (data loaders, the loops' `to_device` helpers) with no
    /// phase on the stack.
    input: bool,
    stage: super::NameId,
    /// Index of the stack's module chain (when the stage is its module path), or `NO_CHAIN`.
    chain: u32,
    /// Where the stack's frames outside the optimizer's `step()` (or `zero_grad()`) begin:
    /// the call site of the update, which tells one optimizer's updates from another's.
    update_site_from: Option<(u16, u16)>,
}

const NO_CHAIN: u32 = u32::MAX;

/// The call site of an update: the first frame outward of the outermost frame of
/// `torch.optim` (or of `zero_grad`) that is the user's own code (not an installed package,
/// not PyTorch's): the line that called `opt.step()`, which tells one optimizer's updates from
/// another's however the call is wrapped (Lightning's `LightningOptimizer.step`). Returned as
/// `(from, to)`, the slice of the stack's frames that names the site; without such a frame,
/// every frame outward of the optimizer's.
fn update_site_from(snap: &Snapshot, stack: StackId) -> Option<(u16, u16)> {
    let frames: Vec<crate::snapshot::Frame> = snap.stacks.frames(stack).collect();
    let mut from = None;
    for (k, f) in frames.iter().enumerate() {
        if frames::is_python(f)
            && (snap.str(f.filename).contains("torch/optim/") || snap.str(f.name) == "zero_grad")
        {
            from = Some(k + 1);
        }
    }
    let from = from?;
    let user = frames[from..].iter().position(|f| {
        let file = snap.str(f.filename);
        frames::is_python(f)
            && !frames::is_plumbing_file(file)
            && !file.contains("/site-packages/")
            && !file.contains("/dist-packages/")
    });
    let (a, b) = match user {
        Some(u) => (from + u, from + u + 1),
        None => (from, frames.len()),
    };
    Some((u16::try_from(a).ok()?, u16::try_from(b).ok()?))
}

/// What the frames of one stack say, read innermost first.
#[derive(Default)]
struct Scan {
    optim: bool,
    backward_call: bool,
    module: bool,
    fsdp: Option<&'static str>,
    checkpoint: bool,
    inner_backward: bool,
    in_transform: bool,
    main: bool,
    python: bool,
    collective: bool,
    zero_grad: bool,
    setup: bool,
    input: bool,
    /// A Python frame other than PyTorch's inside the innermost optimizer frame.
    foreign_inside: bool,
    closure: bool,
    /// A frame of a closure (`closure`, Lightning's `Closure.__call__`) inside the optimizer.
    closure_frame: bool,
    runs_closure: bool,
    scaler: Option<Phase>,
    /// The innermost frame that names a phase: an optimizer step that runs the model inside
    /// its closure (Lightning's automatic optimization, LBFGS) holds a forward and a backward,
    /// and an optimizer step run from a gradient hook is an update inside backward.
    innermost: Option<Phase>,
}

impl Scan {
    fn of(snap: &Snapshot, stack: StackId) -> Scan {
        let mut scan = Scan::default();
        for f in snap.stacks.frames(stack) {
            let file = snap.str(f.filename);
            let name = snap.str(f.name);
            if f.line == 0 {
                scan.native_frame(name);
            } else {
                scan.python_frame(&f, file, name);
            }
        }
        scan
    }

    fn native_frame(&mut self, name: &str) {
        if name.contains("c10d::") || name.contains("ProcessGroupNCCL") || name.contains("nccl") {
            self.collective = true;
        }
        if self.innermost.is_none() && frames::is_autograd_engine_frame(name) {
            self.innermost = Some(Phase::Backward);
        }
    }

    fn python_frame(&mut self, f: &crate::snapshot::Frame, file: &str, name: &str) {
        self.python = true;
        if name == "<module>" {
            self.main = true;
        }
        let mut here = None;
        if name == "zero_grad" {
            self.zero_grad = true;
            here = Some(Phase::Other);
        }
        if !self.optim && name.to_ascii_lowercase().contains("closure") {
            self.closure_frame = true;
        }
        if file.contains("torch/optim/") {
            self.optim = true;
            // an optimizer that calls back into other code (a closure) is no evidence of
            // the update itself
            if !self.foreign_inside {
                here = here.or(Some(Phase::Optimizer));
            } else {
                self.closure = true;
                self.runs_closure |= self.closure_frame;
            }
        } else if !self.optim && frames::is_python(f) && !frames::is_plumbing_file(file) {
            self.foreign_inside = true;
        }
        if (file.ends_with("torch/autograd/__init__.py") && name == "backward")
            || (file.ends_with("torch/autograd/graph.py") && name == "_engine_run_backward")
            || (file.ends_with("torch/_tensor.py") && name == "backward")
        {
            self.backward_call = true;
            here = here.or(Some(Phase::Backward));
        } else if file.ends_with("torch/amp/grad_scaler.py")
            || file.ends_with("torch/cuda/amp/grad_scaler.py")
        {
            // `scaler.scale(loss)` opens backward; unscaling, the step and the scale's update
            // are the optimizer's (the outermost of its frames says which)
            self.scaler = Some(if name == "scale" {
                Phase::Backward
            } else {
                Phase::Optimizer
            });
        } else if name == "backward" || name == "manual_backward" {
            // the loops' entry points to it (accelerate's `Accelerator.backward`, Lightning's
            // `manual_backward` and strategy `backward`): loss scaling belongs to backward
            here = here.or(Some(Phase::Backward));
        }
        let module_file = file.ends_with("torch/nn/modules/module.py");
        if file.contains("torchvision/transforms/") {
            // a transform is a module, but running one prepares a batch: no forward
            self.in_transform = true;
        } else if !module_file {
            self.in_transform = false;
        }
        if module_file {
            if is_module_call(name) {
                if !self.in_transform {
                    self.module = true;
                    here = here.or(Some(Phase::Forward));
                }
            } else {
                // `.to()`, `_apply`, `load_state_dict`: setting the model up, not running it
                self.setup = true;
            }
        }
        // hints only where no frame names a phase (filtered once the stack is read)
        self.setup |= is_setup_frame(file, name);
        self.input |= frames::is_batch_transfer(file, name);
        if self.innermost.is_none() {
            self.innermost = here;
        }
        if file.contains("torch/distributed/fsdp")
            || file.contains("torch/distributed/_composable/fsdp")
        {
            self.fsdp = Some(
                if name.contains("reduce_scatter") || name.contains("post_backward") {
                    "fsdp reduce-scatter"
                } else if name.contains("all_gather") || name.contains("unshard") {
                    "fsdp all-gather"
                } else {
                    self.fsdp.unwrap_or("fsdp")
                },
            );
        }
        if file.ends_with("torch/utils/checkpoint.py") {
            // a backward called inside checkpointing's own (reentrant checkpointing computes
            // the segment's gradients so) is backward, not recomputation
            self.inner_backward |= !self.checkpoint && self.backward_call;
            self.checkpoint = true;
        }
        if file.contains("torch/distributed/") && !file.contains("fsdp") {
            self.collective = true;
        }
    }

    /// The phase the frames name, once all are read.
    fn phase(&mut self, engine: bool) -> (Option<Phase>, bool) {
        // Python frames without the main script at the bottom run on another thread: the
        // autograd engine's, when the main thread is inside backward() (decided while
        // labelling).
        let other_thread = self.python && !self.main;
        if self.innermost.is_none() {
            self.innermost = self.scaler;
        }
        if engine && self.innermost.is_none() {
            self.innermost = Some(Phase::Backward);
        }
        if self.runs_closure && self.innermost.is_none() && !other_thread {
            // the program's code an optimizer calls back (a closure: Lightning's training
            // step, LBFGS) computes the loss: the step's forward, whatever range the optimizer
            // opened
            self.innermost = Some(Phase::Forward);
        }
        let phase = if self.zero_grad {
            Some(Phase::Other)
        } else if other_thread {
            // module calls on another thread are activation checkpointing's recomputation
            // inside backward (decided while labelling); an optimizer step there is an update
            // run from a gradient hook
            match self.innermost {
                Some(Phase::Optimizer) => Some(Phase::Optimizer),
                _ if engine => Some(Phase::Backward),
                _ => None,
            }
        } else if self.innermost.is_some() {
            self.innermost
        } else if self.optim && !self.closure {
            Some(Phase::Optimizer)
        } else if self.collective {
            Some(Phase::Communication)
        } else {
            None
        };
        (phase, other_thread)
    }
}

/// The stage of allocations made while activation checkpointing recomputes a forward.
pub const RECOMPUTE: &str = "activation checkpointing: recompute";

fn facts(
    snap: &Snapshot,
    stack: StackId,
    names: &mut Names,
    sources: &mut SourceFiles,
    classes: &mut modules::ClassNames,
    chains: &mut Vec<modules::Chain>,
) -> Facts {
    let engine =
        frames::in_autograd_engine(snap, stack) || frames::autograd_node(snap, stack).is_some();
    let mut scan = Scan::of(snap, stack);
    let (phase, other_thread) = scan.phase(engine);
    let recompute = scan.checkpoint && (engine || other_thread) && !scan.inner_backward;
    let mut chain = NO_CHAIN;
    let stage = if let Some(f) = scan.fsdp {
        f.to_string()
    } else if recompute {
        RECOMPUTE.to_string()
    } else if let Some(c) = modules::module_chain(snap, stack, sources, classes) {
        let path = c.render(&[]);
        chains.push(c);
        chain = (chains.len() - 1) as u32;
        path
    } else if let Some(f) = frames::user_frames(snap, stack).next() {
        format!("{}:{}", snap.short_file(f.filename), snap.str(f.name))
    } else if let Some(node) = frames::autograd_node(snap, stack) {
        format!("autograd {node}")
    } else {
        String::new()
    };
    Facts {
        phase,
        in_backward_call: scan.backward_call,
        main_thread: scan.main,
        other_thread,
        module: scan.module,
        recompute,
        zero_grad: scan.zero_grad,
        setup: scan.setup && scan.innermost.is_none(),
        input: scan.input && scan.innermost.is_none(),
        stage: names.intern(&stage),
        chain,
        update_site_from: update_site_from(snap, stack),
    }
}

/// `Module.__call__`: running a module (its forward and hooks).
fn is_module_call(name: &str) -> bool {
    matches!(
        name,
        "_call_impl" | "_wrapped_call_impl" | "__call__" | "forward"
    )
}

/// Frames that set a model up: module construction and initialisation, moving it to the
/// device, loading weights.
fn is_setup_frame(file: &str, name: &str) -> bool {
    file.ends_with("torch/nn/init.py")
        || file.ends_with("torch/nn/parameter.py")
        || file.ends_with("torch/serialization.py")
        || (file.contains("torch/nn/modules/")
            && (name == "__init__" || name == "reset_parameters"))
        || name.contains("load_state_dict")
        || name == "from_pretrained"
        || name == "model_to_device"
        || name == "prepare_model"
        || (file.ends_with("torch/nn/parallel/distributed.py")
            && (name == "__init__" || name.starts_with("_ddp_init")))
        || name == "fully_shard"
        || name.contains("init_sharded")
}

/// Where the events' phases came from, counted over a device's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PhaseSources {
    /// `user_metadata` set with `torch.cuda.memory._set_memory_metadata`.
    pub metadata: u64,
    /// A `record_function` range named like a phase.
    pub annotation: u64,
    /// PyTorch's frames on the stack (optimizer, autograd, module calls, ...).
    pub frames: u64,
    /// The autograd thread, while the main thread was inside `backward()`.
    pub autograd_thread: u64,
    /// Frees without evidence of their own, which continue the phase they happen in.
    pub continued: u64,
    /// No evidence: `other`.
    pub none: u64,
}

/// `record_function` ranges of a device as `(start µs, end µs, name, depth)`.
fn annotation_ranges(snap: &Snapshot, device: u32) -> Vec<(i64, i64, crate::snapshot::StrId)> {
    let mut open: Vec<(crate::snapshot::StrId, i64)> = Vec::new();
    let mut out = Vec::new();
    let mut marks: Vec<_> = snap
        .annotations
        .iter()
        .filter(|a| a.device == device as i64)
        .collect();
    marks.sort_by_key(|a| (a.time_us, a.stage == Stage::Start));
    for a in marks {
        match a.stage {
            Stage::Start => open.push((a.name, a.time_us)),
            Stage::End => {
                if let Some(pos) = open.iter().rposition(|o| o.0 == a.name) {
                    let (name, start) = open.remove(pos);
                    out.push((start, a.time_us, name));
                }
            }
        }
    }
    for (name, start) in open {
        out.push((start, i64::MAX, name));
    }
    out.sort_by_key(|r| (r.0, std::cmp::Reverse(r.1)));
    out
}

/// An optimizer update in which nothing was allocated or freed (a fused optimizer whose state
/// exists): it ran, but has no event of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuietPhase {
    /// The last event before the update's range.
    pub after: usize,
}

/// The optimizer updates of a device's trace that hold no event, in event order, each once:
/// the ranges `torch.optim` itself opens around every `step()` (`Optimizer.step#AdamW.step`),
/// which name the phase for certain; one inside another that holds events (an optimizer
/// wrapping another) is part of that one.
pub(crate) fn quiet_phases(snap: &Snapshot, device: u32) -> Vec<QuietPhase> {
    let events = snap.trace(device);
    let mut out: Vec<QuietPhase> = Vec::new();
    // ranges by start, the longest first among equal starts: `after` never decreases
    let mut reach = i64::MIN;
    for (start, end, name) in annotation_ranges(snap, device) {
        if !snap.str(name).starts_with("Optimizer.step#") {
            continue;
        }
        let lo = events.partition_point(|e| e.time_us < start);
        let hi = events.partition_point(|e| e.time_us <= end);
        if hi > lo {
            reach = reach.max(end);
            continue;
        }
        // inside a range with events, or before the first event: nothing to show apart
        if end <= reach || lo == 0 {
            continue;
        }
        if out.last().is_some_and(|q| q.after == lo - 1) {
            continue;
        }
        out.push(QuietPhase { after: lo - 1 });
    }
    out
}

fn phase_of_annotation(name: &str) -> Option<Phase> {
    let n = name.to_ascii_lowercase();
    if n.contains("zero_grad") {
        // `Optimizer.zero_grad#AdamW.zero_grad`: gradients dropped, not an optimizer step
        Some(Phase::Other)
    } else if n.contains("optimizer") || n.contains("optim.") {
        Some(Phase::Optimizer)
    } else if n.contains("backward") {
        Some(Phase::Backward)
    } else if n.contains("forward") {
        Some(Phase::Forward)
    } else {
        None
    }
}

fn step_number(name: &str) -> Option<u32> {
    let n = name
        .strip_prefix("ProfilerStep#")
        .or_else(|| name.strip_prefix("step_"))
        .or_else(|| name.strip_prefix("step"))?;
    n.parse().ok()
}

/// Labels events with generic phases, stages and annotations. With `all` false, only events the
/// pipeline preset left outside any pipeline step get phases and stages.
pub(crate) fn label(
    snap: &Snapshot,
    preview: &PreviewSoon,
    sources: &mut SourceFiles,
    names: &mut Names,
    labels: &mut Labels,
    all: bool,
) -> PhaseSources {
    let mut classes = modules::ClassNames::default();
    let mut chains: Vec<modules::Chain> = Vec::new();
    let mut layers = modules::LayerCounter::default();
    // (event, chain, ordinal of each method), for events whose stage is a module path
    let mut marks: Vec<(usize, u32, Vec<u16>)> = Vec::new();
    let events = snap.trace(preview.device());
    let mut ranges = Ranges::new(snap, preview.device());
    let mut cache = frames::PerStack::new(snap);
    let mut last_main_backward = false;
    let mut segment: u32 = 0;
    let mut last_phase: Option<Phase> = None;
    let mut steps = AnnotatedSteps::default();
    let mut counts = PhaseSources::default();
    let ops = OpNames::new(names);
    // the call site of each update's events, interned by its frames
    let mut sites: rustc_hash::FxHashMap<&[crate::snapshot::FrameId], u32> = Default::default();
    let mut site_of = vec![None; if all { events.len() } else { 0 }];
    // the last event that sets the program up before any phase has run
    let mut setup_until: Option<usize> = None;
    let mut phase_seen = false;
    for (i, e) in events.iter().enumerate() {
        let active = ranges.at(e.time_us);
        let mut l = labels[i];
        if let Some(name) = active.last().map(|r| r.2) {
            l.annotation = names.intern(snap.str(name));
        }
        let step_from_annotation = active.iter().rev().find_map(|r| step_number(snap.str(r.2)));
        if !all && l.pipe_step != STEP_NONE {
            labels.set(i, l);
            continue;
        }
        let f: Facts = cache.get(e.stack, || {
            facts(snap, e.stack, names, sources, &mut classes, &mut chains)
        });
        let meta = snap.str(snap.extra(e).user_metadata);
        let from_meta = (!meta.is_empty())
            .then(|| phase_of_annotation(meta))
            .flatten();
        let no_frames = snap.stacks.stack(e.stack).is_empty();
        let evidence = Evidence {
            zero_grad: f.zero_grad
                || active
                    .iter()
                    .any(|r| snap.str(r.2).to_ascii_lowercase().contains("zero_grad")),
            from_meta,
            annotated: active
                .iter()
                .rev()
                .find_map(|r| phase_of_annotation(snap.str(r.2))),
            autograd_thread: (no_frames || f.other_thread) && last_main_backward,
            is_free: matches!(e.action, Action::FreeRequested | Action::FreeCompleted),
            last_phase,
            all,
        };
        let (phase, source) = evidence.phase(&f);
        *counts.of(source) += 1;
        let continued_free =
            matches!(source, Source::Continued) && evidence.is_free && f.main_thread && !no_frames;
        if f.main_thread {
            last_main_backward = f.in_backward_call;
        }
        // training steps from `ProfilerStep#N` ranges; without them, from the phases below
        if let Some(n) = step_from_annotation {
            steps.at(n);
        }
        if last_phase != Some(phase) && (f.main_thread || last_phase.is_none()) {
            segment += 1;
            last_phase = Some(phase);
        }
        if all {
            phase_seen |= matches!(phase, Phase::Forward | Phase::Backward | Phase::Optimizer);
            if !phase_seen && f.setup && phase == Phase::Other {
                setup_until = Some(i);
            }
            // a free that only continues the update is no evidence of it
            let continued = matches!(source, Source::Continued);
            if (phase == Phase::Optimizer || evidence.zero_grad) && !continued {
                site_of[i] = Some(f.update_site_from.map_or(UNKNOWN_SITE, |(a, b)| {
                    let frames = &snap.stacks.stack(e.stack)[a as usize..b as usize];
                    let next = sites.len() as u32;
                    *sites.entry(frames).or_insert(next)
                }));
            }
        }
        l.phase = phase;
        l.op = ops.of(phase, evidence.zero_grad, f.recompute);
        if all {
            l.train_step = steps.current;
        }
        // PyTorch's own label, when the program set one that names no phase: a module's
        // name, as forward pre-hooks write them (`model.layers.3.mlp`)
        let meta_stage = !meta.is_empty() && from_meta.is_none();
        l.stage = if meta_stage {
            names.intern(meta)
        } else if f.stage == super::NameId::default() && phase == Phase::Backward {
            names.intern(super::AUTOGRAD_THREAD)
        } else {
            f.stage
        };
        l.call = segment | (1 << 31);
        if continued_free {
            l.flags |= super::CONTINUED_FREE;
        }
        if matches!(source, Source::Continued) {
            l.flags |= super::CONTINUED;
        }
        if f.chain != NO_CHAIN && e.action == Action::Alloc && !meta_stage {
            let ordinals = layers.step(&chains[f.chain as usize], segment);
            marks.push((i, f.chain, ordinals));
        }
        if l.detail == super::NameId::default() {
            l.detail = detail(snap, e, names);
        }
        labels.set(i, l);
    }
    if let Some(last) = setup_until {
        labels.map_range(0..last + 1, |l| {
            if l.phase == Phase::Other {
                l.phase = Phase::Setup;
                l.op = ops.setup;
            }
        });
    }
    if all && !steps.seen {
        let quiet: Vec<usize> = quiet_phases(snap, preview.device())
            .iter()
            .map(|q| q.after)
            .collect();
        let updates = Updates {
            site: &site_of,
            quiet: &quiet,
            stopped_by_oom: preview.get().has_oom,
        };
        count_train_steps(snap, labels, events, &updates);
    }
    number_layers(labels, names, &chains, &layers, marks);
    counts
}

/// The `record_function` ranges active as the trace goes on: events come in time order, so
/// each range is opened once and dropped once it has ended.
struct Ranges {
    all: Vec<(i64, i64, crate::snapshot::StrId)>,
    next: usize,
    active: Vec<(i64, i64, crate::snapshot::StrId)>,
}

impl Ranges {
    fn new(snap: &Snapshot, device: u32) -> Ranges {
        Ranges {
            all: annotation_ranges(snap, device),
            next: 0,
            active: Vec::new(),
        }
    }

    /// The ranges active at `time_us`, outermost first.
    fn at(&mut self, time_us: i64) -> &[(i64, i64, crate::snapshot::StrId)] {
        while self.next < self.all.len() && self.all[self.next].0 <= time_us {
            self.active.push(self.all[self.next]);
            self.next += 1;
        }
        self.active.retain(|r| r.1 >= time_us);
        &self.active
    }
}

/// Training steps numbered by `ProfilerStep#N` ranges, from the first one seen.
#[derive(Default)]
struct AnnotatedSteps {
    first: Option<u32>,
    /// The step of the events so far.
    current: u16,
    /// Whether any range numbered a step (then the phases do not).
    seen: bool,
}

impl AnnotatedSteps {
    fn at(&mut self, n: u32) {
        let first = *self.first.get_or_insert(n);
        self.current = n.saturating_sub(first) as u16;
        self.seen = true;
    }
}

/// What an event shows of its phase, besides its stack's [`Facts`].
struct Evidence {
    /// `zero_grad()` on the stack or in a range.
    zero_grad: bool,
    /// The phase its memory metadata names.
    from_meta: Option<Phase>,
    /// The phase its innermost phase-named range names.
    annotated: Option<Phase>,
    /// Allocated on the autograd thread while the main thread was in `backward()`.
    autograd_thread: bool,
    is_free: bool,
    /// The phase of the main thread's latest event.
    last_phase: Option<Phase>,
    /// Whether the whole trace is labelled here (no pipeline took part of it).
    all: bool,
}

/// Where a phase came from, for [`PhaseSources`].
#[derive(Clone, Copy)]
enum Source {
    Metadata,
    Annotation,
    Frames,
    AutogradThread,
    Continued,
    None,
}

impl PhaseSources {
    fn of(&mut self, source: Source) -> &mut u64 {
        match source {
            Source::Metadata => &mut self.metadata,
            Source::Annotation => &mut self.annotation,
            Source::Frames => &mut self.frames,
            Source::AutogradThread => &mut self.autograd_thread,
            Source::Continued => &mut self.continued,
            Source::None => &mut self.none,
        }
    }
}

impl Evidence {
    /// The phase, first evidence wins: `zero_grad()`, memory metadata, a range, the frames,
    /// the autograd thread, a module call on another thread, a free continuing its phase, what
    /// the program computes between a forward and its backward; else `other`.
    fn phase(&self, f: &Facts) -> (Phase, Source) {
        // An optimizer range holds whatever runs inside it (a closure's forward and backward):
        // the innermost evidence wins over it. So does the stretch between a forward and its
        // backward inside the range (the loss).
        let inner = matches!(f.phase, Some(Phase::Forward | Phase::Backward))
            || self.autograd_thread
            || (f.phase.is_none() && self.last_phase == Some(Phase::Forward) && self.all);
        let annotated = self
            .annotated
            .filter(|&p| !(p == Phase::Optimizer && inner));
        if self.zero_grad {
            // the most specific evidence: gradients dropped, whatever range it runs in
            (Phase::Other, Source::Frames)
        } else if let Some(p) = self.from_meta {
            (p, Source::Metadata)
        } else if let Some(p) = annotated {
            (p, Source::Annotation)
        } else if let Some(p) = f.phase {
            (p, Source::Frames)
        } else if self.autograd_thread {
            (Phase::Backward, Source::AutogradThread)
        } else if f.other_thread && f.module {
            (Phase::Forward, Source::Frames)
        } else if let (true, Some(p)) = (self.is_free, self.last_phase) {
            (p, Source::Continued)
        } else if self.last_phase == Some(Phase::Forward) && !f.setup && !f.input && self.all {
            // the loss and whatever else the program computes between the model's forward and
            // its backward, outside any module
            (Phase::Forward, Source::Continued)
        } else {
            (Phase::Other, Source::None)
        }
    }
}

/// The op names a generic program's events get: their phase, `zero_grad` or `recompute`.
struct OpNames {
    phases: [super::NameId; 5],
    zero_grad: super::NameId,
    recompute: super::NameId,
    setup: super::NameId,
}

impl OpNames {
    fn new(names: &mut Names) -> OpNames {
        OpNames {
            zero_grad: names.intern("zero_grad"),
            recompute: names.intern("recompute"),
            setup: names.intern("set-up"),
            phases: [
                names.intern("forward"),
                names.intern("backward"),
                names.intern("optimizer"),
                names.intern("communication"),
                names.intern("other"),
            ],
        }
    }

    fn of(&self, phase: Phase, zero_grad: bool, recompute: bool) -> super::NameId {
        if zero_grad && phase == Phase::Other {
            self.zero_grad
        } else if recompute && phase == Phase::Backward {
            self.recompute
        } else {
            self.phases[match phase {
                Phase::Forward => 0,
                Phase::Backward => 1,
                Phase::Optimizer => 2,
                Phase::Communication => 3,
                Phase::Other | Phase::Setup | Phase::WrapUp => 4,
            }]
        }
    }
}

/// An event's detail: its autograd node, or the compiled region it ran in (torch.compile
/// with `compile_context=True`).
fn detail(snap: &Snapshot, e: &TraceEvent, names: &mut Names) -> super::NameId {
    if let Some(node) = frames::autograd_node(snap, e.stack) {
        return names.intern(&node);
    }
    let context = snap.str(snap.extra(e).compile_context);
    if !context.is_empty() && context != "N/A" {
        names.intern(context)
    } else {
        super::NameId::default()
    }
}

/// Layers of loops: the outermost method called from a loop gets its ordinal in the stage's
/// text and as the label's layer.
fn number_layers(
    labels: &mut Labels,
    names: &mut Names,
    chains: &[modules::Chain],
    layers: &modules::LayerCounter,
    marks: Vec<(usize, u32, Vec<u16>)>,
) {
    for (i, chain, ordinals) in marks {
        let c = &chains[chain as usize];
        let Some(d) = c
            .methods
            .iter()
            .position(|m| layers.loops.contains(&m.caller))
        else {
            continue;
        };
        let mut shown = vec![None; c.methods.len()];
        shown[d] = ordinals.get(d).copied();
        let stage = names.intern(&c.render(&shown));
        let layer = ordinals.get(d).copied();
        labels.update(i, |l| {
            l.stage = stage;
            if let Some(k) = layer {
                l.layer = k;
            }
        });
    }
}

/// Frees the program made on its main thread outside any phase (its own stack names none),
/// of blocks made before the stretch of events they fall in (`data = None` after backward, a
/// loop dropping its batch after the update): they are no part of that stretch's phase, so
/// they are `other`, and the stretch ends where the program left the phase. So are frees of
/// what the phase's own code made (logits dropped once the model has returned). A free of a
/// block the program made while continuing the stretch (a temporary of the loss), or that the
/// phase just before it made (the loss dropped right after its backward), stays in it.
pub(crate) fn frees_outside_phases(
    snap: &Snapshot,
    replay: &crate::replay::Replay,
    labels: &mut Labels,
    other: super::NameId,
) {
    let events = snap.trace(replay.device);
    let same =
        |a: &Label, b: &Label| a.train_step == b.train_step && a.phase == b.phase && a.mb == b.mb;
    // the innermost function of the program's own code on a stack
    let function = |stack: StackId| {
        snap.stacks
            .frames(stack)
            .find(|f| frames::is_python(f) && !frames::is_plumbing_file(snap.str(f.filename)))
            .map(|f| (f.filename, f.name))
    };
    let mut functions = frames::PerStack::new(snap);
    let mut start = 0;
    // the stretch's last event with work of its own (not continuing): the function it ran in
    // is the code that ran the phase (the line that called `backward()`, `opt.step()`)
    let mut last_work: Option<usize> = None;
    for i in 0..labels.len().min(events.len()) {
        if i > 0 && !same(&labels[i - 1], &labels[i]) {
            start = i;
            last_work = None;
        }
        if labels[i].flags & super::CONTINUED_FREE == 0
            || matches!(labels[i].phase, Phase::Other | Phase::Setup | Phase::WrapUp)
        {
            if labels[i].flags & super::CONTINUED == 0
                && !snap.stacks.stack(events[i].stack).is_empty()
            {
                last_work = Some(i);
            }
            continue;
        }
        let caller = last_work.and_then(|w| {
            let stack = events[w].stack;
            functions.get(stack, || function(stack))
        });
        let p = replay
            .partner
            .get(i)
            .copied()
            .unwrap_or(crate::replay::NONE);
        let made =
            (p != crate::replay::NONE && p & crate::replay::PREEXISTING == 0).then_some(p as usize);
        // the loss's own temporaries, or what an earlier phase of the same step and
        // micro-batch made, dropped by the code that ran this phase before it returned (the
        // loss dropped right after its backward)
        let kept = made.is_some_and(|p| {
            let (m, l) = (&labels[p], &labels[i]);
            if p >= start {
                m.flags & super::CONTINUED != 0
            } else {
                m.phase != Phase::Other
                    && m.phase != Phase::Setup
                    && m.train_step == l.train_step
                    && m.mb == l.mb
                    && caller.is_some_and(|c| function(events[i].stack) == Some(c))
            }
        });
        if !kept {
            // the stretch ends before this free
            start = i;
            last_work = None;
            labels.update(i, |l| {
                l.phase = Phase::Other;
                l.op = other;
                l.mb = super::NO_MB;
            });
        }
    }
}

/// A function running at a depth of the call tree: its file and name, and how many Python
/// frames lie outside it.
type Scope = (usize, StrId, StrId);

/// The innermost call both stacks are inside: their Python frames are compared from the
/// outermost in; where they part, the function they were both in (the same function at a
/// different line is still the same call).
fn common_function(snap: &Snapshot, a: StackId, b: StackId) -> Option<Scope> {
    let outside_in = |s: StackId| {
        let mut v: Vec<crate::snapshot::Frame> =
            snap.stacks.frames(s).filter(frames::is_python).collect();
        v.reverse();
        v
    };
    let (a, b) = (outside_in(a), outside_in(b));
    let mut scope = None;
    for (depth, (x, y)) in a.iter().zip(&b).enumerate() {
        if (x.filename, x.name) != (y.filename, y.name) {
            break;
        }
        scope = Some((depth, x.filename, x.name));
        if x.line != y.line {
            break;
        }
    }
    scope
}

/// Whether a stack with Python frames runs outside the call `scope` (it has returned).
fn left(snap: &Snapshot, stack: StackId, scope: Scope) -> bool {
    let python: Vec<crate::snapshot::Frame> = snap
        .stacks
        .frames(stack)
        .filter(frames::is_python)
        .collect();
    let (depth, file, name) = scope;
    !python.is_empty()
        && python
            .len()
            .checked_sub(depth + 1)
            .and_then(|k| python.get(k))
            .is_none_or(|f| (f.filename, f.name) != (file, name))
}

/// Training steps from the program's own (`memsnap.Capture`'s `.tensors.json`): each event
/// belongs to the last step the program started by its time, the events before the first to
/// the first. Micro-batches keep the numbers the phases gave them. Returns the program's number
/// of each step.
pub(crate) fn program_steps(
    events: &[TraceEvent],
    labels: &mut Labels,
    steps: &[crate::snapshot::tensors::ProgramStep],
) -> Vec<i64> {
    let mut ordered: Vec<_> = steps.to_vec();
    ordered.sort_by_key(|s| s.start_us);
    let mut k = 0;
    for (i, e) in events.iter().enumerate().take(labels.len()) {
        while k + 1 < ordered.len() && ordered[k + 1].start_us <= e.time_us {
            k += 1;
        }
        labels.update(i, |l| l.train_step = k.min(u16::MAX as usize) as u16);
    }
    // micro-batches numbered afresh in each step, and only in steps that have several
    let mut seen: Vec<Vec<u16>> = vec![Vec::new(); ordered.len().max(1)];
    for l in labels.iter().filter(|l| l.mb != super::NO_MB) {
        let s = &mut seen[(l.train_step as usize).min(ordered.len().max(1) - 1)];
        if !s.contains(&l.mb) {
            s.push(l.mb);
        }
    }
    labels.map_range(0..labels.len(), |l| {
        if l.mb == super::NO_MB {
            return;
        }
        let s = &seen[(l.train_step as usize).min(ordered.len().max(1) - 1)];
        l.mb = match s.len() {
            1 => super::NO_MB,
            _ => s.iter().position(|&m| m == l.mb).unwrap_or(0) as u16,
        };
    });
    ordered.iter().map(|s| s.step).collect()
}

/// An update whose call site is not known (it allocated nothing under `torch.optim`).
const UNKNOWN_SITE: u32 = u32::MAX;

/// The updates of a trace, for counting its steps.
struct Updates<'a> {
    /// Per event: the call site of the update it belongs to ([`UNKNOWN_SITE`] when not known),
    /// `None` for an event of no update.
    site: &'a [Option<u32>],
    /// Updates that held no event: the event each follows.
    quiet: &'a [usize],
    /// The trace ended in an out-of-memory error.
    stopped_by_oom: bool,
}

/// Where a new stretch of the loop begins, and what ended the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// A forward after a backward with no update between: the next micro-batch, or (in a
    /// trace that shows no update) the next step.
    Micro,
    /// After an update: the next step, or the next part of this one when another optimizer
    /// updates next (a GAN's generator after its discriminator).
    AfterUpdate,
}

/// Numbers the training steps of a trace from its phases. A step is the repeating unit of
/// phases that ends with the updates it holds:
/// - a forward after a backward with no update between is the next micro-batch of the same
///   step (gradient accumulation), numbered in `mb`; in a trace that shows no update at all,
///   it is the next step, unless the trace ended in an out-of-memory error (then the step
///   that failed is still in progress: its micro-batches are one step);
/// - after an update a new step starts at the next forward, or at the next update if no
///   forward allocates in between (a replayed CUDA graph), unless the next update is by an
///   optimizer this step has not updated yet (told by the call site of `step()`): then
///   several optimizers take turns within one step (a GAN, actor-critic);
/// - the step before a cut ends with its update and the frees that follow, so the loading of
///   the next batch opens the step that uses it.
fn count_train_steps(
    snap: &Snapshot,
    labels: &mut Labels,
    events: &[TraceEvent],
    updates: &Updates,
) {
    let stretches = find_stretches(snap, labels, events, updates);
    mark_wrap_up(snap, labels, events, &stretches);
    let any_update = updates.site.iter().any(Option::is_some) || !updates.quiet.is_empty();
    number_steps(labels, &stretches, any_update, updates.stopped_by_oom);
}

/// The stretches of a trace's loop, in event order.
struct Stretches {
    /// Where each stretch opens (its first event) and what ended the one before.
    cuts: Vec<(usize, Cut)>,
    /// The call sites of each stretch's updates.
    sites: Vec<Vec<u32>>,
    /// The last event of the last update or backward.
    last_end: usize,
}

/// Whether event `k` gives memory back.
fn is_free(events: &[TraceEvent], k: usize) -> bool {
    matches!(
        events[k].action,
        Action::FreeRequested | Action::FreeCompleted
    )
}

/// Cuts the trace where the loop goes round: a forward after a backward (the next
/// micro-batch), a forward or an update after an update (the next step or the next optimizer).
fn find_stretches(
    snap: &Snapshot,
    labels: &Labels,
    events: &[TraceEvent],
    updates: &Updates,
) -> Stretches {
    let n = labels.len();
    let mut cuts: Vec<(usize, Cut)> = vec![(0, Cut::Micro)];
    let mut sites: Vec<Vec<u32>> = vec![Vec::new()];
    let mut backward_seen = false;
    let mut updated = false;
    // something other than an update ran since the last update (a batch, a replayed graph)
    let mut since_update = false;
    let mut last_end: usize = 0;
    let mut quiet = updates.quiet.iter().peekable();
    // where the stretch after `last_end` opens, before the work at `i`: at its first event
    // other than a free. After an update, the step's own frees stay in it until the code that
    // runs a step (the innermost call the next step's first work and the update are both
    // inside: Lightning's `advance`, a plain loop's body) has returned.
    let open_after = |last_end: usize, i: usize, after_update: bool| {
        let work = (last_end + 1..i)
            .find(|&k| !is_free(events, k))
            .unwrap_or(i);
        let scope = if after_update && work < n {
            common_function(snap, events[work].stack, events[last_end].stack)
        } else {
            None
        };
        match scope {
            Some(s) => (last_end + 1..work)
                .find(|&k| left(snap, events[k].stack, s))
                .unwrap_or(work),
            None => work,
        }
    };
    for (i, label) in labels.iter().enumerate() {
        let site = updates.site.get(i).copied().flatten();
        let update = site.is_some() && (backward_seen || updated);
        if let Some(s) = site.filter(|_| update) {
            if updated && since_update {
                // an update after other work, with no forward between: the loop went round
                cuts.push((open_after(last_end, i, true), Cut::AfterUpdate));
                sites.push(Vec::new());
                backward_seen = false;
            }
            updated = true;
            since_update = false;
            last_end = i;
            sites.last_mut().expect("a stretch").push(s);
        } else {
            match label.phase {
                Phase::Forward if backward_seen || updated => {
                    let cut = if updated {
                        Cut::AfterUpdate
                    } else {
                        Cut::Micro
                    };
                    cuts.push((open_after(last_end, i, updated), cut));
                    sites.push(Vec::new());
                    backward_seen = false;
                    updated = false;
                }
                Phase::Backward => {
                    backward_seen = true;
                    last_end = i;
                }
                _ if !is_free(events, i) && updated => since_update = true,
                _ => {}
            }
        }
        // an update that held no event follows this one
        while quiet.next_if(|&&q| q <= i).is_some() {
            if backward_seen || updated {
                if updated && since_update {
                    cuts.push((i + 1, Cut::AfterUpdate));
                    sites.push(Vec::new());
                    backward_seen = false;
                }
                updated = true;
                since_update = false;
                last_end = i;
                sites.last_mut().expect("a stretch").push(UNKNOWN_SITE);
            }
        }
    }
    Stretches {
        cuts,
        sites,
        last_end,
    }
}

/// After the last update, what runs once the code that ran the steps has returned is the
/// program's wrap-up.
fn mark_wrap_up(snap: &Snapshot, labels: &mut Labels, events: &[TraceEvent], st: &Stretches) {
    let n = labels.len();
    let last_end = st.last_end;
    if st.sites.last().is_none_or(Vec::is_empty) || last_end + 1 >= n {
        return;
    }
    let first_work = (0..n)
        .find(|&k| labels[k].phase != Phase::Setup)
        .unwrap_or(0);
    let cut = st.cuts.last().map_or(0, |c| c.0).max(first_work);
    let work = (cut..last_end)
        .find(|&k| !is_free(events, k))
        .unwrap_or(last_end);
    let Some(scope) = common_function(snap, events[work].stack, events[last_end].stack) else {
        return;
    };
    if let Some(k) = (last_end + 1..n).find(|&k| left(snap, events[k].stack, scope)) {
        labels.map_range(k..n, |l| {
            if l.phase == Phase::Other || l.flags & super::CONTINUED != 0 {
                l.phase = Phase::WrapUp;
            }
        });
    }
}

/// Numbers steps and micro-batches from the cuts: a cut after an update starts a step, unless
/// the next stretch that updates does so with optimizers this step has not updated yet.
fn number_steps(labels: &mut Labels, st: &Stretches, any_update: bool, stopped_by_oom: bool) {
    let n = labels.len();
    let (cuts, sites) = (&st.cuts, &st.sites);
    let mut step: u16 = 0;
    let mut micro: u16 = 0;
    let mut step_sites: Vec<u32> = sites[0].clone();
    let mut numbered: Vec<(usize, u16, u16)> = vec![(0, 0, 0)];
    for k in 1..cuts.len() {
        let (from, cut) = cuts[k];
        let new_step = match cut {
            Cut::Micro => !any_update && !stopped_by_oom,
            Cut::AfterUpdate => match sites[k..].iter().find(|s| !s.is_empty()) {
                None => true,
                Some(next) => next
                    .iter()
                    .any(|s| *s == UNKNOWN_SITE || step_sites.contains(s)),
            },
        };
        if new_step {
            step = step.saturating_add(1);
            micro = 0;
            step_sites.clear();
        } else if cut == Cut::Micro {
            micro = micro.saturating_add(1);
        }
        step_sites.extend_from_slice(&sites[k]);
        numbered.push((from, step, micro));
    }
    // micro-batches are numbered only in steps that have several
    let mut several = vec![false; step as usize + 1];
    for &(_, s, m) in &numbered {
        if m > 0 {
            several[s as usize] = true;
        }
    }
    for (k, &(from, s, m)) in numbered.iter().enumerate() {
        let to = numbered.get(k + 1).map_or(n, |c| c.0);
        labels.map_range(from.min(to)..to, |l| {
            l.train_step = s;
            let per_micro = matches!(l.phase, Phase::Forward | Phase::Backward);
            l.mb = if several[s as usize] && per_micro {
                m
            } else {
                super::NO_MB
            };
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_name_phases_and_steps() {
        assert_eq!(phase_of_annotation("forward"), Some(Phase::Forward));
        assert_eq!(
            phase_of_annotation("Optimizer.step#AdamW.step"),
            Some(Phase::Optimizer)
        );
        assert_eq!(phase_of_annotation("loss.backward"), Some(Phase::Backward));
        assert_eq!(phase_of_annotation("nccl:coalesced"), None);
        assert_eq!(
            phase_of_annotation("Optimizer.zero_grad#AdamW.zero_grad"),
            Some(Phase::Other)
        );
        assert_eq!(step_number("ProfilerStep#12"), Some(12));
        assert_eq!(step_number("step_3"), Some(3));
        assert_eq!(step_number("stepper"), None);
    }

    /// A trace of `(phase, action)` pairs, labelled only with phases, as `count_train_steps`
    /// reads them (every update by one optimizer); returns `(train step, micro-batch)` per event.
    fn steps_of(trace: &[(Phase, Action)], zero_grad: bool) -> Vec<(u16, u16)> {
        let sites: Vec<Option<u32>> = trace
            .iter()
            .map(|&(phase, _)| {
                (phase == Phase::Optimizer || (zero_grad && phase == Phase::Other)).then_some(0)
            })
            .collect();
        steps_with(trace, &sites, &[], false)
    }

    /// As [`steps_of`], with each event's update site given, quiet updates and an OOM.
    fn steps_with(
        trace: &[(Phase, Action)],
        site: &[Option<u32>],
        quiet: &[usize],
        stopped_by_oom: bool,
    ) -> Vec<(u16, u16)> {
        let labels: Vec<Label> = trace
            .iter()
            .map(|&(phase, _)| Label {
                phase,
                ..Label::EMPTY
            })
            .collect();
        let events: Vec<TraceEvent> = trace
            .iter()
            .map(|&(_, action)| TraceEvent {
                addr: 0,
                size: 0,
                time_us: 0,
                stream: Default::default(),
                stack: StackId::default(),
                extra: 0,
                pool: crate::snapshot::PoolId::UNKNOWN,
                action,
            })
            .collect();
        let updates = Updates {
            site,
            quiet,
            stopped_by_oom,
        };
        let snap = Snapshot::default();
        let mut labels = Labels::from(labels);
        count_train_steps(&snap, &mut labels, &events, &updates);
        labels.iter().map(|l| (l.train_step, l.mb)).collect()
    }

    #[test]
    fn optimizers_taking_turns_are_one_step_and_graph_replays_are_steps() {
        use Action::Alloc;
        use Phase::*;
        let none = crate::attribute::NO_MB;
        // a GAN: the discriminator's forward, backward and update, then the generator's
        let trace = [
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
        ];
        let site = |i: usize| [None, None, Some(1), None, None, Some(2)][i % 6];
        let sites: Vec<Option<u32>> = (0..trace.len()).map(site).collect();
        let got: Vec<u16> = steps_with(&trace, &sites, &[], false)
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(got, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]);
        // updates whose site is not known are each a step's end
        let unknown: Vec<Option<u32>> = sites.iter().map(|s| s.map(|_| UNKNOWN_SITE)).collect();
        let got: Vec<u16> = steps_with(&trace, &unknown, &[], false)
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(got, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        // replayed graphs: after the first step only the batch and the update allocate
        let trace = [
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Other, Alloc),
            (Optimizer, Alloc),
            (Other, Alloc),
            (Optimizer, Alloc),
        ];
        let sites = [None, None, Some(1), None, Some(1), None, Some(1)];
        assert_eq!(
            steps_with(&trace, &sites, &[], false),
            [
                (0, none),
                (0, none),
                (0, none),
                (1, none),
                (1, none),
                (2, none),
                (2, none)
            ]
        );
        // a fused update that holds no event still ends its step
        let trace = [
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Other, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Other, Alloc),
            (Forward, Alloc),
        ];
        let sites = [None, None, Some(1), None, None, None, None, None];
        let got: Vec<u16> = steps_with(&trace, &sites, &[5], false)
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(got, [0, 0, 0, 1, 1, 1, 2, 2]);
        // an out-of-memory error in the first accumulation step: one step in progress
        let trace = [
            (Forward, Alloc),
            (Backward, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Forward, Alloc),
        ];
        assert_eq!(
            steps_with(&trace, &[None; 5], &[], true),
            [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2)]
        );
    }

    #[test]
    fn train_steps_start_at_the_forward_after_an_update() {
        use Action::{Alloc, FreeRequested as Free};
        use Phase::*;
        let none = crate::attribute::NO_MB;
        // forward, backward, update, a free closing the step, the next batch, forward...
        let trace = [
            (Other, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Other, Free),
            (Other, Alloc),
            (Forward, Alloc),
            (Backward, Free),
        ];
        let got: Vec<u16> = steps_of(&trace, false).iter().map(|s| s.0).collect();
        assert_eq!(got, [0, 0, 0, 0, 0, 1, 1, 1]);
        // an optimizer range holding forward and backward (Lightning): the zero_grad between
        // them opens no step
        let trace = [
            (Forward, Alloc),
            (Other, Free),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Forward, Alloc),
            (Other, Free),
            (Backward, Alloc),
            (Optimizer, Alloc),
        ];
        let got: Vec<u16> = steps_of(&trace, true).iter().map(|s| s.0).collect();
        assert_eq!(got, [0, 0, 0, 0, 1, 1, 1, 1]);
        // gradient accumulation: two micro-batches per update, numbered
        let trace = [
            (Forward, Alloc),
            (Backward, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
        ];
        assert_eq!(
            steps_of(&trace, false),
            [
                (0, 0),
                (0, 0),
                (0, 1),
                (0, 1),
                (0, none),
                (1, 0),
                (1, 0),
                (1, 1),
                (1, 1)
            ]
        );
        // a trace that shows no update at all: each forward after a backward is a step
        let trace = [
            (Forward, Alloc),
            (Backward, Alloc),
            (Forward, Alloc),
            (Backward, Alloc),
        ];
        let got: Vec<u16> = steps_of(&trace, false).iter().map(|s| s.0).collect();
        assert_eq!(got, [0, 0, 1, 1]);
        // a step whose update allocated nothing but zero_grad freed the gradients (a skipped
        // GradScaler step)
        let trace = [
            (Forward, Alloc),
            (Backward, Alloc),
            (Other, Free),
            (Forward, Alloc),
            (Backward, Alloc),
            (Optimizer, Alloc),
        ];
        let got: Vec<u16> = steps_of(&trace, true).iter().map(|s| s.0).collect();
        assert_eq!(got, [0, 0, 0, 1, 1, 1]);
    }
}

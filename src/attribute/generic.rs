//! The generic preset: phases of any PyTorch training loop from PyTorch's own frames and
//! `record_function` annotations.
//!
//! Per stack: frames under `torch/optim/` mean the optimizer; frames of the autograd engine
//! (C++), of an autograd node, or of `torch.autograd.backward` mean backward; module calls
//! (`torch/nn/modules/module.py`) mean forward; frames of `torch/distributed/fsdp` name FSDP's
//! all-gather and reduce-scatter; `torch/utils/checkpoint.py` names activation recomputation.
//! An event with no frames takes the phase of the main-thread event before it when that was a
//! backward call (the main thread waits in `backward()` while the autograd thread allocates).
//! An active `record_function` range named like a phase (`forward`, `backward`, `optimizer`)
//! decides over frames. Training steps are counted at `ProfilerStep#N`/`step_N` ranges, or
//! after each optimizer phase.

use super::source::SourceFiles;
use super::{frames, modules};
use super::{Label, Names, Phase, STEP_NONE};
use crate::replay::Preview;
use crate::snapshot::{Action, Snapshot, StackId, Stage};

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
    stage: super::NameId,
    /// Index of the stack's module chain (when the stage is its module path), or `NO_CHAIN`.
    chain: u32,
}

const NO_CHAIN: u32 = u32::MAX;

fn facts(
    snap: &Snapshot,
    stack: StackId,
    names: &mut Names,
    sources: &mut SourceFiles,
    classes: &mut modules::ClassNames,
    chains: &mut Vec<modules::Chain>,
) -> Facts {
    let mut optim = false;
    let engine =
        frames::in_autograd_engine(snap, stack) || frames::autograd_node(snap, stack).is_some();
    let mut backward_call = false;
    let mut module = false;
    let mut fsdp: Option<&'static str> = None;
    let mut checkpoint = false;
    let mut main = false;
    let mut python = false;
    let mut collective = false;
    let mut zero_grad = false;
    for f in snap.stacks.frames(stack) {
        let file = snap.str(f.filename);
        let name = snap.str(f.name);
        if f.line == 0 {
            if name.contains("c10d::") || name.contains("ProcessGroupNCCL") || name.contains("nccl")
            {
                collective = true;
            }
            continue;
        }
        python = true;
        if name == "<module>" {
            main = true;
        }
        if name == "zero_grad" {
            zero_grad = true;
        }
        if file.contains("torch/optim/") {
            optim = true;
        }
        if (file.ends_with("torch/autograd/__init__.py") && name == "backward")
            || (file.ends_with("torch/autograd/graph.py") && name == "_engine_run_backward")
            || (file.ends_with("torch/_tensor.py") && name == "backward")
        {
            backward_call = true;
        }
        if file.ends_with("torch/nn/modules/module.py") {
            module = true;
        }
        if file.contains("torch/distributed/fsdp")
            || file.contains("torch/distributed/_composable/fsdp")
        {
            fsdp = Some(
                if name.contains("reduce_scatter") || name.contains("post_backward") {
                    "fsdp reduce-scatter"
                } else if name.contains("all_gather") || name.contains("unshard") {
                    "fsdp all-gather"
                } else {
                    fsdp.unwrap_or("fsdp")
                },
            );
        }
        if file.ends_with("torch/utils/checkpoint.py") {
            checkpoint = true;
        }
        if file.contains("torch/distributed/") && !file.contains("fsdp") {
            collective = true;
        }
    }
    // Python frames without the main script at the bottom run on another thread: the autograd
    // engine's, when the main thread is inside backward() (decided while labelling).
    let other_thread = python && !main;
    let phase = if zero_grad {
        Some(Phase::Other)
    } else if optim {
        Some(Phase::Optimizer)
    } else if engine || backward_call {
        Some(Phase::Backward)
    } else if other_thread {
        None
    } else if module {
        Some(Phase::Forward)
    } else if collective {
        Some(Phase::Communication)
    } else {
        None
    };
    let recompute = checkpoint && (engine || other_thread);
    let mut chain = NO_CHAIN;
    let stage = if let Some(f) = fsdp {
        f.to_string()
    } else if recompute {
        "activation checkpointing: recompute".to_string()
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
        in_backward_call: backward_call,
        main_thread: main,
        other_thread,
        module,
        recompute,
        zero_grad,
        stage: names.intern(&stage),
        chain,
    }
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
    preview: &Preview,
    sources: &mut SourceFiles,
    names: &mut Names,
    labels: &mut [Label],
    all: bool,
) -> PhaseSources {
    let mut classes = modules::ClassNames::default();
    let mut chains: Vec<modules::Chain> = Vec::new();
    let mut layers = modules::LayerCounter::default();
    // (event, chain, ordinal of each method), for events whose stage is a module path
    let mut marks: Vec<(usize, u32, Vec<u16>)> = Vec::new();
    let events = snap.trace(preview.device);
    let ranges = annotation_ranges(snap, preview.device);
    let mut cache = frames::PerStack::new(snap);
    let mut active: Vec<(i64, i64, crate::snapshot::StrId)> = Vec::new();
    let mut next_range = 0;
    let mut last_main_backward = false;
    let mut segment: u32 = 0;
    let mut last_phase: Option<Phase> = None;
    let mut train_step: u16 = 0;
    let mut first_step_number: Option<u32> = None;
    let mut saw_optimizer = false;
    let mut counts = PhaseSources::default();
    let zero_grad_op = names.intern("zero_grad");
    let recompute_op = names.intern("recompute");
    let ops = [
        names.intern("forward"),
        names.intern("backward"),
        names.intern("optimizer"),
        names.intern("communication"),
        names.intern("other"),
    ];
    for (i, e) in events.iter().enumerate() {
        // annotations active at this event
        while next_range < ranges.len() && ranges[next_range].0 <= e.time_us {
            active.push(ranges[next_range]);
            next_range += 1;
        }
        active.retain(|r| r.1 >= e.time_us);
        let innermost = active.last().map(|r| r.2);
        if let Some(name) = innermost {
            labels[i].annotation = names.intern(snap.str(name));
        }
        let step_from_annotation = active.iter().rev().find_map(|r| step_number(snap.str(r.2)));
        if !all && labels[i].pipe_step != STEP_NONE {
            continue;
        }
        let f: Facts = cache.get(e.stack, || {
            facts(snap, e.stack, names, sources, &mut classes, &mut chains)
        });
        let meta = snap.str(e.user_metadata);
        let from_meta = (!meta.is_empty())
            .then(|| phase_of_annotation(meta))
            .flatten();
        let annotated = active
            .iter()
            .rev()
            .find_map(|r| phase_of_annotation(snap.str(r.2)));
        let is_free = matches!(e.action, Action::FreeRequested | Action::FreeCompleted);
        let zero_grad = f.zero_grad
            || active
                .iter()
                .any(|r| snap.str(r.2).to_ascii_lowercase().contains("zero_grad"));
        let no_frames = snap.stacks.stack(e.stack).is_empty();
        let (phase, source) = if zero_grad {
            // the most specific evidence: gradients dropped, whatever range it runs in
            (Phase::Other, &mut counts.frames)
        } else if let Some(p) = from_meta {
            (p, &mut counts.metadata)
        } else if let Some(p) = annotated {
            (p, &mut counts.annotation)
        } else if let Some(p) = f.phase {
            (p, &mut counts.frames)
        } else if (no_frames || f.other_thread) && last_main_backward {
            (Phase::Backward, &mut counts.autograd_thread)
        } else if f.other_thread && f.module {
            (Phase::Forward, &mut counts.frames)
        } else if let (true, Some(p)) = (is_free, last_phase) {
            (p, &mut counts.continued)
        } else {
            (Phase::Other, &mut counts.none)
        };
        *source += 1;
        if f.main_thread {
            last_main_backward = f.in_backward_call;
        }
        // training steps
        match step_from_annotation {
            Some(n) => {
                let first = *first_step_number.get_or_insert(n);
                train_step = n.saturating_sub(first) as u16;
            }
            None => {
                if saw_optimizer
                    && phase != Phase::Optimizer
                    && !zero_grad
                    && f.main_thread
                    && !is_free
                {
                    train_step += 1;
                    saw_optimizer = false;
                }
                if phase == Phase::Optimizer {
                    saw_optimizer = true;
                }
            }
        }
        if last_phase != Some(phase) && (f.main_thread || last_phase.is_none()) {
            segment += 1;
            last_phase = Some(phase);
        }
        let l = &mut labels[i];
        l.phase = phase;
        l.op = if zero_grad && phase == Phase::Other {
            zero_grad_op
        } else if f.recompute && phase == Phase::Backward {
            recompute_op
        } else {
            ops[match phase {
                Phase::Forward => 0,
                Phase::Backward => 1,
                Phase::Optimizer => 2,
                Phase::Communication => 3,
                Phase::Other => 4,
            }]
        };
        if all {
            l.train_step = train_step;
        }
        l.stage = if f.stage == super::NameId::default() && phase == Phase::Backward {
            names.intern(super::AUTOGRAD_THREAD)
        } else {
            f.stage
        };
        l.call = segment | (1 << 31);
        if f.chain != NO_CHAIN && e.action == Action::Alloc {
            let ordinals = layers.step(&chains[f.chain as usize], segment);
            marks.push((i, f.chain, ordinals));
        }
        if l.detail == super::NameId::default() {
            if let Some(node) = frames::autograd_node(snap, e.stack) {
                l.detail = names.intern(&node);
            } else {
                // the compiled region (torch.compile with compile_context=True)
                let context = snap.str(e.compile_context);
                if !context.is_empty() && context != "N/A" {
                    l.detail = names.intern(context);
                }
            }
        }
    }
    // Layers of loops: the outermost method called from a loop gets its ordinal.
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
        labels[i].stage = names.intern(&c.render(&shown));
        if let Some(&k) = ordinals.get(d) {
            labels[i].layer = k;
        }
    }
    counts
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
}

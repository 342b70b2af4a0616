//! Memory categories, in the vocabulary of `torch.profiler`'s memory timeline, decided from
//! what each block does over its life, with stacks and PyTorch's own labels as evidence.
//!
//! **Any PyTorch program** (the generic preset). Phases and training steps
//! come first ([`super::generic`]); then each allocation gets the first category that holds:
//!
//! 1. **communication**: collective and FSDP buffers, by frames, op or stage;
//! 2. **activation** (recomputed): allocated while activation checkpointing recomputes;
//! 3. **gradient** by frames: `AccumulateGrad` on the stack;
//! 4. by the phase it was allocated in, and when it was freed:
//!    - *optimizer*: **temporary** when freed inside the same update, else **optimizer state**;
//!    - *backward*: **temporary** when freed inside the same backward; else, when it is never
//!      freed, is not the size of any parameter and the trace runs a later step to the end of
//!      its backward, a **workspace** (cuBLAS keeps one per stream); else a **gradient**
//!      (alive past backward, until the update, `zero_grad` or the end);
//!    - *forward*: **temporary** when freed inside the same forward; a **workspace** when a
//!      workspace's C++ frames say so, or when it outlives a later step's whole backward;
//!      else an **activation** (saved for backward, or an output);
//!    - *outside the phases* (`zero_grad` gives temporaries): **temporary** when freed in the
//!      same stretch of events; **parameter** when its stack sets the model up (`Module.to`,
//!      initialisation, `load_state_dict`) or when it outlives the backward of the step after
//!      the forward it precedes; **input** when its stack moves a batch or it stays alive into
//!      the next forward; else **temporary** or **unknown**.
//!
//! **DualPipeV pipelines** (the pithtrain preset), by op and lifetime:
//! communication for receive buffers and collectives, optimizer state for optimizer
//! allocations alive at the end, gradients from `W` chunks, `AccumulateGrad` and backward
//! allocations alive at the end or freed by the optimizer, activations for forward allocations
//! freed by a later call, temporaries for what a call frees itself.
//!
//! In both, blocks alive before recording started are **pre-existing**, and custom rules
//! ([`super::rules`]) override everything. [`CategorySources`] counts what decided each label.

use serde::Serialize;

use super::{frames, Label, Names, Phase};
use crate::replay::{Replay, NONE};
use crate::snapshot::{Action, Snapshot, TraceEvent};

/// What an allocation is for.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Not determined.
    #[default]
    Unknown,
    /// Alive before the trace started.
    PreExisting,
    /// Parameters and buffers: set up outside forward, backward and the update, and alive
    /// across the training steps that follow.
    Parameter,
    /// Gradients.
    Gradient,
    /// Optimizer state.
    OptimizerState,
    /// Activations saved for backward, and outputs.
    Activation,
    /// Short-lived buffers.
    Temporary,
    /// Communication buffers.
    Communication,
    /// The batch moved to the device before the forward that reads it.
    Input,
    /// Library workspaces (cuBLAS, cuDNN) that outlive the steps that made them.
    Workspace,
}

impl Category {
    /// Every category, in display order.
    pub const ALL: [Category; 10] = [
        Category::PreExisting,
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Input,
        Category::Temporary,
        Category::Workspace,
        Category::Communication,
        Category::Unknown,
    ];

    /// Lower-case name, as in the JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Unknown => "unknown",
            Category::PreExisting => "pre-existing",
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Communication => "communication",
            Category::Input => "input",
            Category::Workspace => "workspace",
        }
    }

    /// Parses a name (as written by [`Category::as_str`], with `_` or `-` for spaces).
    pub fn parse(s: &str) -> Option<Category> {
        let s = s.replace(['_', '-'], " ");
        Category::ALL
            .into_iter()
            .find(|c| c.as_str().replace('-', " ") == s)
    }
}

fn is_comm_text(t: &str) -> bool {
    let t = t.to_ascii_lowercase();
    t.contains("receive buffer")
        || t.contains("all-to-all")
        || t.contains("all_to_all")
        || t.contains("a2a")
        || t.contains("fsdp")
        || t == "recv"
        || t == "send"
}

/// Facts about label texts, computed once per text.
struct NameFacts {
    comm: Vec<bool>,
    weight_op: Vec<bool>,
    accumulate: Vec<bool>,
}

impl NameFacts {
    fn new(names: &Names, count: usize) -> NameFacts {
        let ids = (0..count.min(u16::MAX as usize + 1)).map(|i| super::NameId(i as u16));
        let texts: Vec<&str> = ids.map(|id| names.get(id)).collect();
        NameFacts {
            comm: texts.iter().map(|t| is_comm_text(t)).collect(),
            weight_op: texts
                .iter()
                .map(|t| t.starts_with('W') && t.len() <= 2)
                .collect(),
            accumulate: texts.iter().map(|t| *t == "AccumulateGrad").collect(),
        }
    }

    fn get(v: &[bool], id: super::NameId) -> bool {
        v.get(id.0 as usize).copied().unwrap_or(false)
    }
}

/// Sets the category of every allocation of a pipeline trace (and copies it to the frees that
/// end them).
pub(crate) fn assign_pipeline(
    snap: &Snapshot,
    replay: &Replay,
    names: &Names,
    labels: &mut [Label],
) {
    let events = snap.trace(replay.device);
    let mut stack_cache = frames::PerStack::new(snap);
    let facts = NameFacts::new(names, names.len());
    for i in 0..events.len() {
        if events[i].action != Action::Alloc {
            continue;
        }
        let l = labels[i];
        let free = replay.partner[i];
        let freed = (free != NONE).then(|| labels[free as usize]);
        let same_call = freed.is_some_and(|f| f.call == l.call && l.call != u32::MAX);
        let stack = events[i].stack;
        let (comm, accumulate) = stack_cache.get(stack, || {
            (
                frames::stack_has(snap, stack, frames::COMMUNICATION),
                frames::stack_has(snap, stack, frames::ACCUMULATE_GRAD),
            )
        });
        let weight_grad = accumulate
            || NameFacts::get(&facts.weight_op, l.op)
            || NameFacts::get(&facts.accumulate, l.detail);
        let category = if l.phase == Phase::Communication
            || comm
            || NameFacts::get(&facts.comm, l.stage)
            || NameFacts::get(&facts.comm, l.op)
        {
            Category::Communication
        } else if l.phase == Phase::Optimizer {
            if freed.is_none() {
                Category::OptimizerState
            } else {
                Category::Temporary
            }
        } else if weight_grad {
            Category::Gradient
        } else if l.phase == Phase::Backward {
            match freed {
                None => Category::Gradient,
                Some(f) if f.phase == Phase::Optimizer => Category::Gradient,
                _ => Category::Temporary,
            }
        } else if same_call {
            Category::Temporary
        } else if l.phase == Phase::Forward {
            Category::Activation
        } else {
            Category::Unknown
        };
        labels[i].category = category;
    }
    copy_to_frees(replay, events, labels);
}

/// Gives each free the category of the allocation it ends.
fn copy_to_frees(replay: &Replay, events: &[TraceEvent], labels: &mut [Label]) {
    for i in 0..events.len() {
        if events[i].action != Action::Alloc {
            let p = replay.partner[i];
            if p != NONE && p & crate::replay::PREEXISTING == 0 {
                labels[i].category = labels[p as usize].category;
            } else if p != NONE {
                labels[i].category = Category::PreExisting;
            }
        }
    }
}

/// What decided the categories of a device's allocations, counted over its allocations (and
/// the blocks alive before the trace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CategorySources {
    /// The phase a block was allocated in and when it was freed.
    pub lifetime: u64,
    /// Frames on its stack (collectives, `AccumulateGrad`, recomputation, model set-up, batch
    /// transfer, library workspaces).
    pub frames: u64,
    /// Custom rules.
    pub rules: u64,
    /// Alive before the trace started.
    pub before_trace: u64,
    /// PyTorch's own labels, preferred to inference: an `annotate` entry
    /// (`_annotate_tensor`) or memory metadata set as a dict (`_set_memory_metadata`) whose
    /// text names a category.
    #[serde(default)]
    pub labels: u64,
    /// Of those, the allocations whose inferred category was another.
    #[serde(default)]
    pub labels_disagreeing: u64,
}

/// The category a label written by the program or by PyTorch names: a category's name
/// (`activation`, `optimizer_state`, `optimizer state`), PyTorch's component names (`temp`,
/// `buffer`), or a compact JSON object with a `component`, `component_type` or
/// `category` key naming one. `None` for any other text.
pub fn named_category(text: &str) -> Option<Category> {
    let text = text.trim();
    if text.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let o = v.as_object()?;
        return ["component", "component_type", "category"]
            .iter()
            .find_map(|k| o.get(*k).and_then(|v| v.as_str()))
            .and_then(named_category);
    }
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "temp" => Some(Category::Temporary),
        "buffer" | "parameters" => Some(Category::Parameter),
        "gradients" | "grad" => Some(Category::Gradient),
        "activations" => Some(Category::Activation),
        _ => Category::parse(&lower)
            .filter(|c| *c != Category::Unknown && *c != Category::PreExisting),
    }
}

/// Applies PyTorch's own labels to the allocations they name, preferred to what inference
/// decided: an `annotate` entry labels the live allocation at its address; an allocation's
/// own memory metadata labels it when it is a dict naming a category. Returns the allocations
/// labelled, and how many of them inference had given another category.
pub(crate) fn apply_labels(
    snap: &Snapshot,
    events: &[TraceEvent],
    labels: &mut [Label],
) -> (Vec<usize>, u64) {
    let mut live: rustc_hash::FxHashMap<u64, usize> = Default::default();
    let mut named: Vec<(usize, Category)> = Vec::new();
    let mut cache: rustc_hash::FxHashMap<u32, Option<Category>> = Default::default();
    let mut of = |id: crate::snapshot::StrId| {
        *cache
            .entry(id.0)
            .or_insert_with(|| named_category(snap.str(id)))
    };
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, i);
                let meta = snap.str(e.user_metadata);
                if meta.starts_with('{') {
                    if let Some(c) = of(e.user_metadata) {
                        named.push((i, c));
                    }
                }
            }
            Action::FreeRequested | Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            Action::Annotate => {
                if let (Some(&j), Some(c)) = (live.get(&e.addr), of(e.user_metadata)) {
                    named.push((j, c));
                }
            }
            _ => {}
        }
    }
    let mut disagree = 0u64;
    let mut done: Vec<usize> = Vec::new();
    let mut labelled = vec![false; if named.is_empty() { 0 } else { labels.len() }];
    for (j, c) in named {
        let Some(l) = labels.get_mut(j) else { continue };
        if !std::mem::replace(&mut labelled[j], true) {
            done.push(j);
            disagree += u64::from(l.category != c);
        }
        l.category = c;
    }
    (done, disagree)
}

/// Where each training step's forward starts and its backward ends, by event index.
struct StepBounds {
    first_forward: Vec<Option<usize>>,
    last_backward: Vec<Option<usize>>,
    /// `(first forward event, step)` of the steps that have a forward, in event order.
    forwards: Vec<(usize, usize)>,
    /// For each step, the end of the backward of the first later step whose backward ends
    /// before the trace does.
    later_backward: Vec<Option<usize>>,
}

impl StepBounds {
    fn new(labels: &[Label]) -> StepBounds {
        let steps = labels
            .iter()
            .map(|l| l.train_step as usize + 1)
            .max()
            .unwrap_or(0);
        let mut first_forward = vec![None; steps];
        let mut last_backward = vec![None; steps];
        for (i, l) in labels.iter().enumerate() {
            let t = l.train_step as usize;
            match l.phase {
                Phase::Forward => {
                    first_forward[t].get_or_insert(i);
                }
                Phase::Backward => last_backward[t] = Some(i),
                _ => {}
            }
        }
        // steps are numbered in event order, so their first forwards increase with the step
        let forwards = first_forward
            .iter()
            .enumerate()
            .filter_map(|(t, f)| f.map(|f| (f, t)))
            .collect();
        let mut later_backward = vec![None; steps];
        let mut found = None;
        for t in (0..steps).rev() {
            later_backward[t] = found;
            if let Some(b) = last_backward[t].filter(|&b| b + 1 < labels.len()) {
                found = Some(b);
            }
        }
        StepBounds {
            first_forward,
            last_backward,
            forwards,
            later_backward,
        }
    }

    /// The first step whose forward starts after event `i`.
    fn next_forward(&self, i: usize) -> Option<usize> {
        let k = self.forwards.partition_point(|&(f, _)| f <= i);
        self.forwards.get(k).map(|&(_, t)| t)
    }

    /// The end of the backward of the first step after `t` that ran its backward to the end
    /// within the trace (some event follows it).
    fn later_backward(&self, t: usize) -> Option<usize> {
        self.later_backward.get(t).copied().flatten()
    }
}

/// Sets the category of every allocation of any PyTorch program from its lifetime (see the
/// module doc) and copies it to the frees that end them.
pub(crate) fn assign_generic(
    snap: &Snapshot,
    replay: &Replay,
    names: &Names,
    labels: &mut [Label],
) -> CategorySources {
    let events = snap.trace(replay.device);
    let n = events.len().min(labels.len());
    let mut sources = CategorySources::default();
    let mut stack_cache = frames::PerStack::new(snap);
    let facts = NameFacts::new(names, names.len());
    let bounds = StepBounds::new(labels);
    // stretches of events with one step, phase and micro-batch
    let mut run = vec![0u32; n];
    for i in 1..n {
        let (a, b) = (&labels[i - 1], &labels[i]);
        let same = a.train_step == b.train_step && a.phase == b.phase && a.mb == b.mb;
        run[i] = run[i - 1] + u32::from(!same);
    }
    // sizes of the parameters and of the blocks alive before the trace: a gradient has its
    // parameter's size
    let mut param_sizes: std::collections::HashSet<u64> =
        replay.preexisting.iter().map(|p| p.requested).collect();
    let mut pending: Vec<usize> = Vec::new();
    for i in 0..n {
        if events[i].action != Action::Alloc {
            continue;
        }
        let l = labels[i];
        let free = replay.partner[i];
        let freed = (free != NONE).then_some(free as usize);
        let fl = freed.map(|f| labels[f]);
        let same_run = freed.is_some_and(|f| run[f] == run[i]);
        let t = l.train_step as usize;
        let stack = events[i].stack;
        let (comm, accumulate) = stack_cache.get(stack, || {
            (
                frames::stack_has(snap, stack, frames::COMMUNICATION),
                frames::stack_has(snap, stack, frames::ACCUMULATE_GRAD),
            )
        });
        let by_frames = |c: Category| (c, true);
        let by_life = |c: Category| (c, false);
        let (category, from_frames) = if l.phase == Phase::Communication
            || comm
            || NameFacts::get(&facts.comm, l.stage)
            || NameFacts::get(&facts.comm, l.op)
        {
            by_frames(Category::Communication)
        } else if names.get(l.op) == "recompute" {
            by_frames(Category::Activation)
        } else if accumulate || NameFacts::get(&facts.accumulate, l.detail) {
            by_frames(Category::Gradient)
        } else if l.hints & super::HINT_WORKSPACE != 0 && freed.is_none() {
            by_frames(Category::Workspace)
        } else {
            match l.phase {
                Phase::Optimizer => by_life(if same_run {
                    Category::Temporary
                } else {
                    Category::OptimizerState
                }),
                Phase::Backward => {
                    let inside = fl.is_some_and(|f| {
                        f.phase == Phase::Backward && f.train_step == l.train_step && f.mb == l.mb
                    });
                    if inside {
                        by_life(Category::Temporary)
                    } else {
                        // a gradient or a workspace, once the parameters' sizes are known
                        pending.push(i);
                        continue;
                    }
                }
                Phase::Forward => by_life(if same_run {
                    Category::Temporary
                } else if bounds
                    .later_backward(t)
                    .is_some_and(|b| freed.is_none_or(|f| f > b))
                {
                    Category::Workspace
                } else {
                    Category::Activation
                }),
                _ if names.get(l.op) == "zero_grad" || same_run => by_life(Category::Temporary),
                _ => {
                    let next = bounds.next_forward(i);
                    // alive past the backward of the step after the forward it precedes
                    let persistent = match (next, freed) {
                        (Some(s), None) => s + 1 < bounds.first_forward.len(),
                        (Some(s), Some(f)) => bounds
                            .last_backward
                            .get(s + 1)
                            .copied()
                            .flatten()
                            .is_some_and(|b| f > b),
                        (None, _) => false,
                    };
                    let into_forward = next.is_some_and(|s| {
                        let ff = bounds.first_forward[s].unwrap_or(usize::MAX);
                        freed.is_none_or(|f| f > ff)
                    });
                    if l.hints & super::HINT_SETUP != 0 {
                        by_frames(Category::Parameter)
                    } else if persistent {
                        by_life(Category::Parameter)
                    } else if l.hints & super::HINT_INPUT != 0 {
                        by_frames(Category::Input)
                    } else if into_forward {
                        by_life(Category::Input)
                    } else if fl.is_some_and(|f| f.train_step == l.train_step) {
                        by_life(Category::Temporary)
                    } else {
                        by_life(Category::Unknown)
                    }
                }
            }
        };
        if category == Category::Parameter {
            param_sizes.insert(events[i].size);
        }
        labels[i].category = category;
        if from_frames {
            sources.frames += 1;
            labels[i].hints |= super::HINT_BY_FRAMES;
        } else {
            sources.lifetime += 1;
        }
    }
    for i in pending {
        let t = labels[i].train_step as usize;
        let free = replay.partner[i];
        let outlives = |b: usize| free == NONE || free as usize > b;
        labels[i].category = if !param_sizes.contains(&events[i].size)
            && bounds.later_backward(t).is_some_and(outlives)
        {
            Category::Workspace
        } else {
            Category::Gradient
        };
        sources.lifetime += 1;
    }
    copy_to_frees(replay, &events[..n], labels);
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in Category::ALL {
            assert_eq!(Category::parse(c.as_str()), Some(c));
        }
        assert_eq!(
            Category::parse("optimizer_state"),
            Some(Category::OptimizerState)
        );
        assert_eq!(Category::parse("pre_existing"), Some(Category::PreExisting));
        assert_eq!(Category::parse("nope"), None);
    }
}

//! Memory categories, in the vocabulary of `torch.profiler`'s memory timeline, decided from
//! what each block does over its life, with stacks and PyTorch's own labels as evidence.
//!
//! **Any PyTorch program** (the generic preset). Phases and training steps come first
//! ([`super::generic`]). Each source of evidence then adds what it knows to a
//! `Ledger`, strongest first: the program's own list of its tensors
//! (`capture`), PyTorch's labels (`apply_labels`), the code that made or freed the
//! block (`code_paths`), and, weakest, the block's life (`add_life`):
//!
//! - made in an *optimizer* update: a **temporary** when freed inside the same update, else
//!   **optimizer state**;
//! - made in a *backward*: a **temporary** when freed inside the same backward; else a
//!   **gradient** when it has the size of a parameter and, where the program drops gradients
//!   (`zero_grad`), it was not kept past a drop; else a **workspace** when it outlives a later
//!   step's backward (cuBLAS keeps one per stream until the program clears them); else
//!   nothing;
//! - made in a *forward*: a **temporary** when freed inside the same forward or before the
//!   backward that follows it (an output dropped once the loss is computed); a **workspace**
//!   when it outlives a later step's whole backward; else an **activation** (saved for
//!   backward, or an output);
//! - made *outside the phases*: a **temporary** when freed in the same stretch of events or in
//!   `zero_grad`; **input** when it stays alive into the next forward; else nothing (a block
//!   kept across steps that no code path names is `unknown`, not a guessed parameter).
//!
//! The ledger decides: the strongest evidence wins, and evidence of one strength that
//! contradicts itself gives **unknown**.
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

use super::evidence::{Evidence, Ledger};

use super::{frames, Labels, Names, Phase};
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

/// Adds the lifetime evidence of every allocation of a pipeline trace to `ledger`: the
/// category its phase, its code and its free give it.
pub(crate) fn assign_pipeline(
    snap: &Snapshot,
    replay: &Replay,
    names: &Names,
    labels: &Labels,
    ledger: &mut Ledger,
) {
    let events = snap.trace(replay.device);
    let facts = NameFacts::new(names, names.len());
    // each allocation's category depends on its own label and its free's alone: ranges of the
    // trace side by side, each with its own cache of what stacks show
    let init = || frames::PerStack::new(snap);
    ledger.add_each(init, |stack_cache, i| {
        let e = events.get(i)?;
        if e.action != Action::Alloc {
            return None;
        }
        let l = labels[i];
        let free = replay.partner[i];
        let freed = (free != NONE).then(|| labels[free as usize]);
        let same_call = freed.is_some_and(|f| f.call == l.call && l.call != u32::MAX);
        let stack = e.stack;
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
        Some((Evidence::Life, category))
    });
}

/// Gives every allocation the category and evidence `ledger` decided for it, and each free
/// those of the allocation it ends (a block from before the trace: `pre-existing`), in one pass
/// over the trace.
pub(crate) fn settle(ledger: &Ledger, replay: &Replay, events: &[TraceEvent], labels: &mut Labels) {
    let is_alloc = |i: usize| events.get(i).is_some_and(|e| e.action == Action::Alloc);
    for (i, e) in events.iter().enumerate().take(labels.len()) {
        if e.action == Action::Alloc {
            if let Some(decided) = ledger.decision(i) {
                labels.update_keyed(i, key(decided), |l| (l.category, l.evidence) = decided);
            }
            continue;
        }
        let p = replay.partner[i];
        if p == NONE {
            continue;
        }
        let of = if p & crate::replay::PREEXISTING != 0 {
            (Category::PreExisting, Evidence::BeforeTrace)
        } else {
            // an allocation after this free has its decision already, as one before it has
            let p = p as usize;
            match ledger.decision(p).filter(|_| is_alloc(p)) {
                Some(decided) => decided,
                None => (labels[p].category, labels[p].evidence),
            }
        };
        labels.update_keyed(i, key(of), |l| (l.category, l.evidence) = of);
    }
}

/// A category and evidence as one number, for [`Labels::update_keyed`].
fn key((category, evidence): (Category, Evidence)) -> u32 {
    (category as u32) << 8 | evidence as u32
}

/// What decided the categories of a device's allocations, counted over its allocations (and
/// the blocks alive before the trace), by the kind of evidence that decided each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CategorySources {
    /// The program's own list of its tensors (`memsnap.Capture`).
    #[serde(default)]
    pub capture: u64,
    /// PyTorch's own labels: an `annotate` entry (`_annotate_tensor`) or memory metadata set
    /// as a dict (`_set_memory_metadata`) whose text names a category.
    #[serde(default)]
    pub labels: u64,
    /// The code PyTorch ran when the block was made or freed.
    #[serde(default)]
    pub code: u64,
    /// The phase a block was made in and when it was freed.
    pub lifetime: u64,
    /// Custom rules.
    pub rules: u64,
    /// Alive before the trace started, nothing else known.
    pub before_trace: u64,
    /// Evidence of equal strength that disagreed: `unknown`.
    #[serde(default)]
    pub conflicting: u64,
    /// No evidence: `unknown`.
    #[serde(default)]
    pub none: u64,
    /// Of the allocations PyTorch's labels named, those whose other evidence said another
    /// category.
    #[serde(default)]
    pub labels_disagreeing: u64,
}

impl CategorySources {
    /// Counts one allocation decided by `evidence`.
    pub(crate) fn count(&mut self, evidence: Evidence) {
        self.count_many(evidence, 1);
    }

    /// Counts `n` allocations decided by `evidence`.
    pub(crate) fn count_many(&mut self, evidence: Evidence, n: u64) {
        let slot = match evidence {
            Evidence::Capture => &mut self.capture,
            Evidence::Label => &mut self.labels,
            Evidence::Code => &mut self.code,
            Evidence::Life => &mut self.lifetime,
            Evidence::Rules => &mut self.rules,
            Evidence::BeforeTrace => &mut self.before_trace,
            Evidence::Conflict => &mut self.conflicting,
            Evidence::None => &mut self.none,
        };
        *slot += n;
    }
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

/// Adds PyTorch's own labels to the evidence of the allocations they name: an `annotate` entry
/// names the live allocation at its address; an allocation's own memory metadata names it when
/// it is a dict naming a category. Returns how many labelled allocations the other evidence
/// so far gave another category.
pub(crate) fn apply_labels(snap: &Snapshot, events: &[TraceEvent], ledger: &mut Ledger) -> u64 {
    let mut named: Vec<(usize, Category)> = Vec::new();
    let mut cache: rustc_hash::FxHashMap<u32, Option<Category>> = Default::default();
    let mut of = |id: crate::snapshot::StrId| {
        *cache
            .entry(id.0)
            .or_insert_with(|| named_category(snap.str(id)))
    };
    // what an allocation's own metadata (a dict) names, once per distinct set of extra fields
    // (index 0: an entry without any)
    let by_extra: Vec<Option<Category>> = std::iter::once(crate::snapshot::EventExtra::default())
        .chain(snap.event_extras.iter().copied())
        .map(|x| {
            snap.str(x.user_metadata)
                .starts_with('{')
                .then(|| of(x.user_metadata))
                .flatten()
        })
        .collect();
    let extra_names = |e: &TraceEvent| *by_extra.get(e.extra as usize).unwrap_or(&by_extra[0]);
    // The allocation alive at each address, for the annotations: kept only once the trace is
    // known to have one (most have none), so meeting the first starts the walk again keeping it.
    let mut live: Option<rustc_hash::FxHashMap<u64, usize>> = None;
    'walk: loop {
        for (i, e) in events.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    if let Some(live) = &mut live {
                        live.insert(e.addr, i);
                    }
                    if let Some(c) = extra_names(e) {
                        named.push((i, c));
                    }
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    if let Some(live) = &mut live {
                        live.remove(&e.addr);
                    }
                }
                Action::Annotate => {
                    let Some(live) = &live else {
                        live = Some(Default::default());
                        named.clear();
                        continue 'walk;
                    };
                    if let (Some(&j), Some(c)) =
                        (live.get(&e.addr), of(snap.extra(e).user_metadata))
                    {
                        named.push((j, c));
                    }
                }
                _ => {}
            }
        }
        break;
    }
    let mut disagree = 0u64;
    let mut seen = rustc_hash::FxHashSet::default();
    for (j, c) in named {
        if seen.insert(j) {
            disagree += u64::from(ledger.current(j).is_some_and(|(other, _)| other != c));
        }
        ledger.add(j, Evidence::Label, c);
    }
    disagree
}

/// Where each training step's backward ends, by event index.
struct StepBounds {
    /// For each step, the end of the backward of the first later step whose backward ends
    /// before the trace does.
    later_backward: Vec<Option<usize>>,
}

impl StepBounds {
    fn new(labels: &Labels) -> StepBounds {
        let steps = labels
            .iter()
            .map(|l| l.train_step as usize + 1)
            .max()
            .unwrap_or(0);
        let mut last_backward = vec![None; steps];
        for (i, l) in labels.iter().enumerate() {
            if l.phase == Phase::Backward {
                last_backward[l.train_step as usize] = Some(i);
            }
        }
        let mut later_backward = vec![None; steps];
        let mut found = None;
        for t in (0..steps).rev() {
            later_backward[t] = found;
            if let Some(b) = last_backward[t].filter(|&b| b + 1 < labels.len()) {
                found = Some(b);
            }
        }
        StepBounds { later_backward }
    }

    /// The end of the backward of the first step after `t` that ran its backward to the end
    /// within the trace (some event follows it).
    fn later_backward(&self, t: usize) -> Option<usize> {
        self.later_backward.get(t).copied().flatten()
    }
}

/// Stretches of events of one step, phase and micro-batch: `run[i]` numbers event `i`'s.
pub(crate) fn runs(labels: &Labels) -> Vec<u32> {
    let mut run = vec![0u32; labels.len()];
    for i in 1..labels.len() {
        let (a, b) = (&labels[i - 1], &labels[i]);
        let same = a.train_step == b.train_step && a.phase == b.phase && a.mb == b.mb;
        run[i] = run[i - 1] + u32::from(!same);
    }
    run
}

/// Adds the evidence of every allocation of any PyTorch program from its life (see the module
/// doc): the weakest, used where nothing stronger speaks. Runs after the stronger sources, whose
/// parameters give the sizes a gradient may have and whose `zero_grad` frees say when the
/// program drops its gradients.
pub(crate) fn add_life(
    snap: &Snapshot,
    replay: &Replay,
    names: &Names,
    labels: &Labels,
    run: &[u32],
    ledger: &mut Ledger,
) {
    let events = snap.trace(replay.device);
    let n = events.len().min(labels.len());
    let facts = NameFacts::new(names, names.len());
    let bounds = StepBounds::new(labels);
    // where each stretch of forward events starts
    let forward_starts: Vec<usize> = (0..n)
        .filter(|&i| labels[i].phase == Phase::Forward && (i == 0 || run[i - 1] != run[i]))
        .collect();
    // where each stretch of backward events starts: a forward's block freed before the
    // backward that follows it was no activation saved for it (an output dropped once the
    // loss is computed)
    let backward_starts: Vec<usize> = (0..n)
        .filter(|&i| labels[i].phase == Phase::Backward && (i == 0 || run[i - 1] != run[i]))
        .collect();
    let dropped_before_backward = |i: usize, freed: Option<usize>| {
        let k = backward_starts.partition_point(|&b| b <= i);
        match (backward_starts.get(k), freed) {
            (Some(&b), Some(f)) => f < b && labels[b].train_step == labels[i].train_step,
            _ => false,
        }
    };
    // a gradient has its parameter's size: the parameters the evidence found, or (with none
    // found) the blocks alive before the trace
    let mut param_sizes: rustc_hash::FxHashSet<u64> = Default::default();
    // where the program dropped the gradients made in each stretch (`zero_grad` freeing them):
    // stretch → the first such free
    let mut drops: rustc_hash::FxHashMap<u32, usize> = Default::default();
    for i in 0..n {
        if events[i].action != Action::Alloc {
            continue;
        }
        match ledger.current(i) {
            Some((Category::Parameter, _)) => {
                param_sizes.insert(events[i].size);
            }
            Some((Category::Gradient, Evidence::Code | Evidence::Capture)) => {
                let f = replay.partner[i];
                if f != NONE {
                    let d = drops.entry(run[i]).or_insert(f as usize);
                    *d = (*d).min(f as usize);
                }
            }
            _ => {}
        }
    }
    if param_sizes.is_empty() {
        param_sizes.extend(replay.preexisting.iter().map(|p| p.requested));
    }
    for i in 0..n {
        if events[i].action != Action::Alloc {
            continue;
        }
        let l = labels[i];
        let free = replay.partner[i];
        let freed = (free != NONE).then_some(free as usize);
        let fl = freed.filter(|&f| f < n).map(|f| labels[f]);
        let same_run = freed.is_some_and(|f| f < n && run[f] == run[i]);
        let t = l.train_step as usize;
        let outlives_later_backward = || {
            bounds
                .later_backward(t)
                .is_some_and(|b| freed.is_none_or(|f| f > b))
        };
        let category = if l.phase == Phase::Communication
            || NameFacts::get(&facts.comm, l.stage)
            || NameFacts::get(&facts.comm, l.op)
        {
            Some(Category::Communication)
        } else if NameFacts::get(&facts.accumulate, l.detail) {
            Some(Category::Gradient)
        } else {
            match l.phase {
                Phase::Optimizer => Some(if same_run {
                    Category::Temporary
                } else {
                    Category::OptimizerState
                }),
                Phase::Backward => {
                    let inside = fl.is_some_and(|f| {
                        f.phase == Phase::Backward && f.train_step == l.train_step && f.mb == l.mb
                    });
                    // kept past the `zero_grad` that dropped the gradients made beside it
                    let kept_past_drop = drops
                        .get(&run[i])
                        .is_some_and(|&d| freed.is_none_or(|f| f > d));
                    if inside {
                        Some(Category::Temporary)
                    } else if param_sizes.contains(&events[i].size) && !kept_past_drop {
                        Some(Category::Gradient)
                    } else if outlives_later_backward() {
                        // alive across a later step's whole backward, not a parameter's size
                        Some(Category::Workspace)
                    } else {
                        None
                    }
                }
                Phase::Forward => Some(if same_run || dropped_before_backward(i, freed) {
                    Category::Temporary
                } else if outlives_later_backward() {
                    Category::Workspace
                } else {
                    Category::Activation
                }),
                _ if names.get(l.op) == "zero_grad" || same_run => Some(Category::Temporary),
                _ => {
                    // alive into the next forward (a micro-batch's, or the next step's)
                    let k = forward_starts.partition_point(|&f| f <= i);
                    let into_forward = forward_starts
                        .get(k)
                        .is_some_and(|&ff| freed.is_none_or(|f| f > ff));
                    if into_forward {
                        Some(Category::Input)
                    } else if fl.is_some_and(|f| f.train_step == l.train_step) {
                        Some(Category::Temporary)
                    } else {
                        None
                    }
                }
            }
        };
        if let Some(c) = category {
            ledger.add(i, Evidence::Life, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What PyTorch's labels name, found the plain way: every allocation's own dict metadata,
    /// and each annotation's text for the allocation alive at its address.
    fn labels_by_hand(snap: &Snapshot, events: &[TraceEvent]) -> Vec<(usize, Category)> {
        let mut live = std::collections::HashMap::new();
        let mut named = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let text = snap.str(snap.extra(e).user_metadata);
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, i);
                    if let Some(c) = named_category(text).filter(|_| text.starts_with('{')) {
                        named.push((i, c));
                    }
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    live.remove(&e.addr);
                }
                Action::Annotate => {
                    if let (Some(&j), Some(c)) = (live.get(&e.addr), named_category(text)) {
                        named.push((j, c));
                    }
                }
                _ => {}
            }
        }
        named
    }

    #[test]
    fn pytorchs_labels_name_what_a_plain_walk_names() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/snapshots/constructed/annotated.pickle.xz");
        let mut snap = crate::snapshot::load(&path, &Default::default()).unwrap();
        for annotations in [true, false] {
            if !annotations {
                // the same trace without its annotations: the dict metadata alone
                for t in &mut snap.traces {
                    t.retain(|e| e.action != Action::Annotate);
                }
            }
            let events = snap.trace(0);
            let expected = labels_by_hand(&snap, events);
            let annotated = expected.iter().filter(|&&(i, _)| {
                !snap
                    .str(snap.extra(&events[i]).user_metadata)
                    .starts_with('{')
            });
            assert_eq!(annotated.count() > 0, annotations, "{expected:?}");
            assert!(!expected.is_empty());
            let mut ledger = Ledger::new(events.len());
            apply_labels(&snap, events, &mut ledger);
            let mut by_hand = Ledger::new(events.len());
            for &(i, c) in &expected {
                by_hand.add(i, Evidence::Label, c);
            }
            for i in 0..events.len() {
                assert_eq!(ledger.current(i), by_hand.current(i), "event {i}");
            }
        }
    }

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

//! Attribute: every allocation to its pipeline step, op, micro-batch, layer stage and category.
//!
//! Labels come from rules over allocation stacks, compiled once per distinct stack:
//!
//! - the **pithtrain** preset ([`pipeline`]), chosen when frames of `DualPipeV.step` appear:
//!   the line of the `step` frame gives the pipeline step (from the `# Step N` comments of the
//!   source when it is at hand, otherwise inferred from the trace and the schedule model in
//!   [`schedule`]); the function it calls gives the op and, with the schedule, the phase and
//!   micro-batch; frames below give the layer stage;
//! - the **generic** preset ([`generic`]) for any other PyTorch program: forward, backward,
//!   optimizer, FSDP and activation checkpointing from PyTorch's own frames, and
//!   `record_function` ranges from the snapshot's annotations;
//! - **custom rules** from a TOML file ([`rules`]), which override both.
//!
//! Events without a usable stack (backward runs on the autograd thread, whose allocations have
//! no Python frames) are placed by time: they inherit the step, op and micro-batch of the call
//! that was running on the main thread. Frees need no labels of their own:
//! [`crate::replay::Replay::partner`] links each to its allocation.
//!
//! Categories come from evidence, each source in a module of its own that only adds what it
//! saw to an `evidence::Ledger`: the program's own list of its tensors (`capture`),
//! PyTorch's labels (`category::apply_labels`), the code PyTorch ran when a block was made or
//! freed (`code_paths`), and the block's life over the phases ([`category`]). The ledger is
//! the one place that decides: the strongest evidence wins, evidence of one strength that
//! contradicts itself gives `unknown`, and every label keeps the kind of evidence that decided
//! it ([`Evidence`]).
//!
//! Every event gets one [`Label`]; a long trace keeps each distinct label once ([`labels`]).

mod capture;
pub mod category;
mod code_paths;
pub mod evidence;
pub mod frames;
pub mod generic;
mod infer;
pub mod labels;
pub mod modules;
pub mod pipeline;
pub mod rules;
pub mod schedule;
pub mod source;

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::replay::{PreviewSoon, Replay};
use crate::snapshot::{Action, Snapshot};

pub use category::Category;
pub use evidence::Evidence;
pub use labels::Labels;
pub use schedule::Shape;

/// Index of a label text in [`Names`]; 0 is the empty label. Sixteen bits keep a per-event
/// label small; a program with more than 65,535 distinct label texts gets the last one
/// (`(too many labels)`) for the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameId(pub u16);

/// Interned label texts.
#[derive(Clone, Debug)]
pub struct Names {
    texts: Vec<String>,
    index: HashMap<String, NameId>,
}

impl Default for Names {
    fn default() -> Self {
        let mut n = Names {
            texts: Vec::new(),
            index: HashMap::new(),
        };
        n.intern("");
        n
    }
}

impl Names {
    /// Interns a label.
    pub fn intern(&mut self, s: &str) -> NameId {
        if let Some(&id) = self.index.get(s) {
            return id;
        }
        if self.texts.len() >= u16::MAX as usize {
            return self.intern_overflow();
        }
        let id = NameId(self.texts.len() as u16);
        self.texts.push(s.to_string());
        self.index.insert(s.to_string(), id);
        id
    }

    fn intern_overflow(&mut self) -> NameId {
        const TOO_MANY: &str = "(too many labels)";
        if let Some(&id) = self.index.get(TOO_MANY) {
            return id;
        }
        let id = NameId(u16::MAX);
        while self.texts.len() <= u16::MAX as usize {
            self.texts.push(TOO_MANY.to_string());
        }
        self.index.insert(TOO_MANY.to_string(), id);
        id
    }

    /// Number of labels (the empty one included).
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// True when only the empty label exists.
    pub fn is_empty(&self) -> bool {
        self.texts.len() <= 1
    }

    /// The id of a text, when it was interned.
    pub fn find(&self, s: &str) -> Option<NameId> {
        self.index.get(s).copied()
    }

    /// The text of a label.
    pub fn get(&self, id: NameId) -> &str {
        self.texts.get(id.0 as usize).map_or("", |s| s)
    }
}

/// Broad phase of training an event belongs to.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Not known.
    #[default]
    Other,
    /// Forward computation.
    Forward,
    /// Backward computation (input or weight gradients).
    Backward,
    /// Optimizer step.
    Optimizer,
    /// Communication (p2p, collectives).
    Communication,
    /// Setting the program up before its first step: building the model and the optimizer,
    /// moving them to the device, loading weights.
    Setup,
    /// After the last step, once the code that ran the steps has returned: the loop dropping
    /// its last batch, a trainer moving its state off the device.
    WrapUp,
}

impl Phase {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Other => "other",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Communication => "communication",
            Phase::Setup => "set-up",
            Phase::WrapUp => "wrap-up",
        }
    }
}

/// Pipeline step of an event: 1..=8 inside `DualPipeV.step`'s loops.
pub const STEP_NONE: u8 = 0;
/// In `DualPipeV.step` before the `# Step 1` loop.
pub const STEP_BEFORE: u8 = 9;
/// In `DualPipeV.step` after the `# Step 8` loop.
pub const STEP_AFTER: u8 = 10;

/// No micro-batch.
pub const NO_MB: u16 = u16::MAX;

/// The labels of one event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Label {
    /// Training step, counted from 0 at the first recorded one.
    pub train_step: u16,
    /// Pipeline step: [`STEP_NONE`], 1..=8, [`STEP_BEFORE`] or [`STEP_AFTER`].
    pub pipe_step: u8,
    /// Forward, backward, optimizer...
    pub phase: Phase,
    /// The op: `F0`, `B1`, `F1&B0`, `W`, `recv`, `forward`, ...
    pub op: NameId,
    /// Micro-batch of the forward (or only) part of the op.
    pub mb: u16,
    /// Micro-batch of the backward part of an overlapped op.
    pub mb_backward: u16,
    /// Layer stage or other place in the model.
    pub stage: NameId,
    /// Layer ordinal within its chunk (counted at stage-1 entries), or `u16::MAX`.
    pub layer: u16,
    /// Extra detail, such as the autograd node of a backward allocation.
    pub detail: NameId,
    /// Memory category.
    pub category: Category,
    /// Innermost `record_function` range active at the event.
    pub annotation: NameId,
    /// Index of the call (pipeline) or phase segment (generic) the event ran in.
    pub call: u32,
    /// What decided the category.
    pub evidence: Evidence,
    /// Facts of the event for later stages ([`CONTINUED_FREE`]).
    pub flags: u8,
}

/// A free on the program's main thread whose own stack names no phase, which took the phase
/// of the events before it.
pub const CONTINUED_FREE: u8 = 1;
/// An event whose stack names no phase, which took the phase of the events before it (the
/// loss computed by the program between a forward and its backward).
pub const CONTINUED: u8 = 2;

impl Label {
    /// A label that says nothing yet: no step, op, micro-batch, layer or call.
    pub const EMPTY: Label = Label {
        train_step: 0,
        pipe_step: STEP_NONE,
        phase: Phase::Other,
        op: NameId(0),
        mb: NO_MB,
        mb_backward: NO_MB,
        stage: NameId(0),
        layer: u16::MAX,
        detail: NameId(0),
        category: Category::Unknown,
        annotation: NameId(0),
        call: u32::MAX,
        evidence: Evidence::None,
        flags: 0,
    };

    /// The label of a block that was alive before the first recorded event.
    pub const BEFORE_TRACE: Label = Label {
        category: Category::PreExisting,
        evidence: Evidence::BeforeTrace,
        ..Label::EMPTY
    };

    /// Whether this labels a block alive before the first recorded event (as opposed to one
    /// recorded in the trace whose category rules called it pre-existing), whatever category
    /// the evidence later gave it.
    pub fn is_before_trace(&self) -> bool {
        self.call == u32::MAX && self.evidence != Evidence::None
    }
}

/// The stage of backward allocations made on the autograd thread (their node, when the stack
/// names it, is the label's detail).
pub const AUTOGRAD_THREAD: &str = "backward (autograd thread)";

/// Which rule set labelled a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// DualPipeV pipelines (pithtrain).
    Pithtrain,
    /// Any other PyTorch program.
    Generic,
}

/// How pipeline steps were found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "from")]
pub enum StepSource {
    /// From the `# Step N` comments of this file.
    Source {
        /// Path of the file that was read.
        file: String,
    },
    /// Inferred from the order of call sites and the schedule model.
    Inferred,
}

/// What the pithtrain preset found.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct PipelineInfo {
    /// Something the user should know about how steps were found.
    pub note: Option<String>,
    /// Where the step regions came from.
    pub steps_from: StepSource,
    /// Pipeline shape, when it could be inferred.
    pub shape: Option<Shape>,
    /// Whether `shape.chunks` is the number of micro-batches: a trace cut short in step 4
    /// (an out-of-memory error) shows only a lower bound.
    pub chunks_known: bool,
    /// Loop iterations of steps 1..=8 (index 0 = step 1), for each step that ran to its end
    /// and whose count the schedule fixes (a trace cut short early may leave the shape open
    /// but still fix the counts of its first steps).
    #[serde(default)]
    pub iterations: [Option<u32>; 8],
    /// The step a trace cut short by an out-of-memory error stopped in.
    #[serde(default)]
    pub cut_in: Option<u8>,
    /// `(step, first line, last line)` of each step region of `step()`.
    pub regions: Vec<(u8, u32, u32)>,
    /// Recorded path of the file defining `DualPipeV.step`.
    pub file: String,
}

/// Options for attribution.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Folders where source files are looked up (see [`source`]).
    pub source_roots: Vec<PathBuf>,
    /// Also read source files at the paths the snapshot records (see [`source`]).
    pub recorded_sources: bool,
    /// Force a preset instead of choosing by the frames present.
    pub preset: Option<Preset>,
    /// Custom rules that override the preset.
    pub rules: Option<rules::RuleSet>,
}

/// The labels of one device's trace.
#[derive(Clone, Debug)]
pub struct Attribution {
    /// Device ordinal.
    pub device: u32,
    /// The preset used.
    pub preset: Preset,
    /// One label per trace event (for frees: the label of the event itself, by time).
    pub labels: Labels,
    /// Labels of the blocks alive before the trace ([`Replay::preexisting`]).
    pub preexisting: Labels,
    /// Label texts.
    pub names: Names,
    /// Pipeline details when the pithtrain preset was used.
    pub pipeline: Option<PipelineInfo>,
    /// Where the phases of events outside a pipeline came from.
    pub phase_sources: generic::PhaseSources,
    /// What decided the categories (generic preset; zero for pipelines).
    pub category_sources: category::CategorySources,
    /// Optimizer updates that allocated and freed nothing, in event order.
    pub quiet: Vec<generic::QuietPhase>,
    /// What the program's own list of its tensors gave, when one lay beside the file.
    pub capture: Option<CaptureInfo>,
    /// The program's own number of each training step (index: `train_step`), when
    /// `memsnap.Capture` wrote them; empty otherwise.
    pub step_numbers: Vec<i64>,
}

/// What `memsnap.Capture`'s list of the program's tensors gave the attribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CaptureInfo {
    /// Blocks the list named (each once).
    pub blocks: usize,
    /// Listed storages with no block of their address and bytes alive at the moment listed.
    pub unmatched: usize,
    /// The cap the allocator enforced, as the program read it.
    pub allowed_bytes: Option<u64>,
}

impl Attribution {
    /// Text of a pipeline step or generic phase, for tables: `step 4`, `before step 1`,
    /// `optimizer`, ... (with a training-step prefix when the trace spans several).
    pub fn step_text(&self, l: &Label, multi_step: bool) -> String {
        let base = match l.pipe_step {
            STEP_NONE if l.is_before_trace() => return "before the trace".to_string(),
            STEP_NONE if matches!(l.phase, Phase::Setup | Phase::WrapUp) => {
                return l.phase.as_str().to_string()
            }
            STEP_NONE if l.phase == Phase::Other && self.names.get(l.op) == "zero_grad" => {
                "zero_grad".to_string()
            }
            STEP_NONE if self.preset == Preset::Generic && l.mb != NO_MB => {
                format!("{} mb {}", l.phase.as_str(), l.mb)
            }
            STEP_NONE => l.phase.as_str().to_string(),
            STEP_BEFORE => "before step 1".to_string(),
            STEP_AFTER => "after step 8".to_string(),
            n => format!("step {n}"),
        };
        if multi_step {
            format!("train step {} · {base}", self.step_number(l.train_step))
        } else {
            base
        }
    }

    /// Text of an op with its micro-batches: `F1&B0 mb 3/0`, `F0 mb 2`, `backward`.
    pub fn op_text(&self, l: &Label) -> String {
        let op = self.names.get(l.op);
        match (l.mb, l.mb_backward) {
            (NO_MB, _) => op.to_string(),
            (f, NO_MB) => format!("{op} mb {f}"),
            (f, b) => format!("{op} mb {f}/{b}"),
        }
    }

    /// The number a training step is shown with: the program's own (from `memsnap.Capture`)
    /// where it gave them, else counted from 0 at the first recorded step.
    pub fn step_number(&self, train_step: u16) -> i64 {
        self.step_numbers
            .get(train_step as usize)
            .copied()
            .unwrap_or(train_step as i64)
    }

    /// Whether the trace spans more than one training step.
    pub fn multi_step(&self) -> bool {
        self.labels.iter().any(|l| l.train_step > 0)
    }
}

/// Labels every event of one replayed device.
pub fn attribute(snap: &Snapshot, replay: &Replay, options: &Options) -> Attribution {
    label(snap, &PreviewSoon::ready(replay.preview()), options).finish(snap, replay, options)
}

/// Events labelled with their steps, ops, phases and stages, before the replay's lifetimes
/// give them categories ([`Labelled::finish`]). Needs only what is known before the replay
/// runs, so it can be made while it runs.
#[derive(Debug)]
pub struct Labelled {
    device: u32,
    preset: Preset,
    labels: Labels,
    names: Names,
    pipeline: Option<PipelineInfo>,
    phase_sources: generic::PhaseSources,
    quiet: Vec<generic::QuietPhase>,
    step_numbers: Vec<i64>,
}

/// Labels every event of one device with its step, op, phase and stage (everything but the
/// category, which needs the replay).
pub fn label(snap: &Snapshot, preview: &PreviewSoon, options: &Options) -> Labelled {
    let events = snap.trace(preview.device());
    let mut names = Names::default();
    let mut labels = Labels::filled(
        Label {
            call: 0,
            ..Label::EMPTY
        },
        events.len(),
    );
    let mut info = None;
    let mut sources =
        source::SourceFiles::new(options.source_roots.clone(), options.recorded_sources);
    // The pipeline labelling finds no DualPipeV call (and leaves the labels alone) where the
    // program has none, so trying it is also how the preset is detected.
    if options.preset != Some(Preset::Generic) {
        info = pipeline::label(snap, preview, &mut sources, &mut names, &mut labels);
    }
    let preset = if info.is_some() {
        Preset::Pithtrain
    } else {
        Preset::Generic
    };
    let phase_sources = generic::label(
        snap,
        preview,
        &mut sources,
        &mut names,
        &mut labels,
        preset == Preset::Generic,
    );
    // the program's own steps, where it wrote them: their times decide the training steps
    let step_numbers = match &snap.capture {
        Some(c)
            if preset == Preset::Generic && c.device == preview.device() && !c.steps.is_empty() =>
        {
            generic::program_steps(events, &mut labels, &c.steps)
        }
        _ => Vec::new(),
    };
    Labelled {
        device: preview.device(),
        preset,
        labels,
        names,
        pipeline: info,
        phase_sources,
        quiet: generic::quiet_phases(snap, preview.device()),
        step_numbers,
    }
}

impl Labelled {
    /// Gives every event and every block from before the trace its category, then applies the
    /// custom rules: the attribution of the device `replay` replayed.
    pub fn finish(self, snap: &Snapshot, replay: &Replay, options: &Options) -> Attribution {
        debug_assert_eq!(self.device, replay.device);
        let Labelled {
            device,
            preset,
            mut labels,
            mut names,
            pipeline,
            phase_sources,
            quiet,
            step_numbers,
        } = self;
        let mut preexisting = Labels::filled(Label::BEFORE_TRACE, replay.preexisting.len());
        let events = snap.trace(device);
        if preset == Preset::Generic {
            let other = names.intern(Phase::Other.as_str());
            generic::frees_outside_phases(snap, replay, &mut labels, other);
        }
        let is_alloc = |i: usize| events.get(i).is_some_and(|e| e.action == Action::Alloc);
        // every source adds its evidence; the ledger decides
        let mut ledger = evidence::Ledger::new(labels.len());
        match preset {
            Preset::Pithtrain => {
                category::assign_pipeline(snap, replay, &names, &labels, &mut ledger);
            }
            Preset::Generic => {
                let run = category::runs(&labels);
                code_paths::add(snap, replay, &names, &labels, &run, &mut ledger);
                category::add_life(snap, replay, &names, &labels, &run, &mut ledger);
            }
        }
        let captured = snap.capture.as_ref().map(|c| {
            capture::add(
                snap,
                replay,
                c,
                &mut names,
                &mut labels,
                &mut preexisting,
                &mut ledger,
            )
        });
        let disagreeing = category::apply_labels(snap, events, &mut ledger);
        category::settle(&ledger, replay, events, &mut labels);
        if let Some(rules) = &options.rules {
            let before: Vec<Category> = labels.iter().map(|l| l.category).collect();
            let before_pre: Vec<Category> = preexisting.iter().map(|l| l.category).collect();
            rules.apply(snap, replay, &mut names, &mut labels, &mut preexisting);
            for (i, b) in before.into_iter().enumerate() {
                if labels[i].category != b {
                    labels.update(i, |l| l.evidence = Evidence::Rules);
                }
            }
            for (k, b) in before_pre.into_iter().enumerate() {
                if preexisting[k].category != b {
                    preexisting.update(k, |l| l.evidence = Evidence::Rules);
                }
            }
        }
        let mut category_sources = category::CategorySources {
            labels_disagreeing: disagreeing,
            ..Default::default()
        };
        labels.tally(is_alloc, |l, n| category_sources.count_many(l.evidence, n));
        for l in &preexisting {
            category_sources.count(l.evidence);
        }
        let capture = captured.map(|m| CaptureInfo {
            blocks: m.blocks,
            unmatched: m.unmatched,
            allowed_bytes: snap.capture.as_ref().and_then(|c| c.allowed_bytes),
        });
        if std::env::var_os("MEMSNAP_DEBUG_LABELS").is_some() {
            eprintln!(
                "labels: {} events, {} stored",
                labels.len(),
                labels.stored()
            );
        }
        Attribution {
            device,
            preset,
            labels,
            preexisting,
            names,
            pipeline,
            phase_sources,
            category_sources,
            quiet,
            capture,
            step_numbers,
        }
    }
}

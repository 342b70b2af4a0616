//! Programs nobody here wrote, recorded with their own truth (`testdata/record/programs.py`):
//! a Lightning Trainer with automatic and with manual optimization (timm ViT, bf16-mixed), a
//! transformers `Trainer` with gradient accumulation, an accelerate loop, PEFT LoRA, a
//! torchvision resnet50 with AMP and `GradScaler` over six steps of different sizes, and a
//! `torch.compile`d Llama with fused AdamW.
//!
//! At each phase boundary the program left an empty `record_function` mark in the snapshot and
//! printed `memory_allocated()` and the addresses of its parameters, gradients, optimizer
//! state and saved activations. These tests find each mark in the trace and check memsnap's
//! replay, step table and categories against what the program printed.

use std::collections::HashMap;
use std::path::Path;

use memsnap::analysis::breakdown::{step_table, StepRow};
use memsnap::attribute::{Attribution, Category};
use memsnap::replay::Replay;
use memsnap::snapshot::{Action, Snapshot, Stage};

use crate::util::testdata;

const PROGRAMS: [&str; 9] = [
    "lightning_auto",
    "lightning_manual",
    "hf_trainer",
    "accelerate",
    "peft_lora",
    "resnet_amp",
    "compile_fused",
    "oom_survived",
    "metadata_stages",
];

/// One printed mark, placed in the trace.
pub(crate) struct Mark {
    pub(crate) step: u32,
    pub(crate) name: String,
    pub(crate) allocated: u64,
    /// `param`, `grad`, `optimizer_state`, `saved_activation`, `input` → storage addresses.
    pub(crate) ptrs: HashMap<String, Vec<u64>>,
    /// Index of the first event after the mark.
    pub(crate) at: usize,
}

/// A recorded program: its snapshot analysed, and its log's marks placed in the trace.
pub(crate) struct Program {
    pub(crate) snap: Snapshot,
    pub(crate) replay: Replay,
    pub(crate) a: Attribution,
    pub(crate) rows: Vec<StepRow>,
    pub(crate) marks: Vec<Mark>,
}

fn load(name: &'static str) -> Program {
    let p = load_in("snapshots/programs", name);
    assert!(p.marks.len() >= 8, "{name}: {} marks", p.marks.len());
    p
}

/// `memory_snapshot_NAME.pickle.xz` and `NAME.log` of a folder of `testdata/`.
pub(crate) fn load_in(folder: &str, name: &str) -> Program {
    let dir = testdata(folder);
    let snap = Snapshot::open(&dir.join(format!("memory_snapshot_{name}.pickle.xz"))).unwrap();
    let replay = memsnap::replay::replay(&snap, 0, Default::default());
    let a = memsnap::attribute::attribute(&snap, &replay, &Default::default());
    let rows = step_table(&snap, &replay, &a);
    let marks = marks(&snap, &dir.join(format!("{name}.log")));
    assert!(!marks.is_empty(), "{name}: no marks");
    Program {
        snap,
        replay,
        a,
        rows,
        marks,
    }
}

/// The marks of a log, each matched with its `memsnap.mark/STEP/NAME` annotation.
fn marks(snap: &Snapshot, log: &Path) -> Vec<Mark> {
    let mut stamps: Vec<(i64, String)> = snap
        .annotations
        .iter()
        .filter(|a| a.stage == Stage::Start)
        .filter_map(|a| {
            let n = snap.str(a.name);
            n.strip_prefix("memsnap.mark/")
                .map(|rest| (a.time_us, rest.to_string()))
        })
        .collect();
    stamps.sort();
    let events = snap.trace(0);
    let mut out: Vec<Mark> = Vec::new();
    let field = |line: &str, key: &str| -> String {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} in {line}"))
            .to_string()
    };
    for line in std::fs::read_to_string(log).unwrap().lines() {
        if line.starts_with("MARK ") {
            let (step, name) = (field(line, "step="), field(line, "name="));
            let (time, stamp) = &stamps[out.len()];
            assert_eq!(stamp, &format!("{step}/{name}"), "{}", log.display());
            let at = events.partition_point(|e| e.time_us <= *time);
            assert!(
                at == 0 || events[at - 1].time_us < *time,
                "an event shares the mark's microsecond: {line}"
            );
            out.push(Mark {
                step: step.parse().unwrap(),
                name,
                allocated: field(line, "memory_allocated=").parse().unwrap(),
                ptrs: HashMap::new(),
                at,
            });
        } else if let Some(rest) = line.strip_prefix("PTRS ") {
            let kind = field(rest, "kind=");
            let list = rest.split_whitespace().nth(3).unwrap_or("");
            let ptrs = list
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| u64::from_str_radix(s, 16).unwrap())
                // an empty tensor's storage has no block
                .filter(|&a| a != 0)
                .collect();
            out.last_mut().unwrap().ptrs.insert(kind, ptrs);
        }
    }
    assert_eq!(out.len(), stamps.len(), "{}", log.display());
    out
}

impl Program {
    /// Allocated bytes just before event `at`.
    pub(crate) fn allocated_before(&self, at: usize) -> u64 {
        if at == 0 {
            self.replay.start.allocated
        } else {
            self.replay.allocated[at - 1]
        }
    }

    /// The live allocations before event `at`: address → (requested bytes, category).
    pub(crate) fn live_before(&self, at: usize) -> HashMap<u64, (u64, Category)> {
        let mut live = HashMap::new();
        for (i, e) in self.snap.trace(0)[..at].iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, (e.size, self.a.labels[i].category));
                }
                Action::FreeRequested => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        live
    }

    /// Bytes of category `c` live before event `at`.
    fn category_bytes(&self, at: usize, c: Category) -> u64 {
        let live = self.live_before(at);
        live.values().filter(|v| v.1 == c).map(|v| v.0).sum()
    }

    pub(crate) fn row_phase<'a>(&self, row: &'a StepRow) -> &'a str {
        let base = row.label.rsplit(" · ").next().unwrap();
        base.split(" mb ").next().unwrap()
    }
}

/// Requested bytes of the live blocks at these addresses.
fn held_bytes(live: &HashMap<u64, (u64, Category)>, ptrs: &[u64]) -> u64 {
    ptrs.iter().filter_map(|a| live.get(a)).map(|v| v.0).sum()
}

/// The kinds of a mark and the category memsnap must give them, with the tolerance.
const KINDS: [(&str, Category, f64); 4] = [
    ("param", Category::Parameter, 0.01),
    ("grad", Category::Gradient, 0.01),
    ("optimizer_state", Category::OptimizerState, 0.01),
    ("saved_activation", Category::Activation, 0.05),
];

fn within(got: u64, want: u64, share: f64) -> bool {
    // a block of slack for the few bytes-sized tensors (loss scalars, step counters)
    (got as f64 - want as f64).abs() <= want as f64 * share + 64.0 * 1024.0
}

/// At every mark, the replay's allocated bytes are what the program printed, to the byte.
#[test]
fn every_mark_lands_on_the_printed_memory_allocated() {
    let mut checked = 0;
    for name in PROGRAMS {
        let p = load(name);
        for m in &p.marks {
            assert_eq!(
                p.allocated_before(m.at),
                m.allocated,
                "{name} step {} {}",
                m.step,
                m.name
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked}");
}

/// Every parameter, gradient, optimizer-state tensor and saved activation the program held at
/// a mark is a live block of that category, and each category's total is the printed one.
#[test]
fn categories_are_what_the_program_held() {
    let mut checked = 0;
    for name in PROGRAMS {
        let p = load(name);
        for m in p.marks.iter().filter(|m| !m.ptrs.is_empty()) {
            let live = p.live_before(m.at);
            for (kind, category, share) in KINDS {
                let Some(ptrs) = m.ptrs.get(kind) else {
                    continue;
                };
                let truth = held_bytes(&live, ptrs);
                let right: u64 = ptrs
                    .iter()
                    .filter_map(|a| live.get(a))
                    .filter(|v| v.1 == category)
                    .map(|v| v.0)
                    .sum();
                let labelled: u64 = live.values().filter(|v| v.1 == category).map(|v| v.0).sum();
                let at = format!("{name} step {} {} {kind}", m.step, m.name);
                // every printed tensor is in the trace
                let missing = ptrs.iter().filter(|a| !live.contains_key(a)).count();
                assert_eq!(missing, 0, "{at}: {missing} printed tensors not live");
                assert!(
                    within(right, truth, share),
                    "{at}: {right} of {truth} right"
                );
                // the compiled program saves for backward what autograd's hooks do not see
                let unseen = name == "compile_fused" && kind == "saved_activation";
                if !unseen {
                    assert!(
                        within(labelled, truth, share),
                        "{at}: {labelled} labelled, {truth} held"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "{checked}");
}

/// At the peak, parameters and optimizer state are those the program held around it, and the
/// gradients are between what it held at the marks before and after.
#[test]
fn the_peak_holds_the_printed_parameters_state_and_gradients() {
    let mut bracketed = 0;
    for name in PROGRAMS {
        let p = load(name);
        let peak = p.replay.peaks.allocated.event.unwrap() + 1;
        let before = p.marks.iter().rfind(|m| m.at <= peak && !m.ptrs.is_empty());
        let after = p.marks.iter().find(|m| m.at > peak && !m.ptrs.is_empty());
        let (Some(before), Some(after)) = (before, after) else {
            panic!("{name}: the peak between two marks")
        };
        let held = |m: &Mark, kind: &str| held_bytes(&p.live_before(m.at), &m.ptrs[kind]);
        let got = |c| p.category_bytes(peak, c);
        assert!(
            within(got(Category::Parameter), held(before, "param"), 0.01),
            "{name}: parameters at the peak {} vs {}",
            got(Category::Parameter),
            held(before, "param")
        );
        // state and gradients change between the marks (the first update creates the state):
        // checked where the marks on either side of the peak printed addresses
        let adjacent = p
            .marks
            .iter()
            .filter(|m| m.at > before.at && m.at < after.at)
            .count()
            == 0;
        for (kind, c) in [
            ("optimizer_state", Category::OptimizerState),
            ("grad", Category::Gradient),
        ] {
            let (x, y) = (held(before, kind), held(after, kind));
            let (lo, hi) = (x.min(y), x.max(y));
            let g = got(c);
            if !adjacent {
                continue;
            }
            bracketed += 1;
            assert!(
                g + 64 * 1024 >= lo && g <= hi + hi / 100 + 64 * 1024,
                "{name}: {kind} at the peak {g}, printed {lo}..{hi}"
            );
        }
    }
    assert!(bracketed >= 12, "{bracketed} checks between adjacent marks");
}

/// Train steps are counted as the program counted them, every mark between two phases falls
/// between two rows of the step table, and each train step has one forward and one backward
/// row (per micro-batch under gradient accumulation) and at most one optimizer row.
#[test]
fn train_steps_and_phase_rows_follow_the_program() {
    for name in PROGRAMS {
        let p = load(name);
        let mut steps: Vec<u32> = p.marks.iter().map(|m| m.step).collect();
        steps.dedup();
        let counted = p.a.labels.iter().map(|l| l.train_step).max().unwrap() as usize + 1;
        assert_eq!(counted, steps.len(), "{name}: train steps");
        let first = p.marks[0].step;
        for m in &p.marks {
            // a forward hook prints from inside the forward
            let inside = name == "hf_trainer" && m.name == "forward";
            if m.at >= p.a.labels.len() {
                continue;
            }
            if m.name == "start" {
                let t = p.a.labels[m.at].train_step as u32;
                assert_eq!(
                    t,
                    m.step - first,
                    "{name}: the step that starts at mark {}",
                    m.step
                );
            }
            // the marks between two phases (a step's start and end lie among events of no phase)
            let between = ["forward", "backward", "micro_backward", "optimizer"];
            // oom_survived prints its "optimizer" mark after zero_grad, among events of no phase
            let after_zero_grad = name == "oom_survived" && m.name == "optimizer";
            if inside || after_zero_grad || !between.contains(&m.name.as_str()) {
                continue;
            }
            let split = p
                .rows
                .iter()
                .find(|r| r.first_event < m.at && m.at <= r.last_event);
            assert!(
                split.is_none(),
                "{name} step {} {}: inside row {}",
                m.step,
                m.name,
                split.unwrap().label
            );
            let next = p.rows.iter().find(|r| r.first_event == m.at).unwrap();
            // a quiet row lies after its event, in time: not the row a mark follows
            let prev = p
                .rows
                .iter()
                .rfind(|r| !r.quiet && r.last_event + 1 == m.at);
            match m.name.as_str() {
                // the program's own frees between the phases are a row of their own
                "forward" => {
                    let then = p
                        .rows
                        .iter()
                        .filter(|r| r.first_event >= m.at)
                        .find(|r| p.row_phase(r) != "other")
                        .unwrap();
                    assert_eq!(p.row_phase(then), "backward", "{name} {}", then.label)
                }
                "backward" if name != "hf_trainer" => {
                    let before = p
                        .rows
                        .iter()
                        .filter(|r| !r.quiet && r.last_event < m.at)
                        .rfind(|r| p.row_phase(r) != "other")
                        .unwrap();
                    assert_eq!(p.row_phase(before), "backward", "{name} {}", before.label)
                }
                // the Trainer's callbacks run after its own bookkeeping of the micro-batch and
                // after gradient clipping
                "micro_backward" | "backward" => {
                    let prev = prev.unwrap();
                    assert!(
                        ["backward", "other"].contains(&p.row_phase(prev)),
                        "{name} {}",
                        prev.label
                    );
                    let after = if m.name == "backward" {
                        "optimizer"
                    } else {
                        "forward"
                    };
                    assert_eq!(p.row_phase(next), after, "{name} {}", next.label)
                }
                _ => {}
            }
        }
        let micro = if name == "hf_trainer" { 2 } else { 1 };
        for t in 0..counted as u16 {
            let count = |phase: &str| {
                p.rows
                    .iter()
                    .filter(|r| r.train_step == t && p.row_phase(r) == phase)
                    .count()
            };
            assert_eq!(count("forward"), micro, "{name} train step {t}");
            assert_eq!(count("backward"), micro, "{name} train step {t}");
            // every program updates once a step, a fused update of existing state included
            assert_eq!(count("optimizer"), 1, "{name} train step {t}");
        }
    }
}

/// A fused AdamW whose state exists allocates and frees nothing in its later steps: its
/// update is still a row, quiet, found from the range `torch.optim` opens, at the
/// `memory_allocated()` the program printed after `optimizer.step()`.
#[test]
fn an_update_that_allocates_nothing_has_its_row() {
    let p = load("compile_fused");
    let quiet: Vec<&StepRow> = p.rows.iter().filter(|r| r.quiet).collect();
    assert_eq!(
        quiet.len(),
        2,
        "{:?}",
        p.rows.iter().map(|r| &r.label).collect::<Vec<_>>()
    );
    let first = p.marks[0].step;
    for row in quiet {
        assert_eq!(p.row_phase(row), "optimizer");
        assert_eq!(row.first_event, row.last_event);
        assert_eq!(row.start_allocated_bytes, row.end_allocated_bytes);
        let mark = p
            .marks
            .iter()
            .find(|m| m.step - first == row.train_step as u32 && m.name == "optimizer")
            .unwrap();
        assert_eq!(row.end_allocated_bytes, mark.allocated, "{}", row.label);
        // the row lies between the backward and the printed mark
        assert!(row.last_event < mark.at, "{}", row.label);
    }
}

//! A corpus of programs nobody here wrote, in twelve libraries, each recorded with PyTorch's
//! profiler alongside and printing its own truth (`testdata/record/corpus.py`,
//! `testdata/snapshots/corpus/`): at every phase boundary a `memsnap.mark/STEP/NAME` range in
//! the snapshot and the storages of its parameters and buffers, gradients, optimizer state and
//! the data it put on the device itself, by address; the number of updates it ran.
//!
//! memsnap must name every one of those storages with its category, call nothing else a
//! parameter, gradient or optimizer state, count the train steps the program ran, and end a
//! step-table row where the program printed a phase's end.

use memsnap::attribute::{Category, Evidence};

use crate::programs::{load_in, Program};

/// Every program of the corpus.
const CORPUS: [&str; 34] = [
    "accelerate_accum",
    "actor_critic",
    "amp_gradscaler",
    "batchnorm_eval",
    "ckpt_nonreentrant",
    "ckpt_reentrant",
    "cnn_sgd_momentum",
    "compile_cudagraphs",
    "compile_default",
    "ddp_accum",
    "ddp_oom",
    "diffusion_unet",
    "fsdp2_accum",
    "gan",
    "gpytorch_exact_gp",
    "hf_trainer",
    "hf_trainer_accum",
    "lightning_auto",
    "lightning_late_zero_grad",
    "lightning_manual",
    "llama_generate_kv",
    "loss_accumulator",
    "mlp_adamw",
    "oom_step2",
    "peft_lora",
    "pyg_gcn",
    "sentence_transformers_mnrl",
    "tied_embeddings",
    "timm_vit_lamb",
    "torchaudio_conformer",
    "torchdiffeq_adjoint",
    "tv_resnet_fixed_batch",
    "weight_norm",
    "zero_grad_keep",
];

fn load(name: &str) -> (Program, String) {
    let log = std::fs::read_to_string(crate::util::testdata(&format!(
        "snapshots/corpus/{name}.log"
    )))
    .unwrap();
    (load_in("snapshots/corpus", name), log)
}

/// The `KEY=N` of the first line of `log` starting with `start`.
fn figure(log: &str, start: &str, key: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.starts_with(start))?;
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..].split_whitespace().next()?.parse().ok()
}

/// At every mark, the parameters and buffers, gradients and optimizer state the program held
/// are live blocks memsnap gives that category, and no other live block has it: the bytes of
/// each category are the printed ones, exactly.
#[test]
fn parameters_gradients_and_optimizer_state_are_exactly_what_the_program_held() {
    let kinds = [
        ("param", Category::Parameter),
        ("grad", Category::Gradient),
        ("optimizer_state", Category::OptimizerState),
    ];
    let mut checked = 0;
    for name in CORPUS {
        let (p, _) = load(name);
        for m in p.marks.iter().filter(|m| !m.ptrs.is_empty()) {
            let live = p.live_before(m.at);
            for (kind, category) in kinds {
                let Some(ptrs) = m.ptrs.get(kind) else {
                    continue;
                };
                let at = format!("{name} step {} {} {kind}", m.step, m.name);
                let held: u64 = ptrs.iter().filter_map(|a| live.get(a)).map(|v| v.0).sum();
                let named: u64 = ptrs
                    .iter()
                    .filter_map(|a| live.get(a))
                    .filter(|v| v.1 == category)
                    .map(|v| v.0)
                    .sum();
                assert_eq!(named, held, "{at}: {named} of {held} bytes named");
                // FSDP2's root module keeps its own parameters unsharded between forward and
                // backward: the program's list then names the unsharded storages, and the
                // sharded ones (parameters all the same) are named by nothing
                if name == "fsdp2_accum" && kind == "param" {
                    checked += 1;
                    continue;
                }
                let called: u64 = live
                    .iter()
                    .filter(|(a, v)| v.1 == category && !ptrs.contains(a))
                    .map(|(_, v)| v.0)
                    .sum();
                assert_eq!(
                    called, 0,
                    "{at}: {called} bytes called {category:?} besides"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1500, "{checked} checks");
}

/// The data the program put on the device itself (a graph dataset, a fixed batch, a loss
/// accumulator) is `input`, however long it lives; none of it is a parameter.
#[test]
fn data_the_program_keeps_on_the_device_is_input() {
    let mut bytes = 0;
    for name in CORPUS {
        let (p, _) = load(name);
        for m in &p.marks {
            let Some(ptrs) = m.ptrs.get("input") else {
                continue;
            };
            let live = p.live_before(m.at);
            for a in ptrs {
                let Some(&(size, c)) = live.get(a) else {
                    continue;
                };
                // a batch autograd saved for backward is also an activation
                assert!(
                    matches!(c, Category::Input | Category::Activation),
                    "{name} step {} {}: data at {a:x} is {c:?}",
                    m.step,
                    m.name
                );
                bytes += size;
            }
        }
    }
    assert!(bytes > 100 << 20, "{bytes}");
}

/// Train steps are the repeating unit that ends with its updates: a GAN's two updates are one
/// step, replayed CUDA graphs that allocate nothing in their forward still steps, a trace that
/// ran out of memory in its first accumulation step one step in progress.
#[test]
fn train_steps_are_those_the_program_ran() {
    for name in CORPUS {
        let (p, log) = load(name);
        let ran = figure(&log, "STEPS ", "n").unwrap();
        let counted = p.a.labels.iter().map(|l| l.train_step).max().unwrap_or(0) as u64 + 1;
        // a step the error stopped is a step in progress
        let stopped = log.lines().any(|l| l.starts_with("FATAL"));
        let inference = name == "llama_generate_kv";
        if inference {
            assert_eq!(counted, 1, "{name}");
        } else if stopped {
            assert_eq!(
                counted,
                ran + 1,
                "{name}: {ran} updates and the step that failed"
            );
        } else {
            assert_eq!(counted, ran, "{name}");
        }
    }
}

/// Where the program printed a phase's end, a step-table row ends: all forward, optimizer and
/// zero_grad ends, and nearly all of the others.
#[test]
fn step_rows_end_where_the_program_printed_a_phase_end() {
    let (mut ended, mut marks) = (0, 0);
    for name in CORPUS {
        let (p, _) = load(name);
        for m in &p.marks {
            // the stretch of events around the mark at its printed bytes
            let mut lo = m.at;
            while lo > 0 && p.replay.allocated[lo - 1] == m.allocated {
                lo -= 1;
            }
            let mut hi = m.at;
            while hi < p.replay.len() && p.replay.allocated[hi] == m.allocated {
                hi += 1;
            }
            let ends = p.rows.iter().any(|r| {
                r.end_allocated_bytes == m.allocated
                    && (lo.saturating_sub(1)..=hi).contains(&r.last_event)
            });
            let must = ["forward", "optimizer", "zero_grad", "micro_backward"]
                .contains(&m.name.as_str())
                && name != "actor_critic";
            assert!(
                ends || !must,
                "{name} step {} {}: no row ends at {} bytes",
                m.step,
                m.name,
                m.allocated
            );
            ended += usize::from(ends);
            marks += 1;
        }
    }
    assert!(
        ended * 100 >= marks * 93,
        "{ended} of {marks} marks end a row"
    );
}

/// Each category says what decided it, and the corpus is decided by evidence: the unknown
/// bytes at each program's peak are under 5% of it.
#[test]
fn unknown_is_rare_and_every_category_has_its_evidence() {
    for name in CORPUS {
        let (p, _) = load(name);
        let peak = p.replay.peaks.allocated.event.map_or(0, |e| e + 1);
        let live = p.live_before(peak);
        let total: u64 = live.values().map(|v| v.0).sum();
        let unknown: u64 = live
            .values()
            .filter(|v| v.1 == Category::Unknown)
            .map(|v| v.0)
            .sum();
        assert!(
            unknown * 20 <= total,
            "{name}: {unknown} of {total} bytes unknown at the peak"
        );
        for (i, l) in p.a.labels.iter().enumerate() {
            if p.snap.trace(0)[i].action == memsnap::snapshot::Action::Alloc {
                assert_eq!(
                    l.category == Category::Unknown,
                    matches!(l.evidence, Evidence::None | Evidence::Conflict),
                    "{name} event {i}: {:?} from {:?}",
                    l.category,
                    l.evidence
                );
            }
        }
    }
}

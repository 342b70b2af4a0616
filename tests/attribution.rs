//! Attribution: pipeline steps, ops, micro-batches, stages and categories, checked against
//! what the training program printed and against an independent replay.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::*;

fn report(path: &Path, extra: &[&str]) -> Value {
    report_json(path, extra)
}

fn gib(v: &Value) -> String {
    format!("{:.2}", v.as_u64().unwrap() as f64 / (1u64 << 30) as f64)
}

/// `(label, GiB)` memory prints of one pp rank in a pithtrain log.
fn prints(log: &Path, rank: u32) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap();
    let prefix = format!("[rank={rank} pp={rank}] ");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|l| {
            let (label, rest) = l.split_once(": ").unwrap();
            (
                label.to_string(),
                rest.split(" GiB").next().unwrap().to_string(),
            )
        })
        .collect()
}

/// Checks every print of `train.log` against the step table of one snapshot.
fn check_against_log(snapshot: &Path, log: &Path, rank: u32, extra: &[&str]) -> usize {
    let rep = report(snapshot, extra);
    let d = &rep["devices"][0];
    let rows = d["steps"].as_array().unwrap();
    let step_row = |n: u64| rows.iter().find(|r| r["step"] == n && r["train_step"] == 0);
    // A step with no row (empty on this rank) ends where the steps before it ended.
    let end_of = |n: u64| -> String {
        match step_row(n) {
            Some(r) => gib(&r["end_allocated_bytes"]),
            None => rows
                .iter()
                .rfind(|r| (1..n).contains(&r["step"].as_u64().unwrap()))
                .map_or(gib(&d["start_allocated_bytes"]), |r| {
                    gib(&r["end_allocated_bytes"])
                }),
        }
    };
    let mut checked = 0;
    for (label, want) in prints(log, rank) {
        let got = if label == "Before pipeline" {
            gib(&d["start_allocated_bytes"])
        } else if let Some(rest) = label.strip_prefix("After Step") {
            let n: u64 = rest[..1].parse().unwrap();
            end_of(n)
        } else if let Some(i) = label.strip_prefix("Step4 i=") {
            let i: usize = i.parse().unwrap();
            gib(&step_row(4).unwrap()["iteration_end_allocated_bytes"][i])
        } else if let Some(i) = label.strip_prefix("Step1 F0 i=") {
            let i: usize = i.parse().unwrap();
            gib(&step_row(1).unwrap()["iteration_end_allocated_bytes"][i])
        } else {
            continue;
        };
        assert_eq!(
            got,
            want,
            "{} rank {rank} {extra:?}: {label}",
            snapshot.display()
        );
        checked += 1;
    }
    checked
}

fn snapgen() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/snapgen")
}

#[test]
fn step_figures_match_the_printed_memory_with_and_without_source() {
    let Some(dir) = shared() else { return };
    let log = dir.join("pp2-stacks-python/train.log");
    let root = snapgen();
    let root = root.to_string_lossy();
    let mut checked = 0;
    for rank in [0u32, 1] {
        for file in [
            dir.join(format!(
                "pp2-stacks-python/memory_snapshot_rank{rank}_py_step0.pickle.xz"
            )),
            dir.join(format!(
                "pp2-stacks-all/memory_snapshot_rank{rank}_step0.pickle.xz"
            )),
        ] {
            checked += check_against_log(&file, &log, rank, &[]);
            checked += check_against_log(&file, &log, rank, &["--source-root", &root]);
        }
    }
    // rank 0: 1 + 2 + 4 + 5 + 1 prints, rank 1: 1 + 4 + 6 + 1; four ways each
    assert_eq!(checked, 4 * (13 + 12));
}

#[test]
fn a_fork_with_other_lines_and_micro_batches_is_labelled_just_as_well() {
    let dir = testdata("snapshots/pithtrain-fork");
    let source = dir.join("source");
    let source = source.to_string_lossy();
    let mut checked = 0;
    for rank in [0u32, 1] {
        let file = dir.join(format!("memory_snapshot_rank{rank}_fork_step0.pickle.xz"));
        checked += check_against_log(&file, &dir.join("train.log"), rank, &[]);
        checked += check_against_log(
            &file,
            &dir.join("train.log"),
            rank,
            &["--source-root", &source],
        );
        let rep = report(&file, &["--source-root", &source]);
        let p = &rep["devices"][0]["attribution"]["pipeline"];
        assert_eq!(p["steps_from"]["from"], "source");
        assert_eq!(p["shape"]["chunks"], 6);
        assert_eq!(p["shape"]["rank"], rank);
        // the fork's `# Step 1` sits 7 lines lower than the original's
        assert_eq!(p["regions"][0][1], 291);
    }
    assert!(checked >= 40, "{checked}");
    // the original's source does not match the fork: memsnap notices and infers instead
    let file = dir.join("memory_snapshot_rank0_fork_step0.pickle.xz");
    if snapgen().is_dir() {
        let root = snapgen();
        let rep = report(&file, &["--source-root", &root.to_string_lossy()]);
        let p = &rep["devices"][0]["attribution"]["pipeline"];
        assert_eq!(p["steps_from"]["from"], "inferred");
        assert!(p["note"].as_str().unwrap().contains("does not match"));
    }
}

/// The independent replay in `expected/` counts rounded requests and puts events outside any
/// step region (after step 8, the optimizer) into the step before them; folding memsnap's
/// rows the same way must give the same bytes.
#[test]
fn step_figures_equal_the_reference_replay() {
    let Some(dir) = shared() else { return };
    let mut checked = 0;
    for entry in std::fs::read_dir(dir.join("expected")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let (folder, file) = name.split_once("--").unwrap();
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let rep = report(
            &dir.join(folder).join(format!("{file}.pickle.xz")),
            &["--sizes", "rounded"],
        );
        for (want, got) in expected
            .as_array()
            .unwrap()
            .iter()
            .zip(rep["devices"].as_array().unwrap())
        {
            let mut order = Vec::new();
            let mut agg: Vec<(u64, [u64; 3])> = Vec::new();
            let mut current: Option<u64> = None;
            for row in got["steps"].as_array().unwrap() {
                let step = row["step"].as_u64().unwrap();
                let (start, peak, end) = (
                    row["start_allocated_bytes"].as_u64().unwrap(),
                    row["peak_allocated_bytes"].as_u64().unwrap(),
                    row["end_allocated_bytes"].as_u64().unwrap(),
                );
                if (1..=8).contains(&step) {
                    if current != Some(step) {
                        order.push(step);
                    }
                    current = Some(step);
                    match agg.iter_mut().find(|a| a.0 == step) {
                        Some(a) => {
                            a.1[1] = a.1[1].max(peak);
                            a.1[2] = end;
                        }
                        None => agg.push((step, [start, peak, end])),
                    }
                } else if let Some(s) = current {
                    let a = agg.iter_mut().find(|a| a.0 == s).unwrap();
                    a.1[1] = a.1[1].max(peak);
                    a.1[2] = end;
                }
            }
            let want_order: Vec<u64> = want["step_order"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(order, want_order, "{name}");
            for s in want["steps"].as_array().unwrap() {
                let step = s["step"].as_u64().unwrap();
                let got = agg.iter().find(|a| a.0 == step).unwrap().1;
                let want = [
                    s["start_allocated_bytes"].as_u64().unwrap(),
                    s["peak_allocated_bytes"].as_u64().unwrap(),
                    s["end_allocated_bytes"].as_u64().unwrap(),
                ];
                assert_eq!(got, want, "{name} step {step}");
                checked += 1;
            }
        }
    }
    // pp2-large, stacks-all and stacks-python rank 0: 8 steps each; ranks 1: 4; ep2: 4;
    // oom: 3; ring buffer: 5
    assert_eq!(checked, 8 * 3 + 4 * 2 + 4 + 3 + 5);
}

/// Each breakdown of the peak adds up to the peak, to the byte, in both accountings.
#[test]
fn peak_breakdowns_add_up_to_the_peak() {
    let mut files = vec![
        testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz"),
    ];
    if let Some(dir) = shared() {
        files.extend(snapshots_under(&dir));
    }
    for f in files {
        for sizes in ["allocator", "rounded"] {
            let rep = report(&f, &["--sizes", sizes]);
            for d in rep["devices"].as_array().unwrap() {
                let peak = d["peak_allocated_bytes"].as_u64().unwrap();
                for (dim, shares) in d["peak_breakdown"].as_object().unwrap() {
                    let sum: u64 = shares
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s["bytes"].as_u64().unwrap())
                        .sum();
                    assert_eq!(sum, peak, "{} {sizes} by {dim}", f.display());
                }
            }
        }
    }
}

#[test]
fn the_peak_is_named_by_step_op_micro_batch_and_stage() {
    let Some(dir) = shared() else { return };
    let rep = report(
        &dir.join("pp2-stacks-all/memory_snapshot_rank0_step0.pickle.xz"),
        &[],
    );
    let d = &rep["devices"][0];
    let peak = &d["peak"];
    assert_eq!(peak["step"], "step 4");
    // step 4 on rank 0 overlaps a phase-0 forward with a phase-1 backward (the loss)
    assert_eq!(peak["op"], "F0&B1 mb 4/2");
    assert_eq!(peak["detail"], "LogSoftmaxBackward0");
    assert_eq!(peak["stage"], "backward (autograd thread)");
    let steps = d["peak_breakdown"]["step"].as_array().unwrap();
    assert!(steps[0]["label"].as_str().unwrap().starts_with("step 4 · "));
    let stages = labels(&d["peak_breakdown"]["stage"]);
    for want in [
        "stage 1: attention + gate",
        "stage 3: experts",
        "loss",
        "before the trace",
    ] {
        assert!(
            stages.iter().any(|s| s == want),
            "{want} missing in {stages:?}"
        );
    }
    let text = ok(&[
        "report",
        &dir.join("pp2-stacks-all/memory_snapshot_rank0_step0.pickle.xz")
            .to_string_lossy(),
    ]);
    assert!(
        text.contains("the peak was reached in step 4 · F0&B1 mb 4/2"),
        "{text}"
    );
    assert!(
        text.contains("pipeline rank 0 of 2, 8 micro-batches"),
        "{text}"
    );
}

/// With the source at hand, stage numbers come from its `# Stage N.` comments and expert
/// internals from the projection on the recorded line; the names are the same as without it.
#[test]
fn stages_from_source_comments() {
    let Some(dir) = shared() else { return };
    let root = snapgen();
    let file = dir.join("pp2-stacks-python/memory_snapshot_rank1_py_step0.pickle.xz");
    let rep = report(&file, &["--source-root", &root.to_string_lossy()]);
    let stages = labels(&rep["devices"][0]["peak_breakdown"]["stage"]);
    assert!(
        stages.iter().any(|s| s == "stage 1: attention + gate"),
        "{stages:?}"
    );
    assert!(
        stages.iter().any(|s| s.starts_with("stage 3: experts: ")),
        "{stages:?}"
    );
    // one vocabulary: the stage names without the source are the same
    let without = report(&file, &[]);
    let mut names_without = labels(&without["devices"][0]["peak_breakdown"]["stage"]);
    let mut names_with = stages.clone();
    names_without.retain(|s| s.starts_with("stage ") && !s.starts_with("stage 3: experts:"));
    names_with.retain(|s| s.starts_with("stage ") && !s.starts_with("stage 3: experts:"));
    names_without.sort();
    names_with.sort();
    assert_eq!(names_with, names_without);
}

/// The `label` of each row of a JSON array (a breakdown or the step table).
fn labels(rows: &Value) -> Vec<String> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap().to_string())
        .collect()
}

fn phases_of(rep: &Value) -> Vec<String> {
    labels(&rep["devices"][0]["steps"])
}

#[test]
fn generic_preset_on_programs_without_a_pipeline() {
    for (file, extra) in [
        (
            "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
            "annotation",
        ),
        (
            "snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz",
            "fsdp all-gather",
        ),
    ] {
        let rep = report(&testdata(file), &[]);
        let d = &rep["devices"][0];
        assert_eq!(d["attribution"]["preset"], "generic");
        let phases = phases_of(&rep);
        for p in ["forward", "backward", "optimizer"] {
            assert!(phases.iter().any(|x| x == p), "{file}: {phases:?}");
        }
        let cats = labels(&d["peak_breakdown"]["category"]);
        assert!(
            cats.iter().any(|c| c == "activation") && cats.iter().any(|c| c == "pre-existing"),
            "{cats:?}"
        );
        if extra == "annotation" {
            let ann = labels(&d["peak_breakdown"]["annotation"]);
            assert!(
                ann.iter().any(|a| a == "forward") && ann.iter().any(|a| a == "backward"),
                "{ann:?}"
            );
        } else {
            let stages = d["peak_breakdown"]["stage"].to_string();
            assert!(stages.contains(extra), "{stages}");
        }
    }
    let Some(dir) = shared() else { return };
    let rep = report(&dir.join("fixtures-torch-2.11/big_python.pickle"), &[]);
    let d = &rep["devices"][0];
    assert_eq!(d["attribution"]["preset"], "generic");
    let phases = phases_of(&rep);
    assert!(phases.iter().any(|p| p.contains("forward")), "{phases:?}");
    assert!(phases.iter().any(|p| p.contains("backward")), "{phases:?}");
    assert!(phases.iter().any(|p| p.contains("optimizer")), "{phases:?}");
}

#[test]
fn custom_rules_override_the_preset() {
    let dir = scratch();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nfile = \"record_snapshot\\\\.py$\"\nfunction = \"^forward$\"\nstage = \"my transformer block\"\ncategory = \"activation\"\n",
    )
    .unwrap();
    let file = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let rep = report(&file, &["--rules", &rules.to_string_lossy()]);
    let stages = rep["devices"][0]["peak_breakdown"]["stage"].to_string();
    assert!(stages.contains("my transformer block"), "{stages}");
    std::fs::write(&rules, "[[rule]]\ncategory = \"weights\"\n").unwrap();
    let o = memsnap(&[
        "report",
        &file.to_string_lossy(),
        "--rules",
        &rules.to_string_lossy(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown category"), "{}", stderr(&o));
}

#[test]
fn multi_step_traces_label_each_training_step() {
    let Some(dir) = shared() else { return };
    let rep = report(
        &dir.join("ep2-two-steps/memory_snapshot_rank0_steps0-1.pickle.xz"),
        &[],
    );
    let labels = phases_of(&rep);
    assert!(
        labels.contains(&"train step 0 · step 2".to_string()),
        "{labels:?}"
    );
    assert!(
        labels.contains(&"train step 1 · step 8".to_string()),
        "{labels:?}"
    );
    assert!(
        labels.contains(&"train step 0 · optimizer".to_string()),
        "{labels:?}"
    );
    let cats = rep["devices"][0]["peak_breakdown"]["category"].to_string();
    assert!(cats.contains("optimizer state"), "{cats}");
}

/// With and without the source, every event gets the same step, op, micro-batch and call.
#[test]
fn source_and_inference_label_every_event_alike() {
    use memsnap::attribute::{attribute, Options};
    let mut cases: Vec<(PathBuf, PathBuf)> = vec![(
        testdata("snapshots/pithtrain-fork/memory_snapshot_rank1_fork_step0.pickle.xz"),
        testdata("snapshots/pithtrain-fork/source"),
    )];
    if let Some(dir) = shared() {
        for f in [
            "pp2-stacks-python/memory_snapshot_rank0_py_step0.pickle.xz",
            "pp2-stacks-all/memory_snapshot_rank1_step0.pickle.xz",
            "ep2-two-steps/memory_snapshot_rank0_steps0-1.pickle.xz",
        ] {
            cases.push((dir.join(f), snapgen()));
        }
    }
    for (file, root) in cases {
        let snap = memsnap::snapshot::Snapshot::open(&file).unwrap();
        let device = snap.devices_with_events().next().unwrap();
        let replay = memsnap::replay::replay(&snap, device, Default::default());
        let inferred = attribute(&snap, &replay, &Options::default());
        let sourced = attribute(
            &snap,
            &replay,
            &Options {
                source_roots: vec![root],
                ..Options::default()
            },
        );
        assert!(matches!(
            sourced.pipeline.as_ref().unwrap().steps_from,
            memsnap::attribute::StepSource::Source { .. }
        ));
        assert_eq!(
            inferred.pipeline.as_ref().unwrap().steps_from,
            memsnap::attribute::StepSource::Inferred
        );
        let key = |a: &memsnap::attribute::Attribution, i: usize| {
            let l = &a.labels[i];
            (l.train_step, l.pipe_step, a.op_text(l), l.call, l.category)
        };
        for i in 0..replay.len() {
            assert_eq!(
                key(&inferred, i),
                key(&sourced, i),
                "{} event {i}",
                file.display()
            );
        }
    }
}

/// The per-step table's "peak is mostly" column, computed in one sweep, equals grouping the
/// blocks live at each step's peak one by one.
#[test]
fn step_peak_categories_equal_the_live_blocks_at_each_peak() {
    use memsnap::analysis::breakdown::{
        categories_at, group, live_at, step_table, Dimension, Keyer,
    };
    let mut files = vec![
        testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz"),
    ];
    if let Some(dir) = shared() {
        for f in [
            "pp2-stacks-all/memory_snapshot_rank0_step0.pickle.xz",
            "ep2-two-steps/memory_snapshot_rank0_steps0-1.pickle.xz",
            "ring-buffer-wrapped/memory_snapshot_rank0_ring100k_step0.pickle.xz",
            "oom/memory_snapshot_rank0_oom.pickle.xz",
            "fixtures-torch-2.11/streams.pickle",
            "fixtures-torch-2.11/pending_free_end.pickle",
            "fixtures-torch-2.11/multi_gpu.pickle",
        ] {
            files.push(dir.join(f));
        }
    }
    let mut checked = 0;
    for file in files {
        let snap = memsnap::snapshot::Snapshot::open(&file).unwrap();
        for device in snap.devices_with_events() {
            let replay = memsnap::replay::replay(&snap, device, Default::default());
            let a = memsnap::attribute::attribute(&snap, &replay, &Default::default());
            let rows = step_table(&snap, &replay, &a);
            let points: Vec<usize> = (0..replay.len()).step_by(997).collect();
            let swept = categories_at(&snap, &replay, &a, &points);
            let mut keyer = Keyer::new(&snap, &a);
            let expect = |at: usize, keyer: &mut Keyer| {
                group(
                    keyer,
                    Dimension::Category,
                    &live_at(&snap, &replay, &a, Some(at)),
                )
            };
            for row in &rows {
                let want = expect(row.peak_event_index, &mut keyer);
                assert_eq!(
                    row.peak_categories,
                    want,
                    "{} {}",
                    file.display(),
                    row.label
                );
                checked += 1;
            }
            for (&at, got) in points.iter().zip(&swept) {
                assert_eq!(
                    got,
                    &expect(at, &mut keyer),
                    "{} event {at}",
                    file.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "{checked}");
}

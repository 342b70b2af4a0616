//! Attribution on programs written by others: Hugging Face transformers models trained with
//! AdamW (plain, checkpointed, compiled, with memory metadata, MoE, DDP), and DualPipeV
//! pipelines of 4 and 8 ranks and one cut short by an out-of-memory error. Every figure is
//! checked against what the program printed while it was recorded.

use serde_json::Value;

use crate::util::*;

fn report(file: &std::path::Path, extra: &[&str]) -> Value {
    report_json(file, extra)
}

/// `(kind, rank, snapshot)` of every transformers recording.
fn transformers() -> Vec<(String, u32, std::path::PathBuf)> {
    let dir = testdata("snapshots/transformers");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix("memory_snapshot_") {
            let (kind, rank) = rest.split_once("_rank").unwrap();
            let rank: u32 = rank.split('.').next().unwrap().parse().unwrap();
            out.push((kind.to_string(), rank, p));
        }
    }
    out.sort();
    assert!(out.len() >= 7, "{out:?}");
    out
}

/// `PHASE rank=R step=S phase=P memory_allocated=N` lines of a recording, from the step
/// recording started on: `(step, phase, bytes)`.
fn printed_phases(kind: &str, rank: u32) -> (Vec<(u32, String, u64)>, u64) {
    let log =
        std::fs::read_to_string(testdata(&format!("snapshots/transformers/{kind}.log"))).unwrap();
    let mut phases = Vec::new();
    let mut peak = 0;
    for line in log.lines() {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_string)
        };
        if field("rank=").as_deref() != Some(&rank.to_string()) {
            continue;
        }
        if line.starts_with("PHASE ") {
            phases.push((
                field("step=").unwrap().parse::<u32>().unwrap(),
                field("phase=").unwrap(),
                field("memory_allocated=").unwrap().parse().unwrap(),
            ));
        } else if line.starts_with("PEAK ") {
            peak = field("max_memory_allocated=").unwrap().parse().unwrap();
        }
    }
    let first = phases.iter().find(|p| p.1 == "start").unwrap().0;
    phases.retain(|p| p.0 >= first && p.1 != "start");
    let phases = phases
        .into_iter()
        .map(|(s, p, b)| (s - first, p, b))
        .collect();
    (phases, peak)
}

/// The peak is PyTorch's own, and each phase ends where the program printed
/// `memory_allocated()`: after the forward returned, after `loss.backward()`, after
/// `optimizer.step()`, and after `zero_grad()` (the end of the training step); where the
/// program dropped the model's output before printing, that drop is a row of its own after the
/// phase's, and the print is that row's end.
#[test]
fn phase_ends_equal_what_the_program_printed() {
    let mut checked = 0;
    for (kind, rank, file) in transformers() {
        let (phases, peak) = printed_phases(&kind, rank);
        let rep = report(&file, &[]);
        let d = &rep["devices"][0];
        assert_eq!(
            d["peak_allocated_bytes"].as_u64().unwrap(),
            peak,
            "{kind} peak"
        );
        let steps = d["steps"].as_array().unwrap();
        for (step, phase, bytes) in phases {
            let of_step: Vec<&Value> = steps
                .iter()
                .filter(|r| r["train_step"].as_u64() == Some(step as u64))
                .collect();
            // the phase's row, or the row of the program's own frees right after it (the
            // model's output dropped before the program printed)
            let at = match phase.as_str() {
                "zero_grad" => of_step.len().checked_sub(1),
                p => of_step
                    .iter()
                    .position(|r| r["label"].as_str().unwrap().ends_with(p)),
            };
            let ends: Vec<u64> = at
                .map(|k| {
                    let then = of_step[k + 1..]
                        .iter()
                        .copied()
                        .take_while(|r| r["label"].as_str().unwrap().ends_with("· other"));
                    std::iter::once(of_step[k])
                        .chain(then)
                        .map(|r| r["end_allocated_bytes"].as_u64().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            assert!(
                ends.contains(&bytes),
                "{kind} rank {rank}: step {step} {phase}: {bytes} not among {ends:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 56, "{checked}");
}

/// Model code, not the training script, is where the memory of a model call comes from:
/// wherever a model frame (transformers, in `site-packages`) is on an allocation's stack, the
/// allocation's site is not the script's line; and the model library's files are among the
/// top sites at the peak.
#[test]
fn top_sites_name_model_code() {
    for (kind, _, file) in transformers() {
        let snap = memsnap::snapshot::Snapshot::open(&file).unwrap();
        let device = snap.devices_with_events().next().unwrap();
        let mut with_model = 0;
        for e in snap.trace(device) {
            let model_frame = memsnap::attribute::frames::user_frames(&snap, e.stack)
                .any(|f| snap.str(f.filename).contains("/transformers/"));
            if model_frame {
                with_model += 1;
                let site = memsnap::attribute::frames::site(&snap, e.stack, 3);
                // innermost last; a part names its file where the file changes
                let innermost_file = site
                    .split(';')
                    .rfind(|part| part.matches(':').count() == 2)
                    .unwrap_or("");
                assert!(
                    !innermost_file.starts_with("real_world.py"),
                    "{kind}: {site}"
                );
            }
        }
        assert!(with_model > 100, "{kind}: {with_model}");
        let rep = report(&file, &[]);
        let sites: Vec<String> = rep["devices"][0]["top_sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["label"].as_str().unwrap().to_string())
            .collect();
        let model = sites
            .iter()
            .take(6)
            .filter(|s| s.contains("modeling_") || s.contains("loss_utils"))
            .count();
        assert!(model >= 1, "{kind}: {sites:?}");
    }
}

/// Checkpointed layers recompute their forward inside backward: one forward and one
/// backward row per training step, and the recomputation labelled `recompute` in backward.
#[test]
fn checkpoint_recomputation_belongs_to_backward() {
    let file = testdata("snapshots/transformers/memory_snapshot_llama_ckpt_rank0.pickle.xz");
    let rep = report(&file, &[]);
    let labels: Vec<String> = rep["devices"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap().to_string())
        .collect();
    for step in 0..2 {
        for phase in ["forward", "backward", "optimizer"] {
            let n = labels
                .iter()
                .filter(|l| **l == format!("train step {step} · {phase}"))
                .count();
            assert_eq!(n, 1, "{phase} of step {step}: {labels:?}");
        }
    }
    let snap = memsnap::snapshot::Snapshot::open(&file).unwrap();
    let a = memsnap::analysis::analyse_device(&snap, 0, &Default::default());
    let attribution = &a.attribution;
    let recompute: Vec<_> = attribution
        .labels
        .iter()
        .filter(|l| attribution.names.get(l.op) == "recompute")
        .collect();
    assert!(recompute.len() > 50, "{}", recompute.len());
    assert!(recompute
        .iter()
        .all(|l| l.phase == memsnap::attribute::Phase::Backward));
}

/// Metadata the program set with `torch.cuda.memory._set_memory_metadata` decides phases, and
/// the report says how many phases came from it.
#[test]
fn memory_metadata_labels_phases() {
    let with = report(
        &testdata("snapshots/transformers/memory_snapshot_llama_meta_rank0.pickle.xz"),
        &[],
    );
    let sources = &with["devices"][0]["attribution"]["phase_sources"];
    assert!(sources["metadata"].as_u64().unwrap() > 500, "{sources}");
    let without = report(
        &testdata("snapshots/transformers/memory_snapshot_llama_rank0.pickle.xz"),
        &[],
    );
    assert_eq!(
        without["devices"][0]["attribution"]["phase_sources"]["metadata"],
        0
    );
    let text = ok(&[
        "report",
        &testdata("snapshots/transformers/memory_snapshot_llama_meta_rank0.pickle.xz")
            .to_string_lossy(),
    ]);
    assert!(text.contains("memory metadata"), "{text}");
}

/// Frames with no sign of a phase give `other`, never `backward`.
#[test]
fn no_evidence_means_other() {
    use serde_pickle::value::{HashableValue as H, Value as V};
    use std::collections::BTreeMap;
    let s = |t: &str| V::String(t.to_string());
    let frame = |name: &str, line: i64| {
        let mut f = BTreeMap::new();
        f.insert(
            H::String("filename".into()),
            s(&format!("/srv/app/{name}.py")),
        );
        f.insert(H::String("name".into()), s(name));
        f.insert(H::String("line".into()), V::I64(line));
        V::Dict(f)
    };
    let event = |action: &str, addr: i64, size: i64, frames: Vec<V>| {
        let mut e = BTreeMap::new();
        e.insert(H::String("action".into()), s(action));
        e.insert(H::String("addr".into()), V::I64(addr));
        e.insert(H::String("size".into()), V::I64(size));
        e.insert(H::String("stream".into()), V::I64(0));
        e.insert(
            H::String("time_us".into()),
            V::I64(1_700_000_000_000_000 + addr % 1000),
        );
        e.insert(H::String("frames".into()), V::List(frames));
        V::Dict(e)
    };
    let base = 1i64 << 40;
    let mut trace = vec![event("segment_alloc", base, 20 << 20, vec![])];
    for k in 0..20i64 {
        let frames = vec![frame(&format!("qzx{k}"), 10 + k), frame("wvy", 3)];
        trace.push(event(
            "alloc",
            base + k * (1 << 20),
            1 << 20,
            frames.clone(),
        ));
        if k % 2 == 1 {
            trace.push(event(
                "free_requested",
                base + k * (1 << 20),
                1 << 20,
                frames.clone(),
            ));
            trace.push(event(
                "free_completed",
                base + k * (1 << 20),
                1 << 20,
                frames,
            ));
        }
    }
    let bytes = snapshot_pickle(vec![], trace);
    let dir = scratch();
    let file = dir.path().join("random_frames.pickle");
    std::fs::write(&file, bytes).unwrap();
    let rep = report(&file, &[]);
    let phases = rep["devices"][0]["peak_breakdown"]["phase"].to_string();
    assert!(
        !phases.contains("backward") && !phases.contains("forward"),
        "{phases}"
    );
    assert!(phases.contains("other"), "{phases}");
}

/// `[rank=R pp=R] After StepN (K ...): X GiB` lines: `(step, iterations, GiB text)`.
fn printed_steps(log: &str, rank: u32) -> Vec<(u64, u64, String)> {
    let prefix = format!("[rank={rank} pp={rank}] After Step");
    log.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| {
            let (step, rest) = l.split_once(" (")?;
            let (iterations, rest) = rest.split_once(' ')?;
            let gib = rest.split_once("): ")?.1.split(" GiB").next()?;
            Some((
                step.parse().ok()?,
                iterations.parse().ok()?,
                gib.to_string(),
            ))
        })
        .filter(|s| s.0 <= 8)
        .collect()
}

/// Checks one pipeline recording's step table against what each rank printed: the end of
/// every step (a step whose loop runs no iteration ends where the step before it ended) and
/// its iteration count; returns the steps checked.
fn check_pipeline(folder: &str, extra: &[&str], ranks: &[u32], chunks: Option<u64>) -> usize {
    let dir = testdata(&format!("snapshots/pipelines/{folder}"));
    let log = std::fs::read_to_string(dir.join("train.log")).unwrap();
    let mut checked = 0;
    for &rank in ranks {
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.to_string_lossy()
                    .contains(&format!("memory_snapshot_rank{rank}_"))
            })
            .unwrap();
        let shape = chunks.map(|n| (ranks.len() as u64, n));
        checked += check_rank(&file, &log, rank, extra, shape);
    }
    checked
}

/// One rank of a pipeline recording against what it printed: the rank (and, when given, the
/// number of ranks and micro-batches), each step's end and iteration count; returns the steps
/// checked.
fn check_rank(
    file: &std::path::Path,
    log: &str,
    rank: u32,
    extra: &[&str],
    shape_want: Option<(u64, u64)>,
) -> usize {
    let what = format!("{} rank {rank}", file.display());
    let rep = report(file, extra);
    let d = &rep["devices"][0];
    let shape = &d["attribution"]["pipeline"]["shape"];
    if let Some((ranks, chunks)) = shape_want {
        assert_eq!(shape["ranks"].as_u64(), Some(ranks), "{what}: {shape}");
        assert_eq!(shape["chunks"].as_u64(), Some(chunks), "{what}: {shape}");
    }
    assert_eq!(shape["rank"].as_u64(), Some(rank as u64), "{what}: {shape}");
    let steps = d["steps"].as_array().unwrap();
    let gib = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    let mut last_end: Option<u64> = None;
    let printed = printed_steps(log, rank);
    assert!(!printed.is_empty(), "{what}");
    let mut checked = 0;
    for (step, iterations, want) in printed {
        let rows: Vec<&Value> = steps.iter().filter(|r| r["step"] == step).collect();
        let end = match rows.last() {
            Some(r) => {
                let it = r["iterations"].as_u64();
                assert_eq!(it, Some(iterations), "{what} step {step} iterations");
                r["end_allocated_bytes"].as_u64()
            }
            None => {
                // a loop of no iteration ends where the next step starts
                assert_eq!(iterations, 0, "{what}: step {step} has no row");
                steps
                    .iter()
                    .find(|r| (step + 1..=8).contains(&r["step"].as_u64().unwrap()))
                    .and_then(|r| r["start_allocated_bytes"].as_u64())
                    .or(last_end)
            }
        };
        assert_eq!(end.map(gib), Some(want), "{what} step {step}");
        last_end = end;
        checked += 1;
    }
    checked
}

/// The pipelines of the size sweeps (2 ranks with 4 to 16 micro-batches, 4 ranks with 8 to 24),
/// first and last rank: N = 2P, where step 4 runs once and rank 0 starts it with an
/// overlapped call, included.
#[test]
fn every_sweep_pipeline_ends_its_steps_where_it_printed() {
    let dir = testdata("snapshots/sweeps/pipe");
    let mut checked = 0;
    for (tag, ranks, chunks) in [
        ("pp2n4", 2, 4),
        ("pp2n6", 2, 6),
        ("pp2n8", 2, 8),
        ("pp2n16", 2, 16),
        ("pp4n8", 4, 8),
        ("pp4n12", 4, 12),
        ("pp4n16", 4, 16),
        ("pp4n24", 4, 24),
    ] {
        let log = std::fs::read_to_string(dir.join(format!("{tag}.log"))).unwrap();
        for rank in [0, ranks - 1] {
            let file = dir.join(format!("memory_snapshot_rank{rank}_{tag}_step0.pickle.xz"));
            checked += check_rank(&file, &log, rank, &[], Some((ranks as u64, chunks)));
        }
    }
    assert!(checked >= 60, "{checked}");
}

/// Pipelines of 4 and 8 ranks (micro-batches N = 2P, the edge, and N = 3P), every rank: the
/// inferred shape, each step's end and iteration count equal what the program printed.
#[test]
fn every_rank_of_every_pipeline_shape() {
    let mut checked = 0;
    checked += check_pipeline("pp4n8", &[], &[0, 1, 2, 3], Some(8));
    checked += check_pipeline("pp4n12", &[], &[0, 1, 2, 3], Some(12));
    checked += check_pipeline("pp8n16", &[], &[0, 1, 2, 3, 4, 5, 6, 7], Some(16));
    assert!(checked >= 64, "{checked}");
}

/// The same with the source at hand: steps from the `# Step N` comments give the same table.
#[test]
fn pipelines_from_source_equal_inferred() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/snapgen");
    if !root.is_dir() {
        let Some(_) = shared() else { return };
    }
    let root = root.to_string_lossy().into_owned();
    for (folder, ranks) in [("pp4n8", 4u32), ("pp8n16", 8), ("pp2oom", 1)] {
        let dir = testdata(&format!("snapshots/pipelines/{folder}"));
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if !p.to_string_lossy().ends_with(".pickle.xz") {
                continue;
            }
            let inferred = report(&p, &[]);
            let from_source = report(&p, &["--source-root", &root]);
            let steps_from = &from_source["devices"][0]["attribution"]["pipeline"]["steps_from"];
            assert_eq!(steps_from["from"], "source", "{}", p.display());
            let table = |r: &Value| -> Vec<(String, u64, Option<u64>)> {
                r["devices"][0]["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| {
                        (
                            s["label"].as_str().unwrap().to_string(),
                            s["end_allocated_bytes"].as_u64().unwrap(),
                            s["iterations"].as_u64(),
                        )
                    })
                    .collect()
            };
            assert_eq!(table(&inferred), table(&from_source), "{}", p.display());
        }
        let _ = ranks;
    }
}

/// A pipeline cut short by an out-of-memory error in step 4: the steps before the cut have
/// their exact ends and iteration counts, and the number of micro-batches is not claimed.
#[test]
fn a_pipeline_cut_short_by_an_oom() {
    check_pipeline("pp2oom", &[], &[0], None);
    let dir = testdata("snapshots/pipelines/pp2oom");
    let file = dir.join("memory_snapshot_rank0_pp2oom.pickle.xz");
    let rep = report(&file, &[]);
    let pipeline = &rep["devices"][0]["attribution"]["pipeline"];
    assert_eq!(pipeline["chunks_known"], false, "{pipeline}");
    assert_eq!(pipeline["shape"]["ranks"], 2);
    let steps = rep["devices"][0]["steps"].as_array().unwrap();
    let s4 = steps.iter().find(|s| s["step"] == 4).unwrap();
    assert!(s4["iterations"].is_null(), "{s4}");
    let log = std::fs::read_to_string(dir.join("train.log")).unwrap();
    assert!(log.contains("CUDA out of memory"));
}

/// What a rank of a cut pipeline printed in exact bytes: `(step, iterations, bytes)` after
/// each step, and `(step, iteration, bytes)` after each iteration of steps 1 and 4.
type Printed = (Vec<(u64, u64, u64)>, Vec<(u64, u64, u64)>);

fn printed_bytes(log: &str, rank: u64) -> Printed {
    let prefix = format!("[rank={rank} pp={rank}] ");
    let mut steps = Vec::new();
    let mut loops = Vec::new();
    for l in log.lines().filter_map(|l| l.strip_prefix(&prefix)) {
        let Some(bytes) = l
            .split_once("bytes=")
            .and_then(|(_, b)| b.split(' ').next()?.parse::<u64>().ok())
        else {
            continue;
        };
        if let Some(rest) = l.strip_prefix("After Step") {
            let (step, rest) = rest.split_once(" (").unwrap();
            let iterations = rest.split(' ').next().unwrap().parse().unwrap();
            if let Ok(step) = step.parse::<u64>() {
                steps.push((step, iterations, bytes));
            }
        } else if let Some(rest) = l.strip_prefix("Step") {
            let step = rest[..1].parse().unwrap();
            let i = rest.split_once("i=").unwrap().1.split(':').next().unwrap();
            loops.push((step, i.parse().unwrap(), bytes));
        }
    }
    (steps, loops)
}

/// Pipelines cut short by an out-of-memory error in steps 1 to 4 (2 and 4 ranks, with and
/// without expandable segments, Python-only and full stacks): every step that ran to its end
/// has the iteration count and the end the program printed in bytes, each iteration of
/// steps 1 and 4 ends where it printed, the step the error stopped is claimed no count, and
/// the step table is the same with the source at hand.
#[test]
fn pipelines_cut_short_keep_the_steps_that_ran() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/snapgen");
    let with_source = root.is_dir() || shared().is_some();
    let root = root.to_string_lossy().into_owned();
    let cut = testdata("snapshots/pipelines/cut");
    let (mut steps_checked, mut loops_checked, mut files) = (0, 0, 0);
    let mut cut_in = std::collections::BTreeSet::new();
    for dir in std::fs::read_dir(&cut).unwrap() {
        let dir = dir.unwrap().path();
        let log = std::fs::read_to_string(dir.join("train.log")).unwrap();
        assert!(log.contains("CUDA out of memory"), "{}", dir.display());
        for entry in std::fs::read_dir(&dir).unwrap() {
            let file = entry.unwrap().path();
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("memory_snapshot_rank") else {
                continue;
            };
            let rank: u64 = rest.split('_').next().unwrap().parse().unwrap();
            let what = format!("{} rank {rank}", dir.display());
            let (printed, loops) = printed_bytes(&log, rank);
            let rep = report(&file, &[]);
            let d = &rep["devices"][0];
            let rows = d["steps"].as_array().unwrap();
            let pipeline = &d["attribution"]["pipeline"];
            // the error stopped the step after the last one printed
            let stopped = printed.last().map_or(1, |p| p.0 + 1);
            assert_eq!(pipeline["cut_in"].as_u64(), Some(stopped), "{what}");
            cut_in.insert(stopped);
            for &(step, iterations, bytes) in &printed {
                let row = rows.iter().rev().find(|r| r["step"] == step);
                match row {
                    Some(r) => {
                        assert_eq!(r["iterations"].as_u64(), Some(iterations), "{what} {step}");
                        assert_eq!(
                            r["end_allocated_bytes"].as_u64(),
                            Some(bytes),
                            "{what} {step}"
                        );
                    }
                    None => assert_eq!(iterations, 0, "{what}: step {step} has no row"),
                }
                steps_checked += 1;
            }
            for &(step, i, bytes) in loops.iter().filter(|l| l.0 < stopped) {
                let row = rows.iter().find(|r| r["step"] == step).unwrap();
                let ends = row["iteration_end_allocated_bytes"].as_array().unwrap();
                assert_eq!(
                    ends[i as usize].as_u64(),
                    Some(bytes),
                    "{what} {step} i={i}"
                );
                loops_checked += 1;
            }
            let last = rows.iter().rev().find(|r| r["step"] == stopped).unwrap();
            assert!(last["iterations"].is_null(), "{what}: {last}");
            if with_source {
                let from = report(&file, &["--source-root", &root]);
                let table = |r: &Value| -> Vec<(String, Value, Value)> {
                    r["devices"][0]["steps"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| {
                            let label = s["label"].as_str().unwrap().to_string();
                            (
                                label,
                                s["end_allocated_bytes"].clone(),
                                s["iterations"].clone(),
                            )
                        })
                        .collect()
                };
                assert_eq!(
                    from["devices"][0]["attribution"]["pipeline"]["steps_from"]["from"],
                    "source"
                );
                assert_eq!(table(&from), table(&rep), "{what}");
            }
            files += 1;
        }
    }
    eprintln!("{files} files: {steps_checked} step ends, {loops_checked} iteration ends");
    assert!(files >= 17 && steps_checked >= 19 && loops_checked >= 46);
    assert_eq!(cut_in.into_iter().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    // the text says where the pipeline stopped
    let d80 = cut.join("d80/memory_snapshot_rank0_d80.pickle.xz");
    let text = ok(&["report", &d80.to_string_lossy()]);
    assert!(
        text.contains("pipeline rank 0 of 2, at least 4 micro-batches; cut short in step 3"),
        "{text}"
    );
}

/// Stages of generic programs read like a model summary: the module path, with class names
/// when the source is at hand, and the layer of a loop over layers.
#[test]
fn module_paths_with_classes_and_layers() {
    // the example recorder's model: TinyLM with four Blocks; its source is in examples/
    let file = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let rep = report(&file, &["--source-root", &examples.to_string_lossy()]);
    let stages = rep["devices"][0]["peak_breakdown"]["stage"].to_string();
    for k in 0..4 {
        assert!(
            stages.contains(&format!("TinyLM.forward › Block[{k}].forward")),
            "{stages}"
        );
    }
    // transformers without its source: files, functions and lines, four decoder layers
    let file = testdata("snapshots/transformers/memory_snapshot_llama_rank0.pickle.xz");
    let rep = report(&file, &[]);
    let stages = rep["devices"][0]["peak_breakdown"]["stage"].to_string();
    for k in 0..4 {
        assert!(
            stages.contains(&format!("modeling_llama.py:forward[{k}]:322")),
            "{stages}"
        );
    }
    assert!(!stages.contains("forward[4]"), "{stages}");
}

/// DDP's gradient buckets, built in the first forward, are communication buffers.
#[test]
fn ddp_gradient_buckets_are_communication() {
    for rank in 0..2 {
        let file = testdata(&format!(
            "snapshots/transformers/memory_snapshot_gpt2_ddp_rank{rank}.pickle.xz"
        ));
        let rep = report(&file, &[]);
        let cats = rep["devices"][0]["peak_breakdown"]["category"]
            .as_array()
            .unwrap()
            .clone();
        let comm = cats
            .iter()
            .find(|c| c["label"] == "communication")
            .and_then(|c| c["bytes"].as_u64())
            .unwrap_or(0);
        // GPT-2 here has 60 M parameters in fp32: 25 MiB buckets hold about 111 MiB
        assert!(comm > 100 << 20, "rank {rank}: {cats:?}");
    }
}

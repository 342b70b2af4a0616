//! `memsnap diff`: the change of each peak against what the programs printed, causes whose
//! effects add up to it exactly, no change for a run against itself, budgets, Markdown and
//! folders of ranks.

use serde_json::Value;

use crate::util::*;

/// `max_memory_allocated=` and `max_memory_reserved=` of the first `PEAK` line of a log (of
/// `[rank=R]` when given).
fn printed_peaks(log: &str, rank: Option<u32>) -> (i64, i64) {
    let text = std::fs::read_to_string(testdata(log)).expect("the log is bundled");
    let line = text
        .split(['\n', '['])
        .find(|l| {
            l.contains("PEAK ")
                && l.contains("max_memory_allocated=")
                && rank.is_none_or(|r| l.starts_with(&format!("rank={r}]")))
        })
        .unwrap_or_else(|| panic!("{log} has a PEAK line"));
    let field = |name: &str| -> i64 {
        let at = line.find(name).expect("the field") + name.len();
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a number")
    };
    (
        field("max_memory_allocated="),
        field("max_memory_reserved="),
    )
}

/// `memsnap diff BASE NEW --json EXTRA...`: its one object.
fn diff(base: &str, new: &str, extra: &[&str]) -> Value {
    let (b, n) = (testdata(base), testdata(new));
    let (b, n) = (b.to_string_lossy(), n.to_string_lossy());
    let mut args = vec!["diff", b.as_ref(), n.as_ref()];
    args.extend_from_slice(extra);
    json(&args)
}

/// The effects of the causes add up to the change of the peak, which is the printed change,
/// and both runs' peaks rebuilt on the shared timeline are their replayed ones.
fn check_adds_up(d: &Value, printed: (i64, i64), printed_new: (i64, i64)) {
    let delta = d["peak_allocated_delta_bytes"].as_i64().unwrap();
    assert_eq!(
        delta,
        printed_new.0 - printed.0,
        "the printed change of the peak"
    );
    assert_eq!(
        d["peak_reserved_delta_bytes"].as_i64().unwrap(),
        printed_new.1 - printed.1,
        "the printed change of the reserved peak"
    );
    let sum: i64 = d["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["peak_effect_bytes"].as_i64().unwrap())
        .sum();
    assert_eq!(sum, delta, "the effects add up to the change");
    assert_eq!(d["exact"], true);
    for c in d["causes"].as_array().unwrap() {
        for key in ["kind", "site", "module", "category", "step", "phase"] {
            assert!(c[key].is_string(), "{key} in {c}");
        }
    }
}

const CNN: &str = "snapshots/sweeps/cnn";
const SWEEPS: &str = "snapshots/sweeps";

#[test]
fn a_run_against_itself_is_no_change() {
    for f in [
        "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
        "snapshots/sweeps/cnn/memory_snapshot_cnn_32.pickle.xz",
        "snapshots/pipelines/pp4n8/memory_snapshot_rank0_pp4n8_step0.pickle.xz",
    ] {
        let d = diff(f, f, &[]);
        assert_eq!(d["verdict"], "no change", "{f}");
        assert_eq!(d["causes"].as_array().unwrap().len(), 0);
        assert_eq!(d["peak_allocated_delta_bytes"], 0);
        assert_eq!(d["peak_reserved_delta_bytes"], 0);
        let p = testdata(f);
        let p = p.to_string_lossy();
        let text = ok(&["diff", &p, &p, "--max-increase", "0%"]);
        assert!(text.contains("No change"), "{text}");
    }
}

#[test]
fn effects_add_up_to_the_printed_change() {
    let pairs = [
        (
            "cnn/memory_snapshot_cnn_16",
            "cnn/cnn_16.log",
            "cnn/memory_snapshot_cnn_32",
            "cnn/cnn_32.log",
        ),
        (
            "cnn/memory_snapshot_cnn_64",
            "cnn/cnn_64.log",
            "cnn/memory_snapshot_cnn_32",
            "cnn/cnn_32.log",
        ),
        (
            "sdpa/memory_snapshot_sdpa_1024",
            "sdpa/sdpa_1024.log",
            "eager/memory_snapshot_eager_1024",
            "eager/eager_1024.log",
        ),
        (
            "sdpa/memory_snapshot_sdpa_256",
            "sdpa/sdpa_256.log",
            "sdpa/memory_snapshot_sdpa_512",
            "sdpa/sdpa_512.log",
        ),
    ];
    for (b, bl, n, nl) in pairs {
        let d = diff(
            &format!("{SWEEPS}/{b}.pickle.xz"),
            &format!("{SWEEPS}/{n}.pickle.xz"),
            &[],
        );
        let (pb, pn) = (
            printed_peaks(&format!("{SWEEPS}/{bl}"), None),
            printed_peaks(&format!("{SWEEPS}/{nl}"), None),
        );
        check_adds_up(&d, pb, pn);
        assert_eq!(d["verdict"], "changed");
    }
}

#[test]
fn pipelines_of_more_micro_batches_rank_by_rank() {
    // two folders of ranks, matched by rank: one JSON object per rank
    let (b, n) = (
        testdata("snapshots/pipelines/pp4n8"),
        testdata("snapshots/pipelines/pp4n12"),
    );
    let out = ok(&["diff", &b.to_string_lossy(), &n.to_string_lossy(), "--json"]);
    let diffs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(diffs.len(), 4);
    for (r, d) in diffs.iter().enumerate() {
        assert_eq!(d["rank"], format!("rank {r}"));
        let sum: i64 = d["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["peak_effect_bytes"].as_i64().unwrap())
            .sum();
        assert_eq!(sum, d["peak_allocated_delta_bytes"].as_i64().unwrap());
        assert_eq!(d["exact"], true);
        // more micro-batches: more allocations at the same sites
        assert!(d["causes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["kind"] == "count" && c["blocks_new"].as_u64() > c["blocks_base"].as_u64()));
    }
    let text = ok(&["diff", &b.to_string_lossy(), &n.to_string_lossy()]);
    assert!(
        text.contains("rank 3") && text.contains("── rank 0 ──"),
        "{text}"
    );
}

#[test]
fn a_larger_batch_is_said_to_scale_sizes() {
    let d = diff(
        &format!("{CNN}/memory_snapshot_cnn_32.pickle.xz"),
        &format!("{CNN}/memory_snapshot_cnn_64.pickle.xz"),
        &[],
    );
    assert_eq!(d["scaling"]["ratio"], 2.0, "{}", d["scaling"]);
    // one change: every size scaled by the ratio, its sites as its parts
    let top = &d["causes"][0];
    assert_eq!(top["kind"], "size");
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .starts_with("sizes scaled ×2.00"),
        "{top}"
    );
    assert!(
        top["category"].as_str().unwrap().starts_with("activation"),
        "{top}"
    );
    let parts = top["parts"].as_array().expect("its causes");
    assert!(parts.len() > 3, "{top}");
    assert!(
        parts.iter().all(|p| p["kind"] == "size" && {
            // each site's ratio within 5% of the common one
            let what = p["what"].as_str().unwrap();
            let r: f64 = what.rsplit("(×").next().unwrap()[..4].parse().unwrap();
            (r - 2.0).abs() <= 0.1
        }),
        "{top}"
    );
    let sum: i64 = parts
        .iter()
        .map(|p| p["peak_effect_bytes"].as_i64().unwrap())
        .sum();
    assert_eq!(sum, top["peak_effect_bytes"].as_i64().unwrap());
}

/// A cause that is eager attention's allocations, with the sdpa allocations they replaced.
fn eager_in_place_of_sdpa(top: &Value) {
    assert_eq!(top["kind"], "new", "{top}");
    assert!(
        top["site"]
            .as_str()
            .unwrap()
            .contains("eager_attention_forward"),
        "{top}"
    );
    assert!(
        top["what"].as_str().unwrap().contains("in place of"),
        "the sdpa allocations it replaced are part of it: {top}"
    );
}

#[test]
fn eager_attention_is_the_largest_cause() {
    let d = diff(
        &format!("{SWEEPS}/sdpa/memory_snapshot_sdpa_1024.pickle.xz"),
        &format!("{SWEEPS}/eager/memory_snapshot_eager_1024.pickle.xz"),
        &[],
    );
    eager_in_place_of_sdpa(&d["causes"][0]);
    assert!(d["scaling"].is_null(), "no batch change: {}", d["scaling"]);
}

#[test]
fn budgets_fail_the_job_with_one_line() {
    let b = testdata(&format!("{CNN}/memory_snapshot_cnn_32.pickle.xz"));
    let n = testdata(&format!("{CNN}/memory_snapshot_cnn_64.pickle.xz"));
    let (b, n) = (b.to_string_lossy(), n.to_string_lossy());
    let run = |extra: &[&str]| {
        let mut args = vec!["diff", b.as_ref(), n.as_ref(), "--quiet"];
        args.extend_from_slice(extra);
        memsnap(&args)
    };
    // +90.2%: over 5%, within 100%
    let o = run(&["--max-increase", "5%"]);
    one_line_failure(&o, 1, "budget broken: peak allocated grew by");
    assert!(stderr(&o).contains("--max-increase 5%"));
    assert!(
        stdout(&o).contains("Why the peak changed"),
        "the causes still print"
    );
    assert!(run(&["--max-increase", "100%"]).status.success());
    one_line_failure(&run(&["--max-peak", "5GiB"]), 1, "over --max-peak 5.00 GiB");
    assert!(run(&["--max-peak", "6GiB"]).status.success());
    one_line_failure(
        &run(&["--max-reserved-increase", "1GiB"]),
        1,
        "peak reserved grew by",
    );
    // a budget file beside the test; the command line wins over it
    let dir = scratch();
    let budget = write(&dir, "memory-budget.json", br#"{"max_increase": "10%"}"#);
    one_line_failure(&run(&["--budget", &budget]), 1, "--max-increase 10%");
    assert!(run(&["--budget", &budget, "--max-increase", "95%"])
        .status
        .success());
    // usage errors: exit 2
    let o = run(&["--max-increase", "lots"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let bad = write(&dir, "bad.json", br#"{"max_peek": "1GiB"}"#);
    one_line_failure(&run(&["--budget", &bad]), 2, "unknown limit \"max_peek\"");
}

#[test]
fn markdown_for_a_pull_request_with_both_timelines() {
    let b = testdata(&format!("{CNN}/memory_snapshot_cnn_32.pickle.xz"));
    let n = testdata(&format!("{CNN}/memory_snapshot_cnn_64.pickle.xz"));
    let dir = scratch();
    let png = dir.path().join("diff.png");
    let md = ok(&[
        "diff",
        &b.to_string_lossy(),
        &n.to_string_lossy(),
        "--markdown",
        "--png",
        &png.to_string_lossy(),
        "--top",
        "3",
    ]);
    assert!(md.starts_with("### memsnap diff: changed"), "{md}");
    assert!(md.contains("![base and new, one y axis]("), "{md}");
    let header = |l: &str| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        cells.get(1..4) == Some(&["effect", "kind", "what"][..])
    };
    assert!(md.lines().any(header), "{md}");
    // three causes and the row of the rest, each change's own causes under it (`↳`)
    let effect = |l: &str| l.split('|').nth(1).map(|c| c.trim().to_string());
    let rows = md
        .lines()
        .filter_map(effect)
        .filter(|e| {
            e.starts_with('+') || (e.starts_with('-') && !e.starts_with("--")) || e == "0 B"
        })
        .count();
    assert_eq!(rows, 4, "{md}");
    assert!(
        md.lines().filter_map(effect).any(|e| e.starts_with("↳ +")),
        "{md}"
    );
    let bytes = std::fs::read(&png).expect("the chart was written");
    assert!(bytes.starts_with(b"\x89PNG"));
}

#[test]
fn files_and_folders_do_not_mix() {
    let f = testdata(&format!("{CNN}/memory_snapshot_cnn_32.pickle.xz"));
    let dir = testdata(CNN);
    let o = memsnap(&["diff", &f.to_string_lossy(), &dir.to_string_lossy()]);
    one_line_failure(&o, 2, "give two files or two folders");
}

/// `max_memory_allocated` and `max_memory_reserved` of one run of the allocator workload, as
/// `results.jsonl` holds them.
fn allocator_run(name: &str) -> (i64, i64) {
    let text = std::fs::read_to_string(testdata("snapshots/allocator/results.jsonl")).unwrap();
    let run: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["name"] == name)
        .expect("the run is listed");
    (
        run["max_memory_allocated"].as_i64().unwrap(),
        run["max_memory_reserved"].as_i64().unwrap(),
    )
}

#[test]
fn expandable_segments_are_the_allocator_alone() {
    // the same workload, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the new run
    let d = diff(
        "snapshots/allocator/default.pickle.xz",
        "snapshots/allocator/expandable.pickle.xz",
        &[],
    );
    check_adds_up(&d, allocator_run("default"), allocator_run("expandable"));
    assert_eq!(d["verdict"], "allocator only");
    let causes = d["causes"].as_array().unwrap();
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0]["kind"], "allocator");
    assert!(causes[0]["what"]
        .as_str()
        .unwrap()
        .contains("expandable_segments:True"));
    // the settings' part and the requests' part of the reserved change add up to it
    let r = &d["reserved"];
    assert_eq!(r["settings_differ"], true);
    assert_eq!(
        r["settings_effect_bytes"].as_i64().unwrap() + r["requests_effect_bytes"].as_i64().unwrap(),
        d["peak_reserved_delta_bytes"].as_i64().unwrap()
    );
    assert_eq!(r["requests_effect_bytes"], 0, "the same requests");
}

#[test]
fn the_same_program_twice_is_no_change() {
    // the workload again, under a cap above its reserved peak: nothing it did differs
    let d = diff(
        "snapshots/allocator/default.pickle.xz",
        "snapshots/allocator/cap_reserved.pickle.xz",
        &[],
    );
    check_adds_up(&d, allocator_run("default"), allocator_run("cap_reserved"));
    assert_eq!(d["verdict"], "no change");
    let (b, n) = (
        testdata("snapshots/allocator/default.pickle.xz"),
        testdata("snapshots/allocator/cap_reserved.pickle.xz"),
    );
    let o = memsnap(&[
        "diff",
        &b.to_string_lossy(),
        &n.to_string_lossy(),
        "--max-increase",
        "0%",
        "--max-reserved-increase",
        "0%",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("No change"));
}

#[test]
fn checkpointing_switched_off_is_named() {
    // a transformers Llama with gradient checkpointing (base) and without (new)
    let t = "snapshots/transformers";
    let d = diff(
        &format!("{t}/memory_snapshot_llama_ckpt_rank0.pickle.xz"),
        &format!("{t}/memory_snapshot_llama_rank0.pickle.xz"),
        &[],
    );
    check_adds_up(
        &d,
        printed_peaks(&format!("{t}/llama_ckpt.log"), None),
        printed_peaks(&format!("{t}/llama.log"), None),
    );
    let notes = d["notes"].to_string();
    assert!(
        notes.contains("Activation checkpointing is on in the base run"),
        "{notes}"
    );
    let top = &d["causes"][0];
    assert_eq!(top["kind"], "life", "{top}");
    assert!(
        top["category"].as_str().unwrap().starts_with("activation"),
        "{top}"
    );
    let what = top["what"].as_str().unwrap();
    assert!(
        what.starts_with("activation checkpointing off: ")
            && what.contains("freed in forward")
            && what.contains("now alive until backward"),
        "{what}"
    );
    // every decoder layer's blocks in one cause
    assert!(top["module"].as_str().unwrap().contains("[0…3]"), "{top}");
}

/// The planted pairs of `testdata/record/diff_pairs.py` (one change each, recorded on the
/// device): `PLANT bytes=` of a log, when it printed one.
fn plant_bytes(log: &str) -> Option<i64> {
    let text = std::fs::read_to_string(testdata(log)).expect("the log is bundled");
    let line = text.lines().find(|l| l.starts_with("PLANT "))?;
    line.rsplit("bytes=").next()?.trim().parse().ok()
}

const PLANTED: &str = "snapshots/diff";

/// `memsnap diff --json` of one planted pair, whose change of both peaks is the printed one
/// and whose effects add up to it.
fn planted_diff(pair: &str) -> Value {
    let dir = format!("{PLANTED}/{pair}");
    let d = diff(
        &format!("{dir}/base.pickle.xz"),
        &format!("{dir}/new.pickle.xz"),
        &[],
    );
    check_adds_up(
        &d,
        printed_peaks(&format!("{dir}/base.log"), None),
        printed_peaks(&format!("{dir}/new.log"), None),
    );
    d
}

/// A planted pair that changed ([`planted_diff`]): its diff and the printed change of its
/// peak. The allocator's rounding of the same requests, where the settings are the same, is a
/// part of the change that moved the peak most, and stays small beside it.
fn planted(pair: &str) -> (Value, i64) {
    let d = planted_diff(pair);
    assert_eq!(d["verdict"], "changed", "{pair}");
    let delta = d["peak_allocated_delta_bytes"].as_i64().unwrap();
    let causes = d["causes"].as_array().unwrap();
    assert!(
        causes
            .iter()
            .all(|c| c["kind"] != "allocator" || c["peak_effect_bytes"] == 0),
        "{pair}: the rounding that moved the peak is a change's part"
    );
    let rounding: i64 = causes
        .iter()
        .flat_map(|c| c["parts"].as_array().into_iter().flatten())
        .filter(|p| p["kind"] == "allocator")
        .map(|p| p["peak_effect_bytes"].as_i64().unwrap())
        .sum();
    assert!(
        rounding.abs() * 10 <= delta.abs(),
        "{pair}: {rounding} of {delta}"
    );
    (d, delta)
}

/// The effect of a change's own causes, without the allocator's rounding that joined it.
fn without_rounding(change: &Value) -> i64 {
    let rounding: i64 = change["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["kind"] == "allocator")
        .map(|p| p["peak_effect_bytes"].as_i64().unwrap())
        .sum();
    change["peak_effect_bytes"].as_i64().unwrap() - rounding
}

/// The top cause's effect on the peak, checked to be within 1% of `of`.
fn top_within_a_percent(d: &Value, of: i64) -> &Value {
    let top = &d["causes"][0];
    let effect = top["peak_effect_bytes"].as_i64().unwrap();
    assert!(
        (effect - of).abs() * 100 <= of.abs(),
        "{effect} against {of}: {top}"
    );
    top
}

/// The first cause of `d` whose site or module holds `name`, and its rank.
fn cause_at<'d>(d: &'d Value, name: &str) -> Option<(usize, &'d Value)> {
    d["causes"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .find(|(_, c)| {
            c["site"].as_str().unwrap().contains(name)
                || c["module"].as_str().unwrap().contains(name)
        })
}

/// A list kept every step's logits (a logging bug): one cause, the logits now alive to the
/// end, whose effect is the whole change of the peak.
#[test]
fn logits_kept_in_a_list_are_one_life_cause() {
    let (d, delta) = planted("logits_kept");
    let top = &d["causes"][0];
    assert_eq!(top["kind"], "life", "{top}");
    assert!(
        top["site"]
            .as_str()
            .unwrap()
            .contains("modeling_llama.py:forward"),
        "{top}"
    );
    assert_eq!(top["peak_effect_bytes"].as_i64().unwrap(), delta, "{top}");
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .ends_with("now alive to the end"),
        "{top}"
    );
    // the three kept logits are what the program counted
    let plant = plant_bytes(&format!("{PLANTED}/logits_kept/new.log")).unwrap();
    assert_eq!(top["bytes_new"].as_i64().unwrap(), plant, "{top}");
    assert_eq!(top["category"], "activation");
}

/// `gradient_checkpointing` off in a transformers Trainer: checkpointing said in words, and
/// the activations of all four layers now kept until backward are the top cause.
#[test]
fn checkpointing_off_in_a_trainer_is_the_top_cause() {
    let (d, delta) = planted("ckpt_off");
    assert!(d["notes"]
        .to_string()
        .contains("Activation checkpointing is on in the base run"));
    // the layers' activations kept, with their calls through the checkpoint's own path
    let top = top_within_a_percent(&d, delta);
    assert_eq!(top["kind"], "life", "{top}");
    assert!(
        top["category"].as_str().unwrap().starts_with("activation"),
        "{top}"
    );
    assert!(
        top["module"].as_str().unwrap().contains("forward[0…3]"),
        "{top}"
    );
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .starts_with("activation checkpointing off"),
        "{top}"
    );
}

/// sdpa → eager attention (transformers Llama): the eager attention's allocations, in place
/// of sdpa's, are the top cause and hold the attention probabilities the program counted.
#[test]
fn eager_attention_in_place_of_sdpa_is_the_top_cause() {
    let (d, delta) = planted("sdpa_eager");
    let top = &d["causes"][0];
    eager_in_place_of_sdpa(top);
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .contains("sdpa_attention_forward"),
        "{top}"
    );
    let plant = plant_bytes(&format!("{PLANTED}/sdpa_eager/new.log")).unwrap();
    assert!(top["bytes_new"].as_i64().unwrap() >= plant, "{top}");
    // with it, in the same layers: the rotary embeddings' outputs, now freed in forward
    // (eager attention saves others for backward)
    top_within_a_percent(&d, delta);
    let parts = top["parts"].as_array().expect("its causes");
    assert!(
        parts.iter().any(|p| p["kind"] == "life"
            && p["site"].as_str().unwrap().contains("apply_rotary_pos_emb")
            && p["peak_effect_bytes"].as_i64().unwrap() < 0),
        "{top}"
    );
}

/// `zero_grad(set_to_none=False)`: the gradients, once freed at `zero_grad`, now alive to the
/// end, the top cause, with the bytes the program counted (within the allocator's rounding).
#[test]
fn gradients_kept_by_zero_grad_are_the_top_cause() {
    let (d, delta) = planted("zero_grad_keep");
    // with the later steps' gradients, now freed in backward once accumulated
    let top = top_within_a_percent(&d, delta);
    assert_eq!(top["kind"], "life", "{top}");
    assert_eq!(top["category"], "gradient", "{top}");
    let what = top["what"].as_str().unwrap();
    assert!(
        what.contains("zero_grad") && what.contains("now alive to the end;"),
        "{what}"
    );
    // its largest part: the gradients kept, as many bytes as the program counted
    let plant = plant_bytes(&format!("{PLANTED}/zero_grad_keep/new.log")).unwrap();
    let held = top["parts"][0]["bytes_new"].as_i64().unwrap();
    assert!(
        (held - plant).abs() * 100 <= plant * 5,
        "{held} against {plant}"
    );
}

/// A timm ViT's head kept in fp32: the model's state is the top change, made of the head's
/// fp32 weight, its gradient and the AdamW state of twice the size, whose bytes on the peak
/// are the ones the program counted, and the allocator's rounding that came with them.
#[test]
fn a_head_kept_in_fp32_is_named() {
    let (d, delta) = planted("fp32_head");
    let (rank, c) = cause_at(&d, "diff_pairs.py:fp32_head").expect("a cause at the head");
    assert_eq!(rank, 0, "{c}");
    let top = top_within_a_percent(&d, delta);
    // the state's own bytes on the peak are the program's; the allocator's rounding that came
    // with them (blocks of other sizes for the same requests) is said as its last part
    let plant = plant_bytes(&format!("{PLANTED}/fp32_head/new.log")).unwrap();
    let effect = without_rounding(top);
    assert!(
        (effect - plant).abs() * 100 <= plant,
        "{effect} against {plant}"
    );
    let parts = top["parts"].as_array().unwrap();
    assert_eq!(parts.last().unwrap()["kind"], "allocator", "{top}");
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .contains("; with the allocator's rounding of the same requests, +"),
        "{top}"
    );
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .starts_with("the model's state: "),
        "{top}"
    );
    for category in ["parameter", "gradient", "optimizer state"] {
        assert!(
            top["category"].as_str().unwrap().contains(category),
            "{top}"
        );
    }
    let state = top["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["category"] == "optimizer state" && c["kind"] == "size")
        .expect("the AdamW state grew");
    assert!(
        state["what"].as_str().unwrap().contains("(×2.00)"),
        "{state}"
    );
}

/// A larger batch (Lightning on torchvision resnet18, 16 → 24; a plain MLP, 64 → 96): the
/// activations' sizes are the causes, each ×1.50, and they make the change of the peak.
#[test]
fn a_larger_batch_is_sizes_scaled_by_its_ratio() {
    for pair in ["larger_batch", "mlp_batch"] {
        let (d, delta) = planted(pair);
        let top = top_within_a_percent(&d, delta);
        assert_eq!(top["kind"], "size", "{pair}: {top}");
        assert!(
            top["what"]
                .as_str()
                .unwrap()
                .starts_with("sizes scaled ×1.50"),
            "{pair}: {top}"
        );
        let by_size: i64 = d["causes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["kind"] == "size")
            .map(|c| c["peak_effect_bytes"].as_i64().unwrap())
            .sum();
        assert!(by_size * 100 >= delta * 95, "{pair}: {by_size} of {delta}");
    }
    for pair in ["larger_batch", "mlp_batch"] {
        let d = planted_diff(pair);
        assert_eq!(d["scaling"]["ratio"], 1.5, "{pair}: {}", d["scaling"]);
    }
}

/// The same program twice gives no change and exit 0 under a zero budget; expandable segments
/// switched on gives the allocator alone.
#[test]
fn planted_pairs_without_a_program_change() {
    let dir = format!("{PLANTED}/same");
    let d = planted_diff("same");
    assert_eq!(d["verdict"], "no change", "{d}");
    assert_eq!(d["peak_allocated_delta_bytes"], 0);
    let (b, n) = (
        testdata(&format!("{dir}/base.pickle.xz")),
        testdata(&format!("{dir}/new.pickle.xz")),
    );
    let text = ok(&[
        "diff",
        &b.to_string_lossy(),
        &n.to_string_lossy(),
        "--max-increase",
        "0%",
    ]);
    assert!(text.contains("No change"), "{text}");
    let d = planted_diff("expandable");
    assert_eq!(d["verdict"], "allocator only", "{d}");
    assert_eq!(d["reserved"]["settings_differ"], true, "{d}");
}

/// The planted pairs of `testdata/record/diff_pairs_more.py`: `PLANT bytes=` lines of a log
/// whose text holds `what`.
fn plant_of(log: &str, what: &str) -> i64 {
    let text = std::fs::read_to_string(testdata(log)).expect("the log is bundled");
    let line = text
        .lines()
        .find(|l| l.starts_with("PLANT ") && l.contains(what))
        .unwrap_or_else(|| panic!("{log}: no PLANT line of {what}"));
    line.rsplit("bytes=")
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// torch_geometric writes its message passing to a temporary file of a random name, another
/// in each run: the two names are read as one site, so a graph 1.5x larger is sizes scaled,
/// not every message-passing block gone in one run and new in the other.
#[test]
fn a_larger_graph_through_generated_code_is_sizes_scaled() {
    let (d, delta) = planted("gnn_batch");
    let top = top_within_a_percent(&d, delta);
    assert_eq!(top["kind"], "size", "{top}");
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .starts_with("sizes scaled ×1.50"),
        "{top}"
    );
    assert_eq!(d["scaling"]["ratio"], 1.5, "{}", d["scaling"]);
    // nothing is new or gone at the generated module
    for c in d["causes"].as_array().unwrap() {
        let at_generated = c["site"].as_str().unwrap().contains("propagate_");
        assert!(
            !(at_generated && (c["kind"] == "new" || c["kind"] == "gone")),
            "{c}"
        );
    }
}

/// A validation loss summed without `.item()` keeps each step's graph with its saved
/// activations: one change over every module the graph ran through, now kept to the end, as
/// many bytes as the program counted.
#[test]
fn a_kept_graph_is_one_change_kept_to_the_end() {
    let (d, delta) = planted("loss_graph_kept");
    let top = top_within_a_percent(&d, delta);
    assert_eq!(top["kind"], "life", "{top}");
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .contains("freed in other code, now alive to the end"),
        "{top}"
    );
    let plant = plant_of(
        &format!("{PLANTED}/loss_graph_kept/new.log"),
        "validation loss",
    );
    let kept = top["bytes_new"].as_i64().unwrap();
    assert!(
        (kept - plant).abs() * 100 <= plant,
        "{kept} against {plant}"
    );
    // the layers' blocks and the program's own line's, in one change
    let parts = top["parts"].as_array().unwrap();
    assert!(
        parts
            .iter()
            .any(|p| p["site"].as_str().unwrap().contains("loss_graph_kept:117")),
        "{top}"
    );
    assert!(
        parts
            .iter()
            .any(|p| p["module"].as_str().unwrap().contains("forward[0…1]")),
        "{top}"
    );
}

/// An evaluation loop without `torch.no_grad()`: the layers' activations, saved for a backward
/// that never comes, live past the forward.
#[test]
fn evaluation_without_no_grad_keeps_the_layers_activations() {
    let (d, delta) = planted("no_grad_eval");
    let top = top_within_a_percent(&d, delta);
    assert_eq!(top["kind"], "life", "{top}");
    assert_eq!(top["category"], "activation", "{top}");
    assert!(
        top["module"].as_str().unwrap().contains("modeling_bert.py"),
        "{top}"
    );
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .contains("freed in forward, now alive until other code"),
        "{top}"
    );
}

/// Two changes planted in one program (a list keeping each step's logits, a copy of the
/// weights kept on the GPU) are two changes, each at its own line, with the program's bytes.
#[test]
fn two_planted_changes_are_two_changes() {
    let d = planted_diff("two_changes");
    let log = format!("{PLANTED}/two_changes/new.log");
    let causes = d["causes"].as_array().unwrap();
    let (logits, ema) = (&causes[0], &causes[1]);
    assert_eq!(logits["kind"], "life", "{logits}");
    assert!(
        logits["what"]
            .as_str()
            .unwrap()
            .contains("freed in other code, now alive to the end"),
        "{logits}"
    );
    // three logits kept, two of them alive at the peak
    let kept = plant_of(&log, "logits");
    assert_eq!(logits["bytes_new"].as_i64().unwrap(), kept, "{logits}");
    assert_eq!(logits["alone_effect_bytes"].as_i64().unwrap(), kept / 3 * 2);
    // the copy of the weights: its own change, at its own line, its blocks the program's
    // tensors in whole blocks
    assert_eq!(ema["kind"], "count", "{ema}");
    assert!(
        ema["site"].as_str().unwrap().contains("two_changes:270"),
        "{ema}"
    );
    let copy = plant_of(&log, "EMA");
    let effect = ema["peak_effect_bytes"].as_i64().unwrap();
    assert!(
        effect >= copy && (effect - copy) * 100 <= copy * 2,
        "{effect} against {copy}"
    );
}

/// Every weight trained (no LoRA): the model's state is the top change, its optimizer state
/// AdamW's two buffers of every weight, which the program counted with the gradients.
#[test]
fn training_every_weight_instead_of_lora_is_the_models_state() {
    let (d, delta) = planted("peft_full");
    let top = &d["causes"][0];
    assert!(
        top["what"]
            .as_str()
            .unwrap()
            .starts_with("the model's state: optimizer state +"),
        "{top}"
    );
    let effect = top["peak_effect_bytes"].as_i64().unwrap();
    assert!(effect > 0 && effect < delta, "{effect} of {delta}");
    // AdamW's state is two fp32 buffers per weight: two thirds of gradients and state
    let plant = plant_bytes(&format!("{PLANTED}/peft_full/new.log")).unwrap();
    let state: i64 = top["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["category"] == "optimizer state")
        .map(|p| p["peak_effect_bytes"].as_i64().unwrap())
        .sum();
    assert!(
        (state * 3 - plant * 2).abs() * 100 <= plant * 2,
        "{state} against {plant}"
    );
}

/// bf16 autocast through accelerate: the change of the peak is explained to the byte, and a
/// layer's output pairs with its output (×0.50), not with the weight cast just before it at
/// the same line; its causes are not yet told as one change of dtype.
#[test]
fn mixed_precision_through_accelerate_pairs_outputs_with_outputs() {
    let d = planted_diff("accelerate_bf16");
    assert_eq!(d["verdict"], "changed");
    assert!(d["peak_allocated_delta_bytes"].as_i64().unwrap() < 0);
    let all: Vec<&Value> = d["causes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| std::iter::once(c).chain(c["parts"].as_array().into_iter().flatten()))
        .collect();
    let conv1d: Vec<&&Value> = all
        .iter()
        .filter(|c| {
            c["kind"] == "size"
                && c["site"]
                    .as_str()
                    .unwrap()
                    .contains("pytorch_utils.py:forward")
        })
        .collect();
    assert!(!conv1d.is_empty());
    for c in conv1d {
        let what = c["what"].as_str().unwrap();
        let r: f64 = what.rsplit("(×").next().unwrap()[..4].parse().unwrap();
        assert!(r >= 0.45, "{c}");
    }
}

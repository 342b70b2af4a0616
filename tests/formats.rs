//! Snapshots of PyTorch after 2.11: trace entries with pool ids, pinned host memory,
//! `annotate` entries and dict metadata (`testdata/snapshots/constructed/`, built from the
//! torch 2.11 recordings in `testdata/snapshots/pools/` by `make.py` there), checked against
//! what PyTorch itself printed while recording.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::util::*;

fn constructed(name: &str) -> String {
    testdata(&format!("snapshots/constructed/{name}.pickle.xz"))
        .to_string_lossy()
        .into_owned()
}

fn recorded(name: &str) -> String {
    testdata(&format!("snapshots/pools/{name}.pickle.xz"))
        .to_string_lossy()
        .into_owned()
}

/// The `MARK` lines of a recording's log, in order.
fn marks(name: &str) -> Vec<Value> {
    let log = std::fs::read_to_string(testdata(&format!("snapshots/pools/{name}.log"))).unwrap();
    log.lines()
        .filter_map(|l| l.strip_prefix("MARK "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn peak_line(name: &str) -> Value {
    let log = std::fs::read_to_string(testdata(&format!("snapshots/pools/{name}.log"))).unwrap();
    let line = log.lines().find_map(|l| l.strip_prefix("PEAK ")).unwrap();
    serde_json::from_str(line).unwrap()
}

/// A mark's reserved bytes per pool, as `(a, b) -> bytes`.
fn pools_of(mark: &Value) -> BTreeMap<(i64, i64), u64> {
    mark["reserved_by_pool"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let (a, b) = k.split_once(',').unwrap();
            (
                (a.parse().unwrap(), b.parse().unwrap()),
                v.as_u64().unwrap(),
            )
        })
        .collect()
}

fn self_check(file: &str) -> Value {
    let v = json(&["whatif", file]);
    v["devices"][0]["self_check"].clone()
}

/// With pool ids, the allocator simulation keeps each CUDA graph's pool and the `MemPool`
/// apart and reproduces every segment event of the recorded runs (one with expandable
/// segments); the same recordings without pool ids cannot be, and say why.
#[test]
fn pool_ids_make_the_simulation_exact_on_graphs_and_mempools() {
    for name in ["pools_default", "pools_expandable"] {
        let check = self_check(&constructed(&format!("{name}_pool_ids")));
        assert_eq!(check["exact"], true, "{name}: {check}");
        assert!(check["segment_events"].as_u64().unwrap() >= 20, "{check}");
        assert_eq!(check["note"], Value::Null, "{name}");
        let peak = peak_line(name);
        assert_eq!(
            check["simulated_peak_reserved_bytes"], peak["max_memory_reserved"],
            "{name}"
        );

        let old = self_check(&recorded(name));
        assert_eq!(old["exact"], false, "{name}: {old}");
        assert!(
            old["note"].as_str().unwrap().contains("no pool id"),
            "{name}: {old}"
        );
    }
}

/// The reserved bytes of each pool after every mark equal what `memory_snapshot()` listed
/// there, and the report's per-pool figures at the peak and at the end are those.
#[test]
fn reserved_by_pool_equals_what_pytorch_listed() {
    use memsnap::analysis::pools::reserved_after;
    use memsnap::replay::{replay, SizeModel};
    use memsnap::snapshot::{Action, Snapshot};
    for name in ["pools_default", "pools_expandable"] {
        let file = constructed(&format!("{name}_pool_ids"));
        let snap = Snapshot::open(std::path::Path::new(&file)).unwrap();
        let r = replay(&snap, 0, SizeModel::Allocator);
        let at: Vec<usize> = snap
            .trace(0)
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == Action::Snapshot)
            .map(|(i, _)| i)
            .collect();
        let marks = marks(name);
        assert_eq!(marks.len(), 9);
        assert!(at.len() >= marks.len());
        for (mark, &i) in marks.iter().zip(&at) {
            let ours = reserved_after(&snap, &r, Some(i)).expect("the pools add up");
            let theirs = pools_of(mark);
            let ours: BTreeMap<_, _> = ours.into_iter().filter(|&(_, b)| b > 0).collect();
            assert_eq!(ours, theirs, "{name} at {}", mark["label"]);
            assert_eq!(
                r.reserved_at(Some(i)),
                mark["reserved"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                r.allocated[i],
                mark["allocated"].as_u64().unwrap(),
                "{name} at {}",
                mark["label"]
            );
        }

        let d = &report_json(&file, &[])["devices"][0];
        let end = pools_of(marks.last().unwrap());
        let peak = peak_line(name);
        assert_eq!(d["peak_allocated_bytes"], peak["max_memory_allocated"]);
        let mut at_peak_total = 0;
        for p in d["pools"].as_array().unwrap() {
            let id = (
                p["pool_id"][0].as_i64().unwrap(),
                p["pool_id"][1].as_i64().unwrap(),
            );
            assert_eq!(
                p["at_end_bytes"].as_u64().unwrap(),
                end.get(&id).copied().unwrap_or(0),
                "{name} {id:?}"
            );
            at_peak_total += p["at_peak_bytes"].as_u64().unwrap();
        }
        assert_eq!(at_peak_total, d["reserved_at_peak_bytes"].as_u64().unwrap());
        let text = ok(&["report", &file]);
        assert!(
            text.contains("reserved by pool at the peak: default "),
            "{text}"
        );
        assert!(text.contains("CUDA graph (1, 0)"), "{text}");
        assert!(text.contains("pool (0, 1)"), "{text}");
    }
}

/// Pinned host memory is its own device, "host (pinned)", with its own figures; the GPU's
/// figures are those of the same recording without it; whatif and oom leave it out.
#[test]
fn host_memory_is_its_own_device() {
    let file = constructed("host_pinned");
    let with = report_json(&file, &[]);
    let without = report_json(recorded("pools_default"), &[]);
    let devices = with["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    let gpu = &devices[0];
    let host = &devices[1];
    assert_eq!(gpu["device"], 0);
    for key in [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "end_allocated_bytes",
        "end_reserved_bytes",
    ] {
        assert_eq!(gpu[key], without["devices"][0][key], "{key}");
    }
    assert_eq!(host["device"], memsnap::snapshot::HOST_DEVICE);
    assert_eq!(host["peak_allocated_bytes"], 16 << 20);
    assert_eq!(host["peak_reserved_bytes"], 16 << 20);
    assert_eq!(host["end_allocated_bytes"], 8 << 20);
    assert_eq!(host["replay_consistent"], true);

    let text = ok(&["report", &file, "--device", "host"]);
    assert!(
        text.starts_with(&format!("{file} · host (pinned)\n")),
        "{text}"
    );
    assert!(!text.contains("allocator:"), "{text}");

    let whatif = ok(&["whatif", &file]);
    assert!(!whatif.contains("host (pinned)"), "{whatif}");
    one_line_failure(
        &memsnap(&["whatif", &file, "--device", "host"]),
        1,
        "pinned host allocator",
    );
    let o = memsnap(&["report", &file, "--device", "gpu"]);
    assert!(
        stderr(&o).contains("'host' for pinned host memory"),
        "{}",
        stderr(&o)
    );
}

/// `annotate` entries and dict metadata that name a component decide the category of the
/// allocation they name; the report counts them and says where inference disagreed.
#[test]
fn pytorchs_labels_decide_categories() {
    let file = constructed("annotated");
    let d = &report_json(&file, &[])["devices"][0];
    let sources = &d["attribution"]["category_sources"];
    assert_eq!(sources["labels"], 4, "{sources}");
    assert_eq!(sources["labels_disagreeing"], 1, "{sources}");
    let by_category = d["peak_breakdown"]["category"].as_array().unwrap();
    let bytes = |name: &str| {
        by_category
            .iter()
            .find(|s| s["label"] == name)
            .map_or(0, |s| s["bytes"].as_u64().unwrap())
    };
    // the 12 MiB buffer labelled a gradient, live at the peak
    assert_eq!(bytes("gradient"), 12 << 20);
    let plain = &report_json(recorded("pools_default"), &[])["devices"][0];
    assert_eq!(plain["attribution"]["category_sources"]["labels"], 0);
    let text = ok(&["report", &file]);
    assert!(text.contains("PyTorch's labels 4"), "{text}");
    assert!(
        text.contains("inference gave 1 of the 4 labelled allocations another category"),
        "{text}"
    );
}

/// `trim` writes the pool ids back, so a trimmed file keeps its per-pool figures.
#[test]
fn trim_keeps_pool_ids() {
    let file = constructed("pools_default_pool_ids");
    let dir = scratch();
    let out = dir.path().join("t.pickle");
    ok(&["trim", &file, "-o", &out.to_string_lossy()]);
    let a = report_json(&file, &[]);
    let b = report_json(&out, &[]);
    assert_eq!(a["devices"][0]["pools"], b["devices"][0]["pools"]);
    assert_eq!(self_check(&out.to_string_lossy())["exact"], true);
}

/// A trace recorded with `skip_actions` (torch 2.10+) lacks one kind of free: the replay
/// still lands on the snapshot's blocks with PyTorch's own peak and marks, and the simulation
/// still reproduces every segment event.
#[test]
fn traces_without_one_kind_of_free_replay_and_simulate_exactly() {
    let peak = peak_line("pools_default");
    let marks = marks("pools_default");
    for name in ["skip_free_requested", "skip_free_completed"] {
        let file = constructed(name);
        let d = &report_json(&file, &[])["devices"][0];
        assert_eq!(d["replay_consistent"], true, "{name}");
        assert_eq!(
            d["peak_allocated_bytes"], peak["max_memory_allocated"],
            "{name}"
        );
        assert_eq!(
            d["peak_reserved_bytes"], peak["max_memory_reserved"],
            "{name}"
        );
        let end = marks.last().unwrap();
        assert_eq!(d["end_allocated_bytes"], end["allocated"], "{name}");
        assert_eq!(d["end_reserved_bytes"], end["reserved"], "{name}");
        let check = self_check(&file);
        assert_eq!(check["exact"], true, "{name}: {check}");
    }
}

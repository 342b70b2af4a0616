//! The allocator simulation against what the real allocator did: runs of one workload under
//! other settings and caps, recorded on an H200 (`testdata/snapshots/allocator`, with what
//! PyTorch printed in `results.jsonl`), and the shared recordings.

use serde_json::Value;

use crate::util::*;

/// Each recorded run: name, settings, cap, and PyTorch's own figures.
fn runs() -> Vec<Value> {
    let text = std::fs::read_to_string(testdata("snapshots/allocator/results.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn allocator_file(name: &str) -> String {
    testdata(&format!("snapshots/allocator/{name}.pickle.xz"))
        .to_string_lossy()
        .into_owned()
}

/// The figures of PyTorch's out-of-memory message that an explanation gives.
fn message_parts(e: &Value) -> Vec<String> {
    let size = |k: &str| e[k].as_u64().unwrap();
    vec![
        format!(
            "Tried to allocate {}.",
            torch_size(size("alloc_size_bytes"))
        ),
        format!(
            "{} is allocated by PyTorch",
            torch_size(size("allocated_bytes"))
        ),
        format!(
            "{} is reserved by PyTorch but unallocated",
            torch_size(size("reserved_unallocated_bytes"))
        ),
    ]
}

fn within(simulated: u64, real: u64, tolerance: f64) -> bool {
    (simulated as f64 - real as f64).abs() <= real as f64 * tolerance
}

/// Under the settings (and cap) it was recorded with, every run is reproduced exactly: every
/// segment event, reserved bytes between requests, the peak, the failure.
#[test]
fn self_check_is_exact_on_every_recorded_run() {
    let mut files: Vec<String> = runs()
        .iter()
        .map(|r| allocator_file(r["name"].as_str().unwrap()))
        .collect();
    for f in [
        "single-gpu/memory_snapshot_rank0_step1.pickle.xz",
        "fsdp/memory_snapshot_rank0_step1.pickle.xz",
        "pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz",
        "pithtrain-fork/memory_snapshot_rank0_fork_step0.pickle.xz",
    ] {
        files.push(
            testdata(&format!("snapshots/{f}"))
                .to_string_lossy()
                .into_owned(),
        );
    }
    if let Some(dir) = shared() {
        for f in snapshots_under(&dir) {
            let name = f.to_string_lossy().into_owned();
            // CUDA graphs: private pools carry no pool id in the trace
            if !name.ends_with("graph.pickle") {
                files.push(name);
            }
        }
    }
    let mut checked = 0;
    for f in &files {
        let o = memsnap(&["whatif", f, "--json"]);
        if !o.status.success() && stderr(&o).contains("no device has trace events") {
            // a recording without a trace (history disabled): nothing to check
            continue;
        }
        assert!(o.status.success(), "{f}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON value");
        for d in v["devices"].as_array().unwrap() {
            let c = &d["self_check"];
            assert_eq!(c["exact"], true, "{f} device {}: {c}", d["device"]);
            assert_eq!(c["segment_events"], c["segment_events_equal"], "{f}");
            checked += 1;
        }
    }
    assert!(checked >= 18, "{checked}");
}

/// The default run's trace simulated under each other run's settings and cap predicts that
/// run: the same verdict (fits or runs out), peak allocated and reserved within 0.1%, and at a
/// failure the figures PyTorch's message printed.
#[test]
fn simulating_the_default_run_predicts_every_other_run() {
    let default = allocator_file("default");
    let mut compared = 0;
    for run in runs() {
        let name = run["name"].as_str().unwrap();
        if name == "default" {
            continue;
        }
        let conf = run["conf"].as_str().unwrap();
        let mut args = vec!["whatif", default.as_str(), "--alloc-conf", conf];
        let cap = run["cap_bytes"].as_u64().map(|c| c.to_string());
        if let Some(c) = &cap {
            args.extend(["--cap", c.as_str()]);
        }
        let v = json(&args);
        let sim = &v["devices"][0]["simulated"][0];
        let real_oom = run["oom"].as_str();
        assert_eq!(sim["oom"].is_null(), real_oom.is_none(), "{name}: {sim}");
        let peak = |k: &str| sim[k].as_u64().unwrap();
        assert!(
            within(
                peak("peak_allocated_bytes"),
                run["max_memory_allocated"].as_u64().unwrap(),
                0.001
            ),
            "{name} peak allocated"
        );
        assert!(
            within(
                peak("peak_reserved_bytes"),
                run["max_memory_reserved"].as_u64().unwrap(),
                0.001
            ),
            "{name} peak reserved"
        );
        if let Some(message) = real_oom {
            let o = &sim["oom"];
            let size = |k: &str| o[k].as_u64().unwrap();
            let tried = format!(
                "Tried to allocate {}.",
                torch_size(size("alloc_size_bytes"))
            );
            let allocated = format!(
                "{} is allocated by PyTorch",
                torch_size(size("allocated_bytes"))
            );
            let unallocated = format!(
                "{} is reserved by PyTorch but unallocated",
                torch_size(size("reserved_bytes") - size("allocated_bytes"))
            );
            for part in [tried, allocated, unallocated] {
                assert!(message.contains(&part), "{name}: {part:?} not in {message}");
            }
        }
        compared += 1;
    }
    assert_eq!(compared, 13);
}

/// PyTorch's `format_size`, as the out-of-memory message prints sizes.
fn torch_size(b: u64) -> String {
    let f = b as f64;
    if b <= 1024 {
        format!("{b} bytes")
    } else if f < 1048576.0 {
        format!("{:.2} KiB", f / 1024.0)
    } else if f < 1073741824.0 {
        format!("{:.2} MiB", f / 1048576.0)
    } else {
        format!("{:.2} GiB", f / 1073741824.0)
    }
}

/// `memsnap oom` on each failed run gives the figures of PyTorch's message, and the verdict.
#[test]
fn oom_explains_each_failure_in_pytorchs_figures() {
    let mut explained = 0;
    for run in runs() {
        let Some(message) = run["oom"].as_str() else {
            continue;
        };
        let name = run["name"].as_str().unwrap();
        let cap = run["cap_bytes"].as_u64().unwrap().to_string();
        let v = json(&["oom", &allocator_file(name), "--cap", &cap]);
        let e = &v["devices"][0]["oom"];
        let size = |k: &str| e[k].as_u64().unwrap();
        let mut parts = message_parts(e);
        parts.push(format!("{} allowed;", torch_size(size("cap_bytes"))));
        for part in parts {
            assert!(message.contains(&part), "{name}: {part:?} not in {message}");
        }
        // fragmentation when the free cached bytes would have held the request had they been
        // contiguous; otherwise the device had room and the cap refused the segment
        let verdict = if size("requested_bytes") <= size("reserved_unallocated_bytes") {
            "fragmentation"
        } else {
            "cap"
        };
        assert_eq!(e["verdict"], verdict, "{name}");
        assert!(e["whatif"].as_array().unwrap().len() >= 3);
        explained += 1;
    }
    assert_eq!(explained, 7);
    // a run that did not fail says so
    let v = json(&["oom", &allocator_file("default")]);
    assert!(v["devices"][0]["oom"].is_null());
    let text = ok(&["oom", &allocator_file("default")]);
    assert!(text.contains("no out-of-memory error"), "{text}");
}

/// The shared OOM run has the program and settings of `pp2-stacks-python`, capped at
/// 9.04 GiB: simulating the uncapped trace under that cap reproduces the failure.
#[test]
fn the_shared_oom_is_predicted_from_the_uncapped_run() {
    let Some(dir) = shared() else { return };
    let uncapped = dir.join("pp2-stacks-python/memory_snapshot_rank0_py_step0.pickle.xz");
    let v = json(&["whatif", &uncapped.to_string_lossy(), "--cap", "9.04GiB"]);
    let o = &v["devices"][0]["simulated"][0]["oom"];
    assert!(!o.is_null(), "{v}");
    let real = json(&[
        "oom",
        &dir.join("oom/memory_snapshot_rank0_oom.pickle.xz")
            .to_string_lossy(),
    ]);
    let r = &real["devices"][0]["oom"];
    // MoE routing makes sizes data-dependent: within 0.1% here
    for k in ["allocated_bytes", "reserved_bytes"] {
        assert!(
            within(o[k].as_u64().unwrap(), r[k].as_u64().unwrap(), 0.001),
            "{k}: simulated {} vs recorded {}",
            o[k],
            r[k]
        );
    }
    assert_eq!(o["alloc_size_bytes"], r["alloc_size_bytes"]);
    // "Tried to allocate 1000.00 MiB ... 7.31 GiB is allocated by PyTorch, and 950.90 MiB is
    // reserved by PyTorch but unallocated"
    assert_eq!(
        torch_size(r["alloc_size_bytes"].as_u64().unwrap()),
        "1000.00 MiB"
    );
    assert_eq!(
        torch_size(r["allocated_bytes"].as_u64().unwrap()),
        "7.31 GiB"
    );
    assert_eq!(
        torch_size(r["reserved_unallocated_bytes"].as_u64().unwrap()),
        "950.90 MiB"
    );
}

#[test]
fn several_settings_and_the_smallest_cap() {
    let v = json(&[
        "whatif",
        &allocator_file("default"),
        "--try",
        "expandable_segments:True",
        "--try",
        "max_split_size_mb:64",
        "--min-cap",
    ]);
    let sims = v["devices"][0]["simulated"].as_array().unwrap();
    assert_eq!(sims.len(), 3, "recorded settings first, then each --try");
    assert_eq!(sims[0]["alloc_conf"], "defaults");
    assert_eq!(sims[1]["alloc_conf"], "expandable_segments:True");
    let runs = runs();
    let real = |name: &str| {
        runs.iter().find(|r| r["name"] == name).unwrap()["max_memory_reserved"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        sims[1]["peak_reserved_bytes"].as_u64().unwrap(),
        real("expandable")
    );
    assert_eq!(
        sims[2]["peak_reserved_bytes"].as_u64().unwrap(),
        real("split64")
    );
    // the smallest cap that fits: the real run at that cap fits, and 2 MiB less does not
    let min = sims[0]["min_cap_bytes"].as_u64().unwrap();
    let fits = |cap: u64| {
        json(&[
            "whatif",
            &allocator_file("default"),
            "--cap",
            &cap.to_string(),
        ])["devices"][0]["simulated"][0]["oom"]
            .is_null()
    };
    assert!(fits(min));
    assert!(!fits(min - (2 << 20)));
    // the real runs agree: cap_reserved fitted, cap_mid (below the smallest cap) did not
    let cap = |name: &str| {
        runs.iter().find(|r| r["name"] == name).unwrap()["cap_bytes"]
            .as_u64()
            .unwrap()
    };
    assert!(cap("cap_reserved") >= min);
    assert!(cap("cap_mid") < min);
}

#[test]
fn bad_settings_name_the_key() {
    let f = allocator_file("default");
    for (conf, key) in [
        ("expandable_segment:True", "expandable_segment"),
        ("max_split_size_mb:abc", "max_split_size_mb"),
        (
            "garbage_collection_threshold:2",
            "garbage_collection_threshold",
        ),
    ] {
        let o = memsnap(&["whatif", &f, "--try", conf]);
        assert_eq!(o.status.code(), Some(2), "{conf}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(key), "{err}");
    }
    let o = memsnap(&["whatif", &f, "--cap", "lots"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_snapshot_without_a_trace_says_so() {
    let Some(dir) = shared() else { return };
    let f = dir.join("fixtures-torch-2.11/disabled_after.pickle");
    // nothing to simulate or explain: an error, as from every command that needs a trace
    for command in ["whatif", "oom"] {
        let o = memsnap(&[command, &f.to_string_lossy()]);
        one_line_failure(&o, 1, "no device has trace events");
        assert!(o.stdout.is_empty(), "{command}");
    }
    // the report still shows its segments
    assert!(ok(&["report", &f.to_string_lossy()]).contains("reserved"));
}

/// Without `--cap`, the inferred cap of every failed run is at least what the run reserved
/// (PyTorch's `max_memory_reserved()`) and at least the real cap: `garbage_collection_threshold`
/// releases cache before requests that the cap never refused, which is no evidence of a
/// lower cap.
#[test]
fn inferred_caps_are_never_below_what_was_reserved() {
    let mut checked = 0;
    for run in runs() {
        if run["oom"].is_null() {
            continue;
        }
        let name = run["name"].as_str().unwrap();
        let v = json(&["oom", &allocator_file(name)]);
        let e = &v["devices"][0]["oom"];
        assert_eq!(e["cap_inferred"], true, "{name}");
        let cap = e["cap_bytes"].as_u64().unwrap();
        let reserved = run["max_memory_reserved"].as_u64().unwrap();
        let real = run["cap_bytes"].as_u64().unwrap();
        assert!(
            cap >= reserved,
            "{name}: inferred {cap} < reserved {reserved}"
        );
        assert!(cap >= real, "{name}: inferred {cap} < the real cap {real}");
        checked += 1;
    }
    assert_eq!(checked, 7);
}

/// A program that caught one out-of-memory error and died of a later one: the explanation
/// is of the fatal request (PyTorch's `FATAL` message), and the survived one is counted.
#[test]
fn the_fatal_oom_is_the_last_and_earlier_ones_are_survived() {
    let dir = testdata("snapshots/programs");
    let log = std::fs::read_to_string(dir.join("oom_survived.log")).unwrap();
    let message = |tag: &str| -> String {
        log.lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap()
            .to_string()
    };
    let (caught, fatal) = (message("CAUGHT "), message("FATAL "));
    let file = dir.join("memory_snapshot_oom_survived.pickle.xz");
    let v = json(&["oom", &file.to_string_lossy()]);
    let e = &v["devices"][0]["oom"];
    let size = |k: &str| e[k].as_u64().unwrap();
    for part in message_parts(e) {
        assert!(fatal.contains(&part), "{part:?} not in {fatal}");
    }
    let survived = e["survived"].as_array().unwrap();
    assert_eq!(survived.len(), 1, "{e}");
    let first = survived[0]["requested_bytes"].as_u64().unwrap();
    assert!(caught.contains(&format!("Tried to allocate {}.", torch_size(first))));
    assert!(survived[0]["event"].as_u64().unwrap() < size("event"));
    // the cap was 2 GiB (the messages say "2.00 GiB allowed")
    assert!(fatal.contains("2.00 GiB allowed"));
    assert!(size("cap_bytes") >= 2 << 30, "{e}");
    let text = ok(&["oom", &file.to_string_lossy()]);
    assert!(text.contains("1 failed request was survived"), "{text}");
}

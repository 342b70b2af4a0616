//! Snapshots written by `memsnap.Capture` inside real training programs
//! (`testdata/snapshots/capture/`, `testdata/record/capture.py`): each program printed the
//! device's memory right after each probe and PyTorch's peak for the recorded step.

use std::fs;

use crate::util::{ok, report_json, testdata};

/// `(name, used, reserved)` of a `PROBE` line.
type Printed = (String, u64, u64);

/// The `PROBE` lines, and `(max_memory_allocated, max_memory_reserved)` of the `PEAK` line, of
/// a program's log (of one rank's lines, `[rank=R] ...`, when `rank` is given).
fn printed(kind: &str, rank: Option<u32>) -> (Vec<Printed>, Option<(u64, u64)>) {
    let log = fs::read_to_string(testdata(&format!("snapshots/capture/{kind}/log.txt"))).unwrap();
    let prefix = rank.map_or(String::new(), |r| format!("[rank={r}] "));
    let log: String = log
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|l| format!("{l}\n"))
        .collect();
    let num = |line: &str, key: &str| -> u64 {
        let at = line.find(&format!(" {key}=")).unwrap() + key.len() + 2;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let probes = log
        .lines()
        .filter(|l| l.starts_with("PROBE "))
        .map(|l| {
            let name = l.split('\'').nth(1).unwrap().to_string();
            (name, num(l, "used"), num(l, "reserved"))
        })
        .collect();
    let peak = log.lines().find_map(|l| {
        let at = l.find("PEAK ")?;
        let l = &l[at..];
        Some((
            num(l, "max_memory_allocated"),
            num(l, "max_memory_reserved"),
        ))
    });
    (probes, peak)
}

fn snapshot(kind: &str, name: &str) -> std::path::PathBuf {
    testdata(&format!("snapshots/capture/{kind}/{name}"))
}

/// In a plain loop, a Lightning Trainer, a transformers Trainer, on the one recorded rank of
/// two, and on both ranks of a DualPipeV pipeline (two processes on one GPU): the snapshot of the recorded step peaks where PyTorch said, and every probe the
/// report shows is what the program printed beside it.
#[test]
fn captured_steps_peak_where_pytorch_said_and_probes_are_the_device_s_figures() {
    for (kind, file, rank) in [
        ("loop", "memory_snapshot_rank0_step1.pickle.xz", None),
        ("lightning", "memory_snapshot_rank0_step1.pickle.xz", None),
        ("hf", "memory_snapshot_rank0_step1.pickle.xz", None),
        ("ranks", "memory_snapshot_rank1_step0.pickle.xz", None),
        ("pipeline", "memory_snapshot_rank0_step0.pickle.xz", Some(0)),
        ("pipeline", "memory_snapshot_rank1_step0.pickle.xz", Some(1)),
    ] {
        let (probes, peak) = printed(kind, rank);
        let v = report_json(snapshot(kind, file), &[]);
        let d = &v["devices"][0];
        let (allocated, reserved) = peak.unwrap();
        assert_eq!(
            d["peak_allocated_bytes"].as_u64(),
            Some(allocated),
            "{kind}"
        );
        assert_eq!(d["peak_reserved_bytes"].as_u64(), Some(reserved), "{kind}");
        let shown = v["probes"].as_array().unwrap();
        assert!(!shown.is_empty(), "{kind}: probes read");
        for (name, used, reserved) in &probes {
            let p = shown.iter().find(|p| p["name"] == name.as_str()).unwrap();
            assert_eq!(
                p["device_used_bytes"].as_u64(),
                Some(*used),
                "{kind} {name}"
            );
            assert_eq!(
                p["reserved_bytes"].as_u64(),
                Some(*reserved),
                "{kind} {name}"
            );
            assert_eq!(
                p["outside_bytes"].as_u64(),
                Some(used - reserved),
                "{kind} {name}"
            );
        }
    }
    // the pipeline's ranks are read as such: pipeline steps, with the probes beside them
    let v = report_json(
        snapshot("pipeline", "memory_snapshot_rank1_step0.pickle.xz"),
        &[],
    );
    assert_eq!(v["devices"][0]["attribution"]["preset"], "pithtrain");
    assert_eq!(v["probes"].as_array().unwrap().len(), 4);
    // the text says what was outside PyTorch at each probe
    let text = ok(&[
        "report",
        snapshot("ranks", "memory_snapshot_rank1_step0.pickle.xz")
            .to_str()
            .unwrap(),
    ]);
    assert!(
        text.contains("outside PyTorch: 526.81 MiB at \"before init_process_group\" · +64.00 KiB at \"after init_process_group\""),
        "{text}"
    );
}

/// Only the chosen rank writes; an out-of-memory error inside the recorded step leaves its
/// `_oom` snapshot, which `memsnap oom` explains with the request PyTorch refused.
#[test]
fn only_chosen_ranks_write_and_an_oom_leaves_its_snapshot() {
    let log = fs::read_to_string(snapshot("ranks", "log.txt")).unwrap();
    assert!(
        log.contains("RANK 0 wrote 0") && log.contains("RANK 1 wrote 1"),
        "{log}"
    );
    let files: Vec<String> = fs::read_dir(testdata("snapshots/capture/ranks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".pickle"))
        .collect();
    assert!(files.iter().all(|n| n.contains("rank1")), "{files:?}");
    // in a plain loop, inside a Lightning and a transformers Trainer (whose loops no `with` of
    // ours surrounds: the allocator's out-of-memory observer writes the snapshot) and in rank 0
    // of a DualPipeV pipeline under a 1.5 GiB cap, the
    // `_oom` snapshot is the failure that raised: memsnap rebuilds PyTorch's own figures
    for (kind, file, asked) in [
        (
            "oom",
            "memory_snapshot_rank0_step1_oom.pickle.xz",
            "2.00 GiB",
        ),
        (
            "lightning_oom",
            "memory_snapshot_rank0_step1_oom.pickle.xz",
            "200.00 GiB",
        ),
        (
            "hf_oom",
            "memory_snapshot_rank0_step1_oom.pickle.xz",
            "200.00 GiB",
        ),
        (
            "pipeline_oom",
            "memory_snapshot_rank0_step0_oom.pickle.xz",
            "250.00 MiB",
        ),
    ] {
        let log = fs::read_to_string(snapshot(kind, "log.txt")).unwrap();
        let fatal = log
            .lines()
            .find_map(|l| l.split("CUDA out of memory. ").nth(1))
            .unwrap();
        assert!(
            fatal.contains(&format!("Tried to allocate {asked}.")),
            "{kind}: {fatal}"
        );
        let text = ok(&["oom", snapshot(kind, file).to_str().unwrap()]);
        assert!(
            text.contains(&format!("{asked} requested")),
            "{kind}: {text}"
        );
        let at = fatal.find("Of the allocated memory").unwrap();
        let figures = &fatal[at..fatal[at..].find("unallocated").unwrap() + at];
        assert!(text.contains(figures), "{kind}: {figures:?} in {text}");
    }
}

/// The `TRUTH` figures of a capture-evidence program's first line, and the file it wrote.
fn evidence(kind: &str) -> (std::path::PathBuf, [u64; 3]) {
    let dir = testdata(&format!("snapshots/capture_evidence/{kind}"));
    let log = fs::read_to_string(dir.join("log.txt")).unwrap();
    let line = log
        .lines()
        .find_map(|l| l.find("TRUTH ").map(|at| &l[at..]))
        .unwrap();
    let num = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    let file = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".pickle.xz"))
        .unwrap();
    (file, [num("param"), num("grad"), num("optimizer_state")])
}

/// Given the model and optimizer, `memsnap.Capture` lists the program's tensors beside the
/// snapshot: the blocks alive before recording started get their categories and names from it,
/// exact to the byte (a plain loop, a transformers `Trainer` with accumulation and a fused
/// AdamW, a Lightning `Trainer` with plain SGD), and the steps carry the program's numbers.
#[test]
fn the_programs_own_list_names_the_blocks_from_before_recording() {
    use memsnap::attribute::{Category, Evidence};
    for (kind, steps) in [("loop", [2, 3]), ("hf", [1, 2]), ("lightning_oom", [1, 2])] {
        let (file, [param, grad, state]) = evidence(kind);
        let snap = memsnap::snapshot::Snapshot::open(&file).unwrap();
        assert!(snap.capture.is_some(), "{kind}: the side file is read");
        let replay = memsnap::replay::replay(&snap, 0, Default::default());
        let a = memsnap::attribute::attribute(&snap, &replay, &Default::default());
        assert_eq!(a.step_numbers, steps, "{kind}: the program's step numbers");
        // at trace start: the blocks alive before it, by category, in the program's bytes
        let bytes = |c: Category| -> u64 {
            replay
                .preexisting
                .iter()
                .zip(&a.preexisting)
                .filter(|(p, l)| p.live && l.category == c)
                .map(|(p, _)| p.requested)
                .sum()
        };
        assert_eq!(bytes(Category::Parameter), param, "{kind}: parameters");
        assert_eq!(
            bytes(Category::OptimizerState),
            state,
            "{kind}: optimizer state"
        );
        assert_eq!(bytes(Category::Gradient), grad, "{kind}: gradients");
        let named = a
            .preexisting
            .iter()
            .filter(|l| l.evidence == Evidence::Capture)
            .count();
        assert!(named >= 8, "{kind}: {named} blocks named by the capture");
        // the report says so, and names them by the module's own names
        let text = ok(&[
            "report",
            &file.to_string_lossy(),
            "--by",
            "category,stage",
            "--top",
            "200",
        ]);
        assert!(text.contains("the program's tensors (capture)"), "{text}");
        assert!(text.contains(&format!("train step {}", steps[1])), "{text}");
        assert!(text.contains(".weight"), "{text}");
    }
}

/// Out of memory under an 8 GiB cap: the cap is the allocator's own, as the program read it,
/// and every what-if is judged under it.
#[test]
fn an_out_of_memory_error_is_judged_under_the_programs_cap() {
    let (file, _) = evidence("lightning_oom");
    let log =
        fs::read_to_string(testdata("snapshots/capture_evidence/lightning_oom/log.txt")).unwrap();
    let cap: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("CAP bytes="))
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let v = crate::util::json(&["oom", &file.to_string_lossy()]);
    let e = &v["devices"][0]["oom"];
    assert_eq!(e["cap"]["bytes"], cap, "{e}");
    assert_eq!(e["cap"]["from"], "capture");
    assert_eq!(e["verdict"], "cap", "{e}");
    for s in e["whatif"].as_array().unwrap() {
        assert_eq!(s["cap_bytes"], cap, "{s}");
        assert!(
            ["fits", "fails"].contains(&s["verdict"].as_str().unwrap()),
            "{s}"
        );
    }
    let text = ok(&["oom", &file.to_string_lossy()]);
    assert!(text.contains("(the program's)"), "{text}");
}

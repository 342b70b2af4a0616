//! `memsnap trim`: the trimmed file is a snapshot of its own (memsnap, Python's `pickle` and
//! PyTorch's viewer read it), consistent, with the original's figures inside the window.

use std::process::Command;

use crate::util::*;

const PIPELINE: &str = "snapshots/pipelines/pp4n8/memory_snapshot_rank0_pp4n8_step0.pickle.xz";

/// The report of one device of `file`.
fn device_report(file: &str, device: u64) -> serde_json::Value {
    report_json(file, &[])["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == device)
        .unwrap_or_else(|| panic!("{file}: no device {device}"))
        .clone()
}

fn report(file: &str) -> serde_json::Value {
    device_report(file, 0)
}

/// Trims `file` around its peak; the trimmed report is consistent and has the same peak.
fn trims_around_the_peak(file: &str, device: u64, out: &str) {
    let original = device_report(file, device);
    let printed = ok(&[
        "trim",
        file,
        "--around-peak",
        "500",
        "--device",
        &device.to_string(),
        "-o",
        out,
    ]);
    assert!(printed.contains("% of the original"), "{printed}");
    let d = device_report(out, device);
    let o = original;
    assert_eq!(d["replay_consistent"], true, "{file}: {}", d["check"]);
    assert_eq!(
        d["peak_allocated_bytes"], o["peak_allocated_bytes"],
        "{file}"
    );
    assert_eq!(
        d["reserved_at_peak_bytes"], o["reserved_at_peak_bytes"],
        "{file}"
    );
    let events = d["events"].as_u64().unwrap();
    assert!(
        events <= 1001 && events <= o["events"].as_u64().unwrap(),
        "{file}"
    );
}

/// Python reads the trimmed file as plain data (no torch needed) where Python is installed:
/// the events of `device` number as memsnap counts them.
fn python_reads(out: &str, device: u64) {
    let script = "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); \
                  print(len(d['device_traces'][int(sys.argv[2])]))";
    match Command::new("python3")
        .args(["-c", script, out, &device.to_string()])
        .output()
    {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let events: u64 = text.trim().parse().unwrap();
            let expected = device_report(out, device)["events"].as_u64().unwrap();
            assert_eq!(events, expected, "{text}");
        }
        Ok(o) => panic!(
            "python3 could not read it: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(_) => eprintln!("skipping the Python check: no python3"),
    }
}

#[test]
fn a_window_around_the_peak_keeps_the_peak_and_reads_in_python() {
    let dir = scratch();
    let out = dir.path().join("peak.pickle");
    let out = out.to_str().unwrap();
    trims_around_the_peak(&testdata(PIPELINE).to_string_lossy(), 0, out);
    python_reads(out, 0);
}

#[test]
fn seconds_and_compressed_output() {
    let dir = scratch();
    let file = testdata(PIPELINE).to_string_lossy().into_owned();
    let out = dir.path().join("window.pickle.xz");
    let out = out.to_str().unwrap();
    let printed = ok(&["trim", &file, "--from", "1s", "--to", "2.5s", "-o", out]);
    assert!(printed.contains("file "), "{printed}");
    let d = report(out);
    assert_eq!(d["replay_consistent"], true);
    let again = dir.path().join("again.pickle");
    let printed = ok(&[
        "trim",
        &file,
        "--from",
        "1s",
        "--to",
        "2.5s",
        "--json",
        "-o",
        again.to_str().unwrap(),
    ]);
    let j: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!(j["trimmed"]["events"], d["events"]);
    assert_eq!(j["device"], 0);
    assert_eq!(j["compressed"], false);
    assert_eq!(
        j["bytes_after"].as_u64(),
        Some(std::fs::metadata(&again).unwrap().len())
    );
    let span = d["duration_us"].as_u64().unwrap();
    assert!(span <= 1_500_000 && span > 1_000_000, "{span}");
}

#[test]
fn trims_every_shared_snapshot_around_its_peak() {
    let Some(dir) = shared() else { return };
    let scratch = scratch();
    let out = scratch.path().join("t.pickle");
    for file in snapshots_under(&dir) {
        let name = file.to_string_lossy().into_owned();
        let all = report_json(&name, &[]);
        for d in all["devices"].as_array().unwrap() {
            let consistent = d["replay_consistent"] == true;
            if d["events"].as_u64().unwrap_or(0) == 0 || !consistent {
                continue;
            }
            let device = d["device"].as_u64().unwrap();
            trims_around_the_peak(&name, device, out.to_str().unwrap());
            python_reads(out.to_str().unwrap(), device);
        }
    }
}

#[test]
fn bad_windows_get_one_line_and_exit_2() {
    let file = testdata(PIPELINE).to_string_lossy().into_owned();
    let dir = scratch();
    let out = dir.path().join("t.pickle").to_string_lossy().into_owned();
    for (args, needle) in [
        (vec!["--from", "900", "--to", "100"], "--from is after --to"),
        (vec!["--to", "99999999"], "--to is beyond the trace"),
        (vec!["--from", "99999999"], "--from is beyond the trace"),
        (vec!["--from", "abc"], "use an event index"),
    ] {
        let mut all = vec!["trim", &file, "-o", &out];
        all.extend(args);
        let o = memsnap(&all);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(needle), "{all:?}: {err}");
        assert!(
            err.lines().next().unwrap_or("").contains(needle),
            "{all:?}: {err}"
        );
    }
    for (output, needle) in [
        ("no/such/folder/t.pickle", "does not exist"),
        ("t.png", "give a file ending in .pickle"),
    ] {
        let o = memsnap(&["trim", &file, "-o", output]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{}", stderr(&o));
    }
}

/// A window that keeps the whole trace of a file memsnap already trimmed gives a file no
/// smaller than it: trim says so, and how much of the trace the window holds.
#[test]
fn a_window_that_saves_nothing_says_so() {
    let original = testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz");
    let dir = scratch();
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (file, out) = (path("trimmed.pickle"), path("again.pickle"));
    let printed = ok(&[
        "trim",
        &original.to_string_lossy(),
        "--around-peak",
        "1000",
        "-o",
        &file,
    ]);
    assert!(!printed.contains("not smaller"), "{printed}");
    let printed = ok(&["trim", &file, "--around-peak", "1000", "-o", &out]);
    assert!(
        printed.contains("not smaller: the window holds 100% of the trace's events"),
        "{printed}"
    );
    // a narrow window is smaller and says nothing of the kind
    let printed = ok(&["trim", &file, "--around-peak", "50", "-o", &out]);
    assert!(!printed.contains("not smaller"), "{printed}");
}

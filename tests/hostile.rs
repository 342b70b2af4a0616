//! Hostile inputs built here, byte by byte: each must be refused (or read) quickly, in bounded
//! memory, with one line saying why. Every run has `--max-memory 256MiB`: had memsnap held more
//! on the way to its answer, the answer would be the memory-limit error instead.

use std::io::Write;

use crate::util::*;

const LIMIT: &str = "256MiB";

/// Runs `report` under the memory limit; returns the error line of a refused file.
fn refused(file: &str) -> String {
    let o = memsnap(&["report", "--max-memory", LIMIT, file]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{file}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("memory use reached the limit"), "{err}");
    err
}

fn long_binput(i: u32) -> Vec<u8> {
    let mut v = vec![b'r'];
    v.extend_from_slice(&i.to_le_bytes());
    v
}

fn long_binget(i: u32) -> Vec<u8> {
    let mut v = vec![b'j'];
    v.extend_from_slice(&i.to_le_bytes());
    v
}

/// `SHORT_BINUNICODE` of `s`.
fn text(s: &str) -> Vec<u8> {
    let mut v = vec![0x8c, s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}

/// `BININT` of `i`.
fn int(i: i32) -> Vec<u8> {
    let mut v = vec![b'J'];
    v.extend_from_slice(&i.to_le_bytes());
    v
}

#[test]
fn memo_and_container_floods_are_refused_as_memory_bombs() {
    let dir = scratch();
    let n = 8_000_000;
    let floods: [(&str, Vec<u8>); 3] = [
        (
            "memoize",
            [b"\x80\x04N".as_slice(), &vec![0x94; n], b"."].concat(),
        ),
        (
            "empty_lists",
            [b"\x80\x04(".as_slice(), &vec![b']'; n], b"1N."].concat(),
        ),
        (
            "empty_dicts",
            [b"\x80\x04(".as_slice(), &vec![b'}'; n], b"1N."].concat(),
        ),
    ];
    for (name, bytes) in floods {
        let err = refused(&write(&dir, name, &bytes));
        assert!(
            err.contains("refusing a likely memory bomb"),
            "{name}: {err}"
        );
    }
}

#[test]
fn sparse_memo_indexes_stay_small() {
    // LONG_BINPUT to ever-new, descending slots: a hash map entry each, never an array sized
    // by the index.
    let dir = scratch();
    let mut p = b"\x80\x04N".to_vec();
    for i in 0..1_000_000u32 {
        p.extend(long_binput(u32::MAX - i));
    }
    p.push(b'.');
    let err = refused(&write(&dir, "binput", &p));
    assert!(err.contains("not a memory snapshot"), "{err}");
}

#[test]
fn shared_segments_and_blocks_are_refused_before_expanding() {
    // 10,000 references to one segment whose block list holds one block 10,000 times: 10^8
    // blocks if expanded, from a 100 KB file.
    let k = 10_000;
    let mut p = b"\x80\x04}(".to_vec();
    p.extend(text("segments"));
    p.extend(b"](}(");
    for (key, value) in [
        ("address", int(0)),
        ("total_size", int(1 << 24)),
        ("device", int(0)),
    ] {
        p.extend(text(key));
        p.extend(value);
    }
    p.extend(text("blocks"));
    p.extend(b"](}(");
    p.extend(text("size"));
    p.extend(int(512));
    p.extend(text("state"));
    p.extend(text("active_allocated"));
    p.extend(b"u");
    p.extend(long_binput(1000));
    for _ in 1..k {
        p.extend(long_binget(1000));
    }
    p.extend(b"eu");
    p.extend(long_binput(1001));
    for _ in 1..k {
        p.extend(long_binget(1001));
    }
    p.extend(b"e");
    p.extend(text("device_traces"));
    p.extend(b"](]eu.");
    let dir = scratch();
    let err = refused(&write(&dir, "segments", &p));
    assert!(err.contains("an object listed twice"), "{err}");
}

#[test]
fn one_trace_list_shared_by_a_million_devices_is_refused() {
    let mut p = b"\x80\x04}(".to_vec();
    p.extend(text("segments"));
    p.extend(b"]");
    p.extend(text("device_traces"));
    p.extend(b"]((");
    for i in 0..1000 {
        p.extend(b"}(");
        for (key, value) in [
            ("addr", int(i * 512)),
            ("size", int(512)),
            ("stream", int(0)),
        ] {
            p.extend(text(key));
            p.extend(value);
        }
        p.extend(text("action"));
        p.extend(text("alloc"));
        p.extend(b"u");
    }
    p.extend(b"l");
    p.extend(long_binput(7));
    for _ in 1..1_000_000 {
        p.extend(long_binget(7));
    }
    p.extend(b"eu.");
    let dir = scratch();
    let err = refused(&write(&dir, "traces", &p));
    assert!(err.contains("one trace entry twice"), "{err}");
}

#[test]
fn mark_and_frame_floods_are_read_to_the_end() {
    // 20 MB of MARK/POP_MARK pairs and of empty FRAMEs, gzip-compressed to a few hundred KB.
    let dir = scratch();
    let mut marks = b"\x80\x04".to_vec();
    marks.extend(b"(1".repeat(10_000_000));
    marks.extend(b"N.");
    let mut frames = b"\x80\x04".to_vec();
    frames.extend([0x95u8, 0, 0, 0, 0, 0, 0, 0, 0].repeat(2_000_000));
    frames.extend(b"N.");
    for (name, plain) in [("marks.pickle.gz", marks), ("frames.pickle.gz", frames)] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        let err = refused(&write(&dir, name, &gz.finish().unwrap()));
        assert!(err.contains("the pickle holds None"), "{name}: {err}");
    }
}

#[test]
fn size_and_memory_limits_name_the_option_that_raises_them() {
    let file = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let file = file.to_string_lossy();
    // its pickle is 100,467 bytes
    for (option, size, message) in [
        (
            "--max-size",
            "50KiB",
            "of the decompressed stream: the pickle is larger than the limit of 50.00 KiB \
             (raise it with --max-size)",
        ),
        (
            "--max-memory",
            "1MiB",
            "memory use reached the limit of 1.00 MiB (raise it with --max-memory)",
        ),
    ] {
        let o = memsnap(&["report", option, size, &file]);
        assert_eq!(o.status.code(), Some(1));
        let err = stderr(&o);
        assert!(err.contains(message), "{err}");
    }
    let o = memsnap(&["report", "--max-memory", "lots", &file]);
    assert_eq!(o.status.code(), Some(2));
    // and the defaults read it
    ok(&["report", &file]);
}

#[test]
fn impossible_sizes_are_anomalies_not_wrapped_figures() {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let event = |action: &str, addr: i64, size: V, time: i64| {
        let mut e = std::collections::BTreeMap::new();
        e.insert(H::String("action".into()), V::String(action.into()));
        e.insert(H::String("addr".into()), V::I64(addr));
        e.insert(H::String("size".into()), size);
        e.insert(H::String("stream".into()), V::I64(0));
        e.insert(H::String("time_us".into()), V::I64(time));
        e.insert(H::String("frames".into()), V::List(vec![]));
        V::Dict(e)
    };
    let base = 1i64 << 40;
    let t = 1_700_000_000_000_000i64;
    let max = V::Int(num_bigint_max());
    let trace = vec![
        event("segment_alloc", base, V::I64(2 << 20), t),
        event("alloc", base, V::I64(512), t + 1),
        event("alloc", base + 512, max, t + 2),
        event("segment_alloc", base << 2, V::I64(1 << 50), t + 3),
        event("free_requested", base, V::I64(512), t + 4),
    ];
    let dir = scratch();
    let f = write(&dir, "huge.pickle", &snapshot_pickle(vec![], trace));
    let text = ok(&["report", &f]);
    assert!(!text.contains("matches the snapshot exactly"), "{text}");
    assert!(
        text.contains("event 2: alloc of 18446744073709551615 bytes, more than any GPU holds"),
        "{text}"
    );
    let v = report_json(&f, &[]);
    let d = &v["devices"][0];
    assert_eq!(d["peak_allocated_bytes"], 512, "{d}");
    assert_eq!(d["peak_reserved_bytes"], 2 << 20, "{d}");
    let examples = d["check"]["examples"].to_string();
    assert!(
        examples.contains("event 2: alloc of 18446744073709551615 bytes"),
        "{examples}"
    );
    assert!(
        examples.contains("event 3: segment_alloc of 1125899906842624 bytes"),
        "{examples}"
    );
    assert_eq!(d["check"]["anomalies"], 2);
}

/// 2^64 - 1 as serde-pickle's big integer.
fn num_bigint_max() -> num_bigint::BigInt {
    num_bigint::BigInt::from(u64::MAX)
}

/// Every input in `testdata/fuzz/` (what fuzzing found, minimised, and the hostile seeds it
/// started from) is handled: a report, or one error line; never a panic or the memory limit.
#[test]
fn fuzzing_findings_stay_fixed() {
    let dir = testdata("fuzz");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "md"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "{} holds {} inputs",
        dir.display(),
        files.len()
    );
    for file in files {
        let file = file.to_string_lossy();
        for command in ["report", "whatif", "oom"] {
            let o = memsnap(&[command, "--max-memory", LIMIT, &file]);
            let err = stderr(&o);
            assert!(
                matches!(o.status.code(), Some(0 | 1)),
                "{command} {file}: {err}"
            );
            assert!(err.lines().count() <= 1, "{command} {file}: {err}");
            assert!(!err.contains("panicked"), "{command} {file}: {err}");
            assert!(
                !err.contains("memory use reached"),
                "{command} {file}: {err}"
            );
        }
    }
}

/// A segment of one active 512-byte block on `device`.
fn segment_on(device: i64) -> serde_pickle::Value {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let dict = |pairs: Vec<(&str, V)>| {
        V::Dict(
            pairs
                .into_iter()
                .map(|(k, v)| (H::String(k.into()), v))
                .collect(),
        )
    };
    let base = 1i64 << 40;
    dict(vec![
        ("device", V::I64(device)),
        ("address", V::I64(base)),
        ("total_size", V::I64(2 << 20)),
        ("stream", V::I64(0)),
        ("segment_type", V::String("small".into())),
        (
            "blocks",
            V::List(vec![
                dict(vec![
                    ("address", V::I64(base)),
                    ("size", V::I64(512)),
                    ("requested_size", V::I64(512)),
                    ("state", V::String("active_allocated".into())),
                ]),
                dict(vec![
                    ("address", V::I64(base + 512)),
                    ("size", V::I64((2 << 20) - 512)),
                    ("state", V::String("inactive".into())),
                ]),
            ]),
        ),
    ])
}

/// Values no recording holds are refused or named, never read as something else: a segment
/// on device -1 or 2^40 is not device 0, and a time of -2^63 does not stretch the trace to
/// 292,000 years.
#[test]
fn nonsense_is_refused_or_named_not_accepted() {
    let dir = scratch();
    for device in [-1i64, 1 << 40, 128] {
        let f = write(
            &dir,
            "dev.pickle",
            &snapshot_pickle(vec![segment_on(device)], vec![]),
        );
        let o = memsnap(&["report", &f]);
        one_line_failure(&o, 1, "expected a CUDA device index (0 to 127)");
        assert!(stderr(&o).contains(&format!("segments[0].device is {device}")));
    }
    // device 127 is a device
    let f = write(
        &dir,
        "dev127.pickle",
        &snapshot_pickle(vec![segment_on(127)], vec![]),
    );
    ok(&["report", &f]);
    let t = 1_700_000_000_000_000i64;
    let base = 1i64 << 40;
    let trace = vec![
        trace_entry("segment_alloc", base, 2 << 20, t),
        trace_entry("alloc", base, 512, t + 10),
        trace_entry("free_requested", base, 512, i64::MIN),
        trace_entry("free_completed", base, 512, t + 2_000),
    ];
    let f = write(&dir, "time.pickle", &snapshot_pickle(vec![], trace));
    let text = ok(&["report", &f]);
    assert!(text.contains("4 events over 2 ms"), "{text}");
    assert!(
        text.contains("1 event with a time no clock gives"),
        "{text}"
    );
    assert!(!text.contains("matches the snapshot exactly"), "{text}");
    let d = &report_json(&f, &[])["devices"][0];
    assert_eq!(d["duration_us"], 2_000);
    assert_eq!(d["impossible_times"], 1);
    assert_eq!(d["events_out_of_time_order"], 0);
}

/// A snapshot whose settings say `backend:cudaMallocAsync` was made by CUDA's own allocator:
/// the simulation of the caching allocator refuses it instead of claiming to reproduce it,
/// unless `--recorded-conf` names the settings to assume.
#[test]
fn a_cuda_malloc_async_recording_is_not_simulated() {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let t = 1_700_000_000_000_000i64;
    let base = 1i64 << 40;
    let trace = vec![
        trace_entry("segment_alloc", base, 2 << 20, t),
        trace_entry("alloc", base, 512, t + 10),
    ];
    let plain = snapshot_pickle(vec![], trace);
    let mut snap: V = serde_pickle::value_from_slice(&plain, Default::default()).unwrap();
    if let V::Dict(d) = &mut snap {
        let mut settings = std::collections::BTreeMap::new();
        settings.insert(
            H::String("PYTORCH_CUDA_ALLOC_CONF".into()),
            V::String("backend:cudaMallocAsync".into()),
        );
        d.insert(H::String("allocator_settings".into()), V::Dict(settings));
    }
    let bytes = serde_pickle::value_to_vec(&snap, Default::default()).unwrap();
    let dir = scratch();
    let f = write(&dir, "async.pickle", &bytes);
    let o = memsnap(&["whatif", &f, "--try", "expandable_segments:True"]);
    one_line_failure(&o, 1, "recorded with backend:cudaMallocAsync");
    let o = memsnap(&["oom", &f]);
    one_line_failure(&o, 1, "recorded with backend:cudaMallocAsync");
    // the report still reads it
    ok(&["report", &f]);
    // settings named by the user are simulated
    ok(&[
        "whatif",
        &f,
        "--recorded-conf",
        "expandable_segments:False",
        "--try",
        "expandable_segments:True",
    ]);
}

/// `--max-memory` holds after decoding too: a stage about to build something large asks first,
/// so a cap the decoder passes still stops a chart whose image buffer would pass it, with the
/// sizes in the message.
#[test]
fn the_memory_cap_holds_after_decoding() {
    let file = testdata("snapshots/pipelines/pp8n16/memory_snapshot_rank0_pp8n16_step0.pickle.xz");
    let file = file.to_string_lossy().into_owned();
    let mut after_decoding = 0;
    let mut drawn = 0;
    // a 4000x3000 buffer takes 34.33 MiB; the decoder needs about 7 MiB
    for mib in [8, 12, 16, 24, 32, 64] {
        let dir = scratch();
        let out = dir.path().join("t.png");
        let cap = format!("{mib}MiB");
        let o = memsnap(&[
            "timeline",
            &file,
            "--max-memory",
            &cap,
            "--width",
            "4000",
            "--height",
            "3000",
            "-o",
            &out.to_string_lossy(),
        ]);
        if o.status.success() {
            assert!(mib > 32, "{mib} MiB cannot hold a 34.33 MiB image: {o:?}");
            drawn += 1;
            continue;
        }
        one_line_failure(&o, 1, "(raise it with --max-memory)");
        assert!(!out.exists(), "a refused chart leaves no file");
        if stderr(&o).contains("after decoding: a 4000x3000 PNG needs 34.33 MiB") {
            after_decoding += 1;
        }
    }
    assert!(
        after_decoding >= 2,
        "caps the decoder passes stop the chart"
    );
    assert!(drawn >= 1, "a cap with room draws it");
}

/// The most anonymous memory (heap, stacks) a run of `memsnap args` held resident, in bytes,
/// with its output. Linux: the larger of `RssAnon` (with `RssShmem`), read every millisecond
/// while it runs, and `VmHWM` less the most file pages read: the high-water mark is exact
/// where a reading every millisecond may miss a short peak, and at its moment the file pages
/// were no more than their most.
///
/// Not `VmHWM` alone: that also counts the pages of files the process maps, which the kernel
/// chooses (a debug build's binary is about 900 MB, and printing a backtrace maps its debug
/// sections). Where it is more than 64 MiB above the anonymous readings, the figures are
/// printed with the run's error output, so that a failure says which kind of memory grew.
#[cfg(target_os = "linux")]
fn peak_resident(args: &[&str]) -> (u64, std::process::Output) {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib << 10)
    };
    let (mut anon, mut hwm, mut file) = (0u64, 0u64, 0u64);
    let mut out = Vec::new();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut buf).unwrap();
        buf
    });
    loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let shmem = field(&text, "RssShmem:").unwrap_or(0);
            if let Some(a) = field(&text, "RssAnon:") {
                anon = anon.max(a + shmem);
            }
            hwm = hwm.max(field(&text, "VmHWM:").unwrap_or(0));
            file = file.max(field(&text, "RssFile:").unwrap_or(0));
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    out.extend(reader.join().unwrap());
    let mut o = child.wait_with_output().unwrap();
    o.stdout = out;
    if hwm > anon + (64 << 20) {
        eprintln!(
            "{args:?}: {} MiB anonymous, VmHWM {} MiB, file pages up to {} MiB; stderr: {}",
            anon >> 20,
            hwm >> 20,
            file >> 20,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    (anon.max(hwm.saturating_sub(file)), o)
}

/// Floods of empty containers and oversized options stay within the allowance every stage is
/// held to (64 MiB + twice the input, besides what the program needs on a tiny snapshot): the
/// decoder refuses what no snapshot holds (a segment, block or trace entry that is an empty
/// dict) before anything is built for it; the rest is read within the same bound.
#[cfg(target_os = "linux")]
#[test]
fn floods_stay_within_the_memory_allowance() {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let dir = scratch();
    let n = 1_000_000;
    let empty = || V::Dict(Default::default());
    let block_list = {
        let mut seg = std::collections::BTreeMap::new();
        seg.insert(H::String("address".into()), V::I64(1 << 30));
        seg.insert(H::String("total_size".into()), V::I64(2 << 20));
        seg.insert(
            H::String("blocks".into()),
            V::List((0..n).map(|_| empty()).collect()),
        );
        V::Dict(seg)
    };
    let classes: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "segments",
            snapshot_pickle((0..n).map(|_| empty()).collect(), vec![]),
            "a dict without 'total_size'",
        ),
        (
            "blocks",
            snapshot_pickle(vec![block_list], vec![]),
            "a dict without 'size'",
        ),
        (
            "trace",
            snapshot_pickle(vec![], (0..n).map(|_| empty()).collect()),
            "a dict without 'action'",
        ),
        (
            "trace lists",
            snapshot_pickle(vec![], (0..n).map(|_| V::List(vec![])).collect()),
            "a trace entry",
        ),
    ];
    let tiny = testdata("snapshots/constructed/host_pinned.pickle.xz");
    let (baseline, o) = peak_resident(&["report", &tiny.to_string_lossy()]);
    assert!(o.status.success());
    for (what, bytes, says) in classes {
        let file = write(&dir, &format!("{what}.pickle").replace(' ', "_"), &bytes);
        let allowance = baseline + (64 << 20) + 2 * bytes.len() as u64;
        let (peak, o) = peak_resident(&["report", &file]);
        eprintln!(
            "{what}: {} KiB resident, allowance {} KiB",
            peak >> 10,
            allowance >> 10
        );
        one_line_failure(&o, 1, says);
        assert!(
            peak <= allowance,
            "{what}: {} MiB resident, allowance {} MiB",
            peak >> 20,
            allowance >> 20
        );
    }
    // 2,000 settings to try, each simulated in turn
    let small = testdata("snapshots/allocator/default.pickle.xz");
    let small = small.to_string_lossy();
    let mut args: Vec<&str> = vec!["whatif", &small, "--cap", "2.3GiB"];
    for _ in 0..2000 {
        args.extend(["--try", "max_split_size_mb:64"]);
    }
    let input = std::fs::metadata(testdata("snapshots/allocator/default.pickle.xz"))
        .unwrap()
        .len();
    let (one, _) = peak_resident(&[
        "whatif",
        &small,
        "--cap",
        "2.3GiB",
        "--try",
        "max_split_size_mb:64",
    ]);
    let (peak, o) = peak_resident(&args);
    eprintln!(
        "--try x1: {} KiB, x2000: {} KiB (input {input} bytes)",
        one >> 10,
        peak >> 10
    );
    assert!(
        o.status.success() || o.status.code() == Some(2),
        "{}",
        stderr(&o)
    );
    // the settings' own results are kept, not their simulations: 2,000 cost what one does,
    // within the allowance
    assert!(
        peak <= one + (64 << 20),
        "--try x2000: {} MiB resident, one: {} MiB",
        peak >> 20,
        one >> 20
    );
}

/// Inputs beside the pickle's containers stay within the same allowance: a 10 MB allocator
/// settings text inside a snapshot, rules files of 10,000 rules (refused) and of 1,000
/// (read), a 1 MB regex literal, and settings options at their length limit.
#[test]
fn settings_rules_and_options_stay_within_the_memory_allowance() {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let dir = scratch();
    let small = testdata("snapshots/allocator/default.pickle.xz");
    let small = small.to_string_lossy().into_owned();
    let small_len = std::fs::metadata(&small).unwrap().len();
    let (baseline, o) = peak_resident(&["report", &small]);
    assert!(o.status.success(), "{}", stderr(&o));
    let allowance = |input: u64| baseline + (64 << 20) + 2 * input;
    let check = |what: &str, args: &[&str], input: u64, ok: bool, says: &str| {
        let (peak, o) = peak_resident(args);
        eprintln!(
            "{what}: {} KiB resident, allowance {} KiB",
            peak >> 10,
            allowance(input) >> 10
        );
        if ok {
            assert!(o.status.success(), "{what}: {}", stderr(&o));
        } else {
            one_line_failure(&o, 2, says);
        }
        assert!(
            peak <= allowance(input),
            "{what}: {} MiB resident, allowance {} MiB",
            peak >> 20,
            allowance(input) >> 20
        );
    };

    // a snapshot whose allocator settings hold 10 MB of text, twice
    let big = "x".repeat(10_000_000);
    let mut settings = std::collections::BTreeMap::new();
    settings.insert(
        H::String("PYTORCH_CUDA_ALLOC_CONF".into()),
        V::String(big.clone()),
    );
    settings.insert(H::String("some_future_key".into()), V::String(big));
    let trace = vec![
        trace_entry("segment_alloc", 1 << 30, 2 << 20, 1),
        trace_entry("alloc", 1 << 30, 1 << 20, 2),
        trace_entry("free_requested", 1 << 30, 1 << 20, 3),
        trace_entry("free_completed", 1 << 30, 1 << 20, 4),
    ];
    let mut snap = std::collections::BTreeMap::new();
    snap.insert(H::String("segments".into()), V::List(vec![]));
    snap.insert(
        H::String("device_traces".into()),
        V::List(vec![V::List(trace)]),
    );
    snap.insert(H::String("allocator_settings".into()), V::Dict(settings));
    let bytes = serde_pickle::value_to_vec(&V::Dict(snap), Default::default()).unwrap();
    let file = write(&dir, "settings.pickle", &bytes);
    let len = bytes.len() as u64;
    let (peak, o) = peak_resident(&["report", &file, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    // the text is neither echoed nor parsed
    assert!(text.len() < 1 << 20, "{} bytes of output", text.len());
    assert!(peak <= allowance(len), "settings: {} MiB", peak >> 20);
    eprintln!("10 MB settings text: {} KiB resident", peak >> 10);
    check(
        "10 MB settings text, whatif",
        &["whatif", &file, "--cap", "1GiB"],
        len,
        true,
        "",
    );

    // rules: 10,000 is past the limit, 1,000 is read and applied
    let rules = |n: usize| -> String {
        (0..n)
            .map(|i| format!("[[rule]]\nfunction = \"^fn_{i}_(a|b)+$\"\nstage = \"s{i}\"\n"))
            .collect()
    };
    let many = write(&dir, "many.toml", rules(10_000).as_bytes());
    check(
        "10,000 rules",
        &["report", &small, "--rules", &many],
        small_len + std::fs::metadata(&many).unwrap().len(),
        false,
        "--rules",
    );
    let thousand = write(&dir, "thousand.toml", rules(1_000).as_bytes());
    check(
        "1,000 rules",
        &["report", &small, "--rules", &thousand],
        small_len + std::fs::metadata(&thousand).unwrap().len(),
        true,
        "",
    );

    // a regex literal of 1 MB less the rest of the file
    let literal = format!(
        "[[rule]]\nfile = \"{}\"\nstage = \"s\"\n",
        "ab".repeat(500_000 - 32)
    );
    let regex = write(&dir, "regex.toml", literal.as_bytes());
    check(
        "1 MB regex literal",
        &["report", &small, "--rules", &regex],
        small_len + literal.len() as u64,
        false,
        "--rules",
    );

    // 1,000 rules whose patterns each compile to a large program: each gets a share of one
    // budget, and those past their share are refused
    let heavy: String = (0..1_000)
        .map(|i| format!("[[rule]]\nfunction = \"^(\\\\w{{4}}|x{i})$\"\nstage = \"s\"\n"))
        .collect();
    let heavy = write(&dir, "heavy.toml", heavy.as_bytes());
    check(
        "1,000 heavy patterns",
        &["report", &small, "--rules", &heavy],
        small_len + std::fs::metadata(&heavy).unwrap().len(),
        false,
        "the most a pattern may take",
    );

    // settings options at their 4 KiB limit, 64 of them, and one past it
    let long = format!("max_split_size_mb:64,{}", "x".repeat(4000));
    let mut args = vec!["whatif", small.as_str(), "--cap", "2.3GiB"];
    for _ in 0..64 {
        args.extend(["--try", long.as_str()]);
    }
    check("64 settings of 4 KiB", &args, small_len, false, "--try");
    let longer = "x".repeat(100 << 10);
    check(
        "a 100 KiB setting",
        &["whatif", &small, "--cap", "2.3GiB", "--try", &longer],
        small_len,
        false,
        "--try",
    );
}

/// Two tiny snapshots of a loop of three 1 MiB allocations, at sizes 1 and 2 (one and two
/// iterations): `whatif --scale` grows the stream by nine ops per unit of size.
fn tiny_loop_samples(dir: &tempfile::TempDir) -> (String, String) {
    let sample = |iterations: i64| {
        let mut trace = Vec::new();
        let mut t = 1000;
        for _ in 0..iterations {
            for k in 0..3 {
                trace.push(trace_entry(
                    "alloc",
                    0x7f00_0000_0000 + (k << 20),
                    1 << 20,
                    t,
                ));
                t += 1;
            }
            for k in 0..3 {
                let addr = 0x7f00_0000_0000 + (k << 20);
                trace.push(trace_entry("free_requested", addr, 1 << 20, t));
                trace.push(trace_entry("free_completed", addr, 1 << 20, t + 1));
                t += 2;
            }
        }
        snapshot_pickle(vec![], trace)
    };
    let one = write(dir, "loop1.pickle", &sample(1));
    let two = write(dir, "loop2.pickle", &sample(2));
    (format!("{one}=1"), format!("{two}=2"))
}

/// `whatif --scale` holds one predicted program at a time, and asks the memory allowance before
/// building one and as it grows: many large targets cost what one costs, and a target past
/// `--max-memory` is refused before it is built.
#[cfg(target_os = "linux")]
#[test]
fn scale_predictions_stay_within_the_memory_allowance() {
    let dir = scratch();
    let (one, two) = tiny_loop_samples(&dir);
    let run = |targets: &[u64], extra: &[&str]| {
        let to: Vec<String> = targets.iter().map(u64::to_string).collect();
        let mut args = vec!["whatif", "--scale", one.as_str(), two.as_str(), "--to"];
        args.extend(to.iter().map(String::as_str));
        args.extend_from_slice(extra);
        peak_resident(&args)
    };
    let (single, o) = run(&[100_000], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let many: Vec<u64> = (0..8).map(|i| 100_000 + i).collect();
    let (eight, o) = run(&many, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).matches("predicted").count(), 8, "{}", stdout(&o));
    assert!(
        eight <= single + (32 << 20),
        "8 targets took {} MiB resident, one took {} MiB",
        eight >> 20,
        single >> 20
    );
    // a target that would need about 1 GiB, under a 64 MiB allowance
    let (refused, o) = run(&[2_000_000], &["--max-memory", "64MiB"]);
    one_line_failure(&o, 1, "--max-memory");
    assert!(
        stderr(&o).contains("predicting size 2000000"),
        "{}",
        stderr(&o)
    );
    assert!(refused < 64 << 20, "{} MiB resident", refused >> 20);
}

/// 10^5 allocations from 2·10^4 distinct frames whose file names are 1 KB each (a deep
/// folder): every command holds each name a bounded number of times, never once per event or
/// per row, within the allowance (64 MiB + twice the file). Export writes its tables one at a
/// time, holds each text of a column once, and hands polars a part of the rows at a time
/// (before: 1.09 GB resident for the export of such a 31 MB file).
#[cfg(target_os = "linux")]
#[test]
fn long_file_names_stay_within_the_memory_allowance() {
    use crate::util::raw::*;
    let dir = scratch();
    let folder = "d".repeat(1000);
    let (names, events) = (20_000i64, 100_000i64);
    let base = 1i64 << 40;
    let t = 1_700_000_000_000_000i64;
    let mut trace = vec![entry("segment_alloc", base, 1 << 34, t, list([]))];
    for k in 0..events {
        let j = (k % names) as u32;
        let frame = if k < names {
            let file = format!("/{folder}/m{j:06}.py");
            [
                dict(&[
                    ("filename", text(&file)),
                    ("line", int(j.into())),
                    ("name", text("fn")),
                ]),
                put(j),
            ]
            .concat()
        } else {
            get(j)
        };
        trace.push(entry("alloc", base + k * 512, 512, t + k, list([frame])));
    }
    let mut bytes = START.to_vec();
    bytes.extend(dict(&[
        ("segments", list([])),
        ("device_traces", list([list(trace)])),
    ]));
    bytes.push(b'.');
    let file = write(&dir, "names.pickle", &bytes);
    let tiny = testdata("snapshots/constructed/host_pinned.pickle.xz");
    let (baseline, o) = peak_resident(&["report", &tiny.to_string_lossy()]);
    assert!(o.status.success());
    let allowance = baseline + (64 << 20) + 2 * bytes.len() as u64;
    let out = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (page, tables, trimmed) = (out("page.html"), out("tables"), out("trimmed.pickle"));
    let commands: Vec<Vec<&str>> = vec![
        vec!["report", &file],
        vec!["report", &file, "--json"],
        vec!["flamegraph", &file, "--folded"],
        vec!["view", &file, "-o", &page],
        vec!["export", &file, "-o", &tables, "--force"],
        vec!["export", &file, "-o", &tables, "--force", "--format", "csv"],
        vec![
            "export", &file, "-o", &tables, "--force", "--format", "jsonl",
        ],
        vec!["trim", &file, "-o", &trimmed, "--force"],
    ];
    for args in commands {
        let (peak, o) = peak_resident(&args);
        eprintln!(
            "{args:?}: {} KiB resident, allowance {} KiB",
            peak >> 10,
            allowance >> 10
        );
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(
            peak <= allowance,
            "{args:?}: {} MiB resident, allowance {} MiB",
            peak >> 20,
            allowance >> 20
        );
    }
}

/// Two exports of one 16 MB snapshot into one folder at the same moment: each table is a
/// complete file, the same bytes as an export alone, every time, and each process stays
/// within the allowance (before: 422 MB resident for one such export, the events table held
/// whole and then copied whole into polars).
#[cfg(target_os = "linux")]
#[test]
fn concurrent_exports_to_one_folder_stay_whole_and_small() {
    let dir = scratch();
    let base = 1i64 << 40;
    let t = 1_700_000_000_000_000i64;
    let mut trace = vec![trace_entry("segment_alloc", base, 1 << 34, t)];
    for k in 0..200_000i64 {
        let addr = base + (k % 1000) * 4096;
        trace.push(trace_entry("alloc", addr, 4096, t + 2 * k + 1));
        trace.push(trace_entry("free_completed", addr, 4096, t + 2 * k + 2));
    }
    let bytes = snapshot_pickle(vec![], trace);
    let file = write(&dir, "plain.pickle", &bytes);
    let tiny = testdata("snapshots/constructed/host_pinned.pickle.xz");
    let (baseline, _) = peak_resident(&["report", &tiny.to_string_lossy()]);
    let allowance = baseline + (64 << 20) + 2 * bytes.len() as u64;
    for format in ["csv", "parquet"] {
        let alone = dir.path().join(format!("alone-{format}"));
        let shared = dir.path().join(format!("shared-{format}"));
        let (alone, shared) = (alone.to_string_lossy(), shared.to_string_lossy());
        ok(&["export", &file, "-o", &alone, "--format", format]);
        ok(&["export", &file, "-o", &shared, "--format", format]);
        for round in 0..3 {
            let run = || {
                let args = [
                    "export", &file, "-o", &shared, "--format", format, "--force",
                ];
                peak_resident(&args)
            };
            let (one, two) = std::thread::scope(|s| {
                let a = s.spawn(run);
                let b = s.spawn(run);
                (a.join().unwrap(), b.join().unwrap())
            });
            for (peak, o) in [one, two] {
                assert!(o.status.success(), "{format} {round}: {}", stderr(&o));
                assert!(stderr(&o).is_empty(), "{format} {round}: {}", stderr(&o));
                eprintln!("{format} {round}: {} KiB resident", peak >> 10);
                assert!(
                    peak <= allowance,
                    "{format}: {} MiB resident, allowance {} MiB",
                    peak >> 20,
                    allowance >> 20
                );
            }
            for table in ["events", "blocks", "steps", "peak"] {
                let name = format!("{table}.{format}");
                let a = std::fs::read(std::path::Path::new(&*alone).join(&name)).unwrap();
                let b = std::fs::read(std::path::Path::new(&*shared).join(&name)).unwrap();
                assert!(
                    a == b,
                    "{format} round {round}: {name} differs from an export alone"
                );
            }
            // no temporary file is left behind
            let left = std::fs::read_dir(&*shared).unwrap().count();
            assert_eq!(left, 4, "{format} round {round}: {left} files");
        }
    }
}

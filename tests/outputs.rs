//! What memsnap writes: never over a file it reads (through any path), never over a file
//! whose name it chose unless `--force`, never half a file, and never a panic when the output
//! cannot be written (a closed pipe, a full disk).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::*;

const SNAPSHOT: &str = "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz";

/// A copy of the bundled snapshot in `dir`, decompressed (so `trim` can write its kind).
fn plain_copy(dir: &Path, name: &str) -> PathBuf {
    let mut text = Vec::new();
    let mut xz = xz2::read::XzDecoder::new(fs::File::open(testdata(SNAPSHOT)).unwrap());
    std::io::Read::read_to_end(&mut xz, &mut text).unwrap();
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn no_command_writes_over_its_input_through_any_path() {
    let dir = scratch();
    let input = plain_copy(dir.path(), "in.pickle");
    let original = fs::read(&input).unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    fs::hard_link(&input, dir.path().join("hard.pickle")).unwrap();
    std::os::unix::fs::symlink(&input, dir.path().join("link.pickle")).unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let via = [
        s(&input),
        s(&dir.path().join("sub/../in.pickle")),
        s(&dir.path().join("hard.pickle")),
        s(&dir.path().join("link.pickle")),
    ];
    for out in &via {
        for extra in [None, Some("--force")] {
            let mut args = vec!["trim", via[0].as_str(), "-o", out.as_str()];
            args.extend(extra);
            one_line_failure(&memsnap(&args), 2, "is a file this command reads");
            // and the other way round: read through the other path, write the file itself
            let mut args = vec!["trim", out.as_str(), "-o", via[0].as_str()];
            args.extend(extra);
            one_line_failure(&memsnap(&args), 2, "is a file this command reads");
        }
    }
    // Standard input redirected from the file is the file.
    let o = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(["trim", "-", "-o", &via[0]])
        .stdin(fs::File::open(&input).unwrap())
        .output()
        .unwrap();
    one_line_failure(&o, 2, "is a file this command reads");
    // A compressed input, and the other commands that write.
    let xz = dir.path().join("in.pickle.xz");
    fs::copy(testdata(SNAPSHOT), &xz).unwrap();
    let xz_original = fs::read(&xz).unwrap();
    one_line_failure(
        &memsnap(&["trim", &s(&xz), "-o", &s(&xz)]),
        2,
        "is a file this command reads",
    );
    let as_png = dir.path().join("snap.png");
    fs::copy(&input, &as_png).unwrap();
    one_line_failure(
        &memsnap(&["timeline", &s(&as_png), "-o", &s(&as_png)]),
        2,
        "is a file this command reads",
    );
    let as_svg = dir.path().join("snap.svg");
    fs::copy(&input, &as_svg).unwrap();
    one_line_failure(
        &memsnap(&["flamegraph", &s(&as_svg), "-o", &s(&as_svg)]),
        2,
        "is a file this command reads",
    );
    let tables = dir.path().join("tables");
    fs::create_dir(&tables).unwrap();
    let events = tables.join("events.jsonl");
    fs::copy(&input, &events).unwrap();
    one_line_failure(
        &memsnap(&[
            "export",
            &s(&events),
            "-o",
            &s(&tables),
            "--format",
            "jsonl",
            "--force",
        ]),
        2,
        "is a file this command reads",
    );
    let rules = dir.path().join("rules.png");
    fs::write(
        &rules,
        "[[rule]]\nfunction = 'forward'\nphase = 'forward'\n",
    )
    .unwrap();
    one_line_failure(
        &memsnap(&[
            "timeline",
            &s(&input),
            "--rules",
            &s(&rules),
            "-o",
            &s(&rules),
        ]),
        2,
        "is a file this command reads",
    );
    assert_eq!(fs::read(&input).unwrap(), original);
    assert_eq!(fs::read(&xz).unwrap(), xz_original);
    assert_eq!(fs::read(&events).unwrap(), original);
    assert!(fs::read_to_string(&rules).unwrap().starts_with("[[rule]]"));
    // Nothing half-written is left behind.
    assert!(
        names_in(dir.path()).iter().all(|n| !n.starts_with('.')),
        "{:?}",
        names_in(dir.path())
    );
}

#[test]
fn names_memsnap_chose_are_not_written_over_without_force() {
    let dir = scratch();
    let input = testdata(SNAPSHOT).to_string_lossy().into_owned();
    // The default flamegraph.svg of the current folder.
    let flame = dir.path().join("flamegraph.svg");
    fs::write(&flame, "mine").unwrap();
    let run_in = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memsnap"))
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    one_line_failure(&run_in(&["flamegraph", &input]), 2, "give --force");
    assert_eq!(fs::read_to_string(&flame).unwrap(), "mine");
    assert!(run_in(&["flamegraph", &input, "--force"]).status.success());
    assert!(
        fs::read_to_string(&flame).unwrap().starts_with("<?xml") || {
            let t = fs::read_to_string(&flame).unwrap();
            t.contains("<svg")
        }
    );
    // A name the user gave is theirs: written over.
    let named = dir.path().join("mine.svg");
    fs::write(&named, "old").unwrap();
    ok(&["flamegraph", &input, "-o", &named.to_string_lossy()]);
    assert!(fs::read_to_string(&named).unwrap().contains("<svg"));
    // A re-run replaces what memsnap wrote there.
    let before = fs::read(&flame).unwrap();
    assert!(run_in(&["flamegraph", &input]).status.success());
    assert_eq!(fs::read(&flame).unwrap(), before, "the same file again");
    // The charts of a --png folder.
    let charts = dir.path().join("charts");
    fs::create_dir(&charts).unwrap();
    let chart = charts.join("memory_snapshot_rank0_step1-device0-timeline.png");
    fs::write(&chart, "mine").unwrap();
    let o = memsnap(&["report", &input, "--png", &charts.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("give --force"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "checked before the report is printed");
    assert_eq!(fs::read_to_string(&chart).unwrap(), "mine");
    let o = memsnap(&[
        "report",
        &input,
        "--png",
        &charts.to_string_lossy(),
        "--force",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(fs::read(&chart).unwrap().starts_with(b"\x89PNG"));
    assert_eq!(names_in(&charts).len(), 1, "{:?}", names_in(&charts));
    // run again: the same report and the same chart, exit 0
    let again = memsnap(&["report", &input, "--png", &charts.to_string_lossy()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(again.stdout, o.stdout);
    assert_eq!(names_in(&charts).len(), 1, "{:?}", names_in(&charts));
}

#[test]
fn per_device_images_are_not_written_over_without_force() {
    let Some(shared) = shared() else { return };
    let dir = scratch();
    let input = shared.join("two-devices/two_device.pickle.xz");
    let out = dir.path().join("t.png");
    let taken = dir.path().join("t-device1.png");
    fs::write(&taken, "mine").unwrap();
    let args = |force: bool| {
        let mut a = vec![
            "timeline".to_string(),
            input.to_string_lossy().into_owned(),
            "-o".into(),
            out.to_string_lossy().into_owned(),
            "--width".into(),
            "600".into(),
            "--height".into(),
            "400".into(),
        ];
        if force {
            a.push("--force".into());
        }
        a
    };
    let refused = memsnap(&args(false).iter().map(String::as_str).collect::<Vec<_>>());
    one_line_failure(
        &refused,
        2,
        "t-device1.png: exists, and memsnap chose this name",
    );
    // Checked before drawing: the other device's image was not written either.
    assert_eq!(names_in(dir.path()), ["t-device1.png"]);
    assert_eq!(fs::read_to_string(&taken).unwrap(), "mine");
    ok(&args(true).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(fs::read(&taken).unwrap().starts_with(b"\x89PNG"));
    assert_eq!(names_in(dir.path()), ["t-device0.png", "t-device1.png"]);
}

#[test]
fn writers_of_the_same_output_at_once_leave_one_whole_file() {
    let dir = scratch();
    let input = testdata(SNAPSHOT).to_string_lossy().into_owned();
    let out = dir.path().join("same.pickle.xz");
    let children: Vec<_> = (0..10)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_memsnap"))
                .args(["trim", &input, "-o", &out.to_string_lossy()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // One whole file, which reads back; no temporary file left.
    assert_eq!(names_in(dir.path()), ["same.pickle.xz"]);
    let report = ok(&["report", &out.to_string_lossy(), "--json"]);
    let original = ok(&["report", &input, "--json"]);
    let peak = |text: &str| {
        let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        v["devices"][0]["peak_allocated_bytes"].clone()
    };
    assert_eq!(peak(&report), peak(&original));
}

/// A command whose stdout is a pipe closed before it writes: it must end quietly (as `head`
/// users expect), with no panic.
fn with_closed_stdout(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_pipe_or_a_full_disk_ends_the_command_with_one_line() {
    let dir = scratch();
    let input = testdata(SNAPSHOT).to_string_lossy().into_owned();
    let xz = dir
        .path()
        .join("t.pickle.xz")
        .to_string_lossy()
        .into_owned();
    let tables = dir.path().join("tables").to_string_lossy().into_owned();
    let commands: Vec<Vec<&str>> = vec![
        vec!["report", &input],
        vec!["report", &input, "--json"],
        vec!["compare", &input, &input],
        vec!["whatif", &input, "--cap", "3GiB"],
        vec!["flamegraph", &input, "--folded"],
        vec!["completions", "bash"],
        vec!["completions", "zsh"],
        vec!["trim", &input, "-o", &xz, "--force"],
        vec![
            "export", &input, "-o", &tables, "--format", "jsonl", "--force",
        ],
    ];
    for args in &commands {
        let o = with_closed_stdout(args);
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(o.status.code().is_some(), "{args:?}: killed by a signal");
        assert!(err.lines().count() <= 1, "{args:?}: {err}");
        let full = Command::new(env!("CARGO_BIN_EXE_memsnap"))
            .args(args)
            .stdout(
                fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
            .output()
            .unwrap();
        let err = stderr(&full);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(full.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("No space left on device") && !err.contains("os error"),
            "{args:?}: {err}"
        );
    }
    // A file output on a full disk.
    let o = memsnap(&["flamegraph", &input, "-o", "/dev/full"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("svg"), "{}", stderr(&o));
}

#[test]
fn chart_sizes_are_bounded_before_anything_is_drawn() {
    let dir = scratch();
    let input = testdata(SNAPSHOT).to_string_lossy().into_owned();
    let out = dir.path().join("t.png").to_string_lossy().into_owned();
    for (w, h) in [("4294967295", "900"), ("16385", "400"), ("10000", "10000")] {
        let o = memsnap(&[
            "--max-memory",
            "512MiB",
            "timeline",
            &input,
            "-o",
            &out,
            "--width",
            w,
            "--height",
            h,
        ]);
        one_line_failure(&o, 2, "is too large");
    }
    assert!(names_in(dir.path()).is_empty());
    ok(&[
        "timeline", &input, "-o", &out, "--width", "4000", "--height", "3000",
    ]);
}

#[test]
fn command_line_and_rules_errors_are_one_safe_line() {
    let input = testdata(SNAPSHOT).to_string_lossy().into_owned();
    // clap's errors, condensed; no tip that suggests `-- --colour`.
    let o = memsnap(&["report", &input, "--colour", "1"]);
    one_line_failure(&o, 2, "unexpected argument '--colour' found");
    assert!(
        stderr(&o).contains("memsnap report --help"),
        "{}",
        stderr(&o)
    );
    // report has --device, and a device the file lacks is a typed usage error
    let o = memsnap(&["report", &input, "--device", "1"]);
    one_line_failure(&o, 2, "device 1 has no events (devices with events: 0)");
    let shown = ok(&["report", &input, "--device", "0", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
    assert_eq!(v["devices"][0]["device"], 0);
    one_line_failure(&memsnap(&["timeline", &input]), 2, "--output");
    one_line_failure(&memsnap(&["nonsense"]), 2, "unrecognized subcommand");
    // Help and version are still clap's.
    assert!(ok(&["report", "--help"]).lines().count() > 5);
    assert!(ok(&["--version"]).starts_with("memsnap "));
    // A TOML error and a regex error, each on one line with where it is.
    let dir = scratch();
    let bad_toml = write(&dir, "bad.toml", b"[[rule]]\nfunction = \n");
    let o = memsnap(&["report", &input, "--rules", &bad_toml]);
    one_line_failure(&o, 2, "line 2, column");
    let bad_regex = write(
        &dir,
        "re.toml",
        b"[[rule]]\nfunction = '(abc'\nphase = 'forward'\n",
    );
    let o = memsnap(&["report", &input, "--rules", &bad_regex]);
    one_line_failure(
        &o,
        2,
        "rule 1: function: not a regular expression: unclosed group",
    );
    // Rules files that never end, or are not files at all, or are too large.
    for path in ["/dev/zero", "/dev/urandom"] {
        let o = memsnap(&["report", &input, "--rules", path]);
        one_line_failure(&o, 2, "not a regular file");
    }
    let fifo = dir.path().join("rules.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let o = memsnap(&["report", &input, "--rules", &fifo.to_string_lossy()]);
        one_line_failure(&o, 2, "not a regular file");
    }
    let huge = write(&dir, "huge.toml", &vec![b'#'; 2 << 20]);
    one_line_failure(
        &memsnap(&["report", &input, "--rules", &huge]),
        2,
        "the most a rules file may hold",
    );
    let mut many = String::new();
    for k in 0..1001 {
        many.push_str(&format!("[[rule]]\nfunction = 'f{k}'\nphase = 'forward'\n"));
    }
    let many = write(&dir, "many.toml", many.as_bytes());
    one_line_failure(
        &memsnap(&["report", &input, "--rules", &many]),
        2,
        "1001 rules: at most 1000",
    );
    let big_re = format!(
        "[[rule]]\nfunction = '{}'\nphase = 'forward'\n",
        "(a|b|c|d)".repeat(50_000)
    );
    let big_re = write(&dir, "big_re.toml", big_re.as_bytes());
    one_line_failure(
        &memsnap(&[
            "--max-memory",
            "256MiB",
            "report",
            &input,
            "--rules",
            &big_re,
        ]),
        2,
        "a pattern may have at most 16.00 KiB",
    );
    // a short pattern whose program is too large
    let heavy = "[[rule]]\nfunction = '\\w{40}'\nphase = 'forward'\n";
    let heavy = write(&dir, "heavy_re.toml", heavy.as_bytes());
    one_line_failure(
        &memsnap(&["report", &input, "--rules", &heavy]),
        2,
        "the most a pattern may take",
    );
    // Control characters in a name are escaped, never sent to the terminal.
    let evil = dir.path().join("a\x1b[31mred\nline.pickle");
    let o = memsnap(&["report", &evil.to_string_lossy()]);
    one_line_failure(&o, 1, "a\\x1b[31mred\\nline.pickle");
    assert!(!stderr(&o).contains('\x1b'));
}

//! Helpers: running the binary, finding the shared snapshots, scratch files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `memsnap` with `args`.
pub fn memsnap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .output()
        .expect("memsnap runs")
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `memsnap`, asserts success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = memsnap(args);
    assert!(
        o.status.success(),
        "memsnap {args:?} failed: {}",
        stderr(&o)
    );
    stdout(&o)
}

/// Runs `memsnap ARGS --json` (asserting success) and parses its one JSON value.
pub fn json(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    serde_json::from_str(ok(&all).trim()).expect("memsnap printed one JSON value")
}

/// `memsnap report --json FILE EXTRA...`, parsed.
pub fn report_json(file: impl AsRef<Path>, extra: &[&str]) -> serde_json::Value {
    let file = file.as_ref().to_string_lossy().into_owned();
    let mut args = vec!["report", file.as_str()];
    args.extend_from_slice(extra);
    json(&args)
}

/// Asserts a failure that is one stderr line containing `says`, exit code `code`, no panic
/// and no Rust debug text.
pub fn one_line_failure(o: &Output, code: i32, says: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains(says), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Os {"), "{err}");
}

/// The repository's own test data.
pub fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

/// `../shared/snapshots`, the real snapshots recorded for memsnap. `None` (with a message)
/// when absent, as in a user's fresh clone; a failure under CI, where they must be present.
pub fn shared() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/snapshots");
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true but {} is missing", dir.display());
    }
    // straight to the process's stderr, past the test harness's capture, so that a plain
    // `cargo test` shows every test that skipped
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "skipping: {} not found (a fresh clone; CI=true makes this a failure)",
        dir.display()
    );
    None
}

/// Every snapshot file (`.pickle`, `.pickle.xz`) under `dir`, a test data or shared folder, sorted.
pub fn snapshots_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().contains(".pickle")
                && !memsnap::snapshot::probes::is_side_file(&p)
                && !p.to_string_lossy().ends_with(".summary.json")
                && !p.to_string_lossy().ends_with(".summary.err")
            {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A scratch directory removed at the end of the test.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// Writes `bytes` to `name` in `dir`; returns the path as text.
pub fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_string_lossy().into_owned()
}

/// A trace entry without frames on stream 0, as PyTorch writes one.
pub fn trace_entry(action: &str, addr: i64, size: i64, time_us: i64) -> serde_pickle::Value {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let mut e = std::collections::BTreeMap::new();
    e.insert(H::String("action".into()), V::String(action.into()));
    e.insert(H::String("addr".into()), V::I64(addr));
    e.insert(H::String("size".into()), V::I64(size));
    e.insert(H::String("stream".into()), V::I64(0));
    e.insert(H::String("time_us".into()), V::I64(time_us));
    e.insert(H::String("frames".into()), V::List(vec![]));
    V::Dict(e)
}

/// A snapshot pickle of these segments and one device's trace entries.
pub fn snapshot_pickle(
    segments: Vec<serde_pickle::Value>,
    trace: Vec<serde_pickle::Value>,
) -> Vec<u8> {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let mut snap = std::collections::BTreeMap::new();
    snap.insert(H::String("segments".into()), V::List(segments));
    snap.insert(
        H::String("device_traces".into()),
        V::List(vec![V::List(trace)]),
    );
    serde_pickle::value_to_vec(&V::Dict(snap), Default::default()).expect("pickle")
}

/// Raw pickle bytes (protocol 4), for inputs serde-pickle cannot shape: objects shared
/// through the memo, as a recording that reuses one frame or one stack writes them.
pub mod raw {
    /// `\x80\x04`.
    pub const START: &[u8] = b"\x80\x04";

    /// A string.
    pub fn text(s: &str) -> Vec<u8> {
        let mut v = if s.len() < 256 {
            vec![0x8c, s.len() as u8]
        } else {
            let mut v = vec![b'X'];
            v.extend_from_slice(&(s.len() as u32).to_le_bytes());
            v
        };
        v.extend_from_slice(s.as_bytes());
        v
    }

    /// An integer (`LONG1`, eight bytes).
    pub fn int(i: i64) -> Vec<u8> {
        let mut v = vec![0x8a, 8];
        v.extend_from_slice(&i.to_le_bytes());
        v
    }

    /// `LONG_BINPUT i`: remembers the top of the stack.
    pub fn put(i: u32) -> Vec<u8> {
        let mut v = vec![b'r'];
        v.extend_from_slice(&i.to_le_bytes());
        v
    }

    /// `LONG_BINGET i`: pushes what was remembered.
    pub fn get(i: u32) -> Vec<u8> {
        let mut v = vec![b'j'];
        v.extend_from_slice(&i.to_le_bytes());
        v
    }

    /// A dict of these keys and (already encoded) values.
    pub fn dict(items: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut v = b"}(".to_vec();
        for (k, x) in items {
            v.extend(text(k));
            v.extend_from_slice(x);
        }
        v.push(b'u');
        v
    }

    /// A trace entry on stream 0 with its frames.
    pub fn entry(action: &str, addr: i64, size: i64, time: i64, frames: Vec<u8>) -> Vec<u8> {
        dict(&[
            ("action", text(action)),
            ("addr", int(addr)),
            ("size", int(size)),
            ("stream", int(0)),
            ("time_us", int(time)),
            ("frames", frames),
        ])
    }

    /// A list of (already encoded) items.
    pub fn list<I: IntoIterator<Item = Vec<u8>>>(items: I) -> Vec<u8> {
        let mut v = b"](".to_vec();
        for x in items {
            v.extend(x);
        }
        v.push(b'e');
        v
    }
}

/// A snapshot of `allocations` allocations of 512 bytes on device 0, each freed after the
/// next one starts, every event with one stack of `depth` frames: the frames are `frames` in
/// turn, `(name, file, line)`, each written once and then taken from the memo, and the stack
/// is written once and shared by every event, so the file is small whatever the depth.
pub fn shared_stack_pickle(
    frames: &[(String, String, i64)],
    depth: usize,
    allocations: usize,
) -> Vec<u8> {
    use raw::*;
    let mut p = START.to_vec();
    let mut stack = b"](".to_vec();
    for k in 0..depth {
        let slot = (k % frames.len()) as u32;
        if k < frames.len() {
            let (name, file, line) = &frames[k];
            stack.extend(dict(&[
                ("filename", text(file)),
                ("line", int(*line)),
                ("name", text(name)),
            ]));
            stack.extend(put(slot));
        } else {
            stack.extend(get(slot));
        }
    }
    stack.push(b'e');
    let stack_slot = frames.len() as u32;
    stack.extend(put(stack_slot));
    let base = 1i64 << 40;
    let t = 1_700_000_000_000_000i64;
    let mut trace = vec![entry("segment_alloc", base, 1 << 30, t, list([]))];
    let mut first = Some(stack);
    let mut frames_of = || first.take().unwrap_or_else(|| get(stack_slot));
    for k in 0..allocations as i64 {
        let addr = base + (k % 2) * 512;
        trace.push(entry("alloc", addr, 512, t + 2 * k + 1, frames_of()));
        if k > 0 {
            let prev = base + ((k - 1) % 2) * 512;
            trace.push(entry(
                "free_requested",
                prev,
                512,
                t + 2 * k + 2,
                frames_of(),
            ));
            trace.push(entry(
                "free_completed",
                prev,
                512,
                t + 2 * k + 2,
                frames_of(),
            ));
        }
    }
    p.extend(dict(&[
        ("segments", list([])),
        ("device_traces", list([list(trace)])),
    ]));
    p.push(b'.');
    p
}

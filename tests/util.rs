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

//! `cargo bench --bench view`: `memsnap view` on large recordings. For each file: the page's
//! size, the time to write it against `memsnap report --json` on the same file (medians of
//! three whole processes, in alternation), and, in headless Chromium, the page's first paint
//! and its slowest frame while zooming and panning (`tests/browser/check.mjs`, when Node.js,
//! playwright-core and Chromium are there).
//!
//! Files, as plain pickles made by `repeat_trace.py`:
//! - the 650k-event `stacks="all"` trace: `../shared/snapshots/pp2-stacks-all` rank 0 repeated
//!   13 times (about 120 MiB);
//! - with `MEMSNAP_BENCH_10M=1`, the 10-million-event trace: `pp2-large` repeated 31 times
//!   (about 930 MiB; Python needs some 10 GiB and a few minutes to write it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const REPEAT_TRACE: &str = include_str!("repeat_trace.py");

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run(args: &[&str]) -> Duration {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .output()
        .expect("memsnap runs");
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// `source`'s trace repeated `copies` times into `out`.
fn repeated(source: &Path, out: &Path, copies: u32) -> Option<PathBuf> {
    let made = Command::new("python3")
        .args(["-c", REPEAT_TRACE])
        .arg(source)
        .arg(out)
        .arg(copies.to_string())
        .output()
        .ok()?;
    if !made.status.success() {
        eprintln!(
            "skipping {}: python3 could not make it: {}",
            out.display(),
            String::from_utf8_lossy(&made.stderr)
        );
        return None;
    }
    Some(out.to_path_buf())
}

/// First paint and the slowest frame in Chromium, when the browser tests can run here.
fn in_browser(page: &Path, dir: &Path) -> Option<(f64, f64)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/check.mjs");
    if !script.with_file_name("node_modules").is_dir() {
        eprintln!("no browser numbers: run npm ci --prefix tests/browser");
        return None;
    }
    let jobs = dir.join("jobs.json");
    let list = serde_json::json!([{ "page": page, "interact": true }]);
    std::fs::write(&jobs, list.to_string()).ok()?;
    let out = Command::new("node").arg(&script).arg(&jobs).output().ok()?;
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let r = &results[0];
    Some((r["firstPaintMs"].as_f64()?, r["maxDrawMs"].as_f64()?))
}

fn measure(label: &str, file: &Path, dir: &Path) {
    let page = dir.join("page.html");
    let file_s = file.to_str().unwrap();
    let page_s = page.to_str().unwrap();
    let (mut report, mut view) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        report.push(run(&["report", "--quiet", "--json", file_s]));
        view.push(run(&["view", "--quiet", "--force", file_s, "-o", page_s]));
    }
    let (report, view) = (median(report), median(view));
    let size = std::fs::metadata(&page).map_or(0, |m| m.len());
    println!("{label}");
    println!(
        "  page {:.2} MB · view {:.0} ms · report --json {:.0} ms · view/report {:.2}x",
        size as f64 / 1e6,
        view.as_secs_f64() * 1e3,
        report.as_secs_f64() * 1e3,
        view.as_secs_f64() / report.as_secs_f64()
    );
    if let Some((paint, frame)) = in_browser(&page, dir) {
        println!("  Chromium: first paint {paint:.0} ms · slowest frame zooming and panning {frame:.1} ms");
    }
}

fn main() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/snapshots");
    let dir = tempfile::tempdir().expect("temp dir");
    let all = shared.join("pp2-stacks-all/memory_snapshot_rank0_step0.pickle.xz");
    if !all.exists() {
        eprintln!("skipping: {} not found", all.display());
        return;
    }
    if let Some(f) = repeated(&all, &dir.path().join("all650k.pickle"), 13) {
        measure(
            "stacks=\"all\", 650k events (pp2-stacks-all rank 0 x13)",
            &f,
            dir.path(),
        );
        let _ = std::fs::remove_file(f);
    }
    if std::env::var("MEMSNAP_BENCH_10M").is_ok_and(|v| v == "1") {
        let large = shared.join("pp2-large/memory_snapshot_rank0_big_step0.pickle.xz");
        if let Some(f) = repeated(&large, &dir.path().join("ten_million.pickle"), 31) {
            measure("10 million events (pp2-large x31)", &f, dir.path());
        }
    } else {
        println!("(MEMSNAP_BENCH_10M=1 adds the 10-million-event file)");
    }
}

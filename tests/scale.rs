//! Inputs shaped to make a careless implementation quadratic: each is large enough that a
//! search per event over everything seen so far would not finish within the test run (about
//! 10^10 steps), while memsnap's indexes keep them to about n log n. Each is also built at a
//! quarter of its size, and the work measured (the command's best time of two) at both: four
//! times the input may cost at most eight times the time, where a quadratic path costs
//! sixteen.

use serde_pickle::value::{HashableValue as H, Value as V};
use std::collections::BTreeMap;

use crate::util::*;

const N: i64 = 60_000;

fn event(action: &str, addr: i64, size: i64) -> V {
    let mut e = BTreeMap::new();
    e.insert(H::String("action".into()), V::String(action.into()));
    e.insert(H::String("addr".into()), V::I64(addr));
    e.insert(H::String("size".into()), V::I64(size));
    e.insert(H::String("stream".into()), V::I64(0));
    e.insert(
        H::String("time_us".into()),
        V::I64(1_700_000_000_000_000 + addr % 1_000_000),
    );
    e.insert(H::String("frames".into()), V::List(vec![]));
    V::Dict(e)
}

/// The best of two runs of `memsnap args` (with the file in place of `{}`), in seconds.
fn best_time(args: &[&str], file: &str) -> f64 {
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "{}" { file } else { a })
        .collect();
    (0..2)
        .map(|_| {
            let start = std::time::Instant::now();
            ok(&args);
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The work of `memsnap args` on `build(n)` grows about linearly: from a quarter of `N` to
/// `N`, the time grows at most eightfold (a quadratic path grows sixteenfold). Times under
/// 50 ms count as 50 ms, where starting the process is most of it.
fn grows_linearly(
    dir: &tempfile::TempDir,
    what: &str,
    build: impl Fn(i64) -> Vec<V>,
    commands: &[&[&str]],
) {
    let small = write_snapshot(dir, &format!("{what}_small.pickle"), vec![], build(N / 4));
    let large = write_snapshot(dir, &format!("{what}_large.pickle"), vec![], build(N));
    for args in commands {
        let (a, b) = (best_time(args, &small), best_time(args, &large));
        let ratio = b / a.max(0.05);
        eprintln!("{what}: {args:?}: {a:.3} s, {b:.3} s, {ratio:.1}x");
        assert!(
            ratio < 8.0,
            "{what}: {args:?} took {a:.3} s at {} entries and {b:.3} s at {N} ({ratio:.1}x)",
            N / 4
        );
    }
}

fn write_snapshot(dir: &tempfile::TempDir, name: &str, segments: Vec<V>, trace: Vec<V>) -> String {
    write(dir, name, &snapshot_pickle(segments, trace))
}

fn json(file: &str) -> serde_json::Value {
    report_json(file, &[])
}

/// Allocations at distinct addresses with no segment to hold them.
#[test]
fn allocations_outside_every_segment() {
    let dir = scratch();
    let trace = (0..N)
        .map(|k| event("alloc", (1 << 40) + k * 4096, 512))
        .collect();
    let f = write_snapshot(&dir, "nosegments.pickle", vec![], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["events"], N);
}

/// Many different unknown action names.
#[test]
fn many_unknown_action_names() {
    let dir = scratch();
    let trace = (0..N)
        .map(|k| event(&format!("action_{k}"), k, 512))
        .collect();
    let f = write_snapshot(&dir, "unknown.pickle", vec![], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["unknown_actions"], N);
}

/// Many blocks alive at the end, and as many frees of blocks allocated before the trace.
#[test]
fn many_live_blocks_and_frees_of_older_ones() {
    let dir = scratch();
    let base = 1i64 << 40;
    let size = 4096 * N * 2;
    let blocks: Vec<V> = (0..2 * N)
        .map(|k| {
            let mut b = BTreeMap::new();
            b.insert(H::String("address".into()), V::I64(base + k * 4096));
            b.insert(H::String("size".into()), V::I64(4096));
            b.insert(H::String("requested_size".into()), V::I64(4096));
            let state = if k % 2 == 0 {
                "active_allocated"
            } else {
                "inactive"
            };
            b.insert(H::String("state".into()), V::String(state.into()));
            V::Dict(b)
        })
        .collect();
    let mut seg = BTreeMap::new();
    seg.insert(H::String("device".into()), V::I64(0));
    seg.insert(H::String("address".into()), V::I64(base));
    seg.insert(H::String("total_size".into()), V::I64(size));
    seg.insert(H::String("stream".into()), V::I64(0));
    seg.insert(H::String("segment_type".into()), V::String("large".into()));
    seg.insert(H::String("blocks".into()), V::List(blocks));
    let trace = (0..N)
        .flat_map(|k| {
            let a = base + (2 * k + 1) * 4096;
            [
                event("free_requested", a, 4096),
                event("free_completed", a, 4096),
            ]
        })
        .collect();
    let f = write_snapshot(&dir, "frees.pickle", vec![V::Dict(seg)], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["frees_without_alloc"], N);
}

/// An expandable segment growing by many mapped pages, with an allocation in each.
#[test]
fn many_mapped_pages() {
    let dir = scratch();
    let base = 1i64 << 40;
    let page = 2 << 20;
    let trace = (0..N)
        .flat_map(|k| {
            [
                event("segment_map", base + k * page, page),
                event("alloc", base + k * page, 512),
            ]
        })
        .collect();
    let f = write_snapshot(&dir, "maps.pickle", vec![], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["events"], 2 * N);
    assert_eq!(v["devices"][0]["peak_reserved_bytes"], N * page);
}

/// An allocation event whose stack is `frames` (file, line, function).
fn event_with_frames(addr: i64, frames: &[(String, i64, String)]) -> V {
    let V::Dict(mut e) = event("alloc", addr, 512) else {
        unreachable!()
    };
    let frames = frames
        .iter()
        .map(|(file, line, name)| {
            let mut f = BTreeMap::new();
            f.insert(H::String("filename".into()), V::String(file.clone()));
            f.insert(H::String("line".into()), V::I64(*line));
            f.insert(H::String("name".into()), V::String(name.clone()));
            V::Dict(f)
        })
        .collect();
    e.insert(H::String("frames".into()), V::List(frames));
    V::Dict(e)
}

/// `n` allocations whose single frames are in files that all end in `/model.py`.
fn same_base(n: i64) -> Vec<V> {
    (0..n)
        .map(|k| {
            event_with_frames(
                k * 512,
                &[(format!("/src/d{k}/model.py"), 3, "forward".into())],
            )
        })
        .collect()
}

/// `n` allocations each in a file, function and line of its own.
fn distinct_files(n: i64) -> Vec<V> {
    (0..n)
        .map(|k| {
            event_with_frames(
                k * 512,
                &[(format!("/src/pkg{k}/mod{k}.py"), k % 1000, format!("f{k}"))],
            )
        })
        .collect()
}

/// `n` allocations whose stacks of 20 frames are drawn from 10^4 distinct frames.
fn shared_frames(n: i64) -> Vec<V> {
    (0..n)
        .map(|i| {
            let frames: Vec<_> = (0..20)
                .map(|k| {
                    let f = (i * 7 + k) % 10_000;
                    (format!("/src/m{f}.py"), k, format!("g{}", (i + k) % 10_000))
                })
                .collect();
            event_with_frames(i * 512, &frames)
        })
        .collect()
}

/// Frame file names that all end the same (`/src/dK/model.py`), so that each one's shortest
/// distinguishing suffix must be found among all the others (compared pair by pair: 3.6 x 10^9
/// suffix tests), and as many file names that are all different.
#[test]
fn many_files_with_one_base_name_and_many_distinct_files() {
    let dir = scratch();
    let f = write_snapshot(&dir, "samebase.pickle", vec![], same_base(N));
    let text = ok(&["report", &f, "--by", "site", "--top", "3"]);
    assert!(text.contains("/model.py:forward"), "{text}");
    let folded = ok(&["flamegraph", &f, "--folded", "--at", "end"]);
    assert!(
        folded.contains("d17/model.py"),
        "{}",
        &folded[..folded.len().min(500)]
    );
    let f = write_snapshot(&dir, "distinct.pickle", vec![], distinct_files(N));
    let v = json(&f);
    assert_eq!(v["devices"][0]["events"], N);

    let report: &[&str] = &["report", "{}", "--by", "site", "--top", "3"];
    let folded: &[&str] = &["flamegraph", "{}", "--folded", "--at", "end"];
    grows_linearly(&dir, "samebase", same_base, &[report, folded]);
    grows_linearly(&dir, "distinct", distinct_files, &[report]);
}

/// Entries whose stacks of 20 frames are drawn from 10^4 distinct frames, through every
/// command that reads stacks.
#[test]
fn many_entries_sharing_a_pool_of_frames() {
    let dir = scratch();
    let f = write_snapshot(&dir, "shared_frames.pickle", vec![], shared_frames(N));
    assert_eq!(json(&f)["devices"][0]["events"], N);
    let folded = ok(&["flamegraph", &f, "--folded", "--at", "end"]);
    assert!(folded.lines().count() > 1000);
    let tables = dir.path().join("tables");
    ok(&[
        "export",
        &f,
        "-o",
        &tables.to_string_lossy(),
        "--format",
        "jsonl",
    ]);
    let out = dir.path().join("cut.pickle");
    ok(&[
        "trim",
        &f,
        "-o",
        &out.to_string_lossy(),
        "--from",
        "100",
        "--to",
        "50000",
    ]);
    let cut = json(&out.to_string_lossy());
    assert_eq!(cut["devices"][0]["events"], 49_901);

    let tables = dir.path().join("t");
    let tables = tables.to_string_lossy();
    let cut = dir.path().join("c.pickle");
    let cut = cut.to_string_lossy();
    grows_linearly(
        &dir,
        "shared_frames",
        shared_frames,
        &[
            &["report", "{}"],
            &["flamegraph", "{}", "--folded", "--at", "end"],
            &[
                "export", "{}", "-o", &tables, "--format", "jsonl", "--force",
            ],
            &["trim", "{}", "-o", &cut, "--force"],
        ],
    );
}

/// Every event carries one stack of 10^5 frames, shared through the memo: work on a stack is
/// done once per distinct stack, never per event (a trimmed snapshot shares the stack's list as
/// the original does; before, `trim` wrote the 10^5 frames again for each of the 9·10^4 events
/// and took 117 s on 3·10^4 allocations). From a quarter of the allocations to all of them, the
/// time grows at most eightfold, and the whole takes under 10 s.
#[test]
fn one_deep_stack_shared_by_every_event() {
    let dir = scratch();
    let frames: Vec<(String, String, i64)> = (0..1000)
        .map(|k| (format!("f{k}"), format!("/x/model{}.py", k % 7), k))
        .collect();
    let allocations = 30_000;
    let small = write(
        &dir,
        "deep_small.pickle",
        &shared_stack_pickle(&frames, 100_000, allocations / 4),
    );
    let large = write(
        &dir,
        "deep_large.pickle",
        &shared_stack_pickle(&frames, 100_000, allocations),
    );
    let trimmed = dir.path().join("trimmed.pickle");
    let trimmed = trimmed.to_string_lossy();
    let args: &[&str] = &["trim", "{}", "-o", &trimmed, "--force"];
    let (a, b) = (best_time(args, &small), best_time(args, &large));
    let ratio = b / a.max(0.05);
    eprintln!("deep stack: {args:?}: {a:.3} s, {b:.3} s, {ratio:.1}x");
    assert!(b < 10.0 && ratio < 8.0, "{args:?}: {a:.3} s, then {b:.3} s");
    // the trimmed file keeps every event and stays small
    let size = std::fs::metadata(&*trimmed).unwrap().len();
    assert!(size < 8 << 20, "a trimmed file of {size} bytes");
    let out = ok(&["trim", &large, "-o", &trimmed, "--force", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["trimmed"]["events"], 3 * allocations - 2 + 1);
}

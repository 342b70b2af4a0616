//! `cargo bench`: `memsnap report` against Python on the same plain pickle.
//!
//! Two files, each decompressed to a temporary plain pickle:
//! - `../shared/snapshots/pp2-large` (325k events, `stacks="python"`, 28.5 MiB);
//! - a `stacks="all"` trace of 650k events (~110 MB), made from `../shared/snapshots/
//!   pp2-stacks-all` by Python: its trace repeated 13 times, each copy at other addresses and
//!   times, as new objects (so the pickle has the shape of a long recording); rank 1, whose
//!   trace is longer, is repeated 11 times, to 700k events.
//!
//! For each, five times and in alternation, the medians of:
//! - the whole `memsnap report --json FILE` process (decode, replay, report, process start);
//! - `pickle.load(f)` alone inside Python (interpreter start-up not counted);
//! - the work of `python -m torch.cuda._memory_viz stats` (torch itself is not needed): the
//!   same `pickle.load`, then per segment a summary of its blocks (bytes and counts per state,
//!   largest free block), written here;
//!
//! with ratios, and peak memory (maximum resident set size) against the pickle's size. For the
//! second file also `memsnap compare` of two such ranks (each decoded on one thread, side by
//! side; on four or more cores `report` decodes the second file in parts), and in alternation
//! with it `memsnap diff` of the same two. With
//! `MEMSNAP_BENCH_RANKS=FOLDER`, the first two snapshots of that folder (two ranks of a real
//! recording, such as config G of `../shared/snapgen/run_all.sh`) are used instead of the
//! repeated trace. Then it times the
//! allocator simulation on pp2-large's trace, once and twice in a row, under the recorded
//! settings and with expandable segments. Pass another snapshot path as the first argument to use it instead of
//! pp2-large.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const RUNS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Peak resident memory of a command, in bytes, through GNU time when it is installed.
fn peak_rss(cmd: &[&str]) -> Option<u64> {
    let out = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("MAXRSS %M")
        .args(cmd)
        .output()
        .ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    let kb: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("MAXRSS "))?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// `pickle.load` alone, timed inside Python.
const PICKLE_LOAD: &str = "import pickle, sys, time
t = time.perf_counter()
with open(sys.argv[1], 'rb') as f: pickle.load(f)
print(time.perf_counter() - t)";

/// `pickle.load` and a per-segment summary of blocks, as `_memory_viz stats` prints.
const VIZ_STATS: &str = "import pickle, sys, time
t = time.perf_counter()
with open(sys.argv[1], 'rb') as f: snap = pickle.load(f)
segments = snap['segments'] if isinstance(snap, dict) else snap
lines = []
for seg in segments:
    per_state = {}
    largest_free = 0
    for b in seg['blocks']:
        n, total = per_state.get(b['state'], (0, 0))
        per_state[b['state']] = (n + 1, total + b['size'])
        if b['state'] == 'inactive':
            largest_free = max(largest_free, b['size'])
    lines.append(f\"{seg['address']:x} {seg['total_size']} {sorted(per_state.items())} {largest_free}\")
lines.append(f'{len(segments)} segments')
out = '\\n'.join(lines)
print(time.perf_counter() - t)";

/// The `stacks="all"` file at scale: the trace of `source` repeated `copies` times.
const REPEAT_TRACE: &str = include_str!("repeat_trace.py");

/// Runs a Python snippet that prints its own seconds; `None` if Python fails.
fn python_seconds(code: &str, file: &str) -> Option<Duration> {
    let out = Command::new("python3")
        .args(["-c", code, file])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let secs: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some(Duration::from_secs_f64(secs))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// Times `memsnap report` against `pickle.load` and the `_memory_viz stats` work on `plain`.
fn against_python(label: &str, plain: &Path) {
    let plain_s = plain.to_string_lossy().into_owned();
    let size = std::fs::metadata(plain).map_or(0, |m| m.len());
    let memsnap = env!("CARGO_BIN_EXE_memsnap");
    let (mut ours, mut load, mut stats) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let t = Instant::now();
        let out = Command::new(memsnap)
            .args(["report", "--json", &plain_s])
            .output()
            .expect("memsnap runs");
        ours.push(t.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        load.extend(python_seconds(PICKLE_LOAD, &plain_s));
        stats.extend(python_seconds(VIZ_STATS, &plain_s));
    }
    println!("== {label} ({:.1} MiB pickle)", mib(size));
    let ours = median(ours).as_secs_f64();
    println!("memsnap report (whole process):     {:>8.1} ms", ours * 1e3);
    for (name, times) in [
        ("python pickle.load (load only):    ", load),
        ("python _memory_viz stats work:     ", stats),
    ] {
        if times.is_empty() {
            println!("{name} python3 not available");
            continue;
        }
        let theirs = median(times).as_secs_f64();
        println!(
            "{name} {:>8.1} ms: memsnap is {:.1}x faster",
            theirs * 1e3,
            theirs / ours
        );
    }
    match peak_rss(&[memsnap, "report", "--json", &plain_s]) {
        Some(rss) => println!(
            "peak memory: memsnap {:.1} MiB = {:.2}x the pickle",
            mib(rss),
            rss as f64 / size as f64
        ),
        None => println!("peak memory: /usr/bin/time not available"),
    }
    if let Some(rss) = peak_rss(&["python3", "-c", PICKLE_LOAD, &plain_s]) {
        println!(
            "peak memory: python pickle.load {:.1} MiB = {:.2}x the pickle",
            mib(rss),
            rss as f64 / size as f64
        );
    }
}

/// Decompresses `source` into `dir` and returns the plain pickle's path.
fn plain_copy(source: &Path, dir: &Path, name: &str) -> PathBuf {
    let plain = dir.join(name);
    let mut raw = Vec::new();
    let (mut reader, _) =
        memsnap::pickle::source::decompressing(std::fs::File::open(source).unwrap()).unwrap();
    reader.read_to_end(&mut raw).unwrap();
    std::fs::write(&plain, &raw).unwrap();
    plain
}

fn main() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/snapshots");
    let arg = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let source = arg
        .map(PathBuf::from)
        .unwrap_or_else(|| shared.join("pp2-large/memory_snapshot_rank0_big_step0.pickle.xz"));
    if !source.exists() {
        eprintln!("skipping: {} not found", source.display());
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let plain = plain_copy(&source, dir.path(), "snapshot.pickle");
    against_python(&source.display().to_string(), &plain);
    at_scale(&shared, dir.path());
    simulation(&plain);
}

/// The 650k-event `stacks="all"` files: report against Python, and compare of two ranks.
fn at_scale(shared: &Path, dir: &Path) {
    let made = match std::env::var_os("MEMSNAP_BENCH_RANKS") {
        Some(folder) => recorded_ranks(Path::new(&folder), dir),
        None => synthetic_ranks(shared, dir),
    };
    let Some((files, what)) = made else {
        return;
    };
    let events = events_of(&files[0]);
    against_python(
        &format!("stacks=\"all\", {events} events ({what})"),
        &files[0],
    );
    // compare and diff of the two ranks, in alternation
    let (mut compare, mut diff) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        for (command, times) in [("compare", &mut compare), ("diff", &mut diff)] {
            let t = Instant::now();
            let out = Command::new(env!("CARGO_BIN_EXE_memsnap"))
                .arg(command)
                .args(&files)
                .output()
                .expect("memsnap runs");
            times.push(t.elapsed());
            assert!(out.status.success(), "{command}");
        }
    }
    let (compare, diff) = (median(compare), median(diff));
    println!(
        "memsnap compare of the two ranks: {:>8.1} ms",
        compare.as_secs_f64() * 1e3
    );
    println!(
        "memsnap diff of the two ranks:    {:>8.1} ms  ({:.2}x compare)",
        diff.as_secs_f64() * 1e3,
        diff.as_secs_f64() / compare.as_secs_f64()
    );
}

/// The first two snapshot files of `folder` (two ranks of one recording), as plain pickles in
/// `dir`, and what they are.
fn recorded_ranks(folder: &Path, dir: &Path) -> Option<(Vec<PathBuf>, String)> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(folder)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(".pickle"))
        .collect();
    found.sort();
    if found.len() < 2 {
        eprintln!(
            "skipping the recorded ranks: {} holds fewer than two snapshots",
            folder.display()
        );
        return None;
    }
    let files: Vec<PathBuf> = found[..2]
        .iter()
        .enumerate()
        .map(|(k, p)| plain_copy(p, dir, &format!("recorded_rank{k}.pickle")))
        .collect();
    let name = found[0]
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    Some((files, format!("recorded: {}", name.unwrap_or_default())))
}

/// Events of the first device of a snapshot with events, as `memsnap report --json` counts
/// them (0 when it cannot tell).
fn events_of(path: &Path) -> u64 {
    Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(["report", "--json"])
        .arg(path)
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v["devices"][0]["events"].as_u64())
        .unwrap_or(0)
}

/// Events each made rank holds at least: those of a 650k-event recording.
const RANK_EVENTS: u64 = 650_000;

/// Two ranks made from `pp2-stacks-all` by Python, each its trace repeated as often as it
/// takes to hold [`RANK_EVENTS`] (rank 0's 13 times, rank 1's longer trace 11 times), and what
/// they are.
fn synthetic_ranks(shared: &Path, dir: &Path) -> Option<(Vec<PathBuf>, String)> {
    let mut files = Vec::new();
    let mut first_copies = 0;
    for rank in 0..2 {
        let source = shared.join(format!(
            "pp2-stacks-all/memory_snapshot_rank{rank}_step0.pickle.xz"
        ));
        let copies = RANK_EVENTS.div_ceil(events_of(&source).max(1));
        if rank == 0 {
            first_copies = copies;
        }
        let out = dir.join(format!("scale_rank{rank}.pickle"));
        let made = Command::new("python3")
            .args(["-c", REPEAT_TRACE])
            .arg(&source)
            .arg(&out)
            .arg(copies.to_string())
            .output();
        match made {
            Ok(o) if o.status.success() => files.push(out),
            _ => {
                eprintln!("skipping the 650k-event file: python3 could not make it");
                return None;
            }
        }
    }
    Some((
        files,
        format!("pp2-stacks-all rank 0, trace x{first_copies}"),
    ))
}

/// Times one simulation of the trace, and of the trace played twice in a row.
fn simulation(plain: &Path) {
    use memsnap::simulate::{self, AllocConf, Op, Options, Program};
    let snap = memsnap::snapshot::Snapshot::open(plain).expect("snapshot");
    let Some(device) = snap.devices_with_events().next() else {
        return;
    };
    let replay = memsnap::replay::replay(&snap, device, Default::default());
    let recorded = AllocConf::recorded(&snap);
    let once = Program::new(&snap, &replay);
    // the same requests again after the first pass, with their own ids
    let mut twice = once.clone();
    let n = once.events;
    let shift = (n + replay.preexisting.len()) as u32;
    for &(event, op) in &once.ops {
        let op = match op {
            Op::Alloc {
                req,
                size,
                stream,
                pool,
            } => Op::Alloc {
                req: req + shift,
                size,
                stream,
                pool,
            },
            Op::Free { req, now } => Op::Free {
                req: req + shift,
                now,
            },
            Op::Complete { req } => Op::Complete { req: req + shift },
            other => other,
        };
        twice.ops.push((event + n, op));
    }
    twice.events = 2 * n;
    for (name, program) in [("trace", &once), ("trace twice", &twice)] {
        for conf in [
            recorded.clone(),
            AllocConf::parse("expandable_segments:True").unwrap(),
        ] {
            let options = Options {
                conf: conf.clone(),
                ..Options::default()
            };
            let mut times = Vec::new();
            for _ in 0..RUNS {
                let t = Instant::now();
                let out = simulate::simulate(&snap, &replay, program, &recorded, &options);
                times.push(t.elapsed());
                assert!(out.peak_reserved_bytes > 0);
            }
            println!(
                "simulation of the {name} ({} events) under {conf}: {:>7.1} ms",
                program.events,
                median(times).as_secs_f64() * 1e3
            );
        }
    }
}

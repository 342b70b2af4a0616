//! `cargo bench`: `memsnap report` against Python's bare `pickle.load` on the same file.
//!
//! Decompresses `../shared/snapshots/pp2-large` (325k events, 30 MB) to a temporary plain
//! pickle, then times, five times each and in alternation:
//! - the whole `memsnap report --json FILE` process (decode, replay, report, process start);
//! - `pickle.load(f)` alone inside Python (interpreter start-up not counted).
//!
//! It prints the medians, their ratio, and peak memory (maximum resident set size) of both
//! against the pickle's size. Then it times the allocator simulation (`memsnap whatif`) on
//! the same trace and on the trace played twice in a row (650k events), under the recorded
//! settings and with expandable segments. Pass another snapshot path as the first argument
//! to use it.

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

fn main() {
    let arg = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let source = arg.map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/snapshots/pp2-large/memory_snapshot_rank0_big_step0.pickle.xz")
    });
    if !source.exists() {
        eprintln!("skipping: {} not found", source.display());
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let plain = dir.path().join("snapshot.pickle");
    let mut raw = Vec::new();
    let (mut reader, _) =
        memsnap::pickle::source::decompressing(std::fs::File::open(&source).unwrap()).unwrap();
    reader.read_to_end(&mut raw).unwrap();
    std::fs::write(&plain, &raw).unwrap();
    let plain_s = plain.to_string_lossy().into_owned();
    let memsnap = env!("CARGO_BIN_EXE_memsnap");
    let python_code = "import pickle, sys, time\n\
        t = time.perf_counter()\n\
        with open(sys.argv[1], 'rb') as f: pickle.load(f)\n\
        print(time.perf_counter() - t)";

    let mut ours = Vec::new();
    let mut theirs = Vec::new();
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
        match Command::new("python3")
            .args(["-c", python_code, &plain_s])
            .output()
        {
            Ok(out) if out.status.success() => {
                let secs: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
                theirs.push(Duration::from_secs_f64(secs));
            }
            _ => {}
        }
    }
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "file: {} ({:.1} MiB pickle)",
        source.display(),
        mb(raw.len() as u64)
    );
    let ours = median(ours);
    println!(
        "memsnap report (whole process): {:>8.1} ms",
        ours.as_secs_f64() * 1e3
    );
    if theirs.is_empty() {
        println!("python3 not available: no ratio");
    } else {
        let theirs = median(theirs);
        println!(
            "python pickle.load (load only): {:>8.1} ms",
            theirs.as_secs_f64() * 1e3
        );
        println!(
            "ratio: memsnap is {:.1}x faster",
            theirs.as_secs_f64() / ours.as_secs_f64()
        );
    }
    match peak_rss(&[memsnap, "report", "--json", &plain_s]) {
        Some(rss) => println!(
            "peak memory: memsnap {:.1} MiB = {:.2}x the pickle",
            mb(rss),
            rss as f64 / raw.len() as f64
        ),
        None => println!("peak memory: /usr/bin/time not available"),
    }
    if let Some(rss) = peak_rss(&["python3", "-c", python_code, &plain_s]) {
        println!(
            "peak memory: python {:.1} MiB = {:.2}x the pickle",
            mb(rss),
            rss as f64 / raw.len() as f64
        );
    }
    simulation(&plain);
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
            Op::Alloc { req, size, stream } => Op::Alloc {
                req: req + shift,
                size,
                stream,
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

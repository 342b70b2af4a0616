//! `memsnap compare` over report summaries: the JSON that `memsnap report --json` writes beside
//! each rank's snapshot, merged without reading a pickle again.

use std::fs;

use crate::util::*;

const PIPELINE: &str = "snapshots/pipelines/pp4n8";

fn pipeline_snapshots() -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(testdata(PIPELINE))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pickle.xz"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}

fn rows(json: &str) -> Vec<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    value["rows"].as_array().unwrap().clone()
}

/// Sets a file's modification time (a pickle older or newer than its summary).
fn set_modified(path: &std::path::Path, time: std::time::SystemTime) {
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(time)
        .unwrap();
}

/// `compare --json FOLDER`, which must say it read the summaries of all `n` snapshots alone.
fn compare_from_summaries(folder: &str, n: usize) -> std::process::Output {
    let o = memsnap(&["compare", "--json", folder]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "read the summaries written beside the {n} snapshots"
        )),
        "{}",
        stderr(&o)
    );
    o
}

#[test]
fn summaries_give_the_rank_table_of_the_snapshots() {
    let snapshots = pipeline_snapshots();
    assert_eq!(snapshots.len(), 4);
    let dir = scratch();
    let summary = dir.path().join("ranks.jsonl");
    let mut lines = String::new();
    for s in &snapshots {
        lines.push_str(&ok(&["report", "--json", s]));
    }
    fs::write(&summary, lines).unwrap();

    let mut args = vec!["compare", "--json"];
    args.extend(snapshots.iter().map(String::as_str));
    let from_snapshots = rows(&ok(&args));
    let from_summaries = rows(&ok(&["compare", "--json", &summary.to_string_lossy()]));
    assert_eq!(from_summaries.len(), 4);
    for (a, b) in from_snapshots.iter().zip(&from_summaries) {
        for key in [
            "rank",
            "pipeline_rank",
            "file",
            "device",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "peak",
            "top_category",
        ] {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
    // The pipeline ranks come from the schedule, not only from the file names.
    let pipeline: Vec<i64> = from_summaries
        .iter()
        .map(|r| r["pipeline_rank"].as_i64().unwrap())
        .collect();
    assert_eq!(pipeline, [0, 1, 2, 3]);

    let text = ok(&["compare", &summary.to_string_lossy()]);
    assert!(text.contains("why rank 0 peaks"), "{text}");
    assert!(text.contains("peak allocated across 4 ranks"), "{text}");

    // A second data-parallel replica of the pipeline, 1 MiB higher everywhere: each pipeline
    // rank has two replicas whose peaks are 1 MiB apart.
    let mut replicas = String::new();
    for (i, line) in fs::read_to_string(&summary).unwrap().lines().enumerate() {
        let mut r: serde_json::Value = serde_json::from_str(line).unwrap();
        replicas.push_str(line);
        replicas.push('\n');
        r["file"] = format!("memory_snapshot_rank{}_step0.pickle", i + 4).into();
        let peak = r["devices"][0]["peak_allocated_bytes"].as_u64().unwrap();
        r["devices"][0]["peak_allocated_bytes"] = (peak + (1 << 20)).into();
        replicas.push_str(&serde_json::to_string(&r).unwrap());
        replicas.push('\n');
    }
    let both = dir.path().join("replicas.jsonl");
    fs::write(&both, replicas).unwrap();
    let text = ok(&["compare", &both.to_string_lossy()]);
    let groups: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("pipeline rank"))
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(groups.len(), 4, "{text}");
    for g in groups {
        assert!(
            g.contains(" 2 ") && g.trim_end().ends_with("1.00 MiB"),
            "{g}"
        );
    }
}

/// A job of 4,096 ranks: 64 summary files of 64 lines, one of them damaged. The damaged file is
/// named with its line, the others are all compared, the text shows the extremes and the spread.
#[test]
fn thousands_of_ranks_merge_from_summaries() {
    let snapshot = &pipeline_snapshots()[0];
    let template = report_json(snapshot, &[]);
    let base = template["devices"][0]["peak_allocated_bytes"]
        .as_u64()
        .unwrap();
    let dir = scratch();
    let mut files = Vec::new();
    for node in 0..64u64 {
        let mut lines = String::new();
        for local in 0..64u64 {
            let rank = node * 64 + local;
            let mut r = template.clone();
            r["file"] = format!("node{node}/memory_snapshot_rank{rank}_step0.pickle").into();
            r["devices"][0]["peak_allocated_bytes"] = (base + rank * (1 << 20)).into();
            lines.push_str(&serde_json::to_string(&r).unwrap());
            lines.push('\n');
        }
        let path = dir.path().join(format!("node{node}.jsonl"));
        fs::write(&path, lines).unwrap();
        files.push(path.to_string_lossy().into_owned());
    }
    let damaged = dir.path().join("node64.jsonl");
    fs::write(&damaged, "{\"file\": \"x\", \"devices\": [tru\n").unwrap();
    files.push(damaged.to_string_lossy().into_owned());

    let mut args = vec!["compare", "--json"];
    args.extend(files.iter().map(String::as_str));
    let o = memsnap(&args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("node64.jsonl") && err.contains("line 1"),
        "{err}"
    );
    let all = rows(&stdout(&o));
    let compared: Vec<&serde_json::Value> = all.iter().filter(|r| r["error"].is_null()).collect();
    assert_eq!(compared.len(), 4096);
    let highest = compared
        .iter()
        .max_by_key(|r| r["peak_allocated_bytes"].as_u64())
        .unwrap();
    assert_eq!(highest["rank"], 4095);
    assert_eq!(highest["peak_allocated_bytes"], base + 4095 * (1 << 20));

    let png = dir.path().join("spread.png");
    let mut args = vec!["compare", "--png", png.to_str().unwrap()];
    args.extend(files.iter().take(64).map(String::as_str));
    let text = ok(&args);
    assert!(
        text.contains("4,096 ranks; the ten highest and the ten lowest"),
        "{text}"
    );
    assert!(text.contains("rank 4095"), "{text}");
    assert!(text.lines().count() < 120, "{text}");
    assert!(fs::metadata(&png).unwrap().len() > 1000);
}

/// An empty summary file is an error that names it, and no chart is drawn when no summary
/// could be read (an empty chart would look like a result).
#[test]
fn nothing_to_compare_draws_nothing() {
    let dir = scratch();
    let empty = write(&dir, "empty.jsonl", b"");
    let png = dir.path().join("spread.png");
    let png_arg = png.to_string_lossy().into_owned();
    let o = memsnap(&["compare", &empty, "--png", &png_arg]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("empty.jsonl: not a memory snapshot: holds no report summary"));
    assert!(stderr(&o).contains("not drawn"), "{}", stderr(&o));
    assert!(!png.exists());
    let missing = dir.path().join("none.jsonl").to_string_lossy().into_owned();
    let o = memsnap(&["compare", &missing, "--png", &png_arg]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!png.exists());
}

/// Eight ranks recorded under torchrun (the DualPipeV program, 8 pipeline ranks), each with the
/// summary `memsnap.Capture(summary=True)` writes beside its snapshot: `memsnap report --json`
/// of it, in `<snapshot>.summary.json`.
#[test]
fn a_folder_of_ranks_with_fresh_summaries_is_compared_from_them_alone() {
    let src = testdata("snapshots/pipelines/pp8n16");
    let dir = scratch();
    let mut snapshots: Vec<std::path::PathBuf> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pickle.xz"))
        .collect();
    snapshots.sort();
    assert_eq!(snapshots.len(), 8);
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let mut copies = Vec::new();
    for s in &snapshots {
        let copy = dir.path().join(s.file_name().unwrap());
        fs::copy(s, &copy).unwrap();
        // the summary is named after the pickle as it was written, before compression
        let name = copy.to_string_lossy().into_owned();
        let summary = format!("{}.summary.json", name.strip_suffix(".xz").unwrap());
        fs::write(&summary, ok(&["report", "--json", &name])).unwrap();
        set_modified(&copy, old);
        copies.push((copy, summary));
    }
    let folder = dir.path().to_string_lossy().into_owned();
    let truth: Vec<String> = snapshots
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let mut args = vec!["compare", "--json"];
    args.extend(truth.iter().map(|s| s.as_str()));
    let from_pickles = rows(&ok(&args));
    let o = compare_from_summaries(&folder, 8);
    let from_summaries = rows(&stdout(&o));
    assert_eq!(from_summaries.len(), 8);
    for (a, b) in from_pickles.iter().zip(&from_summaries) {
        assert_eq!(a["rank"], b["rank"]);
        assert_eq!(a["peak_allocated_bytes"], b["peak_allocated_bytes"]);
        assert_eq!(a["peak_reserved_bytes"], b["peak_reserved_bytes"]);
    }
    // no pickle is read: a ruined one (older than its summary) changes nothing
    let (pickle, _) = &copies[3];
    fs::write(pickle, b"not a pickle").unwrap();
    set_modified(pickle, old);
    assert_eq!(rows(&ok(&["compare", "--json", &folder])).len(), 8);
    // a pickle newer than its summary: the pickles are read (and the ruined one says so)
    let (pickle, _) = &copies[5];
    set_modified(
        pickle,
        std::time::SystemTime::now() + std::time::Duration::from_secs(60),
    );
    let o = memsnap(&["compare", "--json", &folder]);
    assert!(
        stderr(&o)
            .contains("reading the pickles: 1 of 8 snapshots have no summary beside them newer"),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("memory_snapshot_rank3"),
        "{}",
        stderr(&o)
    );
}

/// Eight ranks of one job under `torchrun --nproc-per-node 8` on the device's one GPU
/// (`testdata/record/fleet.py`), each writing its summary through `memsnap.Capture(summary=
/// True)` in a child process: `compare DIR` reads the summaries alone, and each rank's peaks
/// are what the rank printed (rank 5, which kept 64 MiB more, the outlier).
#[test]
fn eight_torchrun_ranks_compare_from_the_summaries_they_wrote() {
    let src = testdata("snapshots/fleet");
    let log = fs::read_to_string(src.join("log.txt")).unwrap();
    let dir = scratch();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for e in fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let copy = dir.path().join(&name);
        fs::copy(&p, &copy).unwrap();
        if name.ends_with(".pickle.xz") {
            // the pickles older than the summaries written after them
            set_modified(&copy, old);
        }
    }
    let folder = dir.path().to_string_lossy().into_owned();
    let o = compare_from_summaries(&folder, 8);
    let table = rows(&stdout(&o));
    assert_eq!(table.len(), 8);
    for r in &table {
        let rank = r["rank"].as_u64().expect("a rank");
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("[rank={rank}] PEAK ")))
            .expect("the rank's PEAK line");
        let field = |name: &str| -> u64 {
            let at = line.find(name).unwrap() + name.len();
            line[at..].split(' ').next().unwrap().parse().unwrap()
        };
        assert_eq!(
            r["peak_allocated_bytes"],
            field("max_memory_allocated="),
            "rank {rank}"
        );
        assert_eq!(
            r["peak_reserved_bytes"],
            field("max_memory_reserved="),
            "rank {rank}"
        );
    }
    let peak = |rank: u64| {
        table.iter().find(|r| r["rank"] == rank).unwrap()["peak_allocated_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(peak(5) - peak(0), 64 << 20, "the outlier's 64 MiB");
    // each summary is what report --json says of its pickle now
    for rank in [0u64, 5] {
        let pickle = src.join(format!("memory_snapshot_rank{rank}_step1.pickle.xz"));
        let fresh: serde_json::Value =
            serde_json::from_str(&ok(&["report", "--json", pickle.to_str().unwrap()])).unwrap();
        assert_eq!(fresh["devices"][0]["peak_allocated_bytes"], peak(rank));
    }
}

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

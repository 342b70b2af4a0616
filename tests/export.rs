//! `memsnap export`: four tables whose figures are the report's, in Parquet, CSV and JSON
//! lines, with the documented columns.

use std::fs;
use std::path::Path;

use crate::util::*;

const PIPELINE: &str = "snapshots/pipelines/pp4n8/memory_snapshot_rank0_pp4n8_step0.pickle.xz";

const EVENT_COLUMNS: [&str; 21] = [
    "device",
    "index",
    "time_us",
    "action",
    "addr",
    "size",
    "stream",
    "allocated_after_bytes",
    "requested_after_bytes",
    "reserved_after_bytes",
    "train_step",
    "step",
    "op",
    "micro_batch",
    "micro_batch_backward",
    "stage",
    "layer",
    "category",
    "phase",
    "annotation",
    "site",
];

fn report(file: &str) -> serde_json::Value {
    report_json(file, &[])["devices"][0].clone()
}

fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sum(rows: &[serde_json::Value], key: &str) -> u64 {
    rows.iter().map(|r| r[key].as_u64().unwrap()).sum()
}

#[test]
fn json_lines_hold_the_report_figures() {
    let file = testdata(PIPELINE).to_string_lossy().into_owned();
    let dir = scratch();
    let out = dir.path().join("tables");
    let export = |extra: &[&str]| {
        let mut args = vec![
            "export",
            &file,
            "-o",
            out.to_str().unwrap(),
            "--format",
            "jsonl",
        ];
        args.extend_from_slice(extra);
        memsnap(&args)
    };
    let printed = export(&[]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    let printed = stdout(&printed);
    assert_eq!(printed.lines().count(), 4, "{printed}");
    let r = report(&file);
    // The table names are memsnap's: a second export into the folder replaces its own tables
    // with the same ones.
    let first = std::fs::read(out.join("peak.jsonl")).unwrap();
    let again = export(&[]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(std::fs::read(out.join("peak.jsonl")).unwrap(), first);
    let listed = export(&["--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let listed = stdout(&listed);
    let listed: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    let names: Vec<&str> = listed["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["table"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["events", "blocks", "steps", "peak"]);
    assert_eq!(listed["tables"][0]["rows"], r["events"]);
    assert_eq!(
        listed["tables"][0]["columns"].as_array().unwrap().len(),
        EVENT_COLUMNS.len()
    );

    let events = jsonl(&out.join("events.jsonl"));
    assert_eq!(events.len() as u64, r["events"].as_u64().unwrap());
    let keys: Vec<&str> = events[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = EVENT_COLUMNS.to_vec();
    expected.sort_unstable();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, expected);
    let peak = events
        .iter()
        .map(|e| e["allocated_after_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(peak, r["peak_allocated_bytes"].as_u64().unwrap());
    let peak_requested = events
        .iter()
        .map(|e| e["requested_after_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(peak_requested, r["peak_requested_bytes"].as_u64().unwrap());
    let last = events.last().unwrap();
    assert_eq!(last["allocated_after_bytes"], r["end_allocated_bytes"]);
    assert_eq!(last["reserved_after_bytes"], r["end_reserved_bytes"]);
    assert!(events
        .iter()
        .any(|e| e["step"] == "step 4" && e["micro_batch"].is_u64()));

    let blocks = jsonl(&out.join("blocks.jsonl"));
    assert_eq!(
        sum(&blocks, "size_bytes"),
        r["end_allocated_bytes"].as_u64().unwrap()
    );

    let peak_rows = jsonl(&out.join("peak.jsonl"));
    let by_category: Vec<serde_json::Value> = peak_rows
        .into_iter()
        .filter(|p| p["dimension"] == "category")
        .collect();
    assert_eq!(
        sum(&by_category, "bytes"),
        r["peak_allocated_bytes"].as_u64().unwrap()
    );

    let steps = jsonl(&out.join("steps.jsonl"));
    assert_eq!(steps.len(), r["steps"].as_array().unwrap().len());
    let highest = steps
        .iter()
        .map(|s| s["peak_allocated_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(highest, r["peak_allocated_bytes"].as_u64().unwrap());
}

#[cfg(feature = "export")]
#[test]
fn parquet_reads_back_with_the_documented_schema() {
    use polars::prelude::*;

    let file = testdata(PIPELINE).to_string_lossy().into_owned();
    let dir = scratch();
    let out = dir.path().join("tables");
    ok(&["export", &file, "-o", out.to_str().unwrap()]);
    let r = report(&file);
    let read = |name: &str| {
        let f = fs::File::open(out.join(format!("{name}.parquet"))).unwrap();
        ParquetReader::new(f).finish().unwrap()
    };
    let events = read("events");
    let names: Vec<String> = events
        .get_column_names()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(names, EVENT_COLUMNS.map(String::from).to_vec());
    let schema = events.schema();
    assert_eq!(schema.get("allocated_after_bytes"), Some(&DataType::UInt64));
    assert_eq!(schema.get("time_us"), Some(&DataType::Int64));
    assert_eq!(schema.get("step"), Some(&DataType::String));
    assert_eq!(schema.get("micro_batch"), Some(&DataType::UInt64));
    assert_eq!(events.height() as u64, r["events"].as_u64().unwrap());
    let allocated = events
        .column("allocated_after_bytes")
        .unwrap()
        .u64()
        .unwrap()
        .clone();
    assert_eq!(allocated.max(), r["peak_allocated_bytes"].as_u64());
    let blocks = read("blocks");
    let sizes = blocks.column("size_bytes").unwrap().u64().unwrap().clone();
    assert_eq!(sizes.sum(), r["end_allocated_bytes"].as_u64());
    assert_eq!(read("steps").height(), r["steps"].as_array().unwrap().len());
    assert!(read("peak").height() > 5);

    let csv_dir = dir.path().join("csv");
    ok(&[
        "export",
        &file,
        "-o",
        csv_dir.to_str().unwrap(),
        "--format",
        "csv",
    ]);
    let text = fs::read_to_string(csv_dir.join("events.csv")).unwrap();
    assert_eq!(text.lines().next().unwrap(), EVENT_COLUMNS.join(","));
    assert_eq!(
        text.lines().count() as u64,
        r["events"].as_u64().unwrap() + 1
    );
}

#[test]
fn an_output_folder_that_cannot_be_made_exits_2() {
    let file = testdata(PIPELINE).to_string_lossy().into_owned();
    let dir = scratch();
    let missing = dir.path().join("no/such/tables");
    let o = memsnap(&[
        "export",
        &file,
        "-o",
        missing.to_str().unwrap(),
        "--format",
        "jsonl",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("parent folder does not exist"),
        "{}",
        stderr(&o)
    );
    let a_file = dir.path().join("f");
    fs::write(&a_file, "x").unwrap();
    let o = memsnap(&["export", &file, "-o", a_file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a file"), "{}", stderr(&o));
}

/// On every shared snapshot, every device's exported events and blocks give the report's peak,
/// end and live-at-end figures.
#[test]
fn every_shared_snapshot_exports_its_report_figures() {
    let Some(shared_dir) = shared() else { return };
    let dir = scratch();
    for (n, file) in snapshots_under(&shared_dir).into_iter().enumerate() {
        let name = file.to_string_lossy().into_owned();
        let out = dir.path().join(format!("t{n}"));
        ok(&[
            "export",
            &name,
            "-o",
            out.to_str().unwrap(),
            "--format",
            "jsonl",
        ]);
        let all = report_json(&name, &[]);
        // Only the columns checked, typed: the largest file has 325,071 events.
        #[derive(serde::Deserialize)]
        struct Row {
            device: u64,
            allocated_after_bytes: u64,
        }
        let text = fs::read_to_string(out.join("events.jsonl")).unwrap();
        let events: Vec<Row> = serde_json::Deserializer::from_str(&text)
            .into_iter::<Row>()
            .map(|r| r.unwrap())
            .collect();
        let blocks = jsonl(&out.join("blocks.jsonl"));
        for d in all["devices"].as_array().unwrap() {
            let device = &d["device"];
            let number = device.as_u64().unwrap();
            let mine: Vec<&Row> = events.iter().filter(|e| e.device == number).collect();
            assert_eq!(mine.len() as u64, d["events"].as_u64().unwrap(), "{name}");
            let Some(last) = mine.last() else { continue };
            let peak = mine
                .iter()
                .map(|e| e.allocated_after_bytes)
                .max()
                .unwrap()
                .max(d["start_allocated_bytes"].as_u64().unwrap());
            assert_eq!(peak, d["peak_allocated_bytes"].as_u64().unwrap(), "{name}");
            assert_eq!(
                last.allocated_after_bytes,
                d["end_allocated_bytes"].as_u64().unwrap(),
                "{name}"
            );
            let live: u64 = blocks
                .iter()
                .filter(|b| &b["device"] == device)
                .map(|b| b["size_bytes"].as_u64().unwrap())
                .sum();
            assert_eq!(live, d["end_allocated_bytes"].as_u64().unwrap(), "{name}");
        }
    }
}

/// Checks one event against the Trace Event Format's rules (the JSON object format, as its
/// specification writes them): a phase, integer process and thread ids, a time in
/// microseconds, a duration for complete events, numeric arguments for counters, a scope for
/// instants, and the names metadata events take.
fn follows_the_trace_event_format(e: &serde_json::Value) {
    let ph = e["ph"].as_str().expect("ph");
    assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
    assert!(e["name"].is_string(), "{e}");
    match ph {
        "M" => {
            let name = e["name"].as_str().unwrap();
            assert!(
                ["process_name", "thread_name", "process_sort_index"].contains(&name),
                "{e}"
            );
            assert!(e["args"].is_object(), "{e}");
        }
        "C" => {
            assert!(e["ts"].is_number(), "{e}");
            let args = e["args"].as_object().expect("counter args");
            assert!(
                !args.is_empty() && args.values().all(|v| v.is_number()),
                "{e}"
            );
        }
        "X" => {
            assert!(e["ts"].is_number(), "{e}");
            assert!(e["dur"].as_i64().is_some_and(|d| d > 0), "{e}");
        }
        "i" => {
            assert!(e["ts"].is_number(), "{e}");
            assert!(
                ["g", "p", "t"].contains(&e["s"].as_str().unwrap_or("")),
                "{e}"
            );
        }
        other => panic!("unexpected phase {other}: {e}"),
    }
}

#[test]
fn a_chrome_trace_of_two_ranks_reads_back_with_the_reports_peaks() {
    let files = [
        "snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz",
        "snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz",
    ];
    let dir = scratch();
    let out = dir.path().join("memory.trace.json");
    let paths: Vec<String> = files
        .iter()
        .map(|f| testdata(f).display().to_string())
        .collect();
    let o = out.display().to_string();
    let said = ok(&[
        "export",
        &paths[0],
        &paths[1],
        "--format",
        "chrome-trace",
        "-o",
        &o,
    ]);
    assert!(said.contains("2 processes"), "{said}");
    let doc: serde_json::Value = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    events.iter().for_each(follows_the_trace_event_format);
    for (rank, path) in paths.iter().enumerate() {
        let truth = report_json(path, &[]);
        let d = &truth["devices"][0];
        let mine = |name: &'static str| {
            events
                .iter()
                .filter(move |e| e["pid"] == rank as u64 && e["ph"] == "C" && e["name"] == name)
        };
        // counters in time order; the highest allocated is the report's peak, with its
        // reserved bytes, and the categories there add up to it
        let ts: Vec<i64> = mine("memory").map(|e| e["ts"].as_i64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "rank {rank}");
        let peak = mine("memory")
            .max_by_key(|e| e["args"]["allocated"].as_u64().unwrap())
            .unwrap();
        assert_eq!(peak["args"]["allocated"], d["peak_allocated_bytes"]);
        assert_eq!(peak["args"]["reserved"], d["reserved_at_peak_bytes"]);
        let at_peak = mine("allocated by category")
            .find(|e| e["ts"] == peak["ts"])
            .unwrap();
        let sum: u64 = at_peak["args"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(
            sum,
            d["peak_allocated_bytes"].as_u64().unwrap(),
            "rank {rank}"
        );
        let name = events
            .iter()
            .find(|e| e["pid"] == rank as u64 && e["name"] == "process_name")
            .unwrap();
        assert_eq!(
            name["args"]["name"],
            format!("rank {rank} · device {}", d["device"])
        );
        // the pipeline's steps are slices, as the report's step table has them
        let steps: Vec<&str> = events
            .iter()
            .filter(|e| e["pid"] == rank as u64 && e["ph"] == "X")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        let table: Vec<&str> = d["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["quiet"] != true)
            .map(|s| s["label"].as_str().unwrap())
            .collect();
        assert_eq!(steps, table, "rank {rank}");
        assert!(!steps.is_empty());
    }
}

#[test]
fn an_out_of_memory_error_is_an_instant_of_the_trace() {
    let f = testdata("snapshots/pipelines/pp2oom/memory_snapshot_rank0_pp2oom.pickle.xz");
    let f = f.display().to_string();
    let dir = scratch();
    let out = dir.path().join("t.json").display().to_string();
    ok(&["export", &f, "--format", "chrome-trace", "-o", &out]);
    let doc: serde_json::Value = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
    let ooms: Vec<&serde_json::Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i")
        .collect();
    // the train.log's "Tried to allocate 1000.00 MiB"
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0]["args"]["requested"], 1000 * 1024 * 1024);
    // tables take one file at a time
    let o = memsnap(&["export", &f, &f, "-o", dir.path().to_str().unwrap()]);
    one_line_failure(&o, 2, "one file at a time");
}

//! `memsnap view`: pages opened in headless Chromium (driven by `tests/browser/check.mjs`
//! through playwright-core), whose figures must equal `report --json` and `flamegraph
//! --folded`, with no console error and no network request.
//!
//! They need Node.js, `npm ci --prefix tests/browser` and Chromium (`/usr/bin/chromium`, or
//! `MEMSNAP_CHROMIUM`). Without them a test skips with a message; with `CI=true` it fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::util::*;

/// `node` and the check script when the browser tests can run here.
fn browser() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let chromium =
        std::env::var("MEMSNAP_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_string());
    let node = Command::new("node").arg("--version").output();
    let missing = if node.map_or(true, |o| !o.status.success()) {
        Some("node".to_string())
    } else if !dir.join("node_modules/playwright-core").is_dir() {
        Some("tests/browser/node_modules (npm ci --prefix tests/browser)".to_string())
    } else if !Path::new(&chromium).exists() {
        Some(chromium)
    } else {
        None
    };
    match missing {
        None => Some(dir.join("check.mjs")),
        Some(what) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but {what} is missing: the browser tests cannot run")
        }
        Some(what) => {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "skipping the browser tests: {what} not found (CI=true makes this a failure)"
            );
            None
        }
    }
}

/// One page to check.
struct Job {
    page: PathBuf,
    out: Option<PathBuf>,
    interact: bool,
    ranks: bool,
}

/// Runs the check script over `jobs` in one browser; one result per job.
fn check(script: &Path, dir: &Path, jobs: &[Job]) -> Vec<Value> {
    let list: Vec<Value> = jobs
        .iter()
        .map(|j| {
            serde_json::json!({
                "page": j.page, "out": j.out, "interact": j.interact, "ranks": j.ranks
            })
        })
        .collect();
    let file = dir.join("jobs.json");
    std::fs::write(&file, serde_json::to_vec(&list).unwrap()).unwrap();
    let out = Command::new("node")
        .arg(script)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check.mjs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results.len(), jobs.len());
    results
}

/// Writes the page of `files` to `page`.
fn view(files: &[&str], page: &Path) {
    let mut args = vec!["view", "--quiet", "-o", page.to_str().unwrap()];
    args.extend(files);
    ok(&args);
    assert!(page.is_file(), "{}", page.display());
}

/// Loaded cleanly: no console message, no uncaught error, no request.
fn clean(r: &Value) {
    let what = &r["page"];
    for key in ["consoleErrors", "pageErrors", "requests"] {
        assert_eq!(r[key], serde_json::json!([]), "{what}: {key}");
    }
}

/// The non-empty groups of a breakdown shown in the page, by label.
fn shown_groups(rows: &Value) -> BTreeMap<String, u64> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
        .filter(|(_, b)| *b > 0)
        .collect()
}

/// The non-empty shares of a report's breakdown, by label.
/// The whole step of a `--by step` group, as the page groups whole steps: `step 4` of
/// `step 4 · F0&B1 mb 3/1`, `train step 1 · forward` of `train step 1 · forward mb 2`.
fn whole_step(key: &str) -> String {
    let keep = if key.starts_with("train step ") { 2 } else { 1 };
    let step = key.split(" · ").take(keep).collect::<Vec<_>>().join(" · ");
    match step.find(" mb ") {
        Some(at) => step[..at].to_string(),
        None => step,
    }
}

fn report_groups(shares: &Value) -> BTreeMap<String, u64> {
    shares
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap().to_string(),
                s["bytes"].as_u64().unwrap(),
            )
        })
        .filter(|(_, b)| *b > 0)
        .collect()
}

/// The figures on the page's cards, its step table and its peak's breakdown equal the
/// report's, for the first device.
fn same_figures(r: &Value, report: &Value) {
    let what = r["page"].as_str().unwrap();
    let d = &report["devices"][0];
    let shown = &r["shown"];
    for (card, key) in [
        ("peakAllocated", "peak_allocated_bytes"),
        ("peakReserved", "peak_reserved_bytes"),
        ("startAllocated", "start_allocated_bytes"),
        ("endAllocated", "end_allocated_bytes"),
        ("fragmentation", "fragmentation_at_peak_bytes"),
    ] {
        assert_eq!(shown[card], d[key], "{what}: {card}");
    }
    let steps: Vec<Value> = d["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            serde_json::json!({
                "first": s["first_event"], "last": s["last_event"],
                "end": s["end_allocated_bytes"], "peak": s["peak_allocated_bytes"]
            })
        })
        .collect();
    assert_eq!(
        shown["steps"],
        Value::Array(steps),
        "{what}: the step table"
    );
    if d["peak_event_index"].is_null() {
        assert!(
            r["peakMoment"].is_null(),
            "{what}: no peak inside the trace"
        );
        return;
    }
    let m = &r["peakMoment"];
    assert_eq!(
        m["event"], d["peak_event_index"],
        "{what}: the peak's event"
    );
    assert_eq!(
        m["allocated"], d["peak_allocated_bytes"],
        "{what}: the peak"
    );
    // a band of smaller groups only folds when a grouping has more than ten; by step, a
    // trace of more steps and micro-batches than bands shows whole steps: the report's groups
    // added up by step
    for dim in ["category", "step", "phase"] {
        let page = shown_groups(&m["by"][dim]);
        let mut report = report_groups(&d["peak_breakdown"][dim]);
        if dim == "step" && !page.keys().any(|k| k.contains(" mb ")) {
            let mut whole = BTreeMap::new();
            for (k, b) in report {
                *whole.entry(whole_step(&k)).or_insert(0) += b;
            }
            report = whole;
        }
        if !page.keys().any(|k| k.ends_with(" more")) {
            assert_eq!(page, report, "{what}: by {dim} at the peak");
        }
    }
    assert!(
        m["flame"].as_u64().unwrap() > 0,
        "{what}: the peak's stacks"
    );
}

/// Every snapshot of the repository and of `../shared/snapshots` gets a page that loads in
/// Chromium with no error and no request, and shows the report's figures.
#[test]
fn every_snapshot_page_shows_the_reports_figures() {
    let Some(script) = browser() else { return };
    let mut files = snapshots_under(&testdata("snapshots"));
    if let Some(dir) = shared() {
        files.extend(snapshots_under(&dir));
    }
    let dir = scratch();
    let mut jobs = Vec::new();
    let mut reports = Vec::new();
    for (k, f) in files.iter().enumerate() {
        let f = f.to_str().unwrap();
        let out = memsnap(&["report", "--json", f]);
        if !out.status.success() {
            // a damaged fixture: view refuses it with the same one line
            let page = dir.path().join(format!("{k}.html"));
            let v = memsnap(&["view", "-q", f, "-o", page.to_str().unwrap()]);
            assert_eq!(v.status.code(), out.status.code(), "{f}");
            assert!(
                !page.exists(),
                "{f}: no page for a file that cannot be read"
            );
            continue;
        }
        let page = dir.path().join(format!("{k}.html"));
        view(&[f], &page);
        let size = std::fs::metadata(&page).unwrap().len();
        assert!(size < 3 << 20, "{f}: a page of {size} bytes");
        reports.push(serde_json::from_slice::<Value>(&out.stdout).unwrap());
        jobs.push(Job {
            page,
            out: None,
            interact: false,
            ranks: false,
        });
    }
    assert!(jobs.len() >= 60, "{} pages", jobs.len());
    let results = check(&script, dir.path(), &jobs);
    for (r, report) in results.iter().zip(&reports) {
        clean(r);
        same_figures(r, report);
        let oom = !report["devices"][0]["ooms"].as_array().unwrap().is_empty();
        let text = r["shown"]["oomText"].as_str();
        assert_eq!(text.is_some(), oom, "{}: the OOM section", r["page"]);
        if let Some(t) = text {
            assert!(t.contains("OUT OF MEMORY"), "{t}");
        }
    }
}

/// Sums folded stacks by their first frame (the category, with `--root category`).
fn folded_by_root(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let (stack, bytes) = line.rsplit_once(' ').unwrap();
        let root = stack.split(';').next().unwrap().to_string();
        *out.entry(root).or_insert(0) += bytes.parse::<u64>().unwrap();
    }
    out.retain(|_, b| *b > 0);
    out
}

/// A PNG that shows something: more than a few colours.
fn drawn(png_path: &Path) {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png_path).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    let mut colours = std::collections::HashSet::new();
    for p in buf[..info.buffer_size()].chunks(px).step_by(7) {
        colours.insert(p.to_vec());
    }
    assert!(
        colours.len() > 40,
        "{}: {} colours",
        png_path.display(),
        colours.len()
    );
}

/// Clicking, zooming, dragging and the step table work, and what the page says was live at a
/// clicked moment is what `flamegraph --folded` says of the same event.
#[test]
fn a_clicked_moment_matches_memsnap_and_zoom_works() {
    let Some(script) = browser() else { return };
    let files = [
        "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
        "snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz",
        "snapshots/programs/memory_snapshot_lightning_auto.pickle.xz",
        "snapshots/programs/memory_snapshot_oom_survived.pickle.xz",
    ];
    let dir = scratch();
    let mut jobs = Vec::new();
    for (k, f) in files.iter().enumerate() {
        let page = dir.path().join(format!("{k}.html"));
        view(&[testdata(f).to_str().unwrap()], &page);
        let out = dir.path().join(format!("shots{k}"));
        std::fs::create_dir_all(&out).unwrap();
        jobs.push(Job {
            page,
            out: Some(out),
            interact: true,
            ranks: false,
        });
    }
    let results = check(&script, dir.path(), &jobs);
    for ((r, f), job) in results.iter().zip(files).zip(&jobs) {
        clean(r);
        let f = testdata(f).to_string_lossy().into_owned();
        let report = report_json(&f, &[]);
        same_figures(r, &report);
        // a click on the chart: the breakdown of that event, as flamegraph folds it
        let m = &r["clickedMoment"];
        let event = m["event"].as_u64().unwrap();
        let folded = ok(&[
            "flamegraph",
            &f,
            "--folded",
            "--root",
            "category",
            "--at",
            &format!("#{event}"),
        ]);
        assert_eq!(
            shown_groups(&m["by"]["category"]),
            folded_by_root(&folded),
            "{f}: by category at #{event}"
        );
        let total: u64 = folded_by_root(&folded).values().sum();
        assert_eq!(m["allocated"].as_u64().unwrap(), total, "{f}");
        // the wheel and the keys zoom in; a drag over a tenth of the chart shows that tenth
        let span = |v: &Value| v[1].as_f64().unwrap() - v[0].as_f64().unwrap();
        assert!(
            span(&r["zoom"]["after"]) < span(&r["zoom"]["before"]) / 4.0,
            "{f}"
        );
        let tenth = span(&r["dragged"]) / span(&r["zoom"]["before"]);
        assert!((0.08..0.12).contains(&tenth), "{f}: {tenth}");
        // a step row zooms to its step and shows its peak
        let row = r["stepZoom"]["row"].as_u64().unwrap() as usize;
        let step = &report["devices"][0]["steps"][row];
        assert_eq!(
            r["stepZoom"]["moment"]["event"], step["peak_event_index"],
            "{f}"
        );
        assert_eq!(
            r["stepZoom"]["moment"]["allocated"], step["peak_allocated_bytes"],
            "{f}"
        );
        assert!(r["legends"].as_u64().unwrap() >= 2, "{f}");
        // every frame drawn within 50 ms; nothing wider than a phone
        assert!(
            r["maxDrawMs"].as_f64().unwrap() < 50.0,
            "{f}: {}",
            r["maxDrawMs"]
        );
        assert!(r["phone"]["scrollWidth"].as_u64().unwrap() <= 390, "{f}");
        for shot in ["desktop.png", "desktop-peak.png", "phone-dark.png"] {
            drawn(&job.out.as_ref().unwrap().join(shot));
        }
    }
    // the OOM page explains the failure as memsnap oom does
    let oom_page = &results[3]["shown"]["oomText"];
    let oom = ok(&["oom", testdata(files[3]).to_str().unwrap(), "--top", "6"]);
    let first = oom_page.as_str().unwrap().lines().next().unwrap().trim();
    assert!(oom.contains(first), "{first}");
}

/// Two ranks and 64: one panel each on one time axis, the comparison, and each rank's figures.
#[test]
fn two_and_sixty_four_ranks() {
    let Some(script) = browser() else { return };
    let dir = scratch();
    let two = [
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz"),
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz"),
    ];
    let two: Vec<String> = two
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let page2 = dir.path().join("two.html");
    view(&[&two[0], &two[1]], &page2);
    // 64 ranks: the real ranks of four pipeline recordings, named as ranks 0 to 63
    let mut sources = Vec::new();
    for run in ["pp8n16", "pp4n12", "pp4n8"] {
        sources.extend(snapshots_under(&testdata(&format!(
            "snapshots/pipelines/{run}"
        ))));
    }
    let ranks = dir.path().join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    let mut expected = Vec::new();
    for k in 0..64 {
        let source = &sources[k % sources.len()];
        let to = ranks.join(format!("memory_snapshot_rank{k}_step0.pickle.xz"));
        std::fs::copy(source, &to).unwrap();
        expected.push(source.clone());
    }
    let page64 = dir.path().join("ranks.html");
    view(&[ranks.to_str().unwrap()], &page64);
    let size = std::fs::metadata(&page64).unwrap().len();
    assert!(size < 10 << 20, "64 ranks in {size} bytes");
    let jobs = [
        Job {
            page: page2,
            out: None,
            interact: true,
            ranks: true,
        },
        Job {
            page: page64,
            out: None,
            interact: true,
            ranks: true,
        },
    ];
    let results = check(&script, dir.path(), &jobs);
    for r in &results {
        clean(r);
    }
    let peaks = |files: &[String]| -> Vec<Value> {
        files
            .iter()
            .map(|f| report_json(f, &[])["devices"][0]["peak_allocated_bytes"].clone())
            .collect()
    };
    let shown = |r: &Value| -> Vec<Value> {
        r["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["peakAllocated"].clone())
            .collect()
    };
    assert_eq!(results[0]["panels"], 2);
    assert_eq!(shown(&results[0]), peaks(&two));
    assert!(results[0]["shown"]["compareText"]
        .as_str()
        .unwrap()
        .contains("peak allocated"));
    assert_eq!(results[1]["panels"], 64);
    let sources: Vec<String> = expected
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    assert_eq!(shown(&results[1]), peaks(&sources));
    // the panels are in rank order, each labelled by its rank, not by the end of its name
    for (k, x) in results[1]["ranks"].as_array().unwrap().iter().enumerate() {
        let file = x["file"].as_str().unwrap();
        assert!(file.contains(&format!("rank{k}_")), "{k}: {file}");
    }
    for r in &results {
        let labels = r["thumbnails"].as_array().expect("thumbnails");
        let want: Vec<String> = (0..labels.len()).map(|k| format!("rank {k}")).collect();
        assert_eq!(labels, &want);
    }
}

/// Names from a hostile snapshot reach the page as text: no markup, no script, no request.
#[test]
fn hostile_names_stay_text() {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let Some(script) = browser() else { return };
    let dir = scratch();
    let evil = "</script><img src=http://127.0.0.1:9/x onerror=alert(1)>{{data}}";
    let frame = |name: &str| {
        let mut f = BTreeMap::new();
        f.insert(
            H::String("filename".into()),
            V::String(format!("/{name}.py")),
        );
        f.insert(H::String("line".into()), V::I64(3));
        f.insert(H::String("name".into()), V::String(name.into()));
        V::Dict(f)
    };
    let mut trace = Vec::new();
    for k in 0..4i64 {
        let mut e = trace_entry("alloc", 0x1000 + k * 0x100000, 1 << 20, 10 + k);
        if let V::Dict(d) = &mut e {
            d.insert(H::String("frames".into()), V::List(vec![frame(evil)]));
        }
        trace.push(e);
    }
    let bytes = snapshot_pickle(Vec::new(), trace);
    let file = write(&dir, "evil<script>.pickle", &bytes);
    let page = dir.path().join("evil.html");
    view(&[&file], &page);
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("</script>").count(), 2, "the page's own two");
    let results = check(
        &script,
        dir.path(),
        &[Job {
            page,
            out: None,
            interact: false,
            ranks: false,
        }],
    );
    clean(&results[0]);
    assert!(results[0]["shown"]["file"]
        .as_str()
        .unwrap()
        .contains("evil<script>.pickle"));
}

/// A snapshot of `allocations` allocations, each from its own line of a function called
/// `name`: the name is written once and shared through the memo, as Python's pickler shares
/// one string object.
fn one_name_from_many_lines(name: &str, allocations: i64) -> Vec<u8> {
    use crate::util::raw::*;
    let base = 1i64 << 40;
    let t = 1_700_000_000_000_000i64;
    let mut entries = vec![dict(&[
        ("action", text("segment_alloc")),
        ("addr", int(base)),
        ("size", int(1 << 30)),
        ("stream", int(0)),
        ("time_us", int(t)),
        ("frames", list([])),
    ])];
    for k in 0..allocations {
        let mut name_bytes = if k == 0 {
            [text(name), put(0)].concat()
        } else {
            get(0)
        };
        let frame = dict(&[
            ("filename", text("/x/model.py")),
            ("line", int(k + 1)),
            ("name", std::mem::take(&mut name_bytes)),
        ]);
        let caller = dict(&[
            ("filename", text("/x/train.py")),
            ("line", int(100 + k)),
            ("name", text("main")),
        ]);
        entries.push(dict(&[
            ("action", text("alloc")),
            ("addr", int(base + (k << 20))),
            ("size", int(1 << 20)),
            ("stream", int(0)),
            ("time_us", int(t + k + 1)),
            ("frames", list([frame, caller])),
        ]));
    }
    let mut p = START.to_vec();
    p.extend(dict(&[
        ("segments", list([])),
        ("device_traces", list([list(entries)])),
    ]));
    p.push(b'.');
    p
}

/// The page's data element, parsed.
fn page_data(html: &str) -> Value {
    let (_, rest) = html
        .split_once("id=\"memsnap-data\">")
        .expect("the data element");
    let (json, _) = rest.split_once("</script>").expect("its end");
    serde_json::from_str(json).expect("the data is JSON")
}

/// Names of any length keep the page within a few megabytes: each string once in its table,
/// a long name shortened with its length said, a deep stack cut with its frames counted.
/// (Before: a 10 MB name gave a 110 MB page, a 256 KiB name from 64 lines 64 MB.)
#[test]
fn hostile_names_and_stacks_keep_the_page_small() {
    let dir = scratch();
    let huge = "f".repeat(10_485_760);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "huge_name",
            shared_stack_pickle(
                &[
                    (huge.clone(), "/x/model.py".into(), 1),
                    ("main".into(), "/x/train.py".into(), 2),
                ],
                2,
                64,
            ),
        ),
        (
            "long_name_many_lines",
            one_name_from_many_lines(&"g".repeat(256 << 10), 64),
        ),
        (
            "deep_stack",
            shared_stack_pickle(
                &(0..1000)
                    .map(|k| (format!("f{k}"), "/x/deep.py".to_string(), k))
                    .collect::<Vec<_>>(),
                1_000_000,
                64,
            ),
        ),
    ];
    let mut pages = Vec::new();
    for (what, bytes) in cases {
        let file = write(&dir, &format!("{what}.pickle"), &bytes);
        let page = dir.path().join(format!("{what}.html"));
        view(&[&file], &page);
        pages.push(page.clone());
        let html = std::fs::read_to_string(&page).unwrap();
        eprintln!(
            "{what}: {} byte snapshot, {} byte page",
            bytes.len(),
            html.len()
        );
        assert!(
            html.len() <= 4 << 20,
            "{what}: a page of {} bytes",
            html.len()
        );
        let data = page_data(&html);
        let strings: Vec<&str> = data["strings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let distinct: std::collections::BTreeSet<&&str> = strings.iter().collect();
        assert_eq!(distinct.len(), strings.len(), "{what}: each string once");
        match what {
            "huge_name" => assert!(
                strings.iter().any(|s| s.contains("… (10,485,7")),
                "{what}: the name's length is said"
            ),
            "long_name_many_lines" => {
                // the 64 lines stay apart: each site keeps its end
                let sites = strings.iter().filter(|s| s.contains("… (262,1")).count();
                assert!(sites >= 64, "{what}: {sites} shortened names");
            }
            _ => {
                let stacks = data["panels"][0]["stacks"].as_array().unwrap();
                assert!(
                    stacks.iter().any(|s| s["cut"].as_u64() > Some(900_000)),
                    "{what}: the frames left out are counted"
                );
            }
        }
    }
    // each page opens, draws and shows its figures in a browser, without an error
    if let Some(script) = browser() {
        let jobs: Vec<Job> = pages
            .into_iter()
            .map(|page| Job {
                page,
                out: None,
                interact: true,
                ranks: false,
            })
            .collect();
        for r in check(&script, dir.path(), &jobs) {
            clean(&r);
            assert!(r["shown"]["peakAllocated"].as_u64() > Some(0), "{r}");
        }
    }
}

/// A file name or title holding the template's slots is shown as it is, and the page keeps
/// its data (before, `{{data}}` in a title put the data in the title and nothing drew).
#[test]
fn slots_in_names_and_titles_stay_text() {
    let dir = scratch();
    let bytes = snapshot_pickle(
        Vec::new(),
        (0..4)
            .map(|k| trace_entry("alloc", 0x1000 + k * 0x100000, 1 << 20, 10 + k))
            .collect(),
    );
    let file = write(&dir, "x{{data}}{{script}}.pickle", &bytes);
    let page = dir.path().join("page.html");
    let title = "t{{data}}{{style}}{{title}}";
    ok(&[
        "view",
        "--quiet",
        "-o",
        page.to_str().unwrap(),
        "--title",
        title,
        &file,
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains(&format!("<title>{title}</title>")),
        "the title as given"
    );
    let data = page_data(&html);
    assert_eq!(
        data["panels"].as_array().unwrap().len(),
        1,
        "the data is in its place"
    );
    let strings = data["strings"].as_array().unwrap();
    assert!(strings
        .iter()
        .any(|s| s.as_str().unwrap().ends_with("x{{data}}{{script}}.pickle")));
    assert_eq!(
        html.matches("<script>").count(),
        1,
        "one script, the page's own"
    );
    if let Some(script) = browser() {
        let results = check(
            &script,
            dir.path(),
            &[Job {
                page,
                out: None,
                interact: false,
                ranks: false,
            }],
        );
        clean(&results[0]);
    }
}

/// Runs a page script (`fleet.mjs`, `diff.mjs`) on `page`: what it saw, after checking that
/// the page made no console error, no page error and no request.
fn open_page(script: &Path, page: &Path) -> Value {
    let out = Command::new("node").arg(script).arg(page).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["consoleErrors", "pageErrors", "requests"] {
        assert_eq!(r[key], serde_json::json!([]), "{key}: {r}");
    }
    r
}

/// A fleet page of 4,096 ranks, from summaries: one real rank's `report --json` copied with
/// its peak varied (rank 1234 far above the rest), as a job of that size leaves them. Loads
/// without error or request, within 5 MB and 1 s of painting, the outlier first.
#[test]
fn a_fleet_page_of_thousands_of_ranks_puts_the_outlier_first() {
    let Some(script) = browser() else { return };
    let script = script.with_file_name("fleet.mjs");
    let dir = scratch();
    let snapshot =
        testdata("snapshots/pipelines/pp4n8/memory_snapshot_rank0_pp4n8_step0.pickle.xz");
    let one: Value = report_json(&snapshot, &[]);
    let base = one["devices"][0]["peak_allocated_bytes"].as_u64().unwrap();
    let mut lines = String::new();
    for rank in 0..4096u64 {
        let mut r = one.clone();
        r["file"] = Value::from(format!(
            "/scratch/job/memory_snapshot_rank{rank}_step0.pickle"
        ));
        let peak = if rank == 1234 {
            base * 3
        } else {
            base + (rank * 7919 % 1000) * 4096
        };
        r["devices"][0]["peak_allocated_bytes"] = Value::from(peak);
        lines.push_str(&serde_json::to_string(&r).unwrap());
        lines.push('\n');
    }
    let summaries = dir.path().join("summaries.jsonl");
    std::fs::write(&summaries, lines).unwrap();
    let page = dir.path().join("fleet.html");
    let o = memsnap(&[
        "view",
        summaries.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let size = std::fs::metadata(&page).unwrap().len();
    assert!(size < 5_000_000, "{size} bytes");
    let r = open_page(&script, &page);
    assert_eq!(r["rows"], 4096);
    assert!(r["paintMs"].as_f64().unwrap() < 1000.0, "{r}");
    assert_eq!(r["first"][0]["rank"], 1234, "the outlier first: {r}");
    assert_eq!(r["first"][0]["bytes"], base * 3);
    assert_eq!(r["strips"], 4);
    // sorted by rank on a click; a click on a rank names its summary
    assert_eq!(r["byRank"][0]["rank"], 0, "{r}");
    assert!(
        r["detail"].as_str().unwrap().starts_with("rank 0: peak"),
        "{r}"
    );
}

/// Summaries written beside their snapshots: the fleet page names each rank's own page.
#[test]
fn a_fleet_page_names_each_ranks_own_page() {
    let dir = scratch();
    let src = testdata("snapshots/pipelines/pp4n8");
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".pickle.xz") {
            continue;
        }
        let copy = dir.path().join(&name);
        std::fs::copy(&p, &copy).unwrap();
        let summary = dir.path().join(format!(
            "{}.summary.json",
            name.strip_suffix(".xz").unwrap()
        ));
        std::fs::write(&summary, ok(&["report", "--json", copy.to_str().unwrap()])).unwrap();
    }
    let summaries: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .filter(|p| p.ends_with(".summary.json"))
        .collect();
    assert_eq!(summaries.len(), 4);
    let page = dir.path().join("fleet.html");
    let mut args = vec!["view", "-o", page.to_str().unwrap()];
    args.extend(summaries.iter().map(|s| s.as_str()));
    ok(&args);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("memory_snapshot_rank2_pp4n8_step0.pickle.xz\""),
        "the snapshot beside it"
    );
    let start = html.find(r#"id="data">"#).unwrap() + r#"id="data">"#.len();
    let end = start + html[start..].find("</script>").unwrap();
    let data: Value = serde_json::from_str(&html[start..end]).unwrap();
    assert_eq!(data["rows"].as_array().unwrap().len(), 4);
    // --outliers 1: the page of the rank farthest from the median peak, linked
    let page = dir.path().join("fleet2.html");
    let mut args = vec!["view", "--outliers", "1", "-o", page.to_str().unwrap()];
    args.extend(summaries.iter().map(|s| s.as_str()));
    ok(&args);
    let html = std::fs::read_to_string(&page).unwrap();
    let start = html.find(r#"id="data">"#).unwrap() + r#"id="data">"#.len();
    let end = start + html[start..].find("</script>").unwrap();
    let data: Value = serde_json::from_str(&html[start..end]).unwrap();
    let rows = data["rows"].as_array().unwrap();
    let linked: Vec<&Value> = rows.iter().filter(|r| r[9].is_string()).collect();
    assert_eq!(linked.len(), 1, "{rows:?}");
    let peaks: Vec<i64> = rows.iter().map(|r| r[4].as_i64().unwrap()).collect();
    let mut sorted = peaks.clone();
    sorted.sort();
    let median = sorted[(sorted.len() - 1) / 2];
    let farthest = peaks.iter().map(|p| (p - median).abs()).max().unwrap();
    assert_eq!((linked[0][4].as_i64().unwrap() - median).abs(), farthest);
    let own = dir.path().join(linked[0][9].as_str().unwrap());
    let own_html = std::fs::read_to_string(&own).expect("the outlier's own page");
    assert!(own_html.contains("memsnap"), "{}", own.display());
}

/// The diff page of checkpointing switched off (transformers Llama): both curves peak where
/// `diff --json` says, the causes are listed in its order, and a click on the first (the
/// activations now kept until backward) shades its blocks, within what the cause holds.
#[test]
fn a_diff_page_draws_both_runs_and_the_picked_cause() {
    let Some(script) = browser() else { return };
    let script = script.with_file_name("diff.mjs");
    let dir = scratch();
    let t = "snapshots/transformers";
    let base = testdata(&format!("{t}/memory_snapshot_llama_ckpt_rank0.pickle.xz"));
    let new = testdata(&format!("{t}/memory_snapshot_llama_rank0.pickle.xz"));
    let (base, new) = (base.to_str().unwrap(), new.to_str().unwrap());
    let page = dir.path().join("diff.html");
    let o = memsnap(&["diff", base, new, "--html", page.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d = json(&["diff", base, new]);
    let size = std::fs::metadata(&page).unwrap().len();
    assert!(size < 1_000_000, "{size} bytes");
    let r = open_page(&script, &page);
    assert!(r["paintMs"].as_f64().unwrap() < 1000.0, "{r}");
    assert_eq!(r["peaks"][0], d["base"]["peak_allocated_bytes"], "{r}");
    assert_eq!(r["peaks"][1], d["new"]["peak_allocated_bytes"], "{r}");
    let causes = d["causes"].as_array().unwrap();
    assert_eq!(
        r["causes"].as_u64().unwrap() as usize,
        causes.len().min(200)
    );
    for (k, effect) in r["rows"].as_array().unwrap().iter().enumerate() {
        assert_eq!(effect, &causes[k]["peak_effect_bytes"], "row {k}: {r}");
    }
    let first = &causes[0];
    assert_eq!(first["kind"], "life", "{first}");
    let picked = &r["picked"];
    assert_eq!(picked["index"], 0, "{r}");
    assert_eq!(picked["row"], "0", "{r}");
    let held = picked["new"].as_u64().unwrap();
    assert!(
        held > 0 && held <= first["bytes_new"].as_u64().unwrap(),
        "{r}"
    );
    assert!(picked["base"].as_u64().unwrap() <= first["bytes_base"].as_u64().unwrap());
    assert!(
        picked["detail"]
            .as_str()
            .unwrap()
            .contains("now alive until backward"),
        "{r}"
    );
    assert_eq!(r["shaded"], true, "{r}");
    assert!(
        r["summary"]
            .as_str()
            .unwrap()
            .starts_with("changed: peak allocated +"),
        "{r}"
    );
}

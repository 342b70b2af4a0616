//! `memsnap compare`: two snapshots, or a folder of ranks.

use serde_json::Value;

use crate::util::*;

fn peak_of(file: &std::path::Path) -> u64 {
    let v = json(&["report", &file.to_string_lossy()]);
    v["devices"][0]["peak_allocated_bytes"].as_u64().unwrap()
}

#[test]
fn why_rank_0_peaks_higher_than_rank_1() {
    let Some(dir) = shared() else { return };
    let folder = dir.join("pp2-stacks-all");
    let v = json(&["compare", &folder.to_string_lossy()]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["rank"], 0);
    assert_eq!(rows[1]["rank"], 1);
    assert_eq!(v["highest"], 0);
    let why = &v["why"];
    let p0 = peak_of(&folder.join("memory_snapshot_rank0_step0.pickle.xz"));
    let p1 = peak_of(&folder.join("memory_snapshot_rank1_step0.pickle.xz"));
    assert_eq!(
        why["peak_allocated_diff_bytes"].as_i64().unwrap(),
        p0 as i64 - p1 as i64
    );
    // the differences by category add up to the difference of the peaks
    let sum: i64 = why["breakdown"]["category"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["diff_bytes"].as_i64().unwrap())
        .sum();
    assert_eq!(sum, p0 as i64 - p1 as i64);
    // rank 0 holds the loss and the embedding
    let stage = |label: &str| {
        why["breakdown"]["stage"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["label"] == label)
            .cloned()
            .unwrap_or_else(|| panic!("{label} missing"))
    };
    let loss = stage("loss");
    assert_eq!(loss["a_bytes"], 0, "rank 1 has no loss");
    assert!(loss["b_bytes"].as_u64().unwrap() > 1 << 29);
    assert!(stage("before the trace")["diff_bytes"].as_i64().unwrap() > 0);
    let sites = why["sites_more_in_b"].to_string();
    assert!(
        sites.contains("EmbeddingBackward0") && sites.contains("LogSoftmaxBackward0"),
        "{sites}"
    );

    let text = ok(&["compare", &folder.to_string_lossy()]);
    assert!(text.contains("◀ highest"), "{text}");
    assert!(
        text.contains("why rank 0 peaks 1.91 GiB above rank 1"),
        "{text}"
    );
    assert!(
        text.contains("rank 0 holds more of:") && text.contains("loss +0.98 GiB"),
        "{text}"
    );
}

#[test]
fn two_files_side_by_side() {
    let Some(dir) = shared() else { return };
    let a = dir.join("pp2-stacks-python/memory_snapshot_rank1_py_step0.pickle.xz");
    let b = dir.join("pp2-stacks-python/memory_snapshot_rank0_py_step0.pickle.xz");
    let v = json(&["compare", &a.to_string_lossy(), &b.to_string_lossy()]);
    assert_eq!(v["a"]["rank"], 1);
    assert_eq!(v["b"]["rank"], 0);
    let diff = peak_of(&b) as i64 - peak_of(&a) as i64;
    assert_eq!(v["peak_allocated_diff_bytes"].as_i64().unwrap(), diff);
    for dim in ["category", "step", "op", "stage", "phase"] {
        let sum: i64 = v["breakdown"][dim]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["diff_bytes"].as_i64().unwrap())
            .sum();
        assert_eq!(sum, diff, "by {dim}");
    }
    let steps = v["steps"].as_array().unwrap();
    let s4 = steps.iter().find(|s| s["label"] == "step 4").unwrap();
    assert!(s4["a_end_bytes"].is_u64() && s4["b_end_bytes"].is_u64());
    let s1 = steps.iter().find(|s| s["label"] == "step 1").unwrap();
    assert!(s1["a_end_bytes"].is_null(), "the last rank has no step 1");
    // any two snapshots compare, not only ranks: two recordings of one program
    let x = testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz");
    let y = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let text = ok(&["compare", &x.to_string_lossy(), &y.to_string_lossy()]);
    assert!(
        text.contains("peak allocated") && text.contains("at the peaks, by category"),
        "{text}"
    );
}

#[test]
fn a_folder_with_a_bad_file_reports_the_others() {
    let Some(dir) = shared() else { return };
    let tmp = scratch();
    let mut n = 0;
    for f in snapshots_under(&dir) {
        let name = f
            .strip_prefix(&dir)
            .unwrap()
            .to_string_lossy()
            .replace('/', "__");
        std::fs::copy(&f, tmp.path().join(name)).unwrap();
        n += 1;
    }
    std::fs::write(
        tmp.path().join("rank99_broken.pickle"),
        b"this is not a pickle",
    )
    .unwrap();
    let o = memsnap(&["compare", &tmp.path().to_string_lossy(), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let broken: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("rank99_broken.pickle"))
        .collect();
    assert_eq!(broken.len(), 1, "{err}");
    assert!(
        broken[0].starts_with("memsnap: ") && broken[0].contains("byte 0"),
        "{err}"
    );
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let failed: Vec<&Value> = rows.iter().filter(|r| !r["error"].is_null()).collect();
    // the broken file, and the snapshots that hold no trace events
    assert!(failed
        .iter()
        .any(|r| r["file"].as_str().unwrap().contains("rank99_broken")));
    let good = rows.iter().filter(|r| r["error"].is_null()).count();
    assert!(good >= n - 2, "{good} of {n}");
    assert_eq!(
        rows.iter().find(|r| r["rank"] == 99).unwrap()["rank_from_name"],
        true
    );
}

#[test]
fn parallel_and_sequential_loading_agree() {
    let files = [
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz"),
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz"),
        testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/fsdp/memory_snapshot_rank1_step1.pickle.xz"),
    ];
    let args: Vec<String> = files
        .iter()
        .map(|f| f.to_string_lossy().into_owned())
        .collect();
    let run = |threads: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_memsnap"))
            .arg("compare")
            .args(&args)
            .arg("--json")
            .env("RAYON_NUM_THREADS", threads)
            .output()
            .unwrap();
        assert!(o.status.success());
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(run("1"), run("4"));
}

#[test]
fn small_multiples_chart() {
    let out = scratch();
    let png = out.path().join("ranks.png");
    let files = [
        testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/fsdp/memory_snapshot_rank1_step1.pickle.xz"),
        testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"),
    ];
    let mut args = vec!["compare".to_string()];
    args.extend(files.iter().map(|f| f.to_string_lossy().into_owned()));
    args.extend(["--png".to_string(), png.to_string_lossy().into_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = ok(&args);
    assert!(text.contains("◀ highest"), "{text}");
    let file = std::io::BufReader::new(std::fs::File::open(&png).unwrap());
    let reader = png::Decoder::new(file).read_info().unwrap();
    assert_eq!((reader.info().width, reader.info().height), (1600, 900));
}

#[test]
fn usage_errors() {
    let one = testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz");
    let o = memsnap(&["compare", &one.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("give two files, or a folder"),
        "{}",
        stderr(&o)
    );
    let empty = scratch();
    let o = memsnap(&["compare", &empty.path().to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no snapshot files"), "{}", stderr(&o));
}

/// A recursive walk through link loops ends, lists each snapshot once however many links reach
/// it, skips a folder it cannot read with a note, and leaves out summaries met beside snapshots.
#[test]
fn recursive_walks_survive_loops_links_and_unreadable_folders() {
    use std::os::unix::fs::symlink;
    let dir = scratch();
    let root = dir.path().join("runs");
    let a = root.join("a");
    std::fs::create_dir_all(&a).unwrap();
    let snap = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    std::fs::copy(&snap, a.join("memory_snapshot_rank0_step1.pickle.xz")).unwrap();
    std::fs::copy(&snap, root.join("memory_snapshot_rank1_step1.pickle.xz")).unwrap();
    // Two loops (a link to the root below it, a link to itself) and a second path to a file.
    symlink(&root, a.join("up")).unwrap();
    symlink(".", a.join("here")).unwrap();
    symlink(
        a.join("memory_snapshot_rank0_step1.pickle.xz"),
        root.join("memory_snapshot_rank0_step1.again.pickle.xz"),
    )
    .unwrap();
    std::fs::write(root.join("summary.jsonl"), "{}\n").unwrap();
    let closed = root.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::copy(&snap, closed.join("memory_snapshot_rank2_step1.pickle.xz")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o000)).unwrap();
    let unreadable = std::fs::read_dir(&closed).is_err(); // not when running as root
    let o = memsnap(&["compare", "-r", &root.to_string_lossy(), "--json"]);
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let files: Vec<String> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["file"].as_str().unwrap().to_string())
        .collect();
    let expected = if unreadable { 2 } else { 3 };
    assert_eq!(files.len(), expected, "{files:?}");
    let err = stderr(&o);
    assert!(err.contains("left out 1 report summary"), "{err}");
    if unreadable {
        assert!(err.contains("closed: cannot read the folder"), "{err}");
    }
}

/// Links that lead out of the folder (to its parent, to `/`, links to each other) are not
/// followed: the walk ends at once and lists only the folder's own snapshots (before, a link to
/// `/` walked the whole disk for minutes and compared every snapshot on it).
#[test]
fn recursive_walks_stay_inside_the_folder() {
    use std::os::unix::fs::symlink;
    let dir = scratch();
    let root = dir.path().join("runs");
    let deep = root.join("a/b");
    std::fs::create_dir_all(&deep).unwrap();
    let snap = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    std::fs::copy(&snap, root.join("memory_snapshot_rank0_step1.pickle.xz")).unwrap();
    // beside the folder, not in it
    std::fs::copy(
        &snap,
        dir.path().join("memory_snapshot_rank7_step1.pickle.xz"),
    )
    .unwrap();
    symlink("..", root.join("up")).unwrap();
    symlink("/", root.join("everything")).unwrap();
    symlink("../../..", deep.join("out")).unwrap();
    symlink("../..", deep.join("back")).unwrap(); // the folder itself: read once
    symlink("b", root.join("a/c")).unwrap(); // inside: followed, read once
    symlink("two", root.join("one")).unwrap();
    symlink("one", root.join("two")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(["compare", "-r", &root.to_string_lossy(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed().as_secs() > 60 {
            child.kill().unwrap();
            panic!("compare -r did not end within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let files: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["file"].as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with("runs/memory_snapshot_rank0_step1.pickle.xz"));
    let err = stderr(&o);
    assert!(
        err.contains("left out 3 folder links leading outside it"),
        "{err}"
    );
}

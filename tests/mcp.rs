//! `memsnap mcp`, spoken to as a client would: newline-delimited JSON-RPC on the binary's
//! standard input and output (the Model Context Protocol over stdio).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::util::{report_json, testdata};

/// A running server (shared with its watchdog, which ends it if a test waits on it too long;
/// dropping `_watchdog` stands the watchdog down), the next request id, and answers read while
/// waiting for another one.
struct Client {
    child: Arc<Mutex<Child>>,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    id: u64,
    early: Vec<Value>,
    _watchdog: mpsc::Sender<()>,
}

/// How long one server may run before its watchdog kills it: a test waiting for an answer that
/// never comes then fails ("the server hung up") instead of holding up the whole run.
const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(300);

impl Client {
    /// Starts `memsnap mcp --root testdata` and does the handshake.
    fn start() -> Client {
        Client::start_with(&["--root".as_ref(), testdata("").as_os_str()])
    }

    /// Starts `memsnap mcp ARGS` and does the handshake.
    fn start_with(args: &[&std::ffi::OsStr]) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
            .arg("mcp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("memsnap mcp starts");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let child = Arc::new(Mutex::new(child));
        let (watchdog, stood_down) = mpsc::channel::<()>();
        let watched = child.clone();
        std::thread::spawn(move || {
            if stood_down.recv_timeout(WATCHDOG) == Err(RecvTimeoutError::Timeout) {
                // a child already waited for is not signalled again (its pid may be reused)
                if let Ok(mut c) = watched.lock() {
                    let _ = c.kill();
                }
            }
        });
        let mut c = Client {
            child,
            input,
            output,
            id: 0,
            early: Vec::new(),
            _watchdog: watchdog,
        };
        let init = c.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "memsnap-test", "version": "1"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "memsnap", "{init}");
        c.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        c
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.input, "{message}").unwrap();
        self.input.flush().unwrap();
    }

    /// Sends a request and returns its answer (skipping any notification).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.ask(method, params);
        self.answer(id)
    }

    /// Sends a request without waiting; returns its id.
    fn ask(&mut self, method: &str, params: Value) -> u64 {
        self.id += 1;
        let id = self.id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// The answer to request `id`; answers to other requests that come first are kept for their
    /// own turn (answers of concurrent calls come in any order).
    fn answer(&mut self, id: u64) -> Value {
        if let Some(i) = self.early.iter().position(|v| v["id"] == id) {
            return self.early.remove(i);
        }
        loop {
            let mut line = String::new();
            assert!(
                self.output.read_line(&mut line).unwrap() > 0,
                "the server hung up"
            );
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
            if v.get("id").is_some_and(|i| !i.is_null()) {
                self.early.push(v);
            }
        }
    }

    /// Calls a tool: `Ok(its JSON)` or `Err(the error message)`.
    fn call(&mut self, tool: &str, arguments: Value) -> Result<Value, String> {
        let v = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        tool_answer(&v)
    }
}

/// A tool call's answer: `Ok(its JSON)` or `Err(the error message)`.
fn tool_answer(v: &Value) -> Result<Value, String> {
    if let Some(e) = v.get("error") {
        return Err(e["message"].as_str().unwrap_or_default().to_string());
    }
    let r = &v["result"];
    let text = r["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if r["isError"] == true {
        return Err(text);
    }
    Ok(serde_json::from_str(&text).unwrap())
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn file(rel: &str) -> String {
    testdata(rel).display().to_string()
}

#[test]
fn every_tool_answers_with_the_commands_figures() {
    let mut c = Client::start();
    let tools = c.request("tools/list", json!({}));
    let mut names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "compare",
            "diff",
            "live_at",
            "oom",
            "report",
            "steps",
            "timeline",
            "top_sites",
            "whatif"
        ]
    );
    let single = file("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let truth = report_json(&single, &[]);
    let peak = truth["devices"][0]["peak_allocated_bytes"].clone();
    let report = c.call("report", json!({"path": single})).unwrap();
    assert_eq!(report["devices"][0]["peak_allocated_bytes"], peak);
    assert_eq!(report["devices"][0]["steps"], truth["devices"][0]["steps"]);
    let steps = c.call("steps", json!({"path": single})).unwrap();
    assert_eq!(steps["steps"], truth["devices"][0]["steps"]);
    let sites = c
        .call("top_sites", json!({"path": single, "top": 3}))
        .unwrap();
    assert_eq!(sites["top_sites"].as_array().unwrap().len(), 3);
    let live = c
        .call("live_at", json!({"path": single, "at": "peak"}))
        .unwrap();
    assert_eq!(live["allocated_bytes"], peak);
    let categories: u64 = live["by"]["category"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    assert!(categories <= peak.as_u64().unwrap());
    assert!(!live["largest_blocks"][0]["frames"].is_null());
    let oom = c
        .call(
            "oom",
            json!({"path": file("snapshots/allocator/cap_mid.pickle.xz")}),
        )
        .unwrap();
    assert_eq!(oom["devices"][0]["oom"]["requested_bytes"], 131072000);
    let whatif = c
        .call(
            "whatif",
            json!({"path": file("snapshots/allocator/default.pickle.xz"),
                   "settings": ["expandable_segments:True"], "cap": "2.3GiB"}),
        )
        .unwrap();
    assert_eq!(
        whatif["devices"][0]["simulated"][0]["alloc_conf"],
        "expandable_segments:True"
    );
    let ranks = c
        .call("compare", json!({"paths": [file("snapshots/fsdp")]}))
        .unwrap();
    assert_eq!(ranks["rows"].as_array().unwrap().len(), 2, "{ranks}");
    let (b, n) = (
        file("snapshots/sweeps/cnn/memory_snapshot_cnn_32.pickle.xz"),
        file("snapshots/sweeps/cnn/memory_snapshot_cnn_64.pickle.xz"),
    );
    let truth = crate::util::json(&["diff", &b, &n]);
    let d = c
        .call("diff", json!({"base": b, "new": n, "top": 3}))
        .unwrap();
    assert_eq!(
        d["peak_allocated_delta_bytes"],
        truth["peak_allocated_delta_bytes"]
    );
    assert_eq!(d["causes"].as_array().unwrap().len(), 3);
    let listed: i64 = d["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["peak_effect_bytes"].as_i64().unwrap())
        .sum();
    assert_eq!(
        listed + d["more_causes"]["peak_effect_bytes"].as_i64().unwrap(),
        truth["peak_allocated_delta_bytes"].as_i64().unwrap(),
        "the causes left out are summed"
    );
    let dir = tempfile::tempdir_in(testdata("")).unwrap();
    let png = dir.path().join("t.png");
    let drawn = c
        .call(
            "timeline",
            json!({"path": single, "output": png, "by": "step"}),
        )
        .unwrap();
    assert!(png.is_file(), "{drawn}");
    // a second look at a file is served from what was decoded (same answer)
    let again = c.call("report", json!({"path": single})).unwrap();
    assert_eq!(again, report);
}

#[test]
fn bad_input_is_an_error_and_the_server_goes_on() {
    let mut c = Client::start();
    let outside = c
        .call("report", json!({"path": "/etc/hostname"}))
        .unwrap_err();
    assert!(outside.contains("outside the folders"), "{outside}");
    let missing = c
        .call("report", json!({"path": file("snapshots/no-such.pickle")}))
        .unwrap_err();
    assert!(missing.contains("no-such.pickle"), "{missing}");
    let hostile = c
        .call("report", json!({"path": file("fuzz/memoize.pickle")}))
        .unwrap_err();
    assert!(!hostile.is_empty());
    let moment = c
        .call(
            "live_at",
            json!({"path": file("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"),
                   "at": "yesterday"}),
        )
        .unwrap_err();
    assert!(moment.contains("peak, end"), "{moment}");
    let no_args = c.call("report", json!({})).unwrap_err();
    assert!(no_args.contains("path"), "{no_args}");
    let over = c
        .call(
            "timeline",
            json!({"path": file("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"),
                   "output": file("snapshots/single-gpu/log.txt")}),
        )
        .unwrap_err();
    assert!(over.contains("exists"), "{over}");
    // still serving
    let fine = c
        .call(
            "steps",
            json!({"path": file("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz")}),
        )
        .unwrap();
    assert!(fine["steps"].as_array().is_some());
}

/// A root and a folder beside it, each holding a different snapshot: the root's `a.pickle.xz`
/// (single-gpu) and the outside's `secret.pickle.xz` (another recording), with their peaks.
struct Sandbox {
    top: tempfile::TempDir,
    inside_peak: u64,
    outside_peak: u64,
}

impl Sandbox {
    fn new() -> Sandbox {
        let top = tempfile::tempdir().unwrap();
        let (root, outside) = (top.path().join("root"), top.path().join("outside"));
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let inside = "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz";
        let secret = "snapshots/allocator/default.pickle.xz";
        std::fs::copy(testdata(inside), root.join("data/a.pickle.xz")).unwrap();
        std::fs::copy(testdata(secret), outside.join("secret.pickle.xz")).unwrap();
        let peak = |f: &str| {
            report_json(testdata(f), &[])["devices"][0]["peak_allocated_bytes"]
                .as_u64()
                .unwrap()
        };
        let (inside_peak, outside_peak) = (peak(inside), peak(secret));
        assert_ne!(inside_peak, outside_peak);
        Sandbox {
            top,
            inside_peak,
            outside_peak,
        }
    }

    fn root(&self) -> std::path::PathBuf {
        self.top.path().join("root")
    }

    fn outside(&self) -> std::path::PathBuf {
        self.top.path().join("outside")
    }

    fn client(&self, extra: &[&str]) -> Client {
        let root = self.root();
        let mut args: Vec<&std::ffi::OsStr> = vec!["--root".as_ref(), root.as_os_str()];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        Client::start_with(&args)
    }
}

#[test]
fn paths_are_relative_to_the_first_root() {
    let sb = Sandbox::new();
    let mut c = sb.client(&[]);
    let rel = c
        .call("report", json!({"path": "data/a.pickle.xz"}))
        .unwrap();
    assert_eq!(rel["devices"][0]["peak_allocated_bytes"], sb.inside_peak);
    assert_eq!(rel["file"], "data/a.pickle.xz");
    let abs = sb.root().join("data/a.pickle.xz");
    let same = c.call("report", json!({"path": abs})).unwrap();
    assert_eq!(same["file"], "data/a.pickle.xz");
    let drawn = c
        .call(
            "timeline",
            json!({"path": "data/a.pickle.xz", "output": "data/t.png"}),
        )
        .unwrap();
    assert_eq!(drawn["written"], "data/t.png");
    assert!(sb.root().join("data/t.png").is_file());
    let two = c.call("compare", json!({"paths": ["data"]}));
    assert!(two.unwrap_err().contains("1 files"));
}

#[test]
fn links_out_of_the_root_are_neither_read_nor_written() {
    let sb = Sandbox::new();
    let root = sb.root();
    let link =
        |target: &str, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    // a dangling link whose target would be created outside
    link("../outside/escaped.png", "new.png");
    // a link to a file outside, and to the folder outside
    link("../outside/secret.pickle.xz", "leak.pickle.xz");
    link("../outside", "out");
    // a probes side file that leads outside, beside a snapshot inside
    std::fs::write(
        sb.outside().join("p.json"),
        r#"{"probes": [{"name": "SECRET", "device_total_bytes": 1, "device_used_bytes": 1, "reserved_bytes": 0}]}"#,
    )
    .unwrap();
    link("../outside/p.json", "data/a.pickle.probes.json");
    let mut c = sb.client(&[]);
    let snap = "data/a.pickle.xz";
    let drawn = c.call("timeline", json!({"path": snap, "output": "new.png"}));
    assert!(drawn.is_err(), "{drawn:?}");
    assert!(!sb.outside().join("escaped.png").exists());
    let through = c.call("timeline", json!({"path": snap, "output": "out/x.png"}));
    assert!(through.unwrap_err().contains("outside"));
    assert!(!sb.outside().join("x.png").exists());
    for p in [
        "leak.pickle.xz",
        "out/secret.pickle.xz",
        "../outside/secret.pickle.xz",
    ] {
        let e = c.call("report", json!({"path": p})).unwrap_err();
        assert!(e.contains("outside the folders"), "{p}: {e}");
    }
    let e = c
        .call(
            "compare",
            json!({"paths": ["data/a.pickle.xz", "leak.pickle.xz"]}),
        )
        .unwrap();
    let failed: Vec<_> = e["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["error"].is_string())
        .collect();
    assert_eq!(failed.len(), 1, "{e}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("outside"),
        "{e}"
    );
    let rep = c.call("report", json!({"path": snap})).unwrap();
    assert!(!rep.to_string().contains("SECRET"), "{rep}");
}

#[test]
fn a_folder_swapped_for_a_link_while_calls_run_never_leads_outside() {
    let sb = Sandbox::new();
    let root = sb.root();
    // the outside folder holds a file of the same name as the root's
    std::fs::rename(
        sb.outside().join("secret.pickle.xz"),
        sb.outside().join("a.pickle.xz"),
    )
    .unwrap();
    let mut c = sb.client(&[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, root, outside) = (stop.clone(), root.clone(), sb.outside());
        std::thread::spawn(move || {
            let (data, kept, link) = (root.join("data"), root.join("kept"), root.join("link"));
            std::os::unix::fs::symlink(&outside, &link).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // data is the real folder, then the link to outside, then the real folder again
                std::fs::rename(&data, &kept).unwrap();
                std::fs::rename(&link, &data).unwrap();
                std::fs::rename(&data, &link).unwrap();
                std::fs::rename(&kept, &data).unwrap();
            }
        })
    };
    let (mut inside, mut refused) = (0, 0);
    for _ in 0..400 {
        match c.call("steps", json!({"path": "data/a.pickle.xz"})) {
            Ok(_) => inside += 1,
            Err(e) => {
                assert!(!e.contains(&sb.outside_peak.to_string()), "{e}");
                refused += 1;
            }
        }
        // the figures, when there are figures, are the root's file's
        if let Ok(v) = c.call("top_sites", json!({"path": "data/a.pickle.xz"})) {
            assert_eq!(v["peak_allocated_bytes"], sb.inside_peak, "{v}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(
        inside > 0,
        "some calls found the folder in place ({refused} did not)"
    );
}

#[test]
fn a_named_pipe_or_a_slow_call_never_stops_the_server() {
    let sb = Sandbox::new();
    let fifo = sb.root().join("fifo.pickle");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    // a pipe nobody writes to would block an open that waits for a writer
    let mut c = sb.client(&["--timeout", "20"]);
    let started = std::time::Instant::now();
    let e = c
        .call("report", json!({"path": "fifo.pickle"}))
        .unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let mut c = sb.client(&["--timeout", "0.001"]);
    // a call over the time limit is answered with an error, and the protocol goes on meanwhile
    let slow = c.ask(
        "tools/call",
        json!({"name": "report", "arguments": {"path": "data/a.pickle.xz"}}),
    );
    let list = c.ask("tools/list", json!({}));
    let listed = c.answer(list);
    assert_eq!(listed["result"]["tools"].as_array().map(Vec::len), Some(9));
    let late = tool_answer(&c.answer(slow)).unwrap_err();
    assert!(late.contains("longer than"), "{late}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn an_oversized_request_is_answered_with_an_error() {
    let sb = Sandbox::new();
    let mut c = sb.client(&[]);
    // a valid request of 100 MB
    let huge = "x".repeat(100 << 20);
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":9001,"method":"tools/call","params":{{"name":"report","arguments":{{"path":"{huge}"}}}}}}"#
    );
    writeln!(c.input, "{line}").unwrap();
    c.input.flush().unwrap();
    drop(line);
    let v = c.answer(9001);
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("limit"),
        "{v}"
    );
    // and the server goes on
    let fine = c
        .call("steps", json!({"path": "data/a.pickle.xz"}))
        .unwrap();
    assert!(fine["steps"].is_array());
}

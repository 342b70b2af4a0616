//! `memsnap mcp`, spoken to as a client would: newline-delimited JSON-RPC on the binary's
//! standard input and output (the Model Context Protocol over stdio).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

use crate::util::{report_json, testdata};

/// A running server and the next request id.
struct Client {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    id: u64,
}

impl Client {
    /// Starts `memsnap mcp --root testdata` and does the handshake.
    fn start() -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
            .args(["mcp", "--root"])
            .arg(testdata(""))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("memsnap mcp starts");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let mut c = Client {
            child,
            input,
            output,
            id: 0,
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
        self.id += 1;
        let id = self.id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
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
        }
    }

    /// Calls a tool: `Ok(its JSON)` or `Err(the error message)`.
    fn call(&mut self, tool: &str, arguments: Value) -> Result<Value, String> {
        let v = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
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
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

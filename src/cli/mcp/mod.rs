//! `memsnap mcp`: the analyses as tools of a Model Context Protocol server on standard input
//! and output, for coding agents.
//!
//! The protocol (JSON-RPC messages, the handshake, tool schemas) is the official Rust SDK's,
//! `rmcp`, over this module's own stdio transport ([`transport`]); this module maps each tool
//! to the analysis behind a command and returns the command's `--json` object, so field names
//! are those of `--json`. Paths are relative to the first root the server was started with
//! (`--root`, default the current folder), or absolute below one, and every file a tool reads
//! or writes is opened beneath its root ([`roots`]). Each call runs on a worker thread under a
//! time limit (`--timeout`), so a slow call never holds up `tools/list` or the other calls.
//! Decoded snapshots are kept between calls (the newest few, by file identity), so asking a
//! file several questions decodes it once. Bad input (a path outside the roots, a missing or
//! hostile file, an unknown moment) is answered with an MCP error naming it.

pub(crate) mod roots;
pub(crate) mod transport;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{
    schemars, tool, tool_handler, tool_router, ErrorData as McpError, ServerHandler, ServiceExt,
};

use memsnap::analysis::{self, DeviceAnalysis, Dimension};
use memsnap::chart::flamegraph::Moment;
use memsnap::report::compare::{rank_from_name, Profile, Ranks};
use memsnap::report::oom::{self, DeviceOom, OomOptions, OomReport};
use memsnap::report::whatif::{DeviceWhatIf, WhatIfOptions, WhatIfReport};
use memsnap::report::{DeviceReport, FileReport};
use memsnap::simulate::{parse_size, AllocConf};
use memsnap::snapshot::Snapshot;

use super::{Failure, InputArgs};
use roots::{FileId, Refused, Roots};

/// Snapshots kept decoded between calls.
const CACHED: usize = 4;
/// The most files one `compare` call reads.
const MAX_COMPARE: usize = 64;
/// Tool calls worked on at once (each may hold a decoded snapshot); the rest wait their turn,
/// their time limit running.
const WORKERS: usize = 2;

/// Arguments of `memsnap mcp`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Paths in tool calls are relative to the first --root (absolute paths below a root are taken too).\n\nClient configuration (for example .mcp.json):\n  {\"mcpServers\": {\"memsnap\": {\"command\": \"memsnap\", \"args\": [\"mcp\", \"--root\", \"snapshots\"]}}}"
)]
pub struct McpArgs {
    /// Folders whose files the tools may read and write (repeatable; default: the current
    /// folder). Paths are relative to the first.
    #[arg(long = "root", value_name = "DIR")]
    pub roots: Vec<PathBuf>,
    /// The longest a tool call may take, in seconds; a call still running then is answered
    /// with an error.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0, value_parser = parse_timeout)]
    pub timeout: f64,
    #[command(flatten)]
    pub input: InputArgs,
}

fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.trim().trim_end_matches('s').parse::<f64>() {
        Ok(t) if t > 0.0 && t <= 86_400.0 => Ok(t),
        _ => Err(format!("{text:?}: seconds, above 0 and at most a day")),
    }
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct FileArgs {
    /// A snapshot file (.pickle, optionally .gz, .xz or .zst), relative to the server's first
    /// root (or absolute, below a root).
    path: String,
    /// Only this device (default: the first with trace events).
    device: Option<u32>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct TopArgs {
    /// A snapshot file, relative to the server's first root.
    path: String,
    /// Only this device (default: the first with trace events).
    device: Option<u32>,
    /// Rows to return (default 10).
    top: Option<usize>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct LiveArgs {
    /// A snapshot file, relative to the server's first root.
    path: String,
    /// The moment: `peak`, `end`, `#EVENT` or `SECONDS s` (`2.5s`); default `peak`.
    at: Option<String>,
    /// Only this device (default: the first with trace events).
    device: Option<u32>,
    /// Rows per breakdown and blocks to return (default 10).
    top: Option<usize>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct WhatIfArgs {
    /// A snapshot file, relative to the server's first root.
    path: String,
    /// Allocator settings to simulate, each a PYTORCH_CUDA_ALLOC_CONF string (default: the
    /// recorded ones).
    settings: Option<Vec<String>>,
    /// A per-process memory cap: bytes, or a number with KiB, MiB, GiB (`40GiB`).
    cap: Option<String>,
    /// Only this device (default: every device with trace events).
    device: Option<u32>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct CompareArgs {
    /// Two or more snapshot files, or one folder of them, relative to the server's first root.
    paths: Vec<String>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct DiffArgs {
    /// The base run's snapshot file, relative to the server's first root.
    base: String,
    /// The new run's snapshot file, relative to the server's first root.
    new: String,
    /// Only this device of each (default: the first with trace events).
    device: Option<u32>,
    /// Causes to return, largest effect first (default 20; the rest are summed).
    top: Option<usize>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct TimelineArgs {
    /// A snapshot file, relative to the server's first root.
    path: String,
    /// The PNG or SVG to write, relative to the server's first root (a new file).
    output: String,
    /// Stack by: category, step, op, stage, site, phase or annotation (default category).
    by: Option<String>,
    /// Only this device (default: the first with trace events).
    device: Option<u32>,
}

/// Decoded snapshots by file identity, oldest first.
type Cache = Mutex<VecDeque<(FileId, Arc<Snapshot>)>>;

/// The server: its roots, the analysis options, the snapshots decoded so far, and the turns of
/// its workers.
#[derive(Clone)]
struct Server {
    roots: Arc<Roots>,
    options: Arc<analysis::Options>,
    cache: Arc<Cache>,
    workers: Arc<tokio::sync::Semaphore>,
    timeout: Duration,
    tool_router: ToolRouter<Server>,
}

fn bad(message: impl Into<String>) -> McpError {
    McpError::invalid_params(message.into(), None)
}

fn failed(e: memsnap::Error) -> McpError {
    bad(e.to_string())
}

/// The error for a path the roots refused, naming it as given.
fn refused(path: &str, e: Refused) -> McpError {
    bad(format!("{}: {e}", memsnap::units::printable(path)))
}

fn json_result(value: &impl serde::Serialize) -> Result<CallToolResult, McpError> {
    let text =
        serde_json::to_string(value).map_err(|e| McpError::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

impl Server {
    /// Runs `work` on a worker thread, within the time limit (waiting for a turn included).
    async fn off_thread<F>(&self, work: F) -> Result<CallToolResult, McpError>
    where
        F: FnOnce(&Server) -> Result<CallToolResult, McpError> + Send + 'static,
    {
        let limit = self.timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let late = || {
            bad(format!(
                "the call took longer than the server's limit of {} s (--timeout); the server goes on",
                limit.as_secs_f64()
            ))
        };
        let turn = tokio::time::timeout_at(deadline, self.workers.clone().acquire_owned())
            .await
            .map_err(|_| late())?
            .map_err(|_| McpError::internal_error("the server is stopping", None))?;
        let me = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            // the turn is given back when the work ends, even after its caller stopped waiting
            let _turn = turn;
            work(&me)
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(McpError::internal_error("the call failed", None)),
            Err(_) => Err(late()),
        }
    }

    /// The decoded snapshot at `path`, from the cache or read now, with its identity.
    fn snapshot(&self, path: &str) -> Result<Arc<Snapshot>, McpError> {
        let opened = self.roots.read(path).map_err(|e| refused(path, e))?;
        let lock = || {
            self.cache
                .lock()
                .map_err(|_| McpError::internal_error("cache", None))
        };
        if let Some((_, s)) = lock()?.iter().find(|(id, _)| *id == opened.id) {
            return Ok(s.clone());
        }
        let options = super::load_options();
        let snap = Arc::new(
            memsnap::snapshot::load_open(opened.file, Path::new(path), &options).map_err(failed)?,
        );
        let mut cache = lock()?;
        cache.push_back((opened.id, snap.clone()));
        while cache.len() > CACHED {
            cache.pop_front();
        }
        Ok(snap)
    }

    /// One device of a snapshot, analysed.
    fn analyse<'s>(
        &self,
        snap: &'s Snapshot,
        path: &str,
        device: Option<u32>,
    ) -> Result<DeviceAnalysis<'s>, McpError> {
        let d = super::device(snap, device, Path::new(path)).map_err(failed)?;
        Ok(analysis::analyse_device(snap, d, &self.options))
    }

    fn device_report(&self, path: &str, device: Option<u32>) -> Result<DeviceReport, McpError> {
        let snap = self.snapshot(path)?;
        let a = self.analyse(&snap, path, device)?;
        Ok(DeviceReport::new(&a))
    }

    /// The probes beside the snapshot at `path`, read beneath its root.
    fn probes(&self, path: &str) -> Vec<memsnap::snapshot::probes::Probe> {
        for side in memsnap::snapshot::probes::sidecars(Path::new(path)) {
            match self
                .roots
                .read_small(&side, memsnap::snapshot::probes::MAX_BYTES)
            {
                Ok(Some(bytes)) => {
                    return memsnap::snapshot::probes::parse(&bytes).unwrap_or_default()
                }
                Ok(None) => continue,
                Err(_) => return Vec::new(),
            }
        }
        Vec::new()
    }

    fn report_now(&self, a: FileArgs) -> Result<CallToolResult, McpError> {
        let snap = self.snapshot(&a.path)?;
        let devices = match a.device {
            None => analysis::analyse(&snap, &self.options),
            Some(_) => vec![self.analyse(&snap, &a.path, a.device)?],
        };
        let mut rep = FileReport::new(&self.roots.relative(&a.path), &snap, &devices);
        rep.probes = self.probes(&a.path);
        json_result(&rep)
    }

    fn live_at_now(&self, a: LiveArgs) -> Result<CallToolResult, McpError> {
        let snap = self.snapshot(&a.path)?;
        let da = self.analyse(&snap, &a.path, a.device)?;
        let text = a.at.as_deref().unwrap_or("peak");
        let moment = Moment::parse(text).ok_or_else(|| {
            bad(format!(
                "{:?}: use peak, end, #EVENT or SECONDS s (e.g. 3.2s)",
                memsnap::units::printable(text)
            ))
        })?;
        let at = moment.event(&da).map_err(bad)?;
        let top = a.top.unwrap_or(10);
        let live = analysis::breakdown::live_at(&snap, &da.replay, &da.attribution, at);
        let mut keyer = da.keyer();
        let mut by = serde_json::Map::new();
        for d in [
            Dimension::Category,
            Dimension::Step,
            Dimension::Op,
            Dimension::Stage,
            Dimension::Site,
        ] {
            let shares = analysis::breakdown::group(&mut keyer, d, &live);
            let rows: Vec<_> = shares.iter().take(top).collect();
            by.insert(
                d.as_str().to_string(),
                serde_json::to_value(rows).unwrap_or_default(),
            );
        }
        let mut largest: Vec<_> = live.iter().collect();
        largest.sort_by_key(|(bytes, _, _)| std::cmp::Reverse(*bytes));
        let blocks: Vec<_> = largest
            .iter()
            .take(top)
            .map(|(bytes, label, stack)| {
                let frames: Vec<String> = snap
                    .stacks
                    .frames(*stack)
                    .map(|f| format!("{}:{}:{}", snap.str(f.filename), snap.str(f.name), f.line))
                    .collect();
                serde_json::json!({
                    "bytes": bytes,
                    "category": label.category.as_str(),
                    "step": da.attribution.step_text(label, da.attribution.multi_step()),
                    "frames": frames,
                })
            })
            .collect();
        json_result(&serde_json::json!({
            "device": da.device(),
            "event": at,
            "allocated_bytes": live.iter().map(|(b, _, _)| b).sum::<u64>(),
            "by": by,
            "largest_blocks": blocks,
        }))
    }

    fn oom_now(&self, a: FileArgs) -> Result<CallToolResult, McpError> {
        let snap = self.snapshot(&a.path)?;
        let da = self.analyse(&snap, &a.path, a.device)?;
        let report = OomReport {
            file: self.roots.relative(&a.path),
            devices: vec![DeviceOom {
                device: da.device(),
                oom: oom::explain(&da, &OomOptions::default()),
            }],
        };
        json_result(&report)
    }

    fn whatif_now(&self, a: WhatIfArgs) -> Result<CallToolResult, McpError> {
        let snap = self.snapshot(&a.path)?;
        let da = self.analyse(&snap, &a.path, a.device)?;
        let mut confs = Vec::new();
        for s in a.settings.iter().flatten().take(MAX_COMPARE) {
            confs.push(
                AllocConf::parse(s)
                    .map_err(|e| bad(format!("{:?}: {e}", memsnap::units::printable(s))))?,
            );
        }
        let cap =
            match &a.cap {
                Some(c) => Some(parse_size(c).ok_or_else(|| {
                    bad(format!("{:?}: not a size", memsnap::units::printable(c)))
                })?),
                None => None,
            };
        let options = WhatIfOptions {
            confs,
            cap,
            ..WhatIfOptions::default()
        };
        json_result(&WhatIfReport {
            file: self.roots.relative(&a.path),
            devices: vec![DeviceWhatIf::new(&da, &options)],
        })
    }

    fn compare_now(&self, a: CompareArgs) -> Result<CallToolResult, McpError> {
        // a folder is listed beneath its root; each file is opened beneath it again when read
        let mut files = Vec::new();
        for p in &a.paths {
            if self.roots.is_folder(p) {
                let listed = self
                    .roots
                    .list(p, |name| {
                        !memsnap::snapshot::probes::is_side_file(name)
                            && super::compare::is_snapshot_name(name)
                    })
                    .map_err(|e| refused(p, e))?;
                files.extend(listed);
            } else {
                files.push(p.clone());
            }
            if files.len() > MAX_COMPARE {
                break;
            }
        }
        if files.len() < 2 || files.len() > MAX_COMPARE {
            return Err(bad(format!(
                "{} files: compare takes 2 to {MAX_COMPARE}",
                files.len()
            )));
        }
        let mut profiles = Vec::new();
        let mut failures = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let name = self.roots.relative(f);
            match self.snapshot(f) {
                Ok(snap) => {
                    for da in analysis::analyse(&snap, &self.options) {
                        let file_name = Path::new(&name)
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        profiles.push((
                            i,
                            Profile::new(&name, rank_from_name(&file_name), DeviceReport::new(&da)),
                        ));
                    }
                }
                Err(e) => failures.push((i, name, e.message.to_string())),
            }
        }
        json_result(&Ranks::new(profiles, failures))
    }

    fn diff_now(&self, a: DiffArgs) -> Result<CallToolResult, McpError> {
        let (sb, sn) = (self.snapshot(&a.base)?, self.snapshot(&a.new)?);
        let ab = self.analyse(&sb, &a.base, a.device)?;
        let an = self.analyse(&sn, &a.new, a.device)?;
        let names = (self.roots.relative(&a.base), self.roots.relative(&a.new));
        let mut d = memsnap::diff::diff(&ab, &an, (&names.0, &names.1));
        let top = a.top.unwrap_or(20).max(1);
        if d.causes.len() > top {
            let rest: Vec<_> = d.causes.split_off(top);
            let effect: i64 = rest.iter().map(|c| c.peak_effect_bytes).sum();
            let mut v = serde_json::to_value(&d)
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            v["more_causes"] =
                serde_json::json!({"count": rest.len(), "peak_effect_bytes": effect});
            return json_result(&v);
        }
        json_result(&d)
    }

    fn timeline_now(&self, a: TimelineArgs) -> Result<CallToolResult, McpError> {
        let snap = self.snapshot(&a.path)?;
        let da = self.analyse(&snap, &a.path, a.device)?;
        let mut options = memsnap::chart::Options::default();
        if let Some(by) = &a.by {
            options.by = super::parse_dimension(by).map_err(bad)?;
        }
        // drawn into a file of this process's own, then copied into the output, created new
        // beneath its root
        let scratch =
            tempfile::tempdir().map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let name = Path::new(&a.output).file_name().ok_or_else(|| {
            bad(format!(
                "{}: not a file name",
                memsnap::units::printable(&a.output)
            ))
        })?;
        let drawn = scratch.path().join(name);
        let shown = self.roots.relative(&a.output);
        let mut out = self
            .roots
            .create(&a.output)
            .map_err(|e| refused(&a.output, e))?;
        let finished = memsnap::chart::timeline(&drawn, &a.path, &da, &options)
            .map_err(|e| {
                failed(memsnap::Error::new(
                    Path::new(&shown),
                    memsnap::ErrorKind::Chart(e),
                ))
            })
            .and_then(|_| {
                std::fs::File::open(&drawn)
                    .and_then(|mut from| std::io::copy(&mut from, &mut out))
                    .and_then(|_| out.sync_all())
                    .map_err(|e| refused(&a.output, Refused::Io(e)))
            });
        if let Err(e) = finished {
            // what was created is taken away again
            self.roots.remove(&a.output);
            return Err(e);
        }
        json_result(&serde_json::json!({"written": shown}))
    }
}

#[tool_router]
impl Server {
    #[tool(
        description = "The report of a snapshot (memsnap report --json): memory at trace start, peak and end; what the peak was made of by category, step, op, stage, site, phase, annotation; the step table; probes. Paths are relative to the server's first root."
    )]
    async fn report(
        &self,
        Parameters(a): Parameters<FileArgs>,
    ) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| s.report_now(a)).await
    }

    #[tool(
        description = "The step table of a snapshot: one row per training or pipeline step and phase, with allocated bytes at its start, end and peak and what its peak was mostly. Paths are relative to the server's first root."
    )]
    async fn steps(&self, Parameters(a): Parameters<FileArgs>) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| {
            let d = s.device_report(&a.path, a.device)?;
            json_result(&serde_json::json!({"device": d.device, "steps": d.steps}))
        })
        .await
    }

    #[tool(
        description = "The allocation sites (innermost program frames) live at the allocated peak, largest first, with bytes and counts. Paths are relative to the server's first root."
    )]
    async fn top_sites(
        &self,
        Parameters(a): Parameters<TopArgs>,
    ) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| {
            let d = s.device_report(&a.path, a.device)?;
            let top = a.top.unwrap_or(10);
            let sites: Vec<_> = d.top_sites.iter().take(top).collect();
            json_result(&serde_json::json!({
                "device": d.device,
                "peak_allocated_bytes": d.peak_allocated_bytes,
                "top_sites": sites,
            }))
        })
        .await
    }

    #[tool(
        description = "What was live at one moment (peak, end, #EVENT or SECONDS s): allocated bytes, the breakdown by category, step, op, stage and site, and the largest blocks with their stacks. Paths are relative to the server's first root."
    )]
    async fn live_at(
        &self,
        Parameters(a): Parameters<LiveArgs>,
    ) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| s.live_at_now(a)).await
    }

    #[tool(
        description = "An out-of-memory snapshot explained (memsnap oom --json): the failed request, the verdict (fragmentation, capacity or cap), what was live, and which allocator settings would have fit. Paths are relative to the server's first root."
    )]
    async fn oom(&self, Parameters(a): Parameters<FileArgs>) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| s.oom_now(a)).await
    }

    #[tool(
        description = "The caching allocator simulated under other settings and a memory cap (memsnap whatif --json): peak allocated and reserved, fragmentation, and whether it fits. Paths are relative to the server's first root."
    )]
    async fn whatif(
        &self,
        Parameters(a): Parameters<WhatIfArgs>,
    ) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| s.whatif_now(a)).await
    }

    #[tool(
        description = "Ranks or runs side by side (memsnap compare --json): peak allocated and reserved per file and device, where each peaked, the highest and lowest. Paths are relative to the server's first root."
    )]
    async fn compare(
        &self,
        Parameters(a): Parameters<CompareArgs>,
    ) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| s.compare_now(a)).await
    }

    #[tool(
        description = "Why one run used more (or less) memory than another (memsnap diff --json): the two runs' requests aligned, each difference classified (new, gone, count, size, life, before_recording, allocator) with its site, module, category, step and phase, and its effect on the peak in bytes; the effects add up to peak_allocated_delta_bytes. Paths are relative to the server's first root."
    )]
    async fn diff(&self, Parameters(a): Parameters<DiffArgs>) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| s.diff_now(a)).await
    }

    #[tool(
        description = "Draws memory over time as a PNG or SVG (memsnap timeline), stacked by a label, into a new file, and returns its path relative to the server's first root. Paths are relative to the server's first root."
    )]
    async fn timeline(
        &self,
        Parameters(a): Parameters<TimelineArgs>,
    ) -> Result<CallToolResult, McpError> {
        self.off_thread(move |s| s.timeline_now(a)).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("memsnap", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "memsnap explains PyTorch CUDA memory snapshots. Start with report (or live_at \
                 for one moment), oom for an out-of-memory snapshot, whatif for other settings or \
                 caps, compare for ranks. Paths are relative to the server's first root \
                 (absolute paths below a root are taken too).",
            )
    }
}

/// Serves the tools on standard input and output until the client closes them.
pub fn run(args: McpArgs) -> Result<(), Failure> {
    let options = args.input.analysis()?;
    let folders = if args.roots.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.roots.clone()
    };
    let not_a_folder =
        || Failure::Usage(memsnap::error::UsageError::NotAFolder { option: "--root" });
    if folders.iter().any(|f| !f.is_dir()) {
        return Err(not_a_folder());
    }
    let roots = Roots::open(&folders).map_err(|_| not_a_folder())?;
    let server = Server {
        roots: Arc::new(roots),
        options: Arc::new(options),
        cache: Arc::new(Mutex::new(VecDeque::new())),
        workers: Arc::new(tokio::sync::Semaphore::new(WORKERS)),
        timeout: Duration::from_secs_f64(args.timeout),
        tool_router: Server::tool_router(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::Output)?;
    runtime.block_on(async {
        let running = server
            .serve(transport::Stdio::start())
            .await
            .map_err(|e| Failure::Output(std::io::Error::other(e.to_string())))?;
        running
            .waiting()
            .await
            .map_err(|e| Failure::Output(std::io::Error::other(e.to_string())))?;
        Ok(())
    })
}

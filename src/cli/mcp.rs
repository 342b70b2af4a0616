//! `memsnap mcp`: the analyses as tools of a Model Context Protocol server on standard input
//! and output, for coding agents.
//!
//! The protocol (JSON-RPC messages, the handshake, tool schemas) is the official Rust SDK's,
//! `rmcp`; this module only maps each tool to the analysis behind a command and returns the
//! command's `--json` object, so field names are those of `--json`. A tool reads only files
//! below the roots the server was started with (`--root`, default the current folder),
//! checked after resolving links. Decoded snapshots are kept between calls (the newest few),
//! so asking a file several questions decodes it once. Bad input (a path outside the roots, a
//! missing or hostile file, an unknown moment) is answered with an MCP error naming it.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// Snapshots kept decoded between calls.
const CACHED: usize = 4;
/// The most files one `compare` call reads.
const MAX_COMPARE: usize = 64;

/// Arguments of `memsnap mcp`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Client configuration (for example .mcp.json):\n  {\"mcpServers\": {\"memsnap\": {\"command\": \"memsnap\", \"args\": [\"mcp\", \"--root\", \"snapshots\"]}}}"
)]
pub struct McpArgs {
    /// Folders whose files the tools may read (repeatable; default: the current folder).
    #[arg(long = "root", value_name = "DIR")]
    pub roots: Vec<PathBuf>,
    #[command(flatten)]
    pub input: InputArgs,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct FileArgs {
    /// A snapshot file (.pickle, optionally .gz, .xz or .zst) below the server's roots.
    path: String,
    /// Only this device (default: the first with trace events).
    device: Option<u32>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct TopArgs {
    /// A snapshot file below the server's roots.
    path: String,
    /// Only this device (default: the first with trace events).
    device: Option<u32>,
    /// Rows to return (default 10).
    top: Option<usize>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct LiveArgs {
    /// A snapshot file below the server's roots.
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
    /// A snapshot file below the server's roots.
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
    /// Two or more snapshot files, or one folder of them, below the server's roots.
    paths: Vec<String>,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct TimelineArgs {
    /// A snapshot file below the server's roots.
    path: String,
    /// The PNG or SVG to write, below the server's roots (not an existing file).
    output: String,
    /// Stack by: category, step, op, stage, site, phase or annotation (default category).
    by: Option<String>,
    /// Only this device (default: the first with trace events).
    device: Option<u32>,
}

/// Decoded snapshots by resolved path, oldest first.
type Cache = Mutex<VecDeque<(PathBuf, Arc<Snapshot>)>>;

/// The server: its roots, the analysis options, and the snapshots decoded so far.
#[derive(Clone)]
struct Server {
    roots: Arc<Vec<PathBuf>>,
    options: Arc<analysis::Options>,
    cache: Arc<Cache>,
    tool_router: ToolRouter<Server>,
}

fn bad(message: impl Into<String>) -> McpError {
    McpError::invalid_params(message.into(), None)
}

fn failed(e: memsnap::Error) -> McpError {
    bad(e.to_string())
}

fn json_result(value: &impl serde::Serialize) -> Result<CallToolResult, McpError> {
    let text =
        serde_json::to_string(value).map_err(|e| McpError::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
}

impl Server {
    /// `path` resolved, if it lies below a root (links followed).
    fn inside(&self, path: &str) -> Result<PathBuf, McpError> {
        let resolved = Path::new(path)
            .canonicalize()
            .map_err(|e| bad(format!("{path}: {}", memsnap::error::io_text(&e))))?;
        if self.roots.iter().any(|r| resolved.starts_with(r)) {
            Ok(resolved)
        } else {
            Err(bad(format!(
                "{path}: outside the folders this server may read"
            )))
        }
    }

    /// Where an output may be written: its folder lies below a root and it does not exist.
    fn output_inside(&self, path: &str) -> Result<PathBuf, McpError> {
        let p = Path::new(path);
        if p.exists() {
            return Err(bad(format!("{path}: exists; give a new file")));
        }
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let folder = self.inside(&parent.to_string_lossy())?;
        let name = p
            .file_name()
            .ok_or_else(|| bad(format!("{path}: not a file name")))?;
        Ok(folder.join(name))
    }

    /// The decoded snapshot at `path`, from the cache or read now.
    fn snapshot(&self, path: &str) -> Result<(PathBuf, Arc<Snapshot>), McpError> {
        let resolved = self.inside(path)?;
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| McpError::internal_error("cache", None))?;
        if let Some((_, s)) = cache.iter().find(|(p, _)| *p == resolved) {
            return Ok((resolved, s.clone()));
        }
        drop(cache);
        let snap = Arc::new(super::load(&resolved).map_err(failed)?);
        cache = self
            .cache
            .lock()
            .map_err(|_| McpError::internal_error("cache", None))?;
        cache.push_back((resolved.clone(), snap.clone()));
        while cache.len() > CACHED {
            cache.pop_front();
        }
        Ok((resolved, snap))
    }

    /// One device of a snapshot, analysed.
    fn analyse<'s>(
        &self,
        snap: &'s Snapshot,
        path: &Path,
        device: Option<u32>,
    ) -> Result<DeviceAnalysis<'s>, McpError> {
        let d = super::device(snap, device, path).map_err(failed)?;
        Ok(analysis::analyse_device(snap, d, &self.options))
    }

    fn device_report(&self, path: &str, device: Option<u32>) -> Result<DeviceReport, McpError> {
        let (resolved, snap) = self.snapshot(path)?;
        let a = self.analyse(&snap, &resolved, device)?;
        Ok(DeviceReport::new(&a))
    }
}

#[tool_router]
impl Server {
    #[tool(
        description = "The report of a snapshot (memsnap report --json): memory at trace start, peak and end; what the peak was made of by category, step, op, stage, site, phase, annotation; the step table; probes."
    )]
    fn report(&self, Parameters(a): Parameters<FileArgs>) -> Result<CallToolResult, McpError> {
        let (resolved, snap) = self.snapshot(&a.path)?;
        let devices = match a.device {
            None => analysis::analyse(&snap, &self.options),
            Some(_) => vec![self.analyse(&snap, &resolved, a.device)?],
        };
        let mut rep = FileReport::new(&a.path, &snap, &devices);
        if let Ok(Some((_, probes))) = memsnap::snapshot::probes::read(&resolved) {
            rep.probes = probes;
        }
        json_result(&rep)
    }

    #[tool(
        description = "The step table of a snapshot: one row per training or pipeline step and phase, with allocated bytes at its start, end and peak and what its peak was mostly."
    )]
    fn steps(&self, Parameters(a): Parameters<FileArgs>) -> Result<CallToolResult, McpError> {
        let d = self.device_report(&a.path, a.device)?;
        json_result(&serde_json::json!({"device": d.device, "steps": d.steps}))
    }

    #[tool(
        description = "The allocation sites (innermost program frames) live at the allocated peak, largest first, with bytes and counts."
    )]
    fn top_sites(&self, Parameters(a): Parameters<TopArgs>) -> Result<CallToolResult, McpError> {
        let d = self.device_report(&a.path, a.device)?;
        let top = a.top.unwrap_or(10);
        let sites: Vec<_> = d.top_sites.iter().take(top).collect();
        json_result(&serde_json::json!({
            "device": d.device,
            "peak_allocated_bytes": d.peak_allocated_bytes,
            "top_sites": sites,
        }))
    }

    #[tool(
        description = "What was live at one moment (peak, end, #EVENT or SECONDS s): allocated bytes, the breakdown by category, step, op, stage and site, and the largest blocks with their stacks."
    )]
    fn live_at(&self, Parameters(a): Parameters<LiveArgs>) -> Result<CallToolResult, McpError> {
        let (resolved, snap) = self.snapshot(&a.path)?;
        let da = self.analyse(&snap, &resolved, a.device)?;
        let text = a.at.as_deref().unwrap_or("peak");
        let moment = Moment::parse(text).ok_or_else(|| {
            bad(format!(
                "{text:?}: use peak, end, #EVENT or SECONDS s (e.g. 3.2s)"
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

    #[tool(
        description = "An out-of-memory snapshot explained (memsnap oom --json): the failed request, the verdict (fragmentation, capacity or cap), what was live, and which allocator settings would have fit."
    )]
    fn oom(&self, Parameters(a): Parameters<FileArgs>) -> Result<CallToolResult, McpError> {
        let (resolved, snap) = self.snapshot(&a.path)?;
        let da = self.analyse(&snap, &resolved, a.device)?;
        let report = OomReport {
            file: a.path.clone(),
            devices: vec![DeviceOom {
                device: da.device(),
                oom: oom::explain(&da, &OomOptions::default()),
            }],
        };
        json_result(&report)
    }

    #[tool(
        description = "The caching allocator simulated under other settings and a memory cap (memsnap whatif --json): peak allocated and reserved, fragmentation, and whether it fits."
    )]
    fn whatif(&self, Parameters(a): Parameters<WhatIfArgs>) -> Result<CallToolResult, McpError> {
        let (resolved, snap) = self.snapshot(&a.path)?;
        let da = self.analyse(&snap, &resolved, a.device)?;
        let mut confs = Vec::new();
        for s in a.settings.iter().flatten().take(MAX_COMPARE) {
            confs.push(AllocConf::parse(s).map_err(|e| bad(format!("{s:?}: {e}")))?);
        }
        let cap = match &a.cap {
            Some(c) => Some(parse_size(c).ok_or_else(|| bad(format!("{c:?}: not a size")))?),
            None => None,
        };
        let options = WhatIfOptions {
            confs,
            cap,
            ..WhatIfOptions::default()
        };
        json_result(&WhatIfReport {
            file: a.path.clone(),
            devices: vec![DeviceWhatIf::new(&da, &options)],
        })
    }

    #[tool(
        description = "Ranks or runs side by side (memsnap compare --json): peak allocated and reserved per file and device, where each peaked, the highest and lowest."
    )]
    fn compare(&self, Parameters(a): Parameters<CompareArgs>) -> Result<CallToolResult, McpError> {
        // folders listed as `memsnap compare` lists them; every file is checked against the
        // roots again when it is read (a link in a folder may lead out)
        let inputs = a
            .paths
            .iter()
            .map(|p| self.inside(p))
            .collect::<Result<Vec<_>, _>>()?;
        let files = super::compare::expand(&inputs, false).0;
        if files.len() < 2 || files.len() > MAX_COMPARE {
            return Err(bad(format!(
                "{} files: compare takes 2 to {MAX_COMPARE}",
                files.len()
            )));
        }
        let mut profiles = Vec::new();
        let mut failures = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let name = f.display().to_string();
            match self.snapshot(&name) {
                Ok((_, snap)) => {
                    for da in analysis::analyse(&snap, &self.options) {
                        let file_name = f
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

    #[tool(
        description = "Draws memory over time as a PNG or SVG (memsnap timeline), stacked by a label, and returns the path written."
    )]
    fn timeline(
        &self,
        Parameters(a): Parameters<TimelineArgs>,
    ) -> Result<CallToolResult, McpError> {
        let (resolved, snap) = self.snapshot(&a.path)?;
        let out = self.output_inside(&a.output)?;
        let da = self.analyse(&snap, &resolved, a.device)?;
        let mut options = memsnap::chart::Options::default();
        if let Some(by) = &a.by {
            options.by = super::parse_dimension(by).map_err(bad)?;
        }
        super::timeline::draw_to(&out, memsnap::output::Naming::Named, |at| {
            memsnap::chart::timeline(at, &a.path, &da, &options)
        })
        .map_err(failed)?;
        json_result(&serde_json::json!({"written": out.display().to_string()}))
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
                 caps, compare for ranks. Paths are files below the server's roots.",
            )
    }
}

/// Serves the tools on standard input and output until the client closes them.
pub fn run(args: McpArgs) -> Result<(), Failure> {
    let options = args.input.analysis()?;
    let roots = if args.roots.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.roots.clone()
    };
    let mut resolved = Vec::new();
    for r in &roots {
        let c = r.canonicalize().map_err(|_| {
            Failure::Usage(memsnap::error::UsageError::NotAFolder { option: "--root" })
        })?;
        if !c.is_dir() {
            return Err(Failure::Usage(memsnap::error::UsageError::NotAFolder {
                option: "--root",
            }));
        }
        resolved.push(c);
    }
    let server = Server {
        roots: Arc::new(resolved),
        options: Arc::new(options),
        cache: Arc::new(Mutex::new(VecDeque::new())),
        tool_router: Server::tool_router(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::Output)?;
    runtime.block_on(async {
        let running = server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| Failure::Output(std::io::Error::other(e.to_string())))?;
        running
            .waiting()
            .await
            .map_err(|e| Failure::Output(std::io::Error::other(e.to_string())))?;
        Ok(())
    })
}

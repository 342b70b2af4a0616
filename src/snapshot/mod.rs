//! Model: the snapshot as typed, interned, immutable tables.
//!
//! [`Snapshot`] holds what `torch.cuda.memory._snapshot()` recorded, for torch 2.0 through 2.11
//! and newer: the allocator's segments and blocks at snapshot time, one trace of allocator
//! events per device, `record_function` annotations and the allocator settings. Fields missing
//! in older versions take defaults; unknown fields are ignored; a bare segment list (the public
//! `torch.cuda.memory_snapshot()` output) is accepted.
//!
//! Strings are interned ([`StrId`]), frames and stacks too ([`Stacks`]); a trace event is a
//! 48-byte row. Building happens while the pickle is decoded (see [`from_pickle`]), so a large trace
//! never exists as Python-like dicts: most entries reach the builder whole from the decoder's
//! fast path and become rows without a container being made. On machines of four or more
//! cores, a large plain file is decoded in parts on several threads (`split`), with the same
//! result. What the events *mean* over time is the replay stage's job.

mod build;
mod compact;
mod load;
pub mod probes;
#[cfg(unix)]
mod split;
mod stacks;
pub mod tensors;

use std::path::Path;

#[cfg(test)]
pub(crate) use build::read_whole_tests::every_snapshot;
pub use build::{flat_agrees, from_pickle, HOST_DEVICE, MAX_DEVICE, MAX_TIME_US};
pub use load::{load, load_open, LoadOptions};
#[cfg(unix)]
pub use split::parts_agree;

/// Sizes above this (2^48 bytes, 256 TiB) are not real: no GPU holds them. A segment or block
/// of such a size is refused; a trace event of such a size is an anomaly the replay skips, as
/// the allocator would have refused it.
pub const MAX_REAL_SIZE: u64 = 1 << 48;

/// Nor are totals above this (2^52 bytes, 4 PiB) for one device: keeping every sum of live or
/// reserved bytes below it means no sum of them anywhere can wrap.
pub const MAX_REAL_TOTAL: u64 = 1 << 52;
pub use stacks::{Frame, FrameId, StackId, Stacks};

use crate::pickle::Compression;
pub use crate::pickle::StrId;

/// What an allocator trace entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A block was handed to the program (`size` = requested bytes).
    Alloc,
    /// The program dropped the tensor; the block may wait for other streams.
    FreeRequested,
    /// The block really went back to the cache.
    FreeCompleted,
    /// `cudaMalloc` of a new segment.
    SegmentAlloc,
    /// `cudaFree` of a segment.
    SegmentFree,
    /// An expandable segment grew.
    SegmentMap,
    /// Pages of an expandable segment were released.
    SegmentUnmap,
    /// An earlier `_snapshot()` call.
    Snapshot,
    /// An allocation failed (`addr` holds the free bytes the device reported).
    Oom,
    /// Metadata attached to a live allocation after the fact (`_annotate_tensor`, torch
    /// after 2.11): `addr` is the allocation's base address and `user_metadata` the text.
    /// It changes no memory.
    Annotate,
    /// An action this version of memsnap does not know.
    Unknown,
}

impl Action {
    /// Parses PyTorch's action string.
    pub fn parse(s: &str) -> Action {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" => Action::Annotate,
            _ => Action::Unknown,
        }
    }

    /// PyTorch's action string.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::Unknown => "unknown",
        }
    }
}

/// One allocator trace entry, 40 bytes: what every entry has is here; the stream is an index
/// into [`Snapshot::streams`], and the fields few entries carry live in
/// [`Snapshot::event_extras`] ([`Snapshot::extra`] reads them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceEvent {
    /// Block or segment address; for [`Action::Oom`], the free bytes the device reported.
    pub addr: u64,
    /// Requested bytes (alloc/free), segment bytes (segment actions), or the failed request.
    pub size: u64,
    /// Wall clock in microseconds since the Unix epoch; 0 when not recorded (torch < 2.2).
    pub time_us: i64,
    /// Stack of the allocation (or of the free call, with `context="all"`).
    pub stack: StackId,
    /// The CUDA stream ([`Snapshot::stream`] gives the `cudaStream_t` as an integer).
    pub stream: StreamId,
    /// 1 + index into [`Snapshot::event_extras`], or 0 when the entry has none of those fields.
    pub extra: u32,
    /// The memory pool the entry belongs to (`pool_id`, torch after 2.11), packed.
    pub pool: PoolId,
    /// What happened.
    pub action: Action,
}

/// A CUDA stream of a snapshot: an index into [`Snapshot::streams`]. `StreamId(0)` is always
/// stream 0 (the default stream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

/// The fields of a trace entry that few entries carry, or that many carry with the same
/// values (torch 2.8+ writes `compile_context: "N/A"` in every entry): each distinct set is
/// kept once beside the trace, so that every entry stays small.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventExtra {
    /// `compile_context` (torch 2.8+), or the empty string.
    pub compile_context: StrId,
    /// `user_metadata` (torch 2.10+), or the empty string.
    pub user_metadata: StrId,
    /// 1 + index into [`Snapshot::forward_frames`] (anomaly mode), or 0.
    pub forward_frames: u32,
    /// For a free: the bytes its block held beyond the request, when the file records the
    /// block's size (`block_size`, which `memsnap trim` writes on frees of blocks allocated
    /// before its window); else 0. PyTorch does not record it.
    pub block_surplus: u32,
}

impl EventExtra {
    /// Whether the entry carries none of the fields (all empty or 0).
    pub fn is_empty(&self) -> bool {
        *self == EventExtra::default()
    }
}

/// A memory pool as a trace entry names it (`pool_id`, torch after 2.11: `(0, 0)` the
/// default pool, `(n, 0)` a pool a CUDA graph made for itself, `(0, n)` a `MemPool` or
/// `graph_pool_handle()`), packed into 16 bits so that a trace entry stays as small as before:
/// 0 when the entry carries no pool id, 1 for the default pool, `1 + n` for `(n, 0)` with
/// `n < 2^15 - 1`, `2^15 - 1 + n` for `(0, n)` with `n < 2^15`, and [`PoolId::OTHER`] for any
/// other pair (never seen from PyTorch, whose counters start at 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u16);

impl PoolId {
    /// The entry carries no pool id (torch 2.11 and older).
    pub const UNKNOWN: PoolId = PoolId(0);
    /// The default pool, `(0, 0)`.
    pub const DEFAULT: PoolId = PoolId(1);
    /// A pair that does not pack.
    pub const OTHER: PoolId = PoolId(u16::MAX);

    /// Packs PyTorch's pair.
    pub fn pack(id: (i64, i64)) -> PoolId {
        const HALF: i64 = 1 << 15;
        match id {
            (0, 0) => PoolId::DEFAULT,
            (n, 0) if (1..HALF - 1).contains(&n) => PoolId(1 + n as u16),
            (0, n) if (1..HALF).contains(&n) => PoolId((HALF - 1 + n) as u16),
            _ => PoolId::OTHER,
        }
    }

    /// PyTorch's pair, or `None` for [`PoolId::UNKNOWN`] and [`PoolId::OTHER`].
    pub fn pair(self) -> Option<(i64, i64)> {
        const HALF: i64 = 1 << 15;
        let v = self.0 as i64;
        match self {
            PoolId::UNKNOWN | PoolId::OTHER => None,
            PoolId::DEFAULT => Some((0, 0)),
            _ if v < HALF => Some((v - 1, 0)),
            _ => Some((0, v - (HALF - 1))),
        }
    }

    /// A private pool: a CUDA graph's or a `MemPool`'s.
    pub fn is_private(self) -> bool {
        self != PoolId::UNKNOWN && self != PoolId::DEFAULT
    }

    /// A pool a CUDA graph made for itself (`(n, 0)`): requests in it are made during a
    /// capture, when the allocator never releases its cache to retry.
    pub fn is_graph(self) -> bool {
        self.pair().is_some_and(|(a, b)| a > 0 && b == 0)
    }

    /// How the pool is named in text: `default`, `CUDA graph (1, 0)`, `pool (0, 1)`.
    pub fn label(self) -> String {
        match self.pair() {
            Some((0, 0)) => "default".to_string(),
            Some((a, b)) if a > 0 => format!("CUDA graph ({a}, {b})"),
            Some((a, b)) => format!("pool ({a}, {b})"),
            None if self == PoolId::OTHER => "another pool".to_string(),
            None => "unknown pool".to_string(),
        }
    }
}

const _: () = assert!(std::mem::size_of::<TraceEvent>() == 40);

#[cfg(test)]
impl TraceEvent {
    /// An event without frames, metadata or stream, for unit tests.
    pub(crate) fn bare(action: Action, addr: u64, size: u64, time_us: i64) -> TraceEvent {
        TraceEvent {
            addr,
            size,
            time_us,
            stream: StreamId(0),
            stack: StackId::EMPTY,
            extra: 0,
            action,
            pool: PoolId::UNKNOWN,
        }
    }
}

/// State of a block at snapshot time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed to the program.
    ActiveAllocated,
    /// Freed by the program, waiting for other streams (`record_stream`).
    ActivePendingFree,
    /// Cached free memory.
    Inactive,
}

/// A block inside a segment.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Start address.
    pub address: u64,
    /// Rounded block size.
    pub size: u64,
    /// Bytes the program asked for (stale for inactive blocks).
    pub requested_size: u64,
    /// Allocation state.
    pub state: BlockState,
    /// Allocation stack of a live block.
    pub stack: StackId,
}

/// Which pool a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentType {
    /// 2 MiB segments for requests up to 1 MiB.
    Small,
    /// Everything else.
    Large,
}

/// One `cudaMalloc` (or one contiguous mapped range of an expandable segment).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// Device ordinal.
    pub device: u32,
    /// Base address.
    pub address: u64,
    /// Reserved bytes.
    pub total_size: u64,
    /// CUDA stream of the segment.
    pub stream: i64,
    /// Small or large pool.
    pub segment_type: SegmentType,
    /// `(0, 0)` for the default pool; anything else is a private pool (CUDA graph, MemPool).
    pub pool_id: (i64, i64),
    /// Created with `expandable_segments:True`.
    pub is_expandable: bool,
    /// Stack of the `cudaMalloc`.
    pub stack: StackId,
    /// Blocks in address order, covering the segment.
    pub blocks: Vec<Block>,
}

/// Start or end of a `record_function` range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Stage {
    /// The range was entered.
    Start,
    /// The range was left.
    End,
}

/// A `record_function` mark from `external_annotations` (torch 2.5+).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Annotation {
    /// Enter or leave.
    pub stage: Stage,
    /// The range's name.
    pub name: StrId,
    /// Device ordinal.
    pub device: i64,
    /// Wall clock in microseconds since the Unix epoch.
    pub time_us: i64,
}

/// The allocator configuration at snapshot time (torch 2.3+).
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct AllocatorSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as last set.
    pub alloc_conf: String,
    /// Blocks at or above this size are never split; `None` = unlimited.
    pub max_split_size: Option<u64>,
    /// Whether `expandable_segments:True` was on.
    pub expandable_segments: bool,
    /// `roundup_power2_divisions` per power-of-two interval starting at 1 MiB (index 0 = 1 MiB).
    pub roundup_power2_divisions: [u64; 16],
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: f64,
    /// `trace_alloc_overflowed` (torch after 2.11): the trace ring buffer dropped old entries.
    pub trace_overflowed: Option<bool>,
    /// Every setting as `key = value` text, in file order, for display.
    pub entries: Vec<(String, String)>,
}

impl AllocatorSettings {
    /// Whether the recorded `PYTORCH_CUDA_ALLOC_CONF` chose `backend:cudaMallocAsync`, CUDA's
    /// own allocator: it has no caching-allocator segments, so there is nothing to simulate.
    pub fn async_backend(&self) -> bool {
        let said = |key: &str, value: &str| {
            key.trim() == "backend" && value.trim().trim_matches(['\'', '"']) == "cudaMallocAsync"
        };
        self.alloc_conf
            .split(',')
            .filter_map(|part| part.split_once(':'))
            .any(|(k, v)| said(k, v))
            || self.entries.iter().any(|(k, v)| said(k, v))
    }
}

/// Where a snapshot came from and how it was encoded.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SourceInfo {
    /// Pickle protocol (0 or 1 when the file has no PROTO opcode).
    pub protocol: u8,
    /// Compression of the file.
    pub compression: Option<Compression>,
    /// Bytes of the file on disk.
    pub file_bytes: u64,
    /// Bytes of the (decompressed) pickle.
    pub pickle_bytes: u64,
    /// The file held a bare segment list (old `torch.cuda.memory_snapshot()` output).
    pub segments_only: bool,
    /// Trace entries whose action memsnap does not know.
    pub unknown_actions: u64,
}

/// How a device is named in text: `device 0`, or `host (pinned)` for [`HOST_DEVICE`].
pub fn device_name(device: u32) -> String {
    if device == HOST_DEVICE {
        "host (pinned)".to_string()
    } else {
        format!("device {device}")
    }
}

/// A decoded memory snapshot.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Segments at snapshot time, all devices.
    pub segments: Vec<Segment>,
    /// Allocator trace per device; index = device ordinal.
    pub traces: Vec<Vec<TraceEvent>>,
    /// Per device, the trace entries whose `time_us` no clock gave (negative, or centuries
    /// ahead), read as entries without a time.
    pub impossible_times: Vec<u64>,
    /// `record_function` marks, in recorded order.
    pub annotations: Vec<Annotation>,
    /// Allocator settings, when recorded.
    pub settings: Option<AllocatorSettings>,
    /// Interned strings; [`StrId`]`(0)` is the empty string.
    pub strings: Vec<Box<str>>,
    /// Frame and stack tables.
    pub stacks: Stacks,
    /// Forward-pass tracebacks of anomaly mode, referenced by [`EventExtra::forward_frames`].
    pub forward_frames: Vec<Vec<StrId>>,
    /// The CUDA streams the trace names (`cudaStream_t` as integers), in the order first met,
    /// stream 0 first; [`TraceEvent::stream`] indexes it.
    pub streams: Vec<i64>,
    /// The distinct sets of rare fields of the trace entries that carry any
    /// ([`TraceEvent::extra`]), in the order first met.
    pub event_extras: Vec<EventExtra>,
    /// Encoding details.
    pub source: SourceInfo,
    /// Shortest unambiguous suffixes of frame file names, computed on first use.
    pub(crate) short_files: std::sync::OnceLock<rustc_hash::FxHashMap<StrId, String>>,
    /// Facts about each distinct frame that the attribution stage tests in every stack,
    /// computed on first use (`attribute::frames`).
    pub(crate) frame_facts: std::sync::OnceLock<Vec<u8>>,
    /// The program's own list of its tensors and steps (`<file>.tensors.json`, written by
    /// `memsnap.Capture`), when one lies beside the file.
    pub capture: Option<tensors::CaptureTensors>,
    /// Why a side file beside the file was left out, in words.
    pub side_file_problems: Vec<String>,
}

/// The most trailing path components a shortened file name is chosen among.
pub const MAX_SUFFIX_PARTS: usize = 32;

impl Snapshot {
    /// Reads a snapshot file (plain, gzip, xz or zstd).
    pub fn open(path: &Path) -> Result<Snapshot, crate::Error> {
        load(path, &LoadOptions::default())
    }

    /// The text of an interned string.
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id.0 as usize).map_or("", |s| s)
    }

    /// The `cudaStream_t` of a trace entry, as an integer (0 = the default stream).
    pub fn stream(&self, e: &TraceEvent) -> i64 {
        self.streams.get(e.stream.0 as usize).copied().unwrap_or(0)
    }

    /// The rare fields of a trace entry (all empty when it has none).
    pub fn extra(&self, e: &TraceEvent) -> EventExtra {
        match e.extra {
            0 => EventExtra::default(),
            i => self
                .event_extras
                .get(i as usize - 1)
                .copied()
                .unwrap_or_default(),
        }
    }

    /// Devices that have trace events.
    pub fn devices_with_events(&self) -> impl Iterator<Item = u32> + '_ {
        self.traces
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(d, _)| d as u32)
    }

    /// Devices that appear in the trace or own a segment, in ascending order.
    pub fn devices(&self) -> Vec<u32> {
        let mut devs: Vec<u32> = self.devices_with_events().collect();
        devs.extend(self.segments.iter().map(|s| s.device));
        devs.sort_unstable();
        devs.dedup();
        devs
    }

    /// The events of one device (empty if none).
    pub fn trace(&self, device: u32) -> &[TraceEvent] {
        self.traces.get(device as usize).map_or(&[], |t| t)
    }

    /// Segments of one device.
    pub fn segments_of(&self, device: u32) -> impl Iterator<Item = &Segment> + '_ {
        self.segments.iter().filter(move |s| s.device == device)
    }

    /// A frame's file name shortened to the fewest trailing path components (at most
    /// [`MAX_SUFFIX_PARTS`], else the whole path) that no other
    /// file of the snapshot's frames ends with: `modeling_llama.py`, or `a/utils.py` and
    /// `b/utils.py` when both appear.
    pub fn short_file(&self, file: StrId) -> &str {
        let map = self.short_files.get_or_init(|| {
            let mut files: Vec<StrId> = (0..self.stacks.frame_count())
                .map(|i| self.stacks.frame(FrameId(i as u32)).filename)
                .collect();
            files.sort_unstable();
            files.dedup();
            let mut by_base: rustc_hash::FxHashMap<&str, Vec<StrId>> = Default::default();
            for &f in &files {
                let base = self.str(f).rsplit('/').next().unwrap_or("");
                by_base.entry(base).or_default().push(f);
            }
            let mut out = rustc_hash::FxHashMap::default();
            for (base, same) in by_base {
                if same.len() == 1 {
                    out.insert(same[0], base.to_string());
                    continue;
                }
                // Each file's path without empty parts, and where its last 1, 2, ... parts
                // start (at most MAX_SUFFIX_PARTS of them: a longer suffix is the whole path).
                let normal: Vec<String> = same
                    .iter()
                    .map(|&f| {
                        let parts: Vec<&str> =
                            self.str(f).split('/').filter(|p| !p.is_empty()).collect();
                        parts.join("/")
                    })
                    .collect();
                let starts = |p: &str| -> Vec<usize> {
                    let mut at = vec![p.rfind('/').map_or(0, |i| i + 1)];
                    for (i, _) in p.rmatch_indices('/').skip(1).take(MAX_SUFFIX_PARTS - 1) {
                        at.push(i + 1);
                    }
                    if at.len() < MAX_SUFFIX_PARTS && at.last() != Some(&0) {
                        at.push(0);
                    }
                    at
                };
                // How many files end with each suffix: the shortest one of a file that no other
                // file ends with is its name. Linear in the files and their depth, where
                // comparing every pair of a large group (10^5 files all named model.py) was not.
                let mut count: rustc_hash::FxHashMap<&str, u32> = Default::default();
                let all: Vec<Vec<usize>> = normal.iter().map(|p| starts(p)).collect();
                for (p, at) in normal.iter().zip(&all) {
                    for &i in at {
                        *count.entry(&p[i..]).or_default() += 1;
                    }
                }
                for ((p, at), &f) in normal.iter().zip(&all).zip(&same) {
                    let short = at
                        .iter()
                        .map(|&i| &p[i..])
                        .find(|s| count.get(s) == Some(&1))
                        .unwrap_or(p);
                    out.insert(f, short.to_string());
                }
            }
            out
        });
        map.get(&file)
            .map_or_else(|| self.str(file), |s| s.as_str())
    }
}

//! What the program asked of the allocator, read from a device's trace: each allocation with
//! its size and stream, each free, each deferred free completing, each `empty_cache()`, and
//! the request that failed. Everything the allocator did on its own (new segments, releases
//! before an out-of-memory retry, garbage collection) is left out: the simulation decides that
//! again under the settings it is given.

use crate::replay::{Replay, NONE, PREEXISTING};
use crate::snapshot::{Action, PoolId, SegmentType, Snapshot, TraceEvent, MAX_REAL_SIZE};

/// One request of the program, in trace order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// An allocation of `size` bytes on `stream`; `req` names it for its free.
    Alloc {
        /// Request id: the event index, or `events + k` for the k-th block from before.
        req: u32,
        /// Bytes asked for.
        size: u64,
        /// CUDA stream.
        stream: i64,
        /// Private pool ([`Program::pools`] index; 0 = the default pool).
        pool: u16,
    },
    /// The program freed `req`; with `now` the block returns to the cache at once, otherwise
    /// it waits for other streams until [`Op::Complete`].
    Free {
        /// The request freed.
        req: u32,
        /// Returned to the cache at once.
        now: bool,
    },
    /// A deferred free completes.
    Complete {
        /// The request.
        req: u32,
    },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A private pool was released (its graph reset, its `MemPool` destroyed): the recorded
    /// run gave back segments of that pool.
    ReleasePool {
        /// [`Program::pools`] index.
        pool: u16,
        /// Its cache went back at once (a `MemPool` going away), not in an `empty_cache()`
        /// or a release before a retry that follows.
        now: bool,
    },
    /// The request that failed in the recorded run (`size` is rounded).
    Fail {
        /// Rounded bytes.
        size: u64,
        /// CUDA stream.
        stream: i64,
        /// Private pool ([`Program::pools`] index).
        pool: u16,
    },
}

/// A block alive before the trace, to be allocated again when the simulation cannot start
/// from the recorded layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Before {
    /// Request id (`events + k`).
    pub req: u32,
    /// Bytes asked for (the block size when unknown).
    pub size: u64,
    /// CUDA stream.
    pub stream: i64,
    /// Private pool ([`Program::pools`] index).
    pub pool: u16,
}

/// One segment-level event of a run, recorded or simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentEvent {
    /// The trace event during which it happened.
    pub event: usize,
    /// `segment_alloc`, `segment_free`, `segment_map` or `segment_unmap`.
    pub action: Action,
    /// Bytes.
    pub size: u64,
}

/// The program's requests on one device, with what is needed to start simulating them.
#[derive(Clone, Debug)]
pub struct Program {
    /// Device ordinal.
    pub device: u32,
    /// Trace events.
    pub events: usize,
    /// Requests, each with the index of its trace event.
    pub ops: Vec<(usize, Op)>,
    /// Blocks alive before the trace, in address order.
    pub before: Vec<Before>,
    /// Segment events the recorded run made.
    pub recorded_segments: Vec<SegmentEvent>,
    /// Each segment at trace start with its stream and pool: `(stream, small, private pool)`.
    pub start_streams: Vec<(i64, bool, u16)>,
    /// The pools requests name (`pool_id`, torch after 2.11): index 0 is the default pool.
    pub pools: Vec<PoolId>,
    /// Whether private pools (CUDA graphs, `MemPool`) were in use while the trace carries no
    /// pool ids (torch 2.11 and older): their requests cannot be told apart, so they are
    /// simulated in the default pools.
    pub private_pools: bool,
    /// Where the recorded allocator was refused memory and released its cache to retry:
    /// `(first event of the releases, the request it was for, whether that size is already
    /// rounded)`.
    pub refusals: Vec<(usize, u64, bool)>,
}

impl Program {
    /// Reads the requests of the device that `replay` replayed.
    pub fn new(snap: &Snapshot, replay: &Replay) -> Program {
        let events = snap.trace(replay.device);
        let n = events.len();
        let req_of = |partner: u32| -> Option<u32> {
            if partner == NONE {
                None
            } else if partner & PREEXISTING != 0 {
                Some(n as u32 + (partner & !PREEXISTING))
            } else {
                Some(partner)
            }
        };
        let mut ops = Vec::with_capacity(n);
        let mut skip_completion = vec![false; n];
        let mut recorded_segments = Vec::new();
        let mut refusals = Vec::new();
        let mut pools = vec![PoolId::DEFAULT];
        let mut index = |id: PoolId| -> u16 {
            if !id.is_private() {
                return 0;
            }
            match pools.iter().position(|&p| p == id) {
                Some(k) => k as u16,
                None if pools.len() < u16::MAX as usize => {
                    pools.push(id);
                    (pools.len() - 1) as u16
                }
                None => 0,
            }
        };
        let no_completions = crate::replay::completes_on_request(events);
        let mut freed: rustc_hash::FxHashSet<u32> = Default::default();
        let mut i = 0;
        while i < n {
            let e = &events[i];
            match e.action {
                // An allocation the replay skipped (a size no GPU holds) is left out too.
                Action::Alloc if replay.bytes(i) != 0 => ops.push((
                    i,
                    Op::Alloc {
                        req: i as u32,
                        size: e.size,
                        stream: snap.stream(e),
                        pool: index(e.pool),
                    },
                )),
                Action::FreeRequested => {
                    if let Some(req) = req_of(replay.partner[i]) {
                        let paired = events.get(i + 1).is_some_and(|next| {
                            next.action == Action::FreeCompleted && next.addr == e.addr
                        });
                        if paired {
                            skip_completion[i + 1] = true;
                        }
                        let now = paired || no_completions;
                        if !now {
                            freed.insert(req);
                        }
                        ops.push((i, Op::Free { req, now }));
                    }
                }
                Action::FreeCompleted if !skip_completion[i] => {
                    if let Some(req) = req_of(replay.partner[i]) {
                        // without its free_requested (`skip_actions`), the free completes now
                        if freed.remove(&req) {
                            ops.push((i, Op::Complete { req }));
                        } else {
                            ops.push((i, Op::Free { req, now: true }));
                        }
                    }
                }
                Action::SegmentAlloc
                | Action::SegmentFree
                | Action::SegmentMap
                | Action::SegmentUnmap => {
                    let end = segment_run_end(events, i);
                    for (k, s) in events.iter().enumerate().take(end).skip(i) {
                        recorded_segments.push(SegmentEvent {
                            event: k,
                            action: s.action,
                            size: s.size,
                        });
                    }
                    let frees = |e: &&TraceEvent| {
                        matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)
                    };
                    // A private pool that gives segments back was released first; alone, and
                    // not in `empty_cache()`, it gave them back itself.
                    let default_frees = events[i..end]
                        .iter()
                        .filter(frees)
                        .any(|e| !e.pool.is_private());
                    let emptied = is_empty_cache(snap, events, i, end);
                    let mut released: Vec<u16> = Vec::new();
                    for e in events[i..end].iter().filter(frees) {
                        let p = index(e.pool);
                        if p != 0 && !released.contains(&p) {
                            released.push(p);
                            let now = !emptied && !default_frees;
                            ops.push((i, Op::ReleasePool { pool: p, now }));
                        }
                    }
                    if emptied {
                        ops.push((i, Op::EmptyCache));
                    } else if default_frees {
                        let request = events[end..].iter().find_map(|e| match e.action {
                            Action::Alloc => Some((e.size, false)),
                            Action::Oom => Some((e.size, true)),
                            _ => None,
                        });
                        if let Some((size, rounded)) = request {
                            refusals.push((i, size.min(MAX_REAL_SIZE), rounded));
                        }
                    }
                    i = end;
                    continue;
                }
                Action::Oom => ops.push((
                    i,
                    Op::Fail {
                        size: e.size.min(MAX_REAL_SIZE),
                        stream: snap.stream(e),
                        pool: index(e.pool),
                    },
                )),
                _ => {}
            }
            i += 1;
        }
        let start_streams = start_streams(snap, replay, &mut index);
        let before = before_blocks(replay, n, &start_streams);
        let carries_pools = events.iter().any(|e| e.pool != PoolId::UNKNOWN);
        Program {
            device: replay.device,
            events: n,
            ops,
            before,
            recorded_segments,
            start_streams,
            private_pools: !carries_pools
                && snap.segments_of(replay.device).any(|s| s.pool_id != (0, 0)),
            pools,
            refusals,
        }
    }
}

/// The end (exclusive) of the run of segment events starting at `i`.
fn segment_run_end(events: &[TraceEvent], i: usize) -> usize {
    let mut end = i;
    while end < events.len()
        && matches!(
            events[end].action,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        )
    {
        end += 1;
    }
    end
}

/// Whether the releases in `events[i..end]` are the program's `empty_cache()` rather than the
/// allocator's own (before an out-of-memory retry, or garbage collection): their stack names
/// `empty_cache`; or, without stacks, nothing in the allocator follows them (no new segment,
/// no failure).
fn is_empty_cache(snap: &Snapshot, events: &[TraceEvent], i: usize, end: usize) -> bool {
    let releases = events[i..end]
        .iter()
        .filter(|e| matches!(e.action, Action::SegmentFree | Action::SegmentUnmap));
    let mut any = false;
    let mut framed = false;
    for e in releases {
        any = true;
        for f in snap.stacks.frames(e.stack) {
            framed = true;
            if snap.str(f.name).contains("empty_cache") || snap.str(f.name).contains("emptyCache") {
                return true;
            }
        }
    }
    if !any || framed {
        return false;
    }
    let grows = events[i..end]
        .iter()
        .any(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap));
    !grows && events.get(end).is_none_or(|e| e.action != Action::Oom)
}

/// The stream, whether small, and private pool of each segment at trace start, in the
/// replay's order.
fn start_streams(
    snap: &Snapshot,
    replay: &Replay,
    index: &mut impl FnMut(PoolId) -> u16,
) -> Vec<(i64, bool, u16)> {
    replay
        .start_layout
        .iter()
        .map(|seg| match seg.origin(snap, replay.device) {
            (Some(s), _) => (
                s.stream,
                s.segment_type == SegmentType::Small,
                index(PoolId::pack(s.pool_id)),
            ),
            (None, release) => (
                release.map_or(0, |e| snap.stream(e)),
                !seg.expandable && seg.size == 2 << 20,
                release.map_or(0, |e| index(e.pool)),
            ),
        })
        .collect()
}

/// The blocks alive before the trace, in address order.
fn before_blocks(replay: &Replay, n: usize, streams: &[(i64, bool, u16)]) -> Vec<Before> {
    let mut out = Vec::new();
    for (seg, &(stream, _, pool)) in replay.start_layout.iter().zip(streams) {
        for b in &seg.blocks {
            if let Some(k) = b.preexisting {
                if replay.preexisting.get(k).is_some_and(|p| p.live) {
                    out.push(Before {
                        req: (n + k) as u32,
                        size: if b.requested > 0 { b.requested } else { b.size },
                        stream,
                        pool,
                    });
                }
            }
        }
    }
    out
}

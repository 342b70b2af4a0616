//! Replay: memory over time, event by event, exactly as the caching allocator counted it.
//!
//! For each device the trace is replayed on a simulation of the allocator's segments and
//! blocks. That gives, after every event, the four figures PyTorch itself reports:
//!
//! - **allocated**: `torch.cuda.memory_allocated()`, the sum of live *block* sizes. A block is
//!   the rounded request, or a whole free block when the remainder would be too small to split
//!   ([`SizeRules`]). Added at `alloc`, removed at `free_requested`.
//! - **requested**: the bytes the program asked for (what PyTorch's viewer plots).
//! - **active**: allocated plus blocks freed but waiting for other streams (`free_completed`).
//! - **reserved**: `torch.cuda.memory_reserved()`, the sum of segments.
//!
//! The state before the first event is rebuilt from the snapshot: segment events are undone
//! from the end to find the segments at trace start; blocks alive then are those alive at the
//! end that the trace never touched, plus those whose free appears without its alloc (the ring
//! buffer wrapped, or recording started late). Replaying forward must then land exactly on the
//! snapshot's blocks: every live block at the same address with the same size. [`EndCheck`]
//! says whether it did, with figures.
//!
//! `SizeModel::Rounded` counts each request rounded to 512 bytes instead of its block, anchored
//! so that it ends at the snapshot's total: the simpler accounting other tools use.

mod allocator;
mod state;

pub use allocator::{SizeRules, MIN_BLOCK, SMALL_SIZE};

use crate::snapshot::{Action, BlockState, Snapshot, StackId, TraceEvent};
use state::{Blk, State, Use, NIL, PRE};

/// How bytes are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SizeModel {
    /// Block sizes, as `torch.cuda.memory_allocated()` counts them.
    #[default]
    Allocator,
    /// Each request rounded up to 512 bytes.
    Rounded,
}

/// No event: used for links that point nowhere.
pub const NONE: u32 = u32::MAX;

/// The four memory figures at one moment, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    /// Live block bytes (`memory_allocated()`).
    pub allocated: u64,
    /// Bytes requested by live allocations.
    pub requested: u64,
    /// Live and pending-free block bytes.
    pub active: u64,
    /// Segment bytes (`memory_reserved()`).
    pub reserved: u64,
}

/// The highest value of one figure and when it happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Peak {
    /// The value.
    pub bytes: u64,
    /// Index of the event after which it was first reached; `None` = before the first event.
    pub event: Option<usize>,
    /// Microseconds from the first event.
    pub time_offset_us: i64,
}

/// Peaks of the four figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Peaks {
    /// Peak allocated bytes.
    pub allocated: Peak,
    /// Peak requested bytes.
    pub requested: Peak,
    /// Peak active bytes.
    pub active: Peak,
    /// Peak reserved bytes.
    pub reserved: Peak,
}

/// Whether the trace holds the whole history since recording started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct History {
    /// `free_requested` events of blocks allocated before the first event.
    pub frees_without_alloc: u64,
    /// `segment_free`/`segment_unmap` events of segments created before the first event.
    pub segment_frees_without_alloc: u64,
    /// No event refers to an allocation the trace does not hold.
    pub complete: bool,
    /// The ring buffer most likely dropped the oldest events: the snapshot says so, or the trace
    /// is incomplete and holds a round number of events (a `max_entries` setting).
    pub wrapped: bool,
}

/// Did the replay land exactly on the snapshot's state?
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EndCheck {
    /// Every live block matched, and allocated and reserved totals are equal.
    pub consistent: bool,
    /// Allocated bytes at the end of the replay.
    pub replayed_allocated: u64,
    /// Allocated bytes according to the snapshot's blocks.
    pub snapshot_allocated: u64,
    /// Reserved bytes at the end of the replay.
    pub replayed_reserved: u64,
    /// Reserved bytes according to the snapshot's segments.
    pub snapshot_reserved: u64,
    /// Live blocks that differ (missing, extra, or another size).
    pub block_mismatches: u64,
    /// Events the simulation could not place (an alloc on no free block, a free of no block).
    pub anomalies: u64,
    /// A few mismatches, described.
    pub examples: Vec<String>,
}

/// An allocation that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Oom {
    /// Index of the `oom` event.
    pub event: usize,
    /// Bytes requested by the failing allocation.
    pub requested: u64,
    /// Free bytes the device reported.
    pub device_free: u64,
    /// Allocated bytes when it failed.
    pub allocated: u64,
    /// Reserved bytes when it failed.
    pub reserved: u64,
}

/// A block that was alive before the first event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preexisting {
    /// Address.
    pub addr: u64,
    /// Bytes counted for it.
    pub size: u64,
    /// Requested bytes, where known.
    pub requested: u64,
    /// Allocation stack from the snapshot's block, or the stack of its free.
    pub stack: StackId,
    /// Index of its `free_requested`, or [`NONE`] if still alive at the end.
    pub freed_at: u32,
    /// Allocated (not already freed and waiting for other streams) at trace start.
    pub live: bool,
}

/// The replay of one device's trace.
#[derive(Clone, Debug)]
pub struct Replay {
    /// Device ordinal.
    pub device: u32,
    /// How bytes were counted.
    pub model: SizeModel,
    /// Allocated bytes after each event.
    pub allocated: Vec<u64>,
    /// Reserved bytes as `(event, bytes after it)` for each event that changed them, in order
    /// (segments change rarely, so this is much shorter than the trace).
    pub reserved_changes: Vec<(u32, u64)>,
    /// For `alloc` events: the bytes the allocation counts (block or rounded size); else 0.
    pub bytes: Vec<u64>,
    /// For `alloc`: index of its `free_requested` ([`NONE`] if alive at the end). For
    /// `free_requested`/`free_completed`: index of the `alloc`, or `PRE | k` for
    /// [`Replay::preexisting`]`[k]`, or [`NONE`].
    pub partner: Vec<u32>,
    /// Blocks alive before the first event.
    pub preexisting: Vec<Preexisting>,
    /// Figures before the first event.
    pub start: Totals,
    /// Figures after the last event.
    pub end: Totals,
    /// Peaks.
    pub peaks: Peaks,
    /// Completeness of the trace.
    pub history: History,
    /// Agreement with the snapshot's final state.
    pub check: EndCheck,
    /// Failed allocations.
    pub ooms: Vec<Oom>,
    /// Time of the first and last event (µs since the epoch; 0 if not recorded).
    pub time_span_us: (i64, i64),
}

/// Marks a `partner` value as an index into [`Replay::preexisting`].
pub const PREEXISTING: u32 = PRE;

impl Replay {
    /// Number of events.
    pub fn len(&self) -> usize {
        self.allocated.len()
    }

    /// True when the device has no events.
    pub fn is_empty(&self) -> bool {
        self.allocated.is_empty()
    }

    /// Allocated bytes after event `i`, or at trace start for `None`.
    pub fn allocated_at(&self, i: Option<usize>) -> u64 {
        i.map_or(self.start.allocated, |i| self.allocated[i])
    }

    /// Reserved bytes after event `i`, or at trace start for `None`.
    pub fn reserved_at(&self, i: Option<usize>) -> u64 {
        let Some(i) = i else {
            return self.start.reserved;
        };
        let n = self
            .reserved_changes
            .partition_point(|&(e, _)| e as usize <= i);
        if n == 0 {
            self.start.reserved
        } else {
            self.reserved_changes[n - 1].1
        }
    }

    /// Microseconds from the first event to event `i`.
    pub fn offset_us(&self, events: &[TraceEvent], i: usize) -> i64 {
        if self.time_span_us.0 == 0 {
            return 0;
        }
        events[i].time_us.saturating_sub(self.time_span_us.0).max(0)
    }
}

/// The size rules in force for a snapshot.
pub fn size_rules(snap: &Snapshot) -> SizeRules {
    match &snap.settings {
        Some(s) => SizeRules {
            divisions: s.roundup_power2_divisions,
            max_split_size: s.max_split_size,
            expandable_segments: s.expandable_segments,
        },
        None => SizeRules {
            expandable_segments: snap.segments.iter().any(|s| s.is_expandable)
                || snap
                    .traces
                    .iter()
                    .flatten()
                    .any(|e| e.action == Action::SegmentMap),
            ..SizeRules::default()
        },
    }
}

/// Replays every device that has events.
pub fn replay_all(snap: &Snapshot, model: SizeModel) -> Vec<Replay> {
    snap.devices_with_events()
        .map(|d| replay(snap, d, model))
        .collect()
}

/// Replays one device's trace.
pub fn replay(snap: &Snapshot, device: u32, model: SizeModel) -> Replay {
    Replayer::new(snap, device, model).run()
}

struct Replayer<'a> {
    snap: &'a Snapshot,
    events: &'a [TraceEvent],
    device: u32,
    model: SizeModel,
    rules: SizeRules,
    state: State,
    misplaced: u64,
}

impl<'a> Replayer<'a> {
    fn new(snap: &'a Snapshot, device: u32, model: SizeModel) -> Self {
        Replayer {
            snap,
            events: snap.trace(device),
            device,
            model,
            rules: size_rules(snap),
            state: State::default(),
            misplaced: 0,
        }
    }

    /// Segments at trace start: the snapshot's, with the trace's segment events undone.
    fn start_ranges(&mut self) -> u64 {
        for seg in self.snap.segments_of(self.device) {
            self.state
                .map_range(seg.address, seg.total_size, seg.is_expandable);
        }
        let mut orphan_frees = 0;
        for e in self.events.iter().rev() {
            match e.action {
                Action::SegmentAlloc => {
                    self.state.ranges.remove(&e.addr);
                }
                Action::SegmentFree => {
                    self.state.map_range(e.addr, e.size, false);
                }
                Action::SegmentMap => {
                    self.state.unmap_range(e.addr, e.size);
                }
                Action::SegmentUnmap => {
                    self.state.map_range(e.addr, e.size, true);
                }
                _ => {}
            }
        }
        // Segment frees whose segment existed before the trace.
        let mut created: rustc_hash::FxHashSet<u64> = Default::default();
        for e in self.events {
            match e.action {
                Action::SegmentAlloc => {
                    created.insert(e.addr);
                }
                Action::SegmentFree if !created.contains(&e.addr) => orphan_frees += 1,
                _ => {}
            }
        }
        orphan_frees
    }

    /// Blocks alive before the first event.
    fn start_blocks(&mut self) -> (Vec<Preexisting>, u64) {
        let mut first: rustc_hash::FxHashMap<u64, usize> = Default::default();
        for (i, e) in self.events.iter().enumerate() {
            if matches!(
                e.action,
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted
            ) {
                first.entry(e.addr).or_insert(i);
            }
        }
        let mut pre = Vec::new();
        let mut frees_without_alloc = 0;
        // Frees whose alloc came before the first event.
        let mut by_first: Vec<(u64, usize)> = first.iter().map(|(&a, &i)| (a, i)).collect();
        by_first.sort_unstable_by_key(|&(_, i)| i);
        for (addr, i) in by_first {
            let e = &self.events[i];
            if e.action == Action::Alloc {
                continue;
            }
            if e.action == Action::FreeRequested {
                frees_without_alloc += 1;
            }
            let end_block = self.end_block(addr);
            // The block's real size is unknown; its rounded request is the best estimate.
            let size = self.rules.round(e.size);
            pre.push((
                addr,
                size,
                e.size,
                if e.stack != StackId::EMPTY {
                    e.stack
                } else {
                    end_block.map_or(StackId::EMPTY, |b| b.stack)
                },
                if e.action == Action::FreeCompleted {
                    Use::Pending
                } else {
                    Use::Live
                },
            ));
        }
        // Blocks alive at the end that no event touched.
        for seg in self.snap.segments_of(self.device) {
            for b in &seg.blocks {
                if b.state == BlockState::Inactive || first.contains_key(&b.address) {
                    continue;
                }
                let size = b.size;
                let state = if b.state == BlockState::ActivePendingFree {
                    Use::Pending
                } else {
                    Use::Live
                };
                pre.push((b.address, size, b.requested_size, b.stack, state));
            }
        }
        let mut out = Vec::with_capacity(pre.len());
        let mut placed = Vec::with_capacity(pre.len());
        for (k, (addr, size, requested, stack, state)) in pre.into_iter().enumerate() {
            placed.push((
                addr,
                Blk {
                    size,
                    state,
                    requested,
                    origin: PRE | k as u32,
                    prev: NIL,
                    next: NIL,
                },
            ));
            out.push(Preexisting {
                addr,
                size,
                requested,
                stack,
                freed_at: NONE,
                live: state == Use::Live,
            });
        }
        self.misplaced = self.state.build(placed);
        (out, frees_without_alloc)
    }

    fn end_block(&self, addr: u64) -> Option<&crate::snapshot::Block> {
        self.snap
            .segments_of(self.device)
            .flat_map(|s| s.blocks.iter())
            .find(|b| b.address == addr && b.state != BlockState::Inactive)
    }

    fn run(mut self) -> Replay {
        let n = self.events.len();
        let segment_orphans = self.start_ranges();
        let (mut preexisting, frees_without_alloc) = self.start_blocks();
        let mut t = Totals {
            reserved: self.state.ranges.values().map(|r| r.size).sum(),
            ..Totals::default()
        };
        for b in self.state.blocks.values() {
            match b.state {
                Use::Live => {
                    t.allocated += b.size;
                    t.requested += b.requested;
                    t.active += b.size;
                }
                Use::Pending => t.active += b.size,
                Use::Free => {}
            }
        }
        let start = t;
        let mut allocated = Vec::with_capacity(n);
        let mut reserved_changes = Vec::new();
        let mut bytes = vec![0u64; n];
        let mut partner = vec![NONE; n];
        let mut peaks = Peaks {
            allocated: Peak {
                bytes: t.allocated,
                ..Peak::default()
            },
            requested: Peak {
                bytes: t.requested,
                ..Peak::default()
            },
            active: Peak {
                bytes: t.active,
                ..Peak::default()
            },
            reserved: Peak {
                bytes: t.reserved,
                ..Peak::default()
            },
        };
        let mut ooms = Vec::new();
        let mut anomalies = self.misplaced;
        let t0 = self.events.iter().map(|e| e.time_us).find(|&t| t != 0);
        let t0 = t0.unwrap_or(0);

        for (i, e) in self.events.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    let rounded = self.rules.round(e.size);
                    let size = self.allocate(e.addr, rounded, e.size, i as u32, &mut anomalies);
                    let counted = match self.model {
                        SizeModel::Allocator => size,
                        SizeModel::Rounded => rounded,
                    };
                    bytes[i] = counted;
                    t.allocated += counted;
                    t.requested += e.size;
                    t.active += counted;
                }
                Action::FreeRequested => match self.state.blocks.get(&e.addr).copied() {
                    Some(b) if b.state == Use::Live => {
                        let counted = self.counted(&b);
                        t.allocated -= counted.min(t.allocated);
                        t.requested -= b.requested.min(t.requested);
                        partner[i] = b.origin;
                        link_free(&mut partner, &mut preexisting, b.origin, i);
                        if let Some(live) = self.state.blocks.get_mut(&e.addr) {
                            live.state = Use::Pending;
                        }
                    }
                    _ => anomalies += 1,
                },
                Action::FreeCompleted => {
                    let origin = match self.state.blocks.get(&e.addr) {
                        Some(b) if b.state != Use::Free => Some(*b),
                        _ => None,
                    };
                    match origin {
                        Some(b) => {
                            let counted = self.counted(&b);
                            if b.state == Use::Live {
                                // free_requested was not recorded (skip_actions)
                                t.allocated -= counted.min(t.allocated);
                                t.requested -= b.requested.min(t.requested);
                                link_free(&mut partner, &mut preexisting, b.origin, i);
                            }
                            t.active -= counted.min(t.active);
                            partner[i] = b.origin;
                            self.state.release(e.addr);
                        }
                        None => anomalies += 1,
                    }
                }
                Action::SegmentAlloc => {
                    self.state.map_range(e.addr, e.size, false);
                    self.state.blocks.insert(e.addr, Blk::free(e.size));
                    t.reserved += e.size;
                }
                Action::SegmentFree => {
                    self.state.ranges.remove(&e.addr);
                    self.state.drop_chain(e.addr, e.addr.saturating_add(e.size));
                    t.reserved -= e.size.min(t.reserved);
                }
                Action::SegmentMap => {
                    self.state.map_pages(e.addr, e.size);
                    t.reserved += e.size;
                }
                Action::SegmentUnmap => {
                    self.state.unmap_pages(e.addr, e.size);
                    t.reserved -= e.size.min(t.reserved);
                }
                Action::Oom => ooms.push(Oom {
                    event: i,
                    requested: e.size,
                    device_free: e.addr,
                    allocated: t.allocated,
                    reserved: t.reserved,
                }),
                Action::Snapshot | Action::Unknown => {}
            }
            let offset = if e.time_us != 0 { e.time_us - t0 } else { 0 };
            bump(&mut peaks.allocated, t.allocated, i, offset);
            bump(&mut peaks.requested, t.requested, i, offset);
            bump(&mut peaks.active, t.active, i, offset);
            bump(&mut peaks.reserved, t.reserved, i, offset);
            allocated.push(t.allocated);
            let last = reserved_changes.last().map_or(start.reserved, |&(_, r)| r);
            if t.reserved != last {
                reserved_changes.push((i as u32, t.reserved));
            }
        }

        let mut replay = Replay {
            device: self.device,
            model: self.model,
            allocated,
            reserved_changes,
            bytes,
            partner,
            preexisting,
            start,
            end: t,
            peaks,
            history: History {
                frees_without_alloc,
                segment_frees_without_alloc: segment_orphans,
                complete: frees_without_alloc == 0 && segment_orphans == 0,
                wrapped: self.wrapped(frees_without_alloc + segment_orphans),
            },
            check: EndCheck::default(),
            ooms,
            time_span_us: (
                t0,
                self.events
                    .iter()
                    .rev()
                    .map(|e| e.time_us)
                    .find(|&t| t != 0)
                    .unwrap_or(0),
            ),
        };
        replay.check = self.check_end(&replay, anomalies);
        if self.model == SizeModel::Rounded {
            anchor_at_end(&mut replay);
        }
        replay
    }

    fn wrapped(&self, orphans: u64) -> bool {
        if let Some(flag) = self.snap.settings.as_ref().and_then(|s| s.trace_overflowed) {
            return flag;
        }
        let n = self.events.len() as u64;
        orphans > 0 && n >= 1000 && (n.is_multiple_of(1000) || n.is_power_of_two())
    }

    /// The bytes a simulated block counts for under the chosen model.
    fn counted(&self, b: &Blk) -> u64 {
        match self.model {
            SizeModel::Allocator => b.size,
            SizeModel::Rounded => {
                if b.origin & PRE != 0 {
                    b.size
                } else {
                    self.rules.round(b.requested)
                }
            }
        }
    }

    /// Hands out the block at `addr` for a request; returns the block size.
    fn allocate(
        &mut self,
        addr: u64,
        rounded: u64,
        requested: u64,
        event: u32,
        anomalies: &mut u64,
    ) -> u64 {
        let free_here = |st: &State| st.blocks.get(&addr).is_some_and(|b| b.state == Use::Free);
        if !free_here(&self.state) {
            // The allocator always hands out the start of a free block; recover if the
            // simulation disagrees (only inconsistent input gets here).
            *anomalies += 1;
            match self.state.containing(addr) {
                Some(s) if s != addr && self.state.blocks[&s].state == Use::Free => {
                    self.state.split(s, addr - s);
                }
                _ => {
                    let mut b = Blk::free(rounded);
                    b.state = Use::Live;
                    b.requested = requested;
                    b.origin = event;
                    self.state.blocks.insert(addr, b);
                    return rounded;
                }
            }
        }
        let available = self.state.blocks[&addr].size;
        if available < rounded {
            *anomalies += 1;
        }
        let size = if available > rounded && self.rules.splits(available, rounded) {
            self.state.split(addr, rounded);
            rounded
        } else {
            available
        };
        let b = self.state.blocks.get_mut(&addr).expect("present");
        b.state = Use::Live;
        b.requested = requested;
        b.origin = event;
        size
    }

    fn check_end(&self, replay: &Replay, anomalies: u64) -> EndCheck {
        let mut check = EndCheck {
            replayed_allocated: replay.end.allocated,
            replayed_reserved: replay.end.reserved,
            anomalies,
            ..EndCheck::default()
        };
        let mut expected: rustc_hash::FxHashMap<u64, (u64, BlockState)> = Default::default();
        for seg in self.snap.segments_of(self.device) {
            check.snapshot_reserved += seg.total_size;
            for b in &seg.blocks {
                if b.state != BlockState::Inactive {
                    expected.insert(b.address, (b.size, b.state));
                    if b.state == BlockState::ActiveAllocated {
                        check.snapshot_allocated += b.size;
                    }
                }
            }
        }
        let mut seen = 0usize;
        let mut live: Vec<(u64, Blk)> = self
            .state
            .blocks
            .iter()
            .filter(|(_, b)| b.state != Use::Free)
            .map(|(&a, &b)| (a, b))
            .collect();
        live.sort_unstable_by_key(|&(a, _)| a);
        for (addr, b) in &live {
            let addr = *addr;
            if b.state == Use::Free {
                continue;
            }
            match expected.get(&addr) {
                Some(&(size, _)) if size == b.size => seen += 1,
                Some(&(size, _)) => {
                    seen += 1;
                    check.block_mismatches += 1;
                    if check.examples.len() < 5 {
                        check.examples.push(format!(
                            "block {addr:#x}: replay has {} bytes, snapshot {size}",
                            b.size
                        ));
                    }
                }
                None => {
                    check.block_mismatches += 1;
                    if check.examples.len() < 5 {
                        check.examples.push(format!(
                            "block {addr:#x} ({} bytes) is live in the replay, not in the snapshot",
                            b.size
                        ));
                    }
                }
            }
        }
        let missing = expected.len() - seen;
        check.block_mismatches += missing as u64;
        if missing > 0 && check.examples.len() < 5 {
            check.examples.push(format!(
                "{missing} live block(s) of the snapshot never appear in the replay"
            ));
        }
        let allocated_ok = match self.model {
            SizeModel::Allocator => check.replayed_allocated == check.snapshot_allocated,
            SizeModel::Rounded => true,
        };
        check.consistent = check.block_mismatches == 0
            && allocated_ok
            && check.replayed_reserved == check.snapshot_reserved;
        check
    }
}

fn bump(peak: &mut Peak, value: u64, i: usize, offset: i64) {
    if value > peak.bytes {
        *peak = Peak {
            bytes: value,
            event: Some(i),
            time_offset_us: offset,
        };
    }
}

fn link_free(partner: &mut [u32], pre: &mut [Preexisting], origin: u32, free_event: usize) {
    if origin & PRE != 0 {
        if let Some(p) = pre.get_mut((origin & !PRE) as usize) {
            p.freed_at = free_event as u32;
        }
    } else if let Some(p) = partner.get_mut(origin as usize) {
        *p = free_event as u32;
    }
}

/// Shifts a rounded-size replay so that it ends at the snapshot's allocated total.
fn anchor_at_end(replay: &mut Replay) {
    let target = replay.check.snapshot_allocated as i128;
    let delta = target - replay.end.allocated as i128;
    let shift = |v: u64| (v as i128 + delta).max(0) as u64;
    for v in &mut replay.allocated {
        *v = shift(*v);
    }
    replay.start.allocated = shift(replay.start.allocated);
    replay.end.allocated = shift(replay.end.allocated);
    replay.peaks.allocated.bytes = shift(replay.peaks.allocated.bytes);
    for o in &mut replay.ooms {
        o.allocated = shift(o.allocated);
    }
    replay.check.replayed_allocated = replay.end.allocated;
}

#[cfg(test)]
mod tests;

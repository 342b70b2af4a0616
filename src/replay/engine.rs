//! The replay engine: rebuilds the allocator's state at trace start from the snapshot, then
//! applies the trace event by event, recording the figures after each.

use super::state::{Blk, State, Use, NIL, PRE};
use super::*;
use crate::snapshot::{BlockState, TraceEvent, MAX_REAL_SIZE, MAX_REAL_TOTAL};

/// What the replay records while it runs.
struct Recording {
    t: Totals,
    allocated: Vec<u64>,
    requested: Requested,
    reserved_changes: Vec<(u32, u64)>,
    partner: Vec<u32>,
    preexisting: Vec<Preexisting>,
    ooms: Vec<Oom>,
    anomalies: u64,
    /// The first events whose size no GPU could hold (skipped).
    oversized: Vec<(usize, u64)>,
    peaks: Peaks,
}

impl Recording {
    fn new(n: usize, start: Totals, preexisting: Vec<Preexisting>, anomalies: u64) -> Recording {
        let at_start = |bytes| Peak {
            bytes,
            ..Peak::default()
        };
        Recording {
            t: start,
            allocated: Vec::with_capacity(n),
            requested: Requested::with_capacity(n),
            reserved_changes: Vec::new(),
            partner: vec![NONE; n],
            preexisting,
            ooms: Vec::new(),
            anomalies,
            oversized: Vec::new(),
            peaks: Peaks {
                allocated: at_start(start.allocated),
                requested: at_start(start.requested),
                active: at_start(start.active),
                reserved: at_start(start.reserved),
            },
        }
    }

    /// Records the figures after event `i`.
    fn close_event(&mut self, i: usize, offset: i64, start_reserved: u64) {
        let t = self.t;
        bump(&mut self.peaks.allocated, t.allocated, i, offset);
        bump(&mut self.peaks.requested, t.requested, i, offset);
        bump(&mut self.peaks.active, t.active, i, offset);
        bump(&mut self.peaks.reserved, t.reserved, i, offset);
        self.requested
            .push(&self.allocated, t.allocated, t.requested);
        self.allocated.push(t.allocated);
        let last = self
            .reserved_changes
            .last()
            .map_or(start_reserved, |&(_, r)| r);
        if t.reserved != last {
            self.reserved_changes.push((i as u32, t.reserved));
        }
    }
}

/// Whether a trace was recorded without `free_completed` (`skip_actions=["free_completed"]`,
/// torch 2.10+): it has frees, no completion, and an address allocated again after a free
/// (only a completed free gives a block back). Its frees then complete at once. A trace whose
/// few frees all still wait for other streams has no such reuse.
pub(crate) fn completes_on_request(events: &[TraceEvent]) -> bool {
    if events.iter().any(|e| e.action == Action::FreeCompleted) {
        return false;
    }
    let mut freed: rustc_hash::FxHashSet<u64> = Default::default();
    for e in events {
        match e.action {
            Action::FreeRequested => {
                freed.insert(e.addr);
            }
            Action::Alloc if freed.contains(&e.addr) => return true,
            _ => {}
        }
    }
    false
}

/// The replay of one device: the simulated allocator state and the rules it follows.
pub(super) struct Replayer<'a> {
    snap: &'a Snapshot,
    events: &'a [TraceEvent],
    device: u32,
    model: SizeModel,
    rules: SizeRules,
    state: State,
    misplaced: u64,
    /// The trace records no `free_completed` (`skip_actions=["free_completed"]`): a block goes
    /// back to its segment when the program frees it.
    completes_on_request: bool,
}

impl<'a> Replayer<'a> {
    pub(super) fn new(snap: &'a Snapshot, device: u32, model: SizeModel) -> Self {
        let events = snap.trace(device);
        Replayer {
            snap,
            events,
            device,
            model,
            rules: size_rules(snap),
            state: State::default(),
            misplaced: 0,
            completes_on_request: completes_on_request(events),
        }
    }

    /// Segments at trace start: the snapshot's, with the trace's segment events undone. Also
    /// counts the frees of segments from before the trace, and says whether an allocation
    /// failed.
    fn start_ranges(&mut self) -> (u64, bool) {
        for seg in self.snap.segments_of(self.device) {
            self.state
                .map_range(seg.address, seg.total_size, seg.is_expandable);
        }
        let mut orphan_frees = 0;
        let mut has_oom = false;
        for e in self.events.iter().rev() {
            match e.action {
                Action::Oom => has_oom = true,
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
        (orphan_frees, has_oom)
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
        // the snapshot's live blocks by address, for the stacks of frees without an alloc
        let live_at_end: rustc_hash::FxHashMap<u64, StackId> = self
            .snap
            .segments_of(self.device)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| (b.address, b.stack))
            .collect();
        // Frees whose alloc came before the first event (only those are put in order).
        let mut by_first: Vec<(u64, usize)> = first
            .iter()
            .filter(|&(_, &i)| self.events[i].action != Action::Alloc)
            .map(|(&a, &i)| (a, i))
            .collect();
        by_first.sort_unstable_by_key(|&(_, i)| i);
        // recorded without free_requested (`skip_actions`): a completion is the free itself
        let no_requests = !self
            .events
            .iter()
            .any(|e| e.action == Action::FreeRequested);
        for (addr, i) in by_first {
            let e = &self.events[i];
            if e.action == Action::FreeRequested || no_requests {
                frees_without_alloc += 1;
            }
            let end_stack = live_at_end.get(&addr).copied();
            // The block's real size is unknown unless the file records it; otherwise its
            // rounded request is the best estimate.
            let surplus = self.snap.extra(e).block_surplus;
            let size = if surplus > 0 {
                e.size + u64::from(surplus)
            } else {
                self.rules.round(e.size)
            };
            pre.push((
                addr,
                size,
                e.size,
                if e.stack != StackId::EMPTY {
                    e.stack
                } else {
                    end_stack.unwrap_or(StackId::EMPTY)
                },
                if e.action == Action::FreeCompleted && !no_requests {
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

    /// Rebuilds the state at trace start: the work before the first event is replayed.
    pub(super) fn prepare(mut self) -> Prepared<'a> {
        let (segment_orphans, has_oom) = self.start_ranges();
        let (preexisting, frees_without_alloc) = self.start_blocks();
        let history = History {
            frees_without_alloc,
            segment_frees_without_alloc: segment_orphans,
            complete: frees_without_alloc == 0 && segment_orphans == 0,
            wrapped: self.wrapped(frees_without_alloc + segment_orphans),
        };
        Prepared {
            preview: Preview {
                device: self.device,
                history,
                has_oom,
            },
            replayer: self,
            preexisting,
        }
    }
}

/// A replay ready to run: the state at trace start rebuilt, what is known of the trace before
/// its events are replayed at hand.
pub struct Prepared<'a> {
    replayer: Replayer<'a>,
    preexisting: Vec<Preexisting>,
    preview: Preview,
}

impl Prepared<'_> {
    /// What is known of the trace before its events are replayed.
    pub fn preview(&self) -> Preview {
        self.preview
    }

    /// Replays every event from the state rebuilt for trace start.
    pub fn run(self) -> Replay {
        self.replayer.run(self.preexisting, self.preview.history)
    }
}

impl Replayer<'_> {
    /// Replays every event from the state [`Replayer::prepare`] rebuilt.
    fn run(mut self, preexisting: Vec<Preexisting>, history: History) -> Replay {
        let start = self.start_totals();
        let start_layout = self.start_layout();
        let mut rec = Recording::new(self.events.len(), start, preexisting, self.misplaced);
        // The earliest time, not the first: a clock that goes backwards (an anomaly the report
        // counts) must not make offsets negative.
        let t0 = self
            .events
            .iter()
            .map(|e| e.time_us)
            .filter(|&t| t != 0)
            .min();
        let t0 = t0.unwrap_or(0);
        for (i, e) in self.events.iter().enumerate() {
            self.apply(i, e, &mut rec);
            let offset = if e.time_us != 0 {
                e.time_us.saturating_sub(t0)
            } else {
                0
            };
            rec.close_event(i, offset, start.reserved);
        }
        let t_end = self
            .events
            .iter()
            .map(|e| e.time_us)
            .filter(|&t| t != 0)
            .max()
            .unwrap_or(0);
        let anomalies = rec.anomalies;
        let oversized = std::mem::take(&mut rec.oversized);
        let mut replay = Replay {
            device: self.device,
            model: self.model,
            allocated: rec.allocated,
            requested: rec.requested,
            reserved_changes: rec.reserved_changes,
            kept_bytes: None,
            partner: rec.partner,
            preexisting: rec.preexisting,
            start,
            end: rec.t,
            peaks: rec.peaks,
            history,
            check: EndCheck::default(),
            ooms: rec.ooms,
            time_span_us: (t0, t_end),
            start_layout,
        };
        replay.check = self.check_end(&replay, anomalies);
        for (i, size) in oversized {
            replay.check.consistent = false;
            replay.check.examples.push(format!(
                "event {i}: {} of {size} bytes, more than any GPU holds (over 2^48): skipped, \
                 as the allocator would have refused it",
                self.events[i].action.as_str()
            ));
        }
        // a trace that starts from an empty allocator needs no anchor: its rounded series
        // starts at 0 like the allocator's, and nothing is left over for the memory before it
        if self.model == SizeModel::Rounded && replay.preexisting.iter().any(|p| p.live) {
            anchor_at_end(&mut replay);
        }
        replay
    }

    /// The segments and blocks rebuilt for trace start.
    fn start_layout(&self) -> Vec<StartSegment> {
        let mut by_address: Vec<(u64, Blk)> =
            self.state.blocks.iter().map(|(&a, &b)| (a, b)).collect();
        by_address.sort_unstable_by_key(|&(a, _)| a);
        self.state
            .ranges
            .iter()
            .map(|(&address, range)| {
                let end = address.saturating_add(range.size);
                let first = by_address.partition_point(|&(a, _)| a < address);
                let blocks = by_address[first..]
                    .iter()
                    .take_while(|&&(a, _)| a < end)
                    .map(|&(a, b)| StartBlock {
                        address: a,
                        size: b.size,
                        requested: b.requested,
                        preexisting: (b.state != Use::Free && b.origin & PRE != 0)
                            .then_some((b.origin & !PRE) as usize),
                    })
                    .collect();
                StartSegment {
                    address,
                    size: range.size,
                    expandable: range.expandable,
                    blocks,
                }
            })
            .collect()
    }

    /// The four figures of the state rebuilt for trace start.
    fn start_totals(&self) -> Totals {
        let mut t = Totals {
            reserved: self
                .state
                .ranges
                .values()
                .fold(0u64, |sum, r| sum.saturating_add(r.size)),
            ..Totals::default()
        };
        for b in self.state.blocks.values() {
            match b.state {
                Use::Live => {
                    t.allocated = t.allocated.saturating_add(b.size);
                    t.requested = t.requested.saturating_add(b.requested);
                    t.active = t.active.saturating_add(b.size);
                }
                Use::Pending => t.active = t.active.saturating_add(b.size),
                Use::Free => {}
            }
        }
        t
    }

    /// Applies one event to the simulated state and the running figures.
    fn apply(&mut self, i: usize, e: &TraceEvent, rec: &mut Recording) {
        let grows = matches!(
            e.action,
            Action::Alloc | Action::SegmentAlloc | Action::SegmentMap
        );
        let total = match e.action {
            Action::Alloc => rec.t.allocated,
            _ => rec.t.reserved,
        };
        if grows && (e.size > MAX_REAL_SIZE || total.saturating_add(e.size) > MAX_REAL_TOTAL) {
            rec.anomalies += 1;
            if rec.oversized.len() < 3 {
                rec.oversized.push((i, e.size));
            }
            return;
        }
        let t = &mut rec.t;
        match e.action {
            Action::Alloc => {
                let rounded = self.rules.round(e.size);
                let size = self.allocate(e.addr, rounded, e.size, i as u32, &mut rec.anomalies);
                let counted = match self.model {
                    SizeModel::Allocator => size,
                    SizeModel::Rounded => rounded,
                };
                t.allocated = t.allocated.saturating_add(counted);
                t.requested = t.requested.saturating_add(e.size);
                t.active = t.active.saturating_add(counted);
            }
            Action::FreeRequested => match self.state.blocks.get_mut(&e.addr) {
                Some(live) if live.state == Use::Live => {
                    live.state = Use::Pending;
                    let b = *live;
                    let counted = self.counted(&b);
                    t.allocated -= counted.min(t.allocated);
                    t.requested -= b.requested.min(t.requested);
                    rec.partner[i] = b.origin;
                    link_free(&mut rec.partner, &mut rec.preexisting, b.origin, i);
                    if self.completes_on_request {
                        t.active -= counted.min(t.active);
                        self.state.release(e.addr);
                    }
                }
                _ => rec.anomalies += 1,
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
                            link_free(&mut rec.partner, &mut rec.preexisting, b.origin, i);
                        }
                        t.active -= counted.min(t.active);
                        rec.partner[i] = b.origin;
                        self.state.release(e.addr);
                    }
                    None => rec.anomalies += 1,
                }
            }
            Action::SegmentAlloc => {
                self.state.map_range(e.addr, e.size, false);
                self.state.put(e.addr, Blk::free(e.size));
                t.reserved = t.reserved.saturating_add(e.size);
            }
            Action::SegmentFree => {
                self.state.ranges.remove(&e.addr);
                self.state.drop_chain(e.addr, e.addr.saturating_add(e.size));
                t.reserved -= e.size.min(t.reserved);
            }
            Action::SegmentMap => {
                self.state.map_pages(e.addr, e.size);
                t.reserved = t.reserved.saturating_add(e.size);
            }
            Action::SegmentUnmap => {
                self.state.unmap_pages(e.addr, e.size);
                t.reserved -= e.size.min(t.reserved);
            }
            Action::Oom => rec.ooms.push(Oom {
                event: i,
                requested: e.size,
                device_free: e.addr,
                allocated: t.allocated,
                reserved: t.reserved,
            }),
            Action::Snapshot | Action::Annotate | Action::Unknown => {}
        }
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
                    self.state.put(addr, b);
                    return rounded;
                }
            }
        }
        let free = self.state.blocks[&addr];
        let available = free.size;
        if available < rounded {
            *anomalies += 1;
        }
        let splits = available > rounded && self.rules.splits(available, rounded);
        // (a split after 0 bytes cuts nothing off)
        let tail = (splits && rounded > 0).then(|| self.state.add_tail(addr, free, rounded));
        let b = self.state.blocks.get_mut(&addr).expect("present");
        if let Some(tail) = tail {
            b.size = rounded;
            b.next = tail;
        }
        let size = if splits { rounded } else { available };
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
    // the requested figures are held against the allocated ones, which move: made whole first
    let requested = std::mem::replace(&mut replay.requested, Requested::Whole(Vec::new()));
    replay.requested = Requested::Whole(requested.into_whole(&replay.allocated));
    // a shift that cuts a figure at zero loses the rise of the events there: their bytes are
    // kept first
    let lowest = replay.allocated.iter().copied().min().unwrap_or(0);
    if (lowest.min(replay.start.allocated) as i128) + delta < 0 {
        replay.kept_bytes = Some((0..replay.len()).map(|i| replay.bytes(i)).collect());
    }
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

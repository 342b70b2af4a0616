//! `memsnap trim`: one device's events inside a window, with the segments and blocks as they
//! stood at the window's end.
//!
//! The layout at the window's end comes from the replay: segments are the ranges reserved at
//! trace start with the segment events up to the window's end applied; live blocks are the
//! allocations made before the end and not yet freed by it (with their block sizes, and
//! `active_pending_free` when the program freed them but other streams still held them); the
//! rest of each segment is free, as the caching allocator keeps it (free neighbours always
//! merge). Replaying the trimmed file therefore lands exactly on its own final state, and every
//! figure inside the window equals the original's; what was live before the window shows as
//! allocated before recording.

use std::collections::BTreeMap;
use std::io::{self, Write};

use rustc_hash::FxHashMap;

use crate::pickle::PickleWriter;
use crate::replay::{Replay, NONE, PREEXISTING};
use crate::snapshot::{Action, BlockState, SegmentType, Snapshot, StackId, TraceEvent};

/// The events kept: `from..to` of one device's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Device ordinal.
    pub device: u32,
    /// First event kept.
    pub from: usize,
    /// One past the last event kept.
    pub to: usize,
}

/// What the trimmed file holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Trimmed {
    /// Trace events written.
    pub events: usize,
    /// Segments written.
    pub segments: usize,
    /// Blocks live (allocated or pending free) at the window's end.
    pub live_blocks: usize,
    /// Live blocks at the window's end that fall in no segment (an inconsistent trace); left out.
    pub blocks_outside_segments: usize,
    /// Annotations inside the window's time span.
    pub annotations: usize,
}

/// A block at the window's end.
#[derive(Clone, Copy, Debug)]
struct LiveBlock {
    address: u64,
    size: u64,
    requested: u64,
    stack: StackId,
    state: BlockState,
}

/// A segment range at the window's end.
#[derive(Clone, Copy, Debug)]
struct Range {
    size: u64,
    expandable: bool,
    /// Stream and stack of the event that made it, when the trace has it.
    origin: Option<(i64, StackId)>,
}

/// Segments (address → range) at the window's end.
fn segments_at_end(
    snap: &Snapshot,
    replay: &Replay,
    trace: &[TraceEvent],
    to: usize,
) -> BTreeMap<u64, Range> {
    let mut ranges: BTreeMap<u64, Range> = replay
        .start_layout
        .iter()
        .map(|s| {
            let range = Range {
                size: s.size,
                expandable: s.expandable,
                origin: None,
            };
            (s.address, range)
        })
        .collect();
    for ev in &trace[..to] {
        let origin = Some((snap.stream(ev), ev.stack));
        match ev.action {
            Action::SegmentAlloc => {
                let range = Range {
                    size: ev.size,
                    expandable: false,
                    origin,
                };
                ranges.insert(ev.addr, range);
            }
            Action::SegmentFree => {
                ranges.remove(&ev.addr);
            }
            Action::SegmentMap => {
                let range = Range {
                    size: ev.size,
                    expandable: true,
                    origin,
                };
                ranges.insert(ev.addr, range);
            }
            Action::SegmentUnmap => unmap(&mut ranges, ev.addr, ev.size),
            _ => {}
        }
    }
    merge_expandable(ranges)
}

/// Removes `[addr, addr + size)` from the expandable ranges it overlaps (one unmap may span
/// several maps), keeping what lies outside it.
fn unmap(ranges: &mut BTreeMap<u64, Range>, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    let first = ranges
        .range(..=addr)
        .next_back()
        .filter(|(&base, r)| base + r.size > addr)
        .map_or(addr, |(&base, _)| base);
    let overlapping: Vec<(u64, Range)> = ranges
        .range(first..end)
        .map(|(&base, &r)| (base, r))
        .collect();
    for (base, range) in overlapping {
        ranges.remove(&base);
        if base < addr {
            let before = Range {
                size: addr - base,
                ..range
            };
            ranges.insert(base, before);
        }
        if base + range.size > end {
            let after = Range {
                size: base + range.size - end,
                ..range
            };
            ranges.insert(end, after);
        }
    }
}

/// Joins touching ranges of expandable segments into one, as a snapshot lists them.
fn merge_expandable(ranges: BTreeMap<u64, Range>) -> BTreeMap<u64, Range> {
    let mut out: BTreeMap<u64, Range> = BTreeMap::new();
    let mut last: Option<u64> = None;
    for (addr, range) in ranges {
        if let Some(base) = last {
            let prev = out.get_mut(&base).expect("last range was inserted");
            if prev.expandable && range.expandable && base + prev.size == addr {
                prev.size += range.size;
                continue;
            }
        }
        out.insert(addr, range);
        last = Some(addr);
    }
    out
}

/// Blocks live at the window's end, in address order.
fn blocks_at_end(replay: &Replay, trace: &[TraceEvent], to: usize) -> Vec<LiveBlock> {
    // free_completed of each allocation, by the allocation's partner key.
    let mut completed: FxHashMap<u32, usize> = FxHashMap::default();
    for (i, ev) in trace.iter().enumerate() {
        if ev.action == Action::FreeCompleted && replay.partner[i] != NONE {
            completed.insert(replay.partner[i], i);
        }
    }
    let state_at = |key: u32, freed_at: u32, live_at_start: bool| -> Option<BlockState> {
        let requested_free = live_at_start && freed_at != NONE && (freed_at as usize) < to;
        let returned = completed.get(&key).is_some_and(|&c| c < to);
        if !live_at_start || requested_free {
            // Freed by the program: pending until its free_completed, if it has one.
            let has_completion = completed.contains_key(&key);
            (has_completion && !returned).then_some(BlockState::ActivePendingFree)
        } else {
            Some(BlockState::ActiveAllocated)
        }
    };
    let mut blocks = Vec::new();
    for (k, p) in replay.preexisting.iter().enumerate() {
        if let Some(state) = state_at(PREEXISTING | k as u32, p.freed_at, p.live) {
            blocks.push(LiveBlock {
                address: p.addr,
                size: p.size,
                requested: p.requested,
                stack: p.stack,
                state,
            });
        }
    }
    for (i, ev) in trace[..to].iter().enumerate() {
        if ev.action != Action::Alloc {
            continue;
        }
        if let Some(state) = state_at(i as u32, replay.partner[i], true) {
            blocks.push(LiveBlock {
                address: ev.addr,
                size: replay.bytes(i),
                requested: ev.size,
                stack: ev.stack,
                state,
            });
        }
    }
    blocks.sort_by_key(|b| b.address);
    blocks
}

/// For a free of a block allocated before the window: the block's size, which the trimmed file
/// records (`block_size`) because the allocation that told it is cut away.
fn freed_block_size(replay: &Replay, i: usize, from: usize) -> Option<u64> {
    let p = replay.partner[i];
    if p == NONE {
        return None;
    }
    if p & PREEXISTING != 0 {
        return replay
            .preexisting
            .get((p & !PREEXISTING) as usize)
            .map(|b| b.size);
    }
    let alloc = p as usize;
    (alloc < from && alloc < i).then(|| replay.bytes(alloc))
}

/// Writes the trimmed snapshot of `window` as a protocol-2 pickle.
pub fn write<W: Write>(
    snap: &Snapshot,
    replay: &Replay,
    window: Window,
    out: W,
) -> io::Result<Trimmed> {
    let trace = snap.trace(window.device);
    let (from, to) = (window.from.min(trace.len()), window.to.min(trace.len()));
    let ranges = segments_at_end(snap, replay, trace, to);
    let blocks = blocks_at_end(replay, trace, to);
    let mut writer = SnapshotWriter::new(snap, out)?;
    let mut summary = Trimmed {
        events: to.saturating_sub(from),
        segments: ranges.len(),
        live_blocks: blocks.len(),
        ..Trimmed::default()
    };
    let w = &mut writer;
    // pinned host memory is written as the host lists it came from, beside empty device ones
    let host = window.device == crate::snapshot::HOST_DEVICE;
    w.pickle.begin_dict()?;
    if host {
        w.word("segments")?;
        w.pickle.begin_list()?;
        w.pickle.end_list()?;
        w.word("device_traces")?;
        w.pickle.begin_list()?;
        w.pickle.end_list()?;
    }
    w.word(if host { "host_segments" } else { "segments" })?;
    w.pickle.begin_list()?;
    let mut next = 0;
    for (&address, range) in &ranges {
        let end = address + range.size;
        while next < blocks.len() && blocks[next].address < address {
            summary.blocks_outside_segments += 1;
            next += 1;
        }
        let first = next;
        while next < blocks.len() && blocks[next].address + blocks[next].size <= end {
            next += 1;
        }
        w.segment(window.device, address, range, &blocks[first..next])?;
    }
    summary.blocks_outside_segments += blocks.len() - next;
    w.pickle.end_list()?;

    if host {
        w.word("host_traces")?;
        w.pickle.begin_list()?;
        for (i, ev) in trace.iter().enumerate().take(to).skip(from) {
            w.event(ev, freed_block_size(replay, i, from))?;
        }
        w.pickle.end_list()?;
    } else {
        w.word("device_traces")?;
        w.pickle.begin_list()?;
        for device in 0..=window.device {
            w.pickle.begin_list()?;
            if device == window.device {
                for (i, ev) in trace.iter().enumerate().take(to).skip(from) {
                    w.event(ev, freed_block_size(replay, i, from))?;
                }
            }
            w.pickle.end_list()?;
        }
        w.pickle.end_list()?;
    }

    if let Some(settings) = &snap.settings {
        w.word("allocator_settings")?;
        w.settings(settings)?;
    }
    let span = match (trace[from..to].first(), trace[from..to].last()) {
        (Some(a), Some(b)) => (a.time_us, b.time_us),
        _ => (i64::MAX, i64::MIN),
    };
    w.word("external_annotations")?;
    w.pickle.begin_list()?;
    for a in &snap.annotations {
        let device_matches = a.device < 0 || a.device == window.device as i64;
        if device_matches && a.time_us >= span.0 && a.time_us <= span.1 {
            summary.annotations += 1;
            w.pickle.begin_dict()?;
            w.word("version")?;
            w.pickle.int(1)?;
            w.word("name")?;
            w.str(a.name)?;
            w.word("stage")?;
            w.word(match a.stage {
                crate::snapshot::Stage::Start => "START",
                crate::snapshot::Stage::End => "END",
            })?;
            w.word("device")?;
            w.pickle.int(a.device.into())?;
            w.word("time_us")?;
            w.pickle.int(a.time_us.into())?;
            w.pickle.end_dict()?;
        }
    }
    w.pickle.end_list()?;
    w.pickle.end_dict()?;
    writer.pickle.finish()?;
    Ok(summary)
}

/// The pickle writer with the memo of strings, frames and stacks already written.
struct SnapshotWriter<'a, W: Write> {
    snap: &'a Snapshot,
    pickle: PickleWriter<W>,
    strings: FxHashMap<crate::pickle::StrId, u32>,
    frames: FxHashMap<u32, u32>,
    /// Stacks written: the events of one stack share its list, so a deep stack is written
    /// once however many events carry it.
    stacks: FxHashMap<StackId, u32>,
    /// Keys and fixed values (`"action"`, `"alloc"`, …), written once and referenced after.
    words: FxHashMap<&'static str, u32>,
}

impl<'a, W: Write> SnapshotWriter<'a, W> {
    fn new(snap: &'a Snapshot, out: W) -> io::Result<Self> {
        Ok(SnapshotWriter {
            snap,
            pickle: PickleWriter::new(out)?,
            strings: FxHashMap::default(),
            frames: FxHashMap::default(),
            stacks: FxHashMap::default(),
            words: FxHashMap::default(),
        })
    }

    /// A key or fixed value, written once and referenced after, as Python's pickle does with
    /// the interned strings of repeated dict keys.
    fn word(&mut self, w: &'static str) -> io::Result<()> {
        if let Some(&m) = self.words.get(w) {
            return self.pickle.get(m);
        }
        self.pickle.text(w)?;
        let m = self.pickle.put()?;
        self.words.insert(w, m);
        Ok(())
    }

    /// A string of the snapshot, written once and referenced after.
    fn str(&mut self, id: crate::pickle::StrId) -> io::Result<()> {
        if let Some(&m) = self.strings.get(&id) {
            return self.pickle.get(m);
        }
        self.pickle.text(self.snap.str(id))?;
        let m = self.pickle.put()?;
        self.strings.insert(id, m);
        Ok(())
    }

    /// A stack as PyTorch writes it: a list of `{filename, line, name}`, innermost first; each
    /// frame dict written once and referenced after, and so is each stack's list (the events
    /// of one stack share it, as a Python list reached twice is pickled once).
    fn frames(&mut self, stack: StackId) -> io::Result<()> {
        if let Some(&m) = self.stacks.get(&stack) {
            return self.pickle.get(m);
        }
        self.pickle.begin_list()?;
        for &id in self.snap.stacks.stack(stack) {
            if let Some(&m) = self.frames.get(&id.0) {
                self.pickle.get(m)?;
                continue;
            }
            let frame = self.snap.stacks.frame(id);
            self.pickle.begin_dict()?;
            self.word("filename")?;
            self.str(frame.filename)?;
            self.word("line")?;
            self.pickle.int(frame.line.into())?;
            self.word("name")?;
            self.str(frame.name)?;
            self.pickle.end_dict()?;
            let m = self.pickle.put()?;
            self.frames.insert(id.0, m);
        }
        self.pickle.end_list()?;
        let m = self.pickle.put()?;
        self.stacks.insert(stack, m);
        Ok(())
    }

    fn segment(
        &mut self,
        device: u32,
        address: u64,
        range: &Range,
        blocks: &[LiveBlock],
    ) -> io::Result<()> {
        let original = self
            .snap
            .segments_of(device)
            .find(|s| s.address <= address && address < s.address + s.total_size);
        let (stream, stack) = match (original, range.origin) {
            (Some(s), _) => (s.stream, s.stack),
            (None, Some(origin)) => origin,
            (None, None) => (0, StackId::EMPTY),
        };
        let segment_type = original.map_or(
            if range.size == 2 << 20 {
                SegmentType::Small
            } else {
                SegmentType::Large
            },
            |s| s.segment_type,
        );
        let pool = original.map_or((0, 0), |s| s.pool_id);
        let allocated: u64 = blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum();
        let active: u64 = blocks.iter().map(|b| b.size).sum();
        let requested: u64 = blocks.iter().map(|b| b.requested).sum();
        self.pickle.begin_dict()?;
        for (key, value) in [
            ("device", device as i128),
            ("address", address as i128),
            ("total_size", range.size as i128),
            ("allocated_size", allocated as i128),
            ("active_size", active as i128),
            ("requested_size", requested as i128),
            ("stream", stream as i128),
        ] {
            self.word(key)?;
            self.pickle.int(value)?;
        }
        self.word("segment_type")?;
        self.word(match segment_type {
            SegmentType::Small => "small",
            SegmentType::Large => "large",
        })?;
        self.word("segment_pool_id")?;
        self.pickle.int(pool.0.into())?;
        self.pickle.int(pool.1.into())?;
        self.pickle.tuple2()?;
        self.word("is_expandable")?;
        self.pickle.bool(range.expandable)?;
        self.word("frames")?;
        self.frames(stack)?;
        self.word("blocks")?;
        self.pickle.begin_list()?;
        let mut cursor = address;
        for b in blocks {
            if b.address > cursor {
                self.free_block(cursor, b.address - cursor)?;
            }
            self.block(b)?;
            cursor = b.address + b.size;
        }
        if cursor < address + range.size {
            self.free_block(cursor, address + range.size - cursor)?;
        }
        self.pickle.end_list()?;
        self.pickle.end_dict()
    }

    fn block(&mut self, b: &LiveBlock) -> io::Result<()> {
        self.pickle.begin_dict()?;
        self.word("address")?;
        self.pickle.int(b.address.into())?;
        self.word("size")?;
        self.pickle.int(b.size.into())?;
        self.word("requested_size")?;
        self.pickle.int(b.requested.into())?;
        self.word("state")?;
        self.word(match b.state {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        })?;
        self.word("frames")?;
        self.frames(b.stack)?;
        self.pickle.end_dict()
    }

    fn free_block(&mut self, address: u64, size: u64) -> io::Result<()> {
        self.block(&LiveBlock {
            address,
            size,
            requested: 0,
            stack: StackId::EMPTY,
            state: BlockState::Inactive,
        })
    }

    fn event(&mut self, ev: &TraceEvent, block_size: Option<u64>) -> io::Result<()> {
        self.pickle.begin_dict()?;
        self.word("action")?;
        self.word(ev.action.as_str())?;
        if ev.action == Action::Oom {
            self.word("device_free")?;
        } else {
            self.word("addr")?;
        }
        self.pickle.int(ev.addr.into())?;
        self.word("size")?;
        self.pickle.int(ev.size.into())?;
        self.word("stream")?;
        self.pickle.int(self.snap.stream(ev).into())?;
        self.word("time_us")?;
        self.pickle.int(ev.time_us.into())?;
        if let Some((a, b)) = ev.pool.pair() {
            self.word("pool_id")?;
            self.pickle.int(a.into())?;
            self.pickle.int(b.into())?;
            self.pickle.tuple2()?;
        }
        if let (Some(block), Action::FreeRequested | Action::FreeCompleted) =
            (block_size, ev.action)
        {
            self.word("block_size")?;
            self.pickle.int(block.into())?;
        }
        self.word("frames")?;
        self.frames(ev.stack)?;
        for (key, text) in [
            ("compile_context", self.snap.extra(ev).compile_context),
            ("user_metadata", self.snap.extra(ev).user_metadata),
        ] {
            if !self.snap.str(text).is_empty() {
                self.pickle.text(key)?;
                self.str(text)?;
            }
        }
        self.pickle.end_dict()
    }

    fn settings(&mut self, s: &crate::snapshot::AllocatorSettings) -> io::Result<()> {
        self.pickle.begin_dict()?;
        self.word("PYTORCH_CUDA_ALLOC_CONF")?;
        self.pickle.text(&s.alloc_conf)?;
        self.word("max_split_size")?;
        self.pickle.int(s.max_split_size.map_or(-1, i128::from))?;
        self.word("expandable_segments")?;
        self.pickle.bool(s.expandable_segments)?;
        self.word("garbage_collection_threshold")?;
        self.pickle.float(s.garbage_collection_threshold)?;
        self.word("roundup_power2_divisions")?;
        self.pickle.begin_dict()?;
        for (k, &n) in s.roundup_power2_divisions.iter().enumerate() {
            self.pickle.text(&(1u64 << k).to_string())?;
            self.pickle.int(n.into())?;
        }
        self.pickle.end_dict()?;
        if let Some(overflowed) = s.trace_overflowed {
            self.word("trace_alloc_overflowed")?;
            self.pickle.bool(overflowed)?;
        }
        self.pickle.end_dict()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{replay, SizeModel};
    use crate::snapshot::{from_pickle, Snapshot};
    use std::path::{Path, PathBuf};

    fn snapshots(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                snapshots(&p, out);
            } else if p.to_string_lossy().ends_with(".pickle.xz") {
                out.push(p);
            }
        }
    }

    /// Trims `window`, reads the result back and checks that the replay lands on its own
    /// final state and that every figure inside the window equals the original's.
    fn check(snap: &Snapshot, original: &Replay, window: Window, name: &str) {
        let mut bytes = Vec::new();
        let summary = write(snap, original, window, &mut bytes).unwrap();
        assert_eq!(summary.blocks_outside_segments, 0, "{name} {window:?}");
        let trimmed = from_pickle(&bytes[..], Default::default()).unwrap();
        let r = replay(&trimmed, window.device, SizeModel::Allocator);
        assert!(r.check.consistent, "{name} {window:?}: {:?}", r.check);
        assert_eq!(r.len(), window.to - window.from, "{name}");
        assert_eq!(
            r.allocated[..],
            original.allocated[window.from..window.to],
            "{name} {window:?}"
        );
        for k in 0..r.len() {
            assert_eq!(
                r.reserved_at(Some(k)),
                original.reserved_at(Some(window.from + k)),
                "{name} {window:?} event {k}"
            );
        }
    }

    #[test]
    fn trimmed_snapshots_replay_like_the_original_inside_the_window() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/snapshots");
        let mut files = Vec::new();
        snapshots(&root, &mut files);
        assert!(files.len() > 20, "{} snapshots", files.len());
        let mut windows_checked = 0;
        for file in files {
            let snap = Snapshot::open(&file).unwrap();
            let name = file.display().to_string();
            for device in snap.devices_with_events().collect::<Vec<_>>() {
                let original = replay(&snap, device, SizeModel::Allocator);
                if !original.check.consistent {
                    continue;
                }
                let n = original.len();
                let peak = original.peaks.allocated.event.unwrap_or(0);
                for (from, to) in [
                    (0, n),
                    (n / 3, (2 * n / 3).max(n / 3 + 1)),
                    (peak.saturating_sub(50), (peak + 50).min(n)),
                    (n - 1, n),
                ] {
                    check(&snap, &original, Window { device, from, to }, &name);
                    windows_checked += 1;
                }
            }
        }
        assert!(windows_checked > 80, "{windows_checked}");
    }
}

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
//! says whether it did, with figures. What that rebuilding learns of the trace (is its history
//! complete, did an allocation fail: a [`Preview`]) is at hand before the events are replayed
//! ([`prepare`]), so that work needing only that can run meanwhile.
//!
//! `SizeModel::Rounded` counts each request rounded to 512 bytes instead of its block: the
//! simpler accounting other tools use. A trace with blocks alive before it is anchored so that
//! it ends at the snapshot's total (the difference is memory from before the trace); one that
//! starts from an empty allocator starts at 0.

mod allocator;
mod engine;
mod state;

pub use allocator::{SizeRules, MIN_BLOCK, SMALL_SIZE};
pub(crate) use engine::completes_on_request;
pub use engine::Prepared;

use crate::snapshot::{Action, Snapshot, StackId};
use state::PRE;

/// How bytes are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Peak {
    /// The value.
    pub bytes: u64,
    /// Index of the event after which it was first reached; `None` = before the first event.
    pub event: Option<usize>,
    /// Microseconds from the first event.
    pub time_offset_us: i64,
}

/// Peaks of the four figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// Requested bytes after each event, held as what the allocated bytes after it exceed them by
/// (the blocks' rounding, which fits 32 bits on any program seen: 4 bytes an event, not 8),
/// or whole once that does not fit.
#[derive(Clone, Debug)]
pub(crate) enum Requested {
    Below(Vec<u32>),
    Whole(Vec<u64>),
}

impl Requested {
    pub(crate) fn with_capacity(n: usize) -> Requested {
        Requested::Below(Vec::with_capacity(n))
    }

    /// Adds the figures after the next event; `allocated` holds those of the events before.
    pub(crate) fn push(&mut self, allocated: &[u64], now_allocated: u64, now_requested: u64) {
        if let Requested::Below(below) = self {
            let fits = now_allocated
                .checked_sub(now_requested)
                .and_then(|d| u32::try_from(d).ok());
            if let Some(d) = fits {
                below.push(d);
                return;
            }
            let whole = below
                .iter()
                .zip(allocated)
                .map(|(&d, &a)| a - u64::from(d))
                .collect();
            *self = Requested::Whole(whole);
        }
        if let Requested::Whole(whole) = self {
            whole.push(now_requested);
        }
    }

    /// Every figure whole, given the allocated series it was held against.
    pub(crate) fn into_whole(self, allocated: &[u64]) -> Vec<u64> {
        match self {
            Requested::Whole(whole) => whole,
            Requested::Below(below) => below
                .iter()
                .zip(allocated)
                .map(|(&d, &a)| a - u64::from(d))
                .collect(),
        }
    }
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
    /// Requested bytes after each event ([`Replay::requested`]).
    pub(crate) requested: Requested,
    /// Reserved bytes as `(event, bytes after it)` for each event that changed them, in order
    /// (segments change rarely, so this is much shorter than the trace).
    pub reserved_changes: Vec<(u32, u64)>,
    /// Each event's bytes ([`Replay::bytes`]), kept only where they cannot be read from
    /// [`Replay::allocated`]: a rounded-size replay shifted to the snapshot's end that went
    /// below zero somewhere.
    pub(crate) kept_bytes: Option<Vec<u64>>,
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
    /// The segments and blocks rebuilt for trace start, in address order.
    pub start_layout: Vec<StartSegment>,
}

/// A segment (or a contiguous mapped range of an expandable segment) at trace start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartSegment {
    /// Base address.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// Its blocks in address order, covering it.
    pub blocks: Vec<StartBlock>,
}

impl StartSegment {
    /// Where the snapshot says what this segment was: the segment it still lists at its
    /// address, else the first trace entry that gives it back (`None` for both when neither
    /// exists). Its stream, pool and kind come from there.
    pub fn origin<'s>(
        &self,
        snap: &'s Snapshot,
        device: u32,
    ) -> (
        Option<&'s crate::snapshot::Segment>,
        Option<&'s crate::snapshot::TraceEvent>,
    ) {
        let end = self.address.saturating_add(self.size);
        let listed = snap
            .segments_of(device)
            .find(|s| s.address < end && self.address < s.address.saturating_add(s.total_size));
        if listed.is_some() {
            return (listed, None);
        }
        let released = snap.trace(device).iter().find(|e| {
            matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)
                && (self.address..end).contains(&e.addr)
        });
        (None, released)
    }
}

/// A block at trace start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartBlock {
    /// Address.
    pub address: u64,
    /// Block bytes.
    pub size: u64,
    /// Requested bytes, where known.
    pub requested: u64,
    /// Index into [`Replay::preexisting`] of the allocation it holds; `None` when free.
    pub preexisting: Option<usize>,
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

    /// Requested bytes after event `i` (0 past the end).
    pub fn requested(&self, i: usize) -> u64 {
        match &self.requested {
            Requested::Whole(whole) => whole.get(i).copied().unwrap_or(0),
            Requested::Below(below) => match (below.get(i), self.allocated.get(i)) {
                (Some(&d), Some(&a)) => a - u64::from(d),
                _ => 0,
            },
        }
    }

    /// For an `alloc` event: the bytes the allocation counts (block or rounded size); else 0.
    ///
    /// Read from the allocated series, not kept per event (8 bytes an event less): an
    /// allocation is the only event that raises allocated bytes, and it raises them by exactly
    /// what it counts (a free lowers them, any other event leaves them), so the rise at an
    /// event is its bytes and a fall reads as 0.
    pub fn bytes(&self, i: usize) -> u64 {
        if let Some(kept) = &self.kept_bytes {
            return kept.get(i).copied().unwrap_or(0);
        }
        let before = match i {
            0 => self.start.allocated,
            _ => self.allocated.get(i - 1).copied().unwrap_or(0),
        };
        self.allocated
            .get(i)
            .map_or(0, |&a| a.saturating_sub(before))
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

/// Replays one device's trace.
pub fn replay(snap: &Snapshot, device: u32, model: SizeModel) -> Replay {
    prepare(snap, device, model).run()
}

/// Rebuilds one device's state at trace start, ready to replay its events
/// ([`Prepared::run`]); what is known before that ([`Prepared::preview`]) lets other work start
/// meanwhile.
pub fn prepare(snap: &Snapshot, device: u32, model: SizeModel) -> Prepared<'_> {
    engine::Replayer::new(snap, device, model).prepare()
}

/// What is known of a device's trace before its events are replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preview {
    /// Device ordinal.
    pub device: u32,
    /// Completeness of the trace.
    pub history: History,
    /// An allocation failed (the trace holds an `oom` event).
    pub has_oom: bool,
}

/// A device's [`Preview`], which another thread may still be working out: the labels start on
/// the events while [`prepare`] rebuilds the state at trace start, and wait for what it learns
/// only where they need it ([`PreviewSoon::get`]).
pub struct PreviewSoon {
    device: u32,
    known: std::cell::OnceCell<Preview>,
    coming: Option<std::sync::mpsc::Receiver<Preview>>,
}

impl PreviewSoon {
    /// A preview already known.
    pub fn ready(preview: Preview) -> PreviewSoon {
        PreviewSoon {
            device: preview.device,
            known: std::cell::OnceCell::from(preview),
            coming: None,
        }
    }

    /// The preview of `device`, to come through the sender.
    pub fn coming(device: u32) -> (std::sync::mpsc::Sender<Preview>, PreviewSoon) {
        let (tx, rx) = std::sync::mpsc::channel();
        let soon = PreviewSoon {
            device,
            known: std::cell::OnceCell::new(),
            coming: Some(rx),
        };
        (tx, soon)
    }

    /// Device ordinal.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// The preview, waited for where it has not come yet.
    ///
    /// # Panics
    /// If the sender was dropped without sending: the preparation failed, and the panic that
    /// ended it is the one reported.
    pub fn get(&self) -> Preview {
        *self.known.get_or_init(|| {
            self.coming
                .as_ref()
                .and_then(|rx| rx.recv().ok())
                .expect("the replay's preparation ended without its preview")
        })
    }
}

impl Replay {
    /// What was known of the trace before its events were replayed.
    pub fn preview(&self) -> Preview {
        Preview {
            device: self.device,
            history: self.history,
            has_oom: !self.ooms.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests;

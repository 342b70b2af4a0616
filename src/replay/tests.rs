//! Replay tests on small hand-made traces.

use super::*;
use crate::snapshot::*;

const MB: u64 = 1 << 20;

fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
    TraceEvent::bare(action, addr, size, 0)
}

fn segment(address: u64, total: u64, blocks: Vec<(u64, u64, BlockState)>) -> Segment {
    Segment {
        device: 0,
        address,
        total_size: total,
        stream: 0,
        segment_type: if total == 2 * MB {
            SegmentType::Small
        } else {
            SegmentType::Large
        },
        pool_id: (0, 0),
        is_expandable: false,
        stack: StackId::EMPTY,
        blocks: blocks
            .into_iter()
            .map(|(a, size, state)| Block {
                address: a,
                size,
                requested_size: size,
                state,
                stack: StackId::EMPTY,
            })
            .collect(),
    }
}

fn snap(segments: Vec<Segment>, events: Vec<TraceEvent>) -> crate::snapshot::Snapshot {
    crate::snapshot::Snapshot {
        segments,
        traces: vec![events],
        ..crate::snapshot::Snapshot::default()
    }
}

use Action::*;
use BlockState::*;

#[test]
fn unsplit_block_counts_whole() {
    // A 20 MiB segment; 15 MiB then 4 MiB: the 5 MiB remainder leaves 1 MiB, not split.
    let base = 1 << 40;
    let s = snap(
        vec![segment(
            base,
            20 * MB,
            vec![
                (base, 15 * MB, ActiveAllocated),
                (base + 15 * MB, 5 * MB, ActiveAllocated),
            ],
        )],
        vec![
            ev(SegmentAlloc, base, 20 * MB),
            ev(Alloc, base, 15 * MB),
            ev(Alloc, base + 15 * MB, 4 * MB),
        ],
    );
    let r = replay(&s, 0, SizeModel::Allocator);
    assert_eq!(r.allocated, vec![0, 15 * MB, 20 * MB]);
    assert_eq!(r.bytes(2), 5 * MB);
    assert!(r.check.consistent, "{:?}", r.check);
    assert_eq!(r.start.reserved, 0);
    assert_eq!(r.peaks.reserved.bytes, 20 * MB);
    // Rounded accounting counts the requests; the trace starts from an empty allocator, so
    // it starts at 0 and nothing is left over for memory from before it.
    let r = replay(&s, 0, SizeModel::Rounded);
    assert_eq!(r.start.allocated, 0);
    assert_eq!(r.allocated, vec![0, 15 * MB, 19 * MB]);
}

/// A 20 MiB segment at `base` whose first MiB is a live block, the rest free.
fn segment_with_a_live_block(base: u64) -> Segment {
    segment(
        base,
        20 * MB,
        vec![(base, MB, ActiveAllocated), (base + MB, 19 * MB, Inactive)],
    )
}

/// A snapshot of [`segment_with_a_live_block`] whose trace opens with the free of a 2 MiB block
/// allocated before it (the block after the live one), then goes on with `then`.
fn after_an_orphan_free(base: u64, then: &[TraceEvent]) -> crate::snapshot::Snapshot {
    let mut events = vec![
        ev(FreeRequested, base + MB, 2 * MB),
        ev(FreeCompleted, base + MB, 2 * MB),
    ];
    events.extend_from_slice(then);
    snap(vec![segment_with_a_live_block(base)], events)
}

#[test]
fn preexisting_blocks_and_orphan_frees() {
    let base = 1 << 40;
    // Block A (1 MiB) alive before the trace and still at the end; block B (2 MiB) allocated
    // before the trace and freed in it; C allocated and freed in the trace.
    let s = after_an_orphan_free(
        base,
        &[
            ev(Alloc, base + MB, 3 * MB),
            ev(FreeRequested, base + MB, 3 * MB),
            ev(FreeCompleted, base + MB, 3 * MB),
        ],
    );
    let r = replay(&s, 0, SizeModel::Allocator);
    assert_eq!(r.start.allocated, 3 * MB);
    assert_eq!(r.allocated, vec![MB, MB, 4 * MB, MB, MB]);
    assert_eq!(r.history.frees_without_alloc, 1);
    assert!(!r.history.complete);
    assert!(r.check.consistent, "{:?}", r.check);
    assert_eq!(r.preexisting.len(), 2);
    // partner links: the first free points at a pre-existing block, the alloc at its free
    assert_eq!(r.partner[0] & PREEXISTING, PREEXISTING);
    assert_eq!(r.partner[2], 3);
    assert_eq!(r.partner[3], 2);
    let freed: Vec<u32> = r.preexisting.iter().map(|p| p.freed_at).collect();
    assert!(freed.contains(&0) && freed.contains(&NONE));
    // rounded accounting of a trace with blocks from before it ends at the snapshot's total
    let r = replay(&s, 0, SizeModel::Rounded);
    assert_eq!(r.end.allocated, MB);
}

#[test]
fn pending_frees_count_as_active_not_allocated() {
    let base = 1 << 40;
    let s = snap(
        vec![segment(
            base,
            2 * MB,
            vec![
                (base, 512, ActivePendingFree),
                (base + 512, 2 * MB - 512, Inactive),
            ],
        )],
        vec![
            ev(SegmentAlloc, base, 2 * MB),
            ev(Alloc, base, 100),
            ev(FreeRequested, base, 100),
        ],
    );
    let r = replay(&s, 0, SizeModel::Allocator);
    assert_eq!(r.end.allocated, 0);
    assert_eq!(r.end.active, 512);
    assert_eq!(r.peaks.requested.bytes, 100);
    assert!(r.check.consistent, "{:?}", r.check);
}

#[test]
fn segment_free_and_oom() {
    let base = 1 << 40;
    let s = snap(
        vec![],
        vec![
            ev(SegmentAlloc, base, 20 * MB),
            ev(Alloc, base, 2 * MB),
            ev(FreeRequested, base, 2 * MB),
            ev(FreeCompleted, base, 2 * MB),
            ev(SegmentFree, base, 20 * MB),
            ev(Oom, 123, 40 * MB),
        ],
    );
    let r = replay(&s, 0, SizeModel::Allocator);
    let reserved: Vec<u64> = (0..6).map(|i| r.reserved_at(Some(i))).collect();
    assert_eq!(reserved, vec![20 * MB, 20 * MB, 20 * MB, 20 * MB, 0, 0]);
    assert_eq!(r.reserved_changes, vec![(0, 20 * MB), (4, 0)]);
    assert_eq!(r.reserved_at(None), 0);
    assert_eq!(r.ooms.len(), 1);
    assert_eq!(r.ooms[0].requested, 40 * MB);
    assert_eq!(r.ooms[0].device_free, 123);
    assert!(r.check.consistent, "{:?}", r.check);
}

#[test]
fn expandable_segment_grows_and_shrinks() {
    let base = 1 << 40;
    let mut seg = segment(
        base,
        40 * MB,
        vec![
            (base, 30 * MB, ActiveAllocated),
            (base + 30 * MB, 10 * MB, Inactive),
        ],
    );
    seg.is_expandable = true;
    let mut s = snap(
        vec![seg],
        vec![
            ev(SegmentMap, base, 40 * MB),
            ev(Alloc, base, 30 * MB),
            ev(SegmentMap, base + 40 * MB, 60 * MB),
            ev(Alloc, base + 30 * MB, 60 * MB),
            ev(FreeRequested, base + 30 * MB, 60 * MB),
            ev(FreeCompleted, base + 30 * MB, 60 * MB),
            ev(SegmentUnmap, base + 40 * MB, 60 * MB),
        ],
    );
    s.settings = Some(AllocatorSettings {
        expandable_segments: true,
        ..AllocatorSettings::default()
    });
    let r = replay(&s, 0, SizeModel::Allocator);
    assert_eq!(r.peaks.reserved.bytes, 100 * MB);
    assert_eq!(r.peaks.allocated.bytes, 90 * MB);
    assert_eq!(r.end.reserved, 40 * MB);
    assert!(r.check.consistent, "{:?}", r.check);
}

#[test]
fn the_preview_says_before_the_replay_what_the_replay_finds() {
    let base = 1 << 40;
    let orphan_free = after_an_orphan_free(base, &[]);
    let failed = snap(
        vec![],
        vec![ev(SegmentAlloc, base, 20 * MB), ev(Oom, 123, 40 * MB)],
    );
    for (s, complete, has_oom) in [(orphan_free, false, false), (failed, true, true)] {
        let prepared = prepare(&s, 0, SizeModel::Allocator);
        let preview = prepared.preview();
        assert_eq!(preview.history.complete, complete);
        assert_eq!(preview.has_oom, has_oom);
        let r = prepared.run();
        assert_eq!(r.preview(), preview);
        assert_eq!(r.allocated, replay(&s, 0, SizeModel::Allocator).allocated);
    }
}

/// A trace recorded without `free_completed` (`skip_actions`) that ends in a free: the block
/// reused at its address shows the frees completed; the replay and the program built for the
/// simulation both take each free as complete, up to the last event.
#[test]
fn frees_complete_at_once_without_completions() {
    let base = 1 << 40;
    let s = snap(
        vec![segment(base, 2 * MB, vec![(base, 2 * MB, Inactive)])],
        vec![
            ev(SegmentAlloc, base, 2 * MB),
            ev(Alloc, base, 512),
            ev(FreeRequested, base, 512),
            ev(Alloc, base, 512),
            ev(FreeRequested, base, 512),
        ],
    );
    assert!(completes_on_request(s.trace(0)));
    let r = replay(&s, 0, SizeModel::Allocator);
    assert!(r.check.consistent, "{:?}", r.check);
    assert_eq!(r.end.active, 0);
    assert_eq!(r.peaks.allocated.bytes, 512);
    let p = crate::simulate::Program::new(&s, &r);
    let frees: Vec<_> = p
        .ops
        .iter()
        .filter_map(|&(_, op)| match op {
            crate::simulate::Op::Free { now, .. } => Some(now),
            _ => None,
        })
        .collect();
    assert_eq!(frees, vec![true, true]);
}

/// An allocation's bytes are the rise of allocated bytes at it, and every other event's 0;
/// where a rounded replay's shift to the snapshot's end cuts figures at zero, the bytes are
/// kept before the shift and read the same.
#[test]
fn an_allocations_bytes_are_the_rise_it_makes() {
    let base = 1 << 40;
    let s = after_an_orphan_free(
        base,
        &[
            ev(Alloc, base + MB, 3 * MB),
            ev(Alloc, base + 4 * MB, 5 * MB + 1000),
            ev(FreeRequested, base + MB, 3 * MB),
            ev(FreeCompleted, base + MB, 3 * MB),
        ],
    );
    let bytes = |r: &Replay| (0..r.len()).map(|i| r.bytes(i)).collect::<Vec<_>>();
    let r = replay(&s, 0, SizeModel::Allocator);
    assert!(r.kept_bytes.is_none());
    assert_eq!(bytes(&r), [0, 0, 3 * MB, 5 * MB + 1024, 0, 0]);
    // the snapshot holds only the 1 MiB block at its end: the rounded replay, which ends
    // with it and the 5 MiB block the snapshot does not hold, is shifted down by 5 MiB, past
    // zero before the trace (which starts with 3 MiB)
    let r = replay(&s, 0, SizeModel::Rounded);
    assert_eq!(r.end.allocated, MB);
    assert_eq!(r.start.allocated, 0, "cut at zero");
    assert!(r.kept_bytes.is_some(), "{:?} {:?}", r.start, r.allocated);
    assert_eq!(bytes(&r), [0, 0, 3 * MB, 5 * MB + 1024, 0, 0]);
    assert_eq!(r.bytes(99), 0, "past the end");
}

/// Requested bytes are held as what allocated bytes exceed them by, and whole from the first
/// figure that does not fit that way (a rounding of 4 GiB or more, or more requested than
/// allocated): either way every figure reads back as it was given.
#[test]
fn requested_figures_read_back_however_they_are_held() {
    let figures: [(u64, u64); 5] = [
        (0, 0),
        (5 * MB, 5 * MB - 24),
        (6 << 30, 1 << 30),
        (2 * MB, 3 * MB),
        (7 * MB, 7 * MB),
    ];
    for cut in 1..=figures.len() {
        let mut held = Requested::with_capacity(0);
        let mut allocated = Vec::new();
        for &(a, r) in &figures[..cut] {
            held.push(&allocated, a, r);
            allocated.push(a);
        }
        let whole_from = figures[..cut]
            .iter()
            .position(|&(a, r)| a < r || a - r > u64::from(u32::MAX));
        assert_eq!(matches!(held, Requested::Whole(_)), whole_from.is_some());
        let replay = Replay {
            allocated: allocated.clone(),
            requested: held.clone(),
            ..replay(&snap(Vec::new(), Vec::new()), 0, SizeModel::Allocator)
        };
        let read: Vec<u64> = (0..cut).map(|i| replay.requested(i)).collect();
        let given: Vec<u64> = figures[..cut].iter().map(|&(_, r)| r).collect();
        assert_eq!(read, given);
        assert_eq!(replay.requested(cut), 0, "past the end");
        assert_eq!(held.into_whole(&allocated), given);
    }
}

fn preview_of(device: u32) -> Preview {
    Preview {
        device,
        history: History {
            frees_without_alloc: 3,
            segment_frees_without_alloc: 0,
            complete: false,
            wrapped: false,
        },
        has_oom: true,
    }
}

#[test]
fn a_preview_to_come_is_waited_for_where_it_is_needed() {
    let (send, soon) = PreviewSoon::coming(2);
    assert_eq!(soon.device(), 2, "the device is known at once");
    let sent = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        send.send(preview_of(2)).unwrap();
    });
    assert_eq!(soon.get(), preview_of(2));
    // kept once received: the sender is gone now
    sent.join().unwrap();
    assert_eq!(soon.get(), preview_of(2));
    assert_eq!(PreviewSoon::ready(preview_of(5)).get(), preview_of(5));
    assert_eq!(PreviewSoon::ready(preview_of(5)).device(), 5);
}

#[test]
#[should_panic(expected = "ended without its preview")]
fn a_preparation_that_ends_without_its_preview_does_not_leave_the_labels_waiting() {
    let (send, soon) = PreviewSoon::coming(0);
    drop(send);
    soon.get();
}

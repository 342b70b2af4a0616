//! The two runs' requests aligned, and one timeline that holds both.
//!
//! Each allocation is given a token: the stream it was asked on (streams numbered in the
//! order the run first used them, since the handles differ between processes) and its call
//! site (file and function of its innermost frames, without line numbers, so that an edit
//! above a call does not unalign everything after it). The two token sequences are aligned
//! with the Myers diff of the `similar` crate (as `whatif --scale` aligns runs, through
//! [`crate::simulate::scale::equal_pairs`]): allocations it pairs are the same request of
//! the program in both runs; the others are requests of one run only.
//!
//! The merged timeline gives every allocation and free of both runs a position, keeping each
//! run's own order: up to each pair of aligned allocations, the base run's events, then the
//! new run's, then the pair at one position. A block of either run is then a span of
//! positions, from its allocation to its free (or the end), and the allocated bytes of the
//! base run alone (or the new run alone) at its own events are the spans laid over each
//! other: their highest point is that run's peak. The stretch between two aligned
//! allocations is a *gap*; a block whose free falls in the same gap in both runs lives as
//! long in both.
//!
//! Allocations without frames (the autograd thread's, in backward) all share one token per
//! stream, so the diff pairs them by position alone. Between two aligned allocations that have
//! frames, they are aligned again by token and requested size first, then by token alone in
//! what is left (`refine_frameless`): a gradient the new run adds in backward then stays a
//! new block rather than shifting every later backward allocation onto its neighbour, while a
//! larger batch, whose sizes all differ, still pairs them in order.
//!
//! Where both runs allocate at one call site several times in a row, a different number of
//! times (autocast casts a layer's weight at the layer's own line, before its output), the
//! pairs inside that stretch are chosen again by the sizes asked for (`refine_runs`), so that
//! an output pairs with the output and the cast reads as new.
//!
//! Blocks alive before recording started have no allocation to align: they are paired by
//! size, in the order they were freed.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use crate::simulate::scale::equal_pairs_until;

use rustc_hash::FxHasher;

use super::effects::Span;
use super::names::Renames;
use crate::analysis::DeviceAnalysis;
use crate::replay::{NONE, PREEXISTING};
use crate::snapshot::Action;

/// Innermost frames that make an allocation's call site for the alignment.
const SITE_FRAMES: usize = 5;
/// Time given to the diff before it settles for a coarser alignment.
const DIFF_DEADLINE: Duration = Duration::from_secs(10);
/// Allocations without frames between two with frames, in either run, beyond which the
/// diff's own pairing by position is kept (a recording without stacks is one such stretch).
const MAX_WINDOW: usize = 20_000;
/// A free that never came: the block lives to the end.
pub const NEVER: u32 = u32::MAX;

/// Where a block of one run came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The allocation at this trace event.
    Event(usize),
    /// Alive before the first event: this index of the replay's pre-existing blocks.
    BeforeTrace(usize),
}

/// One block of one run on the merged timeline.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// What made it.
    pub origin: Origin,
    /// Its span of positions and the bytes it counts.
    pub span: Span,
    /// The bytes the program asked for (the block may be larger).
    pub requested: u64,
    /// The trace event that freed it, if any.
    pub freed_by: Option<usize>,
    /// The gap its free fell in ([`NEVER`] when it lived to the end).
    pub free_gap: u32,
}

/// How a block of one run corresponds to the other run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pairing {
    /// The same request in both runs: base block, new block.
    Both(usize, usize),
    /// Only in the base run.
    Base(usize),
    /// Only in the new run.
    New(usize),
}

/// Both runs on one timeline.
pub struct Aligned {
    /// Positions of the merged timeline (position 0 is recording start).
    pub positions: usize,
    /// The base run's blocks.
    pub base: Vec<Block>,
    /// The new run's blocks.
    pub new: Vec<Block>,
    /// Every block of either run, once.
    pub pairs: Vec<Pairing>,
    /// Allocations recorded in each run.
    pub requests: (usize, usize),
    /// Allocations aligned.
    pub aligned: usize,
    /// Whether the diff finished (else the alignment is coarser than it could be).
    pub complete: bool,
}

/// A run's allocations as the alignment sees them.
struct Tokens {
    /// Stream and call site, hashed.
    token: Vec<u64>,
    /// The trace event of each allocation.
    events: Vec<usize>,
    /// The bytes it asked for.
    size: Vec<u64>,
    /// Whether its stack has no frames.
    frameless: Vec<bool>,
}

/// The alignment tokens of a run's allocations, its generated files read by the names in
/// `renames` where given.
fn tokens(a: &DeviceAnalysis, renames: Option<&Renames>) -> Tokens {
    let snap = a.snap;
    let mut sites: FxHashMap<crate::snapshot::StackId, u64> = FxHashMap::default();
    let mut streams: FxHashMap<crate::snapshot::StreamId, u64> = FxHashMap::default();
    let mut out = Tokens {
        token: Vec::new(),
        events: Vec::new(),
        size: Vec::new(),
        frameless: Vec::new(),
    };
    for (i, e) in snap.trace(a.device()).iter().enumerate() {
        if e.action != Action::Alloc {
            continue;
        }
        let site = *sites.entry(e.stack).or_insert_with(|| {
            let mut h = FxHasher::default();
            for f in snap.stacks.frames(e.stack).take(SITE_FRAMES) {
                let file = renames
                    .and_then(|r| r.files.get(&f.filename))
                    .map_or(snap.str(f.filename), |n| n.as_str());
                file.rsplit('/').next().unwrap_or(file).hash(&mut h);
                snap.str(f.name).hash(&mut h);
            }
            h.finish()
        });
        let next = streams.len() as u64;
        let stream = *streams.entry(e.stream).or_insert(next);
        let mut h = FxHasher::default();
        (site, stream).hash(&mut h);
        out.token.push(h.finish());
        out.events.push(i);
        out.size.push(e.size);
        out.frameless
            .push(snap.stacks.frames(e.stack).next().is_none());
    }
    out
}

/// The diff's pairs with the allocations without frames aligned again, between each two
/// aligned allocations with frames: by token and size first, then by token alone in the
/// stretches between those (see the module doc). Pairs stay in order in both runs.
fn refine_frameless(
    pairs: Vec<(usize, usize)>,
    b: &Tokens,
    n: &Tokens,
    deadline: Instant,
) -> Vec<(usize, usize)> {
    if !b.frameless.iter().any(|&f| f) || !n.frameless.iter().any(|&f| f) {
        return pairs;
    }
    let mut out = Vec::with_capacity(pairs.len());
    // the window after the last anchor starts at `start`; the diff's own pairs in it are kept
    // where it is too long to align again, or time is up
    let mut start = (0usize, 0usize);
    let mut first_pairs: Vec<(usize, usize)> = Vec::new();
    let window = |end: (usize, usize), start: (usize, usize), first: &mut Vec<_>| {
        let wb: Vec<usize> = (start.0..end.0).filter(|&k| b.frameless[k]).collect();
        let wn: Vec<usize> = (start.1..end.1).filter(|&k| n.frameless[k]).collect();
        if wb.is_empty() || wn.is_empty() {
            first.clear();
            return Vec::new();
        }
        if wb.len().max(wn.len()) > MAX_WINDOW || Instant::now() >= deadline {
            return std::mem::take(first);
        }
        first.clear();
        window_pairs(&wb, &wn, b, n, deadline)
    };
    for &(kb, kn) in &pairs {
        if b.frameless[kb] {
            first_pairs.push((kb, kn));
            continue;
        }
        out.extend(window((kb, kn), start, &mut first_pairs));
        out.push((kb, kn));
        start = (kb + 1, kn + 1);
    }
    out.extend(window(
        (b.token.len(), n.token.len()),
        start,
        &mut first_pairs,
    ));
    out
}

/// Longest stretch of one call site, in either run, whose pairs are chosen again by size.
const MAX_RUN: usize = 64;

/// The diff's pairs inside stretches where both runs allocate at one call site several times
/// in a row, a different number of times (autocast's casts of the weights before a layer's
/// output, one more buffer), chosen again so that the sizes asked for are as alike as can be
/// (the least sum of their log ratios, in order; ties to the earliest), where that is clearly
/// better than the diff's pairing by position: a layer's output then pairs with its output,
/// not with the cast made just before it.
fn refine_runs(mut pairs: Vec<(usize, usize)>, b: &Tokens, n: &Tokens) -> Vec<(usize, usize)> {
    // each allocation's stretch of its token: (first, end)
    fn stretches(t: &Tokens) -> Vec<(u32, u32)> {
        let len = t.token.len();
        let mut out = vec![(0u32, 0u32); len];
        let mut k = 0;
        while k < len {
            let mut end = k + 1;
            while end < len && t.token[end] == t.token[k] {
                end += 1;
            }
            out[k..end].fill((k as u32, end as u32));
            k = end;
        }
        out
    }
    let unlike = |x: u64, y: u64| ((x.max(1) as f64).ln() - (y.max(1) as f64).ln()).abs();
    let (sb, sn) = (stretches(b), stretches(n));
    let mut q = 0;
    while q < pairs.len() {
        let (i, j) = pairs[q];
        let ((i0, i1), (j0, j1)) = (sb[i], sn[j]);
        let (i0, i1, j0, j1) = (i0 as usize, i1 as usize, j0 as usize, j1 as usize);
        let mut end = q;
        while end < pairs.len() && pairs[end].0 < i1 && pairs[end].1 < j1 {
            end += 1;
        }
        let next = end.max(q + 1);
        let (k, l) = (i1 - i0, j1 - j0);
        let alone = (q == 0 || (pairs[q - 1].0 < i0 && pairs[q - 1].1 < j0))
            && (end == pairs.len() || (pairs[end].0 >= i1 && pairs[end].1 >= j1));
        if b.frameless[i] || !alone || k == l || k.max(l) > MAX_RUN || end - q != k.min(l) {
            q = next;
            continue;
        }
        // every allocation of the shorter stretch paired with one of the longer, in order
        let (short, long, swapped) = if k < l {
            (&b.size[i0..i1], &n.size[j0..j1], false)
        } else {
            (&n.size[j0..j1], &b.size[i0..i1], true)
        };
        let (k, l) = (short.len(), long.len());
        let at = |a: usize, c: usize| a * (l + 1) + c;
        let mut cost = vec![f64::INFINITY; (k + 1) * (l + 1)];
        for c in 0..=l {
            cost[at(0, c)] = 0.0;
        }
        for a in 1..=k {
            for c in a..=l {
                let skip = if c > a {
                    cost[at(a, c - 1)]
                } else {
                    f64::INFINITY
                };
                let pair = cost[at(a - 1, c - 1)] + unlike(short[a - 1], long[c - 1]);
                cost[at(a, c)] = skip.min(pair);
            }
        }
        let now: f64 = pairs[q..end]
            .iter()
            .map(|&(x, y)| unlike(b.size[x], n.size[y]))
            .sum();
        // clearly better only: sizes that differ by a rounding stay as the diff paired them
        if cost[at(k, l)] + 0.1 < now {
            let (mut a, mut c) = (k, l);
            let mut chosen = Vec::with_capacity(k);
            while a > 0 {
                if c > a && cost[at(a, c)] == cost[at(a, c - 1)] {
                    c -= 1;
                } else {
                    chosen.push((a - 1, c - 1));
                    a -= 1;
                    c -= 1;
                }
            }
            chosen.reverse();
            for (slot, (x, y)) in pairs[q..end].iter_mut().zip(chosen) {
                *slot = if swapped {
                    (i0 + y, j0 + x)
                } else {
                    (i0 + x, j0 + y)
                };
            }
        }
        q = next;
    }
    pairs
}

/// One window's allocations without frames paired: equal token and size, then equal token.
fn window_pairs(
    wb: &[usize],
    wn: &[usize],
    b: &Tokens,
    n: &Tokens,
    deadline: Instant,
) -> Vec<(usize, usize)> {
    let sized = |t: &Tokens, k: usize| {
        let mut h = FxHasher::default();
        (t.token[k], t.size[k]).hash(&mut h);
        h.finish()
    };
    let kb: Vec<u64> = wb.iter().map(|&k| sized(b, k)).collect();
    let kn: Vec<u64> = wn.iter().map(|&k| sized(n, k)).collect();
    let exact = equal_pairs_until(&kb, &kn, deadline);
    let mut out = Vec::with_capacity(wb.len().min(wn.len()));
    let mut from = (0usize, 0usize);
    for stop in exact
        .iter()
        .copied()
        .chain(std::iter::once((wb.len(), wn.len())))
    {
        // the stretch between two exact pairs, by token alone
        let tb: Vec<u64> = wb[from.0..stop.0].iter().map(|&k| b.token[k]).collect();
        let tn: Vec<u64> = wn[from.1..stop.1].iter().map(|&k| n.token[k]).collect();
        if !tb.is_empty() && !tn.is_empty() {
            out.extend(
                equal_pairs_until(&tb, &tn, deadline)
                    .into_iter()
                    .map(|(x, y)| (wb[from.0 + x], wn[from.1 + y])),
            );
        }
        if stop.0 < wb.len() {
            out.push((wb[stop.0], wn[stop.1]));
        }
        from = (stop.0 + 1, stop.1 + 1);
    }
    out
}

/// Which events of a run change its allocated bytes: allocations and the frees of blocks.
fn counted_events(a: &DeviceAnalysis) -> Vec<bool> {
    let r = &a.replay;
    let mut counted = vec![false; r.partner.len()];
    for (i, e) in a.snap.trace(a.device()).iter().enumerate() {
        if e.action == Action::Alloc {
            counted[i] = true;
            let f = r.partner[i];
            if f != NONE && (f as usize) < counted.len() {
                counted[f as usize] = true;
            }
        }
    }
    for p in &r.preexisting {
        if p.live && p.freed_at != NONE && (p.freed_at as usize) < counted.len() {
            counted[p.freed_at as usize] = true;
        }
    }
    counted
}

/// Positions and gaps given to one run's events while the timeline is laid out.
struct Placed {
    pos: Vec<u32>,
    gap: Vec<u32>,
    counted: Vec<bool>,
    next: usize,
}

impl Placed {
    fn new(a: &DeviceAnalysis) -> Placed {
        let counted = counted_events(a);
        let n = counted.len();
        Placed {
            pos: vec![0; n],
            gap: vec![0; n],
            counted,
            next: 0,
        }
    }

    /// Places this run's counted events before `end` at fresh positions.
    fn place_until(&mut self, end: usize, pos: &mut u32, gap: u32) {
        while self.next < end {
            if self.counted[self.next] {
                self.pos[self.next] = *pos;
                self.gap[self.next] = gap;
                *pos += 1;
            }
            self.next += 1;
        }
    }
}

/// The blocks of one run, on the merged timeline.
fn blocks(a: &DeviceAnalysis, placed: &Placed, positions: u32) -> Vec<Block> {
    let r = &a.replay;
    let mut out = Vec::new();
    for (k, p) in r.preexisting.iter().enumerate().filter(|(_, p)| p.live) {
        let freed = (p.freed_at != NONE).then_some(p.freed_at as usize);
        out.push(Block {
            origin: Origin::BeforeTrace(k),
            span: Span {
                start: 0,
                end: freed.map_or(positions, |f| placed.pos[f]),
                bytes: p.size,
            },
            requested: p.requested,
            freed_by: freed,
            free_gap: freed.map_or(NEVER, |f| placed.gap[f]),
        });
    }
    for (i, e) in a.snap.trace(a.device()).iter().enumerate() {
        if e.action != Action::Alloc {
            continue;
        }
        let f = r.partner[i];
        let freed = (f != NONE && f & PREEXISTING == 0).then_some(f as usize);
        out.push(Block {
            origin: Origin::Event(i),
            span: Span {
                start: placed.pos[i],
                end: freed.map_or(positions, |f| placed.pos[f]),
                bytes: r.bytes(i),
            },
            requested: e.size,
            freed_by: freed,
            free_gap: freed.map_or(NEVER, |f| placed.gap[f]),
        });
    }
    out
}

/// Aligns the new run with the base run and lays both on one timeline.
pub fn align(base: &DeviceAnalysis, new: &DeviceAnalysis, renames: &Renames) -> Aligned {
    let (tb, tn) = rayon::join(|| tokens(base, None), || tokens(new, Some(renames)));
    let ((pairs, complete), (mut pb, mut pn)) = rayon::join(
        || {
            let start = Instant::now();
            let (pairs, complete) =
                crate::simulate::scale::equal_pairs(&tb.token, &tn.token, DIFF_DEADLINE);
            let pairs = refine_frameless(pairs, &tb, &tn, start + DIFF_DEADLINE / 2);
            let pairs = refine_runs(pairs, &tb, &tn);
            (pairs, complete)
        },
        || rayon::join(|| Placed::new(base), || Placed::new(new)),
    );
    let (eb, en) = (&tb.events, &tn.events);
    // position 0 is recording start, before every event
    let mut pos = 1u32;
    for (gap, &(kb, kn)) in pairs.iter().enumerate() {
        let (ib, in_) = (eb[kb], en[kn]);
        pb.place_until(ib, &mut pos, gap as u32);
        pn.place_until(in_, &mut pos, gap as u32);
        // the aligned pair shares one position, which opens the next gap
        pb.pos[ib] = pos;
        pn.pos[in_] = pos;
        pb.gap[ib] = gap as u32 + 1;
        pn.gap[in_] = gap as u32 + 1;
        pb.next = ib + 1;
        pn.next = in_ + 1;
        pos += 1;
    }
    let last = pairs.len() as u32;
    pb.place_until(pb.counted.len(), &mut pos, last);
    pn.place_until(pn.counted.len(), &mut pos, last);
    let positions = pos;
    let (bb, bn) = rayon::join(
        || blocks(base, &pb, positions),
        || blocks(new, &pn, positions),
    );

    // blocks by allocation event, to turn aligned allocations into pairs of blocks
    let index_b = event_index(&bb, pb.counted.len());
    let index_n = event_index(&bn, pn.counted.len());
    let mut paired_b = vec![false; bb.len()];
    let mut paired_n = vec![false; bn.len()];
    let mut out = Vec::with_capacity(bb.len().max(bn.len()));
    for &(kb, kn) in &pairs {
        let (b, n) = (index_b[eb[kb]] as usize, index_n[en[kn]] as usize);
        paired_b[b] = true;
        paired_n[n] = true;
        out.push(Pairing::Both(b, n));
    }
    for (b, n) in before_trace_pairs(&bb, &bn) {
        paired_b[b] = true;
        paired_n[n] = true;
        out.push(Pairing::Both(b, n));
    }
    out.extend((0..bb.len()).filter(|&b| !paired_b[b]).map(Pairing::Base));
    out.extend((0..bn.len()).filter(|&n| !paired_n[n]).map(Pairing::New));
    Aligned {
        positions: positions as usize,
        base: bb,
        new: bn,
        pairs: out,
        requests: (eb.len(), en.len()),
        aligned: pairs.len(),
        complete,
    }
}

/// For each trace event, the block its allocation made (`u32::MAX` for other events).
fn event_index(blocks: &[Block], events: usize) -> Vec<u32> {
    let mut index = vec![u32::MAX; events];
    for (k, b) in blocks.iter().enumerate() {
        if let Origin::Event(i) = b.origin {
            index[i] = k as u32;
        }
    }
    index
}

/// Blocks alive before recording, paired by size: of each size, the first freed with the
/// first freed.
fn before_trace_pairs(base: &[Block], new: &[Block]) -> Vec<(usize, usize)> {
    let by_size = |blocks: &[Block]| {
        let mut m: HashMap<u64, Vec<usize>> = HashMap::new();
        for (k, b) in blocks.iter().enumerate() {
            if matches!(b.origin, Origin::BeforeTrace(_)) {
                m.entry(b.span.bytes).or_default().push(k);
            }
        }
        for list in m.values_mut() {
            list.sort_by_key(|&k| (blocks[k].span.end, k));
        }
        m
    };
    let (mb, mn) = (by_size(base), by_size(new));
    let mut out = Vec::new();
    for (size, list) in &mb {
        if let Some(other) = mn.get(size) {
            out.extend(list.iter().copied().zip(other.iter().copied()));
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(token: &[u64], size: &[u64]) -> Tokens {
        Tokens {
            token: token.to_vec(),
            events: (0..token.len()).collect(),
            size: size.to_vec(),
            frameless: vec![false; token.len()],
        }
    }

    #[test]
    fn a_stretch_of_one_site_pairs_by_size() {
        // autocast: the new run casts a weight at the layer's own line before its output
        let b = tokens(&[1, 7, 2], &[8, 1000, 8]);
        let n = tokens(&[1, 7, 7, 2], &[8, 10, 500, 8]);
        let pairs = refine_runs(vec![(0, 0), (1, 1), (2, 3)], &b, &n);
        assert_eq!(pairs, vec![(0, 0), (1, 2), (2, 3)]);
        // and the other way round: the base run had the extra allocation
        let pairs = refine_runs(vec![(0, 0), (1, 1), (3, 2)], &n, &b);
        assert_eq!(pairs, vec![(0, 0), (2, 1), (3, 2)]);
        // sizes alike, or only a little apart: the diff's pairing stays
        let same = tokens(&[1, 7, 7, 2], &[8, 1000, 1000, 8]);
        let pairs = refine_runs(vec![(0, 0), (1, 2), (2, 3)], &b, &same);
        assert_eq!(pairs, vec![(0, 0), (1, 2), (2, 3)]);
        let near = tokens(&[1, 7, 7, 2], &[8, 1000, 1010, 8]);
        let pairs = refine_runs(vec![(0, 0), (1, 2), (2, 3)], &b, &near);
        assert_eq!(pairs, vec![(0, 0), (1, 2), (2, 3)]);
        // a stretch whose allocations pair beyond the other run's stretch: left as it is
        let b = tokens(&[7, 7], &[1000, 10]);
        let n = tokens(&[7, 3, 7], &[10, 8, 1000]);
        let pairs = refine_runs(vec![(0, 0), (1, 2)], &b, &n);
        assert_eq!(pairs, vec![(0, 0), (1, 2)]);
    }
}

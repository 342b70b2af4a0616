//! Finding DualPipeV step regions without the source, from the order in which call sites of
//! `step()` are visited.
//!
//! The eight steps are consecutive loops in `step()`, in source order, so the call-site lines
//! seen in time order only go backwards inside a loop (the next iteration). Splitting the
//! sorted lines wherever everything before a line was visited before everything after it
//! gives the finest *groups*: a loop with two or more iterations and two or more call sites is
//! one group; a loop that runs once may be several. Groups are then assigned to steps 1..8 by
//! a small dynamic program, for every plausible pipeline shape, against the schedule model:
//! iteration counts per step, which calls each step makes, and in which order.

use super::schedule::{CallKind, Shape};

/// A run of call-site lines that no step boundary can cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) lines: Vec<u32>,
    /// Kinds of the call sites, in line order.
    pub(crate) kinds: Vec<CallKind>,
    /// Iterations seen (1 + backward jumps), when the group has two or more sites.
    pub(crate) iterations: Option<u32>,
    /// For a group of one site: how often the stack below `step()` started over, counting
    /// the frames down to each depth (outermost first), when the caller measured it. A loop
    /// of `n` iterations starts over `n - 1` times at the depth of its call.
    pub(crate) restarts: Option<Vec<u32>>,
}

impl Group {
    /// Whether the stacks of this one-site group can show `count` iterations: some depth
    /// starts over exactly `count - 1` times (unmeasured: unknown, `None`).
    fn shows(&self, count: u32) -> Option<bool> {
        self.restarts
            .as_ref()
            .map(|r| r.contains(&(count.saturating_sub(1))))
    }

    /// Whether this one-site group, cut short, may be the start of `count` iterations: its
    /// stacks start over no more than `count - 1` times at the outermost depth that starts
    /// over at all.
    fn may_begin(&self, count: u32) -> bool {
        self.restarts
            .as_ref()
            .is_none_or(|r| r.iter().find(|&&n| n > 0).is_none_or(|&n| n < count.max(1)))
    }
}

/// The finest groups of call sites that step boundaries may fall between; `restarts` gives,
/// for each call, its restart profile ([`Group::restarts`]), or is empty.
pub(crate) fn groups(calls: &[(u32, CallKind)], restarts: &[Vec<u32>]) -> Vec<Group> {
    let mut lines: Vec<(u32, CallKind, usize, usize)> = Vec::new();
    for (i, &(line, kind)) in calls.iter().enumerate() {
        match lines.iter_mut().find(|l| l.0 == line) {
            Some(l) => l.3 = i,
            None => lines.push((line, kind, i, i)),
        }
    }
    lines.sort_by_key(|l| l.0);
    let n = lines.len();
    let mut suffix_first = vec![usize::MAX; n + 1];
    for i in (0..n).rev() {
        suffix_first[i] = suffix_first[i + 1].min(lines[i].2);
    }
    let mut out = Vec::new();
    let mut current: Vec<(u32, CallKind)> = Vec::new();
    let mut prefix_last = 0;
    for i in 0..n {
        current.push((lines[i].0, lines[i].1));
        prefix_last = prefix_last.max(lines[i].3);
        if i + 1 == n || prefix_last < suffix_first[i + 1] {
            let members: Vec<u32> = current.iter().map(|c| c.0).collect();
            let iterations = (members.len() >= 2).then(|| {
                let seq: Vec<u32> = calls
                    .iter()
                    .map(|c| c.0)
                    .filter(|l| members.contains(l))
                    .collect();
                1 + seq.windows(2).filter(|w| w[1] < w[0]).count() as u32
            });
            // one site, visited once: its calls are one run of that line
            let restarts = (members.len() == 1)
                .then(|| {
                    let line = members[0];
                    let mut visits = calls.iter().enumerate().filter(|c| c.1 .0 == line);
                    match (visits.next(), visits.next()) {
                        (Some((i, _)), None) => restarts.get(i).cloned(),
                        _ => None,
                    }
                })
                .flatten();
            out.push(Group {
                lines: members,
                kinds: current.iter().map(|c| c.1).collect(),
                iterations,
                restarts,
            });
            current.clear();
        }
    }
    out
}

/// Calls a step makes, in order, when its loop runs once (a superset across rank kinds).
/// Step 4 runs a separate forward and backward first only on the last rank.
fn body(step: u8, last_rank: bool) -> &'static [CallKind] {
    use CallKind::*;
    match step {
        4 if !last_rank => &[Send, Send, ForwardBackward, ForwardBackward],
        1 => &[Forward],
        2 => &[Recv, Forward, Recv, Forward, Send],
        3 => &[Backward, Recv, Weight, Forward, Send],
        4 => &[
            Forward,
            Send,
            Backward,
            Send,
            Send,
            ForwardBackward,
            ForwardBackward,
        ],
        5 => &[Backward, ForwardBackward],
        6 => &[Backward, Backward],
        7 => &[Weight, Backward],
        8 => &[Weight],
        _ => &[],
    }
}

fn allowed(step: u8, kind: CallKind, place: Place) -> bool {
    match kind {
        CallKind::Other => true,
        // step 2 receives only phase-0 forwards, which the first rank never does
        CallKind::Recv if step == 2 && place.first_rank => false,
        CallKind::Recv => step <= 7,
        _ => body(step, place.last_rank).contains(&kind),
    }
}

fn is_subsequence(kinds: &[CallKind], of: &[CallKind]) -> bool {
    let mut it = of.iter();
    kinds
        .iter()
        .filter(|k| **k != CallKind::Other)
        .all(|k| it.any(|o| o == k))
}

const IMPOSSIBLE: u32 = u32::MAX / 4;

/// Where a step's groups stand in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    /// The step takes no group at the start or the end of a trace that may be cut there.
    at_an_end: bool,
    /// The step takes the last groups of a trace cut short: its loop may have stopped early.
    cut_here: bool,
    /// The rank is the pipeline's last.
    last_rank: bool,
    /// The rank is the pipeline's first: it receives no phase-0 forward.
    first_rank: bool,
}

/// Cost of giving `gs` to pipeline step `step` (0 = before step 1, 9 = after step 8) when the
/// step should iterate `count` times (`None`: free, for step 4 whose count depends on the
/// number of micro-batches).
fn cost(step: u8, gs: &[Group], count: Option<u32>, place: Place) -> u32 {
    if step == 0 || step == 9 {
        // Code of `step()` outside its loops: bookkeeping calls, not chunks.
        return gs
            .iter()
            .map(|g| {
                if g.kinds.iter().all(|&k| k == CallKind::Other) {
                    1
                } else {
                    4
                }
            })
            .sum();
    }
    if gs.is_empty() {
        // A step may be missing at either end of a trace (recording started late, or the
        // program ran out of memory); in the middle it should not be.
        return if count == Some(0) || place.at_an_end {
            0
        } else {
            3
        };
    }
    if count == Some(0) {
        return IMPOSSIBLE;
    }
    let body = body(step, place.last_rank);
    let kinds: Vec<CallKind> = gs.iter().flat_map(|g| g.kinds.iter().copied()).collect();
    if !kinds.iter().all(|&k| allowed(step, k, place)) {
        return IMPOSSIBLE;
    }
    let others = 5 * kinds.iter().filter(|&&k| k == CallKind::Other).count() as u32;
    let single_pass = gs.iter().all(|g| g.iterations.unwrap_or(1) <= 1);
    let mut best = IMPOSSIBLE;
    // The loop ran once: the sites follow the step's call order.
    if count.is_none_or(|c| c == 1 || place.cut_here) && single_pass {
        let order: Vec<CallKind> = gs
            .iter()
            .flat_map(|g| {
                let mut v: Vec<(u32, CallKind)> = g
                    .lines
                    .iter()
                    .copied()
                    .zip(g.kinds.iter().copied())
                    .collect();
                v.sort();
                v.into_iter().map(|x| x.1)
            })
            .collect();
        if is_subsequence(&order, body) {
            best = 0;
        }
    }
    // The loop ran several times: one interleaved group, maybe after single-pass sites (a
    // statement before the loop, or a branch taken only in the first iteration).
    if count.is_none_or(|c| c >= 2) || step == 4 {
        let (prefix, main) = gs.split_at(gs.len() - 1);
        let main = &main[0];
        let prefix_kinds: Vec<CallKind> = prefix.iter().flat_map(|g| g.kinds.clone()).collect();
        let prefix_ok =
            prefix.iter().all(|g| g.iterations.is_none()) && is_subsequence(&prefix_kinds, body);
        // The statements the schedule itself runs once before or at the start of the loop
        // cost nothing: step 2's first receive, step 4's first-iteration branch (the last
        // rank's separate forward and backward).
        let documented = match step {
            2 => prefix_kinds.iter().all(|&k| k == CallKind::Recv),
            4 => prefix_kinds
                .iter()
                .all(|&k| matches!(k, CallKind::Forward | CallKind::Backward | CallKind::Send)),
            _ => false,
        };
        let prefix_cost = if documented { 0 } else { prefix.len() as u32 };
        if prefix_ok {
            match main.iterations {
                Some(it) if count.is_none_or(|c| c == it) => best = best.min(prefix_cost),
                // Cut short by the end of the trace: fewer iterations than the schedule's.
                Some(it) if place.cut_here && count.is_some_and(|c| it < c) => {
                    best = best.min(prefix_cost)
                }
                // Iterations whose calls allocate nothing leave no trace (the last rank's
                // backward in step 6): fewer visible than the schedule's count is possible, at
                // a price that keeps exact fits first.
                Some(it) if count.is_some_and(|c| it < c && c <= it + MAX_HIDDEN) => {
                    best = best.min(prefix_cost + 2 * (count.unwrap_or(0) - it))
                }
                // One call site repeated (steps 1 and 8): its stacks may show the count.
                None if prefix.is_empty() => {
                    let c = count.unwrap_or(2);
                    best = best.min(match main.shows(c) {
                        Some(true) => 0,
                        _ if place.cut_here && main.may_begin(c) => 0,
                        _ => 1,
                    })
                }
                _ => {}
            }
        }
    }
    if best >= IMPOSSIBLE {
        IMPOSSIBLE
    } else {
        best + others
    }
}

/// Costs already worked out, shared by every shape tried: a dense table over (step, first
/// group, groups taken, how the count relates to those groups, at an end). [`cost`] depends on
/// the count only through that relation, so one entry serves every shape.
struct CostMemo {
    groups: usize,
    slots: Vec<u32>,
}

const UNKNOWN: u32 = u32::MAX;
/// The most loop iterations that may leave no allocation behind.
const MAX_HIDDEN: u32 = 8;
/// The most groups worth fitting to the schedule.
const MAX_GROUPS: usize = 64;
const COUNT_CLASSES: usize = 6 + MAX_HIDDEN as usize;

impl CostMemo {
    fn new(groups: usize) -> CostMemo {
        let n = groups + 1;
        CostMemo {
            groups,
            slots: vec![UNKNOWN; 10 * n * n * COUNT_CLASSES * 2],
        }
    }

    fn cost(
        &mut self,
        step: u8,
        gs: &[Group],
        g: usize,
        take: usize,
        count: Option<u32>,
        place: Place,
    ) -> u32 {
        let taken = &gs[g..g + take];
        // Not kept: the end of a cut trace, the first rank's step 2 and the last rank's step
        // 4, and one site whose stacks
        // were measured (its cost depends on the exact count). Each is one entry per shape.
        if place.cut_here
            || step == 4 && place.last_rank
            || step == 2 && place.first_rank
            || take == 1 && taken[0].restarts.is_some()
        {
            return cost(step, taken, count, place);
        }
        let iterations = taken.last().and_then(|m| m.iterations);
        // Every distinction `cost` makes about the count: absent, zero, one, or more, and
        // whether it equals the iterations of the last group taken or exceeds them by a few.
        let class = match count {
            None => 0,
            Some(0) => 1,
            Some(1) if iterations == Some(1) => 2,
            Some(1) => 3,
            Some(c) if Some(c) == iterations => 4,
            // a few more than seen: each difference costs differently
            Some(c) if iterations.is_some_and(|it| it < c && c <= it + MAX_HIDDEN) => {
                5 + (c - iterations.unwrap_or(0)) as usize
            }
            Some(_) => 5,
        };
        let n = self.groups + 1;
        let i = (((step as usize * n + g) * n + take) * COUNT_CLASSES + class) * 2
            + place.at_an_end as usize;
        if self.slots[i] == UNKNOWN {
            self.slots[i] = cost(step, taken, count, place);
        }
        self.slots[i]
    }
}

/// The best assignment of `gs` to steps 0..=9 for one shape: total cost and the number of
/// groups each step takes.
fn assign(
    gs: &[Group],
    counts: [Option<u32>; 8],
    cut: Cut,
    (first_rank, last_rank): (bool, bool),
    memo: &mut CostMemo,
) -> (u32, [usize; 10]) {
    let m = gs.len();
    // best[s][g]: minimal cost with steps < s holding the first g groups.
    let mut best = vec![vec![IMPOSSIBLE; m + 1]; 11];
    let mut choice = vec![vec![0usize; m + 1]; 11];
    best[0][0] = 0;
    for s in 0..10u8 {
        let count = if (1..=8).contains(&s) {
            counts[s as usize - 1]
        } else {
            None
        };
        for g in 0..=m {
            if best[s as usize][g] >= IMPOSSIBLE {
                continue;
            }
            for take in 0..=(m - g) {
                let place = Place {
                    at_an_end: take == 0 && (g == 0 && cut.head || g == m && cut.tail),
                    cut_here: take > 0 && g + take == m && cut.tail,
                    last_rank,
                    first_rank,
                };
                let c = memo.cost(s, gs, g, take, count, place);
                if c >= IMPOSSIBLE {
                    continue;
                }
                // Ties go to the assignment that uses fewer steps.
                let c = 10 * c + (take > 0) as u32;
                let total = best[s as usize][g] + c;
                if total < best[s as usize + 1][g + take] {
                    best[s as usize + 1][g + take] = total;
                    choice[s as usize + 1][g + take] = take;
                }
            }
        }
    }
    let mut takes = [0usize; 10];
    let mut g = m;
    for s in (1..=10).rev() {
        let t = choice[s][g];
        takes[s - 1] = t;
        g -= t;
    }
    (best[10][m], takes)
}

/// Where a trace may have been cut short.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cut {
    /// The history lost its beginning inside `step()` (the ring buffer wrapped).
    pub(crate) head: bool,
    /// The trace ends early (the program ran out of memory).
    pub(crate) tail: bool,
}

/// Step regions: `(step, first line, last line)`.
pub(crate) type Regions = Vec<(u8, u32, u32)>;

/// What the call sites say about `step()`: its regions, the pipeline's shape, and the
/// iteration count of each step that ran to its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fit {
    /// `(step, first line, last line)`, with 9/10 for the code before step 1 and after step 8.
    pub(crate) regions: Regions,
    /// The shape, when exactly one fits best (a trace cut short early may fit several).
    pub(crate) shape: Option<Shape>,
    /// Iterations of steps 1..=8 (index 0 = step 1) that every best-fitting shape agrees on;
    /// none for the step a cut trace stopped in, or for step 4 before its end.
    pub(crate) counts: [Option<u32>; 8],
}

/// Every shape considered: up to 32 ranks.
fn shapes() -> impl Iterator<Item = (u32, u32)> {
    (1..=32u32).flat_map(|ranks| (0..ranks).map(move |rank| (ranks, rank)))
}

/// The schedule's counts for a shape, step 4's left open.
fn open_counts(ranks: u32, rank: u32) -> [Option<u32>; 8] {
    let mut counts = Shape {
        ranks,
        rank,
        chunks: 2 * ranks,
    }
    .iterations()
    .map(Some);
    counts[3] = None;
    counts
}

/// What the schedule adds to a shape's cost whatever the groups: a pipeline of one rank is
/// rare and fits any short prefix of the others' calls (it has no step 1), so it wins only
/// where it fits better; a rank other than the one the stacks name as first pays.
fn shape_penalty(ranks: u32, rank: u32, first_rank: Option<bool>) -> u32 {
    let one = if ranks == 1 { 5 } else { 0 };
    let first = match first_rank {
        Some(first) if first != (rank == 0) => 20,
        _ => 0,
    };
    one + first
}

/// The cost of one given assignment (`takes` groups per step 0..=9) for one shape.
fn cost_of(
    gs: &[Group],
    takes: &[usize; 10],
    counts: [Option<u32>; 8],
    cut: Cut,
    first_last: (bool, bool),
    memo: &mut CostMemo,
) -> u32 {
    let m = gs.len();
    let mut g = 0;
    let mut total = 0u32;
    for (s, &take) in takes.iter().enumerate() {
        let count = if (1..=8).contains(&s) {
            counts[s - 1]
        } else {
            None
        };
        let place = Place {
            at_an_end: take == 0 && (g == 0 && cut.head || g == m && cut.tail),
            cut_here: take > 0 && g + take == m && cut.tail,
            first_rank: first_last.0,
            last_rank: first_last.1,
        };
        let c = memo.cost(s as u8, gs, g, take, count, place);
        if c >= IMPOSSIBLE {
            return IMPOSSIBLE;
        }
        total += 10 * c + (take > 0) as u32;
        g += take;
    }
    total
}

/// Judges every shape against one assignment: the shapes of the lowest cost give the shape
/// (when one) and the counts they agree on.
fn judge(
    gs: &[Group],
    takes: &[usize; 10],
    cut: Cut,
    first_rank: Option<bool>,
    memo: &mut CostMemo,
) -> (Option<Shape>, [Option<u32>; 8]) {
    let mut best: Vec<(u32, u32)> = Vec::new();
    let mut low = IMPOSSIBLE;
    for (ranks, rank) in shapes() {
        let counts = open_counts(ranks, rank);
        let c = cost_of(gs, takes, counts, cut, (rank == 0, rank + 1 == ranks), memo);
        if c >= IMPOSSIBLE {
            continue;
        }
        let c = c + shape_penalty(ranks, rank, first_rank);
        if c < low {
            low = c;
            best.clear();
        }
        if c == low {
            best.push((ranks, rank));
        }
    }
    let Some(&(ranks, rank)) = best.first() else {
        return (None, [None; 8]);
    };
    // the step a cut trace stopped in did not finish its loop
    let last_taken = (1..=8).rev().find(|&k| takes[k] > 0);
    let cut_in = last_taken.filter(|_| cut.tail && takes[9] == 0);
    let first_step = (1..=8).find(|&k| takes[k] > 0);
    let expected = Shape {
        ranks,
        rank,
        chunks: 2 * ranks,
    }
    .iterations();
    let truncated_head = first_step.is_some_and(|k| (1..k).any(|j| expected[j - 1] > 0));
    let mut counts = [None; 8];
    for (k, slot) in counts.iter_mut().enumerate() {
        // the step the cut stopped and those after it, step 4 (below), and the step a trace
        // that lost its beginning starts in and those before it
        let step = k + 1;
        if cut_in.is_some_and(|c| step >= c) || k == 3 || truncated_head && Some(step) <= first_step
        {
            continue;
        }
        *slot = best
            .iter()
            .map(|&(p, r)| open_counts(p, r)[k])
            .reduce(|a, b| if a == b { a } else { None })
            .flatten();
    }
    // Step 4's count is the iterations of its interleaved group, when there is one.
    let step4 = {
        let before: usize = takes[..4].iter().sum();
        gs[before..before + takes[4]]
            .iter()
            .rev()
            .find_map(|g| g.iterations)
    };
    // step 4 ran to its end, and from its start (a trace that lost its beginning in step 4
    // shows only its last iterations)
    let step4_done = cut_in.is_none_or(|c| c > 4) && !(truncated_head && first_step >= Some(4));
    if step4_done {
        counts[3] = step4.or((takes[4] > 0).then_some(1));
    }
    // Cut short: the fewest micro-batches that allow the step-4 iterations seen.
    let fewest = |seen: u32| Shape {
        ranks,
        rank,
        chunks: (2 * ranks).max((2 * ranks + seen).saturating_sub(rank + 1)),
    };
    let open = cut.tail && best.len() > 1;
    let shape = match step4 {
        _ if truncated_head || open => None,
        // steps 2 and 3 do not depend on the micro-batches
        Some(c4) => Shape::from_counts(expected[1], expected[2], c4)
            .or_else(|| cut.tail.then(|| fewest(c4))),
        None => cut.tail.then(|| fewest(u32::from(takes[4] > 0))),
    };
    (shape, counts)
}

/// The regions of an assignment: `(step, first line, last line)` per step that took groups.
fn regions_of(gs: &[Group], takes: &[usize; 10]) -> Regions {
    let mut regions = Vec::new();
    let mut g = 0;
    for (s, &take) in takes.iter().enumerate() {
        if take > 0 {
            let lines = gs[g..g + take].iter().flat_map(|x| x.lines.iter().copied());
            let (lo, hi) = lines.fold((u32::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
            let step = match s {
                0 => super::STEP_BEFORE,
                9 => super::STEP_AFTER,
                k => k as u8,
            };
            regions.push((step, lo, hi));
        }
        g += take;
    }
    regions
}

/// The inferred step regions, the shape that fits best, and the counts of the steps that
/// ran to their end.
///
/// `restarts` holds each call's restart profile ([`Group::restarts`]) or is empty. A trace cut
/// short (`cut.tail`) before step 4 ended gets a shape whose `chunks` is the fewest
/// micro-batches consistent with what ran: the counts of the other steps do not depend on it.
pub(crate) fn infer(
    calls: &[(u32, CallKind)],
    restarts: &[Vec<u32>],
    first_rank: Option<bool>,
    cut: Cut,
) -> Option<Fit> {
    let gs = groups(calls, restarts);
    // DualPipeV's `step()` makes about twenty groups; far more is some other function.
    if gs.is_empty() || gs.len() > MAX_GROUPS {
        return None;
    }
    let mut best: Option<(u32, u32, [usize; 10])> = None;
    let mut memo = CostMemo::new(gs.len());
    for (ranks, rank) in shapes() {
        let counts = open_counts(ranks, rank);
        let first_last = (rank == 0, rank + 1 == ranks);
        let (total, takes) = assign(&gs, counts, cut, first_last, &mut memo);
        if total >= IMPOSSIBLE {
            continue;
        }
        let total = total + shape_penalty(ranks, rank, first_rank);
        let better = match best {
            None => true,
            Some((t, p, _)) => total < t || (total == t && ranks < p),
        };
        if better {
            best = Some((total, ranks, takes));
        }
    }
    let (_, _, takes) = best?;
    let (shape, counts) = judge(&gs, &takes, cut, first_rank, &mut memo);
    Some(Fit {
        regions: regions_of(&gs, &takes),
        shape,
        counts,
    })
}

/// The shape and counts for regions known from the source: `step_of` gives each call-site
/// line's step (9/10 for before step 1 and after step 8).
pub(crate) fn fit_known(
    calls: &[(u32, CallKind)],
    restarts: &[Vec<u32>],
    first_rank: Option<bool>,
    cut: Cut,
    step_of: impl Fn(u32) -> u8,
) -> Option<(Option<Shape>, [Option<u32>; 8])> {
    let gs = groups(calls, restarts);
    if gs.is_empty() || gs.len() > MAX_GROUPS {
        return None;
    }
    let mut takes = [0usize; 10];
    let mut last = 0;
    for g in &gs {
        let slot = match step_of(g.lines[0]) {
            s if s == super::STEP_BEFORE => 0,
            s if s == super::STEP_AFTER => 9,
            s @ 1..=8 => s as usize,
            _ => return None,
        };
        // groups come in line order; a region out of order is not the schedule's
        if slot < last || g.lines.iter().any(|&l| step_of(l) != step_of(g.lines[0])) {
            return None;
        }
        last = slot;
        takes[slot] += 1;
    }
    let mut memo = CostMemo::new(gs.len());
    Some(judge(&gs, &takes, cut, first_rank, &mut memo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use CallKind::*;

    /// Call sites of the pithtrain rank-0 trace (P=2, N=8), as `step()` visited them.
    fn rank0() -> Vec<(u32, CallKind)> {
        let mut v = vec![
            (287, Forward),
            (299, Forward),
            (301, Forward),
            (310, Backward),
            (311, Recv),
            (312, Weight),
            (313, Forward),
            (329, ForwardBackward),
            (332, ForwardBackward),
        ];
        v.extend(rank0_from_step4_loop(4));
        v
    }

    /// The end of [`rank0`]: `loops` turns of step 4's loop, then steps 5 to 8 and after.
    fn rank0_from_step4_loop(loops: usize) -> Vec<(u32, CallKind)> {
        let mut v = Vec::new();
        for _ in 0..loops {
            v.push((331, ForwardBackward));
            v.push((332, ForwardBackward));
        }
        v.extend([
            (343, Backward),
            (344, ForwardBackward),
            (352, Backward),
            (355, Backward),
            (360, Weight),
            (361, Backward),
            (366, Weight),
            (373, Other),
        ]);
        v
    }

    #[test]
    fn shared_cost_table_fits_every_shape_as_a_fresh_one_does() {
        let gs = groups(&rank0(), &[]);
        let mut shared = CostMemo::new(gs.len());
        for ranks in 1..=8u32 {
            for rank in 0..ranks {
                let counts = open_counts(ranks, rank);
                for cut in [
                    Cut::default(),
                    Cut {
                        head: true,
                        tail: true,
                    },
                ] {
                    let fresh = assign(
                        &gs,
                        counts,
                        cut,
                        (rank == 0, rank + 1 == ranks),
                        &mut CostMemo::new(gs.len()),
                    );
                    assert_eq!(
                        assign(
                            &gs,
                            counts,
                            cut,
                            (rank == 0, rank + 1 == ranks),
                            &mut shared
                        ),
                        fresh,
                        "{ranks} {rank}"
                    );
                }
            }
        }
    }

    #[test]
    fn groups_split_where_no_loop_crosses() {
        let g = groups(&rank0(), &[]);
        let lines: Vec<Vec<u32>> = g.iter().map(|g| g.lines.clone()).collect();
        assert_eq!(lines[0], vec![287]);
        assert!(lines.contains(&vec![331, 332]));
        let fb = g.iter().find(|g| g.lines == vec![331, 332]).unwrap();
        assert_eq!(fb.iterations, Some(5));
    }

    #[test]
    fn rank0_regions_and_shape() {
        let Fit { regions, shape, .. } = infer(&rank0(), &[], Some(true), Cut::default()).unwrap();
        let steps: Vec<u8> = regions.iter().map(|r| r.0).collect();
        assert_eq!(
            steps,
            vec![1, 2, 3, 4, 5, 6, 7, 8, super::super::STEP_AFTER]
        );
        assert_eq!(regions[3], (4, 329, 332));
        let shape = shape.unwrap();
        assert_eq!((shape.ranks, shape.rank, shape.chunks), (2, 0, 8));
    }

    #[test]
    fn last_rank_regions_and_shape() {
        // P=2, rank 1, N=6: steps 2, 4, 6, 8 only
        let mut v = Vec::new();
        for _ in 0..2 {
            v.push((299, Forward));
            v.push((301, Forward));
        }
        v.extend([(323, Forward), (325, Backward), (332, ForwardBackward)]);
        for _ in 0..3 {
            v.push((331, ForwardBackward));
            v.push((332, ForwardBackward));
        }
        for _ in 0..2 {
            v.push((352, Backward));
            v.push((355, Backward));
        }
        v.push((366, Weight));
        let Fit { regions, shape, .. } = infer(&v, &[], Some(false), Cut::default()).unwrap();
        let steps: Vec<u8> = regions.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![2, 4, 6, 8]);
        let shape = shape.unwrap();
        assert_eq!((shape.ranks, shape.rank, shape.chunks), (2, 1, 6));
    }

    #[test]
    fn a_trace_cut_by_an_oom_keeps_its_first_steps() {
        // rank 0 of P=2 ran out of memory in step 3
        let v = rank0()[..6].to_vec();
        let cut = Cut {
            head: false,
            tail: true,
        };
        let Fit { regions, .. } = infer(&v, &[], Some(true), cut).unwrap();
        let steps: Vec<u8> = regions.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![1, 2, 3]);
    }

    #[test]
    fn a_wrapped_trace_starts_late_and_has_no_shape() {
        let v = rank0_from_step4_loop(3);
        let cut = Cut {
            head: true,
            tail: false,
        };
        let Fit { regions, shape, .. } = infer(&v, &[], None, cut).unwrap();
        let steps: Vec<u8> = regions.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![4, 5, 6, 7, 8, super::super::STEP_AFTER]);
        assert_eq!(shape, None, "step 4 was cut: its count says nothing");
        let fit = infer(&v, &[], None, cut).unwrap();
        assert_eq!(fit.counts[3], None, "step 4 lost its first iterations");
    }

    const CUT: Cut = Cut {
        head: false,
        tail: true,
    };

    #[test]
    fn a_cut_trace_keeps_the_counts_of_the_steps_that_ended() {
        // rank 0 of P=2 stopped in step 2: step 1's one call site started over once, the
        // depth of its chunks; a single rank (no step 1) would fit the sites too
        let v = vec![(287, Forward), (299, Forward), (301, Forward)];
        let profiles = vec![vec![0, 1, 1, 14], vec![0], vec![0]];
        let fit = infer(&v, &profiles, Some(true), CUT).unwrap();
        let steps: Vec<u8> = fit.regions.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![1, 2]);
        let shape = fit.shape.unwrap();
        assert_eq!((shape.ranks, shape.rank), (2, 0));
        assert_eq!(fit.counts[0], Some(2));
        assert_eq!(fit.counts[1], None, "the step the error stopped");
        // without the stacks' evidence step 1's count cannot be seen, and a single rank
        // (steps 2 and 4, which it fits exactly) wins
        let fit = infer(&v, &[], Some(true), CUT).unwrap();
        let steps: Vec<u8> = fit.regions.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![2, 4]);
    }

    #[test]
    fn a_cut_trace_that_leaves_the_rank_open_still_counts_its_first_step() {
        // rank 1 of P=4 stopped in step 2's second iteration: its step-2 receive says it is
        // not the first rank; step 1 ran 4 forwards, so P - r = 3, but r is not known
        let v = vec![
            (287, Forward),
            (297, Recv),
            (299, Forward),
            (300, Recv),
            (301, Forward),
            (299, Forward),
        ];
        let profiles = vec![vec![0, 3, 40], vec![], vec![], vec![], vec![], vec![]];
        let fit = infer(&v, &profiles, None, CUT).unwrap();
        let steps: Vec<u8> = fit.regions.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![1, 2]);
        assert_eq!(fit.shape, None, "rank 1 of 4 and rank 2 of 5 fit alike");
        assert_eq!(fit.counts[0], Some(4));
        assert!(fit.counts[1..].iter().all(Option::is_none));
    }

    #[test]
    fn the_first_iteration_of_step_4_is_overlapped_except_on_the_last_rank() {
        // rank 0 of P=2 stopped in step 4's first call: step 3's forward stays in step 3
        let mut v = rank0()[..7].to_vec();
        v.push((329, ForwardBackward));
        let mut profiles = vec![Vec::new(); v.len()];
        profiles[0] = vec![0, 1, 1, 9];
        let fit = infer(&v, &profiles, Some(true), CUT).unwrap();
        let step3 = fit.regions.iter().find(|r| r.0 == 3).unwrap();
        assert_eq!((step3.1, step3.2), (310, 313));
        assert_eq!(fit.counts[..3], [Some(2), Some(1), Some(1)]);
        assert_eq!(fit.counts[3], None);
        // the same call sites with regions known from the source give the same counts
        let known = |line: u32| match line {
            287 => 1,
            299 | 301 => 2,
            310..=313 => 3,
            _ => 4,
        };
        let (shape, counts) = fit_known(&v, &profiles, Some(true), CUT, known).unwrap();
        assert_eq!((shape, counts), (fit.shape, fit.counts));
    }
}

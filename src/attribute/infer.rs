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
}

/// The finest groups of call sites that step boundaries may fall between.
pub(crate) fn groups(calls: &[(u32, CallKind)]) -> Vec<Group> {
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
            out.push(Group {
                lines: members,
                kinds: current.iter().map(|c| c.1).collect(),
                iterations,
            });
            current.clear();
        }
    }
    out
}

/// Calls a step makes, in order, when its loop runs once (a superset across rank kinds).
fn body(step: u8) -> &'static [CallKind] {
    use CallKind::*;
    match step {
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

fn allowed(step: u8, kind: CallKind) -> bool {
    kind == CallKind::Other || body(step).contains(&kind) || kind == CallKind::Recv && step <= 7
}

fn is_subsequence(kinds: &[CallKind], of: &[CallKind]) -> bool {
    let mut it = of.iter();
    kinds
        .iter()
        .filter(|k| **k != CallKind::Other)
        .all(|k| it.any(|o| o == k))
}

const IMPOSSIBLE: u32 = u32::MAX / 4;

/// Cost of giving `gs` to pipeline step `step` (0 = before step 1, 9 = after step 8) when the
/// step should iterate `count` times (`None`: free, for step 4 whose count depends on the
/// number of micro-batches).
fn cost(step: u8, gs: &[Group], count: Option<u32>, at_an_end: bool) -> u32 {
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
        return if count == Some(0) || at_an_end { 0 } else { 3 };
    }
    if count == Some(0) {
        return IMPOSSIBLE;
    }
    let kinds: Vec<CallKind> = gs.iter().flat_map(|g| g.kinds.iter().copied()).collect();
    if !kinds.iter().all(|&k| allowed(step, k)) {
        return IMPOSSIBLE;
    }
    let others = 5 * kinds.iter().filter(|&&k| k == CallKind::Other).count() as u32;
    let single_pass = gs.iter().all(|g| g.iterations.unwrap_or(1) <= 1);
    let mut best = IMPOSSIBLE;
    // The loop ran once: the sites follow the step's call order.
    if count.is_none_or(|c| c == 1) && single_pass {
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
        if is_subsequence(&order, body(step)) {
            best = 0;
        }
    }
    // The loop ran several times: one interleaved group, maybe after single-pass sites (a
    // statement before the loop, or a branch taken only in the first iteration).
    if count.is_none_or(|c| c >= 2) || step == 4 {
        let (prefix, main) = gs.split_at(gs.len() - 1);
        let main = &main[0];
        let prefix_kinds: Vec<CallKind> = prefix.iter().flat_map(|g| g.kinds.clone()).collect();
        let prefix_ok = prefix.iter().all(|g| g.iterations.is_none())
            && is_subsequence(&prefix_kinds, body(step));
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
                // Iterations whose calls allocate nothing leave no trace (the last rank's
                // backward in step 6): fewer visible than the schedule's count is possible, at
                // a price that keeps exact fits first.
                Some(it) if count.is_some_and(|c| it < c && c <= it + MAX_HIDDEN) => {
                    best = best.min(prefix_cost + 2 * (count.unwrap_or(0) - it))
                }
                // One call site repeated (steps 1 and 8): its count cannot be seen.
                None if prefix.is_empty() => best = best.min(1),
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
        at_an_end: bool,
    ) -> u32 {
        let taken = &gs[g..g + take];
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
        let i =
            (((step as usize * n + g) * n + take) * COUNT_CLASSES + class) * 2 + at_an_end as usize;
        if self.slots[i] == UNKNOWN {
            self.slots[i] = cost(step, taken, count, at_an_end);
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
                let at_an_end = take == 0 && (g == 0 && cut.head || g == m && cut.tail);
                let c = memo.cost(s, gs, g, take, count, at_an_end);
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

/// The inferred step regions, with step 1..=8, or 9/10 for the code before step 1 and after
/// step 8, plus the shape that fits best.
pub(crate) fn infer(
    calls: &[(u32, CallKind)],
    first_rank: Option<bool>,
    cut: Cut,
) -> Option<(Regions, Option<Shape>)> {
    let gs = groups(calls);
    // DualPipeV's `step()` makes about twenty groups; far more is some other function.
    if gs.is_empty() || gs.len() > MAX_GROUPS {
        return None;
    }
    let mut best: Option<(u32, u32, u32, [usize; 10])> = None;
    let mut memo = CostMemo::new(gs.len());
    for ranks in 1..=32u32 {
        for rank in 0..ranks {
            let c = Shape {
                ranks,
                rank,
                chunks: 2 * ranks,
            }
            .iterations();
            let mut counts = c.map(Some);
            counts[3] = None;
            let (mut total, takes) = assign(&gs, counts, cut, &mut memo);
            if total >= IMPOSSIBLE {
                continue;
            }
            if let Some(first) = first_rank {
                if first != (rank == 0) {
                    total += 20;
                }
            }
            let better = match best {
                None => true,
                Some((t, p, _, _)) => total < t || (total == t && ranks < p),
            };
            if better {
                best = Some((total, ranks, rank, takes));
            }
        }
    }
    let (_, ranks, rank, takes) = best?;
    let expected = Shape {
        ranks,
        rank,
        chunks: 2 * ranks,
    }
    .iterations();
    let first_step = (1..=8).find(|&k| takes[k] > 0);
    let truncated_head = first_step.is_some_and(|k| (1..k).any(|j| expected[j - 1] > 0));
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
    // Step 4's count is the iterations of its interleaved group, when there is one.
    let step4 = {
        let before: usize = takes[..4].iter().sum();
        gs[before..before + takes[4]]
            .iter()
            .rev()
            .find_map(|g| g.iterations)
    };
    let shape = step4.filter(|_| !truncated_head).and_then(|c4| {
        let s = Shape {
            ranks,
            rank,
            chunks: 0,
        };
        let c = s.iterations();
        Shape::from_counts(c[1], c[2], c4)
    });
    Some((regions, shape))
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
        let gs = groups(&rank0());
        let mut shared = CostMemo::new(gs.len());
        for ranks in 1..=8u32 {
            for rank in 0..ranks {
                let mut counts = Shape {
                    ranks,
                    rank,
                    chunks: 2 * ranks,
                }
                .iterations()
                .map(Some);
                counts[3] = None;
                for cut in [
                    Cut::default(),
                    Cut {
                        head: true,
                        tail: true,
                    },
                ] {
                    let fresh = assign(&gs, counts, cut, &mut CostMemo::new(gs.len()));
                    assert_eq!(
                        assign(&gs, counts, cut, &mut shared),
                        fresh,
                        "{ranks} {rank}"
                    );
                }
            }
        }
    }

    #[test]
    fn groups_split_where_no_loop_crosses() {
        let g = groups(&rank0());
        let lines: Vec<Vec<u32>> = g.iter().map(|g| g.lines.clone()).collect();
        assert_eq!(lines[0], vec![287]);
        assert!(lines.contains(&vec![331, 332]));
        let fb = g.iter().find(|g| g.lines == vec![331, 332]).unwrap();
        assert_eq!(fb.iterations, Some(5));
    }

    #[test]
    fn rank0_regions_and_shape() {
        let (regions, shape) = infer(&rank0(), Some(true), Cut::default()).unwrap();
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
        let (regions, shape) = infer(&v, Some(false), Cut::default()).unwrap();
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
        let (regions, _) = infer(&v, Some(true), cut).unwrap();
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
        let (regions, shape) = infer(&v, None, cut).unwrap();
        let steps: Vec<u8> = regions.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![4, 5, 6, 7, 8, super::super::STEP_AFTER]);
        assert_eq!(shape, None, "step 4 was cut: its count says nothing");
    }
}

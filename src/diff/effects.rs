//! The allocated bytes of a run that is part base, part new, kept for every position of the
//! merged timeline so that the highest of them is known after each change: a segment tree
//! with range addition and the maximum over everything.
//!
//! Each node keeps the highest value below it plus what was added to its whole range, so an
//! addition touches `O(log n)` nodes and the maximum is the root, with no pushing down. A
//! set's effect applied alone ([`alone`]) is read off the tree as built, without adding: the
//! highest value of each stretch between the set's range ends, plus what the set adds there. Written
//! here because the one operation needed (add to a range, read the global maximum) is a few
//! lines, where a general-purpose tree crate would bring generic monoids for nothing.

/// Bytes added over a half-open range of positions: `(start, end, bytes)`.
pub type Range = (u32, u32, i64);

/// A half-open range of positions `[start, end)` holding `bytes` more (or fewer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// First position.
    pub start: u32,
    /// First position after it.
    pub end: u32,
    /// Bytes held over the range.
    pub bytes: u64,
}

/// Allocated bytes at every position, with their maximum.
#[derive(Clone)]
pub struct Curve {
    /// Leaves (a power of two, at least the positions).
    size: usize,
    /// Highest value in the node's range, its own additions included.
    max: Vec<i64>,
    /// What was added to the node's whole range.
    add: Vec<i64>,
    /// Whether anything was added since it was built (until then `max` holds plain maxima).
    added: bool,
}

impl Curve {
    /// A curve of `positions` positions, each starting at the value `values[p]` (positions
    /// past `values` start at the lowest value, so that they never set the maximum).
    pub fn new(values: &[i64], positions: usize) -> Curve {
        let size = positions.max(1).next_power_of_two();
        let mut max = vec![i64::MIN / 4; 2 * size];
        for (p, &v) in values.iter().enumerate().take(positions) {
            max[size + p] = v;
        }
        for n in (1..size).rev() {
            max[n] = max[2 * n].max(max[2 * n + 1]);
        }
        Curve {
            added: false,
            size,
            max,
            add: vec![0; 2 * size],
        }
    }

    /// The highest value at any position.
    pub fn max(&self) -> i64 {
        self.max[1]
    }

    /// Adds `delta` to every position in `[start, end)`: the nodes that cover the range
    /// exactly, found bottom-up, then the maxima above the range's two ends rebuilt.
    pub fn add(&mut self, start: u32, end: u32, delta: i64) {
        let (start, end) = (start as usize, (end as usize).min(self.size));
        if start >= end || delta == 0 {
            return;
        }
        self.added = true;
        let (mut l, mut r) = (start + self.size, end + self.size);
        let (first, last) = (l, r - 1);
        while l < r {
            if l & 1 == 1 {
                self.add[l] += delta;
                self.max[l] += delta;
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.add[r] += delta;
                self.max[r] += delta;
            }
            l >>= 1;
            r >>= 1;
        }
        self.rebuild(first);
        self.rebuild(last);
    }

    /// The maxima of the nodes above leaf `node`, from their children.
    fn rebuild(&mut self, mut node: usize) {
        node >>= 1;
        while node >= 1 {
            self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]) + self.add[node];
            node >>= 1;
        }
    }

    /// The highest value over positions `[start, end)` of a curve nothing was added to.
    fn range_max(&self, start: usize, end: usize) -> i64 {
        debug_assert!(!self.added);
        let (mut l, mut r) = (start + self.size, end.min(self.size) + self.size);
        let mut best = i64::MIN;
        while l < r {
            if l & 1 == 1 {
                best = best.max(self.max[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                best = best.max(self.max[r]);
            }
            l >>= 1;
            r >>= 1;
        }
        best
    }

    /// How much `set` would move the maximum of a curve nothing was added to: its ranges'
    /// ends swept in order, each stretch between two of them read at its highest, with what
    /// the ranges add there.
    fn alone_on_plain(&self, set: &[&[Range]], ends: &mut Vec<(u32, i64)>) -> i64 {
        ends.clear();
        for r in set {
            for &(a, b, d) in r.iter() {
                if a < b && d != 0 {
                    ends.push((a, d));
                    ends.push((b, -d));
                }
            }
        }
        if ends.is_empty() {
            return 0;
        }
        ends.sort_unstable_by_key(|e| e.0);
        // the stretches the set changes; those it leaves alone only where the highest
        // position is among the changed ones (else it keeps the maximum there)
        let top = self.highest();
        let sweep = |changed: bool| {
            let (mut at, mut added, mut best, mut covers) = (0usize, 0i64, i64::MIN, false);
            let mut k = 0;
            loop {
                let p = ends
                    .get(k)
                    .map_or(self.size, |e| (e.0 as usize).min(self.size));
                if at < p && (added != 0) == changed {
                    best = best.max(self.range_max(at, p).saturating_add(added));
                    covers |= (at..p).contains(&top);
                }
                if k == ends.len() {
                    break;
                }
                while ends
                    .get(k)
                    .is_some_and(|e| (e.0 as usize).min(self.size) == p)
                {
                    added += ends[k].1;
                    k += 1;
                }
                at = p;
            }
            (best, covers)
        };
        let (changed, covers) = sweep(true);
        let kept = if covers { sweep(false).0 } else { self.max() };
        changed.max(kept) - self.max()
    }

    /// A position of the highest value of a curve nothing was added to.
    fn highest(&self) -> usize {
        let mut node = 1;
        while node < self.size {
            node = if self.max[2 * node] == self.max[node] {
                2 * node
            } else {
                2 * node + 1
            };
        }
        node - self.size
    }

    /// Takes `span` away (`sign` -1) or puts it in (`sign` 1).
    pub fn apply(&mut self, span: &Span, sign: i64) {
        self.add(span.start, span.end, sign * span.bytes as i64);
    }
}

/// How much each set of ranges would move the curve's maximum, applied alone. The sets are
/// shared among the threads, each on its own copy of the curve, in runs of about equal work.
pub fn alone(curve: &Curve, sets: &[Vec<&[Range]>]) -> Vec<i64> {
    use rayon::prelude::*;
    let work = |set: &Vec<&[Range]>| set.iter().map(|r| r.len()).sum::<usize>() + 1;
    let total: usize = sets.iter().map(work).sum();
    let threads = rayon::current_num_threads().max(1);
    // cut where the work done so far passes each thread's share
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    let (mut start, mut done) = (0, 0);
    for (k, set) in sets.iter().enumerate() {
        done += work(set);
        if done * threads >= total * (runs.len() + 1) || k + 1 == sets.len() {
            runs.push(start..k + 1);
            start = k + 1;
        }
    }
    let parts: Vec<Vec<i64>> = runs
        .into_par_iter()
        .map(|run| {
            if !curve.added {
                // read only: no copy, no additions
                let mut ends = Vec::new();
                return sets[run]
                    .iter()
                    .map(|set| curve.alone_on_plain(set, &mut ends))
                    .collect();
            }
            let mut c = curve.clone();
            sets[run]
                .iter()
                .map(|set| {
                    let before = c.max();
                    set.iter()
                        .for_each(|r| r.iter().for_each(|&(a, b, d)| c.add(a, b, d)));
                    let after = c.max();
                    set.iter()
                        .for_each(|r| r.iter().for_each(|&(a, b, d)| c.add(a, b, -d)));
                    after - before
                })
                .collect()
        })
        .collect();
    parts.concat()
}

/// What replacing block `x` with block `y` adds at each position, as ranges and bytes, where
/// both start at one position (an aligned pair): the common part's change of size, then the
/// longer block's tail. Blocks that start apart are taken away and put in whole.
pub fn net(x: &Span, y: &Span) -> Vec<Range> {
    let (bx, by) = (x.bytes as i64, y.bytes as i64);
    if x.start != y.start {
        return vec![(x.start, x.end, -bx), (y.start, y.end, by)];
    }
    let common = x.end.min(y.end);
    let mut out = Vec::with_capacity(2);
    if by != bx && x.start < common {
        out.push((x.start, common, by - bx));
    }
    if y.end > common {
        out.push((common, y.end, by));
    } else if x.end > common {
        out.push((common, x.end, -bx));
    }
    out
}

/// The value at every position of spans laid over `positions` positions, from their start
/// and end points.
pub fn values(spans: impl Iterator<Item = Span>, positions: usize) -> Vec<i64> {
    let mut delta = vec![0i64; positions + 1];
    for s in spans {
        let (start, end) = (s.start as usize, (s.end as usize).min(positions));
        if start < end {
            delta[start] += s.bytes as i64;
            delta[end] -= s.bytes as i64;
        }
    }
    let mut v = 0;
    delta
        .iter()
        .take(positions)
        .map(|d| {
            v += d;
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The maximum by brute force, over the spans laid one by one.
    fn brute(spans: &[(Span, i64)], positions: usize) -> i64 {
        let mut v = vec![0i64; positions];
        for (s, sign) in spans {
            for x in v.iter_mut().take(s.end as usize).skip(s.start as usize) {
                *x += sign * s.bytes as i64;
            }
        }
        v.into_iter().max().unwrap_or(0)
    }

    /// A small deterministic generator (xorshift): the same sequence on every run, each
    /// number below the bound asked for.
    fn generator(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        }
    }

    /// `count` spans within `positions` positions, of up to 999 bytes.
    fn spans(next: &mut impl FnMut(u64) -> u64, count: usize, positions: usize) -> Vec<Span> {
        (0..count)
            .map(|_| {
                let a = next(positions as u64) as u32;
                let b = next(positions as u64 + 1) as u32;
                Span {
                    start: a.min(b),
                    end: a.max(b),
                    bytes: next(1000),
                }
            })
            .collect()
    }

    #[test]
    fn the_maximum_follows_every_addition() {
        let mut next = generator(0x9e37_79b9_7f4a_7c15);
        for positions in [1usize, 2, 3, 7, 64, 100] {
            let mut laid = Vec::new();
            let base = spans(&mut next, 20, positions);
            for s in &base {
                laid.push((*s, 1));
            }
            let mut curve = Curve::new(&values(base.iter().copied(), positions), positions);
            assert_eq!(curve.max(), brute(&laid, positions));
            for k in 0..50 {
                let s = base[k % base.len()];
                let sign = if k % 3 == 0 { 1 } else { -1 };
                curve.apply(&s, sign);
                laid.push((s, sign));
                assert_eq!(
                    curve.max(),
                    brute(&laid, positions),
                    "positions {positions}"
                );
            }
        }
    }

    #[test]
    fn effects_alone_are_each_set_added_and_taken_back() {
        let mut next = generator(0x2545_f491_4f6c_dd1d);
        for positions in [1usize, 2, 5, 33, 100] {
            let base = spans(&mut next, 15, positions);
            let values = values(base.iter().copied(), positions);
            let ranges: Vec<Vec<Range>> = (0..80)
                .map(|_| {
                    (0..next(4))
                        .map(|_| {
                            let a = next(positions as u64 + 1) as u32;
                            let b = next(positions as u64 + 1) as u32;
                            (a.min(b), a.max(b), next(1500) as i64 - 750)
                        })
                        .collect()
                })
                .collect();
            let sets: Vec<Vec<&[Range]>> = ranges
                .chunks(2)
                .map(|c| c.iter().map(|r| r.as_slice()).collect())
                .collect();
            let plain = Curve::new(&values, positions);
            let fast = alone(&plain, &sets);
            // by brute force: each set laid on the values
            let top = values.iter().copied().max().unwrap_or(0);
            for (set, got) in sets.iter().zip(&fast) {
                let mut v = values.clone();
                for r in set {
                    for &(a, b, d) in r.iter() {
                        for x in v.iter_mut().take(b as usize).skip(a as usize) {
                            *x += d;
                        }
                    }
                }
                let want = v.into_iter().max().unwrap_or(0) - top;
                assert_eq!(*got, want, "positions {positions}: {set:?}");
            }
            // and the same on a curve that was added to and taken back
            let mut touched = plain.clone();
            touched.add(0, positions as u32, 7);
            touched.add(0, positions as u32, -7);
            assert_eq!(alone(&touched, &sets), fast);
        }
    }

    #[test]
    fn a_pairs_net_change_is_both_blocks_swapped() {
        let span = |start, end, bytes| Span { start, end, bytes };
        let cases = [
            (span(2, 9, 5), span(2, 5, 5)),
            (span(2, 5, 5), span(2, 9, 8)),
            (span(2, 9, 8), span(2, 9, 3)),
            (span(2, 9, 8), span(2, 4, 3)),
            (span(1, 3, 4), span(6, 9, 4)),
            (span(3, 3, 4), span(3, 7, 4)),
        ];
        for (x, y) in cases {
            let mut swapped = vec![0i64; 10];
            let mut netted = vec![0i64; 10];
            for p in x.start..x.end {
                swapped[p as usize] -= x.bytes as i64;
            }
            for p in y.start..y.end {
                swapped[p as usize] += y.bytes as i64;
            }
            for (a, b, d) in net(&x, &y) {
                for v in netted.iter_mut().take(b as usize).skip(a as usize) {
                    *v += d;
                }
            }
            assert_eq!(swapped, netted, "{x:?} → {y:?}");
        }
    }

    #[test]
    fn values_add_up_spans() {
        let spans = [
            Span {
                start: 0,
                end: 3,
                bytes: 5,
            },
            Span {
                start: 2,
                end: 9,
                bytes: 7,
            },
        ];
        assert_eq!(values(spans.into_iter(), 4), vec![5, 5, 12, 7]);
    }
}

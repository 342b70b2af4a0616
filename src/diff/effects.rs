//! The allocated bytes of a run that is part base, part new, kept for every position of the
//! merged timeline so that the highest of them is known after each change: a segment tree
//! with range addition and the maximum over everything.
//!
//! Each node keeps the highest value below it plus what was added to its whole range, so an
//! addition touches `O(log n)` nodes and the maximum is the root, with no pushing down. Written
//! here because the one operation needed (add to a range, read the global maximum) is a few
//! lines, where a general-purpose tree crate would bring generic monoids for nothing.

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
pub struct Curve {
    /// Leaves (a power of two, at least the positions).
    size: usize,
    /// Highest value in the node's range, its own additions included.
    max: Vec<i64>,
    /// What was added to the node's whole range.
    add: Vec<i64>,
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
            size,
            max,
            add: vec![0; 2 * size],
        }
    }

    /// The highest value at any position.
    pub fn max(&self) -> i64 {
        self.max[1]
    }

    /// Adds `delta` to every position in `[start, end)`.
    pub fn add(&mut self, start: u32, end: u32, delta: i64) {
        let (start, end) = (start as usize, (end as usize).min(self.size));
        if start >= end || delta == 0 {
            return;
        }
        self.add_in(1, 0, self.size, start, end, delta);
    }

    fn add_in(&mut self, node: usize, lo: usize, hi: usize, start: usize, end: usize, d: i64) {
        if end <= lo || hi <= start {
            return;
        }
        if start <= lo && hi <= end {
            self.add[node] += d;
            self.max[node] += d;
            return;
        }
        let mid = (lo + hi) / 2;
        self.add_in(2 * node, lo, mid, start, end, d);
        self.add_in(2 * node + 1, mid, hi, start, end, d);
        self.max[node] = self.max[2 * node].max(self.max[2 * node + 1]) + self.add[node];
    }

    /// Takes `span` away (`sign` -1) or puts it in (`sign` 1).
    pub fn apply(&mut self, span: &Span, sign: i64) {
        self.add(span.start, span.end, sign * span.bytes as i64);
    }
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

    #[test]
    fn the_maximum_follows_every_addition() {
        // a small deterministic generator: the same sequence on every run
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for positions in [1usize, 2, 3, 7, 64, 100] {
            let mut laid = Vec::new();
            let base: Vec<Span> = (0..20)
                .map(|_| {
                    let a = next(positions as u64) as u32;
                    let b = next(positions as u64 + 1) as u32;
                    Span {
                        start: a.min(b),
                        end: a.max(b),
                        bytes: next(1000),
                    }
                })
                .collect();
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

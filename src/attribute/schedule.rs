//! The DualPipeV schedule: which calls each of its eight steps makes, and how often.
//!
//! `DualPipeV.step()` runs eight loops (`# Step 1` .. `# Step 8`). For pipeline rank `r` of
//! `P` ranks with `N` micro-batches the iteration counts are fixed formulas, and each
//! iteration calls the chunk functions in a fixed order with literal phases. Knowing that is
//! what lets memsnap name the phase and micro-batch of every call from a trace alone.

/// What a call site in `step()` does, from the name of the function it calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CallKind {
    /// `_forward_chunk`
    Forward,
    /// `_backward_chunk`
    Backward,
    /// `_forward_backward_chunk` (one forward and one backward, overlapped)
    ForwardBackward,
    /// `_weight_chunk` (deferred weight gradients)
    Weight,
    /// `_recv_forward` / `_recv_backward`
    Recv,
    /// `_send_forward` / `_send_backward`
    Send,
    /// `_commit_and_wait_comm` or anything else called from `step()` itself.
    Other,
}

impl CallKind {
    /// Classifies the function called from `step()`.
    pub fn of(callee: &str) -> CallKind {
        match callee {
            "_forward_chunk" => CallKind::Forward,
            "_backward_chunk" => CallKind::Backward,
            "_forward_backward_chunk" => CallKind::ForwardBackward,
            "_weight_chunk" => CallKind::Weight,
            "_recv_forward" | "_recv_backward" => CallKind::Recv,
            "_send_forward" | "_send_backward" => CallKind::Send,
            _ => CallKind::Other,
        }
    }
}

/// Pipeline shape of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    /// Number of pipeline ranks `P`.
    pub ranks: u32,
    /// This rank `r` (0-based).
    pub rank: u32,
    /// Micro-batches `N`.
    pub chunks: u32,
}

impl Shape {
    /// Iterations of steps 1..=8 (index 0 = step 1).
    pub fn iterations(&self) -> [u32; 8] {
        let (p, r, n) = (self.ranks as i64, self.rank as i64, self.chunks as i64);
        let c = [
            (p - r - 1) * 2,
            r + 1,
            p - r - 1,
            n - p * 2 + r + 1,
            p - r - 1,
            r + 1,
            p - r - 1,
            r + 1,
        ];
        c.map(|v| v.max(0) as u32)
    }

    /// Recovers the shape from the iteration counts of steps 2, 3 and 4, which are observable
    /// in a trace: `r + 1`, `P - r - 1` and `N - 2P + r + 1`.
    pub fn from_counts(step2: u32, step3: u32, step4: u32) -> Option<Shape> {
        if step2 == 0 {
            return None;
        }
        let rank = step2 - 1;
        let ranks = step2 + step3;
        let chunks = (step4 + 2 * ranks).checked_sub(rank + 1)?;
        (chunks >= 2 * ranks).then_some(Shape {
            ranks,
            rank,
            chunks,
        })
    }
}

/// The phase of the `i`-th call site of `kind` (in source order) within pipeline step `step`.
/// For `ForwardBackward` the pair `(forward phase, backward phase)` is returned.
pub fn phases(step: u8, kind: CallKind, i: usize, of: usize) -> (Option<u8>, Option<u8>) {
    use CallKind::*;
    match (step, kind) {
        (1, Forward) => (Some(0), None),
        // step 2: F0 then F1
        (2, Forward) => (Some(if i == 0 && of > 1 { 0 } else { 1 }), None),
        (2, Recv) => (Some(0), None),
        (3, Backward) => (None, Some(1)),
        (3, Recv) => (Some(1), None),
        (3, Forward) => (Some(1), None),
        // step 4: the last site is F1&B0; earlier ones (the i==0 branch) F0&B1
        (4, ForwardBackward) if i + 1 == of => (Some(1), Some(0)),
        (4, ForwardBackward) => (Some(0), Some(1)),
        (4, Forward) => (Some(0), None),
        (4, Backward) => (None, Some(1)),
        (5, Backward) => (None, Some(1)),
        (5, ForwardBackward) => (Some(1), Some(0)),
        // step 6: B1 then B0
        (6, Backward) => (None, Some(if i == 0 && of > 1 { 1 } else { 0 })),
        (7, Backward) => (None, Some(0)),
        _ => (None, None),
    }
}

/// Whether the backward of phase `phase` in pipeline step `step`, iteration `i`, defers its
/// weight gradients (zero bubble), for a rank of the given shape.
pub fn zero_bubble(step: u8, phase: u8, i: u32, shape: &Shape) -> bool {
    match step {
        3 | 7 => true,
        6 => {
            let half = shape.iterations()[5] / 2;
            let odd = shape.rank % 2 == 1;
            if phase == 1 {
                i > half || (i == half && odd)
            } else {
                i >= half
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_counts_match_the_reference_table() {
        let s = |p, r, n| Shape {
            ranks: p,
            rank: r,
            chunks: n,
        };
        assert_eq!(s(2, 0, 8).iterations(), [2, 1, 1, 5, 1, 1, 1, 1]);
        assert_eq!(s(2, 1, 8).iterations(), [0, 2, 0, 6, 0, 2, 0, 2]);
        assert_eq!(s(4, 1, 16).iterations(), [4, 2, 2, 10, 2, 2, 2, 2]);
        assert_eq!(s(4, 3, 8).iterations(), [0, 4, 0, 4, 0, 4, 0, 4]);
        assert_eq!(s(1, 0, 4).iterations(), [0, 1, 0, 3, 0, 1, 0, 1]);
        // every rank runs N + 3P - r - 1 iterations
        for (p, n) in [(2, 8), (4, 8), (4, 16), (8, 20)] {
            for r in 0..p {
                let total: u32 = s(p, r, n).iterations().iter().sum();
                assert_eq!(total, n + 3 * p - r - 1);
            }
        }
    }

    #[test]
    fn shape_from_observable_counts() {
        for (p, n) in [(2, 8), (4, 8), (4, 16), (1, 4), (8, 20)] {
            for r in 0..p {
                let c = Shape {
                    ranks: p,
                    rank: r,
                    chunks: n,
                }
                .iterations();
                let got = Shape::from_counts(c[1], c[2], c[3]).unwrap();
                assert_eq!((got.ranks, got.rank, got.chunks), (p, r, n));
            }
        }
        assert_eq!(Shape::from_counts(0, 1, 1), None);
    }

    #[test]
    fn deferred_backward_count_is_r_plus_1_in_step_6() {
        for (p, n) in [(2, 8), (4, 8), (3, 9)] {
            for r in 0..p {
                let shape = Shape {
                    ranks: p,
                    rank: r,
                    chunks: n,
                };
                let c6 = shape.iterations()[5];
                let deferred: u32 = (0..c6)
                    .map(|i| {
                        zero_bubble(6, 1, i, &shape) as u32 + zero_bubble(6, 0, i, &shape) as u32
                    })
                    .sum();
                assert_eq!(deferred, r + 1, "P={p} r={r}");
            }
        }
    }
}

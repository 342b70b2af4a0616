//! Scale: the program's requests at another problem size (batch, sequence length, micro-batches
//! per step), predicted from snapshots of the same program at other sizes, for the allocator
//! [`model`](super::model) to run as it runs a recorded [`Program`].
//!
//! **From two or more snapshots.** The allocations of each snapshot are aligned with those of
//! the base snapshot (the one nearest the size asked for) by what made them: stream, call
//! site and whether the block was a workspace freed before the next request, in order, with
//! the Myers diff of the `similar` crate. Each aligned request's size is then fitted as a
//! function of the size parameter by the simplest form that every snapshot agrees with to the
//! byte: constant, proportional, proportional to the square, a line with a fixed part, a
//! parabola. Bytes are whole numbers, so "agrees" means exactly, and a form the snapshots do
//! not pin down (a line through two points, a parabola through three) is said to be unverified.
//! Requests found in one snapshot only keep the base snapshot's size.
//!
//! **Streams that grow.** Where the number of requests grows with the size (micro-batches: each
//! one more iteration of a pipeline's main loop), the requests that the base snapshot has and
//! the next smaller one lacks are the growth. The longest run of them is repeated at its place
//! as many times as the size asked for needs, and each free in and after the copies is given
//! the allocation it freed in the recorded stream, counted back by call site (the third-newest
//! allocation of that site stays the third-newest), so that an activation freed two iterations
//! after it was made still is.
//!
//! **From one snapshot.** Sizes scale by category: activations, temporaries and inputs in
//! proportion to the size, the rest (parameters, gradients, optimizer state, workspaces, what
//! was alive before the trace) constant. This is the weaker estimate and the report says so.
//!
//! The fits are a few lines of exact integer arithmetic; only the alignment, a diff of long
//! sequences, is left to a library.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHasher};
use serde::Serialize;
use similar::{capture_diff_slices_deadline, Algorithm, DiffOp};

use super::program::{Op, Program};
use crate::analysis::DeviceAnalysis;
use crate::attribute::category::Category;
use crate::snapshot::{StackId, MAX_REAL_SIZE};

/// How long the alignment of two request streams may take before the diff settles for a
/// coarser answer.
const DIFF_DEADLINE: Duration = Duration::from_secs(20);

/// A stream grows with the size when the larger snapshot has this share more requests per
/// share more size (micro-batches: about 1; a batch size: a few cuDNN workspaces, about 0.01).
const GROWING_STREAM: f64 = 0.25;

/// The innermost frames that name a request's call site. The outer ones say which iteration
/// or which warm-up of a loop made it (`step` at one line for the first iteration and another
/// for the rest), which the repetition of a growing stream must not tell apart.
const SITE_FRAMES: usize = 5;

/// The most ops a growing stream may gain: the predicted program is held in memory, and its
/// request ids are 32-bit.
const MAX_ADDED_OPS: usize = 50_000_000;

/// One snapshot of the program at a known value of the size parameter.
pub struct Sample<'a, 's> {
    /// The size parameter's value.
    pub size: u64,
    /// The snapshot's analysed device.
    pub analysis: &'a DeviceAnalysis<'s>,
}

/// How a request's size depends on the size parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Growth {
    /// The same in every snapshot.
    Constant,
    /// In proportion to the size.
    Proportional,
    /// In proportion to the square of the size (attention scores over the sequence).
    Square,
    /// A fixed part and a part in proportion.
    Line,
    /// A fixed part, a part in proportion and a part in the square.
    Parabola,
    /// No form fits every snapshot exactly: kept at the base snapshot's size.
    Inexact,
    /// Found in the base snapshot only: kept at its size.
    Unmatched,
}

impl Growth {
    /// The words of the text report.
    pub fn as_str(self) -> &'static str {
        match self {
            Growth::Constant => "constant",
            Growth::Proportional => "proportional",
            Growth::Square => "square",
            Growth::Line => "line",
            Growth::Parabola => "parabola",
            Growth::Inexact => "without an exact fit, kept",
            Growth::Unmatched => "in one snapshot only, kept",
        }
    }
}

/// A request's size as a function of the size: `c0 + c1·u + c2·u²`, with `u` the size divided
/// by the largest snapshot's size (which keeps the arithmetic well conditioned).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// The form.
    pub growth: Growth,
    /// Whether a snapshot beyond those the form needs agrees with it.
    pub verified: bool,
    coef: [f64; 3],
}

impl Fit {
    fn constant(bytes: u64, growth: Growth, verified: bool) -> Fit {
        Fit {
            growth,
            verified,
            coef: [bytes as f64, 0.0, 0.0],
        }
    }

    /// The predicted bytes at `u`: at least one byte (a request does not vanish), at most
    /// the largest size a device could hold (beyond it the allocator refuses the request).
    pub fn at(&self, u: f64) -> u64 {
        let [c0, c1, c2] = self.coef;
        let v = c0 + c1 * u + c2 * u * u;
        if v.is_nan() || v < 1.0 {
            1
        } else {
            v.round().min(MAX_REAL_SIZE as f64) as u64
        }
    }
}

/// Fits the points `(size, bytes)` (distinct sizes, the base first) by the simplest form they
/// all agree with. `scale` divides the sizes. With `strict`, a form the points do not verify
/// is not used: the request keeps the base's bytes (`Inexact`).
pub fn fit(points: &[(u64, u64)], scale: f64, strict: bool) -> Fit {
    let base = points[0].1;
    if points.len() < 2 {
        return Fit::constant(base, Growth::Unmatched, false);
    }
    let n = points.len();
    let (x0, s0) = (points[0].0 as i128, points[0].1 as i128);
    let all = |f: &dyn Fn(i128, i128) -> bool| points.iter().all(|&(x, s)| f(x as i128, s as i128));
    if all(&|_, s| s == s0) {
        return Fit::constant(base, Growth::Constant, true);
    }
    let u = |x: u64| x as f64 / scale;
    if all(&|x, s| {
        s.checked_mul(x0)
            .is_some_and(|l| Some(l) == s0.checked_mul(x))
    }) {
        return Fit {
            growth: Growth::Proportional,
            verified: true,
            coef: [0.0, s0 as f64 / u(points[0].0), 0.0],
        };
    }
    // (the products may pass i128 for sizes near 2^64: then the form does not fit)
    let product = |a: i128, b: i128, c: i128| a.checked_mul(b).and_then(|p| p.checked_mul(c));
    if all(&|x, s| product(s, x0, x0).is_some_and(|l| Some(l) == product(s0, x, x))) {
        let u0 = u(points[0].0);
        return Fit {
            growth: Growth::Square,
            verified: true,
            coef: [0.0, 0.0, s0 as f64 / (u0 * u0)],
        };
    }
    let (x1, s1) = (points[1].0 as i128, points[1].1 as i128);
    if all(&|x, s| {
        let left = (s - s0).checked_mul(x1 - x0);
        left.is_some() && left == (s1 - s0).checked_mul(x - x0)
    }) {
        let (u0, u1) = (u(points[0].0), u(points[1].0));
        let c1 = (s1 - s0) as f64 / (u1 - u0);
        let line = Fit {
            growth: Growth::Line,
            verified: n >= 3,
            coef: [s0 as f64 - c1 * u0, c1, 0.0],
        };
        return if line.verified || !strict {
            line
        } else {
            Fit::constant(base, Growth::Inexact, false)
        };
    }
    // n >= 3 here: two points always lie on a line
    let us: Vec<f64> = points.iter().map(|&(x, _)| u(x)).collect();
    let ss: Vec<f64> = points.iter().map(|&(_, s)| s as f64).collect();
    let parabola = through_three(&us[..3], &ss[..3]);
    let agrees = (3..n).all(|i| {
        let p = Fit {
            growth: Growth::Parabola,
            verified: true,
            coef: parabola,
        };
        (p.at(us[i]) as f64 - ss[i]).abs() <= 0.5
    });
    if agrees && (n >= 4 || !strict) {
        return Fit {
            growth: Growth::Parabola,
            verified: n >= 4,
            coef: parabola,
        };
    }
    Fit::constant(base, Growth::Inexact, false)
}

/// The parabola through three points (Lagrange's form expanded into coefficients).
fn through_three(u: &[f64], s: &[f64]) -> [f64; 3] {
    let mut c = [0.0; 3];
    for i in 0..3 {
        let (j, k) = ((i + 1) % 3, (i + 2) % 3);
        let d = (u[i] - u[j]) * (u[i] - u[k]);
        let w = s[i] / d;
        // (u - uj)(u - uk) = u² - (uj + uk)u + uj·uk
        c[0] += w * u[j] * u[k];
        c[1] -= w * (u[j] + u[k]);
        c[2] += w;
    }
    c
}

/// What the fits decided, for one form: how many requests, and their bytes alive at the base
/// snapshot's allocated peak, at the base size and at the size asked for.
#[derive(Clone, Debug, Serialize)]
pub struct FitGroup {
    /// The form.
    pub growth: Growth,
    /// Requests fitted by it.
    pub requests: usize,
    /// Of those, fitted by a form no further snapshot checked.
    pub unverified: usize,
    /// Their bytes alive at the base snapshot's allocated peak.
    pub bytes_at_base_peak: u64,
    /// The same requests' bytes at the size asked for.
    pub bytes_at_target: u64,
}

/// How a growing stream was extended.
#[derive(Clone, Debug, Serialize)]
pub struct Repeat {
    /// Requests per unit of size, from the base and the next smaller snapshot.
    pub requests_per_unit: f64,
    /// The run of requests repeated (the longest the smaller snapshot lacks).
    pub run_requests: usize,
    /// Requests added by the repetition.
    pub added_requests: usize,
    /// Frees in the repeated run of what the loop's warm-up made: the run is not a steady
    /// iteration and the prediction less sure (0 for a steady one).
    pub unsteady_frees: usize,
}

/// The program at another size, and how it was made.
#[derive(Clone, Debug)]
pub struct Scaled {
    /// The requests, for [`super::simulate`] with the base snapshot's start.
    pub program: Program,
    /// The size asked for.
    pub size: u64,
    /// The sample it was built from (index into the samples given).
    pub base: usize,
    /// Per form, in [`Growth`] order.
    pub groups: Vec<FitGroup>,
    /// Set when the stream grows with the size.
    pub repeat: Option<Repeat>,
}

/// How sizes are predicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Each request fitted across two or more snapshots.
    Fit,
    /// One snapshot: activations, temporaries and inputs in proportion, the rest constant.
    Categories,
    /// One snapshot of a DualPipeV rank, the size its number of micro-batches: the main
    /// loop's iterations repeated (one per micro-batch), the batch's input in proportion.
    Schedule,
}

/// Why a prediction cannot be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ScaleError {
    /// The stream grows with the size and the size asked for is below the largest snapshot.
    #[error(
        "the request stream grows with the size ({per_unit:.1} requests per unit), so it is \
         predicted upwards only: {target} is below the largest snapshot's size {largest}"
    )]
    Shrink {
        /// The size asked for.
        target: u64,
        /// The largest snapshot's size.
        largest: u64,
        /// Requests per unit.
        per_unit: f64,
    },
    /// The size asked for would repeat the loop more than memory allows.
    #[error(
        "size {target} repeats the loop into {ops} more ops, past the {most} a prediction \
         holds: predict a nearer size"
    )]
    TooLarge {
        /// The size asked for.
        target: u64,
        /// Ops it would add.
        ops: u128,
        /// The most allowed.
        most: usize,
    },
    /// The prediction would take more memory than the process's allowance.
    #[error(
        "predicting size {target} needs about {} of memory, past the allowance of {} \
         (--max-memory raises it): predict a nearer size",
        crate::units::bytes(*needed),
        crate::units::bytes(*allowance)
    )]
    Memory {
        /// The size asked for.
        target: u64,
        /// What the prediction would hold, at least.
        needed: u64,
        /// The allowance.
        allowance: u64,
    },
    /// One pipeline rank whose main loop ran too few iterations to repeat one.
    #[error(
        "rank {rank} ran {chunks} micro-batches, which is {iterations} iteration(s) of the \
         pipeline's main loop (step 4): too few to repeat a steady one; give a snapshot at more \
         micro-batches, or two snapshots"
    )]
    FewIterations {
        /// Iterations of step 4.
        iterations: usize,
        /// Micro-batches.
        chunks: u32,
        /// The rank.
        rank: u32,
    },
    /// The streams share too little to be the same program.
    #[error(
        "the snapshots at sizes {a} and {b} are not the same program: only {matched} of {total} \
         requests align by call site"
    )]
    Diverged {
        /// One size.
        a: u64,
        /// The other.
        b: u64,
        /// Requests aligned.
        matched: usize,
        /// Requests of the base.
        total: usize,
    },
}

/// One allocation of a program, as the alignment sees it.
#[derive(Clone, Copy, Debug)]
struct Req {
    /// Index in `Program::ops`.
    op: usize,
    /// Call site, stream and kind of life.
    token: u64,
    bytes: u64,
    /// Index in `Program::ops` of its free, if the trace frees it.
    freed: Option<usize>,
}

/// The allocations of a sample's program in order, with their alignment tokens.
fn requests(a: &DeviceAnalysis, program: &Program) -> Vec<Req> {
    let snap = a.snap;
    let events = snap.trace(a.device());
    let mut site: HashMap<StackId, u64> = HashMap::new();
    // each allocation's free; a request freed before the next one is asked for lives like a
    // workspace (told by counting allocations, not by scanning each life)
    let n = program.ops.len();
    let mut freed_by: Vec<Option<usize>> = vec![None; n];
    let mut freed_at_once = vec![false; n];
    let mut allocs_before = Vec::with_capacity(n);
    let mut allocs = 0;
    let mut last_alloc: FxHashMap<u32, usize> = FxHashMap::default();
    for (k, &(_, op)) in program.ops.iter().enumerate() {
        allocs_before.push(allocs);
        match op {
            Op::Alloc { req, .. } => {
                last_alloc.insert(req, k);
                allocs += 1;
            }
            Op::Free { req, .. } => {
                if let Some(&at) = last_alloc.get(&req) {
                    if freed_by[at].is_none() {
                        freed_by[at] = Some(k);
                        freed_at_once[at] = allocs_before[k] == allocs_before[at] + 1;
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (k, &(event, op)) in program.ops.iter().enumerate() {
        let Op::Alloc { size, stream, .. } = op else {
            continue;
        };
        let stack = events[event].stack;
        let frames = *site.entry(stack).or_insert_with(|| {
            let mut h = FxHasher::default();
            for f in snap.stacks.frames(stack).take(SITE_FRAMES) {
                snap.str(f.filename).hash(&mut h);
                snap.str(f.name).hash(&mut h);
                f.line.hash(&mut h);
            }
            h.finish()
        });
        let mut h = FxHasher::default();
        (frames, stream, freed_at_once[k]).hash(&mut h);
        out.push(Req {
            op: k,
            token: h.finish(),
            bytes: size,
            freed: freed_by[k],
        });
    }
    out
}

/// For each request of `base`, its partner in `other` (by index), aligned by token.
fn align(base: &[Req], other: &[Req]) -> Vec<Option<usize>> {
    let a: Vec<u64> = base.iter().map(|r| r.token).collect();
    let b: Vec<u64> = other.iter().map(|r| r.token).collect();
    let mut map = vec![None; base.len()];
    for (i, j) in equal_pairs(&a, &b, DIFF_DEADLINE).0 {
        map[i] = Some(j);
    }
    map
}

/// The positions of `a` and `b` that the Myers diff pairs as equal, in order, and whether the
/// diff finished within `time` (else it settled for a coarser alignment).
pub fn equal_pairs(a: &[u64], b: &[u64], time: Duration) -> (Vec<(usize, usize)>, bool) {
    let deadline = Instant::now() + time;
    let out = equal_pairs_until(a, b, deadline);
    (out, Instant::now() < deadline)
}

/// The positions of `a` and `b` that the Myers diff pairs as equal, in order, working until
/// `deadline` at most (then with a coarser alignment); equal sequences pair at once.
pub fn equal_pairs_until(a: &[u64], b: &[u64], deadline: Instant) -> Vec<(usize, usize)> {
    if a == b {
        return (0..a.len()).map(|k| (k, k)).collect();
    }
    let mut out = Vec::new();
    for op in capture_diff_slices_deadline(Algorithm::Myers, a, b, Some(deadline)) {
        if let DiffOp::Equal {
            old_index,
            new_index,
            len,
        } = op
        {
            out.extend((0..len).map(|k| (old_index + k, new_index + k)));
        }
    }
    out
}

/// The runs of `base` requests without a partner: `(first, end)` in request order.
fn unmatched_runs(map: &[Option<usize>]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, m) in map.iter().enumerate() {
        match (m, start) {
            (None, None) => start = Some(i),
            (Some(_), Some(s)) => {
                runs.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, map.len()));
    }
    runs
}

/// The requests of `base` repeated once per unit of size: `(first, end, one unit)`.
///
/// A loop's iteration is found by a marker: a call site that the base has exactly `units`
/// more times than the smaller snapshot (once per unit), whose consecutive occurrences are
/// about `per_unit` requests apart. The window runs from one occurrence to the next, inside
/// the stretch the smaller snapshot lacks, so that it holds whole iterations even when their
/// lengths vary a little (a mixture of experts routes tokens differently in each). Without a
/// marker, the longest run the smaller snapshot lacks (not one unit: `false`).
fn repeat_window(
    program: &Program,
    base: &[Req],
    small: &[Req],
    map: &[Option<usize>],
    units: u64,
    per_unit: f64,
) -> Option<Window> {
    let runs = unmatched_runs(map);
    let longest = runs.iter().copied().max_by_key(|&(s, e)| e - s);
    let centre = longest.map_or(base.len() as f64 / 2.0, |(s, e)| (s + e) as f64 / 2.0);
    let mut count: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
    for r in base {
        count.entry(r.token).or_default().0 += 1;
    }
    for r in small {
        count.entry(r.token).or_default().1 += 1;
    }
    let mut at: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    for (i, r) in base.iter().enumerate() {
        let (b, a) = count[&r.token];
        if b == a + units {
            at.entry(r.token).or_default().push(i);
        }
    }
    let period_like = |g: usize| (g as f64 - per_unit).abs() <= 0.1 * per_unit;
    let best = at
        .values()
        .map(|o| {
            let score = o.windows(2).filter(|w| period_like(w[1] - w[0])).count();
            (score, std::cmp::Reverse(o.len()), o)
        })
        .filter(|(score, _, _)| *score > 0)
        .max_by(|x, y| {
            (x.0, x.1)
                .cmp(&(y.0, y.1))
                .then_with(|| y.2[0].cmp(&x.2[0]))
        });
    if let Some((_, _, o)) = best {
        // a steady iteration frees only what its own call sites make (an early one still
        // frees what the warm-up made, once): fewest such frees first, then nearest the centre
        let token_of = freed_tokens(program, base);
        let foreign = |w: &[usize]| foreign_frees(base, &token_of, w[0], w[1]);
        let d = |w: &[usize]| ((w[0] + w[1]) as f64 / 2.0 - centre).abs();
        let w = o
            .windows(2)
            .filter(|w| period_like(w[1] - w[0]))
            .map(|w| (foreign(w), d(w), w))
            .min_by(|x, y| x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)))
            .expect("a period-like pair");
        return Some(Window {
            first: w.2[0],
            end: w.2[1],
            one_unit: true,
            unsteady: w.0,
        });
    }
    longest.map(|(s, e)| Window {
        first: s,
        end: e,
        one_unit: false,
        unsteady: 0,
    })
}

/// For one snapshot of a DualPipeV rank whose size is its number of micro-batches: one
/// iteration of the main loop (step 4) to repeat per micro-batch more, and which requests are
/// freed where the base frees them, past the copies: all but those both made and freed in
/// steps 1 to 8 (per-micro-batch results kept for the caller, what came before the schedule).
///
/// The iteration runs between two occurrences of a call site that step 4 allocates exactly
/// once per iteration: the one whose iterations free least of what other sites made (an early
/// iteration still frees activations of the warm-up steps), the latest of those.
fn schedule_window(
    sample: &Sample,
    program: &Program,
    reqs: &[Req],
) -> Result<Option<(Window, Vec<bool>)>, ScaleError> {
    let a = sample.analysis;
    let Some(pipeline) = &a.attribution.pipeline else {
        return Ok(None);
    };
    let Some(shape) = pipeline.shape else {
        return Ok(None);
    };
    if !pipeline.chunks_known || u64::from(shape.chunks) != sample.size {
        return Ok(None);
    }
    let iterations = shape.iterations()[3] as usize;
    let few = ScaleError::FewIterations {
        iterations,
        chunks: shape.chunks,
        rank: shape.rank,
    };
    if iterations < 2 {
        return Err(few);
    }
    let labels = &a.attribution.labels;
    let step_of = |i: usize| labels[program.ops[reqs[i].op].0].pipe_step;
    let mut at: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    for (i, r) in reqs.iter().enumerate() {
        if step_of(i) == 4 {
            at.entry(r.token).or_default().push(i);
        }
    }
    let token_of = freed_tokens(program, reqs);
    let foreign = |w: &[usize]| foreign_frees(reqs, &token_of, w[0], w[1]);
    let Some(window) = at
        .values()
        // (the last rank runs its first iteration's halves apart, from other sites)
        .filter(|o| o.len() == iterations || o.len() + 1 == iterations)
        .flat_map(|o| {
            o.windows(2)
                .map(|w| (foreign(w), std::cmp::Reverse(w[1]), w[0], w[1]))
        })
        .min()
    else {
        return Err(few);
    };
    let in_steps = |step: u8| (1..=8).contains(&step);
    let to_end = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.freed.is_some_and(|f| {
                !(in_steps(step_of(i)) && in_steps(labels[program.ops[f].0].pipe_step))
            })
        })
        .collect();
    Ok(Some((
        Window {
            first: window.2,
            end: window.3,
            one_unit: true,
            unsteady: window.0,
        },
        to_end,
    )))
}

/// How many ops each request of `reqs` lived (`None`: never freed in the trace).
fn lives(reqs: &[Req]) -> Vec<Option<usize>> {
    reqs.iter().map(|r| r.freed.map(|f| f - r.op)).collect()
}

/// Which requests of the base live until after a growing stream's loop, whenever they were
/// made: those of a call site whose aligned requests live longer in the base than in the
/// smaller snapshot, at the median, by more than half the ops the stream grew by. (An
/// activation freed a few iterations later lives as long in both; the median keeps a request
/// aligned with one an iteration away from deciding for its site.)
fn grown_lives(
    (base, base_reqs): (&Program, &[Req]),
    (small, small_reqs): (&Program, &[Req]),
    map: &[Option<usize>],
) -> Vec<bool> {
    let grown = base.ops.len().saturating_sub(small.ops.len()) as i64;
    let (lb, ls) = (lives(base_reqs), lives(small_reqs));
    let mut longer: FxHashMap<u64, Vec<i64>> = FxHashMap::default();
    for (i, m) in map.iter().enumerate() {
        if let (Some(b), Some(a)) = (lb[i], m.and_then(|j| ls[j])) {
            longer
                .entry(base_reqs[i].token)
                .or_default()
                .push(b as i64 - a as i64);
        }
    }
    let to_end: FxHashMap<u64, bool> = longer
        .into_iter()
        .map(|(t, mut d)| {
            let mid = d.len() / 2;
            let median = *d.select_nth_unstable(mid).1;
            (t, 2 * median > grown)
        })
        .collect();
    base_reqs
        .iter()
        .zip(&lb)
        .map(|(r, life)| life.is_some() && to_end.get(&r.token).copied().unwrap_or(false))
        .collect()
}

/// Requests repeated to grow a stream.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// The first request repeated.
    first: usize,
    /// The request after the last one repeated.
    end: usize,
    /// Whether the window is one unit of size (one loop iteration).
    one_unit: bool,
    /// Frees in the window of requests made before it by call sites it does not repeat: an
    /// iteration still ending the warm-up, not a steady one.
    unsteady: usize,
}

/// The frees among the ops of requests `first..end` (up to request `end`'s op, or the last op)
/// of requests made by call sites the window does not hold: what a window that is not a steady
/// iteration still frees of the warm-up. `token_of` is [`freed_tokens`]'s.
fn foreign_frees(reqs: &[Req], token_of: &[Option<u64>], first: usize, end: usize) -> usize {
    let stop = reqs.get(end).map_or(token_of.len(), |r| r.op);
    let made: rustc_hash::FxHashSet<u64> = reqs[first..end].iter().map(|r| r.token).collect();
    (reqs[first].op..stop)
        .filter(|&k| token_of[k].is_some_and(|t| !made.contains(&t)))
        .count()
}

/// For each op of `program` that frees a request of `reqs`, the token of that request.
fn freed_tokens(program: &Program, reqs: &[Req]) -> Vec<Option<u64>> {
    let mut out = vec![None; program.ops.len()];
    for r in reqs {
        if let Some(f) = r.freed {
            out[f] = Some(r.token);
        }
    }
    out
}

/// The program of the base sample at each size of `targets`, from `samples` (any order, at
/// least one, distinct sizes), handed to `each` one size at a time, so that only one predicted
/// program is held at once; the memory allowance is checked before each is built and as it
/// grows.
pub fn scale(
    samples: &[Sample],
    targets: &[u64],
    mut each: impl FnMut(Scaled) -> Result<(), ScaleError>,
) -> Result<Method, ScaleError> {
    let p = Prepared::new(samples)?;
    for &target in targets {
        each(p.scaled(samples, target)?)?;
    }
    Ok(p.method)
}

/// What every size is predicted from: each sample's program and requests, how the stream
/// grows, and the method.
struct Prepared {
    programs: Vec<Program>,
    reqs: Vec<Vec<Req>>,
    /// Sample indices, smallest size first.
    order: Vec<usize>,
    /// One pipeline rank's schedule: the window of one micro-batch, and the lives that run to
    /// the end.
    schedule: Option<(Window, Vec<bool>)>,
    method: Method,
    largest: usize,
    /// When the stream grows with the size: the next smaller sample and requests per unit.
    growing: Option<(usize, f64)>,
}

/// The run repeated to grow a stream (none when no run fits), its copies, and the requests per
/// unit of size.
type RepeatPlan = (Option<Window>, usize, f64);

/// The samples aligned with one base: the others, and each one's request for each of the
/// base's.
struct Aligned {
    base: usize,
    others: Vec<usize>,
    maps: Vec<Vec<Option<usize>>>,
}

impl Aligned {
    /// The map of sample `o` (one of `others`).
    fn map_of(&self, o: usize) -> &[Option<usize>] {
        let k = self
            .others
            .iter()
            .position(|&x| x == o)
            .expect("the smaller sample");
        &self.maps[k]
    }
}

impl Prepared {
    fn new(samples: &[Sample]) -> Result<Prepared, ScaleError> {
        let programs: Vec<Program> = samples
            .iter()
            .map(|s| Program::new(s.analysis.snap, &s.analysis.replay))
            .collect();
        let reqs: Vec<Vec<Req>> = samples
            .iter()
            .zip(&programs)
            .map(|(s, p)| requests(s.analysis, p))
            .collect();
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by_key(|&i| samples[i].size);
        // one pipeline rank whose size is its number of micro-batches: the schedule says how
        // its stream grows
        let schedule = match samples {
            [one] => schedule_window(one, &programs[0], &reqs[0])?,
            _ => None,
        };
        let method = match (samples.len(), &schedule) {
            (1, Some(_)) => Method::Schedule,
            (1, None) => Method::Categories,
            _ => Method::Fit,
        };
        let largest = *order.last().expect("at least one sample");
        // does the stream grow with the size? (the two largest snapshots say)
        let growing = (samples.len() >= 2).then(|| {
            let small = order[order.len() - 2];
            let (nb, na) = (reqs[largest].len() as f64, reqs[small].len() as f64);
            let (xb, xa) = (samples[largest].size as f64, samples[small].size as f64);
            let per_unit = (nb - na) / (xb - xa);
            let relative = ((nb - na) / na.max(1.0)) / ((xb - xa) / xa);
            (relative >= GROWING_STREAM).then_some((small, per_unit))
        });
        Ok(Prepared {
            programs,
            reqs,
            order,
            schedule,
            method,
            largest,
            growing: growing.flatten(),
        })
    }

    /// The program at size `target`.
    fn scaled(&self, samples: &[Sample], target: u64) -> Result<Scaled, ScaleError> {
        let base = self.base_for(samples, target)?;
        let aligned = self.align_with(samples, base)?;
        let unit = samples[self.largest].size as f64;
        let fits = self.fits(samples, &aligned, unit);
        let u = target as f64 / unit;
        let to_end = self.lives_to_end(&aligned);
        let repeat_plan = self.repeat_plan(samples, &aligned, target)?;
        let (program, reqs) = (&self.programs[base], &self.reqs[base]);
        let built = build(
            program,
            reqs,
            &fits,
            u,
            repeat_plan.and_then(|(w, copies, _)| w.map(|w| (w.first, w.end, copies))),
            &to_end,
        )
        .map_err(|(needed, allowance)| ScaleError::Memory {
            target,
            needed,
            allowance,
        })?;
        let groups = groups(program, samples[base].analysis, reqs, &fits, u);
        let added = built.allocations - reqs.len();
        Ok(Scaled {
            program: built.program,
            size: target,
            base,
            groups,
            repeat: repeat_plan.map(|(window, _, per_unit)| Repeat {
                requests_per_unit: per_unit,
                run_requests: window.map_or(0, |w| w.end - w.first),
                added_requests: added,
                unsteady_frees: window.map_or(0, |w| w.unsteady),
            }),
        })
    }

    /// The sample a size is built from: the largest when the stream grows (no smaller size
    /// than it), else the nearest in size (the larger of two as near).
    fn base_for(&self, samples: &[Sample], target: u64) -> Result<usize, ScaleError> {
        match (self.growing, &self.schedule) {
            (None, Some((w, _))) if target < samples[0].size => Err(ScaleError::Shrink {
                target,
                largest: samples[0].size,
                per_unit: (w.end - w.first) as f64,
            }),
            (Some((_, per_unit)), _) => {
                if target < samples[self.largest].size {
                    return Err(ScaleError::Shrink {
                        target,
                        largest: samples[self.largest].size,
                        per_unit,
                    });
                }
                Ok(self.largest)
            }
            (None, _) => Ok(*self
                .order
                .iter()
                .min_by_key(|&&i| (samples[i].size.abs_diff(target), u64::MAX - samples[i].size))
                .expect("at least one sample")),
        }
    }

    /// Every other sample's requests aligned with the base's; samples that share less than
    /// half their requests are not one program.
    fn align_with(&self, samples: &[Sample], base: usize) -> Result<Aligned, ScaleError> {
        let reqs = &self.reqs;
        let others: Vec<usize> = self.order.iter().copied().filter(|&i| i != base).collect();
        let maps: Vec<Vec<Option<usize>>> = others
            .iter()
            .map(|&o| align(&reqs[base], &reqs[o]))
            .collect();
        for (k, &o) in others.iter().enumerate() {
            let matched = maps[k].iter().filter(|m| m.is_some()).count();
            let total = reqs[base].len();
            if total > 0 && matched * 2 < total.min(reqs[o].len()) {
                return Err(ScaleError::Diverged {
                    a: samples[base].size,
                    b: samples[o].size,
                    matched,
                    total,
                });
            }
        }
        Ok(Aligned { base, others, maps })
    }

    /// Each base request's size as a function of the size: by category for one snapshot,
    /// fitted through the aligned requests for several.
    fn fits(&self, samples: &[Sample], aligned: &Aligned, unit: f64) -> Vec<Fit> {
        let base = aligned.base;
        let reqs = &self.reqs[base];
        match self.method {
            Method::Categories | Method::Schedule => {
                let a = samples[base].analysis;
                reqs.iter()
                    .map(|r| {
                        let event = self.programs[base].ops[r.op].0;
                        let category = a.attribution.labels[event].category;
                        let scales = if self.method == Method::Schedule {
                            category == Category::Input
                        } else {
                            matches!(
                                category,
                                Category::Activation | Category::Temporary | Category::Input
                            )
                        };
                        if scales {
                            Fit {
                                growth: Growth::Proportional,
                                verified: false,
                                coef: [
                                    0.0,
                                    r.bytes as f64 / (samples[base].size as f64 / unit),
                                    0.0,
                                ],
                            }
                        } else {
                            Fit::constant(r.bytes, Growth::Constant, false)
                        }
                    })
                    .collect()
            }
            Method::Fit => (0..reqs.len())
                .map(|i| {
                    let mut points = vec![(samples[base].size, reqs[i].bytes)];
                    for (k, &o) in aligned.others.iter().enumerate() {
                        if let Some(j) = aligned.maps[k][i] {
                            points.push((samples[o].size, self.reqs[o][j].bytes));
                        }
                    }
                    fit(&points, unit, self.growing.is_some())
                })
                .collect(),
        }
    }

    /// Which base requests live to the end of the trace when the stream is grown.
    fn lives_to_end(&self, aligned: &Aligned) -> Vec<bool> {
        let base = aligned.base;
        match self.growing {
            Some((small, _)) => grown_lives(
                (&self.programs[base], &self.reqs[base]),
                (&self.programs[small], &self.reqs[small]),
                aligned.map_of(small),
            ),
            None => match &self.schedule {
                Some((_, to_end)) => to_end.clone(),
                None => vec![false; self.reqs[base].len()],
            },
        }
    }

    /// The run of requests repeated to grow the stream, how many copies, and the requests
    /// per unit of size; refused when the copies would add more than [`MAX_ADDED_OPS`].
    fn repeat_plan(
        &self,
        samples: &[Sample],
        aligned: &Aligned,
        target: u64,
    ) -> Result<Option<RepeatPlan>, ScaleError> {
        let base = aligned.base;
        let plan = match &self.schedule {
            Some((w, _)) => Some((
                Some(*w),
                (target - samples[base].size) as usize,
                (w.end - w.first) as f64,
            )),
            None => self.growing.map(|(small, per_unit)| {
                let units = samples[base].size - samples[small].size;
                let window = repeat_window(
                    &self.programs[base],
                    &self.reqs[base],
                    &self.reqs[small],
                    aligned.map_of(small),
                    units,
                    per_unit,
                );
                let copies = match window {
                    Some(w) if w.one_unit => (target - samples[base].size) as usize,
                    // a run that is not one unit: as many whole copies as the requests need
                    Some(w) => {
                        let want = per_unit * (target - samples[base].size) as f64;
                        (want / (w.end - w.first) as f64).round() as usize
                    }
                    None => 0,
                };
                (window, copies, per_unit)
            }),
        };
        if let Some((Some(w), copies, _)) = plan {
            let reqs = &self.reqs[base];
            let n_ops = self.programs[base].ops.len();
            let end = reqs.get(w.end).map_or(n_ops, |r| r.op);
            let ops = (end - reqs[w.first].op) as u128 * copies as u128;
            if ops > MAX_ADDED_OPS as u128 {
                return Err(ScaleError::TooLarge {
                    target,
                    ops,
                    most: MAX_ADDED_OPS,
                });
            }
        }
        Ok(plan)
    }
}

/// Requests alive at the base's allocated peak, by form.
fn groups(
    program: &Program,
    a: &DeviceAnalysis,
    reqs: &[Req],
    fits: &[Fit],
    u: f64,
) -> Vec<FitGroup> {
    // made by the peak's event and not freed by it
    let live_at_peak = |r: &Req| {
        a.replay.peaks.allocated.event.is_some_and(|peak| {
            program.ops[r.op].0 <= peak && r.freed.is_none_or(|f| program.ops[f].0 > peak)
        })
    };
    let mut by: std::collections::BTreeMap<Growth, FitGroup> = Default::default();
    for f in fits {
        let g = by.entry(f.growth).or_insert(FitGroup {
            growth: f.growth,
            requests: 0,
            unverified: 0,
            bytes_at_base_peak: 0,
            bytes_at_target: 0,
        });
        g.requests += 1;
        g.unverified += usize::from(
            !f.verified && f.growth != Growth::Unmatched && f.growth != Growth::Inexact,
        );
    }
    for (r, f) in reqs.iter().zip(fits).filter(|(r, _)| live_at_peak(r)) {
        if let Some(g) = by.get_mut(&f.growth) {
            g.bytes_at_base_peak = g.bytes_at_base_peak.saturating_add(r.bytes);
            g.bytes_at_target = g.bytes_at_target.saturating_add(f.at(u));
        }
    }
    by.into_values().collect()
}

struct Built {
    program: Program,
    allocations: usize,
}

/// The base program with each request at its fitted size, and, for a growing stream, the
/// requests `(first, end, copies)` repeated `copies` times after `end`.
///
/// Refused with `(bytes needed, allowance)` when the new stream would not fit in the memory
/// allowance: estimated before anything is built, and checked again as it is placed.
///
/// Every free is placed anew from the life of its allocation in the base: a request freed by
/// the loop lives as many ops as it did in the base, so an activation made in a copy is freed
/// as many iterations later as in the base; a request that `to_end` marks (its life grew with
/// the stream: freed after the loop, whenever it was made) is freed where the base frees it,
/// moved past the copies. Each allocation is thus freed once, whatever the copies hold.
fn build(
    base: &Program,
    reqs: &[Req],
    fits: &[Fit],
    u: f64,
    repeat: Option<(usize, usize, usize)>,
    to_end: &[bool],
) -> Result<Built, (u64, u64)> {
    let n_ops = base.ops.len();
    let slots_wanted = match repeat {
        Some((s, e, copies)) if e > s && copies > 0 => {
            let op_end = if e < reqs.len() { reqs[e].op } else { n_ops };
            n_ops.saturating_add(copies.saturating_mul(op_end - reqs[s].op))
        }
        _ => n_ops,
    };
    // the slots, the ops placed (half again for frees) and the program made of them
    let per_slot = std::mem::size_of::<(usize, bool)>()
        + std::mem::size_of::<(usize, u8, Op)>()
        + std::mem::size_of::<(usize, Op)>();
    let needed = (slots_wanted as u64).saturating_mul(per_slot as u64);
    crate::memory::check(needed).map_err(|max| (needed, max))?;
    let mut req_at_op: Vec<u32> = vec![u32::MAX; n_ops];
    for (i, r) in reqs.iter().enumerate() {
        req_at_op[r.op] = i as u32;
    }
    // each allocation's free and completion in the base, by its id
    let mut freed: FxHashMap<u32, (usize, bool)> = FxHashMap::default();
    let mut completed: FxHashMap<u32, usize> = FxHashMap::default();
    for (k, &(_, op)) in base.ops.iter().enumerate() {
        match op {
            Op::Free { req, now } => {
                freed.entry(req).or_insert((k, now));
            }
            Op::Complete { req } => {
                completed.entry(req).or_insert(k);
            }
            _ => {}
        }
    }
    // the base op of each slot of the new stream, and whether the slot is in a copy
    let mut seq: Vec<(usize, bool)> = Vec::with_capacity(n_ops);
    let (mut shift, mut tail_from) = (0usize, n_ops);
    match repeat {
        Some((s, e, copies)) if e > s && copies > 0 => {
            let op_end = if e < reqs.len() { reqs[e].op } else { n_ops };
            let op_start = reqs[s].op;
            seq.extend((0..op_end).map(|k| (k, false)));
            for _ in 0..copies {
                seq.extend((op_start..op_end).map(|k| (k, true)));
            }
            seq.extend((op_end..n_ops).map(|k| (k, false)));
            shift = copies * (op_end - op_start);
            tail_from = op_end;
        }
        _ => seq.extend((0..n_ops).map(|k| (k, false))),
    }
    let slots = seq.len();
    let image = |k: usize| if k >= tail_from { k + shift } else { k };
    let before_id = |req: u32| -> u32 { req - base.events as u32 + slots as u32 };
    let is_before = |req: u32| req >= base.events as u32;
    // (slot, frees before the slot's own op, op)
    let mut placed: Vec<(usize, u8, Op)> = Vec::with_capacity(slots + slots / 2);
    let mut allocations = 0;
    for (at, &(k, copy)) in seq.iter().enumerate() {
        if at % (1 << 20) == 0 {
            crate::memory::check(0).map_err(|max| (needed, max))?;
        }
        match base.ops[k].1 {
            Op::Alloc {
                req, stream, pool, ..
            } => {
                let i = req_at_op[k] as usize;
                let id = at as u32;
                allocations += 1;
                placed.push((
                    at,
                    1,
                    Op::Alloc {
                        req: id,
                        size: fits[i].at(u),
                        stream,
                        pool,
                    },
                ));
                if let Some(&(f, now)) = freed.get(&req) {
                    let slot = if to_end[i] { image(f) } else { at + (f - k) };
                    placed.push((slot, 0, Op::Free { req: id, now }));
                    if let Some(&c) = completed.get(&req) {
                        placed.push((slot + c.saturating_sub(f), 0, Op::Complete { req: id }));
                    }
                }
            }
            Op::Free { req, now } if is_before(req) && !copy => placed.push((
                at,
                0,
                Op::Free {
                    req: before_id(req),
                    now,
                },
            )),
            Op::Complete { req } if is_before(req) && !copy => placed.push((
                at,
                0,
                Op::Complete {
                    req: before_id(req),
                },
            )),
            Op::Free { .. } | Op::Complete { .. } => {}
            // the recorded run stopped there: at another size the program would have gone on,
            // and what it asked for next is unknown
            Op::Fail { .. } => {}
            other => placed.push((at, 1, other)),
        }
    }
    placed.sort_by_key(|&(slot, order, _)| (slot, order));
    let last = slots.saturating_sub(1);
    let mut program = base.clone();
    program.events = slots;
    program.ops = placed
        .into_iter()
        .map(|(slot, _, op)| (slot.min(last), op))
        .collect();
    for b in &mut program.before {
        b.req = before_id(b.req);
    }
    Ok(Built {
        program,
        allocations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(points: &[(u64, u64)], strict: bool) -> Fit {
        fit(points, 1.0, strict)
    }

    #[test]
    fn the_simplest_exact_form_is_chosen() {
        assert_eq!(f(&[(32, 4096), (16, 4096)], false).growth, Growth::Constant);
        let p = f(&[(32, 6144), (16, 3072)], false);
        assert_eq!((p.growth, p.verified), (Growth::Proportional, true));
        assert_eq!(p.at(128.0), 24576);
        let q = f(&[(512, 4 * 512 * 512), (256, 4 * 256 * 256)], false);
        assert_eq!(q.growth, Growth::Square);
        assert_eq!(q.at(2048.0), 4 * 2048 * 2048);
        // a fixed part and a part in proportion: a line, unverified through two points
        let l = f(&[(32, 1000 + 32 * 7), (16, 1000 + 16 * 7)], false);
        assert_eq!((l.growth, l.verified), (Growth::Line, false));
        assert_eq!(l.at(100.0), 1700);
        // strict (a growing stream): an unverified line keeps the base's bytes
        let s = f(&[(32, 1000 + 32 * 7), (16, 1000 + 16 * 7)], true);
        assert_eq!((s.growth, s.at(100.0)), (Growth::Inexact, 1224));
        // three points on a line verify it
        let v = f(
            &[
                (64, 1000 + 64 * 7),
                (16, 1000 + 16 * 7),
                (32, 1000 + 32 * 7),
            ],
            true,
        );
        assert_eq!(
            (v.growth, v.verified, v.at(128.0)),
            (Growth::Line, true, 1896)
        );
    }

    #[test]
    fn a_parabola_needs_three_points_and_a_fourth_verifies_it() {
        let s = |x: u64| 100 + 3 * x + 2 * x * x;
        let p = f(&[(4, s(4)), (1, s(1)), (2, s(2))], false);
        assert_eq!((p.growth, p.verified), (Growth::Parabola, false));
        assert_eq!(p.at(10.0), s(10));
        let v = f(&[(8, s(8)), (1, s(1)), (2, s(2)), (4, s(4))], true);
        assert_eq!(
            (v.growth, v.verified, v.at(10.0)),
            (Growth::Parabola, true, s(10))
        );
        // a fourth point off the parabola: no exact fit
        let x = f(&[(8, s(8) + 512), (1, s(1)), (2, s(2)), (4, s(4))], false);
        assert_eq!((x.growth, x.at(10.0)), (Growth::Inexact, s(8) + 512));
        // large sizes stay exact in the scaled coordinates
        let big = |x: u64| 7 * x * x + 3 * x + 1_000_000_000;
        let g = fit(
            &[(2048, big(2048)), (256, big(256)), (512, big(512))],
            2048.0,
            false,
        );
        assert_eq!(g.at(4096.0 / 2048.0), big(4096));
    }

    #[test]
    fn sizes_near_two_to_the_64_do_not_overflow() {
        let big = u64::MAX - 1;
        let p = f(&[(big, 1 << 47), (big / 2, 1 << 46), (3, 5)], false);
        assert!(p.at(1.0) >= 1);
        let q = f(&[(big, 1 << 47), (1, 1 << 40)], true);
        assert_eq!(q.growth, Growth::Inexact);
    }

    #[test]
    fn any_points_give_a_fit_without_panic() {
        // a small linear congruential generator: every kind of size and byte count
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state >> (state % 60)
        };
        for _ in 0..20_000 {
            let n = 1 + (next() % 5) as usize;
            let mut points: Vec<(u64, u64)> = Vec::new();
            while points.len() < n {
                let x = next().max(1);
                if points.iter().all(|p| p.0 != x) {
                    points.push((x, next() % (1 << 48)));
                }
            }
            let scale = points.iter().map(|p| p.0).max().unwrap() as f64;
            let fitted = fit(&points, scale, next() % 2 == 0);
            let at = fitted.at(next() as f64 / scale);
            assert!((1..=MAX_REAL_SIZE).contains(&at));
        }
    }

    #[test]
    fn one_point_is_unmatched_and_sizes_never_vanish() {
        let one = f(&[(8, 1234)], false);
        assert_eq!((one.growth, one.at(100.0)), (Growth::Unmatched, 1234));
        let down = f(&[(32, 100), (16, 1100)], false);
        assert_eq!(down.growth, Growth::Line);
        assert_eq!(down.at(64.0), 1);
    }

    #[test]
    fn runs_without_partner_are_found() {
        let m = [Some(0), None, None, Some(1), None];
        assert_eq!(unmatched_runs(&m), vec![(1, 3), (4, 5)]);
        assert!(unmatched_runs(&[Some(0)]).is_empty());
    }

    fn program(ops: Vec<Op>) -> Program {
        Program {
            device: 0,
            events: ops.len(),
            ops: ops.into_iter().enumerate().collect(),
            before: Vec::new(),
            recorded_segments: Vec::new(),
            start_streams: Vec::new(),
            pools: vec![crate::snapshot::PoolId::DEFAULT],
            private_pools: false,
            refusals: Vec::new(),
        }
    }

    #[test]
    fn a_repeated_run_frees_what_its_iteration_made_two_iterations_later() {
        // a loop whose iteration i allocates A_i and frees A_{i-2}; after it, the last two are
        // freed. Every A is of one call site.
        let mut ops = Vec::new();
        let mut made = Vec::new();
        for i in 0..5usize {
            let id = ops.len() as u32;
            made.push(id);
            ops.push(Op::Alloc {
                req: id,
                size: 100,
                stream: 0,
                pool: 0,
            });
            if i >= 2 {
                ops.push(Op::Free {
                    req: made[i - 2],
                    now: true,
                });
            }
        }
        for &id in &made[3..] {
            ops.push(Op::Free { req: id, now: true });
        }
        let base = program(ops);
        let reqs: Vec<Req> = base
            .ops
            .iter()
            .enumerate()
            .filter(|(_, (_, o))| matches!(o, Op::Alloc { .. }))
            .map(|(k, _)| Req {
                op: k,
                token: 7,
                bytes: 100,
                freed: None,
            })
            .collect();
        let fits: Vec<Fit> = reqs
            .iter()
            .map(|_| Fit::constant(100, Growth::Constant, true))
            .collect();
        // iteration 2 and 3 (requests 2 and 3) repeated twice, before iteration 4
        let built = build(&base, &reqs, &fits, 1.0, Some((2, 4, 2)), &[false; 5]).unwrap();
        assert_eq!(built.allocations, 9);
        let p = built.program;
        assert_eq!(p.events, base.ops.len() + 2 * 4);
        // every allocation freed exactly once, after it was made; at most three live at once
        let mut live = std::collections::HashSet::new();
        let mut most = 0;
        let mut last_event = 0;
        for &(event, o) in &p.ops {
            assert!(event >= last_event && event < p.events);
            last_event = event;
            match o {
                Op::Alloc { req, .. } => assert!(live.insert(req)),
                Op::Free { req, .. } => assert!(live.remove(&req), "free of {req} not live"),
                _ => {}
            }
            most = most.max(live.len());
        }
        assert!(live.is_empty());
        assert_eq!(most, 3);
        // the same requests freed after the loop stay live through the copies
        let to_end = [false, false, true, true, false];
        let q = build(&base, &reqs, &fits, 1.0, Some((2, 4, 2)), &to_end)
            .unwrap()
            .program;
        let (mut live, mut most) = (0i32, 0);
        for &(_, o) in &q.ops {
            live += match o {
                Op::Alloc { .. } => 1,
                Op::Free { .. } => -1,
                _ => 0,
            };
            most = most.max(live);
        }
        // the six of requests 2 and 3 and their copies, and the last iteration's
        assert_eq!((live, most), (0, 7));
    }
}

//! Memory categories, in the vocabulary of `torch.profiler`'s memory timeline.
//!
//! Each allocation gets the first category whose rule holds:
//!
//! 1. **pre-existing**: alive before recording started (parameters, gradients and optimizer
//!    state of earlier steps, anything else allocated before the trace);
//! 2. **communication**: pipeline receive buffers, all-to-all and collective buffers, FSDP
//!    all-gather/reduce-scatter buffers (by op, stage or frames);
//! 3. **optimizer state**: allocated in the optimizer and still alive at the end of the trace
//!    (freed optimizer allocations are temporaries);
//! 4. **gradient**: allocated by a weight-gradient op (DualPipeV `W` chunks, `AccumulateGrad`),
//!    or allocated in backward and either alive at the end or freed by the optimizer phase
//!    (`zero_grad`);
//! 5. **activation**: allocated in forward and freed by a later call (backward, or a later
//!    send), or alive at the end;
//! 6. **temporary**: freed within the call (pipeline op, or phase segment) that allocated it;
//! 7. **unknown**: anything else.

use serde::Serialize;

use super::{frames, Label, Names, Phase};
use crate::replay::{Replay, NONE};
use crate::snapshot::{Action, Snapshot};

/// What an allocation is for.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Not determined.
    #[default]
    Unknown,
    /// Alive before the trace started.
    PreExisting,
    /// Parameters (only from custom rules: a snapshot cannot tell them from other old blocks).
    Parameter,
    /// Gradients.
    Gradient,
    /// Optimizer state.
    OptimizerState,
    /// Activations saved for backward, and outputs.
    Activation,
    /// Short-lived buffers.
    Temporary,
    /// Communication buffers.
    Communication,
}

impl Category {
    /// Every category, in display order.
    pub const ALL: [Category; 8] = [
        Category::PreExisting,
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Communication,
        Category::Unknown,
    ];

    /// Lower-case name, as in the JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Unknown => "unknown",
            Category::PreExisting => "pre-existing",
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Communication => "communication",
        }
    }

    /// Parses a name (as written by [`Category::as_str`], with `_` or `-` for spaces).
    pub fn parse(s: &str) -> Option<Category> {
        let s = s.replace(['_', '-'], " ");
        Category::ALL
            .into_iter()
            .find(|c| c.as_str().replace('-', " ") == s)
    }
}

fn is_comm_text(t: &str) -> bool {
    let t = t.to_ascii_lowercase();
    t.contains("receive buffer")
        || t.contains("all-to-all")
        || t.contains("all_to_all")
        || t.contains("a2a")
        || t.contains("fsdp")
        || t == "recv"
        || t == "send"
}

/// A frame of collective communication: NCCL and c10d symbols, `torch.distributed` Python
/// code, DDP's gradient buckets.
pub(crate) fn is_comm_frame(snap: &Snapshot, f: &crate::snapshot::Frame) -> bool {
    let n = snap.str(f.name);
    let file = snap.str(f.filename);
    n.contains("all_to_all")
        || n.contains("all_gather")
        || n.contains("reduce_scatter")
        || n.contains("batch_isend_irecv")
        || n.contains("c10d::")
        || n.contains("ProcessGroupNCCL")
        || (f.line > 0 && file.contains("torch/distributed/"))
        || is_ddp_bucket_frame(n, file)
}

/// DDP's gradient buckets: built by its reducer in the first forward (`_pre_forward` rebuilds
/// them), or by the C++ reducer itself.
fn is_ddp_bucket_frame(name: &str, file: &str) -> bool {
    (file.ends_with("torch/nn/parallel/distributed.py")
        && (name == "_pre_forward" || name.contains("bucket") || name.contains("reducer")))
        || name.contains("c10d::Reducer")
}

/// Facts about label texts, computed once per text.
struct NameFacts {
    comm: Vec<bool>,
    weight_op: Vec<bool>,
    accumulate: Vec<bool>,
}

impl NameFacts {
    fn new(names: &Names, count: usize) -> NameFacts {
        let ids = (0..count.min(u16::MAX as usize + 1)).map(|i| super::NameId(i as u16));
        let texts: Vec<&str> = ids.map(|id| names.get(id)).collect();
        NameFacts {
            comm: texts.iter().map(|t| is_comm_text(t)).collect(),
            weight_op: texts
                .iter()
                .map(|t| t.starts_with('W') && t.len() <= 2)
                .collect(),
            accumulate: texts.iter().map(|t| *t == "AccumulateGrad").collect(),
        }
    }

    fn get(v: &[bool], id: super::NameId) -> bool {
        v.get(id.0 as usize).copied().unwrap_or(false)
    }
}

/// Sets the category of every allocation (and copies it to the frees that end them).
pub(crate) fn assign(
    snap: &Snapshot,
    replay: &Replay,
    names: &Names,
    labels: &mut [Label],
    preexisting: &mut [Label],
) {
    for l in preexisting.iter_mut() {
        l.category = Category::PreExisting;
    }
    let events = snap.trace(replay.device);
    let mut stack_cache = frames::PerStack::new(snap);
    let facts = NameFacts::new(names, names.len());
    for i in 0..events.len() {
        if events[i].action != Action::Alloc {
            continue;
        }
        let l = labels[i];
        let free = replay.partner[i];
        let freed = (free != NONE).then(|| labels[free as usize]);
        let same_call = freed.is_some_and(|f| f.call == l.call && l.call != u32::MAX);
        let stack = events[i].stack;
        let (comm, accumulate) = stack_cache.get(stack, || {
            (
                frames::stack_has(snap, stack, frames::COMMUNICATION),
                frames::stack_has(snap, stack, frames::ACCUMULATE_GRAD),
            )
        });
        let weight_grad = accumulate
            || NameFacts::get(&facts.weight_op, l.op)
            || NameFacts::get(&facts.accumulate, l.detail);
        let category = if l.phase == Phase::Communication
            || comm
            || NameFacts::get(&facts.comm, l.stage)
            || NameFacts::get(&facts.comm, l.op)
        {
            Category::Communication
        } else if l.phase == Phase::Optimizer {
            if freed.is_none() {
                Category::OptimizerState
            } else {
                Category::Temporary
            }
        } else if weight_grad {
            Category::Gradient
        } else if l.phase == Phase::Backward {
            match freed {
                None => Category::Gradient,
                Some(f) if f.phase == Phase::Optimizer => Category::Gradient,
                _ => Category::Temporary,
            }
        } else if same_call {
            Category::Temporary
        } else if l.phase == Phase::Forward {
            Category::Activation
        } else {
            Category::Unknown
        };
        labels[i].category = category;
    }
    for i in 0..events.len() {
        if events[i].action != Action::Alloc {
            let p = replay.partner[i];
            if p != NONE && p & crate::replay::PREEXISTING == 0 {
                labels[i].category = labels[p as usize].category;
            } else if p != NONE {
                labels[i].category = Category::PreExisting;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in Category::ALL {
            assert_eq!(Category::parse(c.as_str()), Some(c));
        }
        assert_eq!(
            Category::parse("optimizer_state"),
            Some(Category::OptimizerState)
        );
        assert_eq!(Category::parse("pre_existing"), Some(Category::PreExisting));
        assert_eq!(Category::parse("nope"), None);
    }
}

//! Evidence from the code that made or freed a block: PyTorch's own code paths, read from the
//! frames its files leave on the stack.
//!
//! An allocation's stack is read from the innermost frame outwards, and the first frame that
//! says something decides:
//! - **parameter**: `Module._apply` and the other set-up methods of `torch/nn/modules/module.py`
//!   (`to`, `cuda`, `half`, `register_buffer`, `load_state_dict`), `torch/nn/parameter.py`,
//!   `torch/nn/init.py`, the constructors and `reset_parameters` of `torch/nn/modules/*`,
//!   `register_parametrization`, FSDP's sharded parameters;
//! - **optimizer state**: an optimizer initialising its state (`_init_group`) or loading it;
//! - **gradient**: autograd's `AccumulateGrad` (C++ frames);
//! - **communication**: DDP's buckets and reducer (`torch/nn/parallel/distributed.py`),
//!   FSDP's all-gathers, `torch.distributed` and NCCL;
//! - **workspace**: cuBLAS, cuBLASLt and cuDNN workspaces (C++ frames);
//! - **input**: data loaders and the loops' batch transfer helpers (`move_data_to_device`,
//!   `send_to_device`, `_prepare_inputs`) outside the phases, and data the program itself put
//!   on the device outside the phases (its own code the innermost frame) and kept beyond that
//!   stretch of the program: `Tensor.to` from program code, however long the data lives;
//! - a module call (`Module.__call__`) says nothing: what runs in a forward is decided by its
//!   life.
//!
//! A free's stack adds one fact: a block freed inside `zero_grad` (the optimizer's or the
//! module's, however a loop wraps it) is a **gradient**, since `zero_grad` drops `.grad` and
//! nothing else.

use super::evidence::{Evidence, Ledger};
use super::frames::{self, PerStack};
use super::{Category, Labels, Names, Phase};
use crate::replay::{Replay, NONE};
use crate::snapshot::{Action, Snapshot, StackId};

/// What the code on an allocation's stack says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Made {
    /// A category, from PyTorch's (or a loop's) own code.
    By(Category),
    /// The program's own code, outside any PyTorch code path (`Tensor.to`, a factory call);
    /// `init` when that code is a constructor (a module's or a dataset's: no claim).
    Program { init: bool },
    /// Nothing to say (a module call, an optimizer's arithmetic, no frames).
    Nothing,
}

/// Set-up methods of `torch.nn.Module`.
fn is_module_setup(name: &str) -> bool {
    matches!(
        name,
        "_apply"
            | "convert"
            | "to"
            | "cuda"
            | "half"
            | "float"
            | "double"
            | "bfloat16"
            | "type"
            | "to_empty"
            | "register_buffer"
            | "register_parameter"
            | "load_state_dict"
            | "_load_from_state_dict"
            | "__setstate__"
    )
}

/// Running a module: `Module.__call__` and its machinery.
fn is_module_call(name: &str) -> bool {
    matches!(
        name,
        "_call_impl" | "_wrapped_call_impl" | "__call__" | "forward"
    )
}

/// What the frames of `stack` say of the allocation it made.
fn made_by(snap: &Snapshot, stack: StackId) -> Made {
    for f in snap.stacks.frames(stack) {
        let name = snap.str(f.name);
        if !frames::is_python(&f) {
            if name.contains("AccumulateGrad") {
                return Made::By(Category::Gradient);
            }
            if name.contains("Workspace") || name.contains("getCurrentCUDABlasHandle") {
                return Made::By(Category::Workspace);
            }
            if name.contains("c10d::") || name.contains("ProcessGroupNCCL") || name.contains("nccl")
            {
                return Made::By(Category::Communication);
            }
            continue;
        }
        let file = snap.str(f.filename);
        if file.ends_with("torch/nn/modules/module.py") {
            if is_module_call(name) || name == "zero_grad" {
                return Made::Nothing;
            }
            if is_module_setup(name) {
                return Made::By(Category::Parameter);
            }
            continue;
        }
        if file.ends_with("torch/nn/parameter.py") || file.ends_with("torch/nn/init.py") {
            return Made::By(Category::Parameter);
        }
        if file.contains("torch/nn/modules/")
            && matches!(name, "__init__" | "reset_parameters" | "_reset_parameters")
        {
            return Made::By(Category::Parameter);
        }
        if file.ends_with("torch/nn/utils/parametrize.py") {
            if name == "register_parametrization" {
                return Made::By(Category::Parameter);
            }
            // the parametrized weight computed again in each forward
            return Made::Nothing;
        }
        if file.contains("torch/optim/") {
            return if matches!(
                name,
                "_init_group"
                    | "_init_state"
                    | "load_state_dict"
                    | "_process_value_according_to_param_policy"
                    | "__setstate__"
            ) {
                Made::By(Category::OptimizerState)
            } else {
                // the update's arithmetic: state or temporary, by its life
                Made::Nothing
            };
        }
        if file.ends_with("torch/nn/parallel/distributed.py") {
            // DDP's own: gradient buckets, the reducer's buffers
            return Made::By(Category::Communication);
        }
        if file.contains("torch/distributed/fsdp") || file.contains("torch/distributed/_composable")
        {
            return fsdp(snap, stack);
        }
        if file.contains("torch/distributed/") {
            return Made::By(Category::Communication);
        }
        if frames::is_batch_transfer(file, name) {
            return Made::By(Category::Input);
        }
        if file.ends_with("torch/utils/checkpoint.py") {
            return Made::Nothing;
        }
        if frames::is_plumbing_file(file) {
            continue;
        }
        return Made::Program {
            init: name == "__init__",
        };
    }
    Made::Nothing
}

/// FSDP's code: its sharded parameters (made when a module is sharded) and the unsharded ones
/// (the all-gathers' outputs, which the module's parameters are during its forward and
/// backward) are **parameters**; a reduce-scatter's output holds the sharded gradients, so its
/// life decides; the rest of its buffers are **communication**.
fn fsdp(snap: &Snapshot, stack: StackId) -> Made {
    let names: Vec<&str> = snap
        .stacks
        .frames(stack)
        .filter(|f| {
            let file = snap.str(f.filename);
            file.contains("torch/distributed/fsdp")
                || file.contains("torch/distributed/_composable")
        })
        .map(|f| snap.str(f.name))
        .collect();
    if names
        .iter()
        .any(|n| n.contains("reduce") || n.contains("post_backward"))
    {
        Made::Nothing
    } else if names.iter().any(|n| {
        n.contains("init_sharded")
            || *n == "fully_shard"
            || n.contains("alloc_storage")
            || n.contains("all_gather_outputs")
            || *n == "init_unsharded_param"
    }) {
        Made::By(Category::Parameter)
    } else {
        Made::By(Category::Communication)
    }
}

/// The category of the block allocation `i` replaces, when the same line of code frees a
/// parameter's or optimizer state's storage right beside it (a tensor's data swapped for a
/// converted copy: PEFT casting its adapters, `p.data = p.data.half()`).
fn replaced(
    events: &[crate::snapshot::TraceEvent],
    replay: &Replay,
    ledger: &Ledger,
    i: usize,
) -> Option<Category> {
    let near = i.saturating_sub(4)..(i + 5).min(events.len());
    near.filter(|&k| k != i)
        .filter(|&k| {
            events[k].action == Action::FreeRequested && events[k].stack == events[i].stack
        })
        .filter_map(|k| {
            let p = replay.partner[k];
            (p != NONE && p & crate::replay::PREEXISTING == 0)
                .then(|| ledger.current(p as usize))
                .flatten()
        })
        .map(|(c, _)| c)
        .find(|c| matches!(c, Category::Parameter | Category::OptimizerState))
}

/// Whether the code on a free's stack is `zero_grad`, which drops gradients.
fn frees_gradients(snap: &Snapshot, stack: StackId) -> bool {
    snap.stacks
        .frames(stack)
        .any(|f| frames::is_python(&f) && snap.str(f.name) == "zero_grad")
}

/// Adds the code-path evidence of every allocation of a generic trace: what made it, and
/// whether `zero_grad` freed it. `run` numbers the stretches of events of one step, phase and
/// micro-batch (data the program makes and drops within one stretch is no input).
pub(crate) fn add(
    snap: &Snapshot,
    replay: &Replay,
    names: &Names,
    labels: &Labels,
    run: &[u32],
    ledger: &mut Ledger,
) {
    let events = snap.trace(replay.device);
    let n = events.len().min(labels.len());
    let mut made = PerStack::new(snap);
    let mut freeing = PerStack::new(snap);
    for i in 0..n {
        let e = &events[i];
        if e.action != Action::Alloc {
            continue;
        }
        let l = &labels[i];
        let free = replay.partner[i];
        let freed = (free != NONE).then_some(free as usize);
        if let Some(f) = freed.filter(|&f| f < n) {
            if freeing.get(events[f].stack, || frees_gradients(snap, events[f].stack)) {
                ledger.add(i, Evidence::Code, Category::Gradient);
            }
        }
        if names.get(l.op) == "recompute" {
            // activation checkpointing running the forward again inside backward
            ledger.add(i, Evidence::Code, Category::Activation);
            continue;
        }
        let outside = l.phase == Phase::Other && names.get(l.op) != "zero_grad";
        let by = made.get(e.stack, || made_by(snap, e.stack));
        if matches!(by, Made::Program { .. }) && outside {
            if let Some(c) = replaced(events, replay, ledger, i) {
                // `p.data = p.data.to(dtype)`: the new storage takes the old one's place
                ledger.add(i, Evidence::Code, c);
                continue;
            }
        }
        match by {
            Made::By(Category::Input) if !outside => {}
            Made::By(c) => ledger.add(i, Evidence::Code, c),
            Made::Program { init: false } if outside => {
                let kept = freed.is_none_or(|f| f >= n || run[f] != run[i]);
                if kept {
                    ledger.add(i, Evidence::Code, Category::Input);
                }
            }
            Made::Program { .. } | Made::Nothing => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_calls_and_setup_are_told_apart() {
        assert!(is_module_setup("_apply"));
        assert!(is_module_setup("load_state_dict"));
        assert!(!is_module_setup("forward"));
        assert!(is_module_call("_call_impl"));
        assert!(frames::is_batch_transfer("x.py", "move_data_to_device"));
        assert!(frames::is_batch_transfer(
            "/v/site-packages/torch/utils/data/_utils/pin_memory.py",
            "pin"
        ));
        assert!(!frames::is_batch_transfer("/home/u/train.py", "main"));
    }
}

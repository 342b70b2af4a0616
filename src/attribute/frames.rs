//! Reading stacks: which frames are noise, which are PyTorch's, which are the program's.

use crate::snapshot::{Frame, FrameId, Snapshot, StackId};

/// A Python frame of the program itself ([`is_python`] and not [`is_library`]).
pub(crate) const PROGRAM: u8 = 1;
/// A frame of collective communication (NCCL, c10d, `torch.distributed`, DDP buckets).
pub(crate) const COMMUNICATION: u8 = 2;
/// A frame of autograd's gradient accumulation into `.grad`.
pub(crate) const ACCUMULATE_GRAD: u8 = 4;

/// The facts ([`PROGRAM`], ...) of every distinct frame, by frame id. Each distinct stack is
/// read several times, and a snapshot has a few thousand frames in tens of thousands of
/// stacks: the string tests run once per frame instead of once per frame of every stack.
fn facts(snap: &Snapshot) -> &[u8] {
    snap.frame_facts.get_or_init(|| {
        (0..snap.stacks.frame_count() as u32)
            .map(|i| {
                let f = snap.stacks.frame(FrameId(i));
                let mut facts = 0;
                if is_python(&f) && !is_library(snap, &f) {
                    facts |= PROGRAM;
                }
                if is_comm_frame(snap, &f) {
                    facts |= COMMUNICATION;
                }
                if snap.str(f.name).contains("AccumulateGrad") {
                    facts |= ACCUMULATE_GRAD;
                }
                facts
            })
            .collect()
    })
}

/// A frame of collective communication: NCCL and c10d symbols, `torch.distributed` Python
/// code, DDP's gradient buckets.
fn is_comm_frame(snap: &Snapshot, f: &Frame) -> bool {
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

/// Whether frame `id` has `fact`, in the table [`facts`] made.
fn has(facts: &[u8], id: FrameId, fact: u8) -> bool {
    facts.get(id.0 as usize).is_some_and(|f| f & fact != 0)
}

/// Whether frame `id` is the program's own Python code ([`PROGRAM`]), read from the table
/// of frame facts instead of testing its file name again.
pub(crate) fn is_program_frame(snap: &Snapshot, id: FrameId) -> bool {
    has(facts(snap), id, PROGRAM)
}

/// Whether any frame of `stack` has `fact`.
pub(crate) fn stack_has(snap: &Snapshot, stack: StackId, fact: u8) -> bool {
    let facts = facts(snap);
    snap.stacks
        .stack(stack)
        .iter()
        .any(|&id| has(facts, id, fact))
}

/// A value computed once per distinct stack (stack ids are dense, so this is a vector).
#[derive(Debug)]
pub struct PerStack<T> {
    slots: Vec<Option<T>>,
}

impl<T: Clone> PerStack<T> {
    /// An empty cache for a snapshot's stacks.
    pub fn new(snap: &Snapshot) -> PerStack<T> {
        PerStack {
            slots: vec![None; snap.stacks.stack_count()],
        }
    }

    /// The cached value for `stack`, computing it with `f` the first time.
    #[inline]
    pub fn get(&mut self, stack: StackId, f: impl FnOnce() -> T) -> T {
        let i = stack.0 as usize;
        if let Some(Some(v)) = self.slots.get(i) {
            return v.clone();
        }
        self.fill(i, f)
    }

    /// Computes and keeps the value of slot `i` (growing the table for a stack made later).
    #[cold]
    fn fill(&mut self, i: usize, f: impl FnOnce() -> T) -> T {
        if i >= self.slots.len() {
            self.slots.resize(i + 1, None);
        }
        self.slots[i].get_or_insert_with(f).clone()
    }
}

/// The distinct stacks of a device's events.
pub fn distinct_stacks(snap: &Snapshot, device: u32) -> Vec<StackId> {
    let mut seen = vec![false; snap.stacks.stack_count()];
    let mut out = Vec::new();
    for e in snap.trace(device) {
        if let Some(s) = seen.get_mut(e.stack.0 as usize) {
            if !*s {
                *s = true;
                out.push(e.stack);
            }
        }
    }
    out
}

/// The loops' and data loaders' helpers that move a batch to the device.
pub(crate) fn is_batch_transfer(file: &str, name: &str) -> bool {
    file.contains("torch/utils/data/")
        || file.contains("torchvision/transforms/")
        || matches!(
            name,
            "batch_to_device"
                | "transfer_batch_to_device"
                | "move_data_to_device"
                | "send_to_device"
                | "_prepare_input"
                | "_prepare_inputs"
                | "pin_memory"
        )
}

/// A Python frame (C++ frames have line 0).
pub fn is_python(f: &Frame) -> bool {
    f.line > 0
}

/// A Python frame of *plumbing* rather than of the program: the `torch` package (module call
/// machinery, autograd, checkpointing, dynamo, Inductor, distributed wrappers), code Inductor
/// generated in its cache folder, Triton's launchers, the Python standard library, and frames
/// of no file (`<frozen runpy>`, `<string>`). Everything else is program code, in the user's
/// folder or in `site-packages` alike: for most users a model library such as transformers
/// *is* the program.
pub fn is_library(snap: &Snapshot, f: &Frame) -> bool {
    is_plumbing_file(snap.str(f.filename))
}

/// [`is_library`] on a file path.
pub fn is_plumbing_file(file: &str) -> bool {
    if file.starts_with('<') || file.is_empty() {
        return true;
    }
    if file.contains("torchinductor_") || file.contains("/torchinductor/") {
        return true;
    }
    // an installed package: plumbing when it is torch itself or Triton
    for packages in ["/site-packages/", "/dist-packages/"] {
        if let Some(at) = file.rfind(packages) {
            let package = file[at + packages.len()..].split('/').next().unwrap_or("");
            return matches!(package, "torch" | "triton" | "functorch");
        }
    }
    // a source checkout of torch: `.../torch/` followed by one of its own modules
    if let Some(at) = file
        .rfind("/torch/")
        .map(|a| a + 7)
        .or(file.starts_with("torch/").then_some(6))
    {
        let module = file[at..].split('/').next().unwrap_or("");
        if module.starts_with('_') || TORCH_MODULES.contains(&module) {
            return true;
        }
    }
    // the standard library: .../lib/python3.X/...
    file.contains("/lib/python3")
}

/// Modules and packages of `torch` that tell a source checkout of it from a user's folder
/// named `torch`.
const TORCH_MODULES: [&str; 24] = [
    "nn",
    "autograd",
    "utils",
    "optim",
    "distributed",
    "cuda",
    "fx",
    "amp",
    "jit",
    "export",
    "profiler",
    "testing",
    "ao",
    "backends",
    "multiprocessing",
    "func",
    "sparse",
    "nested",
    "onnx",
    "functional.py",
    "overrides.py",
    "serialization.py",
    "library.py",
    "storage.py",
];

/// The program's own Python frames of a stack, innermost first.
pub fn user_frames<'a>(snap: &'a Snapshot, stack: StackId) -> impl Iterator<Item = Frame> + 'a {
    let facts = facts(snap);
    snap.stacks
        .stack(stack)
        .iter()
        .filter(move |&&id| has(facts, id, PROGRAM))
        .map(|&id| snap.stacks.frame(id))
}

/// The autograd node that made a backward allocation, from C++ frames such as
/// `torch::autograd::generated::MmBackward0::apply(...)`: `MmBackward0`. Helper frames
/// (`generated::details::mm_mat2_backward`) are passed over for the node itself.
pub fn autograd_node(snap: &Snapshot, stack: StackId) -> Option<String> {
    let mut fallback = None;
    for f in snap.stacks.frames(stack) {
        let name = snap.str(f.name);
        if let Some(rest) = name.split("autograd::generated::").nth(1) {
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let ident = ident.strip_suffix("_apply_functional").unwrap_or(&ident);
            let is_node = ident
                .trim_end_matches(|c: char| c.is_ascii_digit())
                .ends_with("Backward");
            if is_node {
                return Some(ident.to_string());
            }
            if fallback.is_none() && !ident.is_empty() && ident != "details" {
                fallback = Some(ident.to_string());
            }
        }
        if name.contains("AccumulateGrad") {
            return Some("AccumulateGrad".to_string());
        }
    }
    fallback
}

/// Whether a stack runs inside the autograd engine's C++ thread.
pub fn in_autograd_engine(snap: &Snapshot, stack: StackId) -> bool {
    snap.stacks
        .frames(stack)
        .any(|f| is_autograd_engine_frame(snap.str(f.name)))
}

/// Whether a C++ frame's symbol is the autograd engine's.
pub(crate) fn is_autograd_engine_frame(name: &str) -> bool {
    name.contains("autograd::Engine::") || name.contains("PythonEngine::thread_init")
}

/// `file:line (function)` with the file's last two path components.
pub fn short_frame(snap: &Snapshot, f: &Frame) -> String {
    let file = snap.str(f.filename);
    let short: Vec<&str> = file.rsplit('/').take(2).collect();
    let short = short.into_iter().rev().collect::<Vec<_>>().join("/");
    if f.line == 0 {
        snap.str(f.name).to_string()
    } else {
        format!("{short}:{} {}", f.line, snap.str(f.name))
    }
}

/// The allocation site of a stack: its innermost program frames, outermost first, joined by
/// `;` (at most `depth` frames). Stacks with no program frame fall back to the innermost
/// PyTorch Python frame, the autograd node, or `<no frames>`.
pub fn site(snap: &Snapshot, stack: StackId, depth: usize) -> String {
    let frames: Vec<Frame> = user_frames(snap, stack).take(depth).collect();
    if !frames.is_empty() {
        // Outermost first; a file name where the file changes.
        let mut out = Vec::with_capacity(frames.len());
        let mut file = None;
        for f in frames.iter().rev() {
            let base = snap.short_file(f.filename);
            if file != Some(f.filename) {
                out.push(format!("{base}:{}:{}", snap.str(f.name), f.line));
                file = Some(f.filename);
            } else {
                out.push(format!("{}:{}", snap.str(f.name), f.line));
            }
        }
        return out.join(";");
    }
    if let Some(f) = snap
        .stacks
        .frames(stack)
        .find(|f| is_python(f) && !snap.str(f.filename).starts_with('<'))
    {
        return format!("torch:{}", short_frame(snap, &f));
    }
    if let Some(node) = autograd_node(snap, stack) {
        return format!("<backward {node}>");
    }
    if snap.stacks.stack(stack).is_empty() {
        "<no frames>".to_string()
    } else {
        "<C++ only>".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plumbing_is_torch_the_standard_library_and_generated_code() {
        for file in [
            "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
            "/usr/lib/python3.12/runpy.py",
            "<frozen runpy>",
            "/scratch/cache/torchinductor_user/xy/cxyzabc.py",
            "/venv/lib/python3.11/site-packages/triton/runtime/jit.py",
            "/home/dev/pytorch/torch/nn/modules/module.py",
        ] {
            assert!(is_plumbing_file(file), "{file}");
        }
        for file in [
            "/venv/lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py",
            "/home/user/train.py",
            "/usr/local/lib/python3.10/dist-packages/timm/models/vit.py",
            "/home/user/pithtrain/pithtrain/pipeline/dualpipev.py",
            "/opt/torch/.venv/lib/python3.12/site-packages/transformers/modeling_layers.py",
            "/opt/torch/project/train.py",
        ] {
            assert!(!is_plumbing_file(file), "{file}");
        }
    }
}

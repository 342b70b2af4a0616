//! Reading stacks: which frames are noise, which are PyTorch's, which are the program's.

use crate::snapshot::{Frame, Snapshot, StackId};

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
    pub fn get(&mut self, stack: StackId, f: impl FnOnce() -> T) -> T {
        let i = stack.0 as usize;
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

/// Frames that say nothing about the program: the unwinder, the interpreter's call machinery,
/// dispatcher boxing (the list both PyTorch viewers filter).
pub fn is_noise(snap: &Snapshot, f: &Frame) -> bool {
    let name = snap.str(f.name);
    let file = snap.str(f.filename);
    const NAMES: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: [&str; 9] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
    ];
    NAMES.iter().any(|n| name.contains(n))
        || FILES.iter().any(|p| file.contains(p))
        || file.contains("cpython/abstract.h")
}

/// A Python frame (C++ frames have line 0).
pub fn is_python(f: &Frame) -> bool {
    f.line > 0
}

/// A Python frame of PyTorch itself, the standard library or the interpreter's runner.
pub fn is_library(snap: &Snapshot, f: &Frame) -> bool {
    let file = snap.str(f.filename);
    file.contains("/torch/")
        || file.contains("site-packages/")
        || file.contains("dist-packages/")
        || file.starts_with('<')
        || file.contains("/lib/python3")
}

/// The program's own Python frames of a stack, innermost first.
pub fn user_frames<'a>(snap: &'a Snapshot, stack: StackId) -> impl Iterator<Item = Frame> + 'a {
    snap.stacks
        .frames(stack)
        .filter(move |f| is_python(f) && !is_library(snap, f))
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
    snap.stacks.frames(stack).any(|f| {
        let name = snap.str(f.name);
        name.contains("autograd::Engine::") || name.contains("PythonEngine::thread_init")
    })
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
            let base = snap.str(f.filename).rsplit('/').next().unwrap_or("");
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

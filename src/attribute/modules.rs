//! Module paths: where in the model an allocation was made, as the chain of the program's
//! `forward` methods that PyTorch's module call machinery entered, outermost first:
//! `LlamaForCausalLM.forward › LlamaModel.forward › LlamaDecoderLayer.forward › LlamaMLP.forward`.
//!
//! A program frame is a module's method when the frame that called it is `torch.nn.Module`'s
//! `_call_impl`. Class names come from the source when it can be read (the recorded path, or
//! below `--source-root`): the nearest `class` above the method's `def`. Without the source a
//! method is named by its file, function and line (`modeling_llama.py:forward:322`).

use std::collections::HashMap;

use super::frames;
use super::source::SourceFiles;
use crate::snapshot::{Snapshot, StackId, StrId};

/// Separates the methods of a path.
pub const SEPARATOR: &str = " › ";

/// Class names found for `(file, line)` of a method, cached.
#[derive(Debug, Default)]
pub struct ClassNames {
    cache: HashMap<(StrId, u32), Option<String>>,
}

impl ClassNames {
    /// The class whose method holds `line` of `file`, if the source can be read.
    fn class_of(
        &mut self,
        snap: &Snapshot,
        sources: &mut SourceFiles,
        file: StrId,
        line: u32,
    ) -> Option<String> {
        self.cache
            .entry((file, line))
            .or_insert_with(|| {
                let lines = sources.lines(snap.str(file))?;
                enclosing_class(lines, line as usize)
            })
            .clone()
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The class around the `def` that holds line `at` (1-based).
fn enclosing_class(lines: &[String], at: usize) -> Option<String> {
    let mut i = at.checked_sub(1)?.min(lines.len().checked_sub(1)?);
    // the def of the function holding the line
    let def_indent = loop {
        let l = &lines[i];
        let t = l.trim_start();
        if t.starts_with("def ") || t.starts_with("async def ") {
            break indent(l);
        }
        i = i.checked_sub(1)?;
    };
    while i > 0 {
        i -= 1;
        let l = &lines[i];
        let t = l.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if indent(l) < def_indent {
            let name = t.strip_prefix("class ")?;
            let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
            return Some(name[..end].to_string());
        }
    }
    None
}

/// The most module methods a path shows (the innermost ones: the outer ones, such as the
/// whole model's `forward`, are the same for every allocation).
pub const MAX_DEPTH: usize = 3;

/// The module path of a stack, or `None` when no module method of the program is on it.
/// Each module call (`_call_impl`) contributes its method: the frame named `forward` inside
/// that call, past any decorator wrappers, or else its first program frame. A helper function
/// of the program called from the innermost method ends the path.
pub fn module_path(
    snap: &Snapshot,
    stack: StackId,
    sources: &mut SourceFiles,
    classes: &mut ClassNames,
) -> Option<String> {
    let mut all: Vec<_> = snap
        .stacks
        .frames(stack)
        .filter(frames::is_python)
        .collect();
    all.reverse(); // outermost first
    let is_call = |f: &crate::snapshot::Frame| {
        snap.str(f.name) == "_call_impl"
            && snap.str(f.filename).ends_with("torch/nn/modules/module.py")
    };
    let program = |f: &crate::snapshot::Frame| !frames::is_library(snap, f);
    // each contributing module call: (its method's frame, the frames inside the call)
    let mut calls: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    let mut k = 0;
    while k < all.len() {
        if !is_call(&all[k]) {
            k += 1;
            continue;
        }
        // the frames of this module call, up to the next module call inside it
        let end = (k + 1..all.len())
            .find(|&j| is_call(&all[j]))
            .unwrap_or(all.len());
        let method = (k + 1..end)
            .find(|&j| program(&all[j]) && snap.str(all[j].name) == "forward")
            .or_else(|| (k + 1..end).find(|&j| program(&all[j])));
        if let Some(m) = method {
            calls.push((m, k + 1..end));
        }
        k = end;
    }
    let mut methods: Vec<String> = Vec::new();
    for (i, (m, _)) in calls.iter().enumerate() {
        let f = &all[*m];
        let function = snap.str(f.name);
        let innermost = i + 1 == calls.len();
        methods.push(match classes.class_of(snap, sources, f.filename, f.line) {
            Some(class) => format!("{class}.{function}"),
            // the line tells which submodule an outer method called; the innermost
            // method's line would split one method into many
            None if innermost => format!("{}:{function}", snap.short_file(f.filename)),
            None => format!("{}:{function}:{}", snap.short_file(f.filename), f.line),
        });
    }
    // a helper function of the program called from the innermost method
    let helper = calls.last().and_then(|(m, inside)| {
        let f = &all[*m];
        inside
            .clone()
            .rev()
            .map(|j| &all[j])
            .find(|g| program(g) && (g.filename != f.filename || g.name != f.name))
            .filter(|g| snap.str(g.name) != "forward")
            .map(|g| format!("{}:{}", snap.short_file(g.filename), snap.str(g.name)))
    });
    if methods.is_empty() {
        return None;
    }
    let skip = methods.len().saturating_sub(MAX_DEPTH);
    let mut path: Vec<String> = methods.split_off(skip);
    if let Some(h) = helper {
        path.push(h);
    }
    Some(path.join(SEPARATOR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_around_a_method() {
        let src: Vec<String> = "import torch\n\nclass LlamaMLP(nn.Module):\n    def __init__(self):\n        pass\n\n    def forward(self, x):\n        # the projection\n        y = self.up(x)\n        return y\n\ndef helper(x):\n    return x\n"
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(enclosing_class(&src, 9).as_deref(), Some("LlamaMLP"));
        assert_eq!(enclosing_class(&src, 13), None);
        assert_eq!(enclosing_class(&src, 99).as_deref(), None);
    }
}

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

/// One module method on a stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Method {
    /// `Class.forward`, or `file:forward` without the source.
    pub name: String,
    /// Without the source: the line of the call the method made (shown for outer methods).
    pub line: Option<u32>,
    /// Where it was called from: the caller's file and line (the same for every layer of a
    /// loop over layers).
    pub caller: (StrId, u32),
    /// The line the method was at (lines go back when the loop calls the next layer).
    pub at: u32,
}

/// The module methods of a stack, outermost first, and the program helper the innermost one
/// called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Methods, outermost first.
    pub methods: Vec<Method>,
    /// A helper function of the program called from the innermost method.
    pub helper: Option<String>,
}

impl Chain {
    /// The path text: the innermost [`MAX_DEPTH`] methods, `ordinals[d]` (when given) as the
    /// layer index of method `d` (`LlamaDecoderLayer[3].forward`), then the helper.
    pub fn render(&self, ordinals: &[Option<u16>]) -> String {
        let n = self.methods.len();
        // the innermost methods, and always the layer of a loop
        let layer = ordinals.iter().position(|o| o.is_some()).unwrap_or(n);
        let skip = n.saturating_sub(MAX_DEPTH).min(layer);
        let mut parts: Vec<String> = Vec::with_capacity(MAX_DEPTH + 1);
        for (d, m) in self.methods.iter().enumerate().skip(skip) {
            let mut name = match ordinals.get(d).copied().flatten() {
                // `Block[3].forward`, or without the source `model.py:forward[3]`
                Some(k) => match m.name.split_once('.') {
                    Some((class, rest)) if m.line.is_none() => format!("{class}[{k}].{rest}"),
                    _ => format!("{}[{k}]", m.name),
                },
                None => m.name.clone(),
            };
            if let (Some(line), false) = (m.line, d + 1 == n) {
                name = format!("{name}:{line}");
            }
            parts.push(name);
        }
        if let Some(h) = &self.helper {
            parts.push(h.clone());
        }
        parts.join(SEPARATOR)
    }
}

/// The module methods of a stack. Each module call (`_call_impl`) contributes its method: the
/// frame named `forward` inside that call, past any decorator wrappers, or else its first
/// program frame. A helper function of the program called from the innermost method ends the
/// chain. `None` when no module method of the program is on the stack.
pub fn module_chain(
    snap: &Snapshot,
    stack: StackId,
    sources: &mut SourceFiles,
    classes: &mut ClassNames,
) -> Option<Chain> {
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
    // each contributing module call: (its method's frame, the frames inside the call, caller)
    let mut calls: Vec<(usize, std::ops::Range<usize>, (StrId, u32))> = Vec::new();
    let mut k = 0;
    while k < all.len() {
        if !is_call(&all[k]) {
            k += 1;
            continue;
        }
        let end = (k + 1..all.len())
            .find(|&j| is_call(&all[j]))
            .unwrap_or(all.len());
        let method = (k + 1..end)
            .find(|&j| program(&all[j]) && snap.str(all[j].name) == "forward")
            .or_else(|| (k + 1..end).find(|&j| program(&all[j])));
        let caller = (0..k)
            .rev()
            .find(|&j| program(&all[j]))
            .map_or((StrId(0), 0), |j| (all[j].filename, all[j].line));
        if let Some(m) = method {
            calls.push((m, k + 1..end, caller));
        }
        k = end;
    }
    if calls.is_empty() {
        return None;
    }
    let methods = calls
        .iter()
        .map(|(m, _, caller)| {
            let f = &all[*m];
            let function = snap.str(f.name);
            let (name, line) = match classes.class_of(snap, sources, f.filename, f.line) {
                Some(class) => (format!("{class}.{function}"), None),
                None => (
                    format!("{}:{function}", snap.short_file(f.filename)),
                    Some(f.line),
                ),
            };
            Method {
                name,
                line,
                caller: *caller,
                at: f.line,
            }
        })
        .collect();
    let helper = calls.last().and_then(|(m, inside, _)| {
        let f = &all[*m];
        inside
            .clone()
            .rev()
            .map(|j| &all[j])
            .find(|g| program(g) && (g.filename != f.filename || g.name != f.name))
            .filter(|g| snap.str(g.name) != "forward")
            .map(|g| format!("{}:{}", snap.short_file(g.filename), snap.str(g.name)))
    });
    Some(Chain { methods, helper })
}

/// Layer ordinals of module methods, counted as a trace is walked: a method called from the
/// same place again whose line goes back is the next layer of a loop; a new forward pass (a
/// new phase segment) starts counting again. Call sites that ever counted past 0 are loops.
#[derive(Debug, Default)]
pub struct LayerCounter {
    depth: Vec<((StrId, u32), u32, u16)>,
    segment: u32,
    /// Call sites seen calling the next layer.
    pub loops: std::collections::HashSet<(StrId, u32)>,
}

impl LayerCounter {
    /// The ordinal of each method of `chain` at an event of phase segment `segment`.
    pub fn step(&mut self, chain: &Chain, segment: u32) -> Vec<u16> {
        if segment != self.segment {
            self.depth.clear();
            self.segment = segment;
        }
        let mut out = Vec::with_capacity(chain.methods.len());
        let mut reset_below = false;
        for (d, m) in chain.methods.iter().enumerate() {
            if d >= self.depth.len() {
                self.depth.push((m.caller, m.at, 0));
                out.push(0);
                continue;
            }
            let (caller, last, ordinal) = &mut self.depth[d];
            if reset_below || *caller != m.caller {
                *caller = m.caller;
                *last = m.at;
                *ordinal = 0;
            } else if m.at < *last {
                *ordinal = ordinal.saturating_add(1);
                self.loops.insert(m.caller);
                reset_below = true;
                *last = m.at;
                out.push(*ordinal);
                self.depth.truncate(d + 1);
                continue;
            } else {
                *last = m.at;
            }
            out.push(*ordinal);
        }
        out
    }
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

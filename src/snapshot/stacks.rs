//! Interned frames and stacks.
//!
//! A snapshot repeats the same few hundred frames in hundreds of thousands of stacks. Each
//! distinct frame is stored once ([`FrameId`]) and each distinct stack once, as a range of one
//! flat `Vec<FrameId>` ([`StackId`]), so events carry a 4-byte stack id.

use rustc_hash::FxHashMap as HashMap;
use std::hash::{BuildHasher, Hash};

use crate::pickle::StrId;

/// Index of a frame in [`Stacks::frame`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);

/// Index of a stack in [`Stacks`]; [`StackId::EMPTY`] is the stack with no frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StackId(pub u32);

impl StackId {
    /// The stack with no frames (nothing recorded).
    pub const EMPTY: StackId = StackId(0);
}

/// One frame as PyTorch records it: a Python function, or a C++ symbol (line 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function or demangled symbol name.
    pub name: StrId,
    /// Source file: a path for Python frames, a basename, `"??"` or `""` for C++ frames.
    pub filename: StrId,
    /// Line number; 0 for C++ frames.
    pub line: u32,
}

/// The frame and stack tables of one snapshot.
#[derive(Debug)]
pub struct Stacks {
    frames: Vec<Frame>,
    frame_index: HashMap<Frame, FrameId>,
    flat: Vec<FrameId>,
    spans: Vec<(u32, u32)>,
    by_hash: HashMap<u64, Vec<StackId>>,
}

impl Default for Stacks {
    fn default() -> Self {
        Stacks {
            frames: Vec::new(),
            frame_index: HashMap::default(),
            flat: Vec::new(),
            spans: vec![(0, 0)],
            by_hash: HashMap::default(),
        }
    }
}

impl Stacks {
    /// Interns a frame.
    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.frame_index.get(&frame) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32);
        self.frames.push(frame);
        self.frame_index.insert(frame, id);
        id
    }

    /// Interns a stack, innermost frame first (as PyTorch orders them).
    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        if frames.is_empty() {
            return StackId::EMPTY;
        }
        let hash = rustc_hash::FxBuildHasher.hash_one(frames);
        if let Some(candidates) = self.by_hash.get(&hash) {
            for &c in candidates {
                if self.stack(c) == frames {
                    return c;
                }
            }
        }
        let id = StackId(self.spans.len() as u32);
        self.spans
            .push((self.flat.len() as u32, frames.len() as u32));
        self.flat.extend_from_slice(frames);
        self.by_hash.entry(hash).or_default().push(id);
        id
    }

    /// A frame by id.
    pub fn frame(&self, id: FrameId) -> Frame {
        self.frames[id.0 as usize]
    }

    /// Number of distinct frames.
    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }

    /// Number of distinct stacks, the empty one included.
    pub fn stack_count(&self) -> usize {
        self.spans.len()
    }

    /// The frames of a stack, innermost first; empty for an unknown id.
    pub fn stack(&self, id: StackId) -> &[FrameId] {
        match self.spans.get(id.0 as usize) {
            Some(&(start, len)) => &self.flat[start as usize..(start + len) as usize],
            None => &[],
        }
    }

    /// The frames themselves of a stack, innermost first.
    pub fn frames(&self, id: StackId) -> impl Iterator<Item = Frame> + '_ {
        self.stack(id).iter().map(|&f| self.frame(f))
    }

    /// Drops the lookup indices once the snapshot is built; ids stay valid.
    pub fn freeze(&mut self) {
        self.frame_index = HashMap::default();
        self.by_hash = HashMap::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_are_interned_by_content() {
        let mut t = Stacks::default();
        let a = t.intern_frame(Frame {
            name: StrId(1),
            filename: StrId(2),
            line: 3,
        });
        let b = t.intern_frame(Frame {
            name: StrId(1),
            filename: StrId(2),
            line: 4,
        });
        assert_ne!(a, b);
        let s1 = t.intern_stack(&[a, b]);
        let s2 = t.intern_stack(&[a, b]);
        let s3 = t.intern_stack(&[b, a]);
        assert_eq!(s1, s2);
        assert_ne!(s1, s3);
        assert_eq!(t.intern_stack(&[]), StackId::EMPTY);
        assert_eq!(t.stack(s3), &[b, a]);
        assert_eq!(t.stack(StackId(99)), &[] as &[FrameId]);
        assert_eq!(t.stack_count(), 3);
    }
}

//! Decoded values: small `Copy` handles into one [`Heap`].
//!
//! A pickle's memo lets one object appear in many places. Every container therefore lives once
//! in the heap and values refer to it by index, so a shared frame list costs one slot however
//! often it is referenced, and no decoded structure is ever deep-copied. Strings are interned:
//! a key such as `"action"` is stored once per file.

use rustc_hash::FxHashMap as HashMap;

/// Index of an interned string in the heap's string table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StrId(pub u32);

/// A reference to a list, tuple or dict in the [`Heap`]: a slot and the generation of that
/// slot when the container was made. A container that an [`super::Adopter`] compacted keeps
/// answering for a while with its replacement; a reference older than that is *stale*.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ref {
    slot: u32,
    generation: u32,
}

/// Generations wrap at 2^28 so that a reference packs into 60 bits (see the memo).
const GENERATION_MASK: u32 = (1 << 28) - 1;

impl Ref {
    pub(crate) fn pack(self) -> u64 {
        ((self.generation as u64) << 32) | self.slot as u64
    }

    pub(crate) fn unpack(p: u64) -> Ref {
        Ref {
            slot: p as u32,
            generation: (p >> 32) as u32 & GENERATION_MASK,
        }
    }
}

impl Value {
    /// A memo entry that a split decode could not carry over from the part that stored it:
    /// the decoder that fetches it stops (and the pickle is decoded again in one piece).
    pub const UNAVAILABLE: Value = Value::Handle(u8::MAX, u32::MAX);
}

/// One decoded value. Containers are references into the [`Heap`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// Python `None`.
    None,
    /// Python `bool`.
    Bool(bool),
    /// A Python `int` that fits in 64 bits.
    Int(i64),
    /// A Python `int` of 65 to 128 bits (see [`Heap::big_int`]).
    BigInt(u32),
    /// Python `float`.
    Float(f64),
    /// Python `str`.
    Str(StrId),
    /// Python `bytes` or `bytearray` (see [`Heap::bytes`]).
    Bytes(u32),
    /// Python `list` (also used for `set` and `frozenset`).
    List(Ref),
    /// Python `tuple`; its items live in the list arena.
    Tuple(Ref),
    /// Python `dict`.
    Dict(Ref),
    /// A container that an [`super::Adopter`] compacted into its own table: `(kind, index)`.
    Handle(u8, u32),
}

/// How long (in releases) a compacted container keeps forwarding to its replacement before
/// its slot is reused. PyTorch fetches a container from the memo before its parent is complete
/// (a shared empty frame list, a frame repeated in one stack); those references are resolved
/// within a few releases, or within one segment's blocks.
const QUARANTINE: usize = 1 << 12;

#[derive(Debug)]
enum Content<T> {
    Open(Vec<T>),
    Forward(Value),
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    memo: u32,
    content: Content<T>,
}

/// A container arena with generation-checked slots and delayed reuse.
#[derive(Debug)]
struct Arena<T> {
    slots: Vec<Slot<T>>,
    quarantine: std::collections::VecDeque<u32>,
    free: Vec<u32>,
    spare: Vec<Vec<T>>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena {
            slots: Vec::new(),
            quarantine: std::collections::VecDeque::new(),
            free: Vec::new(),
            spare: Vec::new(),
        }
    }
}

impl<T> Arena<T> {
    fn alloc(&mut self, items: Vec<T>) -> Ref {
        match self.free.pop() {
            Some(slot) => {
                let s = &mut self.slots[slot as usize];
                s.generation = s.generation.wrapping_add(1) & GENERATION_MASK;
                s.memo = NOT_MEMOIZED;
                s.content = Content::Open(items);
                Ref {
                    slot,
                    generation: s.generation,
                }
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    memo: NOT_MEMOIZED,
                    content: Content::Open(items),
                });
                Ref {
                    slot: (self.slots.len() - 1) as u32,
                    generation: 0,
                }
            }
        }
    }

    /// A new empty container, reusing the storage of a released one.
    fn alloc_empty(&mut self) -> Ref {
        let items = self.spare.pop().unwrap_or_default();
        self.alloc(items)
    }

    fn slot(&self, r: Ref) -> Option<&Slot<T>> {
        self.slots
            .get(r.slot as usize)
            .filter(|s| s.generation == r.generation)
    }

    fn items(&self, r: Ref) -> &[T] {
        match self.slot(r).map(|s| &s.content) {
            Some(Content::Open(v)) => v,
            _ => &[],
        }
    }

    fn items_mut(&mut self, r: Ref) -> Option<&mut Vec<T>> {
        let s = self.slots.get_mut(r.slot as usize)?;
        if s.generation != r.generation {
            return None;
        }
        match &mut s.content {
            Content::Open(v) => Some(v),
            Content::Forward(_) => None,
        }
    }

    fn forward(&self, r: Ref) -> Option<Value> {
        match self.slot(r).map(|s| &s.content) {
            Some(Content::Forward(v)) => Some(*v),
            _ => None,
        }
    }

    fn set_memo(&mut self, r: Ref, index: u32) {
        if let Some(s) = self.slots.get_mut(r.slot as usize) {
            if s.generation == r.generation {
                s.memo = index;
            }
        }
    }

    /// Replaces an open container by `replacement`; returns its memo slot, if any.
    fn release(&mut self, r: Ref, replacement: Value) -> Option<u32> {
        let s = self.slots.get_mut(r.slot as usize)?;
        if s.generation != r.generation {
            return None;
        }
        let Content::Open(items) = std::mem::replace(&mut s.content, Content::Forward(replacement))
        else {
            return None;
        };
        let memo = std::mem::replace(&mut s.memo, NOT_MEMOIZED);
        if items.capacity() > 0 && items.capacity() <= 64 && self.spare.len() < 1024 {
            let mut items = items;
            items.clear();
            self.spare.push(items);
        }
        self.quarantine.push_back(r.slot);
        if self.quarantine.len() > QUARANTINE {
            let old = self.quarantine.pop_front().expect("non-empty");
            self.free.push(old);
        }
        (memo != NOT_MEMOIZED).then_some(memo)
    }

    fn live(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.content, Content::Open(_)))
            .count()
    }
}

/// No string: an empty slot of the cache of recent strings.
const NO_STR: StrId = StrId(u32::MAX);

/// A string of 8 bytes at most as the cache of recent strings knows it: its bytes (as a
/// little-endian word, zero-padded) and its length, which together tell any two apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShortKey {
    word: u64,
    len: u8,
}

impl ShortKey {
    const EMPTY: ShortKey = ShortKey { word: 0, len: 0 };

    /// The key of `bytes`, if they are 8 at most.
    #[inline(always)]
    pub(crate) fn of(bytes: &[u8]) -> Option<ShortKey> {
        if bytes.len() > 8 {
            return None;
        }
        let word = bytes
            .iter()
            .enumerate()
            .fold(0u64, |w, (i, &b)| w | (b as u64) << (8 * i));
        Some(ShortKey {
            word,
            len: bytes.len() as u8,
        })
    }

    /// The key of the `len` bytes at `at` in `window`, read as one word where the window
    /// holds 8 bytes from there; `None` when `len` is over 8 or the bytes are not all there.
    #[inline(always)]
    pub(crate) fn in_window(window: &[u8], at: usize, len: usize) -> Option<ShortKey> {
        if len > 8 {
            return None;
        }
        let Some(eight) = window.get(at..at.checked_add(8)?) else {
            return ShortKey::of(window.get(at..at.checked_add(len)?)?);
        };
        let word = u64::from_le_bytes(eight.try_into().expect("8 bytes"));
        let mask = u64::MAX.checked_shr(64 - 8 * len as u32).unwrap_or(0);
        Some(ShortKey {
            word: word & mask,
            len: len as u8,
        })
    }

    /// The key's slot in the cache (of 16).
    #[inline(always)]
    fn slot(self) -> usize {
        let mixed = self.word ^ ((self.len as u64) << 59);
        (mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize
    }
}

/// Where decoded values live: interned strings, lists, dicts and the few wide integers.
#[derive(Debug)]
pub struct Heap {
    strings: Vec<Box<str>>,
    string_index: HashMap<Box<str>, StrId>,
    lists: Arena<Value>,
    dicts: Arena<(Value, Value)>,
    big_ints: Vec<i128>,
    bytes: Vec<Box<[u8]>>,
    pub(crate) memo_rewrites: Vec<(u32, Value)>,
    recent: [(ShortKey, StrId); 16],
}

impl Default for Heap {
    fn default() -> Self {
        Heap {
            strings: Vec::new(),
            string_index: HashMap::default(),
            lists: Arena::default(),
            dicts: Arena::default(),
            big_ints: Vec::new(),
            bytes: Vec::new(),
            memo_rewrites: Vec::new(),
            recent: [(ShortKey::EMPTY, NO_STR); 16],
        }
    }
}

/// Renderings stop growing past this many bytes, so a memo bomb cannot blow up a message.
const RENDER_LIMIT: usize = 1 << 16;

/// Memo slot marker for a container that was never memoized.
const NOT_MEMOIZED: u32 = u32::MAX;

impl Heap {
    /// Interns `s` and returns its id; the same text always gets the same id.
    pub fn intern(&mut self, s: &str) -> StrId {
        // Short strings repeat by the hundred thousand (one "N/A" per trace entry): a tiny
        // direct-mapped cache on their bytes skips the hash map.
        let Some(key) = ShortKey::of(s.as_bytes()) else {
            return self.intern_slow(s);
        };
        if let Some(id) = self.recent_str(key) {
            return id;
        }
        let id = self.intern_slow(s);
        self.recent[key.slot()] = (key, id);
        id
    }

    /// The id of the short string `key` stands for, if it was interned recently. Only text
    /// (valid UTF-8) is ever keyed, so bytes that find an id are that text.
    #[inline(always)]
    pub(crate) fn recent_str(&self, key: ShortKey) -> Option<StrId> {
        let (k, id) = self.recent[key.slot()];
        (k == key && id != NO_STR).then_some(id)
    }

    fn intern_slow(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.string_index.get(s) {
            return id;
        }
        let id = StrId(self.strings.len() as u32);
        let boxed: Box<str> = s.into();
        self.strings.push(boxed.clone());
        self.string_index.insert(boxed, id);
        id
    }

    /// The id of `s` if it was interned.
    pub fn lookup(&self, s: &str) -> Option<StrId> {
        self.string_index.get(s).copied()
    }

    /// The text of an interned string.
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id.0 as usize).map_or("", |s| s)
    }

    /// Number of interned strings.
    pub fn string_count(&self) -> usize {
        self.strings.len()
    }

    /// Takes the interned strings out of the heap, in id order.
    pub fn take_strings(&mut self) -> Vec<Box<str>> {
        self.string_index.clear();
        self.recent = [(ShortKey::EMPTY, NO_STR); 16];
        std::mem::take(&mut self.strings)
    }

    /// Items of a list or tuple; empty for a compacted or stale reference.
    pub fn list(&self, r: Ref) -> &[Value] {
        self.lists.items(r)
    }

    /// Key/value pairs of a dict in insertion order; empty for a compacted or stale reference.
    pub fn dict(&self, r: Ref) -> &[(Value, Value)] {
        self.dicts.items(r)
    }

    /// Looks `key` up in a dict (dicts in snapshots are small, so this is a scan).
    pub fn dict_get(&self, r: Ref, key: StrId) -> Option<Value> {
        self.dict(r)
            .iter()
            .rev()
            .find(|(k, _)| *k == Value::Str(key))
            .map(|&(_, v)| v)
    }

    /// What a compacted container was replaced by, if `v` is one still remembered.
    pub fn forwarded(&self, v: Value) -> Option<Value> {
        match v {
            Value::List(r) | Value::Tuple(r) => self.lists.forward(r),
            Value::Dict(r) => self.dicts.forward(r),
            _ => None,
        }
    }

    /// A wide integer stored by [`Value::BigInt`].
    pub fn big_int(&self, id: u32) -> i128 {
        self.big_ints.get(id as usize).copied().unwrap_or(0)
    }

    /// Bytes stored by [`Value::Bytes`].
    pub fn bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], |b| b)
    }

    /// The integer value of `v`, if it is an integer (or a bool) that fits in an `i128`.
    pub fn int(&self, v: Value) -> Option<i128> {
        match v {
            Value::Int(i) => Some(i as i128),
            Value::BigInt(id) => Some(self.big_int(id)),
            Value::Bool(b) => Some(b as i128),
            _ => None,
        }
    }

    /// The text of `v`, if it is a string.
    pub fn text(&self, v: Value) -> Option<&str> {
        match v {
            Value::Str(id) => Some(self.str(id)),
            _ => None,
        }
    }

    /// Frees a dict that an [`super::Adopter`] compacted into `replacement`: references to the
    /// dict (memo fetches included) yield `replacement` from now on.
    pub fn replace_dict(&mut self, r: Ref, replacement: Value) {
        if let Some(slot) = self.dicts.release(r, replacement) {
            self.memo_rewrites.push((slot, replacement));
        }
    }

    /// Frees a list that an [`super::Adopter`] compacted into `replacement`, like
    /// [`Heap::replace_dict`].
    pub fn replace_list(&mut self, r: Ref, replacement: Value) {
        if let Some(slot) = self.lists.release(r, replacement) {
            self.memo_rewrites.push((slot, replacement));
        }
    }

    pub(crate) fn new_list(&mut self, items: Vec<Value>) -> Ref {
        self.lists.alloc(items)
    }

    pub(crate) fn empty_list(&mut self) -> Ref {
        self.lists.alloc_empty()
    }

    pub(crate) fn empty_dict(&mut self) -> Ref {
        self.dicts.alloc_empty()
    }

    pub(crate) fn new_dict(&mut self, items: Vec<(Value, Value)>) -> Ref {
        self.dicts.alloc(items)
    }

    pub(crate) fn list_mut(&mut self, r: Ref) -> Option<&mut Vec<Value>> {
        self.lists.items_mut(r)
    }

    pub(crate) fn dict_mut(&mut self, r: Ref) -> Option<&mut Vec<(Value, Value)>> {
        self.dicts.items_mut(r)
    }

    pub(crate) fn note_memo(&mut self, v: Value, index: u64) {
        let index = u32::try_from(index).unwrap_or(NOT_MEMOIZED);
        match v {
            Value::Dict(r) => self.dicts.set_memo(r, index),
            Value::List(r) | Value::Tuple(r) => self.lists.set_memo(r, index),
            _ => {}
        }
    }

    pub(crate) fn new_big_int(&mut self, v: i128) -> Value {
        if let Ok(small) = i64::try_from(v) {
            return Value::Int(small);
        }
        self.big_ints.push(v);
        Value::BigInt((self.big_ints.len() - 1) as u32)
    }

    pub(crate) fn new_bytes(&mut self, b: &[u8]) -> Value {
        self.bytes.push(b.into());
        Value::Bytes((self.bytes.len() - 1) as u32)
    }

    /// A Python-like rendering of `v`, `max_depth` containers deep (for messages and tests).
    pub fn render(&self, v: Value, max_depth: usize) -> String {
        let mut out = String::new();
        self.render_into(&mut out, v, max_depth);
        out
    }

    fn render_into(&self, out: &mut String, v: Value, depth: usize) {
        use std::fmt::Write;
        if out.len() > RENDER_LIMIT {
            if !out.ends_with("...") {
                out.push_str("...");
            }
            return;
        }
        let nested = |out: &mut String, items: &[Value], open: &str, close: &str| {
            out.push_str(open);
            if depth == 0 {
                out.push_str("...");
            } else {
                for (i, item) in items.iter().enumerate() {
                    if out.len() > RENDER_LIMIT {
                        break;
                    }
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.render_into(out, *item, depth - 1);
                }
                if open == "(" && items.len() == 1 {
                    out.push(',');
                }
            }
            out.push_str(close);
        };
        match v {
            Value::None => out.push_str("None"),
            Value::Bool(b) => out.push_str(if b { "True" } else { "False" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::BigInt(id) => {
                let _ = write!(out, "{}", self.big_int(id));
            }
            Value::Float(f) => {
                let _ = write!(out, "{f:?}");
            }
            Value::Str(id) => {
                let _ = write!(out, "{:?}", self.str(id));
            }
            Value::Bytes(id) => {
                let _ = write!(out, "b{:?}", String::from_utf8_lossy(self.bytes(id)));
            }
            Value::List(id) => nested(out, self.list(id), "[", "]"),
            Value::Tuple(id) => nested(out, self.list(id), "(", ")"),
            Value::Dict(id) => {
                out.push('{');
                if depth == 0 {
                    out.push_str("...");
                } else {
                    for (i, (k, val)) in self.dict(id).iter().enumerate() {
                        if out.len() > RENDER_LIMIT {
                            break;
                        }
                        if i > 0 {
                            out.push_str(", ");
                        }
                        self.render_into(out, *k, depth - 1);
                        out.push_str(": ");
                        self.render_into(out, *val, depth - 1);
                    }
                }
                out.push('}');
            }
            Value::Handle(kind, id) => {
                let _ = write!(out, "<{kind}:{id}>");
            }
        }
    }

    /// Number of open (not compacted) lists and dicts, for memory accounting in tests.
    pub fn container_slots(&self) -> (usize, usize) {
        (self.lists.live(), self.dicts.live())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_returns_the_same_id() {
        let mut heap = Heap::default();
        let a = heap.intern("action");
        let b = heap.intern("size");
        assert_ne!(a, b);
        assert_eq!(heap.intern("action"), a);
        assert_eq!(heap.str(b), "size");
        assert_eq!(heap.lookup("size"), Some(b));
        assert_eq!(heap.lookup("nope"), None);
    }

    #[test]
    fn short_strings_are_told_apart_by_all_their_bytes_and_their_length() {
        let mut heap = Heap::default();
        // texts whose words differ only where a length mixed into the word would hide it
        let texts = [
            "N/A",
            "N/A\0\0\0\0X",
            "N/A\0",
            "",
            "\0",
            "12345678",
            "N/A\0\0\0\0",
        ];
        let ids: Vec<StrId> = texts.iter().map(|t| heap.intern(t)).collect();
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(heap.str(ids[i]), *t);
            assert_eq!(heap.intern(t), ids[i], "{t:?} again");
            for j in 0..i {
                assert_ne!(ids[i], ids[j], "{t:?} and {:?}", texts[j]);
            }
        }
        // a key read from a window is the key of the same bytes, whether or not 8 bytes
        // follow them there, and what was interned is found by it
        for t in texts {
            let mut window = b"xx".to_vec();
            window.extend_from_slice(t.as_bytes());
            let short = window.clone();
            window.extend_from_slice(b"trailing");
            let key = ShortKey::of(t.as_bytes());
            assert_eq!(ShortKey::in_window(&window, 2, t.len()), key);
            assert_eq!(ShortKey::in_window(&short, 2, t.len()), key);
            // the cache may have given the slot to another text since: then it finds none
            let found = key.and_then(|k| heap.recent_str(k));
            assert!(found.is_none() || found == heap.lookup(t), "{t:?}");
            heap.intern(t);
            assert_eq!(key.and_then(|k| heap.recent_str(k)), heap.lookup(t));
        }
        // nothing past the window, nothing over 8 bytes
        assert_eq!(ShortKey::in_window(b"abc", 2, 4), None);
        assert_eq!(ShortKey::in_window(b"abc", usize::MAX, 1), None);
        assert_eq!(ShortKey::of(b"123456789"), None);
        assert_eq!(ShortKey::in_window(b"1234567890", 0, 9), None);
        // bytes that are not text are never found, even where a text has the same length
        let not_text = [0xffu8, 0xfe, 0xfd];
        let key = ShortKey::of(&not_text).unwrap();
        assert_eq!(heap.recent_str(key), None);
    }

    #[test]
    fn compacted_containers_forward_then_go_stale() {
        let mut heap = Heap::default();
        let d = heap.new_dict(vec![(Value::Int(1), Value::Int(2))]);
        heap.note_memo(Value::Dict(d), 7);
        heap.replace_dict(d, Value::Handle(1, 5));
        assert_eq!(heap.memo_rewrites, vec![(7, Value::Handle(1, 5))]);
        assert!(heap.dict(d).is_empty());
        assert_eq!(heap.forwarded(Value::Dict(d)), Some(Value::Handle(1, 5)));
        // the slot is reused only after the quarantine has passed
        for i in 0..QUARANTINE {
            let other = heap.new_dict(Vec::new());
            heap.replace_dict(other, Value::Int(i as i64));
        }
        let reused = heap.new_dict(vec![(Value::Int(3), Value::Int(4))]);
        assert_eq!(reused.slot, d.slot);
        assert_ne!(reused, d);
        assert_eq!(
            heap.forwarded(Value::Dict(d)),
            None,
            "stale, not the new dict"
        );
        assert!(heap.dict(d).is_empty());
        assert_eq!(heap.dict(reused).len(), 1);
    }

    #[test]
    fn wide_ints_fall_back_to_i128() {
        let mut heap = Heap::default();
        assert_eq!(heap.new_big_int(-5), Value::Int(-5));
        let v = heap.new_big_int(1i128 << 64);
        assert_eq!(heap.int(v), Some(1i128 << 64));
    }
}

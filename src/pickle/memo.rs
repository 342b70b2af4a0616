//! The pickle memo, packed: one `u64` per entry.
//!
//! A large snapshot memoizes close to a million objects (every trace entry dict and every
//! per-entry string), most never fetched again. Entries are strings, containers or compacted
//! handles, which all fit in 64 bits with a 4-bit tag; anything else goes to a side table.
//! Indices the pickle never uses in order (`PUT 4000000000`) live in a hash map, so no index
//! ever sizes an allocation.

use rustc_hash::FxHashMap;

use super::value::{Ref, StrId, Value};

const TAG_SHIFT: u32 = 60;
const TAG_STR: u64 = 1;
const TAG_LIST: u64 = 2;
const TAG_TUPLE: u64 = 3;
const TAG_DICT: u64 = 4;
const TAG_HANDLE: u64 = 5;
const TAG_OTHER: u64 = 15;

/// Memo storage indexed like Python's memo dict.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// Index of the first dense entry: a part of a split decode starts numbering where the
    /// parts before it stopped.
    offset: u64,
    dense: Vec<u64>,
    sparse: FxHashMap<u64, u64>,
    other: Vec<Value>,
    /// Counts the times an entry that was neither a stand-in nor a container was overwritten
    /// or removed: a scalar, string or handle fetched while this is unchanged still reads the
    /// same.
    overwrites: u64,
    /// Keeps the pages past the dense entries' end faulted in on another core.
    ahead: crate::memory::ahead::Ahead,
}

impl Memo {
    pub(crate) fn with_capacity(n: usize) -> Memo {
        Memo {
            dense: Vec::with_capacity(n),
            ..Memo::default()
        }
    }

    /// A memo whose own entries start at `offset`: the entries before belong to earlier parts
    /// of a split decode and read as [`Memo::ELSEWHERE`] until imported (with [`Memo::put`]).
    pub(crate) fn starting_at(offset: u64, capacity: usize) -> Memo {
        let mut memo = Memo::with_capacity(capacity.saturating_add(offset as usize));
        let stand_in = memo.pack(Memo::ELSEWHERE);
        memo.dense.resize(offset as usize, stand_in);
        memo.offset = offset;
        memo
    }

    /// What an entry stored by another part reads as before it is imported.
    pub(crate) const ELSEWHERE: Value = Value::Handle(u8::MAX, u32::MAX - 1);

    /// Number of entries, those of earlier parts included (what `MEMOIZE` uses as the next
    /// index).
    pub(crate) fn len(&self) -> usize {
        self.dense.len() + self.sparse.len()
    }

    /// Index of the first dense entry.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether an index was stored out of order (`PUT 4000000000`).
    pub(crate) fn has_sparse(&self) -> bool {
        !self.sparse.is_empty()
    }

    /// This part's own entries (from the offset on), `count` of them at most.
    pub(crate) fn own_values(&self, count: usize) -> Vec<Value> {
        self.dense[self.offset as usize..]
            .iter()
            .take(count)
            .map(|&p| self.unpack(p))
            .collect()
    }

    /// Keeps only the first `count` of this part's own entries.
    pub(crate) fn truncate_own(&mut self, count: usize) {
        self.dense.truncate(self.offset as usize + count);
        self.overwrites += 1;
    }

    /// See [`Memo::overwrites`](Memo): unchanged, every entry read before reads the same.
    pub(crate) fn overwrites(&self) -> u64 {
        self.overwrites
    }

    /// Appends entries after the last one (what another part of a split decode stored).
    pub(crate) fn extend(&mut self, values: &[Value]) {
        self.dense.reserve(values.len());
        for &v in values {
            let p = self.pack(v);
            self.dense.push(p);
        }
    }

    fn pack(&mut self, v: Value) -> u64 {
        let container = |tag: u64, r: Ref| (tag << TAG_SHIFT) | r.pack();
        match v {
            Value::Str(s) => (TAG_STR << TAG_SHIFT) | s.0 as u64,
            Value::List(r) => container(TAG_LIST, r),
            Value::Tuple(r) => container(TAG_TUPLE, r),
            Value::Dict(r) => container(TAG_DICT, r),
            Value::Handle(kind, id) => {
                (TAG_HANDLE << TAG_SHIFT) | ((kind as u64) << 32) | id as u64
            }
            other => {
                self.other.push(other);
                (TAG_OTHER << TAG_SHIFT) | (self.other.len() - 1) as u64
            }
        }
    }

    #[inline(always)]
    fn unpack(&self, p: u64) -> Value {
        let payload = p & ((1 << TAG_SHIFT) - 1);
        match p >> TAG_SHIFT {
            TAG_STR => Value::Str(StrId(payload as u32)),
            TAG_LIST => Value::List(Ref::unpack(payload)),
            TAG_TUPLE => Value::Tuple(Ref::unpack(payload)),
            TAG_DICT => Value::Dict(Ref::unpack(payload)),
            TAG_HANDLE => Value::Handle((payload >> 32) as u8, payload as u32),
            _ => self
                .other
                .get(payload as usize)
                .copied()
                .unwrap_or(Value::None),
        }
    }

    /// Stores `v` at `index`.
    pub(crate) fn put(&mut self, index: u64, v: Value) {
        let p = self.pack(v);
        if index < self.dense.len() as u64 {
            let old = std::mem::replace(&mut self.dense[index as usize], p);
            // a stand-in imported, or a container replaced by what it was compacted into:
            // neither was fetched by the readers that watch `overwrites`
            if !matches!(
                self.unpack(old),
                Value::Handle(u8::MAX, _) | Value::List(_) | Value::Tuple(_) | Value::Dict(_)
            ) {
                self.overwrites += 1;
            }
        } else if index == self.dense.len() as u64 && self.sparse.is_empty() {
            self.ahead.before_push(&self.dense);
            self.dense.push(p);
        } else if self.sparse.insert(index, p).is_some() {
            self.overwrites += 1;
        }
    }

    /// Stores `v` after the last entry, where no entry was stored out of order (what
    /// [`Memo::put`] does at [`Memo::len`] then, without its checks).
    #[inline(always)]
    pub(crate) fn push(&mut self, v: Value) {
        debug_assert!(self.sparse.is_empty());
        let p = self.pack(v);
        self.ahead.before_push(&self.dense);
        self.dense.push(p);
    }

    /// The string stored at `index` in order, if that is what it holds.
    #[inline(always)]
    pub(crate) fn str_at(&self, index: u64) -> Option<StrId> {
        let p = *self.dense.get(usize::try_from(index).ok()?)?;
        (p >> TAG_SHIFT == TAG_STR).then_some(StrId((p & ((1 << TAG_SHIFT) - 1)) as u32))
    }

    /// The entry at `index`, if stored.
    #[inline(always)]
    pub(crate) fn get(&self, index: u64) -> Option<Value> {
        if let Some(&p) = self.dense.get(index as usize) {
            return Some(self.unpack(p));
        }
        self.sparse.get(&index).map(|&p| self.unpack(p))
    }

    /// Replaces the entry at `index` if it is stored.
    pub(crate) fn replace(&mut self, index: u64, v: Value) {
        if index < self.dense.len() as u64 || self.sparse.contains_key(&index) {
            self.put(index, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::Heap;

    #[test]
    fn every_kind_of_value_round_trips() {
        let mut heap = Heap::default();
        let l = heap.new_list(vec![]);
        let d = heap.new_dict(vec![]);
        let values = [
            Value::Str(StrId(7)),
            Value::List(l),
            Value::Tuple(l),
            Value::Dict(d),
            Value::Handle(3, u32::MAX),
            Value::Int(-5),
            Value::Float(0.5),
            Value::None,
            Value::Bool(true),
        ];
        let mut memo = Memo::default();
        for (i, v) in values.iter().enumerate() {
            memo.put(i as u64, *v);
        }
        for (i, v) in values.iter().enumerate() {
            assert_eq!(memo.get(i as u64), Some(*v));
        }
        memo.put(1 << 40, Value::Int(1));
        assert_eq!(memo.get(1 << 40), Some(Value::Int(1)));
        assert_eq!(memo.get(99), None);
        assert_eq!(memo.len(), values.len() + 1);
        memo.replace(0, Value::Int(3));
        memo.replace(12345, Value::Int(3));
        assert_eq!(memo.get(0), Some(Value::Int(3)));
        assert_eq!(memo.get(12345), None);
    }

    /// What the fast path of the decoder uses: appending as `put` at the end does, and reading
    /// a string without unpacking any other kind of entry.
    #[test]
    fn pushed_entries_read_as_put_ones_and_only_strings_are_strings() {
        let mut heap = Heap::default();
        let l = heap.new_list(vec![]);
        let values = [
            Value::Str(StrId(9)),
            Value::Handle(2, 5),
            Value::List(l),
            Value::Int(4),
        ];
        let (mut pushed, mut put) = (Memo::default(), Memo::default());
        for (i, &v) in values.iter().enumerate() {
            pushed.push(v);
            put.put(i as u64, v);
        }
        for i in 0..values.len() as u64 {
            assert_eq!(pushed.get(i), put.get(i));
        }
        assert_eq!(
            (pushed.len(), pushed.overwrites()),
            (put.len(), put.overwrites())
        );
        let strings: Vec<_> = (0..6).map(|i| pushed.str_at(i)).collect();
        assert_eq!(strings, [Some(StrId(9)), None, None, None, None, None]);
        assert_eq!(pushed.str_at(u64::MAX), None);
    }
}

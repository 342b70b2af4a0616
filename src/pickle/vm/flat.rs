//! The decoder's fast path: a flat dict (a trace entry) read whole from the window.
//!
//! Nearly all of a large snapshot is trace entries: small dicts of integers and memoized
//! strings with one list of frames, which are memo fetches or, where a frame first appears,
//! small dicts of their own. Decoded opcode by opcode, each entry costs a heap dict, a heap
//! list and fifty stack pushes, only for the adopter to compact them into a row at once. Here
//! the VM reads such a dict from the buffered window in one go, recognising just the opcodes
//! Python's pickler writes for it, and hands its pairs to [`Adopter::adopt_flat`].
//!
//! Anything else leaves the input untouched, and the general path decodes the dict as before:
//! another opcode, a container or a stand-in fetched from the memo, an index not stored yet, a
//! memo stored out of order, a dict longer than [`MAX_FLAT`] bytes or reaching past the point
//! where decoding pauses, too many values, or an adopter that declines (not a trace entry, a
//! field that does not convert: the general path then reports it at its own offset).
//!
//! Only a dict inside a batch of `APPENDS` to a list, with its items in one `MARK`...`SETITEMS`,
//! is read here: the general path offers such a dict to [`Adopter::completed`] at the end of
//! that `SETITEMS`, and the adopter makes the same of it either way, at the same point of the
//! pickle. What the general path leaves behind, this leaves too: the same strings interned in
//! the same order (both intern a string where they read it), the same frames, stacks and rows
//! in the same order, the memo entries holding what compaction leaves in them, the same counts
//! of values and opcodes, the same exports to the other parts of a split decode. Whether a
//! dict is read here depends only on its own bytes and the memo entries it fetches, never on
//! where a window ends: the window is topped up first.
//!
//! Most of an entry is pairs of a key fetched from the memo and an integer or another string
//! fetched: such a pair is recognised at once from its bytes, before the opcode-by-opcode
//! reading of a pair is tried.
//!
//! Written by hand: it is part of the VM, and no pickle library has such a path.

use super::{intern_utf8_at, is_container, is_stand_in, long1, op, Adopter, Reader, Vm};
use crate::pickle::value::{StrId, Value};
use std::io::Read;

/// Longest dict read here, in bytes. The window is topped up to this much before reading, so
/// whether a dict is read fast never depends on where the window happens to end.
pub(super) const MAX_FLAT: usize = 64 << 10;

/// One item of the list in a [`FlatDict`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FlatItem {
    /// A value fetched from the memo.
    Value(Value),
    /// The dict `k` of [`FlatDict::inner`] (a frame met for the first time, or fetched again
    /// within the same list).
    Dict(u32),
}

/// The list of a [`FlatDict`].
#[derive(Clone, Copy, Debug)]
pub enum FlatList<'a> {
    /// Its items.
    Items(&'a [FlatItem]),
    /// The same memo fetches, byte for byte, as a list the adopter replaced by this value
    /// before and called reusable ([`FlatAdopted::list_reusable`]); no memo entry has changed
    /// since, so its items are the same.
    Seen(Value),
}

/// A dict read whole by the fast path: what the general path would have stored into it, with
/// no heap container made.
pub struct FlatDict<'a> {
    /// Its key/value pairs, in order. The value of the pair that holds the list is
    /// [`Value::None`] until the adopter puts the list's replacement there.
    pub pairs: &'a mut [(Value, Value)],
    /// The one list among its values, if any: the index of its pair, and the list.
    pub list: Option<(usize, FlatList<'a>)>,
    /// The dicts among the list's items: each a range of [`FlatDict::inner_pairs`].
    pub inner: &'a [(u32, u32)],
    /// The pairs of the inner dicts, one after the other.
    pub inner_pairs: &'a [(Value, Value)],
}

/// What the adopter made of a [`FlatDict`]: replacements for the dict, its list and its inner
/// dicts (in order), as compaction leaves them in the memo.
pub struct FlatAdopted {
    /// The dict's replacement.
    pub dict: Value,
    /// The list's replacement ([`Value::None`] when there is no list).
    pub list: Value,
    /// The list's replacement depends on its items alone and had no effect the first time
    /// that a second time would lack: the same fetches may be given as [`FlatList::Seen`].
    pub list_reusable: bool,
    /// One replacement per inner dict.
    pub inner: Vec<Value>,
}

impl Default for FlatAdopted {
    fn default() -> Self {
        FlatAdopted {
            dict: Value::None,
            list: Value::None,
            list_reusable: false,
            inner: Vec::new(),
        }
    }
}

/// Lists of memo fetches already adopted, by their bytes, while no memo entry they may fetch
/// has changed ([`super::Memo::overwrites`]). A snapshot repeats a few thousand frame lists
/// in hundreds of thousands of entries.
///
/// A program allocates in the same order step after step, so the list that comes next is
/// mostly one that followed the previous list before: the two lists last seen after each are
/// kept, and the window is compared with them before its run of fetches is scanned and
/// hashed (a hit needs the same bytes followed by `APPENDS`, which is what makes the run the
/// same run).
#[derive(Default)]
pub(super) struct SeenLists {
    /// The runs' bytes, one after the other.
    arena: Vec<u8>,
    runs: Vec<SeenRun>,
    /// The first run of each hash of bytes (the others with it follow [`SeenRun::same_hash`]).
    by_hash: rustc_hash::FxHashMap<u64, u32>,
    /// The run of the last dict read here, while it is one of `runs`.
    last: Option<u32>,
    overwrites: u64,
}

/// A run of fetches seen before.
struct SeenRun {
    /// Where its bytes lie in [`SeenLists::arena`].
    at: usize,
    len: usize,
    fetches: u32,
    /// What the adopter replaced the list by.
    value: Value,
    /// The runs seen right after this one, latest first ([`NO_RUN`] where none).
    next: [u32; 2],
    /// The next run of the same hash, or [`NO_RUN`].
    same_hash: u32,
}

/// No run.
const NO_RUN: u32 = u32::MAX;

/// What [`SeenLists`] may hold, in bytes of fetches (beyond this it starts again).
const SEEN_BYTES: usize = 8 << 20;

/// What [`SeenLists::find`] finds at a list's first item.
enum Found {
    Seen(SeenHit),
    /// A run of `fetches` fetches, ending before the `APPENDS` at `end`, not seen before.
    New {
        end: usize,
        fetches: u32,
    },
    /// Not a run of fetches ended by `APPENDS`.
    NotARun,
}

/// A hit of [`SeenLists`]: the run's index, its length in bytes and fetches, and the list's
/// replacement.
#[derive(Clone, Copy)]
struct SeenHit {
    run: u32,
    len: usize,
    fetches: u32,
    value: Value,
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = rustc_hash::FxBuildHasher.build_hasher();
    h.write(bytes);
    h.finish()
}

impl SeenLists {
    /// Forgets every list if a memo entry changed since they were seen, or if `room` more bytes
    /// would not fit.
    fn forget_if_stale(&mut self, overwrites: u64, room: usize) {
        if overwrites != self.overwrites || self.arena.len() + room > SEEN_BYTES {
            self.arena.clear();
            self.runs.clear();
            self.by_hash.clear();
            self.last = None;
            self.overwrites = overwrites;
        }
    }

    fn hit(&self, k: u32) -> SeenHit {
        let r = &self.runs[k as usize];
        SeenHit {
            run: k,
            len: r.len,
            fetches: r.fetches,
            value: r.value,
        }
    }

    fn bytes(&self, k: u32) -> &[u8] {
        let r = &self.runs[k as usize];
        &self.arena[r.at..r.at + r.len]
    }

    /// What the window holds from `pos`, the first item of a list, with the memo's
    /// `overwrites` count now: a run seen before (predicted, or found by its bytes), a run of
    /// fetches not seen yet, or something else.
    fn find(&mut self, w: &[u8], pos: usize, overwrites: u64) -> Found {
        self.forget_if_stale(overwrites, 0);
        if let Some(hit) = self.predicted(&w[pos..]) {
            return Found::Seen(hit);
        }
        let Some((end, fetches)) = fetch_run(w, pos) else {
            return Found::NotARun;
        };
        match self.get(&w[pos..end]) {
            Some(hit) => Found::Seen(hit),
            None => Found::New { end, fetches },
        }
    }

    /// One of the lists that followed the last one before, if `w` starts with its run and
    /// `APPENDS`.
    fn predicted(&self, w: &[u8]) -> Option<SeenHit> {
        let last = self.last?;
        let next = self.runs[last as usize].next;
        next.into_iter().filter(|&k| k != NO_RUN).find_map(|k| {
            let bytes = self.bytes(k);
            let n = bytes.len();
            (w.get(n) == Some(&op::APPENDS) && w[..n] == *bytes).then(|| self.hit(k))
        })
    }

    /// The list whose run of fetches is `fetches` (ending before `APPENDS`), if seen before.
    fn get(&self, fetches: &[u8]) -> Option<SeenHit> {
        let mut k = *self.by_hash.get(&hash_bytes(fetches))?;
        while k != NO_RUN {
            if self.bytes(k) == fetches {
                return Some(self.hit(k));
            }
            k = self.runs[k as usize].same_hash;
        }
        None
    }

    /// Keeps a list not seen before: its run of `count` fetches, replaced by `value`.
    fn insert(&mut self, fetches: &[u8], count: u32, value: Value, overwrites: u64) -> SeenHit {
        self.forget_if_stale(overwrites, fetches.len());
        let k = self.runs.len() as u32;
        let first = self.by_hash.entry(hash_bytes(fetches)).or_insert(NO_RUN);
        let same_hash = std::mem::replace(first, k);
        self.runs.push(SeenRun {
            at: self.arena.len(),
            len: fetches.len(),
            fetches: count,
            value,
            next: [NO_RUN; 2],
            same_hash,
        });
        self.arena.extend_from_slice(fetches);
        self.hit(k)
    }

    /// Notes that run `k` followed the last one; `None` when the dict just read had no list of
    /// `runs` (a free's entry fetches its block's list whole): the last one stays the last.
    fn followed(&mut self, k: Option<u32>) {
        let Some(k) = k else {
            return;
        };
        if let Some(last) = self.last {
            let next = &mut self.runs[last as usize].next;
            if next[0] != k {
                next[1] = next[0];
                next[0] = k;
            }
        }
        self.last = Some(k);
    }
}

/// A memo entry stored while the dict is read, before it is known what it becomes.
#[derive(Clone, Copy)]
enum Pending {
    Outer,
    List,
    Inner(u32),
    Str(StrId),
    /// A pair of integers (a trace entry's `pool_id`, torch 2.12+), as the tuple made for it.
    Pair(Value),
}

/// Buffers kept from one dict to the next.
#[derive(Default)]
pub(super) struct FlatScratch {
    pairs: Vec<(Value, Value)>,
    /// The pair that holds the list.
    list_at: Option<usize>,
    /// The list is a run of fetches seen before.
    seen: Option<SeenHit>,
    /// Where in the window the list's run of fetches lies, and how many fetches it holds,
    /// when it is one not seen before.
    run: Option<(usize, usize, u32)>,
    items: Vec<FlatItem>,
    inner: Vec<(u32, u32)>,
    inner_pairs: Vec<(Value, Value)>,
    pending: Vec<Pending>,
    adopted: FlatAdopted,
}

impl FlatScratch {
    fn clear(&mut self) {
        self.pairs.clear();
        self.list_at = None;
        self.seen = None;
        self.run = None;
        self.items.clear();
        self.inner.clear();
        self.inner_pairs.clear();
        self.pending.clear();
    }
}

/// Where the reading stands in the window, and what it has counted. Copied, not lent, to the
/// rarely taken calls that are kept out of line, so that the dict's own reading keeps it in
/// registers.
#[derive(Clone, Copy)]
struct Cursor<'w> {
    w: &'w [u8],
    pos: usize,
    /// Opcodes read (as the general path counts them between looks at memory).
    ops: u32,
    /// Values pushed (as the general path counts them against the value budget).
    values: u64,
}

impl Cursor<'_> {
    /// The next opcode, past any `FRAME`s (which the general path also just skips).
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        loop {
            let b = *self.w.get(self.pos)?;
            if b != op::FRAME {
                return Some(b);
            }
            if self.pos + 9 > self.w.len() {
                return None;
            }
            self.pos += 9;
            self.ops += 1;
        }
    }

    /// Consumes an opcode of `len` bytes.
    #[inline(always)]
    fn step(&mut self, len: usize) {
        self.pos += len;
        self.ops += 1;
    }

    #[inline(always)]
    fn arg<const N: usize>(&self) -> Option<[u8; N]> {
        self.w
            .get(self.pos + 1..self.pos + 1 + N)
            .map(|s| s.try_into().expect("length checked"))
    }
}

/// The run of `BINGET`/`LONG_BINGET`s from `pos` when `APPENDS` ends it: where the
/// `APPENDS` stands, and how many fetches there are. Kept out of line, so that its loop keeps
/// the position in a register.
#[inline(never)]
fn fetch_run(w: &[u8], mut pos: usize) -> Option<(usize, u32)> {
    let mut n = 0;
    loop {
        match *w.get(pos)? {
            op::BINGET => pos += 2,
            op::LONG_BINGET => pos += 5,
            op::APPENDS => return Some((pos, n)),
            _ => return None,
        }
        n += 1;
    }
}

/// The memo index that a `BINGET` or `LONG_BINGET` at `at` fetches, and where the opcode ends.
#[inline(always)]
fn fetch_index(w: &[u8], at: usize) -> Option<(u64, usize)> {
    match *w.get(at)? {
        op::BINGET => Some((*w.get(at + 1)? as u64, at + 2)),
        op::LONG_BINGET => {
            let b: [u8; 4] = w.get(at + 1..at + 5)?.try_into().ok()?;
            Some((u32::from_le_bytes(b) as u64, at + 5))
        }
        _ => None,
    }
}

/// The integer that a `BININT1`, `BININT2`, `BININT` or `LONG1` (of up to 8 bytes) at `at`
/// pushes, and where the opcode ends.
#[inline(always)]
fn int_at(w: &[u8], at: usize) -> Option<(i64, usize)> {
    match *w.get(at)? {
        op::BININT1 => Some((*w.get(at + 1)? as i64, at + 2)),
        op::BININT2 => {
            let b = w.get(at + 1..at + 3)?;
            Some((u16::from_le_bytes([b[0], b[1]]) as i64, at + 3))
        }
        op::BININT => {
            let b: [u8; 4] = w.get(at + 1..at + 5)?.try_into().ok()?;
            Some((i32::from_le_bytes(b) as i64, at + 5))
        }
        op::LONG1 => {
            let n = *w.get(at + 1)? as usize;
            Some((long1(w, at + 2, n)?, at + 2 + n))
        }
        _ => None,
    }
}

/// A memo fetch's result, as the fast path can use it.
enum Fetched {
    Value(Value),
    Inner(u32),
}

impl<A: Adopter> Vm<'_, A> {
    /// Reads the dict that starts the window whole, if it is a flat dict the adopter takes.
    /// Returns `false` (consuming nothing, changing nothing the general path would not) when
    /// the general path must decode it.
    pub(super) fn flat_dict<R: Read>(&mut self, r: &mut Reader<R>) -> bool {
        if !A::READS_FLAT || self.memo.has_sparse() || !self.in_list_batch() {
            return false;
        }
        if r.window().len() < MAX_FLAT {
            r.prefetch(MAX_FLAT);
        }
        let w = r.window();
        let w = &w[..w.len().min(MAX_FLAT)];
        let mut s = self.flat.take().unwrap_or_default();
        s.clear();
        let mut c = Cursor {
            w,
            pos: 0,
            ops: 0,
            values: 0,
        };
        let read = self.read_outer(&mut c, &mut s).is_some()
            && self.offset.saturating_add(c.pos as u64) <= self.stop_at
            && self.values.saturating_add(c.values) <= self.limits.max_values;
        let (consumed, ops, values) = (c.pos, c.ops, c.values);
        let taken = read && self.adopt_read(&mut s);
        if taken {
            let overwrites = self.memo.overwrites();
            let current = match (s.seen, s.run) {
                (Some(seen), _) => Some(seen.run),
                (None, Some((from, to, n))) if s.adopted.list_reusable => {
                    let v = s.adopted.list;
                    Some(self.seen_lists.insert(&w[from..to], n, v, overwrites).run)
                }
                _ => None,
            };
            self.seen_lists.followed(current);
            r.advance(consumed);
            self.commit(&mut s, ops, values);
        }
        self.flat = Some(s);
        taken
    }

    /// Whether the top of the stack (or a value read now) lies in a batch of `APPENDS` to a
    /// list (in a part of a split decode, also to the list below the part's stack): where trace
    /// entries are, and where the general path offers a dict to [`Adopter::completed`] at the
    /// end of its `SETITEMS`.
    pub(super) fn in_list_batch(&self) -> bool {
        match self.marks.last() {
            None | Some(0) => self.part.is_some(),
            Some(&m) => matches!(self.stack.get(m - 1), Some(Value::List(_))),
        }
    }

    /// Hands what was read to the adopter.
    fn adopt_read(&mut self, s: &mut FlatScratch) -> bool {
        let dict = FlatDict {
            pairs: &mut s.pairs,
            list: s.list_at.map(|i| match s.seen {
                Some(hit) => (i, FlatList::Seen(hit.value)),
                None => (i, FlatList::Items(&s.items)),
            }),
            inner: &s.inner,
            inner_pairs: &s.inner_pairs,
        };
        self.adopter
            .adopt_flat(&mut self.heap, dict, &mut s.adopted)
    }

    /// Stores the memo entries read, in order, with what the adopter made of them, and pushes
    /// the dict's replacement.
    fn commit(&mut self, s: &mut FlatScratch, ops: u32, values: u64) {
        // the entries follow the last one, and none was stored out of order (`flat_dict`
        // reads nothing otherwise); none is a container, which the heap would note
        let base = self.memo.len() as u64;
        for (k, &p) in s.pending.iter().enumerate() {
            let v = match p {
                Pending::Outer => s.adopted.dict,
                Pending::List => s.adopted.list,
                Pending::Inner(i) => s.adopted.inner[i as usize],
                Pending::Str(id) => Value::Str(id),
                // what the adopter replaced the tuple by, as the general path's memo holds it
                Pending::Pair(v) => self.heap.forwarded(v).unwrap_or(v),
            };
            if is_container(v) {
                self.heap.note_memo(v, base + k as u64);
            }
            self.memo.push(v);
            self.adopter.memoized(&self.heap, base + k as u64, v);
        }
        self.values += values;
        self.since_check += ops.saturating_sub(1);
        self.stack.push(s.adopted.dict);
    }

    /// `EMPTY_DICT`, a memo entry, and its pairs in one batch: `MARK` pairs `SETITEMS`, where
    /// the general path offers the dict to [`Adopter::completed`]. (One pair and `SETITEM` is
    /// left to it: protocol 0 sets every pair so, and no later point says the dict is done.)
    fn read_outer(&mut self, at: &mut Cursor, s: &mut FlatScratch) -> Option<()> {
        let mut local = *at;
        let c = &mut local;
        if c.peek()? != op::EMPTY_DICT {
            return None;
        }
        c.step(1);
        c.values += 1;
        self.memo_op(c, s, Pending::Outer)?;
        if c.peek()? != op::MARK {
            return None;
        }
        self.read_pairs(c, s, true)?;
        *at = local;
        Some(())
    }

    /// An inner dict (a frame): `EMPTY_DICT`, its memo entry and its pairs.
    fn read_inner(&mut self, c: &mut Cursor, s: &mut FlatScratch) -> Option<u32> {
        c.step(1);
        c.values += 1;
        let k = s.inner.len() as u32;
        self.memo_op(c, s, Pending::Inner(k))?;
        let start = s.inner_pairs.len() as u32;
        self.read_pairs(c, s, false)?;
        s.inner.push((start, s.inner_pairs.len() as u32));
        Some(k)
    }

    /// A dict's pairs: `MARK` pairs `SETITEMS`, or one pair and `SETITEM`. The outer dict's
    /// values may hold the one list; an inner dict's are scalars and strings.
    #[inline(always)]
    fn read_pairs(&mut self, c: &mut Cursor, s: &mut FlatScratch, outer: bool) -> Option<()> {
        let batch = c.peek()? == op::MARK;
        if batch {
            c.step(1);
        }
        loop {
            // the commonest pairs at once: a key fetched, then an integer or a string fetched
            // (the same opcodes and values counted as below)
            if let (true, Some((key, at))) = (outer, self.fetched_str(c.w, c.pos)) {
                let value = match self.common_value(c.w, at) {
                    Some((value, end)) => {
                        (c.pos, c.ops, c.values) = (end, c.ops + 2, c.values + 2);
                        value
                    }
                    None => {
                        (c.pos, c.ops, c.values) = (at, c.ops + 1, c.values + 1);
                        self.outer_value(c, s)?
                    }
                };
                s.pairs.push((Value::Str(key), value));
                continue;
            }
            if batch && c.peek()? == op::SETITEMS {
                c.step(1);
                return Some(());
            }
            let key = self.key(c, s)?;
            if outer {
                let value = self.outer_value(c, s)?;
                s.pairs.push((key, value));
            } else {
                let Fetched::Value(value) = self.scalar(c, s)? else {
                    return None;
                };
                s.inner_pairs.push((key, value));
            }
            if !batch {
                return (c.peek()? == op::SETITEM).then(|| c.step(1));
            }
        }
    }

    /// The commonest value of a trace entry's pair, at `at`: an integer of up to 8 bytes, or
    /// a string fetched from the memo. Gives it and where it ends; `None` for anything else
    /// (or a `FRAME` first), which the general reading of a value then takes.
    #[inline(always)]
    fn common_value(&self, w: &[u8], at: usize) -> Option<(Value, usize)> {
        match *w.get(at)? {
            op::BINGET | op::LONG_BINGET => {
                let (v, end) = self.fetched_str(w, at)?;
                Some((Value::Str(v), end))
            }
            _ => {
                let (v, end) = int_at(w, at)?;
                // an integer right after it starts a pair (`pool_id`), read by `int_pair`
                if matches!(
                    w.get(end),
                    Some(&(op::BININT1 | op::BININT2 | op::BININT | op::LONG1))
                ) {
                    return None;
                }
                Some((Value::Int(v), end))
            }
        }
    }

    /// `BINGET` or `LONG_BINGET` at `at` of a string stored before this dict: the string and
    /// where the opcode ends.
    #[inline(always)]
    fn fetched_str(&self, w: &[u8], at: usize) -> Option<(StrId, usize)> {
        let (index, end) = fetch_index(w, at)?;
        Some((self.memo.str_at(index)?, end))
    }

    /// `EMPTY_LIST`, a memo entry, and its items: `MARK` items `APPENDS`, one item and
    /// `APPEND`, or none.
    #[inline(always)]
    fn read_list(&mut self, c: &mut Cursor, s: &mut FlatScratch) -> Option<()> {
        c.step(1);
        c.values += 1;
        self.memo_op(c, s, Pending::List)?;
        if c.peek()? == op::MARK {
            c.step(1);
            match self.seen_lists.find(c.w, c.pos, self.memo.overwrites()) {
                Found::Seen(hit) => {
                    // the fetches and the APPENDS, as the loop below would count them
                    let n = hit.fetches;
                    (c.pos, c.ops, c.values) =
                        (c.pos + hit.len + 1, c.ops + n + 1, c.values + n as u64);
                    s.seen = Some(hit);
                    return Some(());
                }
                Found::New { end, fetches } => s.run = Some((c.pos, end, fetches)),
                Found::NotARun => {}
            }
            return self.items(c, s);
        }
        // one item then APPEND; anything else means the list is empty and the dict goes on
        let lengths = (
            s.items.len(),
            s.pending.len(),
            s.inner.len(),
            s.inner_pairs.len(),
        );
        let mut one = *c;
        if self.item(&mut one, s).is_some() && one.peek() == Some(op::APPEND) {
            one.step(1);
            *c = one;
            return Some(());
        }
        s.items.truncate(lengths.0);
        s.pending.truncate(lengths.1);
        s.inner.truncate(lengths.2);
        s.inner_pairs.truncate(lengths.3);
        Some(())
    }

    /// A list's items up to its `APPENDS`, where they are not a run seen before.
    #[inline(never)]
    fn items(&mut self, at: &mut Cursor, s: &mut FlatScratch) -> Option<()> {
        let mut c = *at;
        loop {
            if c.peek()? == op::APPENDS {
                c.step(1);
                *at = c;
                return Some(());
            }
            self.item(&mut c, s)?;
        }
    }

    /// A list item: a memo fetch or an inner dict.
    fn item(&mut self, c: &mut Cursor, s: &mut FlatScratch) -> Option<()> {
        let item = match c.peek()? {
            op::EMPTY_DICT => FlatItem::Dict(self.read_inner(c, s)?),
            op::BINGET | op::LONG_BINGET => match self.fetch(c, s)? {
                Fetched::Value(v) => FlatItem::Value(v),
                Fetched::Inner(k) => FlatItem::Dict(k),
            },
            _ => return None,
        };
        s.items.push(item);
        Some(())
    }

    /// A key: a string, fetched or read (and memoized).
    #[inline(always)]
    fn key(&mut self, c: &mut Cursor, s: &mut FlatScratch) -> Option<Value> {
        match self.scalar(c, s)? {
            Fetched::Value(v @ Value::Str(_)) => Some(v),
            _ => None,
        }
    }

    /// A value of the outer dict: a scalar, a string, or the one list.
    #[inline(always)]
    fn outer_value(&mut self, c: &mut Cursor, s: &mut FlatScratch) -> Option<Value> {
        if c.peek()? == op::EMPTY_LIST {
            if s.list_at.is_some() {
                return None;
            }
            self.read_list(c, s)?;
            s.list_at = Some(s.pairs.len());
            return Some(Value::None);
        }
        if let Some(pair) = self.int_pair(c, s) {
            return Some(pair);
        }
        match self.scalar(c, s)? {
            Fetched::Value(v) => Some(v),
            Fetched::Inner(_) => None,
        }
    }

    /// Two integers and `TUPLE2` (with its memo entry), as Python writes a trace entry's
    /// `pool_id`: the tuple, counted as the general path counts it (three values, three
    /// opcodes). `None`, consuming nothing, for anything else.
    #[inline(always)]
    fn int_pair(&mut self, c: &mut Cursor, s: &mut FlatScratch) -> Option<Value> {
        let (a, at) = int_at(c.w, c.pos)?;
        let (b, at) = int_at(c.w, at)?;
        if *c.w.get(at)? != op::TUPLE2 {
            return None;
        }
        (c.pos, c.ops, c.values) = (at + 1, c.ops + 3, c.values + 3);
        let v = Value::Tuple(self.heap.new_list(vec![Value::Int(a), Value::Int(b)]));
        self.memo_op(c, s, Pending::Pair(v))?;
        Some(v)
    }

    /// An integer, `None`, a bool, a float, a string (with its memo entry) or a memo fetch.
    #[inline(always)]
    fn scalar(&mut self, c: &mut Cursor, s: &mut FlatScratch) -> Option<Fetched> {
        let code = c.peek()?;
        let v = match code {
            op::BINGET | op::LONG_BINGET => return self.fetch(c, s),
            op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => {
                let (v, end) = int_at(c.w, c.pos)?;
                c.step(end - c.pos);
                Value::Int(v)
            }
            op::NONE => {
                c.step(1);
                Value::None
            }
            op::NEWTRUE | op::NEWFALSE => {
                c.step(1);
                Value::Bool(code == op::NEWTRUE)
            }
            op::BINFLOAT => {
                let b = c.arg::<8>()?;
                c.step(9);
                Value::Float(f64::from_be_bytes(b))
            }
            op::SHORT_BINUNICODE | op::BINUNICODE => {
                let (head, n) = if code == op::SHORT_BINUNICODE {
                    (2, c.arg::<1>()?[0] as usize)
                } else {
                    (5, u32::from_le_bytes(c.arg::<4>()?) as usize)
                };
                if n > self.limits.max_string_bytes {
                    return None;
                }
                let at = c.pos + head;
                c.w.get(at..at + n)?;
                let id = intern_utf8_at(&mut self.heap, c.w, at, n);
                c.step(head + n);
                c.values += 1;
                self.memo_op(c, s, Pending::Str(id))?;
                return Some(Fetched::Value(Value::Str(id)));
            }
            _ => return None,
        };
        c.values += 1;
        Some(Fetched::Value(v))
    }

    /// `BINGET` or `LONG_BINGET` of an entry stored before this dict (not a container, not a
    /// stand-in for another part's entry), or of a string or inner dict stored within it.
    #[inline(always)]
    fn fetch(&self, c: &mut Cursor, s: &FlatScratch) -> Option<Fetched> {
        c.peek()?; // past any FRAME
        let (index, end) = fetch_index(c.w, c.pos)?;
        let stored = self.memo.len() as u64;
        let fetched = if index >= stored {
            match s.pending.get((index - stored) as usize)? {
                Pending::Str(id) => Fetched::Value(Value::Str(*id)),
                Pending::Inner(k) => Fetched::Inner(*k),
                Pending::Outer | Pending::List | Pending::Pair(_) => return None,
            }
        } else {
            match self.memo.get(index)? {
                v if is_stand_in(v) || is_container(v) => return None,
                v => Fetched::Value(v),
            }
        };
        c.step(end - c.pos);
        c.values += 1;
        Some(fetched)
    }

    /// An optional memo entry for what was just read: `MEMOIZE`, or (outside a part of a split
    /// decode) `BINPUT`/`LONG_BINPUT` of the next index. `None` for a `PUT` elsewhere.
    #[inline(always)]
    fn memo_op(&self, c: &mut Cursor, s: &mut FlatScratch, what: Pending) -> Option<()> {
        let next = self.memo.len() as u64 + s.pending.len() as u64;
        let (index, len) = match c.peek()? {
            op::MEMOIZE => (next, 1),
            op::BINPUT if self.part.is_none() => (c.arg::<1>()?[0] as u64, 2),
            op::LONG_BINPUT if self.part.is_none() => (u32::from_le_bytes(c.arg::<4>()?) as u64, 5),
            _ => return Some(()),
        };
        if index != next {
            return None;
        }
        c.step(len);
        s.pending.push(what);
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `BINGET`s of `indices`, and the window holding it with `APPENDS` after it.
    fn run(indices: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let fetches: Vec<u8> = indices.iter().flat_map(|&i| [op::BINGET, i]).collect();
        let mut window = fetches.clone();
        window.push(op::APPENDS);
        window.extend_from_slice(&[op::SETITEMS, op::APPENDS]);
        (fetches, window)
    }

    /// [`SeenLists::predicted`] with the memo's overwrites count at `overwrites`.
    fn predicted(seen: &mut SeenLists, w: &[u8], overwrites: u64) -> Option<SeenHit> {
        seen.forget_if_stale(overwrites, 0);
        seen.predicted(w)
    }

    /// [`SeenLists::get`] with the memo's overwrites count at `overwrites`.
    fn get(seen: &mut SeenLists, fetches: &[u8], overwrites: u64) -> Option<SeenHit> {
        seen.forget_if_stale(overwrites, 0);
        seen.get(fetches)
    }

    #[test]
    fn the_list_that_followed_before_is_predicted_and_only_where_its_run_ends() {
        let mut seen = SeenLists::default();
        let (a, wa) = run(&[1, 2, 3]);
        let (b, wb) = run(&[1, 2, 4, 5]);
        let (c, wc) = run(&[6]);
        let hit_a = seen.insert(&a, 3, Value::Handle(2, 0), 0);
        seen.followed(Some(hit_a.run));
        let hit_b = seen.insert(&b, 4, Value::Handle(2, 1), 0);
        seen.followed(Some(hit_b.run));
        let hit_c = seen.insert(&c, 1, Value::Handle(2, 2), 0);
        seen.followed(Some(hit_c.run));
        // after c, nothing has followed yet
        assert!(predicted(&mut seen, &wb, 0).is_none());
        seen.followed(Some(hit_a.run));
        // after a came b: predicted with its length, fetches and value
        let p = predicted(&mut seen, &wb, 0).expect("b follows a");
        assert_eq!((p.run, p.len, p.fetches), (hit_b.run, b.len(), 4));
        assert_eq!(p.value, Value::Handle(2, 1));
        // the same bytes without APPENDS after them are another (longer) run
        let mut longer = b.clone();
        longer.extend_from_slice(&[op::BINGET, 9, op::APPENDS]);
        assert!(predicted(&mut seen, &longer, 0).is_none());
        // a run that starts like b but is shorter is not b
        assert!(predicted(&mut seen, &wa, 0).is_none());
        // what is found by its bytes is found whether predicted or not
        assert_eq!(get(&mut seen, &c, 0).map(|h| h.run), Some(hit_c.run));
        assert!(get(&mut seen, &wc, 0).is_none());
        // a changed memo entry forgets everything
        assert!(predicted(&mut seen, &wb, 1).is_none());
        assert!(get(&mut seen, &b, 1).is_none());
    }

    #[test]
    fn two_lists_after_one_are_both_predicted() {
        let mut seen = SeenLists::default();
        let runs: Vec<(Vec<u8>, Vec<u8>)> = [&[1u8][..], &[2], &[3]].map(run).into();
        let hits: Vec<SeenHit> = runs
            .iter()
            .enumerate()
            .map(|(k, (r, _))| seen.insert(r, 1, Value::Handle(2, k as u32), 0))
            .collect();
        // 0 then 1, 0 then 2
        for next in [1, 2] {
            seen.followed(Some(hits[0].run));
            seen.followed(Some(hits[next].run));
        }
        seen.followed(Some(hits[0].run));
        assert_eq!(
            predicted(&mut seen, &runs[1].1, 0).map(|h| h.run),
            Some(hits[1].run)
        );
        assert_eq!(
            predicted(&mut seen, &runs[2].1, 0).map(|h| h.run),
            Some(hits[2].run)
        );
        // a list without a run of its own keeps the last one the last
        seen.followed(None);
        assert!(predicted(&mut seen, &runs[2].1, 0).is_some());
    }
}

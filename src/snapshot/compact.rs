//! The streaming compactor: the [`Adopter`] plugged into the pickle VM that turns frames,
//! stacks and trace entries into rows as they complete.
//!
//! [`EntryCompactor`] makes a frame dict a [`FrameId`] as soon as it is stored in its list, a
//! frame list a [`StackId`], and a trace entry dict a [`TraceEvent`] row, each freeing the
//! container it replaces, so a snapshot of millions of entries never holds them as pickle
//! values. What is left (the top-level dict, segments and blocks, settings) is small and is read
//! by [`super::build`]. Every conversion is checked: a wrong type names the field, and a trace
//! entry referenced from two places (which PyTorch never writes, and a memo bomb would) is
//! refused. In a split decode ([`super::split`]) the compactor of each part talks to the
//! others through a [`PartLink`].

use super::*;
use crate::pickle::{
    Adopter, FieldError, FlatAdopted, FlatDict, FlatItem, FlatList, Heap, Limits, Ref, Value,
};

/// The tie of one part of a split decode to the others ([`super::split`] implements it): what
/// this part's compactor stores goes out, what earlier parts stored comes in.
#[cfg(unix)]
pub(crate) trait PartLink: Send {
    /// A string this part uses as a key, an action or a frame's text, which others may fetch.
    fn need(&mut self, heap: &Heap, s: StrId);
    /// A memo entry this part stored at `index`.
    fn export(&mut self, heap: &Heap, stacks: &Stacks, index: u64, value: Value);
    /// A point where parts waiting for this one may be served.
    fn tick(&mut self);
    /// Memo entry `index` of an earlier part, brought into this part's heap and frame table.
    fn import(&mut self, heap: &mut Heap, stacks: &mut Stacks, index: u64) -> Option<Value>;
}

/// Handle kinds of compacted values.
pub(crate) const FRAME: u8 = 1;

pub(crate) const STACK: u8 = 2;

pub(crate) const EVENT: u8 = 3;

/// A trace entry's `pool_id` pair, packed ([`PoolId`]) in place of its tuple.
pub(crate) const POOL: u8 = 5;

/// The keys the builder looks for. They are interned first, in this order, into a fresh
/// heap, so key `i` has `StrId(i)` and a field is found with one `match` on the id.
pub(super) const KEYS: [&str; 16] = [
    "",
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "compile_context",
    "user_metadata",
    "device_free",
    "forward_frames",
    "name",
    "filename",
    "line",
    "block_size",
    "pool_id",
];

pub(super) const K_EMPTY: u32 = 0;

pub(super) const K_ACTION: u32 = 1;

pub(super) const K_ADDR: u32 = 2;

pub(super) const K_SIZE: u32 = 3;

pub(super) const K_STREAM: u32 = 4;

pub(super) const K_TIME_US: u32 = 5;

pub(super) const K_FRAMES: u32 = 6;

pub(super) const K_COMPILE_CONTEXT: u32 = 7;

pub(super) const K_USER_METADATA: u32 = 8;

pub(super) const K_DEVICE_FREE: u32 = 9;

pub(super) const K_FORWARD_FRAMES: u32 = 10;

pub(super) const K_NAME: u32 = 11;

pub(super) const K_FILENAME: u32 = 12;

pub(super) const K_LINE: u32 = 13;

pub(super) const K_BLOCK_SIZE: u32 = 14;

pub(super) const K_POOL_ID: u32 = 15;

/// The VM hook that turns frames, stacks and trace entries into rows as they complete.
pub(crate) struct EntryCompactor {
    pub(crate) stacks: Stacks,
    pub(crate) events: Vec<TraceEvent>,
    pub(crate) forward_frames: Vec<Vec<StrId>>,
    /// The streams met, stream 0 first ([`super::Snapshot::streams`]).
    pub(crate) streams: Vec<i64>,
    /// The rare fields of the entries that carry any ([`super::Snapshot::event_extras`]).
    pub(crate) extras: Vec<EventExtra>,
    actions: Vec<(StrId, Action)>,
    /// The stream of the last entry ([`EntryCompactor::stream_id`]).
    last_stream: u32,
    /// Each stream's id.
    stream_index: rustc_hash::FxHashMap<i64, u32>,
    /// The set of rare fields of the last entry that had one, and its id.
    last_extra: (EventExtra, u32),
    /// Each set's id ([`EntryCompactor::extra_id`]).
    extra_index: rustc_hash::FxHashMap<EventExtra, u32>,
    scratch: Vec<FrameId>,
    /// The tie to the other parts of a split decode, if any.
    #[cfg(unix)]
    pub(crate) link: Option<Box<dyn PartLink>>,
    /// Entries of other parts of a split decode that this part met and did not import.
    pub(crate) deferred: Deferred,
    /// A value of another part was needed where it could not be deferred: this part cannot be
    /// taken in.
    pub(crate) tainted: bool,
    /// Strings, frames and stacks there were at the last clean point of a part.
    pub(crate) at_clean: (usize, usize, usize),
    /// Trace entries taken whole from the decoder's fast path ([`Adopter::adopt_flat`]).
    pub(crate) read_whole: u64,
    /// Keeps the pages past the rows' end faulted in on another core.
    events_ahead: crate::memory::ahead::Ahead,
}

/// The handle kind of a value deferred by a split decode ([`super::split`]).
pub(crate) const DEFERRED: u8 = 4;

/// What a deferred memo entry stood for where it was met.
#[derive(Clone, Copy)]
pub(crate) enum Deferral {
    /// A frame of a frame list.
    Frame,
    /// A trace entry's frame list.
    Stack,
    /// A trace entry's `compile_context` or `user_metadata`.
    Text,
}

/// Memo entries of other parts of a split decode that a part stored in its rows: the `k`-th
/// deferred entry of a kind gets the id `u32::MAX - k` (far above any real frame, stack or
/// string id), resolved against the first decoder's memo when the part is taken in.
#[derive(Default)]
pub(crate) struct Deferred {
    indices: [Vec<u64>; 3],
    places: rustc_hash::FxHashMap<(usize, u32), u32>,
}

impl Deferred {
    /// The stand-in id of memo entry `index` met as `kind` (the same id each time).
    fn stand_in(&mut self, kind: Deferral, index: u32) -> u32 {
        let list = &mut self.indices[kind as usize];
        let k = *self
            .places
            .entry((kind as usize, index))
            .or_insert_with(|| {
                list.push(index as u64);
                (list.len() - 1) as u32
            });
        u32::MAX - k
    }

    /// The memo index a stand-in id of `kind` stands for; `None` for a real id.
    pub(crate) fn index(&self, kind: Deferral, id: u32) -> Option<u64> {
        self.indices[kind as usize]
            .get((u32::MAX - id) as usize)
            .copied()
    }
}

/// A `pool_id` pair, packed; a value that is no pair of integers counts as no pool id.
fn pool_of(heap: &Heap, v: Value) -> PoolId {
    let v = heap.forwarded(v).unwrap_or(v);
    if let Value::Handle(POOL, p) = v {
        return PoolId(p as u16);
    }
    let (Value::Tuple(t) | Value::List(t)) = v else {
        return PoolId::UNKNOWN;
    };
    match heap.list(t) {
        &[a, b] => match (heap.int(a), heap.int(b)) {
            (Some(a), Some(b)) => PoolId::pack((
                i64::try_from(a).unwrap_or(-1),
                i64::try_from(b).unwrap_or(-1),
            )),
            _ => PoolId::UNKNOWN,
        },
        _ => PoolId::UNKNOWN,
    }
}

/// Replaces a `pool_id` tuple by the handle of its packed `pool` (so the tuple does not stay
/// in the heap, held by its memo entry); the handle, or `None` for no pool id.
fn pool_handle(heap: &mut Heap, tuple: Ref, pool: PoolId) -> Option<Value> {
    if pool == PoolId::UNKNOWN {
        return None;
    }
    let handle = Value::Handle(POOL, pool.0 as u32);
    heap.replace_list(tuple, handle);
    Some(handle)
}

impl EntryCompactor {
    pub(crate) fn new() -> Self {
        EntryCompactor {
            stacks: Stacks::default(),
            events: Vec::new(),
            forward_frames: Vec::new(),
            streams: vec![0],
            extras: Vec::new(),
            actions: Vec::new(),
            last_stream: 0,
            stream_index: [(0, 0)].into_iter().collect(),
            last_extra: (EventExtra::default(), 0),
            extra_index: Default::default(),
            scratch: Vec::new(),
            #[cfg(unix)]
            link: None,
            deferred: Deferred::default(),
            tainted: false,
            at_clean: (0, 0, 0),
            read_whole: 0,
            events_ahead: Default::default(),
        }
    }

    /// A text field's string (empty when it is no string).
    fn text_of(&mut self, v: Value) -> StrId {
        match v {
            Value::Handle(DEFERRED, index) => StrId(self.deferred.stand_in(Deferral::Text, index)),
            v => str_id(v).unwrap_or(StrId(K_EMPTY)),
        }
    }

    /// A frame id for a frame dict (or an already compacted frame).
    pub(crate) fn frame_of(&mut self, heap: &Heap, v: Value) -> Option<FrameId> {
        let v = heap.forwarded(v).unwrap_or(v);
        match v {
            Value::Handle(FRAME, id) => Some(FrameId(id)),
            Value::Handle(DEFERRED, index) => {
                Some(FrameId(self.deferred.stand_in(Deferral::Frame, index)))
            }
            Value::Dict(d) => self.frame_from_pairs(heap, heap.dict(d)),
            _ => None,
        }
    }

    /// A frame id for a frame dict's pairs (`None` without a `name`).
    fn frame_from_pairs(&mut self, heap: &Heap, pairs: &[(Value, Value)]) -> Option<FrameId> {
        let (mut name, mut filename, mut line) = (None, None, 0u32);
        for &(key, val) in pairs {
            self.tainted |= is_deferred(key) || is_deferred(val);
            let Value::Str(key) = key else { continue };
            #[cfg(unix)]
            if let Some(link) = self.link.as_mut() {
                link.need(heap, key);
            }
            match key.0 {
                K_NAME => name = str_id(val),
                K_FILENAME => filename = str_id(val),
                K_LINE => {
                    line = heap
                        .int(val)
                        .and_then(|l| u32::try_from(l).ok())
                        .unwrap_or(0)
                }
                _ => {}
            }
        }
        let frame = Frame {
            name: name?,
            filename: filename.unwrap_or(StrId(K_EMPTY)),
            line,
        };
        Some(self.stacks.intern_frame(frame))
    }

    /// A stack id for a list of frames, or `None` if an item is not a frame.
    pub(crate) fn stack_of(&mut self, heap: &Heap, v: Value) -> Option<StackId> {
        let v = heap.forwarded(v).unwrap_or(v);
        match v {
            Value::Handle(STACK, id) => Some(StackId(id)),
            Value::Handle(DEFERRED, index) => {
                Some(StackId(self.deferred.stand_in(Deferral::Stack, index)))
            }
            Value::List(l) => self.stack_from_items(heap, heap.list(l).iter().copied()),
            _ => None,
        }
    }

    /// A stack id for the items of a frame list, or `None` if an item is not a frame.
    fn stack_from_items(
        &mut self,
        heap: &Heap,
        items: impl Iterator<Item = Value>,
    ) -> Option<StackId> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let mut ok = true;
        for item in items {
            if let Value::Handle(FRAME, id) = item {
                scratch.push(FrameId(id));
                continue;
            }
            match self.frame_of(heap, item) {
                Some(f) => scratch.push(f),
                None => {
                    ok = false;
                    break;
                }
            }
        }
        let id = ok.then(|| self.stacks.intern_stack(&scratch));
        self.scratch = scratch;
        id
    }

    fn action_of(&mut self, heap: &Heap, v: Value) -> Action {
        let Value::Str(id) = v else {
            return Action::Unknown;
        };
        if let Some(&(_, a)) = self.actions.iter().find(|(s, _)| *s == id) {
            return a;
        }
        let a = Action::parse(heap.str(id));
        // Only the known actions are remembered (at most ten), so a trace of many different
        // unknown action names costs one comparison each, not a growing search.
        if a != Action::Unknown {
            self.actions.push((id, a));
        }
        a
    }

    /// Converts a trace entry dict into a row.
    pub(super) fn event_of(&mut self, heap: &Heap, d: Ref) -> Result<TraceEvent, FieldError> {
        self.event_from_pairs(heap, heap.dict(d))
    }

    /// Converts a trace entry's pairs into a row.
    fn event_from_pairs(
        &mut self,
        heap: &Heap,
        pairs: &[(Value, Value)],
    ) -> Result<TraceEvent, FieldError> {
        let mut ev = TraceEvent {
            addr: 0,
            size: 0,
            time_us: 0,
            stream: StreamId(0),
            stack: StackId::EMPTY,
            extra: 0,
            action: Action::Unknown,
            pool: PoolId::UNKNOWN,
        };
        let mut extra = EventExtra {
            compile_context: StrId(K_EMPTY),
            user_metadata: StrId(K_EMPTY),
            ..EventExtra::default()
        };
        let mut block_size = None;
        // only a part of a split decode meets values of other parts (deferred) and tells
        // them which strings it needs
        #[cfg(unix)]
        let in_part = self.link.is_some();
        #[cfg(not(unix))]
        let in_part = false;
        for &(key, val) in pairs {
            if in_part {
                // deferred frame lists and texts are resolved later; nothing else can be
                let resolvable = matches!(
                    key,
                    Value::Str(StrId(K_FRAMES | K_COMPILE_CONTEXT | K_USER_METADATA))
                );
                self.tainted |= is_deferred(key) || (is_deferred(val) && !resolvable);
                #[cfg(unix)]
                if let (Some(link), Value::Str(key)) = (self.link.as_mut(), key) {
                    link.need(heap, key);
                    if let (K_ACTION, Value::Str(action)) = (key.0, val) {
                        link.need(heap, action);
                    }
                }
            } else {
                debug_assert!(!is_deferred(key) && !is_deferred(val));
            }
            let Value::Str(key) = key else { continue };
            match key.0 {
                K_ACTION => ev.action = self.action_of(heap, val),
                K_ADDR | K_DEVICE_FREE => ev.addr = unsigned(heap, val, "trace entry addr")?,
                K_SIZE => ev.size = unsigned(heap, val, "trace entry size")?,
                K_BLOCK_SIZE => block_size = Some(unsigned(heap, val, "trace entry block_size")?),
                K_STREAM => ev.stream = self.stream_id(signed(heap, val, "trace entry stream")?),
                K_TIME_US => ev.time_us = signed(heap, val, "trace entry time_us")?,
                K_FRAMES => ev.stack = self.stack_of(heap, val).unwrap_or(StackId::EMPTY),
                K_COMPILE_CONTEXT => extra.compile_context = self.text_of(val),
                K_USER_METADATA => extra.user_metadata = self.text_of(val),
                K_POOL_ID => ev.pool = pool_of(heap, val),
                K_FORWARD_FRAMES => {
                    if let Value::List(l) = val {
                        let lines: Vec<StrId> =
                            heap.list(l).iter().filter_map(|&v| str_id(v)).collect();
                        if !lines.is_empty() {
                            self.forward_frames.push(lines);
                            extra.forward_frames = self.forward_frames.len() as u32;
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(block) = block_size {
            extra.block_surplus = u32::try_from(block.saturating_sub(ev.size)).unwrap_or(u32::MAX);
        }
        ev.extra = self.extra_id(extra);
        Ok(ev)
    }

    /// The id of a set of rare fields ([`TraceEvent::extra`]): 0 for none, else 1 + its index
    /// in the table, where it is added when new. Nearly every entry has the set of the one
    /// before: that is looked at first.
    pub(crate) fn extra_id(&mut self, extra: EventExtra) -> u32 {
        if extra.is_empty() {
            return 0;
        }
        if self.last_extra.0 == extra {
            return self.last_extra.1;
        }
        let next = self.extras.len() as u32 + 1;
        let id = *self.extra_index.entry(extra).or_insert(next);
        if id == next {
            self.extras.push(extra);
        }
        self.last_extra = (extra, id);
        id
    }

    /// The id of a stream, added to the table when new. A program uses a few streams, and
    /// nearly always the one of the entry before: that is looked at first.
    pub(crate) fn stream_id(&mut self, stream: i64) -> StreamId {
        if self.streams.get(self.last_stream as usize) == Some(&stream) {
            return StreamId(self.last_stream);
        }
        let next = self.streams.len() as u32;
        let id = *self.stream_index.entry(stream).or_insert(next);
        if id == next {
            self.streams.push(stream);
        }
        self.last_stream = id;
        StreamId(id)
    }

    /// Adds a row to the table; returns its handle.
    fn push_event(&mut self, ev: TraceEvent) -> Value {
        let handle = Value::Handle(EVENT, self.events.len() as u32);
        if self.events.len() == self.events.capacity() {
            // Grow by a quarter, not double: the table is the largest thing decoding keeps,
            // and its slack counts against the memory allowance.
            self.events.reserve_exact(self.events.len() / 4 + 4096);
        }
        self.events_ahead.before_push(&self.events);
        self.events.push(ev);
        handle
    }

    /// Whether a dict's keys make it a trace entry (an `action`), and else a frame (a `name`
    /// and a `filename`), as [`Adopter::adopt`] tells them apart.
    fn kind_of(&mut self, pairs: &[(Value, Value)]) -> (bool, bool) {
        let (mut action, mut name, mut filename) = (false, false, false);
        for &(key, _) in pairs {
            self.tainted |= is_deferred(key);
            if let Value::Str(s) = key {
                action |= s.0 == K_ACTION;
                name |= s.0 == K_NAME;
                filename |= s.0 == K_FILENAME;
            }
        }
        (action, name && filename)
    }
}

impl Adopter for EntryCompactor {
    const READS_FLAT: bool = true;

    /// A trace entry read whole: its new frames become frame ids and its frame list a stack
    /// id, in the order [`Adopter::adopt`] makes them when they are stored; then the entry
    /// becomes a row, as [`Adopter::completed`] makes it. Anything else is declined.
    fn adopt_flat(&mut self, heap: &mut Heap, dict: FlatDict<'_>, out: &mut FlatAdopted) -> bool {
        // what `kind_of` says of a trace entry: a flat dict's keys are strings, never deferred
        debug_assert!(dict.pairs.iter().all(|(k, _)| matches!(k, Value::Str(_))));
        if !dict
            .pairs
            .iter()
            .any(|&(k, _)| k == Value::Str(StrId(K_ACTION)))
        {
            return false;
        }
        out.inner.clear();
        for &(start, end) in dict.inner {
            let pairs = &dict.inner_pairs[start as usize..end as usize];
            match self.kind_of(pairs) {
                (false, true) => {}
                _ => return false,
            }
            match self.frame_from_pairs(heap, pairs) {
                Some(f) => out.inner.push(Value::Handle(FRAME, f.0)),
                None => return false,
            }
        }
        out.list = Value::None;
        out.list_reusable = false;
        if let Some((at, list)) = dict.list {
            if dict.pairs[at].0 != Value::Str(StrId(K_FRAMES)) {
                return false;
            }
            out.list = match list {
                FlatList::Seen(stack) => stack,
                FlatList::Items(items) => {
                    let inner = &out.inner;
                    let values = items.iter().map(|&item| match item {
                        FlatItem::Value(v) => v,
                        FlatItem::Dict(k) => inner[k as usize],
                    });
                    let Some(stack) = self.stack_from_items(heap, values) else {
                        return false;
                    };
                    // frame ids alone (no deferred frame, no new one): the same list is the
                    // same stack, with nothing to do
                    out.list_reusable = items_are_frames(items);
                    Value::Handle(STACK, stack.0)
                }
            };
            dict.pairs[at].1 = out.list;
        }
        match self.event_from_pairs(heap, dict.pairs) {
            Ok(ev) => {
                // the pool id's tuple becomes its handle, as in `adopt`
                for &(key, val) in dict.pairs.iter() {
                    if let (Value::Str(StrId(K_POOL_ID)), Value::Tuple(t)) = (key, val) {
                        pool_handle(heap, t, ev.pool);
                    }
                }
                out.dict = self.push_event(ev);
                self.read_whole += 1;
                true
            }
            // left to the general path, which fails at this entry with its own offset
            Err(_) => false,
        }
    }

    /// A trace entry in a batch becomes a row as soon as its items are set, whether it was read
    /// whole or opcode by opcode: a pickle that changes it later is refused there.
    fn completed(&mut self, heap: &mut Heap, dict: Value) -> Result<Value, FieldError> {
        match dict {
            Value::Dict(d) if self.kind_of(heap.dict(d)).0 => self.adopt(heap, None, dict),
            _ => Ok(dict),
        }
    }

    #[cfg(unix)]
    #[inline]
    fn memoized(&mut self, heap: &Heap, index: u64, value: Value) {
        if let Some(link) = &mut self.link {
            link.export(heap, &self.stacks, index, value);
        }
    }

    fn clean(&mut self, heap: &Heap) {
        self.at_clean = (
            heap.string_count(),
            self.stacks.frame_count(),
            self.stacks.stack_count(),
        );
    }

    #[cfg(unix)]
    fn tick(&mut self) {
        if let Some(link) = &mut self.link {
            link.tick();
        }
    }

    #[cfg(unix)]
    fn import(&mut self, heap: &mut Heap, index: u64) -> Option<Value> {
        self.link.as_mut()?.import(heap, &mut self.stacks, index)
    }

    fn prepare(&mut self, heap: &mut Heap, limits: &Limits) {
        for (i, key) in KEYS.iter().enumerate() {
            let id = heap.intern(key);
            debug_assert_eq!(id, StrId(i as u32), "keys go first into a fresh heap");
        }
        // A trace entry takes at least ~40 pickle bytes. The reservation is capped: the decoder
        // counts what it holds against what it has read, reserved or not.
        self.events
            .reserve((limits.size_hint / 40).min(1 << 18) as usize);
    }

    fn adopt(
        &mut self,
        heap: &mut Heap,
        key: Option<Value>,
        value: Value,
    ) -> Result<Value, FieldError> {
        match value {
            Value::Dict(d) => {
                let (action, frame) = self.kind_of(heap.dict(d));
                if action {
                    let ev = self.event_of(heap, d)?;
                    let handle = self.push_event(ev);
                    heap.replace_dict(d, handle);
                    Ok(handle)
                } else if frame {
                    match self.frame_of(heap, value) {
                        Some(f) => {
                            let handle = Value::Handle(FRAME, f.0);
                            heap.replace_dict(d, handle);
                            Ok(handle)
                        }
                        None => Ok(value),
                    }
                } else {
                    Ok(value)
                }
            }
            // a pool id's tuple becomes a handle at once (one per entry would otherwise stay in
            // the heap, held by its memo entry, for the whole decode)
            Value::Tuple(t) if key == Some(Value::Str(StrId(K_POOL_ID))) => {
                let pool = pool_of(heap, value);
                Ok(pool_handle(heap, t, pool).unwrap_or(value))
            }
            Value::List(l) if key == Some(Value::Str(StrId(K_FRAMES))) => {
                match self.stack_of(heap, value) {
                    Some(s) => {
                        let handle = Value::Handle(STACK, s.0);
                        heap.replace_list(l, handle);
                        Ok(handle)
                    }
                    None => Ok(value),
                }
            }
            _ => Ok(value),
        }
    }
}

/// Whether every item of a flat list is a compacted frame.
pub(super) fn items_are_frames(items: &[FlatItem]) -> bool {
    items
        .iter()
        .all(|i| matches!(i, FlatItem::Value(Value::Handle(FRAME, _))))
}

/// A value of another part of a split decode, resolved only when the part is taken in.
#[inline]
pub(super) fn is_deferred(v: Value) -> bool {
    matches!(v, Value::Handle(DEFERRED, _))
}

pub(super) fn str_id(v: Value) -> Option<StrId> {
    match v {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

pub(super) fn describe(v: Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::Int(_) | Value::BigInt(_) => "an int",
        Value::Float(_) => "a float",
        Value::Str(_) => "a str",
        Value::Bytes(_) => "bytes",
        Value::List(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Dict(_) => "a dict",
        Value::Handle(FRAME, _) => "a frame",
        Value::Handle(STACK, _) => "a frame list",
        Value::Handle(EVENT, _) => "a trace entry",
        Value::Handle(..) => "a compacted object",
    }
}

#[inline]
pub(super) fn unsigned(heap: &Heap, v: Value, what: &str) -> Result<u64, FieldError> {
    if let Value::Int(i) = v {
        if i >= 0 {
            return Ok(i as u64);
        }
    }
    unsigned_slow(heap, v, what)
}

#[cold]
pub(super) fn unsigned_slow(heap: &Heap, v: Value, what: &str) -> Result<u64, FieldError> {
    match heap.int(v) {
        Some(i) => {
            u64::try_from(i).map_err(|_| FieldError::new(what, i.to_string(), "a 64-bit size"))
        }
        None => Err(FieldError::new(what, describe(v), "an int")),
    }
}

#[inline]
pub(super) fn signed(heap: &Heap, v: Value, what: &str) -> Result<i64, FieldError> {
    if let Value::Int(i) = v {
        return Ok(i);
    }
    signed_slow(heap, v, what)
}

#[cold]
pub(super) fn signed_slow(heap: &Heap, v: Value, what: &str) -> Result<i64, FieldError> {
    match heap.int(v) {
        Some(i) => i64::try_from(i)
            .or_else(|_| u64::try_from(i).map(|u| u as i64))
            .map_err(|_| FieldError::new(what, i.to_string(), "a 64-bit integer")),
        None => Err(FieldError::new(what, describe(v), "an int")),
    }
}

/// The compactor with the decoder's fast path off: every dict decoded opcode by opcode.
pub(super) struct OpcodeByOpcode(pub(super) EntryCompactor);

impl Adopter for OpcodeByOpcode {
    fn prepare(&mut self, heap: &mut Heap, limits: &Limits) {
        self.0.prepare(heap, limits);
    }

    fn completed(&mut self, heap: &mut Heap, dict: Value) -> Result<Value, FieldError> {
        self.0.completed(heap, dict)
    }

    fn adopt(
        &mut self,
        heap: &mut Heap,
        key: Option<Value>,
        value: Value,
    ) -> Result<Value, FieldError> {
        self.0.adopt(heap, key, value)
    }
}

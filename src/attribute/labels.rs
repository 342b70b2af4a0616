//! The labels of a trace, one per event, each distinct label stored once.
//!
//! A label says where an event ran (training step, pipeline step, op, micro-batches, stage,
//! layer, call, annotation) and what it is (category and the evidence for it). Events of one
//! call share all of that but a few fields, so labels repeat (a pipeline's 654,719 events have
//! 30,512 distinct ones): [`Labels`] keeps each once in a table and every event as a 4-byte
//! index into it, a seventh of a label's size. Reading an event's label is two array reads; writing
//! one looks the new label up (the label written last first, which is the one wanted in most
//! passes over the trace, since neighbouring events share their labels). A change that depends
//! on the label and a small key alone (a category and its evidence) remembers the label it made
//! of each label, so that the next event with the same label and key needs no lookup.
//!
//! The table pays for memory, not for time: every read goes through it and every write looks
//! a label up, which made the report of that trace about a tenth slower than with a plain
//! array (0.37 s against 0.33 s, with 9 MiB less), while a 10-million-event one took as long
//! either way with 170 MiB less. So a trace of fewer than [`INTERN_FROM`] events (whose plain
//! labels take under 56 MiB) keeps a plain array of labels, as does one whose labels do not
//! repeat enough (more distinct labels than a quarter of its events, or 2^31), for which the
//! array is the smaller. Reading and writing work the same either way, and give the same labels.
//!
//! Written here: an interner keyed by the label packed in four words, with the label found
//! last looked at first, is a few lines over `rustc_hash`'s map, which a crate would not make
//! shorter.

use std::ops::Range;

use rustc_hash::FxHashMap;

use super::Label;

/// Events from which labels are kept in a table (below it, a plain array).
pub const INTERN_FROM: usize = 1 << 21;

/// Distinct labels kept in the table before a plain array is the smaller store, whatever the
/// number of events.
const MIN_TABLE: usize = 1 << 16;

/// Slots remembering keyed changes (a power of two): each change made by a key is remembered
/// in the slot its old place and key hash to, until another takes the slot.
const KEYED_SLOTS: usize = 1 << 12;

/// One label per event of a trace (or per block alive before it).
#[derive(Clone, Debug)]
pub struct Labels {
    store: Store,
}

#[derive(Clone, Debug)]
enum Store {
    /// Each distinct label once, and each event's place in it.
    Interned(Table),
    /// One label per event.
    Plain(Vec<Label>),
}

/// The distinct labels and each event's index into them.
#[derive(Clone, Debug)]
struct Table {
    /// Each event's index into `table`.
    ids: Vec<u32>,
    table: Vec<Label>,
    /// A label's place in `table`.
    index: FxHashMap<Key, u32>,
    /// The place found last, looked at first.
    last: u32,
    /// Keyed changes made before ([`Labels::update_keyed`]): (old place and key, new place),
    /// in [`KEYED_SLOTS`] slots once used.
    keyed: Vec<(u64, u32)>,
}

impl Table {
    /// The place of `label`, added if new.
    #[inline]
    fn intern(&mut self, label: Label) -> u32 {
        if self.table[self.last as usize] == label {
            return self.last;
        }
        let next = self.table.len() as u32;
        let k = *self.index.entry(key(&label)).or_insert(next);
        if k == next {
            self.table.push(label);
        }
        self.last = k;
        k
    }

    /// The place of what `change` makes of the label at place `old`: `old` itself where the
    /// label stays as it was.
    fn changed(&mut self, old: u32, change: impl FnOnce(&mut Label)) -> u32 {
        let mut l = self.table[old as usize];
        change(&mut l);
        if l == self.table[old as usize] {
            old
        } else {
            self.intern(l)
        }
    }

    /// Whether it holds so many labels that a plain array would be smaller (or its indices
    /// would run out).
    fn crowded(&self) -> bool {
        self.table.len() > MIN_TABLE.max(self.ids.len() / 4).min(1 << 31)
    }
}

impl Labels {
    /// `n` events, each labelled `label`: in a table from [`INTERN_FROM`] events up, else in a
    /// plain array.
    pub fn filled(label: Label, n: usize) -> Labels {
        let table = match forced() {
            Some(table) => table,
            None => n >= INTERN_FROM,
        };
        if table {
            Labels::in_table(label, n)
        } else {
            Labels::from_plain(vec![label; n])
        }
    }

    /// `n` events, each labelled `label`, kept in a table whatever their number.
    pub fn in_table(label: Label, n: usize) -> Labels {
        let mut index = FxHashMap::default();
        index.insert(key(&label), 0);
        // written here rather than allocated zeroed: the passes read an event's label before
        // writing it, and a page first read as the kernel's zero page faults again when written
        // (flushing the page from every core's TLB)
        #[allow(clippy::slow_vector_initialization)]
        let ids = {
            let mut ids = Vec::with_capacity(n);
            ids.resize(n, 0);
            ids
        };
        Labels {
            store: Store::Interned(Table {
                ids,
                table: vec![label],
                index,
                last: 0,
                keyed: Vec::new(),
            }),
        }
    }

    /// Labels held in a plain array.
    pub fn from_plain(v: Vec<Label>) -> Labels {
        Labels {
            store: Store::Plain(v),
        }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Interned(t) => t.ids.len(),
            Store::Plain(v) => v.len(),
        }
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The label of event `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&Label> {
        (i < self.len()).then(|| &self[i])
    }

    /// The labels in event order.
    pub fn iter(&self) -> Iter<'_> {
        match &self.store {
            Store::Interned(t) => Iter::Interned(t.ids.iter(), t.table.as_slice()),
            Store::Plain(v) => Iter::Plain(v.iter()),
        }
    }

    /// Gives event `i` the label `label`.
    #[inline]
    pub fn set(&mut self, i: usize, label: Label) {
        if self[i] != label {
            self.write(i, label);
        }
    }

    /// Calls `f` once for each distinct label among the events `pick` chooses, with how many of
    /// them have it. In a table the events are counted by their index, without reading each
    /// one's label; in a plain array each event is its own call, with 1.
    pub fn tally(&self, pick: impl Fn(usize) -> bool, mut f: impl FnMut(&Label, u64)) {
        match &self.store {
            Store::Interned(t) => {
                let mut counts = vec![0u64; t.table.len()];
                for (i, &id) in t.ids.iter().enumerate() {
                    if pick(i) {
                        counts[id as usize] += 1;
                    }
                }
                for (label, &n) in t.table.iter().zip(&counts) {
                    if n > 0 {
                        f(label, n);
                    }
                }
            }
            Store::Plain(v) => {
                for (i, label) in v.iter().enumerate() {
                    if pick(i) {
                        f(label, 1);
                    }
                }
            }
        }
    }

    /// Changes the label of event `i` in place.
    #[inline]
    pub fn update(&mut self, i: usize, change: impl FnOnce(&mut Label)) {
        let old = self[i];
        let mut new = old;
        change(&mut new);
        if new != old {
            self.write(i, new);
        }
    }

    /// Changes the label of event `i` by `change`, which must depend on the label and `key`
    /// alone: in a table, where the same label was changed by the same key before, the label
    /// it became is taken without looking it up.
    #[inline]
    pub fn update_keyed(&mut self, i: usize, key: u32, change: impl FnOnce(&mut Label)) {
        let Store::Interned(t) = &mut self.store else {
            return self.update(i, change);
        };
        let old = t.ids[i];
        let k = (u64::from(old) << 32) | u64::from(key);
        // the top bits of a multiplicative hash pick the slot
        let slot =
            (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - KEYED_SLOTS.trailing_zeros())) as usize;
        if t.keyed.is_empty() {
            // no place is u32::MAX (a table holds fewer than 2^31 labels): never a hit
            t.keyed = vec![(u64::MAX, 0); KEYED_SLOTS];
        }
        let (seen, to) = t.keyed[slot];
        if seen == k {
            t.ids[i] = to;
            return;
        }
        let stored = t.table.len();
        let to = t.changed(old, change);
        t.keyed[slot] = (k, to);
        t.ids[i] = to;
        self.plain_if_crowded(stored);
    }

    /// Changes the labels of the events in `range` by `change`, which must depend on the
    /// label alone: it runs once per distinct label, not once per event.
    pub fn map_range(&mut self, range: Range<usize>, mut change: impl FnMut(&mut Label)) {
        let stored = self.stored();
        match &mut self.store {
            Store::Interned(t) => {
                // each label's new place, found the first time it is met
                let mut to = vec![u32::MAX; t.table.len()];
                for e in range {
                    let old = t.ids[e] as usize;
                    if to[old] == u32::MAX {
                        to[old] = t.changed(old as u32, &mut change);
                    }
                    t.ids[e] = to[old];
                }
            }
            Store::Plain(v) => v[range].iter_mut().for_each(change),
        }
        self.plain_if_crowded(stored);
    }

    /// Whether the labels are kept in a table (rather than a plain array).
    pub fn is_table(&self) -> bool {
        matches!(self.store, Store::Interned(_))
    }

    /// The number of distinct labels stored (the events' count when held as a plain array).
    pub fn stored(&self) -> usize {
        match &self.store {
            Store::Interned(t) => t.table.len(),
            Store::Plain(v) => v.len(),
        }
    }

    /// Gives event `i` a label other than the one it has.
    #[inline]
    fn write(&mut self, i: usize, label: Label) {
        match &mut self.store {
            Store::Interned(t) => {
                let stored = t.table.len();
                t.ids[i] = t.intern(label);
                self.plain_if_crowded(stored);
            }
            Store::Plain(v) => v[i] = label,
        }
    }

    /// Moves a table that has grown crowded since it held `stored` labels to a plain array.
    fn plain_if_crowded(&mut self, stored: usize) {
        if let Store::Interned(t) = &self.store {
            if t.table.len() > stored && t.crowded() {
                let plain = t.ids.iter().map(|&k| t.table[k as usize]).collect();
                self.store = Store::Plain(plain);
            }
        }
    }
}

/// A label's fields packed into four words, each field whole in its own bits: hashed and
/// compared in fewer steps than field by field.
type Key = [u64; 4];

#[inline]
fn key(l: &Label) -> Key {
    let a = l.train_step as u64
        | (l.pipe_step as u64) << 16
        | (l.phase as u64) << 24
        | (l.op.0 as u64) << 32
        | (l.mb as u64) << 48;
    let b = l.mb_backward as u64
        | (l.stage.0 as u64) << 16
        | (l.layer as u64) << 32
        | (l.detail.0 as u64) << 48;
    let c = l.call as u64 | (l.annotation.0 as u64) << 32;
    let d = l.category as u64 | (l.evidence as u64) << 16 | (l.flags as u64) << 32;
    [a, b, c, d]
}

#[cfg(test)]
use std::cell::Cell;

#[cfg(test)]
thread_local! {
    /// The store tests ask for on this thread, whatever the trace's size: `Some(true)`, a table.
    pub(crate) static FORCE_TABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

fn forced() -> Option<bool> {
    #[cfg(test)]
    {
        FORCE_TABLE.with(|f| f.get())
    }
    #[cfg(not(test))]
    {
        None
    }
}

impl std::ops::Index<usize> for Labels {
    type Output = Label;

    #[inline]
    fn index(&self, i: usize) -> &Label {
        match &self.store {
            Store::Interned(t) => &t.table[t.ids[i] as usize],
            Store::Plain(v) => &v[i],
        }
    }
}

impl From<Vec<Label>> for Labels {
    fn from(v: Vec<Label>) -> Labels {
        let mut labels = Labels::in_table(v.first().copied().unwrap_or_default(), v.len());
        for (i, l) in v.into_iter().enumerate() {
            labels.set(i, l);
        }
        labels
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = &'a Label;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The labels of [`Labels`] in event order.
pub enum Iter<'a> {
    /// Indices into a table.
    Interned(std::slice::Iter<'a, u32>, &'a [Label]),
    /// Labels.
    Plain(std::slice::Iter<'a, Label>),
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Label;

    #[inline]
    fn next(&mut self) -> Option<&'a Label> {
        match self {
            Iter::Interned(ids, table) => ids.next().map(|&k| &table[k as usize]),
            Iter::Plain(v) => v.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            Iter::Interned(ids, _) => ids.len(),
            Iter::Plain(v) => v.len(),
        };
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Interned(ids, table) => ids.next_back().map(|&k| &table[k as usize]),
            Iter::Plain(v) => v.next_back(),
        }
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::{Category, Evidence, NameId, Phase};
    use std::collections::HashMap;

    /// Labels that repeat as a trace's do: the same few within a call of 100 events.
    fn varied(i: usize) -> Label {
        let odd = i % 2 == 1;
        Label {
            train_step: (i / 100 % 3) as u16,
            phase: if odd { Phase::Backward } else { Phase::Forward },
            op: NameId(odd as u16),
            call: (i / 100) as u32,
            category: if odd {
                Category::Temporary
            } else {
                Category::Activation
            },
            evidence: Evidence::Life,
            ..Label::EMPTY
        }
    }

    #[test]
    fn a_tally_counts_each_distinct_label_among_the_events_picked() {
        let n = 1000;
        let mut table = Labels::in_table(Label::EMPTY, n);
        let mut plain = Labels::from_plain(vec![Label::EMPTY; n]);
        for i in 0..n {
            if !i.is_multiple_of(7) {
                table.set(i, varied(i));
                plain.set(i, varied(i));
            }
        }
        let pick = |i: usize| !i.is_multiple_of(3);
        let mut by_hand: HashMap<Key, u64> = HashMap::new();
        for i in (0..n).filter(|&i| pick(i)) {
            *by_hand.entry(key(&plain[i])).or_default() += 1;
        }
        for labels in [&table, &plain] {
            let mut counted: HashMap<Key, u64> = HashMap::new();
            labels.tally(pick, |l, k| *counted.entry(key(l)).or_default() += k);
            assert_eq!(counted, by_hand);
        }
        // the table's calls are one per distinct label
        let mut calls = 0;
        table.tally(pick, |_, _| calls += 1);
        assert_eq!(calls, by_hand.len());
        assert!(calls < n / 10);
    }

    #[test]
    fn a_table_and_a_plain_array_read_back_what_was_written() {
        let n = 1000;
        let mut table = Labels::in_table(Label::EMPTY, n);
        let mut plain = Labels::from_plain(vec![Label::EMPTY; n]);
        let mut expected = vec![Label::EMPTY; n];
        for i in (0..n).rev() {
            table.set(i, varied(i));
            plain.set(i, varied(i));
            expected[i] = varied(i);
        }
        for i in (0..n).step_by(3) {
            let change = |l: &mut Label| l.mb = (i % 11) as u16;
            table.update(i, change);
            plain.update(i, change);
            change(&mut expected[i]);
        }
        let wrap_up = |l: &mut Label| {
            if l.phase == Phase::Backward {
                l.phase = Phase::WrapUp;
            }
        };
        table.map_range(100..600, wrap_up);
        plain.map_range(100..600, wrap_up);
        expected[100..600].iter_mut().for_each(wrap_up);
        assert!(table.is_table() && !plain.is_table());
        for labels in [&table, &plain] {
            assert_eq!(labels.len(), n);
            assert_eq!(labels.iter().copied().collect::<Vec<_>>(), expected);
            assert_eq!(labels.iter().rev().count(), n);
            assert!((0..n).all(|i| labels[i] == expected[i]));
            assert_eq!(labels.get(n), None);
        }
        // 2 labels in each of 10 calls, then up to 11 micro-batches each and the wrap-up
        assert!(table.stored() < n / 2, "{} stored", table.stored());
    }

    #[test]
    fn a_keyed_change_gives_what_the_same_change_unkeyed_gives() {
        // more events than the cache has slots, so that slots are taken over
        let n = 3 * KEYED_SLOTS;
        let mut table = Labels::in_table(Label::EMPTY, n);
        let mut plain = Labels::from_plain(vec![Label::EMPTY; n]);
        let mut expected: Vec<Label> = (0..n).map(|i| varied(i % 97)).collect();
        for (i, &l) in expected.iter().enumerate() {
            table.set(i, l);
            plain.set(i, l);
        }
        for round in 0..3u16 {
            for (i, e) in expected.iter_mut().enumerate() {
                let key = ((i * 7 + round as usize) % 13) as u32;
                let change = |l: &mut Label| l.layer = key as u16 * 10 + round;
                table.update_keyed(i, key, change);
                plain.update_keyed(i, key, change);
                change(e);
            }
            assert!(table.is_table());
            assert_eq!(table.iter().copied().collect::<Vec<_>>(), expected);
            assert_eq!(plain.iter().copied().collect::<Vec<_>>(), expected);
        }
        // a change that leaves the label as it was keeps its place
        let before = table.stored();
        for (i, e) in expected.iter().enumerate() {
            let keep = e.layer;
            table.update_keyed(i, 1000 + u32::from(keep), |l| l.layer = keep);
        }
        assert_eq!(table.stored(), before);
        assert_eq!(table.iter().copied().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn a_label_written_to_many_events_is_stored_once() {
        let mut labels = Labels::in_table(Label::EMPTY, 100);
        for i in 0..100 {
            labels.set(i, varied(i % 2));
        }
        labels.map_range(0..100, |l| l.layer = 3);
        // EMPTY, the two labels, and the two with their layer
        assert_eq!(labels.stored(), 5);
        assert!(labels.iter().all(|l| l.layer == 3));
    }

    #[test]
    fn labels_that_do_not_repeat_move_to_a_plain_array() {
        let n = 4 * MIN_TABLE + 8;
        let mut labels = Labels::in_table(Label::EMPTY, n);
        for i in 0..n {
            labels.set(
                i,
                Label {
                    call: i as u32,
                    ..Label::EMPTY
                },
            );
        }
        assert!(!labels.is_table(), "{} distinct labels", labels.stored());
        assert!((0..n).all(|i| labels[i].call == i as u32));
    }

    #[test]
    fn the_store_follows_the_size_of_the_trace() {
        assert!(!Labels::filled(Label::EMPTY, 10).is_table());
        assert!(Labels::filled(Label::EMPTY, INTERN_FROM).is_table());
    }

    /// The attribution of every snapshot at hand (up to 8 MiB of pickle, for the time of a
    /// debug build) gives the same labels with either store.
    #[test]
    fn every_snapshot_is_labelled_the_same_in_a_table_or_an_array() {
        use crate::replay::{replay, SizeModel};
        let mut devices = 0;
        let mut events = 0;
        for (name, bytes) in crate::snapshot::every_snapshot() {
            if bytes.len() > 8 << 20 {
                continue;
            }
            let Ok(snap) = crate::snapshot::from_pickle(&bytes[..], Default::default()) else {
                continue;
            };
            for device in snap.devices_with_events().collect::<Vec<_>>() {
                let r = replay(&snap, device, SizeModel::Allocator);
                let options = crate::attribute::Options::default();
                let by = |table: bool| {
                    FORCE_TABLE.with(|f| f.set(Some(table)));
                    let a = crate::attribute::attribute(&snap, &r, &options);
                    FORCE_TABLE.with(|f| f.set(None));
                    assert_eq!(a.labels.is_table(), table, "{name}");
                    a
                };
                let (table, plain) = (by(true), by(false));
                assert!(
                    table.labels.iter().eq(plain.labels.iter()),
                    "{name} device {device}"
                );
                assert!(
                    table.preexisting.iter().eq(plain.preexisting.iter()),
                    "{name} device {device}"
                );
                devices += 1;
                events += table.labels.len();
            }
        }
        assert!(
            devices > 100 && events > 100_000,
            "{devices} devices, {events} events"
        );
    }
}

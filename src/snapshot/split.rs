//! Decoding one large snapshot on several threads.
//!
//! A pickle is one stream of opcodes, but nearly all of a large snapshot is one long list: a
//! device's trace entries, appended in batches of a thousand. The file is cut into parts at
//! frame boundaries (protocol 4 and later frame the stream every 64 KiB, and a frame always
//! begins an opcode). The first part is decoded as usual; each later part is decoded on its own
//! thread from its first trace entry on, as if the list and the open batch lay below its stack:
//!
//! - [`crate::pickle::scan`] counts the memo entries before the part, so its `MEMOIZE`s get the
//!   indices the whole pickle gives them;
//! - a memo fetch of an entry stored by an earlier part is imported when that part exported it
//!   (the keys, action names and frames it met, sent in batches, at once when a part waits);
//!   what was not exported (a frame list PyTorch shares between the entries of a block's free,
//!   a shared text, a frame not reached yet) is deferred, and resolved against the first
//!   decoder's memo when the part is taken in;
//! - the part stops at the next part's first entry, or where the pickle reaches below its stack
//!   (the end of the list); it then holds trace rows, a memo and a few pending values.
//!
//! The first decoder pauses at each part's start. Where it stands inside a batch of trace
//! entries there, it takes the part in (rows, frames and strings translated into its own
//! tables, the memo extended) and jumps to the part's end; anywhere else it decodes the stretch
//! itself. Any failure or doubt gives up the split, and the caller decodes the whole file in one
//! piece: the result, and every error with its offset, is always what that would give.
//!
//! Only on four or more threads (`MIN_THREADS`): each later part walks the whole pickle before
//! its cut, and since trace entries are read whole that walk costs about what decoding saves on
//! two cores.
//!
//! Written by hand: no pickle library decodes in parallel, and the parts' hand-over depends on
//! the snapshot's own structure (the compactor's rows).

use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rustc_hash::FxHashMap;

use super::build::{assemble, everything, from_pickle};
use super::compact::{Deferral, EntryCompactor, PartLink, DEFERRED, EVENT, FRAME, STACK};
use super::{EventExtra, Frame, FrameId, Snapshot, StackId, StrId, TraceEvent};
use crate::pickle::scan::{self, Until};
use crate::pickle::source::FileAt;
use crate::pickle::{self, Heap, Limits, PartInput, PartOutput, Progress, Resumable, Value};

/// Smallest part worth a thread: below this the counting and the hand-over cost about what
/// the second thread saves (measured on 2 cores: a 29 MB file in two parts was slower).
const MIN_PART: u64 = 48 << 20;
/// Most parts (threads) used for one file.
const MAX_PARTS: usize = 8;
/// Largest file decoded in parts: beyond this, taking millions of rows in (and holding both
/// parts' tables meanwhile) costs more time and memory than the second thread saves (measured:
/// a 930 MiB file of 10 million events took as long in two parts, with 1.9x the memory).
const MAX_SPLIT: u64 = 512 << 20;
/// How far past a part's planned start its first trace entry is looked for.
const FIND_ENTRY_WITHIN: u64 = 8 << 20;

/// A memo entry one part stored and another may fetch.
#[derive(Clone)]
pub(crate) enum Export {
    Str(Arc<str>),
    Frame(Arc<str>, Arc<str>, u32),
    /// The empty frame list, which PyTorch shares between the entries that have no frames.
    NoFrames,
}

/// What the parts tell each other, behind one lock.
#[derive(Default)]
struct BoardState {
    /// Memo entries stored in each planned region (between two cut points); `None` when it
    /// could not be counted.
    counts: Vec<Option<Option<u64>>>,
    /// Each part's start (its first trace entry) and the memo entries from its cut point to
    /// there; `None` when not found.
    starts: Vec<Option<Option<(u64, u64)>>>,
    /// First memo index of each part (0 for the first).
    bases: Vec<Option<u64>>,
    /// Exported memo entries of each part.
    exports: Vec<FxHashMap<u64, Export>>,
    /// Whether each part has finished exporting.
    done: Vec<bool>,
    /// How many times each part has sent its exports.
    sends: Vec<u64>,
}

/// The parts' shared notice board.
pub(crate) struct Board {
    state: Mutex<BoardState>,
    changed: Condvar,
    /// Threads waiting on `changed`: with none, a change wakes nobody (no system call).
    waiting: AtomicUsize,
}

impl Board {
    fn new(parts: usize) -> Board {
        Board {
            state: Mutex::new(BoardState {
                counts: vec![None; parts],
                starts: vec![None; parts],
                bases: vec![None; parts],
                exports: vec![FxHashMap::default(); parts],
                done: vec![false; parts],
                sends: vec![0; parts],
            }),
            changed: Condvar::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    fn update(&self, f: impl FnOnce(&mut BoardState)) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        drop(s);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }

    /// Whether a thread waits for a change.
    fn awaited(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Waits until `ready` gives an answer.
    fn wait_for<T>(&self, mut ready: impl FnMut(&BoardState) -> Option<T>) -> T {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(t) = ready(&s) {
                return t;
            }
            // counted under the lock, so no update between the test and the wait goes unseen
            self.waiting.fetch_add(1, Ordering::SeqCst);
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Marks a part as finished exporting when dropped, whatever way the part ends.
struct DoneOnDrop<'a>(&'a Board, usize);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        let k = self.1;
        self.0.update(|s| {
            s.done[k] = true;
            // a part that ended early still answers what others wait for
            if k > 0 {
                s.counts[k - 1].get_or_insert(None);
                s.starts[k].get_or_insert(None);
            }
        });
    }
}

/// A compactor's tie to the board: it exports what its part stores, and imports what earlier
/// parts stored.
pub(crate) struct Link {
    board: Arc<Board>,
    part: usize,
    /// Exports not yet on the board: they go up in batches, or at once when a part waits.
    unsent: Vec<(u64, Export)>,
    /// Whether this part has heard from each earlier part since it began.
    synced: Vec<bool>,
    /// The memo index of each string (by id), and whether it is exported.
    string_index: Vec<u64>,
    needed: Vec<bool>,
}

/// The threads decoding a file may use: `threads` ([`LoadOptions::threads`], 0 for one per
/// core), at most one per core.
pub(crate) fn usable_threads(threads: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match threads {
        0 => cores,
        n => n.min(cores),
    }
}

impl PartLink for Link {
    fn need(&mut self, heap: &Heap, s: StrId) {
        Link::need(self, heap, s);
    }

    fn export(&mut self, heap: &Heap, stacks: &super::Stacks, index: u64, value: Value) {
        Link::export(self, heap, stacks, index, value);
    }

    fn tick(&mut self) {
        Link::tick(self);
    }

    fn import(&mut self, heap: &mut Heap, stacks: &mut super::Stacks, index: u64) -> Option<Value> {
        Link::import(self, heap, stacks, index)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.send();
    }
}

impl Link {
    fn new(board: &Arc<Board>, part: usize) -> Link {
        Link {
            board: board.clone(),
            part,
            unsent: Vec::new(),
            synced: vec![false; part],
            string_index: Vec::new(),
            needed: Vec::new(),
        }
    }

    fn send(&mut self) {
        let unsent = std::mem::take(&mut self.unsent);
        self.board.update(|s| {
            s.exports[self.part].extend(unsent);
            s.sends[self.part] += 1;
        });
    }

    /// Hands over the exports at once when another part waits.
    pub(crate) fn tick(&mut self) {
        if self.board.awaited() {
            self.send();
        }
    }

    /// Exports a memo entry that another part could fetch: strings and frames.
    pub(crate) fn export(
        &mut self,
        heap: &Heap,
        compactor_frames: &super::Stacks,
        index: u64,
        v: Value,
    ) {
        let export = match v {
            Value::Str(s) => {
                // a string goes out once it is known to be a key, an action or a frame's
                // (a snapshot memoizes a string per entry that no other entry fetches)
                let slot = s.0 as usize;
                if self.string_index.len() <= slot {
                    self.string_index.resize(slot + 1, u64::MAX);
                }
                self.string_index[slot] = index;
                if !self.needed.get(slot).copied().unwrap_or(false) {
                    return;
                }
                Export::Str(heap.str(s).into())
            }
            Value::Handle(FRAME, f) => {
                let frame = compactor_frames.frame(FrameId(f));
                self.need(heap, frame.name);
                self.need(heap, frame.filename);
                Export::Frame(
                    heap.str(frame.name).into(),
                    heap.str(frame.filename).into(),
                    frame.line,
                )
            }
            Value::Handle(STACK, s) if StackId(s) == StackId::EMPTY => Export::NoFrames,
            _ => return,
        };
        self.push(index, export);
    }

    /// Marks a string as one other parts may fetch, exporting it where it was memoized.
    pub(crate) fn need(&mut self, heap: &Heap, s: StrId) {
        let slot = s.0 as usize;
        if self.needed.get(slot).copied().unwrap_or(false) {
            return;
        }
        if self.needed.len() <= slot {
            self.needed.resize(slot + 1, false);
        }
        self.needed[slot] = true;
        if let Some(&index) = self.string_index.get(slot).filter(|&&i| i != u64::MAX) {
            self.push(index, Export::Str(heap.str(s).into()));
        }
    }

    fn push(&mut self, index: u64, export: Export) {
        self.unsent.push((index, export));
        if self.unsent.len() >= 4096 || self.board.awaited() {
            self.send();
        }
    }

    /// The entry `index` of an earlier part, waiting for that part to store it.
    fn fetch(&mut self, index: u64) -> Option<Export> {
        let mut first_send = None;
        let synced = &mut self.synced;
        let part = self.part;
        self.board.wait_for(|s| {
            // the part whose memo range holds the index (once every earlier base is known)
            let mut owner = None;
            for p in (0..part).rev() {
                match s.bases[p] {
                    Some(b) if b <= index => {
                        owner = Some(p);
                        break;
                    }
                    None if !s.done[p] => return None,
                    _ => {}
                }
            }
            let Some(owner) = owner else {
                return Some(None);
            };
            if let Some(e) = s.exports[owner].get(&index) {
                return Some(Some(e.clone()));
            }
            // not exported (yet): deferred, to be resolved when the part is taken in; but
            // first this part hears from the owner once, which then has sent what it has
            if s.done[owner] || synced[owner] {
                return Some(None);
            }
            match first_send {
                None => {
                    first_send = Some(s.sends[owner]);
                    None
                }
                Some(n) if n == s.sends[owner] => None,
                Some(_) => {
                    synced[owner] = true;
                    Some(None)
                }
            }
        })
    }

    /// Imports `index` into this part's heap and frame table.
    pub(crate) fn import(
        &mut self,
        heap: &mut Heap,
        stacks: &mut super::Stacks,
        index: u64,
    ) -> Option<Value> {
        let Some(export) = self.fetch(index) else {
            // resolved when the part is taken in (or the part is not taken in)
            return u32::try_from(index)
                .ok()
                .map(|i| Value::Handle(DEFERRED, i));
        };
        Some(match export {
            Export::Str(s) => Value::Str(heap.intern(&s)),
            Export::Frame(name, filename, line) => {
                let frame = Frame {
                    name: heap.intern(&name),
                    filename: heap.intern(&filename),
                    line,
                };
                Value::Handle(FRAME, stacks.intern_frame(frame).0)
            }
            Export::NoFrames => Value::Handle(STACK, StackId::EMPTY.0),
        })
    }
}

/// Where the file is cut: frame starts near equal shares (the first part a little larger,
/// since the other parts also count memo entries first). Empty when the file is not a framed
/// pickle or too small to share.
fn cut_points(file: &File, len: u64, parts: usize) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 11];
    if file.read_exact_at(&mut head, 0).is_err()
        || head[0] != pickle::opcodes::PROTO
        || head[1] < 4
        || head[2] != pickle::opcodes::FRAME
    {
        return Vec::new();
    }
    let share = |k: usize| {
        let first = 1.25;
        (len as f64 * (first + (k - 1) as f64) / (first + (parts - 1) as f64)) as u64
    };
    let mut cuts = Vec::new();
    let mut at = 2u64;
    let mut next = 1;
    let mut frame = [0u8; 9];
    while next < parts && at < len {
        if file.read_exact_at(&mut frame, at).is_err() || frame[0] != pickle::opcodes::FRAME {
            break;
        }
        if at >= share(next) {
            cuts.push(at);
            next += 1;
        }
        let size = u64::from_le_bytes(frame[1..9].try_into().expect("8 bytes"));
        at = at.saturating_add(9).saturating_add(size);
    }
    cuts
}

/// Fewest threads worth a split. Each later part first walks the whole pickle before its cut,
/// and the first one then translates every part's rows: on 2 cores, once entries were read
/// whole (`pickle::vm::flat`), a 127 MB file took 0.53 s in two parts against 0.35 s in one
/// (medians of 11 runs in alternation), with 1.45x the memory.
const MIN_THREADS: usize = 4;

/// How many parts to decode a plain file of `len` bytes in (1: in one piece), on at most
/// `threads` threads (0: one per core).
fn part_count(len: u64, limits: &Limits, threads: usize) -> usize {
    if len > limits.caps.max_size || len > MAX_SPLIT {
        return 1;
    }
    let threads = usable_threads(threads);
    if threads < MIN_THREADS {
        return 1;
    }
    threads.min(MAX_PARTS).min((len / MIN_PART) as usize).max(1)
}

/// Decodes a plain snapshot file in parts on several threads. `None` when the file does not
/// lend itself to that (compressed, small, not framed) or anything went wrong: the caller then
/// decodes it in one piece.
pub(crate) fn load(
    file: File,
    len: u64,
    limits: Limits,
    threads: usize,
    on_read: Box<dyn FnMut(u64) + Send>,
) -> Option<Snapshot> {
    let parts = part_count(len, &limits, threads);
    load_in(file, len, limits, on_read, parts).map(|(snap, _)| snap)
}

/// [`load`] in at most `wanted` parts; also says how many parts were taken in.
fn load_in(
    file: File,
    len: u64,
    limits: Limits,
    on_read: Box<dyn FnMut(u64) + Send>,
    wanted: usize,
) -> Option<(Snapshot, usize)> {
    if wanted < 2 {
        return None;
    }
    let cuts = cut_points(&file, len, wanted);
    if cuts.is_empty() {
        return None;
    }
    let parts = cuts.len() + 1;
    let file = Arc::new(file);
    let board = Arc::new(Board::new(parts));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (1..parts)
            .map(|k| {
                let (file, board, cuts) = (file.clone(), board.clone(), &cuts);
                scope.spawn(move || decode_later_part(k, &file, &board, cuts, len, limits))
            })
            .collect();
        let out = decode_first_part(&file, &board, &cuts, limits, on_read, workers, len);
        // whatever happened, no part may wait for the first one any more
        board.update(|s| s.done[0] = true);
        out
    })
}

/// A later part: counts the memo entries of the region before its cut point, finds its first
/// trace entry, and decodes from there.
fn decode_later_part(
    k: usize,
    file: &Arc<File>,
    board: &Arc<Board>,
    cuts: &[u64],
    len: u64,
    limits: Limits,
) -> Option<(PartOutput, EntryCompactor)> {
    let _done = DoneOnDrop(board, k);
    let from = if k == 1 { 0 } else { cuts[k - 2] };
    let cut = cuts[k - 1];
    let counted = scan::walk(
        FileAt::new(file.clone(), from, None),
        from,
        Until::Offset(cut),
    )
    .filter(|w| w.offset == cut)
    .map(|w| w.memoized);
    board.update(|s| s.counts[k - 1] = Some(counted));
    let entry = scan::walk(
        FileAt::new(file.clone(), cut, None),
        cut,
        Until::EmptyDict(cut.saturating_add(FIND_ENTRY_WITHIN).min(len)),
    );
    board.update(|s| s.starts[k] = Some(entry.map(|w| (w.offset, w.memoized))));
    let entry = entry?;
    // the memo entries before the cut point: every earlier region's count
    let before = board.wait_for(|s| {
        let counts = &s.counts[..k];
        if counts.iter().any(|c| matches!(c, Some(None))) {
            return Some(None);
        }
        counts
            .iter()
            .map(|c| c.flatten())
            .sum::<Option<u64>>()
            .map(Some)
    })?;
    let base = before + entry.memoized;
    board.update(|s| s.bases[k] = Some(base));
    // stop at the next part's first entry, when it has one
    let stop_at = if k < cuts.len() {
        board.wait_for(|s| s.starts[k + 1].map(|st| st.map_or(u64::MAX, |(p, _)| p)))
    } else {
        u64::MAX
    };
    let mut compactor = EntryCompactor::new();
    compactor.link = Some(Box::new(Link::new(board, k)));
    let limits = Limits {
        size_hint: len / (cuts.len() as u64 + 1),
        ..limits
    };
    let out = pickle::decode_part(
        FileAt::new(file.clone(), entry.offset, None),
        entry.offset,
        base,
        stop_at,
        limits,
        &mut compactor,
    )?;
    compactor.link = None;
    Some((out, compactor))
}

type Worker<'s> = std::thread::ScopedJoinHandle<'s, Option<(PartOutput, EntryCompactor)>>;

/// The first part: decodes from the start, pausing at each later part's first entry to take
/// it in.
fn decode_first_part(
    file: &Arc<File>,
    board: &Arc<Board>,
    cuts: &[u64],
    limits: Limits,
    on_read: Box<dyn FnMut(u64) + Send>,
    workers: Vec<Worker<'_>>,
    len: u64,
) -> Option<(Snapshot, usize)> {
    let mut compactor = EntryCompactor::new();
    compactor.link = Some(Box::new(Link::new(board, 0)));
    board.update(|s| s.bases[0] = Some(0));
    let limits = Limits {
        size_hint: len,
        ..limits
    };
    let input = FileAt::new(file.clone(), 0, Some(on_read));
    let mut decoder = Resumable::new(input, limits, &mut compactor).ok()?;
    let mut root = None;
    let mut taken = 0;
    for (i, worker) in workers.into_iter().enumerate() {
        let k = i + 1;
        // up to the cut point while the part looks for its first entry past it
        if root.is_none() {
            if let Progress::Done(r) = decoder.run_until(cuts[i]).ok()? {
                root = Some(r);
            }
        }
        let start = board.wait_for(|s| s.starts[k]);
        let paused = match start {
            Some((p, _)) if root.is_none() => match decoder.run_until(p).ok()? {
                Progress::Paused(at) => at == p,
                Progress::Done(r) => {
                    root = Some(r);
                    false
                }
            },
            _ => false,
        };
        if k == 1 {
            // the first part's exports are complete: later fetches must not wait for it
            decoder.parts().1.link = None;
            board.update(|s| s.done[0] = true);
        }
        let output = worker.join().ok().flatten();
        if let (true, Some((part, from))) = (paused, output) {
            taken += take_in(&mut decoder, board, k, part, from).ok()? as usize;
        }
    }
    let root = match root {
        Some(r) => r,
        None => match decoder.run_until(u64::MAX).ok()? {
            Progress::Done(r) => r,
            Progress::Paused(_) => return None,
        },
    };
    let decoded = decoder.finish(root).ok()?;
    Some((assemble(decoded, compactor).ok()?, taken))
}

/// Decodes the plain pickle at `path` in `parts` parts and in one piece, and says where the
/// two differ: parts must give what one piece gives, or give up. `Ok` tells how many parts
/// were taken in. For tests and fuzzing.
#[doc(hidden)]
pub fn parts_agree(path: &std::path::Path, parts: usize) -> Result<usize, String> {
    let open = || File::open(path).map_err(|e| e.to_string());
    let file = open()?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let limits = Limits {
        max_string_bytes: 1 << 20,
        ..Limits::default()
    };
    let split = load_in(file, len, limits, Box::new(|_| {}), parts);
    let whole = from_pickle(open()?, limits);
    match (split, whole) {
        (Some((a, taken)), Ok(b)) if everything(&a) == everything(&b) => Ok(taken),
        (Some(_), Ok(_)) => Err("the parts decode to another snapshot".into()),
        (Some(_), Err(e)) => Err(format!("the parts decode what one piece refuses: {e:?}")),
        (None, _) => Ok(0),
    }
}

/// Takes part `k` into the first decoder when it stands where the part began, inside a batch of
/// trace entries with nothing numbered out of order; otherwise leaves it.
fn take_in<R: std::io::Read + std::io::Seek>(
    decoder: &mut Resumable<'_, R, EntryCompactor>,
    board: &Board,
    k: usize,
    part: PartOutput,
    from: EntryCompactor,
) -> Result<bool, pickle::DecodeError> {
    let base = board.wait_for(|s| Some(s.bases[k]));
    let is_event = |v: Value| matches!(v, Value::Handle(EVENT, _));
    let fits = base == Some(decoder.memo_len())
        && !from.tainted
        && !decoder.memo_has_gaps()
        && part
            .input
            .emitted
            .iter()
            .chain(&part.input.pending)
            .all(|&v| is_event(v))
        && decoder.in_batch(is_event)?;
    if !fits {
        return Ok(false);
    }
    let (emitted, pending, memo) = {
        let (heap, into, memo) = decoder.parts();
        into.events
            .reserve(part.input.emitted.len() + part.input.pending.len());
        let mut t = Translation::new(&part.heap, &from, heap, into, &memo);
        // first what the part made, in the order it made it (as one piece numbers them)
        let (strings, frames, stacks) = match part.ended_clean {
            true => from.at_clean,
            false => (
                part.heap.string_count(),
                from.stacks.frame_count(),
                from.stacks.stack_count(),
            ),
        };
        for s in 0..strings as u32 {
            t.string(StrId(s));
        }
        for f in 0..frames as u32 {
            t.frame(FrameId(f));
        }
        for s in 0..stacks as u32 {
            t.stack(StackId(s));
        }
        let emitted = part.input.emitted.iter().map(|&v| t.value(v)).collect();
        let pending = part.input.pending.iter().map(|&v| t.value(v)).collect();
        let memo = part.input.memo.iter().map(|&v| t.memo_entry(v)).collect();
        (emitted, pending, memo)
    };
    decoder.take_part(PartInput {
        emitted,
        pending,
        memo,
        ..part.input
    })?;
    Ok(true)
}

/// Moves a part's values into the first decoder's heap and tables, each string, frame, stack
/// and row once, in the order they are met.
struct Translation<'a> {
    from_heap: &'a Heap,
    from: &'a EntryCompactor,
    heap: &'a mut Heap,
    into: &'a mut EntryCompactor,
    /// The first decoder's memo entries (what deferred entries stand for).
    memo: &'a dyn Fn(u64) -> Option<Value>,
    /// The new id of each string, frame, stack and row, by old id (`u32::MAX`: not yet).
    strings: Vec<u32>,
    frames: Vec<u32>,
    stacks: Vec<u32>,
    rows: Vec<u32>,
    /// The copies of the part's containers that its memo holds, by the part's reference.
    copies: rustc_hash::FxHashMap<crate::pickle::Ref, Value>,
}

const NOT_YET: u32 = u32::MAX;

/// The translation of `old` in `table`, made with `make` the first time.
fn once(table: &mut [u32], old: u32, make: impl FnOnce() -> u32) -> u32 {
    match table.get(old as usize) {
        Some(&t) if t != NOT_YET => t,
        Some(_) => {
            let t = make();
            table[old as usize] = t;
            t
        }
        None => make(),
    }
}

impl<'a> Translation<'a> {
    fn new(
        from_heap: &'a Heap,
        from: &'a EntryCompactor,
        heap: &'a mut Heap,
        into: &'a mut EntryCompactor,
        memo: &'a dyn Fn(u64) -> Option<Value>,
    ) -> Self {
        Translation {
            memo,
            strings: vec![NOT_YET; from_heap.string_count()],
            frames: vec![NOT_YET; from.stacks.frame_count()],
            stacks: vec![NOT_YET; from.stacks.stack_count()],
            rows: vec![NOT_YET; from.events.len()],
            copies: Default::default(),
            from_heap,
            from,
            heap,
            into,
        }
    }

    fn string(&mut self, s: StrId) -> StrId {
        if s.0 as usize >= self.from_heap.string_count() {
            if let Some(index) = self.from.deferred.index(Deferral::Text, s.0) {
                // a text of the first decoder's, read as one piece reads it
                return match (self.memo)(index) {
                    Some(Value::Str(t)) => t,
                    _ => StrId(0),
                };
            }
        }
        let (heap, from_heap) = (&mut *self.heap, self.from_heap);
        StrId(once(&mut self.strings, s.0, || {
            heap.intern(from_heap.str(s)).0
        }))
    }

    /// A memo entry of the part, as the first decoder's memo must hold it for what later
    /// parts deferred: what one piece would hold there.
    fn memo_entry(&mut self, v: Value) -> Value {
        match self.from_heap.forwarded(v).unwrap_or(v) {
            // a trace entry is never fetched again (it may be listed once): not worth
            // translating (frame lists are, as PyTorch shares one between the entries of a
            // block's free)
            Value::Handle(EVENT, _) => Value::UNAVAILABLE,
            v => self.container(v, 2),
        }
    }

    /// A value with its containers `depth` deep copied into the first decoder's heap (each
    /// container once, so that entries sharing one still share it); deeper ones unavailable.
    /// A frame dict stays a dict in the memo, read as a frame where a list fetches it, and a
    /// list stays a list until its entry is complete: the copies are read the same way when a
    /// later part's deferred frame or frame list is resolved. Their strings are the part's,
    /// all translated before.
    fn container(&mut self, v: Value, depth: u8) -> Value {
        let v = self.from_heap.forwarded(v).unwrap_or(v);
        let (Value::Dict(r) | Value::List(r)) = v else {
            return self.value(v);
        };
        if depth == 0 {
            return Value::UNAVAILABLE;
        }
        if let Some(&copy) = self.copies.get(&r) {
            return copy;
        }
        // the part's heap is borrowed apart from `self`: its containers are read in place
        let from_heap = self.from_heap;
        let copy = match v {
            Value::Dict(_) => {
                let pairs = from_heap
                    .dict(r)
                    .iter()
                    .map(|&(k, v)| (self.value(k), self.container(v, depth - 1)))
                    .collect();
                Value::Dict(self.heap.new_dict(pairs))
            }
            _ => {
                let items = from_heap
                    .list(r)
                    .iter()
                    .map(|&v| self.container(v, depth - 1))
                    .collect();
                Value::List(self.heap.new_list(items))
            }
        };
        self.copies.insert(r, copy);
        copy
    }

    fn frame(&mut self, f: FrameId) -> FrameId {
        if let Some(&t) = self.frames.get(f.0 as usize).filter(|&&t| t != NOT_YET) {
            return FrameId(t);
        }
        if let Some(index) = self.from.deferred.index(Deferral::Frame, f.0) {
            // a frame of the first decoder's, read as one piece reads it
            let v = (self.memo)(index).unwrap_or(Value::None);
            return self.into.frame_of(self.heap, v).unwrap_or(FrameId(NOT_YET));
        }
        let frame = self.from.stacks.frame(f);
        let frame = Frame {
            name: self.string(frame.name),
            filename: self.string(frame.filename),
            line: frame.line,
        };
        let t = self.into.stacks.intern_frame(frame);
        once(&mut self.frames, f.0, || t.0);
        t
    }

    fn stack(&mut self, s: StackId) -> StackId {
        if let Some(&t) = self.stacks.get(s.0 as usize).filter(|&&t| t != NOT_YET) {
            return StackId(t);
        }
        let frames: Vec<FrameId> = self
            .from
            .stacks
            .stack(s)
            .iter()
            .map(|&f| self.frame(f))
            .collect();
        // a deferred item that is no frame makes no stack, as in one piece
        let t = if frames.contains(&FrameId(NOT_YET)) {
            StackId::EMPTY
        } else {
            self.into.stacks.intern_stack(&frames)
        };
        once(&mut self.stacks, s.0, || t.0);
        t
    }

    fn row(&mut self, r: u32) -> u32 {
        if let Some(&t) = self.rows.get(r as usize).filter(|&&t| t != NOT_YET) {
            return t;
        }
        let Some(&e) = self.from.events.get(r as usize) else {
            return NOT_YET;
        };
        let mut extra = match e.extra {
            0 => EventExtra::default(),
            i => self.from.extras[i as usize - 1],
        };
        if extra.forward_frames > 0 {
            let lines = self.from.forward_frames[extra.forward_frames as usize - 1].clone();
            let lines = lines.into_iter().map(|l| self.string(l)).collect();
            self.into.forward_frames.push(lines);
            extra.forward_frames = self.into.forward_frames.len() as u32;
        }
        extra.compile_context = self.string(extra.compile_context);
        extra.user_metadata = self.string(extra.user_metadata);
        let extra = self.into.extra_id(extra);
        let stream = self.into.stream_id(self.from.streams[e.stream.0 as usize]);
        let stack = match self.from.deferred.index(Deferral::Stack, e.stack.0) {
            // a frame list of the first decoder's, read as one piece reads it
            Some(index) => {
                let v = (self.memo)(index).unwrap_or(Value::None);
                self.into.stack_of(self.heap, v).unwrap_or(StackId::EMPTY)
            }
            None => self.stack(e.stack),
        };
        let row = TraceEvent {
            stack,
            stream,
            extra,
            ..e
        };
        let t = self.into.events.len() as u32;
        self.into.events.push(row);
        once(&mut self.rows, r, || t);
        t
    }

    /// A value in the first decoder's terms; what cannot be carried over becomes a value that
    /// stops the decode if it is ever fetched.
    fn value(&mut self, v: Value) -> Value {
        match v {
            Value::Str(s) => Value::Str(self.string(s)),
            Value::Handle(EVENT, r) => Value::Handle(EVENT, self.row(r)),
            Value::Handle(STACK, s) => Value::Handle(STACK, self.stack(StackId(s)).0),
            Value::Handle(FRAME, f) => Value::Handle(FRAME, self.frame(FrameId(f)).0),
            Value::Handle(DEFERRED, i) => (self.memo)(i as u64).unwrap_or(Value::UNAVAILABLE),
            Value::None | Value::Bool(_) | Value::Int(_) | Value::Float(_) => v,
            _ => Value::UNAVAILABLE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::path::{Path, PathBuf};

    /// Every snapshot at hand as a plain pickle in `dir`: the project's test data, and the
    /// shared recordings when present (required where `CI` is set).
    fn plain_snapshots(dir: &Path) -> Vec<PathBuf> {
        super::super::build::read_whole_tests::every_snapshot()
            .enumerate()
            .map(|(i, (_, bytes))| {
                let plain = dir.join(format!("{i}.pickle"));
                File::create(&plain).unwrap().write_all(&bytes).unwrap();
                plain
            })
            .collect()
    }

    /// A fuzzing finding (`fuzz/README.md`): frames of 256 bytes, so that a part of a few KiB
    /// holds a frame dict in its memo that a later part's frame list fetches. Whether a part
    /// is taken in depends on timing, so each split is tried several times.
    #[test]
    fn a_frame_dict_of_an_earlier_part_is_read_as_one_piece_reads_it() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/fuzz/found-split-frame-dict.pickle");
        let mut taken = 0;
        for parts in 2..=4 {
            for _ in 0..8 {
                taken += parts_agree(&path, parts).unwrap_or_else(|e| panic!("{parts} parts: {e}"));
            }
        }
        assert!(taken > 0, "no part was taken in");
    }

    #[test]
    fn parts_give_what_one_piece_gives() {
        let dir = tempfile::tempdir().unwrap();
        let mut taken = 0;
        for path in plain_snapshots(dir.path()) {
            let len = std::fs::metadata(&path).unwrap().len();
            let sound = super::super::from_pickle(File::open(&path).unwrap(), Limits::default());
            for parts in 2..=4 {
                let name = path.display();
                let n = parts_agree(&path, parts).unwrap_or_else(|e| panic!("{name}: {e}"));
                // a sound snapshot is given up only when it cannot be cut
                let cut = !cut_points(&File::open(&path).unwrap(), len, parts).is_empty();
                if sound.is_ok() && cut {
                    let file = File::open(&path).unwrap();
                    let gave = load_in(file, len, Limits::default(), Box::new(|_| {}), parts);
                    assert!(gave.is_some(), "{name} in {parts} parts: gave up");
                }
                taken += n;
            }
        }
        assert!(taken > 0, "no file was decoded in parts");
    }

    /// Damaged files: whatever the parts make of them, they give what one piece gives, or give
    /// up (and one piece then reports the damage).
    #[test]
    fn damage_gives_the_same_result_or_none() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let source = root
            .join("testdata/snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz");
        let (mut r, _) = pickle::source::decompressing(File::open(source).unwrap()).unwrap();
        let mut good = Vec::new();
        r.read_to_end(&mut good).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.pickle");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut split, mut refused) = (0, 0);
        for round in 0..40 {
            let mut bad = good.clone();
            let at = (next() % bad.len() as u64) as usize;
            match round % 4 {
                0 => bad.truncate(at),
                1 => bad[at] ^= 1 << (next() % 8),
                2 => bad[at] = pickle::opcodes::MEMOIZE,
                _ => bad
                    .splice(at..at, [pickle::opcodes::MARK, pickle::opcodes::APPENDS])
                    .for_each(drop),
            }
            std::fs::write(&path, &bad).unwrap();
            match parts_agree(&path, 3) {
                Ok(0) => refused += 1,
                Ok(n) => split += n,
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        assert!(
            split > 0 && refused > 0,
            "{split} parts taken, {refused} refused"
        );
    }
}

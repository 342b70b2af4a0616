//! The pickle virtual machine: a loop over opcodes that builds values and never runs code.
//!
//! Python's `pickle` is a small stack machine. Data-only pickles (what `torch.cuda.memory`
//! writes) use about forty opcodes that push scalars, build lists, tuples and dicts, and store
//! or fetch objects in a memo. The dozen opcodes that import names or call objects (`GLOBAL`,
//! `REDUCE`, `BUILD`, ...) are refused with the byte offset where they appear.

use std::io::Read;

mod flat;
pub use flat::{FlatAdopted, FlatDict, FlatItem, FlatList};

use super::memo::Memo;
use super::opcodes as op;
use super::reader::{ReadError, Reader};
use super::value::{Heap, Ref, Value};
use crate::error::{DecodeError, DecodeErrorKind, FieldError};

/// Caps that keep a hostile pickle from taking unbounded memory.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most values the VM will create (each one costs about 16 bytes).
    pub max_values: u64,
    /// Longest single string or bytes object, in bytes.
    pub max_string_bytes: usize,
    /// Expected size of the pickle, when known: memory is reserved up front (untouched pages
    /// cost nothing) instead of growing and copying.
    pub size_hint: u64,
    /// Refuse, as not a pickle, input whose first byte no pickle starts with (off for
    /// decoding bare opcode sequences).
    pub check_start: bool,
    /// Memory and size caps (`--max-memory`, `--max-size`).
    pub caps: crate::memory::Caps,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_values: 1 << 28,
            max_string_bytes: 256 << 20,
            size_hint: 0,
            check_start: true,
            caps: crate::memory::Caps::DEFAULT,
        }
    }
}

/// Called whenever a value is stored into a container, so that a consumer can compact
/// containers it understands as soon as they are complete (and free their storage).
pub trait Adopter {
    /// Called once before decoding starts, e.g. to intern the keys the adopter looks for.
    fn prepare(&mut self, _heap: &mut Heap, _limits: &Limits) {}

    /// Whether [`Adopter::adopt_flat`] may take dicts: the decoder then reads flat dicts whole
    /// (see `flat.rs`) and offers them to it before decoding them opcode by opcode.
    const READS_FLAT: bool = false;

    /// Takes a flat dict read whole: fills `out` with what the dict, its list and its inner
    /// dicts become, exactly as decoding it opcode by opcode would have made them by the end of
    /// its `SETITEMS` (the list and inner dicts stored by [`Adopter::adopt`], the dict itself
    /// offered to [`Adopter::completed`]), and returns `true`; or returns `false`, having
    /// changed nothing that decoding the dict opcode by opcode would not change, and the decoder
    /// does that.
    fn adopt_flat(
        &mut self,
        _heap: &mut Heap,
        _dict: FlatDict<'_>,
        _out: &mut FlatAdopted,
    ) -> bool {
        false
    }

    /// Told of a dict inside a batch of `APPENDS` to a list (where trace entries are) as soon as
    /// a `SETITEMS` has set its items; returns its replacement to compact it there and then, or
    /// the dict itself to leave it open (later items go into it, and it is offered to
    /// [`Adopter::adopt`] when stored). The fast path reads such dicts whole, so what an adopter
    /// compacts here is what it compacts there, at the same point of the pickle.
    fn completed(&mut self, _heap: &mut Heap, dict: Value) -> Result<Value, FieldError> {
        Ok(dict)
    }

    /// Returns the value to store in place of `value`. `key` is the dict key for dict values and
    /// `None` for list, tuple and set items.
    fn adopt(
        &mut self,
        heap: &mut Heap,
        key: Option<Value>,
        value: Value,
    ) -> Result<Value, FieldError>;

    /// Told of each value stored in the memo, and of each compacted value that replaces one,
    /// so that the other parts of a split decode can import it ([`Adopter::import`]).
    #[inline(always)]
    fn memoized(&mut self, _heap: &Heap, _index: u64, _value: Value) {}

    /// Called every few thousand opcodes (to hand over exports that another part waits for).
    fn tick(&mut self) {}

    /// Told that a part of a split decode may end here (nothing is pending), so that the
    /// adopter can remember how far its own tables had come.
    fn clean(&mut self, _heap: &Heap) {}

    /// The value of a memo entry stored before this part of a split decode began (by another
    /// part), made in this part's heap; `None` when it cannot be had.
    fn import(&mut self, _heap: &mut Heap, _index: u64) -> Option<Value> {
        None
    }
}

/// An [`Adopter`] that keeps every value as it is.
pub struct KeepAll;

impl Adopter for KeepAll {
    fn adopt(&mut self, _: &mut Heap, _: Option<Value>, value: Value) -> Result<Value, FieldError> {
        Ok(value)
    }
}

/// The result of decoding one pickle.
#[derive(Debug)]
pub struct Decoded {
    /// The value that `STOP` returned.
    pub root: Value,
    /// Storage for every container and string reachable from `root`.
    pub heap: Heap,
    /// The protocol named by the `PROTO` opcode (0 or 1 when there is none).
    pub protocol: u8,
    /// Bytes of pickle consumed, up to and including `STOP`.
    pub bytes_read: u64,
}

struct Vm<'a, A: Adopter> {
    heap: Heap,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    protocol: u8,
    values: u64,
    limits: Limits,
    adopter: &'a mut A,
    offset: u64,
    /// Opcodes run since the last look at memory.
    since_check: u32,
    /// This thread's heap tally when decoding began.
    thread_base: i64,
    /// Offset of the first byte decoded (not 0 for a part of a split decode).
    start: u64,
    /// Decoding pauses on reaching this offset ([`Resumable::run_until`], parts).
    stop_at: u64,
    /// Set when decoding one part of a split decode on its own.
    part: Option<Box<PartState>>,
    /// Memory a part may hold besides its allowance: the memo's stand-ins for earlier parts'
    /// entries (8 bytes each, twice while the memo grows).
    stand_in_bytes: u64,
    /// Buffers of the flat-dict fast path, boxed: they are taken out and put back for each dict.
    flat: Option<Box<flat::FlatScratch>>,
    /// Frame lists the fast path has seen, by their bytes.
    seen_lists: flat::SeenLists,
    /// The long list batches are appended to (a device's trace entries, a handle each), and
    /// the pages past its end kept faulted in on another core.
    appended: Option<(Ref, crate::memory::ahead::Ahead)>,
}

/// What a part of a split decode keeps besides the ordinary VM state.
///
/// A part starts just before a value inside a batch of `APPENDS` to some list (a trace's
/// entries): that list and the batch's `MARK` lie below its stack, in the part before. The
/// part appends to that list for as long as the pickle does, and stops at anything else that
/// reaches below its stack.
struct PartState {
    /// The batch open at the start has not been closed yet.
    first_batch_open: bool,
    /// Values appended to the outer list, in order.
    emitted: Vec<Value>,
    /// The last point where nothing was pending: no stack, no mark, the first batch closed.
    clean: Option<CleanPoint>,
}

#[derive(Clone, Copy)]
struct CleanPoint {
    offset: u64,
    emitted: usize,
    memo: usize,
    values: u64,
}

/// Memo entries reserved up front: a memo entry costs at least 2 pickle bytes (a value and
/// `MEMOIZE`); real files use ~35.
fn memo_capacity(limits: &Limits) -> usize {
    (limits.size_hint / 24).min(1 << 20) as usize
}

/// Items from which a list's growth is followed by [`crate::memory::ahead::Ahead`] (512 KiB of
/// values): only a device's trace entries, in practice.
const LONG_LIST: usize = 1 << 15;

/// Opcodes between two looks at memory: often enough that no flood gets far past a limit
/// (each opcode holds at most a few dozen bytes, or one object no larger than its input).
const CHECK_EVERY: u32 = 4096;

/// Decodes one pickle from `input`, handing completed values to `adopter`.
pub fn decode_with<R: Read, A: Adopter>(
    input: R,
    limits: Limits,
    adopter: &mut A,
) -> Result<Decoded, DecodeError> {
    decode_from(Reader::new(input), limits, adopter)
}

/// Decodes one pickle from `stream`, handing completed values to `adopter`.
pub fn decode_stream<A: Adopter>(
    stream: super::source::Stream,
    limits: Limits,
    adopter: &mut A,
) -> Result<Decoded, DecodeError> {
    let reader = match stream {
        super::source::Stream::Direct(input) => Reader::new(input),
        super::source::Stream::Ahead(ahead) => Reader::ahead(ahead),
    };
    decode_from(reader, limits, adopter)
}

/// Decodes the whole pickle `reader` reads.
fn decode_from<R: Read, A: Adopter>(
    mut reader: Reader<R>,
    limits: Limits,
    adopter: &mut A,
) -> Result<Decoded, DecodeError> {
    let mut vm = Vm::new(limits, adopter, 0);
    vm.check_start(&mut reader)?;
    let root = loop {
        if let Some(root) = vm.run(&mut reader)? {
            break root;
        }
    };
    vm.finish(root, &mut reader)
}

/// A decoder that can pause at chosen offsets and take in what other parts of a split decode
/// produced meanwhile (the first part of a split decode; `snapshot::split` drives it).
pub struct Resumable<'a, R: Read, A: Adopter> {
    vm: Vm<'a, A>,
    reader: Reader<R>,
}

/// Where a [`Resumable`] decode stands after [`Resumable::run_until`].
pub enum Progress {
    /// Paused at this offset (the one asked for, or the first opcode after it).
    Paused(u64),
    /// The pickle's `STOP`: the root value.
    Done(Value),
}

impl<'a, R: Read + std::io::Seek, A: Adopter> Resumable<'a, R, A> {
    /// Starts decoding `input` from its first byte.
    pub fn new(input: R, limits: Limits, adopter: &'a mut A) -> Result<Self, DecodeError> {
        let mut reader = Reader::new(input);
        let mut vm = Vm::new(limits, adopter, 0);
        vm.check_start(&mut reader)?;
        Ok(Resumable { vm, reader })
    }

    /// Decodes until the offset `stop` is reached, or to the end of the pickle.
    pub fn run_until(&mut self, stop: u64) -> Result<Progress, DecodeError> {
        self.vm.stop_at = stop;
        let out = self.vm.run(&mut self.reader);
        self.vm.stop_at = u64::MAX;
        Ok(match out? {
            Some(root) => Progress::Done(root),
            None => Progress::Paused(self.vm.offset),
        })
    }

    /// Finishes after `STOP` (reads the rest of the input: junk there is an error).
    pub fn finish(mut self, root: Value) -> Result<Decoded, DecodeError> {
        self.vm.finish(root, &mut self.reader)
    }

    /// Number of memo entries so far (the next `MEMOIZE` index).
    pub fn memo_len(&self) -> u64 {
        self.vm.memo.len() as u64
    }

    /// Whether the memo holds an entry stored out of order (a split decode then cannot number
    /// the entries of later parts).
    pub fn memo_has_gaps(&self) -> bool {
        self.vm.memo.has_sparse()
    }

    /// The heap, the adopter and the memo (read-only), to bring in another part's values.
    pub fn parts(&mut self) -> (&mut Heap, &mut A, impl Fn(u64) -> Option<Value> + '_) {
        let memo = &self.vm.memo;
        (&mut self.vm.heap, &mut *self.vm.adopter, move |i| {
            memo.get(i)
        })
    }

    /// Whether the decoder stands inside a batch of appends to a list: the latest mark has a
    /// list just below it. The values above the mark are handed to the adopter now (as the
    /// `APPENDS` would) and must all pass `accept`, as must the list's last item.
    pub fn in_batch(&mut self, accept: impl Fn(Value) -> bool) -> Result<bool, DecodeError> {
        let Some(&m) = self.vm.marks.last() else {
            return Ok(false);
        };
        let Some(Value::List(list)) = m.checked_sub(1).map(|i| self.vm.stack[i]) else {
            return Ok(false);
        };
        match self.vm.heap.list_mut(list) {
            Some(items) if items.last().is_none_or(|&v| accept(v)) => {}
            _ => return Ok(false),
        }
        for i in m..self.vm.stack.len() {
            let v = self.vm.adopt(None, self.vm.stack[i])?;
            self.vm.stack[i] = v;
            if !accept(v) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Takes in a part that began where this decoder stands (inside a batch, as
    /// [`Resumable::in_batch`] checked) and goes on where the part ended. Its values must be
    /// this decoder's already (the caller translates them).
    pub fn take_part(&mut self, part: PartInput) -> Result<(), DecodeError> {
        let vm = &mut self.vm;
        let m = *vm.marks.last().expect("checked by in_batch");
        let Value::List(list) = vm.stack[m - 1] else {
            unreachable!("checked by in_batch")
        };
        if part.closed_first_batch {
            let (stack, heap) = (&mut vm.stack, &mut vm.heap);
            if let Some(items) = heap.list_mut(list) {
                items.extend_from_slice(&stack[m..]);
                items.extend_from_slice(&part.emitted);
            }
            stack.truncate(m);
            vm.marks.pop();
            if part.batch_open {
                vm.marks.push(vm.stack.len());
            }
        }
        vm.stack.extend_from_slice(&part.pending);
        vm.memo.extend(&part.memo);
        vm.values = vm.values.saturating_add(part.values);
        vm.offset = part.end;
        self.reader.jump(part.end).map_err(|e| self.vm.read_err(e))
    }
}

/// Where a part of a split decode ended and what it left ([`decode_part`]); taken in by
/// [`Resumable::take_part`] once its values are the first decoder's.
pub struct PartInput {
    /// Offset where its usable decoding ends (the next part's start, or the last point where
    /// nothing was pending); decoding goes on from there.
    pub end: u64,
    /// Values it appended to the outer list, in order.
    pub emitted: Vec<Value>,
    /// Values above the latest mark at its end (adopted).
    pub pending: Vec<Value>,
    /// It closed the batch that was open where it began.
    pub closed_first_batch: bool,
    /// A batch is open at its end (the pending values belong to it).
    pub batch_open: bool,
    /// Its memo entries, from its first index on.
    pub memo: Vec<Value>,
    /// Values it created (counted against the value budget).
    pub values: u64,
}

/// What one part of a split decode produced, in its own heap ([`decode_part`]).
pub struct PartOutput {
    /// Offset where it began.
    pub start: u64,
    /// Where it ended and what it left, in its own values.
    pub input: PartInput,
    /// The part's heap (strings, and what its values refer to).
    pub heap: Heap,
    /// It ended at its last clean point ([`Adopter::clean`]), not where it was asked to stop.
    pub ended_clean: bool,
}

/// Decodes one part of a pickle on its own: `input` is positioned at `start`, just before a
/// value inside a batch of `APPENDS` whose list lies in an earlier part, and the part's first
/// `MEMOIZE` stores index `memo_base`. Decoding ends at `stop_at` (the next part's start), or
/// earlier where the pickle reaches below the part's stack. `None` when nothing usable was
/// decoded.
pub fn decode_part<R: Read, A: Adopter>(
    input: R,
    start: u64,
    memo_base: u64,
    stop_at: u64,
    limits: Limits,
    adopter: &mut A,
) -> Option<PartOutput> {
    let mut reader = Reader::starting_at(input, start);
    let mut vm = Vm::new(limits, adopter, start);
    vm.memo = Memo::starting_at(memo_base, memo_capacity(&limits));
    // the stand-ins for earlier parts' entries are not held for what this part reads
    vm.thread_base = crate::memory::thread_bytes();
    vm.stand_in_bytes = memo_base.saturating_mul(16);
    vm.stop_at = stop_at;
    vm.part = Some(Box::new(PartState {
        first_batch_open: true,
        emitted: Vec::new(),
        clean: None,
    }));
    let reached = matches!(vm.run(&mut reader), Ok(None)) && vm.offset == stop_at;
    let part = vm.part.take().expect("set above");
    let memo_base = memo_base as usize;
    let at_stop = if reached {
        let marks = vm.marks.as_slice();
        match (part.first_batch_open, marks) {
            (true, []) => Some((false, true)),
            (false, [0]) => Some((true, true)),
            (false, []) if vm.stack.is_empty() => Some((true, false)),
            _ => None,
        }
    } else {
        None
    };
    if let Some((closed_first_batch, batch_open)) = at_stop {
        let mut pending = std::mem::take(&mut vm.stack);
        let mut adopted = true;
        for v in pending.iter_mut() {
            match vm.adopt(None, *v) {
                Ok(a) => *v = a,
                Err(_) => adopted = false,
            }
        }
        if adopted {
            let count = vm.memo.len() - memo_base;
            return Some(PartOutput {
                start,
                input: PartInput {
                    end: stop_at,
                    emitted: part.emitted,
                    pending,
                    closed_first_batch,
                    batch_open,
                    memo: vm.memo.own_values(count),
                    values: vm.values,
                },
                heap: vm.heap,
                ended_clean: false,
            });
        }
    }
    let clean = part.clean?;
    let mut emitted = part.emitted;
    emitted.truncate(clean.emitted);
    vm.memo.truncate_own(clean.memo);
    Some(PartOutput {
        start,
        input: PartInput {
            end: clean.offset,
            emitted,
            pending: Vec::new(),
            closed_first_batch: true,
            batch_open: false,
            memo: vm.memo.own_values(clean.memo),
            values: clean.values,
        },
        heap: vm.heap,
        ended_clean: true,
    })
}

/// Whether a pickle can begin with this byte: `PROTO` (protocol 2 and later), or for
/// protocols 0 and 1 an opcode that pushes a mark or a value (or imports one, which is refused
/// later with its own message).
fn can_start_a_pickle(b: u8) -> bool {
    matches!(
        b,
        op::PROTO
            | b'('
            | b'}'
            | b']'
            | b')'
            | b'N'
            | b'I'
            | b'L'
            | b'F'
            | b'S'
            | b'V'
            | b'K'
            | b'M'
            | b'J'
            | b'G'
            | b'U'
            | b'T'
            | b'X'
            | b'c'
            | b'i'
    )
}

/// Decodes one pickle from `input`, keeping every value.
pub fn decode<R: Read>(input: R, limits: Limits) -> Result<Decoded, DecodeError> {
    decode_with(input, limits, &mut KeepAll)
}

fn type_name(v: Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "bool",
        Value::Int(_) | Value::BigInt(_) => "int",
        Value::Float(_) => "float",
        Value::Str(_) => "str",
        Value::Bytes(_) => "bytes",
        Value::List(_) => "list",
        Value::Tuple(_) => "tuple",
        Value::Dict(_) => "dict",
        Value::Handle(..) => "compacted object",
    }
}

fn op_name(code: u8) -> &'static str {
    op::name(code).unwrap_or("?")
}

impl<'a, A: Adopter> Vm<'a, A> {
    /// A VM with a fresh heap the adopter has prepared, decoding from offset `start`.
    fn new(limits: Limits, adopter: &'a mut A, start: u64) -> Self {
        let mut heap = Heap::default();
        adopter.prepare(&mut heap, &limits);
        Vm {
            heap,
            stack: Vec::with_capacity(1024),
            marks: Vec::with_capacity(64),
            memo: Memo::with_capacity(memo_capacity(&limits)),
            protocol: 0,
            values: 0,
            limits,
            adopter,
            offset: start,
            since_check: 0,
            thread_base: crate::memory::thread_bytes(),
            start,
            stop_at: u64::MAX,
            part: None,
            stand_in_bytes: 0,
            flat: None,
            seen_lists: flat::SeenLists::default(),
            appended: None,
        }
    }

    /// Refuses, as not a pickle, input whose first byte no pickle starts with, saying what it
    /// looks like instead.
    fn check_start<R: Read>(&mut self, reader: &mut Reader<R>) -> Result<(), DecodeError> {
        if let (true, Ok(Some(first))) = (self.limits.check_start, reader.peek()) {
            if !can_start_a_pickle(first) {
                let what = what_it_is(reader.head(512));
                return Err(DecodeError {
                    offset: 0,
                    kind: DecodeErrorKind::NotAPickle { first, what },
                    decompressed: false,
                });
            }
        }
        Ok(())
    }

    /// After `STOP`: the rest of the input must be empty.
    fn finish<R: Read>(
        mut self,
        root: Value,
        reader: &mut Reader<R>,
    ) -> Result<Decoded, DecodeError> {
        self.offset = reader.offset();
        self.rest_of_input(reader)?;
        Ok(Decoded {
            root,
            heap: self.heap,
            protocol: self.protocol,
            bytes_read: reader.offset(),
        })
    }

    /// A part of a split decode reached something it cannot do on its own.
    #[cold]
    fn part_end(&self) -> DecodeError {
        self.err(DecodeErrorKind::PartEnd)
    }

    /// `APPENDS` (or `APPEND`) in a part, of its whole stack to the list below it:
    /// `batch_of_first` when it closes the batch that was open where the part began.
    #[cold]
    fn append_below(&mut self, batch_of_first: bool) -> Result<(), DecodeError> {
        if self.part.as_ref().map(|p| p.first_batch_open) != Some(batch_of_first) {
            return Err(self.part_end());
        }
        for i in 0..self.stack.len() {
            let v = self.stack[i];
            if is_container(v) {
                self.stack[i] = self.adopt(None, v)?;
            }
        }
        let part = self.part.as_mut().expect("checked above");
        part.emitted.append(&mut self.stack);
        part.first_batch_open = false;
        Ok(())
    }

    /// Records the point after the opcode just run as clean, when nothing is pending there.
    #[inline]
    fn note_clean(&mut self, offset: u64) {
        if let Some(part) = self.part.as_mut() {
            if !part.first_batch_open && self.stack.is_empty() && self.marks.is_empty() {
                part.clean = Some(CleanPoint {
                    offset,
                    emitted: part.emitted.len(),
                    memo: self.memo.len() - self.memo.offset() as usize,
                    values: self.values,
                });
                self.adopter.clean(&self.heap);
            }
        }
    }

    fn err(&self, kind: DecodeErrorKind) -> DecodeError {
        DecodeError {
            offset: self.offset,
            kind,
            decompressed: false,
        }
    }

    /// Reads what follows `STOP` to the end of the input, so that a compressed file's checksum
    /// is verified; anything there is an error: a second pickle, or junk.
    fn rest_of_input<R: Read>(&mut self, r: &mut Reader<R>) -> Result<(), DecodeError> {
        let mut extra = 0u64;
        let mut first = None;
        loop {
            match r.byte() {
                Ok(Some(b)) => {
                    first.get_or_insert(b);
                    let more = r.window().len();
                    r.advance(more);
                    extra += 1 + more as u64;
                    if r.offset() > self.limits.caps.max_size {
                        return Err(self.err(DecodeErrorKind::SizeLimit(self.limits.caps.max_size)));
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(self.read_err(e)),
            }
        }
        match first {
            None => Ok(()),
            Some(b) => Err(self.err(DecodeErrorKind::TrailingData {
                bytes: extra,
                second_pickle: b == op::PROTO,
            })),
        }
    }

    fn read_err(&self, e: ReadError) -> DecodeError {
        match e {
            ReadError::Truncated { needed } => self.err(DecodeErrorKind::Truncated { needed }),
            ReadError::Io(e) => self.err(DecodeErrorKind::Io(e)),
        }
    }

    #[inline(always)]
    fn push(&mut self, v: Value) -> Result<(), DecodeError> {
        self.values += 1;
        if self.values > self.limits.max_values {
            return Err(self.too_many());
        }
        self.stack.push(v);
        Ok(())
    }

    #[cold]
    fn too_many(&self) -> DecodeError {
        self.err(DecodeErrorKind::TooManyValues(self.limits.max_values))
    }

    #[inline]
    fn pop(&mut self, code: u8) -> Result<Value, DecodeError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err(DecodeErrorKind::StackUnderflow { op: op_name(code) }));
        }
        Ok(self.stack.pop().expect("length checked"))
    }

    #[inline]
    fn top(&self, code: u8) -> Result<Value, DecodeError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err(DecodeErrorKind::StackUnderflow { op: op_name(code) }));
        }
        Ok(*self.stack.last().expect("length checked"))
    }

    /// The value just below a popped mark at `m` (the container an `APPENDS` or `SETITEMS`
    /// fills).
    fn below(&self, code: u8, m: usize) -> Result<Value, DecodeError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if m == 0 || m - 1 < floor {
            return Err(self.err(DecodeErrorKind::StackUnderflow { op: op_name(code) }));
        }
        Ok(self.stack[m - 1])
    }

    /// Pops everything above the most recent mark, and the mark.
    fn pop_mark(&mut self, code: u8) -> Result<Vec<Value>, DecodeError> {
        let Some(m) = self.marks.pop() else {
            return Err(self.err(DecodeErrorKind::NoMark { op: op_name(code) }));
        };
        Ok(self.stack.split_off(m))
    }

    /// Hands a container being stored to the adopter (other values are stored as they are:
    /// callers test [`is_container`] first, which keeps this call off the common path).
    #[inline(never)]
    fn adopt(&mut self, key: Option<Value>, v: Value) -> Result<Value, DecodeError> {
        if !is_container(v) {
            return Ok(v);
        }
        if let Some(replacement) = self.heap.forwarded(v) {
            return Ok(replacement);
        }
        self.hand_over(|adopter, heap| adopter.adopt(heap, key, v))
    }

    /// After a `SETITEMS`, the dict on top of the stack: offered to the adopter now when it lies
    /// in a batch of a list ([`Adopter::completed`]).
    fn complete_top(&mut self) -> Result<(), DecodeError> {
        let Some(&dict) = self.stack.last() else {
            return Ok(());
        };
        if !self.in_list_batch() {
            return Ok(());
        }
        let v = self.hand_over(|adopter, heap| adopter.completed(heap, dict))?;
        *self.stack.last_mut().expect("not empty") = v;
        Ok(())
    }

    /// Runs one of the adopter's conversions: its refusal becomes an error at this opcode, and
    /// the memo entries of what it compacted now hold the replacements.
    fn hand_over(
        &mut self,
        convert: impl FnOnce(&mut A, &mut Heap) -> Result<Value, FieldError>,
    ) -> Result<Value, DecodeError> {
        let offset = self.offset;
        let out = convert(self.adopter, &mut self.heap).map_err(|e| DecodeError {
            offset,
            kind: DecodeErrorKind::Rejected(e),
            decompressed: false,
        })?;
        while let Some((slot, replacement)) = self.heap.memo_rewrites.pop() {
            self.memo.replace(slot as u64, replacement);
            self.adopter.memoized(&self.heap, slot as u64, replacement);
        }
        Ok(out)
    }

    fn adopt_all(&mut self, items: &mut [Value]) -> Result<(), DecodeError> {
        for item in items.iter_mut() {
            if is_container(*item) {
                *item = self.adopt(None, *item)?;
            }
        }
        Ok(())
    }

    fn memo_put(&mut self, index: u64, v: Value) {
        self.heap.note_memo(v, index);
        self.memo.put(index, v);
        self.adopter.memoized(&self.heap, index, v);
    }

    #[inline(always)]
    fn memo_get(&mut self, code: u8, index: u64) -> Result<(), DecodeError> {
        match self.memo.get(index) {
            Some(v) if !is_stand_in(v) => self.push(v),
            found => {
                let v = self.memo_miss(code, index, found)?;
                self.push(v)
            }
        }
    }

    /// A memo index this decoder did not store (`found` is what the memo holds there): in a
    /// part of a split decode, one stored by an earlier part (imported); otherwise an error.
    #[cold]
    fn memo_miss(
        &mut self,
        code: u8,
        index: u64,
        found: Option<Value>,
    ) -> Result<Value, DecodeError> {
        match found {
            Some(Memo::ELSEWHERE) => match self.adopter.import(&mut self.heap, index) {
                Some(v) => {
                    // later fetches find it in place
                    self.memo.put(index, v);
                    Ok(v)
                }
                None => Err(self.part_end()),
            },
            Some(Value::UNAVAILABLE) => Err(self.part_end()),
            _ => Err(self.missing_memo(code, index)),
        }
    }

    #[cold]
    fn missing_memo(&self, code: u8, index: u64) -> DecodeError {
        self.err(DecodeErrorKind::MissingMemo {
            op: op_name(code),
            index,
        })
    }

    fn text_arg<'r, R: Read>(
        &self,
        r: &'r mut Reader<R>,
        code: u8,
    ) -> Result<&'r [u8], DecodeError> {
        let limit = self.limits.max_string_bytes;
        match r.line(limit) {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(self.err(DecodeErrorKind::TooLarge {
                what: op_name(code),
                size: limit as u64 + 1,
                limit: limit as u64,
            })),
            Err(e) => Err(self.read_err(e)),
        }
    }

    fn sized<'r, R: Read>(
        &self,
        r: &'r mut Reader<R>,
        code: u8,
        len: u64,
    ) -> Result<&'r [u8], DecodeError> {
        if len > self.limits.max_string_bytes as u64 {
            return Err(self.err(DecodeErrorKind::TooLarge {
                what: op_name(code),
                size: len,
                limit: self.limits.max_string_bytes as u64,
            }));
        }
        r.take(len as usize).map_err(|e| self.read_err(e))
    }

    #[inline(always)]
    fn fixed<R: Read, const N: usize>(&self, r: &mut Reader<R>) -> Result<[u8; N], DecodeError> {
        let s = r.take(N).map_err(|e| self.read_err(e))?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn push_long(&mut self, le: &[u8]) -> Result<(), DecodeError> {
        if le.len() > 16 {
            return Err(self.err(DecodeErrorKind::IntTooWide(le.len() as u64)));
        }
        let v = if le.is_empty() {
            0
        } else {
            let mut buf = if le[le.len() - 1] & 0x80 != 0 {
                [0xffu8; 16]
            } else {
                [0u8; 16]
            };
            buf[..le.len()].copy_from_slice(le);
            i128::from_le_bytes(buf)
        };
        let value = self.heap.new_big_int(v);
        self.push(value)
    }

    /// Refuses to go on when the pickle is longer than `--max-size`, the process holds more than
    /// `--max-memory`, or decoding holds more than a snapshot of the length read could need.
    #[cold]
    fn check_memory(&self, read: u64) -> Result<(), DecodeError> {
        let caps = self.limits.caps;
        if read > caps.max_size {
            return Err(self.err(DecodeErrorKind::SizeLimit(caps.max_size)));
        }
        if crate::memory::process_bytes() > caps.max_memory {
            return Err(self.err(DecodeErrorKind::MemoryLimit(caps.max_memory)));
        }
        let held = (crate::memory::thread_bytes() - self.thread_base).max(0) as u64;
        let read = read.saturating_sub(self.start);
        let allowance = crate::memory::BASE_ALLOWANCE
            .saturating_add(read.saturating_mul(2))
            .saturating_add(self.stand_in_bytes);
        if held > allowance {
            return Err(self.err(DecodeErrorKind::MemoryBomb { held, read }));
        }
        Ok(())
    }

    /// Runs opcodes to `STOP` (`Some(root)`), or until the offset reaches `stop_at` (`None`).
    fn run<R: Read>(&mut self, r: &mut Reader<R>) -> Result<Option<Value>, DecodeError> {
        loop {
            self.offset = r.offset();
            if self.offset >= self.stop_at {
                return Ok(None);
            }
            self.since_check += 1;
            if self.since_check >= CHECK_EVERY {
                self.since_check = 0;
                self.check_memory(self.offset)?;
                self.adopter.tick();
            }
            if self.fast_step(r)? {
                continue;
            }
            let code = match r.byte() {
                Ok(Some(b)) => b,
                Ok(None) if self.offset == 0 => return Err(self.err(DecodeErrorKind::Empty)),
                Ok(None) => return Err(self.err(DecodeErrorKind::Truncated { needed: 1 })),
                Err(e) => return Err(self.read_err(e)),
            };
            if let Some(root) = self.step(r, code)? {
                return Ok(Some(root));
            }
        }
    }

    /// Runs one opcode the fast path left (`Some(root)` at `STOP`), by its family.
    fn step<R: Read>(&mut self, r: &mut Reader<R>, code: u8) -> Result<Option<Value>, DecodeError> {
        match code {
            op::PROTO | op::FRAME | op::STOP | op::MARK | op::POP | op::POP_MARK | op::DUP => {
                return self.control(r, code)
            }
            op::NONE
            | op::NEWTRUE
            | op::NEWFALSE
            | op::BININT
            | op::BININT1
            | op::BININT2
            | op::LONG1
            | op::LONG4
            | op::INT
            | op::LONG
            | op::FLOAT
            | op::BINFLOAT => self.number(r, code)?,
            op::SHORT_BINUNICODE
            | op::BINUNICODE
            | op::BINUNICODE8
            | op::SHORT_BINSTRING
            | op::BINSTRING
            | op::STRING
            | op::UNICODE
            | op::SHORT_BINBYTES
            | op::BINBYTES
            | op::BINBYTES8
            | op::BYTEARRAY8 => self.text(r, code)?,
            op::EMPTY_LIST
            | op::EMPTY_SET
            | op::EMPTY_TUPLE
            | op::EMPTY_DICT
            | op::LIST
            | op::FROZENSET
            | op::TUPLE
            | op::TUPLE1
            | op::TUPLE2
            | op::TUPLE3
            | op::DICT => self.build(code)?,
            op::APPEND | op::APPENDS | op::ADDITEMS | op::SETITEM | op::SETITEMS => {
                self.fill(r, code)?
            }
            op::MEMOIZE
            | op::BINPUT
            | op::LONG_BINPUT
            | op::PUT
            | op::BINGET
            | op::LONG_BINGET
            | op::GET => self.memo(r, code)?,
            op::NEXT_BUFFER | op::READONLY_BUFFER => {
                return Err(self.err(DecodeErrorKind::OutOfBand));
            }
            c if op::runs_code(c) => {
                return Err(self.err(DecodeErrorKind::RunsCode { op: op_name(c) }));
            }
            c => return Err(self.err(DecodeErrorKind::UnknownOpcode(c))),
        }
        Ok(None)
    }

    /// The protocol, frames, marks and the stack's own opcodes; `STOP` gives the root.
    fn control<R: Read>(
        &mut self,
        r: &mut Reader<R>,
        code: u8,
    ) -> Result<Option<Value>, DecodeError> {
        match code {
            op::PROTO => {
                let [v] = self.fixed::<R, 1>(r)?;
                if v > 5 {
                    return Err(self.err(DecodeErrorKind::Protocol(v)));
                }
                self.protocol = v;
            }
            op::FRAME => {
                self.fixed::<R, 8>(r)?;
            }
            op::STOP => {
                if self.part.is_some() {
                    return Err(self.part_end());
                }
                return self.pop(code).map(Some);
            }
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                if self.marks.last() == Some(&self.stack.len()) {
                    // Python pops a mark when the stack top is one.
                    self.marks.pop();
                } else {
                    self.pop(code)?;
                }
            }
            op::POP_MARK => {
                self.pop_mark(code)?;
            }
            op::DUP => {
                let v = self.top(code)?;
                self.push(v)?;
            }
            _ => unreachable!("an opcode of another family"),
        }
        Ok(None)
    }

    /// None, booleans, integers and floats.
    fn number<R: Read>(&mut self, r: &mut Reader<R>, code: u8) -> Result<(), DecodeError> {
        match code {
            op::NONE => self.push(Value::None)?,
            op::NEWTRUE => self.push(Value::Bool(true))?,
            op::NEWFALSE => self.push(Value::Bool(false))?,
            op::BININT => {
                let b = self.fixed::<R, 4>(r)?;
                self.push(Value::Int(i32::from_le_bytes(b) as i64))?;
            }
            op::BININT1 => {
                let [b] = self.fixed::<R, 1>(r)?;
                self.push(Value::Int(b as i64))?;
            }
            op::BININT2 => {
                let b = self.fixed::<R, 2>(r)?;
                self.push(Value::Int(u16::from_le_bytes(b) as i64))?;
            }
            op::LONG1 => {
                let [n] = self.fixed::<R, 1>(r)?;
                let bytes = r.take(n as usize).map_err(|e| self.read_err(e))?;
                let mut le = [0u8; 255];
                le[..n as usize].copy_from_slice(bytes);
                self.push_long(&le[..n as usize])?;
            }
            op::LONG4 => {
                let b = self.fixed::<R, 4>(r)?;
                let n = i32::from_le_bytes(b);
                if n < 0 {
                    return Err(self.err(DecodeErrorKind::BadArgument { op: "LONG4" }));
                }
                if n > 16 {
                    return Err(self.err(DecodeErrorKind::IntTooWide(n as u64)));
                }
                let bytes = r.take(n as usize).map_err(|e| self.read_err(e))?;
                let mut le = [0u8; 16];
                le[..n as usize].copy_from_slice(bytes);
                self.push_long(&le[..n as usize])?;
            }
            op::INT | op::LONG => {
                let text = self.text_arg(r, code)?.to_vec();
                let v = self.text_int(code, &text)?;
                self.push(v)?;
            }
            op::FLOAT => {
                let text = self.text_arg(r, code)?;
                let v = std::str::from_utf8(text)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok());
                match v {
                    Some(f) => self.push(Value::Float(f))?,
                    None => return Err(self.err(DecodeErrorKind::BadArgument { op: "FLOAT" })),
                }
            }
            op::BINFLOAT => {
                let b = self.fixed::<R, 8>(r)?;
                self.push(Value::Float(f64::from_be_bytes(b)))?;
            }
            _ => unreachable!("an opcode of another family"),
        }
        Ok(())
    }

    /// Strings and bytes.
    fn text<R: Read>(&mut self, r: &mut Reader<R>, code: u8) -> Result<(), DecodeError> {
        match code {
            op::SHORT_BINUNICODE => {
                let [n] = self.fixed::<R, 1>(r)?;
                let id = {
                    let s = r.take(n as usize).map_err(|e| self.read_err(e))?;
                    intern_utf8(&mut self.heap, s)
                };
                self.push(Value::Str(id))?;
            }
            op::BINUNICODE => {
                let n = u32::from_le_bytes(self.fixed::<R, 4>(r)?) as u64;
                let id = {
                    let s = self.sized(r, code, n)?;
                    intern_utf8(&mut self.heap, s)
                };
                self.push(Value::Str(id))?;
            }
            op::BINUNICODE8 => {
                let n = u64::from_le_bytes(self.fixed::<R, 8>(r)?);
                let id = {
                    let s = self.sized(r, code, n)?;
                    intern_utf8(&mut self.heap, s)
                };
                self.push(Value::Str(id))?;
            }
            op::SHORT_BINSTRING => {
                let [n] = self.fixed::<R, 1>(r)?;
                let text: String = {
                    let s = r.take(n as usize).map_err(|e| self.read_err(e))?;
                    s.iter().map(|&b| b as char).collect()
                };
                let id = self.heap.intern(&text);
                self.push(Value::Str(id))?;
            }
            op::BINSTRING => {
                let n = i32::from_le_bytes(self.fixed::<R, 4>(r)?);
                if n < 0 {
                    return Err(self.err(DecodeErrorKind::BadArgument { op: "BINSTRING" }));
                }
                let text: String = {
                    let s = self.sized(r, code, n as u64)?;
                    s.iter().map(|&b| b as char).collect()
                };
                let id = self.heap.intern(&text);
                self.push(Value::Str(id))?;
            }
            op::STRING => {
                let line = self.text_arg(r, code)?.to_vec();
                let text = unquote_py_string(&line)
                    .ok_or_else(|| self.err(DecodeErrorKind::BadArgument { op: "STRING" }))?;
                let id = self.heap.intern(&text);
                self.push(Value::Str(id))?;
            }
            op::UNICODE => {
                let line = self.text_arg(r, code)?.to_vec();
                let text = raw_unicode_unescape(&line);
                let id = self.heap.intern(&text);
                self.push(Value::Str(id))?;
            }
            op::SHORT_BINBYTES => {
                let [n] = self.fixed::<R, 1>(r)?;
                let v = {
                    let s = r.take(n as usize).map_err(|e| self.read_err(e))?;
                    let s = s.to_vec();
                    self.heap.new_bytes(&s)
                };
                self.push(v)?;
            }
            op::BINBYTES => {
                let n = u32::from_le_bytes(self.fixed::<R, 4>(r)?) as u64;
                let s = self.sized(r, code, n)?.to_vec();
                let v = self.heap.new_bytes(&s);
                self.push(v)?;
            }
            op::BINBYTES8 | op::BYTEARRAY8 => {
                let n = u64::from_le_bytes(self.fixed::<R, 8>(r)?);
                let s = self.sized(r, code, n)?.to_vec();
                let v = self.heap.new_bytes(&s);
                self.push(v)?;
            }
            _ => unreachable!("an opcode of another family"),
        }
        Ok(())
    }

    /// New containers: empty ones, and lists, tuples and dicts of what is on the stack.
    fn build(&mut self, code: u8) -> Result<(), DecodeError> {
        match code {
            op::EMPTY_LIST | op::EMPTY_SET => {
                let id = self.heap.empty_list();
                self.push(Value::List(id))?;
            }
            op::EMPTY_TUPLE => {
                let id = self.heap.new_list(Vec::new());
                self.push(Value::Tuple(id))?;
            }
            op::EMPTY_DICT => {
                let id = self.heap.empty_dict();
                self.push(Value::Dict(id))?;
            }
            op::LIST | op::FROZENSET => {
                let mut items = self.pop_mark(code)?;
                self.adopt_all(&mut items)?;
                let id = self.heap.new_list(items);
                self.push(Value::List(id))?;
            }
            op::TUPLE => {
                let mut items = self.pop_mark(code)?;
                self.adopt_all(&mut items)?;
                let id = self.heap.new_list(items);
                self.push(Value::Tuple(id))?;
            }
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = (code - op::TUPLE1 + 1) as usize;
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    return Err(self.err(DecodeErrorKind::StackUnderflow { op: op_name(code) }));
                }
                let mut items = self.stack.split_off(self.stack.len() - n);
                self.adopt_all(&mut items)?;
                let id = self.heap.new_list(items);
                self.push(Value::Tuple(id))?;
            }
            op::DICT => {
                let items = self.pop_mark(code)?;
                if !items.len().is_multiple_of(2) {
                    return Err(self.err(DecodeErrorKind::BadArgument { op: "DICT" }));
                }
                let mut pairs = Vec::with_capacity(items.len() / 2);
                for kv in items.chunks_exact(2) {
                    let v = self.adopt(Some(kv[0]), kv[1])?;
                    pairs.push((kv[0], v));
                }
                let id = self.heap.new_dict(pairs);
                self.push(Value::Dict(id))?;
            }
            _ => unreachable!("an opcode of another family"),
        }
        Ok(())
    }

    /// Items added to a list or dict already made (in a part of a split decode, to the list
    /// below the part's stack).
    fn fill<R: Read>(&mut self, r: &mut Reader<R>, code: u8) -> Result<(), DecodeError> {
        match code {
            op::APPEND => {
                if self.part.is_some() && self.stack.len() == 1 && self.marks.is_empty() {
                    self.append_below(false)?;
                    self.note_clean(r.offset());
                    return Ok(());
                }
                let item = self.pop(code)?;
                let target = self.top(code)?;
                let item = self.adopt(None, item)?;
                self.list_target(code, target)?.push(item);
            }
            op::APPENDS if self.part.is_some() && self.marks.last().is_none_or(|&m| m == 0) => {
                // to the list below this part's stack
                let first = self.marks.pop().is_none();
                self.append_below(first)?;
                self.note_clean(r.offset());
            }
            op::APPENDS | op::ADDITEMS => {
                let Some(m) = self.marks.pop() else {
                    return Err(self.err(DecodeErrorKind::NoMark { op: op_name(code) }));
                };
                let target = self.below(code, m)?;
                self.list_target(code, target)?;
                for i in m..self.stack.len() {
                    let item = self.stack[i];
                    if is_container(item) {
                        self.stack[i] = self.adopt(None, item)?;
                    }
                }
                let Value::List(r) = target else {
                    unreachable!("checked")
                };
                let (stack, heap) = (&mut self.stack, &mut self.heap);
                if let Some(list) = heap.list_mut(r) {
                    let items = &stack[m..];
                    if list.len() >= LONG_LIST {
                        list.reserve(items.len());
                        let ahead = match &mut self.appended {
                            Some((to, ahead)) if *to == r => ahead,
                            other => &mut other.insert((r, Default::default())).1,
                        };
                        ahead.before_push(list);
                    }
                    list.extend_from_slice(items);
                }
                stack.truncate(m);
            }
            op::SETITEM => {
                let v = self.pop(code)?;
                let k = self.pop(code)?;
                let target = self.top(code)?;
                self.dict_target(code, target)?;
                let v = self.adopt(Some(k), v)?;
                self.dict_target(code, target)?.push((k, v));
            }
            op::SETITEMS => {
                let Some(m) = self.marks.pop() else {
                    return Err(self.err(DecodeErrorKind::NoMark { op: op_name(code) }));
                };
                if !(self.stack.len() - m).is_multiple_of(2) {
                    return Err(self.err(DecodeErrorKind::BadArgument { op: "SETITEMS" }));
                }
                let target = self.below(code, m)?;
                self.dict_target(code, target)?;
                let mut i = m;
                while i < self.stack.len() {
                    let (k, v) = (self.stack[i], self.stack[i + 1]);
                    if is_container(v) {
                        self.stack[i + 1] = self.adopt(Some(k), v)?;
                    }
                    i += 2;
                }
                let Value::Dict(r) = target else {
                    unreachable!("checked")
                };
                let (stack, heap) = (&mut self.stack, &mut self.heap);
                if let Some(dict) = heap.dict_mut(r) {
                    dict.extend(stack[m..].chunks_exact(2).map(|kv| (kv[0], kv[1])));
                }
                stack.truncate(m);
                self.complete_top()?;
            }
            _ => unreachable!("an opcode of another family"),
        }
        Ok(())
    }

    /// The memo: values remembered and taken again.
    fn memo<R: Read>(&mut self, r: &mut Reader<R>, code: u8) -> Result<(), DecodeError> {
        match code {
            op::MEMOIZE => {
                let v = self.top(code)?;
                let index = self.memo.len() as u64;
                self.memo_put(index, v);
            }
            op::BINPUT => {
                if self.part.is_some() {
                    return Err(self.part_end());
                }
                let [i] = self.fixed::<R, 1>(r)?;
                let v = self.top(code)?;
                self.memo_put(i as u64, v);
            }
            op::LONG_BINPUT => {
                if self.part.is_some() {
                    return Err(self.part_end());
                }
                let i = u32::from_le_bytes(self.fixed::<R, 4>(r)?);
                let v = self.top(code)?;
                self.memo_put(i as u64, v);
            }
            op::PUT => {
                if self.part.is_some() {
                    return Err(self.part_end());
                }
                let i = self.text_index(r, code)?;
                let v = self.top(code)?;
                self.memo_put(i, v);
            }
            op::BINGET => {
                let [i] = self.fixed::<R, 1>(r)?;
                self.memo_get(code, i as u64)?;
            }
            op::LONG_BINGET => {
                let i = u32::from_le_bytes(self.fixed::<R, 4>(r)?);
                self.memo_get(code, i as u64)?;
            }
            op::GET => {
                let i = self.text_index(r, code)?;
                self.memo_get(code, i)?;
            }
            _ => unreachable!("an opcode of another family"),
        }
        Ok(())
    }

    /// Decodes one of the opcodes that make up nearly all of a snapshot straight from the
    /// buffered window. Returns `false` (consuming nothing) for any other opcode, or when the
    /// window is too short; the general path in [`Vm::run`] then takes it.
    #[inline(always)]
    fn fast_step<R: Read>(&mut self, r: &mut Reader<R>) -> Result<bool, DecodeError> {
        let w = r.window();
        if w.len() < 10 {
            return Ok(false);
        }
        let code = w[0];
        match code {
            op::LONG_BINGET | op::BINGET => {
                // Fetches come in runs (a stack's frames are dozens in a row): the whole run is
                // decoded here, without going back through the dispatch for each one.
                let mut pos = 0;
                let mut ops = 0u32;
                let base = r.offset();
                while let Some(&[c, a, b, d, e]) = w.get(pos..pos + 5) {
                    let long = c == op::LONG_BINGET;
                    if !long && c != op::BINGET {
                        break;
                    }
                    // The two widths mix at random (indices above and below 256): selected
                    // without a branch, which would mispredict half the time.
                    let wide = u32::from_le_bytes([a, b, d, e]);
                    let index = std::hint::select_unpredictable(long, wide, wide & 0xff) as u64;
                    let width = std::hint::select_unpredictable(long, 5, 2);
                    match self.memo.get(index) {
                        Some(v) if !is_stand_in(v) => {
                            self.values += 1;
                            self.stack.push(v);
                        }
                        found => {
                            self.offset = base + pos as u64;
                            let v = self.memo_miss(c, index, found)?;
                            self.values += 1;
                            self.stack.push(v);
                        }
                    }
                    pos += width;
                    ops += 1;
                }
                r.advance(pos);
                self.since_check += ops.saturating_sub(1);
                if self.values > self.limits.max_values {
                    self.offset = base;
                    return Err(self.too_many());
                }
            }
            op::MEMOIZE => {
                r.advance(1);
                let v = self.top(code)?;
                let index = self.memo.len() as u64;
                self.memo_put(index, v);
            }
            op::MARK => {
                r.advance(1);
                self.marks.push(self.stack.len());
            }
            op::BININT1 => {
                let b = w[1];
                r.advance(2);
                self.push(Value::Int(b as i64))?;
            }
            op::BININT => {
                let v = i32::from_le_bytes([w[1], w[2], w[3], w[4]]);
                r.advance(5);
                self.push(Value::Int(v as i64))?;
            }
            op::BININT2 => {
                let v = u16::from_le_bytes([w[1], w[2]]);
                r.advance(3);
                self.push(Value::Int(v as i64))?;
            }
            op::LONG1 if w[1] <= 8 => {
                let n = w[1] as usize;
                let v = long1(w, 2, n).expect("at most 8 bytes, in the window");
                r.advance(2 + n);
                self.push(Value::Int(v))?;
            }
            op::SHORT_BINUNICODE if w.len() >= 2 + w[1] as usize => {
                let n = w[1] as usize;
                let id = intern_utf8_at(&mut self.heap, w, 2, n);
                r.advance(2 + n);
                self.push(Value::Str(id))?;
            }
            op::EMPTY_DICT => {
                if self.flat_dict(r) {
                    return Ok(true);
                }
                r.advance(1);
                let id = self.heap.empty_dict();
                self.push(Value::Dict(id))?;
            }
            op::EMPTY_LIST => {
                r.advance(1);
                let id = self.heap.empty_list();
                self.push(Value::List(id))?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn text_int(&mut self, code: u8, text: &[u8]) -> Result<Value, DecodeError> {
        let bad = DecodeErrorKind::BadArgument { op: op_name(code) };
        let Some(s) = std::str::from_utf8(text).ok().map(str::trim) else {
            return Err(self.err(bad));
        };
        if code == op::INT && s == "00" {
            return Ok(Value::Bool(false));
        }
        if code == op::INT && s == "01" {
            return Ok(Value::Bool(true));
        }
        match s.strip_suffix('L').unwrap_or(s).parse::<i128>() {
            Ok(v) => Ok(self.heap.new_big_int(v)),
            Err(_) => Err(self.err(bad)),
        }
    }

    fn text_index<R: Read>(&self, r: &mut Reader<R>, code: u8) -> Result<u64, DecodeError> {
        let line = self.text_arg(r, code)?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| self.err(DecodeErrorKind::BadArgument { op: op_name(code) }))
    }

    fn list_target(&mut self, code: u8, target: Value) -> Result<&mut Vec<Value>, DecodeError> {
        let offset = self.offset;
        match target {
            Value::List(id) => self.heap.list_mut(id).ok_or(DecodeError {
                offset,
                kind: DecodeErrorKind::WrongType {
                    op: op_name(code),
                    expected: "a list",
                    found: "a released list",
                },
                decompressed: false,
            }),
            other => Err(DecodeError {
                offset,
                kind: DecodeErrorKind::WrongType {
                    op: op_name(code),
                    expected: "a list",
                    found: type_name(other),
                },
                decompressed: false,
            }),
        }
    }

    fn dict_target(
        &mut self,
        code: u8,
        target: Value,
    ) -> Result<&mut Vec<(Value, Value)>, DecodeError> {
        let offset = self.offset;
        match target {
            Value::Dict(id) => self.heap.dict_mut(id).ok_or(DecodeError {
                offset,
                kind: DecodeErrorKind::WrongType {
                    op: op_name(code),
                    expected: "a dict",
                    found: "a released dict",
                },
                decompressed: false,
            }),
            other => Err(DecodeError {
                offset,
                kind: DecodeErrorKind::WrongType {
                    op: op_name(code),
                    expected: "a dict",
                    found: type_name(other),
                },
                decompressed: false,
            }),
        }
    }
}

/// The `LONG1` argument of `n` bytes at `at` of `w` (little-endian two's complement), when it
/// fits in an `i64`. Read as one word where `w` has eight bytes there: a copy of `n` bytes
/// would be a call.
#[inline(always)]
fn long1(w: &[u8], at: usize, n: usize) -> Option<i64> {
    if n > 8 {
        return None;
    }
    if n == 0 {
        return Some(0);
    }
    let word = match w.get(at..at + 8) {
        Some(word) => u64::from_le_bytes(word.try_into().expect("8 bytes")),
        None => {
            let mut bytes = [0u8; 8];
            bytes[..n].copy_from_slice(w.get(at..at + n)?);
            u64::from_le_bytes(bytes)
        }
    };
    // keep the n bytes and extend their sign
    let shift = 64 - 8 * n as u32;
    Some(((word << shift) as i64) >> shift)
}

/// A memo entry that stands in for one of another part of a split decode.
#[inline(always)]
fn is_stand_in(v: Value) -> bool {
    matches!(v, Value::Handle(u8::MAX, _))
}

#[inline(always)]
fn is_container(v: Value) -> bool {
    matches!(v, Value::List(_) | Value::Dict(_) | Value::Tuple(_))
}

/// [`intern_utf8`] of the `n` bytes at `at` in the window `w` (which holds them): a short
/// string interned recently is known from its bytes at once, without checking them again.
#[inline(always)]
fn intern_utf8_at(heap: &mut Heap, w: &[u8], at: usize, n: usize) -> super::value::StrId {
    let recent = super::value::ShortKey::in_window(w, at, n).and_then(|k| heap.recent_str(k));
    match recent {
        Some(id) => id,
        None => intern_utf8(heap, &w[at..at + n]),
    }
}

fn intern_utf8(heap: &mut Heap, bytes: &[u8]) -> super::value::StrId {
    match std::str::from_utf8(bytes) {
        Ok(s) => heap.intern(s),
        // Python writes lone surrogates with 'surrogatepass'; keep the rest of the text.
        Err(_) => heap.intern(&String::from_utf8_lossy(bytes)),
    }
}

/// Decodes a protocol-0 `STRING` argument: a Python string literal in quotes.
fn unquote_py_string(line: &[u8]) -> Option<String> {
    let q = *line.first()?;
    if !(q == b'\'' || q == b'"') || line.len() < 2 || *line.last()? != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = String::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b != b'\\' {
            out.push(b as char);
            i += 1;
            continue;
        }
        let e = *body.get(i + 1)?;
        i += 2;
        match e {
            b'n' => out.push('\n'),
            b't' => out.push('\t'),
            b'r' => out.push('\r'),
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut k = 0;
                while k < 2 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + (body[i] - b'0') as u32;
                    i += 1;
                    k += 1;
                }
                out.push(char::from_u32(v & 0xff)?);
            }
            b'x' => {
                let hex = std::str::from_utf8(body.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()? as char);
                i += 2;
            }
            other => out.push(other as char),
        }
    }
    Some(out)
}

/// Decodes a protocol-0 `UNICODE` argument (Python's raw-unicode-escape codec).
fn raw_unicode_unescape(line: &[u8]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        if line[i] == b'\\' && i + 1 < line.len() && (line[i + 1] == b'u' || line[i + 1] == b'U') {
            let width = if line[i + 1] == b'u' { 4 } else { 8 };
            let digits = line
                .get(i + 2..i + 2 + width)
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(|d| u32::from_str_radix(d, 16).ok());
            if let Some(c) = digits.and_then(char::from_u32) {
                out.push(c);
                i += 2 + width;
                continue;
            }
        }
        out.push(line[i] as char);
        i += 1;
    }
    out
}

/// What a file that is not a pickle looks like, from its first bytes: the formats a snapshot
/// is confused with (a `torch.save` archive, memsnap's or PyTorch's own outputs), else text or
/// binary data.
pub(crate) fn what_it_is(head: &[u8]) -> &'static str {
    const KNOWN: &[(&[u8], &str)] = &[
        (
            b"PK\x03\x04",
            "a zip archive, as torch.save writes (a model or tensors, not a memory snapshot)",
        ),
        (b"\x89PNG", "a PNG image"),
        (b"GIF8", "a GIF image"),
        (b"\xff\xd8\xff", "a JPEG image"),
        (b"%PDF", "a PDF document"),
        (b"<svg", "an SVG image"),
        (b"\x7fELF", "a program (ELF)"),
        (b"PAR1", "a Parquet table"),
        (b"SQLite format 3", "an SQLite database"),
    ];
    if let Some((_, what)) = KNOWN.iter().find(|(magic, _)| head.starts_with(magic)) {
        return what;
    }
    let text = head.trim_ascii_start();
    let lower: Vec<u8> = text.iter().take(16).map(u8::to_ascii_lowercase).collect();
    if lower.starts_with(b"<!doctype html") || lower.starts_with(b"<html") {
        return "an HTML page (memsnap view or PyTorch's memory viewer write these; read the snapshot they came from)";
    }
    if text.starts_with(b"<") {
        return "XML or HTML text";
    }
    if text.starts_with(b"{") || text.starts_with(b"[") {
        return "JSON text (memsnap's --json output, a summary or a trace, not a snapshot)";
    }
    let printable = head
        .iter()
        .filter(|&&b| {
            b == b'\n' || b == b'\r' || b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80
        })
        .count();
    // a character cut at the end of the head is still text
    let utf8 = std::str::from_utf8(head).map_or_else(|e| e.error_len().is_none(), |_| true);
    if !head.is_empty() && printable == head.len() && utf8 {
        return "text";
    }
    "binary data of another kind"
}

//! Building a [`Snapshot`] from what the decoder leaves: the top-level dict, segments and
//! blocks, settings, and the rows the compactor ([`super::compact`]) made of the trace.
//!
//! [`assemble`] reads those values with [`Reader`], which checks every field's type and names
//! the field when one is wrong, and cuts each device's rows out of the compactor's table;
//! [`from_pickle`] is the whole path for one stream. Opening files, sniffing their compression
//! and choosing between one decoder and several parts is [`super::load`]'s.

use super::compact::*;
use super::*;
use std::io::Read;

use crate::pickle::{self, Decoded, FieldError, Heap, Limits, Ref, Value};
use crate::ErrorKind;

/// The longest text of `allocator_settings` that is read (a `PYTORCH_CUDA_ALLOC_CONF` is a few
/// dozen bytes).
pub(super) const MAX_SETTING_BYTES: usize = 4096;

/// Reads the small remainder of the value tree (segments, settings, annotations) into a
/// [`Snapshot`], taking the trace rows the compactor made.
pub(super) struct Reader<'a> {
    heap: &'a Heap,
    compactor: &'a mut EntryCompactor,
    /// Segment and block dicts already read: PyTorch writes each once, and a pickle that
    /// shares one many times (n segments sharing a list of n blocks) would cost n² to expand.
    seen: rustc_hash::FxHashSet<u64>,
}

impl Reader<'_> {
    /// Refuses a segment or block dict that was already read.
    fn once(&mut self, d: Ref, ctx: &str) -> Result<(), FieldError> {
        if self.seen.insert(d.pack()) {
            Ok(())
        } else {
            Err(FieldError::new(
                ctx,
                "an object listed twice",
                "each segment and block once (as PyTorch writes them)",
            ))
        }
    }

    fn key(&self, d: Ref, name: &str) -> Option<Value> {
        self.heap
            .lookup(name)
            .and_then(|k| self.heap.dict_get(d, k))
    }

    fn int_field(&self, d: Ref, name: &str, ctx: &str) -> Result<Option<i128>, FieldError> {
        match self.key(d, name) {
            None | Some(Value::None) => Ok(None),
            Some(v) => self
                .heap
                .int(v)
                .map(Some)
                .ok_or_else(|| FieldError::new(format!("{ctx}.{name}"), describe(v), "an int")),
        }
    }

    fn u64_field(&self, d: Ref, name: &str, ctx: &str) -> Result<Option<u64>, FieldError> {
        self.int_field(d, name, ctx)?
            .map(|i| {
                u64::try_from(i)
                    .map_err(|_| FieldError::new(format!("{ctx}.{name}"), i.to_string(), "a size"))
            })
            .transpose()
    }

    /// A byte count of a segment or block: no GPU holds more than 2^48 bytes (256 TiB), and
    /// keeping sizes below that keeps every sum of them exact.
    fn size_field(&self, d: Ref, name: &str, ctx: &str) -> Result<Option<u64>, FieldError> {
        match self.u64_field(d, name, ctx)? {
            Some(v) if v > MAX_REAL_SIZE => Err(FieldError::new(
                format!("{ctx}.{name}"),
                v.to_string(),
                "a size below 2^48 bytes (256 TiB)",
            )),
            other => Ok(other),
        }
    }

    fn list_items(&self, v: Value, ctx: &str) -> Result<&[Value], FieldError> {
        match v {
            Value::List(l) | Value::Tuple(l) => Ok(self.heap.list(l)),
            other => Err(FieldError::new(ctx, describe(other), "a list")),
        }
    }

    fn dict_id(&self, v: Value, ctx: &str) -> Result<Ref, FieldError> {
        match v {
            Value::Dict(d) => Ok(d),
            other => Err(FieldError::new(ctx, describe(other), "a dict")),
        }
    }

    fn stack_field(&mut self, d: Ref) -> StackId {
        match self.key(d, "frames") {
            Some(v) => self.compactor.stack_of(self.heap, v).unwrap_or_default(),
            None => StackId::EMPTY,
        }
    }

    /// A segment of `segments` (or, with `host`, of `host_segments`: pinned host memory,
    /// whose segments belong to [`HOST_DEVICE`] whatever their `device` says).
    fn segment(&mut self, v: Value, i: usize, host: bool) -> Result<Segment, FieldError> {
        let ctx = if host {
            format!("host_segments[{i}]")
        } else {
            format!("segments[{i}]")
        };
        let d = self.dict_id(v, &ctx)?;
        self.once(d, &ctx)?;
        let address = self.u64_field(d, "address", &ctx)?.unwrap_or(0);
        // PyTorch writes every segment with its size: a dict without one (an empty dict, one
        // of a million) is refused here, before anything is built for it
        let total_size = self.size_field(d, "total_size", &ctx)?.ok_or_else(|| {
            FieldError::new(ctx.as_str(), "a dict without 'total_size'", "a segment")
        })?;
        let segment_type = match self.key(d, "segment_type").and_then(|v| self.heap.text(v)) {
            Some("small") => SegmentType::Small,
            Some(_) => SegmentType::Large,
            None if total_size == 2 << 20 => SegmentType::Small,
            None => SegmentType::Large,
        };
        let pool_id = match self.key(d, "segment_pool_id") {
            Some(Value::Tuple(t)) | Some(Value::List(t)) => {
                let items = self.heap.list(t);
                let get = |k: usize| {
                    items
                        .get(k)
                        .and_then(|&v| self.heap.int(v))
                        .and_then(|i| i64::try_from(i).ok())
                        .unwrap_or(0)
                };
                (get(0), get(1))
            }
            _ => (0, 0),
        };
        let is_expandable = matches!(self.key(d, "is_expandable"), Some(Value::Bool(true)));
        let stack = self.stack_field(d);
        let mut blocks = Vec::new();
        if let Some(bv) = self.key(d, "blocks") {
            let items = self.list_items(bv, &format!("{ctx}.blocks"))?.to_vec();
            let mut cursor = address;
            for (j, b) in items.into_iter().enumerate() {
                let block = self.block(b, &format!("{ctx}.blocks[{j}]"), cursor)?;
                cursor = block.address.saturating_add(block.size);
                blocks.push(block);
            }
        }
        let device = match self.int_field(d, "device", &ctx)? {
            _ if host => HOST_DEVICE,
            None => 0,
            Some(i) => match u32::try_from(i) {
                Ok(device) if device <= MAX_DEVICE => device,
                _ => {
                    return Err(FieldError::new(
                        format!("{ctx}.device"),
                        i.to_string(),
                        "a CUDA device index (0 to 127)",
                    ))
                }
            },
        };
        Ok(Segment {
            device,
            address,
            total_size,
            stream: self
                .int_field(d, "stream", &ctx)?
                .map(|i| i as i64)
                .unwrap_or(0),
            segment_type,
            pool_id,
            is_expandable,
            stack,
            blocks,
        })
    }

    fn block(&mut self, v: Value, ctx: &str, cursor: u64) -> Result<Block, FieldError> {
        let d = self.dict_id(v, ctx)?;
        self.once(d, ctx)?;
        let size = self
            .size_field(d, "size", ctx)?
            .ok_or_else(|| FieldError::new(ctx, "a dict without 'size'", "a block"))?;
        let state = match self.key(d, "state").and_then(|v| self.heap.text(v)) {
            Some("active_allocated") => BlockState::ActiveAllocated,
            Some("active_pending_free") | Some("active_awaiting_free") => {
                BlockState::ActivePendingFree
            }
            _ => BlockState::Inactive,
        };
        let mut stack = self.stack_field(d);
        let mut requested = self.size_field(d, "requested_size", ctx)?;
        // torch 2.0: the allocation stack and request live in history[0].
        if let Some(Value::List(h)) = self.key(d, "history") {
            if let Some(&Value::Dict(first)) = self.heap.list(h).first() {
                if stack == StackId::EMPTY {
                    stack = self.stack_field(first);
                }
                if requested.is_none() {
                    requested = self.u64_field(first, "real_size", ctx)?;
                }
            }
        }
        Ok(Block {
            address: self.u64_field(d, "address", ctx)?.unwrap_or(cursor),
            size,
            requested_size: requested.unwrap_or(size),
            state,
            stack,
        })
    }

    fn annotation(&self, v: Value, i: usize) -> Result<Annotation, FieldError> {
        let ctx = format!("external_annotations[{i}]");
        let d = self.dict_id(v, &ctx)?;
        let stage = match self.key(d, "stage").and_then(|v| self.heap.text(v)) {
            Some("END") => Stage::End,
            _ => Stage::Start,
        };
        Ok(Annotation {
            stage,
            name: self.key(d, "name").and_then(str_id).unwrap_or_default(),
            device: self
                .int_field(d, "device", &ctx)?
                .map(|i| i as i64)
                .unwrap_or(0),
            time_us: self
                .int_field(d, "time_us", &ctx)?
                .map(|i| i as i64)
                .unwrap_or(0),
        })
    }

    /// Allocator settings: a text value longer than [`MAX_SETTING_BYTES`] is kept as its
    /// length only.
    fn settings(&self, v: Value) -> Result<AllocatorSettings, FieldError> {
        let d = self.dict_id(v, "allocator_settings")?;
        let mut s = AllocatorSettings::default();
        for &(k, val) in self.heap.dict(d) {
            let Some(key) = self.heap.text(k) else {
                continue;
            };
            let long = self.heap.text(val).map_or(0, str::len);
            if long > MAX_SETTING_BYTES {
                // No allocator reads a setting this long: kept as its length, never parsed.
                s.entries
                    .push((key.to_string(), format!("<text of {long} bytes, not read>")));
                continue;
            }
            s.entries.push((key.to_string(), self.heap.render(val, 2)));
            match key {
                "PYTORCH_CUDA_ALLOC_CONF" => {
                    s.alloc_conf = self.heap.text(val).unwrap_or("").to_string()
                }
                "max_split_size" => {
                    s.max_split_size = self
                        .heap
                        .int(val)
                        .filter(|&i| i > 0 && i < u64::MAX as i128)
                        .map(|i| i as u64)
                }
                "expandable_segments" => s.expandable_segments = val == Value::Bool(true),
                "garbage_collection_threshold" => {
                    s.garbage_collection_threshold = match val {
                        Value::Float(f) if f.is_finite() => f,
                        other => self.heap.int(other).map_or(0.0, |i| i as f64),
                    }
                }
                "trace_alloc_overflowed" => {
                    s.trace_overflowed = match val {
                        Value::Bool(b) => Some(b),
                        _ => None,
                    }
                }
                "roundup_power2_divisions" => s.roundup_power2_divisions = self.divisions(val),
                _ => {}
            }
        }
        Ok(s)
    }

    /// `roundup_power2_divisions`: a dict keyed by interval start in MiB ("1", "2", ...
    /// "32768"), or a plain list in interval order.
    fn divisions(&self, v: Value) -> [u64; 16] {
        let mut out = [0u64; 16];
        match v {
            Value::Dict(d) => {
                for &(k, val) in self.heap.dict(d) {
                    let mb = self
                        .heap
                        .text(k)
                        .and_then(|t| t.parse::<u64>().ok())
                        .or_else(|| self.heap.int(k).and_then(|i| u64::try_from(i).ok()));
                    if let (Some(mb), Some(n)) = (mb, self.heap.int(val)) {
                        if mb.is_power_of_two() && mb.trailing_zeros() < 16 {
                            out[mb.trailing_zeros() as usize] = n.max(0) as u64;
                        }
                    }
                }
            }
            Value::List(l) => {
                for (i, &val) in self.heap.list(l).iter().take(16).enumerate() {
                    out[i] = self.heap.int(val).unwrap_or(0).max(0) as u64;
                }
            }
            _ => {}
        }
        out
    }
}

/// Moves each device's rows out of the compactor's table, refusing shared entries.
pub(super) fn take_traces(
    heap: &Heap,
    compactor: &mut EntryCompactor,
    lists: &[Value],
) -> Result<Vec<Vec<TraceEvent>>, FieldError> {
    if let Some(runs) = row_runs(heap, lists, compactor.events.len()) {
        return Ok(split_runs(std::mem::take(&mut compactor.events), &runs));
    }
    let mut ids: Vec<Vec<u32>> = Vec::with_capacity(lists.len());
    // Each entry may be listed once: a list that repeats one (or one list given for several
    // devices) is refused at its first repeat, before anything is copied.
    let mut taken = vec![false; compactor.events.len()];
    let twice = || {
        FieldError::new(
            "device_traces",
            "a list holding one trace entry twice",
            "each entry once (as PyTorch writes them)",
        )
    };
    for (dev, &list) in lists.iter().enumerate() {
        let items = match list {
            Value::List(l) | Value::Tuple(l) => heap.list(l),
            other => {
                return Err(FieldError::new(
                    format!("device_traces[{dev}]"),
                    describe(other),
                    "a list",
                ))
            }
        };
        let mut rows = Vec::with_capacity(items.len().min(taken.len() + 1));
        for (i, &item) in items.iter().enumerate() {
            let row = match heap.forwarded(item).unwrap_or(item) {
                Value::Handle(EVENT, r) => r,
                Value::Dict(d) => {
                    // A dict completed after it was stored (never from PyTorch): convert now;
                    // one without an action is no trace entry.
                    if !heap
                        .dict(d)
                        .iter()
                        .any(|&(k, _)| k == Value::Str(StrId(super::compact::K_ACTION)))
                    {
                        return Err(FieldError::new(
                            format!("device_traces[{dev}][{i}]"),
                            "a dict without 'action'",
                            "a trace entry",
                        ));
                    }
                    let ev = compactor.event_of(heap, d)?;
                    compactor.events.push(ev);
                    taken.push(false);
                    (compactor.events.len() - 1) as u32
                }
                other => {
                    return Err(FieldError::new(
                        format!("device_traces[{dev}][{i}]"),
                        describe(other),
                        "a trace entry dict",
                    ))
                }
            };
            let slot = taken
                .get_mut(row as usize)
                .ok_or_else(|| FieldError::new("device_traces", "out of range", "a trace entry"))?;
            if std::mem::replace(slot, true) {
                return Err(twice());
            }
            rows.push(row);
        }
        ids.push(rows);
    }
    drop(taken);
    let events = std::mem::take(&mut compactor.events);
    Ok(ids
        .iter()
        .map(|rows| rows.iter().map(|&r| events[r as usize]).collect())
        .collect())
}

/// The usual case, told without a pass that marks each row: every device's list holds rows
/// of the table that follow one another, and no two lists share a row. Gives each list's
/// first row and length; `None` for anything else (which [`take_traces`] then checks row by
/// row, to say what is wrong where).
pub(super) fn row_runs(heap: &Heap, lists: &[Value], rows: usize) -> Option<Vec<(usize, usize)>> {
    let mut runs = Vec::with_capacity(lists.len());
    for &list in lists {
        let (Value::List(l) | Value::Tuple(l)) = list else {
            return None;
        };
        let items = heap.list(l);
        let first = match items.first() {
            Some(&Value::Handle(EVENT, r)) => r as usize,
            Some(_) => return None,
            None => 0,
        };
        let in_order = items
            .iter()
            .zip(first..)
            .all(|(&item, row)| matches!(item, Value::Handle(EVENT, r) if r as usize == row));
        if !in_order || first.checked_add(items.len())? > rows {
            return None;
        }
        runs.push((first, items.len()));
    }
    let mut by_start: Vec<&(usize, usize)> = runs.iter().filter(|r| r.1 > 0).collect();
    by_start.sort_unstable();
    let apart = by_start.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0);
    apart.then_some(runs)
}

/// Cuts the table into the devices' runs ([`row_runs`]) without copying a row.
pub(super) fn split_runs(events: Vec<TraceEvent>, runs: &[(usize, usize)]) -> Vec<Vec<TraceEvent>> {
    let mut order: Vec<usize> = (0..runs.len()).filter(|&d| runs[d].1 > 0).collect();
    order.sort_by_key(|&d| std::cmp::Reverse(runs[d].0));
    let mut rest = events;
    let mut out: Vec<Vec<TraceEvent>> = vec![Vec::new(); runs.len()];
    for d in order {
        let (start, len) = runs[d];
        let mut tail = if start == 0 {
            std::mem::take(&mut rest)
        } else {
            rest.split_off(start)
        };
        tail.truncate(len);
        tail.shrink_to_fit();
        out[d] = tail;
    }
    out
}

/// The whole decoded snapshot as text, ids included: two decodings that must agree (in parts
/// and in one piece, entries read whole or opcode by opcode) agree on this.
pub(crate) fn everything(snap: &Snapshot) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        snap.segments,
        snap.traces,
        snap.streams,
        snap.event_extras,
        snap.annotations,
        snap.settings,
        snap.strings,
        snap.stacks,
        snap.forward_frames,
        snap.source.unknown_actions
    )
}

/// Decodes a plain pickle with trace entries read whole and opcode by opcode, and says where
/// the two differ: the snapshot, or the error, must be the same. `Ok` tells how many entries
/// were read whole. For tests and fuzzing.
#[doc(hidden)]
pub fn flat_agrees(pickle_bytes: &[u8]) -> Result<u64, String> {
    let limits = Limits {
        max_string_bytes: 1 << 20,
        ..Limits::default()
    };
    let mut fast = EntryCompactor::new();
    let fast = match pickle::decode_with(pickle_bytes, limits, &mut fast) {
        Ok(decoded) => {
            let read_whole = fast.read_whole;
            assemble(decoded, fast).map(|snap| (snap, read_whole))
        }
        Err(e) => Err(ErrorKind::Decode(e)),
    };
    let mut slow = OpcodeByOpcode(EntryCompactor::new());
    let slow = match pickle::decode_with(pickle_bytes, limits, &mut slow) {
        Ok(decoded) => assemble(decoded, slow.0),
        Err(e) => Err(ErrorKind::Decode(e)),
    };
    match (fast, slow) {
        (Ok((a, n)), Ok(b)) if everything(&a) == everything(&b) => Ok(n),
        (Err(a), Err(b)) if a.to_string() == b.to_string() => Ok(0),
        (Ok(_), Ok(_)) => Err("entries read whole give another snapshot".into()),
        (a, b) => Err(format!(
            "read whole: {}; opcode by opcode: {}",
            a.map_or_else(|e| e.to_string(), |_| "a snapshot".into()),
            b.map_or_else(|e| e.to_string(), |_| "a snapshot".into()),
        )),
    }
}

/// The snapshot's top-level fields, found in the decoded root.
struct Fields {
    segments: Option<Value>,
    traces: Option<Value>,
    settings: Option<Value>,
    annotations: Option<Value>,
    host_segments: Option<Value>,
    host_traces: Option<Value>,
    /// The root is a bare list of segments (`torch.cuda.memory_snapshot()`).
    segments_only: bool,
}

impl Fields {
    /// The fields of `root`: a dict with `segments` or `device_traces`, or a list of segments.
    fn of(heap: &Heap, root: Value) -> Result<Fields, ErrorKind> {
        match root {
            Value::Dict(d) => {
                let get = |name: &str| heap.lookup(name).and_then(|k| heap.dict_get(d, k));
                let (segments, traces) = (get("segments"), get("device_traces"));
                if segments.is_none() && traces.is_none() {
                    let keys: Vec<String> = heap
                        .dict(d)
                        .iter()
                        .take(5)
                        .map(|&(k, _)| heap.render(k, 0))
                        .collect();
                    return Err(ErrorKind::NotASnapshot(format!(
                        "a dict without 'segments' or 'device_traces' (keys: {})",
                        keys.join(", ")
                    )));
                }
                Ok(Fields {
                    segments,
                    traces,
                    settings: get("allocator_settings"),
                    annotations: get("external_annotations"),
                    host_segments: get("host_segments"),
                    host_traces: get("host_traces"),
                    segments_only: false,
                })
            }
            Value::List(_) => Ok(Fields {
                segments: Some(root),
                traces: None,
                settings: None,
                annotations: None,
                host_segments: None,
                host_traces: None,
                segments_only: true,
            }),
            other => Err(ErrorKind::NotASnapshot(format!(
                "the pickle holds {}, not a dict with 'segments' and 'device_traces'",
                describe(other)
            ))),
        }
    }
}

/// Builds a snapshot from a decoded pickle whose entries `compactor` has already compacted.
pub(crate) fn assemble(
    mut decoded: Decoded,
    mut compactor: EntryCompactor,
) -> Result<Snapshot, ErrorKind> {
    let heap = &decoded.heap;
    let mut snap = Snapshot::default();
    let fields = Fields::of(heap, decoded.root)?;
    let mut reader = Reader {
        heap,
        compactor: &mut compactor,
        seen: Default::default(),
    };
    if let Some(v) = fields.segments {
        snap.segments = read_segments(&mut reader, v, fields.segments_only)?;
    }
    read_annotations_and_settings(&mut reader, &fields, &mut snap)?;
    if let Some(v) = fields.host_segments {
        let items = reader
            .list_items(v, "host_segments")
            .map_err(ErrorKind::Invalid)?
            .to_vec();
        for (i, s) in items.into_iter().enumerate() {
            snap.segments
                .push(reader.segment(s, i, true).map_err(ErrorKind::Invalid)?);
        }
    }
    if fields.traces.is_some() || fields.host_traces.is_some() {
        snap.traces = read_traces(&mut reader, &fields)?;
    }
    finish(
        &mut snap,
        &mut decoded,
        &mut compactor,
        fields.segments_only,
    );
    Ok(snap)
}

/// The segments, their blocks, and at most 2^52 bytes on a device.
fn read_segments(
    reader: &mut Reader,
    v: Value,
    segments_only: bool,
) -> Result<Vec<Segment>, ErrorKind> {
    let invalid = ErrorKind::Invalid;
    let items = reader.list_items(v, "segments").map_err(invalid)?.to_vec();
    if segments_only {
        if let Some(&first) = items.first() {
            if !matches!(first, Value::Dict(_)) {
                return Err(ErrorKind::NotASnapshot(format!(
                    "a list of {}, not a list of segments",
                    describe(first)
                )));
            }
        }
    }
    let mut segments = Vec::new();
    let mut per_device: rustc_hash::FxHashMap<u32, u64> = Default::default();
    for (i, s) in items.into_iter().enumerate() {
        let seg = reader.segment(s, i, false).map_err(invalid)?;
        let blocks = seg
            .blocks
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(b.size));
        let total = per_device.entry(seg.device).or_default();
        *total = total.saturating_add(seg.total_size.max(blocks));
        if *total > MAX_REAL_TOTAL {
            return Err(invalid(FieldError::new(
                format!("segments[..={i}]"),
                format!("more than 2^52 bytes on device {}", seg.device),
                "what a GPU can hold",
            )));
        }
        segments.push(seg);
    }
    Ok(segments)
}

/// `external_annotations` and `allocator_settings`.
fn read_annotations_and_settings(
    reader: &mut Reader,
    fields: &Fields,
    snap: &mut Snapshot,
) -> Result<(), ErrorKind> {
    let invalid = ErrorKind::Invalid;
    if let Some(v) = fields.annotations {
        let items = reader
            .list_items(v, "external_annotations")
            .map_err(invalid)?
            .to_vec();
        for (i, a) in items.into_iter().enumerate() {
            snap.annotations
                .push(reader.annotation(a, i).map_err(invalid)?);
        }
    }
    if let Some(v) = fields.settings {
        if v != Value::None {
            snap.settings = Some(reader.settings(v).map_err(invalid)?);
        }
    }
    Ok(())
}

/// The trace of each device, and pinned host memory's as device [`HOST_DEVICE`].
fn read_traces(reader: &mut Reader, fields: &Fields) -> Result<Vec<Vec<TraceEvent>>, ErrorKind> {
    let invalid = ErrorKind::Invalid;
    let mut lists = match fields.traces {
        Some(v) => reader
            .list_items(v, "device_traces")
            .map_err(invalid)?
            .to_vec(),
        None => Vec::new(),
    };
    let devices = lists.len();
    if let Some(v) = fields.host_traces {
        // one list of entries (or, read as well, one list of entries per list)
        let items = reader
            .list_items(v, "host_traces")
            .map_err(invalid)?
            .to_vec();
        if items
            .iter()
            .all(|&i| matches!(i, Value::List(_) | Value::Tuple(_)))
            && !items.is_empty()
        {
            lists.extend(items);
        } else {
            lists.push(v);
        }
        if devices > HOST_DEVICE as usize {
            return Err(invalid(FieldError::new(
                "device_traces",
                format!("{devices} device lists beside host_traces"),
                "at most 128 devices",
            )));
        }
    }
    let mut all = take_traces(reader.heap, reader.compactor, &lists).map_err(invalid)?;
    if all.len() > devices {
        let host_trace: Vec<TraceEvent> = all.drain(devices..).flatten().collect();
        all.resize_with(HOST_DEVICE as usize + 1, Vec::new);
        all[HOST_DEVICE as usize] = host_trace;
    }
    Ok(all)
}

/// The source's figures, times no clock gives, and the frames, stacks and strings moved in.
fn finish(
    snap: &mut Snapshot,
    decoded: &mut Decoded,
    compactor: &mut EntryCompactor,
    segments_only: bool,
) {
    snap.source.protocol = decoded.protocol;
    snap.source.pickle_bytes = decoded.bytes_read;
    snap.source.segments_only = segments_only;
    // of the rows the traces list (a dict converted but never listed is not in the trace)
    snap.source.unknown_actions = snap
        .traces
        .iter()
        .flatten()
        .filter(|e| e.action == Action::Unknown)
        .count() as u64;
    snap.impossible_times = snap
        .traces
        .iter_mut()
        .map(|t| drop_impossible_times(t))
        .collect();
    snap.forward_frames = std::mem::take(&mut compactor.forward_frames);
    snap.streams = std::mem::take(&mut compactor.streams);
    snap.event_extras = std::mem::take(&mut compactor.extras);
    snap.stacks = std::mem::take(&mut compactor.stacks);
    snap.stacks.freeze();
    snap.strings = decoded.heap.take_strings();
}

/// The highest CUDA device index (PyTorch's `DeviceIndex` is a signed byte).
pub const MAX_DEVICE: u32 = 127;

pub use crate::units::HOST_DEVICE;

// pinned host memory is one past the highest CUDA device
const _: () = assert!(HOST_DEVICE == MAX_DEVICE + 1);

/// The latest trace time taken as real: 2^53 µs after the epoch, in the year 2255. PyTorch
/// records microseconds since the epoch, so a negative time or one past this is no moment.
pub const MAX_TIME_US: i64 = 1 << 53;

/// Sets the times no clock gave (negative, or past [`MAX_TIME_US`]) to 0, "no time", as an
/// entry without `time_us` has, so no span, axis or window is stretched by them; returns how
/// many there were.
fn drop_impossible_times(events: &mut [TraceEvent]) -> u64 {
    let mut dropped = 0;
    for e in events
        .iter_mut()
        .filter(|e| !(0..=MAX_TIME_US).contains(&e.time_us))
    {
        e.time_us = 0;
        dropped += 1;
    }
    dropped
}

/// Decodes a snapshot from an uncompressed pickle stream.
pub fn from_pickle<R: Read>(input: R, limits: Limits) -> Result<Snapshot, ErrorKind> {
    let mut compactor = EntryCompactor::new();
    let decoded = pickle::decode_with(input, limits, &mut compactor).map_err(ErrorKind::Decode)?;
    assemble(decoded, compactor)
}

/// Decodes a snapshot from an opened input (`pickle::source::open_reader`).
pub(crate) fn from_stream(
    input: pickle::source::Stream,
    limits: Limits,
) -> Result<Snapshot, ErrorKind> {
    let mut compactor = EntryCompactor::new();
    let decoded =
        pickle::decode_stream(input, limits, &mut compactor).map_err(ErrorKind::Decode)?;
    assemble(decoded, compactor)
}

#[cfg(test)]
pub(crate) mod read_whole_tests {
    use super::super::compact::*;
    use super::*;
    use crate::pickle::opcodes as op;
    use std::io::Read;

    /// Every snapshot at hand, by path, decompressed one at a time as the iterator is
    /// advanced: the project's test data, and the shared recordings when present (required
    /// where `CI` is set).
    pub(crate) fn every_snapshot() -> impl Iterator<Item = (String, Vec<u8>)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut folders = vec![root.join("testdata/snapshots")];
        let shared = root.join("../shared/snapshots");
        if shared.is_dir() {
            folders.push(shared);
        } else {
            assert!(
                std::env::var_os("CI").is_none(),
                "../shared/snapshots is missing"
            );
            eprintln!("skipping the shared snapshots: ../shared/snapshots not found");
        }
        let mut paths = Vec::new();
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.to_string_lossy().contains(".pickle")
                    && !crate::snapshot::probes::is_side_file(&path)
                {
                    paths.push(path);
                }
            }
        }
        paths.sort();
        paths.into_iter().map(|path| {
            let file = std::fs::File::open(&path).unwrap();
            let (mut r, _) = pickle::source::decompressing(file).unwrap();
            let mut bytes = Vec::new();
            r.read_to_end(&mut bytes).unwrap();
            (path.display().to_string(), bytes)
        })
    }

    /// Entries with a pool id (torch 2.12+: a tuple of two integers each) are read whole too,
    /// with the pool the general path reads.
    #[test]
    fn entries_with_pool_ids_are_read_whole() {
        let (name, bytes) = every_snapshot()
            .find(|(name, _)| name.ends_with("pools_expandable_pool_ids.pickle.xz"))
            .expect("the constructed fixture");
        let snap = from_pickle(&bytes[..], Limits::default()).unwrap();
        let events = snap.traces[0].len();
        assert!(events > 200, "{name}");
        let private = snap.traces[0]
            .iter()
            .filter(|e| e.pool.is_private())
            .count();
        assert!(private > 50, "{private} entries in private pools");
        assert!(snap.traces[0]
            .iter()
            .all(|e| e.pool != crate::snapshot::PoolId::UNKNOWN));
        assert_eq!(flat_agrees(&bytes), Ok(events as u64), "{name}");
    }

    #[test]
    fn entries_read_whole_give_what_opcode_by_opcode_gives() {
        let mut read_whole = 0;
        for (name, bytes) in every_snapshot() {
            let n = flat_agrees(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            read_whole += n;
            // the large recordings are read (nearly) entirely on the fast path
            let events: usize = match from_pickle(&bytes[..], Limits::default()) {
                Ok(snap) => snap.traces.iter().map(Vec::len).sum(),
                Err(_) => 0,
            };
            if events >= 10_000 {
                assert!(
                    n as f64 >= 0.99 * events as f64,
                    "{name}: {n} of {events} entries read whole"
                );
            }
        }
        assert!(read_whole > 0);
    }

    /// Writes protocol-4 pickles by hand, memoizing every string and container.
    #[derive(Default)]
    struct Writer {
        bytes: Vec<u8>,
        memo: u32,
        strings: std::collections::HashMap<String, u32>,
    }

    impl Writer {
        fn op(&mut self, bytes: &[u8]) {
            self.bytes.extend_from_slice(bytes);
        }

        fn memoize(&mut self) -> u32 {
            self.op(&[op::MEMOIZE]);
            self.memo += 1;
            self.memo - 1
        }

        fn get(&mut self, index: u32) {
            match u8::try_from(index) {
                Ok(i) => self.op(&[op::BINGET, i]),
                Err(_) => {
                    self.op(&[op::LONG_BINGET]);
                    self.op(&index.to_le_bytes());
                }
            }
        }

        /// A string: written and memoized the first time, fetched after.
        fn str(&mut self, s: &str) {
            if let Some(&i) = self.strings.get(s) {
                return self.get(i);
            }
            self.op(&[op::SHORT_BINUNICODE, s.len() as u8]);
            self.op(s.as_bytes());
            let i = self.memoize();
            self.strings.insert(s.into(), i);
        }

        fn int(&mut self, v: i32) {
            self.op(&[op::BININT]);
            self.op(&v.to_le_bytes());
        }

        /// A frame dict; returns its memo index.
        fn frame(&mut self, name: &str, line: i32) -> u32 {
            self.op(&[op::EMPTY_DICT]);
            let i = self.memoize();
            self.op(&[op::MARK]);
            for (key, value) in [("name", name), ("filename", "model.py")] {
                self.str(key);
                self.str(value);
            }
            self.str("line");
            self.int(line);
            self.op(&[op::SETITEMS]);
            i
        }

        /// A trace entry of 512 bytes allocated at `addr` whose frame list is written by
        /// `frames`.
        fn entry(&mut self, addr: i32, frames: impl FnOnce(&mut Writer)) {
            self.entry_with(
                |w| {
                    w.str("action");
                    w.str("alloc");
                    w.str("addr");
                    w.int(addr);
                    w.str("size");
                    w.int(512);
                },
                frames,
            );
        }

        /// A trace entry whose pairs before its frame list are written by `pairs`, and the
        /// list's items by `frames`.
        fn entry_with(
            &mut self,
            pairs: impl FnOnce(&mut Writer),
            frames: impl FnOnce(&mut Writer),
        ) {
            self.op(&[op::EMPTY_DICT]);
            self.memoize();
            self.op(&[op::MARK]);
            pairs(self);
            self.str("frames");
            self.op(&[op::EMPTY_LIST]);
            self.memoize();
            self.op(&[op::MARK]);
            frames(self);
            self.op(&[op::APPENDS, op::SETITEMS]);
        }
    }

    /// A snapshot up to the open batch of device 0's trace entries.
    fn trace_head() -> Writer {
        let mut w = Writer::default();
        w.op(&[op::PROTO, 4, op::EMPTY_DICT]);
        w.memoize();
        w.op(&[op::MARK]);
        w.str("segments");
        w.op(&[op::EMPTY_LIST]);
        w.memoize();
        w.str("device_traces");
        w.op(&[op::EMPTY_LIST]);
        w.memoize();
        w.op(&[op::MARK, op::EMPTY_LIST]);
        w.memoize();
        w.op(&[op::MARK]);
        w
    }

    /// Closes what [`trace_head`] opened.
    const TRACE_TAIL: [u8; 4] = [op::APPENDS, op::APPENDS, op::SETITEMS, op::STOP];

    #[test]
    fn a_frame_list_seen_before_is_read_again_once_its_memo_changed() {
        let mut w = trace_head();
        let (mut a, mut b) = (0, 0);
        w.entry(0x1000, |w| {
            a = w.frame("A", 1);
            b = w.frame("B", 2);
        });
        // the same fetches three times: read, then seen
        for addr in [0x2000, 0x3000] {
            w.entry(addr, |w| {
                w.get(a);
                w.get(b);
            });
        }
        // frame A's memo entry now holds frame B
        w.get(b);
        w.op(&[op::BINPUT, a as u8, op::POP]);
        w.entry(0x4000, |w| {
            w.get(a);
            w.get(b);
        });
        w.op(&TRACE_TAIL);

        assert_eq!(flat_agrees(&w.bytes), Ok(4), "every entry is read whole");
        let snap = from_pickle(&w.bytes[..], Limits::default()).unwrap();
        let names: Vec<Vec<&str>> = snap.traces[0]
            .iter()
            .map(|ev| {
                snap.stacks
                    .frames(ev.stack)
                    .map(|f| snap.str(f.name))
                    .collect()
            })
            .collect();
        assert_eq!(
            names,
            [["A", "B"], ["A", "B"], ["A", "B"], ["B", "B"]],
            "the last list fetches what the memo holds now"
        );
    }

    /// Streams become ids into a table of the streams met, and the rare fields one set per
    /// distinct set, whichever way an entry is read: every entry of torch 2.8+ carries
    /// `compile_context`, which must not cost a row each.
    #[test]
    fn streams_and_rare_fields_are_kept_once_beside_the_trace() {
        let streams = [0, -7, 1 << 30, -7, 0, 1 << 30];
        let contexts = ["N/A", "N/A", "N/A", "compiled 1", "N/A", "compiled 1"];
        let mut w = trace_head();
        let frame = {
            let mut f = 0;
            w.entry(0x1000, |w| f = w.frame("A", 1));
            f
        };
        for (k, (stream, context)) in streams.iter().zip(contexts).enumerate() {
            w.entry_with(
                |w| {
                    w.str("action");
                    w.str("alloc");
                    w.str("addr");
                    w.int(0x2000 + 512 * k as i32);
                    w.str("size");
                    w.int(512);
                    w.str("stream");
                    w.int(*stream);
                    w.str("compile_context");
                    w.str(context);
                },
                |w| w.get(frame),
            );
        }
        w.op(&TRACE_TAIL);
        assert_eq!(flat_agrees(&w.bytes), Ok(7), "every entry is read whole");
        let snap = from_pickle(&w.bytes[..], Limits::default()).unwrap();
        let trace = snap.trace(0);
        assert_eq!(trace.len(), 7);
        let read: Vec<(i64, &str)> = trace[1..]
            .iter()
            .map(|e| (snap.stream(e), snap.str(snap.extra(e).compile_context)))
            .collect();
        let wanted: Vec<(i64, &str)> = streams.iter().map(|&s| s as i64).zip(contexts).collect();
        assert_eq!(read, wanted);
        assert_eq!(snap.streams, [0, -7, 1 << 30], "each stream once, 0 first");
        assert_eq!(snap.event_extras.len(), 2, "{:?}", snap.event_extras);
        assert_eq!(trace[0].extra, 0, "the first entry has no rare field");
        assert_eq!(trace[1].extra, trace[5].extra);
        assert_eq!(trace[4].extra, trace[6].extra);
    }

    /// Entries read whole count the values they push as the general path does: with any
    /// budget of values, both run out at the same opcode (or neither does), pair by pair,
    /// whatever kind of integer or fetched string a pair holds.
    #[test]
    fn the_value_budget_runs_out_at_the_same_point_either_way() {
        let mut w = trace_head();
        let frame = {
            let mut f = 0;
            w.entry(0x1000, |w| f = w.frame("A", 1));
            f
        };
        for k in 0..6u8 {
            w.entry_with(
                |w| {
                    w.str("action");
                    w.str(if k % 2 == 0 {
                        "alloc"
                    } else {
                        "free_requested"
                    });
                    w.str("addr");
                    w.op(&[op::LONG1, 5, 0, 0x10, k, 0, 0x7f]);
                    w.str("size");
                    w.op(&[op::BININT2, 0, 2]);
                    w.str("stream");
                    w.op(&[op::BININT1, k]);
                    w.str("time_us");
                    w.int(1000 + i32::from(k));
                    w.str("compile_context");
                    w.str("N/A");
                },
                |w| w.get(frame),
            );
        }
        w.op(&TRACE_TAIL);
        assert_eq!(flat_agrees(&w.bytes), Ok(7), "every entry is read whole");
        // the entries read whole, or the error
        let decode = |read_whole: bool, max_values| {
            let limits = Limits {
                max_values,
                ..Limits::default()
            };
            let error = |e: pickle::DecodeError| e.to_string();
            if read_whole {
                let mut a = EntryCompactor::new();
                let decoded = pickle::decode_with(&w.bytes[..], limits, &mut a).map_err(error);
                decoded.map(|_| a.read_whole)
            } else {
                let mut a = OpcodeByOpcode(EntryCompactor::new());
                pickle::decode_with(&w.bytes[..], limits, &mut a)
                    .map(|_| 0)
                    .map_err(error)
            }
        };
        let mut whole = 0;
        for budget in 0..200 {
            match (decode(true, budget), decode(false, budget)) {
                (Ok(n), Ok(_)) => whole = whole.max(n),
                (Err(a), Err(b)) => assert_eq!(a, b, "budget {budget}"),
                (a, b) => panic!("budget {budget}: read whole {a:?}, opcode by opcode {b:?}"),
            }
        }
        assert_eq!(whole, 7, "a budget large enough reads every entry whole");
    }

    /// An entry whose items were set is a row from then on, read whole or opcode by opcode: a
    /// pickle that goes on changing it (more items, one more batch of them) is refused at that
    /// opcode, with the same message either way.
    #[test]
    fn an_entry_changed_after_its_items_were_set_is_refused_either_way() {
        for (name, batch) in [("SETITEM", false), ("SETITEMS", true)] {
            let mut w = trace_head();
            w.entry(0x1000, |w| {
                w.frame("A", 1);
            });
            if batch {
                w.op(&[op::MARK]);
            }
            w.str("size");
            w.int(1);
            w.op(&[if batch { op::SETITEMS } else { op::SETITEM }]);
            let at = w.bytes.len() - 1;
            w.op(&TRACE_TAIL);
            assert_eq!(flat_agrees(&w.bytes), Ok(0), "{name}");
            let err = from_pickle(&w.bytes[..], Limits::default()).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("byte {at}: {name} expects a dict on the stack, found compacted object")
            );
        }
    }

    /// Protocol 0 sets a dict's items one `SETITEM` at a time, so nothing says when such an
    /// entry is done: it stays open, gets every pair, and becomes a row when it is stored.
    #[test]
    fn an_entry_set_one_pair_at_a_time_gets_every_pair() {
        let mut w = trace_head();
        w.op(&[op::EMPTY_DICT]);
        w.memoize();
        for (key, value) in [("action", "alloc"), ("frames", "")] {
            w.str(key);
            match value {
                "" => w.op(&[op::EMPTY_LIST]),
                v => w.str(v),
            }
            w.op(&[op::SETITEM]);
        }
        w.str("addr");
        w.int(0x5000);
        w.op(&[op::SETITEM]);
        w.op(&TRACE_TAIL);
        assert_eq!(flat_agrees(&w.bytes), Ok(0), "not read whole");
        let snap = from_pickle(&w.bytes[..], Limits::default()).unwrap();
        assert_eq!(snap.traces[0].len(), 1);
        assert_eq!(snap.traces[0][0].action, Action::Alloc);
        assert_eq!(snap.traces[0][0].addr, 0x5000);
    }

    /// Each device's rows in table order, no row in two lists: the runs are told from the
    /// lists alone and cut out of the table; anything else is left to the check row by row.
    #[test]
    fn runs_of_rows_are_told_and_cut_and_anything_else_is_checked_row_by_row() {
        let mut heap = Heap::default();
        let rows = |heap: &mut Heap, r: &[u32]| {
            Value::List(heap.new_list(r.iter().map(|&r| Value::Handle(EVENT, r)).collect()))
        };
        let first = rows(&mut heap, &[0, 1, 2]);
        let second = rows(&mut heap, &[3, 4]);
        let empty = rows(&mut heap, &[]);
        assert_eq!(
            row_runs(&heap, &[first, empty, second], 5),
            Some(vec![(0, 3), (0, 0), (3, 2)])
        );
        assert_eq!(
            row_runs(&heap, &[second, first], 5),
            Some(vec![(3, 2), (0, 3)])
        );
        let overlapping = rows(&mut heap, &[2, 3]);
        let backwards = rows(&mut heap, &[1, 0]);
        let gap = rows(&mut heap, &[0, 2]);
        let not_rows = Value::List(heap.new_list(vec![Value::Int(0)]));
        for lists in [
            vec![first, overlapping],
            vec![first, first],
            vec![backwards],
            vec![gap],
            vec![not_rows],
            vec![Value::Int(3)],
        ] {
            assert_eq!(row_runs(&heap, &lists, 5), None, "{lists:?}");
        }
        assert_eq!(row_runs(&heap, &[first], 2), None, "past the table's end");

        let table: Vec<TraceEvent> = (0..6)
            .map(|i| TraceEvent {
                addr: i,
                size: 0,
                time_us: 0,
                stream: crate::snapshot::StreamId(0),
                stack: StackId::EMPTY,
                extra: 0,
                pool: crate::snapshot::PoolId::UNKNOWN,
                action: Action::Alloc,
            })
            .collect();
        let cut = split_runs(table, &[(3, 2), (0, 0), (0, 3)]);
        let addrs: Vec<Vec<u64>> = cut
            .iter()
            .map(|t| t.iter().map(|e| e.addr).collect())
            .collect();
        assert_eq!(addrs, [vec![3, 4], vec![], vec![0, 1, 2]]);
    }
}

//! The interactive page: what `memsnap view` writes, one HTML file that needs nothing else.
//!
//! The page carries what memsnap computed, never the pickle, so it stays small whatever the
//! snapshot holds ([`Panel`] says what one device contributes):
//! - memory over time as fixed columns that keep each column's highest and lowest allocated
//!   bytes, highest reserved bytes and fragmentation ([`Fine`]), so every peak survives at
//!   every zoom; the events themselves around the peak and each out-of-memory error;
//! - for each way of grouping (category, step, phase, stage, site) the composition of the
//!   highest moment of each coarser column, exact to the byte ([`Grouping`]);
//! - the largest blocks with their lifetimes, labels and stacks (frames interned), and the
//!   folded stacks of everything live at the peak;
//! - `report --json`'s own object for the file, so the page's figures are the report's.
//!
//! [`Budget`] sizes all of that by the number of panels, so a page of 64 ranks stays about as
//! large as a page of one.
//!
//! The page's code (`page.js`, `page.css`) is memsnap's own and draws on canvas without a
//! chart library: what it draws is stacked areas, lines and bands over one x axis from
//! pre-aggregated columns, a few hundred lines that start drawing at once, where a general
//! library would add its own data model and 100 to 1,000 KB to every page. Strings from the
//! snapshot reach the page's DOM as text only, never as markup.

pub mod diff;
pub mod fleet;
pub mod pack;
pub mod texts;

use std::collections::HashMap;
use std::io::{self, Write};

use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::analysis::{DeviceAnalysis, Dimension};
use crate::attribute::frames;
use crate::chart::{flamegraph, palette, series};
use crate::replay::{Replay, NONE};
use crate::snapshot::{Action, StackId};
pub use pack::{pack, Packed};
pub use texts::{Text, Texts};

/// The groupings the page offers, in the order of its switch.
pub const DIMENSIONS: [Dimension; 5] = [
    Dimension::Category,
    Dimension::Step,
    Dimension::Phase,
    Dimension::Stage,
    Dimension::Site,
];

/// How much of each device the page carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Columns of the fine series (highest, lowest, reserved, fragmentation).
    pub fine: usize,
    /// Columns of each grouping's composition.
    pub columns: usize,
    /// Groups drawn in their own band (the rest together).
    pub groups: usize,
    /// Blocks carried: this many of the largest live at the peak, and as many of the largest
    /// of the whole trace.
    pub blocks: usize,
    /// Events kept on each side of the peak and of each out-of-memory error.
    pub raw: usize,
    /// Frames of PyTorch's own kept per stack.
    pub plumbing_frames: usize,
    /// Frames of the program kept per stack, the innermost (the rest are counted).
    pub program_frames: usize,
    /// Frames kept in all the stacks of a panel; past it, stacks keep
    /// [`Budget::FEW_FRAMES`] of the program's.
    pub frames: usize,
    /// Panels sharing the page (each panel's strings get this share of the text budget).
    pub panels: usize,
}

impl Budget {
    /// The budget of each of `panels` panels.
    pub fn for_panels(panels: usize) -> Budget {
        let n = panels.max(1);
        Budget {
            fine: (16_384 / n).clamp(1_024, 16_384),
            columns: (2_048 / n).clamp(256, 2_048),
            groups: if n > 16 { 6 } else { 10 },
            blocks: (2_000 / n).clamp(60, 2_000),
            raw: (1_000 / n).clamp(100, 1_000),
            plumbing_frames: if n > 16 { 8 } else { 24 },
            program_frames: 100,
            frames: (200_000 / n).max(20_000),
            panels: n,
        }
    }

    /// Program frames kept per stack once [`Budget::frames`] is spent.
    pub const FEW_FRAMES: usize = 4;

    /// Frames of each line of the peak's flamegraph (the page draws 40 levels).
    pub const FLAME_FRAMES: usize = 40;
}

/// The page's data for one device of one file. Its strings are in its own table ([`Texts`])
/// until [`Page::new`] takes them into the page's.
#[derive(Clone, Debug, Serialize)]
pub struct Panel {
    /// The file as given.
    pub file: Text,
    /// Its short name in the page (the rank when the name says one).
    pub name: Text,
    /// Rank read from the file name.
    pub rank: Option<u32>,
    /// Device ordinal.
    pub device: u32,
    /// `time` (x in microseconds from the first event) or `events` (x is the event index).
    pub axis: &'static str,
    /// Time of the first event, microseconds since the epoch (0 without times): panels share
    /// one time axis through it.
    pub origin_us: i64,
    /// The largest x.
    pub x_end: i64,
    /// Events of the device's trace.
    pub events: usize,
    /// Allocated and reserved bytes before the first event.
    pub start: [u64; 2],
    /// The allocated peak: bytes, event (`-1`: before the first event), x, reserved then.
    pub peak: PeakMark,
    /// The highest reserved bytes.
    pub peak_reserved: u64,
    /// Failed allocations.
    pub ooms: Vec<OomMark>,
    /// Where the peak was reached, in a few words.
    pub peak_place: Text,
    /// Memory over time, fine.
    pub fine: Fine,
    /// Memory over time by each grouping.
    pub groupings: Vec<Grouping>,
    /// The events around the peak and the failures.
    pub zoom: Vec<Raw>,
    /// x of each step row's first and last event (the rows of the report's `steps`).
    pub step_x: Vec<[i64; 2]>,
    /// Strings the stacks, blocks and flame refer to by index: frames, labels.
    pub strings: Vec<Text>,
    /// Stacks: program frames (innermost first), PyTorch's frames kept, frames left out.
    pub stacks: Vec<StackText>,
    /// The blocks carried.
    pub blocks: Blocks,
    /// Everything live at the peak, folded by category then program frames (outermost first).
    pub peak_flame: Flame,
    /// The `memsnap oom` explanation, for a device that ran out of memory.
    pub oom_text: Option<Text>,
    /// Index of the file's report in [`Page::reports`].
    pub report: usize,
    /// Index of this device in that report's `devices`.
    pub report_device: usize,
    /// The strings [`Text`]s of this panel refer to, until the page takes them.
    #[serde(skip)]
    pub texts: Texts,
}

impl Panel {
    /// Makes every [`Text`] of the panel refer to the page's table (`map`: this panel's
    /// index to the page's).
    fn remap(&mut self, map: &[Text]) {
        let m = |t: &mut Text| *t = map[t.0 as usize];
        m(&mut self.file);
        m(&mut self.name);
        m(&mut self.peak_place);
        self.strings.iter_mut().for_each(m);
        self.oom_text.iter_mut().for_each(m);
        for g in &mut self.groupings {
            g.groups.iter_mut().for_each(m);
        }
    }
}

/// The allocated peak.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PeakMark {
    /// Bytes.
    pub bytes: u64,
    /// Event after which it was reached, `-1` before the first.
    pub event: i64,
    /// Its x.
    pub x: i64,
    /// Reserved bytes then.
    pub reserved: u64,
}

/// A failed allocation.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OomMark {
    /// The `oom` event.
    pub event: usize,
    /// Its x.
    pub x: i64,
    /// Bytes requested.
    pub requested: u64,
}

/// Fixed-width columns over the x range.
#[derive(Clone, Debug, Serialize)]
pub struct Fine {
    /// Columns.
    pub n: usize,
    /// Highest allocated bytes in each column.
    pub amax: Packed,
    /// Lowest allocated bytes in each column.
    pub amin: Packed,
    /// Highest reserved bytes in each column.
    pub rmax: Packed,
    /// Highest reserved minus allocated in each column.
    pub frag: Packed,
    /// The event of each column's highest allocated bytes (the last event before it for a
    /// column without events; `-1` before the first event).
    pub ev: Packed,
}

/// One grouping's composition over time.
#[derive(Clone, Debug, Serialize)]
pub struct Grouping {
    /// `category`, `step`, ...
    pub dimension: &'static str,
    /// Group names, bottom band first; the last holds the smaller groups.
    pub groups: Vec<Text>,
    /// Colours, `#rrggbb`, as the PNG timelines draw them.
    pub colours: Vec<String>,
    /// Distinct labels in the last band.
    pub folded: usize,
    /// The event each column shows (its highest moment).
    pub ev: Packed,
    /// x of each column's event.
    pub x: Packed,
    /// Bytes of each group at each column: group 0's column after column, then group 1's...
    pub bytes: Packed,
}

/// The events of one stretch of the trace.
#[derive(Clone, Debug, Serialize)]
pub struct Raw {
    /// First event.
    pub from: usize,
    /// x of each.
    pub x: Packed,
    /// Allocated bytes after each.
    pub allocated: Packed,
    /// Reserved bytes after each.
    pub reserved: Packed,
}

/// One stack, as the page shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StackText {
    /// The program's frames, innermost first (indices into [`Panel::strings`]).
    pub program: Vec<u32>,
    /// PyTorch's and the standard library's frames, innermost first, the first few.
    pub plumbing: Vec<u32>,
    /// PyTorch's frames left out.
    pub more: usize,
    /// The program's frames left out (the outermost of a very deep stack).
    pub cut: usize,
}

/// The blocks carried, a column per field.
#[derive(Clone, Debug, Serialize)]
pub struct Blocks {
    /// Blocks in total on the device (allocations of the trace and blocks from before it).
    pub total: usize,
    /// Allocating event (`-1`: from before the trace).
    pub start: Packed,
    /// Freeing event (`-1`: alive at the end).
    pub end: Packed,
    /// x of the start (0 from before the trace).
    pub start_x: Packed,
    /// x of the end (`x_end` when alive at the end).
    pub end_x: Packed,
    /// Bytes.
    pub bytes: Packed,
    /// Stack (index into [`Panel::stacks`]).
    pub stack: Packed,
    /// For each of [`DIMENSIONS`], each block's group (index into [`Panel::strings`]).
    pub labels: Vec<Packed>,
}

/// Folded stacks.
#[derive(Clone, Debug, Serialize)]
pub struct Flame {
    /// Each line's frames, outermost first (indices into [`Panel::strings`]); past
    /// [`Budget::FLAME_FRAMES`], one more saying how many were left out.
    pub lines: Vec<Vec<u32>>,
    /// Each line's bytes.
    pub bytes: Vec<u64>,
}

/// Everything one page holds. Every string is once in [`Page::strings`] and referred to by
/// index ([`Text`]), so its size is bounded by the budgets of [`Budget`] and [`texts`]
/// whatever the snapshot's names.
#[derive(Clone, Debug, Serialize)]
pub struct Page {
    /// memsnap's version.
    pub version: &'static str,
    /// The command that wrote the page.
    pub command: Text,
    /// The page's title.
    pub title: Text,
    /// One panel per device of each file.
    pub panels: Vec<Panel>,
    /// `report --json`'s object for each file, its strings as [`Text`]s.
    pub reports: Vec<serde_json::Value>,
    /// `memsnap compare`'s text for several files.
    pub compare_text: Option<Text>,
    /// Files that could not be read: `(file, why)`.
    pub failures: Vec<(Text, Text)>,
    /// The page's strings, each once.
    pub strings: Vec<String>,
    /// The whole text of shortened names short enough to carry: `(index in strings, text)`.
    pub full: Vec<(u32, String)>,
}

/// What a page is made of, its strings as they came.
#[derive(Clone, Debug, Default)]
pub struct Parts {
    /// The command that wrote the page.
    pub command: String,
    /// The page's title.
    pub title: String,
    /// One panel per device of each file.
    pub panels: Vec<Panel>,
    /// `report --json`'s object for each file.
    pub reports: Vec<serde_json::Value>,
    /// `memsnap compare`'s text for several files.
    pub compare_text: Option<String>,
    /// Files that could not be read: `(file, why)`.
    pub failures: Vec<(String, String)>,
}

impl Page {
    /// The page of `parts`: every string taken into one table, shortened within its budget.
    pub fn new(parts: Parts) -> Page {
        let mut texts = Texts::new();
        let title = texts.text(&parts.title);
        let command = texts.text(&parts.command);
        let mut panels = parts.panels;
        for p in &mut panels {
            let own = std::mem::take(&mut p.texts);
            let map = texts.adopt(&own);
            p.remap(&map);
        }
        let mut reports = parts.reports;
        for r in &mut reports {
            intern_strings(r, &mut texts);
        }
        let compare_text = parts.compare_text.map(|t| texts.block(&t));
        let failures = parts
            .failures
            .iter()
            .map(|(f, why)| (texts.text(f), texts.text(why)))
            .collect();
        Page {
            version: env!("CARGO_PKG_VERSION"),
            command,
            title,
            panels,
            reports,
            compare_text,
            failures,
            strings: texts.shown().map(str::to_string).collect(),
            full: texts.full().map(|(i, f)| (i, f.to_string())).collect(),
        }
    }

    /// The text shown for `t`.
    pub fn text(&self, t: Text) -> &str {
        &self.strings[t.0 as usize]
    }
}

/// Replaces every string of a JSON value by its [`Text`] (`{"$": index}`); keys longer than a
/// shown name are shortened in place.
fn intern_strings(v: &mut serde_json::Value, texts: &mut Texts) {
    use serde_json::Value;
    match v {
        Value::String(s) => {
            let t = texts.text(s);
            *v = serde_json::json!({ "$": t.0 });
        }
        Value::Array(items) => items.iter_mut().for_each(|x| intern_strings(x, texts)),
        Value::Object(map) => {
            if map.keys().any(|k| k.len() > texts::SHOWN_CHARS) {
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, x)| {
                        let chars = k.chars().count();
                        (texts::shorten(&k, chars, texts::SHOWN_CHARS), x)
                    })
                    .collect();
            }
            map.values_mut().for_each(|x| intern_strings(x, texts));
        }
        _ => {}
    }
}

/// The x of every event: microseconds from the first event's time, or the event index when
/// the trace has no times.
fn x_of_events(a: &DeviceAnalysis) -> (Vec<i64>, &'static str) {
    let r = &a.replay;
    let events = a.snap.trace(r.device);
    let t0 = r.time_span_us.0;
    if t0 == 0 {
        return ((0..events.len() as i64).collect(), "events");
    }
    let xs = events
        .iter()
        .map(|e| e.time_us.saturating_sub(t0).max(0))
        .collect();
    (xs, "time")
}

/// Builds one device's panel. `report` and `report_device` say where its report is.
pub fn panel(
    a: &DeviceAnalysis,
    file: &str,
    name: &str,
    rank: Option<u32>,
    budget: &Budget,
    oom_text: Option<String>,
    (report, report_device): (usize, usize),
) -> Panel {
    let r = &a.replay;
    let (xs, axis) = x_of_events(a);
    let x_end = xs.iter().copied().max().unwrap_or(0).max(1);
    let x_at = |e: Option<usize>| e.map_or(0, |i| xs[i]);
    // two halves side by side: every allocation's group in each grouping and the groupings'
    // columns; the fine columns, the blocks and the peak's stacks
    let (groupings, (fine, (blocks_and_stacks, flame))) = rayon::join(
        || {
            let changes = Changes::of(a);
            // each column's highest moment, and the moments the page names: the peak, each
            // step's peak, each failure
            let mut moments = highest_moments(r, &xs, x_end, budget.columns.min(xs.len()).max(1));
            moments.extend(r.peaks.allocated.event);
            moments.extend(a.steps.iter().map(|s| s.peak_event_index));
            moments.extend(r.ooms.iter().map(|o| o.event));
            moments.retain(|&e| e < xs.len());
            moments.sort_by_key(|&e| (xs[e], e));
            moments.dedup();
            DIMENSIONS
                .par_iter()
                .map(|&d| {
                    let named = Named::of(a, d, &changes, budget.groups);
                    grouping(a, &named, &changes, (&xs, &moments), budget)
                })
                .collect::<Vec<_>>()
        },
        || {
            rayon::join(
                || fine(r, &xs, x_end, budget.fine),
                || {
                    let mut strings = Texts::with_share(1.0 / budget.panels.max(1) as f64);
                    let mut stacks = StackTable::default();
                    let blocks = blocks(a, &xs, x_end, budget, &mut strings, &mut stacks);
                    let flame = peak_flame(a, &mut strings);
                    ((blocks, stacks, strings), flame)
                },
            )
        },
    );
    let (blocks, stacks, mut texts) = blocks_and_stacks;
    let groupings = groupings
        .into_iter()
        .map(|(mut g, names)| {
            g.groups = names.iter().map(|n| texts.text(n)).collect();
            g
        })
        .collect();
    let file = texts.text(file);
    let name = texts.text(name);
    let peak_place = texts.text(&a.peak_place.summary());
    let oom_text = oom_text.map(|t| texts.block(&t));
    let mut zoom_at: Vec<usize> = r.peaks.allocated.event.into_iter().collect();
    zoom_at.extend(r.ooms.iter().take(4).map(|o| o.event));
    let zoom = zoom_at
        .into_iter()
        .map(|c| raw(r, &xs, c, budget.raw))
        .collect();
    let peak = r.peaks.allocated;
    Panel {
        file,
        name,
        rank,
        device: r.device,
        axis,
        origin_us: r.time_span_us.0,
        x_end,
        events: r.len(),
        start: [r.start.allocated, r.start.reserved],
        peak: PeakMark {
            bytes: peak.bytes,
            event: peak.event.map_or(-1, |e| e as i64),
            x: x_at(peak.event),
            reserved: r.reserved_at(peak.event),
        },
        peak_reserved: r.peaks.reserved.bytes,
        ooms: r
            .ooms
            .iter()
            .map(|o| OomMark {
                event: o.event,
                x: xs.get(o.event).copied().unwrap_or(0),
                requested: o.requested,
            })
            .collect(),
        peak_place,
        fine,
        groupings,
        zoom,
        step_x: a
            .steps
            .iter()
            .map(|s| [x_at(Some(s.first_event)), x_at(Some(s.last_event))])
            .collect(),
        strings: (0..texts.shown().count() as u32).map(Text).collect(),
        stacks: stacks.list,
        blocks,
        peak_flame: flame,
        oom_text,
        report,
        report_device,
        texts,
    }
}

/// The column of `n` over `0..=x_end` that `x` falls in (in floating point: a division of
/// wide integers for each event cost more than the rest of a column's work).
fn column_of(x: i64, n: usize, x_end: i64) -> usize {
    let at = x.max(0) as f64 * (n as f64 / (x_end as f64 + 1.0));
    (at as usize).min(n - 1)
}

/// The event of the highest allocated bytes in each of `n` columns (columns without events
/// left out), in time order.
fn highest_moments(r: &Replay, xs: &[i64], x_end: i64, n: usize) -> Vec<usize> {
    let mut highest: Vec<Option<usize>> = vec![None; n];
    for (i, &x) in xs.iter().enumerate() {
        let c = column_of(x, n, x_end);
        if highest[c].is_none_or(|h| r.allocated[i] > r.allocated[h]) {
            highest[c] = Some(i);
        }
    }
    highest.into_iter().flatten().collect()
}

/// The fine columns: each column's extremes, so no peak is lost at any zoom.
fn fine(r: &Replay, xs: &[i64], x_end: i64, columns: usize) -> Fine {
    let n = columns.min(xs.len()).max(1);
    let column = |x: i64| column_of(x, n, x_end);
    let mut amax = vec![i64::MIN; n];
    let mut amin = vec![i64::MAX; n];
    let mut rmax = vec![i64::MIN; n];
    let mut frag = vec![i64::MIN; n];
    let mut ev = vec![-2i64; n];
    // the values each column ends with, for the columns without events after it
    let mut last: Vec<Option<(i64, i64, i64)>> = vec![None; n];
    let mut reserved = r.start.reserved as i64;
    let mut change = 0;
    for (i, &x) in xs.iter().enumerate() {
        while let Some(&(at, bytes)) = r.reserved_changes.get(change) {
            if at as usize > i {
                break;
            }
            reserved = bytes as i64;
            change += 1;
        }
        let c = column(x);
        let a = r.allocated[i] as i64;
        if a > amax[c] {
            amax[c] = a;
            ev[c] = i as i64;
        }
        amin[c] = amin[c].min(a);
        rmax[c] = rmax[c].max(reserved);
        frag[c] = frag[c].max(reserved - a);
        last[c] = Some((a, reserved, i as i64));
    }
    let mut carry = (r.start.allocated as i64, r.start.reserved as i64, -1i64);
    for c in 0..n {
        match last[c] {
            Some(l) => carry = l,
            None => {
                amax[c] = carry.0;
                amin[c] = carry.0;
                rmax[c] = carry.1;
                frag[c] = carry.1 - carry.0;
                ev[c] = carry.2;
            }
        }
    }
    Fine {
        n,
        amax: pack(amax),
        amin: pack(amin),
        rmax: pack(rmax),
        frag: pack(frag),
        ev: pack(ev),
    }
}

/// What changes allocated memory, in event order: each event that starts or ends an
/// allocation, with the bytes it adds (or takes) and the allocation's label and stack, so that
/// each grouping's passes read these arrays in order instead of reaching back into the trace.
struct Changes {
    /// The event of each change.
    event: Vec<u32>,
    /// Bytes added (positive) or taken (negative).
    delta: Vec<i64>,
    /// The allocation's label id.
    label: Vec<u32>,
    /// The allocation's stack.
    stack: Vec<u32>,
    /// Label ids of the blocks from before the trace.
    label_of_pre: Vec<u32>,
    /// The distinct labels.
    labels: Vec<crate::attribute::Label>,
}

impl Changes {
    fn of(a: &DeviceAnalysis) -> Changes {
        let r = &a.replay;
        let events = a.snap.trace(r.device);
        let mut ids: FxHashMap<crate::attribute::Label, u32> = FxHashMap::default();
        let mut labels = Vec::new();
        let mut id = |l: &crate::attribute::Label| {
            *ids.entry(*l).or_insert_with(|| {
                labels.push(*l);
                labels.len() as u32 - 1
            })
        };
        let label_of_pre: Vec<u32> = a.attribution.preexisting.iter().map(&mut id).collect();
        let mut label_of_event = vec![u32::MAX; events.len()];
        let mut out = Changes {
            event: Vec::new(),
            delta: Vec::new(),
            label: Vec::new(),
            stack: Vec::new(),
            label_of_pre: Vec::new(),
            labels: Vec::new(),
        };
        let mut push = |i: usize, delta: i64, label: u32, stack: StackId| {
            out.event.push(i as u32);
            out.delta.push(delta);
            out.label.push(label);
            out.stack.push(stack.0);
        };
        let mut last: Option<(crate::attribute::Label, u32)> = None;
        for (i, e) in events.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    let l = &a.attribution.labels[i];
                    // neighbours mostly share their label
                    let lid = match last {
                        Some((prev, lid)) if prev == *l => lid,
                        _ => id(l),
                    };
                    last = Some((*l, lid));
                    label_of_event[i] = lid;
                    push(i, r.bytes(i) as i64, lid, e.stack);
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    let p = r.partner[i];
                    if p == NONE {
                        continue;
                    }
                    if p & crate::replay::PREEXISTING != 0 {
                        let k = (p & !crate::replay::PREEXISTING) as usize;
                        let b = &r.preexisting[k];
                        if b.freed_at as usize == i {
                            push(i, -(b.size as i64), label_of_pre[k], b.stack);
                        }
                    } else if r.partner[p as usize] as usize == i {
                        let k = p as usize;
                        push(i, -(r.bytes(k) as i64), label_of_event[k], events[k].stack);
                    }
                }
                _ => {}
            }
        }
        out.label_of_pre = label_of_pre;
        out.labels = labels;
        out
    }
}

/// The group of each change in one grouping.
struct Named {
    dimension: Dimension,
    /// By step, whole steps (their micro-batches together).
    whole: bool,
    names: Vec<String>,
    /// Group of each label (every grouping but sites depends on the label alone).
    by_label: Vec<u32>,
    /// Sites: the group of each change.
    of_change: Option<Vec<u32>>,
    /// Group of each block from before the trace.
    of_pre: Vec<u32>,
}

impl Named {
    /// The groups of dimension `d`; by step, whole steps when there are more steps and
    /// micro-batches than `max_groups` bands, as the PNG timeline groups them.
    fn of(a: &DeviceAnalysis, d: Dimension, changes: &Changes, max_groups: usize) -> Named {
        let named = Named::grouped(a, d, changes, false);
        if d == Dimension::Step && named.names.len() > max_groups {
            Named::grouped(a, d, changes, true)
        } else {
            named
        }
    }

    fn grouped(a: &DeviceAnalysis, d: Dimension, changes: &Changes, whole: bool) -> Named {
        let mut keyer = a.keyer();
        if whole {
            keyer.set_whole_steps();
        }
        let mut names: Vec<String> = Vec::new();
        let mut by_name: FxHashMap<String, u32> = FxHashMap::default();
        let mut name_id = |name: String| {
            let n = names.len() as u32;
            *by_name.entry(name).or_insert_with_key(|k| {
                names.push(k.clone());
                n
            })
        };
        let site = d == Dimension::Site;
        let mut by_label: Vec<u32> = vec![u32::MAX; changes.labels.len()];
        let mut by_site: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        let mut group = |lid: u32, stack: StackId| -> u32 {
            let l = &changes.labels[lid as usize];
            if site {
                *by_site
                    .entry((lid, stack.0))
                    .or_insert_with(|| name_id(keyer.key(d, l, stack)))
            } else {
                let g = &mut by_label[lid as usize];
                if *g == u32::MAX {
                    *g = name_id(keyer.key(d, l, stack));
                }
                *g
            }
        };
        let of_pre = changes
            .label_of_pre
            .iter()
            .zip(&a.replay.preexisting)
            .map(|(&lid, p)| group(lid, p.stack))
            .collect();
        let of_change = site.then(|| {
            // neighbours mostly share their site
            let mut last = (u32::MAX, u32::MAX, 0);
            changes
                .label
                .iter()
                .zip(&changes.stack)
                .map(|(&lid, &stack)| {
                    if (lid, stack) != (last.0, last.1) {
                        last = (lid, stack, group(lid, StackId(stack)));
                    }
                    last.2
                })
                .collect()
        });
        if !site {
            for lid in 0..changes.labels.len() {
                group(lid as u32, StackId::EMPTY);
            }
        }
        Named {
            dimension: d,
            whole,
            names,
            by_label,
            of_change,
            of_pre,
        }
    }

    /// The group of change `k`.
    fn group_of(&self, changes: &Changes, k: usize) -> u32 {
        match &self.of_change {
            Some(of) => of[k],
            None => self.by_label[changes.label[k] as usize],
        }
    }
}

/// One grouping's columns (and its groups' names): the bands the PNG timelines draw (memory from before the trace
/// first, then the largest groups at the peak, then the largest at other times, the rest
/// together), each column showing its highest moment.
fn grouping(
    a: &DeviceAnalysis,
    n: &Named,
    changes: &Changes,
    (xs, moments): (&[i64], &[usize]),
    budget: &Budget,
) -> (Grouping, Vec<String>) {
    let r = &a.replay;
    // the most each group ever held at once
    let mut now = vec![0i64; n.names.len()];
    let mut most = vec![0i64; n.names.len()];
    for (k, p) in r.preexisting.iter().enumerate() {
        if p.live {
            now[n.of_pre[k] as usize] += p.size as i64;
        }
    }
    most.copy_from_slice(&now);
    for (k, &delta) in changes.delta.iter().enumerate() {
        let g = n.group_of(changes, k) as usize;
        now[g] += delta;
        most[g] = most[g].max(now[g]);
    }
    // the bands
    let mut keyer = a.keyer();
    let before = keyer.key(
        n.dimension,
        &crate::attribute::Label::BEFORE_TRACE,
        StackId::EMPTY,
    );
    let mut over_time: Vec<usize> = (0..n.names.len()).filter(|&g| most[g] > 0).collect();
    over_time.sort_by_key(|&g| (std::cmp::Reverse(most[g]), g));
    let elsewhere = over_time.iter().map(|&g| n.names[g].clone());
    let mut seen = std::collections::HashSet::new();
    let at_peak = a
        .peak_shares(n.dimension)
        .iter()
        .map(|s| {
            if n.whole {
                keyer.whole_step(&s.label)
            } else {
                s.label.clone()
            }
        })
        .filter(|l| seen.insert(l.clone()))
        .collect::<Vec<_>>();
    let mut groups = series::bands(a, before, at_peak.into_iter(), elsewhere, budget.groups);
    let other = groups.len();
    let band_of: Vec<usize> = n
        .names
        .iter()
        .map(|name| groups.iter().position(|g| g == name).unwrap_or(other))
        .collect();
    let folded = band_of.iter().filter(|&&b| b == other).count();
    groups.push(series::OTHER.to_string());
    // the columns
    let bands = groups.len();
    let mut totals = vec![0i64; bands];
    for (k, p) in r.preexisting.iter().enumerate() {
        if p.live {
            totals[band_of[n.of_pre[k] as usize]] += p.size as i64;
        }
    }
    // with rounded sizes the difference belongs to the memory from before the trace
    let start_sum: i64 = totals.iter().sum();
    totals[0] += r.start.allocated as i64 - start_sum;
    // the bands' bytes at each column's highest moment, met in event order (a clock that
    // goes back puts a later event in an earlier column)
    let mut order: Vec<usize> = (0..moments.len()).collect();
    order.sort_by_key(|&c| moments[c]);
    let mut best: Vec<(usize, Vec<i64>)> = moments.iter().map(|&i| (i, Vec::new())).collect();
    let mut k = 0;
    for c in order {
        let i = moments[c];
        while k < changes.event.len() && changes.event[k] as usize <= i {
            totals[band_of[n.group_of(changes, k) as usize]] += changes.delta[k];
            k += 1;
        }
        best[c].1 = totals.clone();
    }
    let colours = palette::assign(&groups)
        .into_iter()
        .map(|c| format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2))
        .collect();
    groups[other] = if folded > 0 {
        format!("{folded} more")
    } else {
        "other".to_string()
    };
    let values = (0..bands).flat_map(|k| best.iter().map(move |b| b.1[k].max(0)));
    let grouping = Grouping {
        dimension: n.dimension.as_str(),
        groups: Vec::new(),
        colours,
        folded,
        ev: pack(best.iter().map(|b| b.0 as i64)),
        x: pack(best.iter().map(|b| xs[b.0])),
        bytes: pack(values.collect::<Vec<_>>()),
    };
    (grouping, groups)
}

/// The events from `radius` before `center` to `radius` after it.
fn raw(r: &Replay, xs: &[i64], center: usize, radius: usize) -> Raw {
    let from = center.saturating_sub(radius);
    let to = (center + radius + 1).min(r.len());
    Raw {
        from,
        x: pack(xs[from..to].iter().copied()),
        allocated: pack(r.allocated[from..to].iter().map(|&b| b as i64)),
        reserved: pack((from..to).map(|i| r.reserved_at(Some(i)) as i64)),
    }
}

/// Stacks interned as the page shows them.
#[derive(Default)]
struct StackTable {
    list: Vec<StackText>,
    index: HashMap<StackId, u32>,
    /// Frames kept in all the stacks so far.
    frames: usize,
}

impl StackTable {
    /// The stack's index; its frames are taken in until [`Budget::program_frames`] of the
    /// program's and [`Budget::plumbing_frames`] of PyTorch's (fewer once the panel's
    /// [`Budget::frames`] are spent), the rest counted.
    fn id(
        &mut self,
        a: &DeviceAnalysis,
        stack: StackId,
        strings: &mut Texts,
        budget: &Budget,
    ) -> u32 {
        if let Some(&i) = self.index.get(&stack) {
            return i;
        }
        let snap = a.snap;
        let spent = self.frames >= budget.frames;
        let program_limit = if spent {
            Budget::FEW_FRAMES
        } else {
            budget.program_frames
        };
        let plumbing_limit = if spent { 0 } else { budget.plumbing_frames };
        let mut text = StackText::default();
        for f in snap.stacks.frames(stack) {
            let program = frames::is_python(&f) && !frames::is_library(snap, &f);
            let room = if program {
                text.program.len() < program_limit
            } else {
                text.plumbing.len() < plumbing_limit
            };
            if !room {
                if program {
                    text.cut += 1;
                } else {
                    text.more += 1;
                }
                continue;
            }
            let shown = if f.line == 0 {
                snap.str(f.name).to_string()
            } else {
                format!("{} ({}:{})", snap.str(f.name), snap.str(f.filename), f.line)
            };
            let id = strings.text(&shown).0;
            if program {
                text.program.push(id);
            } else {
                text.plumbing.push(id);
            }
        }
        self.frames += text.program.len() + text.plumbing.len();
        let i = self.list.len() as u32;
        self.list.push(text);
        self.index.insert(stack, i);
        i
    }
}

/// One carried block.
struct Carried {
    start: i64,
    end: i64,
    bytes: u64,
    stack: StackId,
    label: crate::attribute::Label,
}

/// The blocks the page carries: the largest live at the peak and the largest of the trace
/// (all of them when there are few).
fn blocks(
    a: &DeviceAnalysis,
    xs: &[i64],
    x_end: i64,
    budget: &Budget,
    strings: &mut Texts,
    stacks: &mut StackTable,
) -> Blocks {
    let r = &a.replay;
    let events = a.snap.trace(r.device);
    let peak = r.peaks.allocated.event;
    let mut all: Vec<Carried> = Vec::new();
    for (k, p) in r.preexisting.iter().enumerate() {
        if p.live {
            all.push(Carried {
                start: -1,
                end: if p.freed_at == NONE {
                    -1
                } else {
                    p.freed_at as i64
                },
                bytes: p.size,
                stack: p.stack,
                label: a.attribution.preexisting[k],
            });
        }
    }
    for (i, e) in events.iter().enumerate() {
        if e.action == Action::Alloc && r.bytes(i) > 0 {
            let free = r.partner[i];
            all.push(Carried {
                start: i as i64,
                end: if free == NONE { -1 } else { free as i64 },
                bytes: r.bytes(i),
                stack: e.stack,
                label: a.attribution.labels[i],
            });
        }
    }
    let total = all.len();
    let live_at_peak = |b: &Carried| {
        let started = peak.map_or(b.start < 0, |p| b.start <= p as i64);
        let ended = b.end >= 0 && peak.is_some_and(|p| b.end <= p as i64);
        started && !ended
    };
    let mut keep = vec![false; all.len()];
    if all.len() > 3 * budget.blocks {
        // the largest of all, and the largest live at the peak: a selection, not a sort
        let key = |k: &usize| (std::cmp::Reverse(all[*k].bytes), *k);
        let mut largest = |mut set: Vec<usize>| {
            if set.len() > budget.blocks {
                set.select_nth_unstable_by_key(budget.blocks, key);
                set.truncate(budget.blocks);
            }
            for k in set {
                keep[k] = true;
            }
        };
        largest((0..all.len()).collect());
        largest((0..all.len()).filter(|&k| live_at_peak(&all[k])).collect());
    } else {
        keep.iter_mut().for_each(|k| *k = true);
    }
    let kept: Vec<&Carried> = all
        .iter()
        .zip(&keep)
        .filter(|(_, &k)| k)
        .map(|(b, _)| b)
        .collect();
    let mut keyer = a.keyer();
    let labels = DIMENSIONS
        .iter()
        .map(|&d| {
            pack(
                kept.iter()
                    .map(|b| strings.text(&keyer.key(d, &b.label, b.stack)).0 as i64)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let x_of = |e: i64, otherwise: i64| {
        if e < 0 {
            otherwise
        } else {
            xs.get(e as usize).copied().unwrap_or(otherwise)
        }
    };
    Blocks {
        total,
        start: pack(kept.iter().map(|b| b.start)),
        end: pack(kept.iter().map(|b| b.end)),
        start_x: pack(kept.iter().map(|b| x_of(b.start, 0))),
        end_x: pack(kept.iter().map(|b| x_of(b.end, x_end))),
        bytes: pack(kept.iter().map(|b| b.bytes as i64)),
        stack: pack(
            kept.iter()
                .map(|b| stacks.id(a, b.stack, strings, budget) as i64)
                .collect::<Vec<_>>(),
        ),
        labels,
    }
}

/// Everything live at the peak, folded by category and program frames; a line deeper than
/// [`Budget::FLAME_FRAMES`] keeps its outermost frames and says how many it left out.
fn peak_flame(a: &DeviceAnalysis, strings: &mut Texts) -> Flame {
    let lines = flamegraph::folded(
        a,
        a.replay.peaks.allocated.event,
        flamegraph::Root::Category,
    );
    Flame {
        lines: lines
            .iter()
            .map(|(l, _)| {
                let mut ids: Vec<u32> = Vec::new();
                let mut left_out = 0usize;
                for f in l.split(';') {
                    if ids.len() < Budget::FLAME_FRAMES {
                        ids.push(strings.text(f).0);
                    } else {
                        left_out += 1;
                    }
                }
                if left_out > 0 {
                    let more = format!("… {} more frames", crate::units::count(left_out as u64));
                    ids.push(strings.text(&more).0);
                }
                ids
            })
            .collect(),
        bytes: lines.iter().map(|(_, b)| *b).collect(),
    }
}

/// The page's display name of each file, with its rank: `rank 3` when the name says a rank no
/// other file says, else the shortest tail of its path that no other file ends with.
pub fn names(files: &[&str]) -> Vec<(String, Option<u32>)> {
    let short = crate::report::compare::short_paths(files);
    let ranks: Vec<Option<u32>> = files
        .iter()
        .map(|f| crate::report::compare::rank_from_name(f))
        .collect();
    let mut seen: HashMap<u32, usize> = HashMap::new();
    for r in ranks.iter().flatten() {
        *seen.entry(*r).or_default() += 1;
    }
    short
        .into_iter()
        .zip(ranks)
        .map(|(s, rank)| match rank {
            Some(r) if seen.get(&r) == Some(&1) => (format!("rank {r}"), rank),
            _ => (s, rank),
        })
        .collect()
}

/// The page's JSON, safe inside a `<script>` element: `<` is written as `\u003c`, so no
/// string from the snapshot can close the element or open a comment; control characters are
/// escaped as all of memsnap's JSON is ([`crate::escape::json`]).
pub fn data_json(page: &Page) -> serde_json::Result<String> {
    let json = serde_json::to_string(page)?;
    Ok(crate::escape::json(&json).replace('<', "\\u003c"))
}

/// Writes the page: the template with its slots filled in one pass that never reads again
/// what it put in, so a title or a name holding `{{data}}` is shown as it is.
pub fn write(out: &mut dyn Write, page: &Page) -> io::Result<()> {
    let json = data_json(page).map_err(io::Error::other)?;
    let title = escape_text(&crate::escape::printable(page.text(page.title)));
    fill(
        out,
        TEMPLATE,
        &[
            ("title", &title),
            ("style", STYLE),
            ("script", SCRIPT),
            ("data", &json),
        ],
    )
}

/// Writes `template` with each `{{name}}` of `slots` replaced by its text, in one pass over
/// the template: what a slot puts in is never read as template.
fn fill(out: &mut dyn Write, template: &str, slots: &[(&str, &str)]) -> io::Result<()> {
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let slot = after.find("}}").and_then(|close| {
            let name = &after[..close];
            slots
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, text)| (close, *text))
        });
        match slot {
            Some((close, text)) => {
                out.write_all(&rest.as_bytes()[..open])?;
                out.write_all(text.as_bytes())?;
                rest = &after[close + 2..];
            }
            None => {
                out.write_all(&rest.as_bytes()[..open + 2])?;
                rest = after;
            }
        }
    }
    out.write_all(rest.as_bytes())
}

/// Text for an HTML text node.
fn escape_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const TEMPLATE: &str = include_str!("page.html");
const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

#[cfg(test)]
mod tests {
    #[test]
    fn files_are_named_by_their_rank_else_by_the_tail_that_tells_them_apart() {
        let n = |files: &[&str]| -> Vec<String> { names(files).into_iter().map(|x| x.0).collect() };
        assert_eq!(
            n(&[
                "/a/memory_snapshot_rank3_step0.pickle.xz",
                "/a/memory_snapshot_rank12_step0.pickle.xz"
            ]),
            ["rank 3", "rank 12"]
        );
        // the same rank twice (two steps): the names tell them apart
        assert_eq!(
            n(&[
                "/x/rank0_step0.pickle",
                "/x/rank0_step1.pickle",
                "/x/rank1_step0.pickle"
            ]),
            ["rank0_step0.pickle", "rank0_step1.pickle", "rank 1"]
        );
        // no rank: the whole base name, never its cut end
        assert_eq!(
            n(&["/t/huge0.pickle", "/t/huge1.pickle"]),
            ["huge0.pickle", "huge1.pickle"]
        );
        assert_eq!(
            n(&["/a/s.pickle", "/b/s.pickle"]),
            ["a/s.pickle", "b/s.pickle"]
        );
    }

    use super::*;

    #[test]
    fn data_cannot_close_its_script_element() {
        let page = Page::new(Parts {
            command: "memsnap view </script><script>alert(1)</script>".into(),
            title: "<b>{{data}}".into(),
            ..Parts::default()
        });
        let json = data_json(&page).unwrap();
        assert!(!json.contains('<'));
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        let command = back["command"]["$"].as_u64().unwrap() as usize;
        assert_eq!(
            back["strings"][command],
            "memsnap view </script><script>alert(1)</script>"
        );
        let mut html = Vec::new();
        write(&mut html, &page).unwrap();
        let html = String::from_utf8(html).unwrap();
        assert_eq!(html.matches("</script>").count(), 2, "the page's own two");
        assert!(html.contains("<title>&lt;b&gt;{{data}}</title>"), "{html}");
        assert_eq!(html.matches("id=\"memsnap-data\">{").count(), 1);
    }

    #[test]
    fn slots_are_filled_once() {
        let mut out = Vec::new();
        fill(
            &mut out,
            "<{{a}}|{{b}}|{{c}}|{{",
            &[("a", "{{b}}"), ("b", "x{{a}}")],
        )
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "<{{b}}|x{{a}}|{{c}}|{{");
    }

    #[test]
    fn budgets_shrink_with_panels_but_keep_a_floor() {
        let one = Budget::for_panels(1);
        let many = Budget::for_panels(64);
        assert_eq!(one.fine, 16_384);
        assert_eq!(many.fine, 1_024);
        assert!(many.columns >= 256 && many.blocks >= 60);
    }
}

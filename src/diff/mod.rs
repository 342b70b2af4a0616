//! Diff: why one run of a program used more (or less) memory than another, cause by cause.
//!
//! The two runs' requests are [aligned](align) into one timeline. Every block then either has
//! a partner in the other run or not, and each difference is one of a few kinds ([`Kind`]):
//! an allocation only one run made (new, gone, or a changed count where the site allocates in
//! both), a size that changed, a life that changed (freed in another gap of the aligned
//! requests: "now alive until the optimizer step"), or a block alive before recording started.
//! Blocks are grouped into causes by kind, call site and category (the layers of a model,
//! which share their call sites, make one cause, their modules listed as one range). Where
//! allocations at one site are gone and others, called from the same place, are new (an
//! attention function replaced by another), the two make one cause.
//!
//! **Effects on the peak, exactly.** Start from the base run's allocated bytes at every
//! position of the timeline; apply the causes one after the other, each replacing its base
//! blocks with its new ones ([`effects::Curve`]), and read the highest point after each. A
//! cause's effect is how much it moved that highest point, so the effects add up to the new
//! peak minus the base peak, to the byte. The order is the causes' effects applied alone,
//! largest first; both figures are kept.
//!
//! **Reserved bytes** are said apart: when the allocator settings differ, the new run's
//! requests are [simulated](crate::simulate) under the base run's settings, which splits the
//! change of the reserved peak into what the requests did and what the settings did. With the
//! same requests and settings, a different reserved peak is the allocator's placement alone.

pub mod align;
pub mod effects;
pub mod names;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::analysis::breakdown::without_frames;
use crate::analysis::{DeviceAnalysis, Dimension, Keyer};
use crate::attribute::Label;
use crate::simulate::{self, AllocConf, Program};
use align::{Block, Origin, Pairing};
use effects::{Curve, Span};

/// What kind of difference a cause is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Allocations only the new run made, at a site the base run never allocated at.
    New,
    /// Allocations only the base run made, at a site the new run never allocated at.
    Gone,
    /// More or fewer allocations at a site that allocates in both runs.
    Count,
    /// The same request, another size.
    Size,
    /// The same request and size, freed at another point.
    Life,
    /// Blocks alive before recording started.
    BeforeRecording,
    /// The allocator alone: reserved bytes, not requests.
    Allocator,
}

impl Kind {
    /// The kind in one word, as the JSON names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::New => "new",
            Kind::Gone => "gone",
            Kind::Count => "count",
            Kind::Size => "size",
            Kind::Life => "life",
            Kind::BeforeRecording => "before_recording",
            Kind::Allocator => "allocator",
        }
    }
}

/// One cause of the difference.
#[derive(Clone, Debug, Serialize)]
pub struct Cause {
    /// What kind of difference.
    pub kind: Kind,
    /// The allocation site (the program's innermost frames).
    pub site: String,
    /// The module path where known (the chain of `forward` methods), else the place.
    pub module: String,
    /// Category of the blocks.
    pub category: String,
    /// The step(s) the blocks were allocated in.
    pub step: String,
    /// The phase(s) the blocks were allocated in.
    pub phase: String,
    /// How much this cause moved the peak of allocated bytes, applied after the causes above
    /// it; the effects of all causes add up to the change of the peak.
    pub peak_effect_bytes: i64,
    /// How much it would move the base run's peak alone.
    pub alone_effect_bytes: i64,
    /// Blocks of the base run in this cause.
    pub blocks_base: u64,
    /// Blocks of the new run in this cause.
    pub blocks_new: u64,
    /// Their bytes in the base run (each block counted once).
    pub bytes_base: u64,
    /// Their bytes in the new run.
    pub bytes_new: u64,
    /// The cause in words.
    pub what: String,
    /// For the allocator: how much it moved the reserved peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_effect_bytes: Option<i64>,
    /// The cause's blocks on the merged timeline: each base block taken away (`-1`), each new
    /// block added (`+1`); the page draws them (not in the JSON).
    #[serde(skip)]
    pub spans: Vec<(Span, i64)>,
    /// Where this cause is one change made of several: those causes, largest first (their
    /// effects add up to this one's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Cause>,
}

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    /// The file as given.
    pub file: String,
    /// Device ordinal.
    pub device: u32,
    /// Peak allocated bytes (`max_memory_allocated()`).
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes (`max_memory_reserved()`).
    pub peak_reserved_bytes: u64,
    /// Allocations recorded.
    pub requests: usize,
    /// The allocator settings, as `PYTORCH_CUDA_ALLOC_CONF` would say them.
    pub alloc_conf: String,
    /// Recorded time from the first event to the last, in microseconds.
    pub duration_us: i64,
}

/// Sizes that changed by one ratio (a larger batch or sequence).
#[derive(Clone, Debug, Serialize)]
pub struct Scaling {
    /// New size over base size, to two decimals.
    pub ratio: f64,
    /// Aligned requests whose size changed by that ratio (within 5%).
    pub requests: u64,
    /// Share of the bytes that changed size that changed by that ratio.
    pub share: f64,
}

/// The change of the reserved peak, split where the settings differ.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Reserved {
    /// Whether the allocator settings differ.
    pub settings_differ: bool,
    /// The new run's requests under the base run's settings, simulated: their reserved peak.
    pub new_requests_base_settings_bytes: Option<u64>,
    /// What the requests did to the reserved peak (simulated minus base).
    pub requests_effect_bytes: Option<i64>,
    /// What the settings did (new minus simulated).
    pub settings_effect_bytes: Option<i64>,
}

/// Why the new run's memory differs from the base run's.
#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    /// The base run.
    pub base: Side,
    /// The new run.
    pub new: Side,
    /// New peak allocated minus base peak allocated.
    pub peak_allocated_delta_bytes: i64,
    /// New peak reserved minus base peak reserved.
    pub peak_reserved_delta_bytes: i64,
    /// `no change`, `allocator only` or `changed`.
    pub verdict: String,
    /// Requests aligned between the runs.
    pub aligned_requests: usize,
    /// Whether the alignment finished (a very different pair may settle for a coarser one).
    pub alignment_complete: bool,
    /// Whether each run's peak rebuilt on the shared timeline equals its replayed peak (it
    /// always should; the effects add up to the change either way).
    pub exact: bool,
    /// Sizes that changed by one ratio, when most did.
    pub scaling: Option<Scaling>,
    /// The reserved peak's change, split.
    pub reserved: Reserved,
    /// What the difference looks like as a whole, in words (checkpointing switched on or
    /// off, sizes scaled, settings changed).
    pub notes: Vec<String>,
    /// The causes, largest effect first.
    pub causes: Vec<Cause>,
    /// Both runs' allocated bytes on the merged timeline, for the page (not in the JSON).
    #[serde(skip)]
    pub timeline: Timeline,
}

/// Both runs' allocated bytes on the merged timeline (every allocation and free of either run
/// one position, aligned requests side by side), in columns.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// Positions of the merged timeline.
    pub positions: usize,
    /// Each column's first position (the last column ends at `positions`).
    pub column_starts: Vec<u32>,
    /// The base run's highest allocated bytes in each column.
    pub base: Vec<u64>,
    /// The new run's highest allocated bytes in each column.
    pub new: Vec<u64>,
}

impl Timeline {
    /// Most columns drawn.
    pub const COLUMNS: usize = 1600;

    fn new(base: &[i64], new: &[i64], positions: usize) -> Timeline {
        let columns = positions.clamp(1, Self::COLUMNS);
        let column_starts: Vec<u32> = (0..columns)
            .map(|c| (c as u64 * positions as u64 / columns as u64) as u32)
            .collect();
        let mut t = Timeline {
            positions,
            column_starts,
            ..Timeline::default()
        };
        t.base = t.column_max(base);
        t.new = t.column_max(new);
        t
    }

    /// The column of a position.
    pub fn column_of(&self, position: u32) -> usize {
        self.column_starts
            .partition_point(|&s| s <= position)
            .saturating_sub(1)
    }

    /// The highest of `values` (one per position) in each column, never below zero.
    fn column_max(&self, values: &[i64]) -> Vec<u64> {
        let mut out = vec![0u64; self.column_starts.len()];
        for (c, o) in out.iter_mut().enumerate() {
            let from = self.column_starts[c] as usize;
            let to = self
                .column_starts
                .get(c + 1)
                .map_or(self.positions, |&s| s as usize)
                .min(values.len());
            *o = values
                .get(from..to.max(from))
                .and_then(|v| v.iter().copied().max())
                .unwrap_or(0)
                .max(0) as u64;
        }
        out
    }

    /// The live bytes of one run's blocks among `spans` (those of sign `sign`), highest in
    /// each column: a sweep over the spans' ends.
    pub fn spans_by_column(&self, spans: &[(Span, i64)], sign: i64) -> Vec<u64> {
        let mut ends: Vec<(u32, i64)> = Vec::new();
        for (s, k) in spans {
            if *k == sign && s.start < s.end {
                ends.push((s.start, s.bytes as i64));
                ends.push((s.end, -(s.bytes as i64)));
            }
        }
        ends.sort_unstable();
        let mut out = vec![0u64; self.column_starts.len()];
        let mut live: i64 = 0;
        let mut i = 0;
        while i < ends.len() {
            let at = ends[i].0;
            while i < ends.len() && ends[i].0 == at {
                live += ends[i].1;
                i += 1;
            }
            let until = ends.get(i).map_or(at, |e| e.0);
            if live > 0 && (at as usize) < self.positions {
                // the value `live` holds over [at, until)
                let last = until.max(at + 1) - 1;
                let (from, to) = (self.column_of(at), self.column_of(last));
                for o in &mut out[from..=to] {
                    *o = (*o).max(live as u64);
                }
            }
        }
        out
    }
}

impl Diff {
    /// Whether nothing the program asked for changed (the allocator may still differ).
    pub fn same_requests(&self) -> bool {
        self.causes.iter().all(|c| c.kind == Kind::Allocator)
    }
}

/// Allocations a run made while activation checkpointing recomputed a forward.
fn recomputed(a: &DeviceAnalysis) -> u64 {
    let Some(stage) = a
        .attribution
        .names
        .find(crate::attribute::generic::RECOMPUTE)
    else {
        return 0;
    };
    a.snap
        .trace(a.device())
        .iter()
        .zip(&a.attribution.labels)
        .filter(|(e, l)| e.action == crate::snapshot::Action::Alloc && l.stage == stage)
        .count() as u64
}

/// Sizes too far apart to be one request grown or shrunk (a batch or a sequence four times
/// longer makes sizes 16 times larger at most, through attention's square).
fn implausible(a: u64, b: u64) -> bool {
    const FAR: u64 = 16;
    a.max(b) > a.min(b).saturating_mul(FAR)
}

/// The labels of one block.
fn label_of<'a>(a: &'a DeviceAnalysis, b: &Block) -> (&'a Label, crate::snapshot::StackId) {
    match b.origin {
        Origin::Event(i) => (&a.attribution.labels[i], a.snap.trace(a.device())[i].stack),
        Origin::BeforeTrace(k) => (
            a.attribution
                .preexisting
                .get(k)
                .unwrap_or(&Label::BEFORE_TRACE),
            a.replay.preexisting[k].stack,
        ),
    }
}

/// Where a block's life ended, in words: `the optimizer (train step 1)`, `the end`.
fn end_place(a: &DeviceAnalysis, keyer: &mut Keyer, b: &Block) -> String {
    match b.freed_by {
        None => "the end".to_string(),
        Some(f) => {
            let events = a.snap.trace(a.device());
            let l = &a.attribution.labels[f];
            let freed_in = step_of(keyer, l, events[f].stack);
            // the step of the free told against the allocation's, so that one change (a
            // reference kept every step) is one cause whichever step it happened in
            let allocated_in = match b.origin {
                Origin::Event(i) => Some(step_of(keyer, &a.attribution.labels[i], events[i].stack)),
                Origin::BeforeTrace(_) => None,
            };
            // (a step that is only its phase's name says nothing more)
            let step = match freed_in == l.phase.as_str() {
                true => String::new(),
                false => relative_step(allocated_in.as_deref(), &freed_in),
            };
            format!("{}{step}", l.phase.as_str())
        }
    }
}

/// Which step a free came in, told against the step of its allocation: nothing for the same
/// step, else ` of the next step`, ` of a later step` or the free's own step.
fn relative_step(allocated_in: Option<&str>, freed_in: &str) -> String {
    fn numbered(s: &str) -> Option<(&str, u64)> {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, n) = s.split_at(s.len() - digits);
        Some((prefix, n.parse().ok()?))
    }
    match allocated_in {
        Some(from) if from == freed_in => String::new(),
        Some(from) => match (numbered(from), numbered(freed_in)) {
            (Some((p, a)), Some((q, b))) if p == q && b == a + 1 => " of the next step".into(),
            (Some((p, a)), Some((q, b))) if p == q && b > a + 1 => " of a later step".into(),
            _ => format!(" ({freed_in})"),
        },
        None => format!(" ({freed_in})"),
    }
}

/// One run's keys of a block: site, module, category, step, phase.
#[derive(Clone)]
struct Keys {
    /// Where a changed life ended: base and new place, or [`SAME_PLACE`].
    ends: String,
    /// The block's own site where [`Keys::site`] holds its module instead.
    place_site: String,
    /// The line of the innermost frame, which [`Keys::site`] leaves out.
    line: Option<String>,
    site: String,
    module: String,
    category: String,
    step: String,
    phase: String,
}

/// The whole step of an event, without its phase: `train step 1`, `step 4`.
fn step_of(keyer: &mut Keyer, l: &Label, stack: crate::snapshot::StackId) -> String {
    let step = keyer.key(Dimension::Step, l, stack);
    let step = keyer.whole_step(&step);
    let phase = format!(" · {}", l.phase.as_str());
    match step.strip_suffix(&phase) {
        Some(s) => s.to_string(),
        None => step,
    }
}

/// A site without the line of its innermost frame, and that line: the allocations of one
/// function make one cause, whichever of its lines asked.
fn split_line(site: &str) -> (String, Option<String>) {
    let last = site.rsplit(';').next().unwrap_or(site);
    match last.rsplit_once(':') {
        Some((_, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => (
            site[..site.len() - line.len() - 1].to_string(),
            Some(line.to_string()),
        ),
        _ => (site.to_string(), None),
    }
}

impl Keys {
    /// The keys of a block that only the allocator's rounding changed: one cause of all.
    fn allocator() -> Keys {
        Keys {
            ends: String::new(),
            place_site: String::new(),
            line: None,
            site: String::new(),
            module: String::new(),
            category: String::new(),
            step: String::new(),
            phase: String::new(),
        }
    }
}

/// Marks a cause's site slot that holds a module (life changes are grouped by module).
const MODULE_KEY: &str = "\u{1d}";

/// The outermost part of a module path down to its first numbered module (a layer of a
/// stack: `forward[3]:322`), and that module alone with its number and calling line left out,
/// so that every layer's blocks make one cause: (`…forward[3]:322`, `forward[]`). A path
/// without a numbered module is whole.
fn module_root(module: &str) -> (String, String) {
    let parts: Vec<&str> = module.split(crate::attribute::modules::SEPARATOR).collect();
    let numbered = |p: &str| {
        p.find('[').is_some_and(|at| {
            let rest = &p[at + 1..];
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            digits > 0 && rest[digits..].starts_with(']')
        })
    };
    let Some(k) = parts.iter().position(|p| numbered(p)) else {
        return (module.to_string(), module.to_string());
    };
    let root = parts[..=k].join(crate::attribute::modules::SEPARATOR);
    let at = parts[k].find('[').unwrap_or(0);
    let close = parts[k][at..].find(']').map_or(at, |c| at + c);
    // without the number and the line it was called from
    let after = parts[k][close..].trim_end_matches(|c: char| c.is_ascii_digit());
    let after = after.strip_suffix(':').unwrap_or(after);
    let unnumbered = format!("{}[{}", &parts[k][..at], after);
    // the numbered module alone: a chain seen from another caller (recorded through another
    // path, or cut short) still finds its layer
    (root, unnumbered)
}

fn keys_now(keyer: &mut Keyer, l: &Label, stack: crate::snapshot::StackId) -> Keys {
    let (site, line) = split_line(&keyer.key(Dimension::Site, l, stack));
    Keys {
        ends: String::new(),
        place_site: String::new(),
        line,
        site,
        module: keyer.key(Dimension::Stage, l, stack),
        category: l.category.as_str().to_string(),
        step: step_of(keyer, l, stack),
        phase: l.phase.as_str().to_string(),
    }
}

/// Modules listed for one cause.
const MAX_MODULES: usize = 256;

/// A cause while it is gathered.
#[derive(Default)]
struct Gathered {
    spans: Vec<(Span, i64)>,
    /// What the cause adds to the base run's allocated bytes, as ranges of positions and
    /// bytes: a pair's two blocks start at one position, so a changed life is one range.
    net: Vec<effects::Range>,
    blocks: (u64, u64),
    bytes: (u64, u64),
    steps: Vec<String>,
    phases: Vec<String>,
    /// Where changed lives ended ([`Keys::ends`]), counted.
    ends: HashMap<String, u64>,
    /// For a cause grouped by module: its blocks' sites, with their bytes.
    sites: Vec<(String, u64)>,
    /// Lines of the innermost frame its blocks were allocated at (a few).
    lines: Vec<String>,
    /// The modules of its blocks (at most [`MAX_MODULES`]).
    modules: Vec<String>,
    /// Sites of allocations gone that this cause's new ones replace, with blocks and bytes.
    replaces: Vec<(String, u64, u64)>,
    /// New size over base size of size changes (hundredths), with the bytes that changed.
    ratios: HashMap<u64, (u64, u64)>,
}

impl Gathered {
    fn note(&mut self, k: &Keys, bytes: u64) {
        if !k.place_site.is_empty() {
            let full = self.sites.len() >= MAX_MODULES;
            match self.sites.iter_mut().find(|(s, _)| *s == k.place_site) {
                Some(entry) => entry.1 += bytes,
                None if !full => self.sites.push((k.place_site.clone(), bytes)),
                None => {}
            }
        }
        if let Some(line) = &k.line {
            if self.lines.len() < 8 && !self.lines.contains(line) {
                self.lines.push(line.clone());
            }
        }
        if self.modules.len() < MAX_MODULES && !self.modules.contains(&k.module) {
            self.modules.push(k.module.clone());
        }
        if !self.steps.contains(&k.step) {
            self.steps.push(k.step.clone());
        }
        if !self.phases.contains(&k.phase) {
            self.phases.push(k.phase.clone());
        }
    }
}

/// A cause's key: kind, site, category, and for a changed life where it ended in each run.
type Key = (Kind, String, String, String);

/// Where a life ended in both runs, when it ended in the same phase and step of each (the
/// blocks' frees only moved among their neighbours).
const SAME_PLACE: &str = "the same place";

/// The two runs' figures and causes. `base` and `new` are one device of each run.
pub fn diff(base: &DeviceAnalysis, new: &DeviceAnalysis, files: (&str, &str)) -> Diff {
    let renames = names::renames(base.snap, new.snap);
    let aligned = align::align(base, new, &renames);
    let mut kb = Keyer::new(base.snap, &base.attribution);
    let mut kn = Keyer::new(new.snap, &new.attribution);
    if !renames.is_empty() {
        kn = kn.renaming(|text| renames.apply(text));
    }
    let sites = shared_sites(base, new, &aligned, &mut kb, &mut kn);
    let (mut groups, mut order) = gather(base, new, &aligned, (&mut kb, &mut kn), &sites);
    merge_replaced(&mut groups, &mut order);
    let scaled = scaling(&groups).map(|s| (s.ratio * 100.0).round() as u64);
    let reserved = reserved_split(base, new);
    let (mut causes, exact, timeline) = effects_on_the_peak(
        base,
        new,
        &aligned,
        &groups,
        &order,
        scaled,
        !reserved.settings_differ,
    );
    let side = |a: &DeviceAnalysis, file: &str, requests: usize| Side {
        file: file.to_string(),
        device: a.device(),
        peak_allocated_bytes: a.replay.peaks.allocated.bytes,
        peak_reserved_bytes: a.replay.peaks.reserved.bytes,
        requests,
        alloc_conf: AllocConf::recorded(a.snap).to_string(),
        duration_us: a.replay.time_span_us.1 - a.replay.time_span_us.0,
    };
    let (sb, sn) = (
        side(base, files.0, aligned.requests.0),
        side(new, files.1, aligned.requests.1),
    );
    let delta_reserved = sn.peak_reserved_bytes as i64 - sb.peak_reserved_bytes as i64;
    let delta_allocated = sn.peak_allocated_bytes as i64 - sb.peak_allocated_bytes as i64;
    let same_requests = causes.iter().all(|c| c.kind == Kind::Allocator);
    if let Some(c) = allocator_cause(&reserved, &sb, &sn, same_requests, delta_reserved) {
        // one allocator cause: the rounding's allocated bytes and the reserved bytes together
        match causes.iter_mut().find(|x| x.kind == Kind::Allocator) {
            Some(rounding) => {
                rounding.reserved_effect_bytes = c.reserved_effect_bytes;
                rounding.what = format!("{}; {}", c.what, rounding.what);
            }
            None => causes.push(c),
        }
    }
    let verdict = if causes.is_empty() {
        "no change"
    } else if causes.iter().all(|c| c.kind == Kind::Allocator) {
        "allocator only"
    } else {
        "changed"
    };
    let mut notes = Vec::new();
    let (rb, rn) = (recomputed(base), recomputed(new));
    if (rb == 0) != (rn == 0) {
        let (on, off) = if rb > 0 {
            ("base", "new")
        } else {
            ("new", "base")
        };
        notes.push(format!(
            "Activation checkpointing is on in the {on} run ({} recomputed in backward) and off in the {off} run: {}.",
            crate::units::counted(rb.max(rn), "allocation"),
            if rb > 0 {
                "activations the base run freed in forward now stay alive until backward"
            } else {
                "activations are freed in forward and recomputed in backward"
            }
        ));
    }
    if rb > 0 && rn == 0 {
        // the change that keeps activations until backward is the checkpointing switched off
        if let Some(c) = causes.iter_mut().find(|c| {
            c.kind == Kind::Life
                && c.category.contains("activation")
                && c.what.contains("now alive until backward")
        }) {
            c.what = format!("activation checkpointing off: {}", c.what);
        }
    }
    Diff {
        notes,
        peak_allocated_delta_bytes: delta_allocated,
        peak_reserved_delta_bytes: delta_reserved,
        base: sb,
        new: sn,
        verdict: verdict.to_string(),
        aligned_requests: aligned.aligned,
        alignment_complete: aligned.complete,
        exact,
        scaling: scaling(&groups).filter(|_| {
            // only where sizes made most of the change of the peak
            let by_size: i64 = causes
                .iter()
                .filter(|c| c.kind == Kind::Size)
                .map(|c| c.peak_effect_bytes)
                .sum();
            let delta = delta_allocated;
            delta != 0 && by_size.signum() == delta.signum() && by_size.abs() * 2 >= delta.abs()
        }),
        reserved,
        causes,
        timeline,
    }
}

/// The call sites (without the innermost line) that allocate in both runs, of each run: there,
/// a block of one run only is a changed count.
fn shared_sites(
    base: &DeviceAnalysis,
    new: &DeviceAnalysis,
    aligned: &align::Aligned,
    kb: &mut Keyer,
    kn: &mut Keyer,
) -> (HashSet<String>, HashSet<String>) {
    // (a site's text depends on the stack, and on the label only where the stack has no
    // frames: each distinct pair is named once)
    let mut stacks_b = HashMap::new();
    let mut stacks_n = HashMap::new();
    for p in &aligned.pairs {
        if let Pairing::Both(b, n) = *p {
            if implausible(aligned.base[b].span.bytes, aligned.new[n].span.bytes) {
                continue;
            }
            let (lb, sb) = label_of(base, &aligned.base[b]);
            let (ln, sn) = label_of(new, &aligned.new[n]);
            stacks_b.entry((sb, without_frames(lb))).or_insert(lb);
            stacks_n.entry((sn, without_frames(ln))).or_insert(ln);
        }
    }
    let sites_b: HashSet<String> = stacks_b
        .iter()
        .map(|(&(stack, _), l)| split_line(&kb.key(Dimension::Site, l, stack)).0)
        .collect();
    let sites_n: HashSet<String> = stacks_n
        .iter()
        .map(|(&(stack, _), l)| split_line(&kn.key(Dimension::Site, l, stack)).0)
        .collect();

    (sites_b, sites_n)
}

/// One run's keys of blocks, each distinct (stack, label) once, and the places lives ended,
/// each distinct (free, allocation's step) once.
#[derive(Default)]
struct KeyTable {
    ids: rustc_hash::FxHashMap<(crate::snapshot::StackId, Label), u32>,
    keys: Vec<Keys>,
    #[allow(clippy::type_complexity)]
    end_ids: rustc_hash::FxHashMap<(Option<(crate::snapshot::StackId, Label)>, u32), u32>,
    ends: Vec<String>,
}

/// A label with only what a cause's keys read ([`keys_now`], [`end_place`]): its step, phase,
/// op, stage, category and evidence, and whether it is from before the trace. Labels that
/// differ only in the rest (micro-batch, layer, node, range, call) share their keys.
fn keyed(l: &Label) -> Label {
    Label {
        train_step: l.train_step,
        pipe_step: l.pipe_step,
        phase: l.phase,
        op: l.op,
        stage: l.stage,
        category: l.category,
        evidence: l.evidence,
        call: if l.call == u32::MAX { u32::MAX } else { 0 },
        ..Label::EMPTY
    }
}

/// No key: a block of the other run only, or an allocation before recording.
const NO_KEY: u32 = u32::MAX;

impl KeyTable {
    /// The id of a block's keys.
    fn id(&mut self, a: &DeviceAnalysis, keyer: &mut Keyer, b: &Block) -> u32 {
        let (l, stack) = label_of(a, b);
        let l = keyed(l);
        if let Some(&id) = self.ids.get(&(stack, l)) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push(keys_now(keyer, &l, stack));
        self.ids.insert((stack, l), id);
        id
    }

    /// The id of where a block's life ended ([`end_place`]); `own` is its keys' id.
    fn end(&mut self, a: &DeviceAnalysis, keyer: &mut Keyer, b: &Block, own: u32) -> u32 {
        // the allocation's step matters, not the rest of its keys; before recording it has
        // none
        let from = match b.origin {
            Origin::Event(_) => own,
            Origin::BeforeTrace(_) => NO_KEY,
        };
        // and of the free, its labels and stack: not the event itself
        let free = b.freed_by.map(|f| {
            (
                a.snap.trace(a.device())[f].stack,
                keyed(&a.attribution.labels[f]),
            )
        });
        if let Some(&id) = self.end_ids.get(&(free, from)) {
            return id;
        }
        let id = self.ends.len() as u32;
        self.ends.push(end_place(a, keyer, b));
        self.end_ids.insert((free, from), id);
        id
    }
}

/// Blocks that make the same cause, however many: their kind, keys and ends as ids, gathered
/// once each before their keys are made into text.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Variant {
    kind: Kind,
    /// Which run's keys name it: 0 base, 1 new.
    side: u8,
    /// The keys of the run that names it, and the base run's where a life changed.
    own: u32,
    base: u32,
    /// Where its life ended in each run, where it changed.
    ends: (u32, u32),
}

/// The variant of a block of one run only (`side` 0 base, 1 new; `own` its keys' id): gone
/// or new, or alive before recording started; and its bytes.
fn one_run(block: &Block, side: u8, own: u32) -> (Variant, u64) {
    let kind = match (block.origin, side) {
        (Origin::BeforeTrace(_), _) => Kind::BeforeRecording,
        (_, 0) => Kind::Gone,
        _ => Kind::New,
    };
    let v = Variant {
        kind,
        side,
        own,
        base: NO_KEY,
        ends: (NO_KEY, NO_KEY),
    };
    (v, block.span.bytes)
}

/// Every difference of the aligned runs, grouped into causes (in the order first met).
///
/// Each block is first given a [`Variant`] (ids only, no text); each variant's keys are then
/// made into text once, variants of one key make one cause, and a last pass over the blocks
/// adds each to its cause.
fn gather(
    base: &DeviceAnalysis,
    new: &DeviceAnalysis,
    aligned: &align::Aligned,
    keyers: (&mut Keyer, &mut Keyer),
    sites: &(HashSet<String>, HashSet<String>),
) -> (BTreeMap<Key, Gathered>, Vec<Key>) {
    let (kb, kn) = keyers;
    let (mut tb, mut tn) = (KeyTable::default(), KeyTable::default());
    let mut ids: rustc_hash::FxHashMap<Variant, u32> = Default::default();
    // each variant once, with the bytes of the run that names it
    let mut variants: Vec<(Variant, u64)> = Vec::new();
    // a pair whose sizes differ more than this many times is two requests the alignment
    // matched by position (allocations without frames share one call site): one gone, one new
    let split = |p: &Pairing| -> [Option<Pairing>; 2] {
        match *p {
            Pairing::Both(b, n)
                if implausible(aligned.base[b].span.bytes, aligned.new[n].span.bytes) =>
            {
                [Some(Pairing::Base(b)), Some(Pairing::New(n))]
            }
            other => [Some(other), None],
        }
    };
    let pairs: Vec<Pairing> = aligned.pairs.iter().flat_map(split).flatten().collect();
    let mut of_pair: Vec<u32> = Vec::with_capacity(pairs.len());
    for &p in &pairs {
        let (variant, bytes) = match p {
            Pairing::Both(b, n) => {
                let (x, y) = (&aligned.base[b], &aligned.new[n]);
                if x.span.bytes == y.span.bytes && x.free_gap == y.free_gap {
                    of_pair.push(NO_KEY);
                    continue;
                }
                let kind = if matches!(x.origin, Origin::BeforeTrace(_)) {
                    Kind::BeforeRecording
                } else if x.requested == y.requested && x.free_gap == y.free_gap {
                    // the same request, held as a block of another size: the allocator's
                    // rounding (expandable segments round large blocks otherwise)
                    Kind::Allocator
                } else if x.requested != y.requested {
                    Kind::Size
                } else {
                    Kind::Life
                };
                let own = tn.id(new, kn, y);
                let was = tb.id(base, kb, x);
                let ends = if x.free_gap != y.free_gap {
                    (tb.end(base, kb, x, was), tn.end(new, kn, y, own))
                } else {
                    (NO_KEY, NO_KEY)
                };
                let v = Variant {
                    kind,
                    side: 1,
                    own,
                    base: if kind == Kind::Life { was } else { NO_KEY },
                    ends,
                };
                (v, y.span.bytes)
            }
            Pairing::Base(b) => one_run(&aligned.base[b], 0, tb.id(base, kb, &aligned.base[b])),
            Pairing::New(n) => one_run(&aligned.new[n], 1, tn.id(new, kn, &aligned.new[n])),
        };
        let id = *ids.entry(variant).or_insert_with(|| {
            variants.push((variant, 0));
            variants.len() as u32 - 1
        });
        variants[id as usize].1 += bytes;
        of_pair.push(id);
    }

    // each variant's cause, by its keys in text
    let mut groups: Vec<Gathered> = Vec::new();
    let mut order: Vec<Key> = Vec::new();
    let mut at: HashMap<Key, usize> = HashMap::new();
    let mut group_of: Vec<(u32, String)> = Vec::with_capacity(variants.len());
    for (v, noted) in &variants {
        let (kind, keys) = variant_keys(v, (&tb, &tn), sites);
        let key = (
            kind,
            keys.site.clone(),
            keys.category.clone(),
            keys.ends.clone(),
        );
        let g = *at.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            groups.push(Gathered::default());
            groups.len() - 1
        });
        groups[g].note(&keys, *noted);
        group_of.push((g as u32, keys.ends));
    }
    for (&p, &id) in pairs.iter().zip(&of_pair) {
        if id == NO_KEY {
            continue;
        }
        let (gi, ends) = &group_of[id as usize];
        let g = &mut groups[*gi as usize];
        match p {
            Pairing::Both(b, n) => {
                let (x, y) = (&aligned.base[b], &aligned.new[n]);
                g.spans.push((x.span, -1));
                g.spans.push((y.span, 1));
                g.net.extend(effects::net(&x.span, &y.span));
                g.blocks.0 += 1;
                g.blocks.1 += 1;
                g.bytes.0 += x.span.bytes;
                g.bytes.1 += y.span.bytes;
                if x.requested != y.requested && x.span.bytes > 0 {
                    // of the sizes asked for where both are known (a block's rounding would
                    // blur a batch's ratio on small blocks), else of the blocks
                    let (from, to) = if x.requested > 0 && y.requested > 0 {
                        (x.requested, y.requested)
                    } else {
                        (x.span.bytes, y.span.bytes)
                    };
                    let ratio = (to as u128 * 100 / from as u128) as u64;
                    let e = g.ratios.entry(ratio).or_default();
                    e.0 += 1;
                    e.1 += x.span.bytes.abs_diff(y.span.bytes);
                }
                if x.free_gap != y.free_gap {
                    match g.ends.get_mut(ends) {
                        Some(n) => *n += 1,
                        None => {
                            g.ends.insert(ends.clone(), 1);
                        }
                    }
                }
            }
            Pairing::Base(b) => {
                let x = &aligned.base[b];
                g.spans.push((x.span, -1));
                g.net
                    .push((x.span.start, x.span.end, -(x.span.bytes as i64)));
                g.blocks.0 += 1;
                g.bytes.0 += x.span.bytes;
            }
            Pairing::New(n) => {
                let y = &aligned.new[n];
                g.spans.push((y.span, 1));
                g.net.push((y.span.start, y.span.end, y.span.bytes as i64));
                g.blocks.1 += 1;
                g.bytes.1 += y.span.bytes;
            }
        }
    }
    let groups = order.iter().cloned().zip(groups).collect();

    (groups, order)
}

/// A variant's kind and keys in text: the kind of a block of one run (gone or new, or a changed
/// count where its site allocates in both), the category a changed life is told by, and where
/// lives ended.
fn variant_keys(
    v: &Variant,
    tables: (&KeyTable, &KeyTable),
    sites: &(HashSet<String>, HashSet<String>),
) -> (Kind, Keys) {
    let (tb, tn) = tables;
    let table = if v.side == 0 { tb } else { tn };
    let mut k = table.keys[v.own as usize].clone();
    let mut kind = v.kind;
    match kind {
        Kind::Gone if sites.0.contains(&k.site) => kind = Kind::Count,
        Kind::New if sites.1.contains(&k.site) => kind = Kind::Count,
        Kind::Allocator => k = Keys::allocator(),
        _ => {}
    }
    if kind == Kind::Life {
        let was = &tb.keys[v.base as usize].category;
        let (end_b, end_n) = (&tb.ends[v.ends.0 as usize], &tn.ends[v.ends.1 as usize]);
        if (end_n == "the end" && end_b != "the end")
            || (MODEL_STATE.contains(&was.as_str()) && !MODEL_STATE.contains(&k.category.as_str()))
        {
            // a block now never freed has no life of its own to tell its category by (it
            // reads as kept to the end), and a gradient now freed in backward (accumulated
            // into a kept one) reads as a temporary: the base run's says what it was
            k.category = was.clone();
        }
    }
    if v.ends.0 != NO_KEY {
        let ends = (&tb.ends[v.ends.0 as usize], &tn.ends[v.ends.1 as usize]);
        k.ends = if ends.0 == ends.1 {
            SAME_PLACE.to_string()
        } else {
            format!("{}\u{1f}{}", ends.0, ends.1)
        };
        if kind == Kind::Life && k.ends != SAME_PLACE {
            // blocks kept longer by one change (checkpointing off, a reference kept) sit at
            // many sites of one module: one cause per module
            let root = module_root(&k.module).0;
            let sep = crate::attribute::modules::SEPARATOR;
            // the numbered module itself: the same text for every layer
            k.module = root.rsplit(sep).next().unwrap_or(&root).to_string();
            k.place_site = std::mem::replace(
                &mut k.site,
                format!("{MODULE_KEY}{}", module_root(&k.module).1),
            );
        }
    }
    (kind, k)
}

/// Categories that make the model's state: what one parameter brings, whose gradient and
/// optimizer state change with it.
const MODEL_STATE: [&str; 3] = ["parameter", "gradient", "optimizer state"];

/// What ties the causes of one change together ([`bundles`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Bundle {
    /// Sizes changed by the ratio most size changes share.
    Scaled,
    /// Parameters, their gradients and optimizer state.
    ModelState,
    /// Blocks once freed in one place, now kept to the end: what a kept reference holds (a
    /// graph with its saved activations, over every module it ran through).
    Kept(String),
    /// The numbered layers of one stack (the module without its number).
    Layers(String),
    /// One kind at one call site, over steps and categories.
    Site(Kind, String),
    /// A cause on its own.
    Alone(usize),
}

/// The numbered layer a cause's blocks were allocated in, without its number, where all of its
/// modules are layers of one stack.
fn layer_key(g: &Gathered) -> Option<String> {
    let mut key = None;
    for m in &g.modules {
        let (root, k) = module_root(m);
        if root == *m && k == *m {
            return None;
        }
        match &key {
            None => key = Some(k),
            Some(x) if *x == k => {}
            Some(_) => return None,
        }
    }
    key
}

/// The causes grouped into changes: each cause joins the first of these it fits, so that a
/// cause is in one change and no chain of likenesses joins unrelated ones: sizes scaled by
/// the common ratio (a larger batch), the model's state (a parameter and what it brings),
/// lives once ended in one place and now kept to the end (a reference kept to a graph), the
/// layers of one stack (checkpointing switched, an attention function replaced), one kind at
/// one site over steps (the gradients that `zero_grad` no longer frees, each step).
fn bundles(
    groups: &BTreeMap<Key, Gathered>,
    order: &[Key],
    scaled: Option<u64>,
) -> Vec<(Bundle, Vec<usize>)> {
    let mut out: Vec<(Bundle, Vec<usize>)> = Vec::new();
    let mut at: HashMap<Bundle, usize> = HashMap::new();
    for (k, key) in order.iter().enumerate() {
        let g = &groups[key];
        let kind = key.0;
        let ratio = g.ratios.iter().max_by_key(|(r, (n, b))| (*b, *n, **r));
        let near = |r: u64| ratio.is_some_and(|(&own, _)| own.abs_diff(r) * 100 <= 5 * r);
        let bundle = if matches!(kind, Kind::Allocator | Kind::BeforeRecording) {
            Bundle::Alone(k)
        } else if kind == Kind::Size && scaled.is_some_and(near) {
            Bundle::Scaled
        } else if MODEL_STATE.contains(&key.2.as_str()) {
            Bundle::ModelState
        } else if kind == Kind::Life && key.3.ends_with("\u{1f}the end") {
            Bundle::Kept(key.3.clone())
        } else if let Some(layer) = layer_key(g) {
            Bundle::Layers(layer)
        } else {
            Bundle::Site(kind, key.1.clone())
        };
        match at.get(&bundle) {
            Some(&i) => out[i].1.push(k),
            None => {
                at.insert(bundle.clone(), out.len());
                out.push((bundle, vec![k]));
            }
        }
    }
    out
}

/// Each change's effect on the peak, and each of its causes': applied alone to the base run,
/// then one after the other (largest alone first; within a change, its causes largest alone
/// first), so that the effects add up to the change of the peak. Also whether both runs'
/// peaks rebuilt on the shared timeline are their replayed peaks.
fn effects_on_the_peak(
    base: &DeviceAnalysis,
    new: &DeviceAnalysis,
    aligned: &align::Aligned,
    groups: &BTreeMap<Key, Gathered>,
    order: &[Key],
    scaled: Option<u64>,
    settings_same: bool,
) -> (Vec<Cause>, bool, Timeline) {
    // the shared timeline: each run's peak rebuilt from its spans
    let n = aligned.positions;
    let base_values = effects::values(aligned.base.iter().map(|b| b.span), n);
    let base_peak = base_values.iter().copied().max().unwrap_or(0).max(0);
    let new_values = effects::values(aligned.new.iter().map(|b| b.span), n);
    let new_peak = new_values.iter().copied().max().unwrap_or(0).max(0);
    let timeline = Timeline::new(&base_values, &new_values, n);
    drop(new_values);
    let exact = base_peak as u64 == base.replay.peaks.allocated.bytes
        && new_peak as u64 == new.replay.peaks.allocated.bytes;
    let mut curve = Curve::new(&base_values, n);
    let changed = |k: usize| {
        let g = &groups[&order[k]];
        g.bytes.0.abs_diff(g.bytes.1)
    };
    let mut changes = bundles(groups, order, scaled);
    // alone: each cause's, then each change's of several causes
    let net = |k: usize| groups[&order[k]].net.as_slice();
    let sets: Vec<Vec<&[effects::Range]>> = (0..order.len())
        .map(|k| vec![net(k)])
        .chain(
            changes
                .iter()
                .filter(|(_, parts)| parts.len() > 1)
                .map(|(_, parts)| parts.iter().map(|&k| net(k)).collect()),
        )
        .collect();
    let all_alone = effects::alone(&curve, &sets);
    let alone = &all_alone[..order.len()];
    let mut several = all_alone[order.len()..].iter();
    let change_alone: Vec<i64> = changes
        .iter()
        .map(|(_, parts)| match parts[..] {
            [one] => alone[one],
            _ => several.next().copied().unwrap_or(0),
        })
        .collect();
    let mut by_alone: Vec<usize> = (0..changes.len()).collect();
    by_alone.sort_by_key(|&c| {
        let moved: u64 = changes[c].1.iter().map(|&k| changed(k)).sum();
        (
            std::cmp::Reverse(change_alone[c].abs()),
            std::cmp::Reverse(moved),
            c,
        )
    });
    // the allocator's rounding of the same requests, under the same settings, follows from
    // the program's changes: it joins the change that moved the peak most alone, where it is
    // the smaller of the two
    let rounding = |c: usize| match changes[c].0 {
        Bundle::Alone(k) => order[k].0 == Kind::Allocator,
        _ => false,
    };
    let joined = match (
        by_alone.iter().position(|&c| rounding(c)),
        by_alone.iter().position(|&c| {
            !rounding(c)
                && !matches!(changes[c].0, Bundle::Alone(k) if order[k].0 == Kind::BeforeRecording)
        }),
    ) {
        (Some(r), Some(t))
            if settings_same
                && change_alone[by_alone[r]] != 0
                && change_alone[by_alone[r]].abs() <= change_alone[by_alone[t]].abs() =>
        {
            let r = by_alone.remove(r);
            let t = by_alone[if r < t { t - 1 } else { t }];
            Some((t, changes[r].1[0]))
        }
        _ => None,
    };
    let mut causes = Vec::with_capacity(changes.len());
    for c in by_alone {
        let (bundle, parts) = &mut changes[c];
        parts.sort_by_key(|&k| {
            (
                std::cmp::Reverse(alone[k].abs()),
                std::cmp::Reverse(changed(k)),
                k,
            )
        });
        let mut made = Vec::with_capacity(parts.len());
        for &k in parts.iter() {
            let key = &order[k];
            let g = &groups[key];
            let before = curve.max();
            g.net.iter().for_each(|&(a, b, d)| curve.add(a, b, d));
            let effect = curve.max() - before;
            made.push(cause(key, g, effect, alone[k]));
        }
        sort_causes(&mut made);
        let mut rounding = joined.filter(|&(t, _)| t == c).map(|(_, k)| {
            let (key, g) = (&order[k], &groups[&order[k]]);
            let before = curve.max();
            g.net.iter().for_each(|&(a, b, d)| curve.add(a, b, d));
            cause(key, g, curve.max() - before, alone[k])
        });
        // (one that no longer moved the peak stays on its own)
        if let Some(r) = rounding.take_if(|r| r.peak_effect_bytes == 0) {
            causes.push(r);
        }
        let members = (groups, order, &parts[..]);
        causes.push(change(
            bundle,
            made,
            rounding,
            change_alone[c],
            members,
            scaled,
        ));
    }
    sort_causes(&mut causes);

    (causes, exact, timeline)
}

/// Largest effect first, then largest alone, then most bytes changed.
fn sort_causes(causes: &mut [Cause]) {
    causes.sort_by_key(|c| {
        (
            std::cmp::Reverse(c.peak_effect_bytes.abs()),
            std::cmp::Reverse(c.alone_effect_bytes.abs()),
            std::cmp::Reverse(c.bytes_base.abs_diff(c.bytes_new)),
        )
    });
}

/// One change made of its causes (sorted, largest first) and the allocator's rounding that
/// joined it: a cause of its own where it has one, else the largest cause's site and module,
/// the sums of all, and its causes as parts (the rounding last).
fn change(
    bundle: &Bundle,
    mut parts: Vec<Cause>,
    rounding: Option<Cause>,
    alone: i64,
    members: (&BTreeMap<Key, Gathered>, &[Key], &[usize]),
    scaled: Option<u64>,
) -> Cause {
    let (groups, order, members) = members;
    if parts.len() == 1 && rounding.is_none() {
        return parts.remove(0);
    }
    let program = parts.len();
    parts.extend(rounding);
    // (the page draws a change's blocks, not each part's)
    let spans: Vec<(Span, i64)> = parts
        .iter_mut()
        .flat_map(|p| std::mem::take(&mut p.spans))
        .collect();
    // the blocks and bytes the program changed; the effect with the rounding's
    let own = &parts[..program];
    let lead = &own[0];
    let mut out = Cause {
        peak_effect_bytes: parts.iter().map(|p| p.peak_effect_bytes).sum(),
        alone_effect_bytes: alone,
        blocks_base: own.iter().map(|p| p.blocks_base).sum(),
        blocks_new: own.iter().map(|p| p.blocks_new).sum(),
        bytes_base: own.iter().map(|p| p.bytes_base).sum(),
        bytes_new: own.iter().map(|p| p.bytes_new).sum(),
        spans,
        ..lead.clone()
    };
    let mut categories: Vec<&str> = Vec::new();
    let mut steps: Vec<String> = Vec::new();
    let mut phases: Vec<String> = Vec::new();
    for &k in members {
        let g = &groups[&order[k]];
        for s in &g.steps {
            if !steps.contains(s) {
                steps.push(s.clone());
            }
        }
        for p in &g.phases {
            if !phases.contains(p) {
                phases.push(p.clone());
            }
        }
    }
    // the categories of the causes that moved the peak (of all, where none did)
    let moved = own.iter().any(|p| p.peak_effect_bytes != 0);
    for p in own.iter().filter(|p| !moved || p.peak_effect_bytes != 0) {
        if !categories.contains(&p.category.as_str()) {
            categories.push(&p.category);
        }
    }
    out.category = categories.join(", ");
    out.step = span_text(&steps);
    out.phase = phases.join(", ");
    let bytes = crate::units::bytes;
    let signed = |b: i64| crate::units::bytes_delta(b as i128);
    let others = own.len() - 1;
    out.what = match bundle {
        _ if own.len() == 1 => lead.what.clone(),
        Bundle::Scaled => format!(
            "sizes scaled ×{:.2} at {} sites ({} of {} → {}): a larger batch or sequence?",
            scaled.unwrap_or(100) as f64 / 100.0,
            own.len(),
            crate::units::counted(out.blocks_new, "block"),
            bytes(out.bytes_base),
            bytes(out.bytes_new)
        ),
        Bundle::ModelState => {
            let mut by_category: Vec<(&str, i64)> = Vec::new();
            for p in own {
                match by_category.iter_mut().find(|(c, _)| *c == p.category) {
                    Some(e) => e.1 += p.peak_effect_bytes,
                    None => by_category.push((&p.category, p.peak_effect_bytes)),
                }
            }
            let listed: Vec<String> = by_category
                .iter()
                .map(|(c, b)| format!("{c} {}", signed(*b)))
                .collect();
            if let [_] = listed[..] {
                format!(
                    "{}; and {} of the model's state",
                    lead.what,
                    crate::units::counted(others as u64, "more cause")
                )
            } else {
                format!(
                    "the model's state: {} on the peak, {}",
                    listed.join(", "),
                    crate::units::counted(own.len() as u64, "cause")
                )
            }
        }
        Bundle::Kept(ends) => format!(
            "{} blocks of {}{}: freed in {}, now alive to the end",
            crate::units::count(out.blocks_new),
            bytes(out.bytes_new),
            match modules_text(&own.iter().map(|p| p.module.clone()).collect::<Vec<_>>()) {
                m if m.is_empty() => String::new(),
                m => format!(" in {m}"),
            },
            place_words(ends.split('\u{1f}').next().unwrap_or(""))
        ),
        Bundle::Layers(_) => format!(
            "{}; and {} in the same layers",
            lead.what,
            crate::units::counted(others as u64, "more cause")
        ),
        Bundle::Site(..) | Bundle::Alone(_) => format!(
            "{}; and {} at this site",
            lead.what,
            crate::units::counted(others as u64, "more cause")
        ),
    };
    if let Some(r) = parts[program..]
        .first()
        .filter(|r| r.peak_effect_bytes != 0)
    {
        out.what = format!(
            "{}; with the allocator's rounding of the same requests, {}",
            out.what,
            signed(r.peak_effect_bytes)
        );
    }
    out.parts = parts;
    out
}

/// The caller of a site: all its frames but the innermost.
fn caller(site: &str) -> Option<&str> {
    site.rsplit_once(';').map(|(c, _)| c)
}

/// A site's frames without their lines (`a.py:f:12;b.py:g:3,4` → `a.py:f;b.py:g`): a caller
/// reached through another line of the same functions is the same place.
fn without_lines(site: &str) -> String {
    site.split(';')
        .map(|frame| {
            let mut parts = frame.splitn(3, ':');
            match (parts.next(), parts.next()) {
                (Some(file), Some(function)) => format!("{file}:{function}"),
                _ => frame.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Allocations gone at one site and new at another called from the same place, in the same
/// category: one function replaced by another. The gone ones join the new ones' cause.
fn merge_replaced(groups: &mut BTreeMap<Key, Gathered>, order: &mut Vec<Key>) {
    let news: Vec<Key> = order
        .iter()
        .filter(|k| k.0 == Kind::New && caller(&k.1).is_some())
        .cloned()
        .collect();
    let gone: Vec<Key> = order
        .iter()
        .filter(|k| k.0 == Kind::Gone)
        .cloned()
        .collect();
    let mut merged = std::collections::HashSet::new();
    for g in gone {
        let Some(c) = caller(&g.1).map(without_lines) else {
            continue;
        };
        let Some(into) = news
            .iter()
            .filter(|n| {
                caller(&n.1).map(without_lines).as_deref() == Some(c.as_str()) && n.2 == g.2
            })
            .max_by_key(|n| groups.get(*n).map_or(0, |x| x.bytes.1))
        else {
            continue;
        };
        let Some(from) = groups.remove(&g) else {
            continue;
        };
        let target = groups.get_mut(into).expect("a new cause listed in order");
        target.spans.extend(from.spans);
        target.net.extend(from.net);
        target.blocks.0 += from.blocks.0;
        target.bytes.0 += from.bytes.0;
        target
            .replaces
            .push((g.1.clone(), from.blocks.0, from.bytes.0));
        merged.insert(g);
    }
    order.retain(|k| !merged.contains(k));
}

/// The modules of a cause as one text: the one module, or the first and last where they
/// differ only in numbers (`…layers[0…7] › Attention`), else the first and how many.
fn modules_text(modules: &[String]) -> String {
    match modules {
        [] => String::new(),
        [one] => one.clone(),
        [first, ..] => {
            // split into runs of digits and runs of the rest
            fn parts(s: &str) -> Vec<(bool, &str)> {
                let mut out = Vec::new();
                let mut start = 0;
                let mut digit = None;
                for (i, c) in s.char_indices() {
                    let d = c.is_ascii_digit();
                    if digit.is_some_and(|x| x != d) {
                        out.push((digit.unwrap_or(false), &s[start..i]));
                        start = i;
                    }
                    digit = Some(d);
                }
                if start < s.len() {
                    out.push((digit.unwrap_or(false), &s[start..]));
                }
                out
            }
            let all: Vec<Vec<(bool, &str)>> = modules.iter().map(|m| parts(m)).collect();
            fn shape<'a>(p: &[(bool, &'a str)]) -> Vec<Option<&'a str>> {
                p.iter()
                    .map(|(d, t)| if *d { None } else { Some(*t) })
                    .collect()
            }
            let same_shape = all.iter().all(|p| shape(p) == shape(&all[0]));
            if !same_shape {
                return format!("{first} (and {} other modules)", modules.len() - 1);
            }
            let mut out = String::new();
            for (k, (digit, text)) in all[0].iter().enumerate() {
                if !digit {
                    out.push_str(text);
                    continue;
                }
                let values: Vec<u64> = all.iter().filter_map(|p| p[k].1.parse().ok()).collect();
                let (lo, hi) = (values.iter().min(), values.iter().max());
                match (lo, hi) {
                    (Some(lo), Some(hi)) if lo != hi => out.push_str(&format!("{lo}…{hi}")),
                    _ => out.push_str(text),
                }
            }
            out
        }
    }
}

/// A life's new end in words: `now alive until backward (train step 1)`.
fn until(place: &str) -> String {
    if place == "the end" {
        "now alive to the end".to_string()
    } else {
        format!("now alive until {}", place_words(place))
    }
}

/// A place where a life ended in words: the phase `other` (outside forward, backward and the
/// optimizer) as `other code`.
fn place_words(place: &str) -> String {
    match place.strip_prefix("other") {
        Some(rest) if rest.is_empty() || rest.starts_with(' ') => format!("other code{rest}"),
        _ => place.to_string(),
    }
}

/// Several items in order: `a`, `a, b`, `a … c` (first and last of more).
fn span_text(items: &[String]) -> String {
    // `train step 0 … 2`: the last keeps only its number where the prefix is the same
    fn number(s: &str) -> Option<(&str, &str)> {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        (digits > 0).then(|| s.split_at(s.len() - digits))
    }
    let last_short = |first: &str, last: &str| match (number(first), number(last)) {
        (Some((p, _)), Some((q, n))) if p == q => n.to_string(),
        _ => last.to_string(),
    };
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [a, b] => format!("{a}, {}", last_short(a, b)),
        [first, .., last] => format!("{first} … {}", last_short(first, last)),
    }
}

fn cause(key: &Key, g: &Gathered, effect: i64, alone: i64) -> Cause {
    let (kind, site, category, ends) = key.clone();
    let module = modules_text(&g.modules);
    let site = if let Some(module_key) = site.strip_prefix(MODULE_KEY) {
        let _ = module_key;
        let mut sites = g.sites.clone();
        sites.sort_by_key(|(s, b)| (std::cmp::Reverse(*b), s.clone()));
        match sites.len() {
            0 => String::new(),
            1 => sites[0].0.clone(),
            n => format!("{} (and {} more sites)", sites[0].0, n - 1),
        }
    } else if g.lines.is_empty() {
        site
    } else {
        let mut lines = g.lines.clone();
        lines.sort_by_key(|l| l.parse::<u64>().unwrap_or(u64::MAX));
        format!("{site}:{}", lines.join(","))
    };
    let count = |n: u64| crate::units::counted(n, "block");
    let bytes = crate::units::bytes;
    let what = match kind {
        Kind::New if !g.replaces.is_empty() => {
            let (site, n, b) = &g.replaces[0];
            let others = if g.replaces.len() > 1 {
                format!(" and {} more sites", g.replaces.len() - 1)
            } else {
                String::new()
            };
            format!(
                "{} only in the new run, {}, in place of {} of {} at {}{others}",
                count(g.blocks.1),
                bytes(g.bytes.1),
                count(*n),
                bytes(*b),
                site.rsplit(';').next().unwrap_or(site)
            )
        }
        Kind::New => format!(
            "{} only in the new run, {}",
            count(g.blocks.1),
            bytes(g.bytes.1)
        ),
        Kind::Gone => format!(
            "{} only in the base run, {}",
            count(g.blocks.0),
            bytes(g.bytes.0)
        ),
        Kind::Count => format!(
            "{} allocations here: {} → {} ({} → {})",
            if g.blocks.1 >= g.blocks.0 {
                "more"
            } else {
                "fewer"
            },
            g.blocks.0,
            g.blocks.1,
            bytes(g.bytes.0),
            bytes(g.bytes.1)
        ),
        Kind::Size => {
            let mut s = format!(
                "{} of {} → {}",
                count(g.blocks.1),
                bytes(g.bytes.0),
                bytes(g.bytes.1)
            );
            if let Some((&r, _)) = g.ratios.iter().max_by_key(|(r, (n, _))| (*n, **r)) {
                s.push_str(&format!(" (×{:.2})", r as f64 / 100.0));
            }
            if let Some((from, to)) = ends.split_once('\u{1f}') {
                s.push_str(&format!("; freed in {}, {}", place_words(from), until(to)));
            }
            s
        }
        Kind::Life => match ends.split_once('\u{1f}') {
            Some((from, to)) => format!(
                "{} of {}: freed in {}, {}",
                count(g.blocks.1),
                bytes(g.bytes.1),
                place_words(from),
                until(to)
            ),
            None => format!(
                "{} of {}: freed a little earlier or later, in the same phase and step",
                count(g.blocks.1),
                bytes(g.bytes.1)
            ),
        },
        Kind::BeforeRecording => format!(
            "alive when recording started: {} ({}) → {} ({})",
            count(g.blocks.0),
            bytes(g.bytes.0),
            count(g.blocks.1),
            bytes(g.bytes.1)
        ),
        Kind::Allocator => format!(
            "the same requests served by blocks of other sizes: {} of {} → {} (the allocator's rounding or choice of cached block)",
            count(g.blocks.1),
            bytes(g.bytes.0),
            bytes(g.bytes.1)
        ),
    };
    Cause {
        kind,
        site,
        module,
        category,
        step: span_text(&g.steps),
        phase: g.phases.join(", "),
        peak_effect_bytes: effect,
        alone_effect_bytes: alone,
        blocks_base: g.blocks.0,
        blocks_new: g.blocks.1,
        bytes_base: g.bytes.0,
        bytes_new: g.bytes.1,
        what,
        reserved_effect_bytes: None,
        spans: g.spans.clone(),
        parts: Vec::new(),
    }
}

/// The ratio most size changes share, when they are most of the bytes that changed size.
fn scaling(groups: &BTreeMap<Key, Gathered>) -> Option<Scaling> {
    let mut by_ratio: HashMap<u64, (u64, u64)> = HashMap::new();
    for g in groups.values() {
        for (&r, &(n, b)) in &g.ratios {
            let e = by_ratio.entry(r).or_default();
            e.0 += n;
            e.1 += b;
        }
    }
    // the most common ratio of the requests, and ratios within 5% of it (block sizes are
    // rounded, and a convolution's workspace may grow a little otherwise); its share is of the
    // bytes that changed size, so that many small requests of another ratio do not hide it
    let (&ratio, _) = by_ratio.iter().max_by_key(|(r, (n, _))| (*n, **r))?;
    let near = |r: u64| r.abs_diff(ratio) * 100 <= 5 * ratio;
    let total: u64 = by_ratio.values().map(|v| v.1).sum();
    let (requests, bytes) = by_ratio
        .iter()
        .filter(|(r, _)| near(**r))
        .fold((0, 0), |(n, b), (_, v)| (n + v.0, b + v.1));
    let share = bytes as f64 / total.max(1) as f64;
    (requests >= 3 && share >= 0.5).then_some(Scaling {
        ratio: ratio as f64 / 100.0,
        requests,
        share,
    })
}

/// The reserved peak's change split into requests and settings, where the settings differ.
fn reserved_split(base: &DeviceAnalysis, new: &DeviceAnalysis) -> Reserved {
    let (cb, cn) = (
        AllocConf::recorded(base.snap),
        AllocConf::recorded(new.snap),
    );
    let effective = |c: &AllocConf| AllocConf {
        text: String::new(),
        ..c.clone()
    };
    if effective(&cb) == effective(&cn) {
        return Reserved::default();
    }
    let mut out = Reserved {
        settings_differ: true,
        ..Reserved::default()
    };
    let async_backend =
        |a: &DeviceAnalysis| a.snap.settings.as_ref().is_some_and(|s| s.async_backend());
    if new.replay.is_empty() || async_backend(base) || async_backend(new) {
        return out;
    }
    let program = Program::new(new.snap, &new.replay);
    let options = simulate::Options {
        conf: cb,
        ..simulate::Options::default()
    };
    let outcome = simulate::simulate(new.snap, &new.replay, &program, &cn, &options);
    let mid = outcome.peak_reserved_bytes;
    out.new_requests_base_settings_bytes = Some(mid);
    out.requests_effect_bytes = Some(mid as i64 - base.replay.peaks.reserved.bytes as i64);
    out.settings_effect_bytes = Some(new.replay.peaks.reserved.bytes as i64 - mid as i64);
    out
}

/// The allocator's own cause: the settings' part of the reserved change, or, with the same
/// requests and settings, all of it.
fn allocator_cause(
    reserved: &Reserved,
    base: &Side,
    new: &Side,
    same_requests: bool,
    delta_reserved: i64,
) -> Option<Cause> {
    let (effect, what) = if reserved.settings_differ {
        let conf = |c: &str| {
            if c.is_empty() {
                "the defaults".to_string()
            } else {
                c.to_string()
            }
        };
        (
            reserved.settings_effect_bytes,
            format!(
                "allocator settings: {} (base: {})",
                conf(&new.alloc_conf),
                conf(&base.alloc_conf)
            ),
        )
    } else if same_requests && delta_reserved != 0 {
        (
            Some(delta_reserved),
            "the same requests and settings: the allocator placed blocks differently".to_string(),
        )
    } else {
        return None;
    };
    Some(Cause {
        kind: Kind::Allocator,
        site: String::new(),
        module: String::new(),
        category: String::new(),
        step: String::new(),
        phase: String::new(),
        peak_effect_bytes: 0,
        alone_effect_bytes: 0,
        blocks_base: 0,
        blocks_new: 0,
        bytes_base: 0,
        bytes_new: 0,
        what,
        reserved_effect_bytes: effect,
        spans: Vec::new(),
        parts: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_are_compared_without_their_lines() {
        assert_eq!(
            without_lines("a.py:f:12;b.py:g:3,4"),
            "a.py:f;b.py:g".to_string()
        );
        assert_eq!(without_lines("<no frames>"), "<no frames>");
    }

    #[test]
    fn steps_of_frees_are_told_against_the_allocation() {
        assert_eq!(relative_step(Some("train step 1"), "train step 1"), "");
        assert_eq!(
            relative_step(Some("train step 1"), "train step 2"),
            " of the next step"
        );
        assert_eq!(
            relative_step(Some("train step 0"), "train step 3"),
            " of a later step"
        );
        assert_eq!(relative_step(None, "step 2"), " (step 2)");
        assert_eq!(relative_step(Some("set-up"), "step 2"), " (step 2)");
    }

    #[test]
    fn a_site_keeps_its_function_and_gives_its_line() {
        assert_eq!(
            split_line("train.py:step:45;model.py:forward:208"),
            (
                "train.py:step:45;model.py:forward".to_string(),
                Some("208".to_string())
            )
        );
        assert_eq!(
            split_line("<no frames: backward on the autograd thread>"),
            (
                "<no frames: backward on the autograd thread>".to_string(),
                None
            )
        );
    }

    #[test]
    fn every_layer_of_a_stack_makes_one_module_key() {
        let sep = crate::attribute::modules::SEPARATOR;
        let a = ["Model.forward:403", "Layer.forward[3]:322", "MLP.forward"].join(sep);
        let b = ["Layer.forward[11]:306", "Attention.forward"].join(sep);
        let (root_a, key_a) = module_root(&a);
        let (_, key_b) = module_root(&b);
        assert_eq!(
            root_a,
            ["Model.forward:403", "Layer.forward[3]:322"].join(sep)
        );
        assert_eq!(key_a, "Layer.forward[]");
        assert_eq!(key_a, key_b);
        // a path without a numbered module is whole
        assert_eq!(module_root("Head.forward").1, "Head.forward");
    }

    #[test]
    fn modules_and_steps_read_as_ranges() {
        let layers: Vec<String> = (0..4).map(|k| format!("Layer.forward[{k}]:322")).collect();
        assert_eq!(modules_text(&layers), "Layer.forward[0…3]:322");
        let mixed = vec!["A.forward".to_string(), "B.forward[1]".to_string()];
        assert_eq!(modules_text(&mixed), "A.forward (and 1 other modules)");
        let steps: Vec<String> = (0..3).map(|k| format!("train step {k}")).collect();
        assert_eq!(span_text(&steps), "train step 0 … 2");
        assert_eq!(span_text(&steps[..2]), "train step 0, 1");
        assert_eq!(span_text(&steps[..1]), "train step 0");
    }

    #[test]
    fn sizes_far_apart_are_two_requests() {
        assert!(!implausible(512, 512 * 16));
        assert!(implausible(512, 512 * 16 + 1));
        assert!(implausible(0, 1));
        assert!(!implausible(0, 0));
    }
}

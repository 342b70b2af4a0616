//! Flamegraphs of the memory live at one moment: each live block's program frames, outermost
//! first, under an optional root level (its step, stage or category), sized by bytes.
//!
//! The folded stacks (`a;b;c BYTES`, one line per distinct stack) are memsnap's own; the SVG is
//! drawn by the `inferno` crate from them, offline. Frames follow the plumbing rule of the
//! sites ([`crate::attribute::frames::is_library`]): PyTorch, the standard library and
//! generated code are left out. The bytes of all lines add up to allocated memory at that
//! moment.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::io::Write;

use crate::analysis::{breakdown, DeviceAnalysis, Dimension};
use crate::attribute::frames;
use crate::snapshot::StackId;

/// A moment of the trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Moment {
    /// When allocated memory peaked.
    Peak,
    /// After the last event.
    End,
    /// After this event.
    Event(usize),
    /// At this many seconds after the first event.
    Seconds(f64),
}

impl Moment {
    /// Parses `peak`, `end`, `#1234` or `3.2s`.
    pub fn parse(text: &str) -> Option<Moment> {
        match text {
            "peak" => Some(Moment::Peak),
            "end" => Some(Moment::End),
            t => {
                if let Some(n) = t.strip_prefix('#') {
                    return n.parse().ok().map(Moment::Event);
                }
                let s: f64 = t.strip_suffix('s')?.trim().parse().ok()?;
                (s.is_finite() && s >= 0.0).then_some(Moment::Seconds(s))
            }
        }
    }

    /// The event after which the moment is, `None` for before the first event; an error
    /// message when the moment is outside the trace.
    pub fn event(self, a: &DeviceAnalysis) -> Result<Option<usize>, String> {
        let r = &a.replay;
        let n = r.len();
        match self {
            Moment::Peak => Ok(r.peaks.allocated.event),
            Moment::End => Ok(n.checked_sub(1)),
            Moment::Event(i) if i < n => Ok(Some(i)),
            Moment::Event(i) => Err(format!(
                "event #{i} is beyond the trace, which has {n} events (#0 to #{})",
                n.saturating_sub(1)
            )),
            Moment::Seconds(s) => {
                let events = a.snap.trace(r.device);
                let t0 = r.time_span_us.0;
                if t0 == 0 {
                    return Err("the trace has no times: give an event (#N) instead".into());
                }
                let at = t0 + (s * 1e6) as i64;
                if at > r.time_span_us.1 {
                    return Err(format!(
                        "{s} s is beyond the trace, which lasts {:.3} s",
                        r.time_span_us.1.saturating_sub(t0).max(0) as f64 / 1e6
                    ));
                }
                Ok(events
                    .iter()
                    .rposition(|e| e.time_us != 0 && e.time_us <= at))
            }
        }
    }
}

/// The level above the frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// Pipeline step (or phase) with op and micro-batch.
    Step,
    /// Layer stage or module path.
    Stage,
    /// Memory category.
    Category,
    /// No root level.
    None,
}

/// Folded stacks of the memory live after event `at` (`None`: before the first event):
/// `(frames joined by ';', bytes)`, sorted. The bytes are summed by root and stack first, so
/// each distinct stack's line is made once however many blocks share it.
pub fn folded(a: &DeviceAnalysis, at: Option<usize>, root: Root) -> Vec<(String, u64)> {
    let live = breakdown::live_at(a.snap, &a.replay, &a.attribution, at);
    let mut keyer = a.keyer();
    // (root frame, stack, from before the trace, what a block without frames says) -> bytes
    type Key = (Option<String>, StackId, bool, &'static str);
    let mut sums: FxHashMap<Key, u64> = FxHashMap::default();
    for (bytes, label, stack) in live {
        let root_frame = match root {
            Root::Step => Some(keyer.key(Dimension::Step, label, stack)),
            Root::Stage => Some(keyer.key(Dimension::Stage, label, stack)),
            Root::Category => Some(keyer.key(Dimension::Category, label, stack)),
            Root::None => None,
        };
        let before = label.is_before_trace();
        let key = (root_frame, stack, before, breakdown::without_frames(label));
        *sums.entry(key).or_default() += bytes;
    }
    let mut frames_of: FxHashMap<(StackId, bool), Option<String>> = FxHashMap::default();
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for ((root_frame, stack, before, without), bytes) in sums {
        // one vocabulary with the report: a block without program frames says why
        let program = frames_of
            .entry((stack, before))
            .or_insert_with(|| program_frames(a, stack, before));
        let program = program.as_deref().unwrap_or(without);
        let line = match root_frame {
            Some(r) => format!("{};{program}", clean(&r)),
            None => program.to_string(),
        };
        *lines.entry(line).or_default() += bytes;
    }
    lines.into_iter().collect()
}

/// A stack's program frames, outermost first: `function (file:line)`; `None` for a block with
/// no frames at all, or none but PyTorch's from before the trace.
fn program_frames(a: &DeviceAnalysis, stack: StackId, before_trace: bool) -> Option<String> {
    let snap = a.snap;
    let mut names: Vec<String> = frames::user_frames(snap, stack)
        .map(|f| {
            clean(&format!(
                "{} ({}:{})",
                snap.str(f.name),
                snap.short_file(f.filename),
                f.line
            ))
        })
        .collect();
    names.reverse();
    if names.is_empty() {
        if before_trace || snap.stacks.stack(stack).is_empty() {
            return None;
        }
        names.push(match frames::autograd_node(snap, stack) {
            Some(node) => format!("<backward {node}>"),
            None => "<PyTorch only>".to_string(),
        });
    }
    Some(names.join(";"))
}

/// A frame name that cannot break the folded format (no `;`, no line breaks).
fn clean(name: &str) -> String {
    name.replace(';', ",").replace(['\n', '\r'], " ")
}

/// Writes the folded stacks, one `frames BYTES` line each.
pub fn write_folded(out: &mut dyn Write, lines: &[(String, u64)]) -> std::io::Result<()> {
    for (stack, bytes) in lines {
        writeln!(out, "{stack} {bytes}")?;
    }
    Ok(())
}

/// Draws the folded stacks as an SVG flamegraph, written as XML 1.0 can hold it (a control
/// character of a name as U+FFFD, [`crate::escape::Stream::xml`]).
pub fn write_svg(
    out: &mut dyn Write,
    lines: &[(String, u64)],
    title: &str,
) -> Result<(), super::ChartError> {
    let text: Vec<String> = lines.iter().map(|(s, b)| format!("{s} {b}")).collect();
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = "bytes".to_string();
    options.name_type = "Frame:".to_string();
    let mut xml = crate::escape::Stream::xml(out);
    inferno::flamegraph::from_lines(&mut options, text.iter().map(String::as_str), &mut xml)
        .map_err(|e| super::ChartError::Draw(e.to_string()))?;
    xml.into_inner()
        .map(drop)
        .map_err(|e| super::ChartError::Draw(crate::error::io_text(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_parse() {
        assert_eq!(Moment::parse("peak"), Some(Moment::Peak));
        assert_eq!(Moment::parse("end"), Some(Moment::End));
        assert_eq!(Moment::parse("#12"), Some(Moment::Event(12)));
        assert_eq!(Moment::parse("3.5s"), Some(Moment::Seconds(3.5)));
        assert_eq!(Moment::parse("soon"), None);
        assert_eq!(Moment::parse("-1s"), None);
    }

    #[test]
    fn names_cannot_break_lines() {
        assert_eq!(clean("a;b\nc"), "a,b c");
    }
}

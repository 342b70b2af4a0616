//! `memsnap trim FILE -o OUT.pickle`: a smaller snapshot holding one window of the trace.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use memsnap::export::trim::{self, Window};
use memsnap::output::Naming;
use memsnap::replay::Replay;
use memsnap::snapshot::Snapshot;
use memsnap::units;

use memsnap::error::UsageError;

use super::{load, Failure};

/// One end of the window: an event index (`1234` or `#1234`) or seconds from the first event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// Event index.
    Event(usize),
    /// Seconds after the first event.
    Seconds(f64),
}

fn parse_bound(s: &str) -> Result<Bound, String> {
    let t = s.trim();
    if let Some(secs) = t.strip_suffix('s') {
        if let Ok(v) = secs.trim().parse::<f64>() {
            if v.is_finite() && v >= 0.0 {
                return Ok(Bound::Seconds(v));
            }
        }
    } else if let Ok(i) = t.strip_prefix('#').unwrap_or(t).parse::<usize>() {
        return Ok(Bound::Event(i));
    }
    Err(format!(
        "{s:?}: use an event index (1234 or #1234) or seconds (3.2s)"
    ))
}

/// Arguments of `memsnap trim`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  memsnap trim big.pickle --around-peak 2s -o peak.pickle\n  \
                        memsnap trim big.pickle --from 3.2s --to 4s -o window.pickle.xz\n  \
                        memsnap trim big.pickle --from 100000 --to 200000 -o part.pickle"
)]
pub struct TrimArgs {
    /// Snapshot file (`-` reads standard input).
    pub file: PathBuf,
    /// Output snapshot (.pickle, or .pickle.xz to compress it).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// First event kept: an index (1234 or #1234) or seconds from the first event (3.2s).
    #[arg(long, value_parser = parse_bound, conflicts_with = "around_peak")]
    pub from: Option<Bound>,
    /// Last event kept (included): an index or seconds, as --from.
    #[arg(long, value_parser = parse_bound, conflicts_with = "around_peak")]
    pub to: Option<Bound>,
    /// Keep this long before and after the peak (2s), or this many events each side (5000).
    #[arg(long, value_parser = parse_bound)]
    pub around_peak: Option<Bound>,
    /// Device (default: the first with events).
    #[arg(long, value_parser = super::parse_device)]
    pub device: Option<u32>,
    /// Print what was written as one JSON line instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: TrimArgs) -> Result<(), Failure> {
    let name = args.output.to_string_lossy().to_ascii_lowercase();
    let compress = name.ends_with(".xz");
    if !(name.ends_with(".pickle") || name.ends_with(".pkl") || name.ends_with(".pickle.xz")) {
        return Err(memsnap::Error::new(
            &args.output,
            UsageError::OutputKind {
                wants: "a snapshot: give a file ending in .pickle or .pickle.xz",
            }
            .into(),
        )
        .into());
    }
    super::check_output(&args.output, Naming::Named)?;
    let snap = load(&args.file)?;
    let device = super::device(&snap, args.device, &args.file)?;
    let replay = memsnap::replay::replay(&snap, device, memsnap::replay::SizeModel::Allocator);
    super::within_memory(&args.file)?;
    let (from, to) = window(&snap, &replay, &args)
        .map_err(|m| memsnap::Error::new(&args.file, UsageError::Moment(m).into()))?;
    let write_error = |e: std::io::Error| super::write_failed(&args.output, e);
    let mut pending = super::create_output(&args.output, Naming::Named)?;
    let window = Window { device, from, to };
    let file = pending.file();
    let summary = if compress {
        let mut xz = xz2::write::XzEncoder::new(BufWriter::new(file), 6);
        let s = trim::write(&snap, &replay, window, &mut xz).map_err(write_error)?;
        xz.finish()
            .and_then(|mut f| f.flush())
            .map_err(write_error)?;
        s
    } else {
        let mut out = BufWriter::new(file);
        let s = trim::write(&snap, &replay, window, &mut out).map_err(write_error)?;
        out.flush().map_err(write_error)?;
        s
    };
    let after = pending.file().metadata().map_or(0, |m| m.len());
    super::commit_output(pending, &args.output)?;
    // Like for like: a compressed output against the file, a plain one against the pickle.
    let before = if compress {
        snap.source.file_bytes
    } else {
        snap.source.pickle_bytes
    };
    if args.json {
        let value = serde_json::json!({
            "output": args.output.display().to_string(),
            "device": device,
            "first_event": from,
            "last_event": to.saturating_sub(1),
            "trace_events": replay.len(),
            "compressed": compress,
            "bytes_before": before,
            "bytes_after": after,
            "trimmed": summary,
        });
        let mut out = super::stdout(true);
        writeln!(out, "{value}")?;
        out.flush()?;
    } else {
        let sizes = (before, after, compress);
        print_summary(&args, device, (from, to), replay.len(), &summary, sizes)?;
    }
    if summary.blocks_outside_segments > 0 {
        note!(
            "memsnap: {}: {} live at the window's end lie in no segment (the trace is incomplete); left out",
            args.file.display(),
            units::counted(summary.blocks_outside_segments as u64, "block")
        );
    }
    Ok(())
}

/// The two lines `trim` prints: what was written, and the size before and after.
fn print_summary(
    args: &TrimArgs,
    device: u32,
    (from, to): (usize, usize),
    trace_events: usize,
    summary: &trim::Trimmed,
    (before, after, compress): (u64, u64, bool),
) -> io::Result<()> {
    let mut out = super::stdout(false);
    writeln!(
        out,
        "wrote {}: events #{} to #{} of device {device} ({} of {}), {}, {} live at the window's end",
        super::shown(&args.output),
        units::count(from as u64),
        units::count(to.saturating_sub(1) as u64),
        units::counted(summary.events as u64, "event"),
        units::count(trace_events as u64),
        units::counted(summary.segments as u64, "segment"),
        units::counted(summary.live_blocks as u64, "block"),
    )?;
    let share = if before > 0 {
        after as f64 * 100.0 / before as f64
    } else {
        0.0
    };
    let what = if compress { "file" } else { "pickle" };
    writeln!(
        out,
        "  {what} {} → {} ({share:.1}% of the original)",
        units::bytes(before),
        units::bytes(after),
    )?;
    if after >= before {
        // the window kept (nearly) everything, and the rewrite is no smaller than the original
        writeln!(
            out,
            "  not smaller: the window holds {:.0}% of the trace's events; a narrower window (--around-peak, --from, --to) makes a smaller file",
            summary.events as f64 * 100.0 / trace_events.max(1) as f64
        )?;
    }
    out.flush()
}

/// The window as `from..to` event indices, or why it is empty or outside the trace.
fn window(snap: &Snapshot, replay: &Replay, args: &TrimArgs) -> Result<(usize, usize), String> {
    let n = replay.len();
    let events = snap.trace(replay.device);
    let t0 = replay.time_span_us.0;
    let at_seconds = |s: f64| t0.saturating_add((s * 1e6) as i64);
    let no_times = || "the trace has no times: give event indices instead".to_string();
    if let Some(around) = args.around_peak {
        let peak = replay.peaks.allocated.event.unwrap_or(0);
        return Ok(match around {
            Bound::Event(k) => (
                peak.saturating_sub(k),
                peak.saturating_add(k).saturating_add(1).min(n),
            ),
            Bound::Seconds(s) => {
                if t0 == 0 {
                    return Err(no_times());
                }
                let t = events[peak].time_us;
                let d = (s * 1e6) as i64;
                let from = events
                    .partition_point(|e| e.time_us < t.saturating_sub(d))
                    .min(peak);
                let to = events
                    .partition_point(|e| e.time_us <= t.saturating_add(d))
                    .max(peak + 1);
                (from, to)
            }
        });
    }
    let from = match args.from {
        None => 0,
        Some(Bound::Event(i)) => i,
        Some(Bound::Seconds(s)) => {
            if t0 == 0 {
                return Err(no_times());
            }
            events.partition_point(|e| e.time_us < at_seconds(s))
        }
    };
    let to = match args.to {
        None => n,
        Some(Bound::Event(i)) => i.saturating_add(1),
        Some(Bound::Seconds(s)) => {
            if t0 == 0 {
                return Err(no_times());
            }
            events.partition_point(|e| e.time_us <= at_seconds(s))
        }
    };
    if from >= n {
        return Err(format!(
            "--from is beyond the trace, which has {} events (#0 to #{})",
            units::count(n as u64),
            units::count(n.saturating_sub(1) as u64)
        ));
    }
    if to > n {
        return Err(format!(
            "--to is beyond the trace, which has {} events (#0 to #{})",
            units::count(n as u64),
            units::count(n.saturating_sub(1) as u64)
        ));
    }
    if to <= from {
        return Err("--from is after --to: the window holds no event".into());
    }
    Ok((from, to))
}

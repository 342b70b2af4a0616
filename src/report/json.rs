//! The `--json` output of `memsnap report`.
//!
//! # Wire format
//!
//! One JSON object per file, one per line:
//!
//! - `file`: the path given.
//! - `source`: `protocol`, `compression` (`none`/`gzip`/`xz`/`zstd`), `file_bytes`,
//!   `pickle_bytes`, `segments_only`, `unknown_actions`.
//! - `devices`: one object per device with events, each with the fields of
//!   [`super::DeviceReport`]: `device`, `events`, `duration_us`, `stacks`
//!   (`none`/`python`/`python_and_cpp`/`cpp`), `trace_complete`, `frees_without_alloc`,
//!   `trace_wrapped`, `replay_consistent`, `size_model` (`allocator`/`rounded`), `start_*_bytes`,
//!   `peak_*_bytes`, `peak_event_index` (`null` when the peak is before the first event),
//!   `peak_time_offset_us`, `reserved_at_peak_bytes`, `end_*_bytes`,
//!   `fragmentation_at_peak_bytes`, `fragmentation_at_end_bytes`, `largest_free_block_bytes`,
//!   `ooms` (`event`, `requested`, `device_free`, `allocated`, `reserved`) and `check`
//!   (`consistent`, `replayed_allocated`, `snapshot_allocated`, `replayed_reserved`,
//!   `snapshot_reserved`, `block_mismatches`, `anomalies`, `examples`).
//!
//! All sizes are bytes, all times microseconds. Fields are only ever added.

use std::io::{self, Write};

use serde::Serialize;

use super::compare::{Pair, Ranks};
use super::FileReport;

/// Writes one report as a single JSON line.
pub fn write(out: &mut dyn Write, report: &FileReport) -> io::Result<()> {
    line(out, report)
}

/// Writes a two-snapshot comparison as a single JSON line (`a`, `b`, the differences).
pub fn write_pair(out: &mut dyn Write, pair: &Pair) -> io::Result<()> {
    line(out, pair)
}

/// Writes a rank table as a single JSON line (`rows`, `highest`, `lowest`, `why`).
pub fn write_ranks(out: &mut dyn Write, ranks: &Ranks) -> io::Result<()> {
    line(out, ranks)
}

/// Writes `memsnap whatif` as a single JSON line; a device's `simulated` is a list, of one
/// setting or of several alike (one shape whatever the options).
pub fn write_whatif(out: &mut dyn Write, report: &super::whatif::WhatIfReport) -> io::Result<()> {
    line(out, report)
}

/// Writes `memsnap whatif --scale` as a single JSON line.
pub fn write_scale(out: &mut dyn Write, report: &super::whatif::ScaleReport) -> io::Result<()> {
    line(out, report)
}

/// Writes `memsnap oom` as a single JSON line.
pub fn write_oom(out: &mut dyn Write, report: &super::oom::OomReport) -> io::Result<()> {
    line(out, report)
}

fn line(out: &mut dyn Write, value: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)
}

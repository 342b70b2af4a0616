//! memsnap: where every byte of GPU memory went.
//!
//! memsnap reads the pickles that `torch.cuda.memory._snapshot()` produces and explains them.
//! The library is a pipeline; each stage is a module and imports only the ones before it:
//!
//! ```text
//!  file ─▶ pickle ─▶ snapshot ─▶ replay ─▶ attribute ─▶ analysis ─┬─▶ report (text, JSON, compare)
//!         (decode)   (model)    (memory    (labels)     (one value ├─▶ chart  (PNG, SVG)
//!                               over time)               per device)└─▶ page   (HTML, from both)
//! ```
//!
//! - [`pickle`]: a data-only pickle VM (never runs code), with gzip/xz/zstd input;
//! - [`snapshot`]: typed, interned tables of segments, blocks, trace events and frames;
//! - [`replay`]: allocated, requested, active and reserved bytes after every event, from an
//!   exact simulation of the caching allocator, checked against the snapshot's final state;
//! - [`attribute`]: every allocation's pipeline step, op, micro-batch, stage and category;
//! - [`analysis`]: the one per-device value every view reads: replay, labels, the peak's
//!   place and make-up, the step table;
//! - [`report`] and [`chart`]: views of the analysis, which never import each other;
//! - [`page`]: the interactive HTML page, which carries the series the charts draw and the
//!   objects the reports print.
//!
//! ```no_run
//! let snap = memsnap::snapshot::Snapshot::open("rank0.pickle".as_ref())?;
//! for d in memsnap::analysis::analyse(&snap, &Default::default()) {
//!     println!("device {} peaked at {} bytes in {}", d.device(),
//!              d.replay.peaks.allocated.bytes, d.peak_place.summary());
//! }
//! # Ok::<(), memsnap::Error>(())
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod analysis;
pub mod attribute;
pub mod chart;
pub mod diff;
pub mod error;
pub mod escape;
pub mod export;
pub mod memory;
pub mod output;
pub mod page;
pub mod pickle;
pub mod replay;
pub mod report;
pub mod simulate;
pub mod snapshot;
pub mod units;

// Unit tests count memory as the binary does.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: memory::Counting = memory::Counting;

pub use error::{io_text, Error, ErrorKind};

//! memsnap: where every byte of GPU memory went.
//!
//! memsnap reads the pickles that `torch.cuda.memory._snapshot()` produces and explains them.
//! The library is a pipeline; each stage is a module and imports only the ones before it:
//!
//! ```text
//!  file ──▶ pickle ──▶ snapshot ──▶ replay ──▶ report
//!          (decode)    (model)     (memory
//!                                  over time)
//! ```
//!
//! - [`pickle`]: a data-only pickle VM (never runs code), with gzip/xz/zstd input;
//! - [`snapshot`]: typed, interned tables of segments, blocks, trace events and frames;
//! - [`replay`]: allocated, requested, active and reserved bytes after every event, from an
//!   exact simulation of the caching allocator, checked against the snapshot's final state;
//! - [`report`]: the figures `memsnap report` prints, as text or JSON.
//!
//! ```no_run
//! let snap = memsnap::snapshot::Snapshot::open("rank0.pickle".as_ref())?;
//! for r in memsnap::replay::replay_all(&snap, Default::default()) {
//!     println!("device {} peaked at {} bytes", r.device, r.peaks.allocated.bytes);
//! }
//! # Ok::<(), memsnap::Error>(())
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod analysis;
pub mod attribute;
pub mod chart;
mod error;
pub mod pickle;
pub mod replay;
pub mod report;
pub mod snapshot;
pub mod units;

pub use error::{Error, ErrorKind};

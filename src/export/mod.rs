//! Export: the analysis and the snapshot written back out.
//!
//! - [`tables`]: the events, blocks, steps and peak tables (`memsnap export`), as JSON lines,
//!   or as Parquet and CSV through polars ([`parquet`], the `export` feature);
//! - [`trim`]: a window of the trace as a snapshot pickle of its own (`memsnap trim`);
//! - [`chrome`]: memory over time as a Chrome trace, beside the profiler's.
//!
//! This stage reads the model, the replay and the analysis; no other stage reads it.

pub mod chrome;
#[cfg(feature = "export")]
pub mod parquet;
pub mod tables;
pub mod trim;

//! End-to-end tests: they run the `memsnap` binary.

mod attribution;
mod capture;
mod chart;
mod compare;
mod corpus;
mod diff;
mod errors;
mod escaping;
mod export;
mod flamegraph;
mod formats;
mod golden;
mod hostile;
mod mcp;
mod outputs;
mod predict;
mod programs;
mod real_world;
mod report;
mod scale;
mod simulate;
mod summaries;
mod trim;
mod usability;
mod util;
mod view;

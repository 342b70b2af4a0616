//! End-to-end tests: they run the `memsnap` binary.

mod attribution;
mod chart;
mod errors;
mod report;
mod util;

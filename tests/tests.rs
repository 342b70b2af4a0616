//! End-to-end tests: they run the `memsnap` binary.

mod errors;
mod report;
mod util;

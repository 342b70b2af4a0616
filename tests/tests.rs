//! End-to-end tests: they run the `memsnap` binary.

mod attribution;
mod errors;
mod report;
mod util;

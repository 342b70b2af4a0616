//! Errors: one type for the library, one line for the user.
//!
//! Every error type of the crate is defined here, at the ground, so that this module imports
//! nothing from the stages above it, nor from the other ground modules but [`crate::units`]
//! and [`crate::escape`] (which import nothing): [`decode`] holds the pickle reader's errors
//! (re-exported by [`crate::pickle`]), [`options`] those of rules, charts and options
//! (re-exported by [`crate::attribute::rules`] and [`crate::chart`]), [`output`] those of
//! outputs and small inputs (re-exported by [`crate::output`], which imports this module and
//! not the other way round).

pub mod decode;
pub mod options;
pub mod output;

use std::io;
use std::path::{Path, PathBuf};

pub use decode::{DecodeError, DecodeErrorKind, FieldError};
pub use options::{ChartError, RulesError, UsageError};

pub use output::{OutputError, SmallFileError};

/// A file could not be read, decoded or analysed.
///
/// Shown as one line safe for a terminal: `FILE: WHAT`, control characters of the name
/// escaped and a message of several lines (a parser's) joined.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: {}",
    crate::escape::printable(&file.display().to_string()),
    crate::escape::one_line(&kind.to_string())
)]
pub struct Error {
    /// The file concerned.
    pub file: PathBuf,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl Error {
    /// An error about `file`.
    pub fn new(file: &Path, kind: ErrorKind) -> Error {
        Error {
            file: file.to_path_buf(),
            kind,
        }
    }

    /// Whether the user can fix this by changing the command (a bad option value, a rules
    /// file that does not parse, an output path that cannot be written, a `--device` that is
    /// not in the file), as opposed to an input file that cannot be analysed.
    pub fn is_usage(&self) -> bool {
        match &self.kind {
            // the image fits the options; the allowance is what the run lacks, as for a file
            ErrorKind::Chart(ChartError::Memory { .. }) => false,
            kind => matches!(
                kind,
                ErrorKind::Rules(_)
                    | ErrorKind::Chart(_)
                    | ErrorKind::Usage(_)
                    | ErrorKind::Output(_)
            ),
        }
    }
}

/// The kinds of failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Opening, reading or writing failed.
    #[error("{}", io_text(.0))]
    Io(io::Error),
    /// The pickle is corrupt, truncated, hostile or not data-only.
    #[error("{0}")]
    Decode(DecodeError),
    /// The pickle is fine but holds something else than a memory snapshot.
    #[error("not a memory snapshot: {0}")]
    NotASnapshot(String),
    /// A snapshot whose fields have the wrong types.
    #[error("invalid snapshot: {0}")]
    Invalid(FieldError),
    /// A rules file that cannot be used (named with the option that gave it).
    #[error("--rules: {0}")]
    Rules(RulesError),
    /// A chart that cannot be drawn or written.
    #[error("{0}")]
    Chart(ChartError),
    /// No device of the file has what the command needs (trace events, an OOM).
    #[error("{0}")]
    NoDevice(String),
    /// The memory held after decoding, by the analysis and the views, passed `--max-memory`
    /// (the decoder checks as it reads: [`DecodeErrorKind::MemoryLimit`]).
    #[error(
        "memory use passed the limit of {} after decoding (raise it with --max-memory)",
        crate::units::bytes(*.0)
    )]
    MemoryLimit(u64),
    /// A snapshot this command cannot work on (the simulation of a file recorded with another
    /// allocator).
    #[error("{0}")]
    Unsupported(String),
    /// An option value that does not fit this file or command.
    #[error("{0}")]
    Usage(UsageError),
    /// An output that cannot be written (or must not be: it is an input).
    #[error("{0}")]
    Output(OutputError),
}

impl From<UsageError> for ErrorKind {
    fn from(e: UsageError) -> ErrorKind {
        ErrorKind::Usage(e)
    }
}

impl From<OutputError> for ErrorKind {
    fn from(e: OutputError) -> ErrorKind {
        ErrorKind::Output(e)
    }
}

/// An I/O error's text for one line: the system's words without the trailing `(os error N)`.
pub fn io_text(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    }
}

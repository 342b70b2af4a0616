//! Errors: one type for the library, one line for the user.

use std::io;
use std::path::{Path, PathBuf};

use crate::pickle::DecodeError;

/// A file could not be read, decoded or analysed.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", file.display())]
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
}

/// The kinds of failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Opening, reading or writing failed.
    #[error("{0}")]
    Io(io::Error),
    /// The pickle is corrupt, truncated, hostile or not data-only.
    #[error("{0}")]
    Decode(DecodeError),
    /// The pickle is fine but holds something else than a memory snapshot.
    #[error("not a memory snapshot: {0}")]
    NotASnapshot(String),
    /// A snapshot whose fields have the wrong types.
    #[error("invalid snapshot: {0}")]
    Invalid(String),
    /// A request that cannot be served for this file (unknown device, bad rule file, ...).
    #[error("{0}")]
    Usage(String),
}

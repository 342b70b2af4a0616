//! Errors of the outputs and small inputs ([`crate::output`], which re-exports them): kept
//! here, at the ground, so that the error module and the output module do not import each
//! other.

use std::io;
use std::path::PathBuf;

/// Why an output cannot be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The target is a file this command reads.
    #[error("is a file this command reads: memsnap never writes over its input; give another output name")]
    IsInput,
    /// The target exists and its name was not the user's.
    #[error("exists, and memsnap chose this name itself: give --force to write over it")]
    Exists,
    /// The target's folder does not exist.
    #[error("the folder {} does not exist", .0.display())]
    NoFolder(PathBuf),
    /// The target is a folder.
    #[error("is a folder: give a file name")]
    IsFolder,
    /// Creating, writing or renaming failed.
    #[error("cannot write it: {}", super::io_text(.0))]
    Io(#[from] io::Error),
}

/// Why a small input was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SmallFileError {
    /// A device, a pipe or a folder.
    #[error("not a regular file")]
    NotRegular,
    /// More bytes than allowed.
    #[error("larger than {}", crate::units::bytes(*.0))]
    TooLarge(u64),
    /// Opening or reading failed.
    #[error("{}", super::io_text(.0))]
    Io(#[from] io::Error),
}

//! Decoding errors of the pickle reader ([`crate::pickle`]): what went wrong and the byte offset
//! where it did.

use std::io;

/// A pickle could not be decoded. `offset` is the byte (in the decompressed stream) where the
/// failing opcode starts.
#[derive(Debug, thiserror::Error)]
#[error("byte {offset}{}: {kind}", if *.decompressed { " of the decompressed stream" } else { "" })]
pub struct DecodeError {
    /// Offset of the failing opcode in the decompressed pickle stream.
    pub offset: u64,
    /// What went wrong.
    pub kind: DecodeErrorKind,
    /// The input was decompressed (the offset is not a byte of the file).
    pub decompressed: bool,
}

/// The reasons a pickle is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The input is empty.
    #[error("the file is empty")]
    Empty,
    /// The input ends in the middle of an opcode or before `STOP`.
    #[error("the pickle ends {needed} byte(s) early (truncated file?)")]
    Truncated {
        /// How many more bytes the opcode needed (at least).
        needed: u64,
    },
    /// An opcode that imports or calls Python objects.
    #[error("opcode {op} would run code; refusing to load")]
    RunsCode {
        /// The opcode's name.
        op: &'static str,
    },
    /// A byte that is not a pickle opcode.
    #[error("byte 0x{0:02x} is not a pickle opcode (not a pickle, or corrupt)")]
    UnknownOpcode(u8),
    /// The first byte is not how any pickle begins.
    #[error(
        "not a pickle but {what} (it starts with byte 0x{first:02x}); memsnap reads the pickle torch.cuda.memory._dump_snapshot() writes"
    )]
    NotAPickle {
        /// The first byte.
        first: u8,
        /// What the file looks like instead.
        what: &'static str,
    },
    /// A `PROTO` above 5.
    #[error("pickle protocol {0} is newer than protocol 5")]
    Protocol(u8),
    /// An opcode found too few values on the stack.
    #[error("{op} found too few values on the stack (corrupt pickle)")]
    StackUnderflow {
        /// The opcode's name.
        op: &'static str,
    },
    /// An opcode that needs a `MARK` found none.
    #[error("{op} without a MARK (corrupt pickle)")]
    NoMark {
        /// The opcode's name.
        op: &'static str,
    },
    /// A memo fetch of a slot that was never stored.
    #[error("{op} fetches memo slot {index}, which was never stored (corrupt pickle)")]
    MissingMemo {
        /// The opcode's name.
        op: &'static str,
        /// The memo index asked for.
        index: u64,
    },
    /// An opcode applied to the wrong kind of value.
    #[error("{op} expects {expected} on the stack, found {found}")]
    WrongType {
        /// The opcode's name.
        op: &'static str,
        /// What it needed.
        expected: &'static str,
        /// What it found.
        found: &'static str,
    },
    /// An opcode argument that does not parse.
    #[error("malformed argument of {op}")]
    BadArgument {
        /// The opcode's name.
        op: &'static str,
    },
    /// An integer wider than 128 bits.
    #[error("integer of {0} bytes is wider than 128 bits")]
    IntTooWide(u64),
    /// A string or bytes object over the size limit.
    #[error("{what} of {size} bytes is over the limit of {limit} bytes")]
    TooLarge {
        /// The opcode's name.
        what: &'static str,
        /// The size it announced.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// More values than the limit allows.
    #[error("more than {0} values: refusing to use more memory")]
    TooManyValues(u64),
    /// Decoding holds far more memory than the pickle read so far could need: a memory bomb.
    #[error("the pickle's first {} build {} of objects, more than a snapshot needs (64 MiB + 2x what was read); refusing a likely memory bomb", crate::units::bytes(*.read), crate::units::bytes(*.held))]
    MemoryBomb {
        /// Heap bytes the decoder held.
        held: u64,
        /// Bytes of pickle read.
        read: u64,
    },
    /// The process reached `--max-memory`.
    #[error("memory use reached the limit of {} (raise it with --max-memory)", crate::units::bytes(*.0))]
    MemoryLimit(u64),
    /// The decompressed pickle is longer than `--max-size`.
    #[error("the pickle is larger than the limit of {} (raise it with --max-size)", crate::units::bytes(*.0))]
    SizeLimit(u64),
    /// Protocol-5 out-of-band buffers.
    #[error("out-of-band buffers (pickle protocol 5) cannot be read from a file")]
    OutOfBand,
    /// The consumer of the values refused one (see [`crate::pickle::Adopter`]).
    #[error("{0}")]
    Rejected(FieldError),
    /// Reading or decompressing failed.
    #[error("{}", describe_io(.0))]
    Io(io::Error),
    /// A part of a split decode could go no further on its own (never shown: the whole pickle
    /// is then decoded in one piece).
    #[error("the pickle cannot be decoded in parts here")]
    PartEnd,
    /// Bytes follow the pickle's `STOP`.
    #[error("{bytes} more byte(s) follow the end of the pickle{}", if *.second_pickle { " (a second pickle: memsnap reads one snapshot per file)" } else { " (junk: a damaged or concatenated file?)" })]
    TrailingData {
        /// How many.
        bytes: u64,
        /// They begin like a pickle.
        second_pickle: bool,
    },
}

/// A value of the wrong type or out of range where a consumer needed a certain field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place} is {found}, expected {expected}")]
pub struct FieldError {
    /// Where the value is (`segments[3].blocks[0].size`).
    pub place: String,
    /// What it is (`a str`, `-5`).
    pub found: String,
    /// What it should have been (`an int`, `a 64-bit size`).
    pub expected: &'static str,
}

impl FieldError {
    /// `place` holds `found` where `expected` was needed.
    pub fn new(place: impl Into<String>, found: impl Into<String>, expected: &'static str) -> Self {
        FieldError {
            place: place.into(),
            found: found.into(),
            expected,
        }
    }
}

/// A read or decompression error as one plain sentence.
fn describe_io(e: &io::Error) -> String {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if lower.contains("crc") || lower.contains("checksum") || lower.contains("corrupt") {
        format!("the compressed data is damaged ({text})")
    } else if e.kind() == io::ErrorKind::UnexpectedEof || lower.contains("unexpected end") {
        "the compressed file ends early (truncated?)".to_string()
    } else if e.kind() == io::ErrorKind::InvalidInput || e.kind() == io::ErrorKind::InvalidData {
        format!("the compressed data cannot be read ({text})")
    } else {
        text
    }
}

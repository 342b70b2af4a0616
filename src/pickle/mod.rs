//! Decode: a data-only pickle virtual machine.
//!
//! `torch.cuda.memory._snapshot()` is saved with Python's `pickle`. memsnap reads it with its
//! own VM because no crate does the job: `serde-pickle` rejects memo references to the same
//! container from two places (`Syntax(Recursive)`), which every real snapshot has, and even when
//! patched it deep-copies each reference, which costs 10-20x the time and gigabytes of memory on
//! large files. Here every container lives once in a [`Heap`] and values are 16-byte `Copy`
//! handles, so sharing stays sharing.
//!
//! What this stage owns:
//! - reading plain, gzip (`gunzip`: headers of any length), xz or zstd input in bounded
//!   windows ([`source`]);
//! - protocols 0 to 5 and every opcode a data-only pickle uses, `FRAME`, memo ops of all widths;
//! - a fast path for the flat dicts that make up nearly all of a snapshot (trace entries): read
//!   whole from the window and offered to the adopter ([`Adopter::adopt_flat`]), with the same
//!   result as decoding them opcode by opcode;
//! - decoding one stretch of a pickle on its own ([`decode_part`]), and pausing a decode to take
//!   such a stretch in ([`Resumable`]), with [`scan`] to number the memo entries before it: the
//!   snapshot stage splits large files across threads with them;
//! - refusing, with the byte offset, every opcode that would import or call code
//!   (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ(_EX)`, `EXT1/2/4`,
//!   `PERSID`, `BINPERSID`). Nothing is ever executed;
//! - bounded memory on hostile input: length prefixes are never trusted, memo indices never
//!   size an allocation, the VM is iterative (no recursion however deep the nesting), and a
//!   value budget caps the total ([`Limits`]).
//!
//! It knows nothing about snapshots. The snapshot stage plugs in an [`Adopter`], which sees each
//! value as it is stored into its container and may compact it (a trace entry becomes a row, a
//! frame dict an interned id), so a million entries never exist as a million dicts at once.
//!
//! `serde-pickle` is used only in tests, to write pickles for the VM to read back.
//!
//! ```
//! use memsnap::pickle::{decode, Limits, Value};
//! // {'a': [1, 2]} as protocol 2
//! let bytes = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01K\x02es.";
//! let out = decode(&bytes[..], Limits::default()).unwrap();
//! let Value::Dict(d) = out.root else { panic!() };
//! let key = out.heap.lookup("a").unwrap();
//! let Some(Value::List(l)) = out.heap.dict_get(d, key) else { panic!() };
//! assert_eq!(out.heap.list(l), &[Value::Int(1), Value::Int(2)]);
//! ```

mod gunzip;
mod memo;
pub mod opcodes;
mod reader;
pub mod scan;
pub mod source;
mod value;
mod vm;
pub mod writer;

pub use crate::error::{DecodeError, DecodeErrorKind, FieldError};
pub use source::Compression;
pub use value::{Heap, Ref, StrId, Value};
pub use vm::{
    decode, decode_part, decode_stream, decode_with, Adopter, Decoded, FlatAdopted, FlatDict,
    FlatItem, FlatList, KeepAll, Limits, PartInput, PartOutput, Progress, Resumable,
};
pub use writer::PickleWriter;

#[cfg(test)]
mod tests;

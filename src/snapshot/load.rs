//! Loading a snapshot file: opening it (plain, gzip, xz or zstd, or standard input), reporting
//! progress, deciding whether a large plain file is decoded in parts on several threads
//! ([`super::split`]) or in one piece ([`super::build::from_stream`]), and the memory check
//! after decoding.

use std::path::Path;
use std::sync::Arc;

use super::split::usable_threads;
use super::*;
use crate::pickle::{self, Limits};
use crate::{Error, ErrorKind};

/// Options for [`load`].
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Decoder limits.
    pub limits: Limits,
    /// Told `(raw bytes read so far, file size)` as the file is read, e.g. for a progress bar.
    pub on_progress: Option<Arc<dyn Fn(u64, u64) + Send + Sync>>,
    /// Most threads decoding this file may use (0: one per core); less than a core each when
    /// several files are read at once.
    pub threads: usize,
}

/// Decodes a large plain snapshot file in parts on several threads ([`super::split`]); `None`
/// when it is not such a file or the split gives up (then `file` is read from its start again).
#[cfg(unix)]
fn load_split(
    file: &std::fs::File,
    len: u64,
    options: &LoadOptions,
    on_read: Box<dyn FnMut(u64) + Send>,
) -> Option<Snapshot> {
    let mut head = [0u8; 6];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut head, 0).ok()?;
    if pickle::Compression::sniff(&head) != pickle::Compression::None {
        return None;
    }
    super::split::load(
        file.try_clone().ok()?,
        len,
        options.limits,
        options.threads,
        on_read,
    )
}

#[cfg(not(unix))]
fn load_split(
    _: &std::fs::File,
    _: u64,
    _: &LoadOptions,
    _: Box<dyn FnMut(u64) + Send>,
) -> Option<Snapshot> {
    None
}

/// Whether a file is read (and decompressed) on a thread of its own, ahead of the decoder: when
/// the decoder may use more than one core.
fn read_ahead(threads: usize) -> bool {
    usable_threads(threads) > 1
}

/// Reads a snapshot file: plain, gzip, xz or zstd pickle ([`pickle::source::STDIN`] reads
/// standard input).
pub fn load(path: &Path, options: &LoadOptions) -> Result<Snapshot, Error> {
    // No output of this process will be written over the file (`crate::output`).
    crate::output::note_input(path);
    if path == Path::new(pickle::source::STDIN) {
        let stdin = std::io::BufReader::with_capacity(1 << 16, std::io::stdin());
        return load_from(Input::Stream(Box::new(stdin)), path, options);
    }
    let file = std::fs::File::open(path).map_err(|e| Error::new(path, ErrorKind::Io(e)))?;
    let mut snap = load_from(Input::File(file), path, options)?;
    match super::tensors::read(path) {
        Ok(found) => snap.capture = found,
        Err(e) => snap
            .side_file_problems
            .push(format!("the tensors beside it were left out: {e}")),
    }
    Ok(snap)
}

/// Reads a snapshot from a file already open, which is what is read whatever `name` (the name
/// errors and the snapshot give it) leads to now.
pub fn load_open(
    file: std::fs::File,
    name: &Path,
    options: &LoadOptions,
) -> Result<Snapshot, Error> {
    crate::output::note_input(name);
    load_from(Input::File(file), name, options)
}

/// What a snapshot is read from.
enum Input {
    File(std::fs::File),
    /// A pipe: its size is unknown, and it is read once.
    Stream(Box<dyn std::io::Read + Send>),
}

fn load_from(input: Input, path: &Path, options: &LoadOptions) -> Result<Snapshot, Error> {
    let wrap = |kind| Error::new(path, kind);
    let total = match &input {
        Input::File(f) => f.metadata().map(|m| m.len()).unwrap_or(0),
        Input::Stream(_) => 0,
    };
    let progress = options.on_progress.clone();
    let on_read = move || -> Box<dyn FnMut(u64) + Send> {
        let progress = progress.clone();
        let mut read_so_far = 0u64;
        Box::new(move |n| {
            read_so_far += n;
            if let Some(p) = &progress {
                p(read_so_far, total);
            }
        })
    };
    let split = match &input {
        Input::File(f) => load_split(f, total, options, on_read()),
        Input::Stream(_) => None,
    };
    let (mut snap, compression, file_bytes) = match split {
        Some(snap) => (snap, pickle::Compression::None, total),
        None => {
            let raw: Box<dyn std::io::Read + Send> = match input {
                Input::File(mut f) => {
                    use std::io::Seek;
                    f.rewind().map_err(|e| wrap(ErrorKind::Io(e)))?;
                    Box::new(std::io::BufReader::with_capacity(1 << 16, f))
                }
                Input::Stream(s) => s,
            };
            let (reader, compression) =
                pickle::source::open_reader(raw, on_read(), read_ahead(options.threads))
                    .map_err(|e| wrap(ErrorKind::Io(e)))?;
            let file_bytes = total;
            let mut limits = options.limits;
            if limits.size_hint == 0 {
                // Snapshots compress about 10-20x; a generous guess only reserves address
                // space.
                limits.size_hint = match compression {
                    pickle::Compression::None => file_bytes,
                    _ => file_bytes.saturating_mul(16),
                };
            }
            let compressed = compression != pickle::Compression::None;
            let snap = super::build::from_stream(reader, limits).map_err(|mut kind| {
                if let ErrorKind::Decode(d) = &mut kind {
                    d.decompressed = compressed;
                }
                wrap(kind)
            })?;
            (snap, compression, file_bytes)
        }
    };
    snap.source.compression = Some(compression);
    snap.source.file_bytes = file_bytes;
    let max_memory = options.limits.caps.max_memory;
    if crate::memory::process_bytes() > max_memory {
        return Err(wrap(ErrorKind::Decode(pickle::DecodeError {
            offset: snap.source.pickle_bytes,
            kind: pickle::DecodeErrorKind::MemoryLimit(max_memory),
            decompressed: compression != pickle::Compression::None,
        })));
    }
    Ok(snap)
}

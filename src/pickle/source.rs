//! Opening inputs: plain, gzip, xz or zstd, recognised by their first bytes; read (and
//! decompressed) on a thread of their own ahead of the decoder where a core is free for it.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::sync::mpsc;

/// How an input file is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Not compressed.
    None,
    /// gzip (`1f 8b`).
    Gzip,
    /// xz (`fd 37 7a 58 5a 00`).
    Xz,
    /// zstd (`28 b5 2f fd`, or a skippable frame `5? 2a 4d 18` first).
    Zstd,
}

impl Compression {
    /// Recognises the compression from the first bytes of a file.
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
            Compression::Xz
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
            || (head.len() >= 4 && head[0] & 0xf0 == 0x50 && head[1..4] == [0x2a, 0x4d, 0x18])
        {
            // a zstd frame, or a skippable frame (magic 0x184D2A5?) that may come first
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Counts the bytes read from the underlying (possibly compressed) file.
pub struct Counting<R> {
    inner: R,
    on_read: Box<dyn FnMut(u64) + Send>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.on_read)(n as u64);
        Ok(n)
    }
}

/// Wraps `raw` in the decompressor its first bytes call for.
pub fn decompressing<R: Read + Send + 'static>(
    mut raw: R,
) -> io::Result<(Box<dyn Read + Send>, Compression)> {
    let mut head = [0u8; 6];
    let mut got = 0;
    while got < head.len() {
        match raw.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let kind = Compression::sniff(&head[..got]);
    let whole = io::Cursor::new(head[..got].to_vec()).chain(raw);
    let reader: Box<dyn Read + Send> = match kind {
        Compression::None => Box::new(whole),
        Compression::Gzip => Box::new(super::gunzip::Gunzip::new(BufReader::new(whole))),
        Compression::Xz => Box::new(xz2::read::XzDecoder::new_multi_decoder(BufReader::new(
            whole,
        ))),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(whole)?),
    };
    Ok((reader, kind))
}

#[cfg(unix)]
pub use positioned::FileAt;

#[cfg(unix)]
mod positioned {
    use super::*;

    /// A plain file read from any offset, independently of other readers of the same file
    /// (positioned reads): each part of a split decode reads its own stretch.
    pub struct FileAt {
        file: std::sync::Arc<File>,
        pos: u64,
        on_read: Option<Box<dyn FnMut(u64) + Send>>,
    }

    impl FileAt {
        /// Reads `file` from byte `pos`; `on_read` is told of the bytes each read (or jump) passes.
        pub fn new(
            file: std::sync::Arc<File>,
            pos: u64,
            on_read: Option<Box<dyn FnMut(u64) + Send>>,
        ) -> FileAt {
            FileAt { file, pos, on_read }
        }
    }

    impl Read for FileAt {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            use std::os::unix::fs::FileExt;
            let n = self.file.read_at(buf, self.pos)?;
            self.pos += n as u64;
            if let Some(f) = self.on_read.as_mut() {
                f(n as u64);
            }
            Ok(n)
        }
    }

    impl io::Seek for FileAt {
        fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
            let io::SeekFrom::Start(to) = to else {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "only absolute positions",
                ));
            };
            if let Some(f) = self.on_read.as_mut() {
                f(to.saturating_sub(self.pos));
            }
            self.pos = to;
            Ok(to)
        }
    }
}

/// Bytes in one piece that [`ReadAhead`] hands over.
const AHEAD_CHUNK: usize = 1 << 20;
/// Room kept before a piece's bytes, where a reader that takes pieces whole puts the last
/// bytes of its previous window (`reader.rs`).
pub(crate) const PIECE_ROOM: usize = 64 << 10;
/// Pieces read ahead and not yet taken: what reading ahead holds at most, with the one being
/// taken and the one being filled.
const AHEAD_CHUNKS: usize = 3;

/// What the reading thread sends: a piece of the stream (a buffer and how much of it holds
/// bytes), or the error that ended it. The end of the stream is the channel closing.
enum Piece {
    /// A buffer and how many bytes it holds after [`PIECE_ROOM`].
    Bytes(Vec<u8>, usize),
    Failed(io::Error),
}

/// A reader that reads (and decompresses) its input on a thread of its own, a few pieces of
/// 1 MiB ahead of the consumer, so that decompressing overlaps with decoding. The consumer sees
/// the same bytes, errors and end as reading the input directly; memory stays bounded by a few
/// pieces. Dropping it stops the thread at its next piece.
///
/// Written by hand: it is a bounded channel of buffers, recycled, and no crate does exactly
/// this with errors kept in place.
pub struct ReadAhead {
    pieces: mpsc::Receiver<Piece>,
    spare: mpsc::SyncSender<Vec<u8>>,
    current: Vec<u8>,
    filled: usize,
    at: usize,
    /// The error that ended the stream, repeated to any later read.
    failed: Option<(io::ErrorKind, String)>,
}

impl ReadAhead {
    /// Starts reading `inner` ahead; gives it back as it is when no thread can be started.
    pub fn start<R: Read + Send + 'static>(inner: R) -> Box<dyn Read + Send> {
        match ReadAhead::spawn(inner) {
            Ok(ahead) => Box::new(ahead),
            Err(inner) => inner,
        }
    }

    /// Starts reading `inner` ahead, or gives it back (boxed) when no thread can be started.
    pub fn spawn<R: Read + Send + 'static>(inner: R) -> Result<ReadAhead, Box<dyn Read + Send>> {
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(inner)));
        let (piece_tx, pieces) = mpsc::sync_channel(AHEAD_CHUNKS);
        let (spare, spare_rx) = mpsc::sync_channel::<Vec<u8>>(AHEAD_CHUNKS + 1);
        let taken = slot.clone();
        let started = std::thread::Builder::new()
            .name("memsnap-read".into())
            .spawn(move || {
                let Some(inner) = taken.lock().ok().and_then(|mut s| s.take()) else {
                    return;
                };
                fill_pieces(inner, &piece_tx, &spare_rx);
            });
        match started {
            Ok(_) => Ok(ReadAhead {
                pieces,
                spare,
                current: Vec::new(),
                filled: 0,
                at: 0,
                failed: None,
            }),
            Err(_) => {
                let inner = slot.lock().ok().and_then(|mut s| s.take());
                Err(match inner {
                    Some(r) => Box::new(r),
                    None => Box::new(io::empty()),
                })
            }
        }
    }

    /// The next piece whole: its buffer, whose bytes are those from [`PIECE_ROOM`] on, and
    /// how many there are. After a failure, each call gives the same error again.
    pub(crate) fn next_piece(&mut self) -> Handed {
        if let Some((kind, text)) = &self.failed {
            return Handed::Failed(io::Error::new(*kind, text.clone()));
        }
        match self.pieces.recv() {
            Ok(Piece::Bytes(b, n)) => Handed::Piece(b, n),
            Ok(Piece::Failed(e)) => {
                self.failed = Some((e.kind(), e.to_string()));
                Handed::Failed(e)
            }
            Err(mpsc::RecvError) => Handed::End,
        }
    }

    /// Gives a buffer back for a later piece (one of another size is dropped).
    pub(crate) fn give_back(&mut self, used: Vec<u8>) {
        if used.len() == PIECE_ROOM + AHEAD_CHUNK {
            let _ = self.spare.try_send(used);
        }
    }
}

/// What [`ReadAhead::next_piece`] hands over.
pub(crate) enum Handed {
    /// A buffer and how many bytes it holds after [`PIECE_ROOM`].
    Piece(Vec<u8>, usize),
    /// The input has ended.
    End,
    /// Reading failed.
    Failed(io::Error),
}

/// The reading thread: fills pieces (recycled ones first) and sends them until the input
/// ends, fails, or the consumer is gone.
fn fill_pieces<R: Read>(
    mut inner: R,
    pieces: &mpsc::SyncSender<Piece>,
    spare: &mpsc::Receiver<Vec<u8>>,
) {
    loop {
        let mut buf = spare
            .try_recv()
            .unwrap_or_else(|_| vec![0; PIECE_ROOM + AHEAD_CHUNK]);
        let mut filled = PIECE_ROOM;
        let mut failure = None;
        while filled < buf.len() {
            match inner.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let ended = filled < buf.len();
        if filled > PIECE_ROOM && pieces.send(Piece::Bytes(buf, filled - PIECE_ROOM)).is_err() {
            return;
        }
        if let Some(e) = failure {
            let _ = pieces.send(Piece::Failed(e));
            return;
        }
        if ended {
            return;
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.at == self.filled {
            if let Some((kind, text)) = &self.failed {
                return Err(io::Error::new(*kind, text.clone()));
            }
            match self.pieces.recv() {
                Ok(Piece::Bytes(b, n)) => {
                    let used = std::mem::replace(&mut self.current, b);
                    self.give_back(used);
                    (self.filled, self.at) = (PIECE_ROOM + n, PIECE_ROOM);
                }
                Ok(Piece::Failed(e)) => {
                    self.failed = Some((e.kind(), e.to_string()));
                    return Err(e);
                }
                Err(mpsc::RecvError) => return Ok(0),
            }
        }
        let n = buf.len().min(self.filled - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

pub use crate::output::STDIN;

/// An input ready to decode.
pub enum Stream {
    /// Read by the decoder itself.
    Direct(Box<dyn Read + Send>),
    /// Read (and decompressed) on a thread of its own, its pieces handed over whole.
    Ahead(ReadAhead),
}

/// Decoding from `raw` (a file or pipe, buffered): its compression recognised, `on_read`
/// told of each read, and read on a thread of its own when `read_ahead` is set and the thread
/// can be started.
pub fn open_reader(
    raw: Box<dyn Read + Send>,
    on_read: Box<dyn FnMut(u64) + Send>,
    read_ahead: bool,
) -> io::Result<(Stream, Compression)> {
    let counted = Counting {
        inner: raw,
        on_read,
    };
    let (reader, kind) = decompressing(counted)?;
    if !read_ahead {
        return Ok((Stream::Direct(reader), kind));
    }
    let stream = match ReadAhead::spawn(reader) {
        Ok(ahead) => Stream::Ahead(ahead),
        Err(reader) => Stream::Direct(reader),
    };
    Ok((stream, kind))
}

/// Gives `data` in reads of at most `step` bytes, then fails (when `fails`) or ends: an input
/// for the tests of reading ahead, here and in `reader.rs`.
#[cfg(test)]
pub(crate) struct Trickle {
    pub(crate) data: Vec<u8>,
    pub(crate) at: usize,
    pub(crate) step: usize,
    pub(crate) fails: bool,
}

#[cfg(test)]
impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.data.len() {
            return match self.fails {
                true => Err(io::Error::new(io::ErrorKind::InvalidData, "corrupt stream")),
                false => Ok(0),
            };
        }
        let n = buf.len().min(self.step).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn roundtrip(kind: Compression, data: &[u8]) -> Vec<u8> {
        let packed = match kind {
            Compression::None => data.to_vec(),
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Compression::Xz => {
                let mut e = xz2::write::XzEncoder::new(Vec::new(), 1);
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Compression::Zstd => zstd::stream::encode_all(data, 1).unwrap(),
        };
        assert_eq!(Compression::sniff(&packed), kind);
        let (mut r, got) = decompressing(io::Cursor::new(packed)).unwrap();
        assert_eq!(got, kind);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn every_compression_gives_the_same_bytes() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 253) as u8).collect();
        for kind in [
            Compression::None,
            Compression::Gzip,
            Compression::Xz,
            Compression::Zstd,
        ] {
            assert_eq!(roundtrip(kind, &data), data, "{kind:?}");
        }
    }

    #[test]
    fn zstd_with_skippable_frames_and_concatenated_streams_is_read() {
        let mut packed = Vec::new();
        // A skippable frame first (as `zstd --patch-from` and seekable writers put), then two
        // frames with another skippable frame between them.
        packed.extend([0x5a, 0x2a, 0x4d, 0x18]);
        packed.extend(5u32.to_le_bytes());
        packed.extend(b"hello");
        packed.extend(zstd::stream::encode_all(&b"first "[..], 1).unwrap());
        packed.extend([0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0]);
        packed.extend(zstd::stream::encode_all(&b"second"[..], 3).unwrap());
        assert_eq!(Compression::sniff(&packed), Compression::Zstd);
        let (mut r, kind) = decompressing(io::Cursor::new(packed)).unwrap();
        assert_eq!(kind, Compression::Zstd);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"first second");
        // xz streams one after another.
        let mut xz = Vec::new();
        for part in [&b"one "[..], b"two"] {
            let mut e = xz2::write::XzEncoder::new(Vec::new(), 1);
            e.write_all(part).unwrap();
            xz.extend(e.finish().unwrap());
        }
        let (mut r, _) = decompressing(io::Cursor::new(xz)).unwrap();
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"one two");
    }

    #[test]
    fn short_inputs_are_plain() {
        assert_eq!(Compression::sniff(&[]), Compression::None);
        assert_eq!(Compression::sniff(&[0x80, 4]), Compression::None);
    }

    #[test]
    fn reading_ahead_gives_the_same_bytes_then_the_same_end_or_error() {
        let data: Vec<u8> = (0..3 * AHEAD_CHUNK as u32 + 12_345)
            .map(|i| (i % 251) as u8)
            .collect();
        for (step, fails) in [(7_777, false), (AHEAD_CHUNK, false), (100_000, true)] {
            let inner = Trickle {
                data: data.clone(),
                at: 0,
                step,
                fails,
            };
            let mut r = ReadAhead::start(inner);
            let mut got = Vec::new();
            let mut buf = vec![0; 65_537];
            let end = loop {
                match r.read(&mut buf) {
                    Ok(0) => break None,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => break Some(e),
                }
            };
            assert!(got == data, "every byte, in order (reads of {step})");
            match end {
                None => assert!(!fails),
                Some(e) => {
                    assert!(fails);
                    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                    // and again to a later read, as the input itself would
                    let again = r.read(&mut buf).unwrap_err();
                    assert_eq!(again.to_string(), "corrupt stream");
                }
            }
        }
    }

    /// Counts the bytes read from it.
    struct Tally<R>(R, std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl<R: Read> Read for Tally<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            Ok(n)
        }
    }

    #[test]
    fn reading_ahead_holds_a_few_pieces_and_stops_with_its_reader() {
        let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let inner = Trickle {
            data: vec![1; 64 * AHEAD_CHUNK],
            at: 0,
            step: AHEAD_CHUNK,
            fails: false,
        };
        let mut r = ReadAhead::start(Tally(inner, read.clone()));
        let mut buf = [0u8; 10];
        assert_eq!(r.read(&mut buf).unwrap(), 10);
        std::thread::sleep(std::time::Duration::from_millis(200));
        // the pieces queued, the one taken and the one being filled: never the whole input
        let bound = (AHEAD_CHUNKS + 2) * AHEAD_CHUNK;
        assert!(read.load(std::sync::atomic::Ordering::Relaxed) <= bound);
        drop(r);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let after_drop = read.load(std::sync::atomic::Ordering::Relaxed);
        assert!(after_drop <= bound + AHEAD_CHUNK, "{after_drop} bytes read");
    }
}

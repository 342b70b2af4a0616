//! Opening inputs: plain, gzip, xz or zstd, recognised by their first bytes.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

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
    /// zstd (`28 b5 2f fd`).
    Zstd,
}

impl Compression {
    /// Recognises the compression from the first bytes of a file.
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
            Compression::Xz
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
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
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(whole))),
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

/// The path that names standard input (`memsnap report -`).
pub const STDIN: &str = "-";

/// Opens `path` for decoding; [`STDIN`] reads standard input (a pipe: its size is unknown, 0). `on_read` is told how many raw bytes each read consumed (for a
/// progress bar); the second value is the file's size.
pub fn open(
    path: &Path,
    on_read: Box<dyn FnMut(u64) + Send>,
) -> io::Result<(Box<dyn Read + Send>, Compression, u64)> {
    let (inner, len): (Box<dyn Read + Send>, u64) = if path == Path::new(STDIN) {
        (Box::new(BufReader::with_capacity(1 << 16, io::stdin())), 0)
    } else {
        let file = File::open(path)?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        (Box::new(BufReader::with_capacity(1 << 16, file)), len)
    };
    let counted = Counting { inner, on_read };
    let (reader, kind) = decompressing(counted)?;
    Ok((reader, kind, len))
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
    fn short_inputs_are_plain() {
        assert_eq!(Compression::sniff(&[]), Compression::None);
        assert_eq!(Compression::sniff(&[0x80, 4]), Compression::None);
    }
}

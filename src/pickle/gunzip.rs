//! gzip input (RFC 1952): members one after another, each header of any length.
//!
//! flate2 inflates the members' bodies; the headers are read here because flate2's own gzip
//! readers refuse a header field (file name, comment, extra field) longer than 64 KiB, which
//! `gzip -N` and other writers may produce. Header fields are skipped as they stream by, never
//! buffered, so a long one costs no memory. Each member's CRC-32 and length are checked.

use std::io::{self, BufRead, Read};

use flate2::bufread::DeflateDecoder;
use flate2::Crc;

const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;

/// Decompresses every gzip member of `R` in turn.
pub(super) struct Gunzip<R: BufRead> {
    state: State<R>,
    crc: Crc,
}

enum State<R: BufRead> {
    /// Before a member's header (or at the end of the input).
    Between(R),
    /// Inside a member's body.
    Body(Box<DeflateDecoder<R>>),
    /// After the end, or after an error.
    Done,
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("gzip: {what}"))
}

impl<R: BufRead> Gunzip<R> {
    /// A reader of the members of `input`, which starts with a gzip header.
    pub(super) fn new(input: R) -> Gunzip<R> {
        Gunzip {
            state: State::Between(input),
            crc: Crc::new(),
        }
    }
}

/// Reads exactly `buf.len()` bytes, or says the member was cut short.
fn exact<R: BufRead>(r: &mut R, buf: &mut [u8], what: &str) -> io::Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            invalid(&format!("the input ends inside a member's {what}"))
        } else {
            e
        }
    })
}

/// Skips `n` bytes.
fn skip<R: BufRead>(r: &mut R, mut n: u64, what: &str) -> io::Result<()> {
    while n > 0 {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Err(invalid(&format!("the input ends inside a member's {what}")));
        }
        let k = (avail.len() as u64).min(n) as usize;
        r.consume(k);
        n -= k as u64;
    }
    Ok(())
}

/// Skips a zero-terminated field.
fn skip_to_zero<R: BufRead>(r: &mut R, what: &str) -> io::Result<()> {
    loop {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Err(invalid(&format!("the input ends inside a member's {what}")));
        }
        match avail.iter().position(|&b| b == 0) {
            Some(at) => {
                r.consume(at + 1);
                return Ok(());
            }
            None => {
                let k = avail.len();
                r.consume(k);
            }
        }
    }
}

/// Reads a member's header, leaving `r` at the start of its deflate body.
fn header<R: BufRead>(r: &mut R) -> io::Result<()> {
    let mut fixed = [0u8; 10];
    exact(r, &mut fixed, "header")?;
    if fixed[..2] != [0x1f, 0x8b] {
        return Err(invalid("data after the last member is not a gzip member"));
    }
    if fixed[2] != 8 {
        return Err(invalid(&format!(
            "compression method {} (only deflate, 8, exists)",
            fixed[2]
        )));
    }
    let flags = fixed[3];
    if flags & 0xe0 != 0 {
        return Err(invalid("reserved header flags are set"));
    }
    if flags & FEXTRA != 0 {
        let mut len = [0u8; 2];
        exact(r, &mut len, "extra field")?;
        skip(r, u16::from_le_bytes(len) as u64, "extra field")?;
    }
    if flags & FNAME != 0 {
        skip_to_zero(r, "file name")?;
    }
    if flags & FCOMMENT != 0 {
        skip_to_zero(r, "comment")?;
    }
    if flags & FHCRC != 0 {
        skip(r, 2, "header checksum")?;
    }
    Ok(())
}

impl<R: BufRead> Read for Gunzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match std::mem::replace(&mut self.state, State::Done) {
                State::Done => return Ok(0),
                State::Between(mut input) => {
                    if input.fill_buf()?.is_empty() {
                        return Ok(0);
                    }
                    header(&mut input)?;
                    self.crc = Crc::new();
                    self.state = State::Body(Box::new(DeflateDecoder::new(input)));
                }
                State::Body(mut body) => {
                    let n = body.read(buf)?;
                    if n > 0 {
                        self.crc.update(&buf[..n]);
                        self.state = State::Body(body);
                        return Ok(n);
                    }
                    let mut input = body.into_inner();
                    let mut trailer = [0u8; 8];
                    exact(&mut input, &mut trailer, "trailer")?;
                    let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
                    let len = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
                    if crc != self.crc.sum() || len != self.crc.amount() {
                        return Err(invalid("a member's checksum does not match its data"));
                    }
                    self.state = State::Between(input);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A gzip member of `data` with these header fields.
    fn member(
        data: &[u8],
        name: Option<&[u8]>,
        comment: Option<&[u8]>,
        extra: Option<&[u8]>,
    ) -> Vec<u8> {
        let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
        if let Some(x) = extra {
            out[3] |= FEXTRA;
            out.extend((x.len() as u16).to_le_bytes());
            out.extend(x);
        }
        if let Some(n) = name {
            out[3] |= FNAME;
            out.extend(n);
            out.push(0);
        }
        if let Some(c) = comment {
            out[3] |= FCOMMENT;
            out.extend(c);
            out.push(0);
        }
        let mut deflate =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        deflate.write_all(data).unwrap();
        out.extend(deflate.finish().unwrap());
        let mut crc = Crc::new();
        crc.update(data);
        out.extend(crc.sum().to_le_bytes());
        out.extend((data.len() as u32).to_le_bytes());
        out
    }

    fn gunzip(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        Gunzip::new(io::BufReader::with_capacity(64, bytes)).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn headers_of_any_length_and_several_members_are_read() {
        let long_name = vec![b'n'; 1 << 20];
        let mut file = member(
            b"first ",
            Some(&long_name),
            Some(b"a comment"),
            Some(&[7; 65535]),
        );
        file.extend(member(b"second", None, Some(&vec![b'c'; 200_000]), None));
        file.extend(member(b"", None, None, None));
        assert_eq!(gunzip(&file).unwrap(), b"first second");
        // flate2's own reader refuses the first header.
        let mut refused = Vec::new();
        assert!(flate2::read::MultiGzDecoder::new(&file[..])
            .read_to_end(&mut refused)
            .is_err());
        // What gzip itself writes reads the same.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"plain gzip").unwrap();
        assert_eq!(gunzip(&gz.finish().unwrap()).unwrap(), b"plain gzip");
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let good = member(b"some data that compresses", Some(b"n.pickle"), None, None);
        for cut in 0..good.len() {
            assert!(gunzip(&good[..cut]).is_err() || cut == 0, "cut at {cut}");
        }
        let mut bad_crc = good.clone();
        let n = bad_crc.len();
        bad_crc[n - 8] ^= 1;
        assert!(gunzip(&bad_crc)
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        let mut junk = good.clone();
        junk.extend(b"junk after");
        assert!(gunzip(&junk).is_err());
        let mut method = good;
        method[2] = 7;
        assert!(gunzip(&method).is_err());
    }
}

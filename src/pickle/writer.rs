//! Encode: a small protocol-2 pickle writer for the data a snapshot holds (dicts, lists, tuples,
//! text, integers, floats, booleans, `None`), with memo references so that shared values (the
//! frames of a snapshot) are written once and referenced after, as PyTorch's own files do.
//!
//! Written by hand because `serde-pickle` writes each shared value again at every use, which
//! makes a trimmed snapshot larger than the original it was cut from.

use std::io::{self, Write};

/// Writes pickle opcodes to `W`. Containers are written as their empty form, a mark, their
/// items, and the opcode that adds the items (`EMPTY_DICT MARK k v … SETITEMS`).
pub struct PickleWriter<W: Write> {
    out: W,
    next_memo: u32,
}

impl<W: Write> PickleWriter<W> {
    /// Starts a protocol-2 pickle.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&[0x80, 2])?;
        Ok(PickleWriter { out, next_memo: 0 })
    }

    /// Ends the pickle (`STOP`) and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(b".")?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Starts a dict; write keys and values in turn, then [`PickleWriter::end_dict`].
    pub fn begin_dict(&mut self) -> io::Result<()> {
        self.out.write_all(b"}(")
    }

    /// Adds the keys and values written since [`PickleWriter::begin_dict`].
    pub fn end_dict(&mut self) -> io::Result<()> {
        self.out.write_all(b"u")
    }

    /// Starts a list; write its items, then [`PickleWriter::end_list`].
    pub fn begin_list(&mut self) -> io::Result<()> {
        self.out.write_all(b"](")
    }

    /// Adds the items written since [`PickleWriter::begin_list`].
    pub fn end_list(&mut self) -> io::Result<()> {
        self.out.write_all(b"e")
    }

    /// Makes a tuple of the last two values written.
    pub fn tuple2(&mut self) -> io::Result<()> {
        self.out.write_all(&[0x86])
    }

    /// Remembers the value just written; returns the index for [`PickleWriter::get`].
    pub fn put(&mut self) -> io::Result<u32> {
        let index = self.next_memo;
        self.next_memo += 1;
        if index < 256 {
            self.out.write_all(&[b'q', index as u8])?;
        } else {
            self.out.write_all(b"r")?;
            self.out.write_all(&index.to_le_bytes())?;
        }
        Ok(index)
    }

    /// Writes again the value remembered under `index`.
    pub fn get(&mut self, index: u32) -> io::Result<()> {
        if index < 256 {
            self.out.write_all(&[b'h', index as u8])
        } else {
            self.out.write_all(b"j")?;
            self.out.write_all(&index.to_le_bytes())
        }
    }

    /// Writes text (`BINUNICODE`).
    pub fn text(&mut self, s: &str) -> io::Result<()> {
        let len = u32::try_from(s.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "text over 4 GiB"))?;
        self.out.write_all(b"X")?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(s.as_bytes())
    }

    /// Writes an integer in the fewest bytes: `BININT1`, `BININT2`, `BININT`, else `LONG1`.
    pub fn int(&mut self, v: i128) -> io::Result<()> {
        if let Ok(byte) = u8::try_from(v) {
            return self.out.write_all(&[b'K', byte]);
        }
        if let Ok(short) = u16::try_from(v) {
            self.out.write_all(b"M")?;
            return self.out.write_all(&short.to_le_bytes());
        }
        if let Ok(small) = i32::try_from(v) {
            self.out.write_all(b"J")?;
            return self.out.write_all(&small.to_le_bytes());
        }
        // Two's complement, little-endian, as few bytes as keep the sign.
        let bytes = v.to_le_bytes();
        let mut n = bytes.len();
        while n > 1 {
            let (top, next) = (bytes[n - 1], bytes[n - 2]);
            let redundant = (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0);
            if !redundant {
                break;
            }
            n -= 1;
        }
        self.out.write_all(&[0x8a, n as u8])?;
        self.out.write_all(&bytes[..n])
    }

    /// Writes a float (`BINFLOAT`).
    pub fn float(&mut self, v: f64) -> io::Result<()> {
        self.out.write_all(b"G")?;
        self.out.write_all(&v.to_be_bytes())
    }

    /// Writes `True` or `False`.
    pub fn bool(&mut self, v: bool) -> io::Result<()> {
        self.out.write_all(&[if v { 0x88 } else { 0x89 }])
    }

    /// Writes `None`.
    pub fn none(&mut self) -> io::Result<()> {
        self.out.write_all(b"N")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::{decode, Limits};

    #[test]
    fn values_read_back_through_the_vm() {
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_dict().unwrap();
        w.text("ints").unwrap();
        w.begin_list().unwrap();
        for v in [
            0i128,
            -1,
            255,
            256,
            65535,
            65536,
            1 << 31,
            -(1 << 31) - 1,
            u64::MAX as i128,
            i64::MIN as i128,
        ] {
            w.int(v).unwrap();
        }
        w.end_list().unwrap();
        w.text("shared").unwrap();
        w.begin_list().unwrap();
        w.text("frame").unwrap();
        let m = w.put().unwrap();
        for _ in 0..300 {
            w.put().unwrap();
        }
        w.get(m).unwrap();
        w.get(300).unwrap();
        w.end_list().unwrap();
        w.text("pair").unwrap();
        w.int(1).unwrap();
        w.float(2.5).unwrap();
        w.tuple2().unwrap();
        w.text("flags").unwrap();
        w.begin_list().unwrap();
        w.bool(true).unwrap();
        w.bool(false).unwrap();
        w.none().unwrap();
        w.end_list().unwrap();
        w.end_dict().unwrap();
        let bytes = w.finish().unwrap();
        let out = decode(&bytes[..], Limits::default()).unwrap();
        let text = out.heap.render(out.root, 6);
        assert!(
            text.contains("0, -1, 255, 256, 65535, 65536, 2147483648, -2147483649, 18446744073709551615, -9223372036854775808"),
            "{text}"
        );
        assert!(text.contains(r#""frame", "frame", "frame""#), "{text}");
        assert!(text.contains("(1, 2.5)"), "{text}");
        assert!(text.contains("True, False, None"), "{text}");
    }
}

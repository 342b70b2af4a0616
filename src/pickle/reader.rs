//! A buffered byte reader that hands out slices and knows its offset.
//!
//! The VM reads through this instead of holding the whole (decompressed) file in memory: a
//! 100 MB snapshot is decoded with a 1 MiB window. A length prefix is never trusted: a string
//! that claims 2^60 bytes is read in bounded chunks until the input runs out, so memory grows
//! only with bytes that really exist.
//!
//! Where the input is read on another thread ([`ReadAhead`]), the window is that thread's
//! piece itself: at each refill the few bytes left of the old window are put in the room kept
//! before the new piece's bytes, and the two buffers change hands, so the decoder never copies
//! what it reads.

use std::io::{self, Read};

use super::source::{Handed, ReadAhead, PIECE_ROOM};

const WINDOW: usize = 1 << 20;
const SCRATCH_STEP: usize = 1 << 20;

/// Why a read came up short.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The input ended `needed` bytes before the item did.
    Truncated { needed: u64 },
    /// The underlying reader (file, decompressor) failed.
    Io(io::Error),
}

/// Buffered reader with slice access and an absolute offset.
pub(crate) struct Reader<R> {
    inner: R,
    /// Pieces read on another thread, which take `inner`'s place when present.
    ahead: Option<ReadAhead>,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Offset of `buf[0]` in the stream, modulo 2^64: a piece's room for the old window's
    /// last bytes can put `buf[0]` before the stream's first byte.
    base: u64,
    eof: bool,
    /// A read error met while reading ahead ([`Reader::prefetch`]), returned by the next read
    /// that needs more bytes.
    deferred_error: Option<io::Error>,
    scratch: Vec<u8>,
}

impl<R: Read> Reader<R> {
    pub(crate) fn new(inner: R) -> Self {
        Reader {
            inner,
            ahead: None,
            buf: vec![0; WINDOW],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
            deferred_error: None,
            scratch: Vec::new(),
        }
    }

    /// A reader whose first byte is byte `offset` of the stream (`inner` is positioned there).
    pub(crate) fn starting_at(inner: R, offset: u64) -> Self {
        Reader {
            base: offset,
            ..Reader::new(inner)
        }
    }

    /// The most bytes the window is made to hold at once.
    fn room(&self) -> usize {
        match self.ahead {
            Some(_) => WINDOW,
            None => self.buf.len(),
        }
    }

    /// Offset of the next unread byte from the start of the stream.
    #[inline]
    pub(crate) fn offset(&self) -> u64 {
        self.base.wrapping_add(self.pos as u64)
    }

    fn refill(&mut self) -> Result<(), ReadError> {
        if let Some(e) = self.deferred_error.take() {
            return Err(ReadError::Io(e));
        }
        if self.ahead.is_some() {
            return self.take_piece();
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        while !self.eof && self.end < self.buf.len() {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        Ok(())
    }

    /// Makes the next piece read ahead the window, with the old window's unread bytes before
    /// it; at the end of the input, marks the end.
    fn take_piece(&mut self) -> Result<(), ReadError> {
        let Some(ahead) = self.ahead.as_mut() else {
            return Ok(());
        };
        if self.eof {
            return Ok(());
        }
        let (mut piece, n) = match ahead.next_piece() {
            Handed::Piece(piece, n) => (piece, n),
            Handed::End => {
                self.eof = true;
                return Ok(());
            }
            Handed::Failed(e) => return Err(ReadError::Io(e)),
        };
        let offset = self.base.wrapping_add(self.pos as u64);
        let left = self.end - self.pos;
        let old = if left <= PIECE_ROOM {
            let start = PIECE_ROOM - left;
            piece[start..PIECE_ROOM].copy_from_slice(&self.buf[self.pos..self.end]);
            (self.pos, self.end) = (start, PIECE_ROOM + n);
            std::mem::replace(&mut self.buf, piece)
        } else {
            // an item longer than the room spans pieces: its bytes so far and the new piece
            // in one buffer, as large as the item (`take_slow` bounds it)
            let mut joined = Vec::with_capacity(left + n);
            joined.extend_from_slice(&self.buf[self.pos..self.end]);
            joined.extend_from_slice(&piece[PIECE_ROOM..PIECE_ROOM + n]);
            ahead.give_back(std::mem::take(&mut piece));
            (self.pos, self.end) = (0, joined.len());
            std::mem::replace(&mut self.buf, joined)
        };
        ahead.give_back(old);
        self.base = offset.wrapping_sub(self.pos as u64);
        Ok(())
    }

    /// Reads until the window holds `n` bytes; `false` when the input ends first.
    pub(crate) fn fill(&mut self, n: usize) -> Result<bool, ReadError> {
        while self.end - self.pos < n {
            let before = self.end - self.pos;
            self.refill()?;
            if self.end - self.pos == before && (self.eof || self.end == self.buf.len()) {
                return Ok(self.end - self.pos >= n);
            }
        }
        Ok(true)
    }

    /// Reads ahead until the window holds `n` bytes (at most the window's size) or the input
    /// ends. A read error is not reported here but kept for the next read that needs bytes, so
    /// it surfaces at the same place in the stream as without the read-ahead.
    pub(crate) fn prefetch(&mut self, n: usize) {
        let n = n.min(self.room());
        while self.end - self.pos < n && !self.eof && self.deferred_error.is_none() {
            let before = self.end - self.pos;
            match self.refill() {
                Ok(()) if self.end - self.pos == before && !self.eof => return,
                Ok(()) => {}
                Err(ReadError::Io(e)) => self.deferred_error = Some(e),
                Err(ReadError::Truncated { .. }) => return,
            }
        }
    }

    /// The next bytes, up to `n` (fewer at the end of the input), without consuming them.
    pub(crate) fn head(&mut self, n: usize) -> &[u8] {
        self.prefetch(n);
        &self.buf[self.pos..self.end.min(self.pos + n)]
    }

    /// Consumes `n` bytes, however many windows they span.
    pub(crate) fn skip(&mut self, mut n: u64) -> Result<(), ReadError> {
        while n > 0 {
            if self.pos == self.end {
                self.refill()?;
                if self.pos == self.end {
                    return Err(ReadError::Truncated { needed: n });
                }
            }
            let k = (self.end - self.pos).min(usize::try_from(n).unwrap_or(usize::MAX));
            self.pos += k;
            n -= k as u64;
        }
        Ok(())
    }

    /// The buffered bytes not yet consumed (may be shorter than what the input still holds).
    #[inline(always)]
    pub(crate) fn window(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    /// Consumes `n` bytes of [`Reader::window`].
    #[inline(always)]
    pub(crate) fn advance(&mut self, n: usize) {
        debug_assert!(self.pos + n <= self.end);
        self.pos += n;
    }

    /// The next byte without consuming it, or `None` at the end of the input.
    pub(crate) fn peek(&mut self) -> Result<Option<u8>, ReadError> {
        if self.pos == self.end {
            self.refill()?;
        }
        Ok(self
            .buf
            .get(self.pos)
            .copied()
            .filter(|_| self.pos < self.end))
    }

    /// The next byte, or `None` at the end of the input.
    #[inline]
    pub(crate) fn byte(&mut self) -> Result<Option<u8>, ReadError> {
        if self.pos == self.end {
            self.refill()?;
            if self.pos == self.end {
                return Ok(None);
            }
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }

    /// Exactly `n` bytes, or [`ReadError::Truncated`].
    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Result<&[u8], ReadError> {
        if self.end - self.pos >= n {
            let s = self.pos;
            self.pos += n;
            return Ok(&self.buf[s..s + n]);
        }
        self.take_slow(n)
    }

    fn take_slow(&mut self, n: usize) -> Result<&[u8], ReadError> {
        if n <= self.room() {
            while self.end - self.pos < n {
                let before = self.end - self.pos;
                self.refill()?;
                if self.end - self.pos == before && self.eof {
                    return Err(ReadError::Truncated {
                        needed: (n - before) as u64,
                    });
                }
            }
            let s = self.pos;
            self.pos += n;
            return Ok(&self.buf[s..s + n]);
        }
        // Longer than the window: gather in bounded steps so a lying prefix costs nothing.
        self.scratch.clear();
        while self.scratch.len() < n {
            if self.pos == self.end {
                self.refill()?;
                if self.pos == self.end {
                    return Err(ReadError::Truncated {
                        needed: (n - self.scratch.len()) as u64,
                    });
                }
            }
            let want = (n - self.scratch.len()).min(self.end - self.pos);
            self.scratch.reserve(want.min(SCRATCH_STEP));
            self.scratch
                .extend_from_slice(&self.buf[self.pos..self.pos + want]);
            self.pos += want;
        }
        Ok(&self.scratch)
    }

    /// Bytes up to (not including) the next `\n`, which is consumed; at most `limit` bytes.
    pub(crate) fn line(&mut self, limit: usize) -> Result<Option<&[u8]>, ReadError> {
        self.scratch.clear();
        loop {
            if self.pos == self.end {
                self.refill()?;
                if self.pos == self.end {
                    return Err(ReadError::Truncated { needed: 1 });
                }
            }
            let window = &self.buf[self.pos..self.end];
            match window.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    if self.scratch.len() + i > limit {
                        return Ok(None);
                    }
                    self.scratch.extend_from_slice(&window[..i]);
                    self.pos += i + 1;
                    return Ok(Some(&self.scratch));
                }
                None => {
                    if self.scratch.len() + window.len() > limit {
                        return Ok(None);
                    }
                    self.scratch.extend_from_slice(window);
                    self.pos = self.end;
                }
            }
        }
    }
}

impl Reader<Box<dyn Read + Send>> {
    /// A reader of the pieces `ahead` reads on its thread.
    pub(crate) fn ahead(ahead: ReadAhead) -> Self {
        Reader {
            ahead: Some(ahead),
            buf: Vec::new(),
            ..Reader::new(Box::new(io::empty()) as Box<dyn Read + Send>)
        }
    }
}

impl<R: Read + io::Seek> Reader<R> {
    /// Goes on reading at byte `offset` of the stream, wherever that is.
    pub(crate) fn jump(&mut self, offset: u64) -> Result<(), ReadError> {
        if self.ahead.is_some() {
            return Err(ReadError::Io(io::Error::new(
                io::ErrorKind::Unsupported,
                "a stream read ahead goes on only where it is",
            )));
        }
        self.inner
            .seek(io::SeekFrom::Start(offset))
            .map_err(ReadError::Io)?;
        self.base = offset;
        self.pos = 0;
        self.end = 0;
        self.eof = false;
        self.deferred_error = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_across_window_boundaries() {
        let data: Vec<u8> = (0..3 * WINDOW + 17).map(|i| (i % 251) as u8).collect();
        let mut r = Reader::new(&data[..]);
        let mut off = 0usize;
        for n in [1usize, WINDOW - 3, 10, WINDOW + 5, 2] {
            let got = r.take(n).unwrap().to_vec();
            assert_eq!(got, data[off..off + n]);
            off += n;
            assert_eq!(r.offset(), off as u64);
        }
    }

    /// What one reader gives for a run of reads: each result, with the offset after it.
    fn script<R: Read>(r: &mut Reader<R>, steps: &[(u8, usize)]) -> Vec<String> {
        let mut out = Vec::new();
        for &(what, n) in steps {
            let got = match what {
                0 => format!(
                    "{:?}",
                    r.take(n)
                        .map(|b| (b.len(), b.first().copied(), b.last().copied()))
                ),
                1 => format!("{:?}", r.skip(n as u64)),
                2 => format!("{:?} {:?}", r.byte(), r.peek()),
                3 => {
                    let h = r.head(n).to_vec();
                    let k = (n / 2).min(h.len());
                    r.advance(k);
                    format!("head {} {:?}", h.len(), h.get(k))
                }
                _ => format!(
                    "{:?}",
                    r.fill(n).map(|ok| (ok, r.window().first().copied()))
                ),
            };
            out.push(format!("{got} @{}", r.offset()));
        }
        out
    }

    #[test]
    fn pieces_read_ahead_are_read_as_the_input_itself() {
        use crate::pickle::source::{ReadAhead, Trickle};
        let data: Vec<u8> = (0..5 * WINDOW + 4_321)
            .map(|i| (i * 7 % 253) as u8)
            .collect();
        // short reads, items across pieces, one longer than the room kept before a piece,
        // one longer than the window, and reads past the end
        let steps: Vec<(u8, usize)> = [
            (0, 3),
            (3, 1 << 16),
            (0, WINDOW - 100),
            (2, 0),
            (0, 70_000),
            (4, 200_000),
            (3, 9),
            (1, WINDOW + 12_345),
            (0, WINDOW + 99),
            (4, 5),
            (0, 1),
            (1, 2 * WINDOW),
            (2, 0),
            (0, 10_000),
            (4, 50),
            (2, 0),
        ]
        .into_iter()
        .cycle()
        .take(40)
        .collect();
        for fails in [false, true] {
            let mut direct = Reader::new(Trickle {
                data: data.clone(),
                at: 0,
                step: 300_001,
                fails,
            });
            let want = script(&mut direct, &steps);
            let ahead = ReadAhead::spawn(Trickle {
                data: data.clone(),
                at: 0,
                step: 300_001,
                fails,
            });
            let Ok(ahead) = ahead else {
                panic!("no thread to read ahead on")
            };
            let mut r = Reader::ahead(ahead);
            assert_eq!(script(&mut r, &steps), want, "failing input: {fails}");
            assert!(want
                .iter()
                .any(|w| w.contains("Truncated") || w.contains("corrupt stream")));
        }
    }

    #[test]
    fn lying_length_is_truncation_not_allocation() {
        let data = [1u8, 2, 3];
        let mut r = Reader::new(&data[..]);
        match r.take(1 << 40) {
            Err(ReadError::Truncated { needed }) => assert_eq!(needed, (1u64 << 40) - 3),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn lines_respect_their_limit() {
        let data = b"12345\nabc";
        let mut r = Reader::new(&data[..]);
        assert_eq!(r.line(10).unwrap(), Some(&b"12345"[..]));
        assert!(matches!(r.line(10), Err(ReadError::Truncated { .. })));
        let mut r = Reader::new(&data[..]);
        assert_eq!(r.line(3).unwrap(), None);
    }
}

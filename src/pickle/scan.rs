//! Walking a pickle's opcodes without building anything: where each one starts and how many
//! memo entries they store.
//!
//! A split decode (`snapshot::split`) needs, for each part, the memo index of its first
//! `MEMOIZE` and a place to begin; this finds both at a fraction of a full decode's cost. It
//! knows the binary opcodes that protocols 2 to 5 write; anything else (text opcodes,
//! explicitly numbered memo puts, code) makes it give up, and the pickle is then decoded in
//! one piece.

use std::io::Read;

use super::opcodes as op;
use super::reader::Reader;

/// What [`walk`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Offset where the walk ended (an opcode start).
    pub offset: u64,
    /// `MEMOIZE` opcodes passed on the way.
    pub memoized: u64,
}

/// Where a walk ends.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    /// At the first opcode starting at or after this offset.
    Offset(u64),
    /// At the next `EMPTY_DICT`, looking no further than this offset.
    EmptyDict(u64),
}

/// Opcode lengths: 1 to 9 for a fixed length, or one of these.
const STOP_HERE: u8 = 0;
const PREFIX1: u8 = 0x10;
const PREFIX4: u8 = 0x40;
const PREFIX8: u8 = 0x80;

const fn table() -> [u8; 256] {
    let mut t = [STOP_HERE; 256];
    let ones = [
        op::MARK,
        op::STOP,
        op::POP,
        op::POP_MARK,
        op::DUP,
        op::NONE,
        op::NEWTRUE,
        op::NEWFALSE,
        op::EMPTY_DICT,
        op::EMPTY_LIST,
        op::EMPTY_TUPLE,
        op::EMPTY_SET,
        op::APPEND,
        op::APPENDS,
        op::ADDITEMS,
        op::SETITEM,
        op::SETITEMS,
        op::LIST,
        op::DICT,
        op::TUPLE,
        op::TUPLE1,
        op::TUPLE2,
        op::TUPLE3,
        op::FROZENSET,
        op::MEMOIZE,
    ];
    let mut i = 0;
    while i < ones.len() {
        t[ones[i] as usize] = 1;
        i += 1;
    }
    t[op::PROTO as usize] = 2;
    t[op::BININT1 as usize] = 2;
    t[op::BINGET as usize] = 2;
    t[op::BININT2 as usize] = 3;
    t[op::BININT as usize] = 5;
    t[op::LONG_BINGET as usize] = 5;
    t[op::BINFLOAT as usize] = 9;
    t[op::FRAME as usize] = 9;
    t[op::LONG1 as usize] = PREFIX1;
    t[op::SHORT_BINUNICODE as usize] = PREFIX1;
    t[op::SHORT_BINSTRING as usize] = PREFIX1;
    t[op::SHORT_BINBYTES as usize] = PREFIX1;
    t[op::LONG4 as usize] = PREFIX4;
    t[op::BINUNICODE as usize] = PREFIX4;
    t[op::BINSTRING as usize] = PREFIX4;
    t[op::BINBYTES as usize] = PREFIX4;
    t[op::BINUNICODE8 as usize] = PREFIX8;
    t[op::BINBYTES8 as usize] = PREFIX8;
    t[op::BYTEARRAY8 as usize] = PREFIX8;
    t
}

static LENGTHS: [u8; 256] = table();

/// The length of the opcode at the start of `w` (which holds at least 9 bytes), or `None` for
/// one the walk does not pass.
#[inline(always)]
fn length(w: &[u8]) -> Option<u64> {
    match LENGTHS[w[0] as usize] {
        STOP_HERE => None,
        PREFIX1 => Some(2 + w[1] as u64),
        PREFIX4 => Some(5 + u32::from_le_bytes([w[1], w[2], w[3], w[4]]) as u64),
        PREFIX8 => {
            let n = u64::from_le_bytes([w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]]);
            n.checked_add(9)
        }
        fixed => Some(fixed as u64),
    }
}

/// Walks the opcodes of `input`, which is positioned at byte `from` of the pickle (an opcode
/// start), until `until`. `None` when the walk meets an opcode it does not pass, or the end of
/// the input first.
pub fn walk<R: Read>(input: R, from: u64, until: Until) -> Option<Walk> {
    let mut r = Reader::starting_at(input, from);
    let mut memoized = 0u64;
    let (limit, find_dict) = match until {
        Until::Offset(o) => (o, false),
        Until::EmptyDict(o) => (o, true),
    };
    loop {
        let offset = r.offset();
        if offset >= limit {
            return (!find_dict).then_some(Walk { offset, memoized });
        }
        if r.window().len() < 9 && !r.fill(9).ok()? {
            // the last few bytes: read one opcode at a time, zero-padded
            let mut head = [0u8; 9];
            let w = r.window();
            if w.is_empty() {
                return None;
            }
            head[..w.len()].copy_from_slice(w);
            if find_dict && head[0] == op::EMPTY_DICT {
                return Some(Walk { offset, memoized });
            }
            pass_one(&mut r, &head, &mut memoized)?;
            continue;
        }
        // a tight loop over the buffered window
        let w = r.window();
        let mut pos = 0usize;
        let room = w.len() - 8;
        let stop = (limit - offset).min(room as u64) as usize;
        while pos < stop {
            let code = w[pos];
            if find_dict && code == op::EMPTY_DICT {
                r.advance(pos);
                return Some(Walk {
                    offset: r.offset(),
                    memoized,
                });
            }
            // A run of memo fetches (a trace entry's frames) by a loop of its own, whose next
            // position does not wait on the byte it reads: the walk then goes at the speed of
            // predicted branches, not at the latency of two dependent loads per opcode.
            if code == op::LONG_BINGET {
                pos += 5;
                while pos < stop && w[pos] == op::LONG_BINGET {
                    pos += 5;
                }
                continue;
            }
            let n = length(&w[pos..])?;
            memoized += (code == op::MEMOIZE) as u64;
            if n > (w.len() - pos) as u64 {
                break;
            }
            pos += n as usize;
        }
        r.advance(pos);
        if pos < stop {
            // an opcode longer than the window (a large string): skip it through the input
            let head: [u8; 9] = r.window()[..9].try_into().expect("9 bytes left");
            pass_one(&mut r, &head, &mut memoized)?;
        }
    }
}

/// Passes the opcode that `head` (its first 9 bytes, zero-padded) begins, counting it if it
/// is a `MEMOIZE`.
fn pass_one<R: Read>(r: &mut Reader<R>, head: &[u8; 9], memoized: &mut u64) -> Option<()> {
    let n = length(head)?;
    *memoized += (head[0] == op::MEMOIZE) as u64;
    r.skip(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{'a': [1, 'b', 'b']}` as protocol 4 writes it, memo and frame included.
    fn sample() -> Vec<u8> {
        let mut v = vec![op::PROTO, 4, op::FRAME];
        v.extend_from_slice(&[0; 8]);
        v.extend_from_slice(&[op::EMPTY_DICT, op::MEMOIZE, op::SHORT_BINUNICODE, 1, b'a']);
        v.extend_from_slice(&[op::MEMOIZE, op::EMPTY_LIST, op::MEMOIZE, op::MARK]);
        v.extend_from_slice(&[op::BININT1, 1, op::SHORT_BINUNICODE, 1, b'b', op::MEMOIZE]);
        v.extend_from_slice(&[op::BINGET, 2, op::APPENDS, op::SETITEM, op::STOP]);
        v
    }

    #[test]
    fn counts_memo_entries_to_an_offset() {
        let data = sample();
        let end = data.len() as u64;
        let w = walk(&data[..], 0, Until::Offset(end)).unwrap();
        assert_eq!(
            w,
            Walk {
                offset: end,
                memoized: 4
            }
        );
        // from the list on
        let w = walk(&data[17..], 17, Until::Offset(end)).unwrap();
        assert_eq!(w.memoized, 2);
        // the real pickle agrees
        let decoded = crate::pickle::decode(&data[..], Default::default()).unwrap();
        assert_eq!(decoded.bytes_read, end);
    }

    #[test]
    fn runs_of_long_fetches_count_as_opcode_by_opcode() {
        // entries with runs of LONG_BINGET of every length from 0 to 40, over more than two
        // windows, with where each opcode starts and the memo entries before it
        let mut data = vec![op::PROTO, 4, op::EMPTY_LIST, op::MEMOIZE, op::MARK];
        let mut starts = vec![(0usize, 0u64), (2, 0), (3, 0), (4, 1)];
        let mut memoized = 1u64;
        let mut push = |data: &mut Vec<u8>, bytes: &[u8]| {
            starts.push((data.len(), memoized));
            memoized += (bytes[0] == op::MEMOIZE) as u64;
            data.extend_from_slice(bytes);
        };
        let mut k = 0u32;
        while data.len() < (5 << 20) / 2 {
            push(&mut data, &[op::EMPTY_DICT]);
            push(&mut data, &[op::MEMOIZE]);
            push(&mut data, &[op::MARK]);
            push(&mut data, &[op::BINGET, 1]);
            push(&mut data, &[op::BININT1, 7]);
            push(&mut data, &[op::BINGET, 2]);
            push(&mut data, &[op::EMPTY_LIST]);
            push(&mut data, &[op::MEMOIZE]);
            push(&mut data, &[op::MARK]);
            for f in 0..k % 41 {
                // indices whose bytes are themselves opcodes (MEMOIZE, LONG_BINGET)
                let i = 0x94_6a_00_00u32 | f;
                let b = i.to_le_bytes();
                push(&mut data, &[op::LONG_BINGET, b[0], b[1], b[2], b[3]]);
            }
            push(&mut data, &[op::APPENDS]);
            push(&mut data, &[op::SETITEMS]);
            k += 1;
        }
        push(&mut data, &[op::APPENDS]);
        push(&mut data, &[op::STOP]);
        for &(at, before) in starts.iter().step_by(997).chain(starts.last()) {
            let w = walk(&data[..], 0, Until::Offset(at as u64)).unwrap();
            assert_eq!((w.offset, w.memoized), (at as u64, before), "at {at}");
        }
        // the next dict after any opcode start
        let (at, _) = starts[starts.len() / 2];
        let next = starts
            .iter()
            .map(|&(s, _)| s)
            .find(|&s| s >= at && data[s] == op::EMPTY_DICT)
            .unwrap();
        let w = walk(&data[at..], at as u64, Until::EmptyDict(data.len() as u64)).unwrap();
        assert_eq!(w.offset, next as u64);
    }

    #[test]
    fn finds_the_next_empty_dict() {
        let data = sample();
        let w = walk(&data[..], 0, Until::EmptyDict(100)).unwrap();
        assert_eq!(
            w,
            Walk {
                offset: 11,
                memoized: 0
            }
        );
        assert_eq!(walk(&data[12..], 12, Until::EmptyDict(100)), None);
    }

    #[test]
    fn gives_up_on_what_it_does_not_pass() {
        // explicit memo numbering and text opcodes
        for bad in [&[op::NONE, op::BINPUT, 0, op::STOP][..], b"I1\n."] {
            assert_eq!(walk(bad, 0, Until::Offset(bad.len() as u64)), None);
        }
        // a length prefix that runs past the end
        let cut = [op::BINUNICODE, 0xff, 0xff, 0xff, 0x0f, b'a'];
        assert_eq!(walk(&cut[..], 0, Until::Offset(6)), None);
    }

    #[test]
    fn passes_payloads_longer_than_the_window() {
        let mut data = vec![op::PROTO, 4, op::BINUNICODE];
        let big = 3 << 20;
        data.extend_from_slice(&(big as u32).to_le_bytes());
        data.extend(std::iter::repeat_n(b'x', big));
        data.extend_from_slice(&[op::MEMOIZE, op::STOP]);
        let end = data.len() as u64;
        let w = walk(&data[..], 0, Until::Offset(end)).unwrap();
        assert_eq!(
            w,
            Walk {
                offset: end,
                memoized: 1
            }
        );
    }
}

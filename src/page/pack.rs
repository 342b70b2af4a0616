//! Integer columns packed for the page: each value as the zigzag varint of its difference from
//! the one before, the bytes in base64.
//!
//! Memory series change by small steps between neighbouring columns, so a difference takes two
//! to four bytes where its decimal text in JSON would take ten or more. The page unpacks a
//! column once when it loads (`unpack` in `page.js`); values are exact up to 2^53, the most a
//! JavaScript number holds exactly, which is far above any byte count or time here.

use base64::Engine;
use serde::{Serialize, Serializer};

/// A packed column of integers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packed(pub String);

impl Serialize for Packed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Packs `values` (differences from the previous value, zigzag, varint, base64).
pub fn pack<I: IntoIterator<Item = i64>>(values: I) -> Packed {
    let mut bytes = Vec::new();
    let mut last = 0i64;
    for v in values {
        let d = v.wrapping_sub(last);
        last = v;
        let mut z = ((d << 1) ^ (d >> 63)) as u64;
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                bytes.push(b);
                break;
            }
            bytes.push(b | 0x80);
        }
    }
    Packed(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Unpacks what [`pack`] made (the page's decoder, written again for the tests).
pub fn unpack(p: &Packed) -> Option<Vec<i64>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&p.0)
        .ok()?;
    let mut out = Vec::new();
    let (mut z, mut shift, mut last) = (0u64, 0u32, 0i64);
    for b in bytes {
        if shift >= 64 {
            return None;
        }
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 != 0 {
            shift += 7;
            continue;
        }
        let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
        last = last.wrapping_add(d);
        out.push(last);
        (z, shift) = (0, 0);
    }
    (shift == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_large_and_negative_values() {
        let values = vec![0, 1, -1, 5 << 40, (5 << 40) - 512, 3, -(1 << 50), 1 << 52];
        assert_eq!(unpack(&pack(values.clone())), Some(values));
        assert_eq!(pack([]).0, "");
        assert_eq!(unpack(&pack([])), Some(vec![]));
    }

    #[test]
    fn small_steps_take_few_characters() {
        // 1,000 values rising by 512 bytes from 80 GiB: about two bytes each after the first
        let values: Vec<i64> = (0..1000).map(|k| (80i64 << 30) + 512 * k).collect();
        let p = pack(values.clone());
        assert!(p.0.len() < 2 * 1000 * 4 / 3 + 16, "{}", p.0.len());
        assert_eq!(unpack(&p), Some(values));
    }
}

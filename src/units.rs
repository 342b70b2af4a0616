//! Numbers to text: bytes as GiB/MiB, microseconds as seconds, counts with separators.
//! The only place where figures become strings. Names and messages are made safe to print by
//! [`crate::escape`] ([`printable`] and [`one_line`] are its own, for the stages that format
//! messages here).

/// The device number memsnap gives pinned host memory (`host_segments` and `host_traces`,
/// torch after 2.11), one past the highest CUDA device (127): it is reported and drawn as its
/// own device, "host (pinned)", never added to a GPU's figures. Defined here, at the ground,
/// so that the errors that name devices need no stage above it.
pub const HOST_DEVICE: u32 = 128;

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `10.12 GiB`, `512.00 MiB`, `3.00 KiB`, `17 B`: two decimals, binary units (GiB from
/// 1000 MiB on, so a figure never needs four digits before the point).
pub fn bytes(b: u64) -> String {
    let f = b as f64;
    if f >= 1000.0 * MIB {
        format!("{:.2} GiB", f / GIB)
    } else if f >= 1000.0 * KIB {
        format!("{:.2} MiB", f / MIB)
    } else if f >= KIB {
        format!("{:.2} KiB", f / KIB)
    } else {
        format!("{b} B")
    }
}

/// A size as PyTorch's out-of-memory message writes it (`format_size`): `N bytes` up to
/// 1 KiB, then KiB below 1 MiB, MiB below 1 GiB, GiB above; two decimals.
pub fn torch_size(b: u64) -> String {
    let f = b as f64;
    if b <= 1024 {
        format!("{b} bytes")
    } else if f < MIB {
        format!("{:.2} KiB", f / KIB)
    } else if f < GIB {
        format!("{:.2} MiB", f / MIB)
    } else {
        format!("{:.2} GiB", f / GIB)
    }
}

/// A signed difference: `+1.25 GiB`, `-3.00 MiB`, `0 B`.
pub fn bytes_delta(d: i128) -> String {
    let text = bytes(d.unsigned_abs().min(u64::MAX as u128) as u64);
    match d.signum() {
        1 => format!("+{text}"),
        -1 => format!("-{text}"),
        _ => text,
    }
}

/// GiB with two decimals and no unit (for axis labels and the pithtrain log format).
pub fn gib(b: u64) -> String {
    format!("{:.2}", b as f64 / GIB)
}

/// Microseconds as seconds: `3.41 s`, `120 ms` below one second.
pub fn duration_us(us: i64) -> String {
    if us.abs() < 1_000_000 {
        format!("{} ms", us / 1000)
    } else {
        format!("{:.2} s", us as f64 / 1e6)
    }
}

/// `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A count with its noun: `1 event`, `2,048 events` (the plural adds `s`).
pub fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{} {noun}s", count(n))
    }
}

/// A share of a whole: `42.1%`.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// A name or message safe to print on one terminal line: [`crate::escape::printable`], owned.
pub fn printable(s: &str) -> String {
    crate::escape::printable(s).into_owned()
}

/// A message on one line, its control characters escaped: [`crate::escape::one_line`].
pub fn one_line(s: &str) -> String {
    crate::escape::one_line(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(17), "17 B");
        assert_eq!(bytes(3 * 1024), "3.00 KiB");
        assert_eq!(bytes(512 << 20), "512.00 MiB");
        assert_eq!(bytes(1000 << 20), "0.98 GiB");
        assert_eq!(bytes(1000 << 10), "0.98 MiB");
        assert_eq!(bytes(10_868_601_856), "10.12 GiB");
        assert_eq!(bytes_delta(-(3 << 20)), "-3.00 MiB");
        assert_eq!(bytes_delta(1 << 30), "+1.00 GiB");
        assert_eq!(bytes_delta(0), "0 B");
        assert_eq!(gib(1_815_257_600), "1.69");
        assert_eq!(duration_us(3_410_000), "3.41 s");
        assert_eq!(duration_us(120_400), "120 ms");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(12), "12");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(counted(1, "event"), "1 event");
        assert_eq!(torch_size(1000 << 20), "1000.00 MiB");
        assert_eq!(torch_size(1024), "1024 bytes");
        assert_eq!(torch_size(3 << 30), "3.00 GiB");
        assert_eq!(counted(1200, "free"), "1,200 frees");
        assert_eq!(counted(0, "block"), "0 blocks");
        assert_eq!(percent(1, 0), "-");
    }
}

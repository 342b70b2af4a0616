//! The caching allocator's settings: parsed from a `PYTORCH_CUDA_ALLOC_CONF` string, or taken
//! from what a snapshot recorded (`allocator_settings`), or inferred from its trace.
//!
//! Parsing follows PyTorch's rules: comma-separated `key:value` pairs, a bracketed list for
//! `roundup_power2_divisions`, and each setting at its default unless the string sets it
//! (a fresh process reads the string once). Keys that only concern pinned host memory or
//! locking are accepted and change nothing here; an unknown key or a bad value is an error
//! naming it.

use std::fmt;

use crate::snapshot::{Action, AllocatorSettings, Snapshot};

const MIB: u64 = 1 << 20;

/// The settings that change how the device allocator hands out and caches memory.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocConf {
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in bytes; `None` = no limit.
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb`, in bytes: how much larger than an oversize request a
    /// cached oversize block may be and still serve it (20 MiB by default).
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions` per power-of-two interval from 1 MiB (index 0 also covers
    /// smaller sizes).
    pub roundup_power2_divisions: [u64; 16],
    /// `garbage_collection_threshold` (0 = off); acts only with a memory cap.
    pub garbage_collection_threshold: f64,
    /// `per_process_memory_fraction`, when the string sets one.
    pub memory_fraction: Option<f64>,
    /// The text it came from (`""` for the defaults, or when changed since).
    pub text: String,
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            expandable_segments: false,
            max_split_size: None,
            max_non_split_rounding: 20 * MIB,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold: 0.0,
            memory_fraction: None,
            text: String::new(),
        }
    }
}

/// Why a settings string was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfError {
    /// A key PyTorch's CUDA allocator does not know.
    #[error("unknown allocator setting {0:?} (known: expandable_segments, max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold, per_process_memory_fraction, ...)")]
    UnknownKey(String),
    /// A known key with a value it does not take.
    #[error("bad value {value:?} for {key}: {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// A pair without `:`.
    #[error("{0:?} is not a key:value pair")]
    NotAPair(String),
    /// A setting memsnap cannot simulate.
    #[error("{0}")]
    Unsupported(String),
}

impl AllocConf {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string, starting from the defaults.
    pub fn parse(text: &str) -> Result<AllocConf, ConfError> {
        let mut conf = AllocConf {
            text: text.trim().to_string(),
            ..AllocConf::default()
        };
        for pair in split_pairs(text) {
            let (key, value) = pair
                .split_once(':')
                .ok_or_else(|| ConfError::NotAPair(pair.to_string()))?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |expected| ConfError::BadValue {
                key: key.to_string(),
                value: value.to_string(),
                expected,
            };
            match key {
                "expandable_segments" => {
                    conf.expandable_segments = parse_bool(value).ok_or_else(|| bad("True or False"))?
                }
                "max_split_size_mb" => {
                    let mb: u64 = value.parse().map_err(|_| bad("a whole number of MiB above 20"))?;
                    if mb <= 20 {
                        return Err(bad("a whole number of MiB above 20"));
                    }
                    conf.max_split_size = Some(mb.saturating_mul(MIB));
                }
                "max_non_split_rounding_mb" => {
                    let mb: u64 = value.parse().map_err(|_| bad("a whole number of MiB"))?;
                    conf.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "roundup_power2_divisions" => {
                    conf.roundup_power2_divisions = parse_divisions(value).ok_or_else(|| {
                        bad("a power of two, or a list such as [64:8,256:4,>:1]")
                    })?
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| bad("a number between 0 and 1"))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad("a number between 0 and 1"));
                    }
                    conf.garbage_collection_threshold = t;
                }
                "per_process_memory_fraction" => {
                    let f: f64 = value.parse().map_err(|_| bad("a number from 0 to 1"))?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(bad("a number from 0 to 1"));
                    }
                    conf.memory_fraction = Some(f);
                }
                "backend" => match value {
                    "native" => {}
                    "cudaMallocAsync" => {
                        return Err(ConfError::Unsupported(
                            "backend:cudaMallocAsync is CUDA's own allocator; memsnap simulates the native caching allocator".into(),
                        ))
                    }
                    _ => return Err(bad("native or cudaMallocAsync")),
                },
                // Host (pinned) memory and locking: no effect on device memory.
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse" => {
                    parse_bool(value).ok_or_else(|| bad("True or False"))?;
                }
                "pinned_num_register_threads" | "pinned_reserve_segment_size_mb" => {
                    value.parse::<u64>().map_err(|_| bad("a whole number"))?;
                }
                other => return Err(ConfError::UnknownKey(other.to_string())),
            }
        }
        Ok(conf)
    }

    /// The settings a snapshot recorded (torch 2.3+); without them, the defaults, with
    /// expandable segments when the trace maps pages.
    pub fn recorded(snap: &Snapshot) -> AllocConf {
        match &snap.settings {
            Some(s) => AllocConf::from_settings(s),
            None => AllocConf {
                expandable_segments: snap.segments.iter().any(|s| s.is_expandable)
                    || snap
                        .traces
                        .iter()
                        .flatten()
                        .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap)),
                ..AllocConf::default()
            },
        }
    }

    /// From a snapshot's `allocator_settings`.
    pub fn from_settings(s: &AllocatorSettings) -> AllocConf {
        AllocConf {
            expandable_segments: s.expandable_segments,
            max_split_size: s.max_split_size,
            roundup_power2_divisions: s.roundup_power2_divisions,
            garbage_collection_threshold: s.garbage_collection_threshold,
            text: s.alloc_conf.clone(),
            ..AllocConf::default()
        }
    }

    /// Whether blocks are laid out the same way under both (splitting, rounding, segments):
    /// then the state recorded at trace start holds for both.
    pub fn same_layout(&self, other: &AllocConf) -> bool {
        self.expandable_segments == other.expandable_segments
            && self.max_split_size == other.max_split_size
            && self.roundup_power2_divisions == other.roundup_power2_divisions
            && self.max_non_split_rounding == other.max_non_split_rounding
    }

    /// The size rules of these settings (rounding and splitting).
    pub fn size_rules(&self) -> crate::replay::SizeRules {
        crate::replay::SizeRules {
            divisions: self.roundup_power2_divisions,
            max_split_size: self.max_split_size,
            expandable_segments: self.expandable_segments,
        }
    }
}

impl fmt::Display for AllocConf {
    /// The settings as a `PYTORCH_CUDA_ALLOC_CONF` string: the text they were parsed from,
    /// or one written from them (`defaults` when none is set).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.text.is_empty() {
            return write!(f, "{}", self.text);
        }
        let mut parts = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != 20 * MIB {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        if self.roundup_power2_divisions.iter().any(|&d| d > 0) {
            parts.push(format!(
                "roundup_power2_divisions:{}",
                divisions_text(&self.roundup_power2_divisions)
            ));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if let Some(fr) = self.memory_fraction {
            parts.push(format!("per_process_memory_fraction:{fr}"));
        }
        if parts.is_empty() {
            write!(f, "defaults")
        } else {
            write!(f, "{}", parts.join(","))
        }
    }
}

/// `[1:4,2:4,...]` compressed: one number when all intervals agree.
fn divisions_text(d: &[u64; 16]) -> String {
    if d.iter().all(|&x| x == d[0]) {
        return d[0].to_string();
    }
    let items: Vec<String> = d
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{}:{v}", 1u64 << i))
        .collect();
    format!("[{}]", items.join(","))
}

/// Splits on commas outside brackets.
fn split_pairs(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "True" | "true" | "1" => Some(true),
        "False" | "false" | "0" => Some(false),
        _ => None,
    }
}

/// A power of two (or 0) for every interval, or `[MiB:n,...,>:n]` where each key, a power
/// of two in MiB, sets its interval, the first key also every interval below it, and `>`
/// every interval after the last key.
fn parse_divisions(v: &str) -> Option<[u64; 16]> {
    let ok = |n: u64| n == 0 || n.is_power_of_two();
    if let Ok(n) = v.parse::<u64>() {
        return ok(n).then_some([n; 16]);
    }
    let body = v.strip_prefix('[')?.strip_suffix(']')?;
    let mut out = [0u64; 16];
    let mut last: Option<usize> = None;
    for item in body.split(',') {
        let (k, n) = item.split_once(':')?;
        let n: u64 = n.trim().parse().ok()?;
        if !ok(n) {
            return None;
        }
        if k.trim() == ">" {
            let from = last.map_or(0, |l| l + 1);
            for slot in out.iter_mut().skip(from) {
                *slot = n;
            }
            continue;
        }
        let mb: u64 = k.trim().parse().ok()?;
        if !mb.is_power_of_two() {
            return None;
        }
        let index = (mb.trailing_zeros() as usize).min(15);
        if last.is_none() {
            for slot in out.iter_mut().take(index) {
                *slot = n;
            }
        }
        out[index] = n;
        last = Some(index);
    }
    Some(out)
}

/// Parses a size such as `9.04GiB`, `512MiB`, `1.5 GB` or a plain number of bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => MIB as f64,
        "g" | "gib" => (1u64 << 30) as f64,
        "t" | "tib" => (1u64 << 40) as f64,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = value * scale;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then(|| bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_setting() {
        let c = AllocConf::parse(
            "expandable_segments:True,max_split_size_mb:256, garbage_collection_threshold:0.6,roundup_power2_divisions:[64:8,256:4,>:1]",
        )
        .unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, Some(256 << 20));
        assert_eq!(c.garbage_collection_threshold, 0.6);
        // 64 MiB is interval 6: it and everything below take 8; 256 MiB (8) takes 4; the rest 1
        assert_eq!(&c.roundup_power2_divisions[..6], &[8; 6]);
        assert_eq!(c.roundup_power2_divisions[6], 8);
        assert_eq!(c.roundup_power2_divisions[7], 0);
        assert_eq!(c.roundup_power2_divisions[8], 4);
        assert_eq!(&c.roundup_power2_divisions[9..], &[1; 7]);
        assert_eq!(
            AllocConf::parse("roundup_power2_divisions:4")
                .unwrap()
                .roundup_power2_divisions,
            [4; 16]
        );
        assert_eq!(AllocConf::parse("").unwrap(), AllocConf::default());
        assert_eq!(AllocConf::default().to_string(), "defaults");
        let c = AllocConf::parse("max_split_size_mb:64,expandable_segments:True").unwrap();
        assert_eq!(
            c.to_string(),
            "max_split_size_mb:64,expandable_segments:True"
        );
        let written = AllocConf {
            text: String::new(),
            ..c
        };
        assert_eq!(
            written.to_string(),
            "expandable_segments:True,max_split_size_mb:64"
        );
    }

    #[test]
    fn bad_settings_name_the_key() {
        let e = AllocConf::parse("expandable_segment:True").unwrap_err();
        assert!(e.to_string().contains("\"expandable_segment\""), "{e}");
        let e = AllocConf::parse("max_split_size_mb:10").unwrap_err();
        assert!(e.to_string().contains("max_split_size_mb"), "{e}");
        let e = AllocConf::parse("garbage_collection_threshold:1.5").unwrap_err();
        assert!(
            e.to_string().contains("garbage_collection_threshold"),
            "{e}"
        );
        let e = AllocConf::parse("roundup_power2_divisions:3").unwrap_err();
        assert!(e.to_string().contains("roundup_power2_divisions"), "{e}");
        assert!(AllocConf::parse("expandable_segments").is_err());
        assert!(AllocConf::parse("backend:cudaMallocAsync").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(
            parse_size("9.04GiB"),
            Some((9.04 * (1u64 << 30) as f64).round() as u64)
        );
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1000"), Some(1000));
        assert_eq!(parse_size("1.5 GB"), Some(1_500_000_000));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("-3G"), None);
    }
}

//! Probes: the device's memory at named points of a program, written by `memsnap.Capture`
//! beside a snapshot as `<snapshot>.probes.json`. No snapshot holds memory outside PyTorch's
//! allocator (the CUDA context, NCCL communicators, library handles); a probe notes the
//! device's used bytes (`torch.cuda.mem_get_info`) beside what PyTorch reserved, and the
//! difference is that memory.
//!
//! The side file is found from the snapshot's own path (never from anything inside a
//! snapshot), read through the bounded reader and parsed with serde_json. Side files of every
//! kind (`.probes.json`, `.tensors.json`) are told from snapshots here ([`is_side_file`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::output::{read_small, SmallFileError};

/// The largest probes file read.
pub const MAX_BYTES: u64 = 4 << 20;
/// The most probes kept from one file.
const MAX_PROBES: usize = 10_000;

/// One probe as the side file holds it, with what it implies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The name the program gave it (`after init_process_group`).
    pub name: String,
    /// Wall-clock time in microseconds, as the snapshot's trace times are.
    #[serde(default)]
    pub time_us: i64,
    /// Device ordinal.
    #[serde(default)]
    pub device: u32,
    /// The device's memory.
    pub device_total_bytes: u64,
    /// Used on the device by every process and library (`total - free`).
    pub device_used_bytes: u64,
    /// Reserved by PyTorch's caching allocator then.
    pub reserved_bytes: u64,
    /// Allocated by PyTorch then.
    #[serde(default)]
    pub allocated_bytes: u64,
    /// Used on the device but not reserved by PyTorch: the CUDA context, communicators,
    /// libraries (and other processes on the device).
    #[serde(default)]
    pub outside_bytes: u64,
}

#[derive(Deserialize)]
struct File {
    probes: Vec<Probe>,
}

/// Why a probes file was left out.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbesError {
    /// It could not be read (too large, not a regular file, an I/O error): in words.
    #[error("{0}")]
    Read(String),
    /// It is not the JSON `memsnap.Capture` writes.
    #[error("not probes JSON: {0}")]
    NotJson(String),
    /// More probes than are read.
    #[error("{0} probes, at most {MAX_PROBES} are read")]
    TooMany(usize),
}

/// The endings of the side files `memsnap.Capture` writes beside a snapshot.
pub const SIDE_FILE_ENDINGS: [&str; 2] = [".probes.json", ".tensors.json"];

/// Whether `path` names a side file written beside a snapshot (`*.probes.json`,
/// `*.tensors.json`), which folder listings of snapshots leave out.
pub fn is_side_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| {
        let name = n.to_string_lossy().to_ascii_lowercase();
        SIDE_FILE_ENDINGS.iter().any(|end| name.ends_with(end))
    })
}

/// Where the probes of `snapshot` would be: `<snapshot>.probes.json`, or beside the
/// uncompressed name of a `.gz`, `.xz` or `.zst` file.
pub fn sidecars(snapshot: &Path) -> Vec<PathBuf> {
    let mut out = vec![with_suffix(snapshot)];
    if let Some(ext) = snapshot.extension().and_then(|e| e.to_str()) {
        if matches!(ext, "gz" | "xz" | "zst") {
            out.push(with_suffix(&snapshot.with_extension("")));
        }
    }
    out
}

fn with_suffix(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".probes.json");
    PathBuf::from(s)
}

/// The probes beside `snapshot`: `Ok(None)` when there is no side file; an error when there
/// is one that cannot be read.
pub fn read(snapshot: &Path) -> Result<Option<(PathBuf, Vec<Probe>)>, ProbesError> {
    let Some(path) = sidecars(snapshot).into_iter().find(|p| p.is_file()) else {
        return Ok(None);
    };
    let bytes = read_small(&path, MAX_BYTES)
        .map_err(|e: SmallFileError| ProbesError::Read(e.to_string()))?;
    Ok(Some((path, parse(&bytes)?)))
}

/// The probes of a side file's bytes, with what they imply.
pub fn parse(bytes: &[u8]) -> Result<Vec<Probe>, ProbesError> {
    let file: File =
        serde_json::from_slice(bytes).map_err(|e| ProbesError::NotJson(e.to_string()))?;
    if file.probes.len() > MAX_PROBES {
        return Err(ProbesError::TooMany(file.probes.len()));
    }
    Ok(file
        .probes
        .into_iter()
        .map(|mut p| {
            p.outside_bytes = p.device_used_bytes.saturating_sub(p.reserved_bytes);
            p
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_files_are_found_beside_the_snapshot_and_read() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("memory_snapshot_rank0_step0.pickle.xz");
        assert_eq!(read(&snap), Ok(None));
        let side = dir
            .path()
            .join("memory_snapshot_rank0_step0.pickle.probes.json");
        std::fs::write(
            &side,
            r#"{"probes": [{"name": "after init", "time_us": 5, "device": 0,
                "device_total_bytes": 100, "device_used_bytes": 60, "reserved_bytes": 20,
                "allocated_bytes": 10, "extra": 1}]}"#,
        )
        .unwrap();
        let (found, probes) = read(&snap).unwrap().unwrap();
        assert_eq!(found, side);
        assert_eq!(probes[0].outside_bytes, 40);
        assert_eq!(probes[0].name, "after init");
        std::fs::write(&side, b"{not json").unwrap();
        assert!(matches!(read(&snap), Err(ProbesError::NotJson(_))));
        assert!(is_side_file(Path::new("x/s.pickle.tensors.json")));
        assert!(is_side_file(&side));
        assert!(!is_side_file(&snap));
    }
}

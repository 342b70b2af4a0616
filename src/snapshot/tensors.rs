//! The program's own account of its tensors: `<snapshot>.tensors.json`, written by
//! `memsnap.Capture` beside a snapshot when it was given the model and optimizer.
//!
//! The capture sees the program: at recording start, at the end of every recorded step and at an
//! out-of-memory error it lists the CUDA storage of every parameter, buffer, gradient and
//! optimizer-state tensor (address, bytes, kind, the parameter's name, the state's key), with
//! the program's own step numbers and their wall-clock times (the clock of the trace's
//! `time_us`) and the cap the allocator enforced. These are facts, not inference: attribution
//! takes them as its strongest evidence ([`crate::attribute`]).
//!
//! Like the probes, the side file is found from the snapshot's own path (never from anything
//! inside a snapshot), read through the bounded reader, parsed with serde_json, and its names
//! interned: a name repeated in every inventory is held once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::output::{read_small, SmallFileError};

/// The largest side file read.
pub const MAX_BYTES: u64 = 64 << 20;
/// The most tensors read from one file, over all its inventories.
const MAX_TENSORS: usize = 2_000_000;
/// The format this reader knows.
pub const FORMAT: &str = "memsnap-tensors/1";

/// What a listed storage is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// A parameter of a model.
    Parameter,
    /// A buffer of a model (running statistics, a rotary table).
    Buffer,
    /// The `.grad` of a parameter.
    Gradient,
    /// A tensor of an optimizer's state (`exp_avg`, `momentum_buffer`).
    OptimizerState,
}

/// When an inventory was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InventoryAt {
    /// Right after recording started: the blocks alive before the trace.
    Start,
    /// At the end of a recorded step.
    StepEnd,
    /// In the allocator's out-of-memory observer.
    Oom,
}

/// One storage of an inventory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Its address (the block's).
    pub addr: u64,
    /// Its bytes (the block's requested size).
    pub bytes: u64,
    /// What it is.
    pub kind: TensorKind,
    /// The parameter's or buffer's name, an index into [`CaptureTensors::names`].
    pub name: u32,
    /// The optimizer state's key (`exp_avg`), an index into the names (0: none).
    pub state: u32,
}

/// The storages alive at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inventory {
    /// When it was taken.
    pub at: InventoryAt,
    /// The program's step then.
    pub step: i64,
    /// Wall-clock microseconds, the trace's clock.
    pub time_us: i64,
    /// The storages, one entry each.
    pub tensors: Vec<Tensor>,
}

/// One of the program's steps, as it numbered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct ProgramStep {
    /// The program's number for it.
    pub step: i64,
    /// When it started, wall-clock microseconds.
    pub start_us: i64,
    /// `None` for a step an out-of-memory error left open.
    pub end_us: Option<i64>,
}

/// A side file, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureTensors {
    /// Where it was read from.
    pub path: PathBuf,
    /// The rank that wrote it.
    pub rank: Option<u32>,
    /// The device its storages are on.
    pub device: u32,
    /// The device's memory.
    pub device_total_bytes: Option<u64>,
    /// The per-process cap the allocator enforced (`set_per_process_memory_fraction`), `None`
    /// when no fraction was set.
    pub allowed_bytes: Option<u64>,
    /// The recorded steps, as the program numbered them.
    pub steps: Vec<ProgramStep>,
    /// The lists of storages.
    pub inventories: Vec<Inventory>,
    /// Interned texts: names and state keys; 0 is the empty text.
    pub names: Vec<String>,
}

impl CaptureTensors {
    /// The text of a name index.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }
}

/// Why a side file was left out.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TensorsError {
    /// It could not be read (too large, not a regular file, an I/O error): in words.
    #[error("{0}")]
    Read(String),
    /// It is not the JSON `memsnap.Capture` writes.
    #[error("not a tensors file: {0}")]
    NotJson(String),
    /// A format this reader does not know.
    #[error("format {0:?}, not {FORMAT}")]
    Format(String),
    /// More tensors than are read.
    #[error("{0} tensors, at most {MAX_TENSORS} are read")]
    TooMany(usize),
}

#[derive(Deserialize)]
struct RawTensor {
    addr: u64,
    bytes: u64,
    kind: TensorKind,
    #[serde(default)]
    name: String,
    #[serde(default)]
    state: Option<String>,
}

#[derive(Deserialize)]
struct RawInventory {
    at: InventoryAt,
    step: i64,
    time_us: i64,
    tensors: Vec<RawTensor>,
}

#[derive(Deserialize)]
struct RawFile {
    format: String,
    #[serde(default)]
    rank: Option<u32>,
    #[serde(default)]
    device: u32,
    #[serde(default)]
    device_total_bytes: Option<u64>,
    #[serde(default)]
    allowed_bytes: Option<u64>,
    #[serde(default)]
    steps: Vec<ProgramStep>,
    #[serde(default)]
    inventories: Vec<RawInventory>,
}

/// Where the tensors of `snapshot` would be: `<snapshot>.tensors.json`, or beside the
/// uncompressed name of a `.gz`, `.xz` or `.zst` file.
pub fn sidecars(snapshot: &Path) -> Vec<PathBuf> {
    let with = |p: &Path| {
        let mut s = p.as_os_str().to_owned();
        s.push(".tensors.json");
        PathBuf::from(s)
    };
    let mut out = vec![with(snapshot)];
    if let Some(ext) = snapshot.extension().and_then(|e| e.to_str()) {
        if matches!(ext, "gz" | "xz" | "zst") {
            out.push(with(&snapshot.with_extension("")));
        }
    }
    out
}

/// The tensors beside `snapshot`: `Ok(None)` when there is no side file.
pub fn read(snapshot: &Path) -> Result<Option<CaptureTensors>, TensorsError> {
    let Some(path) = sidecars(snapshot).into_iter().find(|p| p.is_file()) else {
        return Ok(None);
    };
    let bytes = read_small(&path, MAX_BYTES)
        .map_err(|e: SmallFileError| TensorsError::Read(e.to_string()))?;
    parse(&bytes, path).map(Some)
}

/// A side file's bytes, read; `path` is where they came from.
pub fn parse(bytes: &[u8], path: PathBuf) -> Result<CaptureTensors, TensorsError> {
    let raw: RawFile =
        serde_json::from_slice(bytes).map_err(|e| TensorsError::NotJson(e.to_string()))?;
    if raw.format != FORMAT {
        return Err(TensorsError::Format(raw.format));
    }
    let total: usize = raw.inventories.iter().map(|i| i.tensors.len()).sum();
    if total > MAX_TENSORS {
        return Err(TensorsError::TooMany(total));
    }
    let mut names = vec![String::new()];
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut intern = |s: String| -> u32 {
        if s.is_empty() {
            return 0;
        }
        *index.entry(s).or_insert_with_key(|s| {
            names.push(s.clone());
            (names.len() - 1) as u32
        })
    };
    let inventories = raw
        .inventories
        .into_iter()
        .map(|inv| Inventory {
            at: inv.at,
            step: inv.step,
            time_us: inv.time_us,
            tensors: inv
                .tensors
                .into_iter()
                .map(|t| Tensor {
                    addr: t.addr,
                    bytes: t.bytes,
                    kind: t.kind,
                    name: intern(t.name),
                    state: t.state.map_or(0, &mut intern),
                })
                .collect(),
        })
        .collect();
    Ok(CaptureTensors {
        path,
        rank: raw.rank,
        device: raw.device,
        device_total_bytes: raw.device_total_bytes,
        allowed_bytes: raw.allowed_bytes,
        steps: raw.steps,
        inventories,
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"format": "memsnap-tensors/1", "rank": 0, "device": 0,
        "device_total_bytes": 1000, "allowed_bytes": 800,
        "steps": [{"step": 2, "start_us": 10, "end_us": 20}, {"step": 3, "start_us": 21, "end_us": null}],
        "inventories": [
          {"at": "start", "step": 2, "time_us": 9, "tensors": [
            {"addr": 4096, "bytes": 512, "kind": "parameter", "name": "fc.weight"},
            {"addr": 8192, "bytes": 512, "kind": "optimizer_state", "name": "fc.weight", "state": "exp_avg"}]},
          {"at": "oom", "step": 3, "time_us": 30, "tensors": [
            {"addr": 4096, "bytes": 512, "kind": "parameter", "name": "fc.weight"},
            {"addr": 12288, "bytes": 512, "kind": "gradient", "name": "fc.weight"}]}]}"#;

    #[test]
    fn names_are_held_once_and_steps_keep_the_programs_numbers() {
        let t = parse(FILE.as_bytes(), PathBuf::from("s.tensors.json")).unwrap();
        assert_eq!(t.allowed_bytes, Some(800));
        assert_eq!(t.steps[1].end_us, None);
        assert_eq!(t.steps[0].step, 2);
        assert_eq!(t.inventories.len(), 2);
        assert_eq!(t.inventories[1].at, InventoryAt::Oom);
        let (a, b) = (t.inventories[0].tensors[0], t.inventories[1].tensors[1]);
        assert_eq!(a.name, b.name);
        assert_eq!(t.name(a.name), "fc.weight");
        assert_eq!(t.name(t.inventories[0].tensors[1].state), "exp_avg");
        assert_eq!(t.names.len(), 3);
    }

    #[test]
    fn other_files_are_refused_with_a_reason() {
        let p = || PathBuf::from("x");
        assert!(matches!(parse(b"{", p()), Err(TensorsError::NotJson(_))));
        assert!(matches!(
            parse(br#"{"format": "other/2"}"#, p()),
            Err(TensorsError::Format(_))
        ));
        assert!(sidecars(Path::new("a/s.pickle.xz"))
            .contains(&PathBuf::from("a/s.pickle.tensors.json")));
    }
}

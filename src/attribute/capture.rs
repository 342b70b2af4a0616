//! Evidence from the program's own list of its tensors (`memsnap.Capture`'s `.tensors.json`,
//! [`crate::snapshot::tensors`]): the strongest there is, since it is what the program held.
//!
//! Each inventory names the storages alive at one moment (recording start, each step's end, an
//! out-of-memory error) by address and bytes. The block a storage is, is the allocation at that
//! address alive at that moment: made at or before it and not freed before it, with the
//! storage's bytes, or a block alive before the trace at that address. That block gets the
//! storage's kind as its category and the tensor's name (`model.layers.3.mlp.up_proj.weight`,
//! `… · exp_avg`) as its stage, so blocks allocated before recording started have their
//! categories and module names too.

use rustc_hash::FxHashMap;

use super::evidence::{Evidence, Ledger};
use super::{Category, Labels, Names};
use crate::replay::{Replay, NONE};
use crate::snapshot::tensors::{CaptureTensors, Tensor, TensorKind};
use crate::snapshot::{Action, Snapshot};

/// The category of a listed storage's kind.
fn category(kind: TensorKind) -> Category {
    match kind {
        TensorKind::Parameter | TensorKind::Buffer => Category::Parameter,
        TensorKind::Gradient => Category::Gradient,
        TensorKind::OptimizerState => Category::OptimizerState,
    }
}

/// The name a listed storage gives its block.
fn name(capture: &CaptureTensors, t: &Tensor) -> String {
    let base = capture.name(t.name);
    match (t.kind, capture.name(t.state)) {
        (TensorKind::Gradient, _) => format!("{base} · grad"),
        (TensorKind::OptimizerState, "") => format!("{base} · optimizer state"),
        (TensorKind::OptimizerState, state) => format!("{base} · {state}"),
        _ => base.to_string(),
    }
}

/// What the capture found, for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Matched {
    /// Listed storages found as blocks (each block once).
    pub(crate) blocks: usize,
    /// Listed storages with no block of their address and size alive then.
    pub(crate) unmatched: usize,
}

/// Adds the capture's evidence: each listed storage's block gets its category (in `ledger`
/// for trace allocations, directly for blocks alive before the trace) and its name as stage.
pub(crate) fn add(
    snap: &Snapshot,
    replay: &Replay,
    capture: &CaptureTensors,
    names: &mut Names,
    labels: &mut Labels,
    preexisting: &mut Labels,
    ledger: &mut Ledger,
) -> Matched {
    let events = snap.trace(replay.device);
    // the allocations at each address, in event order
    let mut at: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    for (i, e) in events.iter().enumerate() {
        if e.action == Action::Alloc {
            at.entry(e.addr).or_default().push(i);
        }
    }
    let before: FxHashMap<u64, usize> = replay
        .preexisting
        .iter()
        .enumerate()
        .map(|(k, p)| (p.addr, k))
        .collect();
    let time_of = |i: usize| events[i].time_us;
    let mut matched = Matched::default();
    let mut done_trace = rustc_hash::FxHashSet::default();
    let mut done_before = rustc_hash::FxHashSet::default();
    for inventory in capture
        .inventories
        .iter()
        .filter(|_| capture.device == replay.device)
    {
        let moment = inventory.time_us;
        for t in &inventory.tensors {
            // the latest allocation at the address made by the moment, alive then
            let made = at.get(&t.addr).and_then(|list| {
                let k = list.partition_point(|&i| time_of(i) <= moment);
                let i = *list.get(k.checked_sub(1)?)?;
                let free = replay.partner[i];
                let alive =
                    free == NONE || events.get(free as usize).is_none_or(|f| f.time_us > moment);
                (alive && events[i].size == t.bytes).then_some(i)
            });
            if let Some(i) = made {
                ledger.add(i, Evidence::Capture, category(t.kind));
                if done_trace.insert(i) {
                    let stage = names.intern(&name(capture, t));
                    labels.update(i, |l| l.stage = stage);
                    matched.blocks += 1;
                }
                continue;
            }
            // a block alive before the trace, not freed by the moment
            let first_at = at
                .get(&t.addr)
                .and_then(|l| l.first())
                .map_or(i64::MAX, |&i| time_of(i));
            let old = before.get(&t.addr).copied().filter(|&k| {
                let p = &replay.preexisting[k];
                let freed_by = p.freed_at;
                let gone = freed_by != NONE
                    && events
                        .get(freed_by as usize)
                        .is_some_and(|f| f.time_us <= moment);
                !gone && first_at > moment && (p.requested == t.bytes || p.requested == 0)
            });
            match old {
                Some(k) => {
                    if done_before.insert(k) {
                        let stage = names.intern(&name(capture, t));
                        preexisting.update(k, |l| {
                            l.category = category(t.kind);
                            l.evidence = Evidence::Capture;
                            l.stage = stage;
                        });
                        matched.blocks += 1;
                    }
                }
                None => matched.unmatched += 1,
            }
        }
    }
    matched
}

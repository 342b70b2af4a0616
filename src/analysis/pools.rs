//! Reserved memory by pool: the default pool, each CUDA graph's private pool, each `MemPool`.
//!
//! At the end the snapshot's segments say it (`segment_pool_id`). At the allocated peak it
//! comes from the trace: the segments alive at trace start (each with the pool of the segment
//! the snapshot still lists at its address, or of the entry that later gives it back), then
//! every segment event of the trace up to the peak in the pool its entry names (`pool_id`,
//! torch after 2.11). The per-pool figures at the peak are given only when they add up to the
//! replay's reserved bytes at that moment.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::replay::Replay;
use crate::snapshot::{Action, PoolId, Snapshot};

/// The reserved bytes of one pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PoolReserved {
    /// PyTorch's pool id: `(0, 0)` the default pool, `(n, 0)` a CUDA graph's own pool,
    /// `(0, n)` a `MemPool` or `graph_pool_handle()`.
    pub pool_id: (i64, i64),
    /// `default`, `CUDA graph (1, 0)`, `pool (0, 1)`.
    pub label: String,
    /// Reserved bytes at the allocated peak; `None` when the trace carries no pool ids.
    pub at_peak_bytes: Option<u64>,
    /// Reserved bytes at the end (the snapshot's segments).
    pub at_end_bytes: u64,
}

/// Reserved bytes per pool at the allocated peak and at the end, default pool first; empty
/// when only the default pool was ever used.
pub fn reserved_by_pool(snap: &Snapshot, replay: &Replay) -> Vec<PoolReserved> {
    let device = replay.device;
    let events = snap.trace(device);
    let mut end: BTreeMap<(i64, i64), u64> = BTreeMap::new();
    for s in snap.segments_of(device) {
        *end.entry(s.pool_id).or_default() += s.total_size;
    }
    let private_in_trace = events.iter().any(|e| e.pool.is_private());
    if !private_in_trace && end.keys().all(|&p| p == (0, 0)) {
        return Vec::new();
    }
    let at_peak = if events.iter().any(|e| e.pool != PoolId::UNKNOWN) {
        reserved_after(snap, replay, replay.peaks.allocated.event)
    } else {
        None
    };
    let mut pools: Vec<(i64, i64)> = end.keys().copied().collect();
    if let Some(peak) = &at_peak {
        pools.extend(peak.keys().copied());
    }
    pools.push((0, 0));
    pools.sort_unstable();
    pools.dedup();
    pools
        .into_iter()
        .map(|id| PoolReserved {
            pool_id: id,
            label: PoolId::pack(id).label(),
            at_peak_bytes: at_peak.as_ref().map(|p| p.get(&id).copied().unwrap_or(0)),
            at_end_bytes: end.get(&id).copied().unwrap_or(0),
        })
        .collect()
}

/// Reserved bytes per pool after trace event `event` (`None`: before the first), from the
/// entries' pool ids, if they add up to the replay's reserved bytes then.
pub fn reserved_after(
    snap: &Snapshot,
    replay: &Replay,
    event: Option<usize>,
) -> Option<BTreeMap<(i64, i64), u64>> {
    let device = replay.device;
    let events = snap.trace(device);
    let mut reserved: BTreeMap<(i64, i64), u64> = BTreeMap::new();
    for seg in &replay.start_layout {
        let pool = match seg.origin(snap, device) {
            (Some(s), _) => s.pool_id,
            (None, released) => released.and_then(|e| e.pool.pair()).unwrap_or((0, 0)),
        };
        *reserved.entry(pool).or_default() += seg.size;
    }
    let upto = event.map_or(0, |i| i + 1);
    for e in events.iter().take(upto) {
        let pool = e.pool.pair().unwrap_or((0, 0));
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                *reserved.entry(pool).or_default() += e.size;
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let r = reserved.entry(pool).or_default();
                *r = r.checked_sub(e.size)?;
            }
            _ => {}
        }
    }
    let total: u64 = reserved.values().sum();
    (total == replay.reserved_at(event)).then_some(reserved)
}

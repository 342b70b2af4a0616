//! Inputs shaped to make a careless implementation quadratic: each is large enough that a
//! search per event over everything seen so far would not finish within the test run (about
//! 10^10 steps), while memsnap's indexes keep them to about n log n.

use serde_pickle::value::{HashableValue as H, Value as V};
use std::collections::BTreeMap;

use crate::util::*;

const N: i64 = 60_000;

fn event(action: &str, addr: i64, size: i64) -> V {
    let mut e = BTreeMap::new();
    e.insert(H::String("action".into()), V::String(action.into()));
    e.insert(H::String("addr".into()), V::I64(addr));
    e.insert(H::String("size".into()), V::I64(size));
    e.insert(H::String("stream".into()), V::I64(0));
    e.insert(
        H::String("time_us".into()),
        V::I64(1_700_000_000_000_000 + addr % 1_000_000),
    );
    e.insert(H::String("frames".into()), V::List(vec![]));
    V::Dict(e)
}

fn write_snapshot(dir: &tempfile::TempDir, name: &str, segments: Vec<V>, trace: Vec<V>) -> String {
    write(dir, name, &snapshot_pickle(segments, trace))
}

fn json(file: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["report", "--json", file])).unwrap()
}

/// Allocations at distinct addresses with no segment to hold them.
#[test]
fn allocations_outside_every_segment() {
    let dir = scratch();
    let trace = (0..N)
        .map(|k| event("alloc", (1 << 40) + k * 4096, 512))
        .collect();
    let f = write_snapshot(&dir, "nosegments.pickle", vec![], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["events"], N);
}

/// Many different unknown action names.
#[test]
fn many_unknown_action_names() {
    let dir = scratch();
    let trace = (0..N)
        .map(|k| event(&format!("action_{k}"), k, 512))
        .collect();
    let f = write_snapshot(&dir, "unknown.pickle", vec![], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["unknown_actions"], N);
}

/// Many blocks alive at the end, and as many frees of blocks allocated before the trace.
#[test]
fn many_live_blocks_and_frees_of_older_ones() {
    let dir = scratch();
    let base = 1i64 << 40;
    let size = 4096 * N * 2;
    let blocks: Vec<V> = (0..2 * N)
        .map(|k| {
            let mut b = BTreeMap::new();
            b.insert(H::String("address".into()), V::I64(base + k * 4096));
            b.insert(H::String("size".into()), V::I64(4096));
            b.insert(H::String("requested_size".into()), V::I64(4096));
            let state = if k % 2 == 0 {
                "active_allocated"
            } else {
                "inactive"
            };
            b.insert(H::String("state".into()), V::String(state.into()));
            V::Dict(b)
        })
        .collect();
    let mut seg = BTreeMap::new();
    seg.insert(H::String("device".into()), V::I64(0));
    seg.insert(H::String("address".into()), V::I64(base));
    seg.insert(H::String("total_size".into()), V::I64(size));
    seg.insert(H::String("stream".into()), V::I64(0));
    seg.insert(H::String("segment_type".into()), V::String("large".into()));
    seg.insert(H::String("blocks".into()), V::List(blocks));
    let trace = (0..N)
        .flat_map(|k| {
            let a = base + (2 * k + 1) * 4096;
            [
                event("free_requested", a, 4096),
                event("free_completed", a, 4096),
            ]
        })
        .collect();
    let f = write_snapshot(&dir, "frees.pickle", vec![V::Dict(seg)], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["frees_without_alloc"], N);
}

/// An expandable segment growing by many mapped pages, with an allocation in each.
#[test]
fn many_mapped_pages() {
    let dir = scratch();
    let base = 1i64 << 40;
    let page = 2 << 20;
    let trace = (0..N)
        .flat_map(|k| {
            [
                event("segment_map", base + k * page, page),
                event("alloc", base + k * page, 512),
            ]
        })
        .collect();
    let f = write_snapshot(&dir, "maps.pickle", vec![], trace);
    let v = json(&f);
    assert_eq!(v["devices"][0]["events"], 2 * N);
    assert_eq!(v["devices"][0]["peak_reserved_bytes"], N * page);
}

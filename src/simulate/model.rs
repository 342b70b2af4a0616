//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`, torch 2.x)
//! for one device: the small and large pools, best-fit search on the request's stream, block
//! splitting and merging, `max_split_size`, expandable segments mapped in pages, the memory
//! cap, garbage collection, and what the allocator does before giving up (release oversize
//! blocks, then every cached segment, then retry). Private pools (CUDA graphs, `MemPool`s)
//! each have their own small and large pools, searched only by their own requests, and give
//! their cache back only once released.
//!
//! Written by hand: no library models this allocator. Blocks live in an arena and link to
//! their neighbours by index, as the C++ links them by pointer; each pool's free blocks are an
//! ordered set keyed like PyTorch's `BlockComparatorSize` (stream, size, address), so a best-fit
//! search is one ordered lookup.

use std::collections::{BTreeSet, VecDeque};

use rustc_hash::FxHashMap;

use super::conf::AllocConf;
use super::program::SegmentEvent;
use crate::replay::{SizeRules, StartSegment};
use crate::snapshot::Action;

const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;
const MIN_BLOCK: u64 = 512;
const NIL: u32 = u32::MAX;
const SMALL: usize = 0;
const LARGE: usize = 1;

/// The block pool of private pool `p` (0 = the default pool) for small or large blocks.
fn slot(p: u16, small: bool) -> usize {
    2 * p as usize + if small { SMALL } else { LARGE }
}

/// The segment a new `cudaMalloc` of `size` bytes gets for a request rounded to `rounded`.
pub fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

#[derive(Clone, Copy, Debug)]
struct Block {
    addr: u64,
    size: u64,
    stream: i64,
    pool: usize,
    prev: u32,
    next: u32,
    allocated: bool,
    /// Freed by the program, waiting for other streams.
    pending: bool,
    mapped: bool,
    /// Part of an expandable segment (whose base is `base`).
    expandable: bool,
    base: u64,
    /// The pool's `get_free_block` count when the block was cached (garbage collection age).
    gc_base: i64,
}

/// Where new segments are placed.
#[derive(Debug)]
enum Addresses {
    /// Below everything seen so far, downwards (as `cudaMalloc` mostly hands them out).
    Invent { next: u64, next_virtual: u64 },
    /// The recorded run's addresses, in order, while the sizes agree; invented after.
    Recorded {
        queue: VecDeque<(u64, u64)>,
        next: u64,
        next_virtual: u64,
    },
}

impl Addresses {
    fn segment(&mut self, size: u64) -> u64 {
        let (next, from_queue) = match self {
            Addresses::Invent { next, .. } => (next, None),
            Addresses::Recorded { queue, next, .. } => {
                let hit = queue.front().filter(|&&(s, _)| s == size).map(|&(_, a)| a);
                if hit.is_some() {
                    queue.pop_front();
                }
                (next, hit)
            }
        };
        if let Some(a) = from_queue {
            return a;
        }
        let base = next.saturating_sub(size) / ROUND_LARGE * ROUND_LARGE;
        *next = base.saturating_sub(ROUND_LARGE);
        base
    }

    fn virtual_range(&mut self, size: u64) -> u64 {
        let next = match self {
            Addresses::Invent { next_virtual, .. } | Addresses::Recorded { next_virtual, .. } => {
                next_virtual
            }
        };
        let base = next.saturating_sub(size) / LARGE_BUFFER * LARGE_BUFFER;
        *next = base.saturating_sub(LARGE_BUFFER);
        base
    }
}

/// The failed request of an out-of-memory error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The request rounded (what the `oom` trace entry records).
    pub rounded: u64,
    /// The segment it needed ("Tried to allocate" in PyTorch's message).
    pub alloc_size: u64,
}

/// The allocator's state for one device.
#[derive(Debug)]
pub struct Model {
    conf: AllocConf,
    rules: SizeRules,
    /// `allowed_memory_maximum` when a memory fraction (cap) is set.
    cap: Option<u64>,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    /// Per block pool ([`slot`]): free blocks by (stream, size, address).
    free: Vec<BTreeSet<(i64, u64, u64, u32)>>,
    /// Per block pool: unmapped ranges of expandable segments by (stream, address).
    unmapped: Vec<BTreeSet<(i64, u64, u32)>>,
    gc_calls: Vec<i64>,
    /// Per private pool: released (its graph reset, its `MemPool` gone), so its cache is
    /// given back like the default pool's.
    released: Vec<bool>,
    /// The released private pools, in the order their cache is given back.
    release_order: Vec<u16>,
    /// Per private pool: a CUDA graph's own, whose requests come during a capture, when a
    /// failed request is not retried after releasing the cache.
    capturing: Vec<bool>,
    /// Reserved bytes (`total_allocated_memory`: segments plus mapped pages).
    pub reserved: u64,
    /// Allocated bytes (`memory_allocated()`).
    pub allocated: u64,
    live: FxHashMap<u32, u32>,
    waiting: FxHashMap<u32, u32>,
    addresses: Addresses,
    virtual_bytes: u64,
    /// Segment events since the caller last took them.
    pub log: Vec<SegmentEvent>,
    /// Allocations retried after releasing the cache.
    pub retries: u64,
    /// The trace event being simulated (for the log).
    pub event: usize,
}

impl Model {
    /// An empty allocator. `virtual_bytes` is the address space of an expandable segment
    /// (9/8 of the device's memory); `recorded` gives the recorded run's segment addresses
    /// in order, to reuse while the simulation makes the same segments.
    pub fn new(
        conf: &AllocConf,
        cap: Option<u64>,
        virtual_bytes: u64,
        lowest_address: u64,
        recorded: Option<Vec<(u64, u64)>>,
    ) -> Model {
        let next = lowest_address.saturating_sub(64 << 20);
        let next_virtual = next.saturating_sub(1 << 44).max(1 << 46);
        Model {
            rules: conf.size_rules(),
            conf: conf.clone(),
            cap,
            blocks: Vec::new(),
            spare: Vec::new(),
            free: vec![BTreeSet::new(), BTreeSet::new()],
            unmapped: vec![BTreeSet::new(), BTreeSet::new()],
            gc_calls: vec![0; 2],
            released: vec![true],
            release_order: Vec::new(),
            capturing: vec![false],
            reserved: 0,
            allocated: 0,
            live: FxHashMap::default(),
            waiting: FxHashMap::default(),
            addresses: match recorded {
                Some(q) => Addresses::Recorded {
                    queue: q.into(),
                    next,
                    next_virtual,
                },
                None => Addresses::Invent { next, next_virtual },
            },
            virtual_bytes,
            log: Vec::new(),
            retries: 0,
            event: 0,
        }
    }

    /// Makes room for private pool `p`; `graph` when a CUDA graph made it for itself.
    pub fn add_pool(&mut self, p: u16, graph: bool) {
        self.room_for(p);
        self.capturing[p as usize] = graph;
    }

    /// Makes room for private pool `p`, as a pool no graph made unless one was added so.
    fn room_for(&mut self, p: u16) {
        let n = p as usize + 1;
        if self.released.len() < n {
            self.released.resize(n, false);
            self.capturing.resize(n, false);
            self.free.resize_with(2 * n, BTreeSet::new);
            self.unmapped.resize_with(2 * n, BTreeSet::new);
            self.gc_calls.resize(2 * n, 0);
        }
    }

    /// Private pool `p` was released (its graph reset, its `MemPool` destroyed): its cached
    /// segments go back at every later release of the cache, after the default pool's and
    /// those of pools released before it; with `now`, they go back at once, the small
    /// pool's first (as a `MemPool` going away gives them back).
    pub fn release_pool(&mut self, p: u16, now: bool) {
        if p == 0 {
            return;
        }
        self.room_for(p);
        if !self.released[p as usize] {
            self.released[p as usize] = true;
            self.release_order.push(p);
        }
        if now {
            self.release_blocks(slot(p, true));
            self.release_blocks(slot(p, false));
        }
    }

    /// Places the segments and blocks recorded at trace start: `streams[i]` is the stream,
    /// whether small, and private pool of `layout[i]`; a block holding an allocation gets
    /// request id `first_req + k` for its pre-existing index `k`.
    pub fn load(&mut self, layout: &[StartSegment], streams: &[(i64, bool, u16)], first_req: u32) {
        let mut expandable: Vec<(usize, i64, &StartSegment)> = Vec::new();
        for (seg, &(stream, small, p)) in layout.iter().zip(streams) {
            self.room_for(p);
            let pool = slot(p, small);
            if seg.expandable {
                expandable.push((pool, stream, seg));
                continue;
            }
            self.reserved = self.reserved.saturating_add(seg.size);
            self.place_run(seg, pool, stream, false, seg.address, NIL, first_req);
        }
        expandable.sort_by_key(|&(pool, stream, seg)| (pool, stream, seg.address));
        let mut k = 0;
        while k < expandable.len() {
            let (pool, stream, first) = expandable[k];
            let base = first.address;
            let mut last = NIL;
            let mut cursor = base;
            while k < expandable.len() && expandable[k].0 == pool && expandable[k].1 == stream {
                let seg = expandable[k].2;
                if seg.address > cursor {
                    last =
                        self.push_unmapped(pool, stream, base, cursor, seg.address - cursor, last);
                }
                self.reserved = self.reserved.saturating_add(seg.size);
                last = self.place_run(seg, pool, stream, true, base, last, first_req);
                cursor = seg.address.saturating_add(seg.size);
                k += 1;
            }
            let end = base.saturating_add(self.virtual_bytes.max(cursor - base + LARGE_BUFFER));
            self.push_unmapped(pool, stream, base, cursor, end - cursor, last);
        }
    }

    /// Places one mapped run's blocks after `prev`; returns the last one.
    #[allow(clippy::too_many_arguments)]
    fn place_run(
        &mut self,
        seg: &StartSegment,
        pool: usize,
        stream: i64,
        expandable: bool,
        base: u64,
        mut prev: u32,
        first_req: u32,
    ) -> u32 {
        let blocks: Vec<(u64, u64, Option<usize>)> = if seg.blocks.is_empty() {
            vec![(seg.address, seg.size, None)]
        } else {
            seg.blocks
                .iter()
                .map(|b| (b.address, b.size, b.preexisting))
                .collect()
        };
        for (addr, size, pre) in blocks {
            let i = self.push(Block {
                addr,
                size,
                stream,
                pool,
                prev,
                next: NIL,
                allocated: pre.is_some(),
                pending: false,
                mapped: true,
                expandable,
                base,
                gc_base: 0,
            });
            if prev != NIL {
                self.blocks[prev as usize].next = i;
            }
            match pre {
                Some(k) => {
                    self.allocated = self.allocated.saturating_add(size);
                    self.live.insert(first_req + k as u32, i);
                }
                None => self.insert_free(i),
            }
            prev = i;
        }
        prev
    }

    fn push_unmapped(
        &mut self,
        pool: usize,
        stream: i64,
        base: u64,
        addr: u64,
        size: u64,
        prev: u32,
    ) -> u32 {
        let i = self.push(Block {
            addr,
            size,
            stream,
            pool,
            prev,
            next: NIL,
            allocated: false,
            pending: false,
            mapped: false,
            expandable: true,
            base,
            gc_base: 0,
        });
        if prev != NIL {
            self.blocks[prev as usize].next = i;
        }
        self.unmapped[pool].insert((stream, addr, i));
        i
    }

    fn push(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn b(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    fn bm(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }

    fn key(&self, i: u32) -> (i64, u64, u64, u32) {
        let b = self.b(i);
        (b.stream, b.size, b.addr, i)
    }

    fn insert_free(&mut self, i: u32) {
        let pool = self.b(i).pool;
        let calls = self.gc_calls[pool];
        self.bm(i).gc_base = calls;
        let key = self.key(i);
        self.free[pool].insert(key);
    }

    fn remove_free(&mut self, i: u32) {
        let key = self.key(i);
        let pool = self.b(i).pool;
        self.free[pool].remove(&key);
    }

    fn gc_on(&self) -> bool {
        self.cap.is_some() && self.conf.garbage_collection_threshold > 0.0
    }

    /// `malloc` in the default pool.
    pub fn malloc(&mut self, req: u32, size: u64, stream: i64) -> Result<(), Failure> {
        self.malloc_in(req, size, stream, 0)
    }

    /// `malloc`: serves request `req` of `size` bytes on `stream` from private pool `p` (0 =
    /// the default pool), or fails as PyTorch would.
    pub fn malloc_in(&mut self, req: u32, size: u64, stream: i64, p: u16) -> Result<(), Failure> {
        let rounded = self.rules.round(size);
        self.room_for(p);
        let pool = slot(p, rounded <= SMALL_SIZE);
        let alloc_size = allocation_size(rounded);
        let mut found = self.get_free_block(pool, stream, rounded);
        if found.is_none() {
            if self.gc_on() {
                self.garbage_collect();
            }
            found = self.alloc_block(pool, stream, rounded, alloc_size);
            if found.is_none() && self.release_available(pool, stream, rounded) {
                found = self.alloc_block(pool, stream, rounded, alloc_size);
            }
            if found.is_none() && !self.capturing[p as usize] {
                self.release_cached();
                self.retries += 1;
                found = self.alloc_block(pool, stream, rounded, alloc_size);
            }
        }
        let Some(i) = found else {
            return Err(Failure {
                rounded,
                alloc_size,
            });
        };
        self.alloc_found(i, rounded, req);
        Ok(())
    }

    /// The best-fit cached block for a request, taken out of its pool.
    fn get_free_block(&mut self, pool: usize, stream: i64, size: u64) -> Option<u32> {
        if self.gc_on() {
            self.gc_calls[pool] += 1;
        }
        let mut candidates = self.free[pool].range((stream, size, 0, 0)..);
        let first = *candidates.next()?;
        if first.0 != stream {
            return None;
        }
        let mut at = first;
        if self.b(at.3).expandable {
            if self.conf.expandable_segments {
                // Best fit counts the unmapped room after a block as part of it.
                let room = |m: &Model, i: u32| {
                    let b = m.b(i);
                    b.size
                        + if b.next != NIL && !m.b(b.next).mapped {
                            m.b(b.next).size
                        } else {
                            0
                        }
                };
                for next in candidates {
                    let better = self.b(at.3).expandable
                        && next.0 == stream
                        && room(self, next.3) < room(self, at.3);
                    if !better {
                        break;
                    }
                    at = *next;
                }
            } else {
                loop {
                    at = *candidates.next()?;
                    if at.0 != stream {
                        return None;
                    }
                    if !self.b(at.3).expandable {
                        break;
                    }
                }
            }
        }
        let block = self.b(at.3).size;
        if let Some(m) = self.conf.max_split_size {
            if size < m && block >= m {
                return None;
            }
            if size >= m && block >= size.saturating_add(self.conf.max_non_split_rounding) {
                return None;
            }
        }
        self.free[pool].remove(&at);
        Some(at.3)
    }

    /// A new segment (or newly mapped pages) for a request, unless the cap refuses it.
    fn alloc_block(&mut self, pool: usize, stream: i64, size: u64, alloc_size: u64) -> Option<u32> {
        if let Some(cap) = self.cap {
            if self.reserved.saturating_add(alloc_size) > cap {
                return None;
            }
        }
        if self.conf.expandable_segments {
            return self.allocate_expandable(pool, stream, size);
        }
        let addr = self.addresses.segment(alloc_size);
        self.reserved = self.reserved.saturating_add(alloc_size);
        self.log(Action::SegmentAlloc, alloc_size);
        Some(self.push(Block {
            addr,
            size: alloc_size,
            stream,
            pool,
            prev: NIL,
            next: NIL,
            allocated: false,
            pending: false,
            mapped: true,
            expandable: false,
            base: addr,
            gc_base: 0,
        }))
    }

    fn log(&mut self, action: Action, size: u64) {
        self.log.push(SegmentEvent {
            event: self.event,
            action,
            size,
        });
    }

    fn allocatable(&self, i: u32) -> bool {
        i != NIL && !self.b(i).allocated && !self.b(i).pending
    }

    /// The lowest-addressed room for `size` bytes in an expandable segment of the stream: an
    /// unmapped range, with the free block before it, followed by whatever is free after;
    /// a new segment when none has room.
    fn find_expandable(&mut self, pool: usize, stream: i64, size: u64) -> u32 {
        let has_room = |m: &Model, mut i: u32| {
            let mut bytes = 0u64;
            while bytes < size && m.allocatable(i) {
                bytes += m.b(i).size;
                i = m.b(i).next;
            }
            bytes >= size
        };
        let mut found = None;
        for &(s, _, i) in self.unmapped[pool].range((stream, 0, 0)..) {
            if s != stream {
                break;
            }
            let prev = self.b(i).prev;
            let c = if self.allocatable(prev) { prev } else { i };
            if has_room(self, c) {
                found = Some(c);
                break;
            }
        }
        if let Some(c) = found {
            return c;
        }
        let page = page_of(pool);
        let size = self.virtual_bytes.div_ceil(page).max(1) * page;
        let base = self.addresses.virtual_range(size);
        self.push_unmapped(pool, stream, base, base, size, NIL)
    }

    fn allocate_expandable(&mut self, pool: usize, stream: i64, size: u64) -> Option<u32> {
        let mut c = self.find_expandable(pool, stream, size);
        if !self.b(c).mapped {
            let want = size.min(self.b(c).size);
            self.map_block(c, want);
        }
        while self.b(c).size < size {
            let remaining = size - self.b(c).size;
            let next = self.b(c).next;
            if next == NIL || self.b(next).mapped {
                return None;
            }
            let want = remaining.min(self.b(next).size);
            self.map_block(next, want);
            c = next;
        }
        self.remove_free(c);
        Some(c)
    }

    /// Maps pages at the start of unmapped block `i` to cover `size` bytes.
    fn map_block(&mut self, i: u32, size: u64) {
        let pool = self.b(i).pool;
        let page = page_of(pool);
        let mapped = size.div_ceil(page).saturating_mul(page).min(self.b(i).size);
        let (stream, addr) = (self.b(i).stream, self.b(i).addr);
        self.unmapped[pool].remove(&(stream, addr, i));
        self.bm(i).mapped = true;
        if mapped < self.b(i).size {
            let b = *self.b(i);
            let rest = self.push(Block {
                addr: b.addr + mapped,
                size: b.size - mapped,
                mapped: false,
                prev: i,
                next: b.next,
                ..b
            });
            if b.next != NIL {
                self.bm(b.next).prev = rest;
            }
            self.bm(i).next = rest;
            self.bm(i).size = mapped;
            self.unmapped[pool].insert((stream, b.addr + mapped, rest));
        }
        let (prev, next) = (self.b(i).prev, self.b(i).next);
        self.merge(i, prev);
        self.merge(i, next);
        self.insert_free(i);
        self.reserved = self.reserved.saturating_add(mapped);
        self.log(Action::SegmentMap, mapped);
    }

    /// Merges free neighbour `src` into `dst` (which is in no set) when both are free and
    /// equally mapped.
    fn merge(&mut self, dst: u32, src: u32) {
        if src == NIL {
            return;
        }
        let s = *self.b(src);
        if s.allocated || s.pending || s.mapped != self.b(dst).mapped {
            return;
        }
        if s.mapped {
            self.free[s.pool].remove(&(s.stream, s.size, s.addr, src));
        } else {
            self.unmapped[s.pool].remove(&(s.stream, s.addr, src));
        }
        if self.b(dst).prev == src {
            self.bm(dst).addr = s.addr;
            self.bm(dst).prev = s.prev;
            if s.prev != NIL {
                self.bm(s.prev).next = dst;
            }
        } else {
            self.bm(dst).next = s.next;
            if s.next != NIL {
                self.bm(s.next).prev = dst;
            }
        }
        self.bm(dst).size += s.size;
        self.spare.push(src);
    }

    /// Hands out block `i` for a request rounded to `size`, splitting off the rest when the
    /// rules say so.
    fn alloc_found(&mut self, mut i: u32, size: u64, req: u32) {
        let b = *self.b(i);
        let remaining = b.size - size;
        let split = if b.pool % 2 == SMALL || self.conf.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            self.conf.max_split_size.is_none_or(|m| size < m) && remaining > SMALL_SIZE
        };
        if split {
            let head = self.push(Block { size, next: i, ..b });
            if b.prev != NIL {
                self.bm(b.prev).next = head;
            }
            let rest = self.bm(i);
            rest.prev = head;
            rest.addr += size;
            rest.size -= size;
            self.insert_free(i);
            i = head;
        }
        self.bm(i).allocated = true;
        self.allocated = self.allocated.saturating_add(self.b(i).size);
        self.live.insert(req, i);
    }

    /// The program frees `req`: at once, or after other streams (`now` false).
    pub fn free(&mut self, req: u32, now: bool) {
        let Some(i) = self.live.remove(&req) else {
            return;
        };
        self.bm(i).allocated = false;
        self.allocated = self.allocated.saturating_sub(self.b(i).size);
        if now {
            self.free_block(i);
        } else {
            self.bm(i).pending = true;
            self.waiting.insert(req, i);
        }
    }

    /// A deferred free of `req` completes.
    pub fn complete(&mut self, req: u32) {
        if let Some(i) = self.waiting.remove(&req) {
            self.bm(i).pending = false;
            self.free_block(i);
        }
    }

    fn free_block(&mut self, i: u32) {
        let (prev, next) = (self.b(i).prev, self.b(i).next);
        self.merge(i, prev);
        self.merge(i, next);
        self.insert_free(i);
    }

    /// Frees a whole cached segment.
    fn release_block(&mut self, i: u32) {
        self.remove_free(i);
        let size = self.b(i).size;
        self.reserved = self.reserved.saturating_sub(size);
        self.log(Action::SegmentFree, size);
        self.spare.push(i);
    }

    fn whole(&self, i: u32) -> bool {
        self.b(i).prev == NIL && self.b(i).next == NIL && !self.b(i).expandable
    }

    /// Unmaps the whole pages inside free expandable block `i`.
    fn unmap_block(&mut self, i: u32) {
        let b = *self.b(i);
        let page = page_of(b.pool);
        // Saturating: an inconsistent start layout (a hostile snapshot) must not wrap.
        let start = b
            .base
            .saturating_add(b.addr.saturating_sub(b.base).div_ceil(page) * page);
        let end = b
            .base
            .saturating_add(b.addr.saturating_add(b.size).saturating_sub(b.base) / page * page);
        if end <= start {
            return;
        }
        self.remove_free(i);
        if start > b.addr {
            let before = self.push(Block {
                size: start - b.addr,
                next: i,
                ..b
            });
            if b.prev != NIL {
                self.bm(b.prev).next = before;
            }
            self.bm(i).prev = before;
            self.insert_free(before);
        }
        if b.addr.saturating_add(b.size) > end {
            let after = self.push(Block {
                addr: end,
                size: b.addr.saturating_add(b.size) - end,
                prev: i,
                ..b
            });
            if b.next != NIL {
                self.bm(b.next).prev = after;
            }
            self.bm(i).next = after;
            self.insert_free(after);
        }
        let blk = self.bm(i);
        blk.addr = start;
        blk.size = end - start;
        blk.mapped = false;
        let (prev, next) = (blk.prev, blk.next);
        self.merge(i, prev);
        self.merge(i, next);
        let b = *self.b(i);
        self.unmapped[b.pool].insert((b.stream, b.addr, i));
        self.reserved = self.reserved.saturating_sub(end - start);
        self.log(Action::SegmentUnmap, end - start);
    }

    /// `release_blocks`: frees every cached whole segment of a block pool, and unmaps the free
    /// pages of its expandable segments.
    fn release_blocks(&mut self, pool: usize) {
        let cached: Vec<u32> = self.free[pool].iter().map(|k| k.3).collect();
        let mut to_unmap = Vec::new();
        for i in cached {
            if self.b(i).expandable {
                to_unmap.push(i);
            } else if self.whole(i) {
                self.release_block(i);
            }
        }
        for i in to_unmap {
            self.unmap_block(i);
            let b = *self.b(i);
            if !b.mapped && b.prev == NIL && b.next == NIL {
                self.unmapped[b.pool].remove(&(b.stream, b.addr, i));
                self.spare.push(i);
            }
        }
    }

    /// `release_cached_blocks` (also `empty_cache()`): waits for pending frees, then releases
    /// the large pool and the small pool, then those of each released private pool.
    pub fn release_cached(&mut self) {
        let mut waiting: Vec<(u32, u32)> = self.waiting.drain().collect();
        waiting.sort_unstable();
        for (_, i) in waiting {
            self.bm(i).pending = false;
            self.free_block(i);
        }
        self.release_blocks(LARGE);
        self.release_blocks(SMALL);
        for k in 0..self.release_order.len() {
            let p = self.release_order[k];
            self.release_blocks(slot(p, false));
            self.release_blocks(slot(p, true));
        }
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, frees one cached
    /// oversize segment large enough, or oversize segments from the largest down until
    /// enough is freed.
    fn release_available(&mut self, pool: usize, stream: i64, size: u64) -> bool {
        let Some(m) = self.conf.max_split_size else {
            return false;
        };
        let want = size.max(m);
        let one = self.free[pool]
            .range((stream, want, 0, 0)..)
            .find(|k| k.0 != stream || self.whole(k.3))
            .copied()
            .filter(|k| k.0 == stream);
        if let Some(k) = one {
            self.release_block(k.3);
            return true;
        }
        let largest: Vec<(u64, u32)> = self.free[pool]
            .range(..(stream, want, 0, 0))
            .rev()
            .take_while(|k| k.0 == stream && k.1 >= m)
            .filter(|k| self.whole(k.3))
            .map(|k| (k.1, k.3))
            .collect();
        let mut released = 0u64;
        for (bytes, i) in largest {
            if released >= want {
                break;
            }
            released += bytes;
            self.release_block(i);
        }
        released >= want
    }

    /// `garbage_collect_cached_blocks`: above `threshold × cap` reserved bytes, frees cached
    /// whole segments of the large pool, oldest first, until enough is reclaimed.
    fn garbage_collect(&mut self) {
        let Some(cap) = self.cap else { return };
        let threshold = (self.conf.garbage_collection_threshold * cap as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved.saturating_sub(threshold);
        let calls = self.gc_calls[LARGE];
        let age = |m: &Model, i: u32| calls - m.b(i).gc_base;
        let mut freeable: Vec<u32> = self.free[LARGE]
            .iter()
            .map(|k| k.3)
            .filter(|&i| self.whole(i))
            .collect();
        let mut total_age: i64 = freeable.iter().map(|&i| age(self, i)).sum();
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && !freeable.is_empty() {
            let mean = total_age as f64 / freeable.len() as f64;
            freed_any = false;
            let mut kept = Vec::with_capacity(freeable.len());
            for i in freeable {
                let a = age(self, i);
                if a as f64 >= mean {
                    freed_any = true;
                    reclaimed += self.b(i).size;
                    total_age -= a;
                    self.release_block(i);
                } else {
                    kept.push(i);
                }
            }
            freeable = kept;
        }
    }

    /// The largest cached free block.
    pub fn largest_free_block(&self) -> u64 {
        self.free
            .iter()
            .flat_map(|set| set.iter())
            .map(|k| k.1)
            .max()
            .unwrap_or(0)
    }
}

fn page_of(pool: usize) -> u64 {
    if pool % 2 == SMALL {
        SMALL_BUFFER
    } else {
        LARGE_BUFFER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn model(conf: &str, cap: Option<u64>) -> Model {
        Model::new(
            &AllocConf::parse(conf).unwrap(),
            cap,
            1 << 40,
            1 << 47,
            None,
        )
    }

    #[test]
    fn segment_sizes_follow_the_request() {
        let mut m = model("", None);
        m.malloc(0, 4, 0).unwrap();
        m.malloc(1, MIB + 1, 0).unwrap();
        // best fit: the rest of the 20 MiB segment serves 11 MiB + 1, split
        m.malloc(2, 11 * MIB + 1, 0).unwrap();
        let sizes: Vec<u64> = m.log.iter().map(|e| e.size).collect();
        assert_eq!(sizes, vec![2 * MIB, 20 * MIB]);
        assert_eq!(m.allocated, 512 + 1_049_088 + 11_534_848);
        // alone, 11 MiB + 1 takes a whole 12 MiB segment: the rest is not over 1 MiB
        let mut m = model("", None);
        m.malloc(0, 11 * MIB + 1, 0).unwrap();
        assert_eq!(m.log[0].size, 12 * MIB);
        assert_eq!(m.allocated, 12 * MIB);
    }

    #[test]
    fn best_fit_reuses_and_merges() {
        let mut m = model("", None);
        m.malloc(0, 3 * MIB, 0).unwrap();
        m.malloc(1, 3 * MIB, 0).unwrap();
        m.malloc(2, 3 * MIB, 0).unwrap();
        assert_eq!(m.log.len(), 1, "three blocks of one 20 MiB segment");
        m.free(0, true);
        m.free(1, true);
        // the freed 6 MiB run is merged and serves a 5 MiB request without a new segment
        m.malloc(3, 5 * MIB, 0).unwrap();
        assert_eq!(m.log.len(), 1);
        assert_eq!(m.reserved, 20 * MIB);
        // another stream never reuses it
        m.malloc(4, 3 * MIB, 7).unwrap();
        assert_eq!(m.log.len(), 2);
    }

    #[test]
    fn the_cap_releases_the_cache_then_fails() {
        let mut m = model("", Some(30 * MIB));
        m.malloc(0, 12 * MIB, 0).unwrap();
        m.free(0, true);
        // 16 MiB does not fit the cached 12 MiB; 12 + 16 fits under 30 MiB
        m.malloc(1, 16 * MIB, 0).unwrap();
        assert_eq!(m.reserved, 28 * MIB);
        m.free(1, true);
        // 20 MiB: 28 + 20 > 30, so both cached segments are freed and the retry succeeds
        m.malloc(2, 20 * MIB, 0).unwrap();
        assert_eq!(m.retries, 1);
        assert_eq!(m.reserved, 20 * MIB);
        let e = m.malloc(3, 20 * MIB, 0).unwrap_err();
        assert_eq!(e.alloc_size, 20 * MIB);
    }

    #[test]
    fn expandable_segments_map_pages_and_pack() {
        let mut m = model("expandable_segments:True", None);
        m.malloc(0, 100 * MIB + 1, 0).unwrap();
        assert_eq!(m.reserved, 120 * MIB, "six 20 MiB pages");
        assert_eq!(m.allocated, 104_858_112);
        m.malloc(1, 15 * MIB, 0).unwrap();
        assert_eq!(m.reserved, 120 * MIB, "packed into the mapped tail");
        m.free(0, true);
        m.free(1, true);
        m.release_cached();
        assert_eq!(m.reserved, 0);
        let kinds: Vec<Action> = m.log.iter().map(|e| e.action).collect();
        assert_eq!(kinds, vec![Action::SegmentMap, Action::SegmentUnmap]);
    }

    #[test]
    fn max_split_size_keeps_oversize_blocks_whole() {
        let mut m = model("max_split_size_mb:64", None);
        m.malloc(0, 100 * MIB, 0).unwrap();
        m.free(0, true);
        // a small request may not take the oversize block
        m.malloc(1, 30 * MIB, 0).unwrap();
        assert_eq!(m.log.len(), 2);
        // an oversize request takes it only within 20 MiB of its size
        m.malloc(2, 90 * MIB, 0).unwrap();
        assert_eq!(m.log.len(), 2);
    }
}

//! The allocator's segments and blocks at one moment, and the operations that move it forward.
//!
//! Like the caching allocator itself, blocks of a segment form a doubly linked list in address
//! order (`prev`/`next` hold neighbour addresses), kept in a hash map by start address. Every
//! trace event then touches a block by its exact address and its two neighbours: O(1). Only
//! inconsistent input (an allocation that does not start a free block) needs a search.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

/// Allocation state of a simulated block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// Handed to the program.
    Live,
    /// Freed by the program, waiting for other streams.
    Pending,
    /// Cached free memory.
    Free,
}

/// No neighbour.
pub(crate) const NIL: u64 = u64::MAX;

/// A block in the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blk {
    pub(crate) size: u64,
    pub(crate) state: Use,
    pub(crate) requested: u64,
    /// Index of the alloc event that handed it out, or `PRE | k` for the k-th block that was
    /// alive before the trace started.
    pub(crate) origin: u32,
    pub(crate) prev: u64,
    pub(crate) next: u64,
}

impl Blk {
    pub(crate) fn free(size: u64) -> Blk {
        Blk {
            size,
            state: Use::Free,
            requested: 0,
            origin: 0,
            prev: NIL,
            next: NIL,
        }
    }
}

/// Marks [`Blk::origin`] values that name a block alive before the trace.
pub(crate) const PRE: u32 = 1 << 31;

/// A mapped address range: a segment, or a contiguous mapped part of an expandable segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) size: u64,
    pub(crate) expandable: bool,
}

/// Segments and blocks of one device.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) ranges: BTreeMap<u64, Range>,
    pub(crate) blocks: FxHashMap<u64, Blk>,
    /// Block starts in address order, for the lookups by address inside a block. Built at the
    /// first such lookup and kept up to date from then on: a consistent trace of fixed
    /// segments never needs one, and saves an ordered insert and remove per event.
    starts: Option<std::collections::BTreeSet<u64>>,
}

impl State {
    /// Adds (or replaces) the block at `addr`.
    pub(crate) fn put(&mut self, addr: u64, b: Blk) {
        self.blocks.insert(addr, b);
        if let Some(starts) = &mut self.starts {
            starts.insert(addr);
        }
    }

    /// Removes the block at `addr`.
    fn take(&mut self, addr: u64) -> Option<Blk> {
        let b = self.blocks.remove(&addr)?;
        if let Some(starts) = &mut self.starts {
            starts.remove(&addr);
        }
        Some(b)
    }

    /// The range holding `addr`: `(start, range)`.
    pub(crate) fn range_of(&self, addr: u64) -> Option<(u64, Range)> {
        let (&start, &r) = self.ranges.range(..=addr).next_back()?;
        (addr < start.saturating_add(r.size)).then_some((start, r))
    }

    /// Adds a mapped range, joining it to adjacent expandable ranges. Blocks are not touched.
    pub(crate) fn map_range(&mut self, addr: u64, size: u64, expandable: bool) {
        let mut start = addr;
        let mut size = size;
        if expandable {
            if let Some((&p, &r)) = self.ranges.range(..addr).next_back() {
                if r.expandable && p.saturating_add(r.size) == addr {
                    self.ranges.remove(&p);
                    start = p;
                    size += r.size;
                }
            }
            let end = start.saturating_add(size);
            if let Some(&r) = self.ranges.get(&end) {
                if r.expandable {
                    self.ranges.remove(&end);
                    size += r.size;
                }
            }
        }
        self.ranges.insert(start, Range { size, expandable });
    }

    /// Removes `[addr, addr + size)` from the range holding it. Blocks are not touched.
    pub(crate) fn unmap_range(&mut self, addr: u64, size: u64) -> bool {
        let Some((start, r)) = self.range_of(addr) else {
            return false;
        };
        let end = start.saturating_add(r.size);
        let cut_end = addr.saturating_add(size).min(end);
        self.ranges.remove(&start);
        if addr > start {
            let left = Range {
                size: addr - start,
                ..r
            };
            self.ranges.insert(start, left);
        }
        if cut_end < end {
            let right = Range {
                size: end - cut_end,
                ..r
            };
            self.ranges.insert(cut_end, right);
        }
        true
    }

    /// Lays out every range at trace start: the given blocks where they are, maximal free
    /// blocks in the gaps, all linked in address order. Returns how many blocks could not be
    /// placed inside a range (each is kept, unlinked).
    pub(crate) fn build(&mut self, mut placed: Vec<(u64, Blk)>) -> u64 {
        placed.sort_unstable_by_key(|&(a, _)| a);
        let mut misplaced = 0;
        let mut i = 0;
        let ranges: Vec<(u64, Range)> = self.ranges.iter().map(|(&a, &r)| (a, r)).collect();
        for (start, r) in ranges {
            let end = start.saturating_add(r.size);
            while i < placed.len() && placed[i].0 < start {
                self.put(placed[i].0, placed[i].1);
                misplaced += 1;
                i += 1;
            }
            let mut chain: Vec<(u64, Blk)> = Vec::new();
            let mut cursor = start;
            while i < placed.len() && placed[i].0 < end {
                let (a, b) = placed[i];
                i += 1;
                if a < cursor || a.saturating_add(b.size) > end {
                    misplaced += 1;
                    continue;
                }
                if a > cursor {
                    chain.push((cursor, Blk::free(a - cursor)));
                }
                chain.push((a, b));
                cursor = a.saturating_add(b.size);
            }
            if cursor < end {
                chain.push((cursor, Blk::free(end - cursor)));
            }
            for k in 0..chain.len() {
                let (a, mut b) = chain[k];
                b.prev = if k > 0 { chain[k - 1].0 } else { NIL };
                b.next = chain.get(k + 1).map_or(NIL, |c| c.0);
                self.put(a, b);
            }
        }
        for &(a, b) in &placed[i..] {
            self.put(a, b);
            misplaced += 1;
        }
        misplaced
    }

    /// The block whose bytes include `addr`.
    pub(crate) fn containing(&mut self, addr: u64) -> Option<u64> {
        let blocks = &self.blocks;
        let starts = self
            .starts
            .get_or_insert_with(|| blocks.keys().copied().collect());
        let &s = starts.range(..=addr).next_back()?;
        let b = self.blocks.get(&s)?;
        (addr < s.saturating_add(b.size)).then_some(s)
    }

    /// Cuts the block at `start` after `len` bytes; the tail becomes its own block with the
    /// same state. Returns the tail's address.
    pub(crate) fn split(&mut self, start: u64, len: u64) -> Option<u64> {
        let b = *self.blocks.get(&start)?;
        if len == 0 || len >= b.size {
            return None;
        }
        let tail = self.add_tail(start, b, len);
        let head = self.blocks.get_mut(&start).expect("present");
        head.size = len;
        head.next = tail;
        Some(tail)
    }

    /// The first half of a split of the block `b` at `start` (`0 < len < b.size`): its tail
    /// made a block of its own and linked to the block after. The caller then shortens the
    /// head to `len` bytes and links it to the tail, whose address this returns.
    pub(crate) fn add_tail(&mut self, start: u64, b: Blk, len: u64) -> u64 {
        let tail = start.saturating_add(len);
        self.put(
            tail,
            Blk {
                size: b.size - len,
                prev: start,
                ..b
            },
        );
        if let Some(n) = self.blocks.get_mut(&b.next) {
            n.prev = tail;
        }
        tail
    }

    /// Merges the block at `start` with its next neighbour (which must be adjacent).
    /// `b` is the block at `start` as it stands now.
    fn absorb_next(&mut self, start: u64, b: Blk) {
        // A block linked to itself only comes from inconsistent input: leave it.
        if b.next == start {
            return;
        }
        let Some(next) = self.take(b.next) else {
            return;
        };
        if let Some(nn) = self.blocks.get_mut(&next.next) {
            nn.prev = start;
        }
        if let Some(head) = self.blocks.get_mut(&start) {
            head.size = head.size.saturating_add(next.size);
            head.next = next.next;
        }
    }

    /// Marks the block at `addr` free and merges it with free neighbours.
    pub(crate) fn release(&mut self, addr: u64) {
        let Some(b) = self.blocks.get_mut(&addr) else {
            return;
        };
        b.state = Use::Free;
        b.requested = 0;
        let freed = *b;
        let (prev, next) = (freed.prev, freed.next);
        if self.blocks.get(&next).is_some_and(|n| n.state == Use::Free) {
            self.absorb_next(addr, freed);
        }
        if let Some(&p) = self.blocks.get(&prev).filter(|p| p.state == Use::Free) {
            self.absorb_next(prev, p);
        }
    }

    /// Removes the chain of blocks that starts at `addr` and lies before `end` (a freed
    /// segment, or unmapped pages).
    pub(crate) fn drop_chain(&mut self, addr: u64, end: u64) {
        let mut cursor = addr;
        let mut prev = NIL;
        while cursor != NIL && cursor < end {
            let Some(b) = self.take(cursor) else {
                break;
            };
            if prev == NIL {
                prev = b.prev;
            }
            cursor = b.next;
        }
        if let Some(p) = self.blocks.get_mut(&prev) {
            p.next = cursor;
        }
        if let Some(n) = self.blocks.get_mut(&cursor) {
            n.prev = prev;
        }
    }

    /// Unlinks the two blocks around an address where a range now ends.
    fn cut_between(&mut self, left: u64, right: u64) {
        if let Some(l) = self.blocks.get_mut(&left) {
            l.next = NIL;
        }
        if let Some(r) = self.blocks.get_mut(&right) {
            r.prev = NIL;
        }
    }

    /// Pages `[addr, addr + size)` were mapped: a free block, linked to the blocks of an
    /// adjacent expandable range and merged with free neighbours.
    pub(crate) fn map_pages(&mut self, addr: u64, size: u64) {
        self.map_range(addr, size, true);
        let mut b = Blk::free(size);
        b.state = Use::Pending;
        let before = addr
            .checked_sub(1)
            .and_then(|last| self.containing(last))
            .filter(|&s| {
                self.blocks
                    .get(&s)
                    .is_some_and(|x| s.saturating_add(x.size) == addr)
            });
        let same_range =
            |st: &State, x: u64| st.range_of(x).map(|r| r.0) == st.range_of(addr).map(|r| r.0);
        if let Some(p) = before.filter(|&p| same_range(self, p)) {
            b.prev = p;
            if let Some(pb) = self.blocks.get_mut(&p) {
                pb.next = addr;
            }
        }
        if self.blocks.contains_key(&(addr.saturating_add(size)))
            && same_range(self, addr.saturating_add(size))
        {
            b.next = addr.saturating_add(size);
            if let Some(nb) = self.blocks.get_mut(&(addr.saturating_add(size))) {
                nb.prev = addr;
            }
        }
        self.put(addr, b);
        self.release(addr);
    }

    /// Pages `[addr, addr + size)` were unmapped: their (free) bytes leave the chain, which is
    /// cut in two there.
    pub(crate) fn unmap_pages(&mut self, addr: u64, size: u64) {
        self.unmap_range(addr, size);
        let end = addr.saturating_add(size);
        if let Some(s) = self.containing(addr) {
            if s < addr {
                self.split(s, addr - s);
            }
        }
        if let Some(s) = self.containing(end.saturating_sub(1)) {
            if s.saturating_add(self.blocks[&s].size) > end {
                self.split(s, end - s);
            }
        }
        let left = self.blocks.get(&addr).map_or(NIL, |b| b.prev);
        let mut right = NIL;
        let mut cursor = addr;
        while cursor != NIL && cursor < end {
            match self.take(cursor) {
                Some(b) => {
                    right = b.next;
                    cursor = b.next;
                }
                None => break,
            }
        }
        self.cut_between(left, right);
    }

    /// The blocks of the range starting at `start`, in address order (for tests and checks).
    #[cfg(test)]
    pub(crate) fn chain(&self, start: u64) -> Vec<(u64, u64, Use)> {
        let mut out = Vec::new();
        let mut cursor = start;
        while let Some(b) = self.blocks.get(&cursor) {
            out.push((cursor, b.size, b.state));
            cursor = b.next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(size: u64) -> Blk {
        Blk {
            size,
            state: Use::Live,
            requested: size,
            ..Blk::free(size)
        }
    }

    #[test]
    fn build_split_and_release_merge_within_a_range() {
        let mut s = State::default();
        s.map_range(0, 1000, false);
        s.map_range(1000, 1000, false);
        assert_eq!(s.build(vec![(100, live(100))]), 0);
        assert_eq!(
            s.chain(0),
            vec![
                (0, 100, Use::Free),
                (100, 100, Use::Live),
                (200, 800, Use::Free)
            ]
        );
        assert_eq!(
            s.chain(1000),
            vec![(1000, 1000, Use::Free)],
            "segments never merge"
        );
        // the index by address, once built, follows the merges
        assert_eq!(s.containing(150), Some(100));
        s.release(100);
        assert_eq!(s.chain(0), vec![(0, 1000, Use::Free)]);
        assert_eq!(s.containing(150), Some(0));
        assert_eq!(s.blocks.len(), 2, "the merged neighbours are gone");
        let tail = s.split(0, 300).unwrap();
        assert_eq!(tail, 300);
        assert_eq!(s.chain(0), vec![(0, 300, Use::Free), (300, 700, Use::Free)]);
        assert_eq!(s.containing(450), Some(300));
        s.drop_chain(0, 1000);
        assert!(s.chain(0).is_empty());
        assert_eq!(s.chain(1000).len(), 1);
    }

    #[test]
    fn expandable_pages_join_and_split() {
        let mut s = State::default();
        s.map_range(0, 100, true);
        s.build(vec![(0, live(60))]);
        s.map_pages(100, 50);
        assert_eq!(s.ranges.len(), 1);
        assert_eq!(s.ranges[&0].size, 150);
        assert_eq!(s.chain(0), vec![(0, 60, Use::Live), (60, 90, Use::Free)]);
        s.unmap_pages(100, 50);
        assert_eq!(s.ranges[&0].size, 100);
        assert_eq!(s.chain(0), vec![(0, 60, Use::Live), (60, 40, Use::Free)]);
        s.unmap_pages(70, 10);
        assert_eq!(s.chain(0), vec![(0, 60, Use::Live), (60, 10, Use::Free)]);
        assert_eq!(s.chain(80), vec![(80, 20, Use::Free)]);
    }
}

//! The caching allocator's rules that decide how many bytes a request really takes.
//!
//! `torch.cuda.memory_allocated()` counts *block* sizes. A request is rounded up (512 bytes, or
//! power-of-two divisions when `roundup_power2_divisions` is set), and when the free block
//! chosen for it would leave too small a remainder, the whole block is handed out unsplit: a
//! 4 MiB request served from a 5 MiB free block counts 5 MiB. These functions restate the rules
//! of `c10/cuda/CUDACachingAllocator.cpp` (`round_size`, `should_split`).

/// Smallest block; every size is a multiple of it.
pub const MIN_BLOCK: u64 = 512;
/// Largest request served from the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;

/// The allocator settings that change sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SizeRules {
    /// `roundup_power2_divisions` per interval (index 0 = sizes below 2 MiB).
    pub divisions: [u64; 16],
    /// Blocks of at least this size are never split (`None` = unlimited).
    pub max_split_size: Option<u64>,
    /// `expandable_segments:True`: any remainder of 512 bytes or more is split off.
    pub expandable_segments: bool,
}

impl SizeRules {
    /// The block size a request of `size` bytes is rounded to.
    pub fn round(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK * divisions {
            next_power2_division(size, divisions)
        } else {
            // Saturating: a size near 2^64 (never real) must not wrap to 0.
            size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
        }
    }

    fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.leading_zeros() as u64;
        let index = log.saturating_sub(20).min(15);
        self.divisions[index as usize]
    }

    /// Whether a free block of `block` bytes serving a rounded request of `rounded` bytes is
    /// split (the remainder stays free) or handed out whole.
    pub fn splits(&self, block: u64, rounded: u64) -> bool {
        let remaining = block.saturating_sub(rounded);
        if rounded <= SMALL_SIZE || self.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            self.max_split_size.is_none_or(|m| rounded < m) && remaining > SMALL_SIZE
        }
    }
}

/// Rounds `size` up to the next of `divisions` equal steps between two powers of two.
fn next_power2_division(size: u64, divisions: u64) -> u64 {
    if size <= 4 || divisions <= 1 || size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down.saturating_add(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_512_bytes() {
        let r = SizeRules::default();
        assert_eq!(r.round(1), 512);
        assert_eq!(r.round(512), 512);
        assert_eq!(r.round(513), 1024);
        assert_eq!(r.round(4 << 20), 4 << 20);
    }

    #[test]
    fn power2_divisions_follow_the_allocator_example() {
        // CUDACachingAllocator.cpp: 1200 with 4 divisions -> 1280 (when it applies)
        assert_eq!(next_power2_division(1200, 4), 1280);
        assert_eq!(next_power2_division(1024, 4), 1024);
        let r = SizeRules {
            divisions: [4; 16],
            ..SizeRules::default()
        };
        // 1200 < 512 * 4: plain rounding
        assert_eq!(r.round(1200), 1536);
        // 5 MiB + 1 with 4 divisions of [4 MiB, 8 MiB): 6 MiB
        assert_eq!(r.round((5 << 20) + 1), 6 << 20);
    }

    #[test]
    fn split_rules_by_pool() {
        let r = SizeRules::default();
        // small pool: any remainder of 512 bytes
        assert!(r.splits(2 << 20, 512));
        assert!(!r.splits(1024, 1024));
        // large pool: remainder must exceed 1 MiB
        assert!(!r.splits(5 << 20, 4 << 20));
        assert!(r.splits((5 << 20) + 512, 4 << 20));
        // max_split_size: large blocks are never split
        let capped = SizeRules {
            max_split_size: Some(200 << 20),
            ..r
        };
        assert!(!capped.splits(400 << 20, 200 << 20));
        // expandable segments split any remainder >= 512
        let exp = SizeRules {
            expandable_segments: true,
            ..r
        };
        assert!(exp.splits((4 << 20) + 512, 4 << 20));
    }
}

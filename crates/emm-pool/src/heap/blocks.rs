//! The arena's blocks by address: hashed by where each starts and by where each
//! ends, so a block's neighbours are found in constant time.
//!
//! Every segment's address range is tiled by its blocks (live, free, pending,
//! retired, gaps; see `BlockHeap::check`), so the block after one starts at its end and
//! the block before it ends at its start: a free coalesces with both neighbours
//! through two hash probes, and a segment's blocks are walked in address order
//! from its base. An ordered map of every block (a B-tree, before) made each of
//! the five to nine block lookups of an allocate+free pair a tree search, the
//! larger part of the pool's time on a thread-cache miss (`perf` on the recorded
//! GPT-2 trace replayed through PyTorch's hooks).

use emm_sys::CUdeviceptr;

use super::Block;
use crate::fasthash::FastMap;

/// The blocks of every segment, by start and by end address.
#[derive(Default)]
pub(crate) struct BlockMap {
    by_start: FastMap<CUdeviceptr, Block>,
    /// The start of the block ending at each address.
    by_end: FastMap<CUdeviceptr, CUdeviceptr>,
}

impl BlockMap {
    /// The block starting at `addr`.
    pub fn get(&self, addr: &CUdeviceptr) -> Option<&Block> {
        self.by_start.get(addr)
    }

    /// Sets the state of the block starting at `addr`; false when there is none.
    /// (Its size changes only through [`BlockMap::insert`], which keeps the end
    /// index.)
    pub fn set_state(&mut self, addr: CUdeviceptr, state: super::State) -> bool {
        match self.by_start.get_mut(&addr) {
            Some(b) => {
                b.state = state;
                true
            }
            None => false,
        }
    }

    /// Gives the block starting at `addr` a new size and state, in place (its
    /// segment stays); the block as it is now, or `None` when there is none.
    pub fn reshape(
        &mut self,
        addr: CUdeviceptr,
        size: usize,
        state: super::State,
    ) -> Option<Block> {
        let b = self.by_start.get_mut(&addr)?;
        let old = b.size;
        b.size = size;
        b.state = state;
        let now = *b;
        self.forget_end(addr, old);
        self.by_end.insert(addr + size as u64, addr);
        Some(now)
    }

    /// Puts `block` at `addr`, replacing the block that started there (returned).
    pub fn insert(&mut self, addr: CUdeviceptr, block: Block) -> Option<Block> {
        let old = self.by_start.insert(addr, block);
        if let Some(o) = old {
            self.forget_end(addr, o.size);
        }
        self.by_end.insert(addr + block.size as u64, addr);
        old
    }

    /// Takes out the block starting at `addr`.
    pub fn remove(&mut self, addr: &CUdeviceptr) -> Option<Block> {
        let old = self.by_start.remove(addr)?;
        self.forget_end(*addr, old.size);
        Some(old)
    }

    /// Drops the end index of the block of `size` bytes at `addr`, unless another
    /// block ending there has taken the index since.
    fn forget_end(&mut self, addr: CUdeviceptr, size: usize) {
        let end = addr + size as u64;
        if self.by_end.get(&end) == Some(&addr) {
            self.by_end.remove(&end);
        }
    }

    /// The block ending at `addr` (the block before one starting there, when both
    /// are of one segment), with its start.
    pub fn ending_at(&self, addr: CUdeviceptr) -> Option<(CUdeviceptr, &Block)> {
        let start = *self.by_end.get(&addr)?;
        self.by_start
            .get(&start)
            .filter(|b| start + b.size as u64 == addr)
            .map(|b| (start, b))
    }

    /// The blocks from the one starting at `from`, each starting where the one
    /// before ends, while they start below `to`: a segment's blocks in address
    /// order when `from` is its base. Stops early where no block starts (which
    /// `BlockHeap::check` reports as a hole in the tiling).
    pub fn walk(
        &self,
        from: CUdeviceptr,
        to: CUdeviceptr,
    ) -> impl Iterator<Item = (CUdeviceptr, &Block)> + '_ {
        let mut at = from;
        std::iter::from_fn(move || {
            if at >= to {
                return None;
            }
            let b = self.by_start.get(&at)?;
            let a = at;
            // A block of no size would repeat forever: end the walk there.
            at = if b.size == 0 { to } else { a + b.size as u64 };
            Some((a, b))
        })
    }

    /// Every block, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&CUdeviceptr, &Block)> + '_ {
        self.by_start.iter()
    }

    /// Every block, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &Block> + '_ {
        self.by_start.values()
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Checks that the end index names each block once, at its end; returns
    /// what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.by_end.len() != self.by_start.len() {
            return Err(format!(
                "{} blocks, {} indexed by their end",
                self.by_start.len(),
                self.by_end.len()
            ));
        }
        for (&a, b) in &self.by_start {
            let end = a + b.size as u64;
            if self.by_end.get(&end) != Some(&a) {
                return Err(format!(
                    "block {a:#x} ({} bytes) not indexed by its end {end:#x}",
                    b.size
                ));
            }
        }
        Ok(())
    }

    /// Forgets every block.
    pub fn clear(&mut self) {
        self.by_start.clear();
        self.by_end.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::State;
    use super::*;

    fn block(size: usize, state: State) -> Block {
        Block::new(size, 0x1000, state, crate::kind::Kind::Large)
    }

    #[test]
    fn neighbours_and_walks_follow_the_tiling() {
        let mut m = BlockMap::default();
        m.insert(0x1000, block(0x100, State::Live));
        m.insert(0x1100, block(0x200, State::Free(7)));
        m.insert(0x1300, block(0x100, State::Gap));
        assert_eq!(m.ending_at(0x1100).map(|(a, _)| a), Some(0x1000));
        assert_eq!(m.ending_at(0x1300).map(|(a, _)| a), Some(0x1100));
        assert!(
            m.ending_at(0x1200).is_none(),
            "no block ends inside another"
        );
        let walked: Vec<u64> = m.walk(0x1000, 0x1400).map(|(a, _)| a).collect();
        assert_eq!(walked, [0x1000, 0x1100, 0x1300]);
        let part: Vec<u64> = m.walk(0x1000, 0x1300).map(|(a, _)| a).collect();
        assert_eq!(part, [0x1000, 0x1100], "stops at the bound");
        // Splitting the free block: the first part takes its entry.
        assert!(m.reshape(0x1100, 0x80, State::Live).is_some());
        assert!(m.reshape(0x1101, 0x80, State::Live).is_none());
        m.insert(0x1180, block(0x180, State::Free(7)));
        assert_eq!(m.ending_at(0x1180).map(|(a, _)| a), Some(0x1100));
        assert_eq!(m.ending_at(0x1300).map(|(a, _)| a), Some(0x1180));
        // Merging it back: the removed block's end index goes with it.
        m.remove(&0x1180);
        assert!(m.insert(0x1100, block(0x200, State::Free(7))).is_some());
        assert!(m.ending_at(0x1180).is_none());
        assert_eq!(m.ending_at(0x1300).map(|(a, _)| a), Some(0x1100));
        assert_eq!(m.len(), 3);
        m.check().unwrap();
        assert!(m.set_state(0x1000, State::Free(7)));
        assert!(!m.set_state(0x1001, State::Free(7)));
        assert_eq!(m.get(&0x1000).map(|b| b.state), Some(State::Free(7)));
    }

    #[test]
    fn a_walk_stops_at_a_hole() {
        let mut m = BlockMap::default();
        m.insert(0x1000, block(0x100, State::Live));
        m.insert(0x1200, block(0x100, State::Live));
        assert_eq!(m.walk(0x1000, 0x1300).count(), 1);
        m.clear();
        assert_eq!(m.walk(0x1000, 0x1300).count(), 0);
        assert!(m.ending_at(0x1100).is_none());
    }
}

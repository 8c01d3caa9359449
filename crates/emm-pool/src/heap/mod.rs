//! The block heap: the blocks tiling a pool's segments, found by address, and its
//! free blocks, found by stream, kind and size. Best fit splits a free block;
//! freeing coalesces a block with its free neighbours of the same segment and
//! stream. The caching pool's arena (`arena/`) and the graph pools (`graph.rs`)
//! both keep their blocks here; what a segment is, where its memory comes from
//! and which free block a request should take are theirs.
//!
//! Every change goes through a method that keeps the two indexes in step: a
//! block is in the free set of `(stream, kind)` exactly when its state is
//! `Free(stream)` and its kind is `kind` ([`BlockHeap::check`]).

use emm_sys::CUdeviceptr;

use crate::fasthash::FastMap;
use crate::kind::Kind;
use crate::stream_key::StreamKey;

mod blocks;
mod free_set;

pub(crate) use blocks::BlockMap;

/// Where a block stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Handed out.
    Live,
    /// Free, reusable on the stream it was freed on (or by any stream: `SETTLED`).
    Free(StreamKey),
    /// Freed on a stream, waiting for an event before another stream may use it.
    Pending,
    /// Address space of the expandable segment whose memory growth moved elsewhere
    /// (see `arena/retire.rs`): still mapped until the work queued on it is done.
    Retired,
    /// Address space of the expandable segment with no memory behind it (a
    /// retired range, unmapped): growth may map memory there again.
    Gap,
}

/// One block of a segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub size: usize,
    /// The base of the segment it lies in.
    pub segment: CUdeviceptr,
    pub state: State,
    /// For a free block: the heap's free clock when it became free (joined
    /// blocks take the latest; see `arena/replace.rs`). Meaningless in other
    /// states.
    pub freed: u64,
    /// Its segment's kind: which free sets it goes to.
    pub kind: Kind,
}

impl Block {
    /// A block of `segment` (of `kind`) in `state`, not known to be idle.
    pub fn new(size: usize, segment: CUdeviceptr, state: State, kind: Kind) -> Block {
        Block {
            size,
            segment,
            state,
            freed: u64::MAX,
            kind,
        }
    }
}

/// Free blocks of one stream and kind, as `(size, address)`: the best fit for
/// `n` bytes is the first at or after `(n, 0)`.
pub(crate) use free_set::FreeSet;

/// The blocks of a pool and its free sets; see the module documentation.
#[derive(Default)]
pub(crate) struct BlockHeap {
    blocks: BlockMap,
    free: FastMap<(StreamKey, Kind), FreeSet>,
    /// Counts the blocks made free, to order frees against events.
    clock: u64,
}

impl BlockHeap {
    /// Every block, by address (to read: changes go through the heap).
    pub fn blocks(&self) -> &BlockMap {
        &self.blocks
    }

    /// The block starting at `addr`.
    pub fn get(&self, addr: CUdeviceptr) -> Option<&Block> {
        self.blocks.get(&addr)
    }

    /// The free clock: how many blocks were made free so far.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Makes `size` bytes at `addr` of `segment` (of `kind`) a free block of
    /// `stream`, coalesced with a free neighbour of the same stream and segment on
    /// each side, and of stream `also` when given (those become `stream`'s: safe
    /// for blocks no queued work uses, the settled ones, since `stream`'s own
    /// order then covers the joined block); returns the joined block's address
    /// and size. A block already at `addr` (the live block being freed) is
    /// replaced.
    pub fn insert_free(
        &mut self,
        addr: CUdeviceptr,
        size: usize,
        segment: CUdeviceptr,
        stream: StreamKey,
        kind: Kind,
        also: Option<StreamKey>,
    ) -> (CUdeviceptr, usize) {
        let joins = |b: &Block| {
            b.segment == segment
                && (b.state == State::Free(stream)
                    || also.is_some_and(|s| b.state == State::Free(s)))
        };
        let (mut addr, mut size) = (addr, size);
        self.remove(addr);
        // (`ending_at` gives only a block that ends exactly at `addr`.)
        if let Some((paddr, &p)) = self.blocks.ending_at(addr) {
            if joins(&p) {
                self.remove(paddr);
                addr = paddr;
                size += p.size;
            }
        }
        let next = addr + size as u64;
        if let Some(&n) = self.blocks.get(&next) {
            if joins(&n) {
                self.remove(next);
                size += n.size;
            }
        }
        self.clock += 1;
        self.insert_new(
            addr,
            Block {
                size,
                segment,
                state: State::Free(stream),
                freed: self.clock,
                kind,
            },
        );
        (addr, size)
    }

    /// Puts `block` at `addr` as it is (no coalescing), replacing the block that
    /// started there; a free block joins its free set. A block of no size is not
    /// put, and nothing changes.
    pub fn put(&mut self, addr: CUdeviceptr, block: Block) {
        if block.size == 0 {
            return;
        }
        self.remove(addr);
        self.insert_new(addr, block);
    }

    /// Puts `block` at `addr`, where no block starts (a free one joins its free
    /// set).
    fn insert_new(&mut self, addr: CUdeviceptr, block: Block) {
        self.list(addr, &block);
        self.blocks.insert(addr, block);
    }

    /// Adds a free block to its free set (not to the block map).
    fn list(&mut self, addr: CUdeviceptr, b: &Block) {
        if let State::Free(s) = b.state {
            self.free
                .entry((s, b.kind))
                .or_default()
                .insert((b.size, addr));
        }
    }

    /// Takes out the block starting at `addr` (a free one leaves its free set).
    pub fn remove(&mut self, addr: CUdeviceptr) -> Option<Block> {
        let b = self.blocks.remove(&addr)?;
        self.unlist(addr, &b);
        Some(b)
    }

    /// Takes a free block out of its free set (not out of the block map).
    fn unlist(&mut self, addr: CUdeviceptr, b: &Block) {
        if let State::Free(s) = b.state {
            if let Some(set) = self.free.get_mut(&(s, b.kind)) {
                set.remove(&(b.size, addr));
            }
        }
    }

    /// The free blocks of `stream` and `kind` of at least `size` bytes, smallest
    /// first (then lowest address), as `(size, address)`.
    pub fn fits(
        &self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
    ) -> impl Iterator<Item = (usize, CUdeviceptr)> + '_ {
        self.free
            .get(&(stream, kind))
            .into_iter()
            .flat_map(move |set| set.at_least(size))
    }

    /// Hands out `size` bytes from the start of the free block at `addr` (at
    /// least `size` bytes long), which becomes live; the rest stays a free block
    /// of the same stream, free since the block was. Returns the block's segment,
    /// or `None` when `addr` starts no free block that large (or `size` is 0).
    pub fn take(&mut self, addr: CUdeviceptr, size: usize) -> Option<CUdeviceptr> {
        let b = *self.blocks.get(&addr)?;
        if !matches!(b.state, State::Free(_)) || b.size < size || size == 0 {
            return None;
        }
        self.unlist(addr, &b);
        // The free block's entry becomes the live block's, in place.
        self.blocks.reshape(addr, size, State::Live);
        if b.size > size {
            // (No block starts inside the free block: the rest is new.)
            self.insert_new(
                addr + size as u64,
                Block {
                    size: b.size - size,
                    ..b
                },
            );
        }
        Some(b.segment)
    }

    /// Gives every free block of `stream` and `kind` the state `state` (a parked
    /// group's `Pending`), out of its free set; their addresses.
    pub fn mark_all(&mut self, stream: StreamKey, kind: Kind, state: State) -> Vec<CUdeviceptr> {
        let Some(set) = self.free.get_mut(&(stream, kind)) else {
            return Vec::new();
        };
        let taken = std::mem::take(set);
        let mut addrs = Vec::with_capacity(taken.len());
        for (_, a) in taken {
            // Out of its set already: only the block map, and a new state's set.
            self.blocks.set_state(a, state);
            if let Some(&b) = self.blocks.get(&a) {
                self.list(a, &b);
            }
            addrs.push(a);
        }
        addrs
    }

    /// Makes every free block of `stream` and `kind` a free block of `to`
    /// (coalesced there); how many moved. Nothing moves when `to` is `stream`.
    pub fn move_free(&mut self, stream: StreamKey, kind: Kind, to: StreamKey) -> usize {
        if to == stream {
            return 0;
        }
        let Some(set) = self.free.remove(&(stream, kind)) else {
            return 0;
        };
        let mut n = 0;
        for (size, a) in set {
            if let Some(b) = self.blocks.remove(&a) {
                self.insert_free(a, size, b.segment, to, kind, None);
                n += 1;
            }
        }
        n
    }

    /// Every free set that holds a block, with its stream and kind.
    pub fn free_sets(&self) -> impl Iterator<Item = (StreamKey, Kind, &FreeSet)> + '_ {
        self.free
            .iter()
            .filter(|(_, set)| !set.is_empty())
            .map(|(&(s, k), set)| (s, k, set))
    }

    /// Free sets kept (the empty ones too: what a scan over them walks).
    pub fn free_set_count(&self) -> usize {
        self.free.len()
    }

    /// Whether every free set kept, the empty ones too, is `stream`'s.
    pub fn only_sets_of(&self, stream: StreamKey) -> bool {
        self.free.keys().all(|&(s, _)| s == stream)
    }

    /// Drops the empty free sets of streams (the settled ones stay).
    pub fn prune_empty_sets(&mut self, keep: StreamKey) {
        self.free
            .retain(|(s, _), set| *s == keep || !set.is_empty());
    }

    /// The largest free block, any stream.
    pub fn largest_free(&self) -> usize {
        self.free
            .values()
            .filter_map(|s| s.last().map(|(sz, _)| sz))
            .max()
            .unwrap_or(0)
    }

    /// Forgets every block.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.free.clear();
    }

    /// Checks that the block map indexes each block by its end and that the free
    /// sets hold exactly the free blocks; returns what is wrong.
    pub fn check(&self) -> Result<(), String> {
        self.blocks.check()?;
        let mut listed = 0;
        for (&(s, kind), set) in &self.free {
            for &(size, a) in set.iter() {
                match self.blocks.get(&a) {
                    Some(b) if b.size == size && b.state == State::Free(s) && b.kind == kind => {}
                    other => {
                        return Err(format!(
                            "free set ({s:#x}, {kind:?}) lists {a:#x} ({size} bytes); the block there is {other:?}"
                        ))
                    }
                }
            }
            listed += set.len();
        }
        let free = self
            .blocks
            .values()
            .filter(|b| matches!(b.state, State::Free(_)))
            .count();
        if free != listed {
            return Err(format!("{free} free blocks, {listed} of them in free sets"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream_key::SETTLED;

    const SEG: CUdeviceptr = 0x10_0000;

    fn heap_with_segment(size: usize, stream: StreamKey) -> BlockHeap {
        let mut h = BlockHeap::default();
        h.insert_free(SEG, size, SEG, stream, Kind::Large, None);
        h
    }

    #[test]
    fn take_splits_and_free_coalesces_back_to_one_block() {
        let mut h = heap_with_segment(4096, 7);
        let (sz, a) = h.fits(1024, Kind::Large, 7).next().unwrap();
        assert_eq!((sz, a), (4096, SEG));
        assert_eq!(h.take(a, 1024), Some(SEG));
        let (_, b) = h.fits(1024, Kind::Large, 7).next().unwrap();
        assert_eq!(b, SEG + 1024);
        assert_eq!(h.take(b, 1024), Some(SEG));
        h.check().unwrap();
        assert_eq!(h.largest_free(), 2048);
        // Freeing the first, then the second: one free block of the whole segment.
        h.insert_free(SEG, 1024, SEG, 7, Kind::Large, None);
        h.insert_free(SEG + 1024, 1024, SEG, 7, Kind::Large, None);
        h.check().unwrap();
        assert_eq!(h.blocks().len(), 1);
        assert_eq!(h.get(SEG).map(|b| b.size), Some(4096));
    }

    #[test]
    fn blocks_of_other_streams_or_segments_stay_apart() {
        let mut h = heap_with_segment(4096, 7);
        h.take(SEG, 4096).unwrap();
        // Freed in halves on two streams: no join across streams.
        h.put(SEG, Block::new(2048, SEG, State::Live, Kind::Large));
        h.put(SEG + 2048, Block::new(2048, SEG, State::Live, Kind::Large));
        h.insert_free(SEG, 2048, SEG, 7, Kind::Large, None);
        h.insert_free(SEG + 2048, 2048, SEG, 8, Kind::Large, None);
        assert_eq!(h.blocks().len(), 2);
        assert!(h.fits(4096, Kind::Large, 7).next().is_none());
        // Settling stream 8's blocks on stream 7 joins them.
        assert_eq!(h.move_free(8, Kind::Large, 7), 1);
        assert_eq!(h.blocks().len(), 1);
        // A neighbour of another segment is never joined.
        let other = SEG + 4096;
        h.insert_free(other, 4096, other, 7, Kind::Large, None);
        assert_eq!(h.blocks().len(), 2);
        h.check().unwrap();
    }

    #[test]
    fn a_free_joins_settled_neighbours_only_when_asked() {
        let mut h = heap_with_segment(3072, 7);
        h.take(SEG, 3072).unwrap();
        for i in 0..3u64 {
            h.put(
                SEG + i * 1024,
                Block::new(1024, SEG, State::Live, Kind::Large),
            );
        }
        h.insert_free(SEG, 1024, SEG, SETTLED, Kind::Large, None);
        h.insert_free(SEG + 2048, 1024, SEG, SETTLED, Kind::Large, None);
        // Freed on stream 7 between two settled blocks: apart, unless asked.
        h.insert_free(SEG + 1024, 1024, SEG, 7, Kind::Large, None);
        assert_eq!(h.blocks().len(), 3);
        h.put(SEG + 1024, Block::new(1024, SEG, State::Live, Kind::Large));
        let joined = h.insert_free(SEG + 1024, 1024, SEG, 7, Kind::Large, Some(SETTLED));
        assert_eq!(joined, (SEG, 3072));
        assert_eq!(h.get(SEG).map(|b| b.state), Some(State::Free(7)));
        assert!(h.fits(1, Kind::Large, SETTLED).next().is_none());
        h.check().unwrap();
    }

    #[test]
    fn states_move_blocks_in_and_out_of_free_sets() {
        let mut h = heap_with_segment(4096, 7);
        assert_eq!(h.mark_all(7, Kind::Large, State::Pending), vec![SEG]);
        assert!(h.fits(1, Kind::Large, 7).next().is_none());
        h.check().unwrap();
        h.put(SEG, Block::new(4096, SEG, State::Free(3), Kind::Large));
        assert_eq!(h.fits(1, Kind::Large, 3).next(), Some((4096, SEG)));
        h.check().unwrap();
        assert!(h.remove(SEG).is_some());
        assert!(h.fits(1, Kind::Large, 3).next().is_none());
        // A take of a block that is not free, or too small, takes nothing.
        h.put(SEG, Block::new(512, SEG, State::Live, Kind::Small));
        assert_eq!(h.take(SEG, 512), None);
        h.put(SEG, Block::new(512, SEG, State::Free(3), Kind::Small));
        assert_eq!(h.take(SEG, 1024), None);
        assert_eq!(
            h.take(SEG, 0),
            None,
            "a take of no bytes would lose the block"
        );
        assert_eq!(h.move_free(3, Kind::Small, 3), 0);
        h.check().unwrap();
    }
}

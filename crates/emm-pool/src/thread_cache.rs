//! One thread's cache of the blocks it freed on one stream: taken back by exact
//! rounded size without the pool's lock.
//!
//! Blocks are filed by size, so a lookup is one hash probe however many blocks the
//! cache holds (a linear scan made every miss cost a walk over all of them, which is
//! what kept the cache at 8 blocks). Within a size, the block freed last is taken
//! first. The block freed last of all waits in a slot in front of the map, so a
//! tensor freed and allocated again at once (the commonest pattern) touches no
//! map at all: that probe had made a same-stream allocate+free pair about half
//! again as slow on the host stand-in.

use emm_sys::CUdeviceptr;

use crate::fasthash::FastMap;
use crate::stream_key::StreamKey;

/// A cached block: what the allocation handed out for it needs again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub ptr: CUdeviceptr,
    /// Rounded size.
    pub size: usize,
    pub base: CUdeviceptr,
    pub base_size: usize,
    /// The pool's generation when the block was cached (a reset makes it stale).
    pub generation: usize,
}

/// Sizes a cache keeps lists for once it is emptied: more distinct sizes than this
/// (shapes that change every step) and the lists leave the map, so an idle cache
/// holds little memory of its own.
const KEPT_SIZES: usize = 256;

/// The most blocks a list may have room for to be kept as a spare when it leaves
/// the map: a spare holds no block, only its room.
const SPARE_ROOM: usize = 8;

/// The blocks one thread freed on one stream.
#[derive(Debug)]
pub(crate) struct StreamCache {
    pub stream: StreamKey,
    /// The block freed last, when it has not been taken or filed since.
    last: Option<Entry>,
    by_size: FastMap<usize, Vec<Entry>>,
    /// Empty lists that left the map, each with room for at most [`SPARE_ROOM`]
    /// blocks, at most [`KEPT_SIZES`] of them: a size filed anew takes one. With
    /// shapes that change every step, the lists of one step's sizes otherwise
    /// went to the heap at a drain and the next step's came from it: one free in
    /// thirty made a heap operation replaying DeepLabV3's recorded trace, one in
    /// a hundred since.
    spare: Vec<Vec<Entry>>,
    /// The sizes whose lists were empty when a block was filed there since the
    /// last drain (a size may appear more than once): what a drain visits. A
    /// drain over every list of the map visited up to [`KEPT_SIZES`] of them to
    /// return a few blocks, most of an allocation's time when its miss emptied
    /// the cache.
    filed: Vec<usize>,
    blocks: usize,
    bytes: usize,
}

impl StreamCache {
    pub fn new(stream: StreamKey) -> Self {
        StreamCache {
            stream,
            last: None,
            by_size: FastMap::default(),
            spare: Vec::new(),
            filed: Vec::new(),
            blocks: 0,
            bytes: 0,
        }
    }

    /// Blocks held (stale ones included).
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes held (stale blocks included).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The block of `size` bytes and generation `generation` freed last, if any.
    /// Blocks of an older generation stay until [`StreamCache::drain`].
    pub fn take(&mut self, size: usize, generation: usize) -> Option<Entry> {
        let e = match self.last {
            // Freed after every block in the map: the latest of its size.
            Some(e) if e.size == size && e.generation == generation => {
                self.last = None;
                e
            }
            _ => {
                let list = self.by_size.get_mut(&size)?;
                let i = list.iter().rposition(|e| e.generation == generation)?;
                list.remove(i)
            }
        };
        self.blocks -= 1;
        self.bytes -= e.size;
        Some(e)
    }

    /// Files a freed block.
    pub fn put(&mut self, e: Entry) {
        if let Some(prev) = self.last.replace(e) {
            let spare = &mut self.spare;
            let list = self
                .by_size
                .entry(prev.size)
                .or_insert_with(|| spare.pop().unwrap_or_default());
            if list.is_empty() {
                self.filed.push(prev.size);
            }
            list.push(prev);
            if self.filed.len() > 2 * KEPT_SIZES {
                // Filed, taken and filed again with no drain between: once per
                // size with blocks is enough.
                let by_size = &self.by_size;
                self.filed
                    .retain(|s| by_size.get(s).is_some_and(|l| !l.is_empty()));
                self.filed.sort_unstable();
                self.filed.dedup();
            }
        }
        self.blocks += 1;
        self.bytes += e.size;
    }

    /// Files a freed block, keeping a block larger than `largest` only in the
    /// slot for the block freed last: the block freed before this one, when
    /// larger than `largest`, is not filed but returned, for the arena. So a
    /// large tensor freed and made again at once is taken back without the
    /// pool's lock, and one that is not waits only until the stream's next
    /// call: this free, or an allocation that misses
    /// ([`StreamCache::take_large_last`]).
    pub fn put_bounded(&mut self, e: Entry, largest: usize) -> Option<Entry> {
        let evicted = self.take_large_last(largest);
        self.put(e);
        evicted
    }

    /// Takes the block freed last when it is larger than `largest` (see
    /// [`StreamCache::put_bounded`]).
    pub fn take_large_last(&mut self, largest: usize) -> Option<Entry> {
        if self.last.is_none_or(|e| e.size <= largest) {
            return None;
        }
        let e = self.last.take()?;
        self.blocks -= 1;
        self.bytes -= e.size;
        Some(e)
    }

    /// Hands every block to `f` and leaves the cache empty.
    pub fn drain(&mut self, mut f: impl FnMut(Entry)) {
        if let Some(e) = self.last.take() {
            f(e);
        }
        for size in self.filed.drain(..) {
            if let Some(list) = self.by_size.get_mut(&size) {
                for e in list.drain(..) {
                    f(e);
                }
            }
        }
        if self.by_size.len() > KEPT_SIZES {
            for (_, list) in self.by_size.drain() {
                if self.spare.len() < KEPT_SIZES && list.capacity() <= SPARE_ROOM {
                    self.spare.push(list);
                }
            }
            // The table keeps its room up to a few times the kept sizes (tens
            // of KiB), so the next steps' sizes do not grow it again.
            self.by_size.shrink_to(4 * KEPT_SIZES);
        }
        self.blocks = 0;
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ptr: u64, size: usize, generation: usize) -> Entry {
        Entry {
            ptr,
            size,
            base: ptr,
            base_size: size,
            generation,
        }
    }

    #[test]
    fn takes_the_exact_size_last_freed_first() {
        let mut c = StreamCache::new(7);
        c.put(entry(0x1000, 512, 0));
        c.put(entry(0x2000, 1024, 0));
        c.put(entry(0x3000, 512, 0));
        assert_eq!((c.blocks(), c.bytes()), (3, 2048));
        assert_eq!(c.take(512, 0).map(|e| e.ptr), Some(0x3000));
        assert_eq!(c.take(512, 0).map(|e| e.ptr), Some(0x1000));
        assert_eq!(c.take(512, 0), None, "no third block of 512");
        assert_eq!(c.take(1536, 0), None, "never a larger block");
        assert_eq!((c.blocks(), c.bytes()), (1, 1024));
    }

    #[test]
    fn a_block_larger_than_the_largest_waits_only_in_the_last_slot() {
        let mut c = StreamCache::new(7);
        let big = 4 << 20;
        assert_eq!(c.put_bounded(entry(0x1000, big, 0), 1 << 20), None);
        // Taken back at once: the same size, from the slot.
        assert_eq!(c.take(big, 0).map(|e| e.ptr), Some(0x1000));
        assert_eq!(c.put_bounded(entry(0x1000, big, 0), 1 << 20), None);
        // The next free sends it on; a small one is filed as usual.
        assert_eq!(
            c.put_bounded(entry(0x9000, 512, 0), 1 << 20).map(|e| e.ptr),
            Some(0x1000)
        );
        assert_eq!((c.blocks(), c.bytes()), (1, 512));
        assert_eq!(c.put_bounded(entry(0xa000, 1024, 0), 1 << 20), None);
        assert_eq!((c.blocks(), c.bytes()), (2, 1536));
        // A large block behind small ones: only it leaves.
        assert_eq!(c.put_bounded(entry(0x2000, big, 0), 1 << 20), None);
        assert_eq!(c.take_large_last(1 << 20).map(|e| e.ptr), Some(0x2000));
        assert_eq!(c.take_large_last(1 << 20), None);
        assert_eq!((c.blocks(), c.bytes()), (2, 1536));
        assert_eq!(c.take(512, 0).map(|e| e.ptr), Some(0x9000));
    }

    #[test]
    fn stale_blocks_are_never_taken_and_leave_at_drain() {
        let mut c = StreamCache::new(7);
        c.put(entry(0x1000, 512, 0));
        c.put(entry(0x2000, 512, 1));
        c.put(entry(0x3000, 512, 0));
        assert_eq!(c.take(512, 1).map(|e| e.ptr), Some(0x2000));
        assert_eq!(c.take(512, 1), None, "generation 0 is stale");
        let mut out = Vec::new();
        c.drain(|e| out.push(e.ptr));
        out.sort_unstable();
        assert_eq!(out, [0x1000, 0x3000]);
        assert_eq!((c.blocks(), c.bytes()), (0, 0));
        assert_eq!(c.take(512, 0), None);
    }

    #[test]
    fn a_drain_returns_every_block_however_often_sizes_were_filed_and_taken() {
        let mut c = StreamCache::new(7);
        // Sizes filed, emptied by takes and filed again, many times over, with
        // no drain between: the record of filed sizes stays bounded.
        for round in 0..(4 * KEPT_SIZES as u64) {
            let size = 512 * (1 + (round % 3) as usize);
            c.put(entry(0x1000 * (round + 1), size, 0));
            c.put(entry(0x1000 * (round + 1) + 0x800, 4096, 0));
            assert!(c.take(size, 0).is_some());
            assert!(
                c.filed.len() <= 2 * KEPT_SIZES + 1,
                "{} sizes recorded",
                c.filed.len()
            );
        }
        // Some blocks of each kind stay: a drain finds every one, once.
        c.put(entry(0x9000_0000, 512, 0));
        c.put(entry(0x9100_0000, 1536, 0));
        c.put(entry(0x9200_0000, 1024, 0));
        let held = c.blocks();
        let mut out = Vec::new();
        c.drain(|e| out.push(e.ptr));
        assert_eq!(out.len(), held);
        out.sort_unstable();
        out.dedup();
        assert_eq!(out.len(), held, "a block returned twice");
        assert_eq!((c.blocks(), c.bytes()), (0, 0));
        let mut again = 0;
        c.drain(|_| again += 1);
        assert_eq!(again, 0);
    }

    #[test]
    fn draining_many_sizes_drops_their_lists() {
        let mut c = StreamCache::new(7);
        for i in 0..(KEPT_SIZES as u64 + 10) {
            c.put(entry(0x1000 * (i + 1), 512 * (i as usize + 1), 0));
        }
        let mut n = 0;
        c.drain(|_| n += 1);
        assert_eq!(n, KEPT_SIZES + 10);
        assert!(c.by_size.is_empty(), "{} size lists kept", c.by_size.len());
        assert!(
            c.spare.len() <= KEPT_SIZES && c.spare.iter().all(|l| l.is_empty()),
            "{} spare lists, some holding blocks",
            c.spare.len()
        );
        let spares = c.spare.len();
        assert!(spares > 0, "no list kept for the next sizes");
        c.put(entry(0x1000, 512, 0));
        c.put(entry(0x2000, 1024, 0));
        assert_eq!(c.spare.len(), spares - 1, "a size filed anew takes a spare");
        assert_eq!(c.take(512, 0).map(|e| e.ptr), Some(0x1000));
        assert_eq!(c.take(1024, 0).map(|e| e.ptr), Some(0x2000));
    }
}

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
/// (shapes that change every step) and the lists go with the blocks, so an idle
/// cache holds little memory of its own.
const KEPT_SIZES: usize = 256;

/// The blocks one thread freed on one stream.
#[derive(Debug)]
pub(crate) struct StreamCache {
    pub stream: StreamKey,
    /// The block freed last, when it has not been taken or filed since.
    last: Option<Entry>,
    by_size: FastMap<usize, Vec<Entry>>,
    blocks: usize,
    bytes: usize,
}

impl StreamCache {
    pub fn new(stream: StreamKey) -> Self {
        StreamCache {
            stream,
            last: None,
            by_size: FastMap::default(),
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
            self.by_size.entry(prev.size).or_default().push(prev);
        }
        self.blocks += 1;
        self.bytes += e.size;
    }

    /// Hands every block to `f` and leaves the cache empty.
    pub fn drain(&mut self, mut f: impl FnMut(Entry)) {
        if let Some(e) = self.last.take() {
            f(e);
        }
        for list in self.by_size.values_mut() {
            for e in list.drain(..) {
                f(e);
            }
        }
        if self.by_size.len() > KEPT_SIZES {
            self.by_size = FastMap::default();
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
    fn draining_many_sizes_drops_their_lists() {
        let mut c = StreamCache::new(7);
        for i in 0..(KEPT_SIZES as u64 + 10) {
            c.put(entry(0x1000 * (i + 1), 512 * (i as usize + 1), 0));
        }
        let mut n = 0;
        c.drain(|_| n += 1);
        assert_eq!(n, KEPT_SIZES + 10);
        assert!(c.by_size.is_empty(), "{} size lists kept", c.by_size.len());
        c.put(entry(0x1000, 512, 0));
        assert_eq!(c.take(512, 0).map(|e| e.ptr), Some(0x1000));
    }
}

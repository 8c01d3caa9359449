//! The allocator's state and rules, after `DeviceCachingAllocator` in PyTorch's
//! `c10/cuda/CUDACachingAllocator.cpp`; each function names the one it follows.
//! Addresses are numbers in a model address space: nothing here is memory.

use std::collections::BTreeSet;

use super::conf::{TorchConf, NO_MAX_SPLIT};

mod inspect;

/// `kMinBlockSize`: every size is rounded to at least 512 bytes.
const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: the largest request of the small pool, 1 MiB.
const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: small requests are packed in 2 MiB segments (and the small
/// pool's expandable segments map 2 MiB pages).
const SMALL_BUFFER: u64 = 2 << 20;
/// `kMinLargeAlloc`: requests from 1 to 10 MiB may share a 20 MiB segment.
const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kLargeBuffer`: that segment, and the large pool's expandable page.
const LARGE_BUFFER: u64 = 20 << 20;
/// `kRoundLarge`: larger segments are rounded up to 2 MiB.
const ROUND_LARGE: u64 = 2 << 20;
/// The model's addresses stay below this: a block's end (an address plus a
/// size of at most 2^56 and a bit) then never wraps.
const ADDRESS_LIMIT: u64 = 1 << 62;

/// How the device is limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// A device of this many bytes: `cudaMalloc` and `cuMemCreate` fail past it.
    Device(u64),
    /// `setMemoryFraction`: PyTorch refuses a new segment whose size would take
    /// its reserved bytes past this (checked in `alloc_block` before any driver
    /// call; garbage collection, when configured, acts only under it).
    Fraction(u64),
}

#[derive(Clone, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    stream: u64,
    small: bool,
    allocated: bool,
    mapped: bool,
    prev: Option<usize>,
    next: Option<usize>,
    /// The expandable segment holding the block (index into `segments`).
    segment: Option<usize>,
    /// `gc_count_base`: the pool's free-block search count when it was cached.
    gc_base: u64,
}

/// `BlockPool`: free mapped blocks by (stream, size, address), unmapped ranges
/// of expandable segments by (stream, address).
#[derive(Default)]
struct Pool {
    blocks: BTreeSet<(u64, u64, u64, usize)>,
    unmapped: BTreeSet<(u64, u64, usize)>,
    get_free_blocks_call_count: u64,
}

/// One expandable segment's address range and page size.
struct Segment {
    base: u64,
    page: u64,
}

/// Counters, as `DeviceStats` keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `reserved_bytes` (`total_allocated_memory`).
    pub reserved: u64,
    /// Its peak.
    pub reserved_peak: u64,
    /// `allocated_bytes`: sizes of the blocks handed out (rounded).
    pub allocated: u64,
    /// Its peak.
    pub allocated_peak: u64,
    /// `num_device_alloc`: `cudaMalloc` calls and pages ranges mapped.
    pub device_allocs: u64,
    /// `num_device_free`: `cudaFree` calls and ranges unmapped.
    pub device_frees: u64,
    /// `num_alloc_retries`: allocations retried after freeing the cache.
    pub alloc_retries: u64,
    /// `num_ooms`: requests refused.
    pub ooms: u64,
    /// Allocations handed out.
    pub allocations: u64,
}

/// The allocator of one device.
pub struct State {
    conf: TorchConf,
    /// The device's memory (`totalGlobalMem`): sizes each expandable segment's
    /// address range (1 1/8 of it) and, unless a limit says less, bounds
    /// `cudaMalloc`.
    device_total: u64,
    limit: Option<Limit>,
    slab: Vec<Option<Block>>,
    free_slots: Vec<usize>,
    pools: [Pool; 2],
    segments: Vec<Segment>,
    next_address: u64,
    stats: Stats,
    /// A block entered a free pool since the last [`State::release_cached_blocks`]:
    /// until one does, another release would find nothing to free or unmap
    /// (what that one left is split or unmapped already) and is skipped. Not
    /// PyTorch's: its walk costs the same there, but a model replaying a
    /// trace of many failing requests would walk every free block each time.
    released_since_insert: bool,
    /// Releases that walked the free pools (for the tests).
    release_walks: u64,
    /// Where a write to a stale index lands (see [`State::bm`]).
    scratch: Block,
}

/// What a stale index reads (see [`State::b`]): a free, unlinked, empty block.
const PLACEHOLDER: Block = Block {
    ptr: 0,
    size: 0,
    stream: 0,
    small: false,
    allocated: false,
    mapped: true,
    prev: None,
    next: None,
    segment: None,
    gc_base: 0,
};

/// A request was refused: PyTorch's `OutOfMemoryError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The rounded request.
    pub size: u64,
    /// What `alloc_block` would have asked the driver for.
    pub alloc_size: u64,
}

impl State {
    /// A fresh allocator with `conf` on a device of `device_total` bytes.
    pub fn new(conf: TorchConf, device_total: u64, limit: Option<Limit>) -> State {
        State {
            conf,
            device_total,
            limit,
            slab: Vec::new(),
            free_slots: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            segments: Vec::new(),
            next_address: 1 << 40,
            stats: Stats::default(),
            released_since_insert: false,
            release_walks: 0,
            scratch: PLACEHOLDER,
        }
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Block `i`. Indices come from the pools and the blocks' links, which only
    /// name live blocks; were one stale (a bug here), a debug build stops and a
    /// release build reads a free placeholder rather than panic.
    fn b(&self, i: usize) -> &Block {
        match self.slab.get(i).and_then(Option::as_ref) {
            Some(b) => b,
            None => {
                debug_assert!(false, "block {i} is not live");
                &PLACEHOLDER
            }
        }
    }

    /// Block `i`, to change (see [`State::b`]).
    fn bm(&mut self, i: usize) -> &mut Block {
        if !matches!(self.slab.get(i), Some(Some(_))) {
            debug_assert!(false, "block {i} is not live");
            self.scratch = PLACEHOLDER;
            return &mut self.scratch;
        }
        match &mut self.slab[i] {
            Some(b) => b,
            None => &mut self.scratch,
        }
    }

    fn new_block(&mut self, b: Block) -> usize {
        match self.free_slots.pop() {
            Some(i) if i < self.slab.len() => {
                self.slab[i] = Some(b);
                i
            }
            Some(_) => {
                self.slab.push(Some(b));
                self.slab.len() - 1
            }
            None => {
                self.slab.push(Some(b));
                self.slab.len() - 1
            }
        }
    }

    fn delete(&mut self, i: usize) {
        if let Some(slot @ Some(_)) = self.slab.get_mut(i) {
            *slot = None;
            self.free_slots.push(i);
        }
    }

    fn pool_of(&self, i: usize) -> usize {
        usize::from(!self.b(i).small)
    }

    fn key(&self, i: usize) -> (u64, u64, u64, usize) {
        let b = self.b(i);
        (b.stream, b.size, b.ptr, i)
    }

    fn ukey(&self, i: usize) -> (u64, u64, usize) {
        let b = self.b(i);
        (b.stream, b.ptr, i)
    }

    /// `BlockPool::insert_into_blocks`.
    fn insert_free(&mut self, i: usize) {
        let p = self.pool_of(i);
        let count = self.pools[p].get_free_blocks_call_count;
        self.bm(i).gc_base = count;
        let k = self.key(i);
        self.pools[p].blocks.insert(k);
        self.released_since_insert = false;
    }

    fn remove_free(&mut self, i: usize) {
        let (p, k) = (self.pool_of(i), self.key(i));
        self.pools[p].blocks.remove(&k);
    }

    fn grow(&mut self, bytes: u64) {
        self.stats.reserved += bytes;
        self.stats.reserved_peak = self.stats.reserved_peak.max(self.stats.reserved);
    }

    /// Whether the device has `bytes` more for the driver.
    fn device_has(&self, bytes: u64) -> bool {
        let cap = match self.limit {
            Some(Limit::Device(cap)) => cap,
            _ => self.device_total,
        };
        // (Checked: with a cap of `u64::MAX` a saturating sum would pass at
        // the overflow.)
        self.stats
            .reserved
            .checked_add(bytes)
            .is_some_and(|total| total <= cap)
    }

    /// `round_size`.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.conf.divisions_for(size);
        // (Wrapping, as `kMinBlockSize * divisions` does in PyTorch: past
        // 2^55 divisions the product is 0 or small, and every size takes the
        // division step, which is then the next power of two.)
        if divisions > 1 && size > MIN_BLOCK.wrapping_mul(divisions) {
            roundup_power2_next_division(size, divisions)
        } else {
            size.div_ceil(MIN_BLOCK) * MIN_BLOCK
        }
    }

    /// `get_allocation_size`.
    fn allocation_size(size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        }
    }

    /// `DeviceCachingAllocator::malloc`: the block handed out (its index and
    /// rounded size), or the refusal.
    pub fn malloc(&mut self, orig: u64, stream: u64) -> Result<(usize, u64), Refused> {
        // Past any device (and past where rounding would overflow): refused.
        if orig > 1 << 56 {
            self.stats.ooms += 1;
            return Err(Refused {
                size: orig,
                alloc_size: orig,
            });
        }
        let size = self.round_size(orig);
        let p = usize::from(size > SMALL_SIZE);
        let alloc_size = Self::allocation_size(size);
        let mut found = self.get_free_block(p, stream, size);
        if found.is_none() {
            if matches!(self.limit, Some(Limit::Fraction(_)))
                && self.conf.garbage_collection_threshold > 0.0
            {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(p, stream, size, alloc_size, false);
            if found.is_none() && self.release_available_cached_blocks(p, stream, size) {
                found = self.alloc_block(p, stream, size, alloc_size, false);
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.alloc_block(p, stream, size, alloc_size, true);
            }
        }
        let Some(i) = found else {
            self.stats.ooms += 1;
            return Err(Refused { size, alloc_size });
        };
        let split = self.should_split(i, size);
        let i = self.alloc_found_block(i, size, split);
        Ok((i, size))
    }

    /// `get_free_block`: best fit on the stream, with the expandable and
    /// oversize rules.
    fn get_free_block(&mut self, p: usize, stream: u64, size: u64) -> Option<usize> {
        if matches!(self.limit, Some(Limit::Fraction(_)))
            && self.conf.garbage_collection_threshold > 0.0
        {
            self.pools[p].get_free_blocks_call_count += 1;
        }
        let mut it = *self.pools[p]
            .blocks
            .range((stream, size, 0, 0)..)
            .next()
            .filter(|k| k.0 == stream)?;
        if self.b(it.3).segment.is_some() {
            if self.conf.expandable_segments {
                // Best fit counts what an expandable block could grow to.
                let expandable_size = |s: &State, i: usize| {
                    let b = s.b(i);
                    b.size
                        + b.next
                            .filter(|&n| !s.b(n).mapped)
                            .map_or(0, |n| s.b(n).size)
                };
                let later = self.pools[p]
                    .blocks
                    .range((it.0, it.1, it.2, it.3 + 1)..)
                    .take_while(|k| k.0 == stream);
                for &n in later {
                    if !(self.b(it.3).segment.is_some()
                        && expandable_size(self, n.3) < expandable_size(self, it.3))
                    {
                        break;
                    }
                    it = n;
                }
            } else {
                it = *self.pools[p]
                    .blocks
                    .range((it.0, it.1, it.2, it.3 + 1)..)
                    .take_while(|k| k.0 == stream)
                    .find(|k| self.b(k.3).segment.is_none())?;
            }
        }
        let max_split = self.conf.max_split_size;
        let found = self.b(it.3).size;
        // Do not return an oversized block for a large request
        if size < max_split && found >= max_split {
            return None;
        }
        // Allow oversized block size to be rounded up but within a limit
        if size >= max_split && found >= size.saturating_add(self.conf.max_non_split_rounding) {
            return None;
        }
        self.pools[p].blocks.remove(&it);
        Some(it.3)
    }

    /// `alloc_block`: a new segment (`cudaMalloc`) or, with expandable segments,
    /// pages mapped into one.
    fn alloc_block(
        &mut self,
        p: usize,
        stream: u64,
        size: u64,
        alloc_size: u64,
        retry: bool,
    ) -> Option<usize> {
        if retry {
            self.stats.alloc_retries += 1;
        }
        if let Some(Limit::Fraction(allowed)) = self.limit {
            if self.stats.reserved.saturating_add(alloc_size) > allowed {
                return None;
            }
        }
        if self.conf.expandable_segments {
            return self.try_allocate_expandable_block(p, stream, size);
        }
        if !self.device_has(alloc_size) {
            return None;
        }
        let ptr = self.reserve_address(alloc_size)?;
        let i = self.new_block(Block {
            ptr,
            size: alloc_size,
            stream,
            small: p == 0,
            ..PLACEHOLDER
        });
        self.grow(alloc_size);
        self.stats.device_allocs += 1;
        Some(i)
    }

    /// Address space for a segment of `bytes`: the model's own addresses,
    /// never given back (PyTorch's come from the driver and are reused). `None`
    /// once they would pass [`ADDRESS_LIMIT`]: the request then fails as out of
    /// memory, as a process out of address space does, instead of addresses
    /// (and a block's end) wrapping past `u64::MAX` after very many segments on
    /// a very large device.
    fn reserve_address(&mut self, bytes: u64) -> Option<u64> {
        let at = self.next_address;
        let next = bytes
            .checked_next_multiple_of(ROUND_LARGE)
            .and_then(|span| at.checked_add(span))
            .filter(|&next| next <= ADDRESS_LIMIT)?;
        self.next_address = next;
        Some(at)
    }

    /// `should_split`.
    fn should_split(&self, i: usize, size: u64) -> bool {
        let b = self.b(i);
        let remaining = b.size.saturating_sub(size);
        if b.small || self.conf.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.conf.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `alloc_found_block`: splits off the remainder, marks the block handed out.
    fn alloc_found_block(&mut self, i: usize, size: u64, split: bool) -> usize {
        let i = if split {
            let rest = self.b(i).clone();
            let new = self.new_block(Block {
                size,
                allocated: false,
                next: Some(i),
                ..rest.clone()
            });
            if let Some(prev) = rest.prev {
                self.bm(prev).next = Some(new);
            }
            let r = self.bm(i);
            r.prev = Some(new);
            r.ptr += size;
            r.size -= size;
            self.insert_free(i);
            new
        } else {
            i
        };
        self.bm(i).allocated = true;
        let s = self.b(i).size;
        self.stats.allocated += s;
        self.stats.allocated_peak = self.stats.allocated_peak.max(self.stats.allocated);
        self.stats.allocations += 1;
        i
    }

    /// `free` (no other stream used the block) and `free_block`.
    pub fn free(&mut self, i: usize) {
        let s = self.b(i).size;
        self.stats.allocated = self.stats.allocated.saturating_sub(s);
        self.bm(i).allocated = false;
        let (prev, next) = (self.b(i).prev, self.b(i).next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_free(i);
    }

    /// `try_merge_blocks`: `dst` takes in its free neighbour `src` (same mapping).
    fn try_merge(&mut self, dst: usize, src: Option<usize>) -> u64 {
        let Some(src) = src else { return 0 };
        let (s, d) = (self.b(src), self.b(dst));
        if s.allocated || s.mapped != d.mapped {
            return 0;
        }
        let (src_prev, src_next, src_ptr, src_size, src_mapped) =
            (s.prev, s.next, s.ptr, s.size, s.mapped);
        let p = self.pool_of(src);
        if src_mapped {
            let k = self.key(src);
            self.pools[p].blocks.remove(&k);
        } else {
            let k = self.ukey(src);
            self.pools[p].unmapped.remove(&k);
        }
        if self.b(dst).prev == Some(src) {
            let d = self.bm(dst);
            d.ptr = src_ptr;
            d.prev = src_prev;
            if let Some(pp) = src_prev {
                self.bm(pp).next = Some(dst);
            }
        } else {
            self.bm(dst).next = src_next;
            if let Some(nn) = src_next {
                self.bm(nn).prev = Some(dst);
            }
        }
        self.bm(dst).size += src_size;
        self.delete(src);
        src_size
    }

    /// `find_expandable_block`: the lowest address of the stream's expandable
    /// segments with room for `size` in free and unmapped blocks, or a new
    /// segment.
    fn find_expandable_block(&mut self, p: usize, stream: u64, size: u64) -> Option<usize> {
        let allocatable = |s: &State, i: Option<usize>| i.is_some_and(|i| !s.b(i).allocated);
        let has_room = |s: &State, mut c: Option<usize>| {
            let mut bytes = 0;
            while bytes < size && allocatable(s, c) {
                let i = c.unwrap_or_default();
                bytes += s.b(i).size;
                c = s.b(i).next;
            }
            bytes >= size
        };
        let unmapped = self.pools[p]
            .unmapped
            .range((stream, 0, 0)..)
            .take_while(|k| k.0 == stream);
        for &(_, _, i) in unmapped {
            let mut c = i;
            if let Some(prev) = self.b(i).prev.filter(|&pv| allocatable(self, Some(pv))) {
                c = prev;
            }
            if has_room(self, Some(c)) {
                return Some(c);
            }
        }
        let page = if p == 0 { SMALL_BUFFER } else { LARGE_BUFFER };
        // Address space for 1 1/8 of the device's memory.
        let span = self
            .device_total
            .min(1 << 56)
            .saturating_add(self.device_total.min(1 << 56) / 8)
            .div_ceil(page)
            * page;
        let base = self.reserve_address(span)?;
        self.segments.push(Segment { base, page });
        let i = self.new_block(Block {
            ptr: base,
            size: span,
            stream,
            small: p == 0,
            mapped: false,
            segment: Some(self.segments.len() - 1),
            ..PLACEHOLDER
        });
        let k = self.ukey(i);
        self.pools[p].unmapped.insert(k);
        Some(i)
    }

    /// `map_block`: maps the pages under the first `size` bytes of the unmapped
    /// block `i` (all or nothing, as `ExpandableSegment::map`).
    fn map_block(&mut self, i: usize, size: u64) -> bool {
        let b = self.b(i).clone();
        let Some(seg) = b.segment.and_then(|g| self.segments.get(g)) else {
            return false;
        };
        let (base, page) = (seg.base, seg.page);
        let begin = (b.ptr - base) / page;
        let end = (b.ptr + size - base).div_ceil(page);
        if begin == end {
            return false;
        }
        let mapped = (end - begin) * page;
        if !self.device_has(mapped) {
            return false;
        }
        let p = self.pool_of(i);
        let k = self.ukey(i);
        self.pools[p].unmapped.remove(&k);
        self.bm(i).mapped = true;
        if mapped < b.size {
            let rest = self.new_block(Block {
                ptr: b.ptr + mapped,
                size: b.size - mapped,
                mapped: false,
                allocated: false,
                prev: Some(i),
                next: b.next,
                ..b.clone()
            });
            if let Some(n) = b.next {
                self.bm(n).prev = Some(rest);
            }
            self.bm(i).next = Some(rest);
            let rk = self.ukey(rest);
            self.pools[p].unmapped.insert(rk);
            self.bm(i).size = mapped;
        }
        let (prev, _) = (self.b(i).prev, ());
        self.try_merge(i, prev);
        let next = self.b(i).next;
        self.try_merge(i, next);
        self.insert_free(i);
        self.grow(mapped);
        self.stats.device_allocs += 1;
        true
    }

    /// `try_allocate_expandable_block`.
    fn try_allocate_expandable_block(&mut self, p: usize, stream: u64, size: u64) -> Option<usize> {
        let mut c = self.find_expandable_block(p, stream, size)?;
        if !self.b(c).mapped {
            let n = self.b(c).size.min(size);
            if !self.map_block(c, n) {
                return None;
            }
        }
        while self.b(c).size < size {
            let remaining = size - self.b(c).size;
            let next = self.b(c).next?;
            let n = remaining.min(self.b(next).size);
            if !self.map_block(next, n) {
                return None;
            }
            c = next;
        }
        self.remove_free(c);
        Some(c)
    }

    /// `release_cached_blocks` (`emptyCache`, and the last retry of `malloc`):
    /// every unsplit cached segment freed, every whole free page unmapped.
    pub fn release_cached_blocks(&mut self) {
        if self.released_since_insert {
            return;
        }
        self.release_blocks(1);
        self.release_blocks(0);
        self.released_since_insert = true;
        self.release_walks += 1;
    }

    /// `release_blocks`.
    fn release_blocks(&mut self, p: usize) {
        let all: Vec<_> = self.pools[p].blocks.iter().copied().collect();
        let mut to_unmap = Vec::new();
        for (_, _, _, i) in all {
            let b = self.b(i);
            if b.segment.is_some() {
                to_unmap.push(i);
            } else if b.prev.is_none() && b.next.is_none() {
                self.release_block(i);
            }
        }
        for i in to_unmap {
            if self.slab[i].is_none() {
                continue;
            }
            self.unmap_block(i);
            let b = self.b(i);
            if b.prev.is_none() && b.next.is_none() && !b.mapped {
                // `release_expandable_segment`: the whole range is unmapped.
                let k = self.ukey(i);
                self.pools[p].unmapped.remove(&k);
                self.delete(i);
            }
        }
    }

    /// `release_block`: `cudaFree` of a whole cached segment.
    fn release_block(&mut self, i: usize) {
        let s = self.b(i).size;
        self.remove_free(i);
        self.stats.reserved = self.stats.reserved.saturating_sub(s);
        self.stats.device_frees += 1;
        self.delete(i);
    }

    /// `unmap_block`: unmaps the whole pages inside the free block `i`.
    fn unmap_block(&mut self, i: usize) {
        let b = self.b(i).clone();
        let Some(seg) = b.segment.and_then(|g| self.segments.get(g)) else {
            return;
        };
        let (base, page) = (seg.base, seg.page);
        let begin = (b.ptr - base).div_ceil(page);
        let end = (b.ptr + b.size - base) / page;
        if begin >= end {
            return;
        }
        self.remove_free(i);
        let (ustart, usize_) = (base + begin * page, (end - begin) * page);
        let before = ustart - b.ptr;
        if before > 0 {
            let bf = self.new_block(Block {
                size: before,
                prev: b.prev,
                next: Some(i),
                ..b.clone()
            });
            if let Some(pv) = b.prev {
                self.bm(pv).next = Some(bf);
            }
            self.bm(i).prev = Some(bf);
            self.insert_free(bf);
        }
        let after = b.size - before - usize_;
        if after > 0 {
            let next = self.b(i).next;
            let af = self.new_block(Block {
                ptr: ustart + usize_,
                size: after,
                prev: Some(i),
                next,
                ..b.clone()
            });
            if let Some(nn) = next {
                self.bm(nn).prev = Some(af);
            }
            self.bm(i).next = Some(af);
            self.insert_free(af);
        }
        {
            let m = self.bm(i);
            m.ptr = ustart;
            m.size = usize_;
            m.mapped = false;
        }
        let prev = self.b(i).prev;
        self.try_merge(i, prev);
        let next = self.b(i).next;
        self.try_merge(i, next);
        let p = self.pool_of(i);
        let k = self.ukey(i);
        self.pools[p].unmapped.insert(k);
        self.stats.reserved = self.stats.reserved.saturating_sub(usize_);
        self.stats.device_frees += 1;
    }

    /// `release_available_cached_blocks`: under `max_split_size`, frees oversize
    /// cached segments of the stream, the smallest that is enough, else the
    /// largest first until enough.
    fn release_available_cached_blocks(&mut self, p: usize, stream: u64, size: u64) -> bool {
        let max_split = self.conf.max_split_size;
        if max_split == NO_MAX_SPLIT {
            return false;
        }
        let want = size.max(max_split);
        let releasable = |s: &State, i: usize| s.b(i).segment.is_none();
        let at = self.pools[p]
            .blocks
            .range((stream, want, 0, 0)..)
            .next()
            .copied()
            .filter(|k| k.0 == stream);
        if let Some(k) = at {
            if !releasable(self, k.3) {
                return false;
            }
            self.release_block(k.3);
            return true;
        }
        let below: Vec<_> = self.pools[p]
            .blocks
            .range(..(stream, want, 0, 0))
            .rev()
            .take_while(|k| k.0 == stream && k.1 >= max_split)
            .copied()
            .collect();
        let mut released = 0;
        for k in below {
            if released >= want {
                break;
            }
            if !releasable(self, k.3) {
                continue;
            }
            released += k.1;
            self.release_block(k.3);
        }
        released >= want
    }

    /// `garbage_collect_cached_blocks`: under a fraction, frees the unsplit large
    /// cached segments not reused for longer than average until reserved memory is
    /// back under the threshold.
    fn garbage_collect_cached_blocks(&mut self) {
        let Some(Limit::Fraction(allowed)) = self.limit else {
            return;
        };
        let threshold = (self.conf.garbage_collection_threshold * allowed as f64) as u64;
        if self.stats.reserved <= threshold {
            return;
        }
        let target = self.stats.reserved - threshold;
        let count = self.pools[1].get_free_blocks_call_count;
        let age = |s: &State, i: usize| count.saturating_sub(s.b(i).gc_base);
        let freeable = |s: &State| -> Vec<usize> {
            s.pools[1]
                .blocks
                .iter()
                .map(|k| k.3)
                .filter(|&i| {
                    s.b(i).prev.is_none() && s.b(i).next.is_none() && s.b(i).segment.is_none()
                })
                .collect()
        };
        let mut blocks = freeable(self);
        let mut total_age: u64 = blocks.iter().map(|&i| age(self, i)).sum();
        let mut reclaimed = 0;
        let mut freed_any = true;
        while reclaimed < target && freed_any && !blocks.is_empty() {
            let threshold_age = total_age as f64 / blocks.len() as f64;
            freed_any = false;
            for i in std::mem::take(&mut blocks) {
                if age(self, i) as f64 >= threshold_age {
                    freed_any = true;
                    reclaimed += self.b(i).size;
                    total_age -= age(self, i);
                    self.release_block(i);
                } else {
                    blocks.push(i);
                }
            }
        }
    }
}

/// `roundup_power2_next_division`.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded = size & !(step - 1);
    if rounded == size {
        size
    } else {
        rounded + step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native() -> State {
        State::new(TorchConf::default(), 80 << 30, None)
    }

    #[test]
    fn sizes_round_and_segments_are_sized_as_pytorch_does() {
        let s = native();
        assert_eq!(s.round_size(1), 512);
        assert_eq!(s.round_size(513), 1024);
        assert_eq!(State::allocation_size(1 << 20), 2 << 20);
        assert_eq!(State::allocation_size((1 << 20) + 1), 20 << 20);
        assert_eq!(State::allocation_size(11 << 20), 12 << 20);
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1024, 4), 1024);
    }

    #[test]
    fn small_requests_share_a_2_mib_segment_and_large_ones_split_20_mib() {
        let mut s = native();
        let (a, _) = s.malloc(1000, 0).unwrap();
        let (b, _) = s.malloc(1000, 0).unwrap();
        assert_eq!(s.stats().reserved, 2 << 20);
        let (c, _) = s.malloc(3 << 20, 0).unwrap();
        let (d, _) = s.malloc(3 << 20, 0).unwrap();
        assert_eq!(s.stats().reserved, (2 << 20) + (20 << 20));
        // Another stream gets segments of its own.
        let (e, _) = s.malloc(1000, 7).unwrap();
        assert_eq!(s.stats().reserved, (4 << 20) + (20 << 20));
        for i in [a, b, c, d, e] {
            s.free(i);
        }
        s.release_cached_blocks();
        assert_eq!(s.stats().reserved, 0);
        assert_eq!(s.stats().reserved_peak, (4 << 20) + (20 << 20));
    }

    #[test]
    fn expandable_segments_map_pages_and_unmap_them_on_empty_cache() {
        let conf = TorchConf::parse("expandable_segments:True").unwrap();
        let mut s = State::new(conf, 80 << 30, None);
        let (a, _) = s.malloc(30 << 20, 0).unwrap();
        assert_eq!(s.stats().reserved, 40 << 20); // two 20 MiB pages
        let (b, _) = s.malloc(5 << 20, 0).unwrap(); // fits in the second page's rest
        assert_eq!(s.stats().reserved, 40 << 20);
        let (c, _) = s.malloc(30 << 20, 0).unwrap();
        assert_eq!(s.stats().reserved, 80 << 20);
        s.free(a);
        s.free(b);
        s.free(c);
        s.release_cached_blocks();
        assert_eq!(s.stats().reserved, 0);
        let (d, _) = s.malloc(30 << 20, 0).unwrap();
        assert_eq!(s.stats().reserved, 40 << 20);
        s.free(d);
    }

    #[test]
    fn a_request_past_any_device_is_refused_not_wrapped() {
        let mut s = native();
        assert!(s.malloc(u64::MAX, 0).is_err());
        assert!(s.malloc(u64::MAX - 100, 3).is_err());
        assert_eq!(s.stats().reserved, 0);
        let mut big = State::new(TorchConf::default(), u64::MAX, None);
        assert!(big.malloc(1 << 20, 0).is_ok());
    }

    #[test]
    fn a_device_of_every_byte_refuses_rather_than_wrapping() {
        // (`--device-memory 18446744073709551615`: segments of 2^56 bytes until
        // the model's address space, below 2^62, holds no more; before, the
        // 256th passed the device's check and wrapped the reserved bytes.)
        let mut s = State::new(TorchConf::default(), u64::MAX, None);
        let granted = (0..300).filter(|_| s.malloc(1 << 56, 0).is_ok()).count();
        assert!(granted > 0 && granted < 300, "{granted}");
        assert_eq!(s.stats().reserved, (granted as u64) << 56);
        let mut d = State::new(TorchConf::default(), u64::MAX, None);
        d.stats.reserved = u64::MAX - (1 << 30);
        assert!(!d.device_has(2 << 30));
    }

    #[test]
    fn the_models_address_space_runs_out_as_out_of_memory_not_wrapping() {
        // Expandable segments: each stream's segment takes address space for
        // 9/8 of the device, and the model never gives addresses back.
        let conf = TorchConf::parse("expandable_segments:True").unwrap();
        let mut s = State::new(conf, 1 << 56, None);
        let granted = (0..400).filter(|&k| s.malloc(512, k).is_ok()).count();
        assert!(granted > 0 && granted < 400, "{granted} of 400 streams");
        // Native segments a retry gives back, stream after stream.
        let mut s = State::new(TorchConf::default(), 1 << 50, Some(Limit::Device(1 << 50)));
        let mut refused = 0;
        for k in 0..10_000u64 {
            match s.malloc((1 << 49) + 512, k % 2) {
                Ok((i, _)) => s.free(i),
                Err(_) => refused += 1,
            }
        }
        assert!(refused > 0, "the address space never ran out");
    }

    #[test]
    fn divisions_past_any_size_round_as_pytorch_does() {
        // PyTorch's `kMinBlockSize * divisions` wraps to 0 here, and its
        // division step is then 0: the next power of two.
        let conf = TorchConf::parse("roundup_power2_divisions:36028797018963968").unwrap();
        let mut s = State::new(conf, 80 << 30, None);
        assert_eq!(s.round_size(1000), 1024);
        assert_eq!(s.round_size(1500), 2048);
        assert_eq!(s.round_size((5 << 20) + 7), 8 << 20);
        assert!(s.malloc(1500, 0).is_ok());
    }

    #[test]
    fn a_device_limit_refuses_after_freeing_the_cache() {
        let mut s = State::new(
            TorchConf::default(),
            80 << 30,
            Some(Limit::Device(64 << 20)),
        );
        let (a, _) = s.malloc(40 << 20, 0).unwrap();
        s.free(a); // cached
                   // 50 MiB does not fit beside the cached 40: the retry frees the cache.
        let (b, _) = s.malloc(50 << 20, 0).unwrap();
        assert_eq!(s.stats().alloc_retries, 1);
        assert!(s.malloc(20 << 20, 0).is_err());
        s.free(b);
        assert_eq!(s.stats().ooms, 1);
    }

    /// Requests that keep failing once the device is full: each retry used to
    /// walk every free block again (200,000 small requests on streams of their
    /// own took 76 s), though nothing entered the cache since the last walk.
    /// The figures stay PyTorch's: the first refusal's release frees the cache.
    #[test]
    fn failing_requests_do_not_walk_an_unchanged_cache_again() {
        let mut s = State::new(TorchConf::default(), 80 << 30, Some(Limit::Device(4 << 30)));
        // 2 MiB small segments, one a stream: 2,048 fill the device.
        let mut held = Vec::new();
        for stream in 0..60_000u64 {
            if let Ok((i, _)) = s.malloc(512, stream) {
                held.push(i);
            }
        }
        assert_eq!(held.len(), 2048);
        assert_eq!(s.stats().ooms, 60_000 - 2048);
        assert_eq!(
            s.release_walks, 1,
            "only the first refusal walked the cache"
        );
        // A free puts a block in the cache; the next failing request's release
        // walks again, and the segment of the freed block goes back.
        let reserved = s.stats().reserved;
        s.free(held.pop().unwrap());
        assert!(s.malloc(4 << 30, 0).is_err());
        assert_eq!(s.release_walks, 2);
        assert_eq!(s.stats().reserved, reserved - (2 << 20));
        // A request that fits now takes the room that release made.
        assert!(s.malloc(512, 1 << 40).is_ok());
    }
}

//! The shared part of the pool: segments from the upstream, their blocks in a
//! [`BlockHeap`] (best fit with splitting and coalescing, per-stream free sets),
//! and the events that order cross-stream reuse. Callers hold the pool's lock
//! around every method.
//!
//! Blocks are found by address in constant time (hashed by start and end, see
//! `heap/blocks.rs`); free blocks by size in logarithmic time (a B-tree per stream and
//! kind), so lookups stay flat as live blocks grow.

use emm_core::{EmmError, Result};
use emm_sys::CUdeviceptr;

use crate::call_work::{self, Work};
use crate::events::{EventId, EventSource};
use crate::family::Family;
use crate::fasthash::FastMap;
use crate::growth_phases::{self, Phase};
use crate::heap::{Block, BlockHeap, State};
use crate::history::History;

mod address_space;
mod expandable;
mod fit;
mod growth;
mod home;
mod inspect;
mod merge;
mod merge_clock;
mod oom;
mod pause;
mod pieces;
mod release;
mod replace;
mod retire;
mod segments;
mod shrink;
mod stream_order;
mod streams;
mod streams_served;

mod policy;

use crate::kind::Kind;
use crate::stream_key::{is_default_stream, stream_id, stream_of_key, StreamKey, SETTLED};
use pieces::Piece;
pub use policy::{
    SegmentPolicy, DEFAULT_EXPAND_STEP, DEFAULT_LEGACY_MERGE, DEFAULT_PIECE_PAGES,
    DEFAULT_PIECE_SHARE,
};
use segments::{Segment, Segments};

/// Counters kept under the lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Bytes reserved from the upstream now.
    pub reserved: usize,
    /// Peak of `reserved`.
    pub peak_reserved: usize,
    /// Bytes in live blocks (rounded sizes).
    pub live: usize,
    /// Peak of `live`.
    pub peak_live: usize,
    /// Segments allocated from the upstream so far.
    pub upstream_allocs: usize,
    /// Segments given back to the upstream so far.
    pub upstream_frees: usize,
    /// Segments held now.
    pub segments: usize,
    /// Allocations served from free blocks without going upstream.
    pub hits: usize,
    /// Out-of-memory ladders run.
    pub oom_ladders: usize,
    /// The events counted (one list: `counters.rs`).
    pub counts: crate::counters::Counts,
    /// Peak of `segments`.
    pub peak_segments: usize,
    /// Allocations that failed for lack of memory (PyTorch's `num_ooms`).
    pub ooms: usize,
    /// Peak of the bytes held by callers (live minus thread-cached), sampled by the
    /// pool (see `PoolStats::allocated_bytes_peak`).
    pub peak_allocated: usize,
    /// Peak of the blocks held by callers, sampled likewise.
    pub peak_allocated_blocks: usize,
    /// The make-up of reserved bytes at the last growth that raised their peak
    /// (`Arena::slack`; the pool fills in its threads' cached bytes).
    pub peak_slack: crate::slack::PeakSlack,
}

impl ArenaStats {
    /// Sets every peak to its current value (`peak_allocated*`: to the caller's
    /// current figures `allocated` and `blocks`).
    pub fn reset_peaks(&mut self, allocated: usize, blocks: usize) {
        self.peak_reserved = self.reserved;
        self.peak_live = self.live;
        self.peak_segments = self.segments;
        self.peak_allocated = allocated;
        self.peak_allocated_blocks = blocks;
        self.peak_slack = Default::default();
    }
}

fn unreachable_fit<T>(size: usize) -> Result<T> {
    Err(EmmError::Internal {
        operation: "pool allocation",
        detail: format!("no free block of {size} bytes after growing"),
    })
}

/// What a caller needs to make a segment: the arena does no I/O itself.
pub(crate) trait SegmentSource {
    fn alloc_segment(&self, size: usize) -> Result<CUdeviceptr>;
    fn free_segment(&self, base: CUdeviceptr, size: usize) -> Result<()>;
    /// Free and total bytes of the device, for error reports.
    fn device_info(&self) -> (usize, usize);
    /// Reserves `size` bytes of address space for an expandable segment; `None`
    /// when the upstream has no virtual memory management.
    fn reserve(&self, _size: usize) -> Result<Option<CUdeviceptr>> {
        Ok(None)
    }
    /// Copies `len` bytes of device memory at `addr` (the device is done with
    /// them) to host memory, for a pause that keeps contents: into `into` when it
    /// has room (a buffer an earlier pause used), else into a new buffer.
    fn save(
        &self,
        _addr: CUdeviceptr,
        _len: usize,
        _into: Option<crate::host_copy::HostCopy>,
    ) -> Result<crate::host_copy::HostCopy> {
        Err(EmmError::Unsupported {
            manager: "pool".into(),
            operation: "a pause that keeps contents",
        })
    }
    /// Releases the memory behind `[addr, addr+len)` (a piece given to `map_pieces`
    /// whole), after waiting for the device.
    fn unmap(&self, _addr: CUdeviceptr, _len: usize) -> Result<()> {
        Err(EmmError::Unsupported {
            manager: "pool".into(),
            operation: "unmap",
        })
    }
    /// As `unmap`, for a range the device is known to be done with (the caller
    /// waited for the work queued on it): no synchronization.
    fn unmap_done(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.unmap(addr, len)
    }
    /// Maps `pieces` one after another at `dst` and up: new memory (`None`) or the
    /// memory mapped at `src`. Returns how many pieces, from the first, were mapped,
    /// and the error that stopped it (see `VirtualMemory::map_pieces`).
    fn map_pieces(
        &self,
        dst: CUdeviceptr,
        pieces: &[(Option<CUdeviceptr>, usize)],
    ) -> (usize, Result<()>);
    /// Hands `maps` (old mappings of moved pieces, free once `event` completes;
    /// at once without) to a helper thread that waits for the event and unmaps
    /// them (see `unmapper.rs`): the job handed over, or `None` when there is no
    /// helper (the default): the caller unmaps them itself.
    fn unmap_later(
        &self,
        _maps: &[(CUdeviceptr, usize)],
        _event: Option<crate::events::EventId>,
    ) -> Option<std::sync::Arc<crate::unmapper::UnmapJob>> {
        None
    }
}

#[derive(Default)]
pub(crate) struct Arena {
    /// The blocks of every segment and the free sets (see `heap/`).
    heap: BlockHeap,
    /// Each stream's latest event, and the free blocks of streams another
    /// stream asked for, until their events complete (see `stream_order.rs`).
    order: stream_order::StreamOrder,
    /// The most bytes reserved at once since the pool began: the peak of
    /// reserved bytes that a reset of the statistics' peaks
    /// (`reset_peak_memory_stats`, which training loops may call every step)
    /// leaves alone. The parked-block policies judge "past the peak" by it.
    most_reserved: usize,
    /// The segments, by base address (see `segments.rs`).
    segments: Segments,
    pub stats: ArenaStats,
    pub policy: SegmentPolicy,
    /// The expandable segment: its address space, pieces, old mappings of
    /// moved pieces waiting for their work, and pause (see `expandable.rs`).
    expandable: expandable::ExpandableSegment,
    /// The allocation history (off unless asked for).
    pub history: History,
    /// When a merge of free segments is due and what it sizes the pool to (see
    /// `merge.rs`).
    merge: merge_clock::MergeClock,
    /// What the pool's family (a pool and its tag and stream pools) shares:
    /// reserved and active bytes and their peaks, the byte limit and the
    /// release threshold.
    family: std::sync::Arc<Family>,
    /// Per stream, what is known of which free blocks no queued work uses (see
    /// `replace.rs`).
    idle: FastMap<StreamKey, replace::IdleMarks>,
    /// What the arena knows of its home segment beyond its base (`home.rs`).
    home: home::HomeState,
    /// Whether the arena's requests came from one stream or several
    /// (`streams_served.rs`).
    served: streams_served::StreamsServed,
    /// The first refusal of the upstream to take a wholly free segment back
    /// since it was last taken (`take_refusal`): a trim that gave back less
    /// than it could says so.
    refusal: Option<EmmError>,
}

impl Arena {
    /// An arena of `family`, whose byte limit and release threshold it shares
    /// with the family's other arenas (a pool and its tag and stream pools). Arenas check
    /// the limit under their own locks: two growing at once can pass it by one
    /// growth. Without `virtual_memory` (the upstream has none) the arena knows
    /// from the start that no expandable segment is to be had, so that its
    /// first allocation already follows the path without it (a home segment
    /// made there, `home.rs`) instead of learning it at its first growth.
    pub(crate) fn in_family(
        policy: SegmentPolicy,
        family: std::sync::Arc<Family>,
        virtual_memory: bool,
    ) -> Self {
        let expandable = if virtual_memory {
            expandable::ExpandableSegment::default()
        } else {
            expandable::ExpandableSegment::without_virtual_memory()
        };
        Arena {
            policy,
            family,
            expandable,
            ..Arena::default()
        }
    }

    /// The first refusal of the upstream to take a segment back since the last
    /// call (see `give_back_segment`), taken.
    pub(crate) fn take_refusal(&mut self) -> Option<EmmError> {
        self.refusal.take()
    }

    /// The byte limit of the family, if any (it may change while the pool serves).
    pub(crate) fn limit(&self) -> Option<usize> {
        self.family.limit()
    }

    /// Whether the pool has no expandable segment: turned off, or none to be had
    /// from the driver. Its large blocks then live in plain segments only.
    pub(super) fn plain_segments_only(&self) -> bool {
        !self.policy.expandable || self.expandable.none_to_be_had()
    }

    /// Reserved bytes the byte limit is checked against: the family's.
    pub(crate) fn family_reserved(&self) -> usize {
        self.family.reserved()
    }

    /// Brings the count of segments held (and its peak) up to date after one
    /// was made or given back.
    fn count_segments(&mut self) {
        self.stats.segments = self.segments.len();
        self.stats.peak_segments = self.stats.peak_segments.max(self.stats.segments);
    }

    /// Counts `n` more bytes reserved (here and in the family).
    fn add_reserved(&mut self, n: usize) {
        self.stats.reserved += n;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        self.most_reserved = self.most_reserved.max(self.stats.reserved);
        self.family.add(n);
    }

    /// Counts `n` bytes fewer reserved.
    fn sub_reserved(&mut self, n: usize) {
        self.stats.reserved = self.stats.reserved.saturating_sub(n);
        self.family.sub(n);
    }

    /// Whether `base` is the expandable segment's base (a block there is virtual
    /// memory).
    pub fn is_expandable(&self, base: CUdeviceptr) -> bool {
        self.expandable.base() == Some(base)
    }

    /// Allocates `size` (rounded) bytes for `stream`. Returns the address and the
    /// base and size of its segment.
    pub fn alloc(
        &mut self,
        size: usize,
        stream: StreamKey,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
    ) -> Result<(CUdeviceptr, CUdeviceptr, usize)> {
        let peak = self.stats.peak_reserved;
        match self.try_alloc(size, stream, events, source, true)? {
            Some(r) => {
                if self.stats.peak_reserved > peak {
                    // A new peak: what the pool held beside the live bytes then.
                    self.stats.peak_slack = self.slack(stream, size);
                    tracing::debug!(
                        stream = stream_id(stream),
                        slack = ?self.stats.peak_slack,
                        "a new peak of reserved bytes"
                    );
                }
                Ok(r)
            }
            None => unreachable_fit(size),
        }
    }

    /// The kind of block a request of `size` bytes takes: large for every size
    /// where the pool keeps one range (`SegmentPolicy::one_range`) over a usable
    /// expandable segment, else by its size.
    fn kind_for(&self, size: usize) -> Kind {
        if self.policy.one_range && self.expandable.usable() {
            Kind::Large
        } else {
            Kind::of(size)
        }
    }

    /// A small request served from the expandable segment's free blocks, this
    /// stream's and then settled ones, by best fit, without growth; `None` for
    /// a large request, without the expandable segment, or where none fits.
    /// [`Arena::try_alloc`] looks there only where growth is allowed, after
    /// its small blocks, stranded memory and parked blocks; the pool asks
    /// first where a thread's cache would otherwise go back to the arena
    /// (`PoolConfig::thread_cache_keep`). Only
    /// the expandable segment: a plain large segment, which the out-of-memory
    /// ladder may make, must be able to come free whole.
    pub fn take_small_in_expandable(
        &mut self,
        size: usize,
        stream: StreamKey,
    ) -> Option<(CUdeviceptr, CUdeviceptr, usize)> {
        let small = self.kind_for(size) == Kind::Small;
        let base = self.expandable.base().filter(|_| small)?;
        for s in [stream, SETTLED] {
            if let Some(a) = self.take_fit_in(size, Kind::Large, s, Some(base)) {
                self.stats.hits += 1;
                return Some(self.finish(a, size));
            }
        }
        None
    }

    /// Whether every request the arena took so far (since its last reset) was
    /// `stream`'s.
    pub fn serves_only(&self, stream: StreamKey) -> bool {
        self.served.only(stream)
    }

    /// Forgets which streams the arena served (a reset drains it).
    fn forget_streams_served(&mut self) {
        self.served = Default::default();
    }

    /// As [`Arena::alloc`]; with `grow` false, returns `None` instead of taking new
    /// memory from the upstream.
    pub fn try_alloc(
        &mut self,
        size: usize,
        stream: StreamKey,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
        grow: bool,
    ) -> Result<Option<(CUdeviceptr, CUdeviceptr, usize)>> {
        let kind = self.kind_for(size);
        self.stats.counts.locked_allocs += 1;
        self.served.note(stream);
        // (Only ever set where the pool has no expandable segment, with merging
        // on: `Arena::merges`.)
        if self.merge.due() && kind == Kind::Large {
            self.merge_if_quiet(events, source);
        }
        if self.wants_home() {
            let made = self.stats.upstream_allocs;
            if let Some(a) = self.take_home(size, stream, source, grow)? {
                // (Served by the home just made: a miss, as any growth.)
                if self.stats.upstream_allocs > made {
                    self.stats.counts.misses += 1;
                } else {
                    self.stats.hits += 1;
                }
                return Ok(Some(self.finish(a, size)));
            }
        }
        if let Some(a) = self.take_fit(size, kind, stream) {
            self.stats.hits += 1;
            return Ok(Some(self.finish(a, size)));
        }
        // (From here on, blocks that were not usable before may be: the home
        // segment's are looked at again first, for a small request too.)
        let settled = |me: &mut Self| me.take_fit_home_first(size, kind, SETTLED);
        if let Some(a) = settled(self) {
            self.stats.hits += 1;
            return Ok(Some(self.finish(a, size)));
        }
        if self.collect_pending(events)? {
            if let Some(a) = settled(self) {
                self.stats.hits += 1;
                return Ok(Some(self.finish(a, size)));
            }
        }
        // This stream's own blocks that another stream asked for and could not
        // take yet: stream order makes them this stream's to reuse at once.
        if self.take_back_parked(stream, events) {
            if let Some(a) = self.take_fit_home_first(size, kind, stream) {
                self.stats.hits += 1;
                return Ok(Some(self.finish(a, size)));
            }
        }
        if self.steal_from_other_streams(events, stream)? && self.collect_pending(events)? {
            if let Some(a) = settled(self) {
                self.stats.hits += 1;
                return Ok(Some(self.finish(a, size)));
            }
        }
        if !grow {
            return Ok(None);
        }
        if self.reclaim_stranded(size, events)? {
            if let Some(a) = settled(self) {
                self.stats.hits += 1;
                return Ok(Some(self.finish(a, size)));
            }
        }
        if self.wait_parked(size, kind, stream, events)? {
            if let Some(a) = settled(self) {
                self.stats.hits += 1;
                return Ok(Some(self.finish(a, size)));
            }
        }
        if self.adopt_parked(size, kind, stream, events) {
            if let Some(a) = self.take_fit_home_first(size, kind, stream) {
                self.stats.hits += 1;
                return Ok(Some(self.finish(a, size)));
            }
        }
        if kind == Kind::Large && self.policy.expandable {
            match growth_phases::timed(Phase::Expand, || self.expand(size, stream, events, source))
            {
                Ok(true) => {
                    self.stats.counts.misses += 1;
                    call_work::note(Work::Grew);
                    let _ = self.cover_fresh(stream, events);
                    if let Some(a) = self.take_fit(size, kind, stream) {
                        return Ok(Some(self.finish(a, size)));
                    }
                }
                Ok(false) => {}
                Err(e) if e.is_out_of_memory() => {
                    return self
                        .oom_ladder(size, kind, stream, events, source, e)
                        .map(Some)
                }
                Err(e) => return Err(e),
            }
        }
        // Before a new small segment, a free block of the expandable segment: the
        // small and large blocks' peaks come at different moments of a step
        // (optimizer state and bookkeeping after the activations are gone), and a
        // small segment taken while the expandable segment holds free memory adds
        // the two peaks (the recorded snapshot of GPT-2 training reached 1.149x
        // of live after 30 passes; 1.122x this way, the recorded traces 0.3-1.4 %
        // lower, with fewer pieces moved). Only with the expandable segment:
        // without it a small block would keep an exact-size segment from coming
        // free whole (the inference snapshot went from 1.60x to 1.90x).
        if let Some(a) = self.take_small_in_expandable(size, stream) {
            return Ok(Some(a));
        }
        if kind == Kind::Large {
            if let Some(a) = self.tighten(size, events, source)? {
                return Ok(Some(a));
            }
        }
        let seg = self.policy.segment_for(size, kind);
        let base = match self.grow(seg, kind, stream, source) {
            Ok(b) => b,
            Err(e) if e.is_out_of_memory() => {
                return self
                    .oom_ladder(size, kind, stream, events, source, e)
                    .map(Some)
            }
            Err(e) => return Err(e),
        };
        self.stats.counts.misses += 1;
        call_work::note(Work::Grew);
        self.note_home_overflow(size);
        if kind == Kind::Large && self.merges() {
            self.merge.grew(seg, self.stats.live);
        }
        let _ = self.cover_fresh(stream, events);
        match self.take_grown(size, kind, stream, base) {
            Some(a) => Ok(Some(self.finish(a, size))),
            None => unreachable_fit(size),
        }
    }

    /// After a plain segment at `base` was made for `size` bytes of `stream`:
    /// best fit (which may find a better block now), else the new segment's
    /// own free block, taken there. Best fit can pass that block over: the
    /// exclusive rule judges a block by its segment's size, and a segment
    /// rounded far past the request (`SegmentPolicy::large_round` of a GiB)
    /// wastes more than it allows. (Before, the segment's base was handed out
    /// with its block still free in the books, for the next request to take
    /// again.) `None` only where the new segment holds no such block.
    fn take_grown(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
        base: CUdeviceptr,
    ) -> Option<(CUdeviceptr, CUdeviceptr)> {
        if let Some(a) = self.take_fit(size, kind, stream) {
            return Some(a);
        }
        self.heap.take(base, size).map(|segment| (base, segment))
    }

    /// Counts the block at `addr` of `segment` (from `take_fit`) live; returns its
    /// address and its segment's base and size.
    fn finish(
        &mut self,
        (addr, segment): (CUdeviceptr, CUdeviceptr),
        size: usize,
    ) -> (CUdeviceptr, CUdeviceptr, usize) {
        self.stats.live += size;
        self.stats.peak_live = self.stats.peak_live.max(self.stats.live);
        self.merge.saw_live(self.stats.live, self.stats.reserved);
        self.family.add_active(size);
        let seg_size = self.segments.get(&segment).map_or(size, |s| s.size);
        (addr, segment, seg_size)
    }

    /// Takes back a live block freed on `stream`. With `events` (the stream is
    /// known to be alive: the caller frees on it now), a created stream gets an
    /// event recorded after the free, so another stream can take its blocks later;
    /// without, the stream's blocks stay with it until a device-wide sync.
    pub fn free(
        &mut self,
        addr: CUdeviceptr,
        stream: StreamKey,
        events: Option<&dyn EventSource>,
    ) -> bool {
        match self.heap.get(addr) {
            Some(b) if b.state == State::Live => {
                let b = *b;
                self.stats.counts.locked_frees += 1;
                self.stats.live -= b.size;
                self.merge.saw_live(self.stats.live, self.stats.reserved);
                self.family.sub_active(b.size);
                // Replaces the live entry at `addr` (no separate removal). A free
                // without an event leaves the stream's blocks waiting for a
                // synchronization: settled neighbours stay out of that.
                let join = events.is_some() && self.joins_settled(stream);
                self.insert_free_joining(addr, b.size, b.segment, stream, join);
                if let Some(ev) = events {
                    self.mark_free(stream, ev);
                }
                // With a release threshold, frees on the default streams record
                // events too, so that their blocks settle without waiting.
                // Without one, an event recorded before this free (while a
                // release threshold was set) does not cover it, so it must not
                // settle the stream's blocks.
                let covers =
                    (!is_default_stream(stream) || self.threshold_set()) && stream != SETTLED;
                let recorded = if covers {
                    self.stats.counts.events_recorded += usize::from(events.is_some());
                    events.map(|ev| ev.record(stream_of_key(stream)))
                } else {
                    None
                };
                self.order.after_free(stream, covers, recorded, events);
                true
            }
            _ => false,
        }
    }
}

//! The shared part of the pool: segments from the upstream, best fit with
//! splitting and coalescing inside them, per-stream free sets, and the events that
//! order cross-stream reuse. Callers hold the pool's lock around every method.
//!
//! Lookup cost is logarithmic in the number of blocks (B-trees keyed by address and
//! by size), so it stays flat as live blocks grow.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use emm_core::{EmmError, Result};
use emm_sys::CUdeviceptr;

use emm_core::{SnapshotBlock, SnapshotSegment, TraceAction};

use crate::events::{EventId, EventSource};
use crate::history::History;

/// Alignment and rounding of every block.
pub const ROUND: usize = 512;
/// Requests up to this size come from small segments.
pub const SMALL_MAX: usize = 1 << 20;

/// Rounds a request to the pool's granularity.
pub fn round_size(size: usize) -> usize {
    size.max(1).div_ceil(ROUND) * ROUND
}

/// Small and large blocks live in different segments (as in PyTorch's allocator):
/// mixing them scatters long-lived small blocks across large free runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Requests ≤ [`SMALL_MAX`].
    Small,
    /// Larger requests.
    Large,
}

impl Kind {
    /// The kind of a rounded request.
    pub fn of(size: usize) -> Kind {
        if size <= SMALL_MAX {
            Kind::Small
        } else {
            Kind::Large
        }
    }
}

/// A stream as the pool keys it.
pub type StreamKey = usize;

/// The key of free blocks whose last stream's work is known to be complete: any
/// stream may take them.
pub const SETTLED: StreamKey = usize::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Live,
    Free(StreamKey),
    /// Freed on a stream, waiting for an event before another stream may use it.
    Pending,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: usize,
    segment: CUdeviceptr,
    state: State,
}

#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Bytes backed by memory (for an expandable segment: mapped so far).
    pub size: usize,
    pub kind: Kind,
    /// For an expandable segment: the address space reserved, and the mapped
    /// pieces `(offset, len)` in order.
    pub expandable: Option<(usize, Vec<(usize, usize)>)>,
}

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
    /// Allocations that needed a new segment.
    pub misses: usize,
    /// Out-of-memory ladders run.
    pub oom_ladders: usize,
    /// Blocks handed to another stream after their event completed.
    pub cross_stream_reuses: usize,
    /// Requests that took the locked path (thread-cache misses and large blocks).
    pub locked_allocs: usize,
    /// Blocks given back to the arena (thread-cache flushes, large blocks).
    pub locked_frees: usize,
    /// Events recorded on streams (cross-stream ordering).
    pub events_recorded: usize,
    /// Event completion queries.
    pub event_queries: usize,
    /// Device-wide synchronizations (out-of-memory ladder, trim, stranded blocks).
    pub device_syncs: usize,
    /// Per-stream entries visited by scans over streams (stealing, stranded
    /// bytes, consolidation): the work that grows with the number of streams.
    pub scan_steps: usize,
    /// Peak of `segments`.
    pub peak_segments: usize,
    /// Allocations that failed for lack of memory (PyTorch's `num_ooms`).
    pub ooms: usize,
    /// Peak of the bytes held by callers (live minus thread-cached), sampled by the
    /// pool (see `PoolStats::allocated_bytes_peak`).
    pub peak_allocated: usize,
    /// Peak of the blocks held by callers, sampled likewise.
    pub peak_allocated_blocks: usize,
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
    }
}

fn unreachable_fit<T>(size: usize) -> Result<T> {
    Err(EmmError::InvalidSize {
        requested: size,
        reason: "the pool found no block after growing (a bug; please report it)",
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
    /// Backs `[addr, addr+len)` of a reservation with memory.
    fn map(&self, _addr: CUdeviceptr, _len: usize) -> Result<()> {
        Err(EmmError::Unsupported {
            manager: "pool".into(),
            operation: "map",
        })
    }
    /// Releases the memory behind `[addr, addr+len)` (a range given to `map` whole).
    fn unmap(&self, _addr: CUdeviceptr, _len: usize) -> Result<()> {
        Err(EmmError::Unsupported {
            manager: "pool".into(),
            operation: "unmap",
        })
    }
}

/// Segment sizes: few upstream calls for many small requests, exact-ish segments
/// for large ones so that reserved memory tracks live memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentPolicy {
    /// Large blocks live in one expandable segment per pool (address space
    /// reserved once, memory mapped in pieces as it grows), when the upstream has
    /// virtual memory management: best fit over one contiguous range.
    pub expandable: bool,
    /// Address space reserved for the expandable segment.
    pub expandable_reserve: usize,
    /// The expandable segment grows by at least this much at a time.
    pub expand_step: usize,
    /// Size of a small-block segment.
    pub small_segment: usize,
    /// Large requests below this share segments of this size.
    pub large_segment: usize,
    /// Large segments are rounded up to this.
    pub large_round: usize,
}

impl Default for SegmentPolicy {
    fn default() -> Self {
        SegmentPolicy {
            expandable: true,
            expandable_reserve: 1 << 40,
            expand_step: 20 << 20,
            small_segment: 4 << 20,
            large_segment: 20 << 20,
            large_round: 2 << 20,
        }
    }
}

impl SegmentPolicy {
    fn segment_for(&self, size: usize, kind: Kind) -> usize {
        match kind {
            Kind::Small => self.small_segment.max(size),
            Kind::Large if size < self.large_segment / 2 => self.large_segment,
            Kind::Large => size.div_ceil(self.large_round) * self.large_round,
        }
    }
}

/// What is known of a stream's free blocks.
#[derive(Clone, Copy, Debug, Default)]
struct StreamState {
    /// An event recorded on the stream after its latest free (created streams).
    last_event: Option<EventId>,
    /// Some free block of the stream was given back without an event (its stream
    /// may be gone): none of its blocks can move to another stream before a
    /// device-wide synchronization.
    uncovered: bool,
}

/// A stream key as snapshots show it (the stream handle as an integer; 0 for
/// blocks settled on no stream).
pub(crate) fn stream_id(s: StreamKey) -> usize {
    if s == SETTLED {
        0
    } else {
        s
    }
}

/// The legacy and per-thread default streams (and null): never destroyed, so an
/// event can be recorded on them at any time.
fn is_default_stream(s: StreamKey) -> bool {
    s <= 2
}

#[derive(Default)]
pub(crate) struct Arena {
    blocks: BTreeMap<CUdeviceptr, Block>,
    streams: HashMap<StreamKey, StreamState>,
    free: HashMap<(StreamKey, Kind), BTreeSet<(usize, CUdeviceptr)>>,
    pending: Vec<(EventId, Vec<CUdeviceptr>)>,
    segments: BTreeMap<CUdeviceptr, Segment>,
    pub stats: ArenaStats,
    pub policy: SegmentPolicy,
    pub limit: Option<usize>,
    /// The expandable segment's base, once reserved; `Some(0)` after a reservation
    /// failed (do not try again).
    grow_base: Option<CUdeviceptr>,
    /// The allocation history (off unless asked for).
    pub history: History,
}

impl Arena {
    pub fn new(policy: SegmentPolicy, limit: Option<usize>) -> Self {
        Arena {
            policy,
            limit,
            ..Arena::default()
        }
    }

    fn insert_free(
        &mut self,
        addr: CUdeviceptr,
        size: usize,
        segment: CUdeviceptr,
        stream: StreamKey,
    ) {
        let kind = self.segments.get(&segment).map_or(Kind::Large, |s| s.kind);
        // Coalesce with a free neighbour of the same stream and segment on each side.
        let (mut addr, mut size) = (addr, size);
        if let Some((&paddr, &p)) = self.blocks.range(..addr).next_back() {
            if p.segment == segment
                && p.state == State::Free(stream)
                && paddr + p.size as u64 == addr
            {
                self.free_set(stream, kind).remove(&(p.size, paddr));
                self.blocks.remove(&paddr);
                addr = paddr;
                size += p.size;
            }
        }
        let next_addr = addr + size as u64;
        if let Some(&n) = self.blocks.get(&next_addr) {
            if n.segment == segment && n.state == State::Free(stream) {
                self.free_set(stream, kind).remove(&(n.size, next_addr));
                self.blocks.remove(&next_addr);
                size += n.size;
            }
        }
        self.blocks.insert(
            addr,
            Block {
                size,
                segment,
                state: State::Free(stream),
            },
        );
        self.free_set(stream, kind).insert((size, addr));
    }

    fn free_set(&mut self, stream: StreamKey, kind: Kind) -> &mut BTreeSet<(usize, CUdeviceptr)> {
        self.free.entry((stream, kind)).or_default()
    }

    /// Best fit among `stream`'s free blocks of `kind`; splits off the remainder.
    fn take_fit(&mut self, size: usize, kind: Kind, stream: StreamKey) -> Option<CUdeviceptr> {
        let set = self.free.get_mut(&(stream, kind))?;
        let &(bsize, addr) = set.range((size, 0)..).next()?;
        // Large blocks: do not hand out a block much larger than asked (it would
        // pin a big free run under a small tensor); split instead.
        set.remove(&(bsize, addr));
        let segment = self.blocks.get(&addr).map_or(addr, |b| b.segment);
        self.blocks.insert(
            addr,
            Block {
                size,
                segment,
                state: State::Live,
            },
        );
        if bsize > size {
            let rest = addr + size as u64;
            self.blocks.insert(
                rest,
                Block {
                    size: bsize - size,
                    segment,
                    state: State::Free(stream),
                },
            );
            self.free_set(stream, kind).insert((bsize - size, rest));
        }
        Some(addr)
    }

    /// Moves blocks whose event completed to the settled free set.
    fn collect_pending(&mut self, events: &dyn EventSource) -> Result<bool> {
        let mut moved = false;
        let mut i = 0;
        while i < self.pending.len() {
            self.stats.event_queries += 1;
            if events.is_complete(self.pending[i].0)? {
                let (id, addrs) = self.pending.swap_remove(i);
                events.recycle(id);
                for a in addrs {
                    if let Some(b) = self.blocks.remove(&a) {
                        self.stats.cross_stream_reuses += 1;
                        self.insert_free(a, b.size, b.segment, SETTLED);
                        moved = true;
                    }
                }
            } else {
                i += 1;
            }
        }
        Ok(moved)
    }

    /// Parks the free blocks of every other stream until an event on that stream
    /// completes: a default stream gets an event recorded now; a created stream
    /// uses the event recorded at its latest free (it may be destroyed since, so
    /// nothing is recorded on it here); a stream with uncovered blocks is skipped.
    fn steal_from_other_streams(
        &mut self,
        events: &dyn EventSource,
        stream: StreamKey,
    ) -> Result<bool> {
        self.stats.scan_steps += self.free.len();
        self.free
            .retain(|(s, _), set| *s == SETTLED || !set.is_empty());
        let donors: Vec<StreamKey> = self
            .free
            .iter()
            .filter(|((s, _), set)| *s != stream && *s != SETTLED && !set.is_empty())
            .map(|((s, _), _)| *s)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut any = false;
        for donor in donors {
            let id = if is_default_stream(donor) {
                self.stats.events_recorded += 1;
                events.record(emm_sys::CUstream(donor as *mut core::ffi::c_void))?
            } else {
                let st = self.streams.entry(donor).or_default();
                if st.uncovered {
                    continue;
                }
                match st.last_event.take() {
                    Some(id) => id,
                    None => continue,
                }
            };
            let mut addrs = Vec::new();
            for kind in [Kind::Small, Kind::Large] {
                if let Some(set) = self.free.get_mut(&(donor, kind)) {
                    for (_, a) in std::mem::take(set) {
                        if let Some(b) = self.blocks.get_mut(&a) {
                            b.state = State::Pending;
                        }
                        addrs.push(a);
                    }
                }
            }
            self.pending.push((id, addrs));
            any = true;
        }
        Ok(any)
    }

    /// Free bytes held by streams whose blocks no other stream can take before a
    /// device-wide synchronization (blocks given back without an event: thread
    /// exit, a thread cache evicting a stream it may no longer see). When they are
    /// at least the request and an eighth of what is reserved, one synchronization
    /// makes them usable by every stream instead of reserving more: a pool that
    /// sees many streams reserves for what is live, not per stream. Returns `true`
    /// if it synchronized.
    fn reclaim_stranded(&mut self, size: usize, events: &dyn EventSource) -> Result<bool> {
        self.stats.scan_steps += self.free.len();
        let stranded: usize = self
            .free
            .iter()
            .filter(|((s, _), _)| {
                *s != SETTLED && self.streams.get(s).is_some_and(|st| st.uncovered)
            })
            .flat_map(|(_, set)| set.iter().map(|&(n, _)| n))
            .sum();
        if stranded == 0 || stranded < size.max(self.stats.reserved / 8) {
            return Ok(false);
        }
        self.consolidate(events)?;
        Ok(true)
    }

    /// New memory lands among `stream`'s free blocks. A created stream records an
    /// event now, while it is surely alive (the caller allocates on it), so that
    /// other streams can take the rest of the new segment once the event completes
    /// instead of each reserving a segment of its own. One event per growth.
    fn cover_fresh(&mut self, stream: StreamKey, events: &dyn EventSource) {
        if is_default_stream(stream) || stream == SETTLED {
            return;
        }
        self.stats.events_recorded += 1;
        let Ok(id) = events.record(emm_sys::CUstream(stream as *mut core::ffi::c_void)) else {
            return; // the rest of the segment stays with the stream, as before
        };
        let st = self.streams.entry(stream).or_default();
        if let Some(old) = st.last_event.replace(id) {
            events.recycle(old);
        }
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
        match self.try_alloc(size, stream, events, source, true)? {
            Some(r) => Ok(r),
            None => unreachable_fit(size),
        }
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
        let kind = Kind::of(size);
        self.stats.locked_allocs += 1;
        if let Some(a) = self.take_fit(size, kind, stream) {
            self.stats.hits += 1;
            return Ok(Some(self.finish(a, size)));
        }
        let settled = |me: &mut Self| me.take_fit(size, kind, SETTLED);
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
        if kind == Kind::Large && self.policy.expandable {
            match self.expand(size, stream, source) {
                Ok(true) => {
                    self.stats.misses += 1;
                    self.cover_fresh(stream, events);
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
        self.stats.misses += 1;
        self.cover_fresh(stream, events);
        let a = self.take_fit(size, kind, stream).unwrap_or(base);
        Ok(Some(self.finish(a, size)))
    }

    fn finish(&mut self, addr: CUdeviceptr, size: usize) -> (CUdeviceptr, CUdeviceptr, usize) {
        self.stats.live += size;
        self.stats.peak_live = self.stats.peak_live.max(self.stats.live);
        let segment = self.blocks.get(&addr).map_or(addr, |b| b.segment);
        let seg_size = self.segments.get(&segment).map_or(size, |s| s.size);
        (addr, segment, seg_size)
    }

    fn grow(
        &mut self,
        seg: usize,
        kind: Kind,
        stream: StreamKey,
        source: &dyn SegmentSource,
    ) -> Result<CUdeviceptr> {
        if let Some(limit) = self.limit {
            if self.stats.reserved + seg > limit {
                let (free, total) = source.device_info();
                return Err(EmmError::OutOfMemory {
                    what: "device",
                    manager: "pool".into(),
                    requested: seg,
                    free,
                    total,
                    detail: format!(
                        "the pool's byte limit of {} would be exceeded",
                        emm_core::fmt_bytes(limit)
                    ),
                });
            }
        }
        let base = source.alloc_segment(seg)?;
        self.segments.insert(
            base,
            Segment {
                size: seg,
                kind,
                expandable: None,
            },
        );
        self.stats.reserved += seg;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        self.stats.upstream_allocs += 1;
        self.stats.segments += 1;
        self.stats.peak_segments = self.stats.peak_segments.max(self.stats.segments);
        self.history
            .push(TraceAction::SegmentAlloc, base, seg, stream_id(stream));
        self.insert_free(base, seg, base, stream);
        Ok(base)
    }

    #[allow(clippy::too_many_arguments)] // reason: the ladder needs the whole request
    fn oom_ladder(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
        first: EmmError,
    ) -> Result<(CUdeviceptr, CUdeviceptr, usize)> {
        self.stats.oom_ladders += 1;
        // 1. Wait for the work of every stream holding free blocks; those blocks
        //    become usable by any stream, and coalesce.
        self.consolidate(events)?;
        if let Some(a) = self.take_fit(size, kind, SETTLED) {
            return Ok(self.finish(a, size));
        }
        // 2. Give back every wholly free segment.
        self.release_free_segments(source);
        // 3. Retry the upstream.
        let seg = self.policy.segment_for(size, kind);
        let retry = self.grow(seg, kind, stream, source).or_else(|_| {
            // A smaller, exact segment may still fit.
            self.grow(size.div_ceil(2 << 20) * (2 << 20), kind, stream, source)
        });
        match retry {
            Ok(_) => {
                self.stats.misses += 1;
                let a = self
                    .take_fit(size, kind, stream)
                    .or_else(|| self.take_fit(size, kind, SETTLED))
                    .ok_or_else(|| first.clone())?;
                Ok(self.finish(a, size))
            }
            Err(_) => {
                let (free, total) = source.device_info();
                self.stats.ooms += 1;
                self.history
                    .push_oom_aware(TraceAction::Oom, 0, size, stream_id(stream), free);
                Err(EmmError::OutOfMemory {
                    what: "device",
                    manager: "pool".into(),
                    requested: size,
                    free,
                    total,
                    detail: format!(
                        "live {}, reserved {}, largest free block {}, after releasing cached segments",
                        emm_core::fmt_bytes(self.stats.live),
                        emm_core::fmt_bytes(self.stats.reserved),
                        emm_core::fmt_bytes(self.largest_free()),
                    ),
                })
            }
        }
    }

    /// Grows the expandable segment so that a free block of `stream` at its end
    /// holds `size` bytes. `Ok(false)`: no virtual memory here.
    fn expand(
        &mut self,
        size: usize,
        stream: StreamKey,
        source: &dyn SegmentSource,
    ) -> Result<bool> {
        let base = match self.grow_base {
            Some(0) => return Ok(false),
            Some(b) => b,
            None => match source.reserve(self.policy.expandable_reserve)? {
                Some(b) => {
                    self.grow_base = Some(b);
                    self.segments.insert(
                        b,
                        Segment {
                            size: 0,
                            kind: Kind::Large,
                            expandable: Some((self.policy.expandable_reserve, Vec::new())),
                        },
                    );
                    self.stats.segments += 1;
                    self.stats.peak_segments = self.stats.peak_segments.max(self.stats.segments);
                    b
                }
                None => {
                    self.grow_base = Some(0);
                    return Ok(false);
                }
            },
        };
        let (mapped, reserve) = match self.segments.get(&base) {
            Some(Segment {
                size,
                expandable: Some((r, _)),
                ..
            }) => (*size, *r),
            _ => return Ok(false),
        };
        let end = base + mapped as u64;
        let tail_free = match self.blocks.range(..end).next_back() {
            Some((&a, b)) if b.state == State::Free(stream) && a + b.size as u64 == end => b.size,
            _ => 0,
        };
        // Grow by what the request lacks, at least the step: over-reserving by a
        // fraction of what is mapped cost 2-3 % of the footprint on the recorded
        // training traces for a handful of driver calls.
        let grow = (size - tail_free).max(self.policy.expand_step);
        let grow = grow.div_ceil(self.policy.large_round) * self.policy.large_round;
        if mapped + grow > reserve {
            return Ok(false);
        }
        if let Some(limit) = self.limit {
            if self.stats.reserved + grow > limit {
                let (free, total) = source.device_info();
                return Err(EmmError::OutOfMemory {
                    what: "device",
                    manager: "pool".into(),
                    requested: grow,
                    free,
                    total,
                    detail: format!(
                        "the pool's byte limit of {} would be exceeded",
                        emm_core::fmt_bytes(limit)
                    ),
                });
            }
        }
        source.map(end, grow)?;
        if let Some(Segment {
            size,
            expandable: Some((_, pieces)),
            ..
        }) = self.segments.get_mut(&base)
        {
            pieces.push((mapped, grow));
            *size += grow;
        }
        self.stats.reserved += grow;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        self.stats.upstream_allocs += 1;
        self.history
            .push(TraceAction::SegmentMap, end, grow, stream_id(stream));
        self.insert_free(end, grow, base, stream);
        Ok(true)
    }

    /// Unmaps the mapped pieces at the end of the expandable segment that lie
    /// wholly in a free block; returns bytes released.
    #[allow(clippy::while_let_loop)] // reason: the loop stops at any of several checks
    fn shrink_expandable(&mut self, source: &dyn SegmentSource) -> usize {
        let Some(base) = self.grow_base.filter(|&b| b != 0) else {
            return 0;
        };
        let mut released = 0;
        loop {
            let Some(Segment {
                size: mapped,
                expandable: Some((_, pieces)),
                ..
            }) = self.segments.get(&base)
            else {
                break;
            };
            let Some(&(off, len)) = pieces.last() else {
                break;
            };
            let mapped = *mapped;
            let end = base + mapped as u64;
            let piece_start = base + off as u64;
            let Some((&a, &b)) = self.blocks.range(..end).next_back() else {
                break;
            };
            let State::Free(stream) = b.state else { break };
            if a + b.size as u64 != end || a > piece_start {
                break;
            }
            if let Err(e) = source.unmap(piece_start, len) {
                tracing::error!(error = %e, "unmapping a piece of the expandable segment failed");
                break;
            }
            self.free_set(stream, Kind::Large).remove(&(b.size, a));
            self.blocks.remove(&a);
            if a < piece_start {
                let rest = (piece_start - a) as usize;
                self.blocks.insert(
                    a,
                    Block {
                        size: rest,
                        segment: base,
                        state: State::Free(stream),
                    },
                );
                self.free_set(stream, Kind::Large).insert((rest, a));
            }
            if let Some(Segment {
                size,
                expandable: Some((_, pieces)),
                ..
            }) = self.segments.get_mut(&base)
            {
                pieces.pop();
                *size -= len;
            }
            self.stats.reserved -= len;
            self.stats.upstream_frees += 1;
            self.history.push(
                TraceAction::SegmentUnmap,
                piece_start,
                len,
                stream_id(stream),
            );
            released += len;
        }
        released
    }

    /// Records an event on every stream holding free blocks, waits for all pending
    /// events, and makes those blocks settled (usable by any stream, coalesced).
    pub fn consolidate(&mut self, events: &dyn EventSource) -> Result<()> {
        // One device-wide synchronization covers every stream, destroyed ones too.
        self.stats.device_syncs += 1;
        events.synchronize_all()?;
        for (id, addrs) in std::mem::take(&mut self.pending) {
            events.recycle(id);
            for a in addrs {
                if let Some(b) = self.blocks.remove(&a) {
                    self.insert_free(a, b.size, b.segment, SETTLED);
                }
            }
        }
        self.stats.scan_steps += self.free.len();
        let keys: Vec<(StreamKey, Kind)> = self
            .free
            .keys()
            .filter(|(s, _)| *s != SETTLED)
            .copied()
            .collect();
        for key in keys {
            for (size, a) in self.free.remove(&key).unwrap_or_default() {
                if let Some(b) = self.blocks.remove(&a) {
                    self.insert_free(a, size, b.segment, SETTLED);
                }
            }
        }
        for (_, st) in self.streams.drain() {
            if let Some(id) = st.last_event {
                events.recycle(id);
            }
        }
        Ok(())
    }

    /// The largest free block, any stream.
    pub fn largest_free(&self) -> usize {
        self.free
            .values()
            .filter_map(|s| s.iter().next_back().map(|(sz, _)| *sz))
            .max()
            .unwrap_or(0)
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
        match self.blocks.get(&addr) {
            Some(b) if b.state == State::Live => {
                let b = *b;
                self.stats.locked_frees += 1;
                self.blocks.remove(&addr);
                self.stats.live -= b.size;
                self.insert_free(addr, b.size, b.segment, stream);
                if !is_default_stream(stream) && stream != SETTLED {
                    self.stats.events_recorded += usize::from(events.is_some());
                    let recorded = events
                        .map(|ev| ev.record(emm_sys::CUstream(stream as *mut core::ffi::c_void)));
                    let st = self.streams.entry(stream).or_default();
                    match recorded {
                        Some(Ok(id)) => {
                            if let (Some(old), Some(ev)) = (st.last_event.replace(id), events) {
                                ev.recycle(old);
                            }
                        }
                        _ => st.uncovered = true,
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// Gives every wholly free segment back to the upstream; returns bytes released.
    pub fn release_free_segments(&mut self, source: &dyn SegmentSource) -> usize {
        let whole: Vec<(CUdeviceptr, usize, StreamKey, Kind)> = self
            .segments
            .iter()
            .filter(|(_, seg)| seg.expandable.is_none())
            .filter_map(|(&base, seg)| match self.blocks.get(&base) {
                Some(b) if b.size == seg.size => match b.state {
                    State::Free(s) => Some((base, seg.size, s, seg.kind)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let mut released = 0;
        for (base, size, stream, kind) in whole {
            if let Err(e) = source.free_segment(base, size) {
                tracing::error!(error = %e, base, size, "returning a segment to the upstream failed; keeping it");
                continue;
            }
            self.free_set(stream, kind).remove(&(size, base));
            self.blocks.remove(&base);
            self.segments.remove(&base);
            self.stats.reserved -= size;
            self.stats.upstream_frees += 1;
            self.stats.segments -= 1;
            self.history
                .push(TraceAction::SegmentFree, base, size, stream_id(stream));
            released += size;
        }
        released + self.shrink_expandable(source)
    }

    /// Every segment, for reset: `(base, size)`.
    pub fn drain_segments(&mut self, source: &dyn SegmentSource) -> Vec<(CUdeviceptr, usize)> {
        let mut segs = Vec::new();
        for (&b, s) in &self.segments {
            match &s.expandable {
                None => {
                    self.history.push(TraceAction::SegmentFree, b, s.size, 0);
                    segs.push((b, s.size));
                }
                Some((_, pieces)) => {
                    for &(off, len) in pieces.iter().rev() {
                        self.history
                            .push(TraceAction::SegmentUnmap, b + off as u64, len, 0);
                        if let Err(e) = source.unmap(b + off as u64, len) {
                            tracing::error!(error = %e, "unmapping during reset failed");
                        }
                    }
                }
            }
        }
        if let Some(b) = self.grow_base.filter(|&b| b != 0) {
            if let Some(seg) = self.segments.get_mut(&b) {
                seg.size = 0;
                if let Some((_, p)) = &mut seg.expandable {
                    p.clear();
                }
            }
        }
        self.segments.retain(|_, s| s.expandable.is_some());
        self.blocks.clear();
        self.free.clear();
        self.pending.clear();
        self.stats.reserved = 0;
        self.stats.live = 0;
        self.stats.segments = self.segments.len();
        segs
    }

    /// Bytes of free blocks that are not a whole segment (PyTorch's
    /// `inactive_split_bytes`): one pass over the free blocks.
    pub fn inactive_split_bytes(&self) -> usize {
        self.blocks
            .values()
            .filter(|b| b.state != State::Live)
            .filter(|b| {
                self.segments
                    .get(&b.segment)
                    .is_some_and(|s| b.size < s.size)
            })
            .map(|b| b.size)
            .sum()
    }

    /// Every segment with memory behind it and its blocks, in address order. Live
    /// blocks (held by callers or parked in thread caches) are `allocated`; free and
    /// pending ones are not.
    pub fn snapshot_segments(&self) -> Vec<SnapshotSegment> {
        self.segments
            .iter()
            .filter(|(_, seg)| seg.size > 0)
            .map(|(&base, seg)| SnapshotSegment {
                address: base,
                total_size: seg.size,
                stream: 0,
                large: seg.kind == Kind::Large,
                expandable: seg.expandable.is_some(),
                blocks: self
                    .blocks
                    .range(base..base + seg.size as u64)
                    .map(|(&a, b)| SnapshotBlock {
                        address: a,
                        size: b.size,
                        requested_size: b.size,
                        allocated: b.state == State::Live,
                    })
                    .collect(),
            })
            .collect()
    }

    /// Pending event groups (for tests and statistics).
    pub fn pending_groups(&self) -> usize {
        self.pending.len()
    }

    /// Checks the arena's internal consistency; returns what is wrong.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut live = 0;
        for (&base, seg) in &self.segments {
            let mut at = base;
            let end = base + seg.size as u64;
            for (&a, b) in self.blocks.range(base..end) {
                if a != at {
                    return Err(format!(
                        "gap or overlap in segment {base:#x} at {a:#x} (expected {at:#x})"
                    ));
                }
                if b.segment != base {
                    return Err(format!(
                        "block {a:#x} names segment {:#x}, lies in {base:#x}",
                        b.segment
                    ));
                }
                if let State::Free(s) = b.state {
                    if !self
                        .free
                        .get(&(s, seg.kind))
                        .is_some_and(|set| set.contains(&(b.size, a)))
                    {
                        return Err(format!("free block {a:#x} missing from its free set"));
                    }
                }
                if b.state == State::Live {
                    live += b.size;
                }
                at = a + b.size as u64;
            }
            if at != end {
                return Err(format!(
                    "segment {base:#x} blocks end at {at:#x}, segment ends at {end:#x}"
                ));
            }
        }
        if live != self.stats.live {
            return Err(format!(
                "live bytes {} by blocks, {} by counter",
                live, self.stats.live
            ));
        }
        let reserved: usize = self.segments.values().map(|s| s.size).sum();
        if reserved != self.stats.reserved {
            return Err(format!(
                "reserved {} by segments, {} by counter",
                reserved, self.stats.reserved
            ));
        }
        Ok(())
    }
}

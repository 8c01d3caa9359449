//! Which free block a request takes: best fit among a stream's free blocks of a
//! kind, with the arena's rules on exclusive segments and ties.

use emm_sys::CUdeviceptr;

use super::*;

/// How many more free blocks of the best fit's size best fit compares by
/// segment age and offset, without the expandable segment (see
/// `Arena::fit_in`).
const TIES: usize = 64;

impl Arena {
    /// Makes `size` bytes at `addr` a free block of `stream`, coalesced with a free
    /// neighbour of the same stream and segment on each side (see
    /// [`BlockHeap::insert_free`]). A block entry already at `addr` (the live block
    /// being freed) is replaced, so a caller need not remove it first.
    ///
    /// Without the expandable segment, settled neighbours join too (and become
    /// `stream`'s): a block freed on a stream beside settled ones (those a
    /// synchronization left free) otherwise stays apart from them, and free
    /// space that no request can span piles up in the plain segments, which
    /// cannot be remapped. Over 100 passes of the eighteen recorded traces (with
    /// tightening at 120 %, `SegmentPolicy::tight_percent`) the footprint's mean
    /// fell from 1.337x to 1.207x of live and its worst from 1.806x to 1.576x,
    /// with no driver allocation after pass 10 (sixteen tighter; looser
    /// `gpt2_infer_h200.csv`, 1.213 to 1.506, and `h200_train_midway.pickle`,
    /// 1.145 to 1.159; joining only large or only small blocks did worse;
    /// `docs/benchmarks.md`, thirty-ninth session). With the
    /// expandable segment nothing changes: moving pieces already joins free
    /// space there, and the traces' figures held or rose (one from 1.041x to
    /// 1.051x).
    ///
    /// Not for a stream whose free blocks wait for a device-wide synchronization
    /// (a free without an event): settled memory joined there would wait with
    /// them.
    pub(super) fn insert_free(
        &mut self,
        addr: CUdeviceptr,
        size: usize,
        segment: CUdeviceptr,
        stream: StreamKey,
    ) {
        let join = self.joins_settled(stream);
        self.insert_free_joining(addr, size, segment, stream, join);
    }

    /// Whether a free on `stream` joins its settled neighbours (see
    /// [`Arena::insert_free`]).
    pub(super) fn joins_settled(&self, stream: StreamKey) -> bool {
        stream != SETTLED && self.plain_segments_only() && !self.order.is_uncovered(stream)
    }

    /// As [`Arena::insert_free`], joining settled neighbours when `join` says so.
    pub(super) fn insert_free_joining(
        &mut self,
        addr: CUdeviceptr,
        size: usize,
        segment: CUdeviceptr,
        stream: StreamKey,
        join: bool,
    ) {
        let kind = self.segments.get(&segment).map_or(Kind::Large, |s| s.kind);
        let also = join.then_some(SETTLED);
        self.heap
            .insert_free(addr, size, segment, stream, kind, also);
    }

    /// The best-fitting free block of `stream` and `kind` for `size` bytes: the
    /// smallest that holds it, except that a block of an exclusive segment (a
    /// large segment of one request's size, made without the expandable segment,
    /// of at least [`SegmentPolicy::exclusive`] bytes; off by default) serves only a request that
    /// wastes at most an eighth of the segment, or a shared segment's size.
    /// Splitting one for a smaller tensor pins the whole segment under that tensor,
    /// so it is never wholly free and cannot be given back when the shapes change:
    /// with variable batch sizes, segments of past shapes then pile up (1.74x of
    /// live in GPT-2 inference on an H200; PyTorch's default allocator, which has
    /// a similar rule only when `max_split_size_mb` is set, reached 1.85x).
    /// Among the blocks of segment `only` when given.
    fn fit_in(
        &self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
        only: Option<CUdeviceptr>,
    ) -> Option<(usize, CUdeviceptr)> {
        let shared = self.policy.large_segment;
        // A block that wastes at most a shared segment qualifies anywhere (every
        // small block does): only a looser fit looks its segment up. Exclusive
        // blocks that do not qualify are skipped: blocks of the expandable segment
        // or of shared segments may follow them.
        let mut fits = self
            .heap
            .fits(size, kind, stream)
            .filter(|&(_, addr)| {
                only.is_none_or(|seg| self.heap.get(addr).is_some_and(|b| b.segment == seg))
            })
            .filter(|&(bsize, addr)| {
                bsize - size <= shared
                    || self
                        .exclusive_segment(addr)
                        .is_none_or(|seg| bsize - size <= seg / 8)
            });
        let first = fits.next()?;
        if !self.plain_segments_only() {
            return Some(first);
        }
        // Among free blocks of the same size, the oldest segment's, then the
        // lowest offset in it: not the lowest address, which is where the driver
        // happened to put a segment. Plain segments lie in whatever order
        // `cuMemAlloc` returns them (the host stand-in's rise as they are made),
        // and choosing by address made the same trace settle at 1.449x of live
        // on the host and 1.532x on an H200 (`gpt2_h200.csv`; 1.460-1.615x with
        // the stand-in's addresses in three other orders).
        let order = |&(_, addr): &(usize, CUdeviceptr)| {
            self.heap
                .get(addr)
                .and_then(|b| {
                    self.segments
                        .get(&b.segment)
                        .map(|s| (s.made, addr - b.segment))
                })
                .unwrap_or((u64::MAX, addr))
        };
        // (At most the first TIES of them, by address: the walk stays bounded on
        // a pool with very many free blocks of one size.)
        std::iter::once(first)
            .chain(fits.take_while(|&(bsize, _)| bsize == first.0).take(TIES))
            .min_by_key(order)
    }

    /// The size of the segment holding the block at `addr` when that segment
    /// serves only requests of about its size (see [`SegmentPolicy::exclusive`]; a
    /// merged segment never does).
    fn exclusive_segment(&self, addr: CUdeviceptr) -> Option<usize> {
        let b = self.heap.get(addr)?;
        if self.is_expandable(b.segment) || self.segments.is_home(b.segment) {
            return None;
        }
        self.segments
            .get(&b.segment)
            .filter(|s| {
                !s.merged
                    && s.kind == Kind::Large
                    && s.size > self.policy.large_segment
                    && s.size >= self.policy.exclusive
            })
            .map(|s| s.size)
    }

    /// Best fit among `stream`'s free blocks of `kind` (see [`Arena::fit_in`]);
    /// splits off the remainder. Returns the block's address and its segment's.
    pub(super) fn take_fit(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
    ) -> Option<(CUdeviceptr, CUdeviceptr)> {
        self.take_fit_in(size, kind, stream, None)
    }

    /// As [`Arena::take_fit`], among the blocks of segment `only` when given.
    pub(super) fn take_fit_in(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
        only: Option<CUdeviceptr>,
    ) -> Option<(CUdeviceptr, CUdeviceptr)> {
        let (_, addr) = self.fit_in(size, kind, stream, only)?;
        let segment = self.heap.take(addr, size)?;
        Some((addr, segment))
    }

    /// The largest free block, any stream.
    pub fn largest_free(&self) -> usize {
        self.heap.largest_free()
    }
}

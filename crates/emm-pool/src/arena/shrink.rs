//! Giving memory back: the expandable segment's pieces at its end or all of it,
//! wholly free plain segments, tightening before a new large segment, and a
//! reset's draining of every segment.

use emm_core::TraceAction;
use emm_sys::CUdeviceptr;

use super::*;
use crate::events::EventSource;

impl Arena {
    /// When no block of the expandable segment is held or pending, unmaps all of it
    /// and starts it again at its base, so its address space is used again;
    /// returns the bytes released. The pieces go first (as `trim` unmaps idle
    /// pieces, [`Arena::release_free_pieces`]), and only once every one of them
    /// went is the segment's bookkeeping reset: a piece the driver refused to
    /// unmap stays mapped in its free block, known, for the next trim (had the
    /// segment been reset over it, growth would map there again and the driver
    /// answer `CUDA_ERROR_ALREADY_MAPPED` for good).
    fn reset_expandable(&mut self, source: &dyn SegmentSource) -> usize {
        let Some(base) = self.expandable.base() else {
            return 0;
        };
        let Some(seg) = self.segments.get(&base) else {
            return 0;
        };
        let end = base + seg.size as u64;
        if seg.size == seg.retired
            || !self.expandable.retiring.is_empty()
            || self
                .heap
                .blocks()
                .walk(base, end)
                .any(|(_, b)| matches!(b.state, State::Live | State::Pending))
        {
            return 0;
        }
        let released = self.release_free_pieces(source);
        let Some(seg) = self.segments.get(&base) else {
            return released;
        };
        let end = base + seg.size as u64;
        if !self.expandable.retiring.is_empty() || !self.expandable.pieces.is_empty() {
            // A mapping stayed (a piece that failed to unmap, one in a block of a
            // stream not settled, or an old mapping of a moved piece waiting).
            return released;
        }
        // Nothing is mapped any more: only gaps (and free blocks without a whole
        // piece) are left; the segment starts again at its base.
        let blocks: Vec<CUdeviceptr> = self.heap.blocks().walk(base, end).map(|(a, _)| a).collect();
        for a in blocks {
            self.heap.remove(a);
        }
        if let Some(seg) = self.segments.get_mut(&base) {
            seg.size = 0;
            seg.retired = 0;
        }
        released
    }

    /// Unmaps the mapped pieces at the end of the expandable segment that lie
    /// wholly in a free block; returns bytes released. Nothing while old mappings
    /// of moved pieces still wait: a piece's memory may then be mapped at two
    /// addresses, and unmapping one would give nothing back.
    #[allow(clippy::while_let_loop)] // reason: the loop stops at any of several checks
    pub(super) fn shrink_expandable(&mut self, source: &dyn SegmentSource) -> usize {
        let Some(base) = self.expandable.base() else {
            return 0;
        };
        if !self.expandable.retiring.is_empty() {
            return 0;
        }
        let mut released = 0;
        loop {
            let Some(&Segment { size: mapped, .. }) = self.segments.get(&base) else {
                break;
            };
            let Some(Piece { offset: off, len }) = self.expandable.pieces.last() else {
                break;
            };
            let end = base + mapped as u64;
            let piece_start = base + off as u64;
            let Some((a, &b)) = self.heap.blocks().ending_at(end) else {
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
            self.heap.remove(a);
            if a < piece_start {
                let rest = (piece_start - a) as usize;
                // (Not known idle: this path has no event for it.)
                self.heap
                    .put(a, Block::new(rest, base, State::Free(stream), Kind::Large));
            }
            self.expandable.pieces.pop();
            if let Some(seg) = self.segments.get_mut(&base) {
                seg.size -= len;
            }
            self.sub_reserved(len);
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

    /// Gives every wholly free segment back to the upstream (and the old mappings
    /// of moved pieces, after their work); returns bytes released.
    pub fn release_free_segments(
        &mut self,
        source: &dyn SegmentSource,
        events: &dyn EventSource,
    ) -> usize {
        self.unmap_retired(events, source, true);
        let released = self.release_whole_segments(source, None) + self.release_home(source);
        // A merge after this sizes the pool afresh (see `merge.rs`).
        self.forget_merges();
        self.expandable.ask_again();
        let whole = self.reset_expandable(source);
        released
            + if whole > 0 {
                whole
            } else {
                self.shrink_expandable(source)
            }
    }

    /// Without the expandable segment (no virtual memory, or turned off for IPC), a
    /// large request that would take a new segment while the pool already reserves
    /// more than `tight_percent` % of the peak of live bytes (or of what is live
    /// plus the request, when more) first waits for
    /// the device (one synchronization), reuses what then fits, and otherwise gives
    /// back the wholly free large segments, so exact-size segments of past shapes
    /// do not pile up. Returns the block when one fits after the wait.
    pub(super) fn tighten(
        &mut self,
        size: usize,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
    ) -> Result<Option<(CUdeviceptr, CUdeviceptr, usize)>> {
        let Some(percent) = self.policy.tight_percent else {
            return Ok(None);
        };
        let seg = self.policy.segment_for(size, Kind::Large);
        // Against the peak of live bytes (since the last reset of peaks), not the
        // live bytes of the moment: the footprint is judged at the peak, and a pool
        // sized for the peak need not give back what the next peak reuses (against
        // the live bytes of the moment, the recorded GPT-2 inference trace
        // synchronized 318 times to reach 1.13x of live; against the peak, 23
        // times for 1.14x).
        let floor = (self.stats.live + size).max(self.stats.peak_live);
        let bound = floor as u128 * u128::from(percent) / 100;
        // (Asking for more wholly free bytes before synchronizing, say the excess,
        // saved no synchronization on the recorded traces and let inference grow to
        // 1.90x; the test below bounds the synchronizations instead.)
        if ((self.stats.reserved + seg) as u128) <= bound
            || self.whole_free(Kind::Large).next().is_none()
        {
            return Ok(None);
        }
        if let Err(e) = self.consolidate(events) {
            // Growing stays possible: the miss goes on as before this policy.
            tracing::warn!(error = %e, "synchronizing to give back free segments failed; growing instead");
            return Ok(None);
        }
        self.stats.counts.tightenings += 1;
        if let Some(a) = self.take_fit(size, Kind::Large, SETTLED) {
            self.stats.hits += 1;
            return Ok(Some(self.finish(a, size)));
        }
        // All of them: giving back only enough to get under the bound kept more
        // segments but synchronized about four times as often on the recorded
        // traces (the pool was back at the bound a few requests later).
        self.release_whole_segments(source, Some(Kind::Large));
        Ok(None)
    }

    /// The wholly free plain segments of `kind` (not the expandable one, nor
    /// the home segment: `home.rs`).
    pub(super) fn whole_free(&self, kind: Kind) -> impl Iterator<Item = &Segment> + '_ {
        self.segments
            .iter()
            .filter(move |(&base, seg)| {
                !self.is_expandable(base) && !self.segments.is_home(base) && seg.kind == kind
            })
            .filter(|(&base, seg)| {
                matches!(self.heap.get(base), Some(b) if b.size == seg.size && matches!(b.state, State::Free(_)))
            })
            .map(|(_, seg)| seg)
    }

    /// Gives back the wholly free segments (of `only` kind, when given), not the
    /// expandable one nor the home segment (`home.rs`); returns the bytes
    /// released.
    pub(super) fn release_whole_segments(
        &mut self,
        source: &dyn SegmentSource,
        only: Option<Kind>,
    ) -> usize {
        self.release_whole_segments_until(source, only, None, 0)
    }

    /// As [`Arena::release_whole_segments`], only the segments free on `stream`
    /// when one is given, stopping once the family reserves no more than `until`
    /// bytes.
    pub(super) fn release_whole_segments_until(
        &mut self,
        source: &dyn SegmentSource,
        only: Option<Kind>,
        stream: Option<StreamKey>,
        until: usize,
    ) -> usize {
        let whole: Vec<(CUdeviceptr, usize, StreamKey)> = self
            .segments
            .iter()
            .filter(|(&base, seg)| {
                !self.is_expandable(base)
                    && !self.segments.is_home(base)
                    && only.is_none_or(|k| seg.kind == k)
            })
            .filter_map(|(&base, _)| {
                let (size, s) = self.wholly_free(base)?;
                stream.is_none_or(|t| t == s).then_some((base, size, s))
            })
            .collect();
        let mut released = 0;
        for (base, size, stream) in whole {
            if self.family_reserved() <= until {
                break;
            }
            if self.give_back_segment(base, size, stream, source) {
                released += size;
            }
        }
        released
    }

    /// The size of the plain segment at `base` and the stream it is free on,
    /// when it is one free block.
    pub(super) fn wholly_free(&self, base: CUdeviceptr) -> Option<(usize, StreamKey)> {
        let seg = self.segments.get(&base)?;
        match self.heap.get(base) {
            Some(b) if b.size == seg.size => match b.state {
                State::Free(s) => Some((seg.size, s)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Gives the wholly free plain segment of `size` bytes at `base` (free on
    /// `stream`) back to the upstream; false, keeping it, when the upstream
    /// refuses.
    pub(super) fn give_back_segment(
        &mut self,
        base: CUdeviceptr,
        size: usize,
        stream: StreamKey,
        source: &dyn SegmentSource,
    ) -> bool {
        if let Err(e) = source.free_segment(base, size) {
            tracing::error!(error = %e, base, size, "returning a segment to the upstream failed; keeping it");
            self.refusal.get_or_insert(e);
            return false;
        }
        self.heap.remove(base);
        self.segments.remove(&base);
        self.count_segments();
        self.sub_reserved(size);
        self.stats.upstream_frees += 1;
        self.history
            .push(TraceAction::SegmentFree, base, size, stream_id(stream));
        true
    }

    /// Every segment, for reset: `(base, size)`.
    /// Events still held (of pending blocks, and each stream's last) go back to
    /// `events`.
    pub fn drain_segments(
        &mut self,
        source: &dyn SegmentSource,
        events: &dyn EventSource,
    ) -> Vec<(CUdeviceptr, usize)> {
        self.forget_merges();
        self.drop_idle_marks(events);
        self.forget_streams_served();
        self.stats.counts.pieces_unmapped += self.expandable.settle_jobs();
        let mut segs = Vec::new();
        let mut stuck = false;
        let expandable = self.expandable.base();
        for (&b, s) in &self.segments {
            match Some(b) == expandable {
                false => {
                    self.history.push(TraceAction::SegmentFree, b, s.size, 0);
                    segs.push((b, s.size));
                }
                true => {
                    let pieces = &self.expandable.pieces;
                    for &Piece { offset: off, len } in pieces.as_slice().iter().rev() {
                        self.history
                            .push(TraceAction::SegmentUnmap, b + off as u64, len, 0);
                        if let Err(e) = source.unmap(b + off as u64, len) {
                            tracing::error!(error = %e, "unmapping during reset failed; the pool reserves new address space for its next growth");
                            stuck = true;
                        }
                    }
                }
            }
        }
        self.expandable.ask_again();
        if stuck {
            // A mapping the driver kept: its address space is not used again (growth
            // there would fail with `CUDA_ERROR_ALREADY_MAPPED`); the virtual memory
            // keeps it and retries on drop, and the next growth reserves anew.
            if let Some(b) = self.expandable.give_up() {
                self.segments.remove(&b);
            }
        }
        if let Some(b) = self.expandable.base() {
            if let Some(seg) = self.segments.get_mut(&b) {
                seg.size = 0;
                seg.retired = 0;
            }
        }
        self.segments.keep_only(self.expandable.base());
        self.ask_home_again();
        self.heap.clear();
        self.order.clear(events);
        // Its pieces were unmapped above; the old mappings waiting go with them,
        // and a pause's unmapped pieces and kept bytes with the blocks they held.
        self.expandable.clear(events);
        let held = self.stats.reserved;
        self.sub_reserved(held);
        self.family.sub_active(self.stats.live);
        self.stats.live = 0;
        self.count_segments();
        segs
    }
}

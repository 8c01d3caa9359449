//! Growth and release: new segments, the expandable segment mapped and unmapped, segments given back.

use emm_core::{EmmError, Result};
use emm_sys::CUdeviceptr;

use emm_core::TraceAction;

use super::*;

impl Arena {
    pub(super) fn grow(
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

    /// Grows the expandable segment so that a free block of `stream` at its end
    /// holds `size` bytes. `Ok(false)`: no virtual memory here.
    pub(super) fn expand(
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
    pub(super) fn shrink_expandable(&mut self, source: &dyn SegmentSource) -> usize {
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
}

//! Reading the arena: snapshots, split bytes, consistency checks.

use emm_core::{SnapshotBlock, SnapshotSegment};

use super::*;

impl Arena {
    /// Bytes of free blocks that are not a whole segment (PyTorch's
    /// `inactive_split_bytes`): one pass over the free blocks.
    pub fn inactive_split_bytes(&self) -> usize {
        self.heap
            .blocks()
            .values()
            .filter(|b| matches!(b.state, State::Free(_) | State::Pending))
            .filter(|b| {
                self.segments
                    .get(&b.segment)
                    .is_some_and(|s| b.size < s.size)
            })
            .map(|b| b.size)
            .sum()
    }

    /// The make-up of what the pool reserves now, for a growth of `stream` by a
    /// request of `request` bytes (see [`PeakSlack`]; the thread-cached share is
    /// the pool's to fill in). One pass over the free sets and the parked blocks.
    ///
    /// [`PeakSlack`]: crate::slack::PeakSlack
    pub(crate) fn slack(&self, stream: StreamKey, request: usize) -> crate::slack::PeakSlack {
        let mut s = crate::slack::PeakSlack {
            reserved_bytes: self.stats.reserved,
            live_bytes: self.stats.live,
            request_bytes: request,
            ..Default::default()
        };
        for (key, kind, set) in self.heap.free_sets() {
            let bytes: usize = set.iter().map(|&(size, _)| size).sum();
            if bytes == 0 {
                continue;
            }
            match kind {
                Kind::Small => s.small_free_bytes += bytes,
                Kind::Large if key == SETTLED => s.settled_free_bytes += bytes,
                Kind::Large => {
                    s.streams += 1;
                    if key == stream {
                        s.own_stream_free_bytes += bytes;
                    } else {
                        s.other_streams_free_bytes += bytes;
                    }
                }
            }
        }
        s.parked_bytes = self
            .order
            .parked()
            .iter()
            .map(|p| self.parked_bytes(&p.blocks, None))
            .sum();
        s
    }

    /// Every segment with memory behind it and its blocks, in address order. Live
    /// blocks (held by callers or parked in thread caches) are `allocated`; free and
    /// pending ones are not. The expandable segment is reported as its runs of
    /// memory between retired address ranges and gaps (whose memory moved), so
    /// blocks tile every reported segment and segments sum to what is reserved.
    pub fn snapshot_segments(&self) -> Vec<SnapshotSegment> {
        let mut out = Vec::new();
        for (&base, seg) in self.segments.iter().filter(|(_, seg)| seg.size > 0) {
            let mut run: Option<SnapshotSegment> = None;
            for (a, b) in self.heap.blocks().walk(base, base + seg.size as u64) {
                if matches!(b.state, State::Retired | State::Gap) {
                    out.extend(run.take());
                    continue;
                }
                let r = run.get_or_insert_with(|| SnapshotSegment {
                    address: a,
                    total_size: 0,
                    stream: 0,
                    large: seg.kind == Kind::Large,
                    expandable: self.is_expandable(base),
                    blocks: Vec::new(),
                });
                r.total_size += b.size;
                r.blocks.push(SnapshotBlock {
                    address: a,
                    size: b.size,
                    requested_size: b.size,
                    allocated: b.state == State::Live,
                });
            }
            out.extend(run);
        }
        out
    }

    /// Pending event groups (for tests and statistics).
    pub fn pending_groups(&self) -> usize {
        self.order.parked().len()
    }

    /// Checks the arena's internal consistency; returns what is wrong.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.heap.check()?;
        let mut live = 0;
        let mut tiled = 0;
        for (&base, seg) in &self.segments {
            let mut retired = 0;
            let mut at = base;
            let end = base + seg.size as u64;
            // Gaps of the segment, in address order (no piece is mapped in one).
            let mut gaps = Vec::new();
            for (a, b) in self.heap.blocks().walk(base, end) {
                tiled += 1;
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
                if b.kind != seg.kind {
                    return Err(format!(
                        "block {a:#x} is {:?}, its segment {base:#x} {:?}",
                        b.kind, seg.kind
                    ));
                }
                if b.state == State::Live {
                    live += b.size;
                }
                if matches!(b.state, State::Retired | State::Gap) {
                    retired += b.size;
                }
                if b.state == State::Gap {
                    gaps.push((a, a + b.size as u64));
                }
                at = a + b.size as u64;
            }
            if at != end {
                return Err(format!(
                    "segment {base:#x} blocks end at {at:#x}, segment ends at {end:#x}"
                ));
            }
            if self.is_expandable(base) {
                let (reserve, pieces) = (self.expandable.reserve(), &self.expandable.pieces);
                // Past its end, the segment's address space holds no block.
                let past = base + reserve as u64;
                if let Some((&a, _)) = self
                    .heap
                    .blocks()
                    .iter()
                    .find(|(&a, _)| a >= end && a < past)
                {
                    return Err(format!(
                        "block {a:#x} past the end {end:#x} of the expandable segment {base:#x}"
                    ));
                }
                let mut at = 0;
                for &Piece { offset: off, len } in pieces.as_slice() {
                    if off < at || off + len > seg.size {
                        return Err(format!(
                            "segment {base:#x}: piece at offset {off} ({len} bytes) out of order or past its {} bytes",
                            seg.size
                        ));
                    }
                    let addr = base + off as u64;
                    let i = gaps.partition_point(|&(ga, _)| ga <= addr);
                    if let Some(&(ga, gend)) = i.checked_sub(1).and_then(|i| gaps.get(i)) {
                        if addr < gend {
                            return Err(format!(
                                "piece {addr:#x} mapped inside the gap at {ga:#x}"
                            ));
                        }
                    }
                    at = off + len;
                }
            }
            if retired != seg.retired {
                return Err(format!(
                    "segment {base:#x}: {retired} retired bytes by blocks, {} by counter",
                    seg.retired
                ));
            }
        }
        let listed = self
            .expandable
            .base()
            .is_some_and(|b| self.segments.get(&b).is_some());
        if !listed && !self.expandable.pieces.is_empty() {
            return Err(format!(
                "{} pieces mapped in no expandable segment of the table",
                self.expandable.pieces.as_slice().len()
            ));
        }
        if tiled != self.heap.blocks().len() {
            return Err(format!(
                "{} blocks, {tiled} of them tiling a segment",
                self.heap.blocks().len()
            ));
        }
        if live != self.stats.live {
            return Err(format!(
                "live bytes {} by blocks, {} by counter",
                live, self.stats.live
            ));
        }
        // (A pause holds its pieces' memory away; see `pause.rs`.)
        let reserved = self
            .segments
            .values()
            .map(|s| s.size.checked_sub(s.retired))
            .sum::<Option<usize>>()
            .and_then(|r| r.checked_sub(self.paused_bytes()))
            .ok_or_else(|| "retired or paused bytes above a segment's size".to_owned())?;
        if reserved != self.stats.reserved {
            return Err(format!(
                "reserved {} by segments, {} by counter",
                reserved, self.stats.reserved
            ));
        }
        Ok(())
    }
}

//! Growth: new segments, and the expandable segment mapped at its end or in its
//! gaps, with the free pieces that growth moves (giving memory back is
//! `shrink.rs`).

use emm_core::{EmmError, Result};
use emm_sys::CUdeviceptr;

use emm_core::TraceAction;

use super::address_space::Obtained;
use super::retire::{HolePieces, Target};
use super::*;
use crate::events::EventSource;

/// Growth at the expandable segment's end maps at most this share of what the
/// pool reserves beyond what the request lacks (a 32nd: about 3 % of the
/// footprint), up to [`SegmentPolicy::expand_step`] (reached at 640 MiB reserved
/// with the default 20 MiB step; `pool_expand_step`).
pub(super) const GROWTH_SHARE: usize = 32;

/// An arena holding less than this share of its family's reserved bytes maps
/// new memory instead of moving pieces (see `Arena::moves_worth_their_calls`).
/// A 32nd: what such a pool can leave unmoved is at most about 3 % of the
/// family's footprint (an 8th gave the same figures on the FSDP2 traces).
pub(super) const MOVE_SHARE: usize = 32;

impl Arena {
    /// Makes a plain segment of `seg` bytes of `kind` from the upstream, free
    /// on `stream`; returns its base.
    pub(super) fn grow(
        &mut self,
        seg: usize,
        kind: Kind,
        stream: StreamKey,
        source: &dyn SegmentSource,
    ) -> Result<CUdeviceptr> {
        self.grow_plain(seg, kind, stream, source, false)
    }

    /// As [`Arena::grow`]; with `home`, the segment is the home segment
    /// (`home.rs`).
    pub(super) fn grow_plain(
        &mut self,
        seg: usize,
        kind: Kind,
        stream: StreamKey,
        source: &dyn SegmentSource,
        home: bool,
    ) -> Result<CUdeviceptr> {
        if let Some(limit) = self.limit() {
            if self.family_reserved().saturating_add(seg) > limit {
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
        if home {
            self.segments.add_home(base, seg);
        } else {
            self.segments.add_plain(base, seg, kind);
        }
        self.count_segments();
        self.add_reserved(seg);
        self.stats.upstream_allocs += 1;
        self.history
            .push(TraceAction::SegmentAlloc, base, seg, stream_id(stream));
        self.insert_free(base, seg, base, stream);
        Ok(base)
    }

    /// Grows the expandable segment so that a free block of `stream` holds `size`
    /// bytes: by mapping memory into a gap (address space whose memory moved away,
    /// see `retire.rs`) between free blocks of the stream, or at its end, whichever
    /// of the two needs the least new memory once free pieces have moved there
    /// (see `growth_targets`). `Ok(false)`: no virtual memory here, the driver
    /// refused its address space (`AddressSpace::obtain`), or its address space is
    /// used up.
    pub(super) fn expand(
        &mut self,
        size: usize,
        stream: StreamKey,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
    ) -> Result<bool> {
        let base = match self.expandable.obtain(size, &self.policy, source)? {
            Obtained::None => return Ok(false),
            Obtained::Have(b) => b,
            Obtained::New(b) => {
                self.segments.add_expandable(b);
                self.count_segments();
                b
            }
        };
        // Old mappings whose work is done become gaps first, so growth can use them.
        growth_phases::timed(Phase::UnmapRetired, || {
            self.unmap_retired(events, source, false)
        });
        let page = self.policy.large_round;
        let mut plan = growth_phases::timed(Phase::Plan, || self.growth_plan(base, size, stream));
        // Small idle pieces the plan would move go back instead, and the plan is
        // made again over what is left (`replace.rs`): their ranges are gaps now,
        // which new memory may fill. A few rounds at most: each gives back only
        // what the plan before it would have moved.
        let most = self.policy.piece_pages.max(1);
        let mut piece = fresh_piece(page, size, most);
        if let Some(share) = std::num::NonZeroUsize::new(self.policy.piece_share) {
            // At least an nth of what the arena reserves (`SegmentPolicy::piece_share`).
            let pages = (self.stats.reserved / share.get() / page).clamp(1, most);
            piece = piece.max(pages * page);
        }
        if self.policy.replace_pieces > 0 {
            piece = piece.min(self.policy.replace_pieces.saturating_mul(page));
            self.refresh_idle(stream, events);
            for _ in 0..REPLACE_ROUNDS {
                let runs = match &plan {
                    Some((_, p, _)) => self.replaceable(p, piece),
                    None => break,
                };
                if runs.is_empty() || self.replace_runs(base, &runs, source) == 0 {
                    break;
                }
                plan = growth_phases::timed(Phase::Plan, || self.growth_plan(base, size, stream));
            }
        }
        let Some((target, plan, movable_bytes)) = plan else {
            return Ok(false);
        };
        let (dst, grow, room) = (target.dst, target.want, target.room);
        // First the memory of whole pieces inside free holes of this stream (or
        // settled), mapped again at `dst`, their old addresses retired (see
        // `retire.rs`). Same-stream order (or the settling event) makes that as safe
        // as reusing the hole, and the pool reserves no more memory for a request
        // that fragmentation would otherwise have grown it for. Then new memory in
        // pieces that can move later (`fresh_pieces`: up to 8 pages each; a piece's
        // cost to the driver does not depend on its size, a move maps it again). All
        // of it in one `map_pieces` call: the driver grants access once over the
        // whole range. The last moved piece may pass `grow`, never `room`.
        let movable: Vec<(Option<CUdeviceptr>, usize)> = plan
            .iter()
            .flat_map(|h| {
                let mut at = h.first;
                h.pieces.iter().map(move |&len| {
                    let src = at;
                    at += len as u64;
                    (Some(src), len)
                })
            })
            .collect();
        let fresh = grow.saturating_sub(movable_bytes);
        // Fail fast when the device cannot hold even what the request lacks (the
        // target's `need`, less the pieces that move; not the growth step's
        // margin): made piece by piece, the growth would fail part-way and undo
        // what it made (four driver calls a piece, milliseconds for a large
        // request) before the same answer. Nothing has changed yet; the caller may
        // release its cache and ask again.
        let needed = target.need.saturating_sub(movable_bytes).min(fresh);
        if needed > 0
            && self
                .limit()
                .is_none_or(|l| self.family_reserved() + fresh <= l)
        {
            let (free, total) = source.device_info();
            if total > 0 && free < needed {
                return Err(EmmError::OutOfMemory {
                    what: "device",
                    manager: "pool".into(),
                    requested: needed,
                    free,
                    total,
                    detail: "the device has less free memory than the new memory the request needs; nothing was mapped".into(),
                });
            }
        }
        let over_limit = self
            .limit()
            .filter(|&limit| self.family_reserved() + fresh > limit);
        let mut pieces = movable.clone();
        if over_limit.is_none() {
            pieces.extend(
                fresh_pieces(fresh, page, piece)
                    .into_iter()
                    .map(|len| (None, len)),
            );
        }
        let (mut mapped, mut result) = source.map_pieces(dst, &pieces);
        // Pieces moved: those of the first call that were moves (a fallback below
        // maps only new memory).
        let moved_pieces = mapped.min(movable.len());
        let mut over_limit = over_limit;
        if result.is_err() && mapped < movable.len() && over_limit.is_none() {
            // Moving a piece failed: new memory for what is missing (within the limit).
            if let Err(e) = &result {
                tracing::warn!(error = %e, "moving a piece of the expandable segment failed; mapping new memory instead");
            }
            let have: usize = pieces[..mapped].iter().map(|p| p.1).sum();
            let want = grow.saturating_sub(have).min(room - have);
            let limit = self.limit().filter(|&l| self.family_reserved() + want > l);
            if limit.is_some() {
                // Out of memory under the byte limit, not the move's error.
                over_limit = limit;
                result = Ok(());
            } else {
                let rest: Vec<(Option<CUdeviceptr>, usize)> = fresh_pieces(want, page, piece)
                    .into_iter()
                    .map(|len| (None, len))
                    .collect();
                let (more, r) = source.map_pieces(dst + have as u64, &rest);
                pieces.truncate(mapped);
                pieces.extend_from_slice(&rest);
                mapped += more;
                result = r;
            }
        }
        let mut off = (dst - base) as usize;
        let mut new_pieces = Vec::with_capacity(mapped);
        let (mut moved, mut fresh_mapped) = (0, 0);
        for (i, &(_, len)) in pieces[..mapped].iter().enumerate() {
            new_pieces.push(Piece::new(off, len));
            if i < moved_pieces {
                moved += len;
            } else {
                fresh_mapped += len;
            }
            off += len;
        }
        self.stats.counts.pieces_moved += moved_pieces;
        self.stats.counts.pieces_mapped += mapped - moved_pieces;
        growth_phases::timed(Phase::Retire, || {
            self.retire_moved(base, &plan, moved_pieces, events, source)
        });
        self.commit_growth(base, &target, moved, fresh_mapped, &new_pieces, stream);
        if let Some(limit) = over_limit {
            let (free, total) = source.device_info();
            return Err(EmmError::OutOfMemory {
                what: "device",
                manager: "pool".into(),
                requested: fresh,
                free,
                total,
                detail: format!(
                    "the pool's byte limit of {} would be exceeded",
                    emm_core::fmt_bytes(limit)
                ),
            });
        }
        result?;
        Ok(true)
    }

    /// Where growth for `size` bytes of `stream` maps memory, the free pieces it
    /// moves there and their bytes: of [`Arena::growth_targets`], the one whose
    /// moved pieces leave the least new memory to map (on a tie, the first: the
    /// one needing the fewest bytes). `None` when the expandable segment has no
    /// room left. No piece moves while [`Arena::moves_worth_their_calls`] says
    /// no.
    fn growth_plan(
        &self,
        base: CUdeviceptr,
        size: usize,
        stream: StreamKey,
    ) -> Option<(Target, Vec<HolePieces>, usize)> {
        let moves = self.moves_worth_their_calls();
        self.growth_targets(base, size, stream)
            .into_iter()
            .map(|t| {
                let plan = if moves {
                    self.hole_pieces(base, &t.exclude, t.want, t.room, stream)
                } else {
                    Vec::new()
                };
                let movable: usize = plan.iter().flat_map(|h| h.pieces.iter()).sum();
                (t, plan, movable)
            })
            .min_by_key(|(t, _, m)| t.want.saturating_sub(*m))
    }

    /// Whether this arena's growth moves free pieces: not when it holds less
    /// than a [`MOVE_SHARE`]th of its family's reserved bytes (a stream's or a
    /// tag's pool beside a larger one, or the pool's own beside larger tag
    /// pools). A move costs the driver about what
    /// mapping new memory does (a map and an access a piece, an unmap later),
    /// and only spares new memory; such a pool's moves spare at most a
    /// [`MOVE_SHARE`]th of the family's footprint, and the pool moves again once
    /// it grows past that share. Replaying FSDP2 of the 1.1 B Llama with stream
    /// pools, a 0.35 GiB stream moved 1,440 pieces a pass to hold its pool
    /// within 0.8 % of its live bytes; without its moves the four-GPU trace
    /// holds 1.043x of live with 872 moves a pass instead of 1.038x with 2,312
    /// (lag 0; the two-GPU trace 1.041x with 547 instead of 1.033x with 2,607).
    /// A family of one pool always moves.
    fn moves_worth_their_calls(&self) -> bool {
        self.stats.reserved.saturating_mul(MOVE_SHARE) >= self.family_reserved()
    }

    /// The bytes mapped so far in the expandable segment, when `base` is its
    /// base; `None` for any other segment.
    fn expandable_mapped(&self, base: CUdeviceptr) -> Option<usize> {
        self.segments
            .get(&base)
            .filter(|_| self.is_expandable(base))
            .map(|seg| seg.size)
    }

    /// Where growth for `size` bytes of `stream` may map memory, preferred first:
    /// the gap that joins free blocks of the stream into one of `size` bytes with
    /// the fewest bytes mapped, when it needs no more than the segment's end would,
    /// then the end (at least the step, so a growing pool makes few driver calls);
    /// empty when neither fits in the reservation. `expand` takes the one whose
    /// moved pieces leave the least new memory to map: a gap's room can be too
    /// small for the whole pieces that could fill it, while the end has room for
    /// all of them.
    fn growth_targets(&self, base: CUdeviceptr, size: usize, stream: StreamKey) -> Vec<Target> {
        let Some(mapped) = self.expandable_mapped(base) else {
            return Vec::new();
        };
        let reserve = self.expandable.reserve();
        let page = self.policy.large_round;
        let end = base + mapped as u64;
        // The segment's own last block when it is free (a block of another
        // segment may end where this one starts).
        let tail = self
            .heap
            .blocks()
            .ending_at(end)
            .filter(|(_, b)| b.segment == base && b.state == State::Free(stream))
            .map(|(a, b)| (a, b.size));
        // (Best fit tried this stream's blocks first, so a free tail is smaller
        // than the request; saturating all the same.)
        let tail_need = size.saturating_sub(tail.map_or(0, |t| t.1));
        let mut best: Vec<Target> = Vec::new();
        // A gap when it needs no more than the end would, or when the end is past
        // the reservation (moving memory retires the ranges it leaves, so the end
        // walks up through the reservation while gaps open below).
        let gap = self.best_gap(base, end, size, stream);
        // At the end, growth is by what the request lacks, at least the step
        // (a growing pool makes few driver calls), but never more than a
        // [`GROWTH_SHARE`]th of what the pool reserves: the step's overshoot is
        // reserved at the moment of a new peak, and a 20 MiB step was a tenth of
        // a 165 MiB inference snapshot (1.091x of live; 1.042x with the share).
        let step = self
            .policy
            .expand_step
            .min((self.stats.reserved / GROWTH_SHARE).max(page));
        let end_want = tail_need.max(step).div_ceil(page) * page;
        let end_fits = mapped + end_want <= reserve;
        let end_target = end_fits.then(|| Target {
            dst: end,
            want: end_want,
            need: tail_need.div_ceil(page) * page,
            room: reserve - mapped,
            exclude: [tail.map(|t| t.0), None],
            gap: None,
        });
        match gap {
            Some(gap) if !end_fits || gap.want <= tail_need.div_ceil(page) * page => {
                best.push(gap);
                best.extend(end_target);
            }
            _ => best.extend(end_target),
        }
        best
    }

    /// Accounts for `moved` bytes of moved pieces and `fresh` bytes of new memory
    /// mapped at the target (as `new_pieces`, offsets in the segment), and makes
    /// them one free block of `stream` (joined with its free neighbours).
    fn commit_growth(
        &mut self,
        base: CUdeviceptr,
        target: &Target,
        moved: usize,
        fresh: usize,
        new_pieces: &[Piece],
        stream: StreamKey,
    ) {
        let grown = moved + fresh;
        if grown == 0 {
            return;
        }
        let expandable = self.is_expandable(base);
        if let Some(Segment { size, retired, .. }) =
            self.segments.get_mut(&base).filter(|_| expandable)
        {
            // (At `target.dst`: pieces stay in address order.)
            self.expandable.pieces.insert_run(new_pieces);
            match target.gap {
                None => *size += grown,
                Some(_) => *retired -= grown,
            }
        }
        if let Some(gap) = target.gap {
            // The gap's address space now has memory: what is left of it stays a gap.
            self.heap.remove(gap);
            if target.room > grown {
                self.heap.put(
                    gap + grown as u64,
                    Block::new(target.room - grown, base, State::Gap, Kind::Large),
                );
            }
        }
        self.add_reserved(fresh);
        if fresh > 0 {
            self.stats.upstream_allocs += 1;
            self.history.push(
                TraceAction::SegmentMap,
                target.dst + moved as u64,
                fresh,
                stream_id(stream),
            );
        }
        self.insert_free(target.dst, grown, base, stream);
    }

    /// The whole pieces, up to `want` bytes (the last may pass it, never `cap` in
    /// all), lying in free blocks of `stream` (or settled) of the expandable
    /// segment other than the blocks `exclude` (those growth joins): the pieces
    /// growth moves. Pieces tile the segment's memory in address order, so those
    /// of one block are a contiguous run.
    pub(super) fn hole_pieces(
        &self,
        base: CUdeviceptr,
        exclude: &[Option<CUdeviceptr>; 2],
        want: usize,
        cap: usize,
        stream: StreamKey,
    ) -> Vec<HolePieces> {
        let mut plan = Vec::new();
        let Some(mapped) = self.expandable_mapped(base) else {
            return plan;
        };
        let pieces = &self.expandable.pieces;
        let mut left = want;
        let mut taken = 0usize;
        for (a, b) in self.heap.blocks().walk(base, base + mapped as u64) {
            if left == 0 {
                break;
            }
            let owner = match b.state {
                State::Free(s)
                    if b.segment == base
                        && (s == stream || s == SETTLED)
                        && !exclude.contains(&Some(a)) =>
                {
                    s
                }
                _ => continue,
            };
            let (lo, hi) = ((a - base) as usize, (a - base) as usize + b.size);
            let mut run = Vec::new();
            let mut first = None;
            for p in pieces.starting_at(lo) {
                if p.end() > hi || left == 0 || taken + p.len > cap {
                    // (A piece past `cap` ends this block's run; a later block
                    // may hold smaller pieces that fit.)
                    break;
                }
                first.get_or_insert(p.offset);
                run.push(p.len);
                left = left.saturating_sub(p.len);
                taken += p.len;
            }
            if let Some(first) = first {
                plan.push(HolePieces {
                    block: a,
                    size: b.size,
                    owner,
                    first: base + first as u64,
                    pieces: run,
                });
            }
        }
        plan
    }
}

/// New memory of `bytes` (a multiple of `page`) in pieces of `piece` bytes
/// (`fresh_piece`: a 64th of the request, at least a page and at most 8 pages,
/// 16 MiB of 2 MiB pages; at most `SegmentPolicy::replace_pieces` pages where
/// that is set), the remainder one smaller piece. A piece is the unit the pool
/// moves and unmaps, and it moves only when wholly free: the piece where a block
/// ends is shared with the free rest of its hole and stays put, so a piece in
/// proportion to the block bounds what a hole strands beside the blocks around
/// it. The driver's cost is per piece, not per byte (run 83, H200: creating a
/// piece 12-14 us, granting access to it about 30 us, mapping it 1 us, the same
/// for 2 and 16 MiB; moving one, a map and its access, 31 us), and the bytes a
/// steady pass moves hardly depend on the pieces' size, so smaller pieces cost
/// moves. Replaying the recorded traces 100 passes on the host stand-in
/// (`docs/benchmarks.md`, nineteenth session), pieces of up to 8 pages and at most
/// a 32nd of the *segment* (before) held 1.012-1.297x of live at steady state;
/// these hold 1.008-1.091x (a 32nd of the request: 1.009-1.091x, `gpt_train.csv`
/// and the Llama-style trace at 1.063 and 1.050), with about twice the moves a
/// pass (bucketed inference about 1,200 instead of 400-500). On an H100 neither
/// change showed in the step times (runs 138, 139, 146).
fn fresh_pieces(bytes: usize, page: usize, piece: usize) -> Vec<usize> {
    let pages = bytes / page;
    // (A piece is at least a page, whatever the settings made of it.)
    let per = pages.clamp(1, (piece / page).max(1));
    let mut out = vec![per * page; pages / per];
    if pages % per > 0 {
        out.push((pages % per) * page);
    }
    out
}

/// The size new memory for a request of `request` bytes comes in (see
/// `fresh_pieces`): a 64th of the request, at least a page, at most `most`
/// pages (`SegmentPolicy::piece_pages`, at least 1).
fn fresh_piece(page: usize, request: usize, most: usize) -> usize {
    (request / page / PIECES_PER_REQUEST).clamp(1, most) * page
}

/// Rounds of giving small idle pieces back and planning again, at most, in one
/// growth (see `Arena::expand`).
const REPLACE_ROUNDS: usize = 3;

/// A piece of new memory is at most this fraction of the request it is made for
/// (see `fresh_pieces`).
const PIECES_PER_REQUEST: usize = 64;

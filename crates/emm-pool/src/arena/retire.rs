//! The address space of moved pieces. When growth moves a piece's memory out of a
//! free hole (see `growth.rs`), the hole's range is retired: its old mapping stays
//! until the work queued on it is done, then it is unmapped and the range becomes
//! a gap, which growth maps memory into again when that joins free blocks.
//!
//! So the segment holds about one mapping per piece of memory, and its address
//! space is reused instead of running through the reservation: a GPT-2 training
//! loop with variable shapes moved about 900 pieces every 56 steps, some 11 GiB of
//! address space and as many mappings, which used up a terabyte's reservation in
//! about 5,000 steps (and the host's 65,530 mappings sooner, on the stand-in).
//!
//! `trim` (PyTorch's `empty_cache`) makes gaps the same way out of the idle
//! pieces themselves: their memory goes back to the device, wherever in the
//! segment they lie ([`Arena::release_free_pieces`]).

use emm_core::TraceAction;
use emm_sys::CUdeviceptr;

use super::*;
use crate::events::{EventId, EventSource};
use crate::unmapper::{Outcome, UnmapJob};

/// Old mappings allowed to wait for their work; past it, growth waits for the
/// oldest (their work was queued before a move, and moves are rare).
pub(super) const MAX_RETIRING: usize = 1024;

/// When the work queued on a retired range is known to be done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Done {
    /// Already: the range was settled (its last stream's work had completed).
    Now,
    /// When this event, recorded on the range's stream at the move, completes.
    After(EventId),
    /// After a device-wide synchronization (recording the event failed).
    AfterSync,
}

/// Old mappings of the pieces moved out of retired ranges by one growth.
#[derive(Debug)]
pub(super) struct Retiring {
    /// The retired blocks (each keeps its extent until it becomes a gap).
    blocks: Vec<CUdeviceptr>,
    /// Each old mapping: address and length.
    maps: Vec<(CUdeviceptr, usize)>,
    done: Done,
    /// The same mappings handed to the helper thread that unmaps them (see
    /// `unmapper.rs`); `None`: the arena unmaps them itself.
    job: Option<std::sync::Arc<UnmapJob>>,
    /// The stream the event was recorded on and the heap's free clock then:
    /// once the event completes, that stream's blocks freed before are idle
    /// (`Arena::note_idle`).
    mark: Option<(StreamKey, u64)>,
}

/// The old mappings of moved pieces still waiting, one [`Retiring`] per growth
/// (or trim) that left them, oldest first.
#[derive(Debug, Default)]
pub(super) struct Retirements(Vec<Retiring>);

impl Retirements {
    /// Whether no old mapping waits.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The old mappings waiting.
    fn waiting(&self) -> usize {
        self.0.iter().map(|r| r.maps.len()).sum()
    }

    /// Adds the old mappings one growth (or trim) left, the newest.
    fn push(&mut self, r: Retiring) {
        self.0.push(r);
    }

    /// Takes every entry out, oldest first (for [`Arena::unmap_retired`], which
    /// puts back those still waiting with [`Retirements::put_back`]).
    fn take(&mut self) -> Vec<Retiring> {
        std::mem::take(&mut self.0)
    }

    /// Puts back the entries [`Retirements::take`] took that still wait, oldest
    /// first, before any added since.
    fn put_back(&mut self, mut waiting: Vec<Retiring>) {
        waiting.append(&mut self.0);
        self.0 = waiting;
    }

    /// Settles every job handed to the helper thread (a queued one taken back, a
    /// started one waited for) and calls `gone` with each old mapping the helper
    /// unmapped; those not unmapped stay, for the caller.
    pub(super) fn settle_jobs(&mut self, mut gone: impl FnMut(CUdeviceptr)) {
        for r in &mut self.0 {
            let Some(job) = r.job.take() else {
                continue;
            };
            if let Outcome::Done(unmapped) = job.settle() {
                for (&(addr, _), ok) in r.maps.iter().zip(unmapped) {
                    if ok {
                        gone(addr);
                    }
                }
            }
        }
    }

    /// Forgets every entry (a reset: the caller unmaps the mappings with the
    /// segment's pieces); their events go back to `events`.
    pub(super) fn forget(&mut self, events: &dyn EventSource) {
        for r in self.take() {
            if let Done::After(id) = r.done {
                events.recycle(id);
            }
        }
    }
}

/// Whole pieces of one free block of the expandable segment that growth may move.
#[derive(Clone, Debug)]
pub(super) struct HolePieces {
    /// The free block: address, size and stream.
    pub block: CUdeviceptr,
    pub size: usize,
    pub owner: StreamKey,
    /// The address of its first whole piece, and the lengths of the pieces to move
    /// (a contiguous run).
    pub first: CUdeviceptr,
    pub pieces: Vec<usize>,
}

impl Arena {
    /// Retires the ranges of the first `moved` pieces of `plan`, whose memory is
    /// mapped elsewhere now: their old mappings wait for the work queued on them
    /// (an event on the hole's stream; none for a settled hole).
    pub(super) fn retire_moved(
        &mut self,
        base: CUdeviceptr,
        plan: &[HolePieces],
        moved: usize,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
    ) {
        let mut left = moved;
        let mut settled = Retiring {
            blocks: Vec::new(),
            maps: Vec::new(),
            done: Done::Now,
            job: None,
            mark: None,
        };
        let mut queued: Option<Retiring> = None;
        for h in plan {
            if left == 0 {
                break;
            }
            let n = h.pieces.len().min(left);
            left -= n;
            let len: usize = h.pieces[..n].iter().sum();
            self.retire(base, h, h.first + len as u64);
            let entry = if h.owner == SETTLED {
                &mut settled
            } else {
                // One event for the growing stream's work, recorded once.
                queued.get_or_insert_with(|| Retiring {
                    blocks: Vec::new(),
                    maps: Vec::new(),
                    done: self.done_after(h.owner, events),
                    job: None,
                    mark: Some((h.owner, self.heap.clock())),
                })
            };
            entry.blocks.push(h.first);
            let mut at = h.first;
            for &l in &h.pieces[..n] {
                entry.maps.push((at, l));
                at += l as u64;
            }
        }
        for mut r in [Some(settled), queued].into_iter().flatten() {
            if r.maps.is_empty() {
                continue;
            }
            // The helper thread unmaps them once their work is done, off the
            // allocating thread; after a failed record (a device-wide
            // synchronization stands for the event) the arena keeps them.
            let event = match r.done {
                Done::Now => Some(None),
                Done::After(id) => Some(Some(id)),
                Done::AfterSync => None,
            };
            if let Some(event) = event {
                r.job = source.unmap_later(&r.maps, event);
            }
            self.expandable.retiring.push(r);
        }
    }

    /// Unmaps every whole piece of the expandable segment that lies in a settled
    /// free block (every free block is settled after `consolidate`): its memory
    /// goes back to the device and its range becomes a gap, which growth maps
    /// memory into again when that joins free blocks. So the free middle of the
    /// segment is given back while live blocks sit past it (PyTorch's
    /// `empty_cache` unmaps the free pages of its expandable segments likewise).
    ///
    /// Nothing is done while old mappings of moved pieces still wait to be
    /// unmapped: a piece's memory may then be mapped at two addresses, and
    /// unmapping one would give nothing back. A piece that fails to unmap stays
    /// mapped in its free block, for the next trim (the error is logged). Returns
    /// the bytes released.
    pub fn release_free_pieces(&mut self, source: &dyn SegmentSource) -> usize {
        self.release_free_pieces_until(source, 0)
    }

    /// As [`Arena::release_free_pieces`], stopping once the family reserves no
    /// more than `until` bytes.
    pub(super) fn release_free_pieces_until(
        &mut self,
        source: &dyn SegmentSource,
        until: usize,
    ) -> usize {
        let Some(base) = self.expandable.base() else {
            return 0;
        };
        if !self.expandable.retiring.is_empty() {
            return 0;
        }
        let plan = self.hole_pieces(base, &[None, None], usize::MAX, usize::MAX, SETTLED);
        let mut released = 0;
        for h in plan {
            released += self.release_run(base, &h, source, until);
        }
        released
    }

    /// Unmaps the pieces of `h` (a run in a free block that no queued work
    /// uses) while the family reserves more than `until` bytes; each run of them
    /// that went becomes a gap. A piece that fails to unmap stays mapped in its
    /// free block (the error is logged). Returns the bytes released.
    pub(super) fn release_run(
        &mut self,
        base: CUdeviceptr,
        h: &HolePieces,
        source: &dyn SegmentSource,
        until: usize,
    ) -> usize {
        let mut released = 0;
        // The free block around the runs still to retire (it starts past the
        // last run retired), and the run of pieces unmapped so far.
        let mut block = (h.block, h.size);
        let (mut run_start, mut run) = (h.first, Vec::new());
        let mut at = h.first;
        for &len in &h.pieces {
            if self.family_reserved() <= until {
                break;
            }
            if self.unmap_piece(at, len, source) {
                if run.is_empty() {
                    run_start = at;
                }
                run.push(len);
            } else if !run.is_empty() {
                released += self.retire_unmapped(
                    base,
                    &mut block,
                    h.owner,
                    run_start,
                    std::mem::take(&mut run),
                );
            }
            at += len as u64;
        }
        if !run.is_empty() {
            released += self.retire_unmapped(base, &mut block, h.owner, run_start, run);
        }
        released
    }

    /// Makes the run of `pieces` from `first`, unmapped now, a gap of the free
    /// block `block` (address, size) of `owner`, which becomes what is left of it
    /// past the run; returns the run's bytes, which the pool no longer holds.
    fn retire_unmapped(
        &mut self,
        base: CUdeviceptr,
        block: &mut (CUdeviceptr, usize),
        owner: StreamKey,
        first: CUdeviceptr,
        pieces: Vec<usize>,
    ) -> usize {
        let len: usize = pieces.iter().sum();
        let to = first + len as u64;
        let run = HolePieces {
            block: block.0,
            size: block.1,
            owner,
            first,
            pieces,
        };
        self.retire(base, &run, to);
        self.make_gap(first);
        *block = (to, (block.0 + block.1 as u64 - to) as usize);
        self.sub_reserved(len);
        self.stats.upstream_frees += 1;
        self.history.push(TraceAction::SegmentUnmap, first, len, 0);
        len
    }

    /// Unmaps the mapping of `len` bytes at `addr` of the expandable segment
    /// (the device is done with it) and drops it from the segment's pieces;
    /// whether it went (a failure is logged and leaves it mapped).
    fn unmap_piece(&mut self, addr: CUdeviceptr, len: usize, source: &dyn SegmentSource) -> bool {
        let gone = unmap_mapping(addr, len, source);
        if gone {
            self.forget_piece(addr);
        }
        gone
    }

    /// Counts the mapping at `addr` of the expandable segment unmapped and drops
    /// it from the segment's pieces.
    fn forget_piece(&mut self, addr: CUdeviceptr) {
        self.stats.counts.pieces_unmapped += 1;
        self.expandable.forget_piece(addr);
    }

    /// When the work queued so far on `owner` (the stream growing now, whose
    /// handle is valid) is done.
    fn done_after(&mut self, owner: StreamKey, events: &dyn EventSource) -> Done {
        self.stats.counts.events_recorded += 1;
        match events.record(stream_of_key(owner)) {
            Ok(id) => Done::After(id),
            Err(e) => {
                tracing::warn!(error = %e, "recording an event for moved pieces failed; their old mappings wait for a device synchronization");
                Done::AfterSync
            }
        }
    }

    /// Splits the free block of `h` around `[h.first, to)`, which is retired.
    fn retire(&mut self, base: CUdeviceptr, h: &HolePieces, to: CUdeviceptr) {
        let (a, n, owner, from) = (h.block, h.size, h.owner, h.first);
        // The free parts left stay free since the hole's free.
        let freed = self.heap.remove(a).map_or(u64::MAX, |b| b.freed);
        let put = |me: &mut Self, at: CUdeviceptr, len: usize, state: State| {
            me.heap.put(
                at,
                Block {
                    freed,
                    ..Block::new(len, base, state, Kind::Large)
                },
            );
        };
        put(self, a, (from - a) as usize, State::Free(owner));
        put(self, from, (to - from) as usize, State::Retired);
        put(self, to, (a + n as u64 - to) as usize, State::Free(owner));
        if let Some(seg) = self.segments.get_mut(&base) {
            seg.retired += (to - from) as usize;
        }
    }

    /// Unmaps the old mappings whose work is done and makes their ranges gaps.
    /// With more than [`MAX_RETIRING`] waiting (or `all`), first waits for the
    /// oldest (for all).
    pub(super) fn unmap_retired(
        &mut self,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
        all: bool,
    ) {
        let waiting = self.expandable.retiring.waiting();
        let mut excess = if all {
            waiting
        } else {
            waiting.saturating_sub(MAX_RETIRING)
        };
        let mut keep = Vec::new();
        for mut r in self.expandable.retiring.take() {
            if let Some(job) = r.job.clone() {
                // Needed now: a queued job is taken back, a started one waited for.
                let outcome = if excess > 0 { job.settle() } else { job.poll() };
                match outcome {
                    Outcome::Pending => {
                        keep.push(r);
                        continue;
                    }
                    Outcome::Done(unmapped) => {
                        excess = excess.saturating_sub(r.maps.len());
                        if let Done::After(id) = r.done {
                            events.recycle(id);
                        }
                        if let Some((s, clock)) = r.mark {
                            self.note_idle(s, clock);
                        }
                        if let Some(again) = self.finish_retiring(r, &unmapped) {
                            keep.push(again);
                        }
                        continue;
                    }
                    // Not done by the helper: unmapped here, as without it.
                    Outcome::Yours => r.job = None,
                }
            }
            let ready = match r.done {
                Done::Now => true,
                Done::After(id) => {
                    self.stats.counts.event_queries += 1;
                    match events.is_complete(id) {
                        Ok(true) => true,
                        _ if excess > 0 => {
                            self.stats.counts.retire_waits += 1;
                            events.wait(id).is_ok()
                        }
                        _ => false,
                    }
                }
                Done::AfterSync if excess > 0 => {
                    self.stats.counts.device_syncs += 1;
                    self.stats.counts.retire_waits += 1;
                    events.synchronize_all().is_ok()
                }
                Done::AfterSync => false,
            };
            if !ready {
                keep.push(r);
                continue;
            }
            excess = excess.saturating_sub(r.maps.len());
            if let Done::After(id) = r.done {
                events.recycle(id);
            }
            if let Some((s, clock)) = r.mark {
                self.note_idle(s, clock);
            }
            if let Some(again) = self.unmap_retiring(r, source) {
                keep.push(again);
            }
        }
        self.expandable.retiring.put_back(keep);
    }

    /// Unmaps `r`'s old mappings (their work is done) and makes its blocks gaps.
    /// A mapping that fails to go keeps its blocks retired and is returned, to be
    /// tried again by the next growth or trim (the error is logged); until then
    /// the segment is not reset over it and no piece is unmapped by `trim`.
    fn unmap_retiring(&mut self, r: Retiring, source: &dyn SegmentSource) -> Option<Retiring> {
        let unmapped: Vec<bool> = r
            .maps
            .iter()
            .map(|&(addr, len)| unmap_mapping(addr, len, source))
            .collect();
        self.finish_retiring(r, &unmapped)
    }

    /// After `r`'s old mappings were unmapped, here or by the helper thread
    /// (`unmapped[i]`: whether the i-th went): those that went leave the
    /// segment's pieces, and once every mapping is gone its blocks become gaps.
    /// Those that failed are returned, to be tried again by the next growth or
    /// trim.
    fn finish_retiring(&mut self, r: Retiring, unmapped: &[bool]) -> Option<Retiring> {
        let mut failed = Vec::new();
        for (i, &(addr, len)) in r.maps.iter().enumerate() {
            if unmapped.get(i) == Some(&true) {
                self.forget_piece(addr);
            } else {
                failed.push((addr, len));
            }
        }
        if failed.is_empty() {
            for b in r.blocks {
                self.make_gap(b);
            }
            return None;
        }
        Some(Retiring {
            blocks: r.blocks,
            maps: failed,
            // Its work was done when the unmap was first tried.
            done: Done::Now,
            job: None,
            mark: None,
        })
    }

    /// The retired block at `addr` (unmapped now) becomes a gap, joined with the
    /// gaps beside it.
    fn make_gap(&mut self, addr: CUdeviceptr) {
        let Some(b) = self.heap.get(addr).copied() else {
            return;
        };
        if b.state != State::Retired {
            return;
        }
        let (mut at, mut size) = (addr, b.size);
        if let Some((pa, p)) = self.heap.blocks().ending_at(addr).map(|(a, &p)| (a, p)) {
            // (`ending_at` gives only a block that ends exactly at `addr`.)
            if p.state == State::Gap && p.segment == b.segment {
                self.heap.remove(addr);
                at = pa;
                size += p.size;
            }
        }
        let next = addr + b.size as u64;
        if let Some(n) = self.heap.get(next).copied() {
            if n.state == State::Gap && n.segment == b.segment {
                self.heap.remove(next);
                size += n.size;
            }
        }
        // A gap at the segment's end is no address space of it at all: its block
        // goes (the retired block itself, or the gap before it that it joined),
        // else it would lie past the end and overlap what growth maps there next.
        if let Some(seg) = self.segments.get_mut(&b.segment) {
            if b.segment + seg.size as u64 == at + size as u64 {
                seg.size -= size;
                seg.retired -= size;
                self.heap.remove(at);
                return;
            }
        }
        self.heap
            .put(at, Block::new(size, b.segment, State::Gap, Kind::Large));
    }

    /// The gap whose memory would join free blocks of `stream` into one of `size`
    /// bytes with the fewest bytes mapped (on a tie, the lowest): mapped from the
    /// gap's start, onto the free block before it, or filling it whole, joining the
    /// free blocks on both sides.
    pub(super) fn best_gap(
        &self,
        base: CUdeviceptr,
        end: CUdeviceptr,
        size: usize,
        stream: StreamKey,
    ) -> Option<Target> {
        let page = self.policy.large_round;
        let free_of = |b: &Block| b.segment == base && b.state == State::Free(stream);
        let mut best: Option<Target> = None;
        let mut prev: Option<(CUdeviceptr, Block)> = None;
        for (ga, g) in self.heap.blocks().walk(base, end) {
            let before = prev.replace((ga, *g));
            if g.state != State::Gap {
                continue;
            }
            let a = before.filter(|(pa, p)| free_of(p) && pa + p.size as u64 == ga);
            let gend = ga + g.size as u64;
            let b = self
                .heap
                .get(gend)
                .filter(|n| free_of(n))
                .map(|n| (gend, n.size));
            let asz = a.map_or(0, |(_, p)| p.size);
            let prefix = size.saturating_sub(asz).div_ceil(page) * page;
            let want = if prefix <= g.size {
                prefix
            } else if asz + g.size + b.map_or(0, |b| b.1) >= size {
                g.size
            } else {
                continue;
            };
            if best.as_ref().is_none_or(|t| want < t.want) {
                best = Some(Target {
                    dst: ga,
                    want,
                    need: want,
                    room: g.size,
                    exclude: [a.map(|a| a.0), b.map(|b| b.0)],
                    gap: Some(ga),
                });
            }
        }
        best
    }
}

/// Where growth maps memory (see `Arena::growth_target`).
#[derive(Clone, Debug)]
pub(super) struct Target {
    /// The first address mapped.
    pub dst: CUdeviceptr,
    /// Bytes wanted (moved pieces may pass it, never `room`).
    pub want: usize,
    /// The least of `want` that serves the request (`want` less the growth
    /// step's margin at the segment's end): below it the growth cannot help.
    pub need: usize,
    /// Bytes of address space there.
    pub room: usize,
    /// The free blocks the growth joins (their pieces do not move).
    pub exclude: [Option<CUdeviceptr>; 2],
    /// The gap mapped into (`None`: the segment's end).
    pub gap: Option<CUdeviceptr>,
}

/// Unmaps the mapping of `len` bytes at `addr` (the device is done with it);
/// whether it went (a failure is logged and leaves it mapped).
fn unmap_mapping(addr: CUdeviceptr, len: usize, source: &dyn SegmentSource) -> bool {
    match source.unmap_done(addr, len) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, addr, len, "unmapping a piece of the expandable segment failed; it stays mapped");
            false
        }
    }
}

//! Replacing small idle pieces instead of moving them.
//!
//! Growth assembles a request from the whole pieces lying in free holes (see
//! `growth.rs` and `retire.rs`): each moved piece costs its driver calls (a
//! map and an access at its new address, an unmap of the old one later), and
//! it keeps its size wherever it goes. The pieces made for small requests are
//! a page (2 MiB), so a step whose largest requests (1.25 GiB of logits in the
//! Llama-style training trace) find their memory scattered moved some 250
//! pieces for each of them, pass after pass.
//!
//! So growth first gives back (unmaps) the small pieces of the holes it would
//! move from when no queued work uses them any more, and maps new memory for
//! what the request lacks, in pieces sized for it (`fresh_pieces`: up to 8
//! pages). The memory goes back before the new is made, so the footprint does
//! not rise; the next time that memory is needed it moves in an eighth of the
//! calls.
//!
//! Idle is known from markers: with the policy on, a stream records an event
//! every [`MARK_EVERY`] frees on the arena (the newest [`MARKS`] kept), and each
//! growth that moves pieces records one anyway; once one has completed, the
//! blocks of that stream that became free before it have no work queued on
//! them ([`IdleMarks`], against each block's `freed` stamp of the heap's free
//! clock). Settled blocks are idle. Nothing is replaced while old mappings of
//! moved pieces still wait to be unmapped: one of them may map the same memory,
//! which would then not go back before the new is made (as `trim` does,
//! [`Arena::release_free_pieces`]).
//!
//! Off by default (`SegmentPolicy::replace_pieces`): on the recorded traces it
//! trades the moves' driver calls against footprint (`docs/benchmarks.md`,
//! thirty-fifth session).

use std::collections::VecDeque;

use emm_sys::CUdeviceptr;

use super::retire::HolePieces;
use super::*;
use crate::events::{EventId, EventSource};

/// A stream records a marker every this many frees on the arena.
const MARK_EVERY: u32 = 64;
/// Markers kept per stream, newest last; the oldest goes when a new one comes.
const MARKS: usize = 8;
/// Streams that keep markers, at most: a program that makes a stream per
/// request would otherwise hold [`MARKS`] events for every stream it ever
/// freed on (until the arena drains). Later streams' blocks are idle only once
/// settled or after a move's event.
const MARKED_STREAMS: usize = 64;

/// What is known of which of a stream's free blocks no queued work uses.
#[derive(Debug, Default)]
pub(super) struct IdleMarks {
    /// Markers recorded on the stream, oldest first, each with the heap's free
    /// clock when it was recorded.
    ring: VecDeque<(EventId, u64)>,
    /// Frees on the arena since the newest marker.
    since: u32,
    /// Blocks of the stream that became free at or before this value of the
    /// free clock are idle.
    through: u64,
}

impl Arena {
    /// After a free on `stream`: every [`MARK_EVERY`]th records a marker (with
    /// the policy on; created and default streams alike, the caller freeing on a
    /// live stream).
    pub(super) fn mark_free(&mut self, stream: StreamKey, events: &dyn EventSource) {
        if self.policy.replace_pieces == 0 || stream == SETTLED {
            return;
        }
        let clock = self.heap.clock();
        if self.idle.len() >= MARKED_STREAMS && !self.idle.contains_key(&stream) {
            return;
        }
        let marks = self.idle.entry(stream).or_default();
        marks.since += 1;
        if marks.since < MARK_EVERY {
            return;
        }
        marks.since = 0;
        self.stats.counts.events_recorded += 1;
        let Ok(id) = events.record(stream_of_key(stream)) else {
            return;
        };
        if marks.ring.len() == MARKS {
            if let Some((old, _)) = marks.ring.pop_front() {
                events.recycle(old);
            }
        }
        marks.ring.push_back((id, clock));
    }

    /// Before a growth on `stream`: the newest of its markers that has completed
    /// makes the blocks freed before it idle; it and older ones go.
    pub(super) fn refresh_idle(&mut self, stream: StreamKey, events: &dyn EventSource) {
        let Some(marks) = self.idle.get_mut(&stream) else {
            return;
        };
        let mut done = None;
        for (i, &(id, _)) in marks.ring.iter().enumerate().rev() {
            self.stats.counts.event_queries += 1;
            if events.is_complete(id).unwrap_or(false) {
                done = Some(i);
                break;
            }
        }
        if let Some(i) = done {
            for (id, clock) in marks.ring.drain(..=i) {
                marks.through = marks.through.max(clock);
                events.recycle(id);
            }
        }
    }

    /// Gives every marker back (the arena drains).
    pub(super) fn drop_idle_marks(&mut self, events: &dyn EventSource) {
        for (_, marks) in self.idle.drain() {
            for (id, _) in marks.ring {
                events.recycle(id);
            }
        }
    }

    /// Notes that the work queued on `stream` before the free clock read `clock`
    /// is done (an event recorded then has completed).
    pub(super) fn note_idle(&mut self, stream: StreamKey, clock: u64) {
        if self.policy.replace_pieces == 0 || stream == SETTLED {
            return;
        }
        let marks = self.idle.entry(stream).or_default();
        marks.through = marks.through.max(clock);
    }

    /// Whether no queued work uses the free block of `h` (settled, or of a
    /// stream whose work queued since the block's free is known done).
    fn idle(&self, h: &HolePieces) -> bool {
        if h.owner == SETTLED {
            return true;
        }
        let through = self.idle.get(&h.owner).map_or(0, |m| m.through);
        self.heap
            .get(h.block)
            .is_some_and(|b| b.state == State::Free(h.owner) && b.freed <= through)
    }

    /// The runs of `plan` (a growth's pieces to move) that growth gives back
    /// instead: idle, at least `replace_pieces` pieces long (a hole holding a
    /// new piece's worth of them: shorter runs, scattered among live blocks,
    /// would gather into new pieces that small blocks then pin, and the
    /// Llama-style trace went past 1.05x of live), and every piece smaller than
    /// `piece` (the size new memory for the request comes in). None with the
    /// policy off, or while old mappings wait to be unmapped.
    pub(super) fn replaceable(&self, plan: &[HolePieces], piece: usize) -> Vec<HolePieces> {
        let min_run = self.policy.replace_pieces;
        if min_run == 0 || !self.expandable.retiring.is_empty() {
            return Vec::new();
        }
        plan.iter()
            .filter(|h| {
                h.pieces.len() >= min_run && h.pieces.iter().all(|&len| len < piece) && self.idle(h)
            })
            .cloned()
            .collect()
    }

    /// Gives back the pieces of `runs` (see [`Arena::replaceable`]); returns the
    /// bytes released. Each run that went becomes a gap, which growth may map
    /// new memory into.
    pub(super) fn replace_runs(
        &mut self,
        base: CUdeviceptr,
        runs: &[HolePieces],
        source: &dyn SegmentSource,
    ) -> usize {
        let mut released = 0;
        for h in runs {
            let before = self.stats.counts.pieces_unmapped;
            released += self.release_run(base, h, source, 0);
            self.stats.counts.pieces_replaced += self.stats.counts.pieces_unmapped - before;
        }
        released
    }
}

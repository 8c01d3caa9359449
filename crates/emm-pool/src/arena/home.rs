//! The home segment: without the expandable segment, one plain segment sized up
//! front (`SegmentPolicy::initial_size`, `EMM_POOL_INITIAL_SIZE`), as RMM's
//! pool takes an initial size.
//!
//! Without virtual memory a segment cannot grow in place, so the pool makes
//! segments for the first steps' shapes before it knows how large later steps
//! get, and those segments set each recorded trace's peak in its first pass
//! (`merge.rs`). Given its size from a previous run, one segment holds every
//! step: each request takes the best-fitting free block there first, small
//! ones too, so that every block shares one range and free space coalesces
//! across all of it. Other segments come only for what the home cannot hold,
//! and go as they do without one (tightening, merging); the home itself goes
//! back only when wholly free, on `trim` or on the out-of-memory ladder's
//! second step (both `Arena::release_free_segments`), and the next allocation
//! asks for it again.

use emm_core::Result;
use emm_sys::CUdeviceptr;

use super::*;

/// What an arena knows of its home segment beyond its base (which `Segments`
/// keeps).
#[derive(Debug, Default)]
pub(super) struct HomeState {
    /// The home could not be had for lack of memory: none is asked for until
    /// a `trim`, a reset or the out-of-memory ladder (which gives memory back).
    refused: bool,
    /// A request the home could not hold was logged (once an arena).
    warned: bool,
    /// That the home cannot be had was logged as a warning (once an arena;
    /// later refusals at debug level).
    refusal_logged: bool,
}

impl Arena {
    /// Whether this arena keeps a home segment: an initial size is set and it
    /// has no expandable segment (turned off, or none to be had).
    pub(super) fn wants_home(&self) -> bool {
        self.policy.initial_size > 0 && self.plain_segments_only()
    }

    /// The best-fitting free block of the home segment for `size` bytes on
    /// `stream`, else a settled one there, split off as [`Arena::take_fit`]
    /// does. With `grow`, makes the home first when there is none: a device
    /// (or byte limit) that cannot hold it leaves the pool without one, with a
    /// warning, until a `trim`, a reset or the out-of-memory ladder asks again;
    /// so does an initial size larger than any device. Another failure of the
    /// upstream is returned, and the next allocation asks again.
    ///
    /// The free segments beside it are not given back to make room for it: a
    /// job whose request the home could not hold (the out-of-memory ladder then
    /// gives a wholly free home back for it) would give that request's segment
    /// back for the home at its next small request and the home back again at
    /// its next large one, two driver allocations, two frees and a device-wide
    /// wait a cycle, where without the home it settles.
    pub(super) fn take_home(
        &mut self,
        size: usize,
        stream: StreamKey,
        source: &dyn SegmentSource,
        grow: bool,
    ) -> Result<Option<(CUdeviceptr, CUdeviceptr)>> {
        let base = match self.segments.home() {
            Some(base) => base,
            None if grow && !self.home.refused => {
                // (A size no page count can round is more than any device holds.)
                let Some(want) = self
                    .policy
                    .initial_size
                    .checked_next_multiple_of(self.policy.large_round)
                else {
                    tracing::warn!(
                        initial_size = self.policy.initial_size,
                        "the pool's initial size (EMM_POOL_INITIAL_SIZE) is larger than any device holds; going on without a home segment"
                    );
                    self.home.refused = true;
                    return Ok(None);
                };
                match self.grow_plain(want, Kind::Large, SETTLED, source, true) {
                    Ok(base) => base,
                    Err(e) if e.is_out_of_memory() => {
                        // Once a warning; asked again after each out-of-memory
                        // ladder, a device that stays full would repeat it.
                        if std::mem::replace(&mut self.home.refusal_logged, true) {
                            tracing::debug!(error = %e, initial_size = want, "the home segment still cannot be had");
                        } else {
                            tracing::warn!(
                                error = %e,
                                initial_size = want,
                                "the pool's initial size (EMM_POOL_INITIAL_SIZE) cannot be had; going on without a home segment"
                            );
                        }
                        self.home.refused = true;
                        return Ok(None);
                    }
                    Err(e) => return Err(e),
                }
            }
            None => return Ok(None),
        };
        for s in [stream, SETTLED] {
            if let Some(a) = self.take_fit_in(size, Kind::Large, s, Some(base)) {
                return Ok(Some(a));
            }
        }
        Ok(None)
    }

    /// As [`Arena::take_fit`], the home segment's best fit first where the
    /// arena keeps one, whatever the request's kind (the home's blocks are all
    /// large): for the retries after a step made more free blocks usable
    /// (pending blocks collected, other streams' blocks taken, the device
    /// waited for), where a small request would otherwise look only among
    /// small segments and grow, or fail, while the home holds room.
    pub(super) fn take_fit_home_first(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
    ) -> Option<(CUdeviceptr, CUdeviceptr)> {
        if let Some(base) = self.segments.home().filter(|_| self.wants_home()) {
            if let Some(a) = self.take_fit_in(size, Kind::Large, stream, Some(base)) {
                return Some(a);
            }
        }
        self.take_fit(size, kind, stream)
    }

    /// Gives the home segment back when it is wholly free (`trim`, and the
    /// out-of-memory ladder through [`Arena::release_free_segments`]); returns
    /// the bytes released. Either way the next allocation that finds none asks for
    /// it again, also after the device could not hold it.
    pub(super) fn release_home(&mut self, source: &dyn SegmentSource) -> usize {
        self.ask_home_again();
        let Some(base) = self.segments.home() else {
            return 0;
        };
        match self.wholly_free(base) {
            Some((size, stream)) if self.give_back_segment(base, size, stream, source) => size,
            _ => 0,
        }
    }

    /// Forgets that the home segment could not be had: the next allocation
    /// asks for it again (after a `trim` or reset gave memory back).
    pub(super) fn ask_home_again(&mut self) {
        self.home.refused = false;
    }

    /// A request of `size` bytes took a new segment while the arena has a
    /// home: counted (`emm.home_overflows`), and the first one logged as a
    /// warning, since the initial size is then smaller than the job needs
    /// (its live blocks, and on several streams the free blocks still waiting
    /// for another stream's work) and every such request costs its whole size
    /// beside the home.
    pub(super) fn note_home_overflow(&mut self, size: usize) {
        if let Some(home) = self.home_size() {
            self.count_home_overflow(size, home);
        }
    }

    /// The size of the home segment, where the arena keeps one.
    pub(super) fn home_size(&self) -> Option<usize> {
        let base = self.segments.home().filter(|_| self.wants_home())?;
        self.segments.get(&base).map(|s| s.size)
    }

    /// As [`Arena::note_home_overflow`], for a home of `home` bytes that was
    /// there when the request came (the out-of-memory ladder may have given it
    /// back for the request since).
    pub(super) fn count_home_overflow(&mut self, size: usize, home: usize) {
        self.stats.counts.home_overflows += 1;
        if self.home.warned {
            return;
        }
        self.home.warned = true;
        tracing::warn!(
            request = size,
            home,
            live = self.stats.live,
            "a request of {} did not fit in the pool's home segment of {} ({} live): it takes a segment of its own; EMM_POOL_INITIAL_SIZE is smaller than this job needs (emm.home_overflows counts such requests)",
            emm_core::fmt_bytes(size),
            emm_core::fmt_bytes(home),
            emm_core::fmt_bytes(self.stats.live),
        );
    }
}

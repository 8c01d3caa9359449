//! Merging free segments without the expandable segment (`SegmentPolicy::merge_quiet`).
//!
//! Without virtual memory management every large segment is a `cuMemAlloc` of its
//! own, and a block can never span two of them. Exact-size segments made for the
//! shapes of one step are split by the smaller blocks of the next, and a few
//! long-lived blocks then pin many partly used segments: replaying a recorded
//! trace pass after pass, the pool kept making segments (about 12 a pass on
//! `gpt_train.csv`, 3.38x of live after 100 passes, while a large segment made
//! for one request served only requests of about its size: `exclusive`, off
//! since; without it and unmerged, 1.35x after 12 passes). Merging gives the pool one
//! range again at the moments the program is quiet (between steps most of its
//! blocks are free): every wholly free large segment goes back and one segment
//! takes their place, and the next steps' blocks share one range by best fit. Its
//! size is what the steps need, not what happened to be free: the first merge
//! sizes the pool to a tenth above the peak of live bytes, a later one to the
//! last merge's size plus the large segments the steps since had to make; never
//! past the peak of reserved bytes. (Of their total size, the merged range of
//! `gpt_train.csv` was the first pass's 1.6x of live, which the later passes
//! kept; sized, the trace holds 1.25x.) A merge is due only after a new large
//! segment was made, so a pool whose segments serve every step makes no driver
//! call at all.
//!
//! Quiet is judged two ways ([`MergeClock`]): live bytes at most a `merge_quiet`th
//! of reserved, or, where weights and optimizer state stay live between steps
//! and keep them above that share, live bytes back within a `merge_quiet`th of
//! the way from their low since the last new segment to reserved, after a step
//! rose at least half of it. With the first alone, a trained mixture of experts
//! (`moe_h200.csv`, a third of its peak live between steps) and LLM generation
//! (469 MiB of weights against 1.1-1.7 GiB reserved) never merged, and GPT-2
//! inference merged three times in 100 passes (1.82x of live; 1.21x with both).

use super::merge_clock::MergeClock;
use super::*;
use crate::events::EventSource;

impl Arena {
    /// Merges the wholly free large segments into one when the pool is quiet (live
    /// bytes at most 1/`merge_quiet` of reserved, or back near their low after a
    /// step: [`MergeClock`]); called while a merge is due.
    /// Synchronizes the device first (one synchronization), so that blocks freed on
    /// other streams are free everywhere and whole segments come free. A failure
    /// leaves the pool as it was, or with the freed segments given back and no
    /// merged one (growth makes what is missing later).
    pub(super) fn merge_if_quiet(&mut self, events: &dyn EventSource, source: &dyn SegmentSource) {
        let Some(quiet) = self.policy.merge_quiet else {
            self.merge.settle();
            return;
        };
        if !self
            .merge
            .quiet(self.stats.live, self.stats.reserved, quiet.max(1))
        {
            return;
        }
        self.merge.settle();
        if let Err(e) = self.consolidate(events) {
            tracing::warn!(error = %e, "synchronizing to merge free segments failed; not merging");
            return;
        }
        // Fewer than two wholly free segments: nothing to merge.
        if self.whole_free(Kind::Large).count() < 2 {
            return;
        }
        self.release_whole_segments(source, Some(Kind::Large));
        // Not what happened to be free: what the steps need. The first merge
        // sizes the pool to a tenth above the peak of live bytes (best fit over
        // one range held the recorded traces within 1.07-1.12x of it); a later
        // one to the last merge's size plus what the steps since had to grow by
        // (a merged range a step outgrew).
        let floor = self.stats.peak_live / 10 * 11;
        let target = self.merge.target(floor);
        // It may take more than it gave back (a merged range the steps outgrew is
        // pinned by a block or two, and the new one must hold what overflowed),
        // never past the peak of reserved bytes: a merge sets no new peak.
        let room = self.stats.peak_reserved.saturating_sub(self.stats.reserved);
        let size = target.saturating_sub(self.stats.reserved).min(room) / self.policy.large_round
            * self.policy.large_round;
        self.merge.forget_growth();
        if size == 0 {
            self.merge.sized(self.stats.reserved);
            return;
        }
        match self.grow(size, Kind::Large, SETTLED, source) {
            Ok(base) => {
                if let Some(seg) = self.segments.get_mut(&base) {
                    seg.merged = true;
                }
                self.stats.counts.merges += 1;
                self.merge.sized(self.stats.reserved);
            }
            Err(e) => {
                tracing::warn!(error = %e, size, "allocating a merged segment failed; growing by request instead");
            }
        }
    }

    /// Whether plain large segments are merged: with `merge_quiet` set, where
    /// the pool has no expandable segment (turned off, or none to be had from
    /// the driver). A pool that has one makes plain segments only for a request
    /// its address space cannot hold, and its steps are served by the expandable
    /// segment: a merge's synchronization would buy nothing there.
    pub(super) fn merges(&self) -> bool {
        self.policy.merge_quiet.is_some() && self.plain_segments_only()
    }

    /// Forgets the last merge's size, what grew since and whether a merge was
    /// due (a trim or reset gave segments back): the next merge comes after the
    /// next new segment and sizes the pool from the peak of live bytes. (A
    /// merge left due with live bytes at their low would come at the next
    /// large request and grow the pool back at once.)
    pub(super) fn forget_merges(&mut self) {
        self.merge = MergeClock::default();
    }
}

//! Merging free segments without the expandable segment (`SegmentPolicy::merge_quiet`).
//!
//! Without virtual memory management every large segment is a `cuMemAlloc` of its
//! own, and a block can never span two of them. Exact-size segments made for the
//! shapes of one step are split by the smaller blocks of the next, and a few
//! long-lived blocks then pin many partly used segments: replaying a recorded
//! trace pass after pass, the pool kept making segments (about 12 a pass on
//! `gpt_train.csv`, 3.38x of live after 100 passes). Merging gives the pool one
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

use super::*;
use crate::events::EventSource;

impl Arena {
    /// Merges the wholly free large segments into one when the pool is quiet (live
    /// bytes at most 1/`merge_quiet` of reserved); called while a merge is due.
    /// Synchronizes the device first (one synchronization), so that blocks freed on
    /// other streams are free everywhere and whole segments come free. A failure
    /// leaves the pool as it was, or with the freed segments given back and no
    /// merged one (growth makes what is missing later).
    pub(super) fn merge_if_quiet(&mut self, events: &dyn EventSource, source: &dyn SegmentSource) {
        let Some(quiet) = self.policy.merge_quiet else {
            self.merge_due = false;
            return;
        };
        if self.stats.live.saturating_mul(quiet.max(1)) > self.stats.reserved {
            return;
        }
        self.merge_due = false;
        if let Err(e) = self.consolidate(events) {
            tracing::warn!(error = %e, "synchronizing to merge free segments failed; not merging");
            return;
        }
        // Fewer than two wholly free segments: nothing to merge.
        if self.whole_free_segments(Kind::Large) < 2 {
            return;
        }
        self.release_whole_segments(source, Some(Kind::Large));
        // Not what happened to be free: what the steps need. The first merge
        // sizes the pool to a tenth above the peak of live bytes (best fit over
        // one range held the recorded traces within 1.07-1.12x of it); a later
        // one to the last merge's size plus what the steps since had to grow by
        // (a merged range a step outgrew).
        let floor = self.stats.peak_live / 10 * 11;
        let target = match self.merge_target {
            None => floor,
            Some(t) => t.saturating_add(self.grown_since_merge),
        };
        // It may take more than it gave back (a merged range the steps outgrew is
        // pinned by a block or two, and the new one must hold what overflowed),
        // never past the peak of reserved bytes: a merge sets no new peak.
        let room = self.stats.peak_reserved.saturating_sub(self.stats.reserved);
        let size = target.saturating_sub(self.stats.reserved).min(room) / self.policy.large_round
            * self.policy.large_round;
        self.grown_since_merge = 0;
        if size == 0 {
            self.merge_target = Some(self.stats.reserved);
            return;
        }
        match self.grow(size, Kind::Large, SETTLED, source) {
            Ok(base) => {
                if let Some(seg) = self.segments.get_mut(&base) {
                    seg.merged = true;
                }
                self.stats.counts.merges += 1;
                self.merge_target = Some(self.stats.reserved);
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

    /// Whether the pool has no expandable segment: turned off, or none to be had
    /// from the driver. Its large blocks then live in plain segments only.
    pub(super) fn plain_segments_only(&self) -> bool {
        !self.policy.expandable
            || matches!(
                self.grow_base,
                Reservation::Unavailable | Reservation::Refused
            )
    }

    /// Forgets the last merge's size and what grew since (a trim or reset gave
    /// segments back): the next merge sizes the pool from the peak of live bytes.
    pub(super) fn forget_merges(&mut self) {
        self.merge_target = None;
        self.grown_since_merge = 0;
    }

    /// How many large segments (not the expandable one) are wholly free.
    fn whole_free_segments(&self, kind: Kind) -> usize {
        self.segments
            .iter()
            .filter(|(_, seg)| seg.expandable.is_none() && seg.kind == kind)
            .filter(|(&base, seg)| {
                matches!(self.blocks.get(&base), Some(b) if b.size == seg.size && matches!(b.state, State::Free(_)))
            })
            .count()
    }
}

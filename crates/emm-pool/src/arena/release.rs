//! The release threshold: while the pool's family reserves more than
//! `pool_release_threshold`, a free that reaches the arena gives free memory back
//! to the device, once the streams that freed it are idle (see
//! `PoolConfig::release_threshold`).
//!
//! Nothing here waits for the device. A stream's free blocks become usable by
//! any stream, and so can be given back, when the event recorded at its latest
//! free has completed (queried); while a threshold is set, frees on the default
//! streams record one too. Memory is unmapped (pieces of the expandable segment)
//! or freed (wholly free segments) only when no stream's work can still touch it,
//! so giving it back costs the driver calls and no synchronization.

use super::*;

impl Arena {
    /// Whether a release threshold is set: frees on the default streams then
    /// record events, so that their blocks settle without a synchronization.
    pub(super) fn threshold_set(&self) -> bool {
        self.family.release_threshold() != usize::MAX
    }

    /// Whether the family reserves more than its release threshold.
    pub(crate) fn above_release_threshold(&self) -> bool {
        self.family.above_threshold()
    }

    /// Gives back settled free memory until the family reserves no more than its
    /// release threshold: first the free blocks of idle streams settle, then
    /// wholly free segments go back, then free pieces of the expandable segment.
    /// Returns the bytes given back. A failed event query stops the settling
    /// (logged); what was settled before is still given back.
    pub(crate) fn release_above_threshold(
        &mut self,
        events: &dyn EventSource,
        source: &dyn SegmentSource,
    ) -> usize {
        let threshold = self.family.release_threshold();
        // (Nothing of this arena is free: nothing to give back, and no scan.)
        if self.family_reserved() <= threshold
            || self.is_paused()
            || self.stats.reserved <= self.stats.live
        {
            return 0;
        }
        if let Err(e) = self
            .collect_pending(events)
            .and_then(|_| self.settle_idle_streams(events))
        {
            tracing::warn!(error = %e, "querying the pool's events failed; releasing what is settled");
        }
        let mut released =
            self.release_whole_segments_until(source, None, Some(SETTLED), threshold);
        if self.family_reserved() > threshold {
            // Old mappings of moved pieces whose work is done go first (without
            // waiting); while some still wait, no piece is unmapped.
            self.unmap_retired(events, source, false);
            released += self.release_free_pieces_until(source, threshold);
        }
        if released > 0 {
            self.stats.counts.threshold_releases += 1;
        }
        released
    }

    /// Settles the free blocks of every stream whose event recorded at its latest
    /// free has completed: no work queued before it can touch them.
    fn settle_idle_streams(&mut self, events: &dyn EventSource) -> Result<()> {
        let idle: Vec<(StreamKey, EventId)> = self.order.covered_streams();
        for (stream, id) in idle {
            self.stats.counts.event_queries += 1;
            if !events.is_complete(id)? {
                continue;
            }
            self.order.forget(stream);
            events.recycle(id);
            for kind in [Kind::Small, Kind::Large] {
                self.heap.move_free(stream, kind, SETTLED);
            }
        }
        Ok(())
    }
}

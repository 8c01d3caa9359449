//! Cross-stream reuse: events, pending groups, stealing from other streams, stranded blocks.

use std::collections::BTreeSet;

use std::time::Duration;

use emm_core::Result;

use super::*;
use crate::events::EventSource;

/// How long a stream waits for one parked group's event before it grows
/// instead (see [`Arena::wait_parked`]): well past a training step's lead of
/// the host over the device, short enough that a hung collective does not keep
/// the arena's lock from other threads for long.
pub(crate) const PARKED_WAIT_LIMIT: Duration = Duration::from_secs(1);

impl Arena {
    /// Moves blocks whose event completed to the settled free set.
    pub(super) fn collect_pending(&mut self, events: &dyn EventSource) -> Result<bool> {
        let mut moved = false;
        let mut i = 0;
        while i < self.order.parked().len() {
            self.stats.counts.event_queries += 1;
            if events.is_complete(self.order.parked()[i].event)? {
                let parked = self.order.unpark(i);
                events.recycle(parked.event);
                for a in parked.blocks {
                    if let Some(b) = self
                        .heap
                        .get(a)
                        .copied()
                        .filter(|b| b.state == State::Pending)
                    {
                        self.stats.counts.cross_stream_reuses += 1;
                        self.insert_free(a, b.size, b.segment, SETTLED);
                        moved = true;
                    }
                }
            } else {
                i += 1;
            }
        }
        Ok(moved)
    }

    /// Parks the free blocks of every other stream until an event on that stream
    /// completes: a default stream gets an event recorded now; a created stream
    /// uses the event recorded at its latest free (it may be destroyed since, so
    /// nothing is recorded on it here); a stream with uncovered blocks is skipped.
    pub(super) fn steal_from_other_streams(
        &mut self,
        events: &dyn EventSource,
        stream: StreamKey,
    ) -> Result<bool> {
        self.stats.counts.scan_steps += self.heap.free_set_count();
        self.heap.prune_empty_sets(SETTLED);
        let donors: Vec<StreamKey> = self
            .heap
            .free_sets()
            .filter(|&(s, _, _)| s != stream && s != SETTLED)
            .map(|(s, _, _)| s)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut any = false;
        for donor in donors {
            let id = if is_default_stream(donor) {
                self.stats.counts.events_recorded += 1;
                events.record(stream_of_key(donor))?
            } else {
                match self.order.take_event(donor) {
                    Some(id) => id,
                    None => continue,
                }
            };
            let mut addrs = Vec::new();
            for kind in [Kind::Small, Kind::Large] {
                addrs.extend(self.heap.mark_all(donor, kind, State::Pending));
            }
            self.order.park(id, donor, addrs);
            call_work::note(Work::Parked);
            any = true;
        }
        Ok(any)
    }

    /// Gives `stream` back its own parked blocks (see `stream_order::Parked`; those whose
    /// events completed were settled by `collect_pending` before): stream order
    /// makes them safe for it to reuse at once, as before they were parked.
    /// Without this, a stream that another one asked while the device ran behind
    /// the host went without its own free blocks and reserved more, and so did the
    /// next (FSDP2 on two H100s: 1.083x of allocated on a 1.1 B Llama, where the
    /// replay of its recording with events that complete at once says 1.047x after
    /// 10 passes). Returns whether any block came back.
    pub(super) fn take_back_parked(&mut self, stream: StreamKey, events: &dyn EventSource) -> bool {
        self.stats.counts.scan_steps += self.order.parked().len();
        let mut any = false;
        let mut i = 0;
        while i < self.order.parked().len() {
            if self.order.parked()[i].owner != stream {
                i += 1;
                continue;
            }
            let parked = self.order.unpark(i);
            let n = self.unpark_to(&parked.blocks, stream);
            self.stats.counts.parked_taken_back += n;
            any |= n > 0;
            call_work::note(Work::Parked);
            // (Recorded again later: an event may be recorded over one in flight.)
            // The stream's next free or growth records its next latest event;
            // until then no other stream asks for these blocks again. (Making
            // this one its latest instead let other streams take them sooner, and
            // took GPT-2's snapshot with a side stream from 1.046x to 1.053x of
            // live at a lag of 3,000 requests, `emm-trace/tests/device_lag.rs`.)
            events.recycle(parked.event);
        }
        any
    }

    /// Before `stream` grows past the peak of reserved bytes for `size` bytes of
    /// `kind` while live bytes (with the request) are at most 7/8 of their peak:
    /// when blocks of that kind parked for other streams (see `stream_order::Parked`) hold
    /// at least `size` bytes, makes `stream` wait on the device for their events
    /// (in parking order, until the groups taken hold `size` bytes) and gives
    /// their blocks to it, with an event recorded on it after the wait so that
    /// other streams may take them in turn: stream order then makes them its
    /// own to use at once, and the host does not wait. A growth that stays under
    /// the peak is left to happen (it costs no memory a step did not already
    /// hold, and adds no dependency between streams); so is one near the peak of
    /// live bytes (there the holes are what is short, and adopting only moved
    /// blocks between streams: the replay of the FSDP2 Llama drifted from 1.035
    /// to 1.156 over 30 passes at a lag of 3,000 requests); so is a stream that
    /// cannot wait (a failed wait leaves the group parked; a stream being
    /// captured into a CUDA graph would fail here, but the pool's capture
    /// allocations go to `graph.rs`'s pools), and a small request (a free block
    /// of the expandable segment may serve it, or a 2 MiB segment). Returns
    /// whether any block was adopted. Only with [`SegmentPolicy::adopt_parked`].
    pub(super) fn adopt_parked(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
        events: &dyn EventSource,
    ) -> bool {
        if !self.policy.adopt_parked
            || stream == SETTLED
            || kind != Kind::Large
            || self.stats.reserved.saturating_add(size) <= self.most_reserved
            || self.stats.live.saturating_add(size) > self.stats.peak_live / 8 * 7
        {
            return false;
        }
        self.stats.counts.scan_steps += self.order.parked().len();
        let groups = self.groups_for(stream, kind);
        if groups.iter().map(|&(_, b)| b).sum::<usize>() < size {
            return false;
        }
        let mut chosen = Vec::new();
        let mut bytes = 0;
        for (i, b) in groups {
            if events
                .stream_wait(stream_of_key(stream), self.order.parked()[i].event)
                .is_err()
            {
                // This group stays parked; its event still orders it.
                continue;
            }
            chosen.push(i);
            bytes += b;
            if bytes >= size {
                break;
            }
        }
        // Highest index first: `swap_remove` moves only entries past it.
        chosen.sort_unstable_by(|a, b| b.cmp(a));
        let mut any = false;
        for i in chosen {
            let parked = self.order.unpark(i);
            let n = self.unpark_to(&parked.blocks, stream);
            self.stats.counts.parked_adopted += n;
            any |= n > 0;
            events.recycle(parked.event);
        }
        if any && !is_default_stream(stream) && !self.cover_fresh(stream, events) {
            // No event after the wait: the stream's last one, recorded before
            // it, must not let another stream take these blocks while their
            // owner's work may still run. They wait for a device-wide
            // synchronization (a default stream gets its event when asked).
            self.order.uncover(stream, events);
        }
        any
    }

    /// Before `stream` grows past the peak of reserved bytes for `size` bytes of
    /// `kind`: when blocks of that kind are parked for other streams (see
    /// `stream_order::Parked`), waits on the host for their events, in parking order, until
    /// the groups waited for hold `size` bytes or none is left, and settles them
    /// (any stream's, coalesced), instead of reserving more: what they lack,
    /// growth then moves from them rather than mapping anew (at the four-GPU
    /// Llama's peak of live bytes 924 MiB were parked for a 1,268 MiB request;
    /// waiting only when the parked groups held the whole request left that peak
    /// where it was). Without the expandable segment only a group holding a
    /// block of `size` bytes is waited for: blocks there cannot join.
    ///
    /// On a GPU the host runs ahead of the device, and an FSDP2 step parks most
    /// of the pool behind events the device has not reached: the 1.1 B Llama's
    /// peak on four H100s came with a 125 MiB request while 5.5 GiB were live
    /// and 22.9-24.3 GiB were parked (1.087-1.142x of allocated against
    /// expandable segments' 1.069x, runs 218-219; with the wait 1.053-1.062x
    /// over 40 steps, run 224, and 1.060-1.075x over 100, runs 227-229). The host gives up some of its lead instead; the device keeps
    /// running the work queued since (where [`SegmentPolicy::adopt_parked`] made
    /// the stream's work wait for the other streams' on the device, and steps
    /// ran slower).
    ///
    /// The wait holds the arena's lock, as a device-wide synchronization does,
    /// so it is bounded: each event gets at most [`PARKED_WAIT_LIMIT`], and one
    /// that does not complete by then (a peer that never joins a collective the
    /// work before it needs) ends the waiting, and the stream grows; a failed
    /// wait ends it too, its group left parked. "Past the peak" is judged by the
    /// most bytes ever reserved, which a reset of the statistics' peaks leaves
    /// alone. A growth that stays under it does not wait (it costs no memory a
    /// step did not already hold); nor does a small request (a free block of the
    /// expandable segment may serve it, or a 2 MiB segment), unless the pool
    /// serves every request from its expandable segment (`one_range`). Returns
    /// whether any group was settled. Only with [`SegmentPolicy::wait_parked`].
    pub(super) fn wait_parked(
        &mut self,
        size: usize,
        kind: Kind,
        stream: StreamKey,
        events: &dyn EventSource,
    ) -> Result<bool> {
        if !self.policy.wait_parked
            || kind != Kind::Large
            || self.order.parked().is_empty()
            || self.stats.reserved.saturating_add(size) <= self.most_reserved
        {
            return Ok(false);
        }
        self.stats.counts.scan_steps += self.order.parked().len();
        let joins = self.policy.expandable && self.expandable.usable();
        // The groups that could serve the request, in parking order.
        let mut groups = self.groups_for(stream, kind);
        groups.retain(|&(i, _)| {
            joins
                || self
                    .parked_sizes(&self.order.parked()[i].blocks, Some(kind))
                    .any(|n| n >= size)
        });
        if groups.is_empty() {
            return Ok(false);
        }
        groups.sort_unstable_by_key(|&(i, _)| self.order.parked()[i].seq);
        let mut bytes = 0;
        let mut waited = 0;
        for (i, b) in groups {
            let event = self.order.parked()[i].event;
            match growth_phases::timed(Phase::WaitParked, || {
                events.wait_for(event, PARKED_WAIT_LIMIT)
            }) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(
                        limit_ms = PARKED_WAIT_LIMIT.as_millis() as u64,
                        "parked blocks' event did not complete within the limit; the stream grows"
                    );
                    break;
                }
                Err(e) => {
                    // This group stays parked; its event still orders it.
                    tracing::warn!(error = %e, "waiting for the event of parked blocks failed; they stay parked and the stream grows");
                    break;
                }
            }
            waited += 1;
            bytes += b;
            if bytes >= size {
                break;
            }
        }
        if waited == 0 {
            return Ok(false);
        }
        self.stats.counts.parked_waited += waited;
        tracing::debug!(
            stream = stream_id(stream),
            request = size,
            groups = waited,
            bytes,
            "waited for parked blocks instead of growing past the peak"
        );
        call_work::note(Work::Parked);
        self.collect_pending(events)
    }

    /// Makes the blocks of `blocks` that are still parked free blocks of
    /// `stream` (only parked blocks: nothing else changes them while they
    /// wait); returns how many.
    fn unpark_to(&mut self, blocks: &[CUdeviceptr], stream: StreamKey) -> usize {
        let mut n = 0;
        for &a in blocks {
            if let Some(&b) = self.heap.get(a).filter(|b| b.state == State::Pending) {
                self.insert_free(a, b.size, b.segment, stream);
                n += 1;
            }
        }
        n
    }

    /// Bytes of the blocks of `blocks` that are still parked, in segments of
    /// `kind` where one is given.
    pub(super) fn parked_bytes(&self, blocks: &[CUdeviceptr], kind: Option<Kind>) -> usize {
        self.parked_sizes(blocks, kind).sum()
    }

    /// The sizes of the blocks of `blocks` that are still parked, in segments of
    /// `kind` where one is given.
    fn parked_sizes<'a>(
        &'a self,
        blocks: &'a [CUdeviceptr],
        kind: Option<Kind>,
    ) -> impl Iterator<Item = usize> + 'a {
        blocks
            .iter()
            .filter_map(|&a| self.heap.get(a))
            .filter(|b| b.state == State::Pending)
            .filter(move |b| {
                kind.is_none() || self.segments.get(&b.segment).map(|s| s.kind) == kind
            })
            .map(|b| b.size)
    }

    /// Each group parked for a stream other than `stream`'s own that holds
    /// blocks of `kind`: its index among the parked groups and those blocks'
    /// bytes.
    fn groups_for(&self, stream: StreamKey, kind: Kind) -> Vec<(usize, usize)> {
        self.order
            .parked()
            .iter()
            .enumerate()
            .filter(|(_, p)| p.owner != stream)
            .map(|(i, p)| (i, self.parked_bytes(&p.blocks, Some(kind))))
            .filter(|&(_, bytes)| bytes > 0)
            .collect()
    }

    /// Free bytes held by streams whose blocks no other stream can take before a
    /// device-wide synchronization (blocks given back without an event: thread
    /// exit, a thread cache evicting a stream it may no longer see). When they are
    /// at least the request and an eighth of what is reserved, one synchronization
    /// makes them usable by every stream instead of reserving more: a pool that
    /// sees many streams reserves for what is live, not per stream. Returns `true`
    /// if it synchronized.
    pub(super) fn reclaim_stranded(
        &mut self,
        size: usize,
        events: &dyn EventSource,
    ) -> Result<bool> {
        self.stats.counts.scan_steps += self.heap.free_set_count();
        let stranded: usize = self
            .heap
            .free_sets()
            .filter(|(s, _, _)| *s != SETTLED && self.order.is_uncovered(*s))
            .flat_map(|(_, _, set)| set.iter().map(|&(n, _)| n))
            .sum();
        if stranded == 0 || stranded < size.max(self.stats.reserved / 8) {
            return Ok(false);
        }
        self.consolidate(events)?;
        Ok(true)
    }

    /// New memory lands among `stream`'s free blocks. A created stream records an
    /// event now, while it is surely alive (the caller allocates on it), so that
    /// other streams can take the rest of the new segment once the event completes
    /// instead of each reserving a segment of its own. One event per growth.
    /// Returns whether an event was recorded.
    pub(super) fn cover_fresh(&mut self, stream: StreamKey, events: &dyn EventSource) -> bool {
        if is_default_stream(stream) || stream == SETTLED {
            return false;
        }
        self.stats.counts.events_recorded += 1;
        let Ok(id) = events.record(stream_of_key(stream)) else {
            return false; // the rest of the segment stays with the stream, as before
        };
        self.order.cover(stream, id, events);
        true
    }

    /// Records an event on every stream holding free blocks, waits for all pending
    /// events, and makes those blocks settled (usable by any stream, coalesced).
    pub fn consolidate(&mut self, events: &dyn EventSource) -> Result<()> {
        // Nothing waits on a stream (every free block settled, none pending): a
        // synchronization would settle nothing, and on the out-of-memory path it
        // is most of the time a refusal takes. The streams' last events go back
        // all the same (nothing refers to them once their streams' entries go; a
        // later record reuses them), so a trim can destroy them.
        if self.order.parked().is_empty() && self.heap.only_sets_of(SETTLED) {
            self.order.forget_streams(events);
            return Ok(());
        }
        // One device-wide synchronization covers every stream, destroyed ones too.
        self.stats.counts.device_syncs += 1;
        events.synchronize_all()?;
        for parked in self.order.unpark_all() {
            events.recycle(parked.event);
            for a in parked.blocks {
                if let Some(b) = self
                    .heap
                    .get(a)
                    .copied()
                    .filter(|b| b.state == State::Pending)
                {
                    self.insert_free(a, b.size, b.segment, SETTLED);
                }
            }
        }
        self.stats.counts.scan_steps += self.heap.free_set_count();
        let keys: Vec<(StreamKey, Kind)> = self
            .heap
            .free_sets()
            .filter(|&(s, _, _)| s != SETTLED)
            .map(|(s, k, _)| (s, k))
            .collect();
        for (s, kind) in keys {
            self.heap.move_free(s, kind, SETTLED);
        }
        self.heap.prune_empty_sets(SETTLED);
        self.order.forget_streams(events);
        Ok(())
    }
}

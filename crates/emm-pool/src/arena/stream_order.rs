//! What orders one stream's free blocks against other streams' work: each
//! stream's latest event (recorded after a free or a growth) and whether some of
//! its blocks went without one, and the groups of free blocks parked for another
//! stream until their events complete. The arena decides when to record, park,
//! settle and wait (`streams.rs`); this type keeps the events and gives each back
//! to the event source exactly once.

use emm_sys::CUdeviceptr;

use crate::events::{EventId, EventSource};
use crate::fasthash::FastMap;
use crate::stream_key::StreamKey;

/// What is known of a stream's free blocks.
#[derive(Clone, Copy, Debug, Default)]
struct StreamState {
    /// An event recorded on the stream after its latest free (created streams).
    last_event: Option<EventId>,
    /// Some free block of the stream was given back without an event (its stream
    /// may be gone): none of its blocks can move to another stream before a
    /// device-wide synchronization.
    uncovered: bool,
}

/// Free blocks of one stream that another stream asked for: once `event` (on
/// `owner`, after their last use) completes they are settled, any stream's. Until
/// then they are out of every free set, and `owner` may take them back.
#[derive(Debug)]
pub(super) struct Parked {
    pub event: EventId,
    pub owner: StreamKey,
    pub blocks: Vec<CUdeviceptr>,
    /// When it was parked, in the arena's order of parking (an older group's
    /// event was most often recorded earlier, though not always: a created
    /// stream's group waits for the event of its latest free).
    pub seq: u64,
}

/// The streams' events and the parked groups; see the module documentation.
#[derive(Default)]
pub(super) struct StreamOrder {
    streams: FastMap<StreamKey, StreamState>,
    parked: Vec<Parked>,
    /// Groups parked so far (each group's `seq`).
    parks: u64,
}

impl StreamOrder {
    /// After a free on `stream`: the event recorded after it (`Some(Ok)`), or a
    /// free whose event could not be recorded or was not asked for (`Some(Err)`,
    /// `None` with `covers` true): the stream's blocks then wait for a
    /// device-wide synchronization. With `covers` false (a default stream, no
    /// release threshold) no event is recorded for frees; one recorded before no
    /// longer covers the stream's blocks and goes back (kept, uncovered, when
    /// there is no event source to give it to).
    pub fn after_free(
        &mut self,
        stream: StreamKey,
        covers: bool,
        recorded: Option<emm_core::Result<EventId>>,
        events: Option<&dyn EventSource>,
    ) {
        if covers {
            let st = self.streams.entry(stream).or_default();
            match recorded {
                Some(Ok(id)) => {
                    if let (Some(old), Some(ev)) = (st.last_event.replace(id), events) {
                        ev.recycle(old);
                    }
                }
                _ => st.uncovered = true,
            }
        } else if let Some(st) = self.streams.get_mut(&stream) {
            if let Some(old) = st.last_event.take() {
                match events {
                    Some(ev) => ev.recycle(old),
                    None => {
                        st.last_event = Some(old);
                        st.uncovered = true;
                    }
                }
            }
        }
    }

    /// Makes `id` (recorded on `stream` now) the stream's latest event.
    pub fn cover(&mut self, stream: StreamKey, id: EventId, events: &dyn EventSource) {
        let st = self.streams.entry(stream).or_default();
        if let Some(old) = st.last_event.replace(id) {
            events.recycle(old);
        }
    }

    /// Marks `stream`'s blocks as waiting for a device-wide synchronization; its
    /// latest event goes back.
    pub fn uncover(&mut self, stream: StreamKey, events: &dyn EventSource) {
        let st = self.streams.entry(stream).or_default();
        if let Some(old) = st.last_event.take() {
            events.recycle(old);
        }
        st.uncovered = true;
    }

    /// Whether some free block of `stream` went without an event.
    pub fn is_uncovered(&self, stream: StreamKey) -> bool {
        self.streams.get(&stream).is_some_and(|st| st.uncovered)
    }

    /// Takes `stream`'s latest event for a group parked behind it; `None` when the
    /// stream has none or is uncovered.
    pub fn take_event(&mut self, stream: StreamKey) -> Option<EventId> {
        let st = self.streams.entry(stream).or_default();
        if st.uncovered {
            return None;
        }
        st.last_event.take()
    }

    /// The streams whose free blocks are all covered by their latest event, with
    /// it.
    pub fn covered_streams(&self) -> Vec<(StreamKey, EventId)> {
        self.streams
            .iter()
            .filter(|(_, st)| !st.uncovered)
            .filter_map(|(&s, st)| st.last_event.map(|id| (s, id)))
            .collect()
    }

    /// Forgets `stream` (its blocks were settled after its latest event, which the
    /// caller gives back).
    pub fn forget(&mut self, stream: StreamKey) {
        self.streams.remove(&stream);
    }

    /// Gives every stream's latest event back and forgets the streams.
    pub fn forget_streams(&mut self, events: &dyn EventSource) {
        for (_, st) in self.streams.drain() {
            if let Some(id) = st.last_event {
                events.recycle(id);
            }
        }
    }

    /// Parks `blocks` of `owner` behind `event`.
    pub fn park(&mut self, event: EventId, owner: StreamKey, blocks: Vec<CUdeviceptr>) {
        self.parks += 1;
        self.parked.push(Parked {
            event,
            owner,
            blocks,
            seq: self.parks,
        });
    }

    /// The parked groups, in no particular order.
    pub fn parked(&self) -> &[Parked] {
        &self.parked
    }

    /// Takes out parked group `i` (the last group takes its index); the caller
    /// gives its event back.
    pub fn unpark(&mut self, i: usize) -> Parked {
        self.parked.swap_remove(i)
    }

    /// Takes out every parked group; the caller gives their events back.
    pub fn unpark_all(&mut self) -> Vec<Parked> {
        std::mem::take(&mut self.parked)
    }

    /// Gives back every event held (the parked groups' and each stream's latest)
    /// and forgets them all.
    pub fn clear(&mut self, events: &dyn EventSource) {
        for parked in self.unpark_all() {
            events.recycle(parked.event);
        }
        self.forget_streams(events);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use emm_sys::CUstream;

    use super::*;

    /// Hands out numbered events and counts each one's returns.
    #[derive(Default)]
    struct Counting {
        next: Mutex<usize>,
        returned: Mutex<Vec<usize>>,
    }

    impl Counting {
        fn returned(&self) -> Vec<usize> {
            let mut r = self.returned.lock().unwrap().clone();
            r.sort_unstable();
            r
        }
    }

    impl EventSource for Counting {
        fn record(&self, _stream: CUstream) -> emm_core::Result<EventId> {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            Ok(EventId(*n))
        }
        fn is_complete(&self, _id: EventId) -> emm_core::Result<bool> {
            Ok(true)
        }
        fn wait(&self, _id: EventId) -> emm_core::Result<()> {
            Ok(())
        }
        fn stream_wait(&self, _stream: CUstream, _id: EventId) -> emm_core::Result<()> {
            Ok(())
        }
        fn recycle(&self, id: EventId) {
            self.returned.lock().unwrap().push(id.0);
        }
        fn synchronize_all(&self) -> emm_core::Result<()> {
            Ok(())
        }
    }

    fn event(ev: &Counting) -> EventId {
        ev.record(CUstream(std::ptr::null_mut())).unwrap()
    }

    #[test]
    fn a_streams_latest_event_replaces_the_one_before_and_each_goes_back_once() {
        let ev = Counting::default();
        let mut o = StreamOrder::default();
        o.after_free(7, true, Some(Ok(event(&ev))), Some(&ev));
        o.after_free(7, true, Some(Ok(event(&ev))), Some(&ev));
        assert_eq!(
            ev.returned(),
            vec![1],
            "the first event went back when the second came"
        );
        assert_eq!(o.covered_streams(), vec![(7, EventId(2))]);
        // A free that could not record an event leaves the stream uncovered: its
        // blocks wait for a synchronization, and no group parks behind it.
        o.after_free(7, true, None, None);
        assert!(o.is_uncovered(7));
        assert!(o.covered_streams().is_empty());
        assert_eq!(o.take_event(7), None);
        o.cover(8, event(&ev), &ev);
        o.uncover(8, &ev);
        assert_eq!(ev.returned(), vec![1, 3]);
        o.clear(&ev);
        assert_eq!(ev.returned(), vec![1, 2, 3], "every event went back once");
    }

    #[test]
    fn a_free_without_an_event_drops_the_cover_of_the_one_before() {
        let ev = Counting::default();
        let mut o = StreamOrder::default();
        o.after_free(1, true, Some(Ok(event(&ev))), Some(&ev));
        // The default stream without a release threshold: no event for this free.
        o.after_free(1, false, None, Some(&ev));
        assert_eq!(ev.returned(), vec![1]);
        assert_eq!(o.take_event(1), None);
        // Without an event source to give it to, the old event stays, uncovered.
        o.after_free(2, true, Some(Ok(event(&ev))), Some(&ev));
        o.after_free(2, false, None, None);
        assert!(o.is_uncovered(2));
        o.clear(&ev);
        assert_eq!(ev.returned(), vec![1, 2]);
    }

    #[test]
    fn parked_groups_keep_their_order_and_their_events() {
        let ev = Counting::default();
        let mut o = StreamOrder::default();
        o.park(event(&ev), 5, vec![0x1000]);
        o.park(event(&ev), 6, vec![0x2000, 0x3000]);
        o.park(event(&ev), 5, vec![0x4000]);
        let seqs: Vec<(StreamKey, u64)> = o.parked().iter().map(|p| (p.owner, p.seq)).collect();
        assert_eq!(seqs, vec![(5, 1), (6, 2), (5, 3)]);
        let first = o.unpark(0);
        assert_eq!((first.owner, first.seq, first.blocks), (5, 1, vec![0x1000]));
        // The last group took the index.
        assert_eq!(o.parked()[0].seq, 3);
        ev.recycle(first.event);
        o.clear(&ev);
        assert!(o.parked().is_empty());
        assert_eq!(ev.returned(), vec![1, 2, 3]);
    }
}

//! The map of an allocator's memory at its peak ([`PeakMap`]): its segments and
//! blocks, and the trace's allocations live then, taken during a replay when the
//! allocator's reserved bytes reach a new most ([`ReplayOptions::peak_map`]).
//!
//! [`ReplayOptions::peak_map`]: crate::ReplayOptions::peak_map

use std::time::{Duration, Instant};

use emm_core::SnapshotSegment;

use crate::target::ReplayTarget;

/// An allocator's memory at its peak in a replay: of the moments its reserved
/// bytes were at their most, the first where live bytes were at their most
/// then (taken before the next event that frees memory). So the map shows how
/// the allocator held the most the program needed at its largest footprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeakMap {
    /// Events replayed (over every pass) when it was taken.
    pub event: u64,
    /// The allocator's reserved bytes then.
    pub reserved_bytes: u64,
    /// Live requested bytes then (failed requests included).
    pub live_bytes: u128,
    /// The allocator's segments and their blocks then, in address order; `None`
    /// where it keeps no segments of its own ([`ReplayTarget::segments`]).
    pub segments: Option<Vec<SnapshotSegment>>,
    /// The trace's allocations live then, in no particular order.
    pub live: Vec<LiveBlock>,
}

/// An allocation live in a [`PeakMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Where the allocator placed it; `None` where the target does not say
    /// ([`ReplayTarget::block_address`]).
    pub address: Option<u64>,
    /// Bytes requested.
    pub size: u64,
    /// The trace's stream (as the trace names it; 0: the default stream).
    pub stream: u64,
    /// The index in the trace of the event that made it (its time and stack in
    /// [`Trace::details`](crate::Trace::details)).
    pub event: u64,
    /// The pass that made it (from 0).
    pub pass: u32,
}

/// An allocation the replay holds, with what a [`LiveBlock`] says of it.
pub(crate) struct Held<B> {
    /// The target's allocation; dropping it frees it.
    pub(crate) block: B,
    pub(crate) size: u64,
    pub(crate) stream: u64,
    pub(crate) event: u64,
    pub(crate) pass: u32,
}

/// Watches a replay's reserved bytes and takes a [`PeakMap`] at each new most
/// (of reserved bytes, then of live bytes at those reserved bytes).
pub(crate) struct PeakWatch {
    /// The most reserved bytes seen.
    most: u64,
    /// The most live bytes seen while reserved bytes were at `most`.
    live: u128,
    /// A new most was seen and its map is not taken yet.
    pending: bool,
    map: Option<PeakMap>,
    /// Time spent reading and mapping: not the replay's.
    pub(crate) spent: Duration,
}

impl PeakWatch {
    /// A watch starting from `reserved` bytes.
    pub(crate) fn new(reserved: u64) -> PeakWatch {
        PeakWatch {
            most: reserved,
            live: 0,
            pending: false,
            map: None,
            spent: Duration::ZERO,
        }
    }

    /// Reads `target`'s reserved bytes after an allocation, with `live` bytes
    /// live; returns them.
    pub(crate) fn read<T: ReplayTarget + ?Sized>(&mut self, target: &T, live: u128) -> u64 {
        let t = Instant::now();
        let reserved = target.stats().reserved_bytes as u64;
        if reserved > self.most || (reserved == self.most && live > self.live) {
            self.most = reserved;
            self.live = live;
            self.pending = true;
        }
        self.spent += t.elapsed();
        reserved
    }

    /// Whether a map is to be taken before memory is freed.
    pub(crate) fn pending(&self) -> bool {
        self.pending
    }

    /// Takes the map now: `event` events replayed, `live_bytes` live, `held` the
    /// allocations the replay holds.
    pub(crate) fn take<'a, T, I>(&mut self, target: &T, held: I, event: u64, live_bytes: u128)
    where
        T: ReplayTarget + ?Sized,
        T::Block: 'a,
        I: Iterator<Item = &'a Held<T::Block>>,
    {
        let t = Instant::now();
        self.pending = false;
        self.live = self.live.max(live_bytes);
        let live = held
            .map(|h| LiveBlock {
                address: target.block_address(&h.block),
                size: h.size,
                stream: h.stream,
                event: h.event,
                pass: h.pass,
            })
            .collect();
        self.map = Some(PeakMap {
            event,
            reserved_bytes: target.stats().reserved_bytes as u64,
            live_bytes,
            segments: target.segments(),
            live,
        });
        self.spent += t.elapsed();
    }

    /// The last map taken.
    pub(crate) fn finish(self) -> Option<PeakMap> {
        self.map
    }
}

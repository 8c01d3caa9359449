//! [`PeakSlack`]: where a pool's reserved bytes were at its peak, by what held
//! them. The arena fills it at the moment a growth raises the peak of reserved
//! bytes (`Arena::slack`), so a run's last figure is the make-up of its peak: the
//! live bytes and each kind of free memory the pool held beside them and could
//! not use for the request that grew it. (A resume of paused tags maps memory
//! back outside any request; a peak it raises is not taken apart.)

use emm_core::stat_names as stat;

/// The make-up of the pool's reserved bytes at the last growth that raised their
/// peak (all zero until one does, and after a reset of peaks).
///
/// `reserved_bytes` = `live_bytes` + `own_stream_free_bytes` +
/// `other_streams_free_bytes` + `settled_free_bytes` + `parked_bytes` +
/// `small_free_bytes`; `thread_cached_bytes` is part of `live_bytes`. Counted just
/// after the request that grew the pool was served, so its block is live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeakSlack {
    /// Reserved bytes then (the peak).
    pub reserved_bytes: usize,
    /// Bytes of live blocks: callers' and those waiting in threads' caches.
    pub live_bytes: usize,
    /// Of `live_bytes`, those waiting in threads' caches (free to their thread
    /// and stream, not to the rest of the pool).
    pub thread_cached_bytes: usize,
    /// Free bytes of large blocks of the stream that grew the pool: its holes,
    /// too small for the request, and the rest of the growth.
    pub own_stream_free_bytes: usize,
    /// Free bytes of large blocks of other streams (theirs until an event says
    /// their work is done).
    pub other_streams_free_bytes: usize,
    /// Free bytes of large blocks any stream may take (their work is done).
    pub settled_free_bytes: usize,
    /// Free bytes parked behind events for another stream (see `streams.rs`).
    pub parked_bytes: usize,
    /// Free bytes in small-block segments.
    pub small_free_bytes: usize,
    /// The request that grew the pool (rounded).
    pub request_bytes: usize,
    /// Streams holding free large blocks then (the one that grew included when
    /// it holds any).
    pub streams: usize,
}

impl PeakSlack {
    /// Adds `other`'s figures to these (a tag pool's to its parent's): an upper
    /// bound, as the peaks it sums.
    pub fn absorb(&mut self, other: &PeakSlack) {
        self.reserved_bytes += other.reserved_bytes;
        self.live_bytes += other.live_bytes;
        self.thread_cached_bytes += other.thread_cached_bytes;
        self.own_stream_free_bytes += other.own_stream_free_bytes;
        self.other_streams_free_bytes += other.other_streams_free_bytes;
        self.settled_free_bytes += other.settled_free_bytes;
        self.parked_bytes += other.parked_bytes;
        self.small_free_bytes += other.small_free_bytes;
        self.request_bytes += other.request_bytes;
        self.streams += other.streams;
    }

    /// Each figure under its statistic name, in the order of
    /// `emm_core::stat_names::STAT_NAMES`.
    pub fn to_list(&self) -> Vec<(&'static str, u64)> {
        let u = |v: usize| v as u64;
        vec![
            (stat::PEAK_SLACK_RESERVED_BYTES, u(self.reserved_bytes)),
            (stat::PEAK_SLACK_LIVE_BYTES, u(self.live_bytes)),
            (
                stat::PEAK_SLACK_THREAD_CACHED_BYTES,
                u(self.thread_cached_bytes),
            ),
            (
                stat::PEAK_SLACK_OWN_STREAM_FREE_BYTES,
                u(self.own_stream_free_bytes),
            ),
            (
                stat::PEAK_SLACK_OTHER_STREAMS_FREE_BYTES,
                u(self.other_streams_free_bytes),
            ),
            (
                stat::PEAK_SLACK_SETTLED_FREE_BYTES,
                u(self.settled_free_bytes),
            ),
            (stat::PEAK_SLACK_PARKED_BYTES, u(self.parked_bytes)),
            (stat::PEAK_SLACK_SMALL_FREE_BYTES, u(self.small_free_bytes)),
            (stat::PEAK_SLACK_REQUEST_BYTES, u(self.request_bytes)),
            (stat::PEAK_SLACK_STREAMS, u(self.streams)),
        ]
    }
}

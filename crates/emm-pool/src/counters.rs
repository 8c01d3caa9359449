//! The pool's event counters, declared once: each with the statistic name it
//! is reported under and what it counts. The arena keeps them
//! ([`ArenaStats::counts`](crate::ArenaStats::counts)), the pool reports them
//! ([`PoolStats::counts`](crate::PoolStats::counts), and under their names in
//! `memory_stats`), and a pool's tag pools add theirs in. A new counter is one
//! line here and its name in `emm_core::stat_names`.

use emm_core::stat_names as stat;

macro_rules! counters {
    ($($(#[doc = $doc:literal])+ $field:ident => $name:ident,)+) => {
        /// Events the pool counts (each under a statistic name of
        /// `emm_core::stat_names`, listed in [`Counts::to_list`]).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Counts {
            $($(#[doc = $doc])+ pub $field: usize,)+
        }

        impl Counts {
            /// Adds `other`'s counts to these (a tag pool's to its parent's).
            pub fn absorb(&mut self, other: &Counts) {
                $(self.$field += other.$field;)+
            }

            /// Each count under its statistic name, in the order of
            /// `emm_core::stat_names::STAT_NAMES`.
            pub fn to_list(&self) -> Vec<(&'static str, u64)> {
                vec![$((stat::$name, self.$field as u64),)+]
            }
        }
    };
}

counters! {
    /// Blocks handed to another stream after their event completed.
    cross_stream_reuses => CROSS_STREAM_REUSES,
    /// Free blocks a stream took back from those parked for another stream
    /// (their event had not completed; stream order lets their own stream reuse
    /// them at once).
    parked_taken_back => PARKED_TAKEN_BACK,
    /// Free blocks parked for other streams that a stream adopted instead of
    /// growing past the peak of reserved bytes, after making its work wait (on
    /// the device) for their events (`SegmentPolicy::adopt_parked`).
    parked_adopted => PARKED_ADOPTED,
    /// Groups of free blocks parked for other streams whose events a stream
    /// waited for on the host instead of growing past the peak of reserved
    /// bytes (`SegmentPolicy::wait_parked`).
    parked_waited => PARKED_WAITED,
    /// Requests that took the locked path (thread-cache misses and large blocks).
    locked_allocs => LOCKED_ALLOCS,
    /// Blocks given back to the arena (thread-cache flushes, large blocks).
    locked_frees => LOCKED_FREES,
    /// Events recorded on streams (cross-stream ordering).
    events_recorded => EVENTS_RECORDED,
    /// Event completion queries.
    event_queries => EVENT_QUERIES,
    /// Device-wide synchronizations (out-of-memory ladder, trim, stranded blocks).
    device_syncs => DEVICE_SYNCS,
    /// Allocations that needed new memory from the upstream.
    misses => MISSES,
    /// Per-stream entries visited by scans over streams (stealing, stranded
    /// bytes, consolidation): the work that grows with the number of streams.
    scan_steps => SCAN_STEPS,
    /// Pieces of the expandable segment mapped with new memory (one driver call each).
    pieces_mapped => PIECES_MAPPED,
    /// Pieces of the expandable segment whose memory was mapped again elsewhere
    /// in it, where growth needed memory (instead of new memory).
    pieces_moved => PIECES_MOVED,
    /// Mappings unmapped once the work queued on them was done (one driver call
    /// each): old mappings of moved pieces, and idle pieces `trim` gave back.
    pieces_unmapped => PIECES_UNMAPPED,
    /// Pieces of the expandable segment that growth gave back instead of
    /// moving them: idle, and smaller than the pieces new memory for the
    /// request comes in (`SegmentPolicy::replace_pieces`; counted in
    /// `pieces_unmapped` too).
    pieces_replaced => PIECES_REPLACED,
    /// Times the pool waited for the work queued on old mappings of moved pieces
    /// (growth past the number it lets wait, or a trim or pause unmapping them
    /// all): host stalls until the device caught up.
    retire_waits => RETIRE_WAITS,
    /// Synchronizations made to give back wholly free large segments instead of
    /// growing (without the expandable segment; `SegmentPolicy::tight_percent`).
    tightenings => TIGHTENINGS,
    /// Wholly free large segments merged into one (without the expandable
    /// segment; `SegmentPolicy::merge_quiet`).
    merges => MERGES,
    /// Requests the home segment could not hold (`SegmentPolicy::initial_size`),
    /// which took a new segment beside it: the initial size is smaller than
    /// the job needs.
    home_overflows => HOME_OVERFLOWS,
    /// Frees after which memory above the release threshold went back
    /// (`pool_release_threshold`).
    threshold_releases => THRESHOLD_RELEASES,
    /// Times the pool claimed other threads' caches to take back their blocks
    /// (before it grows for a stream, on out of memory, on a trim, a pause or a
    /// change of the release threshold): one process-wide barrier each
    /// (`owner_lock::barrier`). Before a growth, threads whose caches hold no
    /// block of that stream are not claimed (unless another stream they cache
    /// shares its bit of the mask).
    cache_reclaims => CACHE_RECLAIMS,
}

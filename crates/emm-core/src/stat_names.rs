//! Every statistic name [`MemoryManager::memory_stats`] can report, in one table:
//! PyTorch's `torch.cuda.memory_stats` keys where the meaning is the same, emm's
//! own under `emm.`. Producers (the managers) and readers (the trace's driver
//! counts, the C ABI's PyTorch bridge) use these constants; C and Python read the
//! table through `emm_stat_names`, and the Python bindings' copy
//! (`python/emm/_stat_names.py`) is checked against it by a test.
//!
//! [`MemoryManager::memory_stats`]: crate::MemoryManager::memory_stats

/// Declares each name as a constant and lists them all in [`STAT_NAMES`].
macro_rules! stat_names {
    ($($(#[doc = $doc:literal])* $id:ident = $name:literal;)*) => {
        $($(#[doc = $doc])* pub const $id: &str = $name;)*

        /// Every name with its description, in the order `memory_stats` lists them.
        pub const STAT_NAMES: &[(&str, &str)] = &[$(($name, concat!($($doc),*))),*];
    };
}

stat_names! {
    /// Bytes in blocks callers hold now.
    ALLOCATED_BYTES_CURRENT = "allocated_bytes.all.current";
    /// Peak of `allocated_bytes.all.current` since the last reset of peaks.
    ALLOCATED_BYTES_PEAK = "allocated_bytes.all.peak";
    /// Bytes handed out in all (accumulated).
    ALLOCATED_BYTES_ALLOCATED = "allocated_bytes.all.allocated";
    /// Bytes given back in all (accumulated).
    ALLOCATED_BYTES_FREED = "allocated_bytes.all.freed";
    /// Bytes the manager holds from the driver now.
    RESERVED_BYTES_CURRENT = "reserved_bytes.all.current";
    /// Peak of `reserved_bytes.all.current`.
    RESERVED_BYTES_PEAK = "reserved_bytes.all.peak";
    /// Bytes of blocks in use, cached ones counted as in use by their thread.
    ACTIVE_BYTES_CURRENT = "active_bytes.all.current";
    /// Peak of `active_bytes.all.current`.
    ACTIVE_BYTES_PEAK = "active_bytes.all.peak";
    /// Free bytes inside segments that also hold live blocks.
    INACTIVE_SPLIT_BYTES_CURRENT = "inactive_split_bytes.all.current";
    /// Segments (driver allocations or mapped pieces) held now.
    SEGMENT_CURRENT = "segment.all.current";
    /// Peak of `segment.all.current`.
    SEGMENT_PEAK = "segment.all.peak";
    /// Blocks callers hold now.
    ALLOCATION_CURRENT = "allocation.all.current";
    /// Peak of `allocation.all.current`.
    ALLOCATION_PEAK = "allocation.all.peak";
    /// Blocks handed out in all (accumulated).
    ALLOCATION_ALLOCATED = "allocation.all.allocated";
    /// Blocks given back in all (accumulated).
    ALLOCATION_FREED = "allocation.all.freed";
    /// Allocations that gave cached memory back and retried.
    NUM_ALLOC_RETRIES = "num_alloc_retries";
    /// Allocations refused for want of memory.
    NUM_OOMS = "num_ooms";
    /// Driver allocations (segments, expandable pieces).
    NUM_DEVICE_ALLOC = "num_device_alloc";
    /// Driver frees.
    NUM_DEVICE_FREE = "num_device_free";
    /// Bytes threads keep in their caches for immediate reuse.
    THREAD_CACHED_BYTES = "emm.thread_cached_bytes";
    /// Allocations served from a thread's cache (no lock).
    THREAD_CACHE_HITS = "emm.thread_cache_hits";
    /// Allocations served from the shared arena's free blocks.
    SHARED_HITS = "emm.shared_hits";
    /// Blocks another stream took once their event completed.
    CROSS_STREAM_REUSES = "emm.cross_stream_reuses";
    /// Free blocks a stream took back while another stream waited for them.
    PARKED_TAKEN_BACK = "emm.parked_taken_back";
    /// Free blocks of other streams a stream adopted, waiting for them on the device instead of growing.
    PARKED_ADOPTED = "emm.parked_adopted";
    /// Groups of free blocks parked for other streams whose events a stream waited for on the host instead of growing.
    PARKED_WAITED = "emm.parked_waited";
    /// Allocations that took the arena's lock.
    LOCKED_ALLOCS = "emm.locked_allocs";
    /// Frees that took the arena's lock.
    LOCKED_FREES = "emm.locked_frees";
    /// CUDA events recorded for cross-stream reuse.
    EVENTS_RECORDED = "emm.events_recorded";
    /// CUDA event queries.
    EVENT_QUERIES = "emm.event_queries";
    /// Device-wide synchronizations the pool made.
    DEVICE_SYNCS = "emm.device_syncs";
    /// Allocations that found no free block and grew.
    MISSES = "emm.misses";
    /// Per-stream entries visited by scans over streams.
    SCAN_STEPS = "emm.scan_steps";
    /// Pieces of the expandable segment mapped with new memory.
    PIECES_MAPPED = "emm.pieces_mapped";
    /// Pieces of the expandable segment whose memory moved.
    PIECES_MOVED = "emm.pieces_moved";
    /// Pieces of the expandable segment unmapped (memory given back).
    PIECES_UNMAPPED = "emm.pieces_unmapped";
    /// Pieces of the expandable segment that growth gave back instead of moving them (idle, smaller than the request's new pieces; counted in `emm.pieces_unmapped` too).
    PIECES_REPLACED = "emm.pieces_replaced";
    /// Times the pool waited for the work on old mappings of moved pieces (growth
    /// past the number it lets wait, or a trim or pause unmapping them all): a
    /// host stall until the device caught up.
    RETIRE_WAITS = "emm.retire_waits";
    /// Synchronizations made to give back free segments instead of growing (no expandable segment).
    TIGHTENINGS = "emm.tightenings";
    /// Wholly free large segments merged into one (no expandable segment).
    MERGES = "emm.merges";
    /// Requests the home segment (`EMM_POOL_INITIAL_SIZE`) could not hold, which took a new segment beside it.
    HOME_OVERFLOWS = "emm.home_overflows";
    /// Frees after which memory above the release threshold went back.
    THRESHOLD_RELEASES = "emm.threshold_releases";
    /// Times the pool claimed other threads' caches (one process-wide barrier
    /// each) to take back their blocks: before growing for a stream, on out of
    /// memory, on a trim, a pause or a change of the release threshold.
    CACHE_RECLAIMS = "emm.cache_reclaims";
    /// Bytes of tagged blocks a pause gave back.
    PAUSED_BYTES = "emm.paused_bytes";
    /// At the last growth that raised the peak of reserved bytes: reserved bytes then.
    PEAK_SLACK_RESERVED_BYTES = "emm.peak_slack.reserved_bytes";
    /// At that growth: bytes of live blocks (callers' and threads' caches').
    PEAK_SLACK_LIVE_BYTES = "emm.peak_slack.live_bytes";
    /// At that growth: of the live bytes, those waiting in threads' caches.
    PEAK_SLACK_THREAD_CACHED_BYTES = "emm.peak_slack.thread_cached_bytes";
    /// At that growth: free large blocks of the stream that grew the pool.
    PEAK_SLACK_OWN_STREAM_FREE_BYTES = "emm.peak_slack.own_stream_free_bytes";
    /// At that growth: free large blocks of other streams.
    PEAK_SLACK_OTHER_STREAMS_FREE_BYTES = "emm.peak_slack.other_streams_free_bytes";
    /// At that growth: free large blocks any stream may take.
    PEAK_SLACK_SETTLED_FREE_BYTES = "emm.peak_slack.settled_free_bytes";
    /// At that growth: free blocks parked behind events for another stream.
    PEAK_SLACK_PARKED_BYTES = "emm.peak_slack.parked_bytes";
    /// At that growth: free bytes in small-block segments.
    PEAK_SLACK_SMALL_FREE_BYTES = "emm.peak_slack.small_free_bytes";
    /// At that growth: the request that grew the pool.
    PEAK_SLACK_REQUEST_BYTES = "emm.peak_slack.request_bytes";
    /// At that growth: streams holding free large blocks.
    PEAK_SLACK_STREAMS = "emm.peak_slack.streams";
    /// Bytes of managed memory held now.
    MANAGED_BYTES_CURRENT = "emm.managed_bytes.current";
    /// Peak of `emm.managed_bytes.current`.
    MANAGED_BYTES_PEAK = "emm.managed_bytes.peak";
    /// Managed allocations held now.
    MANAGED_ALLOCATIONS_CURRENT = "emm.managed_allocations.current";
    /// Managed allocations made in all (accumulated).
    MANAGED_ALLOCATIONS_ALLOCATED = "emm.managed_allocations.allocated";
    /// Managed bytes freed while cleanup is deferred, not yet given back.
    MANAGED_PENDING_BYTES = "emm.managed_pending_bytes";
}

/// Whether `name` is one of PyTorch's `memory_stats` keys (emm's own begin with
/// `emm.`).
pub fn is_torch(name: &str) -> bool {
    !name.starts_with("emm.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_plain_and_documented() {
        let mut seen = std::collections::BTreeSet::new();
        for &(name, doc) in STAT_NAMES {
            assert!(seen.insert(name), "{name} twice");
            // `stats_json` writes names unescaped.
            assert!(
                name.split('.').all(|p| !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')),
                "{name}"
            );
            assert!(doc.trim().ends_with('.'), "{name}: {doc:?}");
        }
        assert!(is_torch(ALLOCATED_BYTES_CURRENT) && !is_torch(PAUSED_BYTES));
    }
}

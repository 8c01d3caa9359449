//! [`PoolStats`]: a pool's counters, under PyTorch's `memory_stats` names where
//! they mean the same.

use emm_core::stat_names as stat;
use emm_core::StatList;

/// Statistics of a pool, with PyTorch's `memory_stats` names where they fit
/// ([`PoolStats::to_list`] gives them under those names).
///
/// Blocks a thread keeps in its cache for reuse are free to callers but not to
/// the rest of the pool: they count in `active_bytes` (PyTorch's "active": held, or
/// freed but not yet reusable by everyone), not in `allocated_bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// `allocated_bytes.all.current`: bytes in blocks held by callers (rounded;
    /// blocks waiting in thread caches are not counted).
    pub allocated_bytes: usize,
    /// `allocated_bytes.all.peak`: the peak of `allocated_bytes`, sampled (with no
    /// cost on the lock-free path) at every allocation that takes the pool's lock
    /// and at every statistics query or snapshot. Exact when every allocation takes
    /// the lock (`thread_cache_blocks` 0); otherwise a peak reached by thread-cache
    /// hits alone and undone before the next sample is missed. Never above
    /// `active_bytes_peak`, never below `allocated_bytes`.
    pub allocated_bytes_peak: usize,
    /// `allocated_bytes.all.allocated`: bytes handed to callers so far (rounded).
    pub allocated_bytes_total: u64,
    /// `allocation.all.current`: blocks held by callers.
    pub allocated_blocks: usize,
    /// `allocation.all.peak`, sampled as `allocated_bytes_peak`.
    pub allocated_blocks_peak: usize,
    /// `active_bytes.all.current`: bytes of live blocks, callers' and those parked
    /// in thread caches.
    pub active_bytes: usize,
    /// `active_bytes.all.peak` (exact).
    pub active_bytes_peak: usize,
    /// Bytes parked in thread caches (`active_bytes - allocated_bytes`).
    pub thread_cached_bytes: usize,
    /// `inactive_split_bytes.all.current`: free bytes in blocks that are not a
    /// whole segment.
    pub inactive_split_bytes: usize,
    /// `segment.all.peak`.
    pub segments_peak: usize,
    /// `num_ooms`: allocations that failed for lack of memory.
    pub num_ooms: usize,
    /// `reserved_bytes.all.current`: bytes held from the upstream.
    pub reserved_bytes: usize,
    /// `reserved_bytes.all.peak`.
    pub reserved_bytes_peak: usize,
    /// `num_alloc_retries`-like: out-of-memory ladders run.
    pub num_alloc_retries: usize,
    /// `num_device_alloc`: segments taken from the upstream.
    pub num_device_alloc: usize,
    /// `num_device_free`: segments given back.
    pub num_device_free: usize,
    /// `segment.all.current`.
    pub segments: usize,
    /// Allocations served (all paths).
    pub allocations: u64,
    /// Allocations served by a thread's cache (no lock, no driver call).
    pub thread_cache_hits: u64,
    /// Allocations served from the shared free blocks.
    pub shared_hits: usize,
    /// The events counted, each reported under its `emm.` name (one list:
    /// `counters.rs`).
    pub counts: crate::counters::Counts,
    /// Bytes of tagged allocations whose memory a pause gave back (address space
    /// kept; not in `reserved_bytes`).
    pub paused_bytes: usize,
    /// The make-up of reserved bytes at the last growth that raised their peak:
    /// live bytes and each kind of free memory beside them (under
    /// `emm.peak_slack.*`).
    pub peak_slack: crate::PeakSlack,
}

impl PoolStats {
    /// Adds `other`'s figures to these (a tag pool's to its parent's): counters
    /// and current figures sum; peaks sum too, an upper bound of the peak of the
    /// sum.
    pub fn absorb(&mut self, other: &PoolStats) {
        self.allocated_bytes += other.allocated_bytes;
        self.allocated_bytes_peak += other.allocated_bytes_peak;
        self.allocated_bytes_total += other.allocated_bytes_total;
        self.allocated_blocks += other.allocated_blocks;
        self.allocated_blocks_peak += other.allocated_blocks_peak;
        self.active_bytes += other.active_bytes;
        self.active_bytes_peak += other.active_bytes_peak;
        self.thread_cached_bytes += other.thread_cached_bytes;
        self.inactive_split_bytes += other.inactive_split_bytes;
        self.segments_peak += other.segments_peak;
        self.num_ooms += other.num_ooms;
        self.reserved_bytes += other.reserved_bytes;
        self.reserved_bytes_peak += other.reserved_bytes_peak;
        self.num_alloc_retries += other.num_alloc_retries;
        self.num_device_alloc += other.num_device_alloc;
        self.num_device_free += other.num_device_free;
        self.segments += other.segments;
        self.allocations += other.allocations;
        self.thread_cache_hits += other.thread_cache_hits;
        self.shared_hits += other.shared_hits;
        self.counts.absorb(&other.counts);
        self.paused_bytes += other.paused_bytes;
        self.peak_slack.absorb(&other.peak_slack);
    }

    /// The counters under PyTorch's `memory_stats` names where they mean the same,
    /// emm's own under `emm.`.
    pub fn to_list(&self) -> StatList {
        let u = |v: usize| v as u64;
        let freed_bytes = self
            .allocated_bytes_total
            .saturating_sub(u(self.allocated_bytes));
        let mut list = vec![
            (stat::ALLOCATED_BYTES_CURRENT, u(self.allocated_bytes)),
            (stat::ALLOCATED_BYTES_PEAK, u(self.allocated_bytes_peak)),
            (stat::ALLOCATED_BYTES_ALLOCATED, self.allocated_bytes_total),
            (stat::ALLOCATED_BYTES_FREED, freed_bytes),
            (stat::RESERVED_BYTES_CURRENT, u(self.reserved_bytes)),
            (stat::RESERVED_BYTES_PEAK, u(self.reserved_bytes_peak)),
            (stat::ACTIVE_BYTES_CURRENT, u(self.active_bytes)),
            (stat::ACTIVE_BYTES_PEAK, u(self.active_bytes_peak)),
            (
                stat::INACTIVE_SPLIT_BYTES_CURRENT,
                u(self.inactive_split_bytes),
            ),
            (stat::SEGMENT_CURRENT, u(self.segments)),
            (stat::SEGMENT_PEAK, u(self.segments_peak)),
            (stat::ALLOCATION_CURRENT, u(self.allocated_blocks)),
            (stat::ALLOCATION_PEAK, u(self.allocated_blocks_peak)),
            (stat::ALLOCATION_ALLOCATED, self.allocations),
            (
                stat::ALLOCATION_FREED,
                self.allocations.saturating_sub(u(self.allocated_blocks)),
            ),
            (stat::NUM_ALLOC_RETRIES, u(self.num_alloc_retries)),
            (stat::NUM_OOMS, u(self.num_ooms)),
            (stat::NUM_DEVICE_ALLOC, u(self.num_device_alloc)),
            (stat::NUM_DEVICE_FREE, u(self.num_device_free)),
            (stat::THREAD_CACHED_BYTES, u(self.thread_cached_bytes)),
            (stat::THREAD_CACHE_HITS, self.thread_cache_hits),
            (stat::SHARED_HITS, u(self.shared_hits)),
        ];
        list.extend(self.counts.to_list());
        list.push((stat::PAUSED_BYTES, u(self.paused_bytes)));
        list.extend(self.peak_slack.to_list());
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_reports_every_name_of_the_table_once() {
        let mut names: Vec<&str> = PoolStats::default()
            .to_list()
            .into_iter()
            .chain(emm_core::ManagedStats::default().to_list())
            .map(|(n, _)| n)
            .collect();
        let listed: Vec<&str> = stat::STAT_NAMES.iter().map(|&(n, _)| n).collect();
        assert_eq!(names, listed, "the pool's list in the table's order");
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), listed.len());
    }
}

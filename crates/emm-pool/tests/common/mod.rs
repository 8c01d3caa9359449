//! What the pool's model tests share.

use std::sync::Arc;

use emm_core::DeviceAllocation;
use emm_default::HostUpstream;
use emm_pool::{
    round_size, HostEvents, HostVmm, PoolConfig, PoolManager, PoolUpstream, SegmentPolicy,
};

/// A pool over 4 GiB of host memory whose events complete only when the test
/// says so (`HostEvents::manual`), with the expandable segment or without,
/// `thread_cache_blocks` per thread and stream, and the segment policy as
/// `policy` leaves it.
#[allow(dead_code)] // the model tests make their own pools
pub fn manual_pool(
    expandable: bool,
    thread_cache_blocks: usize,
    policy: impl FnOnce(&mut SegmentPolicy),
) -> (PoolManager, Arc<HostEvents>) {
    let host = Arc::new(HostUpstream::new(4 << 30, false));
    let events = Arc::new(HostEvents::manual());
    let vmm = expandable
        .then(|| Box::new(HostVmm::new(host.clone())) as Box<dyn emm_pool::VirtualMemory>);
    let mut config = PoolConfig {
        thread_cache_blocks,
        // Caches, where a test turns them on, keep blocks of any size: those
        // tests are about what a cache holds (`growth_step.rs` tests the
        // default's largest block, 1 MiB).
        thread_cache_largest: usize::MAX,
        // The stand-in's events complete when waited for: a helper thread
        // unmapping moved pieces would complete them behind the test's back.
        background_unmap: false,
        ..PoolConfig::default()
    };
    config.segments.expandable = expandable;
    // Without the expandable segment a merge synchronizes at quiet moments,
    // which would also complete the manual events behind the test's back;
    // `merge.rs` tests merging.
    config.segments.merge_quiet = None;
    policy(&mut config.segments);
    let pool = PoolManager::with_config(
        PoolUpstream::Custom(Box::new(host), Box::new(events.clone()), vmm, None),
        config,
    )
    .unwrap();
    (pool, events)
}

/// Checks the blocks a model test holds (`live`; empty stand-ins for refused
/// requests have size 0) against `pool`: no two overlap, and the pool counts
/// them allocated (at least them where threads `cache`, which keeps freed
/// blocks allocated to the pool). Returns their rounded bytes.
#[allow(dead_code)] // only the model tests hold blocks this way
pub fn check_live_blocks(pool: &PoolManager, live: &[DeviceAllocation], cache: bool) -> usize {
    let held = || live.iter().filter(|a| a.size() > 0);
    let mut ranges: Vec<(u64, u64)> = held()
        .map(|a| (a.ptr(), a.ptr() + round_size(a.size()) as u64))
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "live blocks overlap: {:#x?} {:#x?}",
            w[0],
            w[1]
        );
    }
    let user_live: usize = held().map(|a| round_size(a.size())).sum();
    let allocated = pool.stats().allocated_bytes;
    if cache {
        assert!(
            allocated >= user_live,
            "allocated {allocated} < live {user_live}"
        );
    } else {
        assert_eq!(allocated, user_live, "allocated bytes add up");
    }
    user_live
}

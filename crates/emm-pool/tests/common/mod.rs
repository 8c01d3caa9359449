//! What the pool's model tests share.

use std::sync::Arc;

use emm_default::HostUpstream;
use emm_pool::{HostEvents, HostVmm, PoolConfig, PoolManager, PoolUpstream, SegmentPolicy};

/// A pool over 4 GiB of host memory whose events complete only when the test
/// says so (`HostEvents::manual`), with the expandable segment or without,
/// `thread_cache_blocks` per thread and stream, and the segment policy as
/// `policy` leaves it.
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
        // The stand-in's events complete when waited for: a helper thread
        // unmapping moved pieces would complete them behind the test's back.
        background_unmap: false,
        ..PoolConfig::default()
    };
    config.segments.expandable = expandable;
    policy(&mut config.segments);
    let pool = PoolManager::with_config(
        PoolUpstream::Custom(Box::new(host), Box::new(events.clone()), vmm, None),
        config,
    )
    .unwrap();
    (pool, events)
}

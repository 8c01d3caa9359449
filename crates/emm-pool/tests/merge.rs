//! Merging free segments without the expandable segment
//! (`SegmentPolicy::merge_quiet`): after the pool made a large segment, the first
//! large request that finds it quiet merges the wholly free large segments into one
//! of their total size, and the steps after it fit there without a driver call.

use emm_core::MemoryManager;
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy};

const MIB: usize = 1 << 20;

fn pool(merge_quiet: Option<usize>) -> PoolManager {
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable: false,
            tight_percent: None,
            merge_quiet,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    PoolManager::host(1 << 40, config).unwrap()
}

/// One step: three tensors of 40, 60 and 100 MiB live together, then a 180 MiB
/// one after the first two are gone (it fits no single segment of the first
/// three).
fn step(pool: &PoolManager) {
    let s = emm_core::SYNC_STREAM;
    let a = pool.memalloc_async(40 * MIB, s).unwrap();
    let b = pool.memalloc_async(60 * MIB, s).unwrap();
    let c = pool.memalloc_async(100 * MIB, s).unwrap();
    drop(a);
    drop(b);
    let d = pool.memalloc_async(180 * MIB, s).unwrap();
    drop(c);
    drop(d);
}

#[test]
fn quiet_merge_gives_steps_one_range_and_no_more_driver_calls() {
    let p = pool(Some(6));
    step(&p);
    // Four exact segments (40 + 60 + 100 + 180 MiB).
    assert_eq!(p.stats().num_device_alloc, 4);
    let reserved = p.stats().reserved_bytes;
    // The next step's first large request finds the pool quiet: one merged
    // segment of the same total takes the four's place.
    step(&p);
    let st = p.stats();
    assert_eq!(st.counts.merges, 1);
    assert_eq!(st.segments, 1, "{st:?}");
    assert_eq!(st.reserved_bytes, reserved);
    let allocs = st.num_device_alloc;
    for _ in 0..5 {
        step(&p);
    }
    let st = p.stats();
    assert_eq!(st.num_device_alloc, allocs, "a steady step allocated");
    assert_eq!(st.counts.merges, 1);
}

#[test]
fn merging_is_off_by_default_and_needs_a_quiet_pool() {
    let p = pool(None);
    for _ in 0..3 {
        step(&p);
    }
    assert_eq!(p.stats().counts.merges, 0);
    assert_eq!(p.stats().segments, 4);
    // On, but never quiet: a long-lived block keeps live above a sixth of reserved.
    let p = pool(Some(6));
    let s = emm_core::SYNC_STREAM;
    let keep = p.memalloc_async(300 * MIB, s).unwrap();
    for _ in 0..3 {
        step(&p);
    }
    assert_eq!(p.stats().counts.merges, 0);
    drop(keep);
}

#[test]
fn the_default_policy_does_not_merge() {
    assert_eq!(PoolConfig::default().segments.merge_quiet, None);
}

//! Merging free segments without the expandable segment
//! (`SegmentPolicy::merge_quiet`): after the pool made a large segment, the first
//! large request that finds it quiet gives back the wholly free large segments and
//! makes one sized to what the steps need (a tenth above the peak of live bytes,
//! then the last merge's size plus what the steps since grew by; never past the
//! peak of reserved bytes), and the steps after it fit there without a driver
//! call.

use std::sync::Arc;

use emm_core::MemoryManager;
use emm_default::HostUpstream;
use emm_pool::{HostEvents, HostVmm, PoolConfig, PoolManager, PoolUpstream, SegmentPolicy};

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
    // Exact segments of 40, 60 and 100 MiB; once the first two tensors are gone,
    // live bytes are back at 100 MiB, where they were when the 100 MiB segment
    // was made, after rising half the way to reserved: the pool is quiet. The
    // 40 and 60 MiB segments go back and one merged segment takes their place:
    // a tenth above the 200 MiB peak of live bytes less the 100 MiB still
    // reserved (120 MiB), no more than the peak of reserved bytes leaves room
    // for (100 MiB). The 180 MiB tensor fits there no more and gets a segment of
    // its own.
    let st = p.stats();
    assert_eq!(st.num_device_alloc, 5, "{st:?}");
    assert_eq!(st.counts.merges, 1, "{st:?}");
    assert_eq!(st.segments, 3, "{st:?}");
    assert_eq!(st.reserved_bytes, (100 + 100 + 180) * MIB, "{st:?}");
    // The next step's first request finds nothing live: the three go back and
    // one range takes their place, sized to the last merge's figure plus what
    // grew since (200 + 180 MiB), which every later step fits.
    step(&p);
    let st = p.stats();
    assert_eq!(st.counts.merges, 2);
    assert_eq!(st.segments, 1, "{st:?}");
    assert_eq!(st.reserved_bytes, 380 * MIB);
    let allocs = st.num_device_alloc;
    for _ in 0..5 {
        step(&p);
    }
    let st = p.stats();
    assert_eq!(st.num_device_alloc, allocs, "a steady step allocated");
    assert_eq!(st.counts.merges, 2);
    assert_eq!(st.reserved_bytes_peak, 380 * MIB, "a merge set a new peak");
}

/// A trim gives the segments back and the merges' sizing with them: the first
/// merge after it sizes the pool from the peak of live bytes again (to 308 MiB,
/// a tenth above 280: the 100 MiB tensor's segment and a merged one of 208 MiB,
/// which the 180 MiB tensor fits), not to the last merged size (380 MiB).
#[test]
fn a_trim_forgets_the_last_merge() {
    let p = pool(Some(6));
    for _ in 0..3 {
        step(&p);
    }
    assert_eq!((p.stats().counts.merges, p.stats().segments), (2, 1));
    p.trim();
    assert_eq!(p.stats().reserved_bytes, 0);
    step(&p);
    let st = p.stats();
    assert_eq!(st.counts.merges, 3, "{st:?}");
    assert_eq!(st.segments, 2, "{st:?}");
    assert_eq!(st.reserved_bytes, 308 * MIB, "{st:?}");
}

/// A merge never takes the pool past its peak of reserved bytes: one made while
/// little was ever reserved is no larger than that peak allows.
#[test]
fn a_merge_sets_no_new_peak() {
    let p = pool(Some(6));
    let s = emm_core::SYNC_STREAM;
    // Two 30 MiB segments, then a quiet pool: 1.1 x the 60 MiB peak of live
    // bytes is 66 MiB, above the 60 reserved: the merge stays at 60.
    let a = p.memalloc_async(30 * MIB, s).unwrap();
    let b = p.memalloc_async(30 * MIB, s).unwrap();
    drop((a, b));
    let peak = p.stats().reserved_bytes_peak;
    drop(p.memalloc_async(10 * MIB, s).unwrap());
    let st = p.stats();
    assert_eq!(st.counts.merges, 1, "{st:?}");
    assert_eq!(st.reserved_bytes_peak, peak, "{st:?}");
}

#[test]
fn merging_turned_off_never_merges_and_on_needs_a_quiet_pool() {
    let p = pool(None);
    for _ in 0..3 {
        step(&p);
    }
    assert_eq!(p.stats().counts.merges, 0);
    assert_eq!(p.stats().segments, 4);
    // On, but never quiet: live bytes only rise.
    let p = pool(Some(6));
    let s = emm_core::SYNC_STREAM;
    let kept: Vec<_> = (1..=6)
        .map(|i| p.memalloc_async(i * 30 * MIB, s).unwrap())
        .collect();
    assert_eq!(p.stats().counts.merges, 0);
    assert_eq!(p.stats().segments, 6);
    drop(kept);
}

/// A block that stays live between steps (weights, optimizer state) keeps live
/// bytes above a sixth of reserved; the pool is quiet once they are back within
/// a sixth of the way from their low to reserved after a step, and merges.
#[test]
fn a_long_lived_block_does_not_keep_the_pool_from_merging() {
    let p = pool(Some(6));
    let s = emm_core::SYNC_STREAM;
    let keep = p.memalloc_async(300 * MIB, s).unwrap();
    for _ in 0..6 {
        step(&p);
    }
    let st = p.stats();
    assert!(st.counts.merges >= 1, "{st:?}");
    let allocs = st.num_device_alloc;
    for _ in 0..5 {
        step(&p);
    }
    let st = p.stats();
    assert_eq!(
        st.num_device_alloc, allocs,
        "a steady step allocated: {st:?}"
    );
    // The kept block's segment and one range for the steps.
    assert_eq!(st.segments, 2, "{st:?}");
    drop(keep);
}

#[test]
fn the_default_policy_merges_at_a_sixth_and_the_setting_turns_it_off() {
    assert_eq!(
        PoolConfig::default().segments.merge_quiet,
        Some(emm_pool::DEFAULT_LEGACY_MERGE)
    );
    assert_eq!(emm_pool::DEFAULT_LEGACY_MERGE, 6);
    std::env::set_var("EMM_POOL_LEGACY_MERGE", "0");
    let off = PoolConfig::from_env();
    std::env::remove_var("EMM_POOL_LEGACY_MERGE");
    assert_eq!(off.unwrap().segments.merge_quiet, None);
}

/// A pool that has its expandable segment gives a request larger than the
/// segment's address space a segment of its own; those are not merged (a merge
/// synchronizes the device, and the path it serves is the one without virtual
/// memory), even with two of them wholly free and the pool quiet.
#[test]
fn a_pool_with_its_expandable_segment_does_not_merge() {
    let host = Arc::new(HostUpstream::new(4 << 30, false));
    let vmm = Box::new(HostVmm::new(host.clone()));
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable_reserve: 64 * MIB,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    let p = PoolManager::with_config(
        PoolUpstream::Custom(
            Box::new(host),
            Box::new(HostEvents::immediate()),
            Some(vmm),
            None,
        ),
        config,
    )
    .unwrap();
    let s = emm_core::SYNC_STREAM;
    let a = p.memalloc_async(100 * MIB, s).unwrap();
    let b = p.memalloc_async(120 * MIB, s).unwrap();
    drop(a);
    drop(b);
    let c = p.memalloc_async(110 * MIB, s).unwrap();
    let st = p.stats();
    assert_eq!(st.counts.merges, 0, "{st:?}");
    drop(c);
    p.check().unwrap();
}

/// The setting's documented default is the policy's.
#[test]
fn the_settings_default_is_the_policys() {
    assert_eq!(
        emm_pool::settings::LEGACY_MERGE.key().default,
        emm_pool::DEFAULT_LEGACY_MERGE.to_string()
    );
}

//! `PoolStats::peak_slack` (`emm.peak_slack.*`): at the growth that raised the
//! peak of reserved bytes, what held them. The parts sum to the reserved bytes,
//! each kind of free memory lands in its own part, and a reset of peaks clears
//! it until the next growth. Events complete only when the test says so.

use std::sync::Arc;

use emm_core::stat_names as stat;
use emm_core::MemoryManager;
use emm_pool::{HostEvents, PeakSlack, PoolManager};
use emm_sys::CUstream;

mod common;
use common::manual_pool;

const MIB: usize = 1 << 20;

/// A pool whose streams grow rather than wait for parked blocks (`wait_parked`
/// off), so that a peak can come with blocks parked.
fn pool(expandable: bool, thread_cache_blocks: usize) -> (PoolManager, Arc<HostEvents>) {
    manual_pool(expandable, thread_cache_blocks, |s| s.wait_parked = false)
}

fn stream(n: usize) -> CUstream {
    CUstream((0x100 * n) as *mut core::ffi::c_void)
}

fn parts(s: &PeakSlack) -> usize {
    s.live_bytes
        + s.own_stream_free_bytes
        + s.other_streams_free_bytes
        + s.settled_free_bytes
        + s.parked_bytes
        + s.small_free_bytes
}

fn check_parked_and_sum(expandable: bool) {
    let (pool, _events) = pool(expandable, 0);
    let (a, b) = (stream(1), stream(2));
    assert_eq!(
        pool.stats().peak_slack,
        PeakSlack::default(),
        "before any growth"
    );
    // A's 64 MiB goes free on A; B's 96 MiB parks it behind A's event, which has
    // not completed, and grows: a new peak with A's block parked.
    drop(pool.memalloc_async(64 * MIB, a).unwrap());
    let small = pool.memalloc_async(4096, b).unwrap();
    let y = pool.memalloc_async(96 * MIB, b).unwrap();
    let st = pool.stats();
    let s = st.peak_slack;
    assert_eq!(s.reserved_bytes, st.reserved_bytes_peak, "{s:?}");
    assert_eq!(parts(&s), s.reserved_bytes, "the parts do not sum: {s:?}");
    assert_eq!(s.request_bytes, 96 * MIB, "{s:?}");
    assert_eq!(s.parked_bytes, 64 * MIB, "A's block is parked: {s:?}");
    assert_eq!(s.live_bytes, 96 * MIB + 4096, "{s:?}");
    assert_eq!(s.thread_cached_bytes, 0, "no thread caches: {s:?}");
    assert_eq!(
        s.small_free_bytes,
        2 * MIB - 4096,
        "the small segment's rest: {s:?}"
    );
    // Reported under its names.
    let listed: Vec<(&str, u64)> = pool
        .memory_stats()
        .into_iter()
        .filter(|(n, _)| n.starts_with("emm.peak_slack."))
        .collect();
    assert_eq!(listed, s.to_list(), "memory_stats lists the make-up");
    assert!(listed
        .iter()
        .any(|&(n, v)| n == stat::PEAK_SLACK_PARKED_BYTES && v == 64 * MIB as u64));
    // A reset of peaks clears it; only a growth past the new peak sets it again.
    pool.reset_peak_stats();
    assert_eq!(pool.stats().peak_slack, PeakSlack::default());
    drop(y);
    let y2 = pool.memalloc_async(96 * MIB, b).unwrap();
    assert_eq!(
        pool.stats().peak_slack,
        PeakSlack::default(),
        "reusing a free block set it"
    );
    drop((y2, small));
}

#[test]
fn parked_blocks_show_and_the_parts_sum_to_the_peak_with_the_expandable_segment() {
    check_parked_and_sum(true);
}

#[test]
fn parked_blocks_show_and_the_parts_sum_to_the_peak_without_it() {
    check_parked_and_sum(false);
}

#[test]
fn blocks_in_a_threads_cache_for_another_stream_show_as_thread_cached() {
    let (pool, _events) = pool(true, 256);
    let (a, b) = (stream(1), stream(2));
    // A's 32 MiB goes into this thread's cache for A; B grows beside it.
    drop(pool.memalloc_async(32 * MIB, a).unwrap());
    let y = pool.memalloc_async(64 * MIB, b).unwrap();
    let s = pool.stats().peak_slack;
    assert_eq!(s.thread_cached_bytes, 32 * MIB, "{s:?}");
    assert_eq!(
        s.live_bytes,
        96 * MIB,
        "cached blocks are live to the arena: {s:?}"
    );
    assert_eq!(parts(&s), s.reserved_bytes, "{s:?}");
    assert_eq!(s.parked_bytes, 0, "{s:?}");
    drop(y);
}

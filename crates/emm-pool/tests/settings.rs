//! The pool's run-time settings over the host stand-in: the byte limit changed
//! while the pool serves (lowering it trims, then refuses what would pass it) and
//! the release threshold (frees give memory above it back once their streams are
//! idle; without one, the pool keeps what it reserved).

use emm_core::{EmmError, MemoryManager, SYNC_STREAM};
use emm_pool::{PoolConfig, PoolManager};
use emm_sys::CUstream;

const MIB: usize = 1 << 20;

/// A pool whose frees all reach the shared arena (no thread caches), so that the
/// counts below do not depend on what a thread keeps.
fn pool(release_threshold: usize) -> PoolManager {
    pool_with(release_threshold, PoolConfig::default().stream_pools)
}

/// [`pool`] with `stream_pools` pools of created streams (0: one shared pool).
fn pool_with(release_threshold: usize, stream_pools: usize) -> PoolManager {
    let config = PoolConfig {
        thread_cache_blocks: 0,
        thread_cache_bytes: 0,
        release_threshold,
        stream_pools,
        ..PoolConfig::default()
    };
    PoolManager::host(64 << 30, config).unwrap()
}

fn stream(n: usize) -> CUstream {
    CUstream(n as *mut core::ffi::c_void)
}

#[test]
fn without_a_threshold_the_pool_keeps_what_it_reserved() {
    let p = pool(usize::MAX);
    let blocks: Vec<_> = (0..8)
        .map(|_| p.memalloc_async(32 * MIB, SYNC_STREAM).unwrap())
        .collect();
    let high = p.stats().reserved_bytes;
    drop(blocks);
    let s = p.stats();
    assert_eq!(s.reserved_bytes, high, "{s:?}");
    assert_eq!(s.counts.threshold_releases, 0);
}

#[test]
fn frees_give_back_memory_above_the_threshold_on_every_stream() {
    // A created stream's blocks in a pool of its own (stream pools, the
    // default) and in the one shared pool.
    for (on, stream_pools) in [(SYNC_STREAM, 8), (stream(0x5000), 8), (stream(0x5000), 0)] {
        let p = pool_with(64 * MIB, stream_pools);
        let blocks: Vec<_> = (0..8)
            .map(|_| p.memalloc_async(32 * MIB, on).unwrap())
            .collect();
        assert!(p.stats().reserved_bytes >= 256 * MIB);
        drop(blocks);
        let s = p.stats();
        assert!(
            s.reserved_bytes <= 64 * MIB,
            "stream {on:?}: reserved {} above the 64 MiB threshold: {s:?}",
            s.reserved_bytes
        );
        assert!(s.counts.threshold_releases > 0, "{s:?}");
        // What stays is reused: the next allocations fit in it or grow again.
        let again = p.memalloc_async(32 * MIB, on).unwrap();
        assert!(p.stats().reserved_bytes >= 32 * MIB);
        drop(again);
    }
}

#[test]
fn a_threshold_set_while_serving_releases_at_once() {
    let p = pool(usize::MAX);
    let blocks: Vec<_> = (0..4)
        .map(|_| p.memalloc_async(64 * MIB, SYNC_STREAM).unwrap())
        .collect();
    let keep = p.memalloc_async(16 * MIB, SYNC_STREAM).unwrap();
    drop(blocks);
    let cached = p.stats().reserved_bytes;
    assert!(cached >= 256 * MIB);
    let released = p.set_release_threshold(32 * MIB);
    assert_eq!(p.release_threshold(), 32 * MIB);
    let s = p.stats();
    assert!(
        released > 0 && s.reserved_bytes + released == cached,
        "{released} {s:?}"
    );
    assert!(s.reserved_bytes <= 32 * MIB, "{s:?}");
    assert!(s.allocated_bytes >= 16 * MIB, "the live block stays: {s:?}");
    drop(keep);
}

#[test]
fn lowering_the_limit_trims_then_refuses_and_raising_it_serves_again() {
    let p = pool(usize::MAX);
    assert_eq!(p.limit(), None);
    let blocks: Vec<_> = (0..4)
        .map(|_| p.memalloc_async(64 * MIB, SYNC_STREAM).unwrap())
        .collect();
    let live = p.memalloc_async(64 * MIB, SYNC_STREAM).unwrap();
    drop(blocks);
    assert!(p.stats().reserved_bytes >= 320 * MIB);
    // Lower than what is reserved, above what is live: the cache goes back.
    let released = p.set_limit(Some(128 * MIB));
    assert!(released >= 192 * MIB, "{released}");
    assert!(p.stats().reserved_bytes <= 128 * MIB);
    let e = p.memalloc_async(128 * MIB, SYNC_STREAM).unwrap_err();
    assert!(matches!(e, EmmError::OutOfMemory { .. }), "{e}");
    assert!(e.to_string().contains("byte limit"), "{e}");
    // Within the limit still serves.
    let small = p.memalloc_async(32 * MIB, SYNC_STREAM).unwrap();
    // Lower than what is live: nothing live is touched, and growth is refused.
    p.set_limit(Some(16 * MIB));
    assert!(p.stats().allocated_bytes >= 96 * MIB);
    assert!(p.memalloc_async(64 * MIB, SYNC_STREAM).is_err());
    p.set_limit(None);
    let big = p.memalloc_async(512 * MIB, SYNC_STREAM).unwrap();
    drop((big, small, live));
}

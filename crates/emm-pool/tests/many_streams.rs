//! A pool that sees many streams reserves for what is live, not per stream, and its
//! work grows linearly with the number of streams (counted, not timed): one
//! 512-byte allocate+free on each of N streams, over the host stand-in.

use core::ffi::c_void;

use emm_pool::{PoolConfig, PoolManager, PoolStats};
use emm_sys::CUstream;

fn one_pair_per_stream(n: usize) -> PoolStats {
    let pool = PoolManager::host(1 << 40, PoolConfig::default()).unwrap();
    for i in 0..n {
        // Distinct created-stream handles (the host stand-in never dereferences them).
        let stream = CUstream((0x10_0000 + 64 * i) as *mut c_void);
        let block = pool.alloc(512, stream).unwrap();
        drop(block);
    }
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes, 0);
    pool.check().unwrap();
    stats
}

fn assert_bounded(n: usize, stats: &PoolStats) {
    // Live is 512 bytes at any time: one small segment (4 MiB) serves every stream.
    assert!(
        stats.reserved_bytes_peak <= 4 << 20,
        "{n} streams reserved {} bytes at peak ({} segments)",
        stats.reserved_bytes_peak,
        stats.num_device_alloc
    );
    assert!(
        stats.counts.scan_steps <= 8 * n,
        "{n} streams took {} scan steps (more than 8 per stream)",
        stats.counts.scan_steps
    );
}

#[test]
fn four_thousand_streams_share_one_segment() {
    let stats = one_pair_per_stream(4_000);
    assert_bounded(4_000, &stats);
    assert_eq!(stats.num_device_alloc, 1);
}

#[test]
fn a_hundred_thousand_streams_reserve_one_segment_in_linear_work() {
    let stats = one_pair_per_stream(100_000);
    assert_bounded(100_000, &stats);
}

/// The per-thread default stream (`CU_STREAM_PER_THREAD`) is a different stream on
/// every thread: a block one thread frees on it is that thread's stream's (an event
/// recorded at the free), and another thread allocating on its own per-thread
/// stream takes it only as a cross-stream reuse after that event, never as a
/// same-stream hit.
#[test]
fn the_per_thread_default_stream_is_a_stream_per_thread() {
    let config = PoolConfig {
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    let pool = std::sync::Arc::new(PoolManager::host(1 << 30, config).unwrap());
    let p = pool.clone();
    let (freed, before) = std::thread::spawn(move || {
        let a = p.alloc(1 << 20, emm_sys::CU_STREAM_PER_THREAD).unwrap();
        let (ptr, before) = (a.ptr(), p.stats());
        drop(a);
        (ptr, before)
    })
    .join()
    .unwrap();
    let after_free = pool.stats();
    assert_eq!(
        after_free.counts.events_recorded,
        before.counts.events_recorded + 1,
        "the free on a thread's per-thread stream records an event: {after_free:?}"
    );
    let p = pool.clone();
    let (ptr, stats) = std::thread::spawn(move || {
        let b = p.alloc(1 << 20, emm_sys::CU_STREAM_PER_THREAD).unwrap();
        (b.ptr(), p.stats())
    })
    .join()
    .unwrap();
    assert_eq!(ptr, freed, "the completed block is reused");
    assert_eq!(
        stats.counts.cross_stream_reuses,
        after_free.counts.cross_stream_reuses + 1,
        "taken from another thread's per-thread stream after its event: {stats:?}"
    );
}

/// Threads that exit are forgotten (their counters folded into the pool's), and
/// the statistics stay whole: a program that starts many short-lived threads keeps
/// a short list and exact counts.
#[test]
fn exited_threads_are_folded_and_their_counts_kept() {
    let pool = std::sync::Arc::new(PoolManager::host(1 << 30, PoolConfig::default()).unwrap());
    let keep = pool.alloc(4096, CUstream(std::ptr::null_mut())).unwrap();
    for i in 0..300usize {
        let p = pool.clone();
        std::thread::spawn(move || {
            let a = p.alloc(512 + i, CUstream(std::ptr::null_mut())).unwrap();
            let b = p.alloc(512 + i, CUstream(std::ptr::null_mut())).unwrap();
            drop(a);
            b // freed by the main thread: the live count moves between threads
        })
        .join()
        .map(drop)
        .unwrap();
    }
    let stats = pool.stats();
    assert!(
        pool.tracked_threads() <= 2,
        "{} thread records",
        pool.tracked_threads()
    );
    assert_eq!(stats.allocations, 601, "{stats:?}");
    assert_eq!(stats.allocated_blocks, 1, "{stats:?}");
    drop(keep);
    assert_eq!(pool.stats().allocated_blocks, 0);
}

/// A block allocated on one thread's per-thread stream and dropped on another
/// thread stays with the first thread's stream (no event can be recorded on it
/// from elsewhere): a third thread's per-thread stream does not take it without a
/// device-wide synchronization.
#[test]
fn a_per_thread_block_freed_elsewhere_stays_with_its_thread() {
    use std::sync::mpsc;
    let config = PoolConfig {
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    let pool = PoolManager::host(1 << 30, config).unwrap();
    let ptds = emm_sys::CU_STREAM_PER_THREAD;
    std::thread::scope(|s| {
        let (to_b, at_b) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let pool = &pool;
        s.spawn(move || {
            to_b.send(pool.alloc(1 << 20, ptds).unwrap()).unwrap();
            // The owning thread stays alive while the others run.
            done_rx.recv().unwrap();
        });
        let a = at_b.recv().unwrap();
        let ptr = a.ptr();
        let syncs = pool.stats().counts.device_syncs;
        drop(a); // on this thread, another than the allocating one
        let c = s
            .spawn(move || pool.alloc(1 << 20, ptds).unwrap().ptr())
            .join()
            .unwrap();
        assert!(
            c != ptr || pool.stats().counts.device_syncs > syncs,
            "a third thread's per-thread stream took the block without a synchronization"
        );
        done_tx.send(()).unwrap();
    });
}

//! Memory tools over the host stand-in: PyTorch-named statistics, the peak reset,
//! and snapshots whose segments and blocks agree with the statistics, with a
//! recorded history that replays to the same state.

use std::collections::HashMap;

use emm_core::{MemoryManager, MemorySnapshot, TraceAction};
use emm_pool::{PoolConfig, PoolManager, PoolStats};
use emm_sys::CUstream;

const S: CUstream = emm_core::SYNC_STREAM;

fn stat(snap: &MemorySnapshot, key: &str) -> u64 {
    snap.stats
        .iter()
        .find(|(k, _)| *k == key)
        .map(|&(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} in the snapshot's statistics"))
}

/// Segments sum to reserved, allocated blocks to active (and to allocated when no
/// thread caches blocks), blocks tile their segments.
fn check_consistent(snap: &MemorySnapshot) {
    let reserved: usize = snap.segments.iter().map(|s| s.total_size).sum();
    assert_eq!(reserved as u64, stat(snap, "reserved_bytes.all.current"));
    let active: usize = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.allocated)
        .map(|b| b.size)
        .sum();
    assert_eq!(active as u64, stat(snap, "active_bytes.all.current"));
    assert_eq!(
        active as u64 - stat(snap, "emm.thread_cached_bytes"),
        stat(snap, "allocated_bytes.all.current")
    );
    for seg in &snap.segments {
        let mut at = seg.address;
        for b in &seg.blocks {
            assert_eq!(b.address, at, "blocks tile the segment");
            at += b.size as u64;
        }
        assert_eq!(at, seg.address + seg.total_size as u64);
    }
}

fn config(cache: usize) -> PoolConfig {
    PoolConfig {
        thread_cache_blocks: cache,
        ..PoolConfig::default()
    }
}

#[test]
fn snapshot_blocks_and_segments_match_the_statistics() {
    for cache in [0, 8] {
        let pool = PoolManager::host(1 << 36, config(cache)).unwrap();
        let mut held = Vec::new();
        for i in 0..40usize {
            held.push(
                pool.alloc(512 * (i % 7 + 1) + (i % 3) * (3 << 20), S)
                    .unwrap(),
            );
            if i % 4 == 3 {
                held.swap_remove(i % held.len());
            }
        }
        let snap = pool.snapshot();
        check_consistent(&snap);
        assert_eq!(
            stat(&snap, "emm.thread_cached_bytes"),
            0,
            "this thread's cache went back"
        );
        let held_bytes: usize = held.iter().map(|a| emm_pool::round_size(a.size())).sum();
        assert_eq!(
            stat(&snap, "allocated_bytes.all.current"),
            held_bytes as u64
        );
        assert_eq!(stat(&snap, "allocation.all.current"), held.len() as u64);
        assert!(
            snap.segments.iter().any(|s| s.expandable),
            "large blocks use the expandable segment"
        );
        drop(held);
        pool.trim();
        let snap = pool.snapshot();
        check_consistent(&snap);
        assert_eq!(stat(&snap, "allocated_bytes.all.current"), 0);
        pool.check().unwrap();
    }
}

#[test]
fn another_threads_cached_blocks_are_active_not_allocated() {
    let pool = std::sync::Arc::new(PoolManager::host(1 << 36, config(8)).unwrap());
    let p = pool.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        drop(p.alloc(4096, S).unwrap()); // parked in this thread's cache
        done_tx.send(()).unwrap();
        rx.recv().unwrap();
    });
    done_rx.recv().unwrap();
    let snap = pool.snapshot();
    check_consistent(&snap);
    assert_eq!(stat(&snap, "emm.thread_cached_bytes"), 4096);
    assert_eq!(stat(&snap, "allocated_bytes.all.current"), 0);
    assert_eq!(stat(&snap, "active_bytes.all.current"), 4096);
    tx.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn peaks_exclude_cached_blocks_and_reset() {
    let pool = PoolManager::host(1 << 36, config(8)).unwrap();
    let a = pool.alloc(1 << 20, S).unwrap();
    let b = pool.alloc(1 << 20, S).unwrap();
    drop(a);
    drop(b);
    // Both parked in this thread's cache: allocated 0, active 2 MiB.
    let s: PoolStats = pool.stats();
    assert_eq!(s.allocated_bytes, 0);
    assert_eq!(s.active_bytes, 2 << 20);
    assert_eq!(s.allocated_bytes_peak, 2 << 20);
    assert_eq!(s.allocated_blocks_peak, 2);
    assert_eq!(s.allocated_bytes_total, 2 << 20);
    pool.reset_peak_stats();
    let s = pool.stats();
    assert_eq!(s.allocated_bytes_peak, 0);
    assert_eq!(
        s.active_bytes_peak,
        2 << 20,
        "active is current: the cache holds it"
    );
    assert_eq!(s.reserved_bytes_peak, s.reserved_bytes);
    let c = pool.alloc(1 << 20, S).unwrap(); // a thread-cache hit
    assert_eq!(
        pool.stats().allocated_bytes_peak,
        1 << 20,
        "sampled at the query"
    );
    drop(c);
    let list = MemoryManager::memory_stats(&pool);
    let m: HashMap<_, _> = list.into_iter().collect();
    assert_eq!(m["allocated_bytes.all.allocated"], 3 << 20);
    assert_eq!(m["allocated_bytes.all.freed"], 3 << 20);
    assert_eq!(m["allocation.all.allocated"], 3);
    assert_eq!(m["allocation.all.freed"], 3);
    MemoryManager::reset_peak_stats(&pool);
}

#[test]
fn the_history_replays_to_the_snapshot() {
    let pool = PoolManager::host(1 << 36, config(8)).unwrap();
    assert!(pool.snapshot().trace.is_empty(), "off by default");
    pool.record_history(100_000);
    let mut held = Vec::new();
    for i in 0..200usize {
        held.push(
            pool.alloc(512 * (i % 5 + 1) + (i % 4) * (2 << 20), S)
                .unwrap(),
        );
        if i % 3 == 0 {
            held.swap_remove(i % held.len());
        }
    }
    let snap = pool.snapshot();
    check_consistent(&snap);
    // Replay: allocs minus frees give the held blocks; segment events the reserve.
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut reserved = 0i64;
    for e in &snap.trace {
        match e.action {
            TraceAction::Alloc => assert!(live.insert(e.addr, e.size).is_none()),
            TraceAction::FreeCompleted => assert_eq!(live.remove(&e.addr), Some(e.size)),
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => reserved += e.size as i64,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => reserved -= e.size as i64,
            TraceAction::FreeRequested | TraceAction::Oom => {}
        }
    }
    let held_bytes: usize = held.iter().map(|a| emm_pool::round_size(a.size())).sum();
    assert_eq!(live.values().sum::<usize>(), held_bytes);
    assert_eq!(reserved as u64, stat(&snap, "reserved_bytes.all.current"));
    // Bounded ring; off drops it.
    pool.record_history(10);
    drop(held);
    assert_eq!(pool.snapshot().trace.len(), 10);
    pool.record_history(0);
    assert!(pool.snapshot().trace.is_empty());
    let json = pool.snapshot().to_json();
    assert!(json.starts_with("{\"segments\":["), "{json}");
}

#[test]
fn an_out_of_memory_is_counted_and_recorded() {
    let pool = PoolManager::host(
        1 << 36,
        PoolConfig {
            limit: Some(64 << 20),
            ..config(8)
        },
    )
    .unwrap();
    pool.record_history(100);
    assert!(pool.alloc(1 << 30, S).is_err());
    let snap = pool.snapshot();
    assert_eq!(stat(&snap, "num_ooms"), 1);
    assert!(snap
        .trace
        .iter()
        .any(|e| e.action == TraceAction::Oom && e.size == 1 << 30));
}

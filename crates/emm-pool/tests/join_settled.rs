//! Without the expandable segment, a block freed on a stream joins the settled
//! free blocks beside it (those a synchronization left free), which become that
//! stream's: free space in a plain segment, which cannot be remapped, stays in
//! one block that a later request can span. With the expandable segment the
//! free path is as before (moving pieces joins free space there; the replays
//! of `emm-trace/tests/steady_state.rs` print the same figures either way).
//!
//! (Handing the joined block to the stream is safe: the settled part had no
//! work queued on it, and the stream's own order covers the rest; another
//! stream takes it only after the stream's event, as any of its blocks.)

use emm_core::MemoryManager;
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy};
use emm_sys::CUstream;

const MIB: usize = 1 << 20;

fn pool() -> PoolManager {
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable: false,
            tight_percent: None,
            merge_quiet: None,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    PoolManager::host(1 << 40, config).unwrap()
}

/// A created stream, as the pool keys it (the host stand-in never dereferences
/// it).
fn stream() -> CUstream {
    CUstream(0x5000 as *mut _)
}

#[test]
fn a_free_joins_its_settled_neighbours_into_a_block_a_request_can_span() {
    let p = pool();
    let s = stream();
    // Three 4 MiB tensors share one 20 MiB segment (requests below half of it do).
    let a = p.memalloc_async(4 * MIB, s).unwrap();
    let b = p.memalloc_async(4 * MIB, s).unwrap();
    let c = p.memalloc_async(4 * MIB, s).unwrap();
    assert_eq!(p.stats().num_device_alloc, 1);
    drop(a);
    drop(c);
    // A trim synchronizes: the free blocks on both sides of `b` are settled; the
    // segment holds `b`, so it stays.
    assert_eq!(p.trim(), 0);
    drop(b);
    // The whole segment is one free block of the stream again: a 20 MiB request
    // takes it without a new segment (apart, the largest free block would be
    // 12 MiB).
    let whole = p.memalloc_async(20 * MIB, s).unwrap();
    let st = p.stats();
    assert_eq!(st.num_device_alloc, 1, "{st:?}");
    assert_eq!(whole.size(), 20 * MIB);
    drop(whole);
}

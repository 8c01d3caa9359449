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
        stats.scan_steps <= 8 * n,
        "{n} streams took {} scan steps (more than 8 per stream)",
        stats.scan_steps
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

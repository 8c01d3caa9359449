//! Replacing small idle pieces instead of moving them
//! (`SegmentPolicy::replace_pieces`): a large request that finds its memory
//! scattered over holes of one-page pieces gives back the pieces no queued work
//! uses and maps new memory in larger pieces, at the same footprint; pieces
//! whose work may still run on the device move as before.

use std::sync::Arc;

use emm_core::{HostClock, MemoryManager};
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy};

const MIB: usize = 1 << 20;

fn pool(replace_pieces: usize, clock: &Arc<HostClock>) -> PoolManager {
    let config = PoolConfig {
        segments: SegmentPolicy {
            replace_pieces,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        stream_pools: 0,
        ..PoolConfig::default()
    };
    PoolManager::host_lagged(1 << 40, config, clock.clone()).unwrap()
}

/// 160 blocks of 2 MiB (one page each), every other run of 8 freed (80 frees,
/// each a tick of the device's clock: ten holes of 8 pieces between live
/// blocks), then a 1 GiB request (new memory for it comes in 8-page pieces): the
/// counters after it, and the reserved bytes.
fn scatter_then_grow(p: &PoolManager, clock: &HostClock) -> (emm_pool::PoolStats, usize) {
    let s = emm_core::SYNC_STREAM;
    let mut blocks: Vec<_> = (0..160)
        .map(|_| Some(p.memalloc_async(2 * MIB, s).unwrap()))
        .collect();
    for (i, b) in blocks.iter_mut().enumerate() {
        if (i / 8) % 2 == 0 {
            drop(b.take());
            clock.tick();
        }
    }
    let before = p.stats();
    let big = p.memalloc_async(1 << 30, s).unwrap();
    let after = p.stats();
    let reserved = after.reserved_bytes;
    drop(big);
    drop(blocks);
    let mut d = after.counts;
    d.pieces_moved -= before.counts.pieces_moved;
    d.pieces_replaced -= before.counts.pieces_replaced;
    let mut out = after;
    out.counts = d;
    (out, reserved)
}

#[test]
fn idle_small_pieces_are_replaced_not_moved_at_the_same_footprint() {
    let (off_clock, on_clock) = (Arc::new(HostClock::new(0)), Arc::new(HostClock::new(0)));
    let (off, off_reserved) = scatter_then_grow(&pool(0, &off_clock), &off_clock);
    let (on, on_reserved) = scatter_then_grow(&pool(8, &on_clock), &on_clock);
    // Off: every free 2 MiB hole's piece moves into the 1 GiB block.
    assert_eq!(off.counts.pieces_replaced, 0);
    assert_eq!(off.counts.pieces_moved, 80, "{:?}", off.counts);
    // On: the marker recorded at the 64th free completed at once (no lag), so
    // the 8 holes freed up to it are idle and their 64 pieces go back; the 2
    // freed after it may still be in use on the device and move.
    assert_eq!(on.counts.pieces_replaced, 64, "{:?}", on.counts);
    assert_eq!(on.counts.pieces_moved, 16, "{:?}", on.counts);
    // The memory went back before the new was made: the same footprint.
    assert_eq!(on_reserved, off_reserved);
    assert_eq!(on.reserved_bytes_peak, off.reserved_bytes_peak);
}

#[test]
fn pieces_whose_work_may_still_run_move() {
    // The device runs 1,000 requests behind: the marker has not completed, so
    // no hole is known idle and every piece moves, as with the policy off.
    let clock = Arc::new(HostClock::new(1000));
    let (on, _) = scatter_then_grow(&pool(8, &clock), &clock);
    assert_eq!(on.counts.pieces_replaced, 0, "{:?}", on.counts);
    assert_eq!(on.counts.pieces_moved, 80, "{:?}", on.counts);
}

#[test]
fn holes_shorter_than_a_new_piece_move() {
    // Every other 2 MiB block freed: eighty holes of one piece, none a run of
    // eight, all idle; they move as with the policy off.
    let clock = Arc::new(HostClock::new(0));
    let p = pool(8, &clock);
    let s = emm_core::SYNC_STREAM;
    let mut blocks: Vec<_> = (0..160)
        .map(|_| Some(p.memalloc_async(2 * MIB, s).unwrap()))
        .collect();
    for b in blocks.iter_mut().step_by(2) {
        drop(b.take());
        clock.tick();
    }
    let before = p.stats().counts;
    let _big = p.memalloc_async(1 << 30, s).unwrap();
    let after = p.stats().counts;
    assert_eq!(after.pieces_replaced, before.pieces_replaced);
    assert_eq!(after.pieces_moved - before.pieces_moved, 80);
}

/// Events recorded while each of `streams` created streams frees 64 blocks.
fn events_for_streams(replace_pieces: usize, streams: usize) -> usize {
    let clock = Arc::new(HostClock::new(0));
    let p = pool(replace_pieces, &clock);
    for n in 1..=streams {
        let s = emm_sys::CUstream((0x1000 * n) as *mut core::ffi::c_void);
        let blocks: Vec<_> = (0..64)
            .map(|_| p.memalloc_async(2 * MIB, s).unwrap())
            .collect();
        drop(blocks);
    }
    p.stats().counts.events_recorded
}

#[test]
fn markers_are_kept_for_at_most_64_streams() {
    // Every free on a created stream records an event anyway; with the policy a
    // stream's 64th free records a marker too, on the first 64 streams only.
    assert_eq!(events_for_streams(8, 10) - events_for_streams(0, 10), 10);
    assert_eq!(events_for_streams(8, 70) - events_for_streams(0, 70), 64);
}

#[test]
fn the_setting_reads_a_page_count() {
    std::env::set_var("EMM_POOL_REPLACE_PIECES", "4");
    let c = PoolConfig::from_env();
    std::env::remove_var("EMM_POOL_REPLACE_PIECES");
    assert_eq!(c.unwrap().segments.replace_pieces, 4);
    std::env::set_var("EMM_POOL_REPLACE_PIECES", "many");
    let e = PoolConfig::from_env();
    std::env::remove_var("EMM_POOL_REPLACE_PIECES");
    let msg = e.unwrap_err().to_string();
    assert!(msg.contains("EMM_POOL_REPLACE_PIECES"), "{msg}");
}

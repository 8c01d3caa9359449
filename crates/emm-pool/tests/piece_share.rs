//! New memory in pieces of at least a share of what the pool reserves
//! (`SegmentPolicy::piece_share`): once the pool is large, small requests'
//! growths map fewer, larger pieces for the same bytes.

use emm_core::MemoryManager;
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy, DEFAULT_PIECE_SHARE};

const MIB: usize = 1 << 20;

fn pool(piece_share: usize) -> PoolManager {
    let config = PoolConfig {
        segments: SegmentPolicy {
            piece_share,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        stream_pools: 0,
        ..PoolConfig::default()
    };
    PoolManager::host(1 << 40, config).unwrap()
}

/// A 2 GiB block, then forty blocks of 6 MiB each (each past the pool's end:
/// a growth whose new memory comes in one-page pieces by the request alone).
/// The pieces mapped for the forty, and the reserved bytes after them.
fn grow_small_after_large(p: &PoolManager) -> (usize, usize) {
    let s = emm_core::SYNC_STREAM;
    let _big = p.memalloc_async(2 << 30, s).unwrap();
    let before = p.stats().counts.pieces_mapped;
    let small: Vec<_> = (0..40)
        .map(|_| p.memalloc_async(6 * MIB, s).unwrap())
        .collect();
    let stats = p.stats();
    assert_eq!(small.len(), 40);
    (stats.counts.pieces_mapped - before, stats.reserved_bytes)
}

#[test]
fn a_large_pool_maps_small_requests_memory_in_fewer_larger_pieces() {
    let (off_pieces, off_reserved) = grow_small_after_large(&pool(0));
    // 2 GiB / 256 = 8 MiB: pieces of four pages instead of one.
    let (on_pieces, on_reserved) = grow_small_after_large(&pool(256));
    assert!(
        on_pieces * 3 <= off_pieces,
        "{on_pieces} pieces with the share, {off_pieces} without"
    );
    // Pieces are the unit of mapping, not of reserving: growth maps what it
    // would have mapped, within one piece.
    assert!(
        on_reserved.abs_diff(off_reserved) <= 8 * MIB,
        "{on_reserved} reserved with the share, {off_reserved} without"
    );
}

#[test]
fn a_small_pool_keeps_the_requests_own_pieces() {
    // 40 MiB reserved / 256 is under a page: the share asks for nothing more.
    let s = emm_core::SYNC_STREAM;
    let (off, on) = (pool(0), pool(256));
    for p in [&off, &on] {
        let _a = p.memalloc_async(40 * MIB, s).unwrap();
        let _b = p.memalloc_async(6 * MIB, s).unwrap();
    }
    assert_eq!(
        on.stats().counts.pieces_mapped,
        off.stats().counts.pieces_mapped
    );
}

#[test]
fn the_setting_reads_a_count_and_is_on_by_default() {
    assert_eq!(
        PoolConfig::default().segments.piece_share,
        DEFAULT_PIECE_SHARE
    );
    assert_eq!(
        PoolConfig::from_env().unwrap().segments.piece_share,
        DEFAULT_PIECE_SHARE
    );
    std::env::set_var("EMM_POOL_PIECE_SHARE", "0");
    let c = PoolConfig::from_env();
    std::env::remove_var("EMM_POOL_PIECE_SHARE");
    assert_eq!(c.unwrap().segments.piece_share, 0);
    std::env::set_var("EMM_POOL_PIECE_SHARE", "half");
    let e = PoolConfig::from_env();
    std::env::remove_var("EMM_POOL_PIECE_SHARE");
    let msg = e.unwrap_err().to_string();
    assert!(msg.contains("EMM_POOL_PIECE_SHARE"), "{msg}");
}

/// The setting's documented default is the policy's.
#[test]
fn the_settings_default_is_the_policys() {
    assert_eq!(
        emm_pool::settings::PIECE_SHARE.key().default,
        DEFAULT_PIECE_SHARE.to_string()
    );
}

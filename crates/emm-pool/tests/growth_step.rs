//! Three settings that shape the expandable segment's free space: the growth
//! step (`SegmentPolicy::expand_step`, `pool_expand_step`), what growth at the
//! segment's end maps beyond what a request lacks; the largest block a thread
//! caches (`PoolConfig::thread_cache_largest`, `pool_thread_cache_largest`),
//! past which freed blocks go straight back to the arena to join their free
//! neighbours; and the most pages in a piece of new memory
//! (`SegmentPolicy::piece_pages`, `pool_piece_pages`).

use emm_core::MemoryManager;
use emm_pool::{
    PoolConfig, PoolManager, SegmentPolicy, DEFAULT_EXPAND_STEP, DEFAULT_PIECE_PAGES,
    DEFAULT_THREAD_CACHE_LARGEST,
};

const MIB: usize = 1 << 20;

fn pool(expand_step: usize, thread_cache_largest: usize) -> PoolManager {
    let config = PoolConfig {
        segments: SegmentPolicy {
            expand_step,
            ..SegmentPolicy::default()
        },
        thread_cache_largest,
        stream_pools: 0,
        ..PoolConfig::default()
    };
    PoolManager::host(1 << 40, config).unwrap()
}

/// Reserved bytes after 640 MiB is held and then 3 MiB more asked for (a growth
/// at the end of a pool large enough that a 32nd of it is 20 MiB).
fn reserved_after_a_small_growth(p: &PoolManager) -> usize {
    let s = emm_core::SYNC_STREAM;
    let _big = p.memalloc_async(640 * MIB, s).unwrap();
    let before = p.stats().reserved_bytes;
    assert_eq!(before, 640 * MIB);
    let _more = p.memalloc_async(3 * MIB, s).unwrap();
    p.stats().reserved_bytes - before
}

#[test]
fn growth_maps_the_step_or_only_what_the_request_lacks() {
    // A step of 20 MiB (the default until the fifty-eighth session; a 32nd of
    // 640 MiB is as much).
    assert_eq!(
        reserved_after_a_small_growth(&pool(20 * MIB, usize::MAX)),
        20 * MIB
    );
    // A page, the default: the two pages the 3 MiB needs, nothing past them.
    assert_eq!(
        reserved_after_a_small_growth(&pool(DEFAULT_EXPAND_STEP, usize::MAX)),
        4 * MIB
    );
    // A step larger than a 32nd of the pool is held to the 32nd.
    assert_eq!(
        reserved_after_a_small_growth(&pool(64 * MIB, usize::MAX)),
        20 * MIB
    );
}

#[test]
fn a_thread_keeps_a_block_larger_than_the_largest_only_until_its_next_call() {
    let s = emm_core::SYNC_STREAM;
    for (largest, kept) in [(usize::MAX, 5 * MIB), (MIB, MIB)] {
        let p = pool(DEFAULT_EXPAND_STEP, largest);
        let cached = || p.stats().thread_cached_bytes;
        // The large block freed first, then the small one: with `largest` at
        // 1 MiB the small one's free sends the large one on to the arena.
        let (large, small) = (
            p.memalloc_async(4 * MIB, s).unwrap(),
            p.memalloc_async(MIB, s).unwrap(),
        );
        drop(large);
        drop(small);
        assert_eq!(cached(), kept, "largest {largest}");
    }
    // A large tensor freed and made again at once (the same-stream pair) is
    // taken back from the thread without the pool's lock, at the same address.
    let p = pool(DEFAULT_EXPAND_STEP, MIB);
    let first = p.memalloc_async(64 * MIB, s).unwrap();
    let addr = first.ptr();
    drop(first);
    let locked = p.stats().counts.locked_allocs;
    for _ in 0..100 {
        let again = p.memalloc_async(64 * MIB, s).unwrap();
        assert_eq!(again.ptr(), addr);
    }
    assert_eq!(
        p.stats().counts.locked_allocs,
        locked,
        "a pair took the lock"
    );
    // A tensor that grows every step (a KV cache: the larger one made, then
    // the old one freed): each old one waits in the cache only until the next
    // step's allocation misses, then joins the free memory beside it, so the
    // cache never holds more than the one block freed last.
    let mut prev = p.memalloc_async(8 * MIB, s).unwrap();
    for step in 1..100usize {
        let next = p.memalloc_async(8 * MIB + step * 8192, s).unwrap();
        assert_eq!(
            p.stats().thread_cached_bytes,
            0,
            "step {step}: the block freed last was kept past a miss"
        );
        let freed = emm_pool::round_size(8 * MIB + (step - 1) * 8192);
        drop(std::mem::replace(&mut prev, next));
        assert_eq!(p.stats().thread_cached_bytes, freed, "step {step}");
    }
    drop(prev);
}

#[test]
fn the_settings_read_sizes_and_keep_their_documented_defaults() {
    assert_eq!(
        PoolConfig::default().segments.expand_step,
        DEFAULT_EXPAND_STEP
    );
    assert_eq!(
        PoolConfig::default().thread_cache_largest,
        DEFAULT_THREAD_CACHE_LARGEST
    );
    assert_eq!(
        PoolConfig::default().segments.piece_pages,
        DEFAULT_PIECE_PAGES
    );
    assert_eq!(
        emm_pool::settings::EXPAND_STEP.key().default,
        "2M",
        "the documented default"
    );
    assert_eq!(DEFAULT_EXPAND_STEP, 2 * MIB);
    assert_eq!(emm_pool::settings::THREAD_CACHE_LARGEST.key().default, "1M");
    assert_eq!(DEFAULT_THREAD_CACHE_LARGEST, MIB);
    assert_eq!(emm_pool::settings::PIECE_PAGES.key().default, "4");
    assert_eq!(DEFAULT_PIECE_PAGES, 4);
    // (Set and read back in one test: the variables are the process's.)
    std::env::set_var("EMM_POOL_EXPAND_STEP", "20M");
    std::env::set_var("EMM_POOL_THREAD_CACHE_LARGEST", "64M");
    std::env::set_var("EMM_POOL_PIECE_PAGES", "8");
    let c = PoolConfig::from_env();
    std::env::set_var("EMM_POOL_PIECE_PAGES", "eight");
    let bad_pages = PoolConfig::from_env();
    std::env::remove_var("EMM_POOL_PIECE_PAGES");
    std::env::set_var("EMM_POOL_THREAD_CACHE_LARGEST", "max");
    let max = PoolConfig::from_env();
    std::env::set_var("EMM_POOL_EXPAND_STEP", "a lot");
    let bad = PoolConfig::from_env();
    std::env::set_var("EMM_POOL_EXPAND_STEP", "0");
    let zero = PoolConfig::from_env().and_then(|c| PoolManager::host(1 << 30, c));
    std::env::remove_var("EMM_POOL_EXPAND_STEP");
    std::env::remove_var("EMM_POOL_THREAD_CACHE_LARGEST");
    let c = c.unwrap();
    assert_eq!(
        (
            c.segments.expand_step,
            c.thread_cache_largest,
            c.segments.piece_pages
        ),
        (20 * MIB, 64 * MIB, 8)
    );
    let msg = bad_pages.unwrap_err().to_string();
    assert!(msg.contains("EMM_POOL_PIECE_PAGES"), "{msg}");
    assert_eq!(max.unwrap().thread_cache_largest, usize::MAX);
    let msg = bad.unwrap_err().to_string();
    assert!(msg.contains("EMM_POOL_EXPAND_STEP"), "{msg}");
    let Err(e) = zero else {
        panic!("a step of 0 was taken");
    };
    // Refused where the variable is read, naming it (not at the pool's
    // creation under an internal name).
    let msg = e.to_string();
    assert!(
        msg.contains("EMM_POOL_EXPAND_STEP") && msg.contains("positive"),
        "{msg}"
    );
}

/// The pieces one growth for a request of `request` bytes maps, with pieces of
/// at most `pages` pages.
fn pieces_for(request: usize, pages: usize) -> usize {
    let p = PoolManager::host(
        1 << 40,
        PoolConfig {
            segments: SegmentPolicy {
                piece_pages: pages,
                ..SegmentPolicy::default()
            },
            stream_pools: 0,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let _block = p.memalloc_async(request, emm_core::SYNC_STREAM).unwrap();
    let stats = p.stats();
    assert_eq!(stats.reserved_bytes, request, "{pages} pages a piece");
    stats.counts.pieces_mapped
}

#[test]
fn new_memory_comes_in_pieces_of_at_most_the_set_pages() {
    // 1 GiB: a 64th of it is 16 MiB, eight pages, held to the most.
    assert_eq!(pieces_for(1 << 30, DEFAULT_PIECE_PAGES), 128);
    assert_eq!(pieces_for(1 << 30, 8), 64);
    assert_eq!(pieces_for(1 << 30, 1), 512);
    // 0 counts as one page; a most above a 64th of the request changes nothing.
    assert_eq!(pieces_for(1 << 30, 0), 512);
    assert_eq!(pieces_for(1 << 30, 64), 64);
    // A request under 128 MiB maps one-page pieces whatever the most.
    assert_eq!(pieces_for(64 * MIB, 8), 32);
}

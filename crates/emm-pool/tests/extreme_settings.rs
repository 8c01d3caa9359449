//! The pool under any settings a user can give it (`EMM_POOL_*`, `PoolConfig`):
//! sizes of zero, one byte, odd, typical or near `usize::MAX` in every numeric
//! field, every switch either way, over the host stand-in. Making the pool either
//! refuses the settings with `InvalidConfig` naming the field, or gives a pool
//! that serves, refuses (a typed error) or fails each request of any size on any
//! stream without a panic, frees, trims and resets, and checks its books after
//! each step. (A `replace_pieces` of 2^43 pages or more once overflowed the
//! growth path's arithmetic on every large request.)

use emm_core::{EmmError, MemoryManager};
use emm_pool::{PoolConfig, PoolManager, SegmentPolicy};
use emm_sys::CUstream;
use proptest::prelude::*;

/// What the stand-in device holds: requests past it fail as out of memory.
const CAPACITY: usize = 8 << 30;

/// A size a user might write in a setting: zero, tiny, odd, typical, larger
/// than any device, or at the top of `usize`.
fn any_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1usize),
        1usize..=4096,
        Just(2 << 20),
        Just(20 << 20),
        (1usize..=64).prop_map(|n| n << 20),
        (30u32..=63).prop_map(|b| 1usize << b),
        (30u32..=63).prop_map(|b| (1usize << b) - 1),
        (0usize..=16).prop_map(|n| usize::MAX - n),
    ]
}

/// A count a user might write (`replace_pieces`, `piece_share`, the merge's
/// quiet share, thread cache blocks, stream pools).
fn any_count() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        1usize..=16,
        Just(4096usize),
        (20u32..=63).prop_map(|b| 1usize << b),
        (0usize..=4).prop_map(|n| usize::MAX - n),
    ]
}

fn any_policy() -> impl Strategy<Value = SegmentPolicy> {
    (
        (
            any::<bool>(),
            any_size(),
            any_size(),
            any_size(),
            any_size(),
        ),
        (
            any_size(),
            prop::option::of(prop_oneof![0u32..=200, Just(u32::MAX)]),
            any_size(),
            prop::option::of(any_count()),
            any::<bool>(),
        ),
        (
            any::<bool>(),
            any::<bool>(),
            any_count(),
            any_count(),
            any_count(),
            any_size(),
        ),
    )
        .prop_map(
            |(
                (expandable, expandable_reserve, expand_step, small_segment, large_segment),
                (large_round, tight_percent, exclusive, merge_quiet, one_range),
                (adopt_parked, wait_parked, replace_pieces, piece_share, piece_pages, initial_size),
            )| SegmentPolicy {
                expandable,
                expandable_reserve,
                expand_step,
                small_segment,
                large_segment,
                large_round,
                tight_percent,
                exclusive,
                merge_quiet,
                one_range,
                adopt_parked,
                wait_parked,
                replace_pieces,
                piece_share,
                piece_pages,
                initial_size,
            },
        )
}

/// Mostly the defaults' page and segment sizes (so that most pools are made
/// and serve), each field sometimes anything.
fn any_config() -> impl Strategy<Value = PoolConfig> {
    (
        any_policy(),
        any::<bool>(),
        prop::option::of(any_size()),
        any_count(),
        any_size(),
        any_size(),
        any::<bool>(),
        any_count(),
    )
        .prop_map(
            |(mut segments, typical, limit, blocks, cache, threshold, exportable, pools)| {
                if typical {
                    // The sizes every pool checks at creation, as by default.
                    let d = SegmentPolicy::default();
                    segments.large_round = d.large_round;
                    segments.small_segment = d.small_segment;
                    segments.large_segment = d.large_segment;
                    segments.expand_step = d.expand_step;
                    segments.expandable_reserve = segments.expandable_reserve.max(d.large_round);
                    segments.tight_percent = segments.tight_percent.map(|p| p.max(100));
                }
                PoolConfig {
                    segments,
                    limit,
                    thread_cache_blocks: blocks,
                    thread_cache_bytes: cache,
                    release_threshold: threshold,
                    exportable,
                    stream_pools: pools,
                    ..PoolConfig::default()
                }
            },
        )
}

#[derive(Clone, Debug)]
enum Step {
    Alloc { size: usize, stream: usize },
    Free(usize),
    Trim,
    Reset,
}

fn any_request() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..=(1 << 20),
        4 => (1usize..=96).prop_map(|n| n << 20),
        1 => Just(0usize),
        1 => (1usize..=4).prop_map(|n| n << 30),
        1 => any_size(),
    ]
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (any_request(), 0usize..4).prop_map(|(size, stream)| Step::Alloc { size, stream }),
        6 => any::<prop::sample::Index>().prop_map(|i| Step::Free(i.index(usize::MAX))),
        1 => Just(Step::Trim),
        1 => Just(Step::Reset),
    ]
}

/// The streams the steps use: the legacy default stream, the per-thread one
/// and two created ones.
fn stream(n: usize) -> CUstream {
    stream_handle([0usize, 2, 0x5000, 0x9000][n % 4])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn no_setting_and_no_request_makes_the_pool_panic(
        config in any_config(),
        steps in prop::collection::vec(any_step(), 1..40),
    ) {
        let pool = match PoolManager::host(CAPACITY, config) {
            Ok(p) => p,
            Err(EmmError::InvalidConfig { name, .. }) => {
                prop_assert!(!name.is_empty());
                return Ok(());
            }
            Err(e) => return Err(TestCaseError::fail(format!("making the pool: {e}"))),
        };
        let mut live = Vec::new();
        for step in steps {
            match step {
                Step::Alloc { size, stream: s } => match pool.memalloc_async(size, stream(s)) {
                    Ok(a) => live.push(a),
                    Err(e) => {
                        let text = e.to_string();
                        prop_assert!(!text.is_empty());
                    }
                },
                Step::Free(i) => {
                    if !live.is_empty() {
                        let n = i % live.len();
                        drop(live.swap_remove(n));
                    }
                }
                Step::Trim => {
                    let _ = pool.trim();
                }
                Step::Reset => {
                    live.clear();
                    let _ = pool.reset();
                }
            }
            if let Err(e) = pool.check() {
                return Err(TestCaseError::fail(format!("the pool's books: {e}")));
            }
        }
        drop(live);
        let _ = pool.trim();
        let s = pool.stats();
        prop_assert_eq!(s.active_bytes, 0, "{:?}", s);
    }
}

/// Without the expandable segment, with large segments rounded to a GiB and
/// the exclusive rule on for every segment, best fit passes over the block of
/// the segment just made for a 2 MiB request (it would waste more than an
/// eighth of its segment). The pool once handed out that segment's base with
/// its block still free in its books (which `check` finds), so the next
/// request that fit there got the same bytes (the overlap asserted below).
#[test]
fn a_block_from_a_new_segment_best_fit_passes_over_is_taken_in_the_books() {
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable: false,
            large_segment: 2 << 20,
            large_round: 1 << 30,
            exclusive: 0,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        thread_cache_bytes: 0,
        ..PoolConfig::default()
    };
    let pool = PoolManager::host(CAPACITY, config).unwrap();
    let a = pool.memalloc_async(2 << 20, stream(0)).unwrap();
    pool.check().unwrap();
    // 1000 MiB wastes 24 MiB of the first segment's free GiB: best fit takes
    // it there (before, the block at its base, the first request's).
    let b = pool.memalloc_async(1000 << 20, stream(0)).unwrap();
    pool.check().unwrap();
    let (a0, b0) = (a.ptr(), b.ptr());
    assert!(
        a0 + a.size() as u64 <= b0 || b0 + b.size() as u64 <= a0,
        "two live blocks overlap: {a0:#x}+{} and {b0:#x}+{}",
        a.size(),
        b.size()
    );
    assert_eq!(pool.stats().allocated_bytes, 1002 << 20);
    assert_eq!(pool.stats().segments, 1);
}

/// A stream handle no user-space address can be: refused as an argument. Its
/// top bit set, the pool would take it for a thread's per-thread stream, and
/// `usize::MAX` for the key of blocks any stream may take at once (so a block
/// freed on it would go to another stream with no event).
#[test]
fn a_stream_handle_that_is_no_address_is_refused() {
    let pool = PoolManager::host(CAPACITY, PoolConfig::default()).unwrap();
    for raw in [usize::MAX, 1 << 63, (1 << 63) | 0x5000, usize::MAX - 1] {
        match pool.memalloc_async(1 << 20, stream_handle(raw)) {
            Err(EmmError::InvalidArgument { what, found, .. }) => {
                assert_eq!(what, "stream");
                assert_eq!(found, format!("{raw:#x}"));
            }
            other => panic!("stream {raw:#x}: {other:?}"),
        }
    }
    for raw in [0usize, 1, 2, 0x5000] {
        let a = pool
            .memalloc_async(1 << 20, stream_handle(raw))
            .unwrap_or_else(|e| panic!("stream {raw:#x}: {e}"));
        drop(a);
    }
    pool.check().unwrap();
}

fn stream_handle(raw: usize) -> CUstream {
    CUstream(raw as *mut core::ffi::c_void)
}

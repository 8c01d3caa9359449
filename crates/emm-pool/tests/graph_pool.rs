//! The private pool for CUDA graphs on the host stand-in: a block freed on a
//! stream is reused on that stream only, blocks split and merge inside their
//! segment, and segments go back only once the pool is released and holds
//! nothing live in them. A model-based test checks those rules over random
//! sequences of allocations, frees, releases and reclaims.

use std::collections::HashMap;
use std::sync::Arc;

use emm_core::{DeviceAllocation, EmmError};
use emm_default::HostUpstream;
use emm_pool::{GraphPool, GRAPH_MEDIUM_SEGMENT, GRAPH_ROUND, GRAPH_SMALL_SEGMENT};
use emm_sys::{CUdeviceptr, CUstream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn stream(n: usize) -> CUstream {
    CUstream(n as *mut core::ffi::c_void)
}

fn pool(capacity: usize) -> (Arc<GraphPool>, Arc<HostUpstream>) {
    let host = Arc::new(HostUpstream::new(capacity, false));
    (GraphPool::new(Box::new(host.clone())), host)
}

#[test]
fn a_block_freed_on_a_stream_is_reused_there_and_not_on_another() {
    let (pool, host) = pool(1 << 30);
    let a = pool.alloc(4096, stream(1)).unwrap();
    let addr = a.ptr();
    drop(a);
    let on_other = pool.alloc(4096, stream(2)).unwrap();
    assert_ne!(
        on_other.ptr(),
        addr,
        "stream 2 took a block freed on stream 1"
    );
    let again = pool.alloc(4096, stream(1)).unwrap();
    assert_eq!(
        again.ptr(),
        addr,
        "stream 1 did not reuse its own freed block"
    );
    assert_eq!(host.alloc_count(), 2, "one small segment per stream");
}

#[test]
fn small_blocks_share_a_segment_and_merge_back_when_freed() {
    let (pool, host) = pool(1 << 30);
    let s = stream(7);
    let blocks: Vec<DeviceAllocation> = (0..4).map(|_| pool.alloc(MIB / 2, s).unwrap()).collect();
    assert_eq!(
        host.alloc_count(),
        1,
        "four half-MiB blocks fit one 2 MiB segment"
    );
    let st = pool.stats();
    assert_eq!(
        (st.live_blocks, st.live_bytes, st.reserved_bytes),
        (4, 2 * MIB, GRAPH_SMALL_SEGMENT)
    );
    // Free in an order that needs merging on both sides.
    let mut blocks = blocks.into_iter().map(Some).collect::<Vec<_>>();
    for i in [1, 3, 0, 2] {
        blocks[i] = None;
    }
    // The whole segment is one free block again: a 2 MiB request on the stream
    // takes it without a new segment.
    let whole = pool.alloc(GRAPH_SMALL_SEGMENT, s).unwrap();
    assert_eq!(
        host.alloc_count(),
        1,
        "the freed pieces did not merge back into one block"
    );
    assert_eq!(pool.stats().live_bytes, GRAPH_SMALL_SEGMENT);
    drop(whole);
}

#[test]
fn segments_go_back_only_after_release_and_only_when_nothing_in_them_lives() {
    let (pool, host) = pool(1 << 30);
    let s = stream(3);
    let kept = pool.alloc(64 * MIB, s).unwrap(); // a segment of its own
    let freed = pool.alloc(3 * MIB, s).unwrap(); // a 20 MiB segment
    drop(freed);
    assert_eq!(pool.reclaim().unwrap(), 0, "a pool in use gave memory back");
    pool.set_released();
    assert_eq!(
        pool.reclaim().unwrap(),
        GRAPH_MEDIUM_SEGMENT,
        "only the idle segment goes"
    );
    assert_eq!(host.used(), 64 * MIB);
    let err = pool.alloc(512, s).unwrap_err();
    assert!(matches!(err, EmmError::InvalidArgument { .. }), "{err}");
    drop(kept);
    assert_eq!(pool.reclaim().unwrap(), 64 * MIB);
    assert_eq!((host.used(), host.misuse()), (0, 0));
    let st = pool.stats();
    assert_eq!(
        (
            st.segments,
            st.reserved_bytes,
            st.segment_allocs,
            st.segment_frees
        ),
        (0, 0, 2, 2)
    );
    assert_eq!(st.peak_reserved_bytes, 64 * MIB + GRAPH_MEDIUM_SEGMENT);
}

#[test]
fn out_of_memory_and_bad_sizes_are_errors_that_say_what_was_asked() {
    let (pool, _host) = pool(8 * MIB);
    let err = pool.alloc(16 * MIB, stream(1)).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let err = pool.alloc(0, stream(1)).unwrap_err();
    assert!(
        matches!(err, EmmError::InvalidSize { requested: 0, .. }),
        "{err}"
    );
    let err = pool.alloc(usize::MAX, stream(1)).unwrap_err();
    assert!(matches!(err, EmmError::InvalidSize { .. }), "{err}");
    assert_eq!(pool.stats().live_blocks, 0);
}

#[test]
fn owns_and_live_blocks_tell_its_live_blocks_from_anything_else() {
    let (pool, _host) = pool(1 << 30);
    let a = pool.alloc(1000, stream(1)).unwrap();
    let addr = a.ptr();
    assert!(pool.owns(addr));
    assert!(
        !pool.owns(addr + 512),
        "the free tail of the segment is not a live block"
    );
    let b = pool.alloc(1 << 21, stream(2)).unwrap();
    let mut want = vec![addr, b.ptr()];
    want.sort_unstable();
    assert_eq!(pool.live_blocks(), want);
    drop(a);
    assert!(!pool.owns(addr), "a freed block is not live");
    assert_eq!(pool.live_blocks(), vec![b.ptr()]);
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, stream: usize },
    Free(usize),
    Release,
    Reclaim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop_oneof![1usize..8192, 100_000usize..1_100_000, Just(3 * MIB), Just(11 * MIB + 1)], 1usize..4)
            .prop_map(|(size, stream)| Op::Alloc { size, stream }),
        5 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Release),
        1 => Just(Op::Reclaim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The pool against a model: live blocks never overlap, the counters match
    /// what is live and what the upstream holds, and no allocation on stream T
    /// overlaps memory whose last free was on another stream (the host upstream
    /// never hands an address out twice, so that history never goes stale).
    #[test]
    fn the_pool_keeps_its_rules_over_random_sequences(ops in proptest::collection::vec(op(), 1..60)) {
        let (pool, host) = pool(1 << 34);
        let mut live: Vec<(DeviceAllocation, usize)> = Vec::new();
        // Granule address -> the stream its last free was on.
        let mut freed_on: HashMap<CUdeviceptr, usize> = HashMap::new();
        let mut released = false;
        for op in ops {
            match op {
                Op::Alloc { size, stream: s } => {
                    let got = pool.alloc(size, stream(s));
                    if released {
                        prop_assert!(got.is_err(), "a released pool handed out memory");
                        continue;
                    }
                    let a = got.unwrap();
                    let start = a.ptr();
                    prop_assert_eq!(start % GRAPH_ROUND as u64, 0);
                    let end = start + size.div_ceil(GRAPH_ROUND) as u64 * GRAPH_ROUND as u64;
                    for (b, _) in &live {
                        let (bs, be) = (b.ptr(), b.ptr() + b.size() as u64);
                        prop_assert!(end <= bs || be <= start, "{start:#x}..{end:#x} overlaps {bs:#x}..{be:#x}");
                    }
                    let mut g = start;
                    while g < end {
                        if let Some(&other) = freed_on.get(&g) {
                            prop_assert_eq!(other, s, "memory freed on stream {} went to stream {}", other, s);
                        }
                        g += GRAPH_ROUND as u64;
                    }
                    live.push((a, s));
                }
                Op::Free(i) if !live.is_empty() => {
                    let (a, s) = live.swap_remove(i % live.len());
                    let start = a.ptr();
                    let end = start + a.size().div_ceil(GRAPH_ROUND) as u64 * GRAPH_ROUND as u64;
                    let mut g = start;
                    while g < end {
                        freed_on.insert(g, s);
                        g += GRAPH_ROUND as u64;
                    }
                    drop(a);
                }
                Op::Free(_) => {}
                Op::Release => {
                    pool.set_released();
                    released = true;
                }
                Op::Reclaim => {
                    let before = pool.stats().reserved_bytes;
                    let n = pool.reclaim().unwrap();
                    if !released {
                        prop_assert_eq!(n, 0);
                    }
                    prop_assert_eq!(pool.stats().reserved_bytes, before - n);
                }
            }
            prop_assert_eq!(pool.check(), Ok(()));
            let st = pool.stats();
            prop_assert_eq!(st.live_blocks, live.len());
            let rounded: usize = live.iter().map(|(a, _)| a.size().div_ceil(GRAPH_ROUND) * GRAPH_ROUND).sum();
            prop_assert!(st.live_bytes >= rounded && st.live_bytes <= rounded + live.len() * GRAPH_ROUND,
                "live_bytes {} against {} requested (rounded)", st.live_bytes, rounded);
            prop_assert_eq!(st.reserved_bytes, host.used());
            prop_assert!(st.reserved_bytes >= st.live_bytes);
        }
        live.clear();
        pool.set_released();
        pool.reclaim().unwrap();
        prop_assert_eq!((host.used(), host.misuse(), pool.stats().segments), (0, 0, 0));
    }
}

//! Stream pools (`pool_stream_pools`) over the host stand-in: each created
//! stream up to the bound allocates from a pool of its own; statistics,
//! trim and the byte limit cover them all; a request that one pool cannot
//! serve takes the other pools' free memory first.

use emm_core::{DeviceAllocation, MemoryManager};
use emm_pool::{round_size, PoolConfig, PoolManager};
use emm_sys::CUstream;
use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};

mod common;

const MIB: usize = 1 << 20;

fn stream(n: usize) -> CUstream {
    CUstream(n as *mut core::ffi::c_void)
}

fn pool(stream_pools: usize, limit: Option<usize>) -> PoolManager {
    let config = PoolConfig {
        stream_pools,
        limit,
        ..PoolConfig::default()
    };
    PoolManager::host(1 << 34, config).unwrap()
}

/// Over the host stand-in the pools of a family share one device: blocks live
/// in two streams' pools count against the same capacity (each pool had a
/// stand-in of its own, so `emm replay --device-memory` let stream pools
/// hold more than the device).
#[test]
fn stream_pools_over_the_stand_in_share_one_device() {
    for lagged in [false, true] {
        let config = PoolConfig {
            stream_pools: 2,
            thread_cache_blocks: 0,
            ..PoolConfig::default()
        };
        let p = if lagged {
            let clock = std::sync::Arc::new(emm_core::HostClock::new(10));
            PoolManager::host_lagged(100 * MIB, config, clock).unwrap()
        } else {
            PoolManager::host(100 * MIB, config).unwrap()
        };
        let a = p.memalloc_async(64 * MIB, stream(0x10)).unwrap();
        let e = p
            .memalloc_async(64 * MIB, stream(0x20))
            .expect_err("128 MiB live on a 100 MiB device");
        assert!(e.is_out_of_memory(), "{e}");
        drop(a);
        // The first stream's pool gives its free memory back for the second.
        let b = p.memalloc_async(64 * MIB, stream(0x20)).unwrap();
        drop(b);
        p.check().unwrap();
    }
}

#[test]
fn each_created_stream_allocates_from_memory_of_its_own() {
    let p = pool(2, None);
    let a = p.memalloc_async(8 * MIB, stream(0x10)).unwrap();
    let b = p.memalloc_async(8 * MIB, stream(0x20)).unwrap();
    let c = p.memalloc_async(8 * MIB, stream(0x30)).unwrap();
    let d = p.memalloc_async(8 * MIB, stream(0)).unwrap();
    let segment_of = |x: &DeviceAllocation| {
        p.snapshot()
            .segments
            .iter()
            .find(|s| s.address <= x.ptr() && x.ptr() < s.address + s.total_size as u64)
            .map(|s| s.address)
            .unwrap()
    };
    let (sa, sb, sc, sd) = (
        segment_of(&a),
        segment_of(&b),
        segment_of(&c),
        segment_of(&d),
    );
    assert_ne!(sa, sb, "two created streams share no segment");
    assert_ne!(sa, sc);
    assert_ne!(sb, sc);
    // The stream past the bound (0x30) and the null stream share the pool's own.
    assert_eq!(
        sc, sd,
        "past the bound, a stream shares the pool's own memory"
    );
    drop((a, b, c, d));
    p.check().unwrap();
    assert_eq!(p.stats().allocated_bytes, 0);
    p.trim();
    assert_eq!(
        p.stats().reserved_bytes,
        0,
        "trim covers every stream's pool"
    );
}

#[test]
fn a_stream_of_small_blocks_makes_no_pool_of_its_own() {
    let p = pool(1, None);
    let segment_of = |x: &DeviceAllocation| {
        p.snapshot()
            .segments
            .iter()
            .find(|s| s.address <= x.ptr() && x.ptr() < s.address + s.total_size as u64)
            .map(|s| (s.address, s.large))
            .unwrap()
    };
    let own = p.memalloc_async(8 * MIB, stream(0)).unwrap();
    let small = p.memalloc_async(4096, stream(0x50)).unwrap();
    assert!(!segment_of(&small).1, "in one of the pool's small segments");
    // The one slot is still free: the next stream's large block gets it.
    let large = p.memalloc_async(8 * MIB, stream(0x60)).unwrap();
    assert_ne!(
        segment_of(&large).0,
        segment_of(&own).0,
        "stream 0x60 has a pool of its own"
    );
    drop((own, small, large));
    p.check().unwrap();
}

#[test]
fn the_reserved_peak_is_the_peak_of_the_sum() {
    let p = pool(4, None);
    let a = p.memalloc_async(64 * MIB, stream(0x10)).unwrap();
    drop(a);
    p.trim();
    let b = p.memalloc_async(64 * MIB, stream(0x20)).unwrap();
    let s = p.stats();
    assert!(s.reserved_bytes_peak >= 64 * MIB);
    assert!(
        s.reserved_bytes_peak < 96 * MIB,
        "two pools' 64 MiB at different times peak once, not twice: {}",
        s.reserved_bytes_peak
    );
    assert!(
        s.allocated_bytes_peak < 96 * MIB,
        "{}",
        s.allocated_bytes_peak
    );
    drop(b);
    p.reset_peak_stats();
    assert_eq!(p.stats().reserved_bytes_peak, p.stats().reserved_bytes);
}

#[test]
fn a_request_takes_another_streams_free_memory_under_the_limit() {
    let p = pool(4, Some(100 * MIB));
    let a = p.memalloc_async(70 * MIB, stream(0x10)).unwrap();
    drop(a);
    assert!(
        p.stats().reserved_bytes >= 70 * MIB,
        "kept cached by stream 0x10's pool"
    );
    let b = p
        .memalloc_async(70 * MIB, stream(0x20))
        .expect("stream 0x10's free memory goes back for stream 0x20");
    assert!(p.stats().reserved_bytes <= 100 * MIB);
    assert_eq!(
        p.stats().num_ooms,
        0,
        "a refusal the family served is no OOM"
    );
    // A request no trim can make room for is still refused, typed, once.
    let e = p.memalloc_async(70 * MIB, stream(0x10)).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(p.stats().num_ooms, 1, "counted once");
    // The message says what the refusing pool holds (stream 0x10's: nothing
    // live) and what the family holds together (stream 0x20's 70 MiB).
    let msg = e.to_string();
    assert!(msg.contains("live 0 B"), "{msg}");
    assert!(
        msg.contains("all 3 pools of this manager (its own, its stream and tag pools) together: live 70.0 MiB"),
        "{msg}"
    );
    drop(b);
    p.check().unwrap();
}

#[test]
fn tag_and_stream_pools_give_each_other_their_free_memory() {
    let p = pool(4, Some(100 * MIB));
    // A tag's cache serves a stream...
    {
        let _r = emm_core::Region::enter("stream-pools-tagged").unwrap();
        drop(p.memalloc_async(70 * MIB, stream(0x10)).unwrap());
    }
    let a = p
        .memalloc_async(70 * MIB, stream(0x10))
        .expect("the tag's free memory goes back for the stream");
    drop(a);
    // ...and a stream's cache serves a tag.
    let _r = emm_core::Region::enter("stream-pools-tagged").unwrap();
    let b = p
        .memalloc_async(70 * MIB, stream(0x10))
        .expect("the stream's free memory goes back for the tag");
    drop(b);
    p.check().unwrap();
}

#[test]
fn the_setting_sets_how_many_streams_get_pools() {
    // (No other test of this binary reads the environment.)
    std::env::remove_var("EMM_POOL_STREAM_POOLS");
    assert_eq!(
        PoolConfig::from_env().unwrap().stream_pools,
        emm_pool::DEFAULT_STREAM_POOLS
    );
    assert_eq!(
        PoolConfig::default().stream_pools,
        emm_pool::DEFAULT_STREAM_POOLS
    );
    // The setting's documented default is the constant.
    let key = emm_pool::settings::STREAM_POOLS.key();
    assert_eq!(key.default, emm_pool::DEFAULT_STREAM_POOLS.to_string());
    std::env::set_var("EMM_POOL_STREAM_POOLS", "0");
    assert_eq!(PoolConfig::from_env().unwrap().stream_pools, 0);
    std::env::set_var("EMM_POOL_STREAM_POOLS", "3");
    assert_eq!(PoolConfig::from_env().unwrap().stream_pools, 3);
    std::env::set_var("EMM_POOL_STREAM_POOLS", "many");
    let e = PoolConfig::from_env().unwrap_err().to_string();
    std::env::remove_var("EMM_POOL_STREAM_POOLS");
    assert!(e.contains("EMM_POOL_STREAM_POOLS"), "{e}");
}

// Model: blocks on the null stream, two created streams with pools of their
// own and one past the bound, under a byte limit.

const LIMIT: usize = 96 * MIB;
const STREAMS: [usize; 4] = [0, 0x10, 0x20, 0x30];

#[derive(Clone, Debug)]
enum Step {
    Alloc(usize, usize),
    Free(usize),
    Trim,
    ResetPeaks,
}

#[derive(Clone, Debug)]
struct Model {
    cache: bool,
    live: usize,
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        any::<bool>()
            .prop_map(|cache| Model { cache, live: 0 })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let n = state.live.max(1);
        let size = prop_oneof![1usize..(1 << 20), (1usize << 20)..(30 << 20)];
        prop_oneof![
            6 => (size, 0..STREAMS.len()).prop_map(|(s, i)| Step::Alloc(s, STREAMS[i])),
            5 => (0..n).prop_map(Step::Free),
            1 => Just(Step::Trim),
            1 => Just(Step::ResetPeaks),
        ]
        .boxed()
    }

    fn preconditions(state: &Model, step: &Step) -> bool {
        match step {
            Step::Free(i) => *i < state.live,
            _ => true,
        }
    }

    fn apply(mut m: Model, step: &Step) -> Model {
        match step {
            Step::Alloc(..) => m.live += 1,
            Step::Free(_) => m.live -= 1,
            _ => {}
        }
        m
    }
}

struct Sut {
    pool: PoolManager,
    live: Vec<DeviceAllocation>,
}

impl StateMachineTest for Sut {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(m: &Model) -> Sut {
        let config = PoolConfig {
            stream_pools: 2,
            limit: Some(LIMIT),
            thread_cache_blocks: if m.cache { 4 } else { 0 },
            ..PoolConfig::default()
        };
        Sut {
            pool: PoolManager::host(1 << 34, config).unwrap(),
            live: Vec::new(),
        }
    }

    fn apply(mut sut: Sut, _m: &Model, step: Step) -> Sut {
        match step {
            Step::Alloc(size, st) => match sut.pool.memalloc_async(size, stream(st)) {
                Ok(a) => {
                    assert_eq!(a.size(), size);
                    sut.live.push(a);
                }
                Err(e) => {
                    assert!(e.is_out_of_memory(), "{e}");
                    let live: usize = sut.live.iter().map(|a| round_size(a.size())).sum();
                    // Refused only near the limit: every other pool's free
                    // memory went back first.
                    assert!(
                        live + round_size(size) > LIMIT / 2,
                        "{size} bytes refused with {live} live under a {LIMIT}-byte limit"
                    );
                    // SAFETY: owns nothing (keeps the model's count).
                    sut.live.push(unsafe {
                        DeviceAllocation::from_raw_parts(0, 0, stream(st), |_, _, _| {})
                    });
                }
            },
            Step::Free(i) => drop(sut.live.remove(i)),
            Step::Trim => {
                sut.pool.trim();
            }
            Step::ResetPeaks => sut.pool.reset_peak_stats(),
        }
        sut
    }

    fn check_invariants(sut: &Sut, m: &Model) {
        sut.pool.check().unwrap();
        common::check_live_blocks(&sut.pool, &sut.live, m.cache);
        let s = sut.pool.stats();
        assert!(s.reserved_bytes >= s.allocated_bytes);
        assert!(
            s.reserved_bytes <= LIMIT,
            "the family's limit holds: {}",
            s.reserved_bytes
        );
        let segments: usize = sut
            .pool
            .snapshot()
            .segments
            .iter()
            .map(|x| x.total_size)
            .sum();
        assert_eq!(segments, s.reserved_bytes, "segments sum to reserved bytes");
    }

    fn teardown(mut sut: Sut, _m: Model) {
        sut.live.clear();
        sut.pool.trim();
        let s = sut.pool.stats();
        assert_eq!(s.allocated_bytes, 0, "every block came back");
        assert_eq!(s.reserved_bytes, 0, "trim gave every pool's memory back");
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]
    #[test]
    fn stream_pools_match_their_model(sequential 1..60 => Sut);
}

/// Pieces moved by a growth of stream 0x10 that a freed block cannot serve,
/// with `big` bytes live on the null stream beside it.
fn moves_of_a_growth(stream_pools: usize, big: usize) -> usize {
    let config = PoolConfig {
        stream_pools,
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    let p = PoolManager::host(1 << 34, config).unwrap();
    let _big = (big > 0).then(|| p.memalloc_async(big, stream(0)).unwrap());
    let a = p.memalloc_async(8 * MIB, stream(0x10)).unwrap();
    let _b = p.memalloc_async(8 * MIB, stream(0x10)).unwrap();
    drop(a);
    let before = p.stats().counts.pieces_moved;
    let _c = p.memalloc_async(24 * MIB, stream(0x10)).unwrap();
    p.check().unwrap();
    p.stats().counts.pieces_moved - before
}

#[test]
fn a_pool_holding_a_small_share_of_its_family_maps_new_memory_instead_of_moving() {
    // One pool: the growth moves the freed block's pieces to join the new memory.
    assert!(
        moves_of_a_growth(0, 1 << 30) > 0,
        "a family of one pool moves"
    );
    // The stream's own pool, alone in the family: it moves too.
    assert!(
        moves_of_a_growth(2, 0) > 0,
        "a pool that is its family's bulk moves"
    );
    // The stream's pool beside a pool 30 times its size: new memory instead.
    assert_eq!(
        moves_of_a_growth(2, 1 << 30),
        0,
        "a pool under a 32nd of the family moves nothing"
    );
}

#[test]
fn a_huge_request_on_a_created_stream_is_a_typed_error() {
    for n in [0, 4] {
        let p = pool(n, None);
        for size in [usize::MAX, usize::MAX / 2, 1 << 62] {
            let e = p.memalloc_async(size, stream(0x10)).unwrap_err();
            assert!(
                matches!(e, emm_core::EmmError::InvalidSize { .. }) || e.is_out_of_memory(),
                "{size}: {e}"
            );
        }
        p.check().unwrap();
    }
}

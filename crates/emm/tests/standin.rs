//! The managers against `emm-standin`, the fault-injecting stand-in driver (host
//! memory, no GPU): conformance, data through copies, and injected faults (out of
//! memory at each step of each manager's ladder, failing frees, failing event
//! calls, a lost context), each ending in a typed error or a correct retry with
//! nothing leaked and nothing freed twice.
//!
//! The library is found next to the test executable (`target/<profile>/`); build
//! it first with `cargo build -p emm-standin` (`cargo xtask ci` does).

mod common;

use common::managers::{manager, MANAGERS};
use common::{fixture, oom, snapshot, Fixture, Snapshot};

use emm::core::conformance;
use emm::{Context, EmmError, MemoryManager, Stream};
use emm_default::DefaultManager;
use emm_driver::memory;
use emm_hostonly::HostOnlyManager;
use emm_pool::PoolManager;
use emm_sys::{CUresult, StandIn};

fn assert_clean(s: &StandIn<'_>, ctx: &Context, before: &Snapshot, what: &str) {
    ctx.synchronize().unwrap();
    let after = snapshot(s);
    assert_eq!(
        &after, before,
        "{what}: the stand-in's live resources or bad-free counters changed"
    );
}

/// Runs `body` on a thread of its own and joins it, so that leak checks also see
/// what a thread's exit gives back (its caches; the pool itself goes with its last
/// owner, as `pool_drop_destroys_its_events_on_a_live_thread` checks).
fn on_thread<R: Send>(body: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|sc| sc.spawn(body).join().unwrap())
}

fn conformance_of(name: &str) {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let m = manager(name, &f.ctx);
        let report = conformance::run(m.as_ref(), &f.ctx);
        println!("{name} on the stand-in:\n{report}");
        assert!(report.all_passed(), "{name}:\n{report}");
    });
    assert_clean(&f.s, &f.ctx, &before, name);
}

#[test]
fn conformance_default() {
    conformance_of("default");
}

#[test]
fn conformance_pool() {
    conformance_of("pool");
}

#[test]
fn conformance_hostonly() {
    conformance_of("hostonly");
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn data_written_is_read_back_through_copies() {
    let f = fixture();
    let before = snapshot(&f.s);
    for name in MANAGERS {
        on_thread(|| data_round_trip(name, &f.ctx, true));
        assert_clean(&f.s, &f.ctx, &before, name);
    }
}

fn data_round_trip(name: &str, ctx: &Context, trim: bool) {
    let f = ctx;
    {
        let m = manager(name, f);
        let stream = Stream::new(f).unwrap();
        for (i, &n) in [1usize, 4097, 1 << 20, 5 << 20].iter().enumerate() {
            let a = m.memalloc(n).unwrap();
            let b = m.memalloc_async(n, stream.raw()).unwrap();
            let data = pattern(i as u8, n);
            let mut back = vec![0u8; n];
            // SAFETY: both allocations hold `n` bytes.
            unsafe {
                memory::copy_htod(f, a.ptr(), &data).unwrap();
                memory::copy_dtod(f, b.ptr(), a.ptr(), n).unwrap();
                memory::copy_dtoh(f, &mut back, b.ptr()).unwrap();
            }
            assert_eq!(back, data, "{name}: {n} bytes through htod, dtod, dtoh");
            // SAFETY: as above.
            unsafe {
                memory::memset_d8(f, a.ptr(), 0xAB, n).unwrap();
                memory::copy_dtoh(f, &mut back, a.ptr()).unwrap();
            }
            assert!(back.iter().all(|&x| x == 0xAB), "{name}: memset");
        }
        drop(stream);
        if trim {
            // Trim first too: both ways of ending must leave nothing behind.
            m.release_cached().unwrap();
        }
        drop(m);
    }
}

#[test]
fn a_copy_to_freed_memory_is_refused_by_the_stand_in() {
    let f = fixture();
    let p = memory::alloc(&f.ctx, 4096).unwrap();
    // SAFETY: allocated above, freed once.
    unsafe { memory::free(&f.ctx, p).unwrap() };
    // SAFETY: the stand-in checks the range and refuses it (no host write happens).
    let r = unsafe { memory::copy_htod(&f.ctx, p, &[1, 2, 3]) };
    assert!(
        r.is_err(),
        "the stand-in must refuse a copy to freed memory"
    );
    let d0 = f.s.control("double_frees").unwrap();
    // SAFETY: a deliberate double free; the stand-in refuses and counts it.
    let r = unsafe { memory::free(&f.ctx, p) };
    assert!(r.is_err());
    assert_eq!(f.s.control("double_frees").unwrap(), d0 + 1);
}

// ---- out of memory: the default manager's flush-and-retry ----

#[test]
fn default_oom_flushes_pending_frees_and_retries() {
    let f = fixture();
    let before = snapshot(&f.s);
    {
        let m = DefaultManager::new(&f.ctx).unwrap();
        m.initialize().unwrap(); // learns the capacity the queue's byte limit is a share of
        let a = m.memalloc(1 << 20).unwrap();
        drop(a); // queued, not freed
        assert_eq!(m.pending().0, 1);
        let allocs = f.s.calls("cuMemAlloc_v2").unwrap();
        f.s.fail_nth("cuMemAlloc_v2", 1, oom()).unwrap();
        let b = m.memalloc(1 << 20).expect("flush, then the retry works");
        assert_eq!(f.s.calls("cuMemAlloc_v2").unwrap(), allocs + 2);
        assert_eq!(m.pending().0, 0, "the queue was flushed");
        assert_eq!(m.stats().oom_retries, 1);
        // Both attempts fail: a typed error naming the manager.
        f.s.fail_nth("cuMemAlloc_v2", 1, oom()).unwrap();
        f.s.fail_nth("cuMemAlloc_v2", 2, oom()).unwrap();
        match m.memalloc(1 << 20) {
            Err(EmmError::OutOfMemory { manager, .. }) => assert_eq!(manager, "default"),
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        // Past the capacity: typed too, and the manager keeps working.
        let (_, total) = f.ctx.mem_info().unwrap();
        assert!(matches!(
            m.memalloc(total + 1),
            Err(EmmError::OutOfMemory { .. })
        ));
        drop(b);
        let c = m.memalloc(4096).unwrap();
        drop(c);
        assert_eq!(m.stats().live, 0);
    }
    assert_clean(&f.s, &f.ctx, &before, "default OOM");
}

// ---- out of memory: hostonly's trim-and-retry ----

#[test]
fn hostonly_oom_trims_and_retries() {
    let f = fixture();
    let before = snapshot(&f.s);
    {
        let m = HostOnlyManager::new(&f.ctx).unwrap();
        let stream = Stream::new(&f.ctx).unwrap();
        let a = m.memalloc_async(8 << 20, stream.raw()).unwrap();
        drop(a);
        let syncs = f.s.calls("cuCtxSynchronize").unwrap();
        let trims = f.s.calls("cuMemPoolTrimTo").unwrap();
        f.s.fail_nth("cuMemAllocFromPoolAsync", 1, oom()).unwrap();
        let b = m
            .memalloc_async(8 << 20, stream.raw())
            .expect("trim, then the retry works");
        assert!(f.s.calls("cuCtxSynchronize").unwrap() > syncs);
        assert_eq!(f.s.calls("cuMemPoolTrimTo").unwrap(), trims + 1);
        f.s.fail_nth("cuMemAllocFromPoolAsync", 1, oom()).unwrap();
        f.s.fail_nth("cuMemAllocFromPoolAsync", 2, oom()).unwrap();
        match m.memalloc(1 << 20) {
            Err(EmmError::OutOfMemory { manager, .. }) => assert_eq!(manager, "hostonly"),
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        // The trim itself fails: a typed driver error, not a panic.
        f.s.fail_nth("cuMemAllocFromPoolAsync", 1, oom()).unwrap();
        f.s.fail_nth("cuMemPoolTrimTo", 1, CUresult::ERROR_UNKNOWN)
            .unwrap();
        assert!(matches!(m.memalloc(1 << 20), Err(EmmError::Driver(_))));
        // Capacity: cached memory is given back so a large request fits.
        drop(b);
        let used = f.s.control("used_bytes").unwrap();
        f.s.control(&format!("capacity {}", used + (12 << 20)))
            .unwrap();
        let c = m
            .memalloc(12 << 20)
            .expect("fits after the cache is trimmed");
        drop(c);
        f.s.control("capacity 8G").unwrap();
    }
    assert_clean(&f.s, &f.ctx, &before, "hostonly OOM");
}

// ---- out of memory: the pool's ladder ----

/// Runs `op` on a fresh pool with the `nth` call of `function` failing with
/// out-of-memory; the outcome must be success or a typed out-of-memory error, the
/// pool consistent, and nothing leaked once it drops.
fn pool_with_fault(f: &Fixture, function: &str, nth: u64, sizes: &[usize]) -> Result<(), EmmError> {
    let before = snapshot(&f.s);
    // On a thread of its own: see `pool_drop_destroys_its_events_on_a_live_thread`.
    let outcome = on_thread(|| {
        // One shared arena (`stream_pools` 0): with stream pools (the default)
        // the blocks warmed on s1 would sit in s1's own pool, and the arena's
        // ladder under test would have nothing to give back.
        let config = emm_pool::PoolConfig {
            stream_pools: 0,
            ..emm_pool::PoolConfig::from_env().unwrap()
        };
        let pool = PoolManager::with_config(emm_pool::PoolUpstream::Driver(f.ctx.clone()), config)
            .unwrap();
        let s1 = Stream::new(&f.ctx).unwrap();
        // Warm: cached blocks on a stream and in segments, so every rung has work.
        let warm: Vec<_> = sizes
            .iter()
            .map(|&n| pool.memalloc_async(n, s1.raw()).unwrap())
            .collect();
        drop(warm);
        f.s.fail_nth(function, nth, oom()).unwrap();
        let mut held = Vec::new();
        let mut result = Ok(());
        for &n in sizes.iter().rev() {
            match pool.memalloc(n * 2 + 4096) {
                Ok(a) => held.push(a),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = &result {
            assert!(
                e.is_out_of_memory(),
                "{function} #{nth}: expected out-of-memory, got {e:?}"
            );
        }
        pool.check()
            .unwrap_or_else(|e| panic!("{function} #{nth}: {e}"));
        let stats = pool.stats();
        let held_bytes: usize = held.iter().map(|a| a.size()).sum();
        assert!(stats.allocated_bytes >= held_bytes, "{stats:?}");
        drop(held);
        pool.trim();
        f.s.reset().unwrap();
        result
    });
    assert_clean(&f.s, &f.ctx, &before, &format!("pool, {function} #{nth}"));
    outcome
}

#[test]
fn pool_oom_at_each_step_is_typed_or_retried_and_leaks_nothing() {
    let f = fixture();
    let sizes = [512usize, 100_000, 3 << 20, 30 << 20];
    for function in ["cuMemCreate", "cuMemMap", "cuMemAlloc_v2"] {
        for nth in 1..=6 {
            let r = pool_with_fault(&f, function, nth, &sizes);
            println!("pool with {function} #{nth} failing: {r:?}");
        }
    }
    // Without VMM the large requests go to cuMemAlloc segments.
    f.s.control("vmm 0").unwrap();
    for nth in 1..=6 {
        let r = pool_with_fault(&f, "cuMemAlloc_v2", nth, &sizes);
        println!("pool without VMM, cuMemAlloc_v2 #{nth} failing: {r:?}");
    }
    f.s.reset().unwrap();
}

#[test]
fn pool_oom_past_capacity_runs_the_ladder_then_works() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let pool = PoolManager::new(&f.ctx).unwrap();
        let held: Vec<_> = (0..4).map(|_| pool.memalloc(64 << 20).unwrap()).collect();
        drop(held);
        let reserved = pool.stats().reserved_bytes;
        let used = f.s.control("used_bytes").unwrap();
        f.s.control(&format!("capacity {}", used + (32 << 20)))
            .unwrap();
        let (_, total) = f.ctx.mem_info().unwrap();
        match pool.memalloc(total + (1 << 20)) {
            Err(EmmError::OutOfMemory {
                total: t, detail, ..
            }) => {
                assert_eq!(t, total);
                assert!(detail.contains("largest free block"), "{detail}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(pool.stats().num_alloc_retries, 1);
        assert!(pool.stats().reserved_bytes < reserved, "segments released");
        let ok = pool
            .memalloc(200 << 20)
            .expect("the capacity is free again");
        drop(ok);
        pool.check().unwrap();
        f.s.control("capacity 8G").unwrap();
    });
    assert_clean(&f.s, &f.ctx, &before, "pool past capacity");
}

// ---- failing frees ----

#[test]
fn failing_frees_are_reported_not_retried_twice() {
    let f = fixture();
    for name in MANAGERS {
        let before = snapshot(&f.s);
        on_thread(|| failing_frees(name, &f));
        let _ = f.ctx.take_deferred_errors();
        let after = snapshot(&f.s);
        assert_eq!(
            (after.double_frees, after.invalid_frees),
            (before.double_frees, before.invalid_frees),
            "{name}: a failed free was followed by a bad free"
        );
        // What the driver refused stayed with the manager's context, not lost
        // with the manager: once frees are taken again, its next synchronize
        // gives all of it back.
        f.ctx.synchronize().unwrap();
        assert_eq!(f.ctx.doomed_handles(), 0, "{name}");
        assert_eq!(
            snapshot(&f.s),
            before,
            "{name}: what the driver refused came back once it took frees again"
        );
    }
}

fn failing_frees(name: &str, f: &Fixture) {
    {
        let m = manager(name, &f.ctx);
        let stream = Stream::new(&f.ctx).unwrap();
        let a = m.memalloc(1 << 20).unwrap();
        let b = m.memalloc_async(3 << 20, stream.raw()).unwrap();
        f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
        drop(a);
        drop(b);
        let _ = m.release_cached();
        drop(m);
        f.s.reset().unwrap();
        drop(stream);
    }
}

// ---- events ----

#[test]
fn pool_cross_stream_reuse_waits_for_events_that_are_not_ready() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let pool = PoolManager::new(&f.ctx).unwrap();
        let s1 = Stream::new(&f.ctx).unwrap();
        let s2 = Stream::new(&f.ctx).unwrap();
        f.s.control("not_ready 3").unwrap();
        for round in 0..20 {
            let a = pool.memalloc_async(1 << 20, s1.raw()).unwrap();
            let p = a.ptr();
            drop(a);
            let b = pool.memalloc_async(1 << 20, s2.raw()).unwrap();
            if b.ptr() == p {
                assert!(
                    f.s.calls("cuEventQuery").unwrap() > 0
                        || f.s.calls("cuEventSynchronize").unwrap() > 0,
                    "round {round}: reused across streams without asking the event"
                );
            }
            drop(b);
        }
        pool.check().unwrap();
        f.s.reset().unwrap();
        pool.trim();
        drop(pool);
    });
    assert_clean(&f.s, &f.ctx, &before, "pool with events not ready");
}

/// A pool reset gives the events it still held (of pending blocks, and each
/// stream's last) back to its event pool: cycles of cross-stream frees and resets
/// do not create ever more driver events.
#[test]
fn pool_reset_recycles_its_events() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        // No thread caches: frees go to the arena, where another stream sees them.
        let config = emm_pool::PoolConfig {
            thread_cache_blocks: 0,
            ..emm_pool::PoolConfig::default()
        };
        let pool = PoolManager::with_config(emm_pool::PoolUpstream::Driver(f.ctx.clone()), config)
            .unwrap();
        let s1 = Stream::new(&f.ctx).unwrap();
        let s2 = Stream::new(&f.ctx).unwrap();
        let mut counts = Vec::new();
        for _ in 0..6 {
            let a = pool.memalloc_async(1 << 20, s1.raw()).unwrap();
            drop(a); // an event recorded at the free on s1
                     // s2 takes s1's free blocks as pending behind that event, which is not
                     // ready, and maps new memory meanwhile.
            f.s.control("not_ready 1000").unwrap();
            let b = pool.memalloc_async(1 << 20, s2.raw()).unwrap();
            drop(b);
            f.s.reset().unwrap();
            pool.reset().unwrap();
            counts.push(f.s.live().unwrap().events);
        }
        assert!(
            counts.windows(2).all(|w| w[1] <= w[0]),
            "live driver events grew across resets: {counts:?}"
        );
        drop(pool);
    });
    assert_clean(&f.s, &f.ctx, &before, "pool resets");
}

#[test]
fn a_failing_event_record_or_query_is_typed_and_leaks_nothing() {
    let f = fixture();
    let before = snapshot(&f.s);
    for function in [
        "cuEventRecord",
        "cuEventQuery",
        "cuEventCreate",
        "cuEventSynchronize",
    ] {
        on_thread(|| {
            let pool = PoolManager::new(&f.ctx).unwrap();
            let s1 = Stream::new(&f.ctx).unwrap();
            let s2 = Stream::new(&f.ctx).unwrap();
            f.s.control("not_ready 1").unwrap();
            f.s.control(&format!("fail_always {function} CUDA_ERROR_UNKNOWN"))
                .unwrap();
            for _ in 0..10 {
                let a = pool.memalloc_async(1 << 20, s1.raw());
                drop(a);
                match pool.memalloc_async(1 << 20, s2.raw()) {
                    Ok(b) => drop(b),
                    Err(e) => assert!(
                        matches!(e, EmmError::Driver(_)),
                        "{function}: untyped {e:?}"
                    ),
                }
            }
            f.s.reset().unwrap();
            pool.check().unwrap();
            pool.trim();
            drop(pool);
        });
        let _ = f.ctx.take_deferred_errors();
        assert_clean(&f.s, &f.ctx, &before, function);
    }
}

// ---- context loss ----

#[test]
fn a_lost_context_gives_typed_errors_and_no_double_free() {
    let f = fixture();
    for name in MANAGERS {
        let before = snapshot(&f.s);
        let m = manager(name, &f.ctx);
        let a = m.memalloc(1 << 20).unwrap();
        f.s.control("lose_context").unwrap();
        // Large enough that no manager can serve it from a cache.
        match m.memalloc(700 << 20) {
            Err(EmmError::Driver(_)) => {}
            other => panic!("{name}: expected a driver error, got {other:?}"),
        }
        assert!(m.get_memory_info().is_err());
        drop(a);
        drop(m);
        f.s.reset().unwrap();
        let _ = f.ctx.take_deferred_errors();
        let after = snapshot(&f.s);
        assert_eq!(
            (after.double_frees, after.invalid_frees),
            (before.double_frees, before.invalid_frees),
            "{name}: bad frees after a lost context"
        );
    }
}

#[test]
fn emm_info_names_the_stand_in() {
    let f = fixture();
    let drv = f.ctx.driver();
    assert!(drv.is_stand_in());
    assert!(
        drv.missing_optional().is_empty(),
        "{:?}",
        drv.missing_optional()
    );
    assert!(emm::Device::get(0)
        .unwrap()
        .name()
        .unwrap()
        .contains("stand-in"));
}

/// Regression: `PoolManager::drop` gave back only settled, wholly free segments;
/// blocks freed on a created stream (each waiting for its event) were never
/// settled, so their segments leaked. It now synchronizes and frees every segment.
#[test]
fn pool_drop_gives_back_segments_freed_on_a_created_stream() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let m = PoolManager::new(&f.ctx).unwrap();
        let stream = Stream::new(&f.ctx).unwrap();
        for n in [1usize, 4097, 1 << 20, 5 << 20] {
            let a = m.memalloc(n).unwrap();
            let b = m.memalloc_async(n, stream.raw()).unwrap();
            drop((a, b));
        }
        assert_eq!(m.stats().allocated_bytes, 0);
        drop(stream);
        drop(m);
    });
    assert_clean(
        &f.s,
        &f.ctx,
        &before,
        "pool dropped after frees on a stream",
    );
}

/// Regression: every thread that allocated from a pool kept its core (events,
/// the context retain, the VMM reservation) alive after `PoolManager::drop` until
/// that thread exited; thread caches now hold the pool weakly.
#[test]
fn pool_drop_destroys_its_events_on_a_live_thread() {
    let f = fixture();
    let before = snapshot(&f.s);
    {
        let m = PoolManager::new(&f.ctx).unwrap();
        let stream = Stream::new(&f.ctx).unwrap();
        for n in [1usize << 20, 5 << 20, 40 << 20] {
            let a = m.memalloc_async(n, stream.raw()).unwrap();
            let b = m.memalloc(n).unwrap();
            drop((a, b));
        }
        m.trim();
        drop(stream);
        drop(m);
    }
    assert_clean(&f.s, &f.ctx, &before, "pool dropped on this thread");
}

// ---- a proptest over the stand-in-backed pool ----

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: usize,
        stream: usize,
    },
    Free(usize),
    /// Managed memory: passed through to the driver, beside the pool's blocks.
    Managed {
        size: usize,
        global: bool,
    },
    FreeManaged(usize),
    Trim,
    NotReady(u64),
    FailNextGrowth,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (prop_oneof![1usize..4096, 4096usize..(2 << 20), (2usize << 20)..(48 << 20)], 0usize..3)
            .prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(Op::Free),
        1 => (1usize..(3 << 20), any::<bool>()).prop_map(|(size, global)| Op::Managed { size, global }),
        1 => any::<usize>().prop_map(Op::FreeManaged),
        1 => Just(Op::Trim),
        1 => (0u64..4).prop_map(Op::NotReady),
        1 => Just(Op::FailNextGrowth),
    ]
}

fn stamp(ctx: &Context, ptr: u64, size: usize, seed: u8) -> Vec<u8> {
    let n = (size / 2).clamp(1, 64);
    let data = pattern(seed, n);
    // SAFETY: the allocation holds `size` >= `n` bytes at both ends.
    unsafe {
        memory::copy_htod(ctx, ptr, &data).unwrap();
        memory::copy_htod(ctx, ptr + (size - n) as u64, &data).unwrap();
    }
    data
}

fn verify(ctx: &Context, ptr: u64, size: usize, data: &[u8]) -> Result<(), String> {
    let n = data.len();
    let mut head = vec![0u8; n];
    let mut tail = vec![0u8; n];
    // SAFETY: as in `stamp`.
    unsafe {
        memory::copy_dtoh(ctx, &mut head, ptr).map_err(|e| e.to_string())?;
        memory::copy_dtoh(ctx, &mut tail, ptr + (size - n) as u64).map_err(|e| e.to_string())?;
    }
    if head != data || tail != data {
        return Err(format!(
            "allocation {ptr:#x} of {size} bytes was overwritten"
        ));
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    #[test]
    fn pool_on_the_stand_in_keeps_data_and_leaks_nothing(ops in proptest::collection::vec(op(), 1..40)) {
        let f = fixture();
        let before = snapshot(&f.s);
        let outcome: Result<(), String> = on_thread(|| {
            let pool = PoolManager::new(&f.ctx).unwrap();
            let streams: Vec<Stream> = (0..3).map(|_| Stream::new(&f.ctx).unwrap()).collect();
            let mut live: Vec<(emm::DeviceAllocation, Vec<u8>)> = Vec::new();
            let mut managed: Vec<(emm_core::ManagedMemory, Vec<u8>)> = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Alloc { size, stream } => match pool.memalloc_async(*size, streams[*stream].raw()) {
                        Ok(a) => {
                            let data = stamp(&f.ctx, a.ptr(), a.size(), i as u8);
                            live.push((a, data));
                        }
                        Err(e) if e.is_out_of_memory() => {}
                        Err(e) => return Err(format!("op {i} {op:?}: {e}")),
                    },
                    Op::Free(k) if !live.is_empty() => {
                        let (a, data) = live.swap_remove(k % live.len());
                        verify(&f.ctx, a.ptr(), a.size(), &data)?;
                    }
                    Op::Free(_) => {}
                    Op::Managed { size, global } => {
                        let attach = emm_core::ManagedAttach::from_global(*global);
                        match pool.memallocmanaged(*size, attach) {
                            Ok(a) => {
                                let data = stamp(&f.ctx, a.ptr(), a.size(), i as u8);
                                managed.push((a, data));
                            }
                            Err(e) if e.is_out_of_memory() => {}
                            Err(e) => return Err(format!("op {i} {op:?}: {e}")),
                        }
                    }
                    Op::FreeManaged(k) if !managed.is_empty() => {
                        let (a, data) = managed.swap_remove(k % managed.len());
                        verify(&f.ctx, a.ptr(), a.size(), &data)?;
                    }
                    Op::FreeManaged(_) => {}
                    Op::Trim => {
                        pool.trim();
                    }
                    Op::NotReady(n) => {
                        f.s.control(&format!("not_ready {n}")).unwrap();
                    }
                    Op::FailNextGrowth => {
                        for function in ["cuMemCreate", "cuMemAlloc_v2", "cuMemAllocManaged"] {
                            f.s.fail_nth(function, 1, oom()).unwrap();
                        }
                    }
                }
                pool.check().map_err(|e| format!("op {i} {op:?}: {e}"))?;
            }
            for (a, data) in &live {
                verify(&f.ctx, a.ptr(), a.size(), data)?;
            }
            for (a, data) in &managed {
                verify(&f.ctx, a.ptr(), a.size(), data)?;
            }
            drop(live);
            f.s.reset().unwrap();
            let stats = pool.stats();
            if stats.allocated_bytes != 0 {
                return Err(format!(
                    "allocated_bytes {} with no device block live ({} managed allocations are, counted apart)",
                    stats.allocated_bytes,
                    managed.len()
                ));
            }
            let held: usize = managed.iter().map(|(a, _)| a.size()).sum();
            if pool.managed_stats().allocated_bytes != held {
                return Err(format!("managed stats {:?} with {held} bytes held", pool.managed_stats()));
            }
            drop(managed);
            if pool.managed_stats().live != 0 {
                return Err(format!("managed stats {:?} with nothing held", pool.managed_stats()));
            }
            pool.trim();
            drop(streams);
            drop(pool);
            Ok(())
        });
        f.s.reset().unwrap();
        proptest::prop_assert!(outcome.is_ok(), "{:?}", outcome);
        assert_clean(&f.s, &f.ctx, &before, "proptest");
    }
}

// ---- the cross-manager out-of-memory hook ----

/// One manager's cache is what makes room for another: the pool holds 40 MiB of
/// freed memory with 64 MiB free on the device; the default manager's allocation of 40 MiB
/// fails when asked directly, and succeeds through `Router::alloc_from`, which
/// asks every manager of the router to release its cache only after the failure.
#[test]
fn one_managers_cache_makes_room_for_another_through_the_oom_hook() {
    let f = fixture();
    let before = snapshot(&f.s);
    // 64 MiB free, whatever earlier tests of this process still hold (the
    // process-wide router's managers).
    let (free, total) = f.ctx.mem_info().unwrap();
    let used_mib = (total - free).div_ceil(1 << 20);
    f.s.control(&format!("capacity {}M", used_mib + 64))
        .unwrap();
    on_thread(|| {
        let router = emm::core::Router::new();
        let pool: std::sync::Arc<dyn MemoryManager> =
            std::sync::Arc::new(PoolManager::new(&f.ctx).unwrap());
        let shared = pool.clone();
        router.register("pool", move |_: &Context| Ok(shared.clone()));
        router.set_memory_manager("pool").unwrap();
        assert!(std::sync::Arc::ptr_eq(
            &router.manager(&f.ctx).unwrap(),
            &pool
        ));
        drop(pool.memalloc(40 << 20).unwrap());
        let cached = pool.stats().reserved_bytes;
        assert!(
            cached >= 40 << 20,
            "the pool keeps its freed block: {cached}"
        );

        let other = DefaultManager::new(&f.ctx).unwrap();
        let e = other.memalloc(40 << 20).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert_eq!(
            pool.stats().reserved_bytes,
            cached,
            "a direct call asks nobody"
        );

        let a = router
            .alloc_from(&other, 40 << 20, emm::core::SYNC_STREAM)
            .expect("the pool's cache makes room");
        assert_eq!(a.size(), 40 << 20);
        assert!(
            pool.stats().reserved_bytes < cached,
            "the pool gave its cache back"
        );
        // The fast path asks nobody: the pool caches again, and a small allocation
        // that fits leaves its cache alone.
        drop(pool.memalloc(4 << 20).unwrap());
        let cached = pool.stats().reserved_bytes;
        drop(
            router
                .alloc_from(&other, 1 << 20, emm::core::SYNC_STREAM)
                .unwrap(),
        );
        assert_eq!(pool.stats().reserved_bytes, cached);
        // More than the device even after every cache: still a typed error.
        let e = router
            .alloc_from(&other, (used_mib + 128) << 20, emm::core::SYNC_STREAM)
            .unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        drop(a);
        other.flush();
    });
    assert_eq!(snapshot(&f.s), before, "leaked or freed twice");
}

/// Ten 30 MiB blocks of `m`, then every other one freed: 150 MiB of holes, none
/// of which holds a 120 MiB request (`None` where a block was freed).
fn holes_of_30_mib(m: &PoolManager) -> Vec<Option<emm::DeviceAllocation>> {
    let mut blocks: Vec<_> = (0..10)
        .map(|_| Some(m.memalloc(30 << 20).unwrap()))
        .collect();
    for b in blocks.iter_mut().step_by(2) {
        drop(b.take());
    }
    blocks
}

/// The pool moves the memory of free pages in the middle of its expandable segment
/// to the segment's end instead of mapping new memory (the same physical pages at a
/// second address, `cuMemMap` of one handle twice): the data written through the new
/// addresses is read back intact, blocks still held are untouched, the pool reserves
/// no more than before, and everything is given back at the end.
#[test]
fn pool_moves_free_pages_to_the_end_instead_of_growing() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let m = PoolManager::new(&f.ctx).unwrap();
        let mib = 1usize << 20;
        let blocks = holes_of_30_mib(&m);
        let mut kept = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            let data = pattern(i as u8, 4096);
            if let Some(b) = b {
                // SAFETY: each block holds 30 MiB.
                unsafe { memory::copy_htod(&f.ctx, b.ptr(), &data) }.unwrap();
            }
            kept.push(data);
        }
        let reserved = m.stats().reserved_bytes;
        // 120 MiB in one piece fits no hole: without moving pages the pool would map
        // 120 MiB more.
        let big = m.memalloc(120 * mib).unwrap();
        assert!(
            m.stats().reserved_bytes <= reserved,
            "reserved grew from {reserved} to {}",
            m.stats().reserved_bytes
        );
        let data = pattern(99, 120 * mib);
        let mut back = vec![0u8; 120 * mib];
        // SAFETY: `big` holds 120 MiB.
        unsafe {
            memory::copy_htod(&f.ctx, big.ptr(), &data).unwrap();
            memory::copy_dtoh(&f.ctx, &mut back, big.ptr()).unwrap();
        }
        assert!(back == data, "data through moved pages");
        for (i, b) in blocks.iter().enumerate() {
            if let Some(b) = b {
                let mut got = vec![0u8; 4096];
                // SAFETY: each block holds 30 MiB.
                unsafe { memory::copy_dtoh(&f.ctx, &mut got, b.ptr()) }.unwrap();
                assert_eq!(got, kept[i], "block {i} kept its data");
            }
        }
        m.check().unwrap();
        drop(big);
        drop(blocks);
        assert!(m.trim() > 0);
        assert_eq!(m.stats().reserved_bytes, 0, "trim gives every byte back");
        drop(m);
    });
    assert_clean(&f.s, &f.ctx, &before, "pool after moving pages");
}

/// A moved piece's old mapping whose unmap fails stays known to the pool's virtual
/// memory: its range stays retired, and trimming unmaps it with the rest of the
/// expandable segment, so nothing leaks (the mapping used to be forgotten before
/// the driver had unmapped it).
#[test]
fn a_failed_unmap_of_a_moved_piece_is_undone_when_the_segment_goes() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let m = PoolManager::new(&f.ctx).unwrap();
        let mib = 1usize << 20;
        let blocks = holes_of_30_mib(&m);
        let big = m.memalloc(120 * mib).unwrap();
        let moved = m.stats().counts.pieces_moved;
        assert!(moved > 0, "no piece moved");
        drop(big);
        drop(blocks);
        f.s.fail_nth("cuMemUnmap", 1, CUresult::ERROR_UNKNOWN)
            .unwrap();
        m.trim();
        assert_eq!(
            f.s.control("pending_faults").unwrap(),
            0,
            "no unmap was tried"
        );
        // The refused old mapping is still the pool's: it neither reports it
        // given back nor resets its segment over it.
        let held = f.s.live().unwrap().bytes - before.live.bytes;
        assert_eq!(
            m.stats().reserved_bytes as u64,
            held,
            "the pool's reserved bytes are what the driver still holds"
        );
        m.check().unwrap();
        // It allocates again (before, every growth here failed with
        // CUDA_ERROR_ALREADY_MAPPED), and the next trim gives every byte back.
        let again: Vec<_> = (0..6).map(|_| m.memalloc(30 * mib).unwrap()).collect();
        m.check().unwrap();
        drop(again);
        m.trim();
        assert_eq!(
            m.stats().reserved_bytes,
            0,
            "the next trim gives every byte back"
        );
        assert_eq!(f.s.live().unwrap().bytes, before.live.bytes);
        drop(m);
    });
    assert_clean(&f.s, &f.ctx, &before, "pool after a failed unmap");
}

// ---- a failed unmap (reliability issue: the pool never allocated again) ----

/// Ten 4 MiB blocks in the expandable segment, all freed; `trim` while the driver
/// refuses every free and unmap; the fault clears; a new allocation. Before, the
/// trim reported the segment released while the driver still held it, and every
/// later growth failed with `CUDA_ERROR_ALREADY_MAPPED`.
#[test]
fn pool_allocates_again_after_a_trim_whose_unmaps_failed() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let pool = PoolManager::new(&f.ctx).unwrap();
        let blocks: Vec<_> = (0..10).map(|_| pool.memalloc(4 << 20).unwrap()).collect();
        drop(blocks);
        let held = f.s.live().unwrap().bytes - before.live.bytes;
        assert!(
            held >= 40 << 20,
            "the stand-in holds {held} bytes for the pool"
        );
        f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
        let released = pool.trim();
        let still = f.s.live().unwrap().bytes - before.live.bytes;
        assert_eq!(
            pool.stats().reserved_bytes as u64,
            still,
            "after a trim whose unmaps failed ({released} bytes reported released), the pool's reserved bytes must be what the driver still holds"
        );
        pool.check().unwrap();
        f.s.reset().unwrap();
        let a = pool.memalloc(5 << 20).unwrap();
        let b = pool.memalloc(64 << 20).unwrap();
        pool.check().unwrap();
        drop((a, b));
        assert!(pool.trim() > 0);
        assert_eq!(pool.stats().reserved_bytes, 0);
        assert_eq!(f.s.live().unwrap().bytes, before.live.bytes);
        drop(pool);
    });
    assert_clean(&f.s, &f.ctx, &before, "pool after failed unmaps");
}

/// As above, with `reset` (every segment back) while unmaps fail: the pool
/// reserves new address space and allocates again; the stuck mapping is retried
/// when the pool goes.
#[test]
fn pool_allocates_again_after_a_reset_whose_unmaps_failed() {
    let f = fixture();
    let before = snapshot(&f.s);
    on_thread(|| {
        let pool = PoolManager::new(&f.ctx).unwrap();
        let blocks: Vec<_> = (0..10).map(|_| pool.memalloc(4 << 20).unwrap()).collect();
        drop(blocks);
        f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
        pool.reset().unwrap();
        f.s.reset().unwrap();
        let a = pool.memalloc(5 << 20).unwrap();
        pool.check().unwrap();
        drop(a);
        pool.trim();
        drop(pool);
    });
    let _ = f.ctx.take_deferred_errors();
    assert_clean(
        &f.s,
        &f.ctx,
        &before,
        "pool after a reset whose unmaps failed",
    );
}

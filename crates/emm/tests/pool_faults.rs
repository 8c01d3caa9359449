//! Focused tests of the defects the fault sweep found (issue 36), on the stand-in
//! driver: each fails without its fix. The sweep (`fault_sweep.rs`) covers them
//! too, among every other position of every fault.

mod common;

use common::{fixture, snapshot, Fixture};

use emm::{MemoryManager, Stream};
use emm_pool::PoolManager;

const MIB: usize = 1 << 20;

fn pool(f: &Fixture) -> PoolManager {
    let m = PoolManager::new(&f.ctx).unwrap();
    m.initialize().unwrap();
    m
}

/// Bytes the stand-in holds beyond `before`.
fn held(f: &Fixture, before: &common::Snapshot) -> u64 {
    f.s.control("live_bytes").unwrap() - before.live.bytes
}

/// Defect 1: `cuMemSetAccess` fails while the expandable segment grows, and the
/// rollback's `cuMemUnmap` fails too. The mapping used to stay while the pool
/// forgot it: its memory leaked and the next growth there failed with
/// `CUDA_ERROR_ALREADY_MAPPED` for good.
#[test]
fn a_growth_whose_rollback_fails_is_unmapped_before_the_next_growth() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    f.s.control("fail cuMemSetAccess 1 CUDA_ERROR_UNKNOWN")
        .unwrap();
    f.s.control("fail cuMemUnmap 1 CUDA_ERROR_CONTEXT_IS_DESTROYED")
        .unwrap();
    assert!(m.memalloc(8 * MIB).is_err(), "the growth fails");
    f.s.reset().unwrap();
    // The same range is grown into again.
    let a = m
        .memalloc(8 * MIB)
        .expect("the pool grows again where the failed growth was");
    drop(a);
    m.release_cached().unwrap();
    let st = m.stats();
    assert_eq!(
        (held(&f, &before), st.allocated_bytes),
        (st.reserved_bytes as u64, 0),
        "after a trim the stand-in holds what the pool reserves"
    );
    drop(m);
    assert!(
        f.ctx.take_deferred_errors().is_empty(),
        "the teardown reports nothing: no reservation with a stale mapping left"
    );
    assert_eq!(snapshot(&f.s), before, "everything went back");
}

/// Defect 1 on the trim path: the mapping a failed rollback kept is unmapped by
/// the next trim even when the pool never grows again.
#[test]
fn a_trim_unmaps_what_a_failed_rollback_kept() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    f.s.control("fail cuMemSetAccess 1 CUDA_ERROR_UNKNOWN")
        .unwrap();
    f.s.control("fail cuMemUnmap 1 CUDA_ERROR_UNKNOWN").unwrap();
    assert!(m.memalloc(8 * MIB).is_err());
    f.s.reset().unwrap();
    assert!(held(&f, &before) > 0, "the failed rollback kept a mapping");
    m.release_cached().unwrap();
    assert_eq!(held(&f, &before), m.stats().reserved_bytes as u64);
    drop(m);
    assert!(f.ctx.take_deferred_errors().is_empty());
    assert_eq!(snapshot(&f.s), before);
}

/// Defect 2: a piece whose `cuMemRelease` failed waited for the next unmap, so a
/// trim left its memory held although the pool counted it off.
#[test]
fn a_trim_releases_a_piece_whose_release_failed() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    drop(m.memalloc(8 * MIB).unwrap());
    f.s.control("fail_always cuMemRelease CUDA_ERROR_UNKNOWN")
        .unwrap();
    m.release_cached().unwrap();
    f.s.reset().unwrap();
    assert_eq!(m.stats().reserved_bytes, 0, "the pool counted it off");
    m.release_cached().unwrap();
    assert_eq!(held(&f, &before), 0, "the next trim released it");
    drop(m);
    assert!(f.ctx.take_deferred_errors().is_empty());
    assert_eq!(snapshot(&f.s), before);
}

/// Defect 2: the teardown after a lost context reports one typed error, not one
/// per handle, and does not free a reservation that still has a mapping in it.
#[test]
fn a_teardown_after_a_lost_context_reports_once() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    let a = m.memalloc(8 * MIB).unwrap();
    let b = m.memalloc(16 * MIB).unwrap();
    drop((a, b));
    f.s.control("lose_context").unwrap();
    drop(m);
    f.s.reset().unwrap();
    let errors = f.ctx.take_deferred_errors();
    let vmm: Vec<_> = errors
        .iter()
        .filter(|e| {
            let e = e.to_string();
            e.contains("cuMem") && !e.contains("cuMemFree_v2")
        })
        .collect();
    assert_eq!(
        vmm.len(),
        1,
        "one error for the virtual memory's teardown: {errors:?}"
    );
    assert!(
        !errors
            .iter()
            .any(|e| e.to_string().contains("INVALID_VALUE")),
        "no call with a stale handle: {errors:?}"
    );
    let after = snapshot(&f.s);
    assert_eq!(after.invalid_frees, before.invalid_frees);
    assert_eq!(after.double_frees, before.double_frees);
    // What the driver refused went to the context, not with the pool: once the
    // driver takes memory back again, the context's next synchronize releases
    // all of it (mappings before the reservation around them).
    assert!(f.ctx.doomed_handles() > 0, "handed to the context");
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0);
    assert_eq!(snapshot(&f.s), before, "everything went back");
}

/// Defect 3: a reset whose segment free the driver refused forgot the segment.
#[test]
fn a_reset_keeps_a_segment_whose_free_failed_and_the_next_trim_frees_it() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    // A small block: a legacy segment (`cuMemAlloc`).
    drop(m.memalloc(4097).unwrap());
    f.s.control("fail_always cuMemFree_v2 CUDA_ERROR_UNKNOWN")
        .unwrap();
    m.reset().unwrap();
    f.s.reset().unwrap();
    assert!(m.refused_bytes() > 0, "the refused free is kept");
    m.release_cached().unwrap();
    assert_eq!(m.refused_bytes(), 0);
    assert_eq!(held(&f, &before), m.stats().reserved_bytes as u64);
    drop(m);
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(snapshot(&f.s), before);
}

/// Defect 3: a reset that fails before it gave anything back (its
/// synchronization) changes nothing: the blocks stay the caller's and come back
/// when freed, instead of staying allocated in the pool for good.
#[test]
fn a_reset_that_cannot_synchronize_changes_nothing() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    let a = m.memalloc(MIB).unwrap();
    let b = m.memalloc(4097).unwrap();
    f.s.control("fail cuCtxSynchronize 1 CUDA_ERROR_LAUNCH_FAILED")
        .unwrap();
    assert!(m.reset().is_err());
    f.s.reset().unwrap();
    drop((a, b));
    m.release_cached().unwrap();
    let st = m.stats();
    assert_eq!(st.allocated_bytes, 0, "the blocks came back");
    assert_eq!(held(&f, &before), st.reserved_bytes as u64);
    drop(m);
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(snapshot(&f.s), before);
}

/// Defect 4: a stream whose `cuStreamDestroy` failed in `Drop` was leaked.
#[test]
fn a_stream_whose_destroy_failed_is_destroyed_again() {
    let f = fixture();
    let before = snapshot(&f.s);
    let s = Stream::new(&f.ctx).unwrap();
    f.s.control("fail cuStreamDestroy_v2 1 CUDA_ERROR_CONTEXT_IS_DESTROYED")
        .unwrap();
    drop(s);
    f.s.reset().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 1);
    // The drop's error is reported once, then the stream goes.
    assert!(f.ctx.synchronize().is_err());
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0);
    assert_eq!(snapshot(&f.s), before);
}

/// Defect 6: each failed `cuEventRecord` of the pool's events left one more
/// event, never used again until the pool went; now the pool keeps the event
/// idle, and a trim destroys the idle ones.
#[test]
fn failed_event_records_leave_no_events() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    let stream = Stream::new(&f.ctx).unwrap();
    f.s.control("fail_always cuEventRecord CUDA_ERROR_LAUNCH_FAILED")
        .unwrap();
    for i in 0..20 {
        // Each growth on a created stream records an event (see `cover_fresh`).
        let a = m.memalloc_async((8 + i) * MIB, stream.raw()).unwrap();
        drop(a);
        stream.synchronize().unwrap();
        m.release_cached().unwrap();
    }
    let events = f.s.control("live_events").unwrap() - before.live.events;
    f.s.reset().unwrap();
    assert!(events <= 1, "{events} events held after 20 failed records");
    drop(stream);
    drop(m);
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(snapshot(&f.s), before);
}

/// Defect 6, documented bound: the pool holds an event per stream it grew for
/// only until the next trim; a program that cycles through new streams does not
/// accumulate events across trims.
#[test]
fn events_do_not_accumulate_with_new_streams_across_trims() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    for i in 0..50 {
        let stream = Stream::new(&f.ctx).unwrap();
        let a = m.memalloc_async((2 + i % 7) * MIB, stream.raw()).unwrap();
        drop(a);
        stream.synchronize().unwrap();
        drop(stream);
        if i % 10 == 9 {
            m.release_cached().unwrap();
            let events = f.s.control("live_events").unwrap() - before.live.events;
            assert_eq!(events, 0, "after a trim the pool holds no event");
        }
    }
    drop(m);
    assert_eq!(snapshot(&f.s), before);
}

/// `release_cached` while the driver refuses the free of a wholly free segment
/// says so (as `hostonly`'s does), where it returned `Ok` with fewer bytes; the
/// segment is kept, still reserved, and the next trim once the fault clears
/// gives it back.
#[test]
fn release_cached_reports_a_segment_the_driver_would_not_take_back() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = pool(&f);
    let small = m.memalloc(1000).unwrap(); // a plain 2 MiB segment
    drop(small);
    let reserved = m.stats().reserved_bytes;
    assert!(reserved > 0);
    f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
    let e = m.release_cached().unwrap_err();
    assert!(e.to_string().contains("CUDA_ERROR_UNKNOWN"), "{e}");
    assert_eq!(m.stats().reserved_bytes, reserved, "kept, still reserved");
    f.s.reset().unwrap();
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(m.release_cached().unwrap(), reserved);
    assert_eq!((m.stats().reserved_bytes, held(&f, &before)), (0, 0));
}

/// One driver failure while a stream's pool is made no longer turns stream
/// pools off for the pool's life: the parent serves the streams without one
/// for a while, then making one is tried again.
#[test]
fn a_stream_pool_that_could_not_be_made_is_tried_again_later() {
    let f = fixture();
    let m = pool(&f);
    let expandable = |m: &PoolManager| {
        m.snapshot()
            .segments
            .iter()
            .filter(|s| s.expandable)
            .count()
    };
    let (s1, s2) = (Stream::new(&f.ctx).unwrap(), Stream::new(&f.ctx).unwrap());
    let a0 = m
        .memalloc_async(8 * MIB, Stream::legacy(&f.ctx).raw())
        .unwrap();
    f.s.control("fail cuDeviceTotalMem_v2 1 CUDA_ERROR_UNKNOWN")
        .unwrap();
    let a1 = m.memalloc_async(8 * MIB, s1.raw()).unwrap();
    f.s.reset().unwrap();
    assert_eq!(expandable(&m), 1, "s1 served by the parent's");
    // s2's large requests: served by the parent's for a while, then by its own.
    let mut own = false;
    for _ in 0..2_000 {
        let a = m.memalloc_async(8 * MIB, s2.raw()).unwrap();
        if expandable(&m) == 2 {
            own = true;
            drop(a);
            break;
        }
        drop(a);
    }
    assert!(own, "making a stream's pool was tried again");
    drop((a0, a1));
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
}

/// A failed query of the device's virtual memory support while the pool is made
/// is the pool's error: it used to give, silently, a pool without its
/// expandable segment for its whole life. Made again once the fault clears, the
/// pool has it.
#[test]
fn a_failed_virtual_memory_query_fails_the_pool_rather_than_losing_the_segment() {
    let f = fixture();
    f.s.control("fail cuDeviceGetAttribute 1 CUDA_ERROR_UNKNOWN")
        .unwrap();
    let e = PoolManager::new(&f.ctx)
        .map(|_| ())
        .expect_err("the query's failure");
    assert!(e.to_string().contains("cuDeviceGetAttribute"), "{e}");
    f.s.reset().unwrap();
    let m = pool(&f);
    let a = m.memalloc(8 * MIB).unwrap();
    assert_eq!(
        m.snapshot()
            .segments
            .iter()
            .filter(|s| s.expandable)
            .count(),
        1
    );
    drop(a);
}

/// A refusal met before a trim (the out-of-memory ladder's, logged then) is not
/// the trim's to report: `release_cached` after it, with the fault cleared,
/// gives back what it can and says `Ok`.
#[test]
fn release_cached_reports_only_its_own_refusals() {
    let f = fixture();
    let m = pool(&f);
    let small = m.memalloc(1000).unwrap(); // a plain segment, wholly free after
    drop(small);
    f.s.control("capacity 256M").unwrap();
    f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
    // Past the device: the ladder gives back the free segment first, refused.
    assert!(m.memalloc(1 << 30).is_err());
    f.s.reset().unwrap();
    let _ = f.ctx.take_deferred_errors();
    m.release_cached()
        .expect("the ladder's refusal is not this trim's");
    assert_eq!(m.stats().reserved_bytes, 0);
}

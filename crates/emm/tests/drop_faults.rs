//! A manager dropped while the driver refuses to take its memory back (a lost
//! context, a failing `cuMemFree`) hands that memory to its context, which
//! releases it once the driver takes it again, instead of leaking it with the
//! manager. Against `emm-standin` (host memory, not a GPU); each test fails on
//! the code before the hand-over (the memory stayed allocated for good).
//!
//! The library is found next to the test executable (`target/<profile>/`); build
//! it first with `cargo build -p emm-standin` (`cargo xtask ci` does).

mod common;

use common::managers::{manager, MANAGERS};
use common::{fixture, snapshot, Fixture, Snapshot};

use emm::driver::Orphan;
use emm::{Context, EmmError, MemoryManager};
use emm_core::{HostAllocFlags, ManagedAttach};

const MIB: usize = 1 << 20;

/// Drops `m` while every `symbol` call fails, checks the context holds what
/// was refused, lets the driver take memory back again, and checks the next
/// synchronize of the context releases all of it.
fn drop_refused_then_clear(
    f: &Fixture,
    before: &Snapshot,
    m: Box<dyn MemoryManager>,
    symbols: &[&str],
    what: &str,
) {
    for s in symbols {
        f.s.control(&format!("fail_always {s} CUDA_ERROR_UNKNOWN"))
            .unwrap();
    }
    drop(m);
    f.s.reset().unwrap();
    assert!(
        f.ctx.doomed_handles() > 0,
        "{what}: the refused memory was handed to the context"
    );
    assert_ne!(&snapshot(&f.s), before, "{what}: still held after the drop");
    // The drop's recorded error is reported once; the retry releases it all.
    let _ = f.ctx.take_deferred_errors();
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0, "{what}: nothing waits any more");
    assert_eq!(f.ctx.doomed_bytes(), 0, "{what}");
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(&snapshot(&f.s), before, "{what}: everything went back");
}

/// A fresh `name` manager with one `size`-byte block allocated and dropped
/// (queued or cached), then [`drop_refused_then_clear`].
fn handed_over_at_drop(name: &str, size: usize, symbols: &[&str], what: &str) {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = manager(name, &f.ctx);
    drop(m.memalloc(size).unwrap());
    drop_refused_then_clear(&f, &before, m, symbols, what);
}

#[test]
fn a_pool_dropped_while_cumemfree_fails_hands_its_segment_to_the_context() {
    // A small block: a legacy segment (`cuMemAlloc`).
    handed_over_at_drop("pool", 4097, &["cuMemFree_v2"], "pool, legacy segment");
}

#[test]
fn a_pool_dropped_while_cumemunmap_fails_hands_its_mapping_and_reservation_to_the_context() {
    // A large block: the expandable segment (virtual memory).
    handed_over_at_drop("pool", 8 * MIB, &["cuMemUnmap"], "pool, expandable segment");
}

#[test]
fn a_pool_dropped_while_every_vmm_release_fails_hands_all_of_it_to_the_context() {
    handed_over_at_drop(
        "pool",
        8 * MIB,
        &["cuMemUnmap", "cuMemRelease", "cuMemAddressFree"],
        "pool, every virtual-memory release refused",
    );
}

#[test]
fn a_default_manager_dropped_while_cumemfree_fails_hands_its_queued_frees_to_the_context() {
    // Queued (below the flush thresholds), freed by the drop.
    handed_over_at_drop("default", MIB, &["cuMemFree_v2"], "default");
}

#[test]
fn a_hostonly_manager_dropped_while_its_frees_fail_hands_its_blocks_to_the_context() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = manager("hostonly", &f.ctx);
    let a = m.memalloc(MIB).unwrap();
    f.s.control("fail_always cuMemFreeAsync CUDA_ERROR_UNKNOWN")
        .unwrap();
    // Its free is refused: kept by the manager for the next trim or its drop.
    drop(a);
    drop_refused_then_clear(&f, &before, m, &["cuMemFreeAsync"], "hostonly");
}

#[test]
fn pinned_memory_queued_when_its_manager_goes_is_handed_to_the_context() {
    for name in MANAGERS {
        let f = fixture();
        let before = snapshot(&f.s);
        let m = manager(name, &f.ctx);
        drop(m.memhostalloc(MIB, HostAllocFlags::default()).unwrap());
        drop_refused_then_clear(&f, &before, m, &["cuMemFreeHost"], name);
    }
}

#[test]
fn managed_memory_queued_when_its_manager_goes_is_handed_to_the_context() {
    for name in MANAGERS {
        let f = fixture();
        let before = snapshot(&f.s);
        let m = manager(name, &f.ctx);
        let a = m.memallocmanaged(MIB, ManagedAttach::Global).unwrap();
        // Held back by a guard, so the free is still queued when the manager goes.
        let guard = m.defer_cleanup();
        drop(a);
        drop(guard);
        f.s.control("fail_always cuMemFree_v2 CUDA_ERROR_UNKNOWN")
            .unwrap();
        let b = m.memallocmanaged(MIB, ManagedAttach::Global).unwrap();
        drop(b);
        drop_refused_then_clear(&f, &before, m, &["cuMemFree_v2"], name);
        assert_eq!(f.s.control("live_managed").unwrap(), 0, "{name}");
    }
}

#[test]
fn a_refused_pinned_allocation_names_its_manager_and_the_hosts_memory() {
    for name in MANAGERS {
        let f = fixture();
        let m = manager(name, &f.ctx);
        let held = m.memhostalloc(3 * MIB, HostAllocFlags::default()).unwrap();
        f.s.control("fail_always cuMemHostAlloc CUDA_ERROR_OUT_OF_MEMORY")
            .unwrap();
        let e = m
            .memhostalloc(MIB, HostAllocFlags::default())
            .expect_err("the driver refuses");
        f.s.reset().unwrap();
        let EmmError::OutOfMemory {
            what,
            manager,
            requested,
            total,
            detail,
            ..
        } = &e
        else {
            panic!("{name}: not an out-of-memory error: {e}");
        };
        assert_eq!(
            (*what, manager.as_str(), *requested),
            ("pinned host", name, MIB),
            "{e}"
        );
        if cfg!(target_os = "linux") {
            assert!(*total > 0, "{name}: the host's total memory is read: {e}");
        }
        assert!(
            detail.contains(&format!("holds {} bytes", 3 * MIB)),
            "{name}: what the manager holds is named: {e}"
        );
        drop(held);
    }
}

#[test]
fn a_reservation_is_freed_only_after_the_mapping_inside_it() {
    let f = fixture();
    let before = snapshot(&f.s);
    let m = manager("pool", &f.ctx);
    drop(m.memalloc(8 * MIB).unwrap());
    f.s.control("fail_always cuMemUnmap CUDA_ERROR_UNKNOWN")
        .unwrap();
    drop(m);
    let waiting = f.ctx.doomed_handles();
    assert!(
        waiting >= 2,
        "a mapping and its reservation wait: {waiting}"
    );
    let _ = f.ctx.take_deferred_errors();
    // The unmap is refused again: the reservation around it is not even tried.
    let address_frees = || f.s.control("calls cuMemAddressFree").unwrap();
    let tried = address_frees();
    // Each mapping's refusal is returned once, one a call; the reservation's
    // free is never tried, so it has none.
    let mut refusals = 0;
    while let Err(e) = f.ctx.synchronize() {
        refusals += 1;
        assert!(e.to_string().contains("cuMemUnmap"), "{e}");
        assert!(refusals < waiting, "at most one refusal a mapping");
    }
    assert_eq!(refusals, waiting - 1, "every mapping's refusal returned");
    assert_eq!(
        address_frees(),
        tried,
        "no cuMemAddressFree with a mapping inside"
    );
    assert_eq!(f.ctx.doomed_handles(), waiting, "both still wait");
    assert_eq!(
        f.s.live().unwrap().reservations,
        before.live.reservations + 1,
        "the reservation is still held"
    );
    f.ctx.synchronize().unwrap();
    assert_eq!(
        address_frees(),
        tried,
        "the later retries try no cuMemAddressFree either"
    );
    assert_eq!(f.ctx.doomed_handles(), waiting, "both still wait");
    f.s.reset().unwrap();
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0);
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(snapshot(&f.s), before);
}

/// Another retain of the same context going (the C ABI makes and drops one per
/// call) does not take the last chance at what was handed over: the memory
/// stays for the retain that lives on, which frees it once the driver takes
/// frees again. Found by review: the first retain dropped threw it away.
#[test]
fn another_retain_going_keeps_what_was_handed_over() {
    let f = fixture();
    let before = snapshot(&f.s);
    default_refused_at_drop(&f, &f.ctx, "CUDA_ERROR_UNKNOWN");
    let waiting = f.ctx.doomed_handles();
    drop(Context::on_device(0).unwrap());
    assert_eq!(f.ctx.doomed_handles(), waiting, "still kept");
    f.s.reset().unwrap();
    let _ = f.ctx.take_deferred_errors();
    f.ctx.synchronize().unwrap();
    assert_eq!(snapshot(&f.s), before);
}

/// A default manager of `ctx` with one block whose free is queued; its
/// address.
fn default_with_a_queued_free(ctx: &Context) -> (Box<dyn MemoryManager>, u64) {
    let m = manager("default", ctx);
    let a = m.memalloc(MIB).unwrap();
    let ptr = a.ptr();
    drop(a);
    (m, ptr)
}

/// [`default_with_a_queued_free`], dropped while `cuMemFree_v2` fails with
/// `code`: the refused free waits on the context (checked); its address.
fn default_refused_at_drop(f: &Fixture, ctx: &Context, code: &str) -> u64 {
    let (m, ptr) = default_with_a_queued_free(ctx);
    f.s.control(&format!("fail_always cuMemFree_v2 {code}"))
        .unwrap();
    drop(m);
    assert!(ctx.doomed_handles() > 0, "the refused free was handed over");
    ptr
}

/// The next synchronize of `ctx` frees nothing (`cuMemFree_v2` not called)
/// and drops what waits; then `ptr`, which the stand-in's reset keeps (a real
/// one frees it), is freed here so the next test starts clean.
fn assert_dropped_unfreed(f: &Fixture, ctx: &Context, ptr: u64, what: &str) {
    let frees = || f.s.control("calls cuMemFree_v2").unwrap();
    let before = frees();
    ctx.synchronize().unwrap();
    assert_eq!(frees(), before, "{what}");
    assert_eq!(ctx.doomed_handles(), 0, "{what}: dropped");
    // SAFETY: a block still allocated in the stand-in, freed once.
    unsafe { emm::driver::memory::free(&f.ctx, ptr) }.unwrap();
}

/// A context reset (`cuDevicePrimaryCtxReset`, as `numba.cuda.close()` does)
/// takes what was handed over with it: the new context under the same handle
/// may have handed the same addresses to new owners, so nothing kept for the
/// old one is freed in it. Found by review.
#[test]
fn a_context_reset_drops_what_was_kept_for_the_old_context_unfreed() {
    let f = fixture();
    let ptr = default_refused_at_drop(&f, &f.ctx, "CUDA_ERROR_UNKNOWN");
    f.s.reset().unwrap();
    let _ = f.ctx.take_deferred_errors();
    f.s.control("reset_primary 0").unwrap();
    assert_dropped_unfreed(&f, &f.ctx, ptr, "nothing freed in the new context");
}

/// A manager's trim (`release_cached`) releases what another manager of the
/// same context handed over, once the driver takes it again.
#[test]
fn a_trim_releases_what_another_manager_handed_over() {
    let f = fixture();
    let before = snapshot(&f.s);
    for name in MANAGERS {
        default_refused_at_drop(&f, &f.ctx, "CUDA_ERROR_UNKNOWN");
        f.s.reset().unwrap();
        let _ = f.ctx.take_deferred_errors();
        let other = manager(name, &f.ctx);
        other.release_cached().unwrap();
        assert_eq!(f.ctx.doomed_handles(), 0, "{name}: its trim released it");
        drop(other);
        assert_eq!(snapshot(&f.s), before, "{name}");
    }
}

/// Memory handed over by a manager made before a context reset and dropped
/// after it is keyed with the old context's id, so it is dropped, not freed in
/// the new context (where its address may be another owner's). Found by
/// review: the hand-over took the id of the moment, the new context's.
#[test]
fn a_manager_of_the_old_context_dropped_after_a_reset_frees_nothing_in_the_new_one() {
    let f = fixture();
    let (m, ptr) = default_with_a_queued_free(&f.ctx);
    f.s.control("reset_primary 0").unwrap();
    f.s.control("fail_always cuMemFree_v2 CUDA_ERROR_INVALID_VALUE")
        .unwrap();
    drop(m);
    f.s.reset().unwrap();
    let _ = f.ctx.take_deferred_errors();
    assert_dropped_unfreed(&f, &f.ctx, ptr, "nothing freed in the new context");
}

/// A retain whose context id could not be read keys what it hands over with
/// an id that matches no context: never freed (a context it cannot name may
/// be a new one), dropped at the next retry.
#[test]
fn what_a_retain_of_unknown_id_hands_over_is_never_freed() {
    let f = fixture();
    f.s.control("fail cuCtxGetId 1 CUDA_ERROR_UNKNOWN").unwrap();
    let ctx = Context::on_device(0).unwrap();
    f.s.reset().unwrap();
    let ptr = default_refused_at_drop(&f, &ctx, "CUDA_ERROR_UNKNOWN");
    f.s.reset().unwrap();
    let _ = ctx.take_deferred_errors();
    assert_dropped_unfreed(&f, &ctx, ptr, "not freed under an unknown id");
}

/// A piece the driver keeps refusing fails one synchronize, not every later
/// one: it stays kept and retried, [`Context::retry_destroys`] still returns
/// its refusal, and a trim's retry (whose refusal nobody sees) does not use up
/// that one report. Before, every synchronize returned the same refusal for as
/// long as the driver refused.
#[test]
fn a_lasting_refusal_fails_one_synchronize_not_every_one() {
    let f = fixture();
    let before = snapshot(&f.s);
    default_refused_at_drop(&f, &f.ctx, "CUDA_ERROR_UNKNOWN");
    let waiting = f.ctx.doomed_handles();
    let _ = f.ctx.take_deferred_errors();
    let frees = || f.s.control("calls cuMemFree_v2").unwrap();
    let other = manager("pool", &f.ctx);
    let tried = frees();
    other.release_cached().unwrap();
    assert!(frees() > tried, "the trim retried it");
    let tried = frees();
    assert!(
        f.ctx.synchronize().is_err(),
        "the first synchronize after the trim returns the refusal"
    );
    assert!(frees() > tried, "the synchronize retried it");
    for _ in 0..3 {
        let tried = frees();
        f.ctx.synchronize().unwrap();
        assert!(frees() > tried, "every synchronize retries it");
    }
    assert_eq!(f.ctx.doomed_handles(), waiting, "still kept");
    assert!(
        f.ctx.retry_destroys().is_err(),
        "an explicit retry returns the refusal"
    );
    f.s.reset().unwrap();
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0);
    drop(other);
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(snapshot(&f.s), before, "everything went back");
}

/// Memory handed over out of its release order (the reservation first, then
/// the handle, then the mapping inside it) is released in one retry: the
/// mapping is undone before the handle is released and the reservation freed.
/// Without that order the reservation's free is refused (a mapping inside it)
/// and waits for a second retry, and the first synchronize fails.
#[test]
fn memory_handed_over_out_of_order_is_released_in_order() {
    let f = fixture();
    let before = snapshot(&f.s);
    let drv = emm_sys::driver().unwrap();
    let len = 2 * MIB;
    f.ctx.set_current().unwrap();
    let (mut addr, mut h) = (0, 0);
    let prop = emm_sys::CUmemAllocationProp {
        type_: emm_sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        location: emm_sys::CUmemLocation {
            type_: emm_sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        ..Default::default()
    };
    let desc = emm_sys::CUmemAccessDesc {
        location: prop.location,
        flags: emm_sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: valid out-pointers and descriptors; the range is reserved, then
    // mapped once with the handle made for it.
    unsafe {
        assert!((drv.mem_address_reserve.unwrap())(&mut addr, len, 0, 0, 0).is_success());
        assert!((drv.mem_create.unwrap())(&mut h, len, &prop, 0).is_success());
        assert!((drv.mem_map.unwrap())(addr, len, 0, h, 0).is_success());
        assert!((drv.mem_set_access.unwrap())(addr, len, &desc, 1).is_success());
    }
    assert_ne!(snapshot(&f.s), before);
    // SAFETY: each is live in this context, handed over once, and nobody uses
    // it again.
    unsafe {
        f.ctx.free_later(Orphan::Reservation { addr, size: len });
        f.ctx.free_later(Orphan::Handle(h));
        f.ctx.free_later(Orphan::Mapping { addr, len });
    }
    let address_frees = || f.s.control("calls cuMemAddressFree").unwrap();
    let tried = address_frees();
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0, "all three released at once");
    assert_eq!(
        address_frees(),
        tried + 1,
        "one cuMemAddressFree, not refused"
    );
    assert_eq!(snapshot(&f.s), before, "nothing left, no invalid free");
}

/// Two handles the driver keeps refusing: each synchronize returns one
/// refusal not returned before, so both are reported, one a call, before
/// synchronize succeeds while they stay kept; a stream's creation (which
/// retries streams quietly) and a manager's trim, reset or wait use up no
/// report. Found by review: the first version marked every refused handle
/// reported while returning only the first refusal, and the hostonly
/// manager's trim, whose wait is a synchronize, used up the report.
#[test]
fn each_lasting_refusal_is_returned_once_by_synchronize() {
    let f = fixture();
    let before = snapshot(&f.s);
    f.s.control("fail_always cuStreamDestroy_v2 CUDA_ERROR_UNKNOWN")
        .unwrap();
    for _ in 0..2 {
        drop(emm::Stream::new(&f.ctx).unwrap());
        // The drop's own error, recorded for the next call.
        assert_eq!(f.ctx.take_deferred_errors().len(), 1);
    }
    assert_eq!(f.ctx.doomed_handles(), 2, "both streams kept");
    // Quiet retries: a stream's creation, the managers' trims and resets.
    let s = emm::Stream::new(&f.ctx).unwrap();
    let hostonly = manager("hostonly", &f.ctx);
    let default = manager("default", &f.ctx);
    for m in [&hostonly, &default] {
        m.release_cached().unwrap();
        m.reset().unwrap();
    }
    assert_eq!(f.ctx.doomed_handles(), 2, "still kept");
    let destroys = || f.s.control("calls cuStreamDestroy_v2").unwrap();
    let tried = destroys();
    for which in ["first", "second"] {
        let e = f.ctx.synchronize().unwrap_err();
        assert!(
            e.to_string().contains("cuStreamDestroy_v2"),
            "the {which} stream's refusal: {e}"
        );
    }
    f.ctx.synchronize().unwrap();
    assert_eq!(destroys(), tried + 6, "each synchronize retried both");
    assert_eq!(f.ctx.doomed_handles(), 2, "both still kept");
    f.s.reset().unwrap();
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0);
    drop((s, hostonly, default));
    let _ = f.ctx.take_deferred_errors();
    assert_eq!(snapshot(&f.s), before, "everything went back");
}

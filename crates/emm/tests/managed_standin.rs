//! Managed memory (`memallocmanaged`) of every built-in manager against
//! `emm-standin` (host memory, no GPU): served by each, host and device views of
//! the same bytes, counted apart from device memory, never pooled, frees held
//! back by `defer_cleanup`, and `cuMemAllocManaged` failing (out of memory, no
//! managed memory on the device) with typed errors and nothing leaked.
//!
//! The library is found next to the test executable (`target/<profile>/`); build
//! it first with `cargo build -p emm-standin` (`cargo xtask ci` does).

mod common;

use common::managers::{manager, MANAGERS};
use common::{fixture, oom, snapshot, Fixture, Snapshot};

use emm::EmmError;
use emm_core::{ManagedAttach, ManagedMemory};
use emm_driver::memory;
use emm_sys::{CUpointer_attribute, CUresult};

fn assert_clean(f: &Fixture, before: &Snapshot, what: &str) {
    f.ctx.synchronize().unwrap();
    assert_eq!(
        &snapshot(&f.s),
        before,
        "{what}: the stand-in's live resources or bad-free counters changed"
    );
    assert_eq!(f.s.control("live_managed").unwrap(), 0, "{what}");
}

/// The stand-in's device memory is host memory: the manager's address is the
/// host's, and the driver says the range is managed.
fn check_host_and_device_views(f: &Fixture, a: &ManagedMemory, seed: u8) {
    let n = a.size();
    let data: Vec<u8> = (0..n).map(|i| (i as u8) ^ seed).collect();
    // SAFETY: `n` bytes of managed memory; nothing runs on the device.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), a.host_ptr(), n) };
    let mut back = vec![0u8; n];
    // SAFETY: `a` holds `n` bytes.
    unsafe { memory::copy_dtoh(&f.ctx, &mut back, a.ptr()) }.unwrap();
    assert_eq!(back, data);
    let managed =
        memory::pointer_attribute_u64(&f.ctx, CUpointer_attribute::IS_MANAGED, a.ptr()).unwrap();
    assert_eq!(managed & 0xFFFF_FFFF, 1, "IS_MANAGED of {:#x}", a.ptr());
}

#[test]
fn every_builtin_manager_serves_managed_memory_counted_apart_and_not_pooled() {
    let f = fixture();
    let before = snapshot(&f.s);
    for name in MANAGERS {
        let m = manager(name, &f.ctx);
        let device_before = m.stats();
        let allocs = f.s.calls("cuMemAllocManaged").unwrap();
        let frees = f.s.calls("cuMemFree_v2").unwrap();
        let sizes = [1usize, 300, 4096, 3 << 20];
        let held: Vec<ManagedMemory> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let attach = if i % 2 == 0 {
                    ManagedAttach::Global
                } else {
                    ManagedAttach::Host
                };
                let a = m
                    .memallocmanaged(s, attach)
                    .unwrap_or_else(|e| panic!("{name}: memallocmanaged({s}): {e}"));
                assert_eq!((a.size(), a.attach()), (s, attach), "{name}");
                check_host_and_device_views(&f, &a, i as u8);
                a
            })
            .collect();
        // One driver call per request: nothing served from (or put into) a cache.
        assert_eq!(
            f.s.calls("cuMemAllocManaged").unwrap(),
            allocs + sizes.len() as u64,
            "{name}"
        );
        assert_eq!(f.s.control("live_managed").unwrap(), sizes.len() as u64);
        let ms = m.managed_stats();
        assert_eq!(ms.allocated_bytes, sizes.iter().sum::<usize>(), "{name}");
        assert_eq!((ms.live, ms.allocations), (4, 4), "{name}");
        assert_eq!(
            m.stats(),
            device_before,
            "{name}: managed memory is not device memory in stats()"
        );
        let listed: std::collections::HashMap<_, _> = m.memory_stats().into_iter().collect();
        assert_eq!(
            listed.get("emm.managed_bytes.current").copied(),
            Some(ms.allocated_bytes as u64),
            "{name}"
        );
        drop(held);
        // Freed at once with cuMemFree, not kept.
        assert_eq!(
            f.s.calls("cuMemFree_v2").unwrap(),
            frees + sizes.len() as u64,
            "{name}"
        );
        assert_eq!(f.s.control("live_managed").unwrap(), 0, "{name}");
        let after = m.managed_stats();
        assert_eq!((after.allocated_bytes, after.live), (0, 0), "{name}");
        assert_eq!(after.allocated_bytes_peak, ms.allocated_bytes, "{name}");
        m.reset_peak_stats();
        assert_eq!(m.managed_stats().allocated_bytes_peak, 0, "{name}");
        // Zero bytes: an empty allocation that owns nothing, and no driver call.
        let z = m.memallocmanaged(0, ManagedAttach::Global).unwrap();
        assert_eq!((z.ptr(), z.size()), (0, 0));
        assert_eq!(
            f.s.calls("cuMemAllocManaged").unwrap(),
            allocs + sizes.len() as u64
        );
        // Sizes no machine holds: typed, before the driver.
        for size in [usize::MAX, isize::MAX as usize, (1 << 63) + 1] {
            match m.memallocmanaged(size, ManagedAttach::Global) {
                Err(EmmError::InvalidSize { requested, .. }) => assert_eq!(requested, size),
                other => panic!("{name}: memallocmanaged({size:#x}) gave {other:?}"),
            }
        }
        m.release_cached().unwrap();
    }
    assert_clean(&f, &before, "managed memory of every manager");
}

#[test]
fn managed_frees_wait_for_the_last_defer_guard() {
    let f = fixture();
    let before = snapshot(&f.s);
    for name in MANAGERS {
        let m = manager(name, &f.ctx);
        let outer = m.defer_cleanup();
        let inner = m.defer_cleanup();
        let a = m.memallocmanaged(1 << 20, ManagedAttach::Global).unwrap();
        let b = m.memallocmanaged(4096, ManagedAttach::Host).unwrap();
        drop(a);
        drop(b);
        assert_eq!(
            f.s.control("live_managed").unwrap(),
            2,
            "{name}: freed while deferred"
        );
        let s = m.managed_stats();
        assert_eq!((s.allocated_bytes, s.pending_bytes), (0, (1 << 20) + 4096));
        // The out-of-memory hook does not free while a guard lives either.
        m.release_cached().unwrap();
        assert_eq!(f.s.control("live_managed").unwrap(), 2, "{name}");
        drop(outer);
        assert_eq!(
            f.s.control("live_managed").unwrap(),
            2,
            "{name}: a guard lives"
        );
        drop(inner);
        assert_eq!(
            f.s.control("live_managed").unwrap(),
            0,
            "{name}: the last guard frees"
        );
        assert_eq!(m.managed_stats().pending_bytes, 0);
        m.release_cached().unwrap();
    }
    assert_clean(&f, &before, "deferred managed frees");
}

#[test]
fn reset_frees_live_managed_memory_once() {
    let f = fixture();
    let before = snapshot(&f.s);
    for name in MANAGERS {
        let m = manager(name, &f.ctx);
        let held = m.memallocmanaged(8192, ManagedAttach::Global).unwrap();
        m.reset().unwrap();
        assert_eq!(f.s.control("live_managed").unwrap(), 0, "{name}");
        assert_eq!(m.managed_stats().live, 0, "{name}");
        drop(held); // invalidated: no second free
        let fresh = m.memallocmanaged(8192, ManagedAttach::Global).unwrap();
        check_host_and_device_views(&f, &fresh, 7);
        drop(fresh);
        m.release_cached().unwrap();
    }
    assert_clean(&f, &before, "reset with managed memory held");
}

#[test]
fn managed_out_of_memory_is_retried_once_then_typed_and_leaks_nothing() {
    let f = fixture();
    let before = snapshot(&f.s);
    for name in MANAGERS {
        let m = manager(name, &f.ctx);
        // The pool and the default manager hold freed device memory: the ladder
        // gives it back before the retry.
        let cached = m.memalloc(8 << 20).unwrap();
        drop(cached);
        let calls = f.s.calls("cuMemAllocManaged").unwrap();
        f.s.fail_nth("cuMemAllocManaged", 1, oom()).unwrap();
        let a = m
            .memallocmanaged(1 << 20, ManagedAttach::Global)
            .unwrap_or_else(|e| panic!("{name}: the retry should work: {e}"));
        assert_eq!(f.s.calls("cuMemAllocManaged").unwrap(), calls + 2, "{name}");
        if name != "hostonly" {
            assert_eq!(
                m.stats().reserved_bytes,
                0,
                "{name}: the cache was given back before the retry"
            );
        }
        // Both attempts fail: OutOfMemory naming the manager, the request and the
        // device's figures; no managed allocation is left behind.
        f.s.fail_nth("cuMemAllocManaged", 1, oom()).unwrap();
        f.s.fail_nth("cuMemAllocManaged", 2, oom()).unwrap();
        let (free, total) = f.ctx.mem_info().unwrap();
        match m.memallocmanaged(4096, ManagedAttach::Host) {
            Err(EmmError::OutOfMemory {
                what,
                manager,
                requested,
                total: t,
                free: fr,
                ..
            }) => {
                assert_eq!((what, manager.as_str(), requested), ("managed", name, 4096));
                assert_eq!((fr, t), (free, total), "{name}");
            }
            other => panic!("{name}: expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(f.s.control("live_managed").unwrap(), 1, "{name}");
        assert_eq!(m.managed_stats().live, 1, "{name}");
        // Past the device's capacity (the stand-in does not oversubscribe).
        let e = m
            .memallocmanaged(total + 4096, ManagedAttach::Global)
            .unwrap_err();
        assert!(e.is_out_of_memory(), "{name}: {e:?}");
        assert!(e.to_string().contains("out of managed memory"), "{e}");
        drop(a);
        // Any other driver failure is the driver's typed error.
        f.s.fail_nth("cuMemAllocManaged", 1, CUresult::ERROR_UNKNOWN)
            .unwrap();
        assert!(matches!(
            m.memallocmanaged(64, ManagedAttach::Global),
            Err(EmmError::Driver(_))
        ));
        // And the manager keeps working.
        let b = m.memallocmanaged(64, ManagedAttach::Global).unwrap();
        drop(b);
        m.release_cached().unwrap();
    }
    assert_clean(&f, &before, "managed out of memory");
}

#[test]
fn a_device_without_managed_memory_is_unsupported_typed() {
    let f = fixture();
    let before = snapshot(&f.s);
    assert!(emm::Device::get(0)
        .unwrap()
        .supports_managed_memory()
        .unwrap());
    f.s.control("managed 0").unwrap();
    assert!(!emm::Device::get(0)
        .unwrap()
        .supports_managed_memory()
        .unwrap());
    for name in MANAGERS {
        let m = manager(name, &f.ctx);
        match m.memallocmanaged(4096, ManagedAttach::Global) {
            Err(EmmError::Unsupported { manager, operation }) => {
                assert_eq!(manager, name);
                assert!(operation.starts_with("memallocmanaged"), "{operation}");
            }
            other => panic!("{name}: expected Unsupported, got {other:?}"),
        }
        // Device memory is unaffected.
        drop(m.memalloc(4096).unwrap());
        m.release_cached().unwrap();
    }
    f.s.reset().unwrap();
    assert_clean(&f, &before, "no managed memory");
}

#[test]
fn a_failing_managed_free_is_reported_once_and_retried_by_the_next_flush() {
    let f = fixture();
    for name in MANAGERS {
        let before = snapshot(&f.s);
        let m = manager(name, &f.ctx);
        let a = m.memallocmanaged(4096, ManagedAttach::Global).unwrap();
        f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
        drop(a);
        f.s.reset().unwrap();
        // The failure is recorded on the context (its next fallible call reports it).
        assert_eq!(f.ctx.take_deferred_errors().len(), 1, "{name}");
        // The refused free freed nothing: the block waits for the next flush.
        assert_eq!(f.s.control("live_managed_bytes").unwrap(), 4096, "{name}");
        assert_eq!(m.managed_stats().pending_bytes, 4096, "{name}");
        // The hook frees it, once; reset and the drop find nothing more to free.
        m.release_cached().unwrap();
        assert_eq!(f.s.control("live_managed_bytes").unwrap(), 0, "{name}");
        m.reset().unwrap();
        assert_eq!(m.managed_stats().live, 0, "{name}");
        drop(m);
        assert!(f.ctx.take_deferred_errors().is_empty(), "{name}");
        assert_clean(&f, &before, name);
    }
}

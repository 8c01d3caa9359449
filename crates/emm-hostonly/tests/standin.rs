//! The hostonly plugin against `emm-standin`, the fault-injecting stand-in driver
//! (host memory, no GPU): frees the driver refuses (failing frees, a lost
//! context) are reported, the blocks stay the manager's, and a later call frees
//! them once the fault clears, with nothing leaked and nothing freed twice.
//!
//! The library is found next to the test executable (`target/<profile>/`); build
//! it first with `cargo build -p emm-standin` (`cargo xtask ci` does).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, Once};

use emm_core::{EmmError, IpcHandle, MemoryManager};
use emm_driver::{Context, DriverError, Stream};
use emm_hostonly::HostOnlyManager;
use emm_sys::StandIn;

/// Serializes the tests (the stand-in's faults and counters are process-wide),
/// loads the stand-in once and clears its faults.
struct Fixture {
    _serial: MutexGuard<'static, ()>,
    s: StandIn<'static>,
    ctx: Context,
}

fn fixture() -> Fixture {
    static SERIAL: Mutex<()> = Mutex::new(());
    static LOAD: Once = Once::new();
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    LOAD.call_once(|| {
        let exe = std::env::current_exe().expect("the test executable's path");
        let path: PathBuf = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("the test executable lives in target/<profile>/deps")
            .join("libemm_standin.so");
        assert!(
            path.is_file(),
            "{} is missing: run `cargo build -p emm-standin` first (cargo xtask ci does)",
            path.display()
        );
        std::env::set_var(emm_sys::DRIVER_PATH_ENV, &path);
    });
    let drv = emm_sys::driver().expect("the stand-in loads");
    let s = drv
        .stand_in()
        .expect("the loaded driver is emm-standin (EMM_CUDA_DRIVER was set elsewhere?)");
    s.reset().unwrap();
    s.control("capacity 8G").unwrap();
    let ctx = Context::on_device(0).unwrap();
    let _ = ctx.take_deferred_errors();
    Fixture {
        _serial: serial,
        s,
        ctx,
    }
}

/// `(live device bytes, double frees, invalid frees)` of the stand-in.
fn counters(s: &StandIn<'_>) -> (u64, u64, u64) {
    (
        s.control("live_bytes").unwrap(),
        s.control("double_frees").unwrap(),
        s.control("invalid_frees").unwrap(),
    )
}

/// Asserts that the stand-in holds `held` bytes more than `base` for the manager,
/// that the manager reports the same, and that nothing was freed twice.
#[track_caller]
fn assert_held(s: &StandIn<'_>, m: &HostOnlyManager, base: (u64, u64, u64), held: u64) {
    let now = counters(s);
    assert_eq!(
        now,
        (base.0 + held, base.1, base.2),
        "the stand-in's (live bytes, double frees, invalid frees)"
    );
    assert_eq!(
        m.stats().allocated_bytes as u64,
        held,
        "the manager's allocated bytes"
    );
}

/// A free refused in a drop (no caller to tell) is recorded on the context and
/// the block stays allocated and counted; a trim while the fault lasts reports it
/// again and keeps the block; once the fault clears a trim frees it, and the
/// manager's and the stand-in's bytes are back where they were.
#[test]
fn a_free_refused_in_a_drop_is_reported_and_the_next_trim_frees_it() {
    let f = fixture();
    let m = HostOnlyManager::new(&f.ctx).unwrap();
    let stream = Stream::new(&f.ctx).unwrap();
    let base = counters(&f.s);
    let a = m.memalloc(1 << 20).unwrap();
    let b = m.memalloc_async(3 << 20, stream.raw()).unwrap();
    assert_held(&f.s, &m, base, 4 << 20);

    f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
    drop(a);
    drop(b);
    assert_held(&f.s, &m, base, 4 << 20);
    // The first fallible call reports what the drops could not.
    match m.trim(0) {
        Err(EmmError::Driver(DriverError::Deferred(e))) => {
            assert!(e.to_string().contains("cuMemFreeAsync"), "{e}");
        }
        other => panic!("expected the drop's error, deferred; got {other:?}"),
    }
    // While the fault lasts, the retry fails, says so, and keeps both blocks.
    let e = m.trim(0).expect_err("frees still fail");
    let text = e.to_string();
    assert!(
        text.contains("could not free") && text.contains("CUDA_ERROR_UNKNOWN"),
        "{text}"
    );
    assert_held(&f.s, &m, base, 4 << 20);

    f.s.control("fail_frees off").unwrap();
    m.trim(0).unwrap();
    assert_held(&f.s, &m, base, 0);
    assert_eq!(m.stats().upstream_frees, 2, "each block freed once");
    // Reclaimed for good: a second trim finds nothing more, and frees nothing twice.
    m.trim(0).unwrap();
    assert_held(&f.s, &m, base, 0);
    assert!(f.ctx.take_deferred_errors().is_empty());
    drop(stream);
}

/// The same with a lost context: the drop's free fails, and once the context is
/// back the block is freed by the out-of-memory hook's path (`release_cached`).
#[test]
fn a_free_refused_by_a_lost_context_is_freed_once_it_is_back() {
    let f = fixture();
    let m = HostOnlyManager::new(&f.ctx).unwrap();
    let base = counters(&f.s);
    let a = m.memalloc(2 << 20).unwrap();
    f.s.control("lose_context").unwrap();
    drop(a);
    f.s.reset().unwrap();
    assert_held(&f.s, &m, base, 2 << 20);
    assert!(
        m.release_cached().is_err(),
        "the drop's error is reported first"
    );
    m.release_cached().unwrap();
    assert_held(&f.s, &m, base, 0);
    assert!(f.ctx.take_deferred_errors().is_empty());
}

/// A block whose free failed in a drop and was never retried is freed when the
/// manager goes: dropping it leaks nothing.
#[test]
fn the_managers_end_frees_blocks_whose_free_failed() {
    let f = fixture();
    let base = counters(&f.s);
    {
        let m = HostOnlyManager::new(&f.ctx).unwrap();
        let a = m.memalloc(1 << 20).unwrap();
        f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
        drop(a);
        f.s.control("fail_frees off").unwrap();
        let _ = f.ctx.take_deferred_errors();
    }
    f.ctx.synchronize().unwrap();
    assert_eq!(counters(&f.s), base, "nothing leaked, nothing freed twice");
}

/// Pins `buf` through a manager made for it, then drops the pinned range and the
/// manager while the driver refuses every unpinning (the fault stays set).
/// `buf` must outlive every retry of the unpinning (the caller drops it last).
fn pin_and_refuse_its_unpinning(f: &Fixture, buf: &mut [u8]) {
    let pinned_before = f.s.control("live_host").unwrap();
    let m = HostOnlyManager::new(&f.ctx).unwrap();
    // SAFETY: the caller keeps `buf` past every retry of its unpinning.
    let pinned = unsafe { m.mempin(buf.as_mut_ptr(), buf.len(), false) }.unwrap();
    assert_eq!(f.s.control("live_host").unwrap(), pinned_before + 1);
    f.s.control("fail_always cuMemHostUnregister CUDA_ERROR_UNKNOWN")
        .unwrap();
    drop(pinned);
    // The manager's own retry at its end is refused too.
    drop(m);
}

/// A `mempin` range whose unpinning the driver refuses even as its manager goes
/// is handed to the context, not left pinned: the context's next synchronize
/// unregisters it once the fault clears (before, the manager's drop logged it
/// and the range stayed page-locked for the process's life).
#[test]
fn a_range_the_driver_would_not_unpin_goes_to_the_context_with_the_manager() {
    let f = fixture();
    let pinned_before = f.s.control("live_host").unwrap();
    let mut buf = vec![0u8; 1 << 16];
    pin_and_refuse_its_unpinning(&f, &mut buf);
    assert_eq!(
        f.s.control("live_host").unwrap(),
        pinned_before + 1,
        "still registered while the driver refuses"
    );
    assert!(
        f.ctx.synchronize().is_err(),
        "the refusals are reported to the context's next call"
    );
    let _ = f.ctx.take_deferred_errors();
    f.s.reset().unwrap();
    let calls = f.s.control("calls cuMemHostUnregister").unwrap();
    f.ctx.synchronize().unwrap();
    assert_eq!(
        f.s.control("live_host").unwrap(),
        pinned_before,
        "the context unregistered the range once the driver took it"
    );
    // Once, and done for good: another synchronize has nothing left to
    // unregister.
    assert_eq!(f.s.control("calls cuMemHostUnregister").unwrap(), calls + 1);
    f.ctx.synchronize().unwrap();
    assert_eq!(f.s.control("calls cuMemHostUnregister").unwrap(), calls + 1);
    drop(buf);
}

/// Another manager pinning a range that a gone manager's refused unpinning
/// left registered (handed to the context) gets it: the context's retry
/// unregisters it first, instead of `mempin` failing with "already
/// registered" until the context's next synchronize.
#[test]
fn a_range_left_registered_by_a_gone_manager_can_be_pinned_again() {
    let f = fixture();
    let pinned_before = f.s.control("live_host").unwrap();
    let mut buf = vec![0u8; 1 << 16];
    pin_and_refuse_its_unpinning(&f, &mut buf);
    f.s.reset().unwrap();
    let _ = f.ctx.take_deferred_errors();
    let other = HostOnlyManager::new(&f.ctx).unwrap();
    // SAFETY: as above.
    let again = unsafe { other.mempin(buf.as_mut_ptr(), buf.len(), true) }
        .expect("the context's retry unregistered the old range first");
    assert_eq!(f.s.control("live_host").unwrap(), pinned_before + 1);
    drop(again);
    assert_eq!(f.s.control("live_host").unwrap(), pinned_before);
    assert!(f.ctx.take_deferred_errors().is_empty());
    drop(buf);
}

/// An explicit free ([`emm_core::DeviceAllocation::free`]) returns the refused
/// free as [`EmmError::FreeFailed`] with the allocation, still live; freeing it
/// again once the fault clears works. `reset` also frees blocks whose free failed.
#[test]
fn an_explicit_free_returns_the_refusal_and_the_allocation_for_a_retry() {
    let f = fixture();
    let m = HostOnlyManager::new(&f.ctx).unwrap();
    let base = counters(&f.s);
    let a = m.memalloc(1 << 20).unwrap();
    let ptr = a.ptr();
    f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
    let emm_core::NotFreed {
        allocation: a,
        error: e,
    } = *a.free().expect_err("the driver refuses the free");
    match &e {
        EmmError::FreeFailed {
            manager,
            ptr: p,
            size,
            source,
        } => {
            assert_eq!((manager.as_str(), *p, *size), ("hostonly", ptr, 1 << 20));
            assert!(source.to_string().contains("cuMemFreeAsync"), "{source}");
        }
        other => panic!("expected FreeFailed, got {other:?}"),
    }
    assert!(e.to_string().contains("free it again"), "{e}");
    assert_eq!(a.ptr(), ptr);
    assert_held(&f.s, &m, base, 1 << 20);
    assert!(
        f.ctx.take_deferred_errors().is_empty(),
        "returned to the caller, not deferred"
    );
    f.s.control("fail_frees off").unwrap();
    a.free().unwrap();
    assert_held(&f.s, &m, base, 0);

    // A drop's failed free, then `reset`: freed there.
    let b = m.memalloc(1 << 20).unwrap();
    f.s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
    drop(b);
    f.s.control("fail_frees off").unwrap();
    let _ = f.ctx.take_deferred_errors();
    m.reset().unwrap();
    assert_held(&f.s, &m, base, 0);
}

/// A failed export of the pool for IPC is the call's error, the driver's (it
/// was `Unsupported`, kept for the manager's life), and the next call exports
/// once the fault clears.
#[test]
fn a_failed_pool_export_is_tried_again_at_the_next_ipc_handle() {
    let f = fixture();
    let m = HostOnlyManager::new(&f.ctx).unwrap();
    let a = m.memalloc(1 << 20).unwrap();
    f.s.control("fail cuMemPoolExportToShareableHandle 1 CUDA_ERROR_OUT_OF_MEMORY")
        .unwrap();
    let e = m.get_ipc_handle(a.as_view()).unwrap_err();
    assert!(matches!(e, EmmError::Driver(_)), "{e:?}");
    assert!(
        e.to_string().contains("cuMemPoolExportToShareableHandle"),
        "{e}"
    );
    f.s.reset().unwrap();
    m.get_ipc_handle(a.as_view())
        .expect("exported once the fault cleared");
}

/// A pool pointer opened from an IPC handle whose free the driver refuses as
/// its mapping is dropped goes to the context with its imported pool: the pool
/// is not destroyed under the pointer, the refusal reaches the context's next
/// call, and the context's retry frees the pointer, then the pool.
#[test]
fn a_pool_pointer_whose_free_is_refused_in_a_drop_goes_to_the_context_with_its_pool() {
    let f = fixture();
    let m = HostOnlyManager::new(&f.ctx).unwrap();
    let a = m.memalloc(1 << 20).unwrap();
    let h = m.get_ipc_handle(a.as_view()).unwrap();
    let pools = f.s.live().unwrap().pools;
    let opened = h.open(&f.ctx, &m).unwrap();
    assert_eq!(
        f.s.live().unwrap().pools,
        pools + 1,
        "the import is a pool of its own"
    );
    f.s.control("fail cuMemFreeAsync 1 CUDA_ERROR_UNKNOWN")
        .unwrap();
    drop(opened);
    assert_eq!(
        f.ctx.doomed_handles(),
        2,
        "the pointer and its pool handed to the context"
    );
    assert_eq!(
        f.s.live().unwrap().pools,
        pools + 1,
        "the pool is not destroyed while its pointer is not freed"
    );
    let e = f.ctx.synchronize().unwrap_err();
    assert!(e.to_string().contains("cuMemFreeAsync"), "{e}");
    // The retry's free refused again: the pool is kept with its pointer.
    f.s.control("fail cuMemFreeAsync 1 CUDA_ERROR_UNKNOWN")
        .unwrap();
    let e = f.ctx.synchronize().unwrap_err();
    assert!(e.to_string().contains("cuMemFreeAsync"), "{e}");
    assert_eq!(f.ctx.doomed_handles(), 2);
    assert_eq!(f.s.live().unwrap().pools, pools + 1);
    f.ctx.synchronize().unwrap();
    assert_eq!(f.ctx.doomed_handles(), 0, "both released by the retry");
    assert_eq!(f.s.live().unwrap().pools, pools);
    drop(a);
    m.trim(0).unwrap();
    let (_, double, invalid) = counters(&f.s);
    assert_eq!((double, invalid), (0, 0));
}

/// Runs `body` with the stand-in showing two devices (one again after it,
/// whether or not `body` panics), given the IPC handle of a block of device
/// 0's `hostonly` manager, device 1's context and a `hostonly` manager of it;
/// nothing freed twice or by a wrong address.
fn on_two_devices(f: &Fixture, body: impl FnOnce(&IpcHandle, &Context, &HostOnlyManager)) {
    assert_eq!(f.s.control("devices 2").unwrap(), 2);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let m0 = HostOnlyManager::new(&f.ctx).unwrap();
        let a = m0.memalloc(1 << 20).unwrap();
        let h = m0.get_ipc_handle(a.as_view()).unwrap();
        let ctx1 = Context::on_device(1).unwrap();
        let m1 = HostOnlyManager::new(&ctx1).unwrap();
        body(&h, &ctx1, &m1);
        drop(a);
    }));
    f.s.control("devices 1").unwrap();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    let (_, double, invalid) = counters(&f.s);
    assert_eq!((double, invalid), (0, 0));
}

/// Memory of another device opened as a staged copy (NBEP 7 "Staged IPC"):
/// a close whose free the manager refuses returns the refusal and keeps the
/// copy, and the next close frees it.
#[test]
fn a_staged_copy_whose_free_is_refused_stays_for_the_next_close() {
    let f = fixture();
    on_two_devices(&f, |h, ctx1, m1| {
        let mut staged = h.open(ctx1, m1).unwrap();
        assert!(staged.is_staged());
        let held = m1.usage().unwrap().used;
        assert!(
            held >= 1 << 20,
            "the copy is the importing manager's: {held}"
        );
        f.s.control("fail cuMemFreeAsync 1 CUDA_ERROR_UNKNOWN")
            .unwrap();
        let e = staged.close().unwrap_err();
        assert!(e.to_string().contains("cuMemFreeAsync"), "{e}");
        assert!(staged.is_open() && staged.is_staged(), "the copy is kept");
        assert_eq!(m1.usage().unwrap().used, held, "and still the manager's");
        staged.close().unwrap();
        assert!(!staged.is_open());
        assert_eq!(m1.usage().unwrap().used, held - (1 << 20));
    });
}

/// Closing an opened pool pointer waits for its free with the library's own
/// wait: an error another owner's drop recorded on the context is neither
/// returned by the close (which the driver did not refuse) nor lost; the
/// context's next call reports it.
#[test]
fn closing_an_opened_pool_pointer_leaves_other_owners_errors_for_their_next_call() {
    let f = fixture();
    let m = HostOnlyManager::new(&f.ctx).unwrap();
    let a = m.memalloc(1 << 20).unwrap();
    let h = m.get_ipc_handle(a.as_view()).unwrap();
    let mut opened = h.open(&f.ctx, &m).unwrap();
    f.s.control("fail cuStreamDestroy_v2 1 CUDA_ERROR_UNKNOWN")
        .unwrap();
    drop(Stream::new(&f.ctx).unwrap());
    opened.close().unwrap();
    assert!(!opened.is_open());
    let e = f.ctx.synchronize().unwrap_err();
    assert!(e.to_string().contains("cuStreamDestroy"), "{e}");
    f.ctx.synchronize().unwrap();
    drop(a);
}

/// A staged open closes its mapping of the other device's memory once the
/// copy is made; a refusal of that close reaches the caller's context (the
/// one it opened on), not the other device's, which it may never call on.
#[test]
fn a_refused_close_of_a_staged_opens_source_reaches_the_callers_context() {
    let f = fixture();
    on_two_devices(&f, |h, ctx1, m1| {
        // The first stream-ordered free of the open is its source's close.
        f.s.control("fail cuMemFreeAsync 1 CUDA_ERROR_UNKNOWN")
            .unwrap();
        let mut staged = h.open(ctx1, m1).unwrap();
        assert!(staged.is_staged());
        let e = ctx1.synchronize().unwrap_err();
        assert!(e.to_string().contains("cuMemFreeAsync"), "{e}");
        f.ctx.synchronize().unwrap();
        staged.close().unwrap();
    });
}

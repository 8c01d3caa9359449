//! The default manager and a device-only plugin composing `HostOnly`, on a GPU.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use emm_core::{
    conformance, DeferGuard, DeferState, DeviceAllocation, DeviceView, EmmError, HostAllocFlags,
    HostMemory, IpcHandle, MemoryInfo, MemoryManager, Result,
};
use emm_default::{DefaultManager, HostOnly, PendingConfig};
use emm_driver::{memory, Context};
use emm_sys::CUstream;

fn ctx() -> Context {
    Context::on_device(0).expect("device 0")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn default_manager_passes_the_conformance_suite() {
    let ctx = ctx();
    let m = DefaultManager::new(&ctx).unwrap();
    m.initialize().unwrap();
    let report = conformance::run(&m, &ctx);
    print!("{report}");
    assert!(report.all_passed());
    assert!(m.take_release_errors().is_empty());
}

/// A plugin of NBEP 7's "device memory only" kind written the way a user would:
/// `cuMemAlloc` with a finalizer per block, host memory forwarded to `HostOnly`.
struct DeviceOnlyPlugin {
    ctx: Context,
    host: HostOnly,
    defer: Arc<DeferState>,
    allocs: Arc<AtomicUsize>,
    frees: Arc<AtomicUsize>,
}

impl DeviceOnlyPlugin {
    fn new(ctx: &Context) -> Self {
        let defer = DeferState::new();
        DeviceOnlyPlugin {
            ctx: ctx.clone(),
            host: HostOnly::new(ctx, PendingConfig::default(), defer.clone()).unwrap(),
            defer,
            allocs: Arc::new(AtomicUsize::new(0)),
            frees: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl MemoryManager for DeviceOnlyPlugin {
    fn name(&self) -> &str {
        "device-only-test-plugin"
    }
    fn initialize(&self) -> Result<()> {
        Ok(())
    }
    fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
        if size == 0 {
            // SAFETY: owns nothing.
            return Ok(unsafe {
                DeviceAllocation::from_raw_parts(0, 0, emm_core::SYNC_STREAM, |_, _, _| {})
            });
        }
        let ptr = memory::alloc(&self.ctx, size)?;
        self.allocs.fetch_add(1, Ordering::SeqCst);
        let (ctx, frees) = (self.ctx.clone(), self.frees.clone());
        // SAFETY: a fresh cuMemAlloc block, freed once by the finalizer.
        Ok(unsafe {
            DeviceAllocation::from_raw_parts(
                ptr,
                size,
                emm_core::SYNC_STREAM,
                move |p, _, _: CUstream| {
                    // SAFETY: allocated above, freed once.
                    if let Err(e) = memory::free(&ctx, p) {
                        ctx.record_drop_error(e);
                    }
                    frees.fetch_add(1, Ordering::SeqCst);
                },
            )
        })
    }
    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        self.host.memhostalloc(size, flags)
    }
    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        // SAFETY: forwarded.
        unsafe { self.host.mempin(ptr, len, mapped) }
    }
    fn get_memory_info(&self) -> Result<MemoryInfo> {
        let (free, total) = self.ctx.mem_info()?;
        Ok(MemoryInfo { free, total })
    }
    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle> {
        IpcHandle::export_legacy(&self.ctx, view.parent().base().0, view.ptr(), view.len())
    }
    fn reset(&self) -> Result<()> {
        self.host.flush();
        Ok(())
    }
    fn defer_cleanup(&self) -> DeferGuard {
        let host = self.host.clone();
        self.defer.guard(move || host.flush_if_needed())
    }
    fn context(&self) -> Option<&Context> {
        Some(&self.ctx)
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_device_only_plugin_composing_host_only_passes_the_conformance_suite() {
    let ctx = ctx();
    let p = DeviceOnlyPlugin::new(&ctx);
    let report = conformance::run(&p, &ctx);
    print!("{report}");
    // This plugin's reset does not invalidate live blocks (it owns none); the
    // suite's reset check still holds because dropping `held` frees only `held`.
    assert!(report.all_passed());
    // Every finalizer ran exactly once: nothing leaked, nothing freed twice.
    assert_eq!(
        p.allocs.load(Ordering::SeqCst),
        p.frees.load(Ordering::SeqCst)
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn frees_queue_and_flush_past_the_count_threshold() {
    let ctx = ctx();
    let m = DefaultManager::with_config(
        &ctx,
        PendingConfig {
            max_count: 4,
            max_ratio: 0.2,
        },
    )
    .unwrap();
    m.initialize().unwrap();
    let (free_before, _) = ctx.mem_info().unwrap();
    for i in 1..=4 {
        drop(m.memalloc(64 << 20).unwrap());
        assert_eq!(m.pending().0, i, "free {i} is queued, not done");
    }
    // Queued frees still hold device memory: 4 x 64 MiB.
    let (free_queued, _) = ctx.mem_info().unwrap();
    assert!(
        free_before - free_queued >= 4 * (64 << 20) - (2 << 20),
        "{free_before} -> {free_queued}"
    );
    drop(m.memalloc(64 << 20).unwrap()); // the fifth exceeds max_count 4: flush
    assert_eq!(m.pending(), (0, 0));
    let (free_after, _) = ctx.mem_info().unwrap();
    assert!(
        free_after + (2 << 20) >= free_before,
        "flushed memory went back to the device"
    );
    assert!(m.stats().flushes >= 1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn frees_flush_past_the_byte_ratio() {
    let ctx = ctx();
    let total = ctx.device().total_memory().unwrap();
    // 1 MB of pending bytes at most (Numba's test_max_pending_bytes).
    let ratio = 1e6 / total as f64;
    let m = DefaultManager::with_config(
        &ctx,
        PendingConfig {
            max_count: 1000,
            max_ratio: ratio,
        },
    )
    .unwrap();
    m.initialize().unwrap();
    let max = m.config().max_bytes(total);
    drop(m.memalloc(500_000).unwrap());
    assert_eq!(m.pending().0, 1);
    drop(m.memalloc(max - 500_000).unwrap()); // exactly at the limit: no flush
    assert_eq!(m.pending(), (2, max));
    drop(m.memalloc(1).unwrap()); // one byte over: flush
    assert_eq!(m.pending(), (0, 0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn defer_cleanup_holds_flushes_nests_and_survives_a_panic() {
    let ctx = ctx();
    let m = Arc::new(
        DefaultManager::with_config(
            &ctx,
            PendingConfig {
                max_count: 1,
                max_ratio: 0.2,
            },
        )
        .unwrap(),
    );
    m.initialize().unwrap();
    {
        let _outer = m.defer_cleanup();
        {
            let _inner = m.defer_cleanup();
            for _ in 0..3 {
                drop(m.memalloc(1 << 20).unwrap());
            }
            assert_eq!(m.pending().0, 3);
        }
        drop(m.memalloc(1 << 20).unwrap());
        assert_eq!(m.pending().0, 4, "the outer guard still holds flushes");
        assert_eq!(
            m.release_cached().unwrap(),
            0,
            "nothing released while deferred"
        );
    }
    assert_eq!(m.pending().0, 0, "the outermost guard's release flushed");
    let m2 = m.clone();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _g = m2.defer_cleanup();
        drop(m2.memalloc(1 << 20).unwrap());
        drop(m2.memalloc(1 << 20).unwrap());
        panic!("user code failed inside defer_cleanup");
    }));
    assert!(r.is_err());
    assert_eq!(
        m.pending().0,
        0,
        "unwinding released the guard, which flushed"
    );
    drop(m.memalloc(1 << 20).unwrap());
    drop(m.memalloc(1 << 20).unwrap());
    assert_eq!(m.pending().0, 0, "flushing works normally afterwards");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_flushes_retries_then_reports_requested_free_and_total() {
    let ctx = ctx();
    let m = DefaultManager::with_config(
        &ctx,
        PendingConfig {
            max_count: 1_000_000,
            max_ratio: 1.0,
        },
    )
    .unwrap();
    m.initialize().unwrap();
    let (free, total) = ctx.mem_info().unwrap();
    // Fill most of the device with queued (not yet freed) blocks.
    let chunk = 1 << 30;
    let n = free / chunk - 1;
    for _ in 0..n {
        drop(m.memalloc(chunk).unwrap());
    }
    assert_eq!(m.pending().0, n);
    // This only fits if the ladder flushes the queue first.
    let big = m.memalloc(free - (2 << 30)).unwrap();
    assert_eq!(m.pending().0, 0);
    assert!(m.stats().oom_retries >= 1);
    drop(big);
    m.flush();
    // More than the device has: a typed error with the figures.
    let err = m.memalloc(total + (1 << 30)).unwrap_err();
    match &err {
        EmmError::OutOfMemory {
            requested,
            total: t,
            free: f,
            ..
        } => {
            assert_eq!(*requested, total + (1 << 30));
            assert_eq!(*t, total);
            assert!(*f <= total);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("out of device memory in manager `default`: requested"),
        "{err}"
    );
    // The next allocation works.
    let ok = m.memalloc(1 << 20).unwrap();
    assert_eq!(ok.size(), 1 << 20);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_frees_are_queued_with_their_sizes() {
    let ctx = ctx();
    let m = DefaultManager::with_config(
        &ctx,
        PendingConfig {
            max_count: 100,
            max_ratio: 0.2,
        },
    )
    .unwrap();
    m.initialize().unwrap();
    let host = m.host().unwrap();
    drop(m.memhostalloc(4096, HostAllocFlags::default()).unwrap());
    drop(
        m.memhostalloc(
            8192,
            HostAllocFlags {
                mapped: true,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    assert_eq!(
        host.pending(),
        (2, 4096 + 8192),
        "numba#9507: sizes are tracked"
    );
    assert_eq!(m.release_cached().unwrap(), 4096 + 8192);
    assert_eq!(host.pending(), (0, 0));
    // Pinning the same buffer again and again works (unpinning is not deferred).
    let mut buf = vec![0u8; 1 << 16];
    let _g = m.defer_cleanup();
    for _ in 0..3 {
        // SAFETY: `buf` outlives each pin.
        let p = unsafe { m.mempin(buf.as_mut_ptr(), buf.len(), true) }.unwrap();
        assert!(p.device_ptr().is_some());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reset_frees_everything_and_invalidates_live_blocks() {
    let ctx = ctx();
    let m = DefaultManager::new(&ctx).unwrap();
    m.initialize().unwrap();
    let (free0, _) = ctx.mem_info().unwrap();
    let held: Vec<_> = (0..4).map(|_| m.memalloc(256 << 20).unwrap()).collect();
    drop(m.memalloc(256 << 20).unwrap()); // queued
    m.reset().unwrap();
    let (free1, _) = ctx.mem_info().unwrap();
    assert!(
        free1 + (4 << 20) >= free0,
        "reset returned all memory: {free0} -> {free1}"
    );
    assert_eq!(m.stats().live, 0);
    let fresh = m.memalloc(256 << 20).unwrap();
    drop(held); // invalidated: must not free `fresh`, which may reuse an address
    let data = vec![0x5Au8; 4096];
    // SAFETY: `fresh` holds 256 MiB.
    unsafe { memory::copy_htod(&ctx, fresh.ptr(), &data) }.unwrap();
    assert!(m.take_release_errors().is_empty());
    assert_eq!(m.stats().live, 1);
}

/// Cross-process IPC of a sub-allocation view: the child opens the handle, checks
/// the parent's bytes at the view's offset, and writes its own.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ipc_round_trip_of_a_view_across_processes() {
    let ctx = ctx();
    let m = DefaultManager::new(&ctx).unwrap();
    m.initialize().unwrap();
    let block = m.memalloc(1 << 20).unwrap();
    let pattern: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: `block` holds 1 MiB.
    unsafe { memory::copy_htod(&ctx, block.ptr(), &pattern) }.unwrap();
    let view = block.view(4096, 8192).unwrap();
    let handle = m.get_ipc_handle(view).unwrap();
    assert_eq!((handle.offset(), handle.size()), (4096, 8192));
    let text = emm_core::conformance::run_child_test("ipc_child_process", &handle)
        .unwrap_or_else(|t| panic!("child failed:\n{t}"));
    assert!(text.contains("child: verified 8192 bytes"), "{text}");
    let mut back = vec![0u8; 1 << 20];
    // SAFETY: `block` holds 1 MiB.
    unsafe { memory::copy_dtoh(&ctx, &mut back, block.ptr()) }.unwrap();
    assert!(
        back[4096..4096 + 8192].iter().all(|&b| b == 0xC5),
        "the child's write is visible"
    );
    assert_eq!(
        &back[..4096],
        &pattern[..4096],
        "bytes before the view untouched"
    );
    assert_eq!(
        &back[4096 + 8192..],
        &pattern[4096 + 8192..],
        "bytes after the view untouched"
    );
}

/// The child half of `ipc_round_trip_of_a_view_across_processes`; does nothing
/// unless started by it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ipc_child_process() {
    let Some(handle) = emm_core::conformance::child_handle() else {
        return; // not started by the parent test: nothing to do
    };
    let handle = handle.unwrap();
    let ctx = ctx();
    let m = DefaultManager::new(&ctx).unwrap();
    m.initialize().unwrap();
    let mut mem = handle.open(&ctx, &m).unwrap();
    assert!(!mem.is_staged());
    let mut got = vec![0u8; 8192];
    // SAFETY: the mapping covers 8192 bytes.
    unsafe { memory::copy_dtoh(&ctx, &mut got, mem.ptr()) }.unwrap();
    let want: Vec<u8> = (4096..4096 + 8192).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        got, want,
        "the child sees the parent's bytes at the view's offset"
    );
    // SAFETY: as above.
    unsafe { memory::memset_d8(&ctx, mem.ptr(), 0xC5, 8192) }.unwrap();
    ctx.synchronize().unwrap();
    mem.close().unwrap();
    println!("child: verified 8192 bytes");
}

/// Garbled handles never reach the driver; a well-formed handle with a foreign
/// driver handle is a typed driver error, not a crash.
#[test]
#[ignore = "needs a CUDA GPU"]
fn foreign_ipc_handles_are_typed_errors() {
    let ctx = ctx();
    let m = DefaultManager::new(&ctx).unwrap();
    let forged = IpcHandle::Legacy {
        handle: [0xAB; 64],
        base_size: 1 << 20,
        offset: 0,
        size: 4096,
        device_uuid: ctx.device().uuid().unwrap(),
        pid: 1,
    };
    let err = forged.open(&ctx, &m).unwrap_err();
    assert!(matches!(err, EmmError::Driver(_)), "{err:?}");
    let err = IpcHandle::from_bytes(b"definitely not a handle").unwrap_err();
    assert!(matches!(err, EmmError::InvalidIpcHandle { .. }));
}

/// Two GPUs: one manager per device, and staged IPC from GPU 0 to GPU 1.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_one_manager_each_and_staged_ipc() {
    let n = emm_driver::Device::count().unwrap();
    assert!(n >= 2, "this test needs two GPUs, found {n}");
    let router = emm_core::Router::new();
    router.register("default", |c: &Context| -> Result<Arc<dyn MemoryManager>> {
        Ok(Arc::new(DefaultManager::new(c)?))
    });
    // The process default is `pool`, which this crate's router does not know.
    router.set_memory_manager("default").unwrap();
    let c0 = Context::on_device(0).unwrap();
    let c1 = Context::on_device(1).unwrap();
    let m0 = router.manager(&c0).unwrap();
    let m1 = router.manager(&c1).unwrap();
    assert!(!Arc::ptr_eq(&m0, &m1));
    assert!(Arc::ptr_eq(&m0, &router.manager(&c0).unwrap()));
    let a0 = m0.memalloc(1 << 20).unwrap();
    let a1 = m1.memalloc(1 << 20).unwrap();
    // SAFETY: each allocation holds 1 MiB in its own context.
    unsafe {
        memory::copy_htod(&c0, a0.ptr(), &vec![1u8; 1 << 20]).unwrap();
        memory::copy_htod(&c1, a1.ptr(), &vec![2u8; 1 << 20]).unwrap();
    }
    let pattern: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
    // SAFETY: 1 MiB.
    unsafe { memory::copy_htod(&c0, a0.ptr(), &pattern) }.unwrap();
    let handle = m0.get_ipc_handle(a0.view(65_536, 65_536).unwrap()).unwrap();
    let text = emm_core::conformance::run_child_test("staged_ipc_child_process", &handle)
        .unwrap_or_else(|t| panic!("child failed:\n{t}"));
    assert!(text.contains("child: staged 65536 bytes intact"), "{text}");
}

/// The child half of `two_gpus_one_manager_each_and_staged_ipc`: opens a GPU-0
/// handle on GPU 1.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn staged_ipc_child_process() {
    let Some(handle) = emm_core::conformance::child_handle() else {
        return; // not started by the parent test: nothing to do
    };
    let handle = handle.unwrap();
    let c1 = Context::on_device(1).unwrap();
    let m1 = DefaultManager::new(&c1).unwrap();
    m1.initialize().unwrap();
    let live_before = m1.stats().live;
    let mem = handle.open(&c1, &m1).unwrap();
    assert!(mem.is_staged(), "GPU 0 memory opened on GPU 1 is staged");
    assert_eq!(
        m1.stats().live,
        live_before + 1,
        "the staging buffer belongs to GPU 1's manager"
    );
    let mut got = vec![0u8; 65_536];
    // SAFETY: the staging buffer holds 65536 bytes on GPU 1.
    unsafe { memory::copy_dtoh(&c1, &mut got, mem.ptr()) }.unwrap();
    let want: Vec<u8> = (65_536..131_072).map(|i| (i % 253) as u8).collect();
    assert_eq!(got, want);
    drop(mem);
    assert_eq!(
        m1.stats().live,
        live_before,
        "the staging buffer went back once"
    );
    println!("child: staged 65536 bytes intact");
}

//! Managed memory of every built-in manager on a GPU: the host writes through the
//! address, the device reads it (a copy) and writes it (a memset, a kernel), and
//! the host reads the result; the driver confirms the memory is managed.
//!
//! Every manager must serve it here (the conformance suite also accepts a typed
//! "unsupported"; the built-in managers do not say that).

use core::ffi::c_void;

use emm::{Context, MemoryManager, Stream};
use emm_core::{ManagedAttach, ManagedMemory};
use emm_default::DefaultManager;
use emm_driver::{memory, LaunchConfig, Module};
use emm_hostonly::HostOnlyManager;
use emm_pool::PoolManager;
use emm_sys::CUpointer_attribute;

const PTX: &str = include_str!("../../../kernels/saxpy.ptx");
const MANAGERS: [&str; 3] = ["default", "pool", "hostonly"];

fn ctx() -> Context {
    Context::on_device(0).expect("device 0")
}

fn manager(name: &str, ctx: &Context) -> Box<dyn MemoryManager> {
    let m: Box<dyn MemoryManager> = match name {
        "default" => Box::new(DefaultManager::new(ctx).unwrap()),
        "pool" => Box::new(PoolManager::new(ctx).unwrap()),
        _ => Box::new(HostOnlyManager::new(ctx).unwrap()),
    };
    m.initialize().unwrap();
    m
}

/// Writes `v` through the host's view of managed memory (callers make sure nothing
/// runs on a device without concurrent managed access).
fn write_floats(a: &ManagedMemory, v: &[f32]) {
    assert!(v.len() * 4 <= a.size() && a.ptr() % 4 == 0);
    // SAFETY: `a` holds at least `v.len()` floats, 4-byte aligned (256 in fact),
    // host-accessible (managed memory).
    unsafe { core::ptr::copy_nonoverlapping(v.as_ptr(), a.host_ptr().cast::<f32>(), v.len()) };
}

/// Reads every float of managed memory through the host's view (as above).
fn read_floats(a: &ManagedMemory) -> Vec<f32> {
    assert_eq!(a.ptr() % 4, 0);
    // SAFETY: as in `write_floats`; copied out at once.
    unsafe { core::slice::from_raw_parts(a.host_ptr().cast::<f32>(), a.size() / 4) }.to_vec()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn managed_memory_is_one_address_for_the_host_and_the_device() {
    let ctx = ctx();
    let dev = ctx.device();
    assert!(dev.supports_managed_memory().unwrap());
    println!(
        "concurrent managed access: {}",
        dev.concurrent_managed_access().unwrap()
    );
    for name in MANAGERS {
        let m = manager(name, &ctx);
        let device_stats = m.stats();
        for attach in [ManagedAttach::Global, ManagedAttach::Host] {
            let n = (4 << 20) + 12;
            let a = m
                .memallocmanaged(n, attach)
                .unwrap_or_else(|e| panic!("{name} {attach:?}: {e}"));
            let is_managed =
                memory::pointer_attribute_u64(&ctx, CUpointer_attribute::IS_MANAGED, a.ptr())
                    .unwrap();
            assert_eq!(
                is_managed & 0xFFFF_FFFF,
                1,
                "{name}: the driver says not managed"
            );
            ctx.synchronize().unwrap();
            // The host writes, the device reads.
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            // SAFETY: `n` host-accessible bytes; nothing runs on the device.
            unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), a.host_ptr(), n) };
            let mut back = vec![0u8; n];
            // SAFETY: `a` holds `n` bytes.
            unsafe { memory::copy_dtoh(&ctx, &mut back, a.ptr()) }.unwrap();
            assert!(
                back == data,
                "{name} {attach:?}: a device copy of host writes differs"
            );
            // The device writes, the host reads.
            // SAFETY: as above.
            unsafe { memory::memset_d8(&ctx, a.ptr() + 5, 0x3C, n - 10) }.unwrap();
            ctx.synchronize().unwrap();
            // SAFETY: `n` bytes the host may read now.
            let host = unsafe { core::slice::from_raw_parts(a.host_ptr(), n) };
            assert_eq!(&host[..5], &data[..5], "{name}: memset overran its start");
            assert_eq!(
                &host[n - 5..],
                &data[n - 5..],
                "{name}: memset overran its end"
            );
            assert!(
                host[5..n - 5].iter().all(|&b| b == 0x3C),
                "{name} {attach:?}"
            );
            assert_eq!(m.managed_stats().allocated_bytes, n, "{name}");
        }
        assert_eq!(m.managed_stats().allocated_bytes, 0, "{name}");
        assert_eq!(
            m.stats().allocated_bytes,
            device_stats.allocated_bytes,
            "{name}"
        );
        m.release_cached().unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_writes_global_managed_memory_that_the_host_reads() {
    saxpy_on_managed_memory(ManagedAttach::Global);
}

/// Host-attached memory is for kernels only where the device has concurrent
/// managed access (compute capability 6.0 and later on Linux). Kept apart from the
/// global case because compute-sanitizer's memcheck cannot follow a kernel into
/// host-attached memory: a plain CUDA program (`cuMemAllocManaged` with
/// `CU_MEM_ATTACH_HOST`, a kernel, the host reading back) fails under memcheck
/// too, and runs correctly without it (docs/gpu-verification.md, run 55).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_writes_host_attached_managed_memory_that_the_host_reads() {
    let ctx = ctx();
    if !ctx.device().concurrent_managed_access().unwrap() {
        println!("no concurrent managed access: a kernel may not touch host-attached memory here");
        return;
    }
    drop(ctx);
    saxpy_on_managed_memory(ManagedAttach::Host);
}

/// saxpy on two managed arrays of every manager, attached as `attach`, written and
/// read back by the host.
fn saxpy_on_managed_memory(attach: ManagedAttach) {
    let ctx = ctx();
    let module = Module::load_ptx(&ctx, PTX).unwrap();
    let saxpy = module.function("saxpy").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    for name in MANAGERS {
        let m = manager(name, &ctx);
        let n = 1_000_003usize;
        let x = m.memallocmanaged(n * 4, attach).unwrap();
        let y = m.memallocmanaged(n * 4, attach).unwrap();
        let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
        let ys: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
        write_floats(&x, &xs);
        write_floats(&y, &ys);
        let (mut py, mut px, mut pa, mut pn) = (y.ptr(), x.ptr(), 3.0f32, n as u32);
        let mut params = [
            (&mut py as *mut u64).cast::<c_void>(),
            (&mut px as *mut u64).cast(),
            (&mut pa as *mut f32).cast(),
            (&mut pn as *mut u32).cast(),
        ];
        // SAFETY: saxpy(u64 y, u64 x, f32 a, u32 n) over n floats of x and y,
        // which live until after the synchronize below.
        unsafe { saxpy.launch(LaunchConfig::for_elements(n, 256), &stream, &mut params) }.unwrap();
        stream.synchronize().unwrap();
        ctx.synchronize().unwrap();
        let got = read_floats(&y);
        // The kernel's fused multiply-add, on the host.
        let bad = (0..n).find(|&i| got[i] != 3.0f32.mul_add(xs[i], ys[i]));
        assert!(
            bad.is_none(),
            "{name} {attach:?}: y[{bad:?}] is {:?} after saxpy",
            bad.map(|i| got[i])
        );
        // A device copy of the kernel's output agrees with the host's view.
        let mut back = vec![0u8; 64];
        // SAFETY: y holds n * 4 >= 64 bytes.
        unsafe { memory::copy_dtoh(&ctx, &mut back, y.ptr()) }.unwrap();
        let first = f32::from_le_bytes([back[4], back[5], back[6], back[7]]);
        assert_eq!(first, got[1], "{name}");
        m.release_cached().unwrap();
    }
}

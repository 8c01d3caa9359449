//! The blog's test on a GPU: fill on the host, move to the device, a kernel adds the
//! sum of each element's indices, move back, compare with the host's own result; for
//! every kernel type and ranks 1 to 3. Memory comes from emm's pool.

use core::ffi::c_void;
use std::sync::Arc;

use emm_array::{Element, KernelIndexer, MemArray, Side};
use emm_core::MemoryManager;
use emm_driver::{Context, LaunchConfig, Module, Stream};

const PTX: &str = include_str!("../../../kernels/memarray.ptx");

trait FromIndex: Element {
    fn from_f64(v: f64) -> Self;
}
macro_rules! from_index {
    ($($t:ty),*) => {$( impl FromIndex for $t { fn from_f64(v: f64) -> Self { v as $t } } )*};
}
from_index!(i32, i64, f32, f64);
impl FromIndex for u8 {
    fn from_f64(v: f64) -> Self {
        // The kernel's integer conversions wrap modulo 256.
        (v as i64).rem_euclid(256) as u8
    }
}

fn run<T: FromIndex, const N: usize>(
    kernel: &str,
    shape: [usize; N],
    m: &Arc<dyn MemoryManager>,
    ctx: &Context,
    module: &Module,
    stream: &Arc<Stream>,
) {
    let a = MemArray::<T, N>::new(shape, m.clone(), ctx).unwrap();
    let ix = a.indexer();
    a.with_host_mut(|s| {
        for (i, v) in s.iter_mut().enumerate() {
            *v = T::from_f64((i % 97) as f64);
        }
    })
    .unwrap();
    assert!(a.move_to(Side::Device, Some(stream), false).unwrap());
    assert!(
        !a.move_to(Side::Device, Some(stream), false).unwrap(),
        "already on the device: no copy"
    );
    assert!(
        a.get([0; N]).is_err(),
        "host access while the device copy is current is an error"
    );
    let f = module.function(kernel).unwrap();
    let (mut p, mut k, mut n): (u64, KernelIndexer, i64) =
        (a.data_ptr(), ix.to_kernel().unwrap(), ix.len() as i64);
    let mut params = [
        (&mut p as *mut u64).cast::<c_void>(),
        (&mut k as *mut KernelIndexer).cast(),
        (&mut n as *mut i64).cast(),
    ];
    // SAFETY: (T*, Indexer by value, int64) as in kernels/memarray.cu; the device
    // copy holds `len` elements until the array moves back after the stream syncs.
    unsafe {
        f.launch(
            LaunchConfig::for_elements(ix.len(), 128),
            stream,
            &mut params,
        )
    }
    .unwrap();
    assert!(a.move_to(Side::Host, Some(stream), true).unwrap());
    a.with_host(|s| {
        for (i, got) in s.iter().enumerate() {
            let idx = ix.multi(i).unwrap();
            let want = T::from_f64((i % 97) as f64 + idx.iter().sum::<usize>() as f64);
            assert_eq!(*got, want, "{kernel} shape {shape:?} at {idx:?}");
        }
    })
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_adds_index_sums_for_every_type_and_rank() {
    let ctx = Context::on_device(0).unwrap();
    ctx.set_current().unwrap();
    let m: Arc<dyn MemoryManager> = Arc::new(emm_pool::PoolManager::new(&ctx).unwrap());
    let module = Module::load_ptx(&ctx, PTX).unwrap();
    let stream = std::sync::Arc::new(Stream::new(&ctx).unwrap());
    macro_rules! all_ranks {
        ($t:ty, $k:expr) => {
            run::<$t, 1>($k, [1000], &m, &ctx, &module, &stream);
            run::<$t, 2>($k, [37, 41], &m, &ctx, &module, &stream);
            run::<$t, 3>($k, [7, 11, 13], &m, &ctx, &module, &stream);
        };
    }
    all_ranks!(i32, "add_index_sum_i32");
    all_ranks!(i64, "add_index_sum_i64");
    all_ranks!(f32, "add_index_sum_f32");
    all_ranks!(f64, "add_index_sum_f64");
    all_ranks!(u8, "add_index_sum_u8");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_device_export_is_zero_copy_and_locks_the_array() {
    let ctx = Context::on_device(0).unwrap();
    let m: Arc<dyn MemoryManager> = Arc::new(emm_pool::PoolManager::new(&ctx).unwrap());
    let a = MemArray::<f32, 2>::new([64, 64], m, &ctx).unwrap();
    a.move_to(Side::Device, None, true).unwrap();
    let t = a.to_dlpack().unwrap();
    // SAFETY: a fresh export, released once below.
    unsafe {
        assert_eq!(
            (*t).dl_tensor.device.device_type,
            emm_array::dlpack::KDL_CUDA
        );
        assert_eq!((*t).dl_tensor.data as u64, a.data_ptr());
        assert!(
            a.move_to(Side::Host, None, true).is_err(),
            "locked while exported"
        );
        ((*t).deleter.unwrap())(t);
    }
    assert!(a.move_to(Side::Host, None, true).unwrap());
    assert_eq!(a.deleters_run(), 1);
}

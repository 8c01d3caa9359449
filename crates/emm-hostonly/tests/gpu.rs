//! The hostonly plugin on a GPU.

use core::ffi::c_void;

use emm_core::{conformance, IpcHandle, MemoryManager};
use emm_driver::{memory, Context, LaunchConfig, Module, Stream};
use emm_hostonly::{HostOnlyConfig, HostOnlyManager};

const PTX: &str = include_str!("../../../kernels/saxpy.ptx");

fn ctx() -> Context {
    Context::on_device(0).expect("device 0")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn hostonly_passes_the_conformance_suite() {
    let ctx = ctx();
    let m = HostOnlyManager::new(&ctx).unwrap();
    let report = conformance::run(&m, &ctx);
    print!("{report}");
    assert!(report.all_passed());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernels_on_several_streams_write_and_read_their_allocations() {
    let ctx = ctx();
    let m = HostOnlyManager::new(&ctx).unwrap();
    let module = Module::load_ptx(&ctx, PTX).unwrap();
    let xor = module.function("xor_words").unwrap();
    let streams: Vec<Stream> = (0..4).map(|_| Stream::new(&ctx).unwrap()).collect();
    for round in 0..20u32 {
        let mut blocks = Vec::new();
        for (i, s) in streams.iter().enumerate() {
            let n = 1000 + 4096 * i + round as usize;
            let a = m.memalloc_async(n * 4, s.raw()).unwrap();
            // SAFETY: n words, alive until the stream synchronizes.
            unsafe { memory::memset_d32_async(a.ptr(), round, n, s) }.unwrap();
            let (mut p, mut key, mut count) = (a.ptr(), 0xFFFF_0000u32 + i as u32, n as u64);
            let mut params = [
                (&mut p as *mut u64).cast::<c_void>(),
                (&mut key as *mut u32).cast(),
                (&mut count as *mut u64).cast(),
            ];
            // SAFETY: xor_words(u64, u32, u64) over n words of `a`.
            unsafe { xor.launch(LaunchConfig::for_elements(n, 256), s, &mut params) }.unwrap();
            blocks.push((a, n, round ^ (0xFFFF_0000 + i as u32)));
        }
        for ((a, n, want), s) in blocks.iter().zip(&streams) {
            let mut back = vec![0u32; *n];
            // SAFETY: n words; synchronized below.
            unsafe { memory::copy_dtoh_async(back.as_mut_ptr().cast(), a.ptr(), n * 4, s) }
                .unwrap();
            s.synchronize().unwrap();
            assert!(back.iter().all(|w| w == want), "round {round}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn trim_returns_memory_to_the_device() {
    let ctx = ctx();
    let m = HostOnlyManager::with_config(
        &ctx,
        HostOnlyConfig {
            release_threshold: u64::MAX,
        },
    )
    .unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let held: Vec<_> = (0..4)
        .map(|_| m.memalloc_async(512 << 20, stream.raw()).unwrap())
        .collect();
    stream.synchronize().unwrap();
    let stats = m.stats();
    assert_eq!(
        (stats.allocations, stats.allocated_bytes),
        (4, 4 * (512 << 20)),
        "{stats:?}"
    );
    drop(held);
    stream.synchronize().unwrap();
    let u = m.usage().unwrap();
    assert!(
        u.reserved >= 2 << 30,
        "the pool keeps what was freed: {u:?}"
    );
    let (free_before, _) = ctx.mem_info().unwrap();
    let released = m.trim(0).unwrap();
    let (free_after, _) = ctx.mem_info().unwrap();
    assert!(released >= 2 << 30, "{released}");
    assert!(
        free_after >= free_before + (2 << 30) - (64 << 20),
        "{free_before} -> {free_after}"
    );
    assert_eq!(m.usage().unwrap().reserved, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mempool_ipc_round_trip_across_processes() {
    let ctx = ctx();
    let m = HostOnlyManager::new(&ctx).unwrap();
    let block = m.memalloc(1 << 20).unwrap();
    let pattern: Vec<u8> = (0..(1 << 20)).map(|i| (i * 13 % 241) as u8).collect();
    // SAFETY: 1 MiB.
    unsafe { memory::copy_htod(&ctx, block.ptr(), &pattern) }.unwrap();
    let handle = m.get_ipc_handle(block.view(8192, 4096).unwrap()).unwrap();
    assert!(matches!(handle, IpcHandle::MemPool { .. }));
    let text = emm_core::conformance::run_child_test("mempool_ipc_child_process", &handle)
        .unwrap_or_else(|t| panic!("child failed:\n{t}"));
    assert!(text.contains("child: mempool view verified"), "{text}");
    let mut back = vec![0u8; 1 << 20];
    // SAFETY: 1 MiB.
    unsafe { memory::copy_dtoh(&ctx, &mut back, block.ptr()) }.unwrap();
    assert!(
        back[8192..8192 + 4096].iter().all(|&b| b == 0x3C),
        "the child's write is visible"
    );
    assert_eq!(&back[..8192], &pattern[..8192]);
}

/// The child half of `mempool_ipc_round_trip_across_processes`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn mempool_ipc_child_process() {
    let Some(handle) = emm_core::conformance::child_handle() else {
        return; // not started by the parent test: nothing to do
    };
    let handle = handle.unwrap();
    let ctx = ctx();
    let m = HostOnlyManager::new(&ctx).unwrap();
    let mem = handle.open(&ctx, &m).unwrap();
    let mut got = vec![0u8; 4096];
    // SAFETY: the mapping covers 4096 bytes.
    unsafe { memory::copy_dtoh(&ctx, &mut got, mem.ptr()) }.unwrap();
    let want: Vec<u8> = (8192..8192 + 4096).map(|i| (i * 13 % 241) as u8).collect();
    assert_eq!(got, want);
    // SAFETY: as above.
    unsafe { memory::memset_d8(&ctx, mem.ptr(), 0x3C, 4096) }.unwrap();
    ctx.synchronize().unwrap();
    drop(mem);
    println!("child: mempool view verified");
}

//! The pool on a GPU: conformance, a 16-thread stress test, out of memory, trim.

use emm_core::{conformance, EmmError, MemoryManager};
use emm_driver::{memory, Context, Stream};
use emm_pool::{PoolConfig, PoolManager, PoolUpstream, SegmentPolicy};

fn ctx() -> Context {
    Context::on_device(0).expect("device 0")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_passes_the_conformance_suite() {
    let ctx = ctx();
    for expandable in [true, false] {
        let cfg = PoolConfig {
            segments: SegmentPolicy {
                expandable,
                ..SegmentPolicy::default()
            },
            ..PoolConfig::default()
        };
        let pool = PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), cfg).unwrap();
        let report = conformance::run(&pool, &ctx);
        print!("expandable {expandable}:\n{report}");
        assert!(report.all_passed(), "expandable {expandable}");
        pool.check().unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sixteen_threads_random_sizes_and_streams_keep_their_data() {
    let ctx = ctx();
    let pool = PoolManager::new(&ctx).unwrap();
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16u32)
            .map(|t| {
                let (pool, ctx) = (&pool, &ctx);
                s.spawn(move || -> Result<(), String> {
                    ctx.set_current().map_err(|e| e.to_string())?;
                    let streams: Vec<Stream> = (0..3).map(|_| Stream::new(ctx).unwrap()).collect();
                    let mut x = 0x9E37_79B9u64 ^ u64::from(t);
                    let mut held = Vec::new();
                    for i in 0..400u32 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let size =
                            4 + (x % (if x % 16 == 0 { 48 << 20 } else { 200_000 })) as usize;
                        let stream = &streams[(x >> 20) as usize % 3];
                        let a = pool
                            .memalloc_async(size, stream.raw())
                            .map_err(|e| e.to_string())?;
                        let word = (t << 24) | i;
                        // SAFETY: `a` holds at least size/4 words until it is dropped,
                        // which happens after the check below synchronizes.
                        unsafe { memory::memset_d32_async(a.ptr(), word, size / 4, stream) }
                            .map_err(|e| e.to_string())?;
                        held.push((a, word, stream));
                        if held.len() > 6 || x % 3 == 0 {
                            let (a, word, stream) = held.remove((x as usize >> 8) % held.len());
                            let n = a.size() / 4;
                            let mut back = vec![0u32; n];
                            // SAFETY: `back` holds n words; synchronized below.
                            unsafe {
                                memory::copy_dtoh_async(
                                    back.as_mut_ptr().cast(),
                                    a.ptr(),
                                    n * 4,
                                    stream,
                                )
                            }
                            .map_err(|e| e.to_string())?;
                            stream.synchronize().map_err(|e| e.to_string())?;
                            if let Some(bad) = back.iter().position(|&w| w != word) {
                                return Err(format!(
                                    "thread {t}: block of {} bytes overwritten at word {bad}",
                                    a.size()
                                ));
                            }
                        }
                    }
                    for s in &streams {
                        s.synchronize().map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().unwrap().err())
            .collect()
    });
    assert!(errors.is_empty(), "{errors:?}");
    pool.check().unwrap();
    let st = pool.stats();
    assert!(st.allocations >= 16 * 400);
    assert!(st.thread_cache_hits + st.shared_hits as u64 > 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_is_typed_releases_the_cache_and_the_next_allocation_works() {
    let ctx = ctx();
    let pool = PoolManager::new(&ctx).unwrap();
    // Fill the cache with freed blocks.
    let held: Vec<_> = (0..8).map(|_| pool.memalloc(1 << 30).unwrap()).collect();
    drop(held);
    let reserved = pool.stats().reserved_bytes;
    assert!(reserved >= 8 << 30);
    let (_, total) = ctx.mem_info().unwrap();
    let err = pool.memalloc(total + (1 << 30)).unwrap_err();
    match &err {
        EmmError::OutOfMemory {
            requested,
            total: t,
            detail,
            ..
        } => {
            assert_eq!(*requested, total + (1 << 30));
            assert_eq!(*t, total);
            assert!(detail.contains("largest free block"), "{detail}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        pool.stats().reserved_bytes < reserved,
        "the ladder released cached segments"
    );
    let ok = pool.memalloc(1 << 30).unwrap();
    assert_eq!(ok.size(), 1 << 30);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn trim_gives_every_byte_back_to_the_device() {
    let ctx = ctx();
    ctx.synchronize().unwrap();
    let (free0, _) = ctx.mem_info().unwrap();
    {
        let pool = PoolManager::new(&ctx).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let mut held = Vec::new();
        for i in 0..200usize {
            held.push(
                pool.memalloc_async(1000 + i * 37_000, stream.raw())
                    .unwrap(),
            );
            if i % 3 == 0 {
                held.swap_remove(i % held.len());
            }
        }
        held.push(pool.memalloc(300 << 20).unwrap());
        let (free_mid, _) = ctx.mem_info().unwrap();
        assert!(free_mid < free0);
        drop(held);
        stream.synchronize().unwrap();
        pool.trim();
        assert_eq!(pool.stats().reserved_bytes, 0, "{:?}", pool.stats());
        let (free1, _) = ctx.mem_info().unwrap();
        assert!(
            free1 + (2 << 20) >= free0,
            "free memory {free0} -> {free1} after trim"
        );
    }
}

/// `trim` (PyTorch's `empty_cache`) gives the idle middle of the expandable
/// segment back to the device while live blocks on both sides keep their data,
/// and the next allocation maps memory there again.
#[test]
#[ignore = "needs a CUDA GPU"]
fn trim_gives_back_the_idle_middle_and_live_blocks_keep_their_data() {
    const MIB: usize = 1 << 20;
    let ctx = ctx();
    let pool = PoolManager::new(&ctx).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let first = pool.memalloc_async(8 * MIB, stream.raw()).unwrap();
    let middle = pool.memalloc_async(512 * MIB, stream.raw()).unwrap();
    let last = pool.memalloc_async(8 * MIB, stream.raw()).unwrap();
    // SAFETY: both blocks are live and 8 MiB long.
    unsafe {
        memory::memset_d8(&ctx, first.ptr(), 0xA5, 8 * MIB).unwrap();
        memory::memset_d8(&ctx, last.ptr(), 0x5A, 8 * MIB).unwrap();
    }
    drop(middle);
    stream.synchronize().unwrap();
    let reserved = pool.stats().reserved_bytes;
    let (free0, _) = ctx.mem_info().unwrap();
    let released = pool.trim();
    let (free1, _) = ctx.mem_info().unwrap();
    assert!(released >= 500 * MIB, "released {released}");
    assert_eq!(pool.stats().reserved_bytes, reserved - released);
    assert!(
        free1 >= free0 + 500 * MIB,
        "the device's free memory went {free0} -> {free1}"
    );
    pool.check().unwrap();
    for (a, byte) in [(&first, 0xA5u8), (&last, 0x5A)] {
        let mut back = vec![0u8; 8 * MIB];
        // SAFETY: `back` holds 8 MiB; `a` is live and as long.
        unsafe { memory::copy_dtoh(&ctx, &mut back, a.ptr()) }.unwrap();
        assert!(
            back.iter().all(|&b| b == byte),
            "a live block lost its data"
        );
    }
    let again = pool.memalloc_async(512 * MIB, stream.raw()).unwrap();
    // SAFETY: `again` is live and 512 MiB long.
    unsafe { memory::memset_d8(&ctx, again.ptr(), 1, 512 * MIB) }.unwrap();
    pool.check().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_block_freed_on_one_stream_is_reused_on_another_only_after_its_event() {
    let ctx = ctx();
    // One shared pool: stream pools (the default) keep each created stream's
    // large blocks apart, so no block would pass between s1 and s2.
    let cfg = PoolConfig {
        thread_cache_blocks: 0,
        stream_pools: 0,
        ..PoolConfig::default()
    };
    let pool = PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), cfg).unwrap();
    let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let a = pool.memalloc_async(4 << 20, s1.raw()).unwrap();
    let addr = a.ptr();
    drop(a);
    // Same stream: reused at once.
    let b = pool.memalloc_async(4 << 20, s1.raw()).unwrap();
    assert_eq!(b.ptr(), addr);
    drop(b);
    s1.synchronize().unwrap();
    // Another stream: only through an event (recorded and, here, already complete).
    let c = pool.memalloc_async(4 << 20, s2.raw()).unwrap();
    assert_eq!(
        c.ptr(),
        addr,
        "an idle stream's block is reused after its event"
    );
    assert!(pool.stats().counts.cross_stream_reuses >= 1);
}

fn exportable_pool(ctx: &Context) -> PoolManager {
    let cfg = PoolConfig {
        exportable: true,
        ..PoolConfig::default()
    };
    PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), cfg).unwrap()
}

fn vmm_pattern(i: usize) -> u8 {
    (i * 11 % 239) as u8
}

/// Cross-process IPC of a view into a block of the expandable segment, exported
/// by file descriptor (`IpcHandle::Vmm`): the child takes the pieces' descriptors
/// with `pidfd_getfd`, maps them, checks the parent's bytes and writes its own.
/// Needs Linux 5.6+ and ptrace permission over the parent (the child is its
/// descendant: Yama scopes 0 and 1 allow it).
#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_ipc_round_trip_across_processes() {
    let ctx = ctx();
    let pool = exportable_pool(&ctx);
    let n = 48 << 20;
    let block = pool.memalloc(n).unwrap();
    let data: Vec<u8> = (0..n).map(vmm_pattern).collect();
    // SAFETY: `block` holds `n` bytes.
    unsafe { memory::copy_htod(&ctx, block.ptr(), &data) }.unwrap();
    let (off, len) = (3 << 20, 40 << 20);
    let handle = pool.get_ipc_handle(block.view(off, len).unwrap()).unwrap();
    let emm_core::IpcHandle::Vmm { pieces, .. } = &handle else {
        panic!("expected a virtual-memory handle, got {handle:?}");
    };
    println!("{} pieces behind the view", pieces.len());
    let text = conformance::run_child_test("vmm_ipc_child_process", &handle)
        .unwrap_or_else(|t| panic!("child failed:\n{t}"));
    assert!(text.contains("child: vmm view verified"), "{text}");
    let mut back = vec![0u8; n];
    // SAFETY: as above.
    unsafe { memory::copy_dtoh(&ctx, &mut back, block.ptr()) }.unwrap();
    assert!(
        back[off..off + len].iter().all(|&b| b == 0x6B),
        "the child's write is visible"
    );
    assert_eq!(back[..off], data[..off], "bytes before the view untouched");
    assert_eq!(back[off + len..], data[off + len..], "bytes after it too");
    pool.check().unwrap();
}

/// The child half of `vmm_ipc_round_trip_across_processes`; does nothing unless
/// started by it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_ipc_child_process() {
    let Some(handle) = conformance::child_handle() else {
        return; // not started by the parent test: nothing to do
    };
    let handle = handle.unwrap();
    let ctx = ctx();
    let pool = PoolManager::new(&ctx).unwrap();
    let mut mem = handle.open(&ctx, &pool).unwrap();
    assert!(!mem.is_staged());
    let (off, len) = (3 << 20, 40 << 20);
    let mut got = vec![0u8; len];
    // SAFETY: the mapping covers `len` bytes.
    unsafe { memory::copy_dtoh(&ctx, &mut got, mem.ptr()) }.unwrap();
    let want: Vec<u8> = (off..off + len).map(vmm_pattern).collect();
    assert!(got == want, "the child sees the parent's bytes at the view");
    // SAFETY: as above.
    unsafe { memory::memset_d8(&ctx, mem.ptr(), 0x6B, len) }.unwrap();
    ctx.synchronize().unwrap();
    mem.close().unwrap();
    println!("child: vmm view verified");
}

/// What exportable pieces cost: the same growth-heavy loop (the expandable
/// segment maps new pieces every round, `trim` gives them back) with and without
/// `exportable`, timed; prints microseconds per mapped piece for each. Fails only
/// if exportable creation is more than twice as slow (on a GPU).
#[test]
#[ignore = "needs a CUDA GPU"]
fn exportable_pieces_cost() {
    let ctx = ctx();
    let mut per_piece = Vec::new();
    for exportable in [false, true, false, true] {
        let cfg = PoolConfig {
            exportable,
            ..PoolConfig::default()
        };
        let pool = PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), cfg).unwrap();
        let t = std::time::Instant::now();
        for round in 0..20usize {
            let held: Vec<_> = (0..8)
                .map(|i| pool.memalloc((64 + 16 * i + round) << 20).unwrap())
                .collect();
            drop(held);
            pool.trim();
        }
        let s = pool.stats();
        let us = t.elapsed().as_secs_f64() * 1e6 / s.counts.pieces_mapped.max(1) as f64;
        println!(
            "exportable {exportable}: {} pieces mapped, {us:.1} us per piece (map, unmap and trim included)",
            s.counts.pieces_mapped
        );
        per_piece.push((exportable, us));
    }
    let avg = |e: bool| {
        let v: Vec<f64> = per_piece.iter().filter(|p| p.0 == e).map(|p| p.1).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let (plain, exp) = (avg(false), avg(true));
    println!(
        "exportable / plain: {:.2} ({exp:.1} us vs {plain:.1} us per piece)",
        exp / plain
    );
    // On the stand-in both are the same memfd: only a GPU's figures mean anything.
    let on_standin = emm_sys::driver().is_ok_and(|d| d.stand_in().is_some());
    assert!(
        on_standin || exp < 2.0 * plain,
        "exportable pieces cost {exp:.1} us vs {plain:.1} us"
    );
}

const PTX: &str = include_str!("../../../kernels/saxpy.ptx");

/// Keeps `stream` busy for about `cycles` GPU clock cycles (`saxpy.ptx`'s `spin`).
fn spin(module: &emm_driver::Module, stream: &Stream, cycles: u64) {
    let f = module.function("spin").unwrap();
    let mut c = cycles;
    let mut params = [(&mut c as *mut u64).cast::<core::ffi::c_void>()];
    // SAFETY: spin takes one u64 and touches no memory.
    unsafe {
        f.launch(
            emm_driver::LaunchConfig {
                grid: (1, 1, 1),
                block: (1, 1, 1),
                shared_mem_bytes: 0,
            },
            stream,
            &mut params,
        )
    }
    .unwrap();
}

/// A block freed on a stream that a kernel keeps busy is parked when another
/// stream asks; with `wait_parked` (the default) that stream, about to grow
/// past the peak, waits on the host for the busy stream's event and takes the
/// block (nothing more reserved, the kernel done by then); without it, it
/// grows at once while the kernel still runs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_waits_for_a_busy_streams_parked_block_instead_of_growing() {
    let ctx = ctx();
    let module = emm_driver::Module::load_ptx(&ctx, PTX).unwrap();
    for wait in [false, true] {
        // One shared pool, as above (stream pools keep s1's block from s2).
        let cfg = PoolConfig {
            thread_cache_blocks: 0,
            stream_pools: 0,
            segments: SegmentPolicy {
                wait_parked: wait,
                ..SegmentPolicy::default()
            },
            ..PoolConfig::default()
        };
        let pool = PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), cfg).unwrap();
        let (s1, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let a = pool.memalloc_async(64 << 20, s1.raw()).unwrap();
        let addr = a.ptr();
        // A quarter to a third of a second: well inside the wait's limit of
        // a second (`PARKED_WAIT_LIMIT`), long past the request on s2.
        spin(&module, &s1, 500_000_000);
        drop(a); // its event, recorded on s1 now, completes after the kernel
        let before = pool.stats().reserved_bytes;
        let b = pool.memalloc_async(64 << 20, s2.raw()).unwrap();
        let stats = pool.stats();
        if wait {
            assert_eq!(stats.reserved_bytes, before, "s2 grew: {stats:?}");
            assert_eq!(b.ptr(), addr, "s2 did not take s1's block");
            assert!(stats.counts.parked_waited >= 1, "{stats:?}");
            assert!(s1.query().unwrap(), "the host did not wait for s1's kernel");
        } else {
            assert!(stats.reserved_bytes > before, "s2 did not grow: {stats:?}");
            assert_ne!(b.ptr(), addr, "s2 took s1's block while its kernel ran");
            assert_eq!(stats.counts.parked_waited, 0);
            assert!(!s1.query().unwrap(), "the kernel was over before s2 asked");
        }
        // SAFETY: `b` is live and 64 MiB long; s2 orders the write.
        unsafe { memory::memset_d8_async(b.ptr(), 3, 64 << 20, &s2) }.unwrap();
        s2.synchronize().unwrap();
        s1.synchronize().unwrap();
        drop(b);
        pool.check().unwrap();
    }
}

/// Stream pools (`pool_stream_pools`) on a GPU: the conformance suite passes;
/// blocks of three created streams and the default stream keep their data
/// while freed across streams and trimmed; and a stream's request for more
/// than the device has left takes another stream's free memory.
#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_pools_keep_data_and_share_memory_on_out_of_memory() {
    const MIB: usize = 1 << 20;
    let ctx = ctx();
    let cfg = PoolConfig {
        stream_pools: 4,
        ..PoolConfig::default()
    };
    let pool = PoolManager::with_config(PoolUpstream::Driver(ctx.clone()), cfg).unwrap();
    let report = conformance::run(&pool, &ctx);
    print!("stream pools:\n{report}");
    assert!(report.all_passed());
    let streams: Vec<Stream> = (0..3).map(|_| Stream::new(&ctx).unwrap()).collect();
    // The null stream (the pool's own) and three streams of their own pools.
    let on: Vec<Option<&Stream>> = std::iter::once(None)
        .chain(streams.iter().map(Some))
        .collect();
    let mut held = Vec::new();
    for round in 0..6u8 {
        for (i, s) in on.iter().enumerate() {
            let size = (1 + (round as usize * 7 + i * 3) % 24) * MIB + 4096 * i;
            let raw = s.map_or(emm_sys::CUstream(std::ptr::null_mut()), Stream::raw);
            let a = pool.memalloc_async(size, raw).unwrap();
            let byte = round.wrapping_mul(16).wrapping_add(i as u8 + 1);
            match s {
                // SAFETY: `a` is live and `size` bytes long, used on its stream.
                Some(s) => unsafe { memory::memset_d8_async(a.ptr(), byte, size, s) }.unwrap(),
                // SAFETY: as above, on the null stream.
                None => unsafe { memory::memset_d8(&ctx, a.ptr(), byte, size) }.unwrap(),
            }
            held.push((a, byte));
        }
        // Every other block freed once its stream's work finished.
        ctx.synchronize().unwrap();
        let mut k = 0;
        held.retain(|_| {
            k += 1;
            k % 2 == 0
        });
    }
    ctx.synchronize().unwrap();
    pool.trim();
    pool.check().unwrap();
    for (a, byte) in &held {
        let mut back = vec![0u8; a.size()];
        // SAFETY: `back` is as long as the live block `a`.
        unsafe { memory::copy_dtoh(&ctx, &mut back, a.ptr()) }.unwrap();
        assert!(
            back.iter().all(|b| b == byte),
            "a stream pool's block lost its data"
        );
    }
    drop(held);
    // Out of memory in one stream's pool: the other's free memory goes back.
    pool.trim();
    let (free, _) = ctx.mem_info().unwrap();
    let big = free / 10 * 6 / MIB * MIB;
    let a = pool.memalloc_async(big, streams[0].raw()).unwrap();
    drop(a);
    streams[0].synchronize().unwrap();
    let b = pool
        .memalloc_async(big, streams[1].raw())
        .expect("the other stream's free memory serves the request");
    // SAFETY: `b` is live and `big` bytes long.
    unsafe { memory::memset_d8(&ctx, b.ptr(), 7, big) }.unwrap();
    let s = pool.stats();
    assert!(
        s.reserved_bytes_peak < 2 * big,
        "the peak is of the sum ({} for two {big}-byte requests at different times)",
        s.reserved_bytes_peak
    );
    drop(b);
    pool.check().unwrap();
}

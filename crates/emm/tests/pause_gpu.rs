//! Pause and resume on a GPU through the process-wide router: the device's free
//! memory (`cuMemGetInfo`) rises by what a pause gives back, kept contents come
//! back at the same addresses, memory paused without keeping works again, and
//! the pool gives everything back at the end. (This binary holds only this test:
//! the current tag is process-wide.)

use emm::core::SYNC_STREAM;
use emm::{Context, Keep, Region, Tag};
use emm_driver::memory;

const MIB: usize = 1 << 20;

#[test]
#[ignore = "needs a CUDA GPU"]
fn pause_gives_memory_to_the_device_and_resume_restores_contents() {
    emm::register_builtin_managers();
    let ctx = Context::on_device(0).unwrap();
    let m = emm::memory_manager(&ctx).unwrap();
    assert_eq!(m.name(), "pool");
    let w = Tag::named("gpu-weights").unwrap();
    let kv = Tag::named("gpu-kv").unwrap();
    let sizes = [512, 3 * MIB + 4096, 256 * MIB, 1024 * MIB];
    let blocks: Vec<_> = {
        let _r = Region::of(w);
        sizes
            .iter()
            .map(|&n| m.memalloc_async(n, SYNC_STREAM).unwrap())
            .collect()
    };
    for (i, b) in blocks.iter().enumerate() {
        // SAFETY: the block holds b.size() bytes, a multiple of 4 (rounded).
        unsafe { memory::memset_d8(&ctx, b.ptr(), 0x10 + i as u8, b.size()) }.unwrap();
    }
    let cache = {
        let _r = Region::of(kv);
        m.memalloc_async(2048 * MIB, SYNC_STREAM).unwrap()
    };
    ctx.synchronize().unwrap();
    // Work still queued on a side stream when the pause comes: the pause waits
    // for it (the copy it keeps holds the stream's last writes).
    let side = emm_driver::Stream::new(&ctx).unwrap();
    for v in 0..8u8 {
        // SAFETY: the block holds 1 GiB; the pause below waits for the stream.
        unsafe { memory::memset_d8_async(blocks[3].ptr(), 0x20 + v, 1024 * MIB, &side) }.unwrap();
    }
    let (free0, _) = ctx.mem_info().unwrap();
    let t = std::time::Instant::now();
    let r = emm::pause(&[w, kv], Keep::Host).unwrap();
    let paused_in = t.elapsed();
    let (free1, _) = ctx.mem_info().unwrap();
    println!(
        "pause: {} MiB given back, {} MiB copied, in {paused_in:?}; the device's free memory rose by {} MiB",
        r.bytes / MIB,
        r.copied_bytes / MIB,
        (free1 - free0) / MIB
    );
    assert!(r.bytes >= 3 * 1024 * MIB, "{r:?}");
    // The device's own count: at least 95 % of what the pause reports.
    assert!(
        (free1 - free0) as f64 >= 0.95 * r.bytes as f64,
        "free memory rose by {} for {} paused",
        free1 - free0,
        r.bytes
    );
    let t = std::time::Instant::now();
    let back = emm::resume(&[w, kv]).unwrap();
    println!(
        "resume: {} MiB mapped, {} MiB copied back, in {:?}",
        back.bytes / MIB,
        back.copied_bytes / MIB,
        t.elapsed()
    );
    assert_eq!(back.bytes, r.bytes);
    for (i, b) in blocks.iter().enumerate() {
        let mut out = vec![0u8; b.size()];
        // SAFETY: the block holds b.size() bytes.
        unsafe { memory::copy_dtoh(&ctx, &mut out, b.ptr()) }.unwrap();
        let want = if i == 3 { 0x27 } else { 0x10 + i as u8 };
        assert!(
            out.iter().all(|&x| x == want),
            "block {i} ({} bytes) lost its contents",
            b.size()
        );
    }
    // Paused without keeping: the memory works again after the resume.
    emm::pause(&[kv], Keep::Nothing).unwrap();
    emm::resume(&[kv]).unwrap();
    // SAFETY: the block holds 2 GiB.
    unsafe { memory::memset_d8(&ctx, cache.ptr(), 0x77, 2048 * MIB) }.unwrap();
    let mut out = vec![0u8; MIB];
    // SAFETY: the block holds at least 1 MiB.
    unsafe { memory::copy_dtoh(&ctx, &mut out, cache.ptr() + (2047 * MIB) as u64) }.unwrap();
    assert!(out.iter().all(|&x| x == 0x77));
    drop((blocks, cache));
    // The process-wide manager lives until exit: give its cache back so that the
    // sanitizer's leak check sees nothing left.
    m.release_cached().unwrap();
    assert_eq!(m.stats().reserved_bytes, 0);
}

/// What keeping 1 GiB in host memory costs each way, pinned (a new
/// `cuMemHostAlloc` buffer, as a pause makes) against pageable (`Vec<u8>`, the
/// driver staging the copy): printed, for the choice in `host_copy.rs`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn host_copy_costs() {
    let ctx = Context::on_device(0).unwrap();
    let n = 1024 * MIB;
    let d = emm_driver::memory::alloc(&ctx, n).unwrap();
    // SAFETY: `d` holds `n` bytes.
    unsafe { memory::memset_d8(&ctx, d, 0x5a, n) }.unwrap();
    for round in 0..3 {
        let t = std::time::Instant::now();
        let p = emm_driver::memory::host_alloc(&ctx, n, 0).unwrap();
        let pinned_alloc = t.elapsed();
        // SAFETY: `p` holds `n` bytes until freed below.
        let pinned = unsafe { std::slice::from_raw_parts_mut(p, n) };
        let t = std::time::Instant::now();
        // SAFETY: `d` holds `n` bytes.
        unsafe { memory::copy_dtoh(&ctx, pinned, d) }.unwrap();
        let pinned_out = t.elapsed();
        let t = std::time::Instant::now();
        // SAFETY: as above.
        unsafe { memory::copy_htod(&ctx, d, pinned) }.unwrap();
        let pinned_in = t.elapsed();
        // SAFETY: allocated above, freed once.
        unsafe { emm_driver::memory::free_host(&ctx, p) }.unwrap();
        let t = std::time::Instant::now();
        let mut v = vec![0u8; n];
        // SAFETY: `d` holds `n` bytes.
        unsafe { memory::copy_dtoh(&ctx, &mut v, d) }.unwrap();
        let pageable_out = t.elapsed();
        let t = std::time::Instant::now();
        // SAFETY: as above.
        unsafe { memory::copy_htod(&ctx, d, &v) }.unwrap();
        let pageable_in = t.elapsed();
        assert!(v.iter().step_by(4096).all(|&x| x == 0x5a));
        println!(
            "round {round}, 1 GiB: pinned alloc {pinned_alloc:?} + out {pinned_out:?}, in {pinned_in:?}; pageable (alloc included) out {pageable_out:?}, in {pageable_in:?}"
        );
    }
    // SAFETY: allocated above, freed once.
    unsafe { emm_driver::memory::free(&ctx, d) }.unwrap();
}

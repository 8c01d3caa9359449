//! Run-time settings on a GPU through the process-wide router, checked at the
//! device (`cuMemGetInfo`): lowering `pool_limit` below what the pool reserves
//! gives the cache back, keeps live bytes, and refuses what would pass it;
//! `pool_release_threshold` gives memory above it back when set and after frees
//! whose streams are idle; and `release_cached` gives every byte back, the
//! created stream's own pool's too, so the process ends holding nothing (the
//! sanitizer's leak check). (This binary holds only this test: configuration is
//! process-wide.)

use emm::core::SYNC_STREAM;
use emm::{Context, EmmError};
use emm_driver::{memory, Stream};

const MIB: usize = 1 << 20;

fn reserved(m: &dyn emm::MemoryManager) -> usize {
    m.memory_stats()
        .iter()
        .find(|(k, _)| *k == emm::core::stat_names::RESERVED_BYTES_CURRENT)
        .map_or(0, |&(_, v)| v as usize)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn run_time_settings_give_memory_to_the_device() {
    if std::env::var_os("EMM_POOL_LIMIT").is_some()
        || std::env::var_os("EMM_POOL_RELEASE_THRESHOLD").is_some()
    {
        eprintln!("EMM_POOL_LIMIT or EMM_POOL_RELEASE_THRESHOLD is set: the environment wins");
        return;
    }
    emm::register_builtin_managers();
    let ctx = Context::on_device(0).unwrap();
    let m = emm::memory_manager(&ctx).unwrap();
    assert_eq!(m.name(), "pool");
    let live = m.memalloc_async(256 * MIB, SYNC_STREAM).unwrap();
    // SAFETY: the block holds 256 MiB.
    unsafe { memory::memset_d8(&ctx, live.ptr(), 0x5a, 256 * MIB) }.unwrap();
    let cache: Vec<_> = (0..6)
        .map(|_| m.memalloc_async(512 * MIB, SYNC_STREAM).unwrap())
        .collect();
    drop(cache);
    ctx.synchronize().unwrap();
    let (free0, _) = ctx.mem_info().unwrap();
    let high = reserved(m.as_ref());
    emm::configure("pool_limit", "512M").unwrap();
    let (free1, _) = ctx.mem_info().unwrap();
    let low = reserved(m.as_ref());
    println!(
        "pool_limit 512 MiB: reserved {} -> {} MiB; the device's free memory rose by {} MiB",
        high / MIB,
        low / MIB,
        (free1 - free0) / MIB
    );
    assert!(low <= 512 * MIB, "{low}");
    assert!(free1 - free0 + 4 * MIB >= high - low);
    let e = m.memalloc_async(512 * MIB, SYNC_STREAM).unwrap_err();
    assert!(matches!(e, EmmError::OutOfMemory { .. }), "{e}");
    let mut back = vec![0u8; 4096];
    // SAFETY: the live block holds 256 MiB; reading its first 4 KiB.
    unsafe { memory::copy_dtoh(&ctx, &mut back, live.ptr()) }.unwrap();
    assert!(
        back.iter().all(|&b| b == 0x5a),
        "a live block lost its bytes"
    );
    emm::configure("pool_limit", "max").unwrap();

    // The release threshold, on a created stream with work queued.
    let stream = Stream::new(&ctx).unwrap();
    let blocks: Vec<_> = (0..8)
        .map(|_| m.memalloc_async(256 * MIB, stream.raw()).unwrap())
        .collect();
    for b in &blocks {
        // SAFETY: each block holds 256 MiB; the work is ordered on `stream`.
        unsafe { memory::memset_d8_async(b.ptr(), 1, 256 * MIB, &stream) }.unwrap();
    }
    drop(blocks);
    stream.synchronize().unwrap();
    let (free2, _) = ctx.mem_info().unwrap();
    let grown = reserved(m.as_ref());
    emm::configure("pool_release_threshold", "768M").unwrap();
    let (free3, _) = ctx.mem_info().unwrap();
    let settled = reserved(m.as_ref());
    println!(
        "pool_release_threshold 768 MiB: reserved {} -> {} MiB; the device's free memory rose by {} MiB",
        grown / MIB,
        settled / MIB,
        (free3 - free2) / MIB
    );
    assert!(settled <= 768 * MIB, "{settled}");
    assert!(free3 - free2 + 4 * MIB >= grown - settled);
    // Frees past the threshold give memory back on their own once their stream
    // is idle (thread caches keep up to `pool_thread_cache` per stream).
    let blocks: Vec<_> = (0..8)
        .map(|_| m.memalloc_async(256 * MIB, stream.raw()).unwrap())
        .collect();
    let before = reserved(m.as_ref());
    for b in blocks {
        stream.synchronize().unwrap();
        drop(b);
    }
    let after = reserved(m.as_ref());
    println!(
        "frees past the threshold: reserved {} -> {} MiB",
        before / MIB,
        after / MIB
    );
    assert!(after <= 768 * MIB + 512 * MIB + 256 * MIB, "{after}");
    emm::configure("pool_release_threshold", "max").unwrap();
    drop(live);

    // Nothing live: a release gives every pool's memory back to the device.
    ctx.synchronize().unwrap();
    let (free4, _) = ctx.mem_info().unwrap();
    let cached = reserved(m.as_ref());
    assert!(cached > 0, "the pool cached nothing to release");
    let released = m.release_cached().unwrap();
    let (free5, _) = ctx.mem_info().unwrap();
    println!(
        "release_cached: {} MiB released of {} MiB reserved; the device's free memory rose by {} MiB",
        released / MIB,
        cached / MIB,
        (free5 - free4) / MIB
    );
    assert_eq!(reserved(m.as_ref()), 0, "a pool kept memory");
    assert_eq!(released, cached);
    assert!(free5 - free4 + 4 * MIB >= cached);
}

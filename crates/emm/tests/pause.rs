//! Pause and resume through the router over `emm-standin`, the stand-in driver
//! (its virtual memory is host memory that holds bytes): contents kept in host
//! memory come back at the same addresses, the device's free memory rises by what
//! a pause gives back, the tag states are enforced, a resume that finds the
//! device full fails and can be retried, and nothing leaks.
//!
//! The current tag is process-wide, and the stand-in's counters too: the tests
//! take the fixture's lock (`common::fixture`).

mod common;

use common::{fixture, snapshot};

use emm::core::{ManagerFactory, SYNC_STREAM};
use emm::{Context, EmmError, Keep, MemoryManager, Region, Router, Tag};
use emm_driver::memory;
use emm_pool::PoolManager;
use emm_sys::CUresult;
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn router() -> Router {
    let r = Router::new();
    let factory = |ctx: &Context| -> emm::Result<Arc<dyn MemoryManager>> {
        Ok(Arc::new(PoolManager::new(ctx)?))
    };
    r.register("pool", factory);
    let _: &dyn ManagerFactory = &factory;
    r
}

/// The router's statistics of the tag named `name` (the default's when no
/// manager has that tag).
fn stats_of(router: &Router, name: &str) -> emm::TagStats {
    router
        .tag_stats()
        .into_iter()
        .find(|(_, s)| s.tag == name)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

fn write(ctx: &Context, ptr: u64, data: &[u8]) {
    // SAFETY: `ptr` is a live allocation of at least `data.len()` bytes.
    unsafe { memory::copy_htod(ctx, ptr, data).unwrap() };
}

fn read(ctx: &Context, ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `ptr` is a live allocation of at least `len` bytes, mapped.
    unsafe { memory::copy_dtoh(ctx, &mut out, ptr).unwrap() };
    out
}

fn free_bytes(ctx: &Context) -> usize {
    ctx.mem_info().unwrap().0
}

#[test]
fn paused_contents_come_back_at_the_same_addresses() {
    let f = fixture();
    let before_all = snapshot(&f.s);
    {
        let router = router();
        let m = router.manager(&f.ctx).unwrap();
        let w = Tag::named("standin-weights").unwrap();
        let kv = Tag::named("standin-kv").unwrap();
        let sizes = [4096, 3 * MIB + 512, 40 * MIB];
        let blocks: Vec<_> = {
            let _r = Region::of(w);
            sizes
                .iter()
                .map(|&n| m.memalloc_async(n, SYNC_STREAM).unwrap())
                .collect()
        };
        for (i, b) in blocks.iter().enumerate() {
            write(&f.ctx, b.ptr(), &pattern(i as u8 * 7 + 1, b.size()));
        }
        let cache = {
            let _r = Region::of(kv);
            m.memalloc_async(64 * MIB, SYNC_STREAM).unwrap()
        };
        let untagged = m.memalloc_async(8 * MIB, SYNC_STREAM).unwrap();
        write(&f.ctx, untagged.ptr(), &pattern(99, 8 * MIB));

        let free0 = free_bytes(&f.ctx);
        let r = router.pause(&[w, kv], Keep::Host).unwrap();
        let kept: usize = sizes
            .iter()
            .map(|&n| emm_pool::round_size(n))
            .sum::<usize>()
            + 64 * MIB;
        assert_eq!(r.copied_bytes, kept, "{r:?}");
        assert_eq!(r.blocks_copied, 4);
        assert!(r.bytes >= kept, "{r:?}");
        let free1 = free_bytes(&f.ctx);
        assert!(
            free1 >= free0 + r.bytes,
            "the device's free memory rose by {} for a pause of {}",
            free1 - free0,
            r.bytes
        );
        for s in router.tag_stats() {
            if s.1.tag.starts_with("standin-") {
                assert!(s.1.paused, "{s:?}");
                assert_eq!(s.1.reserved_bytes, 0, "{s:?}");
            }
        }

        // States: no allocation under a paused tag, no second pause, no resume
        // of an active tag, no pause of "default"; other allocations go on.
        {
            let _r = Region::of(w);
            let e = m.memalloc_async(MIB, SYNC_STREAM).unwrap_err();
            assert!(matches!(e, EmmError::TagState { .. }), "{e}");
        }
        assert!(matches!(
            router.pause(&[w], Keep::Nothing),
            Err(EmmError::TagState { .. })
        ));
        assert!(matches!(
            router.pause(&[Tag::DEFAULT], Keep::Nothing),
            Err(EmmError::TagState { .. })
        ));
        let other = Tag::named("standin-other").unwrap();
        assert!(matches!(
            router.resume(&[other]),
            Err(EmmError::TagState { .. })
        ));
        let more = m.memalloc_async(2 * MIB, SYNC_STREAM).unwrap();
        assert_eq!(read(&f.ctx, untagged.ptr(), 8 * MIB), pattern(99, 8 * MIB));

        // A resume that finds the device full fails, stays paused, and can be
        // tried again.
        f.s.fail_nth("cuMemCreate", 1, CUresult::ERROR_OUT_OF_MEMORY)
            .unwrap();
        let e = router.resume(&[w, kv]).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(w.is_paused() || kv.is_paused());
        let r2 = router.resume(&[w, kv]);
        // A tag that the failed call finished is active again: resume the rest.
        let r2 = match r2 {
            Ok(r) => r,
            Err(EmmError::TagState { .. }) => {
                let left: Vec<Tag> = [w, kv].into_iter().filter(|t| t.is_paused()).collect();
                router.resume(&left).unwrap()
            }
            Err(e) => panic!("{e}"),
        };
        assert!(r2.bytes > 0);
        assert!(!w.is_paused() && !kv.is_paused());
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(
                read(&f.ctx, b.ptr(), b.size()),
                pattern(i as u8 * 7 + 1, b.size()),
                "block {i} after the resume"
            );
        }
        // Memory under a tag paused without keeping works again after a resume.
        router.pause(&[kv], Keep::Nothing).unwrap();
        router.resume(&[kv]).unwrap();
        write(&f.ctx, cache.ptr(), &pattern(5, 64 * MIB));
        assert_eq!(read(&f.ctx, cache.ptr(), 64 * MIB), pattern(5, 64 * MIB));
        let again = {
            let _r = Region::of(w);
            m.memalloc_async(MIB, SYNC_STREAM).unwrap()
        };
        drop((blocks, cache, untagged, more, again));
        m.release_cached().unwrap();
    }
    f.ctx.synchronize().unwrap();
    assert_eq!(
        snapshot(&f.s),
        before_all,
        "the stand-in's live resources changed"
    );
}

#[test]
fn a_failed_pause_changes_nothing() {
    let f = fixture();
    let before_all = snapshot(&f.s);
    {
        let router = router();
        let m = router.manager(&f.ctx).unwrap();
        let t = Tag::named("standin-fail").unwrap();
        let b = {
            let _r = Region::of(t);
            m.memalloc_async(30 * MIB, SYNC_STREAM).unwrap()
        };
        write(&f.ctx, b.ptr(), &pattern(3, 30 * MIB));
        // The second unmap fails: the first piece is mapped again and its bytes
        // restored, the tag stays active.
        f.s.fail_nth("cuMemUnmap", 2, CUresult::ERROR_UNKNOWN)
            .unwrap();
        let e = router.pause(&[t], Keep::Host).unwrap_err();
        assert!(!matches!(e, EmmError::TagState { .. }), "{e}");
        assert!(!t.is_paused());
        assert_eq!(read(&f.ctx, b.ptr(), 30 * MIB), pattern(3, 30 * MIB));
        let c = {
            let _r = Region::of(t);
            m.memalloc_async(MIB, SYNC_STREAM).unwrap()
        };
        // The fault cleared: the pause works.
        let r = router.pause(&[t], Keep::Host).unwrap();
        assert!(r.bytes >= 30 * MIB);
        // A copy back that fails leaves the tag paused with its bytes kept; the
        // next resume finishes.
        f.s.fail_nth("cuMemcpyHtoD_v2", 1, CUresult::ERROR_UNKNOWN)
            .unwrap();
        assert!(router.resume(&[t]).is_err());
        assert!(t.is_paused());
        {
            let _r = Region::of(t);
            assert!(matches!(
                m.memalloc_async(MIB, SYNC_STREAM),
                Err(EmmError::TagState { .. })
            ));
        }
        router.resume(&[t]).unwrap();
        assert!(!t.is_paused());
        assert_eq!(read(&f.ctx, b.ptr(), 30 * MIB), pattern(3, 30 * MIB));
        drop((b, c));
        m.release_cached().unwrap();
    }
    f.ctx.synchronize().unwrap();
    assert_eq!(
        snapshot(&f.s),
        before_all,
        "the stand-in's live resources changed"
    );
}

#[test]
fn a_second_pause_reuses_the_pinned_buffers_and_a_trim_frees_them() {
    let f = fixture();
    let before_all = snapshot(&f.s);
    {
        let router = router();
        let m = router.manager(&f.ctx).unwrap();
        let t = Tag::named("standin-reuse").unwrap();
        let blocks: Vec<_> = {
            let _r = Region::of(t);
            [5 * MIB, 3 * MIB, 64 * 1024]
                .iter()
                .map(|&n| m.memalloc_async(n, SYNC_STREAM).unwrap())
                .collect()
        };
        let host = |router: &Router| stats_of(router, "standin-reuse").host_copy_bytes;
        router.pause(&[t], Keep::Host).unwrap();
        let held = host(&router);
        assert!(held >= 8 * MIB, "{held}");
        router.resume(&[t]).unwrap();
        assert_eq!(
            host(&router),
            held,
            "the buffers are kept for the next pause"
        );
        let live = f.s.live().unwrap();
        for seed in 0..3u8 {
            for (i, b) in blocks.iter().enumerate() {
                write(&f.ctx, b.ptr(), &pattern(seed + i as u8, b.size()));
            }
            router.pause(&[t], Keep::Host).unwrap();
            router.resume(&[t]).unwrap();
            for (i, b) in blocks.iter().enumerate() {
                assert_eq!(
                    read(&f.ctx, b.ptr(), b.size()),
                    pattern(seed + i as u8, b.size())
                );
            }
            assert_eq!(host(&router), held, "no new pinned buffer");
        }
        assert_eq!(
            f.s.live().unwrap(),
            live,
            "the stand-in's live resources changed across reused pauses"
        );
        m.release_cached().unwrap();
        assert_eq!(host(&router), 0, "a trim frees the spare buffers");
        drop(blocks);
        m.release_cached().unwrap();
    }
    f.ctx.synchronize().unwrap();
    assert_eq!(
        snapshot(&f.s),
        before_all,
        "the stand-in's live resources changed"
    );
}

#[test]
fn memory_that_cannot_be_paused_is_refused_and_nothing_changes() {
    let f = fixture();
    {
        // A tagged block cannot be exported: a pause would take its memory from
        // under the importer.
        let router = router();
        let m = router.manager(&f.ctx).unwrap();
        let t = Tag::named("standin-export").unwrap();
        let b = {
            let _r = Region::of(t);
            m.memalloc_async(4 * MIB, SYNC_STREAM).unwrap()
        };
        let e = m.get_ipc_handle(b.as_view()).unwrap_err();
        assert!(matches!(e, EmmError::TagState { .. }), "{e}");
        assert!(e.to_string().contains("exported"), "{e}");
        drop(b);
        m.release_cached().unwrap();
    }
    // Without virtual memory management the pool's blocks are cuMemAlloc
    // segments: a pause is refused, the tag stays active and allocates.
    f.s.control("vmm 0").unwrap();
    {
        let router = router();
        let m = router.manager(&f.ctx).unwrap();
        let t = Tag::named("standin-novmm").unwrap();
        let b = {
            let _r = Region::of(t);
            m.memalloc_async(6 * MIB, SYNC_STREAM).unwrap()
        };
        write(&f.ctx, b.ptr(), &pattern(9, 6 * MIB));
        let e = router.pause(&[t], Keep::Host).unwrap_err();
        assert!(matches!(e, EmmError::TagState { .. }), "{e}");
        assert!(e.to_string().contains("outside virtual memory"), "{e}");
        assert!(!t.is_paused());
        assert_eq!(read(&f.ctx, b.ptr(), 6 * MIB), pattern(9, 6 * MIB));
        let c = {
            let _r = Region::of(t);
            m.memalloc_async(MIB, SYNC_STREAM).unwrap()
        };
        drop((b, c));
        m.release_cached().unwrap();
    }
    f.s.reset().unwrap();
}

#[test]
fn allocations_from_other_threads_carry_the_open_region() {
    let f = fixture();
    let router = router();
    let m = router.manager(&f.ctx).unwrap();
    let t = Tag::named("standin-threads").unwrap();
    let blocks: Vec<_> = {
        let _r = Region::of(t);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let (m, ctx) = (&m, &f.ctx);
                    s.spawn(move || {
                        ctx.set_current().unwrap();
                        m.memalloc_async(3 * MIB, SYNC_STREAM).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let s = stats_of(&router, "standin-threads");
    assert!(s.allocated_bytes >= 12 * MIB, "{s:?}");
    let r = router.pause(&[t], Keep::Nothing).unwrap();
    assert!(r.bytes >= 12 * MIB, "{r:?}");
    router.resume(&[t]).unwrap();
    drop(blocks);
    m.release_cached().unwrap();
}

#[test]
fn a_pause_that_cannot_put_its_memory_back_stays_paused_until_a_resume() {
    let f = fixture();
    let before_all = snapshot(&f.s);
    {
        let router = router();
        let m = router.manager(&f.ctx).unwrap();
        let t = Tag::named("standin-stuck").unwrap();
        let b = {
            let _r = Region::of(t);
            m.memalloc_async(30 * MIB, SYNC_STREAM).unwrap()
        };
        write(&f.ctx, b.ptr(), &pattern(4, 30 * MIB));
        // The second unmap fails, and so does mapping the first piece again.
        f.s.fail_nth("cuMemUnmap", 2, CUresult::ERROR_UNKNOWN)
            .unwrap();
        f.s.fail_nth("cuMemCreate", 1, CUresult::ERROR_OUT_OF_MEMORY)
            .unwrap();
        assert!(router.pause(&[t], Keep::Host).is_err());
        // Some of its memory is gone: the tag stays paused and refuses
        // allocations, and says so.
        assert!(t.is_paused());
        let s = stats_of(&router, "standin-stuck");
        assert!(s.paused && s.paused_bytes > 0, "{s:?}");
        {
            let _r = Region::of(t);
            assert!(matches!(
                m.memalloc_async(MIB, SYNC_STREAM),
                Err(EmmError::TagState { .. })
            ));
        }
        router.resume(&[t]).unwrap();
        assert_eq!(read(&f.ctx, b.ptr(), 30 * MIB), pattern(4, 30 * MIB));
        drop(b);
        m.release_cached().unwrap();
    }
    f.ctx.synchronize().unwrap();
    assert_eq!(
        snapshot(&f.s),
        before_all,
        "the stand-in's live resources changed"
    );
}

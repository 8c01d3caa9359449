//! Tagged allocations, pause and resume, over the host stand-in (sizes and
//! addresses are real; the stand-in's memory holds no bytes, so contents are
//! checked in `crates/emm/tests/pause.rs` over the stand-in driver).
//!
//! The current tag is process-wide: every test of this binary takes `SERIAL`.

use std::sync::Mutex;

use emm_core::{EmmError, Keep, MemoryManager, Region, Tag, SYNC_STREAM};
use emm_pool::{PoolConfig, PoolManager};
use proptest::prelude::*;

static SERIAL: Mutex<()> = Mutex::new(());

const MIB: usize = 1 << 20;

fn pool() -> PoolManager {
    PoolManager::host(64 << 30, PoolConfig::default()).unwrap()
}

fn tag_stats(p: &PoolManager, tag: &str) -> emm_core::TagStats {
    p.tag_stats()
        .into_iter()
        .find(|s| s.tag == tag)
        .unwrap_or_else(|| panic!("no statistics for tag {tag}"))
}

#[test]
fn a_paused_tag_gives_its_memory_back_and_keeps_its_addresses() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = pool();
    let kv = Tag::named("pause-kv").unwrap();
    let w = Tag::named("pause-weights").unwrap();
    let (big, small) = {
        let _r = Region::of(kv);
        (
            p.memalloc_async(100 * MIB, SYNC_STREAM).unwrap(),
            p.memalloc_async(4096, SYNC_STREAM).unwrap(),
        )
    };
    let weights = {
        let _r = Region::of(w);
        p.memalloc_async(50 * MIB, SYNC_STREAM).unwrap()
    };
    let untagged = p.memalloc_async(10 * MIB, SYNC_STREAM).unwrap();
    // Tags share no page: each tag's blocks lie in its own range.
    let kv_stats = tag_stats(&p, "pause-kv");
    assert!(kv_stats.reserved_bytes >= 100 * MIB + 4096, "{kv_stats:?}");
    assert!(kv_stats.allocated_bytes >= 100 * MIB, "{kv_stats:?}");
    assert!(!kv_stats.paused);
    let before = p.stats();
    let (big_at, small_at) = (big.ptr(), small.ptr());

    let r = p.pause_tag(kv, Keep::Nothing).unwrap();
    assert!(r.bytes >= 100 * MIB, "{r:?}");
    assert_eq!(r.copied_bytes, 0);
    let during = p.stats();
    // (The pause also gives back the tag's idle pieces, as a trim would.)
    assert!(during.reserved_bytes + r.bytes <= before.reserved_bytes);
    assert_eq!(during.paused_bytes, r.bytes);
    let kv_stats = tag_stats(&p, "pause-kv");
    assert!(kv_stats.paused, "{kv_stats:?}");
    assert_eq!(kv_stats.paused_bytes, r.bytes);
    assert_eq!(kv_stats.reserved_bytes, 0, "{kv_stats:?}");
    p.check().unwrap();

    // The paused tag refuses allocations; the others keep working.
    {
        let _r = Region::of(kv);
        let e = p.memalloc_async(MIB, SYNC_STREAM).unwrap_err();
        assert!(matches!(e, EmmError::TagState { .. }), "{e}");
        assert!(e.to_string().contains("pause-kv"), "{e}");
    }
    let more = {
        let _r = Region::of(w);
        p.memalloc_async(8 * MIB, SYNC_STREAM).unwrap()
    };
    let plain = p.memalloc_async(MIB, SYNC_STREAM).unwrap();
    // Freeing a paused block is bookkeeping.
    drop(small);
    p.check().unwrap();
    // A trim leaves the paused tag alone.
    p.trim();
    p.check().unwrap();

    let back = p.resume_tag(kv).unwrap();
    assert_eq!(back.bytes, r.bytes);
    assert_eq!(big.ptr(), big_at);
    assert_eq!(p.stats().paused_bytes, 0);
    assert!(!tag_stats(&p, "pause-kv").paused);
    p.check().unwrap();
    let again = {
        let _r = Region::of(kv);
        p.memalloc_async(4096, SYNC_STREAM).unwrap()
    };
    // The freed small block's place is reused.
    assert_eq!(again.ptr(), small_at);
    // A resume of a tag that is not paused here does nothing.
    assert_eq!(p.resume_tag(kv).unwrap().bytes, 0);
    drop((big, again, weights, untagged, more, plain));
    p.check().unwrap();
}

#[test]
fn keeping_contents_needs_memory_that_holds_bytes() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = pool();
    let t = Tag::named("pause-keep-host").unwrap();
    let b = {
        let _r = Region::of(t);
        p.memalloc_async(3 * MIB, SYNC_STREAM).unwrap()
    };
    let before = p.stats();
    let e = p.pause_tag(t, Keep::Host).unwrap_err();
    assert!(matches!(e, EmmError::Unsupported { .. }), "{e}");
    // Nothing changed: the tag's memory is still there and it still allocates.
    assert_eq!(p.stats().reserved_bytes, before.reserved_bytes);
    let c = {
        let _r = Region::of(t);
        p.memalloc_async(MIB, SYNC_STREAM).unwrap()
    };
    drop((b, c));
    p.check().unwrap();
}

#[test]
fn a_tag_that_never_allocated_here_pauses_nothing() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = pool();
    let t = Tag::named("pause-unused").unwrap();
    assert_eq!(p.pause_tag(t, Keep::Nothing).unwrap().bytes, 0);
    // Paused all the same: no allocation under it until resumed.
    {
        let _r = Region::of(t);
        assert!(matches!(
            p.memalloc_async(MIB, SYNC_STREAM),
            Err(EmmError::TagState { .. })
        ));
    }
    assert!(matches!(
        p.pause_tag(t, Keep::Nothing),
        Err(EmmError::TagState { .. })
    ));
    assert_eq!(p.resume_tag(t).unwrap().bytes, 0);
    let b = {
        let _r = Region::of(t);
        p.memalloc_async(MIB, SYNC_STREAM).unwrap()
    };
    assert_eq!(tag_stats(&p, "pause-unused").paused_bytes, 0);
    drop(b);
}

#[derive(Clone, Debug)]
enum Op {
    /// Allocate this many KiB under tag `t` (0: default).
    Alloc(usize, u32),
    /// Free the live block at this index (modulo their number).
    Free(usize),
    /// Pause tag `t` (1 or 2).
    Pause(usize),
    /// Resume tag `t` (1 or 2).
    Resume(usize),
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, 1u32..40_000).prop_map(|(t, k)| Op::Alloc(t, k)),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (1usize..3).prop_map(Op::Pause),
        1 => (1usize..3).prop_map(Op::Resume),
        1 => Just(Op::Trim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A model of the tags' states against the pool: allocations succeed exactly
    /// when their tag is not paused here, addresses never change, paused bytes
    /// leave `reserved_bytes` and come back, and the pool stays consistent.
    #[test]
    fn tags_follow_their_model(ops in proptest::collection::vec(op(), 1..60)) {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let p = pool();
        let tags = [
            Tag::DEFAULT,
            Tag::named("model-a").unwrap(),
            Tag::named("model-b").unwrap(),
        ];
        let mut paused = [false; 3];
        let mut live: Vec<(emm_core::DeviceAllocation, usize, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(t, kib) => {
                    let r = {
                        let _r = Region::of(tags[t]);
                        p.memalloc_async(kib as usize * 1024, SYNC_STREAM)
                    };
                    if paused[t] {
                        prop_assert!(matches!(r, Err(EmmError::TagState { .. })), "{r:?}");
                    } else {
                        let b = r.unwrap();
                        let at = b.ptr();
                        live.push((b, t, at));
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let i = i % live.len();
                    drop(live.swap_remove(i));
                }
                Op::Free(_) => {}
                Op::Pause(t) if !paused[t] => {
                    let before = p.stats();
                    let r = p.pause_tag(tags[t], Keep::Nothing).unwrap();
                    let after = p.stats();
                    prop_assert_eq!(after.paused_bytes, before.paused_bytes + r.bytes);
                    prop_assert!(after.reserved_bytes + r.bytes <= before.reserved_bytes);
                    paused[t] = true;
                }
                Op::Pause(_) => {}
                Op::Resume(t) => {
                    let before = p.stats();
                    let r = p.resume_tag(tags[t]).unwrap();
                    let after = p.stats();
                    prop_assert_eq!(after.paused_bytes + r.bytes, before.paused_bytes);
                    prop_assert_eq!(after.reserved_bytes, before.reserved_bytes + r.bytes);
                    paused[t] = false;
                }
                Op::Trim => {
                    p.trim();
                }
            }
            for (b, _, at) in &live {
                prop_assert_eq!(b.ptr(), *at);
            }
            if let Err(e) = p.check() {
                prop_assert!(false, "{}", e);
            }
        }
        for t in 1..3 {
            if paused[t] {
                p.resume_tag(tags[t]).unwrap();
            }
        }
        prop_assert_eq!(p.stats().paused_bytes, 0);
        drop(live);
        p.check().unwrap();
    }
}

#[test]
fn a_reset_while_paused_drops_the_pause_and_the_tag_allocates_again_after_resume() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = pool();
    let t = Tag::named("pause-reset").unwrap();
    let b = {
        let _r = Region::of(t);
        p.memalloc_async(40 * MIB, SYNC_STREAM).unwrap()
    };
    let r = p.pause_tag(t, Keep::Nothing).unwrap();
    assert!(r.bytes >= 40 * MIB);
    p.reset().unwrap();
    // The block was invalidated by the reset; its free is a no-op.
    drop(b);
    assert_eq!(p.stats().paused_bytes, 0);
    assert_eq!(p.stats().reserved_bytes, 0);
    // Nothing left to map again; the tag allocates afterwards.
    assert_eq!(p.resume_tag(t).unwrap().bytes, 0);
    let c = {
        let _r = Region::of(t);
        p.memalloc_async(MIB, SYNC_STREAM).unwrap()
    };
    p.check().unwrap();
    drop(c);
    p.check().unwrap();
}

#[test]
fn a_pool_and_its_tags_share_one_byte_limit_and_a_resume_past_it_waits() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = PoolManager::host(
        64 << 30,
        PoolConfig {
            limit: Some(64 * MIB),
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let t = Tag::named("pause-limit").unwrap();
    let plain = p.memalloc_async(40 * MIB, SYNC_STREAM).unwrap();
    {
        let _r = Region::of(t);
        let e = p.memalloc_async(40 * MIB, SYNC_STREAM).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
    }
    let tagged = {
        let _r = Region::of(t);
        p.memalloc_async(16 * MIB, SYNC_STREAM).unwrap()
    };
    assert!(p.stats().reserved_bytes <= 64 * MIB, "{:?}", p.stats());
    // Paused memory leaves the budget; a resume that would pass the limit is
    // refused and leaves the tag paused until there is room.
    p.pause_tag(t, Keep::Nothing).unwrap();
    let more = p.memalloc_async(20 * MIB, SYNC_STREAM).unwrap();
    let e = p.resume_tag(t).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(p
        .tag_stats()
        .iter()
        .any(|s| s.tag == "pause-limit" && s.paused));
    drop(more);
    p.trim();
    p.resume_tag(t).unwrap();
    assert!(p.stats().reserved_bytes <= 64 * MIB, "{:?}", p.stats());
    drop((plain, tagged));
    p.check().unwrap();
}

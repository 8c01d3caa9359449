//! A `MemArray`'s copies, in the order their buffers need, on the stand-in
//! driver (which runs copies at once: the waits are counted, not raced). Each
//! case fails on the code before it: a copy on another stream was not ordered
//! after a pending one, a dropped array did not wait for its pending copy, a
//! failed wait forgot the copy, and a copy could be queued with no event to
//! track it.

mod common;

use std::sync::Arc;

use common::fixture;
use emm::{Context, MemoryManager, Stream};
use emm_array::{ArrayError, MemArray, Side};
use emm_pool::PoolManager;

fn pool(ctx: &Context) -> Arc<dyn MemoryManager> {
    let m: Arc<dyn MemoryManager> = Arc::new(PoolManager::new(ctx).unwrap());
    m.initialize().unwrap();
    m
}

/// A copy on a second stream waits for the copy pending on the first (both
/// use the same buffers).
#[test]
fn a_copy_on_another_stream_is_ordered_after_the_pending_one() {
    let f = fixture();
    let a = MemArray::<f32, 1>::new([1024], pool(&f.ctx), &f.ctx).unwrap();
    let (s1, s2) = (
        Arc::new(Stream::new(&f.ctx).unwrap()),
        Arc::new(Stream::new(&f.ctx).unwrap()),
    );
    let waits = || f.s.control("calls cuStreamWaitEvent").unwrap();
    a.move_to(Side::Device, Some(&s1), false).unwrap(); // pending on s1
    let before = waits();
    a.move_to(Side::Host, Some(&s2), true).unwrap();
    assert_eq!(waits(), before + 1, "s2 waited for s1's copy");
}

/// Dropping an array with a copy pending waits for it before its buffers go
/// (the device block is freed in order on the stream it was allocated on, the
/// pinned host mirror at once).
#[test]
fn a_dropped_array_waits_for_its_pending_copy() {
    let f = fixture();
    let a = MemArray::<f32, 1>::new([1 << 18], pool(&f.ctx), &f.ctx).unwrap();
    let (s1, s2) = (
        Arc::new(Stream::new(&f.ctx).unwrap()),
        Arc::new(Stream::new(&f.ctx).unwrap()),
    );
    a.move_to(Side::Device, Some(&s1), true).unwrap(); // the block's stream: s1
    a.move_to(Side::Host, Some(&s1), true).unwrap();
    a.move_to(Side::Device, Some(&s2), false).unwrap(); // pending on s2
    let syncs = || f.s.control("calls cuEventSynchronize").unwrap();
    let before = syncs();
    drop(a);
    assert_eq!(syncs(), before + 1, "the drop waited for the copy");
}

/// A wait that fails keeps the copy pending: host access is still refused.
#[test]
fn a_failed_wait_keeps_the_copy_pending() {
    let f = fixture();
    let a = MemArray::<f32, 1>::new([1024], pool(&f.ctx), &f.ctx).unwrap();
    let s = Arc::new(Stream::new(&f.ctx).unwrap());
    a.move_to(Side::Device, Some(&s), true).unwrap();
    f.s.control("not_ready 1000000").unwrap(); // the copy does not finish
    a.move_to(Side::Host, Some(&s), false).unwrap();
    f.s.control("fail cuEventSynchronize 1 CUDA_ERROR_LAUNCH_FAILED")
        .unwrap();
    assert!(a.synchronize().is_err());
    let got = a.get([0]);
    f.s.reset().unwrap();
    assert!(
        matches!(got, Err(ArrayError::CopyPending { .. })),
        "{got:?}"
    );
    a.synchronize().unwrap();
    assert_eq!(a.get([0]).unwrap(), 0.0);
}

/// The event that tracks a copy is made before the copy is queued: when it
/// cannot be made, nothing was queued and the array is where it was.
#[test]
fn no_copy_is_queued_without_an_event_to_track_it() {
    let f = fixture();
    let a = MemArray::<f32, 1>::new([1024], pool(&f.ctx), &f.ctx).unwrap();
    let s = Arc::new(Stream::new(&f.ctx).unwrap());
    a.move_to(Side::Device, Some(&s), true).unwrap();
    a.move_to(Side::Host, Some(&s), true).unwrap();
    let copies = || f.s.control("calls cuMemcpyHtoDAsync_v2").unwrap();
    let before = copies();
    f.s.control("fail cuEventCreate 1 CUDA_ERROR_OUT_OF_MEMORY")
        .unwrap();
    assert!(a.move_to(Side::Device, Some(&s), false).is_err());
    f.s.reset().unwrap();
    assert_eq!(copies(), before, "no copy queued");
    assert_eq!(a.side(), Side::Host);
    a.set([0], 1.0).unwrap();
    assert!(a.move_to(Side::Device, Some(&s), false).unwrap());
}

/// A manager of one device with a context of another is refused: the memory
/// would come from one device and be copied and exported (DLPack) as the
/// other's.
#[test]
fn a_manager_and_a_context_of_different_devices_are_refused() {
    let f = fixture();
    f.s.control("devices 2").unwrap();
    let ctx1 = Context::on_device(1).unwrap();
    let m1 = pool(&ctx1);
    let got = MemArray::<f32, 1>::new([16], m1.clone(), &f.ctx);
    assert!(
        matches!(
            got,
            Err(ArrayError::DeviceMismatch {
                manager_device: 1,
                context_device: 0
            })
        ),
        "{:?}",
        got.err()
    );
    MemArray::<f32, 1>::new([16], m1.clone(), &ctx1).unwrap();
    drop(m1);
    f.s.control("devices 1").unwrap();
}

/// A copy asked on another device's stream is refused before anything is
/// queued (safe code used to pass any raw handle); the array stays where it
/// was and moves on its own device's stream.
#[test]
fn a_copy_on_another_devices_stream_is_refused() {
    let f = fixture();
    f.s.control("devices 2").unwrap();
    let ctx1 = Context::on_device(1).unwrap();
    let other = Arc::new(Stream::new(&ctx1).unwrap());
    let a = MemArray::<f32, 1>::new([16], pool(&f.ctx), &f.ctx).unwrap();
    let got = a.move_to(Side::Device, Some(&other), true);
    assert!(
        matches!(
            got,
            Err(ArrayError::ForeignStream {
                array_device: 0,
                stream_device: 1
            })
        ),
        "{got:?}"
    );
    assert_eq!(a.side(), Side::Host, "nothing moved");
    // Already on the host: refused all the same, not passed over silently.
    assert!(matches!(
        a.move_to(Side::Host, Some(&other), true),
        Err(ArrayError::ForeignStream { .. })
    ));
    let own = Arc::new(Stream::new(&f.ctx).unwrap());
    assert!(a.move_to(Side::Device, Some(&own), true).unwrap());
    drop((other, own, a));
    f.s.control("devices 1").unwrap();
}

/// The device block belongs to the stream of the copy that made it and is
/// freed there when the array goes; the array keeps that stream alive until
/// then, so safe code dropping its handle first cannot leave the free on a
/// destroyed stream. Found by review: the block was freed on the destroyed
/// stream (`CUDA_ERROR_INVALID_HANDLE`).
#[test]
fn the_array_keeps_the_stream_its_block_belongs_to() {
    let f = fixture();
    let before = common::snapshot(&f.s);
    for name in common::managers::MANAGERS {
        let m: Arc<dyn MemoryManager> = Arc::from(common::managers::manager(name, &f.ctx));
        let a = MemArray::<f32, 1>::new([1024], m.clone(), &f.ctx).unwrap();
        let s = Arc::new(Stream::new(&f.ctx).unwrap());
        a.move_to(Side::Device, Some(&s), false).unwrap();
        a.synchronize().unwrap();
        let streams = f.s.live().unwrap().streams;
        drop(s);
        assert_eq!(
            f.s.live().unwrap().streams,
            streams,
            "{name}: the array keeps its block's stream"
        );
        a.move_to(Side::Host, None, true).unwrap();
        a.move_to(Side::Device, None, true).unwrap();
        drop(a);
        m.release_cached().unwrap();
        drop(m);
        let errors = f.ctx.take_deferred_errors();
        assert!(errors.is_empty(), "{name}: {errors:?}");
        f.ctx.synchronize().unwrap();
        assert_eq!(
            common::snapshot(&f.s),
            before,
            "{name}: the stream went with the array"
        );
    }
}

//! The home segment (`SegmentPolicy::initial_size`, `EMM_POOL_INITIAL_SIZE`)
//! over the host stand-in: without the expandable segment, one plain segment of
//! the initial size made at the first allocation, which every request tries
//! first; other segments only for what it cannot hold; given back only by
//! `trim`, and asked for again after; a device that cannot hold it leaves the
//! pool working without one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use emm_core::{DeviceAllocation, EmmError, MemoryManager};
use emm_default::{HostUpstream, Upstream};
use emm_pool::{HostEvents, PoolConfig, PoolManager, PoolUpstream, SegmentPolicy};
use emm_sys::{CUdeviceptr, CUstream};

const MIB: usize = 1 << 20;
const S: CUstream = emm_core::SYNC_STREAM;

fn stream(n: usize) -> CUstream {
    CUstream(n as *mut core::ffi::c_void)
}

/// The defaults without the expandable segment, with a home of `initial` bytes.
fn config(initial: usize) -> PoolConfig {
    PoolConfig {
        segments: SegmentPolicy {
            expandable: false,
            initial_size: initial,
            ..SegmentPolicy::default()
        },
        ..PoolConfig::default()
    }
}

/// The base and size of the segment holding `a`.
fn segment_of(p: &PoolManager, a: &DeviceAllocation) -> (CUdeviceptr, usize) {
    p.snapshot()
        .segments
        .iter()
        .find(|s| s.address <= a.ptr() && a.ptr() < s.address + s.total_size as u64)
        .map(|s| (s.address, s.total_size))
        .expect("every block lies in a segment")
}

#[test]
fn every_request_of_every_size_and_stream_shares_the_home() {
    // Rounded up to whole 2 MiB pages.
    let p = PoolManager::host(1 << 30, config(63 * MIB + 5)).unwrap();
    let blocks: Vec<DeviceAllocation> = [
        (256, S),
        (64 << 10, S),
        (MIB + 1, S),
        (21 * MIB, S),
        // Created streams share it too: no pool of their own.
        (8 * MIB, stream(0x10)),
        (300, stream(0x20)),
    ]
    .into_iter()
    .map(|(size, s)| p.memalloc_async(size, s).unwrap())
    .collect();
    let home = segment_of(&p, &blocks[0]);
    assert_eq!(home.1, 64 * MIB);
    for b in &blocks {
        assert_eq!(segment_of(&p, b), home, "block of {} bytes", b.size());
    }
    let stats = p.stats();
    assert_eq!((stats.segments, stats.num_device_alloc), (1, 1));
    assert_eq!(stats.counts.home_overflows, 0);
    assert_eq!(stats.reserved_bytes, 64 * MIB);
    drop(blocks);
    // Threads cache nothing: a freed block is free in the home at once.
    assert_eq!(p.stats().thread_cached_bytes, 0);
    p.check().unwrap();
}

#[test]
fn what_the_home_cannot_hold_comes_beside_it_and_goes_while_the_home_stays() {
    let p = PoolManager::host(1 << 30, config(32 * MIB)).unwrap();
    let small = p.memalloc_async(MIB, S).unwrap();
    let home = segment_of(&p, &small);
    // Larger than the home: a segment beside it.
    let big = p.memalloc_async(40 * MIB, S).unwrap();
    assert_ne!(segment_of(&p, &big).0, home.0);
    assert_eq!(p.stats().segments, 2);
    // Counted: the initial size is smaller than the job needs.
    assert_eq!(p.stats().counts.home_overflows, 1);
    drop(big);
    drop(small);
    // A request the home holds goes there, not to the free segment beside it.
    let again = p.memalloc_async(30 * MIB, S).unwrap();
    assert_eq!(segment_of(&p, &again), home);
    drop(again);
    // Tightening gives back wholly free segments but never the home: a
    // request past 120 % of the peak of live bytes finds it there.
    let bigger = p.memalloc_async(60 * MIB, S).unwrap();
    let stats = p.stats();
    assert_eq!(stats.counts.home_overflows, 2);
    assert!(
        p.snapshot().segments.iter().any(|s| s.address == home.0),
        "the home stays"
    );
    assert_eq!(
        stats.reserved_bytes,
        32 * MIB + 60 * MIB,
        "the 40 MiB segment went back"
    );
    drop(bigger);
    p.check().unwrap();
}

#[test]
fn trim_gives_back_a_wholly_free_home_and_the_next_allocation_makes_it_again() {
    let p = PoolManager::host(1 << 30, config(16 * MIB)).unwrap();
    let a = p.memalloc_async(MIB, S).unwrap();
    // Not while a block lives in it.
    p.trim();
    assert_eq!(p.stats().reserved_bytes, 16 * MIB);
    drop(a);
    p.trim();
    assert_eq!(p.stats().reserved_bytes, 0);
    let b = p.memalloc_async(MIB, S).unwrap();
    assert_eq!(segment_of(&p, &b).1, 16 * MIB);
    assert_eq!(p.stats().num_device_alloc, 2);
    drop(b);
    p.check().unwrap();
}

#[test]
fn a_home_the_device_cannot_hold_leaves_the_pool_working_without_one() {
    // 64 MiB of device for a home of 128 MiB.
    let (p, _, asked) = flaky(64 * MIB, config(128 * MIB));
    let homes = || {
        asked
            .lock()
            .unwrap()
            .iter()
            .filter(|&&s| s == 128 * MIB)
            .count()
    };
    let a = p.memalloc_async(4 * MIB, S).unwrap();
    assert_eq!(homes(), 1, "the home was asked for");
    assert!(segment_of(&p, &a).1 < 64 * MIB);
    // Not asked for again at every allocation...
    let b = p.memalloc_async(30 * MIB, S).unwrap();
    assert_eq!(homes(), 1);
    drop((a, b));
    // ...but again after a trim, and the pool still serves.
    p.trim();
    let c = p.memalloc_async(4 * MIB, S).unwrap();
    assert_eq!(homes(), 2);
    assert!(segment_of(&p, &c).1 < 64 * MIB);
    drop(c);
    p.check().unwrap();
}

/// The host stand-in, whose allocations fail with an error that is not for
/// want of memory while `fail` is set, as a driver fault, and which notes the
/// size of every allocation asked of it.
struct Flaky {
    host: HostUpstream,
    fail: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<usize>>>,
}

/// The switch that makes a [`Flaky`] stand-in fail, and the sizes asked of it.
type FlakyHandles = (Arc<AtomicBool>, Arc<Mutex<Vec<usize>>>);

/// A pool with `config` over a [`Flaky`] stand-in of `capacity` bytes, with
/// its switch and the sizes asked of it.
fn flaky(
    capacity: usize,
    config: PoolConfig,
) -> (PoolManager, Arc<AtomicBool>, Arc<Mutex<Vec<usize>>>) {
    let (fail, asked): FlakyHandles = Default::default();
    let p = PoolManager::with_config(
        PoolUpstream::Custom(
            Box::new(Flaky {
                host: HostUpstream::new(capacity, false),
                fail: fail.clone(),
                asked: asked.clone(),
            }),
            Box::new(HostEvents::immediate()),
            None,
            None,
        ),
        config,
    )
    .unwrap();
    (p, fail, asked)
}

impl Upstream for Flaky {
    fn name(&self) -> &'static str {
        "host, failing on demand"
    }

    fn alloc(&self, size: usize) -> emm_core::Result<CUdeviceptr> {
        self.asked.lock().unwrap().push(size);
        if self.fail.load(Ordering::Relaxed) {
            return Err(EmmError::InvalidArgument {
                what: "segment allocation (a failure the test injects)",
                found: "CUDA_ERROR_UNKNOWN".into(),
                expected: "an allocation".into(),
            });
        }
        self.host.alloc(size)
    }

    unsafe fn free(&self, ptr: CUdeviceptr, size: usize) -> emm_core::Result<()> {
        // SAFETY: the caller's contract for `ptr`, which `self.host` lent.
        unsafe { self.host.free(ptr, size) }
    }

    fn mem_info(&self) -> emm_core::Result<emm_core::MemoryInfo> {
        self.host.mem_info()
    }
}

#[test]
fn a_driver_fault_making_the_home_is_returned_and_the_next_allocation_makes_it() {
    let (p, fail, _) = flaky(1 << 30, config(32 * MIB));
    fail.store(true, Ordering::Relaxed);
    let e = p.memalloc_async(MIB, S).expect_err("the fault is returned");
    assert!(!e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains("CUDA_ERROR_UNKNOWN"), "{e}");
    assert_eq!(p.stats().reserved_bytes, 0);
    fail.store(false, Ordering::Relaxed);
    let a = p.memalloc_async(MIB, S).unwrap();
    assert_eq!(segment_of(&p, &a).1, 32 * MIB);
    drop(a);
    p.check().unwrap();
}

#[test]
fn with_the_expandable_segment_an_initial_size_changes_nothing() {
    let with = PoolConfig {
        segments: SegmentPolicy {
            initial_size: 64 * MIB,
            ..SegmentPolicy::default()
        },
        ..PoolConfig::default()
    };
    let p = PoolManager::host(1 << 30, with).unwrap();
    let q = PoolManager::host(1 << 30, PoolConfig::default()).unwrap();
    let a = p.memalloc_async(24 * MIB, S).unwrap();
    let b = q.memalloc_async(24 * MIB, S).unwrap();
    assert_eq!(p.stats().reserved_bytes, q.stats().reserved_bytes);
    assert!(p.stats().reserved_bytes < 64 * MIB);
    drop((a, b));
}

/// A pool with `config` over the host stand-in of `capacity` bytes, without
/// virtual memory, whose events complete only when waited for (a device
/// behind the host) with `manual`, else at once.
fn without_vmm(capacity: usize, config: PoolConfig, manual: bool) -> PoolManager {
    let events = if manual {
        HostEvents::manual()
    } else {
        HostEvents::immediate()
    };
    PoolManager::with_config(
        PoolUpstream::Custom(
            Box::new(HostUpstream::new(capacity, false)),
            Box::new(events),
            None,
            None,
        ),
        config,
    )
    .unwrap()
}

#[test]
fn a_small_request_finds_the_home_once_another_streams_blocks_are_usable() {
    // 17 MiB of device for a home of 16 MiB: no room for a segment beside it.
    let p = without_vmm(17 * MIB, config(16 * MIB), true);
    let live = p.memalloc_async(4 * MIB, S).unwrap();
    let home = segment_of(&p, &live);
    let a = p.memalloc_async(12 * MIB, stream(0x10)).unwrap();
    drop(a);
    // The home's other 12 MiB wait for stream 0x10's work. A small request on
    // another stream gets them once the device is waited for, as a large one
    // would: not an out-of-memory error while the home holds room.
    let b = p.memalloc_async(256, S).unwrap();
    assert_eq!(segment_of(&p, &b), home);
    let stats = p.stats();
    assert_eq!((stats.segments, stats.num_ooms), (1, 0));
    // Served by the home, so not counted as a request it could not hold.
    assert_eq!(stats.counts.home_overflows, 0);
    drop((live, b));
    p.check().unwrap();
}

#[test]
fn a_request_larger_than_the_home_on_a_full_device_settles_without_it() {
    // 20 MiB of device, a home of 16 MiB, requests of 18 MiB and 1 MiB by
    // turns, each freed before the next (a server whose home is idle between
    // requests).
    let p = without_vmm(20 * MIB, config(16 * MIB), false);
    drop(p.memalloc_async(MIB, S).unwrap());
    let mut allocs = Vec::new();
    for _ in 0..6 {
        // No room beside the home: the ladder gives the wholly free home back
        // and the request gets the device.
        let big = p.memalloc_async(18 * MIB, S).unwrap();
        assert_eq!(segment_of(&p, &big).1, 18 * MIB);
        drop(big);
        // The home is asked for again, once, and cannot be had beside the free
        // 18 MiB: the small request goes beside them, and the pool settles
        // instead of trading the two segments back and forth.
        let small = p.memalloc_async(MIB, S).unwrap();
        assert!(segment_of(&p, &small).1 < 16 * MIB);
        drop(small);
        allocs.push(p.stats().num_device_alloc);
    }
    assert!(
        allocs.windows(2).all(|w| w[0] == w[1]),
        "device allocations after each round: {allocs:?}"
    );
    // Counted once, when the 18 MiB took a segment while the home was there.
    assert_eq!(p.stats().counts.home_overflows, 1);
    // A trim gives the free segments back and asks for the home again.
    p.trim();
    let c = p.memalloc_async(MIB, S).unwrap();
    assert_eq!(segment_of(&p, &c).1, 16 * MIB);
    drop(c);
    p.check().unwrap();
}

#[test]
fn an_initial_size_larger_than_any_device_leaves_the_pool_working_without_a_home() {
    for initial in [usize::MAX, usize::MAX - MIB, 1 << 62] {
        let p = PoolManager::host(1 << 30, config(initial)).unwrap();
        let a = p.memalloc_async(MIB, S).unwrap();
        assert!(segment_of(&p, &a).1 < 64 * MIB, "{initial}");
        let b = p.memalloc_async(30 * MIB, S).unwrap();
        assert_eq!(p.stats().counts.home_overflows, 0, "no home, no overflow");
        drop((a, b));
        p.check().unwrap();
    }
}

#[test]
fn with_the_expandable_segment_asked_for_and_no_virtual_memory_the_first_allocation_makes_the_home()
{
    let mut c = config(16 * MIB);
    c.segments.expandable = true;
    let p = without_vmm(1 << 30, c, false);
    // A small request first: no growth of the expandable segment ever tells
    // the pool there is none; it knows from its upstream.
    let a = p.memalloc_async(256, S).unwrap();
    let home = segment_of(&p, &a);
    assert_eq!(home.1, 16 * MIB);
    let b = p.memalloc_async(4 * MIB, S).unwrap();
    let c2 = p.memalloc_async(4 * MIB, S).unwrap();
    assert_eq!((segment_of(&p, &b), segment_of(&p, &c2)), (home, home));
    assert_eq!(p.stats().segments, 1);
    drop((a, b, c2));
    p.check().unwrap();
}

//! The expandable segment's address space when the driver refuses it: a
//! process's address space is finite, and every pool of every device (a
//! stream's and a tag's pools too) reserves its own. A refusal for want of
//! address space never fails the request: the pool takes a smaller
//! reservation, or serves requests from segments of their own until a trim or
//! a reset asks again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use emm_core::{MemoryManager, Result};
use emm_default::HostUpstream;
use emm_pool::{
    HostEvents, HostVmm, PoolConfig, PoolManager, PoolUpstream, SegmentPolicy, VirtualMemory,
};
use emm_sys::{CUdeviceptr, CUstream};

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// Host virtual memory that refuses any reservation above `cap` bytes, as a
/// driver out of address space does, and notes every reservation asked for
/// and every one made.
struct Capped {
    inner: HostVmm,
    cap: Arc<AtomicUsize>,
    /// Every reservation fails as a driver without virtual memory management.
    unsupported: Arc<AtomicBool>,
    /// Every reservation fails with an error that is not for want of memory.
    other: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<usize>>>,
    made: Arc<Mutex<Vec<(CUdeviceptr, usize)>>>,
}

impl VirtualMemory for Capped {
    fn reserve(&self, size: usize) -> Result<CUdeviceptr> {
        self.asked.lock().unwrap().push(size);
        if self.unsupported.load(Ordering::Relaxed) {
            // What `DriverVmm` gives for a driver without the entry point.
            return Err(emm_core::EmmError::Driver(
                emm_driver::DriverError::Unsupported {
                    symbol: "cuMemAddressReserve",
                    version: 10_000,
                },
            ));
        }
        if self.other.load(Ordering::Relaxed) {
            // Drivers refuse too large a reservation with codes other than out
            // of memory too (invalid value, not supported).
            return Err(emm_core::EmmError::InvalidArgument {
                what: "reservation (a failure the test injects)",
                found: "CUDA_ERROR_NOT_SUPPORTED".into(),
                expected: "a reservation".into(),
            });
        }
        if size > self.cap.load(Ordering::Relaxed) {
            return Err(emm_core::EmmError::OutOfMemory {
                what: "address space",
                manager: "test".into(),
                requested: size,
                free: 0,
                total: 0,
                detail: "a refusal the test injects".into(),
            });
        }
        let b = self.inner.reserve(size)?;
        self.made.lock().unwrap().push((b, size));
        Ok(b)
    }
    fn map(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.inner.map(addr, len)
    }
    fn alias(&self, src: CUdeviceptr, dst: CUdeviceptr, len: usize) -> Result<()> {
        self.inner.alias(src, dst, len)
    }
    fn unmap(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.inner.unmap(addr, len)
    }
}

struct Setup {
    pool: PoolManager,
    cap: Arc<AtomicUsize>,
    unsupported: Arc<AtomicBool>,
    other: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<usize>>>,
    made: Arc<Mutex<Vec<(CUdeviceptr, usize)>>>,
}

/// A pool reserving `reserve` bytes of address space for its expandable
/// segment, over host virtual memory that refuses reservations above `cap`.
fn setup(reserve: usize, cap: usize) -> Setup {
    let host = Arc::new(HostUpstream::new(4 << 30, false));
    let (cap, asked, made) = (
        Arc::new(AtomicUsize::new(cap)),
        Arc::default(),
        Arc::default(),
    );
    let (unsupported, other) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let vmm = Capped {
        inner: HostVmm::new(host.clone()),
        cap: Arc::clone(&cap),
        unsupported: Arc::clone(&unsupported),
        other: Arc::clone(&other),
        asked: Arc::clone(&asked),
        made: Arc::clone(&made),
    };
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable_reserve: reserve,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    let pool = PoolManager::with_config(
        PoolUpstream::Custom(
            Box::new(host),
            Box::new(Arc::new(HostEvents::immediate())),
            Some(Box::new(vmm)),
            None,
        ),
        config,
    )
    .unwrap();
    Setup {
        pool,
        cap,
        unsupported,
        other,
        asked,
        made,
    }
}

/// The legacy default stream.
fn stream() -> CUstream {
    CUstream(std::ptr::null_mut())
}

/// Whether `addr` lies in a reservation `made` holds.
fn in_reservation(made: &[(CUdeviceptr, usize)], addr: CUdeviceptr) -> bool {
    made.iter()
        .any(|&(b, len)| addr >= b && addr < b + len as u64)
}

#[test]
fn a_refused_reservation_is_asked_again_a_quarter_the_size() {
    let s = setup(64 * GIB, 20 * GIB);
    let a = s.pool.memalloc_async(64 * MIB, stream()).unwrap();
    // 64 GiB refused, 16 GiB made: the block is in the expandable segment.
    assert_eq!(*s.asked.lock().unwrap(), vec![64 * GIB, 16 * GIB]);
    let made = s.made.lock().unwrap().clone();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].1, 16 * GIB);
    assert!(in_reservation(&made, a.ptr()), "{:#x} {made:?}", a.ptr());
    assert_eq!(s.pool.stats().num_ooms, 0);
    s.pool.check().unwrap();
}

#[test]
fn with_no_address_space_requests_take_segments_until_a_trim_asks_again() {
    let s = setup(64 * GIB, 0);
    // Every size refused (64, 16, 4 and 1 GiB): a segment of its own, no error.
    let a = s.pool.memalloc_async(64 * MIB, stream()).unwrap();
    assert_eq!(
        *s.asked.lock().unwrap(),
        vec![64 * GIB, 16 * GIB, 4 * GIB, GIB]
    );
    assert!(s.made.lock().unwrap().is_empty());
    assert_eq!(s.pool.stats().num_ooms, 0);
    // Later growths do not ask again (four failing driver calls a growth).
    s.asked.lock().unwrap().clear();
    let big = s.pool.memalloc_async(2 * GIB, stream()).unwrap();
    assert!(s.asked.lock().unwrap().is_empty());
    drop(big);
    // The address space comes back; a trim asks again at the next growth,
    // which reserves and maps there.
    s.cap.store(usize::MAX, Ordering::Relaxed);
    s.pool.trim();
    let b = s.pool.memalloc_async(128 * MIB, stream()).unwrap();
    assert_eq!(*s.asked.lock().unwrap(), vec![64 * GIB]);
    let made = s.made.lock().unwrap().clone();
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(in_reservation(&made, b.ptr()));
    assert!(!in_reservation(&made, a.ptr()));
    s.pool.check().unwrap();
    drop((a, b));
    s.pool.check().unwrap();
}

#[test]
fn a_reservation_smaller_than_the_request_is_not_asked_for() {
    let s = setup(64 * GIB, 0);
    // 3 GiB: 64, 16 and 4 GiB asked for, not 1 GiB.
    let _big = s.pool.memalloc_async(3 * GIB, stream()).unwrap();
    assert_eq!(*s.asked.lock().unwrap(), vec![64 * GIB, 16 * GIB, 4 * GIB]);
}

#[test]
fn a_driver_without_virtual_memory_is_not_asked_again() {
    let s = setup(64 * GIB, 0);
    s.unsupported.store(true, Ordering::Relaxed);
    let _a = s.pool.memalloc_async(64 * MIB, stream()).unwrap();
    s.pool.trim();
    let _b = s.pool.memalloc_async(64 * MIB, stream()).unwrap();
    assert_eq!(*s.asked.lock().unwrap(), vec![64 * GIB]);
}

#[test]
fn a_refusal_with_another_error_is_a_refusal_too() {
    let s = setup(64 * GIB, usize::MAX);
    s.other.store(true, Ordering::Relaxed);
    let a = s.pool.memalloc_async(64 * MIB, stream()).unwrap();
    assert_eq!(
        *s.asked.lock().unwrap(),
        vec![64 * GIB, 16 * GIB, 4 * GIB, GIB]
    );
    // Once it clears, a trim asks again and the pool reserves.
    s.other.store(false, Ordering::Relaxed);
    s.pool.trim();
    let b = s.pool.memalloc_async(64 * MIB, stream()).unwrap();
    let made = s.made.lock().unwrap().clone();
    assert!(!in_reservation(&made, a.ptr()));
    assert!(in_reservation(&made, b.ptr()), "{made:?}");
}

#[test]
fn a_request_larger_than_the_reservation_leaves_it_for_the_next_growth() {
    let s = setup(GIB, usize::MAX);
    // 2 GiB: no reservation holds it; nothing is asked, a segment of its own.
    let big = s.pool.memalloc_async(2 * GIB, stream()).unwrap();
    assert!(s.asked.lock().unwrap().is_empty());
    // The next growth reserves (no trim needed: nothing was refused).
    let small = s.pool.memalloc_async(64 * MIB, stream()).unwrap();
    assert_eq!(*s.asked.lock().unwrap(), vec![GIB]);
    assert!(in_reservation(&s.made.lock().unwrap(), small.ptr()));
    drop((big, small));
}

#[test]
fn a_reservation_smaller_than_a_page_is_a_configuration_error() {
    let host = Arc::new(HostUpstream::new(1 << 30, false));
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable_reserve: MIB,
            ..SegmentPolicy::default()
        },
        ..PoolConfig::default()
    };
    let made = PoolManager::with_config(
        PoolUpstream::Custom(
            Box::new(host.clone()),
            Box::new(Arc::new(HostEvents::immediate())),
            Some(Box::new(HostVmm::new(host))),
            None,
        ),
        config,
    );
    let Err(e) = made else {
        panic!("a 1 MiB reservation under 2 MiB pages was accepted");
    };
    assert!(e.to_string().contains("segments.expandable_reserve"), "{e}");
}

/// Without the expandable segment (`EMM_POOL_EXPANDABLE=0`) a tag's pool,
/// which serves every request from one range when it has one, places small
/// requests in small segments as the pool does: it knows from the start that
/// no range is to be had (it took a 4 KiB request as a large one, a 20 MiB
/// segment, while it waited for a growth to tell it).
#[test]
fn without_the_expandable_segment_a_tags_small_request_takes_a_small_segment() {
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable: false,
            ..SegmentPolicy::default()
        },
        ..PoolConfig::default()
    };
    let p = PoolManager::host(GIB, config).unwrap();
    let t = emm_core::Tag::named("reserve-small").unwrap();
    let a = {
        let _in = emm_core::Region::of(t);
        p.memalloc_async(4096, emm_core::SYNC_STREAM).unwrap()
    };
    let tag = p
        .tag_stats()
        .into_iter()
        .find(|s| s.tag == "reserve-small")
        .unwrap();
    assert_eq!(tag.reserved_bytes, 2 * MIB);
    drop(a);
}

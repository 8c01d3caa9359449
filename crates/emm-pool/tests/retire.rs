//! Moved pieces of the expandable segment: the old mapping of a moved piece is
//! unmapped only once the work queued on it (an event recorded on its stream at the
//! move) has completed, and growth maps its address range again, so a long run
//! stays inside the segment's reservation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use emm_core::{MemoryManager, Result};
use emm_default::HostUpstream;
use emm_pool::{
    HostEvents, HostVmm, PoolConfig, PoolManager, PoolUpstream, SegmentPolicy, VirtualMemory,
};
use emm_sys::{CUdeviceptr, CUstream};

const MIB: usize = 1 << 20;

/// Host virtual memory that counts unmaps, and keeps the reservation's start and
/// the highest address mapped.
struct Counting {
    inner: HostVmm,
    unmaps: Arc<AtomicUsize>,
    /// The address whose unmap fails; 0: none.
    fail_at: Arc<AtomicUsize>,
    top: Arc<AtomicUsize>,
    base: Arc<AtomicUsize>,
}

impl VirtualMemory for Counting {
    fn reserve(&self, size: usize) -> Result<CUdeviceptr> {
        let b = self.inner.reserve(size)?;
        self.base.store(b as usize, Ordering::Relaxed);
        Ok(b)
    }
    fn map(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.top.fetch_max(addr as usize + len, Ordering::Relaxed);
        self.inner.map(addr, len)
    }
    fn alias(&self, src: CUdeviceptr, dst: CUdeviceptr, len: usize) -> Result<()> {
        self.top.fetch_max(dst as usize + len, Ordering::Relaxed);
        self.inner.alias(src, dst, len)
    }
    fn unmap(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.unmaps.fetch_add(1, Ordering::Relaxed);
        if addr as usize == self.fail_at.load(Ordering::Relaxed) {
            return Err(emm_core::EmmError::InvalidArgument {
                what: "unmap (a failure the test injects)",
                found: format!("{addr:#x}"),
                expected: "another address".into(),
            });
        }
        self.inner.unmap(addr, len)
    }
}

struct Setup {
    pool: PoolManager,
    events: Arc<HostEvents>,
    unmaps: Arc<AtomicUsize>,
    fail_at: Arc<AtomicUsize>,
    top: Arc<AtomicUsize>,
    base: Arc<AtomicUsize>,
}

fn setup(reserve: usize) -> Setup {
    let host = Arc::new(HostUpstream::new(4 << 30, false));
    let events = Arc::new(HostEvents::manual());
    let (unmaps, top, base) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let fail_at = Arc::new(AtomicUsize::new(0));
    let vmm = Counting {
        inner: HostVmm::new(host.clone()),
        unmaps: unmaps.clone(),
        fail_at: fail_at.clone(),
        top: top.clone(),
        base: base.clone(),
    };
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable_reserve: reserve,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        // The arena's own unmapping (on the allocating thread), which these tests
        // pace with the stand-in's events; `background_unmap.rs` tests the helper.
        background_unmap: false,
        ..PoolConfig::default()
    };
    let pool = PoolManager::with_config(
        PoolUpstream::Custom(
            Box::new(host),
            Box::new(events.clone()),
            Some(Box::new(vmm)),
            None,
        ),
        config,
    )
    .unwrap();
    Setup {
        pool,
        events,
        unmaps,
        fail_at,
        top,
        base,
    }
}

/// A created stream (its events are recorded on it, not on the default stream).
fn stream() -> CUstream {
    CUstream(7 as *mut core::ffi::c_void)
}

#[test]
fn an_old_mapping_waits_for_its_streams_work_before_it_is_unmapped() {
    let s = setup(1 << 40);
    let (pool, st) = (&s.pool, stream());
    // A hole of 64 MiB below a live block, then a request that does not fit: the
    // hole's pieces move to the end.
    let a = pool.memalloc_async(64 * MIB, st).unwrap();
    let b = pool.memalloc_async(64 * MIB, st).unwrap();
    drop(a);
    let c = pool.memalloc_async(200 * MIB, st).unwrap();
    let moved = pool.stats().counts.pieces_moved;
    assert!(moved > 0, "the hole's pieces were not moved");
    let outstanding = s.events.outstanding();
    assert!(
        outstanding > 0,
        "no event was recorded for the moved pieces"
    );
    // Growth again, with the move's event still pending: nothing is unmapped.
    let d = pool.memalloc_async(100 * MIB, st).unwrap();
    assert_eq!(
        s.unmaps.load(Ordering::Relaxed),
        0,
        "unmapped before the stream's work was done"
    );
    assert_eq!(pool.stats().counts.pieces_unmapped, 0);
    pool.check().unwrap();
    // The stream's work completes; the next growth unmaps the old mappings first.
    s.events.complete_all();
    let e = pool.memalloc_async(400 * MIB, st).unwrap();
    let unmapped = pool.stats().counts.pieces_unmapped;
    assert_eq!(
        unmapped, moved,
        "every old mapping of a moved piece is unmapped once"
    );
    assert!(s.unmaps.load(Ordering::Relaxed) >= unmapped);
    pool.check().unwrap();
    // Live blocks stay distinct.
    let blocks = [
        (&b, 64 * MIB),
        (&c, 200 * MIB),
        (&d, 100 * MIB),
        (&e, 400 * MIB),
    ];
    for (i, (x, xs)) in blocks.iter().enumerate() {
        for (y, ys) in blocks.iter().skip(i + 1) {
            let (x0, y0) = (x.ptr(), y.ptr());
            assert!(
                x0 + *xs as u64 <= y0 || y0 + *ys as u64 <= x0,
                "live blocks overlap"
            );
        }
    }
    drop((b, c, d, e));
    pool.check().unwrap();
}

/// Pass after pass of the same pattern (a hole, then a larger request): a
/// reservation of 512 MiB, about 3 times what is live at once, serves 300 rounds,
/// every block from the expandable segment (none from a segment of its own), with
/// old mappings unmapped as they go. (`emm-trace`'s `epochs.rs` runs the recorded
/// GPT-2 trace for 30 passes through a reservation it would once have used up.)
#[test]
fn a_long_run_stays_inside_the_reservation() {
    const RESERVE: usize = 512 * MIB;
    let s = setup(RESERVE);
    let (pool, st) = (&s.pool, stream());
    let keep = pool.memalloc_async(32 * MIB, st).unwrap();
    let inside = |p: u64, len: usize| {
        let base = s.base.load(Ordering::Relaxed) as u64;
        p >= base && p + len as u64 <= base + RESERVE as u64
    };
    assert!(inside(keep.ptr(), 32 * MIB));
    for round in 0..300usize {
        let small = 40 + (round % 7) * 6;
        let a = pool.memalloc_async(small * MIB, st).unwrap();
        let b = pool.memalloc_async(24 * MIB, st).unwrap();
        drop(a);
        let c = pool.memalloc_async((small + 30) * MIB, st).unwrap();
        for (x, len) in [(&b, 24 * MIB), (&c, (small + 30) * MIB)] {
            assert!(
                inside(x.ptr(), len),
                "round {round}: a block outside the expandable segment"
            );
        }
        drop((b, c));
        s.events.complete_all();
        pool.check().unwrap();
    }
    let stats = pool.stats();
    println!("{stats:?}");
    assert!(stats.counts.pieces_moved > 0, "the pattern moved nothing");
    assert!(stats.counts.pieces_unmapped > 0, "nothing was unmapped");
    assert!(
        s.top.load(Ordering::Relaxed) as u64
            <= s.base.load(Ordering::Relaxed) as u64 + RESERVE as u64
    );
    drop(keep);
}

/// `trim` (PyTorch's `empty_cache`) gives back the idle middle of the expandable
/// segment while live blocks sit on both sides: the idle pieces are unmapped, the
/// reserved bytes drop by them, the live blocks stay where they are, and growth
/// maps memory into the gap again afterwards. (The host stand-in's addresses are
/// made up; `tests/gpu.rs` checks the live blocks' data on a GPU.)
#[test]
fn trim_gives_back_the_idle_middle_of_the_expandable_segment() {
    let s = setup(1 << 30);
    let (pool, st) = (&s.pool, stream());
    let first = pool.memalloc_async(8 * MIB, st).unwrap();
    let middle = pool.memalloc_async(96 * MIB, st).unwrap();
    let last = pool.memalloc_async(8 * MIB, st).unwrap();
    assert!(
        first.ptr() < middle.ptr() && middle.ptr() < last.ptr(),
        "not laid out in order"
    );
    drop(middle);
    let before = pool.stats();
    let unmaps = s.unmaps.load(Ordering::Relaxed);

    let released = pool.trim();
    let after = pool.stats();
    assert!(released >= 64 * MIB, "released {released} of 96 MiB idle");
    assert_eq!(after.reserved_bytes, before.reserved_bytes - released);
    assert!(
        s.unmaps.load(Ordering::Relaxed) > unmaps,
        "nothing was unmapped"
    );
    assert_eq!(after.allocated_bytes, 16 * MIB);
    pool.check().unwrap();

    // Growth maps memory into the gap again: the new block lies between the two.
    let again = pool.memalloc_async(96 * MIB, st).unwrap();
    assert!(pool.stats().reserved_bytes >= 16 * MIB + 96 * MIB);
    assert!(
        first.ptr() + 8 * MIB as u64 <= again.ptr() && again.ptr() + 96 * MIB as u64 <= last.ptr(),
        "the gap was not used again"
    );
    pool.check().unwrap();
    drop((first, last, again));
    assert!(pool.trim() > 0);
    assert_eq!(
        pool.stats().reserved_bytes,
        0,
        "everything goes back once nothing is live"
    );
    pool.check().unwrap();
}

/// A piece that fails to unmap during `trim` stays mapped in its free block: the
/// pieces on both sides still go back, the pool's accounting holds, and the next
/// `trim` gives the piece back.
#[test]
fn a_piece_that_fails_to_unmap_is_given_back_by_the_next_trim() {
    let s = setup(1 << 30);
    let (pool, st) = (&s.pool, stream());
    let first = pool.memalloc_async(8 * MIB, st).unwrap();
    // Three growths: three pieces, which join into one free block when freed.
    let middle: Vec<_> = (0..3)
        .map(|_| pool.memalloc_async(32 * MIB, st).unwrap())
        .collect();
    let last = pool.memalloc_async(8 * MIB, st).unwrap();
    // The piece mapped at the second block's start fails to unmap.
    let failing = middle[1].ptr();
    drop(middle);
    let before = pool.stats().reserved_bytes;
    s.fail_at.store(failing as usize, Ordering::Relaxed);
    let released = pool.trim();
    pool.check().unwrap();
    let after = pool.stats().reserved_bytes;
    assert_eq!(after, before - released);
    assert!(
        released >= 64 * MIB && after > 16 * MIB,
        "released {released}, reserved {after}: the failing piece should have stayed"
    );
    s.fail_at.store(0, Ordering::Relaxed);
    let again = pool.trim();
    pool.check().unwrap();
    assert!(again > 0, "the piece that failed was not given back");
    assert_eq!(pool.stats().reserved_bytes, after - again);
    drop((first, last));
}

/// More old mappings waiting than the pool lets wait (1,024): the next growth
/// waits for the oldest move's work (a host stall on a GPU), and
/// `emm.retire_waits` counts it; below that, growth never waits.
#[test]
fn growth_waits_only_past_the_old_mappings_it_lets_wait_and_counts_it() {
    let s = setup(1 << 40);
    let (pool, st) = (&s.pool, stream());
    // 1,100 blocks of 2 MiB (growth maps them as pieces of one 2 MiB page), a
    // live one above them, then all of them freed: one free hole of 1,100 pieces.
    let blocks: Vec<_> = (0..1100)
        .map(|_| pool.memalloc_async(2 * MIB, st).unwrap())
        .collect();
    let top = pool.memalloc_async(2 * MIB, st).unwrap();
    drop(blocks);
    // A request the hole cannot serve: its pieces move to the end, and their old
    // mappings wait for the stream's work (the events stay pending).
    let big = pool.memalloc_async(2600 * MIB, st).unwrap();
    let moved = pool.stats().counts.pieces_moved;
    assert!(moved > 1024, "only {moved} pieces moved");
    assert_eq!(
        pool.stats().counts.retire_waits,
        0,
        "a growth waited below the bound"
    );
    assert_eq!(s.unmaps.load(Ordering::Relaxed), 0);
    // The next growth finds more than 1,024 waiting: it waits for the oldest
    // (the host events complete when waited for) and unmaps them.
    let more = pool.memalloc_async(64 * MIB, st).unwrap();
    let stats = pool.stats();
    assert!(stats.counts.retire_waits > 0, "no wait counted: {stats:?}");
    assert!(
        stats.counts.pieces_unmapped > 0,
        "nothing unmapped after the wait"
    );
    let listed = stats
        .to_list()
        .into_iter()
        .find(|(n, _)| *n == emm_core::stat_names::RETIRE_WAITS)
        .map(|(_, v)| v);
    assert_eq!(listed, Some(stats.counts.retire_waits as u64));
    pool.check().unwrap();
    drop((top, big, more));
    pool.check().unwrap();
}

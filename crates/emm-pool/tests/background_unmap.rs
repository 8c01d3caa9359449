//! Old mappings of moved pieces unmapped by the pool's helper thread
//! (`pool_background_unmap`, on by default): the unmaps happen off the allocating
//! thread, each old mapping goes once, the arena turns the ranges into gaps at its
//! next growth or trim, a mapping the helper fails to unmap is tried again by the
//! arena, and a long run of moves stays consistent. (`retire.rs` tests the
//! arena's own unmapping, with the helper off.)

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use emm_core::{MemoryManager, Result};
use emm_default::HostUpstream;
use emm_pool::{
    EventId, EventSource, HostEvents, HostVmm, PoolConfig, PoolManager, PoolUpstream,
    SegmentPolicy, VirtualMemory,
};
use emm_sys::{CUdeviceptr, CUstream};

const MIB: usize = 1 << 20;

/// Host virtual memory that records which thread unmapped what, fails the
/// unmap of one address on request, and counts unmaps made while a growth maps
/// pieces (whose maps take `map_us` microseconds a piece, on request).
struct Recording {
    inner: HostVmm,
    unmaps: Arc<Mutex<Vec<(CUdeviceptr, ThreadId)>>>,
    /// The address whose unmap fails; 0: none.
    fail_at: Arc<AtomicUsize>,
    /// A `map_pieces` call is under way.
    mapping: Arc<AtomicBool>,
    /// Unmaps made while one was.
    overlaps: Arc<AtomicUsize>,
    /// Microseconds each piece of a `map_pieces` call takes.
    map_us: Arc<AtomicU64>,
}

impl VirtualMemory for Recording {
    fn reserve(&self, size: usize) -> Result<CUdeviceptr> {
        self.inner.reserve(size)
    }
    fn map(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.inner.map(addr, len)
    }
    fn alias(&self, src: CUdeviceptr, dst: CUdeviceptr, len: usize) -> Result<()> {
        self.inner.alias(src, dst, len)
    }
    fn map_pieces(
        &self,
        dst: CUdeviceptr,
        pieces: &[(Option<CUdeviceptr>, usize)],
    ) -> (usize, Result<()>) {
        self.mapping.store(true, Ordering::SeqCst);
        let mut at = dst;
        let mut done = (pieces.len(), Ok(()));
        for (i, &(src, len)) in pieces.iter().enumerate() {
            std::thread::sleep(Duration::from_micros(self.map_us.load(Ordering::Relaxed)));
            let r = match src {
                None => self.inner.map(at, len),
                Some(src) => self.inner.alias(src, at, len),
            };
            if let Err(e) = r {
                done = (i, Err(e));
                break;
            }
            at += len as u64;
        }
        self.mapping.store(false, Ordering::SeqCst);
        done
    }
    fn unmap(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        if self.mapping.load(Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        if addr as usize == self.fail_at.load(Ordering::Relaxed) {
            return Err(emm_core::EmmError::InvalidArgument {
                what: "unmap (a failure the test injects)",
                found: format!("{addr:#x}"),
                expected: "another address".into(),
            });
        }
        self.inner.unmap(addr, len)?;
        self.unmaps
            .lock()
            .unwrap()
            .push((addr, std::thread::current().id()));
        Ok(())
    }
}

/// The stand-in's manual events, except that a wait blocks until the test
/// completes the event (as a GPU's does until the device gets there), where
/// `HostEvents::wait` completes it.
struct Blocking(Arc<HostEvents>);

impl EventSource for Blocking {
    fn record(&self, stream: CUstream) -> Result<EventId> {
        self.0.record(stream)
    }
    fn is_complete(&self, id: EventId) -> Result<bool> {
        self.0.is_complete(id)
    }
    fn wait(&self, id: EventId) -> Result<()> {
        while !self.0.is_complete(id)? {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
    fn stream_wait(&self, stream: CUstream, id: EventId) -> Result<()> {
        self.0.stream_wait(stream, id)
    }
    fn recycle(&self, id: EventId) {
        self.0.recycle(id)
    }
    fn synchronize_all(&self) -> Result<()> {
        self.0.synchronize_all()
    }
}

struct Setup {
    pool: PoolManager,
    unmaps: Arc<Mutex<Vec<(CUdeviceptr, ThreadId)>>>,
    fail_at: Arc<AtomicUsize>,
    overlaps: Arc<AtomicUsize>,
    map_us: Arc<AtomicU64>,
    events: Arc<HostEvents>,
    base: CUdeviceptr,
}

fn setup() -> Setup {
    setup_with(false)
}

/// With `blocking`, the helper's waits block until the test completes events.
fn setup_with(blocking: bool) -> Setup {
    let host = Arc::new(HostUpstream::new(4 << 30, false));
    let unmaps = Arc::new(Mutex::new(Vec::new()));
    let fail_at = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let map_us = Arc::new(AtomicU64::new(0));
    let vmm = Recording {
        inner: HostVmm::new(host.clone()),
        unmaps: unmaps.clone(),
        fail_at: fail_at.clone(),
        mapping: Arc::new(AtomicBool::new(false)),
        overlaps: overlaps.clone(),
        map_us: map_us.clone(),
    };
    let config = PoolConfig {
        segments: SegmentPolicy {
            expandable_reserve: 1 << 40,
            ..SegmentPolicy::default()
        },
        thread_cache_blocks: 0,
        ..PoolConfig::default()
    };
    assert!(config.background_unmap, "the helper is on by default");
    let events = Arc::new(HostEvents::manual());
    let source: Box<dyn EventSource> = if blocking {
        Box::new(Blocking(events.clone()))
    } else {
        Box::new(events.clone())
    };
    let pool = PoolManager::with_config(
        PoolUpstream::Custom(Box::new(host), source, Some(Box::new(vmm)), None),
        config,
    )
    .unwrap();
    // The expandable segment's reservation starts where its first block does.
    let first = pool.memalloc_async(2 * MIB, stream()).unwrap();
    let base = first.ptr();
    drop(first);
    Setup {
        pool,
        unmaps,
        fail_at,
        overlaps,
        map_us,
        events,
        base,
    }
}

/// How many times each of `addrs` was unmapped.
fn unmap_counts(s: &Setup, addrs: &[CUdeviceptr]) -> Vec<usize> {
    let unmaps = s.unmaps.lock().unwrap();
    addrs
        .iter()
        .map(|a| unmaps.iter().filter(|(x, _)| x == a).count())
        .collect()
}

/// A created stream (its events are recorded on it).
fn stream() -> CUstream {
    CUstream(7 as *mut core::ffi::c_void)
}

/// A hole of 64 MiB below a live block, then a request that does not fit: the
/// hole's pieces move to the end, and their old mappings go to the helper.
/// Returns the live blocks, the hole's address and the pieces moved. With
/// `refuse`, the unmap of the hole's first piece (at its start) fails.
fn move_a_hole(s: &Setup, refuse: bool) -> ([emm_core::DeviceAllocation; 2], CUdeviceptr, usize) {
    let (pool, st) = (&s.pool, stream());
    let a = pool.memalloc_async(64 * MIB, st).unwrap();
    let b = pool.memalloc_async(64 * MIB, st).unwrap();
    let hole = a.ptr();
    if refuse {
        s.fail_at.store(hole as usize, Ordering::Relaxed);
    }
    drop(a);
    let c = pool.memalloc_async(200 * MIB, st).unwrap();
    let moved = pool.stats().counts.pieces_moved;
    assert!(moved > 1, "the hole moved {moved} pieces");
    ([b, c], hole, moved)
}

/// Round `round` of the long runs' pattern (as `retire.rs`'s): a hole below a
/// live block, then a request larger than the hole, whose growth moves the
/// hole's pieces. Returns the two live blocks and the hole's size in MiB.
fn hole_then_larger(
    pool: &PoolManager,
    st: CUstream,
    round: usize,
) -> (
    emm_core::DeviceAllocation,
    emm_core::DeviceAllocation,
    usize,
) {
    let small = 40 + (round % 7) * 6;
    let a = pool.memalloc_async(small * MIB, st).unwrap();
    let b = pool.memalloc_async(24 * MIB, st).unwrap();
    drop(a);
    let c = pool.memalloc_async((small + 30) * MIB, st).unwrap();
    (b, c, small)
}

/// Whether a thread other than this one (the helper) unmapped anything.
fn helper_unmapped(s: &Setup) -> bool {
    let me = std::thread::current().id();
    s.unmaps.lock().unwrap().iter().any(|&(_, t)| t != me)
}

/// Waits (up to 30 s) until the helper unmapped something.
fn wait_for_the_helper(s: &Setup) {
    let start = Instant::now();
    while !helper_unmapped(s) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits (up to 30 s) until `n` unmaps were recorded.
fn wait_for_unmaps(s: &Setup, n: usize) {
    let start = Instant::now();
    while s.unmaps.lock().unwrap().len() < n && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn old_mappings_are_unmapped_once_by_the_helper_thread_and_become_gaps() {
    let s = setup();
    let pool = &s.pool;
    let (live, hole, moved) = move_a_hole(&s, false);
    wait_for_unmaps(&s, moved);
    let me = std::thread::current().id();
    let old: Vec<CUdeviceptr> = {
        let unmaps = s.unmaps.lock().unwrap();
        assert_eq!(unmaps.len(), moved, "each old mapping is unmapped once");
        assert!(
            unmaps.iter().all(|&(_, t)| t != me),
            "an old mapping was unmapped on the allocating thread"
        );
        unmaps.iter().map(|&(a, _)| a).collect()
    };
    assert!(old.contains(&hole));
    pool.check().unwrap();
    // A trim takes what the helper did (waiting for it if it is not done) and
    // turns the ranges into gaps; no old mapping is unmapped again.
    pool.trim();
    assert!(pool.stats().counts.pieces_unmapped >= moved);
    assert!(
        unmap_counts(&s, &old).iter().all(|&n| n == 1),
        "unmapped twice"
    );
    pool.check().unwrap();
    drop(live);
    pool.trim();
    pool.check().unwrap();
}

#[test]
fn the_helper_waits_for_the_moved_pieces_work() {
    let s = setup_with(true);
    let pool = &s.pool;
    let (live, _, moved) = move_a_hole(&s, false);
    // The stream's work is not done: the helper waits, nothing is unmapped.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        s.unmaps.lock().unwrap().len(),
        0,
        "unmapped before the work was done"
    );
    // The device gets there: the helper unmaps them.
    s.events.complete_all();
    wait_for_unmaps(&s, moved);
    assert_eq!(s.unmaps.lock().unwrap().len(), moved);
    drop(live);
    pool.trim();
    pool.check().unwrap();
}

/// A reset after the helper unmapped the old mappings, before the arena took
/// its result: each mapping is unmapped once, and the pool keeps its
/// reservation (a failed unmap during a reset would make it reserve anew).
#[test]
fn a_reset_after_the_helper_unmaps_each_mapping_once() {
    let s = setup();
    let (pool, st) = (&s.pool, stream());
    let (live, _, moved) = move_a_hole(&s, false);
    wait_for_unmaps(&s, moved);
    let old: Vec<CUdeviceptr> = s.unmaps.lock().unwrap().iter().map(|&(a, _)| a).collect();
    drop(live);
    pool.reset().unwrap();
    assert!(
        unmap_counts(&s, &old).iter().all(|&n| n == 1),
        "unmapped twice"
    );
    pool.check().unwrap();
    let again = pool.memalloc_async(64 * MIB, st).unwrap();
    assert_eq!(
        again.ptr(),
        s.base,
        "the pool reserved new address space after its reset"
    );
    drop(again);
    pool.check().unwrap();
}

#[test]
fn a_mapping_the_helper_fails_to_unmap_is_unmapped_by_the_arena_later() {
    let s = setup();
    let pool = &s.pool;
    // The hole's first piece (at the hole's start) refuses to go.
    let (live, hole, moved) = move_a_hole(&s, true);
    wait_for_unmaps(&s, moved - 1);
    let me = std::thread::current().id();
    assert!(
        s.unmaps.lock().unwrap().iter().all(|&(_, t)| t != me),
        "the old mappings were unmapped on the allocating thread"
    );
    // A trim waits for the helper's job and takes what it did; the refused
    // mapping stays, and while it does no free piece is unmapped either.
    pool.trim();
    assert_eq!(pool.stats().counts.pieces_unmapped, moved - 1);
    pool.check().unwrap();
    // The fault clears: the next trim unmaps it, on this thread.
    s.fail_at.store(0, Ordering::Relaxed);
    drop(live);
    pool.trim();
    // (The trim unmaps the segment's free pieces too.)
    assert!(pool.stats().counts.pieces_unmapped >= moved);
    assert!(
        s.unmaps
            .lock()
            .unwrap()
            .iter()
            .any(|&(addr, t)| addr == hole && t == me),
        "the arena did not unmap the mapping the helper failed"
    );
    pool.check().unwrap();
}

/// The pattern of `retire.rs`'s long run (a hole, then a larger request), 300
/// rounds, with the helper unmapping as it goes: every block stays distinct, the
/// pool stays consistent, and a trim at the end leaves no old mapping behind.
#[test]
fn a_long_run_of_moves_with_the_helper_stays_consistent() {
    let s = setup();
    let (pool, st) = (&s.pool, stream());
    let keep = pool.memalloc_async(32 * MIB, st).unwrap();
    for round in 0..300usize {
        let (b, c, small) = hole_then_larger(pool, st, round);
        let (bp, cp) = (b.ptr(), c.ptr());
        assert!(
            bp + 24 * MIB as u64 <= cp || cp + ((small + 30) * MIB) as u64 <= bp,
            "round {round}: live blocks overlap"
        );
        drop((b, c));
        if round == 0 {
            // The helper gets to the first job before the run goes on (on a busy
            // machine it may start late, and the arena takes back every job it
            // has not started once too many wait).
            wait_for_the_helper(&s);
        }
        if round % 50 == 0 {
            pool.check().unwrap();
        }
    }
    drop(keep);
    pool.trim();
    let counts = pool.stats().counts;
    assert!(
        counts.pieces_moved > 300,
        "moved only {}",
        counts.pieces_moved
    );
    // Every old mapping went (by the helper or, when needed at once, the arena),
    // each once.
    let unmaps = s.unmaps.lock().unwrap().len();
    assert!(
        unmaps >= counts.pieces_moved,
        "{unmaps} unmaps for {} moves",
        counts.pieces_moved
    );
    assert!(counts.pieces_unmapped >= counts.pieces_moved);
    assert!(helper_unmapped(&s), "the helper unmapped nothing");
    pool.check().unwrap();
}

/// The helper does not unmap while a growth maps pieces: the driver runs these
/// calls one at a time, so an unmap in between would lengthen the growth on the
/// allocating thread. With maps slowed to 200 us a piece and the helper busy
/// with the previous growths' old mappings, no unmap lands inside a growth's
/// maps, and the helper still does the unmapping.
#[test]
fn the_helper_does_not_unmap_while_a_growth_maps() {
    let s = setup();
    s.map_us.store(200, Ordering::Relaxed);
    let (pool, st) = (&s.pool, stream());
    let keep = pool.memalloc_async(32 * MIB, st).unwrap();
    for round in 0..40usize {
        drop(hole_then_larger(pool, st, round));
    }
    let moved = pool.stats().counts.pieces_moved;
    assert!(moved > 40, "moved only {moved}");
    wait_for_the_helper(&s);
    assert!(helper_unmapped(&s), "the helper unmapped nothing");
    assert_eq!(
        s.overlaps.load(Ordering::SeqCst),
        0,
        "the helper unmapped while a growth mapped"
    );
    drop(keep);
    pool.check().unwrap();
}

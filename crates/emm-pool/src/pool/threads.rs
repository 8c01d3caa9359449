//! Each thread's counters and caches for a pool, and the thread-local registry
//! that finds them. A thread's [`Local`] holds its pool weakly, as a
//! [`CacheOwner`]: the thread's exit gives the cached blocks back to whatever
//! owns them, without this file knowing the pool's type.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::owner_lock::{self, OwnerLock};
use crate::stream_key::StreamKey;
use crate::thread_cache::StreamCache;

/// What takes a thread's cached blocks back when the thread exits.
pub(super) trait CacheOwner: Send + Sync {
    /// The thread owning `counters` is exiting: its cached blocks go back.
    fn thread_exited(&self, counters: &ThreadCounters);
}

/// Counters one thread writes and others read (single writer: no contention),
/// and the thread's caches. Aligned so that two threads' counters never share a
/// cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct ThreadCounters {
    pub(super) live_blocks: AtomicU64,
    pub(super) freed_blocks: AtomicU64,
    pub(super) allocations: AtomicU64,
    pub(super) hits: AtomicU64,
    /// Bytes of freed blocks sitting in this thread's cache (live to the arena,
    /// free to the user). Written only under `caches`' lock.
    pub(super) cached_bytes: AtomicU64,
    /// Bytes handed out by this thread so far (rounded).
    pub(super) allocated_total: AtomicU64,
    /// The streams this thread's caches may hold blocks of, one bit each (see
    /// [`stream_bit`]): set when a block is cached, made exact again whenever
    /// the caches are flushed. Written only by whoever holds `caches` (its
    /// owner, or a thread that claimed them); read by any thread, so that
    /// taking back one stream's blocks claims only threads that may hold some
    /// (a claim costs every thread a process-wide barrier). A bit may be stale
    /// the other way (set for a stream whose blocks were taken since): that
    /// costs a claim that finds nothing, as before the mask.
    pub(super) cached_streams: AtomicU64,
    /// The thread's cached blocks, per stream: at most [`MAX_STREAM_CACHES`](super::config::MAX_STREAM_CACHES),
    /// oldest first. Its own thread enters it on every call (a biased lock, no
    /// atomic read-modify-write); another thread only claims it, while it holds
    /// the arena, to take blocks back before the pool grows, on out of memory or
    /// on trim (see `Core::reclaim_cached`).
    pub(super) caches: OwnerLock<Vec<StreamCache>>,
}

/// This thread's caches, entered as their owner.
///
/// Callers pass the counters of this thread's own `Local` (reached through
/// `LOCALS`, which no other thread can reach), and never hold another guard of
/// them at the same time.
pub(super) fn caches_of(c: &ThreadCounters) -> owner_lock::Guard<'_, Vec<StreamCache>> {
    // SAFETY: per this function's contract, the calling thread owns `c` (its
    // `Local` lives in this thread's `LOCALS`) and holds no guard of it.
    unsafe { c.caches.enter() }
}

pub(super) fn add_cached(c: &ThreadCounters, delta: i64) {
    let v = &c.cached_bytes;
    v.store(
        v.load(Ordering::Relaxed).wrapping_add(delta as u64),
        Ordering::Relaxed,
    );
}

/// The bit of `cached_streams` standing for `stream` (a hash of its key:
/// streams are pointers, so their low bits say little; two streams may share a
/// bit, which costs only a claim that finds nothing).
pub(super) fn stream_bit(stream: StreamKey) -> u64 {
    1 << ((stream as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58)
}

/// Whether `c`'s thread may hold cached blocks of a stream in `mask` (bits of
/// [`stream_bit`]; `u64::MAX` for any): what a claim of its caches could take.
pub(super) fn may_cache(c: &ThreadCounters, mask: u64) -> bool {
    c.cached_bytes.load(Ordering::Relaxed) > 0
        && c.cached_streams.load(Ordering::Relaxed) & mask != 0
}

/// Notes that `c`'s thread cached a block of `stream` (its caches are held).
pub(super) fn mark_cached(c: &ThreadCounters, stream: StreamKey) {
    let (v, bit) = (c.cached_streams.load(Ordering::Relaxed), stream_bit(stream));
    if v & bit == 0 {
        c.cached_streams.store(v | bit, Ordering::Relaxed);
    }
}

/// Makes `c`'s mask of streams exact for `caches` (its caches, held by the
/// caller), after blocks left them.
pub(super) fn remark_cached(c: &ThreadCounters, caches: &[StreamCache]) {
    let mask = caches
        .iter()
        .filter(|sc| sc.blocks() > 0)
        .fold(0, |m, sc| m | stream_bit(sc.stream));
    c.cached_streams.store(mask, Ordering::Relaxed);
}

pub(super) fn bump(c: &AtomicU64) {
    add(c, 1);
}

/// Adds to a counter only its own thread writes (a load and a store, no
/// read-modify-write).
pub(super) fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// A thread's caches for one pool. It holds the pool weakly: a dropped pool is
/// gone at once (its events, context and address reservation released), and a
/// thread that outlives it just discards its stale entries.
pub(super) struct Local {
    pub(super) id: usize,
    pub(super) core: Weak<dyn CacheOwner>,
    /// The thread's counters and caches (shared with `Core::threads`).
    pub(super) counters: Arc<ThreadCounters>,
}

impl Drop for Local {
    fn drop(&mut self) {
        if emm_sys::forked() {
            // A child forked after CUDA was initialised: the pool (and its lock,
            // perhaps held by a parent thread that does not exist here) is the
            // parent's; a thread exiting here gives nothing back.
            return;
        }
        let Some(owner) = self.core.upgrade() else {
            return; // the pool is gone, and its memory with it
        };
        owner.thread_exited(&self.counters);
    }
}

thread_local! {
    pub(super) static LOCALS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

pub(super) static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

//! [`PoolManager`]: the caching pool as an emm plugin.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use emm_core::{
    DeferGuard, DeferState, DeviceAllocation, DeviceRelease, DeviceView, EmmError, HostAllocFlags,
    HostMemory, IpcHandle, ManagedAttach, ManagedMemory, ManagedStats, ManagerStats, MemoryInfo,
    MemoryManager, MemorySnapshot, Released, Result, StatList, TraceAction, SYNC_STREAM,
};
use emm_default::{DriverUpstream, HostOnly, HostUpstream, Managed, PendingConfig, Upstream};
use emm_driver::Context;
use emm_sys::{CUdeviceptr, CUstream};

use crate::arena::{
    is_per_thread, per_thread_key_of, per_thread_number, round_size, stream_id, stream_key, Arena,
    SegmentPolicy, SegmentSource, StreamKey,
};
use crate::events::{DriverEvents, EventSource, HostEvents};
use crate::owner_lock::{self, OwnerLock};
use crate::thread_cache::{Entry, StreamCache};
use crate::vmm::{DriverVmm, HostVmm, VirtualMemory};

/// Configuration of a [`PoolManager`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolConfig {
    /// Segment sizes.
    pub segments: SegmentPolicy,
    /// Largest number of bytes the pool may reserve (`None`: the device's memory).
    pub limit: Option<usize>,
    /// Blocks a thread keeps per stream for immediate reuse.
    pub thread_cache_blocks: usize,
    /// Bytes a thread keeps per stream for immediate reuse.
    pub thread_cache_bytes: usize,
    /// Reserved bytes above which `release_cached` and a free's trim check give
    /// wholly free segments back (`usize::MAX`: only on `trim()` or out of memory).
    pub release_threshold: usize,
    /// The expandable segment's pieces are created exportable as POSIX file
    /// descriptors, so that `get_ipc_handle` of a block there gives an
    /// [`IpcHandle::Vmm`] another process opens (legacy CUDA IPC cannot export
    /// virtual memory). Off by default (`EMM_POOL_EXPORTABLE`; `emm.numba_plugin`
    /// turns it on); see `export.rs` for the contract.
    pub exportable: bool,
}

impl PoolConfig {
    /// The defaults, with `EMM_POOL_EXPANDABLE` (`0`/`false` turns the expandable
    /// segment off, e.g. for legacy IPC of every block), `EMM_POOL_EXPORTABLE`
    /// (`1`/`true`: blocks of the expandable segment export by file descriptor),
    /// `EMM_POOL_LEGACY_MERGE`
    /// (without the expandable segment: merge wholly free large segments when live
    /// bytes fall to 1/n of reserved; 0 off, see `SegmentPolicy::merge_quiet`),
    /// `EMM_POOL_THREAD_CACHE`
    /// (bytes per thread and stream; 0 turns thread caches off) and `EMM_POOL_LIMIT`
    /// (bytes) applied. An invalid value is an error naming the variable.
    pub fn from_env() -> Result<PoolConfig> {
        let mut c = PoolConfig::default();
        if let Ok(v) = emm_core::config::var("EMM_POOL_EXPANDABLE") {
            c.segments.expandable = env_bool("EMM_POOL_EXPANDABLE", v, true)?;
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_EXPORTABLE") {
            c.exportable = env_bool("EMM_POOL_EXPORTABLE", v, false)?;
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_THREAD_CACHE") {
            if !v.trim().is_empty() {
                c.thread_cache_bytes = emm_core::parse_bytes(&v)
                    .and_then(|n| usize::try_from(n).map_err(|_| "too large".to_owned()))
                    .map_err(|reason| EmmError::InvalidConfig {
                        name: "EMM_POOL_THREAD_CACHE".into(),
                        value: v.clone(),
                        reason,
                    })?;
                if c.thread_cache_bytes == 0 {
                    c.thread_cache_blocks = 0;
                }
            }
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_LEGACY_MERGE") {
            if !v.trim().is_empty() {
                let n: usize = v.trim().parse().map_err(|_| EmmError::InvalidConfig {
                    name: "EMM_POOL_LEGACY_MERGE".into(),
                    value: v.clone(),
                    reason: "expected a count (0: off)".into(),
                })?;
                c.segments.merge_quiet = (n > 0).then_some(n);
            }
        }
        if let Ok(v) = emm_core::config::var("EMM_POOL_LIMIT") {
            if !v.trim().is_empty() {
                c.limit = Some(
                    emm_core::parse_bytes(&v)
                        .and_then(|n| usize::try_from(n).map_err(|_| "too large".to_owned()))
                        .map_err(|reason| EmmError::InvalidConfig {
                            name: "EMM_POOL_LIMIT".into(),
                            value: v.clone(),
                            reason,
                        })?,
                );
            }
        }
        Ok(c)
    }
}

/// A boolean variable's value (`empty`: what an empty value means).
fn env_bool(name: &str, v: String, empty: bool) -> Result<bool> {
    match v.trim() {
        "" => Ok(empty),
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(EmmError::InvalidConfig {
            name: name.into(),
            value: v,
            reason: "expected 0 or 1".into(),
        }),
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            segments: SegmentPolicy::default(),
            limit: None,
            thread_cache_blocks: 256,
            thread_cache_bytes: 512 << 20,
            release_threshold: usize::MAX,
            exportable: false,
        }
    }
}

/// Statistics of a pool, with PyTorch's `memory_stats` names where they fit
/// ([`PoolStats::to_list`] gives them under those names).
///
/// Blocks a thread keeps in its cache for reuse are free to callers but not to
/// the rest of the pool: they count in `active_bytes` (PyTorch's "active": held, or
/// freed but not yet reusable by everyone), not in `allocated_bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// `allocated_bytes.all.current`: bytes in blocks held by callers (rounded;
    /// blocks waiting in thread caches are not counted).
    pub allocated_bytes: usize,
    /// `allocated_bytes.all.peak`: the peak of `allocated_bytes`, sampled (with no
    /// cost on the lock-free path) at every allocation that takes the pool's lock
    /// and at every statistics query or snapshot. Exact when every allocation takes
    /// the lock (`thread_cache_blocks` 0); otherwise a peak reached by thread-cache
    /// hits alone and undone before the next sample is missed. Never above
    /// `active_bytes_peak`, never below `allocated_bytes`.
    pub allocated_bytes_peak: usize,
    /// `allocated_bytes.all.allocated`: bytes handed to callers so far (rounded).
    pub allocated_bytes_total: u64,
    /// `allocation.all.current`: blocks held by callers.
    pub allocated_blocks: usize,
    /// `allocation.all.peak`, sampled as `allocated_bytes_peak`.
    pub allocated_blocks_peak: usize,
    /// `active_bytes.all.current`: bytes of live blocks, callers' and those parked
    /// in thread caches.
    pub active_bytes: usize,
    /// `active_bytes.all.peak` (exact).
    pub active_bytes_peak: usize,
    /// Bytes parked in thread caches (`active_bytes - allocated_bytes`).
    pub thread_cached_bytes: usize,
    /// `inactive_split_bytes.all.current`: free bytes in blocks that are not a
    /// whole segment.
    pub inactive_split_bytes: usize,
    /// `segment.all.peak`.
    pub segments_peak: usize,
    /// `num_ooms`: allocations that failed for lack of memory.
    pub num_ooms: usize,
    /// `reserved_bytes.all.current`: bytes held from the upstream.
    pub reserved_bytes: usize,
    /// `reserved_bytes.all.peak`.
    pub reserved_bytes_peak: usize,
    /// `num_alloc_retries`-like: out-of-memory ladders run.
    pub num_alloc_retries: usize,
    /// `num_device_alloc`: segments taken from the upstream.
    pub num_device_alloc: usize,
    /// `num_device_free`: segments given back.
    pub num_device_free: usize,
    /// `segment.all.current`.
    pub segments: usize,
    /// Allocations served (all paths).
    pub allocations: u64,
    /// Allocations served by a thread's cache (no lock, no driver call).
    pub thread_cache_hits: u64,
    /// Allocations served from the shared free blocks.
    pub shared_hits: usize,
    /// Blocks reused by another stream after their event completed.
    pub cross_stream_reuses: usize,
    /// Requests that took the locked path (a thread-cache miss or a large block).
    pub locked_allocs: usize,
    /// Blocks given back to the shared arena (cache flushes, large blocks).
    pub locked_frees: usize,
    /// Events recorded for cross-stream ordering.
    pub events_recorded: usize,
    /// Event completion queries.
    pub event_queries: usize,
    /// Device-wide synchronizations (out-of-memory ladder, trim).
    pub device_syncs: usize,
    /// Allocations that needed new memory from the upstream.
    pub misses: usize,
    /// Per-stream entries visited by scans over streams: grows linearly with the
    /// number of streams a program uses (a test asserts it).
    pub scan_steps: usize,
    /// Synchronizations made to give back wholly free large segments instead of
    /// growing (without the expandable segment; `SegmentPolicy::tight_percent`).
    pub tightenings: usize,
    /// Wholly free large segments merged into one without the expandable segment
    /// (`EMM_POOL_LEGACY_MERGE`).
    pub merges: usize,
    /// Pieces of the expandable segment mapped with new memory (one driver call each).
    pub pieces_mapped: usize,
    /// Pieces of the expandable segment whose memory moved (mapped again where
    /// growth needed memory, instead of new memory; one driver call each).
    pub pieces_moved: usize,
    /// Mappings of the expandable segment unmapped without a synchronization of
    /// their own (one driver call each), their address space used again: old
    /// mappings of moved pieces once their work was done, and idle pieces `trim`
    /// gave back.
    pub pieces_unmapped: usize,
}

impl PoolStats {
    /// The counters under PyTorch's `memory_stats` names where they mean the same,
    /// emm's own under `emm.`.
    pub fn to_list(&self) -> StatList {
        let u = |v: usize| v as u64;
        let freed_bytes = self
            .allocated_bytes_total
            .saturating_sub(u(self.allocated_bytes));
        vec![
            ("allocated_bytes.all.current", u(self.allocated_bytes)),
            ("allocated_bytes.all.peak", u(self.allocated_bytes_peak)),
            ("allocated_bytes.all.allocated", self.allocated_bytes_total),
            ("allocated_bytes.all.freed", freed_bytes),
            ("reserved_bytes.all.current", u(self.reserved_bytes)),
            ("reserved_bytes.all.peak", u(self.reserved_bytes_peak)),
            ("active_bytes.all.current", u(self.active_bytes)),
            ("active_bytes.all.peak", u(self.active_bytes_peak)),
            (
                "inactive_split_bytes.all.current",
                u(self.inactive_split_bytes),
            ),
            ("segment.all.current", u(self.segments)),
            ("segment.all.peak", u(self.segments_peak)),
            ("allocation.all.current", u(self.allocated_blocks)),
            ("allocation.all.peak", u(self.allocated_blocks_peak)),
            ("allocation.all.allocated", self.allocations),
            (
                "allocation.all.freed",
                self.allocations.saturating_sub(u(self.allocated_blocks)),
            ),
            ("num_alloc_retries", u(self.num_alloc_retries)),
            ("num_ooms", u(self.num_ooms)),
            ("num_device_alloc", u(self.num_device_alloc)),
            ("num_device_free", u(self.num_device_free)),
            ("emm.thread_cached_bytes", u(self.thread_cached_bytes)),
            ("emm.thread_cache_hits", self.thread_cache_hits),
            ("emm.shared_hits", u(self.shared_hits)),
            ("emm.cross_stream_reuses", u(self.cross_stream_reuses)),
            ("emm.locked_allocs", u(self.locked_allocs)),
            ("emm.locked_frees", u(self.locked_frees)),
            ("emm.events_recorded", u(self.events_recorded)),
            ("emm.event_queries", u(self.event_queries)),
            ("emm.device_syncs", u(self.device_syncs)),
            ("emm.misses", u(self.misses)),
            ("emm.scan_steps", u(self.scan_steps)),
            ("emm.pieces_mapped", u(self.pieces_mapped)),
            ("emm.pieces_moved", u(self.pieces_moved)),
            ("emm.pieces_unmapped", u(self.pieces_unmapped)),
            ("emm.tightenings", u(self.tightenings)),
            ("emm.merges", u(self.merges)),
        ]
    }
}

struct SourceAdapter<'a>(&'a dyn Upstream, Option<&'a dyn VirtualMemory>);

impl<'a> SourceAdapter<'a> {
    fn vmm(&self, operation: &'static str) -> Result<&'a dyn VirtualMemory> {
        self.1.ok_or(EmmError::Unsupported {
            manager: "pool".into(),
            operation,
        })
    }
}

impl SegmentSource for SourceAdapter<'_> {
    fn reserve(&self, size: usize) -> Result<Option<CUdeviceptr>> {
        match self.1 {
            Some(v) => v.reserve(size).map(Some),
            None => Ok(None),
        }
    }
    fn unmap(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.vmm("unmap")?.unmap(addr, len)
    }
    fn unmap_done(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.vmm("unmap")?.unmap_done(addr, len)
    }
    fn map_pieces(
        &self,
        dst: CUdeviceptr,
        pieces: &[(Option<CUdeviceptr>, usize)],
    ) -> (usize, Result<()>) {
        match self.vmm("map_pieces") {
            Ok(v) => v.map_pieces(dst, pieces),
            Err(e) => (0, Err(e)),
        }
    }
    fn alloc_segment(&self, size: usize) -> Result<CUdeviceptr> {
        self.0.alloc(size)
    }
    fn free_segment(&self, base: CUdeviceptr, size: usize) -> Result<()> {
        // SAFETY: the arena gives back only segments it took from this upstream,
        // once, and only when every block in them is free.
        unsafe { self.0.free(base, size) }
    }
    fn device_info(&self) -> (usize, usize) {
        self.0
            .mem_info()
            .map(|i| (i.free, i.total))
            .unwrap_or((0, 0))
    }
}

/// Counters one thread writes and others read (single writer: no contention),
/// and the thread's caches. Aligned so that two threads' counters never share a
/// cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct ThreadCounters {
    live_blocks: AtomicU64,
    freed_blocks: AtomicU64,
    allocations: AtomicU64,
    hits: AtomicU64,
    /// Bytes of freed blocks sitting in this thread's cache (live to the arena,
    /// free to the user). Written only under `caches`' lock.
    cached_bytes: AtomicU64,
    /// Bytes handed out by this thread so far (rounded).
    allocated_total: AtomicU64,
    /// The thread's cached blocks, per stream: at most [`MAX_STREAM_CACHES`],
    /// oldest first. Its own thread enters it on every call (a biased lock, no
    /// atomic read-modify-write); another thread only claims it, while it holds
    /// the arena, to take blocks back before the pool grows, on out of memory or
    /// on trim (see `Core::reclaim_cached`).
    caches: OwnerLock<Vec<StreamCache>>,
}

/// This thread's caches, entered as their owner.
///
/// Callers pass the counters of this thread's own `Local` (reached through
/// `LOCALS`, which no other thread can reach), and never hold another guard of
/// them at the same time.
fn caches_of(c: &ThreadCounters) -> owner_lock::Guard<'_, Vec<StreamCache>> {
    // SAFETY: per this function's contract, the calling thread owns `c` (its
    // `Local` lives in this thread's `LOCALS`) and holds no guard of it.
    unsafe { c.caches.enter() }
}

fn add_cached(c: &ThreadCounters, delta: i64) {
    let v = &c.cached_bytes;
    v.store(
        v.load(Ordering::Relaxed).wrapping_add(delta as u64),
        Ordering::Relaxed,
    );
}

fn bump(c: &AtomicU64) {
    add(c, 1);
}

/// Adds to a counter only its own thread writes (a load and a store, no
/// read-modify-write).
fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

pub(crate) struct Core {
    id: usize,
    name: &'static str,
    arena: Mutex<Arena>,
    upstream: Box<dyn Upstream>,
    vmm: Option<Box<dyn VirtualMemory>>,
    events: Box<dyn EventSource>,
    config: PoolConfig,
    generation: AtomicUsize,
    threads: Mutex<Vec<Arc<ThreadCounters>>>,
    orphan: ThreadCounters,
    host: Option<HostOnly>,
    /// Managed memory: passed through to the driver, never into segments.
    managed: Option<Managed>,
    ctx: Option<Context>,
    defer: Arc<DeferState>,
    /// The history is being recorded (the arena's ring has room), for the
    /// lock-free path, which reads it relaxed.
    recording: AtomicBool,
    /// Segments whose free the upstream refused on reset or drop, freed again by
    /// the next trim, reset or drop.
    refused: crate::refused::Refused,
}

/// A thread's caches for one pool. It holds the pool weakly: a dropped pool is
/// gone at once (its events, context and address reservation released), and a
/// thread that outlives it just discards its stale entries.
struct Local {
    id: usize,
    core: Weak<Core>,
    /// The thread's counters and caches (shared with `Core::threads`).
    counters: Arc<ThreadCounters>,
}

/// Streams a thread keeps cached blocks for, per pool. A thread that frees on more
/// streams gives the oldest stream's blocks back to the arena: lookups stay a short
/// scan, and a program that cycles through thousands of streams does not strand a
/// cache on each.
pub const MAX_STREAM_CACHES: usize = 16;

/// The most a thread caches per stream in a pool without the expandable segment
/// (see `Core::cache_bytes`).
pub const NO_VMM_CACHE_BYTES: usize = 64 << 20;

impl Drop for Local {
    fn drop(&mut self) {
        if emm_sys::forked() {
            // A child forked after CUDA was initialised: the pool (and its lock,
            // perhaps held by a parent thread that does not exist here) is the
            // parent's; a thread exiting here gives nothing back.
            return;
        }
        let Some(core) = self.core.upgrade() else {
            return; // the pool is gone, and its memory with it
        };
        let mut caches = caches_of(&self.counters);
        let mut arena = core.lock();
        let gen = core.generation.load(Ordering::Acquire);
        for mut sc in caches.drain(..) {
            let stream = sc.stream;
            sc.drain(|e| {
                if e.generation == gen {
                    arena.free(e.ptr, stream, None); // the stream may be gone
                }
            });
        }
        self.counters.cached_bytes.store(0, Ordering::Relaxed);
    }
}

thread_local! {
    static LOCALS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

impl Core {
    fn source(&self) -> SourceAdapter<'_> {
        SourceAdapter(self.upstream.as_ref(), self.vmm.as_deref())
    }

    fn lock(&self) -> MutexGuard<'_, Arena> {
        self.arena.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on this thread's cache for this pool (created on first use).
    fn with_local<R>(self: &Arc<Self>, f: impl FnOnce(&mut Local) -> R) -> Option<R> {
        LOCALS
            .try_with(|cell| {
                let mut locals = cell.try_borrow_mut().ok()?;
                let i = match locals.iter().position(|l| l.id == self.id) {
                    Some(i) => i,
                    None => {
                        // Forget the caches of pools dropped since.
                        locals.retain(|l| l.core.strong_count() > 0);
                        let counters = Arc::new(ThreadCounters::default());
                        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
                        self.fold_exited(&mut threads);
                        threads.push(counters.clone());
                        locals.push(Local {
                            id: self.id,
                            core: Arc::downgrade(self),
                            counters,
                        });
                        locals.len() - 1
                    }
                };
                Some(f(&mut locals[i]))
            })
            .ok()
            .flatten()
    }

    /// Gives a stream's cached blocks to the arena; `alive`: the stream is known
    /// to be usable now (events may be recorded on it).
    fn flush_stream(
        &self,
        arena: &mut Arena,
        sc: &mut StreamCache,
        counters: &ThreadCounters,
        gen: usize,
        alive: bool,
    ) -> bool {
        let events = if alive {
            Some(self.events.as_ref())
        } else {
            None
        };
        let (stream, bytes) = (sc.stream, sc.bytes());
        let mut any = false;
        sc.drain(|e| {
            if e.generation == gen {
                arena.free(e.ptr, stream, events);
                any = true;
            }
        });
        add_cached(counters, -(bytes as i64));
        any
    }

    /// Gives this thread's cached blocks of every stream back to the arena, without
    /// recording events (a stream may be gone).
    fn flush_thread(self: &Arc<Self>, arena: &mut Arena) {
        let gen = self.generation.load(Ordering::Acquire);
        let _ = self.with_local(|local| {
            for sc in caches_of(&local.counters).iter_mut() {
                self.flush_stream(arena, sc, &local.counters, gen, false);
            }
        });
    }

    /// Bytes a thread may cache per stream. Without the expandable segment, large
    /// blocks are whole segments of their exact size, which the pool gives back
    /// (instead of growing) only when they are free in the arena: a cache holding
    /// many of them counts as live there and let the recorded inference trace grow
    /// to 1.71x of live; such a pool caches at most [`NO_VMM_CACHE_BYTES`].
    fn cache_bytes(&self) -> usize {
        if self.vmm.is_some() && self.config.segments.expandable {
            self.config.thread_cache_bytes
        } else {
            self.config.thread_cache_bytes.min(NO_VMM_CACHE_BYTES)
        }
    }

    /// Gives blocks other threads cached back to the arena. With `Some(key)`
    /// (before the pool grows for stream `key`): every thread's blocks of that
    /// stream, with an event recorded on it (the caller allocates on it, so it is
    /// alive), so that memory parked in another thread's cache (the blocks
    /// PyTorch's autograd thread freed, when the next forward pass allocates on the
    /// main thread) is not reserved a second time. With `None` (out of memory,
    /// `trim`): every stream's blocks, without events (a stream may be gone: the
    /// blocks serve another stream after a device-wide synchronization). A cache
    /// whose thread holds it right now is skipped: that thread may be waiting for
    /// the arena, which the caller holds. `gen` is the generation read under the
    /// arena's lock. Returns whether any current block came back.
    fn reclaim_cached(&self, arena: &mut Arena, only: Option<StreamKey>, gen: usize) -> bool {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        // Claim every cache that holds blocks, then one process-wide barrier for
        // all of them (see `owner_lock`).
        let claims: Vec<_> = threads
            .iter()
            .filter(|t| t.cached_bytes.load(Ordering::Relaxed) > 0)
            .filter_map(|t| Some((t, t.caches.claim()?)))
            .collect();
        if claims.is_empty() {
            return false;
        }
        let barrier_ok = owner_lock::barrier();
        let mut any = false;
        for (t, claim) in claims {
            let Some(mut caches) = claim.confirm(barrier_ok) else {
                continue;
            };
            for sc in caches.iter_mut() {
                if sc.blocks() == 0 || only.is_some_and(|k| k != sc.stream) {
                    continue;
                }
                arena.stats.scan_steps += 1;
                any |= self.flush_stream(arena, sc, t, gen, only.is_some());
            }
        }
        any
    }

    fn alloc(self: &Arc<Self>, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        // In a forked child the cached blocks are the parent's: hand none out.
        emm_core::check_not_forked()?;
        if size == 0 {
            // SAFETY: a zero-length allocation owns nothing.
            return Ok(unsafe { DeviceAllocation::from_raw_parts(0, 0, stream, |_, _, _| {}) });
        }
        if size > isize::MAX as usize / 2 {
            return Err(EmmError::InvalidSize {
                requested: size,
                reason: "larger than any device",
            });
        }
        let rsize = round_size(size);
        let key = stream_key(stream);
        let gen = self.generation.load(Ordering::Acquire);
        // Fast path: this thread's cache for this stream, exact rounded size.
        let hit = self.with_local(|local| {
            bump(&local.counters.allocations);
            let mut caches = caches_of(&local.counters);
            let sc = caches.iter_mut().find(|s| s.stream == key)?;
            let e = sc.take(rsize, gen)?;
            add_cached(&local.counters, -(e.size as i64));
            bump(&local.counters.hits);
            bump(&local.counters.live_blocks);
            add(&local.counters.allocated_total, e.size as u64);
            Some(e)
        });
        let entry = match hit {
            Some(Some(e)) => {
                if self.recording.load(Ordering::Relaxed) {
                    self.lock()
                        .history
                        .push(TraceAction::Alloc, e.ptr, e.size, stream_id(key));
                }
                e
            }
            other => {
                let mut arena = self.lock();
                // Read again under the lock: a reset may have come in between, and
                // blocks are judged stale (never freed) or current by it below.
                let gen = self.generation.load(Ordering::Acquire);
                let source = self.source();
                let mut found = None;
                let on_thread = other.is_some();
                let cfg_caches = self.config.thread_cache_blocks > 0;
                if on_thread {
                    // A miss: serve it from the arena's free blocks if possible;
                    // before taking new memory, give this stream's cached blocks back
                    // so they can coalesce and serve it.
                    found = arena.try_alloc(rsize, key, self.events.as_ref(), &source, false)?;
                    if found.is_none() {
                        self.with_local(|local| {
                            let mut caches = caches_of(&local.counters);
                            if let Some(sc) = caches.iter_mut().find(|s| s.stream == key) {
                                self.flush_stream(&mut arena, sc, &local.counters, gen, true);
                            }
                        });
                        // Other threads' blocks of this stream, before growing.
                        if cfg_caches && self.reclaim_cached(&mut arena, Some(key), gen) {
                            found = arena.try_alloc(
                                rsize,
                                key,
                                self.events.as_ref(),
                                &source,
                                false,
                            )?;
                        }
                    }
                }
                let (ptr, base, base_size) = match found {
                    Some(f) => f,
                    None => match arena.alloc(rsize, key, self.events.as_ref(), &source) {
                        // Out of memory: every thread's cached blocks, of any
                        // stream, go back, and the request is tried once more.
                        Err(e)
                            if e.is_out_of_memory()
                                && cfg_caches
                                && self.reclaim_cached(&mut arena, None, gen) =>
                        {
                            arena.alloc(rsize, key, self.events.as_ref(), &source)?
                        }
                        r => r?,
                    },
                };
                // Counted live only once it exists (an error leaves no count behind).
                if on_thread {
                    self.with_local(|local| {
                        bump(&local.counters.live_blocks);
                        add(&local.counters.allocated_total, rsize as u64);
                    });
                } else {
                    // Shared by every thread without a cache: read-modify-write.
                    self.orphan.allocations.fetch_add(1, Ordering::Relaxed);
                    self.orphan.live_blocks.fetch_add(1, Ordering::Release);
                    self.orphan
                        .allocated_total
                        .fetch_add(rsize as u64, Ordering::Relaxed);
                }
                arena
                    .history
                    .push(TraceAction::Alloc, ptr, rsize, stream_id(key));
                if arena.stats.live > arena.stats.peak_allocated {
                    self.sample_peaks(&mut arena);
                }
                Entry {
                    ptr,
                    size: rsize,
                    base,
                    base_size,
                    generation: gen,
                }
            }
        };
        let core: *const Core = Arc::as_ptr(self);
        let owner: *const dyn DeviceRelease = core;
        // SAFETY: the block is live in the arena, owned by this core until released
        // through it; the core outlives every allocation (PoolManager's Drop leaks it
        // while any is live).
        Ok(unsafe {
            DeviceAllocation::with_borrowed_releaser(
                entry.ptr,
                size,
                stream,
                entry.base,
                entry.base_size,
                owner,
                pack_token(entry.generation, key),
            )
        })
    }

    fn give_back(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        stream: CUstream,
        token: usize,
        base: (CUdeviceptr, usize),
    ) {
        let gen = self.generation.load(Ordering::Acquire);
        let rsize = round_size(size);
        let (token_gen, owner) = unpack_token(token);
        let here = stream_key(stream);
        // A block allocated on one thread's per-thread stream and freed with that
        // handle on another thread belongs to the first thread's stream (the handle
        // names the calling thread's).
        let key = match owner {
            Some(o) if is_per_thread(stream) => o,
            _ => here,
        };
        let current = gen & GEN_MASK;
        let cfg = &self.config;
        if key != here {
            // Not this thread's stream: no event can be recorded on it from here,
            // so the block waits, without one, for a device-wide synchronization
            // before another stream takes it (its own stream may reuse it).
            if self.recording.load(Ordering::Relaxed) {
                let mut arena = self.lock();
                for action in [TraceAction::FreeRequested, TraceAction::FreeCompleted] {
                    arena.history.push(action, ptr, rsize, stream_id(key));
                }
            }
            if token_gen == current {
                self.lock().free(ptr, key, None);
            }
            self.orphan.freed_blocks.fetch_add(1, Ordering::Release);
            return;
        }
        if self.recording.load(Ordering::Relaxed) {
            let mut arena = self.lock();
            for action in [TraceAction::FreeRequested, TraceAction::FreeCompleted] {
                arena.history.push(action, ptr, rsize, stream_id(key));
            }
        }
        // The block stops counting as live only after this free is done with the
        // core: `PoolManager::drop` frees the core once nothing is live, and an
        // allocation may be dropped on any thread.
        let done = |c: &AtomicU64| {
            c.store(c.load(Ordering::Relaxed).wrapping_sub(1), Ordering::Release);
        };
        let cached = LOCALS
            .try_with(|cell| {
                let mut locals = cell.try_borrow_mut().ok()?;
                let local = locals.iter_mut().find(|l| l.id == self.id)?;
                if token_gen != current {
                    done(&local.counters.live_blocks);
                    return Some(Freed::Cached); // invalidated by reset
                }
                let cap = self.cache_bytes();
                if cfg.thread_cache_blocks == 0 || rsize > cap {
                    return Some(Freed::ToArena(local.counters.clone()));
                }
                let mut caches = caches_of(&local.counters);
                let sc = match caches.iter().position(|s| s.stream == key) {
                    Some(i) => &mut caches[i],
                    None => {
                        if caches.len() >= MAX_STREAM_CACHES {
                            // The oldest stream's blocks go back without an event:
                            // that stream may be gone by now.
                            let mut oldest = caches.remove(0);
                            let mut arena = self.lock();
                            arena.stats.scan_steps += 1;
                            self.flush_stream(&mut arena, &mut oldest, &local.counters, gen, false);
                        }
                        caches.push(StreamCache::new(key));
                        caches.last_mut()?
                    }
                };
                // Full: the stream's cached blocks all go back to the arena (where
                // they coalesce) and this one starts the cache afresh, so blocks that
                // are not reused (one large tensor, say) cannot keep the cache full
                // and send every other size to the locked path.
                if sc.blocks() >= cfg.thread_cache_blocks || sc.bytes().saturating_add(rsize) > cap
                {
                    let mut arena = self.lock();
                    self.flush_stream(&mut arena, sc, &local.counters, gen, true);
                }
                sc.put(Entry {
                    ptr,
                    size: rsize,
                    base: base.0,
                    base_size: base.1,
                    generation: gen,
                });
                add_cached(&local.counters, rsize as i64);
                done(&local.counters.live_blocks);
                Some(Freed::Cached)
            })
            .ok()
            .flatten();
        match cached {
            Some(Freed::Cached) => {}
            Some(Freed::ToArena(counters)) => {
                self.lock().free(ptr, key, Some(self.events.as_ref()));
                done(&counters.live_blocks);
            }
            None => {
                // No cache on this thread (or it is being torn down).
                if token_gen == current {
                    self.lock().free(ptr, key, Some(self.events.as_ref()));
                }
                self.orphan.freed_blocks.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// Folds the counters of threads that have exited (their cache is gone, so only
    /// this list holds their counters) into `orphan` and forgets them, so a program
    /// that starts many short-lived threads keeps a short list.
    fn fold_exited(&self, threads: &mut Vec<Arc<ThreadCounters>>) {
        threads.retain(|c| {
            if Arc::strong_count(c) > 1 {
                return true;
            }
            // The exited thread's last writes happen before its release of the
            // count (as `Arc`'s drop orders them); this fence makes them visible.
            std::sync::atomic::fence(Ordering::Acquire);
            let o = &self.orphan;
            for (from, to) in [
                (&c.live_blocks, &o.live_blocks),
                (&c.allocations, &o.allocations),
                (&c.hits, &o.hits),
                (&c.allocated_total, &o.allocated_total),
            ] {
                to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            false
        });
    }

    /// Gives every segment back to the upstream and the events still held back to
    /// their source (drop and reset, after the generation bump and a device-wide
    /// synchronization); a failed free is logged with `during`.
    ///
    /// What the driver refuses is kept, not forgotten: a segment whose free fails
    /// waits in `refused`, and a piece of the expandable segment that fails to
    /// unmap stays with the virtual memory (`abandon_all`); the next trim, reset
    /// or drop retries both.
    fn give_back_all(&self, during: &str) {
        let segments = {
            let mut arena = self.lock();
            let segments = arena.drain_segments(&self.source(), self.events.as_ref());
            // The pool knows no mapping now; under the arena's lock, before any
            // growth maps again.
            if let Some(v) = &self.vmm {
                v.abandon_all();
            }
            segments
        };
        for (base, size) in segments {
            // SAFETY: every segment came from this upstream; the device finished
            // its work on them, and after the generation bump no block of them is
            // handed out or taken back again (stale cache entries included).
            if let Err(e) = unsafe { self.upstream.free(base, size) } {
                self.refused.keep(base, size, &e, during);
            }
        }
        self.retry_refused(during);
    }

    /// Retries what the driver refused earlier: segment frees kept by
    /// `give_back_all`, and what the virtual memory kept (mappings of failed
    /// growths or forgotten by a reset, unreleased pieces); returns the bytes of
    /// segments freed (the virtual memory's are not counted: the pool had
    /// already counted them off).
    fn retry_refused(&self, during: &str) -> usize {
        if let Some(v) = &self.vmm {
            if let Err(e) = v.settle() {
                tracing::warn!(error = %e, "giving back what the driver refused earlier failed again ({during}); kept for the next try");
            }
        }
        self.refused.retry(self.upstream.as_ref(), during)
    }

    /// Bytes parked in thread caches, as last written by their threads.
    fn cached_bytes(&self) -> usize {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        threads
            .iter()
            .map(|c| c.cached_bytes.load(Ordering::Relaxed) as usize)
            .sum()
    }

    /// Callers' bytes and blocks now: `(live - cached, live blocks)`.
    fn allocated_now(&self, arena: &Arena) -> (usize, usize) {
        let bytes = arena.stats.live.saturating_sub(self.cached_bytes());
        (bytes, self.live_blocks().max(0) as usize)
    }

    /// Folds the callers' current bytes and blocks into their peaks.
    fn sample_peaks(&self, arena: &mut Arena) {
        let (bytes, blocks) = self.allocated_now(arena);
        let s = &mut arena.stats;
        s.peak_allocated = s.peak_allocated.max(bytes);
        s.peak_allocated_blocks = s.peak_allocated_blocks.max(blocks);
    }

    fn live_blocks(&self) -> i64 {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let t: i64 = threads
            .iter()
            .map(|c| c.live_blocks.load(Ordering::Relaxed) as i64)
            .sum();
        t + self.orphan.live_blocks.load(Ordering::Relaxed) as i64
            - self.orphan.freed_blocks.load(Ordering::Relaxed) as i64
    }
}

/// An allocation's token: the pool's generation when it was handed out (low 32
/// bits), and for a block allocated on a thread's per-thread stream that thread's
/// number plus one (high bits), so a free from another thread finds its stream.
const GEN_MASK: usize = (1 << 32) - 1;

fn pack_token(generation: usize, key: StreamKey) -> usize {
    let g = generation & GEN_MASK;
    match per_thread_number(key) {
        Some(n) => ((n + 1) << 32) | g,
        None => g,
    }
}

/// `(generation bits, owner's per-thread key)` of a token.
fn unpack_token(token: usize) -> (usize, Option<StreamKey>) {
    let n = token >> 32;
    (token & GEN_MASK, (n != 0).then(|| per_thread_key_of(n - 1)))
}

/// Where a freed block went.
enum Freed {
    /// Into this thread's cache (or nowhere: invalidated by a reset).
    Cached,
    /// To the shared arena, then counted off on this thread's counters.
    ToArena(Arc<ThreadCounters>),
}

impl DeviceRelease for Core {
    fn release(&self, b: Released) {
        self.give_back(b.ptr, b.size, b.stream, b.token, (b.base, b.base_size));
    }
}

/// Where a pool's segments come from.
pub enum PoolUpstream {
    /// `cuMemAlloc` in a context.
    Driver(Context),
    /// The host stand-in (no GPU): `capacity` bytes, `touch` to back blocks with
    /// real host memory.
    Host {
        /// Bytes of the stand-in device.
        capacity: usize,
        /// Back blocks with real memory.
        touch: bool,
    },
    /// Any other upstream, with its event source and optional virtual memory.
    Custom(
        Box<dyn Upstream>,
        Box<dyn EventSource>,
        Option<Box<dyn VirtualMemory>>,
        Option<Context>,
    ),
}

/// The caching pool: a stream-aware best-fit allocator over segments, with
/// per-thread caches so that a same-stream allocate+free pair takes no lock and
/// makes no driver call.
///
/// - **Stream-aware.** A block freed on stream S goes back to S's free blocks and is
///   reused on S at once (stream order makes that safe). Another stream T takes it
///   only after an event recorded on S has completed (events are pooled).
/// - **Thread caches.** Each thread keeps up to [`PoolConfig::thread_cache_blocks`]
///   freed blocks per stream; an allocation of the same rounded size on the same
///   stream takes one back without a lock. A miss that needs new memory, or a free
///   into a full cache, gives that stream's cached blocks back to the shared arena
///   first, so nothing stays fragmented or stuck in a cache; before the pool grows
///   for a stream, every other thread's cached blocks of that stream go back too.
/// - **Best fit with splitting and coalescing** inside segments; small (≤ 1 MiB) and
///   large blocks use different segments, except that a small request takes a free
///   block of the expandable segment before a new small segment; lookups are
///   `O(log n)`.
/// - **Out of memory**: wait for pending cross-stream events, give back every
///   wholly free segment, retry, then [`EmmError::OutOfMemory`] with a report (live,
///   reserved, largest free block, the device's free and total).
/// - **`defer_cleanup`**: the pool never synchronizes on a free, so there is nothing
///   to defer for device memory; the guard defers the pinned-host queue of the
///   composed [`HostOnly`].
/// - **The synchronous path** (`memalloc`) orders memory on the legacy default
///   stream: safe there and on every blocking stream; a non-blocking stream must
///   first wait for the legacy stream (as with RMM's pool).
/// - **Managed memory** (`memallocmanaged`) is passed through to the driver by a
///   composed [`Managed`]: one `cuMemAllocManaged` per request and one `cuMemFree`
///   per free, never in segments or thread caches, and counted apart from the
///   pool's statistics (`emm.managed_*` in `memory_stats`). Managed blocks are
///   rare and large, their pages migrate between host and device, and a cached
///   one would keep memory from both and carry its last user's page residency and
///   advice to the next; on out of memory the pool's cache is given back first.
pub struct PoolManager {
    core: Arc<Core>,
}

impl core::fmt::Debug for PoolManager {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PoolManager")
            .field("stats", &self.stats())
            .finish()
    }
}

impl PoolManager {
    /// A pool of device memory in `ctx` (`cuMemAlloc` segments, and an expandable
    /// segment where the device has virtual memory management) with host memory from
    /// a composed [`HostOnly`], configured by [`PoolConfig::from_env`].
    pub fn new(ctx: &Context) -> Result<PoolManager> {
        Self::with_config(PoolUpstream::Driver(ctx.clone()), PoolConfig::from_env()?)
    }

    /// A pool over `upstream` with `config`.
    pub fn with_config(upstream: PoolUpstream, config: PoolConfig) -> Result<PoolManager> {
        let seg = &config.segments;
        for (name, value) in [
            ("segments.large_round", seg.large_round),
            ("segments.small_segment", seg.small_segment),
            ("segments.large_segment", seg.large_segment),
            ("segments.expand_step", seg.expand_step),
        ] {
            if value == 0 || (name == "segments.large_round" && !value.is_power_of_two()) {
                return Err(EmmError::InvalidConfig {
                    name: name.into(),
                    value: value.to_string(),
                    reason: "a positive size (the rounding a power of two)".into(),
                });
            }
        }
        if let Some(p) = seg.tight_percent.filter(|&p| p < 100) {
            return Err(EmmError::InvalidConfig {
                name: "segments.tight_percent".into(),
                value: p.to_string(),
                reason: "a percentage of live bytes of at least 100 (or None: never)".into(),
            });
        }
        let defer = DeferState::new();
        type Parts = (
            Box<dyn Upstream>,
            Box<dyn EventSource>,
            Option<Box<dyn VirtualMemory>>,
            Option<Context>,
        );
        let (up, events, vmm, ctx): Parts = match upstream {
            PoolUpstream::Driver(ctx) => {
                let vmm = if config.segments.expandable {
                    DriverVmm::new(&ctx).map(|mut v| {
                        if config.exportable {
                            v.set_exportable();
                        }
                        v
                    })
                } else {
                    None
                };
                let vmm = vmm.filter(|v| {
                    v.granularity()
                        .is_ok_and(|g| config.segments.large_round % g == 0)
                });
                (
                    Box::new(DriverUpstream::new(&ctx)),
                    Box::new(DriverEvents::new(&ctx)),
                    vmm.map(|v| Box::new(v) as Box<dyn VirtualMemory>),
                    Some(ctx),
                )
            }
            PoolUpstream::Host { capacity, touch } => {
                let host = Arc::new(HostUpstream::new(capacity, touch));
                let vmm: Option<Box<dyn VirtualMemory>> = if config.segments.expandable && !touch {
                    Some(Box::new(HostVmm::new(host.clone())))
                } else {
                    None
                };
                (Box::new(host), Box::new(HostEvents::immediate()), vmm, None)
            }
            PoolUpstream::Custom(u, e, v, ctx) => (u, e, v, ctx),
        };
        let name = "pool";
        let host = match &ctx {
            Some(c) => Some(HostOnly::new(c, PendingConfig::from_env()?, defer.clone())?),
            None => None,
        };
        let managed = ctx.as_ref().map(|c| Managed::new(c, "pool", defer.clone()));
        let limit = config.limit;
        Ok(PoolManager {
            core: Arc::new(Core {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                name,
                arena: Mutex::new(Arena::new(config.segments, limit)),
                upstream: up,
                vmm,
                events,
                config,
                generation: AtomicUsize::new(0),
                threads: Mutex::new(Vec::new()),
                orphan: ThreadCounters::default(),
                host,
                managed,
                ctx,
                defer,
                recording: AtomicBool::new(false),
                refused: Default::default(),
            }),
        })
    }

    /// A pool over the host stand-in of `capacity` bytes (no GPU needed).
    pub fn host(capacity: usize, config: PoolConfig) -> Result<PoolManager> {
        Self::with_config(
            PoolUpstream::Host {
                capacity,
                touch: false,
            },
            config,
        )
    }

    /// Allocates on `stream` (the stream-ordered path; same as
    /// [`MemoryManager::memalloc_async`]).
    pub fn alloc(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        self.core.alloc(size, stream)
    }

    /// How many threads' counters the pool keeps: the threads that have a cache for
    /// it now, plus those that exited since the last new thread registered (their
    /// counters are folded away then).
    pub fn tracked_threads(&self) -> usize {
        self.core
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Statistics.
    pub fn stats(&self) -> PoolStats {
        let mut arena = self.core.lock();
        self.stats_locked(&mut arena)
    }

    fn stats_locked(&self, arena: &mut Arena) -> PoolStats {
        self.core.sample_peaks(arena);
        let a = arena.stats;
        let inactive_split_bytes = arena.inactive_split_bytes();
        let allocated_blocks = self.core.live_blocks().max(0) as usize;
        let threads = self.core.threads.lock().unwrap_or_else(|p| p.into_inner());
        let allocated_bytes_total = threads
            .iter()
            .map(|c| c.allocated_total.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.core.orphan.allocated_total.load(Ordering::Relaxed);
        let allocations = threads
            .iter()
            .map(|c| c.allocations.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.core.orphan.allocations.load(Ordering::Relaxed);
        let thread_cache_hits = threads
            .iter()
            .map(|c| c.hits.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.core.orphan.hits.load(Ordering::Relaxed);
        let cached = threads
            .iter()
            .map(|c| c.cached_bytes.load(Ordering::Relaxed) as usize)
            .sum::<usize>();
        let allocated_bytes = a.live.saturating_sub(cached);
        PoolStats {
            allocated_bytes,
            allocated_bytes_peak: a.peak_allocated.max(allocated_bytes),
            allocated_bytes_total,
            allocated_blocks,
            allocated_blocks_peak: a.peak_allocated_blocks.max(allocated_blocks),
            active_bytes: a.live,
            active_bytes_peak: a.peak_live,
            thread_cached_bytes: a.live - allocated_bytes,
            inactive_split_bytes,
            segments_peak: a.peak_segments,
            num_ooms: a.ooms,
            reserved_bytes: a.reserved,
            reserved_bytes_peak: a.peak_reserved,
            num_alloc_retries: a.oom_ladders,
            num_device_alloc: a.upstream_allocs,
            num_device_free: a.upstream_frees,
            segments: a.segments,
            allocations,
            thread_cache_hits,
            shared_hits: a.hits,
            cross_stream_reuses: a.cross_stream_reuses,
            locked_allocs: a.locked_allocs,
            locked_frees: a.locked_frees,
            events_recorded: a.events_recorded,
            event_queries: a.event_queries,
            device_syncs: a.device_syncs,
            misses: a.misses,
            scan_steps: a.scan_steps,
            tightenings: a.tightenings,
            merges: a.merges,
            pieces_mapped: a.pieces_mapped,
            pieces_moved: a.pieces_moved,
            pieces_unmapped: a.pieces_unmapped,
        }
    }

    /// Sets every peak (allocated, active, reserved, segments) to its current value.
    pub fn reset_peak_stats(&self) {
        let mut arena = self.core.lock();
        let (bytes, blocks) = self.core.allocated_now(&arena);
        arena.stats.reset_peaks(bytes, blocks);
    }

    /// Records the allocation history in a ring of the latest `max_entries`
    /// entries (0: off, the history dropped). While on, every allocation and free
    /// takes the pool's lock to record itself; off, the lock-free path reads one
    /// relaxed flag.
    pub fn record_history(&self, max_entries: usize) {
        let mut arena = self.core.lock();
        arena.history.set_capacity(max_entries);
        self.core
            .recording
            .store(max_entries > 0, Ordering::Relaxed);
    }

    /// Segments, blocks, the recorded history and the statistics, taken under the
    /// pool's lock at one time. This thread's cached blocks go back to the pool
    /// first (as with [`trim`](Self::trim)); blocks other threads keep cached are
    /// live to the pool and show as allocated, so the allocated blocks sum to
    /// `active_bytes`, and to `allocated_bytes` when no other thread caches any
    /// (`thread_cached_bytes` is 0). Segments sum to `reserved_bytes`.
    pub fn snapshot(&self) -> MemorySnapshot {
        let mut arena = self.core.lock();
        self.core.flush_thread(&mut arena);
        let stats = self.stats_locked(&mut arena).to_list();
        MemorySnapshot {
            segments: arena.snapshot_segments(),
            trace: arena.history.entries(),
            stats,
        }
    }

    /// Gives every wholly free segment back to the upstream, and every idle piece
    /// of the expandable segment, wherever it lies (after returning the blocks
    /// this thread and the other threads cached; a thread using its cache at that
    /// moment keeps it); returns the bytes released. Releases nothing in a child
    /// forked after CUDA was initialised (the memory is the parent's).
    pub fn trim(&self) -> usize {
        if emm_sys::forked() {
            return 0;
        }
        let mut arena = self.core.lock();
        self.core.flush_thread(&mut arena);
        let gen = self.core.generation.load(Ordering::Acquire);
        self.core.reclaim_cached(&mut arena, None, gen);
        let settled = arena.consolidate(self.core.events.as_ref());
        if let Err(e) = &settled {
            tracing::warn!(error = %e, "waiting for streams during trim failed; trimming what is settled");
        }
        let source = self.core.source();
        let released = arena.release_free_segments(&source, self.core.events.as_ref())
            + arena.release_free_pieces(&source)
            + self.core.retry_refused("trim");
        if settled.is_ok() {
            // The events idle now (every stream's, after the consolidation) are
            // destroyed: the pool keeps only those still in use.
            self.core.events.release_idle();
        }
        released
    }

    /// Bytes of segments the pool gave back whole (reset, drop) whose free the
    /// driver refused: no longer in `reserved_bytes`, kept and freed again by the
    /// next trim, reset or drop.
    pub fn refused_bytes(&self) -> usize {
        self.core.refused.bytes()
    }

    /// Checks the pool's internal consistency (for tests); returns what is wrong.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.core.lock().check()
    }

    /// Pending cross-stream event groups (for tests).
    pub fn pending_event_groups(&self) -> usize {
        self.core.lock().pending_groups()
    }

    /// The composed host-memory half, when serving a real context.
    pub fn host_only(&self) -> Option<&HostOnly> {
        self.core.host.as_ref()
    }

    fn no_host(&self, operation: &'static str) -> EmmError {
        EmmError::Unsupported {
            manager: "pool over the host stand-in".into(),
            operation,
        }
    }
}

impl Drop for PoolManager {
    fn drop(&mut self) {
        if emm_sys::forked() {
            // In a forked child the core is the parent's: leave it untouched.
            std::mem::forget(self.core.clone());
            return;
        }
        // Allocations point at the core without counting references; if any is
        // still live, the core must outlive it: leak it rather than free under it.
        let live = self.core.live_blocks();
        if live > 0 {
            tracing::warn!(
                live,
                "pool dropped while {live} allocations are live; its memory is kept until exit"
            );
            std::mem::forget(self.core.clone());
            return;
        }
        // Pairs with the Release of the last free's count: that free is done with
        // the core before the core is taken apart below.
        std::sync::atomic::fence(Ordering::Acquire);
        // Every block is free now, in the arena or in some thread's cache (those
        // entries go stale with the generation): wait for the device's work on
        // them, then give every segment back.
        self.core.generation.fetch_add(1, Ordering::AcqRel);
        if let Err(e) = self.core.events.synchronize_all() {
            tracing::error!(error = %e, "synchronizing before dropping a pool failed; freeing its segments anyway");
        }
        self.core.give_back_all("dropping a pool");
    }
}

impl MemoryManager for PoolManager {
    fn name(&self) -> &str {
        self.core.name
    }

    fn initialize(&self) -> Result<()> {
        Ok(())
    }

    fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
        self.memalloc_async(size, SYNC_STREAM)
    }

    fn memalloc_async(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        self.core.alloc(size, stream)
    }

    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        self.core
            .host
            .as_ref()
            .ok_or_else(|| self.no_host("memhostalloc"))?
            .memhostalloc(size, flags)
    }

    fn memallocmanaged(&self, size: usize, attach: ManagedAttach) -> Result<ManagedMemory> {
        self.core
            .managed
            .as_ref()
            .ok_or_else(|| self.no_host("memallocmanaged"))?
            .memallocmanaged(size, attach, &|| self.release_cached().unwrap_or(0))
    }

    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        let host = self
            .core
            .host
            .as_ref()
            .ok_or_else(|| self.no_host("mempin"))?;
        // SAFETY: forwarded to the caller.
        unsafe { host.mempin(ptr, len, mapped) }
    }

    fn get_memory_info(&self) -> Result<MemoryInfo> {
        self.core.upstream.mem_info()
    }

    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle> {
        let ctx = self
            .core
            .ctx
            .as_ref()
            .ok_or_else(|| self.no_host("get_ipc_handle"))?;
        // Large blocks, and the small ones placed in the expandable segment when no
        // small segment had room (see `Arena::try_alloc`), are virtual memory,
        // which legacy IPC cannot export: exported by file descriptor where the
        // pool made its pieces exportable (see `export.rs`).
        let base = view.parent().base().0;
        if let Some(vmm) = self.core.vmm.as_deref() {
            if self.core.lock().is_expandable(base) {
                if !self.core.config.exportable {
                    return Err(EmmError::Unsupported {
                        manager: "pool (a block of its expandable segment, which legacy IPC cannot export: build it with exportable: true, EMM_POOL_EXPORTABLE=1, to export it by file descriptor (emm.numba_plugin does), or with expandable: false, EMM_POOL_EXPANDABLE=0, for legacy IPC of every block)".into(),
                        operation: "get_ipc_handle",
                    });
                }
                let exported = vmm.export_range(view.ptr(), view.len())?;
                return Ok(IpcHandle::Vmm {
                    pid: std::process::id(),
                    pieces: exported.pieces,
                    offset: exported.offset,
                    size: view.len(),
                    device_uuid: ctx.device().uuid()?,
                });
            }
        }
        IpcHandle::export_legacy(ctx, view.parent().base().0, view.ptr(), view.len())
    }

    fn reset(&self) -> Result<()> {
        emm_core::check_not_forked()?;
        // Every stream's work on the pool's memory is done before its segments and
        // events go back (any upstream: the event source synchronizes the device).
        // First: a reset that fails here has changed nothing (its blocks are
        // still the callers', and come back when freed), rather than invalidated
        // blocks it never gave back.
        self.core.events.synchronize_all()?;
        self.core.generation.fetch_add(1, Ordering::AcqRel);
        self.core.give_back_all("reset");
        if let Some(h) = &self.core.host {
            h.flush();
        }
        if let Some(m) = &self.core.managed {
            m.reset();
        }
        Ok(())
    }

    fn defer_cleanup(&self) -> DeferGuard {
        let host = self.core.host.clone();
        let managed = self.core.managed.clone();
        self.core.defer.guard(move || {
            if let Some(h) = host {
                h.flush_if_needed();
            }
            if let Some(m) = managed {
                m.flush();
            }
        })
    }

    fn release_cached(&self) -> Result<usize> {
        emm_core::check_not_forked()?;
        Ok(self.trim()
            + self.core.host.as_ref().map_or(0, HostOnly::flush)
            + self
                .core
                .managed
                .as_ref()
                .map_or(0, Managed::release_cached))
    }

    fn context(&self) -> Option<&Context> {
        self.core.ctx.as_ref()
    }

    fn report(&self) -> String {
        format!("{:?}", PoolManager::stats(self))
    }

    fn memory_stats(&self) -> StatList {
        let mut list = PoolManager::stats(self).to_list();
        list.extend(MemoryManager::managed_stats(self).to_list());
        list
    }

    fn reset_peak_stats(&self) {
        PoolManager::reset_peak_stats(self);
        if let Some(m) = &self.core.managed {
            m.reset_peak();
        }
    }

    fn managed_stats(&self) -> ManagedStats {
        self.core
            .managed
            .as_ref()
            .map(Managed::stats)
            .unwrap_or_default()
    }

    fn record_history(&self, max_entries: usize) -> Result<()> {
        PoolManager::record_history(self, max_entries);
        Ok(())
    }

    fn snapshot(&self) -> Option<MemorySnapshot> {
        Some(PoolManager::snapshot(self))
    }

    fn stats(&self) -> ManagerStats {
        let s = PoolManager::stats(self);
        ManagerStats {
            allocated_bytes: s.allocated_bytes,
            allocated_bytes_peak: s.allocated_bytes_peak,
            reserved_bytes: s.reserved_bytes,
            reserved_bytes_peak: s.reserved_bytes_peak,
            allocations: s.allocations,
            upstream_allocs: s.num_device_alloc as u64,
            upstream_frees: s.num_device_free as u64,
        }
    }
}

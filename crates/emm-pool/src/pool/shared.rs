//! The pool's shared state ([`Core`]) and its paths: allocation (a thread's
//! cache, then the arena), free (back to the cache or the arena), the caches
//! reclaimed before growth and on out of memory, and peaks sampled.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use emm_core::{
    DeferState, DeviceAllocation, DeviceRelease, EmmError, Released, Result, TraceAction,
};
use emm_default::{HostOnly, Managed, Upstream};
use emm_driver::Context;
use emm_sys::{CUdeviceptr, CUstream};

use super::config::{PoolConfig, MAX_STREAM_CACHES, NO_VMM_CACHE_BYTES};
use super::source::SourceAdapter;
use super::threads::{
    add, add_cached, bump, caches_of, mark_cached, may_cache, remark_cached, stream_bit,
    CacheOwner, Local, ThreadCounters, LOCALS,
};
use crate::arena::Arena;
use crate::call_work::{self, Work};
use crate::events::EventSource;
use crate::kind::round_size;
use crate::owner_lock;
use crate::stream_key::{
    is_per_thread, is_stream_handle, per_thread_key_of, per_thread_number, stream_id, stream_key,
    StreamKey,
};
use crate::thread_cache::{Entry, StreamCache};
use crate::vmm::VirtualMemory;

/// A pool's shared state: the arena under its lock, where memory comes from,
/// the threads' counters, and the halves composed for host and managed memory.
pub(super) struct Core {
    pub(super) id: usize,
    pub(super) name: &'static str,
    pub(super) arena: Mutex<Arena>,
    pub(super) upstream: Box<dyn Upstream>,
    pub(super) vmm: Option<Arc<dyn VirtualMemory>>,
    pub(super) events: Arc<dyn EventSource>,
    /// The helper thread that unmaps moved pieces' old mappings
    /// (`pool_background_unmap`; only with virtual memory).
    pub(super) unmapper: Option<crate::unmapper::Unmapper>,
    pub(super) config: PoolConfig,
    pub(super) generation: AtomicUsize,
    pub(super) threads: Mutex<Vec<Arc<ThreadCounters>>>,
    pub(super) orphan: ThreadCounters,
    pub(super) host: Option<HostOnly>,
    /// Managed memory: passed through to the driver, never into segments.
    pub(super) managed: Option<Managed>,
    pub(super) ctx: Option<Context>,
    pub(super) defer: Arc<DeferState>,
    /// The history is being recorded (the arena's ring has room), for the
    /// lock-free path, which reads it relaxed.
    pub(super) recording: AtomicBool,
    /// Segments whose free the upstream refused on reset or drop, freed again by
    /// the next trim, reset or drop.
    pub(super) refused: crate::refused::Refused,
}

impl Core {
    pub(super) fn source(&self) -> SourceAdapter<'_> {
        SourceAdapter(
            self.upstream.as_ref(),
            self.vmm.as_deref(),
            self.ctx.as_ref(),
            self.unmapper.as_ref(),
        )
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Arena> {
        call_work::note(Work::Locked);
        self.arena.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on this thread's cache for this pool (created on first use).
    pub(super) fn with_local<R>(self: &Arc<Self>, f: impl FnOnce(&mut Local) -> R) -> Option<R> {
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
                            core: Arc::downgrade(self) as Weak<dyn CacheOwner>,
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
    pub(super) fn flush_stream(
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
    pub(super) fn flush_thread(self: &Arc<Self>, arena: &mut Arena) {
        let gen = self.generation.load(Ordering::Acquire);
        let _ = self.with_local(|local| {
            let mut caches = caches_of(&local.counters);
            for sc in caches.iter_mut() {
                self.flush_stream(arena, sc, &local.counters, gen, false);
            }
            remark_cached(&local.counters, &caches);
        });
    }

    /// Bytes a thread may cache per stream. Without the expandable segment, large
    /// blocks are whole segments of their exact size, which the pool gives back
    /// (instead of growing) only when they are free in the arena: a cache holding
    /// many of them counts as live there and let the recorded inference trace grow
    /// to 1.71x of live; such a pool caches at most [`NO_VMM_CACHE_BYTES`], and
    /// none with a home segment (`SegmentPolicy::initial_size`): a block held
    /// in a cache is not free in the home to coalesce, and three recorded traces
    /// then outgrew a home that held them without caches.
    pub(super) fn cache_bytes(&self) -> usize {
        if self.vmm.is_some() && self.config.segments.expandable {
            self.config.thread_cache_bytes
        } else if self.config.segments.initial_size > 0 {
            0
        } else {
            self.config.thread_cache_bytes.min(NO_VMM_CACHE_BYTES)
        }
    }

    /// Whether a request of `rsize` bytes on `key` that found no free block in
    /// the arena's small blocks leaves this thread's cache of the stream in
    /// place while the expandable segment can serve it: a small request, this
    /// thread's cache of the stream holding blocks, less than
    /// [`PoolConfig::thread_cache_keep`] bytes of them, and no other thread
    /// holding blocks of the stream (those go back first, as before: blocks
    /// PyTorch's autograd thread freed are the main thread's to reuse).
    /// Otherwise, where threads cache nothing, and with stream pools turned
    /// off, the cache goes back to the arena first, to coalesce, as before.
    /// (Stream pools take only large requests; with them off, the arena holds
    /// every stream's large blocks too, and keeping caches moved FSDP2 of GPT-2
    /// from 1.052x to 1.055x of live over 100 replayed passes: see
    /// `PoolConfig::thread_cache_keep`.)
    fn keeps_cache(self: &Arc<Self>, key: StreamKey, rsize: usize) -> bool {
        let keep = self.config.thread_cache_keep;
        let caches_on = self.config.thread_cache_blocks > 0 && self.cache_bytes() > 0;
        let stream_pools_off = self.config.stream_pools == 0;
        if keep == 0 || !caches_on || stream_pools_off || rsize > crate::SMALL_MAX {
            return false;
        }
        let mine = self.with_local(|local| {
            let caches = caches_of(&local.counters);
            let holds = caches
                .iter()
                .find(|sc| sc.stream == key)
                .is_some_and(|sc| sc.blocks() > 0 && sc.bytes() < keep);
            holds.then(|| local.counters.clone())
        });
        let Some(Some(me)) = mine else {
            return false;
        };
        // Any other thread `reclaim_cached` would claim for the stream.
        let bit = stream_bit(key);
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        !threads
            .iter()
            .any(|t| !Arc::ptr_eq(t, &me) && may_cache(t, bit))
    }

    /// The largest block a thread files in its cache:
    /// [`PoolConfig::thread_cache_largest`] with the expandable segment; without
    /// it, any block within the cache's bytes. A larger block waits only in the
    /// slot for the block freed last (`StreamCache::put_bounded`): an
    /// allocation of its size next takes it back without the lock (a tensor
    /// freed and made again, the same-stream pair of `emm bench`), and the
    /// stream's next free, or its next allocation that misses, sends it on to
    /// the arena, where it joins its free neighbours. Without the expandable
    /// segment plain segments cannot move pieces, and a block taken again at its
    /// own size keeps their layout: with 1 MiB, the recorded traces replayed
    /// without virtual memory came looser (GPT-2's bucketed inference 1.186x to
    /// 1.217x of live, the Llama-style training 1.191x to 1.231x).
    pub(super) fn cache_largest(&self) -> usize {
        if self.vmm.is_some() && self.config.segments.expandable {
            self.config.thread_cache_largest
        } else {
            usize::MAX
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
    pub(super) fn reclaim_cached(
        &self,
        arena: &mut Arena,
        only: Option<StreamKey>,
        gen: usize,
    ) -> bool {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        // Claim every cache that may hold blocks (of `only`, when given), then
        // one process-wide barrier for all of them (see `owner_lock`). A thread
        // whose mask says it holds none of `only`'s is left alone: under FSDP2
        // each thread caches blocks of several streams, and every miss of the
        // arena on one stream claimed them all.
        let want = only.map_or(u64::MAX, stream_bit);
        let claims: Vec<_> = threads
            .iter()
            .filter(|t| may_cache(t, want))
            .filter_map(|t| Some((t, t.caches.claim()?)))
            .collect();
        if claims.is_empty() {
            return false;
        }
        arena.stats.counts.cache_reclaims += 1;
        call_work::note(Work::Reclaim);
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
                arena.stats.counts.scan_steps += 1;
                any |= self.flush_stream(arena, sc, t, gen, only.is_some());
            }
            remark_cached(t, &caches);
        }
        any
    }

    pub(super) fn alloc(
        self: &Arc<Self>,
        size: usize,
        stream: CUstream,
    ) -> Result<DeviceAllocation> {
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
        if !is_stream_handle(stream) {
            return Err(EmmError::InvalidArgument {
                what: "stream",
                found: format!("{:#x}", stream.0 as usize),
                expected: "a stream handle (a user-space address), 0, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD".into(),
            });
        }
        let rsize = round_size(size);
        let key = stream_key(stream);
        let gen = self.generation.load(Ordering::Acquire);
        // Fast path: this thread's cache for this stream, exact rounded size.
        let hit = self.with_local(|local| {
            bump(&local.counters.allocations);
            let mut caches = caches_of(&local.counters);
            let Some(sc) = caches.iter_mut().find(|s| s.stream == key) else {
                return Lookup::Miss(None);
            };
            if let Some(e) = sc.take(rsize, gen) {
                add_cached(&local.counters, -(e.size as i64));
                bump(&local.counters.hits);
                bump(&local.counters.live_blocks);
                add(&local.counters.allocated_total, e.size as u64);
                return Lookup::Hit(e);
            }
            // A miss: a block larger than a thread files, waiting in the slot
            // for the block freed last, was not asked for again; it goes on to
            // the arena before the arena looks (see `Core::cache_largest`).
            let passed_on = sc.take_large_last(self.cache_largest());
            if let Some(e) = passed_on {
                add_cached(&local.counters, -(e.size as i64));
                remark_cached(&local.counters, &caches);
            }
            Lookup::Miss(passed_on)
        });
        let entry = match hit {
            Some(Lookup::Hit(e)) => {
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
                if let Some(Lookup::Miss(Some(e))) = other {
                    // (Judged by the generation read under the lock.)
                    if e.generation == gen {
                        arena.free(e.ptr, key, Some(self.events.as_ref()));
                    }
                }
                if on_thread {
                    // A miss: serve it from the arena's free blocks if possible;
                    // before taking new memory, give this stream's cached blocks back
                    // so they can coalesce and serve it.
                    found = arena.try_alloc(rsize, key, self.events.as_ref(), &source, false)?;
                    if found.is_none() && arena.serves_only(key) && self.keeps_cache(key, rsize) {
                        // A small request and a cache holding little: a free
                        // block of the expandable segment first, so the blocks
                        // the cache holds are still there for the sizes asked
                        // next (see `PoolConfig::thread_cache_keep`).
                        found = arena.take_small_in_expandable(rsize, key);
                    }
                    if found.is_none() {
                        self.with_local(|local| {
                            let mut caches = caches_of(&local.counters);
                            if let Some(sc) = caches.iter_mut().find(|s| s.stream == key) {
                                self.flush_stream(&mut arena, sc, &local.counters, gen, true);
                            }
                            remark_cached(&local.counters, &caches);
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
                let peak = arena.stats.peak_reserved;
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
                if arena.stats.peak_reserved > peak {
                    // The arena counted the peak's make-up; threads' caches are ours.
                    arena.stats.peak_slack.thread_cached_bytes = self.cached_bytes();
                }
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

    /// After frees reached the arena: memory above the release threshold goes
    /// back to the device (see `PoolConfig::release_threshold`; one relaxed load
    /// and a comparison when the pool is under it).
    fn after_free(&self, arena: &mut Arena) {
        if arena.above_release_threshold() {
            arena.release_above_threshold(self.events.as_ref(), &self.source());
        }
    }

    pub(super) fn give_back(
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
                            arena.stats.counts.scan_steps += 1;
                            self.flush_stream(&mut arena, &mut oldest, &local.counters, gen, false);
                        }
                        caches.push(StreamCache::new(key));
                        caches.last_mut()?
                    }
                };
                // Full: the stream's cached blocks all go back to the arena (where
                // they coalesce) and this one starts the cache afresh, so blocks that
                // are not reused (one large tensor, say) cannot keep the cache full
                // and send every other size to the locked path. A large block
                // in the slot, and a large one being freed, count here though
                // each waits only until the stream's next call: large frees in a
                // row then flush the small blocks, which join the arena's free
                // memory before the next large request. Leaving them out (the
                // fifty-ninth session) kept more small blocks cached and loosened
                // FSDP2 of the 1.1 B Llama on four GPUs from 1.047x to 1.051x of
                // live over 100 replayed passes (`steady_state.rs`).
                if sc.blocks() >= cfg.thread_cache_blocks || sc.bytes().saturating_add(rsize) > cap
                {
                    let mut arena = self.lock();
                    self.flush_stream(&mut arena, sc, &local.counters, gen, true);
                    self.after_free(&mut arena);
                }
                // A block larger than the largest a thread keeps waits only in
                // the slot for the block freed last; the one before it, if such
                // a block, goes on to the arena now (see `Core::cache_largest`).
                let entry = Entry {
                    ptr,
                    size: rsize,
                    base: base.0,
                    base_size: base.1,
                    generation: gen,
                };
                let passed_on = sc.put_bounded(entry, self.cache_largest());
                add_cached(&local.counters, rsize as i64);
                mark_cached(&local.counters, key);
                if let Some(e) = passed_on {
                    add_cached(&local.counters, -(e.size as i64));
                    let mut arena = self.lock();
                    // Read again under the lock: a reset in between makes the
                    // block stale (as the allocation path judges it).
                    if e.generation == self.generation.load(Ordering::Acquire) {
                        arena.free(e.ptr, key, Some(self.events.as_ref()));
                    }
                    self.after_free(&mut arena);
                }
                // Counted off only once this free is done with the core (see
                // `done`): the pool may be retired as soon as nothing is live.
                done(&local.counters.live_blocks);
                Some(Freed::Cached)
            })
            .ok()
            .flatten();
        match cached {
            Some(Freed::Cached) => {}
            Some(Freed::ToArena(counters)) => {
                let mut arena = self.lock();
                arena.free(ptr, key, Some(self.events.as_ref()));
                self.after_free(&mut arena);
                drop(arena);
                done(&counters.live_blocks);
            }
            None => {
                // No cache on this thread (or it is being torn down).
                if token_gen == current {
                    let mut arena = self.lock();
                    arena.free(ptr, key, Some(self.events.as_ref()));
                    self.after_free(&mut arena);
                }
                self.orphan.freed_blocks.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// Folds the counters of threads that have exited (their cache is gone, so only
    /// this list holds their counters) into `orphan` and forgets them, so a program
    /// that starts many short-lived threads keeps a short list.
    pub(super) fn fold_exited(&self, threads: &mut Vec<Arc<ThreadCounters>>) {
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
    pub(super) fn give_back_all(&self, during: &str) {
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
    pub(super) fn retry_refused(&self, during: &str) -> usize {
        if let Some(v) = &self.vmm {
            if let Err(e) = v.settle() {
                tracing::warn!(error = %e, "giving back what the driver refused earlier failed again ({during}); kept for the next try");
            }
        }
        self.refused.retry(self.upstream.as_ref(), during)
    }

    /// Bytes parked in thread caches, as last written by their threads.
    pub(super) fn cached_bytes(&self) -> usize {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        threads
            .iter()
            .map(|c| c.cached_bytes.load(Ordering::Relaxed) as usize)
            .sum()
    }

    /// Callers' bytes and blocks now: `(live - cached, live blocks)`.
    pub(super) fn allocated_now(&self, arena: &Arena) -> (usize, usize) {
        let bytes = arena.stats.live.saturating_sub(self.cached_bytes());
        (bytes, self.live_blocks().max(0) as usize)
    }

    /// Folds the callers' current bytes and blocks into their peaks.
    pub(super) fn sample_peaks(&self, arena: &mut Arena) {
        let (bytes, blocks) = self.allocated_now(arena);
        let s = &mut arena.stats;
        s.peak_allocated = s.peak_allocated.max(bytes);
        s.peak_allocated_blocks = s.peak_allocated_blocks.max(blocks);
    }

    pub(super) fn live_blocks(&self) -> i64 {
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

/// What this thread's cache gave an allocation.
enum Lookup {
    /// A cached block of the request's size.
    Hit(Entry),
    /// None; with the large block that waited in the slot for the block freed
    /// last, taken out to go on to the arena.
    Miss(Option<Entry>),
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

impl CacheOwner for Core {
    fn thread_exited(&self, counters: &ThreadCounters) {
        let mut caches = caches_of(counters);
        let mut arena = self.lock();
        let gen = self.generation.load(Ordering::Acquire);
        for mut sc in caches.drain(..) {
            let stream = sc.stream;
            sc.drain(|e| {
                if e.generation == gen {
                    arena.free(e.ptr, stream, None); // the stream may be gone
                }
            });
        }
        counters.cached_bytes.store(0, Ordering::Relaxed);
        counters.cached_streams.store(0, Ordering::Relaxed);
    }
}

//! [`PoolManager`]: the caching pool, built over an upstream
//! ([`PoolUpstream`]), with its allocation path, statistics, snapshot, trim,
//! limits and teardown (its [`MemoryManager`](emm_core::MemoryManager) interface: `plugin.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use emm_core::{DeviceAllocation, EmmError, MemorySnapshot, Result, Tag};
use emm_default::{HostOnly, HostUpstream};
use emm_driver::Context;
use emm_sys::CUstream;

use super::config::PoolConfig;
use super::shared::Core;
use super::siblings::{Recipe, Siblings};
use super::stats::PoolStats;
use super::streams::StreamPools;
use super::tagged::TagPools;
use super::upstream::{host_parts, make_core, PoolUpstream};
use crate::arena::Arena;
use crate::events::HostEvents;
use crate::family::Family;
use crate::kind::SMALL_MAX;

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
///   composed [`Managed`](emm_default::Managed): one `cuMemAllocManaged` per request and one `cuMemFree`
///   per free, never in segments or thread caches, and counted apart from the
///   pool's statistics (`emm.managed_*` in `memory_stats`). Managed blocks are
///   rare and large, their pages migrate between host and device, and a cached
///   one would keep memory from both and carry its last user's page residency and
///   advice to the next; on out of memory the pool's cache is given back first.
pub struct PoolManager {
    pub(super) core: Arc<Core>,
    /// The pools of tagged allocations (see `tagged.rs`).
    pub(super) tags: TagPools,
    /// The pools of created streams, with `pool_stream_pools` (see
    /// `streams.rs`).
    pub(super) streams: StreamPools,
    /// How tag and stream pools are made.
    siblings: Arc<Siblings>,
    /// Reserved bytes, their peak, byte limit and release threshold, shared
    /// with the tag and stream pools.
    family: Arc<Family>,
}

impl core::fmt::Debug for PoolManager {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PoolManager")
            .field("stats", &self.stats())
            .finish()
    }
}

impl PoolManager {
    /// The settings it reads: its own ([`crate::settings::SETTINGS`]) and its
    /// pinned-host queue's ([`emm_default::SETTINGS`]), for its factory to
    /// declare.
    pub fn settings() -> Vec<&'static dyn emm_core::setting::AnySetting> {
        crate::settings::SETTINGS
            .iter()
            .chain(emm_default::SETTINGS)
            .copied()
            .collect()
    }

    /// A pool of device memory in `ctx` (`cuMemAlloc` segments, and an expandable
    /// segment where the device has virtual memory management) with host memory from
    /// a composed [`HostOnly`], configured by [`PoolConfig::from_env`].
    pub fn new(ctx: &Context) -> Result<PoolManager> {
        Self::with_config(PoolUpstream::Driver(ctx.clone()), PoolConfig::from_env()?)
    }

    /// A pool over `upstream` with `config`. Over a custom upstream, which
    /// cannot be made again, the pool keeps no tag or stream pools (tagged
    /// allocations and every stream come from the pool itself).
    pub fn with_config(upstream: PoolUpstream, config: PoolConfig) -> Result<PoolManager> {
        let recipe = match upstream {
            PoolUpstream::Driver(ref ctx) => Recipe::Driver(ctx.clone()),
            PoolUpstream::Host { capacity, touch } => {
                // One stand-in device for the pool and its tag and stream
                // pools. Over it, moved pieces are unmapped on the allocating
                // thread (its events complete when waited for: a helper's
                // timing would move a replay's figures).
                let host = Arc::new(HostUpstream::new(capacity, touch));
                let (up, vmm) = host_parts(&host, touch, &config.segments);
                let config = PoolConfig {
                    background_unmap: false,
                    ..config
                };
                return Self::build(
                    PoolUpstream::Custom(up, Box::new(HostEvents::immediate()), vmm, None),
                    config,
                    Recipe::Host { host, touch },
                );
            }
            PoolUpstream::Custom(..) => Recipe::None,
        };
        Self::build(upstream, config, recipe)
    }

    /// A pool over `upstream` with `config`, whose tag and stream pools are
    /// made by `recipe`.
    fn build(upstream: PoolUpstream, config: PoolConfig, recipe: Recipe) -> Result<PoolManager> {
        let family = Arc::new(Family::new(config.limit, config.release_threshold));
        let siblings = Arc::new(Siblings::new(recipe, family.clone()));
        Ok(PoolManager {
            core: make_core(upstream, config, family.clone())?,
            tags: TagPools::new(siblings.clone()),
            streams: StreamPools::new(siblings.clone(), config.stream_pools_made()),
            siblings,
            family,
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

    /// A pool over the host stand-in of `capacity` bytes whose device runs
    /// `clock.lag()` requests behind the host (see [`emm_core::HostClock`]): its
    /// events complete only once the clock has moved that far, as a GPU's do
    /// while the host queues work ahead. Its tag and stream pools run on the same
    /// clock. Without the helper thread that unmaps moved pieces
    /// ([`PoolConfig::background_unmap`]): a replay gives the same figures every time.
    pub fn host_lagged(
        capacity: usize,
        config: PoolConfig,
        clock: Arc<emm_core::HostClock>,
    ) -> Result<PoolManager> {
        let host = Arc::new(HostUpstream::new(capacity, false));
        let (up, vmm) = host_parts(&host, false, &config.segments);
        // As over the plain stand-in, moved pieces are unmapped on the replaying
        // thread, so a replay gives the same figures every time.
        let config = PoolConfig {
            background_unmap: false,
            ..config
        };
        let recipe = Recipe::Lagged {
            host,
            clock: clock.clone(),
        };
        Self::build(
            PoolUpstream::Custom(up, Box::new(crate::LaggedEvents::new(clock)), vmm, None),
            config,
            recipe,
        )
    }

    /// Allocates on `stream` (the stream-ordered path; same as
    /// [`MemoryManager::memalloc_async`](emm_core::MemoryManager::memalloc_async)).
    pub fn alloc(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        let tag = Tag::current();
        if tag != Tag::DEFAULT && self.tags.enabled() {
            let owner = || self.tags.get(tag).map(|t| t.core.clone());
            return self.with_family_memory(&owner, || {
                self.tags.alloc(tag, &self.core.config, size, stream)
            });
        }
        // Small requests stay in the pool's own small segments (see
        // `streams.rs`; `SMALL_MAX` is a multiple of the rounding, so the
        // unrounded size decides the same).
        let core = if size <= SMALL_MAX {
            &self.core
        } else {
            self.streams
                .pool_of(stream, &self.core.config)
                .unwrap_or(&self.core)
        };
        self.with_family_memory(&|| Some(core.clone()), || core.alloc(size, stream))
    }

    /// Runs `allocate`, an allocation from the pool `owner` names (the tag's
    /// pool may be made by the allocation itself). Where it runs out of memory
    /// and the family has other pools (tag or stream pools), their free memory
    /// goes back first (a trim of each; paused tags keep theirs) and
    /// `allocate` runs once more: one stream's or tag's cache never makes
    /// another's request fail. The refused first try is not counted in
    /// `num_ooms` (its `oom` history entry stays): only the outcome is. An
    /// out-of-memory error that stands says what the pool that refused held
    /// and, where the family has other pools, what they all hold together.
    fn with_family_memory(
        &self,
        owner: &dyn Fn() -> Option<Arc<Core>>,
        allocate: impl Fn() -> Result<DeviceAllocation>,
    ) -> Result<DeviceAllocation> {
        match allocate() {
            Err(e) if e.is_out_of_memory() => {
                let owner = owner();
                let others: Vec<Arc<Core>> = std::iter::once(self.core.clone())
                    .chain(self.sibling_cores())
                    .filter(|c| owner.as_ref().is_none_or(|o| !Arc::ptr_eq(c, o)))
                    .collect();
                let freed: usize = others.iter().map(|c| trim_core(c).0).sum();
                if freed == 0 {
                    return Err(self.with_family_figures(e));
                }
                let r = allocate();
                if let Some(o) = owner {
                    let mut arena = o.lock();
                    arena.stats.ooms = arena.stats.ooms.saturating_sub(1);
                }
                r.map_err(|e| self.with_family_figures(e))
            }
            r => r,
        }
    }

    /// `e`, an out-of-memory error of one of the family's pools, with the
    /// family's figures added to its detail where other pools share the device
    /// with the one that refused (its own live and reserved bytes leave theirs
    /// out); any other error, or a pool alone, unchanged.
    fn with_family_figures(&self, e: EmmError) -> EmmError {
        let pools = 1 + self.sibling_cores().len();
        match e {
            EmmError::OutOfMemory {
                what,
                manager,
                requested,
                free,
                total,
                detail,
            } if pools > 1 => EmmError::OutOfMemory {
                what,
                manager,
                requested,
                free,
                total,
                detail: format!(
                    "{detail} (of the pool that refused); all {pools} pools of this manager (its own, its stream and tag pools) together: live {}, reserved {}",
                    emm_core::fmt_bytes(self.family.active()),
                    emm_core::fmt_bytes(self.family.reserved()),
                ),
            },
            e => e,
        }
    }

    /// The pools of the family other than the pool's own: its tag pools', then
    /// its stream pools'.
    pub(super) fn sibling_cores(&self) -> Vec<Arc<Core>> {
        self.tags
            .all()
            .into_iter()
            .map(|t| t.core.clone())
            .chain(self.streams.all().map(|p| p.core.clone()))
            .collect()
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

    /// Statistics: the pool's own and its tag and stream pools' summed. Of the
    /// peaks, reserved and active bytes are the peaks of the family's sums;
    /// the other peaks are sums of each pool's peak (bounds of the peak of the
    /// sum), allocated bytes' no more than the active peak.
    pub fn stats(&self) -> PoolStats {
        let mut s = {
            let mut arena = self.core.lock();
            self.stats_locked(&mut arena)
        };
        let siblings = self.sibling_cores();
        for c in &siblings {
            let mut arena = c.lock();
            s.absorb(&core_stats(c, &mut arena));
        }
        if !siblings.is_empty() {
            family_peaks(&mut s, &self.family);
        }
        s
    }

    /// The pool's own statistics (its tag pools' apart), under its lock.
    fn stats_locked(&self, arena: &mut Arena) -> PoolStats {
        core_stats(&self.core, arena)
    }
}

impl PoolManager {
    /// Sets every peak (allocated, active, reserved, segments) to its current
    /// value, the tag and stream pools' and the family's too.
    pub fn reset_peak_stats(&self) {
        for core in std::iter::once(self.core.clone()).chain(self.sibling_cores()) {
            let mut a = core.lock();
            let (bytes, blocks) = core.allocated_now(&a);
            a.stats.reset_peaks(bytes, blocks);
        }
        self.family.reset_peaks();
    }

    /// Records the allocation history in a ring of the latest `max_entries`
    /// entries (0: off, the history dropped). While on, every allocation and free
    /// takes the pool's lock to record itself; off, the lock-free path reads one
    /// relaxed flag.
    pub fn record_history(&self, max_entries: usize) {
        // Tag and stream pools made from now on record too (set first: one
        // made while this runs records as those listed below).
        self.siblings.set_history(max_entries);
        for core in std::iter::once(self.core.clone()).chain(self.sibling_cores()) {
            let mut arena = core.lock();
            arena.history.set_capacity(max_entries);
            core.recording.store(max_entries > 0, Ordering::Relaxed);
        }
    }

    /// Segments, blocks, the recorded history and the statistics, taken under the
    /// pool's lock at one time. This thread's cached blocks go back to the pool
    /// first (as with [`trim`](Self::trim)); blocks other threads keep cached are
    /// live to the pool and show as allocated, so the allocated blocks sum to
    /// `active_bytes`, and to `allocated_bytes` when no other thread caches any
    /// (`thread_cached_bytes` is 0). Segments sum to `reserved_bytes` (plus
    /// `paused_bytes`: a paused tag's segment keeps its size). Tag and stream
    /// pools are read after the pool, each under its own lock.
    pub fn snapshot(&self) -> MemorySnapshot {
        let mut arena = self.core.lock();
        self.core.flush_thread(&mut arena);
        let mut stats = self.stats_locked(&mut arena);
        let mut segments = arena.snapshot_segments();
        let mut trace = arena.history.entries();
        drop(arena);
        // Tag and stream pools, each under its own lock after the pool's.
        let siblings = self.sibling_cores();
        for c in &siblings {
            let mut a = c.lock();
            c.flush_thread(&mut a);
            stats.absorb(&core_stats(c, &mut a));
            segments.extend(a.snapshot_segments());
            trace.extend(a.history.entries());
        }
        if !siblings.is_empty() {
            family_peaks(&mut stats, &self.family);
        }
        segments.sort_by_key(|s| s.address);
        // (Stable: each pool's entries keep their order at equal times.)
        trace.sort_by_key(|e| e.time_us);
        MemorySnapshot {
            segments,
            trace,
            stats: stats.to_list(),
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
        self.trim_reporting().0
    }

    /// [`PoolManager::trim`], with the first refusal of the upstream to take a
    /// wholly free segment back (the segment is kept, still reserved).
    pub(crate) fn trim_reporting(&self) -> (usize, Option<EmmError>) {
        if emm_sys::forked() {
            return (0, None);
        }
        let mut refusal = None;
        let mut released = 0usize;
        for core in self
            .sibling_cores()
            .iter()
            .chain(std::iter::once(&self.core))
        {
            let (n, e) = trim_core(core);
            released += n;
            if let Some(e) = e {
                refusal.get_or_insert(e);
            }
        }
        (released, refusal)
    }

    /// The byte limit of the pool and its tag pools (`None`: the device's memory).
    pub fn limit(&self) -> Option<usize> {
        self.family.limit()
    }

    /// Sets the byte limit of the pool and its tag pools while it serves
    /// (`pool_limit` at run time). Below what the pool reserves, the pool trims at
    /// once ([`PoolManager::trim`]); what is still above it stays until it is
    /// freed, and growth that would pass the limit is refused
    /// ([`EmmError::OutOfMemory`] naming the limit). Returns the bytes the trim
    /// gave back.
    pub fn set_limit(&self, limit: Option<usize>) -> usize {
        self.family.set_limit(limit);
        match limit {
            Some(l) if self.family.reserved() > l => self.trim(),
            _ => 0,
        }
    }

    /// The release threshold (`usize::MAX`: none; see
    /// [`PoolConfig::release_threshold`]).
    pub fn release_threshold(&self) -> usize {
        self.family.release_threshold()
    }

    /// Sets the release threshold while the pool serves
    /// (`pool_release_threshold` at run time). When the pool reserves more, it
    /// takes the threads' cached blocks back and waits for its streams once (as
    /// [`PoolManager::trim`] does), and gives back free memory down to the
    /// threshold. Returns the bytes given back.
    pub fn set_release_threshold(&self, bytes: usize) -> usize {
        self.family.set_release_threshold(bytes);
        let mut released = 0;
        for core in self.sibling_cores().iter().chain([&self.core]) {
            if !self.family.above_threshold() {
                break;
            }
            let mut arena = core.lock();
            // Cached blocks go back to the arena first, as in a trim.
            core.flush_thread(&mut arena);
            let gen = core.generation.load(Ordering::Acquire);
            core.reclaim_cached(&mut arena, None, gen);
            if let Err(e) = arena.consolidate(core.events.as_ref()) {
                tracing::warn!(error = %e, "waiting for streams failed; releasing what is settled");
            }
            released += arena.release_above_threshold(core.events.as_ref(), &core.source());
        }
        released
    }
}

/// Puts the family's peaks into `s`, the summed statistics of its pools:
/// reserved and active bytes peak at the family's sums (a sum of each pool's
/// peak only bounds those), and allocated bytes never above active ones.
fn family_peaks(s: &mut PoolStats, family: &Family) {
    let (reserved, active) = family.peaks();
    s.reserved_bytes_peak = reserved.max(s.reserved_bytes);
    s.active_bytes_peak = active.max(s.active_bytes);
    s.allocated_bytes_peak = s
        .allocated_bytes_peak
        .min(s.active_bytes_peak)
        .max(s.allocated_bytes);
}

/// Trims `core` (see [`PoolManager::trim`]), with the first refusal of the
/// upstream to take a segment back; a paused arena holds no memory to give back
/// and is left alone.
fn trim_core(core: &Arc<Core>) -> (usize, Option<EmmError>) {
    let mut arena = core.lock();
    if arena.is_paused() {
        return (0, None);
    }
    // Only this trim's refusals are its to report: one of an earlier growth's
    // out-of-memory ladder or tightening was logged then.
    let _ = arena.take_refusal();
    // Pinned host buffers kept for the next pause go too (host memory: not in
    // the bytes returned).
    arena.release_spare_copies();
    core.flush_thread(&mut arena);
    let gen = core.generation.load(Ordering::Acquire);
    core.reclaim_cached(&mut arena, None, gen);
    let settled = arena.consolidate(core.events.as_ref());
    if let Err(e) = &settled {
        tracing::warn!(error = %e, "waiting for streams during trim failed; trimming what is settled");
    }
    let source = core.source();
    let released = arena.release_free_segments(&source, core.events.as_ref())
        + arena.release_free_pieces(&source)
        + core.retry_refused("trim");
    if settled.is_ok() {
        // The events idle now (every stream's, after the consolidation) are
        // destroyed: the pool keeps only those still in use.
        core.events.release_idle();
    }
    (released, arena.take_refusal())
}

impl PoolManager {
    /// Bytes of segments the pool gave back whole (reset, drop) whose free the
    /// driver refused: no longer in `reserved_bytes`, kept and freed again by the
    /// next trim, reset or drop.
    pub fn refused_bytes(&self) -> usize {
        self.core.refused.bytes()
            + self
                .sibling_cores()
                .iter()
                .map(|c| c.refused.bytes())
                .sum::<usize>()
    }

    /// Checks the pool's internal consistency (for tests): each pool's, and the
    /// family's reserved and active bytes against the sums over its pools
    /// (call it while no other thread allocates or frees). Returns what is
    /// wrong.
    pub fn check(&self) -> std::result::Result<(), String> {
        // Each pool locked once: checked, and its bytes summed.
        let (mut reserved, mut active) = (0, 0);
        let mut check = |core: &Arc<Core>, what: &dyn Fn() -> String| {
            let a = core.lock();
            a.check().map_err(|e| format!("{}{e}", what()))?;
            reserved += a.stats.reserved;
            active += a.stats.live;
            Ok::<(), String>(())
        };
        check(&self.core, &String::new)?;
        for t in self.tags.all() {
            check(&t.core, &|| format!("tag `{}`: ", t.tag.name()))?;
        }
        for p in self.streams.all() {
            check(&p.core, &|| format!("the pool of stream {:#x}: ", p.stream))?;
        }
        let (family_reserved, family_active) = (self.family.reserved(), self.family.active());
        if (family_reserved, family_active) != (reserved, active) {
            return Err(format!(
                "the family counts {family_reserved} bytes reserved and {family_active} active; its pools sum to {reserved} and {active}"
            ));
        }
        Ok(())
    }

    /// Pending cross-stream event groups (for tests).
    pub fn pending_event_groups(&self) -> usize {
        self.core.lock().pending_groups()
    }

    /// The composed host-memory half, when serving a real context.
    pub fn host_only(&self) -> Option<&HostOnly> {
        self.core.host.as_ref()
    }

    pub(super) fn no_host(&self, operation: &'static str) -> EmmError {
        EmmError::Unsupported {
            manager: "pool over the host stand-in".into(),
            operation,
        }
    }
}

impl Drop for PoolManager {
    fn drop(&mut self) {
        retire_core(&self.core, "pool");
        for t in self.tags.all() {
            retire_core(&t.core, "tag pool");
        }
        for p in self.streams.all() {
            retire_core(&p.core, "stream pool");
        }
    }
}

/// Gives `core`'s memory back as its pool goes (unless a block is still live,
/// or in a forked child: then the core is kept until exit).
fn retire_core(core: &Arc<Core>, what: &str) {
    if emm_sys::forked() {
        // In a forked child the core is the parent's: leave it untouched.
        std::mem::forget(core.clone());
        return;
    }
    // Allocations point at the core without counting references; if any is
    // still live, the core must outlive it: leak it rather than free under it.
    let live = core.live_blocks();
    if live > 0 {
        tracing::warn!(
            live,
            "{what} dropped while {live} allocations are live; its memory is kept until exit"
        );
        std::mem::forget(core.clone());
        return;
    }
    // Pairs with the Release of the last free's count: that free is done with
    // the core before the core is taken apart below.
    std::sync::atomic::fence(Ordering::Acquire);
    // Every block is free now, in the arena or in some thread's cache (those
    // entries go stale with the generation): wait for the device's work on
    // them, then give every segment back.
    core.generation.fetch_add(1, Ordering::AcqRel);
    match core.events.synchronize_all() {
        Err(e) if e.is_driver_shutting_down() => {
            tracing::debug!(error = %e, "the driver is shutting down as the pool goes");
        }
        Err(e) => {
            tracing::error!(error = %e, "synchronizing before dropping a pool failed; freeing its segments anyway");
        }
        Ok(()) => {}
    }
    core.give_back_all("dropping a pool");
    core.refused.hand_over(core.upstream.as_ref());
}

/// `core`'s statistics, under its lock.
fn core_stats(core: &Core, arena: &mut Arena) -> PoolStats {
    core.sample_peaks(arena);
    let a = arena.stats;
    let inactive_split_bytes = arena.inactive_split_bytes();
    let allocated_blocks = core.live_blocks().max(0) as usize;
    let threads = core.threads.lock().unwrap_or_else(|p| p.into_inner());
    let allocated_bytes_total = threads
        .iter()
        .map(|c| c.allocated_total.load(Ordering::Relaxed))
        .sum::<u64>()
        + core.orphan.allocated_total.load(Ordering::Relaxed);
    let allocations = threads
        .iter()
        .map(|c| c.allocations.load(Ordering::Relaxed))
        .sum::<u64>()
        + core.orphan.allocations.load(Ordering::Relaxed);
    let thread_cache_hits = threads
        .iter()
        .map(|c| c.hits.load(Ordering::Relaxed))
        .sum::<u64>()
        + core.orphan.hits.load(Ordering::Relaxed);
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
        counts: a.counts,
        paused_bytes: arena.paused_bytes(),
        peak_slack: a.peak_slack,
    }
}

//! [`DefaultManager`]: NBEP 7's built-in manager (Numba's `NumbaCUDAMemoryManager`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use emm_core::{
    DeferGuard, DeferState, DeviceAllocation, DeviceRelease, DeviceView, EmmError, HostAllocFlags,
    HostMemory, IpcHandle, ManagedAttach, ManagedMemory, ManagedStats, MemoryInfo, MemoryManager,
    Released, Result, SYNC_STREAM,
};
use emm_driver::Context;
use emm_sys::{CUdeviceptr, CUstream};

use crate::config::PendingConfig;
use crate::host::HostOnly;
use crate::managed::Managed;
use crate::upstream::{DriverUpstream, Upstream};

/// Counters of a [`DefaultManager`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefaultStats {
    /// Allocations served.
    pub allocations: usize,
    /// Flushes of the pending queue.
    pub flushes: usize,
    /// Blocks given back to the upstream (`cuMemFree`), one call each.
    pub frees: usize,
    /// Out-of-memory retries (flush, then retry once).
    pub oom_retries: usize,
    /// Live allocations.
    pub live: usize,
    /// Live bytes.
    pub live_bytes: usize,
    /// Peak of bytes held from the upstream (live plus pending frees).
    pub peak_held_bytes: usize,
    /// Peak of live bytes (allocations held by callers).
    pub peak_live_bytes: usize,
}

#[derive(Debug, Default)]
struct State {
    pending: Vec<(CUdeviceptr, usize)>,
    pending_bytes: usize,
    live: HashMap<CUdeviceptr, usize>,
    live_bytes: usize,
    peak_held: usize,
    peak_live: usize,
    generation: usize,
}

struct Inner<U: Upstream> {
    upstream: U,
    config: PendingConfig,
    capacity: AtomicUsize,
    defer: Arc<DeferState>,
    state: Mutex<State>,
    allocations: AtomicUsize,
    flushes: AtomicUsize,
    frees: AtomicUsize,
    oom_retries: AtomicUsize,
    release_errors: Mutex<Vec<EmmError>>,
}

impl<U: Upstream> Inner<U> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn over(&self, s: &State) -> bool {
        s.pending.len() > self.config.max_count
            || s.pending_bytes > self.config.max_bytes(self.capacity.load(Ordering::Relaxed))
    }

    fn take_pending(s: &mut State) -> Vec<(CUdeviceptr, usize)> {
        s.pending_bytes = 0;
        std::mem::take(&mut s.pending)
    }

    fn free_blocks(&self, blocks: Vec<(CUdeviceptr, usize)>) -> usize {
        if blocks.is_empty() {
            return 0;
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let mut bytes = 0;
        let mut failed = Vec::new();
        for (ptr, size) in blocks {
            // SAFETY: each block came from `upstream.alloc(size)`, left the live set
            // exactly once (release or reset), and is freed once here.
            match unsafe { self.upstream.free(ptr, size) } {
                Ok(()) => {
                    bytes += size;
                    self.frees.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(ptr = format_args!("{ptr:#x}"), size, error = %e, "freeing a pending block failed; it stays queued for the next flush");
                    self.release_errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(e);
                    failed.push((ptr, size));
                }
            }
        }
        // A refused free leaves the block allocated: it goes back to the queue, so
        // the next flush (a trim, the out-of-memory ladder, the manager's drop)
        // tries again instead of leaking it.
        if !failed.is_empty() {
            let mut s = self.lock();
            s.pending_bytes += failed.iter().map(|&(_, size)| size).sum::<usize>();
            s.pending.extend(failed);
        }
        bytes
    }

    fn flush(&self) -> usize {
        let blocks = Self::take_pending(&mut self.lock());
        self.free_blocks(blocks)
    }

    fn flush_if_needed(&self) {
        let blocks = {
            let mut s = self.lock();
            if self.defer.is_deferred() || !self.over(&s) {
                return;
            }
            Self::take_pending(&mut s)
        };
        self.free_blocks(blocks);
    }
}

/// The last owner gone (the manager and every allocation it handed out): frees
/// still queued go back to the upstream, so dropping a manager leaks nothing.
impl<U: Upstream> Drop for Inner<U> {
    fn drop(&mut self) {
        let blocks = Self::take_pending(self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.free_blocks(blocks);
        // What the driver refused again went back to the queue: nobody is left
        // to flush it, so it is handed to the upstream to free later.
        let refused = Self::take_pending(self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (ptr, size) in refused {
            // SAFETY: each block came from `upstream.alloc(size)`, its free just
            // failed, and with the last owner gone nobody uses it again.
            if !unsafe { self.upstream.free_later(ptr, size) } {
                tracing::error!(
                    ptr = format_args!("{ptr:#x}"),
                    size,
                    "a block whose free failed stays allocated as the default manager goes"
                );
            }
        }
        for e in self
            .release_errors
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default()
        {
            tracing::error!(error = %e, "a free failed while the default manager was dropped");
        }
    }
}

impl<U: Upstream> DeviceRelease for Inner<U> {
    fn release(&self, block: Released) {
        let Released {
            ptr, size, token, ..
        } = block;
        let blocks = {
            let mut s = self.lock();
            if token != s.generation {
                return; // invalidated by reset: the memory was already freed
            }
            if s.live.remove(&ptr).is_none() {
                return;
            }
            s.live_bytes -= size;
            s.pending.push((ptr, size));
            s.pending_bytes += size;
            if self.defer.is_deferred() || !self.over(&s) {
                return;
            }
            Self::take_pending(&mut s)
        };
        self.free_blocks(blocks);
    }
}

/// NBEP 7's default manager: device memory straight from the upstream
/// (`cuMemAlloc`), frees queued and flushed in batches.
///
/// - A free is queued; the queue is flushed when its count exceeds
///   [`PendingConfig::max_count`] or its bytes exceed [`PendingConfig::max_ratio`]
///   of device memory (both "strictly greater", as in Numba).
/// - `defer_cleanup` holds every flush while any guard lives (guards nest; a panic
///   unwinding through one releases it); when the last guard drops, the queue is
///   flushed if it is over its thresholds. The out-of-memory ladder does not flush
///   while deferred either.
/// - Out of memory: flush the queue, retry once, then [`EmmError::OutOfMemory`] with
///   the requested bytes and the device's free and total.
/// - `reset` frees everything, live allocations included; those are invalidated
///   (their drop does nothing), so nothing is freed twice.
/// - Host memory comes from a composed [`HostOnly`] sharing the defer guard, and
///   managed memory from a composed [`Managed`] (`cuMemAllocManaged` per request,
///   `cuMemFree` per free: not queued with device frees, counted apart).
pub struct DefaultManager<U: Upstream + 'static = DriverUpstream> {
    inner: Arc<Inner<U>>,
    host: Option<HostOnly>,
    managed: Option<Managed>,
    ctx: Option<Context>,
}

impl<U: Upstream + 'static> core::fmt::Debug for DefaultManager<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DefaultManager")
            .field("upstream", &self.inner.upstream.name())
            .field("stats", &self.stats())
            .finish()
    }
}

impl DefaultManager<DriverUpstream> {
    /// The settings it reads ([`crate::SETTINGS`]), for its factory to declare.
    pub fn settings() -> Vec<&'static dyn emm_core::setting::AnySetting> {
        crate::SETTINGS.to_vec()
    }

    /// The default manager of `ctx`, configured from the environment
    /// ([`PendingConfig::from_env`]).
    pub fn new(ctx: &Context) -> Result<Self> {
        Self::with_config(ctx, PendingConfig::from_env()?)
    }

    /// The default manager of `ctx` with `config`.
    pub fn with_config(ctx: &Context, config: PendingConfig) -> Result<Self> {
        let mut m = DefaultManager::over(DriverUpstream::new(ctx), config);
        m.host = Some(HostOnly::new(ctx, config, m.inner.defer.clone())?.for_manager("default"));
        m.managed = Some(Managed::new(ctx, "default", m.inner.defer.clone()));
        m.ctx = Some(ctx.clone());
        Ok(m)
    }
}

impl<U: Upstream + 'static> DefaultManager<U> {
    /// A manager over any upstream, without host memory (for the host stand-in).
    pub fn over(upstream: U, config: PendingConfig) -> Self {
        DefaultManager {
            inner: Arc::new(Inner {
                upstream,
                config,
                capacity: AtomicUsize::new(0),
                defer: DeferState::new(),
                state: Mutex::new(State::default()),
                allocations: AtomicUsize::new(0),
                flushes: AtomicUsize::new(0),
                frees: AtomicUsize::new(0),
                oom_retries: AtomicUsize::new(0),
                release_errors: Mutex::new(Vec::new()),
            }),
            host: None,
            managed: None,
            ctx: None,
        }
    }

    /// The upstream.
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The configuration.
    pub fn config(&self) -> PendingConfig {
        self.inner.config
    }

    /// `(count, bytes)` of frees waiting in the device queue.
    pub fn pending(&self) -> (usize, usize) {
        let s = self.inner.lock();
        (s.pending.len(), s.pending_bytes)
    }

    /// The composed host-memory half, when serving a real context.
    pub fn host(&self) -> Option<&HostOnly> {
        self.host.as_ref()
    }

    /// Counters.
    pub fn stats(&self) -> DefaultStats {
        let s = self.inner.lock();
        DefaultStats {
            allocations: self.inner.allocations.load(Ordering::Relaxed),
            flushes: self.inner.flushes.load(Ordering::Relaxed),
            frees: self.inner.frees.load(Ordering::Relaxed),
            oom_retries: self.inner.oom_retries.load(Ordering::Relaxed),
            live: s.live.len(),
            live_bytes: s.live_bytes,
            peak_held_bytes: s.peak_held,
            peak_live_bytes: s.peak_live,
        }
    }

    /// Errors raised while freeing queued blocks (also logged when they happened).
    pub fn take_release_errors(&self) -> Vec<EmmError> {
        std::mem::take(
            &mut *self
                .inner
                .release_errors
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Flushes the device queue now (ignores the defer guard); returns bytes freed.
    pub fn flush(&self) -> usize {
        self.inner.flush()
    }

    fn attempt(&self, size: usize) -> Result<CUdeviceptr> {
        match self.inner.upstream.alloc(size) {
            Err(e) if e.is_out_of_memory() => {
                self.inner.oom_retries.fetch_add(1, Ordering::Relaxed);
                if !self.inner.defer.is_deferred() {
                    self.inner.flush();
                    if let Some(h) = &self.host {
                        h.flush();
                    }
                }
                self.inner.upstream.alloc(size).map_err(|e| {
                    if e.is_out_of_memory() {
                        let info = self.inner.upstream.mem_info().unwrap_or_default();
                        let (count, bytes) = self.pending();
                        EmmError::OutOfMemory {
                            what: "device",
                            manager: "default".into(),
                            requested: size,
                            free: info.free,
                            total: info.total,
                            detail: if count > 0 {
                                format!(
                                    "{count} frees of {} held back by defer_cleanup",
                                    emm_core::fmt_bytes(bytes)
                                )
                            } else {
                                String::new()
                            },
                        }
                    } else {
                        e
                    }
                })
            }
            other => other,
        }
    }

    fn allocate(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        if size == 0 {
            // SAFETY: a zero-length allocation owns nothing; the finalizer does nothing.
            return Ok(unsafe { DeviceAllocation::from_raw_parts(0, 0, stream, |_, _, _| {}) });
        }
        let ptr = self.attempt(size)?;
        let token = {
            let mut s = self.inner.lock();
            s.live.insert(ptr, size);
            s.live_bytes += size;
            s.peak_held = s.peak_held.max(s.live_bytes + s.pending_bytes);
            s.peak_live = s.peak_live.max(s.live_bytes);
            s.generation
        };
        self.inner.allocations.fetch_add(1, Ordering::Relaxed);
        let owner: Arc<dyn DeviceRelease> = self.inner.clone();
        // SAFETY: `ptr` is a fresh upstream block of `size` bytes, owned by `inner`
        // until released through it.
        Ok(unsafe { DeviceAllocation::with_releaser(ptr, size, stream, ptr, size, owner, token) })
    }

    fn no_host(&self, operation: &'static str) -> EmmError {
        EmmError::Unsupported {
            manager: format!("default over {}", self.inner.upstream.name()),
            operation,
        }
    }
}

impl<U: Upstream + 'static> MemoryManager for DefaultManager<U> {
    fn name(&self) -> &str {
        "default"
    }

    fn initialize(&self) -> Result<()> {
        let info = self.inner.upstream.mem_info()?;
        self.inner.capacity.store(info.total, Ordering::Relaxed);
        Ok(())
    }

    fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
        self.allocate(size, SYNC_STREAM)
    }

    fn memalloc_async(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        // cuMemAlloc memory is usable on every stream at once; the allocation only
        // remembers `stream`.
        self.allocate(size, stream)
    }

    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        self.host
            .as_ref()
            .ok_or_else(|| self.no_host("memhostalloc"))?
            .memhostalloc(size, flags)
    }

    fn memallocmanaged(&self, size: usize, attach: ManagedAttach) -> Result<ManagedMemory> {
        self.managed
            .as_ref()
            .ok_or_else(|| self.no_host("memallocmanaged"))?
            .memallocmanaged(size, attach, &|| self.release_cached().unwrap_or(0))
    }

    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        let host = self.host.as_ref().ok_or_else(|| self.no_host("mempin"))?;
        // SAFETY: forwarded to the caller.
        unsafe { host.mempin(ptr, len, mapped) }
    }

    fn get_memory_info(&self) -> Result<MemoryInfo> {
        self.inner.upstream.mem_info()
    }

    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle> {
        let ctx = self
            .ctx
            .as_ref()
            .ok_or_else(|| self.no_host("get_ipc_handle"))?;
        IpcHandle::export_legacy(ctx, view.parent().base().0, view.ptr(), view.len())
    }

    fn reset(&self) -> Result<()> {
        // No kernel may still use what is freed. Waited for before anything is
        // taken out of the manager: a failure then leaves every block where it
        // was (taken first, they were lost: neither freed nor tracked).
        if let Some(ctx) = &self.ctx {
            ctx.synchronize_for_manager()?;
        }
        let blocks = {
            let mut s = self.inner.lock();
            s.generation = s.generation.wrapping_add(1);
            let mut blocks = Inner::<U>::take_pending(&mut s);
            blocks.extend(s.live.drain());
            s.live_bytes = 0;
            blocks
        };
        self.inner.free_blocks(blocks);
        if let Some(h) = &self.host {
            h.flush();
        }
        if let Some(m) = &self.managed {
            m.reset();
        }
        Ok(())
    }

    fn defer_cleanup(&self) -> DeferGuard {
        let inner = self.inner.clone();
        let host = self.host.clone();
        let managed = self.managed.clone();
        self.inner.defer.guard(move || {
            inner.flush_if_needed();
            if let Some(h) = host {
                h.flush_if_needed();
            }
            if let Some(m) = managed {
                m.flush();
            }
        })
    }

    fn release_cached(&self) -> Result<usize> {
        if self.inner.defer.is_deferred() {
            return Ok(0);
        }
        if let Some(ctx) = &self.ctx {
            ctx.retry_destroys_in_trim();
        }
        Ok(self.inner.flush()
            + self.host.as_ref().map_or(0, HostOnly::flush)
            + self.managed.as_ref().map_or(0, Managed::release_cached))
    }

    fn context(&self) -> Option<&Context> {
        self.ctx.as_ref()
    }

    fn stats(&self) -> emm_core::ManagerStats {
        let st = DefaultManager::stats(self);
        let (_, pending) = self.pending();
        emm_core::ManagerStats {
            allocated_bytes: st.live_bytes,
            allocated_bytes_peak: st.peak_live_bytes,
            reserved_bytes: st.live_bytes + pending,
            reserved_bytes_peak: st.peak_held_bytes,
            allocations: st.allocations as u64,
            upstream_allocs: st.allocations as u64,
            upstream_frees: st.frees as u64,
        }
    }

    fn managed_stats(&self) -> ManagedStats {
        self.managed
            .as_ref()
            .map(Managed::stats)
            .unwrap_or_default()
    }

    fn reset_peak_stats(&self) {
        {
            let mut s = self.inner.lock();
            s.peak_live = s.live_bytes;
            s.peak_held = s.live_bytes + s.pending_bytes;
        }
        if let Some(m) = &self.managed {
            m.reset_peak();
        }
    }
}

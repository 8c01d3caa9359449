//! An emm plugin of NBEP 7's "device memory only" kind, on CUDA's stream-ordered
//! allocator. Read this file top to bottom: it is a complete plugin.
//!
//! 1. **Device memory** comes from a memory pool the plugin creates on its context's
//!    device (`cuMemPoolCreate`, exportable as a POSIX file descriptor for IPC),
//!    with `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on the allocation's stream.
//!    The synchronous NBEP 7 `memalloc` allocates on the legacy default stream and
//!    synchronizes it before returning, so the memory is safe on any stream.
//! 2. **Host memory** is forwarded to a composed [`HostOnly`] (NBEP 7's
//!    `HostOnlyCUDAMemoryManager`, by composition instead of inheritance).
//! 3. **Release threshold**: bytes the pool keeps reserved at synchronization points
//!    ([`HostOnlyConfig::release_threshold`], or `EMM_HOSTONLY_RELEASE_THRESHOLD` in
//!    bytes, or `max`). [`HostOnlyManager::trim`] gives memory back
//!    (`cuMemPoolTrimTo`).
//! 4. **IPC**: legacy `cuIpcGetMemHandle` cannot export pool memory (rmm#1029,
//!    ucx#7110), so handles are [`IpcHandle::MemPool`]: the pool's file descriptor
//!    plus the pointer's export data. The importer takes the descriptor from this
//!    process with `pidfd_getfd` (see `emm_core::IpcHandle`), imports the pool, then
//!    the pointer.
//! 5. **`defer_cleanup`**: frees are stream-ordered and never synchronize the device,
//!    so there is nothing to defer for device memory; the guard defers the pinned
//!    host queue of [`HostOnly`].
//! 6. On a driver or device without the stream-ordered allocator,
//!    [`HostOnlyManager::new`] fails with [`EmmError::Unsupported`].
//! 7. **Managed memory** (Numba's `memallocmanaged`) comes from a composed
//!    [`Managed`]: `cuMemAllocManaged` per request, `cuMemFree` per free. CUDA's
//!    memory pools hold device memory only, and Numba itself puts
//!    `memallocmanaged` in its `HostOnlyCUDAMemoryManager` (the part a device-only
//!    plugin inherits), so "hostonly" serves it the way Numba's base class does.
//!    It is counted apart from the pool's device memory
//!    ([`MemoryManager::managed_stats`]).
//!
//! ```no_run
//! use emm_core::MemoryManager;
//! let ctx = emm_driver::Context::on_device(0)?;
//! let manager = emm_hostonly::HostOnlyManager::new(&ctx)?;
//! let stream = emm_driver::Stream::new(&ctx)?;
//! let _block = manager.memalloc_async(1 << 20, stream.raw())?; // freed on `stream` when dropped
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use emm_core::setting::{parse, AnySetting, Key, Setting, ValueKind};
use emm_core::{
    DeferGuard, DeferState, DeviceAllocation, DeviceRelease, DeviceView, EmmError, HostAllocFlags,
    HostMemory, IpcHandle, ManagedAttach, ManagedMemory, ManagedStats, MemoryInfo, MemoryManager,
    Released, Result, SYNC_STREAM,
};
use emm_default::{HostOnly, Managed, PendingConfig};
use emm_driver::mempool::{free_async, MemPool};
use emm_driver::{Context, Stream};
use emm_sys::{CUmemPool_attribute as Attr, CUstream};

/// `EMM_HOSTONLY_RELEASE_THRESHOLD`: bytes the pool keeps reserved (or `max`).
pub const RELEASE_THRESHOLD_ENV: &str = "EMM_HOSTONLY_RELEASE_THRESHOLD";

/// Configuration of a [`HostOnlyManager`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostOnlyConfig {
    /// Bytes the pool keeps reserved at synchronization points (default: all of
    /// them, `u64::MAX`, so freed memory is reused instead of returned).
    pub release_threshold: u64,
}

impl Default for HostOnlyConfig {
    fn default() -> Self {
        HostOnlyConfig {
            release_threshold: u64::MAX,
        }
    }
}

impl HostOnlyConfig {
    /// The defaults, with [`RELEASE_THRESHOLD`] applied (the environment's
    /// value when set, else the one configured in code).
    pub fn from_env() -> Result<Self> {
        let d = HostOnlyConfig::default();
        Ok(HostOnlyConfig {
            release_threshold: RELEASE_THRESHOLD.get(d.release_threshold)?,
        })
    }
}

/// `hostonly_release_threshold` ([`RELEASE_THRESHOLD_ENV`]).
pub static RELEASE_THRESHOLD: Setting<u64> = Setting::new(
    Key::new(
        "hostonly_release_threshold",
        RELEASE_THRESHOLD_ENV,
        ValueKind::BytesOrMax,
        "max",
        "bytes the `hostonly` manager's pool keeps reserved at synchronization points (`max`: all)",
    ),
    |v| parse::bytes_or_max(v).map(|n| u64::try_from(n).unwrap_or(u64::MAX)),
);

/// The settings of the `hostonly` manager (see [`HostOnlyManager::settings`]).
pub static SETTINGS: &[&dyn AnySetting] = &[&RELEASE_THRESHOLD];

/// Bytes of the pool, from its attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// Bytes reserved from the device now.
    pub reserved: u64,
    /// High-water mark of `reserved`.
    pub reserved_high: u64,
    /// Bytes in allocations now.
    pub used: u64,
    /// High-water mark of `used`.
    pub used_high: u64,
}

struct Inner {
    ctx: Context,
    pool: MemPool,
    /// Live allocations and their sizes (for `reset`).
    live: Mutex<HashMap<u64, usize>>,
    /// Blocks whose free failed in a drop (no caller to tell): still allocated in
    /// the pool, freed again by the next [`HostOnlyManager::trim`] (and so
    /// `release_cached` and the out-of-memory ladder), `reset`, or the manager's
    /// end. `(ptr, size)`.
    failed: Mutex<Vec<(u64, usize)>>,
    generation: Mutex<usize>,
    /// Allocations served (each one a driver call: the driver's pool is upstream).
    allocations: AtomicU64,
    /// Frees made (`cuMemFreeAsync`, one driver call each).
    frees: AtomicU64,
}

impl Inner {
    fn generation(&self) -> usize {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, Vec<(u64, usize)>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `b` out of the live set; `None` when it is not there (`reset` freed
    /// it already).
    fn take_live(&self, b: &Released) -> Option<usize> {
        if self.generation() != b.token {
            return None; // freed by reset already
        }
        self.live().remove(&b.ptr)
    }

    /// `cuMemFreeAsync` of `b` on its stream.
    fn free_on_its_stream(&self, b: &Released) -> emm_driver::Result<()> {
        // SAFETY: `b.stream` is the stream the caller ordered the memory on (a
        // stream of this context that outlives its allocations, or a default stream).
        let stream = unsafe { Stream::from_raw(&self.ctx, b.stream) };
        // SAFETY: `b.ptr` came from this pool, left the live set just now (so no
        // one else frees it) and is freed once, on its stream.
        unsafe { free_async(b.ptr, &stream) }?;
        self.frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Frees again the blocks whose free failed in a drop, on the legacy default
    /// stream. The caller has synchronized the context since those drops, so no
    /// work still uses them. Those that fail again stay for the next retry; the
    /// first error is returned. The number freed on success.
    fn retry_failed(&self) -> Result<usize> {
        let blocks = std::mem::take(&mut *self.failed());
        if blocks.is_empty() {
            return Ok(0);
        }
        let legacy = Stream::legacy(&self.ctx);
        let mut first = None;
        let mut freed = 0;
        let mut kept = Vec::new();
        for (ptr, size) in blocks {
            // SAFETY: each block came from this pool, left the live set when its
            // owner dropped it, and is freed once: it is in `failed` only until a
            // free of it succeeds. The context was synchronized since, so no work
            // uses it.
            match unsafe { free_async(ptr, &legacy) } {
                Ok(()) => {
                    self.frees.fetch_add(1, Ordering::Relaxed);
                    freed += 1;
                }
                Err(e) => {
                    kept.push((ptr, size));
                    first.get_or_insert(EmmError::FreeFailed {
                        manager: "hostonly".into(),
                        ptr,
                        size,
                        source: Box::new(e),
                    });
                }
            }
        }
        if !kept.is_empty() {
            tracing::warn!(
                blocks = kept.len(),
                "hostonly: freeing blocks whose free failed earlier failed again; they are kept for the next trim"
            );
            self.failed().extend(kept);
        }
        match first {
            Some(e) => Err(e),
            None => Ok(freed),
        }
    }
}

impl DeviceRelease for Inner {
    fn release(&self, b: Released) {
        if self.take_live(&b).is_none() {
            return;
        }
        if let Err(e) = self.free_on_its_stream(&b) {
            // No caller to return to: the error goes to the context (reported by
            // its next fallible call), and the block, still allocated in the pool,
            // is kept for the next trim to free again.
            tracing::warn!(
                ptr = format_args!("{:#x}", b.ptr),
                size = b.size,
                "hostonly: a free in a drop failed; the block is kept and freed again by the next trim"
            );
            self.failed().push((b.ptr, b.size));
            self.ctx.record_drop_error(e);
        }
    }

    fn try_release(&self, b: Released) -> Result<()> {
        if self.take_live(&b).is_none() {
            return Ok(());
        }
        self.free_on_its_stream(&b).map_err(|e| {
            // Nothing was freed: the block stays live, its owner's again.
            self.live().insert(b.ptr, b.size);
            EmmError::FreeFailed {
                manager: "hostonly".into(),
                ptr: b.ptr,
                size: b.size,
                source: Box::new(e),
            }
        })
    }
}

/// The manager's end (its last allocation gone too): blocks whose free failed are
/// freed now, before the pool goes, so the pool does not keep them.
impl Drop for Inner {
    fn drop(&mut self) {
        if self.failed().is_empty() {
            return;
        }
        // Errors recorded on the context stay for its next user.
        if let Err(e) = self.ctx.synchronize_keeping_deferred() {
            tracing::error!(error = %e, "hostonly: synchronizing before its last frees failed");
        }
        if let Err(e) = self.retry_failed() {
            tracing::error!(error = %e, blocks = self.failed().len(), "hostonly: blocks whose free failed could not be freed at the manager's end; its context frees them later");
            let kept = std::mem::take(&mut *self.failed());
            for (ptr, size) in kept {
                // SAFETY: each block came from this pool, its free failed, and
                // with the manager and its last allocation gone nobody uses it
                // again. The driver keeps the pool until its last block is freed.
                unsafe {
                    self.ctx
                        .free_later(emm_driver::Orphan::StreamOrdered { ptr, size })
                };
            }
        }
    }
}

/// Device memory from CUDA's stream-ordered allocator, host memory from
/// [`HostOnly`]. See the crate docs.
pub struct HostOnlyManager {
    inner: Arc<Inner>,
    host: HostOnly,
    managed: Managed,
    defer: Arc<DeferState>,
    exported_fd: OnceLock<std::os::fd::OwnedFd>,
    export_error: Option<String>,
}

impl core::fmt::Debug for HostOnlyManager {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HostOnlyManager")
            .field("usage", &self.usage().ok())
            .finish()
    }
}

impl HostOnlyManager {
    /// The settings it reads: its own ([`SETTINGS`]) and its pinned-host
    /// queue's ([`emm_default::SETTINGS`]), for its factory to declare.
    pub fn settings() -> Vec<&'static dyn AnySetting> {
        SETTINGS
            .iter()
            .chain(emm_default::SETTINGS)
            .copied()
            .collect()
    }

    /// A manager for `ctx`, configured from the environment.
    pub fn new(ctx: &Context) -> Result<Self> {
        Self::with_config(ctx, HostOnlyConfig::from_env()?)
    }

    /// A manager for `ctx` with `config`.
    pub fn with_config(ctx: &Context, config: HostOnlyConfig) -> Result<Self> {
        if !ctx.device().supports_memory_pools()? {
            return Err(EmmError::Unsupported {
                manager: "hostonly".into(),
                operation: "CUDA's stream-ordered allocator (this driver or device lacks cuMemAllocAsync and memory pools)",
            });
        }
        // Exportable for IPC when the device allows it; plain otherwise (and IPC then
        // says why it is unsupported).
        let (pool, export_error) = match MemPool::create(ctx, true) {
            Ok(p) => (p, None),
            Err(e) => {
                tracing::warn!(error = %e, "an exportable memory pool could not be created; IPC is unavailable");
                (MemPool::create(ctx, false)?, Some(e.to_string()))
            }
        };
        pool.set_attribute(Attr::RELEASE_THRESHOLD, config.release_threshold)?;
        let defer = DeferState::new();
        Ok(HostOnlyManager {
            inner: Arc::new(Inner {
                ctx: ctx.clone(),
                pool,
                live: Mutex::new(HashMap::new()),
                failed: Mutex::new(Vec::new()),
                generation: Mutex::new(0),
                allocations: AtomicU64::new(0),
                frees: AtomicU64::new(0),
            }),
            host: HostOnly::new(ctx, PendingConfig::from_env()?, defer.clone())?,
            managed: Managed::new(ctx, "hostonly", defer.clone()),
            defer,
            exported_fd: OnceLock::new(),
            export_error,
        })
    }

    /// The pool's reserved and used bytes.
    pub fn usage(&self) -> Result<PoolUsage> {
        let p = &self.inner.pool;
        Ok(PoolUsage {
            reserved: p.attribute(Attr::RESERVED_MEM_CURRENT)?,
            reserved_high: p.attribute(Attr::RESERVED_MEM_HIGH)?,
            used: p.attribute(Attr::USED_MEM_CURRENT)?,
            used_high: p.attribute(Attr::USED_MEM_HIGH)?,
        })
    }

    /// Gives reserved memory above `keep` bytes back to the device (after the
    /// context's queued frees have run); returns the bytes released.
    ///
    /// First frees again the blocks whose free failed in a drop (the context is
    /// synchronized, so nothing uses them): once the fault clears they are back
    /// in the pool. While it lasts, their error is returned
    /// ([`EmmError::FreeFailed`]) and they are kept for the next call.
    pub fn trim(&self, keep: usize) -> Result<u64> {
        self.inner.ctx.synchronize_for_manager()?;
        if self.inner.retry_failed()? > 0 {
            self.inner.ctx.synchronize_for_manager()?; // the frees just queued, done
        }
        let before = self.inner.pool.attribute(Attr::RESERVED_MEM_CURRENT)?;
        self.inner.pool.trim_to(keep)?;
        let after = self.inner.pool.attribute(Attr::RESERVED_MEM_CURRENT)?;
        Ok(before.saturating_sub(after))
    }

    fn allocate(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        if size == 0 {
            // SAFETY: owns nothing.
            return Ok(unsafe { DeviceAllocation::from_raw_parts(0, 0, stream, |_, _, _| {}) });
        }
        // SAFETY: callers pass a stream of this context or a default stream.
        let s = unsafe { Stream::from_raw(&self.inner.ctx, stream) };
        let ptr = match self.inner.pool.alloc_async(size, &s) {
            Ok(p) => p,
            Err(e) if e.is_out_of_memory() => {
                // The out-of-memory ladder: let queued frees finish, trim, retry.
                self.trim(0)?;
                self.inner.pool.alloc_async(size, &s).map_err(|e| {
                    if e.is_out_of_memory() {
                        let (free, total) = self.inner.ctx.mem_info().unwrap_or((0, 0));
                        EmmError::OutOfMemory {
                            what: "device",
                            manager: "hostonly".into(),
                            requested: size,
                            free,
                            total,
                            detail: String::new(),
                        }
                    } else {
                        e.into()
                    }
                })?
            }
            Err(e) => return Err(e.into()),
        };
        self.inner.allocations.fetch_add(1, Ordering::Relaxed);
        let token = *self
            .inner
            .generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr, size);
        let owner: Arc<dyn DeviceRelease> = self.inner.clone();
        // SAFETY: a fresh pool block of `size` bytes, released once through `owner`.
        Ok(unsafe { DeviceAllocation::with_releaser(ptr, size, stream, ptr, size, owner, token) })
    }

    /// The pool's exported descriptor, exported at the first call that
    /// succeeds: a failed export is the call's error (the driver's), and the next
    /// call tries again, where a kept failure turned IPC off for the manager's
    /// life over a fault that may clear.
    fn pool_fd(&self) -> Result<i32> {
        use std::os::fd::AsRawFd;
        if let Some(fd) = self.exported_fd.get() {
            return Ok(fd.as_raw_fd());
        }
        let fd = self.inner.pool.export_fd()?;
        // Another thread's export kept first: this one is closed, theirs used.
        Ok(self.exported_fd.get_or_init(|| fd).as_raw_fd())
    }
}

impl MemoryManager for HostOnlyManager {
    fn name(&self) -> &str {
        "hostonly"
    }

    fn initialize(&self) -> Result<()> {
        Ok(())
    }

    fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
        let a = self.allocate(size, SYNC_STREAM)?;
        // Safe on any stream once the allocation itself has run.
        Stream::legacy(&self.inner.ctx).synchronize()?;
        Ok(a)
    }

    fn memalloc_async(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        self.allocate(size, stream)
    }

    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        self.host.memhostalloc(size, flags)
    }

    fn memallocmanaged(&self, size: usize, attach: ManagedAttach) -> Result<ManagedMemory> {
        self.managed
            .memallocmanaged(size, attach, &|| self.release_cached().unwrap_or(0))
    }

    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        // SAFETY: forwarded to the caller.
        unsafe { self.host.mempin(ptr, len, mapped) }
    }

    fn get_memory_info(&self) -> Result<MemoryInfo> {
        let (free, total) = self.inner.ctx.mem_info()?;
        Ok(MemoryInfo { free, total })
    }

    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle> {
        if let Some(e) = &self.export_error {
            return Err(EmmError::Unsupported {
                manager: format!("hostonly (its pool is not exportable: {e})"),
                operation: "get_ipc_handle",
            });
        }
        let parent = view.parent();
        let pool_fd = self.pool_fd()?;
        Ok(IpcHandle::MemPool {
            export: self.inner.pool.export_pointer(parent.ptr())?,
            pool_fd,
            pid: std::process::id(),
            base_size: parent.size(),
            offset: (view.ptr() - parent.ptr()) as usize,
            size: view.len(),
            device_uuid: self.inner.ctx.device().uuid()?,
        })
    }

    fn reset(&self) -> Result<()> {
        *self
            .inner
            .generation
            .lock()
            .unwrap_or_else(|p| p.into_inner()) += 1;
        let live: Vec<(u64, usize)> = self
            .inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        // After the generation bump the owners' drops do nothing: the drained
        // blocks are the manager's alone. Any it cannot free yet join the failed
        // ones, for the next trim.
        let mut blocks = live;
        blocks.append(&mut self.inner.failed());
        if let Err(e) = self.inner.ctx.synchronize_for_manager() {
            self.inner.failed().extend(blocks);
            return Err(e.into());
        }
        let legacy = Stream::legacy(&self.inner.ctx);
        let mut first = None;
        for (ptr, size) in blocks {
            // SAFETY: every block came from this pool and is the manager's alone
            // (see above); the context is synchronized, so no work uses it. It is
            // freed once: here, or, where this fails, by a later retry.
            match unsafe { free_async(ptr, &legacy) } {
                Ok(()) => {
                    self.inner.frees.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.inner.failed().push((ptr, size));
                    first.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first {
            return Err(e.into());
        }
        self.trim(0)?;
        self.host.flush();
        self.managed.reset();
        Ok(())
    }

    fn defer_cleanup(&self) -> DeferGuard {
        let host = self.host.clone();
        let managed = self.managed.clone();
        self.defer.guard(move || {
            host.flush_if_needed();
            managed.flush();
        })
    }

    fn release_cached(&self) -> Result<usize> {
        self.inner.ctx.retry_destroys_in_trim();
        Ok(self.trim(0)? as usize + self.host.flush() + self.managed.release_cached())
    }

    fn context(&self) -> Option<&Context> {
        Some(&self.inner.ctx)
    }

    fn stats(&self) -> emm_core::ManagerStats {
        let u = self.usage().unwrap_or_default();
        emm_core::ManagerStats {
            allocated_bytes: u.used as usize,
            allocated_bytes_peak: u.used_high as usize,
            reserved_bytes: u.reserved as usize,
            reserved_bytes_peak: u.reserved_high as usize,
            allocations: self.inner.allocations.load(Ordering::Relaxed),
            // Every allocation is a call to the driver's stream-ordered pool.
            upstream_allocs: self.inner.allocations.load(Ordering::Relaxed),
            upstream_frees: self.inner.frees.load(Ordering::Relaxed),
        }
    }

    fn managed_stats(&self) -> ManagedStats {
        self.managed.stats()
    }

    fn reset_peak_stats(&self) {
        // The driver resets a pool's high-water marks to their current values when
        // they are set to 0.
        for attr in [Attr::USED_MEM_HIGH, Attr::RESERVED_MEM_HIGH] {
            if let Err(e) = self.inner.pool.set_attribute(attr, 0) {
                tracing::warn!(error = %e, "resetting a high-water mark of the pool failed");
            }
        }
        self.managed.reset_peak();
    }
}

// The README's examples are compiled as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

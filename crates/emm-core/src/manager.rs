//! The [`MemoryManager`] trait: NBEP 7's plugin interface, with its contract.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use emm_driver::Context;
use emm_sys::CUstream;

use crate::error::{EmmError, Result};
use crate::ipc::IpcHandle;
use crate::managed::{ManagedAttach, ManagedMemory, ManagedStats};
use crate::pointer::{DeviceAllocation, DeviceView, HostAllocFlags, HostMemory};
use crate::snapshot::{MemorySnapshot, StatList};
use crate::stat_names as stat;
use crate::tags::{Keep, PauseReport, Tag, TagStats};

/// The interface version managers of this crate implement (NBEP 7's version 1).
pub const INTERFACE_VERSION: u32 = 1;

/// The interface versions the core accepts from a manager.
pub const SUPPORTED_INTERFACE_VERSIONS: core::ops::RangeInclusive<u32> = 1..=1;

/// Free and total device memory, as NBEP 7's `MemoryInfo`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Free bytes.
    pub free: usize,
    /// Total bytes.
    pub total: usize,
}

/// What a manager can say about its device memory (the names follow PyTorch's
/// `memory_stats` where they fit). Counters a manager does not keep are 0.
///
/// Managed memory ([`MemoryManager::memallocmanaged`]) is not in these counters:
/// it is counted apart, in [`MemoryManager::managed_stats`] (see
/// [`crate::managed`] for why).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagerStats {
    /// Bytes in allocations held by callers.
    pub allocated_bytes: usize,
    /// Peak of `allocated_bytes`.
    pub allocated_bytes_peak: usize,
    /// Bytes the manager holds from the device (allocated plus cached).
    pub reserved_bytes: usize,
    /// Peak of `reserved_bytes`.
    pub reserved_bytes_peak: usize,
    /// Allocations served.
    pub allocations: u64,
    /// Allocations the manager made from its upstream (the driver).
    pub upstream_allocs: u64,
    /// Frees the manager made to its upstream (the driver): with
    /// `upstream_allocs`, how often it called the driver for memory.
    pub upstream_frees: u64,
}

/// A memory manager: where a context's device and pinned host memory comes from.
///
/// # Contract
///
/// Who calls what, and when (the core's side of the contract):
///
/// - One instance serves one context. The router ([`crate::Router`]) creates it on
///   the first allocation in that context and calls [`initialize`](Self::initialize)
///   before anything else; `initialize` may be called again later (it must then do
///   nothing harmful).
/// - Every method may be called from any thread, concurrently: managers are
///   `Send + Sync` and do their own locking. Allocation methods are called once per
///   user request; nothing is batched.
/// - The memory returned belongs to the caller until the returned value drops; the
///   value then gives it back exactly once (through [`crate::DeviceRelease`] or a
///   callback), on the thread that drops it. Managers never free memory a caller
///   still holds, except through [`reset`](Self::reset), after which they must not
///   touch freed memory again.
/// - [`release_cached`](Self::release_cached) is the out-of-memory hook: before an
///   allocation in *any* manager of the device fails for lack of memory, the core
///   asks every manager of that device to give back what it caches, then retries
///   once.
///
/// What a manager must guarantee (its side):
///
/// - [`memalloc`](Self::memalloc) (NBEP 7's synchronous `memalloc`) returns memory
///   usable from any stream as soon as it returns, ordered on the legacy default
///   stream. [`memalloc_async`](Self::memalloc_async) returns memory usable on
///   `stream` in stream order; the allocation remembers the stream and is released
///   on it.
/// - Sizes: zero-byte requests are valid and return a zero-length allocation that
///   owns nothing, unless the manager documents otherwise; a size it cannot serve is
///   [`EmmError::InvalidSize`] or [`EmmError::OutOfMemory`], never a panic.
/// - Alignment: device allocations are aligned to at least 256 bytes, like
///   `cuMemAlloc`.
/// - Errors are [`EmmError`]s whose message says what was asked and what was found.
/// - `get_memory_info`, `get_ipc_handle` and `memallocmanaged` may be unsupported:
///   they return [`EmmError::Unsupported`], which is the one documented
///   "unsupported" error.
/// - [`memallocmanaged`](Self::memallocmanaged) (Numba's `memallocmanaged`, not in
///   NBEP 7's list) returns one address valid on the host and on every device,
///   aligned like device memory. Managed memory is never pooled with device
///   memory, is freed with `cuMemFree` (held back while a `defer_cleanup` guard
///   lives), and is counted in [`managed_stats`](Self::managed_stats), not in
///   [`stats`](Self::stats).
/// - [`defer_cleanup`](Self::defer_cleanup) returns a guard; while any guard of the
///   manager lives, the manager must not run deallocations that synchronize the
///   device (what exactly it defers is in each manager's docs). Guards nest.
pub trait MemoryManager: Send + Sync {
    /// The name the manager is registered under (`default`, `pool`, …).
    fn name(&self) -> &str;

    /// The NBEP 7 interface version the manager implements.
    fn interface_version(&self) -> u32 {
        INTERFACE_VERSION
    }

    /// Prepares the manager; called before its first allocation, and harmless when
    /// called again.
    fn initialize(&self) -> Result<()>;

    /// `size` bytes of device memory usable from any stream on return (NBEP 7
    /// `memalloc`).
    fn memalloc(&self, size: usize) -> Result<DeviceAllocation>;

    /// `size` bytes of device memory ordered on `stream`, released on it. The
    /// default forwards to [`memalloc`](Self::memalloc), which is correct (memory
    /// usable on every stream) but not stream-ordered.
    ///
    /// The caller keeps `stream` alive until the allocation is released (or moves
    /// the allocation to a live stream with `DeviceAllocation::set_stream` first):
    /// managers may record an event on it at the release, as CUDA's own
    /// stream-ordered allocator orders the free on it.
    fn memalloc_async(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        let mut a = self.memalloc(size)?;
        a.set_stream(stream);
        Ok(a)
    }

    /// `size` bytes of pinned host memory (NBEP 7 `memhostalloc(size, mapped,
    /// portable, wc)`): [`HostMemory::Mapped`] when `flags.mapped`.
    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory>;

    /// `size` bytes of managed memory attached as `attach` (Numba's
    /// `memallocmanaged(size, attach_global)`, which `cuda.managed_array` calls;
    /// NBEP 7 does not list it). Zero bytes give an empty allocation that owns
    /// nothing. The default: [`EmmError::Unsupported`], so a plugin that does not
    /// serve managed memory says so in the one typed way.
    fn memallocmanaged(&self, _size: usize, _attach: ManagedAttach) -> Result<ManagedMemory> {
        Err(EmmError::Unsupported {
            manager: self.name().to_owned(),
            operation: "memallocmanaged",
        })
    }

    /// Page-locks the caller's host range (NBEP 7 `mempin`); mapped when `mapped`.
    /// Dropping the result unpins it.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be a live host allocation that outlives the result.
    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory>;

    /// Free and total memory of the device (NBEP 7 `get_memory_info`), or
    /// [`EmmError::Unsupported`].
    fn get_memory_info(&self) -> Result<MemoryInfo>;

    /// An IPC handle for `view` (NBEP 7 `get_ipc_handle`), or
    /// [`EmmError::Unsupported`].
    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle>;

    /// Frees everything the manager holds (NBEP 7 `reset`). Allocations still held
    /// by callers are invalidated: their drop does nothing harmful.
    fn reset(&self) -> Result<()>;

    /// A guard that holds back deallocations that would synchronize (NBEP 7
    /// `defer_cleanup`).
    fn defer_cleanup(&self) -> DeferGuard;

    /// Gives back cached memory to the device (the out-of-memory hook); returns the
    /// bytes released. Default: nothing cached.
    fn release_cached(&self) -> Result<usize> {
        Ok(0)
    }

    /// The context the manager serves, when it serves a real one.
    fn context(&self) -> Option<&Context> {
        None
    }

    /// Statistics of device memory; the default knows nothing.
    fn stats(&self) -> ManagerStats {
        ManagerStats::default()
    }

    /// Statistics of managed memory (kept apart from [`stats`](Self::stats)); the
    /// default knows nothing.
    fn managed_stats(&self) -> ManagedStats {
        ManagedStats::default()
    }

    /// Every counter the manager keeps, as one line a person reads (for profiling:
    /// which paths served the requests, how often the driver was called). The
    /// default is [`stats`](Self::stats).
    fn report(&self) -> String {
        format!("{:?}", self.stats())
    }

    /// Every counter the manager keeps, named as in PyTorch's `memory_stats` where
    /// they mean the same (`allocated_bytes.all.current`, `reserved_bytes.all.peak`,
    /// ...; emm's own under `emm.`, managed memory's under `emm.managed_`). The
    /// default names what [`stats`](Self::stats) and
    /// [`managed_stats`](Self::managed_stats) know.
    fn memory_stats(&self) -> StatList {
        let s = self.stats();
        let mut list = vec![
            (stat::ALLOCATED_BYTES_CURRENT, s.allocated_bytes as u64),
            (stat::ALLOCATED_BYTES_PEAK, s.allocated_bytes_peak as u64),
            (stat::RESERVED_BYTES_CURRENT, s.reserved_bytes as u64),
            (stat::RESERVED_BYTES_PEAK, s.reserved_bytes_peak as u64),
            (stat::ALLOCATION_ALLOCATED, s.allocations),
            (stat::NUM_DEVICE_ALLOC, s.upstream_allocs),
            (stat::NUM_DEVICE_FREE, s.upstream_frees),
        ];
        list.extend(self.managed_stats().to_list());
        list
    }

    /// Sets every peak counter to its current value (PyTorch's
    /// `reset_peak_memory_stats`). The default keeps no peaks of its own.
    fn reset_peak_stats(&self) {}

    /// Records the allocation history in a ring of the latest `max_entries` entries
    /// (0: stop recording and drop the history), for [`snapshot`](Self::snapshot).
    /// The default: [`EmmError::Unsupported`].
    fn record_history(&self, max_entries: usize) -> Result<()> {
        let _ = max_entries;
        Err(EmmError::Unsupported {
            manager: self.name().to_owned(),
            operation: "record_history",
        })
    }

    /// The manager's segments, blocks, recorded history and counters, or `None`
    /// where it keeps no segments of its own (the default).
    fn snapshot(&self) -> Option<MemorySnapshot> {
        None
    }

    /// Gives back the device memory of the blocks allocated under `tag` while
    /// keeping their addresses (see [`Router::pause`](crate::Router::pause), which
    /// calls this on every manager after marking the tag paused); with
    /// [`Keep::Host`] their contents are copied to host memory first. The default:
    /// [`EmmError::Unsupported`].
    fn pause_tag(&self, _tag: Tag, _keep: Keep) -> Result<PauseReport> {
        Err(EmmError::Unsupported {
            manager: self.name().into(),
            operation: "pause",
        })
    }

    /// Whether [`pause_tag`](Self::pause_tag) would be refused now (memory that
    /// cannot be paused, a tag already paused here), without changing anything:
    /// the router asks every manager before any pauses. The default:
    /// [`EmmError::Unsupported`].
    fn check_pause_tag(&self, _tag: Tag) -> Result<()> {
        Err(EmmError::Unsupported {
            manager: self.name().into(),
            operation: "pause",
        })
    }

    /// Maps fresh memory under the blocks [`pause_tag`](Self::pause_tag) unmapped,
    /// at the same addresses, and copies back what it kept. The default:
    /// [`EmmError::Unsupported`].
    fn resume_tag(&self, _tag: Tag) -> Result<PauseReport> {
        Err(EmmError::Unsupported {
            manager: self.name().into(),
            operation: "resume",
        })
    }

    /// The manager's memory per tag that allocated from it (the default: none,
    /// a manager that keeps no tags).
    fn tag_stats(&self) -> Vec<TagStats> {
        Vec::new()
    }

    /// Run-time setting `name` (one declared [`Key::at_run_time`]) changed while
    /// this manager serves; the manager reads the new value through the
    /// setting's [`Setting::value`]. The default does nothing: a manager acts only
    /// on the settings it declares.
    ///
    /// [`Key::at_run_time`]: crate::setting::Key::at_run_time
    /// [`Setting::value`]: crate::setting::Setting::value
    fn setting_changed(&self, _name: &str) -> Result<()> {
        Ok(())
    }
}

/// Checks a manager's interface version against [`SUPPORTED_INTERFACE_VERSIONS`].
pub fn check_interface_version(manager: &dyn MemoryManager) -> Result<()> {
    let found = manager.interface_version();
    if SUPPORTED_INTERFACE_VERSIONS.contains(&found) {
        Ok(())
    } else {
        Err(EmmError::InterfaceVersion {
            manager: manager.name().to_owned(),
            found,
            supported: format!(
                "{}..={}",
                SUPPORTED_INTERFACE_VERSIONS.start(),
                SUPPORTED_INTERFACE_VERSIONS.end()
            ),
        })
    }
}

/// A nesting counter for [`DeferGuard`]s; managers embed one.
#[derive(Debug, Default)]
pub struct DeferState {
    depth: AtomicUsize,
}

impl DeferState {
    /// A counter at depth zero.
    pub fn new() -> Arc<DeferState> {
        Arc::new(DeferState::default())
    }

    /// `true` while any guard lives.
    pub fn is_deferred(&self) -> bool {
        self.depth.load(Ordering::Acquire) > 0
    }

    /// The number of live guards.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Acquire)
    }

    /// A new guard; `on_last_release` runs when the outermost guard drops (a
    /// manager flushes what it held back there).
    pub fn guard(self: &Arc<Self>, on_last_release: impl FnOnce() + Send + 'static) -> DeferGuard {
        self.depth.fetch_add(1, Ordering::AcqRel);
        DeferGuard {
            state: Some(self.clone()),
            on_last_release: Some(Box::new(on_last_release)),
        }
    }
}

/// Holds back a manager's synchronizing deallocations while it lives. Guards nest;
/// dropping the last one (also during a panic's unwinding) lets the manager flush.
#[must_use = "deallocations are deferred only while the guard lives"]
pub struct DeferGuard {
    state: Option<Arc<DeferState>>,
    on_last_release: Option<Box<dyn FnOnce() + Send>>,
}

impl core::fmt::Debug for DeferGuard {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeferGuard")
            .field("depth", &self.state.as_ref().map(|s| s.depth()))
            .finish()
    }
}

impl DeferGuard {
    /// A guard for a manager that defers nothing.
    pub fn noop() -> DeferGuard {
        DeferGuard {
            state: None,
            on_last_release: None,
        }
    }
}

impl Drop for DeferGuard {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            if state.depth.fetch_sub(1, Ordering::AcqRel) == 1 {
                if let Some(f) = self.on_last_release.take() {
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                        tracing::error!("a deferred-cleanup flush panicked");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn guards_nest_and_flush_once_at_the_outermost() {
        let s = DeferState::new();
        let flushed = Arc::new(AtomicUsize::new(0));
        let f1 = flushed.clone();
        let f2 = flushed.clone();
        let outer = s.guard(move || {
            f1.fetch_add(1, Ordering::SeqCst);
        });
        let inner = s.guard(move || {
            f2.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(s.depth(), 2);
        drop(outer); // order of drops does not matter: the last one flushes
        assert!(s.is_deferred());
        assert_eq!(flushed.load(Ordering::SeqCst), 0);
        drop(inner);
        assert!(!s.is_deferred());
        assert_eq!(flushed.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_panic_unwinding_through_a_guard_releases_it() {
        let s = DeferState::new();
        let flushed = Arc::new(AtomicBool::new(false));
        let f = flushed.clone();
        let s2 = s.clone();
        let r = std::panic::catch_unwind(move || {
            let _g = s2.guard(move || f.store(true, Ordering::SeqCst));
            panic!("user code failed while deferred");
        });
        assert!(r.is_err());
        assert!(!s.is_deferred());
        assert!(flushed.load(Ordering::SeqCst));
    }
}

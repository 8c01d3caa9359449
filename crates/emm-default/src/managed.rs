//! [`Managed`]: managed (unified) memory straight from `cuMemAllocManaged`, which
//! every built-in manager composes for Numba's `memallocmanaged`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use emm_core::{DeferState, EmmError, ManagedAttach, ManagedMemory, ManagedStats, Result};
use emm_driver::{memory, Context, DriverError};
use emm_sys::{CUdeviceptr, CUresult};

/// Requests above this are refused as [`EmmError::InvalidSize`] before the driver
/// sees them (no device or host comes near it).
const MAX_SIZE: usize = isize::MAX as usize / 2;

#[derive(Debug, Default)]
struct State {
    live: HashMap<CUdeviceptr, usize>,
    bytes: usize,
    peak: usize,
    allocations: u64,
    /// Frees held back by a `defer_cleanup` guard.
    deferred: Vec<(CUdeviceptr, usize)>,
    deferred_bytes: usize,
    generation: u64,
}

#[derive(Debug)]
struct Shared {
    ctx: Context,
    manager: &'static str,
    defer: Arc<DeferState>,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Frees `blocks`; a failure is recorded on the context (which logs it and
    /// returns it from its next fallible call) and the block goes back to the
    /// queued frees, for the next flush to try again (it is still allocated: a
    /// refused free changes nothing). Returns the bytes freed.
    fn free_all(&self, blocks: Vec<(CUdeviceptr, usize)>) -> usize {
        let mut bytes = 0;
        let mut failed = Vec::new();
        for (ptr, size) in blocks {
            // SAFETY: each block came from cuMemAllocManaged in this context, left
            // the live set exactly once (release or reset) and is freed once here
            // (or, refused, queued again: it was not freed).
            match unsafe { memory::free(&self.ctx, ptr) } {
                Ok(()) => bytes += size,
                Err(e) => {
                    self.ctx.record_drop_error(e);
                    failed.push((ptr, size));
                }
            }
        }
        if !failed.is_empty() {
            let mut s = self.lock();
            s.deferred_bytes += failed.iter().map(|&(_, size)| size).sum::<usize>();
            s.deferred.extend(failed);
        }
        bytes
    }

    fn take_deferred(s: &mut State) -> Vec<(CUdeviceptr, usize)> {
        s.deferred_bytes = 0;
        std::mem::take(&mut s.deferred)
    }

    fn flush(&self) -> usize {
        let blocks = Self::take_deferred(&mut self.lock());
        self.free_all(blocks)
    }

    /// A caller dropped `(ptr, size)` of generation `generation`.
    fn release(&self, ptr: CUdeviceptr, size: usize, generation: u64) {
        let now = {
            let mut s = self.lock();
            if s.generation != generation || s.live.remove(&ptr).is_none() {
                return; // freed by reset already
            }
            s.bytes -= size;
            if self.defer.is_deferred() {
                s.deferred.push((ptr, size));
                s.deferred_bytes += size;
                None
            } else {
                Some((ptr, size))
            }
        };
        match now {
            Some(block) => {
                self.free_all(vec![block]);
            }
            // The last guard may have gone between the check and the push: its
            // flush did not see this block, so free it now.
            None if !self.defer.is_deferred() => {
                self.flush();
            }
            None => {}
        }
    }
}

/// The last owner gone (the manager and every allocation it handed out): frees
/// still queued run, so dropping a manager leaks nothing.
impl Drop for Shared {
    fn drop(&mut self) {
        let blocks = Self::take_deferred(self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.free_all(blocks);
        // What the driver refused again went back to the queue: nobody is left
        // to flush it, so the context frees it later.
        let refused = Self::take_deferred(self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (ptr, size) in refused {
            // SAFETY: from cuMemAllocManaged in this context, its free just
            // failed, and with the last owner gone nobody uses it again.
            unsafe {
                self.ctx
                    .free_later(emm_driver::Orphan::Device { ptr, size })
            };
        }
    }
}

/// Managed memory for one context. Cloning shares the allocations and counters.
///
/// Numba puts `memallocmanaged` in `HostOnlyCUDAMemoryManager`, the half that a
/// device-only plugin inherits; here it is a value a manager owns, as
/// [`HostOnly`](crate::HostOnly) is.
///
/// - **Not pooled.** Each request is one `cuMemAllocManaged`, each free one
///   `cuMemFree`: managed blocks never enter a device pool's segments or caches.
///   They are rare and large (arrays the host reads too); a cached managed block
///   would keep both host and device pages from the rest of the system and carry
///   its last user's residency and advice (`cuMemAdvise`, prefetches) to the next;
///   and the driver already commits pages lazily, on first touch, so there is
///   little for a cache to save.
/// - **Frees** run at once, except while a `defer_cleanup` guard lives (`cuMemFree`
///   synchronizes the device): then they wait in a queue freed when the last guard
///   goes ([`Managed::flush`]), or by the out-of-memory ladder once no guard lives.
/// - **Counted apart** from device memory ([`ManagedStats`]), in bytes as requested.
/// - **Reset** frees every live managed allocation; their later drop does nothing.
/// - **Out of memory**: the owning manager's cache is given back (the `on_oom`
///   callback), queued frees run, and the request is tried once more; then
///   [`EmmError::OutOfMemory`] (`what: "managed"`). A driver or device without
///   managed memory is [`EmmError::Unsupported`].
#[derive(Debug, Clone)]
pub struct Managed {
    shared: Arc<Shared>,
}

impl Managed {
    /// Managed memory for `ctx`, on behalf of the manager named `manager` (for
    /// messages); frees wait while any guard of `defer` lives.
    pub fn new(ctx: &Context, manager: &'static str, defer: Arc<DeferState>) -> Managed {
        Managed {
            shared: Arc::new(Shared {
                ctx: ctx.clone(),
                manager,
                defer,
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn unsupported(&self, operation: &'static str) -> EmmError {
        EmmError::Unsupported {
            manager: self.shared.manager.to_owned(),
            operation,
        }
    }

    /// A driver error of `cuMemAllocManaged` as the manager's error: a missing
    /// entry point or `CUDA_ERROR_NOT_SUPPORTED` is [`EmmError::Unsupported`].
    fn driver_error(&self, e: DriverError) -> EmmError {
        match e {
            DriverError::Unsupported { .. } => {
                self.unsupported("memallocmanaged (the loaded CUDA driver lacks cuMemAllocManaged)")
            }
            e if e.code() == Some(CUresult::ERROR_NOT_SUPPORTED) => {
                self.unsupported("memallocmanaged (the device does not support managed memory)")
            }
            e => e.into(),
        }
    }

    /// `size` bytes of managed memory attached as `attach`. On out of memory,
    /// `on_oom` gives the owning manager's cache back (it returns the bytes
    /// released), queued frees run, and the request is tried once more.
    pub fn memallocmanaged(
        &self,
        size: usize,
        attach: ManagedAttach,
        on_oom: &dyn Fn() -> usize,
    ) -> Result<ManagedMemory> {
        if size == 0 {
            return Ok(ManagedMemory::empty(attach));
        }
        if size > MAX_SIZE {
            return Err(EmmError::InvalidSize {
                requested: size,
                reason: "larger than any device or host can hold as managed memory",
            });
        }
        let sh = &self.shared;
        let flags = attach.driver_flags();
        let ptr = match memory::alloc_managed(&sh.ctx, size, flags) {
            Ok(p) => p,
            Err(e) if e.is_out_of_memory() => {
                let released = on_oom()
                    + if sh.defer.is_deferred() {
                        0
                    } else {
                        sh.flush()
                    };
                tracing::info!(
                    size,
                    released,
                    "out of memory for managed memory: gave cached memory back; retrying once"
                );
                memory::alloc_managed(&sh.ctx, size, flags).map_err(|e| {
                    if e.is_out_of_memory() {
                        let (free, total) = sh.ctx.mem_info().unwrap_or((0, 0));
                        let (live, bytes, pending) = {
                            let s = sh.lock();
                            (s.live.len(), s.bytes, s.deferred_bytes)
                        };
                        EmmError::OutOfMemory {
                            what: "managed",
                            manager: sh.manager.to_owned(),
                            requested: size,
                            free,
                            total,
                            detail: format!(
                                "{live} managed allocations of {} live, {} of frees held back by defer_cleanup",
                                emm_core::fmt_bytes(bytes),
                                emm_core::fmt_bytes(pending)
                            ),
                        }
                    } else {
                        self.driver_error(e)
                    }
                })?
            }
            Err(e) => return Err(self.driver_error(e)),
        };
        let generation = {
            let mut s = sh.lock();
            s.live.insert(ptr, size);
            s.bytes += size;
            s.peak = s.peak.max(s.bytes);
            s.allocations += 1;
            s.generation
        };
        let owner = self.shared.clone();
        // SAFETY: `ptr` is a fresh managed allocation of `size` bytes, freed only
        // through `owner` (once: release checks the live set and the generation).
        Ok(unsafe {
            ManagedMemory::from_raw_parts(ptr, size, attach, move |p, s| {
                owner.release(p, s, generation)
            })
        })
    }

    /// The counters.
    pub fn stats(&self) -> ManagedStats {
        let s = self.shared.lock();
        ManagedStats {
            allocated_bytes: s.bytes,
            allocated_bytes_peak: s.peak,
            live: s.live.len(),
            allocations: s.allocations,
            pending_bytes: s.deferred_bytes,
        }
    }

    /// Sets the peak to the bytes held now.
    pub fn reset_peak(&self) {
        let mut s = self.shared.lock();
        s.peak = s.bytes;
    }

    /// Frees every queued free now (ignores guards); returns the bytes freed.
    pub fn flush(&self) -> usize {
        self.shared.flush()
    }

    /// The out-of-memory hook's part: queued frees run unless a guard lives;
    /// returns the bytes freed.
    pub fn release_cached(&self) -> usize {
        if self.shared.defer.is_deferred() {
            0
        } else {
            self.flush()
        }
    }

    /// Frees every live managed allocation and every queued free (NBEP 7
    /// `reset`); the allocations still held by callers do nothing when dropped.
    /// The caller synchronizes the device first.
    pub fn reset(&self) {
        let blocks = {
            let mut s = self.shared.lock();
            s.generation = s.generation.wrapping_add(1);
            let mut blocks = Shared::take_deferred(&mut s);
            blocks.extend(s.live.drain());
            s.bytes = 0;
            blocks
        };
        self.shared.free_all(blocks);
    }
}

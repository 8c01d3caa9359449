//! [`HostOnly`]: the host-memory half of a manager (pinned, mapped, `mempin`),
//! which plugins that manage only device memory compose.
//!
//! NBEP 7's `HostOnlyCUDAMemoryManager` is a base class; here it is a value a plugin
//! owns and forwards `memhostalloc` and `mempin` to.
//!
//! - `memhostalloc` memory is freed through a pending queue of its own that
//!   **tracks sizes**, so the byte threshold works for pinned memory too (Numba
//!   queues pinned frees with size 0, numba#9507, so its byte limit never fires).
//! - `mempin` ranges are unpinned at once when dropped, not queued: a program that
//!   pins the same buffer again right after (Numba's `cuda.pinned` then
//!   `cuda.mapped` on one array) would otherwise fail with "already registered".

use std::sync::{Arc, Mutex};

use emm_core::{
    DeferState, EmmError, HostAllocFlags, HostMemory, MappedMemory, PinnedMemory, Result,
};
use emm_driver::{memory, Context};
use emm_sys::host_register;

use crate::config::PendingConfig;

#[derive(Debug, Default)]
struct Queue {
    items: Vec<(usize, usize)>,
    bytes: usize,
}

#[derive(Debug)]
struct Shared {
    ctx: Context,
    config: PendingConfig,
    capacity: usize,
    defer: Arc<DeferState>,
    queue: Mutex<Queue>,
}

/// The last owner frees what is still queued (a process-wide manager is never
/// dropped, but a manager a program makes and drops must not leak pinned memory).
impl Drop for Shared {
    fn drop(&mut self) {
        let drained = std::mem::take(
            &mut self
                .queue
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .items,
        );
        self.free_all(drained);
    }
}

impl Shared {
    fn over(&self, q: &Queue) -> bool {
        q.items.len() > self.config.max_count || q.bytes > self.config.max_bytes(self.capacity)
    }

    fn push(&self, ptr: *mut u8, size: usize) {
        let drained = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.items.push((ptr as usize, size));
            q.bytes += size;
            if !self.defer.is_deferred() && self.over(&q) {
                q.bytes = 0;
                std::mem::take(&mut q.items)
            } else {
                Vec::new()
            }
        };
        self.free_all(drained);
    }

    fn flush(&self) -> usize {
        let drained = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.bytes = 0;
            std::mem::take(&mut q.items)
        };
        self.free_all(drained)
    }

    fn free_all(&self, items: Vec<(usize, usize)>) -> usize {
        let mut bytes = 0;
        for (ptr, size) in items {
            // SAFETY: every queued pointer came from cuMemHostAlloc in this context
            // and was queued once, by its owner's drop.
            if let Err(e) = unsafe { memory::free_host(&self.ctx, ptr as *mut u8) } {
                self.ctx.record_drop_error(e);
            } else {
                bytes += size;
            }
        }
        bytes
    }
}

/// Pinned and mapped host memory for one context, with a size-tracking pending
/// queue. Cloning shares the queue.
#[derive(Debug, Clone)]
pub struct HostOnly {
    shared: Arc<Shared>,
}

impl HostOnly {
    /// Host memory for `ctx`, flushing by `config` against the device's total
    /// memory, deferred while any guard of `defer` lives.
    pub fn new(ctx: &Context, config: PendingConfig, defer: Arc<DeferState>) -> Result<HostOnly> {
        let capacity = ctx.device().total_memory()?;
        Ok(HostOnly {
            shared: Arc::new(Shared {
                ctx: ctx.clone(),
                config,
                capacity,
                defer,
                queue: Mutex::new(Queue::default()),
            }),
        })
    }

    /// `(count, bytes)` of pinned frees waiting in the queue.
    pub fn pending(&self) -> (usize, usize) {
        let q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        (q.items.len(), q.bytes)
    }

    /// Frees every queued block now; returns the bytes freed.
    pub fn flush(&self) -> usize {
        self.shared.flush()
    }

    /// Flushes if the queue is over its thresholds and no guard lives.
    pub fn flush_if_needed(&self) {
        let over = {
            let q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.over(&q)
        };
        if over && !self.shared.defer.is_deferred() {
            self.shared.flush();
        }
    }

    /// NBEP 7 `memhostalloc`: `size` bytes of page-locked memory.
    pub fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        if size == 0 {
            return Err(EmmError::InvalidSize {
                requested: 0,
                reason: "pinned allocations hold at least one byte",
            });
        }
        let ctx = &self.shared.ctx;
        let ptr = match memory::host_alloc(ctx, size, flags.driver_flags()) {
            Err(e) if e.is_out_of_memory() => {
                self.shared.flush();
                memory::host_alloc(ctx, size, flags.driver_flags()).map_err(|e| {
                    if e.is_out_of_memory() {
                        EmmError::OutOfMemory {
                            what: "pinned host",
                            manager: "HostOnly".into(),
                            requested: size,
                            free: 0,
                            total: 0,
                            detail: "the driver could not page-lock more host memory".into(),
                        }
                    } else {
                        e.into()
                    }
                })?
            }
            other => other?,
        };
        let shared = self.shared.clone();
        // SAFETY: the driver returned `size` page-locked bytes at `ptr`, freed only
        // by this callback (through the queue).
        let pinned =
            unsafe { PinnedMemory::from_raw_parts(ptr, size, move |p, s| shared.push(p, s)) };
        if flags.mapped {
            let dptr = memory::host_device_pointer(ctx, ptr)?;
            Ok(HostMemory::Mapped(MappedMemory::new(pinned, dptr)))
        } else {
            Ok(HostMemory::Pinned(pinned))
        }
    }

    /// NBEP 7 `mempin`: page-locks the caller's range (portable; mapped when
    /// `mapped`); unpinned at once when the result drops.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be a live host allocation that outlives the result.
    pub unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        if len == 0 {
            return Err(EmmError::InvalidSize {
                requested: 0,
                reason: "cannot pin an empty range",
            });
        }
        let ctx = self.shared.ctx.clone();
        let flags = host_register::PORTABLE | if mapped { host_register::DEVICEMAP } else { 0 };
        // SAFETY: forwarded to the caller.
        unsafe { memory::host_register(&ctx, ptr, len, flags) }?;
        let dptr = if mapped {
            match memory::host_device_pointer(&ctx, ptr) {
                Ok(d) => Some(d),
                Err(e) => {
                    // SAFETY: registered just above, unregistered once.
                    let _ = unsafe { memory::host_unregister(&ctx, ptr) };
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let unpin_ctx = ctx.clone();
        let unpin = move |p: *mut u8, _: usize| {
            // SAFETY: registered in mempin, unregistered once here.
            if let Err(e) = unsafe { memory::host_unregister(&unpin_ctx, p) } {
                unpin_ctx.record_drop_error(e);
            }
        };
        // SAFETY: the range stays pinned until `unpin` unregisters it.
        let pinned = unsafe { PinnedMemory::from_raw_parts(ptr, len, unpin) };
        Ok(match dptr {
            Some(d) => HostMemory::Mapped(MappedMemory::new(pinned, d)),
            None => HostMemory::Pinned(pinned),
        })
    }
}

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

use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// The manager it serves, for its errors.
    manager: &'static str,
    /// Bytes of `memhostalloc` memory not yet freed (handed out or queued).
    held: AtomicUsize,
    config: PendingConfig,
    capacity: usize,
    defer: Arc<DeferState>,
    queue: Mutex<Queue>,
    /// `mempin` ranges `(start, length)` whose unregistration the driver
    /// refused: still pinned, so the next flush (or `mempin`, or the drop) tries
    /// again.
    unpin_retry: Mutex<Vec<(usize, usize)>>,
}

/// The last owner frees what is still queued (a process-wide manager is never
/// dropped, but a manager a program makes and drops must not leak pinned memory).
impl Drop for Shared {
    fn drop(&mut self) {
        let drained = self.take_queued();
        self.free_all(drained);
        // What the driver refused again went back to the queue: nobody is left
        // to flush it, so the context frees it later.
        let refused = self.take_queued();
        for (addr, size) in refused {
            // SAFETY: from cuMemHostAlloc in this context, its free just failed,
            // and with the last owner gone nobody uses it again.
            unsafe { self.ctx.free_later(emm_driver::Orphan::Host { addr, size }) };
        }
        self.retry_unpins();
        let still = self
            .unpin_retry
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_else(|p| std::mem::take(p.into_inner()));
        for (addr, len) in still {
            // SAFETY: registered by mempin in this context, its unregistration
            // just refused again, and its owner gone: nobody unregisters it but
            // the context's retry.
            unsafe {
                self.ctx
                    .free_later(emm_driver::Orphan::Registration { addr, len })
            };
        }
    }
}

impl Shared {
    /// Takes every queued block out of the queue (in the drop: no lock taken).
    fn take_queued(&mut self) -> Vec<(usize, usize)> {
        let q = self.queue.get_mut().unwrap_or_else(|p| p.into_inner());
        q.bytes = 0;
        std::mem::take(&mut q.items)
    }

    /// Unregisters the range of `len` bytes at `ptr` (a `mempin` range whose
    /// owner is gone); a refusal is recorded on the context (reported by its next
    /// fallible call) and the range kept for [`Shared::retry_unpins`].
    fn unpin(&self, ptr: usize, len: usize) {
        // SAFETY: registered by mempin; its owner is gone, and the range is
        // unregistered at most once (a refusal unregisters nothing).
        if let Err(e) = unsafe { memory::host_unregister(&self.ctx, ptr as *mut u8) } {
            let gone = e.code() == Some(emm_sys::CUresult::ERROR_HOST_MEMORY_NOT_REGISTERED);
            self.ctx.record_drop_error(e);
            if !gone {
                let mut r = self.unpin_retry.lock().unwrap_or_else(|p| p.into_inner());
                r.push((ptr, len));
            }
        }
    }

    /// Tries again the unregistrations the driver refused.
    fn retry_unpins(&self) {
        let retry =
            std::mem::take(&mut *self.unpin_retry.lock().unwrap_or_else(|p| p.into_inner()));
        for (ptr, len) in retry {
            self.unpin(ptr, len);
        }
    }

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
        self.retry_unpins();
        let drained = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.bytes = 0;
            std::mem::take(&mut q.items)
        };
        self.free_all(drained)
    }

    /// Frees `items`; a refused free is recorded on the context (reported by its
    /// next fallible call) and the block queued again for the next flush (it is
    /// still allocated). Returns the bytes freed.
    fn free_all(&self, items: Vec<(usize, usize)>) -> usize {
        let mut bytes = 0;
        let mut failed = Vec::new();
        for (ptr, size) in items {
            // SAFETY: every queued pointer came from cuMemHostAlloc in this context
            // and was queued once, by its owner's drop (or again after a refused
            // free, which freed nothing).
            if let Err(e) = unsafe { memory::free_host(&self.ctx, ptr as *mut u8) } {
                self.ctx.record_drop_error(e);
                failed.push((ptr, size));
            } else {
                bytes += size;
            }
        }
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        if !failed.is_empty() {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.bytes += failed.iter().map(|&(_, size)| size).sum::<usize>();
            q.items.extend(failed);
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
    /// memory, deferred while any guard of `defer` lives. Its errors name the
    /// manager `hostonly` unless [`HostOnly::for_manager`] names another.
    pub fn new(ctx: &Context, config: PendingConfig, defer: Arc<DeferState>) -> Result<HostOnly> {
        let capacity = ctx.device().total_memory()?;
        Ok(HostOnly {
            shared: Arc::new(Shared {
                ctx: ctx.clone(),
                manager: "hostonly",
                held: AtomicUsize::new(0),
                config,
                capacity,
                defer,
                queue: Mutex::new(Queue::default()),
                unpin_retry: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The same, its errors naming `manager` (the manager that composes it);
    /// on a clone already shared, the name stays.
    pub fn for_manager(mut self, manager: &'static str) -> HostOnly {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.manager = manager;
        }
        self
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
                        self.out_of_memory(size)
                    } else {
                        e.into()
                    }
                })?
            }
            other => other?,
        };
        self.shared.held.fetch_add(size, Ordering::Relaxed);
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

    /// The error of a `memhostalloc` of `requested` bytes the driver refused
    /// after a flush: the host's available and total memory, and what this
    /// manager holds.
    fn out_of_memory(&self, requested: usize) -> EmmError {
        let held = self.shared.held.load(Ordering::Relaxed);
        let (queued, queued_bytes) = self.pending();
        let (free, total, host) = match host_memory() {
            Some((available, total)) => (available, total, String::new()),
            None => (0, 0, " (the host's memory could not be read)".to_string()),
        };
        EmmError::OutOfMemory {
            what: "pinned host",
            manager: self.shared.manager.into(),
            requested,
            free,
            total,
            detail: format!(
                "the driver could not page-lock more host memory{host}; this manager holds {held} bytes of pinned memory, {queued_bytes} of them in {queued} frees still queued"
            ),
        }
    }

    /// NBEP 7 `mempin`: page-locks the caller's range (portable; mapped when
    /// `mapped`); unpinned at once when the result drops. An unpinning the
    /// driver refuses is tried again later: by this manager's next flush or
    /// `mempin`, and once the manager is gone by its context
    /// ([`emm_driver::Orphan::Registration`]); the range stays registered with
    /// the driver until then. A range another manager's refused unpinning
    /// still holds registered is unpinned by the context's retry first.
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
        // A range whose unpinning was refused earlier may be this one again.
        self.shared.retry_unpins();
        let ctx = self.shared.ctx.clone();
        let flags = host_register::PORTABLE | if mapped { host_register::DEVICEMAP } else { 0 };
        // SAFETY: forwarded to the caller.
        match unsafe { memory::host_register(&ctx, ptr, len, flags) } {
            Err(e) if e.code() == Some(emm_sys::CUresult::ERROR_HOST_MEMORY_ALREADY_REGISTERED) => {
                // A manager that went may have handed this range to the context,
                // its unpinning refused: the context's retry first (quiet: a
                // refusal there stays for its next synchronize), then once more.
                ctx.retry_destroys_in_trim();
                // SAFETY: as above.
                unsafe { memory::host_register(&ctx, ptr, len, flags) }?;
            }
            other => other?,
        }
        let dptr = if mapped {
            match memory::host_device_pointer(&ctx, ptr) {
                Ok(d) => Some(d),
                Err(e) => {
                    // Registered just above: unregistered once, or (refused) kept
                    // for the next flush to try again rather than left pinned.
                    self.shared.unpin(ptr as usize, len);
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let shared = self.shared.clone();
        let unpin = move |p: *mut u8, len: usize| shared.unpin(p as usize, len);
        // SAFETY: the range stays pinned until `unpin` unregisters it.
        let pinned = unsafe { PinnedMemory::from_raw_parts(ptr, len, unpin) };
        Ok(match dptr {
            Some(d) => HostMemory::Mapped(MappedMemory::new(pinned, d)),
            None => HostMemory::Pinned(pinned),
        })
    }
}

/// The host's available and total memory in bytes (`MemAvailable` and
/// `MemTotal` of `/proc/meminfo`), where it can be read.
fn host_memory() -> Option<(usize, usize)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<usize> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: usize = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

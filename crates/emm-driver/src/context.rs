//! [`Context`]: a device's primary context, and the push/pop guard.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use emm_sys::{CUcontext, Driver};

use crate::device::Device;
use crate::doomed::{self, Doomed, Kept, Key, MappingWait, Orphan, Report, Which};
use crate::error::{check, driver, DriverError, Result};

/// A device's primary context, retained while any clone (or any stream, event or
/// module made in it) lives.
///
/// The primary context is the one the CUDA runtime, PyTorch, CuPy and Numba use, so
/// memory emm hands out is usable by all of them.
///
/// Errors raised while releasing resources in `Drop` are logged through `tracing`
/// and kept here; the next fallible call on this context (or on a stream, event or
/// module of it) returns the first of them as [`DriverError::Deferred`], and
/// [`Context::take_deferred_errors`] drains them all.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    raw: CUcontext,
    /// `cuCtxGetId` when retained (0 where the driver has none): the key of
    /// what is kept for a retry when the driver cannot say it now.
    id: u64,
    device: Device,
    drv: &'static Driver,
    has_deferred: AtomicBool,
    deferred: Mutex<Vec<DriverError>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Only emm's last retain takes the last chance: another one (a
        // library's handle beside its caller's) retries later. In a forked
        // child the context is the parent's: nothing of it is touched.
        let last = !emm_sys::forked() && doomed::released(self.raw);
        let doomed = if !last || !doomed::any() {
            Vec::new()
        } else {
            match ctx_id(self.drv, self.raw) {
                Some(id) => doomed::take(Key::new(self.raw, id), Which::All),
                None => {
                    // The context cannot say which it is (lost): nothing is
                    // released, and nothing is kept past emm's last retain.
                    let n = doomed::forget(self.raw);
                    tracing::error!(handles = n, "handles kept for a retry are dropped unreleased: their context is lost as emm's last retain of it goes");
                    Vec::new()
                }
            }
        };
        if !doomed.is_empty() {
            // The last chance: the context is still retained here, and made
            // current for the calls. A failure is logged (nobody is left to
            // report it to) and the handle is dropped from the list: what is
            // left goes with the context's destruction (when this was its last
            // retain; another retain, the CUDA runtime's say, keeps it held). It
            // is not kept for a later retain: a context made again may hand out
            // the same addresses, and a stale free would take a new owner's.
            let drv = self.drv;
            let mut prev = CUcontext::NULL;
            // SAFETY: `prev` is a valid out-pointer; `self.raw` is retained.
            let pushed = unsafe { (drv.ctx_get_current)(&mut prev) }.is_success()
                && (prev == self.raw
                    // SAFETY: as above.
                    || unsafe { (drv.ctx_push_current)(self.raw) }.is_success());
            if !pushed {
                tracing::error!(
                    handles = doomed.len(),
                    "handles kept for a retry are dropped unreleased: their context could not be made current as emm's last retain of it goes"
                );
            }
            let doomed = if pushed { doomed } else { Vec::new() };
            for (k, r) in doomed::destroy(self.drv, doomed, MappingWait::Wait) {
                let d = k.what;
                match r {
                    Some(Ok(())) => {}
                    // A driver shutting down (the process exiting) frees it all.
                    Some(Err(e)) if e.is_shutting_down() => {
                        tracing::debug!(error = %e, handle = ?d, "the driver is shutting down; it goes with it");
                    }
                    Some(Err(e)) => {
                        tracing::error!(error = %e, handle = ?d, "destroying or freeing again failed as its context went");
                    }
                    None => {
                        tracing::error!(handle = ?d, "not released as its context goes: a reservation holding a mapping the driver kept, or a pool whose memory's free it refused");
                    }
                }
            }
            if pushed && prev != self.raw {
                let mut popped = CUcontext::NULL;
                // SAFETY: pops the context pushed above.
                let _ = unsafe { (drv.ctx_pop_current)(&mut popped) };
            }
        }
        // SAFETY: this `Inner` holds exactly one retain of the device's primary context.
        let r = unsafe { (self.drv.device_primary_ctx_release)(self.device.raw()) };
        if let Err(e) = check(self.drv, "cuDevicePrimaryCtxRelease_v2", r) {
            tracing::error!(error = %e, device = self.device.ordinal(), "releasing the primary context failed");
        }
        if let Ok(list) = self.deferred.get_mut() {
            for e in list.drain(..) {
                tracing::error!(error = %e, "a deferred driver error was never retrieved");
            }
        }
    }
}

/// `cuCtxGetId` of `raw`: `Some(0)` where the driver has no such call (before
/// CUDA 12.0: contexts are then told apart by handle alone), `None` where the
/// call fails (a lost context).
///
/// What is kept for a retry is keyed with the id its context had when emm
/// retained it ([`Inner`]'s), and released only while the context still has
/// that id: a context reset since (a new context under the same handle) may
/// have handed the same addresses to new owners. Memory of the new context
/// kept through a retain made before the reset is so dropped unreleased (a
/// leak), never released in a context it may not belong to.
fn ctx_id(drv: &'static Driver, raw: CUcontext) -> Option<u64> {
    let Some(f) = drv.ctx_get_id else {
        return Some(0);
    };
    let mut id = 0u64;
    // SAFETY: `raw` is retained by the caller; `id` is a valid out-pointer.
    unsafe { f(raw, &mut id) }.is_success().then_some(id)
}

impl core::fmt::Debug for Context {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Context")
            .field("raw", &self.inner.raw)
            .field("device", &self.inner.device)
            .finish()
    }
}

impl PartialEq for Context {
    fn eq(&self, other: &Self) -> bool {
        self.inner.raw == other.inner.raw
    }
}
impl Eq for Context {}

impl Context {
    /// Retains `device`'s primary context.
    pub fn primary(device: Device) -> Result<Context> {
        let drv = driver()?;
        let mut raw = CUcontext::NULL;
        // SAFETY: `raw` is a valid out-pointer; `device` came from the driver.
        check(drv, "cuDevicePrimaryCtxRetain", unsafe {
            (drv.device_primary_ctx_retain)(&mut raw, device.raw())
        })?;
        doomed::retained(raw);
        Ok(Context {
            inner: Arc::new(Inner {
                raw,
                id: ctx_id(drv, raw).unwrap_or(doomed::UNKNOWN_ID),
                device,
                drv,
                has_deferred: AtomicBool::new(false),
                deferred: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The primary context of device `ordinal`.
    pub fn on_device(ordinal: usize) -> Result<Context> {
        Context::primary(Device::get(ordinal)?)
    }

    /// The raw handle.
    pub fn raw(&self) -> CUcontext {
        self.inner.raw
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// The driver table.
    pub fn driver(&self) -> &'static Driver {
        self.inner.drv
    }

    /// Makes this context current on the calling thread until the guard drops, then
    /// restores the previous one. Cheap when it is already current (no push).
    pub fn push(&self) -> Result<ContextGuard<'_>> {
        let drv = self.inner.drv;
        let mut cur = CUcontext::NULL;
        // SAFETY: `cur` is a valid out-pointer.
        check(drv, "cuCtxGetCurrent", unsafe {
            (drv.ctx_get_current)(&mut cur)
        })?;
        if cur == self.inner.raw {
            return Ok(ContextGuard {
                ctx: self,
                pushed: false,
                _not_send: PhantomData,
            });
        }
        // SAFETY: our raw context is retained for the lifetime of `self`.
        check(drv, "cuCtxPushCurrent_v2", unsafe {
            (drv.ctx_push_current)(self.inner.raw)
        })?;
        Ok(ContextGuard {
            ctx: self,
            pushed: true,
            _not_send: PhantomData,
        })
    }

    /// Makes this context current on the calling thread (no restore).
    pub fn set_current(&self) -> Result<()> {
        let drv = self.inner.drv;
        // SAFETY: our raw context is retained for the lifetime of `self`.
        check(drv, "cuCtxSetCurrent", unsafe {
            (drv.ctx_set_current)(self.inner.raw)
        })
    }

    /// Waits for all work in the context, then destroys again the streams and
    /// events whose destruction failed in a drop and releases the memory handed
    /// over with [`Context::free_later`] (see [`Context::retry_destroys`]).
    ///
    /// A retry the driver refuses is returned once for each handle, one handle
    /// a call: while the driver keeps refusing one already returned, later
    /// calls log it (debug level) and keep it for the next try, so that one
    /// piece the driver will not take back does not fail every later
    /// synchronize. [`Context::retry_destroys`] returns a refusal whether
    /// returned before or not.
    pub fn synchronize(&self) -> Result<()> {
        self.synchronize_then_retry(Report::Once)
    }

    /// [`Context::synchronize`] as a memory manager's own wait (a trim, a
    /// reset, a graph pool's reclaim, before it frees its memory): the errors
    /// recorded in drops are returned as there, but a refused retry is logged,
    /// not returned: it is not the manager's, and it stays unreported for the
    /// caller's own synchronize.
    pub fn synchronize_for_manager(&self) -> Result<()> {
        self.synchronize_then_retry(Report::Never)
    }

    fn synchronize_then_retry(&self, report: Report) -> Result<()> {
        self.check_deferred()?;
        {
            let _g = self.push()?;
            let drv = self.inner.drv;
            // SAFETY: the context is current.
            check(drv, "cuCtxSynchronize", unsafe { (drv.ctx_synchronize)() })?;
        }
        // With `Report::Never` only a failure to make the context current or
        // to read its id comes back: the manager's to report, as it would be
        // of its own next call.
        self.retry(Which::All, report, MappingWait::Waited)
    }

    /// Keeps a stream or event whose destruction just failed in a drop, for
    /// [`Context::retry_destroys`] (the failure itself is recorded by the caller
    /// with [`Context::record_drop_error`]).
    pub(crate) fn keep_doomed(&self, handle: Doomed) {
        doomed::put(self.key(), Kept::new(handle));
    }

    /// The key of what is kept for a retry: the raw handle and the id the
    /// context had when retained (see [`ctx_id`]).
    fn key(&self) -> Key {
        Key::new(self.inner.raw, self.inner.id)
    }

    /// Hands over memory whose release the driver refused, from an owner that
    /// is going (a memory manager being dropped) and can no longer retry it:
    /// it is released by the context's retries ([`Context::retry_destroys`]:
    /// the next synchronize or trim of a manager of this raw context, and last
    /// the release of emm's last retain of it). A context reset meanwhile
    /// (`cuDevicePrimaryCtxReset`, Numba's `cuda.close()`) took it with it: it
    /// is then dropped, never released in the new context. Where emm's last
    /// retain goes and the driver still refuses, it stays until the context's
    /// destruction (logged).
    ///
    /// # Safety
    /// `orphan` must be live in this context (made here, its release refused),
    /// handed over once, and used by nobody again: no queued work may still
    /// touch it. A mapping's handle and reservation, if handed over too, are
    /// released after it.
    pub unsafe fn free_later(&self, orphan: Orphan) {
        tracing::debug!(
            ?orphan,
            "memory the driver would not take back is kept by its context and released again later"
        );
        doomed::put(self.key(), Kept::new(Doomed::Orphan(orphan)));
    }

    /// Streams, events and handed-over memory ([`Context::free_later`]) whose
    /// destruction or release failed, waiting for a retry (for tests and
    /// diagnostics).
    pub fn doomed_handles(&self) -> usize {
        doomed::count(self.inner.raw).0
    }

    /// Bytes of memory handed over with [`Context::free_later`] that wait for
    /// a retry.
    pub fn doomed_bytes(&self) -> usize {
        doomed::count(self.inner.raw).1
    }

    /// Destroys again the streams and events whose destruction failed when they
    /// were dropped (a lost context, say), and releases the memory handed over
    /// with [`Context::free_later`], instead of leaking them: those that fail
    /// again stay for the next try and the first failure among those it tried
    /// is returned (the drop already recorded the original one; what another
    /// thread's retry holds at that moment is not tried here).
    /// [`Context::synchronize`] retries the same way but returns a handle's
    /// refusal once (one a call), and the managers' trims, resets and waits
    /// ([`Context::synchronize_for_manager`]) log them; one atomic load when
    /// there is nothing to retry. Not where work may be being captured into a
    /// graph: `cuMemFree` synchronizes the device, and a virtual-memory
    /// mapping handed over is undone only after a wait of the context (its
    /// owner may have handed it over because its own wait was refused).
    pub fn retry_destroys(&self) -> Result<()> {
        self.retry(Which::All, Report::Every, MappingWait::Wait)
    }

    /// [`Context::retry_destroys`] for a manager's trim (`release_cached`):
    /// a refusal again is logged (debug level), not returned: the trim's own
    /// result is about its own memory, the first refusal was reported when its
    /// owner handed the handle over (recorded on the context for its next call,
    /// or logged at error level where the owner's drop had no caller to tell),
    /// and the next [`Context::synchronize`] returns it once more. It adds no
    /// wait of the context: virtual-memory mappings handed over stay for a
    /// retry after one ([`Context::synchronize`],
    /// [`Context::synchronize_for_manager`], [`Context::retry_destroys`]).
    pub fn retry_destroys_in_trim(&self) {
        self.retry_quietly(Which::All);
    }

    /// Destroys again the streams and events only (see
    /// [`Context::retry_destroys`]), logging a refusal: what their creation
    /// does, which may run during a graph capture.
    pub(crate) fn retry_handles(&self) {
        self.retry_quietly(Which::Handles);
    }

    /// A retry whose caller has no use for its outcome: nothing returned, every
    /// refusal logged and left unreported (`Report::Never`), as is a failure to
    /// make the context current or read its id.
    fn retry_quietly(&self, which: Which) {
        if let Err(e) = self.retry(which, Report::Never, MappingWait::Skip) {
            tracing::debug!(error = %e, ?which, "retrying what the driver refused earlier failed; kept for the next try");
        }
    }

    fn retry(&self, which: Which, report: Report, wait: MappingWait) -> Result<()> {
        if !doomed::any() {
            return Ok(());
        }
        // The context's id now: a reset since a handle was kept drops it
        // (`doomed::take`); a driver that cannot say (a lost context) retries
        // nothing, and says so.
        let Some(id) = ctx_id(self.inner.drv, self.inner.raw) else {
            let drv = self.inner.drv;
            let mut id = 0u64;
            let f = crate::error::optional(drv, drv.ctx_get_id, "cuCtxGetId")?;
            // SAFETY: our raw context is retained; `id` is a valid out-pointer.
            return check(drv, "cuCtxGetId", unsafe { f(self.inner.raw, &mut id) });
        };
        let key = Key::new(self.inner.raw, id);
        let doomed = doomed::take(key, which);
        if doomed.is_empty() {
            return Ok(());
        }
        let _g = match self.push() {
            Ok(g) => g,
            Err(e) => {
                for d in doomed {
                    doomed::put(key, d);
                }
                return Err(e);
            }
        };
        let mut first = None;
        for (mut k, r) in doomed::destroy(self.inner.drv, doomed, wait) {
            match r {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    let returned = match report {
                        Report::Once => !k.reported,
                        Report::Every => true,
                        Report::Never => false,
                    };
                    if returned && first.is_none() {
                        // Only the refusal returned counts as reported: the
                        // others wait for the next call to return theirs.
                        k.reported = true;
                        first = Some(e);
                    } else {
                        tracing::debug!(error = %e, handle = ?k.what, "releasing a kept handle was refused again; kept for the next try");
                    }
                    doomed::put(key, k);
                }
                None => doomed::put(key, k),
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Waits for all work in the context, as [`Context::synchronize`] does, but
    /// leaves the errors recorded during drops for the next fallible call to
    /// report: for code that runs in a `Drop`, or a fallback that must not take
    /// another caller's error.
    pub fn synchronize_keeping_deferred(&self) -> Result<()> {
        let _g = self.push()?;
        let drv = self.inner.drv;
        // SAFETY: the context is current.
        check(drv, "cuCtxSynchronize", unsafe { (drv.ctx_synchronize)() })
    }

    /// `(free, total)` bytes of the device, as `cuMemGetInfo` reports them.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let _g = self.push()?;
        let drv = self.inner.drv;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the context is current; both out-pointers are valid.
        check(drv, "cuMemGetInfo_v2", unsafe {
            (drv.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    /// Records an error raised while releasing something in `Drop`: logged now,
    /// returned by the next fallible call. A driver shutting down
    /// ([`DriverError::is_shutting_down`]: the process is exiting, and the
    /// driver frees what is left) is recorded too, but logged at debug level:
    /// a drop after the driver's teardown is no fault of the program.
    pub fn record_drop_error(&self, error: DriverError) {
        if error.is_shutting_down() {
            tracing::debug!(error = %error, "driver shutting down during drop");
        } else {
            tracing::warn!(error = %error, "driver error during drop; it will be reported on the next call");
        }
        if let Ok(mut list) = self.inner.deferred.lock() {
            list.push(error);
            self.inner.has_deferred.store(true, Ordering::Release);
        }
    }

    /// Drains every error recorded by [`Context::record_drop_error`].
    pub fn take_deferred_errors(&self) -> Vec<DriverError> {
        let mut list = match self.inner.deferred.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        self.inner.has_deferred.store(false, Ordering::Release);
        std::mem::take(&mut *list)
    }

    /// Returns the first error recorded during a drop, if any, as
    /// [`DriverError::Deferred`]. One atomic load when there is none.
    pub fn check_deferred(&self) -> Result<()> {
        if !self.inner.has_deferred.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut errors = self.take_deferred_errors();
        if errors.is_empty() {
            return Ok(());
        }
        let first = errors.remove(0);
        for e in errors {
            tracing::error!(error = %e, "further deferred driver error");
        }
        Err(DriverError::Deferred(Box::new(first)))
    }
}

/// Keeps a context current on this thread; pops it on drop. Not `Send`.
#[must_use = "the context is popped when the guard drops"]
pub struct ContextGuard<'a> {
    ctx: &'a Context,
    pushed: bool,
    _not_send: PhantomData<*const ()>,
}

impl ContextGuard<'_> {
    /// The context kept current.
    pub fn context(&self) -> &Context {
        self.ctx
    }
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        if !self.pushed {
            return;
        }
        let drv = self.ctx.inner.drv;
        let mut popped = CUcontext::NULL;
        // SAFETY: we pushed this context on this thread (the guard is not Send).
        let r = unsafe { (drv.ctx_pop_current)(&mut popped) };
        if let Err(e) = check(drv, "cuCtxPopCurrent_v2", r) {
            self.ctx.record_drop_error(e);
        }
    }
}

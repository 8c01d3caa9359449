//! [`Stream`] and [`Event`].

use emm_sys::{
    event_flags, stream_flags, CUevent, CUresult, CUstream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD,
};

use crate::context::Context;
use crate::doomed::Doomed;
use crate::error::{check, Result};

/// A stream of a context: one the caller created (destroyed on drop), or one of
/// the two default streams (never destroyed).
#[derive(Debug)]
pub struct Stream {
    raw: CUstream,
    ctx: Context,
    owned: bool,
}

impl Stream {
    /// A new non-blocking stream of default priority.
    pub fn new(ctx: &Context) -> Result<Stream> {
        Stream::with_flags(ctx, stream_flags::NON_BLOCKING, 0)
    }

    /// A new stream with `flags` (see [`emm_sys::stream_flags`]) and `priority`
    /// (lower numbers are higher priority; the driver clamps to its range).
    pub fn with_flags(ctx: &Context, flags: u32, priority: i32) -> Result<Stream> {
        ctx.check_deferred()?;
        let _g = ctx.push()?;
        // Streams whose destruction failed earlier go first (a failure again is
        // not this call's: they stay for the next try).
        ctx.retry_handles();
        let drv = ctx.driver();
        let mut raw = CUstream::NULL;
        // SAFETY: the context is current; `raw` is a valid out-pointer.
        check(drv, "cuStreamCreateWithPriority", unsafe {
            (drv.stream_create_with_priority)(&mut raw, flags, priority)
        })?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
            owned: true,
        })
    }

    /// The legacy default stream of `ctx`.
    pub fn legacy(ctx: &Context) -> Stream {
        Stream {
            raw: CU_STREAM_LEGACY,
            ctx: ctx.clone(),
            owned: false,
        }
    }

    /// The per-thread default stream of `ctx`.
    pub fn per_thread(ctx: &Context) -> Stream {
        Stream {
            raw: CU_STREAM_PER_THREAD,
            ctx: ctx.clone(),
            owned: false,
        }
    }

    /// Borrows a stream made elsewhere (PyTorch's, CuPy's); never destroyed by emm.
    ///
    /// # Safety
    /// `raw` must be a stream of `ctx` (or a default-stream handle) that outlives
    /// the returned value.
    pub unsafe fn from_raw(ctx: &Context, raw: CUstream) -> Stream {
        Stream {
            raw,
            ctx: ctx.clone(),
            owned: false,
        }
    }

    /// The raw handle.
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Waits until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.check_deferred()?;
        self.synchronize_keeping_deferred()
    }

    /// As [`Stream::synchronize`], leaving the errors other drops deferred on
    /// the context for their callers' next call (a wait of the library's own,
    /// such as closing an IPC mapping, in a drop too).
    pub fn synchronize_keeping_deferred(&self) -> Result<()> {
        let _g = self.ctx.push()?;
        let drv = self.ctx.driver();
        // SAFETY: the stream belongs to the current context and is alive.
        check(drv, "cuStreamSynchronize", unsafe {
            (drv.stream_synchronize)(self.raw)
        })
    }

    /// `true` when all work queued on the stream has finished.
    pub fn query(&self) -> Result<bool> {
        let _g = self.ctx.push()?;
        let drv = self.ctx.driver();
        // SAFETY: as in `synchronize`.
        let r = unsafe { (drv.stream_query)(self.raw) };
        if r == CUresult::ERROR_NOT_READY {
            return Ok(false);
        }
        check(drv, "cuStreamQuery", r).map(|()| true)
    }

    /// Makes future work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let _g = self.ctx.push()?;
        let drv = self.ctx.driver();
        // SAFETY: both handles are alive; flags must be 0.
        check(drv, "cuStreamWaitEvent", unsafe {
            (drv.stream_wait_event)(self.raw, event.raw, 0)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let drv = self.ctx.driver();
        let r = match self.ctx.push() {
            // SAFETY: we created this stream and destroy it once.
            Ok(_g) => check(drv, "cuStreamDestroy_v2", unsafe {
                (drv.stream_destroy)(self.raw)
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            // Reported once, by the next fallible call; the stream is destroyed
            // again later (see `Context::retry_stream_destroys`), not leaked.
            self.ctx.record_drop_error(e);
            self.ctx.keep_doomed(Doomed::Stream(self.raw));
        }
    }
}

/// An event of a context, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: CUevent,
    ctx: Context,
}

// SAFETY: the handle is an opaque identifier usable from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; `&Event` methods only pass the handle to thread-safe driver calls.
unsafe impl Sync for Event {}

impl Event {
    /// A new event with `flags` (see [`emm_sys::event_flags`]).
    pub fn new(ctx: &Context, flags: u32) -> Result<Event> {
        ctx.check_deferred()?;
        let _g = ctx.push()?;
        // Events and streams whose destruction failed earlier go first (a
        // failure again is not this call's: they stay for the next try).
        ctx.retry_handles();
        let drv = ctx.driver();
        let mut raw = CUevent::NULL;
        // SAFETY: the context is current; `raw` is a valid out-pointer.
        check(drv, "cuEventCreate", unsafe {
            (drv.event_create)(&mut raw, flags)
        })?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// A new event that records timing.
    pub fn timing(ctx: &Context) -> Result<Event> {
        Event::new(ctx, event_flags::DEFAULT)
    }

    /// A new event without timing: the cheapest to record and query.
    pub fn sync_only(ctx: &Context) -> Result<Event> {
        Event::new(ctx, event_flags::DISABLE_TIMING)
    }

    /// The raw handle.
    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.record_raw(stream.raw())
    }

    /// Records the event on a raw stream handle of the same context.
    pub fn record_raw(&self, stream: CUstream) -> Result<()> {
        let drv = self.ctx.driver();
        // SAFETY: both handles are alive and belong to the same context.
        check(drv, "cuEventRecord", unsafe {
            (drv.event_record)(self.raw, stream)
        })
    }

    /// Makes future work on `stream` (a raw handle of this event's context: a
    /// stream the caller knows to be alive, or a default stream) wait for this
    /// event, on the device.
    pub fn wait_on_raw(&self, stream: CUstream) -> Result<()> {
        let _g = self.ctx.push()?;
        let drv = self.ctx.driver();
        // SAFETY: the event is alive; the caller vouches for the stream; flags
        // must be 0.
        check(drv, "cuStreamWaitEvent", unsafe {
            (drv.stream_wait_event)(stream, self.raw, 0)
        })
    }

    /// Waits for the event.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.check_deferred()?;
        let drv = self.ctx.driver();
        // SAFETY: the event is alive.
        check(drv, "cuEventSynchronize", unsafe {
            (drv.event_synchronize)(self.raw)
        })
    }

    /// As [`Event::synchronize`], leaving the errors other drops deferred on the
    /// context for their callers' next call (a wait of an allocator's own).
    pub fn synchronize_keeping_deferred(&self) -> Result<()> {
        let drv = self.ctx.driver();
        // SAFETY: the event is alive.
        check(drv, "cuEventSynchronize", unsafe {
            (drv.event_synchronize)(self.raw)
        })
    }

    /// `true` when the work before the event's last record has finished (or it was
    /// never recorded).
    pub fn query(&self) -> Result<bool> {
        let drv = self.ctx.driver();
        // SAFETY: the event is alive.
        let r = unsafe { (drv.event_query)(self.raw) };
        if r == CUresult::ERROR_NOT_READY {
            return Ok(false);
        }
        check(drv, "cuEventQuery", r).map(|()| true)
    }

    /// Milliseconds between `self` (recorded first) and `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let drv = self.ctx.driver();
        let mut ms = 0f32;
        // SAFETY: both events are alive; `ms` is a valid out-pointer.
        check(drv, "cuEventElapsedTime", unsafe {
            (drv.event_elapsed_time)(&mut ms, self.raw, end.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let drv = self.ctx.driver();
        // SAFETY: we created this event and destroy it once.
        let r = unsafe { (drv.event_destroy)(self.raw) };
        if let Err(e) = check(drv, "cuEventDestroy_v2", r) {
            // Reported once, by the next fallible call; the event is destroyed
            // again later (see `Context::retry_destroys`), not leaked.
            self.ctx.record_drop_error(e);
            self.ctx.keep_doomed(Doomed::Event(self.raw));
        }
    }
}

/// Whether `stream` (of `ctx`, or a default stream; a framework's stream too) is
/// capturing a CUDA graph (`cuStreamIsCapturing`; a capture that was
/// invalidated counts: work queued on it must not run either). `false` on a
/// driver without the call, which has no captures.
pub fn stream_is_capturing(ctx: &Context, stream: CUstream) -> Result<bool> {
    let drv = ctx.driver();
    let Some(is_capturing) = drv.stream_is_capturing else {
        return Ok(false);
    };
    let _g = ctx.push()?;
    let mut status: core::ffi::c_int = 0;
    // SAFETY: `status` is a writable int; the stream handle is the caller's, and
    // the driver reports a dead one as an error rather than touching memory.
    check(drv, "cuStreamIsCapturing", unsafe {
        is_capturing(stream, &mut status)
    })?;
    Ok(status != 0)
}

/// While alive, the calling thread's calls are in CUDA's relaxed capture mode
/// (`cuThreadExchangeStreamCaptureMode`): a call that a capture in progress
/// would otherwise refuse (a `cuMemAlloc` while another thread captures in
/// global mode) goes ahead. Only for calls that are safe during a capture:
/// `cuMemAlloc` of memory a graph keeps (PyTorch's allocator does the same
/// around `cudaMalloc` in a capture). Dropping it restores the thread's mode.
#[derive(Debug)]
#[must_use = "the mode is relaxed only while the guard lives"]
pub struct RelaxedCapture<'a> {
    ctx: &'a Context,
    /// The thread's mode before, to restore; `None` when the driver has no such
    /// call (it has no captures either).
    previous: Option<core::ffi::c_int>,
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: core::ffi::c_int = 2;

impl<'a> RelaxedCapture<'a> {
    /// Relaxes the calling thread's capture mode until the guard drops.
    pub fn new(ctx: &'a Context) -> Result<RelaxedCapture<'a>> {
        let drv = ctx.driver();
        let Some(exchange) = drv.thread_exchange_stream_capture_mode else {
            return Ok(RelaxedCapture {
                ctx,
                previous: None,
            });
        };
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a writable int holding a valid mode.
        check(drv, "cuThreadExchangeStreamCaptureMode", unsafe {
            exchange(&mut mode)
        })?;
        Ok(RelaxedCapture {
            ctx,
            previous: Some(mode),
        })
    }
}

impl Drop for RelaxedCapture<'_> {
    fn drop(&mut self) {
        let Some(mut mode) = self.previous else {
            return;
        };
        let drv = self.ctx.driver();
        if let Some(exchange) = drv.thread_exchange_stream_capture_mode {
            // SAFETY: `mode` is a writable int holding the mode the driver gave.
            let r = unsafe { exchange(&mut mode) };
            if let Err(e) = check(drv, "cuThreadExchangeStreamCaptureMode", r) {
                tracing::error!("could not restore the thread's capture mode: {e}");
            }
        }
    }
}

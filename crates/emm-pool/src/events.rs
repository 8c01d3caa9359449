//! Ordering cross-stream reuse: an [`EventSource`] records a marker on a stream and
//! says when the work before it has completed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emm_core::Result;
use emm_driver::{Context, Event};
use emm_sys::CUstream;

use crate::call_work::{self, Work};

/// Records completion markers on streams.
pub trait EventSource: Send + Sync {
    /// Records a marker after the work queued so far on `stream`.
    fn record(&self, stream: CUstream) -> Result<EventId>;
    /// `true` once the work before the marker has completed.
    fn is_complete(&self, id: EventId) -> Result<bool>;
    /// Blocks until the marker completes.
    fn wait(&self, id: EventId) -> Result<()>;
    /// Waits at most `limit` for the marker: `Ok(true)` once it completed,
    /// `Ok(false)` when `limit` passed first. The default waits as
    /// [`EventSource::wait`] does, without a limit.
    fn wait_for(&self, id: EventId, limit: Duration) -> Result<bool> {
        let _ = limit;
        self.wait(id).map(|()| true)
    }
    /// Makes future work on `stream` (alive: the caller allocates on it) wait
    /// for the marker on the device, without the host waiting.
    fn stream_wait(&self, stream: CUstream, id: EventId) -> Result<()>;
    /// Returns the marker to the source for reuse.
    fn recycle(&self, id: EventId);
    /// Waits for all work on every stream of the device (`cuCtxSynchronize`).
    fn synchronize_all(&self) -> Result<()>;
    /// Destroys the markers kept for reuse that nothing uses now (the pool's trim
    /// calls it: then only the markers still in use are held). The default keeps
    /// them.
    fn release_idle(&self) {}
}

/// A marker recorded by an [`EventSource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId(pub usize);

/// Pooled driver events (timing disabled); created on demand, reused after
/// recycling, destroyed with the source or, once idle, by
/// [`EventSource::release_idle`] (the pool's trim).
///
/// So the source holds at most as many events as were in use at once since the
/// last trim: one per pending cross-stream group, one per stream that the pool
/// grew for (its latest growth, until the next trim, out-of-memory ladder or
/// reset consolidates), one per batch of moved pieces waiting to be unmapped. A
/// failed record keeps its event idle for the next one.
#[derive(Debug)]
pub struct DriverEvents {
    ctx: Context,
    /// Events by id; `None`: a slot whose event was released, reused first.
    all: Mutex<Vec<Option<Arc<Event>>>>,
    idle: Mutex<Vec<usize>>,
}

impl DriverEvents {
    /// Events of `ctx`.
    pub fn new(ctx: &Context) -> Self {
        DriverEvents {
            ctx: ctx.clone(),
            all: Mutex::new(Vec::new()),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn get(&self, id: EventId) -> Option<Arc<Event>> {
        self.all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id.0)
            .cloned()
            .flatten()
    }
}

impl EventSource for DriverEvents {
    fn record(&self, stream: CUstream) -> Result<EventId> {
        call_work::note(Work::Events);
        let reused = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let id = match reused {
            Some(i) => i,
            None => {
                let e = Arc::new(Event::sync_only(&self.ctx)?);
                let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
                match all.iter().position(Option::is_none) {
                    Some(i) => {
                        all[i] = Some(e);
                        i
                    }
                    None => {
                        all.push(Some(e));
                        all.len() - 1
                    }
                }
            }
        };
        let ev = self
            .get(EventId(id))
            .ok_or_else(|| emm_core::EmmError::Internal {
                operation: "recording a pooled event",
                detail: format!("event {id} is not in the pool of events"),
            })?;
        let recorded = self.ctx.push().and_then(|_g| ev.record_raw(stream));
        if let Err(e) = recorded {
            // The event stays the pool's, idle: a failed record neither loses it
            // nor makes the next record create another (each failure used to
            // leave one more event, never used again, until the pool went).
            self.recycle(EventId(id));
            return Err(e.into());
        }
        Ok(EventId(id))
    }

    fn is_complete(&self, id: EventId) -> Result<bool> {
        call_work::note(Work::Events);
        match self.get(id) {
            Some(e) => Ok(e.query()?),
            None => Ok(true),
        }
    }

    fn wait(&self, id: EventId) -> Result<()> {
        call_work::note(Work::Events);
        if let Some(e) = self.get(id) {
            // A wait of the pool's own: errors recorded by other drops stay for
            // their callers (as in `synchronize_all`).
            e.synchronize_keeping_deferred()?;
        }
        Ok(())
    }

    fn wait_for(&self, id: EventId, limit: Duration) -> Result<bool> {
        call_work::note(Work::Events);
        let Some(e) = self.get(id) else {
            return Ok(true);
        };
        // Polled, so that the wait can end: `cuEventSynchronize` has no limit.
        let start = Instant::now();
        loop {
            if e.query()? {
                return Ok(true);
            }
            if start.elapsed() >= limit {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn stream_wait(&self, stream: CUstream, id: EventId) -> Result<()> {
        call_work::note(Work::Events);
        if let Some(e) = self.get(id) {
            e.wait_on_raw(stream)?;
        }
        Ok(())
    }

    fn recycle(&self, id: EventId) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(id.0);
    }

    fn synchronize_all(&self) -> Result<()> {
        // A wait of the pool's own: errors recorded by other drops stay for their
        // callers' next call (taking one here failed the wait, and a trim then
        // kept memory it could have given back).
        Ok(self.ctx.synchronize_keeping_deferred()?)
    }

    fn release_idle(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        for i in idle {
            // Dropped here, or by whoever still holds a clone (a wait in flight);
            // a failed destroy is kept on the context for a retry.
            if let Some(slot) = all.get_mut(i) {
                slot.take();
            }
        }
    }
}

/// Markers for the host stand-in: complete at once, or only when the test says so.
#[derive(Debug, Default)]
pub struct HostEvents {
    manual: bool,
    state: Mutex<Vec<Arc<AtomicBool>>>,
    streams: Mutex<Vec<usize>>,
    /// `(stream, marker)` of every stream wait (manual markers only).
    waits: Mutex<Vec<(usize, usize)>>,
}

impl HostEvents {
    /// Markers that complete immediately (replay without a GPU); nothing is kept of
    /// them ([`HostEvents::log`] stays empty).
    pub fn immediate() -> Self {
        HostEvents {
            manual: false,
            state: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            waits: Mutex::new(Vec::new()),
        }
    }

    /// Markers that complete only through [`HostEvents::complete`] (model tests).
    pub fn manual() -> Self {
        HostEvents {
            manual: true,
            state: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            waits: Mutex::new(Vec::new()),
        }
    }

    /// Completes marker `id`.
    pub fn complete(&self, id: EventId) {
        if let Some(f) = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id.0)
        {
            f.store(true, Ordering::Release);
        }
    }

    /// Completes every marker recorded so far.
    pub fn complete_all(&self) {
        for f in self.state.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            f.store(true, Ordering::Release);
        }
    }

    /// `(stream, marker)` of every stream made to wait for a marker so far, in
    /// order (manual markers only).
    pub fn waits(&self) -> Vec<(usize, usize)> {
        self.waits.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `(stream, complete)` of every marker recorded so far, in order (manual
    /// markers only).
    pub fn log(&self) -> Vec<(usize, bool)> {
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        streams
            .iter()
            .zip(state.iter())
            .map(|(&s, f)| (s, f.load(Ordering::Acquire)))
            .collect()
    }

    /// Markers recorded and not yet complete.
    pub fn outstanding(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|f| !f.load(Ordering::Acquire))
            .count()
    }
}

impl EventSource for HostEvents {
    fn record(&self, stream: CUstream) -> Result<EventId> {
        if !self.manual {
            // Complete at once: nothing to keep (a long replay records millions).
            return Ok(EventId(usize::MAX));
        }
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(stream.0 as usize);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.push(Arc::new(AtomicBool::new(!self.manual)));
        Ok(EventId(s.len() - 1))
    }

    fn is_complete(&self, id: EventId) -> Result<bool> {
        Ok(self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id.0)
            .is_none_or(|f| f.load(Ordering::Acquire)))
    }

    fn wait(&self, id: EventId) -> Result<()> {
        // A host marker "waits" by completing: the test harness plays the device.
        self.complete(id);
        Ok(())
    }

    fn stream_wait(&self, stream: CUstream, id: EventId) -> Result<()> {
        // No device work to order on the stand-in; a model test may ask which
        // stream waited for what.
        if self.manual {
            self.waits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((stream.0 as usize, id.0));
        }
        Ok(())
    }

    fn recycle(&self, _id: EventId) {}

    fn synchronize_all(&self) -> Result<()> {
        if !self.manual {
            return Ok(());
        }
        // A device-wide sync: logged as a marker on "every stream" (usize::MAX).
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(usize::MAX);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for f in s.iter() {
            f.store(true, Ordering::Release);
        }
        s.push(Arc::new(AtomicBool::new(true)));
        Ok(())
    }
}

impl<T: EventSource + ?Sized> EventSource for Arc<T> {
    fn record(&self, stream: CUstream) -> Result<EventId> {
        (**self).record(stream)
    }
    fn is_complete(&self, id: EventId) -> Result<bool> {
        (**self).is_complete(id)
    }
    fn wait(&self, id: EventId) -> Result<()> {
        (**self).wait(id)
    }
    fn wait_for(&self, id: EventId, limit: Duration) -> Result<bool> {
        (**self).wait_for(id, limit)
    }
    fn stream_wait(&self, stream: CUstream, id: EventId) -> Result<()> {
        (**self).stream_wait(stream, id)
    }
    fn recycle(&self, id: EventId) {
        (**self).recycle(id)
    }
    fn synchronize_all(&self) -> Result<()> {
        (**self).synchronize_all()
    }
    fn release_idle(&self) {
        (**self).release_idle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_markers_keep_nothing_and_are_complete() {
        let ev = HostEvents::immediate();
        for _ in 0..10_000 {
            let id = ev.record(CUstream(core::ptr::null_mut())).unwrap();
            assert!(ev.is_complete(id).unwrap());
        }
        ev.synchronize_all().unwrap();
        assert!(ev.log().is_empty());
        assert_eq!(ev.outstanding(), 0);
        let manual = HostEvents::manual();
        let id = manual.record(CUstream(core::ptr::null_mut())).unwrap();
        assert!(!manual.is_complete(id).unwrap());
        assert_eq!(manual.log().len(), 1);
    }
}

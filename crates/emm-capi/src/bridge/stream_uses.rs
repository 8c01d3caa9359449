//! Streams besides its own that an allocation freed by address is used on
//! (PyTorch's `Tensor.record_stream`, through `emm_torch_record_stream`).
//!
//! PyTorch frees a tensor in the order of the stream it was allocated on. Work
//! queued on another stream may still read or write it then, and its own allocator
//! waits for that work before reusing the memory; under a pluggable allocator
//! PyTorch forwards no such call, so emm is told directly. At the free, the
//! allocation's own stream is made to wait (`cuStreamWaitEvent`, nothing blocks on
//! the host) for the work queued so far on every stream that used it, and only then
//! does the block go back to the pool, ordered on its own stream. Every later use of
//! the memory is ordered after that wait: on the same stream by stream order, on any
//! other by the event the pool records (or the synchronization it makes) before it
//! hands a block to another stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use emm_core::EmmError;
use emm_driver::{Context, Event, Stream};
use emm_sys::CUstream;

use crate::ffi::lock;

/// The streams each live allocation of one device is used on besides its own.
#[derive(Default)]
pub(crate) struct StreamUses {
    /// Allocations with an entry in `map`, so that a free of an allocation no
    /// other stream used (nearly every free) takes no lock here.
    noted: AtomicUsize,
    map: Mutex<HashMap<u64, Vec<CUstream>>>,
}

impl StreamUses {
    /// Notes that the allocation at `ptr` is used on `stream` too. Called with the
    /// device's map of live allocations locked (so the allocation cannot be freed
    /// meanwhile).
    pub(crate) fn note(&self, ptr: u64, stream: CUstream) {
        let mut map = lock(&self.map);
        let streams = map.entry(ptr).or_insert_with(|| {
            self.noted.fetch_add(1, Ordering::Relaxed);
            Vec::new()
        });
        if !streams.contains(&stream) {
            streams.push(stream);
        }
    }

    /// The streams noted for `ptr`, forgotten here (the allocation is being
    /// freed). Called with the device's map of live allocations locked.
    pub(crate) fn take(&self, ptr: u64) -> Vec<CUstream> {
        if self.noted.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let found = lock(&self.map).remove(&ptr);
        match found {
            Some(streams) => {
                self.noted.fetch_sub(1, Ordering::Relaxed);
                streams
            }
            None => Vec::new(),
        }
    }
}

/// Makes future work on `own` wait for the work queued so far on each of `others`
/// (streams of `ctx`). Where an event cannot be made, recorded or waited on, the
/// other stream is synchronized instead. An error means that neither worked for
/// some stream: its work may still use the memory, which must then never be
/// reused.
pub(crate) fn join(ctx: &Context, own: CUstream, others: &[CUstream]) -> Result<(), EmmError> {
    // SAFETY: `own` is the stream PyTorch frees the allocation on, a stream of
    // `ctx` that is alive during the free; the value is dropped before return.
    let own_stream = unsafe { Stream::from_raw(ctx, own) };
    for &other in others.iter().filter(|&&s| s != own) {
        let by_event = Event::sync_only(ctx).and_then(|ev| {
            ev.record_raw(other)?;
            own_stream.wait_event(&ev)
            // Dropping the event now is fine: a wait already queued on it stays
            // valid, and the driver frees it once it has completed.
        });
        if let Err(e) = by_event {
            tracing::warn!(
                "cannot order a free after its use on stream {other:?} by an event ({e}); synchronizing that stream"
            );
            // SAFETY: `other` was named by the caller as a stream of `ctx` that uses
            // the allocation; the value is dropped at the end of this statement.
            unsafe { Stream::from_raw(ctx, other) }.synchronize()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_each_stream_once_and_forgets_them_at_the_free() {
        let uses = StreamUses::default();
        assert!(uses.take(0x1000).is_empty(), "nothing noted");
        let (a, b) = (CUstream(0x10 as _), CUstream(0x20 as _));
        uses.note(0x1000, a);
        uses.note(0x1000, b);
        uses.note(0x1000, a);
        uses.note(0x2000, b);
        assert_eq!(uses.noted.load(Ordering::Relaxed), 2);
        assert_eq!(uses.take(0x1000), vec![a, b]);
        assert!(
            uses.take(0x1000).is_empty(),
            "forgotten after the first take"
        );
        assert_eq!(uses.take(0x2000), vec![b]);
        assert_eq!(uses.noted.load(Ordering::Relaxed), 0);
    }
}

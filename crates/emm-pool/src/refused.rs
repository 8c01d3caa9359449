//! Segments whose free the upstream refused when the pool gave them back whole
//! (a reset or the pool's drop: a lost context, a failing `cuMemFree`). The pool
//! no longer holds them in its arena, so they are kept here, not forgotten, and
//! freed again by the next trim, reset or drop (as emm-default requeues the
//! frees its driver refused); those the drop's retry could not free are handed
//! to the upstream to free later ([`Refused::hand_over`]).

use std::sync::Mutex;

use emm_core::EmmError;
use emm_default::Upstream;
use emm_sys::CUdeviceptr;

/// Segments (base, size) whose free failed, waiting for a retry.
#[derive(Debug, Default)]
pub(crate) struct Refused {
    segments: Mutex<Vec<(CUdeviceptr, usize)>>,
}

impl Refused {
    /// Keeps the segment at `base` of `size` bytes, whose free just failed with
    /// `error` (logged with `during`).
    pub(crate) fn keep(&self, base: CUdeviceptr, size: usize, error: &EmmError, during: &str) {
        tracing::error!(error = %error, base, size, "freeing a segment failed ({during}); it is kept and freed again by the next trim, reset or drop");
        self.segments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((base, size));
    }

    /// Bytes kept for a retry.
    pub(crate) fn bytes(&self) -> usize {
        self.segments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|&(_, s)| s)
            .sum()
    }

    /// Frees every kept segment again through `upstream`; those refused again stay
    /// (logged). Returns the bytes freed.
    pub(crate) fn retry(&self, upstream: &dyn Upstream, during: &str) -> usize {
        let kept = std::mem::take(&mut *self.segments.lock().unwrap_or_else(|p| p.into_inner()));
        let mut freed = 0;
        for (base, size) in kept {
            // SAFETY: each segment came from this upstream, was taken out of the
            // arena whole after the device finished its work on it, and its free
            // failed: it is freed once more here (kept again if that fails too).
            match unsafe { upstream.free(base, size) } {
                Ok(()) => freed += size,
                Err(e) => self.keep(base, size, &e, during),
            }
        }
        freed
    }

    /// Hands every kept segment to `upstream` to free later, as the pool goes
    /// and nobody is left to retry ([`Upstream::free_later`]); one it cannot
    /// take stays allocated (logged).
    pub(crate) fn hand_over(&self, upstream: &dyn Upstream) {
        let kept = std::mem::take(&mut *self.segments.lock().unwrap_or_else(|p| p.into_inner()));
        for (base, size) in kept {
            // SAFETY: each segment came from this upstream, its free failed, and
            // the pool that held it is going: nobody uses or frees it again.
            if !unsafe { upstream.free_later(base, size) } {
                tracing::error!(
                    base,
                    size,
                    "a segment whose free failed stays allocated as its pool goes"
                );
            }
        }
    }
}

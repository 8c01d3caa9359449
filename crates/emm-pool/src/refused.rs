//! Segments whose free the upstream refused when the pool gave them back whole
//! (a reset or the pool's drop: a lost context, a failing `cuMemFree`). The pool
//! no longer holds them in its arena, so they are kept here, not forgotten, and
//! freed again by the next trim, reset or drop (as emm-default requeues the
//! frees its driver refused).

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
}

//! CUDA graph capture through emm's allocator object for PyTorch: each device's
//! private pools ([`GraphPool`]), named by PyTorch's pool ids, and the frees held
//! back while a capture runs.
//!
//! PyTorch calls `beginAllocateToPool` before a capture begins, allocates the
//! capture's memory from the pool it named while the capture runs (the object
//! in `python/emm/_torch_native.cpp` tells which allocations those are, with
//! PyTorch's filter), calls `endAllocateToPool` after the capture ended and
//! `releasePool` when the graph is reset or destroyed. Graphs captured with one
//! pool id share the pool.
//!
//! While a capture runs, a free of the process's manager on a stream that is
//! capturing, or of a block used on one (`record_stream`), is held back until
//! the capture ends: the manager would record an event on that stream (or query
//! one), which a capture forbids, and the work the captured graph queued on the
//! memory has not run yet. Other frees go ahead. Memory of a graph pool is never held: it goes back to its
//! pool at once, for the rest of the capture to reuse in stream order.
//!
//! This file holds the state ([`GraphPools`], one per device, a field of the
//! device's state in `devices.rs`); the protocol over it is `graph_capture.rs`,
//! above both, and its C functions are in `graph_hooks.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use emm::emm_pool::{GraphPool, GraphPoolStats};
use emm_core::{DeviceAllocation, EmmError};
use emm_driver::Context;
use emm_sys::CUstream;

use crate::ffi::lock;

/// PyTorch's `MempoolId_t`: a pair of capture ids.
pub(crate) type PoolId = (u64, u64);

/// A pool some graph still uses.
pub(crate) struct Entry {
    pub(crate) pool: Arc<GraphPool>,
    /// `beginAllocateToPool` calls not yet matched by `releasePool`.
    pub(crate) uses: usize,
    /// `beginAllocateToPool` calls not yet matched by `endAllocateToPool`.
    pub(crate) routes: usize,
}

/// A free held back while its stream captures.
pub(crate) struct Held {
    pub(crate) a: DeviceAllocation,
    pub(crate) used_on: Vec<CUstream>,
}

/// One device's graph pools.
#[derive(Default)]
pub(crate) struct GraphPools {
    /// Captures routing allocations to a pool now (sum of the entries' routes).
    pub(crate) routing: AtomicUsize,
    pub(crate) pools: Mutex<HashMap<PoolId, Entry>>,
    /// Pools every graph released that still hold segments (a live tensor of
    /// theirs, or not yet reclaimed).
    pub(crate) released: Mutex<Vec<Arc<GraphPool>>>,
    /// Frees held back while their stream captures; `routing` changes only with
    /// this locked, so a free never lands here after the last capture ended.
    pub(crate) held: Mutex<Vec<Held>>,
    /// Held for a whole reclaim and by `begin` while it raises `routing`, so no
    /// capture begins while a reclaim synchronizes or frees.
    pub(crate) gate: Mutex<()>,
    /// Segments taken and given back by pools that are gone (the device's
    /// counters never go down).
    gone_allocs: AtomicUsize,
    gone_frees: AtomicUsize,
}

impl GraphPools {
    /// Whether a capture may be routing allocations now (one atomic load: the
    /// free path asks this on every call).
    pub(crate) fn routing(&self) -> bool {
        self.routing.load(Ordering::Acquire) > 0
    }

    /// Takes the free of `a` unless it has to wait for the capture on its stream
    /// to end: `None` when it was held back, else the allocation, to be freed now.
    pub(crate) fn hold_if_capturing(
        &self,
        ctx: Option<&Context>,
        a: DeviceAllocation,
        used_on: Vec<CUstream>,
    ) -> Option<Held> {
        let back = Held { a, used_on };
        let Some(ctx) = ctx else {
            return Some(back);
        };
        if self.owns(back.a.ptr()) {
            return Some(back);
        }
        // Its own stream, or one it was used on (the free joins those with an
        // event): any of them capturing holds it.
        let streams = std::iter::once(back.a.stream()).chain(back.used_on.iter().copied());
        let mut capturing = Ok(false);
        for s in streams {
            match emm_driver::stream_is_capturing(ctx, s) {
                Ok(false) => {}
                other => {
                    capturing = other;
                    break;
                }
            }
        }
        match capturing {
            Ok(true) => {}
            Ok(false) => return Some(back),
            Err(e) => {
                // Hold it: freeing into a capture could invalidate it, and the
                // hold ends with the capture anyway.
                tracing::warn!(
                    "could not tell whether stream {:?} is capturing ({e}); the free of {:#x} waits for the capture to end",
                    back.a.stream(),
                    back.a.ptr()
                );
            }
        }
        let mut held = lock(&self.held);
        if self.routing.load(Ordering::Acquire) == 0 {
            return Some(back); // the capture ended meanwhile
        }
        held.push(back);
        None
    }

    /// Holds the free of `a` until the captures now routing end (when a device-wide
    /// synchronization, which would invalidate a capture, is not allowed):
    /// `None` when it was held, else the allocation back (no capture routes now).
    pub(crate) fn hold_until_captures_end(
        &self,
        a: DeviceAllocation,
        used_on: Vec<CUstream>,
    ) -> Option<Held> {
        let mut held = lock(&self.held);
        if self.routing.load(Ordering::Acquire) == 0 {
            return Some(Held { a, used_on });
        }
        held.push(Held { a, used_on });
        None
    }

    /// Whether a graph pool of the device handed out `ptr` (and it is live).
    fn owns(&self, ptr: u64) -> bool {
        lock(&self.pools).values().any(|e| e.pool.owns(ptr))
            || lock(&self.released).iter().any(|p| p.owns(ptr))
    }

    /// The pools' holdings, summed.
    pub(crate) fn stats(&self) -> GraphPoolStats {
        let mut sum = GraphPoolStats::default();
        let pools = lock(&self.pools);
        let released = lock(&self.released);
        for p in pools.values().map(|e| &e.pool).chain(released.iter()) {
            let s = p.stats();
            sum.live_bytes += s.live_bytes;
            sum.live_blocks += s.live_blocks;
            sum.reserved_bytes += s.reserved_bytes;
            sum.segments += s.segments;
            sum.peak_live_bytes += s.peak_live_bytes;
            sum.peak_reserved_bytes += s.peak_reserved_bytes;
            sum.segment_allocs += s.segment_allocs;
            sum.segment_frees += s.segment_frees;
        }
        sum.segment_allocs += self.gone_allocs.load(Ordering::Relaxed);
        sum.segment_frees += self.gone_frees.load(Ordering::Relaxed);
        sum
    }

    /// Gives back the segments of released pools that hold nothing live (none
    /// while a capture routes: reclaiming synchronizes); the bytes given back.
    pub(crate) fn reclaim(&self) -> Result<usize, EmmError> {
        let _gate = lock(&self.gate);
        if self.routing() {
            return Ok(0);
        }
        let pools: Vec<Arc<GraphPool>> = lock(&self.released).clone();
        let mut total = 0;
        let mut first_error = None;
        for p in &pools {
            match p.reclaim() {
                Ok(n) => total += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        lock(&self.released).retain(|p| {
            let s = p.stats();
            if s.segments > 0 {
                return true;
            }
            self.gone_allocs
                .fetch_add(s.segment_allocs, Ordering::Relaxed);
            self.gone_frees
                .fetch_add(s.segment_frees, Ordering::Relaxed);
            false
        });
        match first_error {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }
}

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

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use emm::emm_default::DriverUpstream;
use emm::emm_pool::{GraphPool, GraphPoolStats};
use emm_core::{DeviceAllocation, EmmError};
use emm_driver::Context;
use emm_sys::CUstream;

use crate::framework::{insert_live, known_device, live_device, release_now, LiveDevice};
use crate::{emm_status, fail, fail_alloc, guard, invalid, lock, ssize_t, stream_of, EMM_OK};

/// PyTorch's `MempoolId_t`: a pair of capture ids.
type PoolId = (u64, u64);

/// A pool some graph still uses.
struct Entry {
    pool: Arc<GraphPool>,
    /// `beginAllocateToPool` calls not yet matched by `releasePool`.
    uses: usize,
    /// `beginAllocateToPool` calls not yet matched by `endAllocateToPool`.
    routes: usize,
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
    routing: AtomicUsize,
    pools: Mutex<HashMap<PoolId, Entry>>,
    /// Pools every graph released that still hold segments (a live tensor of
    /// theirs, or not yet reclaimed).
    released: Mutex<Vec<Arc<GraphPool>>>,
    /// Frees held back while their stream captures; `routing` changes only with
    /// this locked, so a free never lands here after the last capture ended.
    held: Mutex<Vec<Held>>,
    /// Held for a whole reclaim and by `begin` while it raises `routing`, so no
    /// capture begins while a reclaim synchronizes or frees.
    gate: Mutex<()>,
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

fn pool_name(device: c_int, id: PoolId) -> String {
    format!("graph pool ({}, {}) of device {device}", id.0, id.1)
}

/// Frees what was held back for captures that are over: all of it once no
/// capture routes, else the frees whose stream no longer captures (a capture
/// that failed before PyTorch ended it).
fn release_held(d: &LiveDevice) -> emm_status {
    let ready: Vec<Held> = {
        let mut held = lock(&d.graphs.held);
        if d.graphs.routing.load(Ordering::Acquire) == 0 {
            std::mem::take(&mut *held)
        } else {
            let Some(ctx) = d.manager.context() else {
                return EMM_OK;
            };
            let (ready, still): (Vec<Held>, Vec<Held>) = held.drain(..).partition(|h| {
                matches!(
                    emm_driver::stream_is_capturing(ctx, h.a.stream()),
                    Ok(false)
                )
            });
            *held = still;
            ready
        }
    };
    let mut status = EMM_OK;
    for h in ready {
        let code = release_now(
            "a free held back during a CUDA graph capture",
            d,
            h.a,
            &h.used_on,
        );
        if status == EMM_OK {
            status = code;
        }
    }
    status
}

/// PyTorch's `beginAllocateToPool` for a CUDA graph capture (emm's allocator
/// object): makes the private pool `(pool_a, pool_b)` of `device` if it does not
/// exist (a pool id used again after every graph of it was released gets a new
/// pool), counts one more use of it, and marks a capture as routing allocations
/// to it until [`emm_torch_graph_pool_end`]. Frees held back for captures that
/// are over go ahead. A device whose manager serves no device context is
/// `EMM_ERR_UNSUPPORTED`. Since ABI 308.
#[no_mangle]
pub extern "C" fn emm_torch_graph_pool_begin(
    device: c_int,
    pool_a: u64,
    pool_b: u64,
) -> emm_status {
    guard(|| {
        let d = match live_device(device) {
            Ok(d) => d,
            Err(code) => return code,
        };
        let Some(ctx) = d.manager.context() else {
            return fail(EmmError::Unsupported {
                manager: d.manager.name().to_string(),
                operation: "CUDA graph pools (it serves no device context)",
            });
        };
        let status = release_held(d);
        {
            let mut pools = lock(&d.graphs.pools);
            let e = pools.entry((pool_a, pool_b)).or_insert_with(|| Entry {
                pool: GraphPool::new(Box::new(DriverUpstream::new(ctx))),
                uses: 0,
                routes: 0,
            });
            e.uses += 1;
            e.routes += 1;
            let _gate = lock(&d.graphs.gate);
            let _held = lock(&d.graphs.held);
            d.graphs.routing.fetch_add(1, Ordering::AcqRel);
        }
        status
    })
}

/// PyTorch's `endAllocateToPool`, after the capture ended: the capture no longer
/// routes to `(pool_a, pool_b)`. When no capture routes any more, the frees held
/// back go ahead and released pools give back what they can. A pool that was
/// never begun is `EMM_ERR_INVALID_ARGUMENT`. Since ABI 308.
#[no_mangle]
pub extern "C" fn emm_torch_graph_pool_end(device: c_int, pool_a: u64, pool_b: u64) -> emm_status {
    guard(|| {
        let Some(d) = known_device(device) else {
            return invalid(format!(
                "emm_torch_graph_pool_end: {} was never begun",
                pool_name(device, (pool_a, pool_b))
            ));
        };
        {
            let mut pools = lock(&d.graphs.pools);
            match pools.get_mut(&(pool_a, pool_b)) {
                Some(e) if e.routes > 0 => {
                    e.routes -= 1;
                    let _held = lock(&d.graphs.held);
                    d.graphs.routing.fetch_sub(1, Ordering::AcqRel);
                }
                _ => {
                    return invalid(format!(
                        "emm_torch_graph_pool_end: no capture routes to {}",
                        pool_name(device, (pool_a, pool_b))
                    ))
                }
            }
        }
        let status = release_held(d);
        match d.graphs.reclaim() {
            Ok(_) => status,
            Err(e) if status == EMM_OK => fail(e),
            Err(e) => {
                tracing::warn!("emm_torch_graph_pool_end: {e}");
                status
            }
        }
    })
}

/// PyTorch's `releasePool`, when a graph captured with the pool is reset or
/// destroyed: one use fewer. When none is left the pool takes no more
/// allocations, and its segments go back once nothing in them is live (now if
/// no capture runs, else at the end of the captures, at `emm_torch_empty_cache`
/// or when a later pool call finds it so). A pool released before its capture
/// ended (a capture that failed) routes no more, and frees held for it go
/// ahead. An unknown pool is `EMM_ERR_INVALID_ARGUMENT`; every failure is also
/// logged, as PyTorch calls this from a destructor. Since ABI 308.
#[no_mangle]
pub extern "C" fn emm_torch_graph_pool_release(
    device: c_int,
    pool_a: u64,
    pool_b: u64,
) -> emm_status {
    guard(|| {
        let Some(d) = known_device(device) else {
            return invalid(format!(
                "emm_torch_graph_pool_release: no {}",
                pool_name(device, (pool_a, pool_b))
            ));
        };
        let status = {
            let mut pools = lock(&d.graphs.pools);
            let Some(e) = pools.get_mut(&(pool_a, pool_b)) else {
                return invalid(format!(
                    "emm_torch_graph_pool_release: no {}",
                    pool_name(device, (pool_a, pool_b))
                ));
            };
            e.uses = e.uses.saturating_sub(1);
            if e.uses == 0 {
                if let Some(e) = pools.remove(&(pool_a, pool_b)) {
                    if e.routes > 0 {
                        // Released before its capture ended (a capture that
                        // failed): it routes no more.
                        let _held = lock(&d.graphs.held);
                        d.graphs.routing.fetch_sub(e.routes, Ordering::AcqRel);
                    }
                    e.pool.set_released();
                    lock(&d.graphs.released).push(e.pool);
                }
            }
            drop(pools);
            release_held(d)
        };
        let status = match d.graphs.reclaim() {
            Ok(_) => status,
            Err(e) if status == EMM_OK => fail(e),
            Err(e) => {
                tracing::warn!("emm_torch_graph_pool_release: {e}");
                status
            }
        };
        if status != EMM_OK {
            // PyTorch calls releasePool from a destructor and cannot report it.
            tracing::warn!(
                "releasing {}: {}",
                pool_name(device, (pool_a, pool_b)),
                crate::last_error_message()
            );
        }
        status
    })
}

/// An allocation of `size` bytes on `device` ordered on `stream` from the graph
/// pool `(pool_a, pool_b)` (begun with [`emm_torch_graph_pool_begin`] and not yet
/// released), for emm's allocator object while a capture routes to the pool.
/// Freed like any other address of `emm_torch_alloc` (`emm_torch_release`), back
/// into its pool. NULL on failure (`emm_last_error` says why; out of memory is
/// `EMM_ERR_OUT_OF_MEMORY`: the pool gives nothing back during a capture); size 0
/// is NULL with `EMM_OK`. Since ABI 308.
#[no_mangle]
pub extern "C" fn emm_torch_graph_pool_alloc(
    size: ssize_t,
    device: c_int,
    stream: *mut c_void,
    pool_a: u64,
    pool_b: u64,
) -> *mut c_void {
    let mut out: *mut c_void = core::ptr::null_mut();
    let _ = guard(|| {
        let Ok(size) = usize::try_from(size) else {
            return invalid(format!("emm_torch_graph_pool_alloc: negative size {size}"));
        };
        if size == 0 {
            return EMM_OK;
        }
        let Some(d) = known_device(device) else {
            return invalid(format!(
                "emm_torch_graph_pool_alloc: no {}",
                pool_name(device, (pool_a, pool_b))
            ));
        };
        let Some(pool) = lock(&d.graphs.pools)
            .get(&(pool_a, pool_b))
            .map(|e| e.pool.clone())
        else {
            return invalid(format!(
                "emm_torch_graph_pool_alloc: no {} in use (begin it first)",
                pool_name(device, (pool_a, pool_b))
            ));
        };
        match pool.alloc(size, stream_of(stream)) {
            Ok(a) => {
                out = insert_live(d, a) as *mut c_void;
                EMM_OK
            }
            Err(e) => {
                let code = fail_alloc(e, size, d.manager.as_ref());
                let why = crate::last_error_message();
                crate::set_error(
                    code,
                    format!("{}: {why}", pool_name(device, (pool_a, pool_b))),
                )
            }
        }
    });
    out
}

/// PyTorch's `checkPoolLiveAllocations` (CUDA graph trees, `torch.compile`'s
/// reduce-overhead mode): the addresses of the blocks of the graph pool
/// `(pool_a, pool_b)` of `device` handed out and not yet freed, in address
/// order: the first `n` into `ptrs` (may be NULL when `n` is 0), and how many
/// there are into `*count`. A pool that is not in use is
/// `EMM_ERR_INVALID_ARGUMENT`; so is a null `count`, or a null `ptrs` with
/// `n > 0`. Since ABI 308.
#[no_mangle]
pub unsafe extern "C" fn emm_torch_graph_pool_live(
    device: c_int,
    pool_a: u64,
    pool_b: u64,
    ptrs: *mut *mut c_void,
    n: usize,
    count: *mut usize,
) -> emm_status {
    guard(|| {
        if count.is_null() || (n > 0 && ptrs.is_null()) {
            return invalid(
                "emm_torch_graph_pool_live: `count` is null, or `ptrs` is null with n > 0",
            );
        }
        let pool = known_device(device).and_then(|d| {
            lock(&d.graphs.pools)
                .get(&(pool_a, pool_b))
                .map(|e| e.pool.clone())
        });
        let Some(pool) = pool else {
            return invalid(format!(
                "emm_torch_graph_pool_live: no {} in use",
                pool_name(device, (pool_a, pool_b))
            ));
        };
        let live = pool.live_blocks();
        for (i, &p) in live.iter().take(n).enumerate() {
            // SAFETY: `ptrs` holds `n` writable elements per the contract, and i < n.
            unsafe { *ptrs.add(i) = p as *mut c_void };
        }
        // SAFETY: non-null (checked above) and writable per the contract.
        unsafe { *count = live.len() };
        EMM_OK
    })
}

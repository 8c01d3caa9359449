//! The C functions of PyTorch's CUDA graph-pool protocol for emm's allocator
//! object (`emm_torch_graph_pool_*`): they find the device's state (`framework.rs`)
//! and work on its `GraphPools` (`graph_pools.rs`, which describes the protocol),
//! and free what was held back once captures are over.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use emm::emm_default::DriverUpstream;
use emm::emm_pool::GraphPool;
use emm_core::EmmError;

use crate::bridge::devices::{insert_live, known_device, live_device, release_now, LiveDevice};
use crate::bridge::graph_pools::{Entry, Held, PoolId};
use crate::ffi::{lock, stream_of};
use crate::guard::guard;
use crate::status::{emm_status, fail, fail_alloc, invalid, ssize_t, EMM_OK};

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
                crate::status::last_error_message()
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
                let why = crate::status::last_error_message();
                crate::status::set_error(
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

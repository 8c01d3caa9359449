//! PyTorch's private-pool protocol (CUDA graphs and `torch.cuda.MemPool`) on a
//! device's state: `createOrIncrefPool` ([`create`]), `beginAllocateToPool`
//! ([`begin`]), allocations routed to the pool ([`alloc`]), `endAllocateToPool`
//! ([`end`]), `releasePool` ([`release`]), `checkPoolLiveAllocations`
//! ([`live`]), `getPoolUseCount` and the pool's figures ([`info`]), and the
//! frees held back for captures that are over going ahead.
//! The state is [`GraphPools`](super::graph_pools::GraphPools) (`graph_pools.rs`, which describes the protocol),
//! a field of the device's state (`devices.rs`); this file sits above both. The
//! C functions in `graph_hooks.rs` only convert arguments and report.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use emm::emm_default::DriverUpstream;
use emm::emm_pool::{GraphPool, GraphPoolStats};
use emm_core::EmmError;
use emm_sys::CUstream;

use super::devices::{insert_live, known_device, live_device, release_now, LiveDevice};
use super::graph_pools::{Entry, Held, PoolId};
use crate::ffi::lock;
use crate::status::{emm_status, fail, fail_alloc, invalid, EMM_OK};

/// How messages name the pool `id` of `device`.
pub(crate) fn pool_name(device: c_int, id: PoolId) -> String {
    format!("graph pool ({}, {}) of device {device}", id.0, id.1)
}

/// Frees what was held back for captures that are over: all of it once no
/// capture routes, else the frees whose stream no longer captures (a capture
/// that failed before PyTorch ended it). The first failure's status, after
/// trying every free.
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

/// Gives back the segments of released pools that hold nothing live, keeping
/// `status` when it already says something failed (the reclaim's error is then
/// logged as `what`).
fn reclaim_after(what: &str, d: &LiveDevice, status: emm_status) -> emm_status {
    match d.graphs.reclaim() {
        Ok(_) => status,
        Err(e) if status == EMM_OK => fail(e),
        Err(e) => {
            tracing::warn!("{what}: {e}");
            status
        }
    }
}

/// The pool `id` of `d`, made if it does not exist (an id used again after
/// every user released it gets a new pool), with one more use counted;
/// `route` also marks one more capture or `use_mem_pool` as routing
/// allocations to it. A device whose manager serves no device context is
/// `EMM_ERR_UNSUPPORTED`.
fn use_pool(d: &LiveDevice, id: PoolId, route: bool) -> emm_status {
    let Some(ctx) = d.manager.context() else {
        return fail(EmmError::Unsupported {
            manager: d.manager.name().to_string(),
            operation: "private memory pools for CUDA graphs and torch.cuda.MemPool (it serves no device context)",
        });
    };
    let status = release_held(d);
    let mut pools = lock(&d.graphs.pools);
    let e = pools.entry(id).or_insert_with(|| Entry {
        pool: GraphPool::new(Box::new(DriverUpstream::new(ctx))),
        uses: 0,
        routes: 0,
    });
    e.uses += 1;
    if route {
        e.routes += 1;
        // A reclaim running now finishes before a capture may begin (`gate`),
        // and `routing` changes only with `held` locked (see `GraphPools`).
        let _gate = lock(&d.graphs.gate);
        let _held = lock(&d.graphs.held);
        d.graphs.routing.fetch_add(1, Ordering::AcqRel);
    }
    status
}

/// `createOrIncrefPool` (`torch.cuda.MemPool()`): makes the pool `id` of
/// `device` if it does not exist and counts one more use of it, routing
/// nothing to it yet. Released by [`release`], as PyTorch's `MemPool` does when
/// it dies.
pub(crate) fn create(device: c_int, id: PoolId) -> emm_status {
    match live_device(device) {
        Ok(d) => use_pool(d, id, false),
        Err(code) => code,
    }
}

/// `beginAllocateToPool`: makes the pool `id` of `device` if it does not exist
/// (an id used again after every graph of it was released gets a new pool),
/// counts one more use of it, and marks a capture as routing allocations to it
/// until [`end`]. Frees held back for captures that are over go ahead. A device
/// whose manager serves no device context is `EMM_ERR_UNSUPPORTED`.
pub(crate) fn begin(device: c_int, id: PoolId) -> emm_status {
    match live_device(device) {
        Ok(d) => use_pool(d, id, true),
        Err(code) => code,
    }
}

/// `endAllocateToPool`, after the capture ended: the capture no longer routes
/// to `id`. When no capture routes any more, the frees held back go ahead and
/// released pools give back what they can. A pool no capture routes to is
/// `EMM_ERR_INVALID_ARGUMENT`.
pub(crate) fn end(device: c_int, id: PoolId) -> emm_status {
    let Some(d) = known_device(device) else {
        return invalid(format!(
            "emm_torch_graph_pool_end: {} was never begun",
            pool_name(device, id)
        ));
    };
    {
        let mut pools = lock(&d.graphs.pools);
        match pools.get_mut(&id) {
            Some(e) if e.routes > 0 => {
                e.routes -= 1;
                let _held = lock(&d.graphs.held);
                d.graphs.routing.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {
                return invalid(format!(
                    "emm_torch_graph_pool_end: no capture routes to {}",
                    pool_name(device, id)
                ))
            }
        }
    }
    let status = release_held(d);
    reclaim_after("emm_torch_graph_pool_end", d, status)
}

/// `releasePool`, when a graph captured with the pool is reset or destroyed:
/// one use fewer. When none is left the pool takes no more allocations, and its
/// segments go back once nothing in them is live (now if no capture runs, else
/// at the end of the captures, at `emm_torch_empty_cache` or when a later pool
/// call finds it so). A pool released before its capture ended (a capture that
/// failed) routes no more, and frees held for it go ahead. An unknown pool is
/// `EMM_ERR_INVALID_ARGUMENT`.
pub(crate) fn release(device: c_int, id: PoolId) -> emm_status {
    let unknown = || {
        invalid(format!(
            "emm_torch_graph_pool_release: no {}",
            pool_name(device, id)
        ))
    };
    let Some(d) = known_device(device) else {
        return unknown();
    };
    {
        let mut pools = lock(&d.graphs.pools);
        let Some(e) = pools.get_mut(&id) else {
            return unknown();
        };
        e.uses = e.uses.saturating_sub(1);
        if e.uses == 0 {
            if let Some(e) = pools.remove(&id) {
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
    }
    let status = release_held(d);
    reclaim_after("emm_torch_graph_pool_release", d, status)
}

/// An allocation of `size` bytes (not 0) on `device` ordered on `stream` from
/// the pool `id` (begun and not yet released), remembered by address like any
/// allocation of the hooks (freed by address, back into its pool); the address,
/// or the status of the failure (out of memory is `EMM_ERR_OUT_OF_MEMORY`: the
/// pool gives nothing back during a capture).
pub(crate) fn alloc(
    device: c_int,
    size: usize,
    stream: CUstream,
    id: PoolId,
) -> Result<u64, emm_status> {
    let Some(d) = known_device(device) else {
        return Err(invalid(format!(
            "emm_torch_graph_pool_alloc: no {}",
            pool_name(device, id)
        )));
    };
    let Some(pool) = lock(&d.graphs.pools).get(&id).map(|e| e.pool.clone()) else {
        return Err(invalid(format!(
            "emm_torch_graph_pool_alloc: no {} in use (begin it first)",
            pool_name(device, id)
        )));
    };
    match pool.alloc(size, stream) {
        Ok(a) => Ok(insert_live(d, a)),
        Err(e) => {
            let code = fail_alloc(e, size, d.manager.as_ref());
            let why = crate::status::last_error_message();
            Err(crate::status::set_error(
                code,
                format!("{}: {why}", pool_name(device, id)),
            ))
        }
    }
}

/// `checkPoolLiveAllocations`: the addresses of the blocks of pool `id` of
/// `device` handed out and not yet freed, in address order. A pool not in use
/// is `EMM_ERR_INVALID_ARGUMENT`.
pub(crate) fn live(device: c_int, id: PoolId) -> Result<Vec<u64>, emm_status> {
    let pool =
        known_device(device).and_then(|d| lock(&d.graphs.pools).get(&id).map(|e| e.pool.clone()));
    match pool {
        Some(pool) => Ok(pool.live_blocks()),
        None => Err(invalid(format!(
            "emm_torch_graph_pool_live: no {} in use",
            pool_name(device, id)
        ))),
    }
}

/// What a pool in use holds, and how many uses it has (`getPoolUseCount`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolInfo {
    /// Uses not yet released (`createOrIncrefPool` and `beginAllocateToPool`
    /// calls not matched by `releasePool`).
    pub(crate) uses: usize,
    /// The pool's figures.
    pub(crate) stats: GraphPoolStats,
}

/// The uses and figures of pool `id` of `device`; all zero for a pool that is
/// not in use (never made, or released by every user).
pub(crate) fn info(device: c_int, id: PoolId) -> PoolInfo {
    known_device(device)
        .and_then(|d| {
            lock(&d.graphs.pools).get(&id).map(|e| PoolInfo {
                uses: e.uses,
                stats: e.pool.stats(),
            })
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    //! The protocol in Rust over the stand-in (`test_driver.rs`), whose
    //! `capturing` knob makes a stream report that it captures.

    use super::*;
    use crate::bridge::devices::{live_alloc, live_free};
    use crate::bridge::test_driver::{standin, stat};
    use crate::status::{last_error_message, EMM_ERR_INVALID_ARGUMENT};
    use emm_core::stat_names as names;
    use emm_core::SYNC_STREAM;

    const MIB: usize = 1 << 20;

    fn control(command: &str) {
        let driver = emm_sys::driver().expect("the stand-in loads");
        driver
            .stand_in()
            .expect("the stand-in")
            .control(command)
            .expect("a knob the stand-in knows");
    }

    fn allocated(d: &LiveDevice) -> u64 {
        stat(d.manager.as_ref(), names::ALLOCATED_BYTES_CURRENT)
    }

    #[test]
    fn a_pool_serves_its_capture_holds_the_managers_frees_and_goes_back_after_its_last_release() {
        let _s = standin();
        let id = (41, 0);
        let d = live_device(0).unwrap();
        assert_eq!(end(0, id), EMM_ERR_INVALID_ARGUMENT, "never begun");
        assert!(
            last_error_message().contains("no capture routes to graph pool (41, 0) of device 0")
        );
        assert_eq!(
            alloc(0, MIB, SYNC_STREAM, id),
            Err(EMM_ERR_INVALID_ARGUMENT)
        );

        // A block of the manager's, freed while a capture runs on its stream.
        let m = live_alloc(0, MIB, SYNC_STREAM).unwrap();
        assert_eq!(begin(0, id), EMM_OK);
        assert_eq!(begin(0, id), EMM_OK, "a second graph shares the pool");
        assert!(d.graphs.routing());
        control(&format!("capturing {}", SYNC_STREAM.0 as u64));
        let g = alloc(0, MIB, SYNC_STREAM, id).unwrap();
        assert_eq!(live(0, id), Ok(vec![g]));
        let before = allocated(d);
        assert_eq!(live_free("test", 0, m, None), EMM_OK);
        assert_eq!(allocated(d), before, "a free on a capturing stream waits");
        assert_eq!(lock(&d.graphs.held).len(), 1);

        // The pool's own block goes back to the pool at once, even mid-capture.
        assert_eq!(live_free("test", 0, g, None), EMM_OK);
        assert_eq!(live(0, id), Ok(vec![]));
        control("capturing off");
        assert_eq!(end(0, id), EMM_OK);
        assert_eq!(end(0, id), EMM_OK);
        assert!(!d.graphs.routing());
        assert_eq!(
            allocated(d),
            before - MIB as u64,
            "the held free went ahead"
        );
        assert!(lock(&d.graphs.held).is_empty());

        // Two uses, two releases; the pool's segment goes back after the last.
        assert_eq!(release(0, id), EMM_OK);
        assert!(
            d.graphs.stats().segments > 0,
            "one graph still uses the pool"
        );
        assert_eq!(release(0, id), EMM_OK);
        let s = d.graphs.stats();
        assert_eq!((s.segments, s.reserved_bytes), (0, 0));
        assert_eq!(s.segment_allocs, s.segment_frees);
        assert_eq!(release(0, id), EMM_ERR_INVALID_ARGUMENT, "gone");
        assert_eq!(live(0, id), Err(EMM_ERR_INVALID_ARGUMENT));
    }

    #[test]
    fn a_pool_released_before_its_capture_ended_routes_no_more_and_frees_its_held_blocks() {
        let _s = standin();
        let id = (42, 1);
        let d = live_device(0).unwrap();
        let m = live_alloc(0, MIB, SYNC_STREAM).unwrap();
        assert_eq!(begin(0, id), EMM_OK);
        control(&format!("capturing {}", SYNC_STREAM.0 as u64));
        let g = alloc(0, 3 * MIB, SYNC_STREAM, id).unwrap();
        let before = allocated(d);
        assert_eq!(live_free("test", 0, m, None), EMM_OK);
        assert_eq!(allocated(d), before, "held");
        // The capture fails: PyTorch releases the pool without ending it.
        control("capturing off");
        assert_eq!(release(0, id), EMM_OK);
        assert!(!d.graphs.routing(), "a released pool routes no more");
        assert_eq!(
            allocated(d),
            before - MIB as u64,
            "the held free went ahead"
        );
        assert_eq!(
            end(0, id),
            EMM_ERR_INVALID_ARGUMENT,
            "a released pool cannot be ended"
        );
        // Its live block keeps the segment until it is freed; then it goes back.
        assert!(d.graphs.stats().segments > 0);
        assert_eq!(live_free("test", 0, g, None), EMM_OK);
        assert!(d.graphs.reclaim().unwrap() >= 3 * MIB);
        assert_eq!(d.graphs.stats().segments, 0);
        // The id begins a new pool.
        assert_eq!(begin(0, id), EMM_OK);
        assert_eq!(live(0, id), Ok(vec![]));
        assert_eq!(end(0, id), EMM_OK);
        assert_eq!(release(0, id), EMM_OK);
    }

    #[test]
    fn a_mem_pool_counts_its_uses_routes_only_while_used_and_gives_memory_back_when_it_dies() {
        let _s = standin();
        let id = (0, 77);
        let d = live_device(0).unwrap();
        assert_eq!(info(0, id), PoolInfo::default(), "never made");
        // MemPool(): one use, nothing routed.
        assert_eq!(create(0, id), EMM_OK);
        assert_eq!(info(0, id).uses, 1);
        assert!(!d.graphs.routing());
        // use_mem_pool: begin (a use and a route), allocations, end and release.
        assert_eq!(begin(0, id), EMM_OK);
        assert_eq!(info(0, id).uses, 2);
        assert!(d.graphs.routing());
        let p = alloc(0, 5 * MIB, SYNC_STREAM, id).unwrap();
        assert_eq!(end(0, id), EMM_OK);
        assert_eq!(release(0, id), EMM_OK);
        assert!(!d.graphs.routing());
        let i = info(0, id);
        assert_eq!(
            (i.uses, i.stats.live_bytes),
            (1, 5 * MIB),
            "the tensor outlives the `with`"
        );
        assert!(i.stats.reserved_bytes >= 5 * MIB);
        // The pool's blocks are the pool's: freed, they stay in it for its next use.
        assert_eq!(live_free("test", 0, p, None), EMM_OK);
        let i = info(0, id);
        assert_eq!(i.stats.live_bytes, 0);
        assert!(
            i.stats.reserved_bytes >= 5 * MIB,
            "kept for the pool's next use"
        );
        // The MemPool dies: its last release, then its memory goes back.
        let before = d.graphs.stats();
        assert_eq!(release(0, id), EMM_OK);
        assert_eq!(info(0, id), PoolInfo::default());
        let after = d.graphs.stats();
        assert!(after.reserved_bytes + 5 * MIB <= before.reserved_bytes);
        assert_eq!(release(0, id), EMM_ERR_INVALID_ARGUMENT, "released twice");
    }
}

//! The C functions of PyTorch's private-pool protocol (CUDA graphs and
//! `torch.cuda.MemPool`) for emm's allocator object (`emm_torch_graph_pool_*`):
//! each converts its arguments and calls the protocol in
//! `bridge/graph_capture.rs`, which works on the device's `GraphPools`
//! (`bridge/graph_pools.rs`, which describes the protocol).

use std::ffi::{c_int, c_void};

use crate::bridge::graph_capture::{self, pool_name};
use crate::ffi::stream_of;
use crate::guard::guard;
use crate::status::{emm_status, invalid, ssize_t, EMM_OK};

/// The uses and figures of one private pool ([`emm_torch_graph_pool_info`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct emm_graph_pool_info {
    /// Uses not yet released: `emm_torch_graph_pool_create` and
    /// `emm_torch_graph_pool_begin` calls not matched by
    /// `emm_torch_graph_pool_release` (PyTorch's `getPoolUseCount`).
    pub uses: usize,
    /// Bytes handed out from the pool and not yet freed (rounded sizes).
    pub live_bytes: usize,
    /// Blocks handed out and not yet freed.
    pub live_blocks: usize,
    /// Bytes of the segments the pool holds.
    pub reserved_bytes: usize,
    /// Segments the pool holds.
    pub segments: usize,
    /// The largest `live_bytes` so far.
    pub peak_live_bytes: usize,
    /// The largest `reserved_bytes` so far.
    pub peak_reserved_bytes: usize,
}

/// PyTorch's `createOrIncrefPool`, which `torch.cuda.MemPool()` calls: makes
/// the private pool `(pool_a, pool_b)` of `device` if it does not exist (an id
/// used again after every user released it gets a new pool) and counts one more
/// use of it; nothing is routed to it until [`emm_torch_graph_pool_begin`]
/// (`torch.cuda.use_mem_pool`). [`emm_torch_graph_pool_release`] ends the use;
/// after the last, the pool's memory goes back once nothing in it is live. A
/// device whose manager serves no device context is `EMM_ERR_UNSUPPORTED`.
/// Since ABI 312.
#[no_mangle]
pub extern "C" fn emm_torch_graph_pool_create(
    device: c_int,
    pool_a: u64,
    pool_b: u64,
) -> emm_status {
    guard(|| graph_capture::create(device, (pool_a, pool_b)))
}

/// The uses and figures of the private pool `(pool_a, pool_b)` of `device` into
/// `*out`: all zero for a pool not in use (never made, or released by every
/// user). A null `out` is `EMM_ERR_INVALID_ARGUMENT`. Since ABI 312.
#[no_mangle]
pub unsafe extern "C" fn emm_torch_graph_pool_info(
    device: c_int,
    pool_a: u64,
    pool_b: u64,
    out: *mut emm_graph_pool_info,
) -> emm_status {
    guard(|| {
        if out.is_null() {
            return invalid("emm_torch_graph_pool_info: `out` is null");
        }
        let i = graph_capture::info(device, (pool_a, pool_b));
        let info = emm_graph_pool_info {
            uses: i.uses,
            live_bytes: i.stats.live_bytes,
            live_blocks: i.stats.live_blocks,
            reserved_bytes: i.stats.reserved_bytes,
            segments: i.stats.segments,
            peak_live_bytes: i.stats.peak_live_bytes,
            peak_reserved_bytes: i.stats.peak_reserved_bytes,
        };
        // SAFETY: non-null (checked above) and writable per the contract.
        unsafe { out.write(info) };
        EMM_OK
    })
}

/// PyTorch's `beginAllocateToPool` for a CUDA graph capture or
/// `torch.cuda.use_mem_pool` (emm's allocator object): makes the private pool `(pool_a, pool_b)` of `device` if it does not
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
    guard(|| graph_capture::begin(device, (pool_a, pool_b)))
}

/// PyTorch's `endAllocateToPool`, after the capture ended: the capture no longer
/// routes to `(pool_a, pool_b)`. When no capture routes any more, the frees held
/// back go ahead and released pools give back what they can. A pool that was
/// never begun is `EMM_ERR_INVALID_ARGUMENT`. Since ABI 308.
#[no_mangle]
pub extern "C" fn emm_torch_graph_pool_end(device: c_int, pool_a: u64, pool_b: u64) -> emm_status {
    guard(|| graph_capture::end(device, (pool_a, pool_b)))
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
        let status = graph_capture::release(device, (pool_a, pool_b));
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
        match graph_capture::alloc(device, size, stream_of(stream), (pool_a, pool_b)) {
            Ok(ptr) => {
                out = ptr as *mut c_void;
                EMM_OK
            }
            Err(code) => code,
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
        let live = match graph_capture::live(device, (pool_a, pool_b)) {
            Ok(live) => live,
            Err(code) => return code,
        };
        for (i, &p) in live.iter().take(n).enumerate() {
            // SAFETY: `ptrs` holds `n` writable elements per the contract, and i < n.
            unsafe { *ptrs.add(i) = p as *mut c_void };
        }
        // SAFETY: non-null (checked above) and writable per the contract.
        unsafe { *count = live.len() };
        EMM_OK
    })
}

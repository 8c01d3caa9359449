//! PyTorch's memory tools over emm's own allocator object for PyTorch
//! (`python/emm/_torch_native.cpp`): what `torch.cuda.memory_stats()`,
//! `torch.cuda.reset_peak_memory_stats()`, `torch.cuda.empty_cache()` and cuDNN's
//! workspace sizing (the allocator's `cacheInfo`) ask of PyTorch's allocator,
//! answered by the manager behind `emm_torch_alloc` on each device.
//!
//! A device emm has not set up holds nothing of emm's: its counters read 0 and
//! the question sets nothing up (PyTorch's own allocator does not create a device
//! context to answer either). Only `emm_torch_cache_info`, asked right before a
//! workspace is allocated on the device, sets it up.

use std::ffi::{c_char, c_int, CStr};

use emm::emm_pool::GraphPoolStats;

use crate::bridge::devices::{device_manager, known_device_checked, known_devices, LiveDevice};
use crate::guard::guard;
use crate::status::{emm_status, fail, invalid, EMM_OK};
use emm_core::stat_names as stat;

/// The counter named `key` in `stats`, if the manager keeps one.
fn counter(stats: &[(&'static str, u64)], key: &str) -> Option<u64> {
    stats.iter().find(|(k, _)| *k == key).map(|&(_, v)| v)
}

/// The manager's counters with the device's CUDA graph pools added in: their
/// live and reserved bytes, blocks and segments count in the current values
/// (and in the peaks where that raises them), their segments in the device
/// allocations and frees.
fn device_stats(d: &LiveDevice) -> Vec<(&'static str, u64)> {
    let mut stats = d.manager.memory_stats();
    let g: GraphPoolStats = d.graphs.stats();
    if g.segment_allocs == 0 {
        return stats;
    }
    let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let add = |stats: &mut Vec<(&'static str, u64)>, (current, peak): (&str, &str), n: usize| {
        let mut now = None;
        for (k, v) in stats.iter_mut() {
            if *k == current {
                *v = v.saturating_add(as_u64(n));
                now = Some(*v);
            }
        }
        if let Some(now) = now {
            for (k, v) in stats.iter_mut() {
                if *k == peak {
                    *v = (*v).max(now);
                }
            }
        }
    };
    use stat::*;
    add(
        &mut stats,
        (ALLOCATED_BYTES_CURRENT, ALLOCATED_BYTES_PEAK),
        g.live_bytes,
    );
    add(
        &mut stats,
        (ACTIVE_BYTES_CURRENT, ACTIVE_BYTES_PEAK),
        g.live_bytes,
    );
    add(
        &mut stats,
        (RESERVED_BYTES_CURRENT, RESERVED_BYTES_PEAK),
        g.reserved_bytes,
    );
    add(
        &mut stats,
        (ALLOCATION_CURRENT, ALLOCATION_PEAK),
        g.live_blocks,
    );
    add(&mut stats, (SEGMENT_CURRENT, SEGMENT_PEAK), g.segments);
    for (k, v) in stats.iter_mut() {
        match *k {
            stat::NUM_DEVICE_ALLOC => *v = v.saturating_add(as_u64(g.segment_allocs)),
            stat::NUM_DEVICE_FREE => *v = v.saturating_add(as_u64(g.segment_frees)),
            _ => {}
        }
    }
    stats
}

/// `torch.cuda.memory_stats(device)`: the counters named `keys[0..n]` (as
/// `emm_memory_stat` names them, e.g. stat::ALLOCATED_BYTES_PEAK) of the manager
/// behind `emm_torch_alloc` on `device`, read at one moment, into `values[0..n]`.
/// The device's CUDA graph pools count in (`emm_torch_graph_pool_begin`: their
/// live and reserved bytes in the current values, their segments in the device
/// allocations). A name the manager does not keep reads 0, and so does every name on a device
/// emm has not set up (which this does not set up); `*found` (may be NULL) gets
/// how many of the names the manager keeps. A null `keys` or `values` with `n > 0`,
/// a null name, or a device outside `0..64` is `EMM_ERR_INVALID_ARGUMENT`, and
/// `values` is then unspecified. Since ABI 307.
#[no_mangle]
pub unsafe extern "C" fn emm_torch_memory_stats(
    device: c_int,
    keys: *const *const c_char,
    values: *mut u64,
    n: usize,
    found: *mut usize,
) -> emm_status {
    guard(|| {
        if n > 0 && (keys.is_null() || values.is_null()) {
            return invalid("emm_torch_memory_stats: `keys` or `values` is null");
        }
        let d = match known_device_checked(device) {
            Ok(d) => d,
            Err(code) => return code,
        };
        let stats = d.map(device_stats).unwrap_or_default();
        let mut hits = 0;
        for i in 0..n {
            // SAFETY: `keys` and `values` hold `n` elements each per the contract
            // (both non-null when n > 0, checked above).
            let (key, out) = unsafe { (*keys.add(i), values.add(i)) };
            if key.is_null() {
                return invalid(format!("emm_torch_memory_stats: name {i} of {n} is null"));
            }
            // (A name that is not UTF-8 is no name of emm's: it reads 0.)
            // SAFETY: non-null names are NUL-terminated strings per the contract.
            let key = unsafe { CStr::from_ptr(key) }.to_str().unwrap_or_default();
            let v = counter(&stats, key);
            hits += usize::from(v.is_some());
            // SAFETY: `out` is element i of `values`, writable per the contract.
            unsafe { *out = v.unwrap_or(0) };
        }
        if !found.is_null() {
            // SAFETY: non-null and writable per the contract.
            unsafe { *found = hits };
        }
        EMM_OK
    })
}

/// `torch.cuda.reset_peak_memory_stats(device)`: sets every peak counter of the
/// manager behind `emm_torch_alloc` on `device` to its current value. A device
/// emm has not set up has nothing to reset; one outside `0..64` is
/// `EMM_ERR_INVALID_ARGUMENT`. Since ABI 307.
#[no_mangle]
pub extern "C" fn emm_torch_reset_peak_stats(device: c_int) -> emm_status {
    guard(|| match known_device_checked(device) {
        Ok(Some(d)) => {
            d.manager.reset_peak_stats();
            EMM_OK
        }
        Ok(None) => EMM_OK,
        Err(code) => code,
    })
}

/// `torch.cuda.empty_cache()`: gives back what the manager behind
/// `emm_torch_alloc` holds idle on `device`, on every device emm has set up when
/// `device` is -1 (the manager's `release_cached`: its idle device memory, and the
/// pinned host and managed memory it caches), and the segments of CUDA graph
/// pools that every graph released and nothing in them lives (none while a
/// capture runs), after freeing again the blocks whose free by address the
/// manager refused (a driver call failed; see `emm_torch_release`);
/// `*released` (may be NULL) gets the bytes given back, of all five. Every
/// device is tried; the status is the first failure's. A device emm has not set up holds nothing; one outside `-1..64` is
/// `EMM_ERR_INVALID_ARGUMENT`. Since ABI 307.
#[no_mangle]
pub unsafe extern "C" fn emm_torch_empty_cache(device: c_int, released: *mut usize) -> emm_status {
    guard(|| {
        if device < -1 {
            return invalid(format!(
                "emm_torch_empty_cache: device {device} is neither -1 (every device) nor in 0..64"
            ));
        }
        let devices: Vec<&LiveDevice> = if device == -1 {
            known_devices().collect()
        } else {
            match known_device_checked(device) {
                Ok(d) => d.into_iter().collect(),
                Err(code) => return code,
            }
        };
        let mut total = 0usize;
        let mut status = EMM_OK;
        for d in devices {
            // Blocks whose free was refused first: what they free can go back too.
            for result in [
                d.refused.retry(),
                d.manager.release_cached(),
                d.graphs.reclaim(),
            ] {
                match result {
                    Ok(n) => total = total.saturating_add(n),
                    Err(e) if status == EMM_OK => status = fail(e),
                    Err(e) => tracing::warn!("emm_torch_empty_cache: {e}"),
                }
            }
        }
        if !released.is_null() {
            // SAFETY: non-null and writable per the contract.
            unsafe { *released = total };
        }
        status
    })
}

/// The allocator's `cacheInfo`, which cuDNN asks to bound the workspace it
/// allocates next: into `*largest`, the larger of the device's free memory and the
/// bytes the manager behind `emm_torch_alloc` holds reserved but not in use on
/// `device` (what an allocation can get once the manager's out-of-memory ladder
/// has given idle memory back; PyTorch's own allocator answers the larger of the
/// free memory and its largest cached block). Sets the device up when emm has not
/// yet. Since ABI 307.
#[no_mangle]
pub unsafe extern "C" fn emm_torch_cache_info(device: c_int, largest: *mut usize) -> emm_status {
    guard(|| {
        if largest.is_null() {
            return invalid("emm_torch_cache_info: `largest` is null");
        }
        let m = match device_manager(device) {
            Ok(m) => m,
            Err(code) => return code,
        };
        let free = match m.get_memory_info() {
            Ok(info) => info.free,
            Err(e) => return fail(e),
        };
        let stats = m.memory_stats();
        let reserved = counter(&stats, stat::RESERVED_BYTES_CURRENT).unwrap_or(0);
        let active = counter(&stats, stat::ACTIVE_BYTES_CURRENT).unwrap_or(0);
        let idle = usize::try_from(reserved.saturating_sub(active)).unwrap_or(usize::MAX);
        // SAFETY: non-null (checked above) and writable per the contract.
        unsafe { *largest = free.max(idle) };
        EMM_OK
    })
}

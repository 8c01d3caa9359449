//! The devices the allocator hooks of frameworks that free by address serve
//! (PyTorch's pluggable allocator and emm's own object, CuPy's C-function
//! allocator): each device's manager, the map from address to live allocation
//! (which remembers its manager and stream), the other streams an allocation is
//! used on, and the frees a CUDA graph capture holds back. The manager is the
//! process's: `EMM_MEMORY_MANAGER`, else the one configured, else `pool`. Pure
//! Rust: the shims in `torch.rs`, `cupy.rs`, `graph_hooks.rs` and
//! `torch_tools.rs` turn C arguments into these calls.

use std::ffi::c_int;
use std::sync::{Arc, Mutex, OnceLock};

use emm_core::{DeviceAllocation, EmmError, MemoryManager};
use emm_sys::{CUresult, CUstream};

use super::graph_pools::GraphPools;
use super::live_table::LiveTable;
use super::refused_frees::RefusedFrees;
use super::stream_uses::{self, StreamUses};
use crate::ffi::lock;
use crate::ffi::manager_for;
use crate::status::{emm_status, fail, fail_alloc, invalid, EMM_OK};

/// One device's manager and the allocations handed out by address.
pub(crate) struct LiveDevice {
    pub(crate) manager: Arc<dyn MemoryManager>,
    live: Mutex<LiveTable<DeviceAllocation>>,
    /// Other streams live allocations are used on (`emm_torch_record_stream`);
    /// changed only with `live` locked.
    uses: StreamUses,
    /// The private pools of CUDA graph captures, and the frees held back while a
    /// capture runs.
    pub(crate) graphs: GraphPools,
    /// Blocks whose free the manager refused, freed again later.
    pub(crate) refused: RefusedFrees,
}

const LIVE_DEVICES: usize = 64;

/// Each device's state once made (see [`live_device`]).
static DEVICES: [Slot; LIVE_DEVICES] = [const { OnceLock::new() }; LIVE_DEVICES];

/// One device's state once made. A failure to make it is not kept: the next
/// call tries again, so a fault that clears (a driver call refused once) does
/// not leave the device without the hooks for the life of the process.
type Slot = OnceLock<LiveDevice>;

/// The slot of `device`; `None` outside `0..64`.
pub(crate) fn slot(device: c_int) -> Option<&'static Slot> {
    usize::try_from(device).ok().and_then(|d| DEVICES.get(d))
}

/// `EMM_ERR_INVALID_ARGUMENT` for a device past the slots.
pub(crate) fn out_of_range(device: c_int) -> emm_status {
    invalid(format!("device {device} is outside 0..{LIVE_DEVICES}"))
}

/// Whether a CUDA graph capture routes allocations on any device set up (a
/// pause must wait for it: it synchronizes the device, which would invalidate
/// the capture).
pub(crate) fn any_capture_routing() -> bool {
    DEVICES
        .iter()
        .filter_map(set_up)
        .any(|d| d.graphs.routing())
}

/// The state in `slot` if the device was set up, without setting it up.
pub(crate) fn set_up(slot: &'static Slot) -> Option<&'static LiveDevice> {
    slot.get()
}

/// The device's state, created on first use, or the status of why it cannot be
/// now (recorded for `emm_last_error`): a device outside `0..64`, or no manager
/// could be made, which the next call tries again. Two threads making it at once
/// both ask for the device's manager (the process's one, `emm::memory_manager`);
/// one state is kept.
pub(crate) fn live_device(device: c_int) -> Result<&'static LiveDevice, emm_status> {
    let Some(slot) = slot(device) else {
        return Err(out_of_range(device));
    };
    if let Some(d) = slot.get() {
        return Ok(d);
    }
    let (manager, _) = manager_for(None, device).map_err(fail)?;
    Ok(slot.get_or_init(|| LiveDevice {
        manager,
        live: Mutex::new(LiveTable::default()),
        uses: StreamUses::default(),
        graphs: GraphPools::default(),
        refused: RefusedFrees::default(),
    }))
}

/// The state of `device` if emm has set it up (an allocation was asked for on
/// it), without setting it up.
pub(crate) fn known_device(device: c_int) -> Option<&'static LiveDevice> {
    slot(device).and_then(set_up)
}

/// The state of `device` if emm has set the device up for the allocator hooks,
/// without setting it up (`None`: nothing of emm's is on it); a device outside
/// `0..64` is `EMM_ERR_INVALID_ARGUMENT`.
pub(crate) fn known_device_checked(
    device: c_int,
) -> Result<Option<&'static LiveDevice>, emm_status> {
    let slot = slot(device).ok_or_else(|| out_of_range(device))?;
    Ok(set_up(slot))
}

/// The manager of `device` for the allocator hooks, setting the device up when
/// it is not yet; the status of why it cannot be otherwise.
pub(crate) fn device_manager(device: c_int) -> Result<&'static dyn MemoryManager, emm_status> {
    live_device(device).map(|d| d.manager.as_ref())
}

/// Every device emm has set up for the allocator hooks, in device order.
pub(crate) fn known_devices() -> impl Iterator<Item = &'static LiveDevice> {
    DEVICES.iter().filter_map(set_up)
}

/// Allocates `size` bytes on `device` ordered on `stream` and remembers the
/// allocation by address; the address (0 for size 0), or the status of the failure.
pub(crate) fn live_alloc(device: c_int, size: usize, stream: CUstream) -> Result<u64, emm_status> {
    let d = live_device(device)?;
    match emm_core::alloc_from(d.manager.as_ref(), size, stream) {
        Ok(a) if size == 0 => Ok(a.ptr()),
        Ok(a) => Ok(insert_live(d, a)),
        Err(e) => Err(fail_alloc(e, size, d.manager.as_ref())),
    }
}

/// Remembers `a` (not empty) among `d`'s live allocations; its address.
pub(crate) fn insert_live(d: &LiveDevice, a: DeviceAllocation) -> u64 {
    let ptr = a.ptr();
    lock(&d.live).insert(ptr, a);
    ptr
}

/// Frees an allocation of `live_alloc` by address: ordered on `stream`, or on the
/// stream it was allocated on when `stream` is `None`, after the work queued so far
/// on every other stream it was used on (`emm_torch_record_stream`).
pub(crate) fn live_free(
    what: &str,
    device: c_int,
    ptr: u64,
    stream: Option<CUstream>,
) -> emm_status {
    let d = match live_device(device) {
        Ok(d) => d,
        Err(code) => return code,
    };
    free_known(what, d, ptr, stream).unwrap_or_else(|| {
        invalid(format!(
            "{what}: {ptr:#x} is not an emm allocation of device {device}"
        ))
    })
}

/// Frees `ptr` if it is one of `d`'s live allocations (see [`live_free`]);
/// `None` when it is not. A block whose free was refused is not live: it is
/// emm's, freed again by emm (see [`RefusedFrees`]), and freeing its address
/// again is the caller's double free (once emm has freed it, the address may
/// be another block's).
pub(crate) fn free_known(
    what: &str,
    d: &LiveDevice,
    ptr: u64,
    stream: Option<CUstream>,
) -> Option<emm_status> {
    let (a, used_on) = take_live(d, ptr)?;
    Some(release_taken(what, d, a, used_on, stream))
}

/// [`live_free`] on the allocation's own stream, on whichever device whose state
/// exists holds `ptr` (the devices in order).
pub(crate) fn live_free_any(what: &str, ptr: u64) -> emm_status {
    for d in DEVICES.iter().filter_map(set_up) {
        if let Some(code) = free_known(what, d, ptr, None) {
            return code;
        }
    }
    invalid(format!(
        "{what}: {ptr:#x} is not an emm allocation of any device"
    ))
}

/// Takes the live allocation at `ptr` out of `d`'s table, with the other streams
/// it was used on. The lock is released on return, before the allocation is
/// dropped (freed).
pub(crate) fn take_live(d: &LiveDevice, ptr: u64) -> Option<(DeviceAllocation, Vec<CUstream>)> {
    let mut live = lock(&d.live);
    let a = live.remove(ptr)?;
    let used_on = d.uses.take(ptr);
    Some((a, used_on))
}

/// Frees `a`, taken out of `d`'s table: ordered on `stream` (its own when `None`),
/// after the work queued so far on each of `used_on`.
pub(crate) fn release_taken(
    what: &str,
    d: &LiveDevice,
    mut a: DeviceAllocation,
    used_on: Vec<CUstream>,
    stream: Option<CUstream>,
) -> emm_status {
    if let Some(s) = stream {
        a.set_stream(s);
    }
    if d.graphs.routing() {
        match d.graphs.hold_if_capturing(d.manager.context(), a, used_on) {
            None => return EMM_OK, // freed when the capture on its stream ends
            Some(back) => return release_now(what, d, back.a, &back.used_on),
        }
    }
    release_now(what, d, a, &used_on)
}

/// Frees `a` now: after the work queued so far on each of `used_on`, ordered on
/// its stream. Where that work cannot be waited for (a stream handle that is dead
/// or was never one, a failing event), see [`release_after_device_sync`].
pub(crate) fn release_now(
    what: &str,
    d: &LiveDevice,
    a: DeviceAllocation,
    used_on: &[CUstream],
) -> emm_status {
    match wait_for_other_streams(what, d, &a, used_on) {
        Ok(()) => free_or_keep(what, d, a),
        Err(e) => release_after_device_sync(what, d, a, used_on, &e),
    }
}

/// Frees `a` (its stream's order arranged): `EMM_OK`, or, where the manager
/// refuses (a driver call failed), the refusal's status, with `a` kept by
/// [`RefusedFrees`] and freed again later. First, when due, blocks refused
/// before are freed again (a failure there is logged: this call's status is
/// its own).
fn free_or_keep(what: &str, d: &LiveDevice, a: DeviceAllocation) -> emm_status {
    if let Err(e) = d.refused.retry_if_due() {
        let (n, bytes) = d.refused.held();
        tracing::warn!(
            "{what}: {n} blocks ({bytes} bytes) whose free was refused were refused again ({e}); emm keeps them and tries again"
        );
    }
    let ptr = a.ptr();
    match a.free() {
        Ok(()) => EMM_OK,
        Err(refused) => {
            let e = d.refused.keep(*refused);
            refused_status(what, ptr, &e)
        }
    }
}

/// The status of a free of `ptr` the manager refused with `e`, the block kept.
fn refused_status(what: &str, ptr: u64, e: &EmmError) -> emm_status {
    crate::status::set_error(
        crate::status::code_of(e),
        format!(
            "{what}: freeing {ptr:#x} failed ({e}); emm keeps the block and frees it again itself (on a later free on its device, or at emm_torch_empty_cache): do not free the address again"
        ),
    )
}

/// The fallback of [`release_now`] when the work of a stream `a` was used on
/// could not be waited for (`why`): once the whole device is idle
/// (`cuCtxSynchronize`) no stream's work uses `a`, and it is freed on its own
/// stream (`EMM_OK`; a warning says what happened). While a CUDA graph capture
/// may run, the device is not synchronized (that would invalidate the capture):
/// the free is held until the captures end, as frees on capturing streams are.
/// Where the synchronization fails too, `a` goes back into the live table, still
/// noted as used on `used_on`, and the status says why: releasing it again later
/// frees it. The block is never lost, and never reused while in use.
pub(crate) fn release_after_device_sync(
    what: &str,
    d: &LiveDevice,
    a: DeviceAllocation,
    used_on: &[CUstream],
    why: &EmmError,
) -> emm_status {
    let (ptr, size) = (a.ptr(), a.size());
    let Some(ctx) = d.manager.context() else {
        // No device work to wait for (see `wait_for_other_streams`).
        return free_or_keep(what, d, a);
    };
    let a = match d.graphs.hold_until_captures_end(a, used_on.to_vec()) {
        None => {
            tracing::warn!(
                "{what}: {ptr:#x} ({size} bytes) is used on other streams {used_on:?}, whose work could not be waited for ({why}); it is freed once the CUDA graph captures running now end"
            );
            return EMM_OK;
        }
        Some(back) => back.a,
    };
    match ctx.synchronize_keeping_deferred() {
        Ok(()) => {
            tracing::warn!(
                "{what}: {ptr:#x} ({size} bytes) is used on other streams {used_on:?}, whose work could not be waited for ({why}); it was freed after synchronizing the device"
            );
            free_or_keep(what, d, a)
        }
        Err(sync) => {
            {
                let mut live = lock(&d.live);
                live.insert(ptr, a);
                for &s in used_on {
                    d.uses.note(ptr, s);
                }
            }
            let msg = format!(
                "{what}: {ptr:#x} ({size} bytes) is used on other streams {used_on:?}, whose work could not be waited for ({why}), and synchronizing the device failed too ({sync}); the block is kept, live and unused: release it again once the device recovers"
            );
            tracing::error!("{msg}");
            crate::status::set_error(crate::status::code_of(&EmmError::Driver(sync)), msg)
        }
    }
}

/// Makes the stream `a` is freed on wait for the work queued so far on each of
/// `used_on` (nothing to do when it is empty, or for a manager without a device
/// context, which runs no device work). The error when that work could not be
/// waited for.
pub(crate) fn wait_for_other_streams(
    what: &str,
    d: &LiveDevice,
    a: &DeviceAllocation,
    used_on: &[CUstream],
) -> Result<(), EmmError> {
    if used_on.is_empty() {
        return Ok(());
    }
    let Some(ctx) = d.manager.context() else {
        tracing::debug!(
            "{what}: manager `{}` has no context; the uses of {:#x} on other streams are not waited for",
            d.manager.name(),
            a.ptr()
        );
        return Ok(());
    };
    stream_uses::join(ctx, a.stream(), used_on)
}

/// Notes that the live allocation at `ptr` of `device` is used on `stream` as
/// well as on its own: its free then waits for the work queued on `stream`. The
/// stream is checked first (`cuStreamIsCapturing`, a query that is allowed during
/// a capture and changes nothing; the default streams are not asked): a handle the
/// driver does not know is `EMM_ERR_INVALID_ARGUMENT` and is not noted, so the free
/// never waits on it. The driver answers for streams it knows and for destroyed
/// ones; a pointer that was never a stream may crash a real driver before it
/// answers, as any driver call given one may.
pub(crate) fn live_record_stream(device: c_int, ptr: u64, stream: CUstream) -> emm_status {
    let d = match live_device(device) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let not_live = || {
        invalid(format!(
            "emm_torch_record_stream: {ptr:#x} is not the address of a live emm allocation of device {device}"
        ))
    };
    match lock(&d.live).get(ptr) {
        Some(a) if a.stream() == stream => return EMM_OK,
        Some(_) => {}
        None => return not_live(),
    }
    // The default streams (null, legacy, per-thread) always exist, and asking
    // about the legacy one during a capture in another stream is an error of its
    // own (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`): only created streams are asked.
    let default_stream = [
        emm_sys::CUstream(std::ptr::null_mut()),
        emm_sys::CU_STREAM_LEGACY,
        emm_sys::CU_STREAM_PER_THREAD,
    ]
    .contains(&stream);
    if let Some(ctx) = d.manager.context().filter(|_| !default_stream) {
        if let Err(e) = emm_driver::stream_is_capturing(ctx, stream) {
            let unknown = matches!(
                e.code(),
                Some(CUresult::ERROR_INVALID_HANDLE | CUresult::ERROR_INVALID_VALUE)
            );
            let found = format!("{stream:?}, which the driver refused ({e})");
            let err = EmmError::InvalidArgument {
                what: "stream for emm_torch_record_stream",
                found,
                expected: format!(
                    "a live stream of device {device}'s context, or a default stream; nothing was recorded for {ptr:#x}"
                ),
            };
            return if unknown {
                fail(err)
            } else {
                crate::status::set_error(crate::status::EMM_ERR_DRIVER, err.to_string())
            };
        }
    }
    // Checked without the table locked (a driver call): the allocation may have
    // been freed meanwhile.
    let live = lock(&d.live);
    if live.get(ptr).is_none() {
        return not_live();
    }
    d.uses.note(ptr, stream);
    EMM_OK
}

#[cfg(test)]
mod tests {
    //! The bridge in Rust, over the stand-in driver (`test_driver.rs`): the
    //! devices' tables, frees by address on any device, the other streams an
    //! allocation is used on.

    use super::*;
    use crate::bridge::test_driver::{standin, stat};
    use crate::status::{last_error_message, EMM_ERR_INVALID_ARGUMENT};

    fn allocated(d: &LiveDevice) -> u64 {
        stat(
            d.manager.as_ref(),
            emm_core::stat_names::ALLOCATED_BYTES_CURRENT,
        )
    }

    #[test]
    fn allocations_are_freed_by_address_once_on_the_device_that_holds_them() {
        let _s = standin();
        assert!(known_device_checked(LIVE_DEVICES as c_int).is_err());
        assert_eq!(
            live_alloc(-1, 16, emm_core::SYNC_STREAM),
            Err(EMM_ERR_INVALID_ARGUMENT)
        );
        let ptr = live_alloc(0, 3 << 20, emm_core::SYNC_STREAM).unwrap();
        let d = known_device(0).expect("set up by the allocation");
        assert!(allocated(d) >= 3 << 20);
        assert_eq!(
            live_alloc(0, 0, emm_core::SYNC_STREAM),
            Ok(0),
            "size 0: no block"
        );
        // Another address of no block, then the block itself, then it again.
        let code = live_free("test", 0, ptr + 4096, None);
        assert_eq!(code, EMM_ERR_INVALID_ARGUMENT);
        assert!(last_error_message().contains("is not an emm allocation of device 0"));
        let before = allocated(d);
        assert_eq!(live_free_any("test", ptr), EMM_OK);
        assert_eq!(allocated(d), before - (3 << 20));
        assert_eq!(live_free_any("test", ptr), EMM_ERR_INVALID_ARGUMENT);
        assert!(last_error_message().contains("of any device"));
        assert!(!any_capture_routing());
    }

    #[test]
    fn a_block_used_on_another_stream_is_freed_after_that_streams_work() {
        let _s = standin();
        let d = live_device(0).unwrap();
        let ctx = d
            .manager
            .context()
            .expect("a device manager has a context")
            .clone();
        let side = emm_driver::Stream::new(&ctx).unwrap();
        let ptr = live_alloc(0, 1 << 20, emm_core::SYNC_STREAM).unwrap();
        assert_eq!(live_record_stream(0, ptr, side.raw()), EMM_OK);
        // Noted once per stream; the default streams are never noted.
        assert_eq!(live_record_stream(0, ptr, side.raw()), EMM_OK);
        assert_eq!(live_record_stream(0, ptr, emm_core::SYNC_STREAM), EMM_OK);
        let (taken, used_on) = take_live(d, ptr).expect("live");
        assert_eq!(used_on, vec![side.raw()]);
        lock(&d.live).insert(ptr, taken);
        d.uses.note(ptr, side.raw());
        let before = allocated(d);
        let s = emm_sys::driver().unwrap().stand_in().expect("the stand-in");
        let waits = s.calls("cuStreamWaitEvent").unwrap();
        assert_eq!(live_free("test", 0, ptr, None), EMM_OK);
        assert_eq!(
            s.calls("cuStreamWaitEvent").unwrap(),
            waits + 1,
            "the free is ordered after the side stream's work"
        );
        assert_eq!(allocated(d), before - (1 << 20));
        assert!(take_live(d, ptr).is_none(), "freed once");
        // An address emm never handed out cannot be recorded.
        assert_eq!(
            live_record_stream(0, 0x1000, side.raw()),
            EMM_ERR_INVALID_ARGUMENT
        );
    }
}

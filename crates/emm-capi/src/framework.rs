//! Allocator hooks of frameworks that free by address: PyTorch's pluggable
//! allocator (`emm_torch_alloc`/`emm_torch_free`) and CuPy's C-function allocator
//! (`emm_cupy_malloc`/`emm_cupy_free`).
//!
//! Both hand emm a bare address to free, so each device keeps a map from address to
//! the live allocation (which remembers its manager and stream). The manager is the
//! process's: `EMM_MEMORY_MANAGER`, else the one configured, else `pool`.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use emm_core::{DeviceAllocation, EmmError, MemoryManager};
use emm_sys::{CUresult, CUstream};

use crate::ffi::{lock, stream_of};
use crate::graph_pools::GraphPools;
use crate::live_table::LiveTable;
use crate::manager::manager_for;
use crate::status::{
    emm_status, fail, fail_alloc, guard, invalid, ssize_t, EMM_ERR_INVALID_ARGUMENT,
    EMM_ERR_OUT_OF_MEMORY, EMM_OK,
};
use crate::stream_uses::{self, StreamUses};
use crate::timing::{self, Hook};

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
}

const LIVE_DEVICES: usize = 64;

/// Each device's state once made (see [`live_device`]).
static DEVICES: [Slot; LIVE_DEVICES] = [const { OnceLock::new() }; LIVE_DEVICES];

/// One device's state once made, or why it could not be.
type Slot = OnceLock<Result<LiveDevice, (emm_status, String)>>;

/// The slot of `device`; `None` outside `0..64`.
fn slot(device: c_int) -> Option<&'static Slot> {
    usize::try_from(device).ok().and_then(|d| DEVICES.get(d))
}

/// `EMM_ERR_INVALID_ARGUMENT` for a device past the slots.
fn out_of_range(device: c_int) -> emm_status {
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
fn set_up(slot: &'static Slot) -> Option<&'static LiveDevice> {
    slot.get()?.as_ref().ok()
}

/// The device's state, created on first use, or the status of why it cannot be
/// (recorded again for `emm_last_error` at every call, as each caller needs it): a
/// device outside `0..64`, or no manager could be made.
pub(crate) fn live_device(device: c_int) -> Result<&'static LiveDevice, emm_status> {
    let Some(slot) = slot(device) else {
        return Err(out_of_range(device));
    };
    let state = slot.get_or_init(|| match manager_for(None, device) {
        Ok((manager, _)) => Ok(LiveDevice {
            manager,
            live: Mutex::new(LiveTable::default()),
            uses: StreamUses::default(),
            graphs: GraphPools::default(),
        }),
        Err(e) => {
            let code = fail(e);
            let msg = crate::status::last_error_message();
            Err((code, msg))
        }
    });
    match state {
        Ok(d) => Ok(d),
        Err((code, msg)) => Err(crate::status::set_error(*code, msg.clone())),
    }
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
fn live_alloc(device: c_int, size: usize, stream: CUstream) -> Result<u64, emm_status> {
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
fn live_free(what: &str, device: c_int, ptr: u64, stream: Option<CUstream>) -> emm_status {
    let d = match live_device(device) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let Some((a, used_on)) = take_live(d, ptr) else {
        return invalid(format!(
            "{what}: {ptr:#x} is not an emm allocation of device {device}"
        ));
    };
    release_taken(what, d, a, used_on, stream)
}

/// [`live_free`] on the allocation's own stream, on whichever device whose state
/// exists holds `ptr` (the devices in order).
fn live_free_any(what: &str, ptr: u64) -> emm_status {
    for d in DEVICES.iter().filter_map(set_up) {
        if let Some((a, used_on)) = take_live(d, ptr) {
            return release_taken(what, d, a, used_on, None);
        }
    }
    invalid(format!(
        "{what}: {ptr:#x} is not an emm allocation of any device"
    ))
}

/// Takes the live allocation at `ptr` out of `d`'s table, with the other streams
/// it was used on. The lock is released on return, before the allocation is
/// dropped (freed).
fn take_live(d: &LiveDevice, ptr: u64) -> Option<(DeviceAllocation, Vec<CUstream>)> {
    let mut live = lock(&d.live);
    let a = live.remove(ptr)?;
    let used_on = d.uses.take(ptr);
    Some((a, used_on))
}

/// Frees `a`, taken out of `d`'s table: ordered on `stream` (its own when `None`),
/// after the work queued so far on each of `used_on`.
fn release_taken(
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
        Ok(()) => {
            drop(a);
            EMM_OK
        }
        Err(e) => release_after_device_sync(what, d, a, used_on, &e),
    }
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
fn release_after_device_sync(
    what: &str,
    d: &LiveDevice,
    a: DeviceAllocation,
    used_on: &[CUstream],
    why: &EmmError,
) -> emm_status {
    let (ptr, size) = (a.ptr(), a.size());
    let Some(ctx) = d.manager.context() else {
        drop(a); // no device work to wait for (see `wait_for_other_streams`)
        return EMM_OK;
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
            drop(a);
            EMM_OK
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
fn wait_for_other_streams(
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
fn live_record_stream(device: c_int, ptr: u64, stream: CUstream) -> emm_status {
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

/// PyTorch's pluggable allocator (`torch.cuda.memory.CUDAPluggableAllocator`), on
/// the process's manager (`EMM_MEMORY_MANAGER`, else the one configured, else
/// "pool"): allocates `size` bytes on `device` ordered on `stream`. Returns NULL on
/// failure; `emm_last_error` says why. (emm's own allocator object, which
/// `emm.torch.install()` sets up, raises `torch.OutOfMemoryError` with that reason;
/// PyTorch's `CUDAPluggableAllocator` does not check, and hands out a tensor at
/// address 0.)
#[no_mangle]
pub extern "C" fn emm_torch_alloc(
    size: ssize_t,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let mut out: *mut c_void = core::ptr::null_mut();
    let _ = timing::timed(Hook::Alloc, || {
        guard(|| {
            let Ok(size) = usize::try_from(size) else {
                return invalid(format!("emm_torch_alloc: negative size {size}"));
            };
            match live_alloc(device, size, stream_of(stream)) {
                Ok(p) => {
                    out = p as *mut c_void;
                    EMM_OK
                }
                Err(code) => code,
            }
        })
    });
    out
}

/// PyTorch's pluggable allocator: frees `ptr` from `emm_torch_alloc`, ordered on
/// `stream` (`size` is not needed: emm knows it).
#[no_mangle]
pub extern "C" fn emm_torch_free(
    ptr: *mut c_void,
    size: ssize_t,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = size; // named in the generated header; emm knows each block's size
    let _ = timing::timed(Hook::Free, || {
        guard(|| {
            if ptr.is_null() {
                return EMM_OK;
            }
            live_free(
                "emm_torch_free",
                device,
                ptr as u64,
                Some(stream_of(stream)),
            )
        })
    });
}

/// Frees `ptr` from [`emm_torch_alloc`] on `device` (-1: whichever device holds
/// it), ordered on the stream it was allocated on, after the work queued so far on
/// every other stream it was used on ([`emm_torch_record_stream`]): the deleter of
/// the tensors of emm's own PyTorch allocator object (`emm.torch.install()`, built
/// from `python/emm/_torch_native.cpp`), which knows neither the size nor the
/// stream, and cannot pass a status on. A null `ptr` does nothing; an address emm
/// did not hand out on that device (or on any, for -1) is
/// `EMM_ERR_INVALID_ARGUMENT` and frees nothing (a device emm never used is not
/// set up for it). Where the work of a stream it was used on cannot be waited
/// for (the stream was destroyed), the block is freed after a synchronization of
/// the device (or, while a CUDA graph capture runs, once the captures end), with a
/// warning; only if that fails too is the status an error, and the block then
/// stays live for a later release. Every failure is also logged as a warning
/// (`EMM_LOG`). Since ABI 306.
#[no_mangle]
pub extern "C" fn emm_torch_release(ptr: *mut c_void, device: c_int) -> emm_status {
    timing::timed(Hook::Free, || {
        let code = guard(|| {
            if ptr.is_null() {
                return EMM_OK;
            }
            let what = "emm_torch_release";
            if device == -1 {
                return live_free_any(what, ptr as u64);
            }
            // Only a device emm has set up can hold it (a free sets none up).
            let known = known_device(device);
            match known.and_then(|d| Some((d, take_live(d, ptr as u64)?))) {
                Some((d, (a, used_on))) => release_taken(what, d, a, used_on, None),
                None => invalid(format!(
                    "{what}: {:#x} is not an emm allocation of device {device}",
                    ptr as u64
                )),
            }
        });
        if code != EMM_OK {
            let msg = crate::status::last_error_message();
            tracing::warn!("a tensor's free failed: {msg}");
        }
        code
    })
}

/// PyTorch's `Tensor.record_stream`: the allocation at `ptr` (from
/// `emm_torch_alloc` on `device`; the base address of the tensor's storage) is
/// used on `stream` as well as on the stream it was allocated on. Its free then
/// makes its own stream wait for the work queued on `stream` up to that moment
/// (an event and `cuStreamWaitEvent`; nothing blocks on the host), so the memory
/// is not reused while that work may still touch it. PyTorch's pluggable allocator
/// does not forward `record_stream` calls (it has no Python setting for them), so
/// `emm.torch.install()` routes `torch.Tensor.record_stream` here. A null `ptr` or
/// the allocation's own stream does nothing; an address emm did not hand out is
/// `EMM_ERR_INVALID_ARGUMENT` (PyTorch's own allocator ignores memory it did not
/// allocate, and so does `emm.torch`), and so is a stream handle the driver does
/// not know (`cuStreamIsCapturing` refuses it): nothing is recorded then. Since
/// ABI 305.
#[no_mangle]
pub extern "C" fn emm_torch_record_stream(
    ptr: *mut c_void,
    device: c_int,
    stream: *mut c_void,
) -> emm_status {
    guard(|| {
        if ptr.is_null() {
            return EMM_OK;
        }
        live_record_stream(device, ptr as u64, stream_of(stream))
    })
}

/// Raises a Python exception of `type` with message `msg` (CPython's
/// `PyErr_SetString`); called with the GIL held.
pub type emm_raise_fn = Option<unsafe extern "C" fn(exc_type: *mut c_void, msg: *const c_char)>;

/// Returns CuPy's current stream, or -1 with a Python exception set (the C function
/// behind `cupy_backends.cuda.stream.get_current_stream_ptr`); called with the GIL
/// held.
pub type emm_stream_fn = Option<unsafe extern "C" fn() -> isize>;

/// What `emm_cupy_malloc` needs from the Python side, set once by
/// `emm_cupy_set_hooks`.
struct CupyHooks {
    current_stream: unsafe extern "C" fn() -> isize,
    raise: unsafe extern "C" fn(*mut c_void, *const c_char),
    oom_type: *mut c_void,
    error_type: *mut c_void,
}

/// The hooks in force; replaced hooks are leaked on purpose (a few bytes once per
/// `emm_cupy_set_hooks`), so a reader never sees freed hooks.
static CUPY_HOOKS: AtomicPtr<CupyHooks> = AtomicPtr::new(core::ptr::null_mut());

/// The address `emm_cupy_malloc` returns on failure, with a Python exception set
/// (`(void *)EMM_CUPY_FAILED`): CuPy's `_call_malloc` returns `intptr_t` and checks
/// for an exception when it is -1.
pub const EMM_CUPY_FAILED: isize = -1;

/// Gives `emm_cupy_malloc` CuPy's current-stream function and the means to raise
/// Python exceptions: `raise` (CPython's `PyErr_SetString`) with `oom_type` for out
/// of memory and `error_type` for other failures (Python type objects, which the
/// caller keeps alive for the life of the process).
#[no_mangle]
pub extern "C" fn emm_cupy_set_hooks(
    current_stream: emm_stream_fn,
    raise: emm_raise_fn,
    oom_type: *mut c_void,
    error_type: *mut c_void,
) -> emm_status {
    guard(|| {
        let (Some(current_stream), Some(raise)) = (current_stream, raise) else {
            return invalid("emm_cupy_set_hooks: `current_stream` or `raise` is null");
        };
        if oom_type.is_null() || error_type.is_null() {
            return invalid("emm_cupy_set_hooks: `oom_type` or `error_type` is null");
        }
        let hooks = Box::into_raw(Box::new(CupyHooks {
            current_stream,
            raise,
            oom_type,
            error_type,
        }));
        CUPY_HOOKS.store(hooks, Ordering::Release);
        EMM_OK
    })
}

/// CuPy's C-function allocator (`cupy.cuda.memory.CFunctionAllocator`): `size`
/// bytes on `device`, ordered on CuPy's current stream. `param` is unused. Called by
/// CuPy with the GIL held. On failure returns `EMM_CUPY_FAILED` (-1 as an address)
/// with a Python exception set (out of memory: the `oom_type` of
/// `emm_cupy_set_hooks`); null when no hooks were set (nothing can be raised then:
/// only the Python bindings install this function, after setting the hooks).
///
/// The GIL stays held for the whole allocation, as around CuPy's own pool: the
/// pool's out-of-memory ladder synchronizes the device, so a pending host callback
/// on a stream that needs the GIL (`Stream.launch_host_func` with a Python
/// function) would wait on it; CuPy's `cudaFree` under its own pool has the same
/// hazard.
#[no_mangle]
pub extern "C" fn emm_cupy_malloc(param: *mut c_void, size: usize, device: c_int) -> *mut c_void {
    let _ = param; // CuPy's opaque argument; emm's state is process-wide
    let hooks = CUPY_HOOKS.load(Ordering::Acquire);
    if hooks.is_null() {
        set_no_hooks();
        return core::ptr::null_mut();
    }
    // SAFETY: non-null pointers in CUPY_HOOKS come from Box::into_raw and are never
    // freed.
    let hooks = unsafe { &*hooks };
    // SAFETY: the function was given by emm_cupy_set_hooks as CuPy's current-stream
    // function; CuPy calls this allocator with the GIL held, as that function needs.
    let stream = unsafe { (hooks.current_stream)() };
    if stream == -1 {
        // The stream function set a Python exception: let CuPy raise it.
        return EMM_CUPY_FAILED as *mut c_void;
    }
    let mut out = Err(EMM_OK);
    let code = guard(
        || match live_alloc(device, size, CUstream(stream as *mut c_void)) {
            Ok(p) => {
                out = Ok(p);
                EMM_OK
            }
            Err(code) => code,
        },
    );
    match out {
        Ok(p) => p as *mut c_void,
        Err(_) => {
            let exc = if code == EMM_ERR_OUT_OF_MEMORY {
                hooks.oom_type
            } else {
                hooks.error_type
            };
            let msg = crate::status::last_error_message();
            let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
            // SAFETY: `raise` is PyErr_SetString per emm_cupy_set_hooks, called with
            // the GIL held (CuPy holds it around its allocator) with a live type
            // object and a NUL-terminated string that outlives the call.
            unsafe { (hooks.raise)(exc, msg.as_ptr()) };
            EMM_CUPY_FAILED as *mut c_void
        }
    }
}

fn set_no_hooks() {
    crate::status::set_error(
        EMM_ERR_INVALID_ARGUMENT,
        "emm_cupy_malloc: emm_cupy_set_hooks was not called".into(),
    );
}

/// CuPy's C-function allocator: frees `ptr` (from `emm_cupy_malloc`) on the stream
/// it was allocated on, as CuPy's own pool does. Null and `EMM_CUPY_FAILED` are
/// ignored; an address emm did not hand out is reported through emm's log
/// (`emm_last_error` too), as CuPy's free returns nothing.
#[no_mangle]
pub extern "C" fn emm_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let _ = param; // CuPy's opaque argument; emm's state is process-wide
    if ptr.is_null() || ptr as isize == EMM_CUPY_FAILED {
        return;
    }
    let code = guard(|| live_free("emm_cupy_free", device, ptr as u64, None));
    if code != EMM_OK {
        let msg = crate::status::last_error_message();
        tracing::error!("CuPy freed memory emm could not free: {msg}");
    }
}

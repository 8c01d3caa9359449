//! The C ABI of emm. The header, `include/emm.h`, is generated from this crate by
//! cbindgen (`cargo xtask header`; `cbindgen.toml` holds its settings): the doc
//! comments of the exported items are the header's documentation, written for C
//! readers. `cargo xtask ci` checks that the committed header is the generated one
//! and that the library exports exactly the functions it declares.
//!
//! Conventions:
//! - Every function returns an [`emm_status`]: `EMM_OK` (0) or an error code. The
//!   message of the last failure on the calling thread is copied out by
//!   [`emm_last_error`].
//! - Device pointers are `uint64_t`; streams are `CUstream`/`cudaStream_t` values
//!   passed as `void*` (`NULL` is the legacy default stream).
//! - No Rust panic crosses the boundary: each entry point catches it and returns
//!   `EMM_ERR_PANIC`.
//! - Managers come from emm's process-wide router, so C, C++, Python and PyTorch in
//!   one process share one manager per device. Without a choice the manager is
//!   `pool`, for every entry point ([`emm_manager_create`] with a null name and
//!   PyTorch's [`emm_torch_alloc`] alike).
//! - Configuration: [`emm_configure`] sets any `EMM_*` setting before the first
//!   allocation (the environment wins).
//! - Out of memory is `EMM_ERR_OUT_OF_MEMORY`; [`emm_last_oom`] gives the bytes
//!   requested, free and total.
//! - Log output: see the [`log`] module (`EMM_LOG`, default `warn`, on standard
//!   error; or queued for [`emm_take_warning`]).
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)
#![allow(non_camel_case_types)] // reason: C names in the ABI
#![allow(clippy::missing_safety_doc)] // reason: the contract of each pointer argument is in its doc comment, which is include/emm.h's

mod array;
mod framework;
mod graph_hooks;
mod graph_pools;
mod handles;
mod live_table;
pub mod log;
mod managed;
mod settings;
mod stat_names;
mod stream_uses;
mod tags;
mod timing;
mod tools;
mod torch_tools;
pub use array::*;
pub use framework::*;
pub use graph_hooks::*;
pub use log::{emm_capture_warnings, emm_take_warning};
pub use managed::{
    emm_alloc_managed, emm_free_managed, EMM_MEM_ATTACH_GLOBAL, EMM_MEM_ATTACH_HOST,
};
pub use settings::*;
pub use stat_names::*;
pub use tags::*;
pub use tools::*;
pub use torch_tools::*;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use emm_core::{
    DeviceAllocation, EmmError, HostAllocFlags, HostMemory, IpcHandle, IpcMemory, ManagedMemory,
    MemoryManager,
};
use emm_driver::Context;
use emm_sys::CUstream;

/// What every function returns: `EMM_OK` (0) or one of the `EMM_ERR_*` codes.
pub type emm_status = c_int;

/// C's `ssize_t` (from `<sys/types.h>`, which the header includes): the size type of
/// PyTorch's pluggable-allocator pair, `emm_torch_alloc` and `emm_torch_free`.
pub type ssize_t = isize;

/// Success.
pub const EMM_OK: emm_status = 0;
/// An argument was invalid (null pointer, bad size, unknown pointer).
pub const EMM_ERR_INVALID_ARGUMENT: emm_status = 1;
/// Out of memory.
pub const EMM_ERR_OUT_OF_MEMORY: emm_status = 2;
/// The CUDA driver failed (or is missing).
pub const EMM_ERR_DRIVER: emm_status = 3;
/// The manager does not support the operation.
pub const EMM_ERR_UNSUPPORTED: emm_status = 4;
/// No manager of that name.
pub const EMM_ERR_UNKNOWN_MANAGER: emm_status = 5;
/// An IPC handle was invalid.
pub const EMM_ERR_IPC: emm_status = 6;
/// Another manager already serves this process.
pub const EMM_ERR_ALREADY_IN_USE: emm_status = 7;
/// A panic was caught at the boundary (a bug in emm).
pub const EMM_ERR_PANIC: emm_status = 8;
/// Any other error.
pub const EMM_ERR_OTHER: emm_status = 9;
/// emm reached a state its own code should never reach (a bug in emm). Since ABI 302.
pub const EMM_ERR_INTERNAL: emm_status = 10;
/// This process was forked after its parent initialised CUDA through emm: CUDA
/// and the parent's pools cannot be used here, so every call that would touch
/// them is refused (nothing is allocated, freed or destroyed; `emm_manager_name`
/// answers NULL). Start workers with
/// spawn, or fork before CUDA is first used. Since ABI 309.
pub const EMM_ERR_FORKED: emm_status = 11;
/// An operation a tag's state does not allow: allocating under a paused tag,
/// pausing a paused tag or `"default"`, resuming a tag that is not paused,
/// pausing memory that cannot be paused, exporting a tagged block. Since ABI 310.
pub const EMM_ERR_TAG_STATE: emm_status = 12;

/// The version of the C ABI that `include/emm.h` declares (there `EMM_ABI_VERSION`):
/// major * 10000 + minor * 100 + patch. A program compares it with
/// `emm_abi_version()`, the version of the library it loaded.
pub const ABI_VERSION: c_int = 311;

thread_local! {
    static LAST_ERROR: RefCell<(emm_status, String)> = const { RefCell::new((EMM_OK, String::new())) };
    /// Requested, free and total bytes of the last failure when it was out of memory.
    static LAST_OOM: std::cell::Cell<Option<(usize, usize, usize)>> = const { std::cell::Cell::new(None) };
}

pub(crate) fn set_error(code: emm_status, msg: String) -> emm_status {
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = (code, msg));
    let _ = LAST_OOM.try_with(|o| o.set(None));
    code
}

/// The message of this thread's last failure (empty when there is none, or while
/// the thread is being torn down).
pub(crate) fn last_error_message() -> String {
    LAST_ERROR
        .try_with(|e| e.borrow().1.clone())
        .unwrap_or_default()
}

fn set_oom(requested: usize, free: usize, total: usize) {
    let _ = LAST_OOM.try_with(|o| o.set(Some((requested, free, total))));
}

pub(crate) fn code_of(e: &EmmError) -> emm_status {
    match e {
        e if e.forked().is_some() => EMM_ERR_FORKED,
        e if e.is_out_of_memory() => EMM_ERR_OUT_OF_MEMORY,
        EmmError::InvalidSize { .. }
        | EmmError::InvalidArgument { .. }
        | EmmError::OutOfRange { .. }
        | EmmError::InvalidConfig { .. } => EMM_ERR_INVALID_ARGUMENT,
        EmmError::Driver(_) | EmmError::FreeFailed { .. } => EMM_ERR_DRIVER,
        EmmError::Unsupported { .. } | EmmError::InterfaceVersion { .. } => EMM_ERR_UNSUPPORTED,
        EmmError::UnknownManager { .. } => EMM_ERR_UNKNOWN_MANAGER,
        EmmError::InvalidIpcHandle { .. }
        | EmmError::IpcExporterGone { .. }
        | EmmError::IpcDescriptorRefused { .. } => EMM_ERR_IPC,
        EmmError::AlreadyInUse { .. } | EmmError::ConfiguredTooLate { .. } => {
            EMM_ERR_ALREADY_IN_USE
        }
        EmmError::Internal { .. } => EMM_ERR_INTERNAL,
        EmmError::TagState { .. } => EMM_ERR_TAG_STATE,
        _ => EMM_ERR_OTHER,
    }
}

pub(crate) fn fail(e: EmmError) -> emm_status {
    let code = set_error(code_of(&e), e.to_string());
    if let EmmError::OutOfMemory {
        requested,
        free,
        total,
        ..
    } = e
    {
        set_oom(requested, free, total);
    }
    code
}

/// `fail` for an allocation of `size` bytes: an out-of-memory error that does not
/// carry the numbers (a driver's code) gets them from `manager` (0 where unknown).
pub(crate) fn fail_alloc(e: EmmError, size: usize, manager: &dyn MemoryManager) -> emm_status {
    let oom_without_numbers = e.is_out_of_memory() && !matches!(e, EmmError::OutOfMemory { .. });
    let code = fail(e);
    if oom_without_numbers {
        let (free, total) = manager
            .get_memory_info()
            .map(|i| (i.free, i.total))
            .unwrap_or((0, 0));
        set_oom(size, free, total);
    }
    code
}

pub(crate) fn invalid(msg: impl Into<String>) -> emm_status {
    set_error(EMM_ERR_INVALID_ARGUMENT, msg.into())
}

/// Runs `f`, turning a panic into `EMM_ERR_PANIC`; installs the log output on
/// first use. In a child forked after CUDA was initialised `f` does not run:
/// `EMM_ERR_FORKED` (the managers, handles and tables are the parent's, copied by
/// fork, their locks perhaps held by parent threads that do not exist here).
pub(crate) fn guard(f: impl FnOnce() -> emm_status) -> emm_status {
    if let Err(e) = emm_core::check_not_forked() {
        return fail(e);
    }
    log::init();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => {
            if code == EMM_OK {
                let _ = LAST_ERROR.try_with(|e| e.borrow_mut().0 = EMM_OK);
            }
            code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_error(
                EMM_ERR_PANIC,
                format!("a panic was caught at the C boundary (a bug in emm): {what}"),
            )
        }
    }
}

/// A manager handle (opaque; from `emm_manager_create`): the shared manager of one
/// device plus what this handle handed out, so callers free by pointer.
pub struct emm_manager {
    pub(crate) manager: Arc<dyn MemoryManager>,
    pub(crate) ctx: Context,
    device: Mutex<HashMap<u64, DeviceAllocation>>,
    host: Mutex<HashMap<usize, HostMemory>>,
    ipc: Mutex<HashMap<u64, IpcMemory>>,
    /// Managed memory (`emm_alloc_managed`), kept apart from device memory.
    managed: Mutex<HashMap<u64, ManagedMemory>>,
}

pub(crate) fn stream_of(s: *mut c_void) -> CUstream {
    if s.is_null() {
        emm_core::SYNC_STREAM
    } else {
        CUstream(s)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn manager_for(
    name: Option<&str>,
    device: c_int,
) -> Result<(Arc<dyn MemoryManager>, Context), EmmError> {
    emm::register_builtin_managers();
    if let Some(n) = name {
        emm::set_memory_manager(n)?;
    }
    let ord = usize::try_from(device).map_err(|_| EmmError::InvalidArgument {
        what: "device ordinal",
        found: device.to_string(),
        expected: "0 or more".into(),
    })?;
    let ctx = Context::on_device(ord)?;
    let m = emm::memory_manager(&ctx)?;
    Ok((m, ctx))
}

/// The version of the library's C ABI: major * 10000 + minor * 100 + patch (the
/// header's is `EMM_ABI_VERSION`). 300 (0.3.0) added `emm_configure`,
/// `emm_last_oom`, `emm_capture_warnings` and `emm_take_warning`, and made "pool"
/// the default manager; 301 added the memory tools (`emm_memory_stat`,
/// `emm_memory_stats_json`, `emm_reset_peak_stats`, `emm_record_memory_history`,
/// `emm_memory_snapshot_json`, `emm_string_free`); 302 added `EMM_ERR_INTERNAL` and
/// refuses handles that emm did not create, or that were destroyed, with
/// `EMM_ERR_INVALID_ARGUMENT`; 303 added CuPy's C-function allocator
/// (`emm_cupy_set_hooks`, `emm_cupy_malloc`, `emm_cupy_free`); 304 added managed
/// memory (`emm_alloc_managed`, `emm_free_managed`, `EMM_MEM_ATTACH_GLOBAL`,
/// `EMM_MEM_ATTACH_HOST`); 305 added `emm_torch_record_stream`; 306 added
/// `emm_torch_release` (the deleter of `emm.torch`'s own allocator object); 307
/// added PyTorch's memory tools for that object (`emm_torch_memory_stats`,
/// `emm_torch_reset_peak_stats`, `emm_torch_empty_cache`, `emm_torch_cache_info`);
/// 308 added CUDA graph pools for it (`emm_torch_graph_pool_begin`,
/// `emm_torch_graph_pool_end`, `emm_torch_graph_pool_release`,
/// `emm_torch_graph_pool_alloc`, `emm_torch_graph_pool_live`); 309 added
/// `EMM_ERR_FORKED`, which every call that would touch a manager, a handle or the
/// driver returns in a child forked after emm initialised CUDA; 310 added tags,
/// pause and resume (`emm_region_enter`, `emm_region_exit`, `emm_pause`,
/// `emm_resume`, `emm_tag_stats`, `EMM_KEEP_NOTHING`, `EMM_KEEP_HOST`,
/// `EMM_ERR_TAG_STATE`); 311 added `emm_settings` (the list of settings),
/// `emm_stat_names` (the statistic names) and
/// run-time settings in `emm_configure` (`pool_limit`,
/// `pool_release_threshold`).
#[no_mangle]
pub extern "C" fn emm_abi_version() -> c_int {
    ABI_VERSION
}

fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, emm_status> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: the caller passes a NUL-terminated string that outlives the call.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// Configuration in code. Every key mirrors an environment variable, whose name
/// is accepted as the key too; `emm_settings` lists them with their kinds,
/// defaults and documentation (e.g. "manager", "pool_limit",
/// "pool_release_threshold", "pool_expandable", "pool_thread_cache").
///
/// A set environment variable wins (with a warning). Values are validated at once
/// (`EMM_ERR_INVALID_ARGUMENT`; an unknown manager is `EMM_ERR_UNKNOWN_MANAGER`).
/// Once a manager has been created, a different value fails with
/// `EMM_ERR_ALREADY_IN_USE` (the value in effect is accepted), except for the
/// run-time settings (`emm_setting.runtime`, e.g. "pool_limit"), which change at
/// once in every manager: lowering the pool's limit below what it reserves gives
/// its cached memory back, then refuses what would pass the limit.
#[no_mangle]
pub unsafe extern "C" fn emm_configure(key: *const c_char, value: *const c_char) -> emm_status {
    guard(|| {
        let key = match c_str(key, "emm_configure: `key`") {
            Ok(k) => k,
            Err(c) => return c,
        };
        let value = match c_str(value, "emm_configure: `value`") {
            Ok(v) => v,
            Err(c) => return c,
        };
        match emm::configure(key, value) {
            Ok(()) => EMM_OK,
            Err(e) => fail(e),
        }
    })
}

/// After `EMM_ERR_OUT_OF_MEMORY`: the bytes requested, and the free and total bytes
/// (of the device, or of the manager's limit) when it failed; 0 where unknown. Any
/// output may be NULL. `EMM_ERR_INVALID_ARGUMENT` when the last failure on this
/// thread was not out of memory.
#[no_mangle]
pub unsafe extern "C" fn emm_last_oom(
    requested: *mut usize,
    free: *mut usize,
    total: *mut usize,
) -> emm_status {
    let Some((r, f, t)) = LAST_OOM.try_with(|o| o.get()).ok().flatten() else {
        return EMM_ERR_INVALID_ARGUMENT;
    };
    for (p, v) in [(requested, r), (free, f), (total, t)] {
        if !p.is_null() {
            // SAFETY: a non-null output is writable per the contract.
            unsafe { *p = v };
        }
    }
    EMM_OK
}

/// The last failure on this thread: copies its message (NUL-terminated, truncated to
/// `len`) into `buf` and returns the message's full length; `buf` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn emm_last_error(buf: *mut c_char, len: usize) -> usize {
    LAST_ERROR
        .try_with(|e| {
            let e = e.borrow();
            let bytes = e.1.as_bytes();
            if !buf.is_null() && len > 0 {
                let n = bytes.len().min(len - 1);
                // SAFETY: the caller gives `len` writable bytes at `buf`; n < len.
                unsafe {
                    core::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
                    *buf.add(n) = 0;
                }
            }
            bytes.len()
        })
        .unwrap_or(0)
}

/// The code of the last failure on this thread (`EMM_OK` after a success).
#[no_mangle]
pub extern "C" fn emm_last_error_code() -> emm_status {
    LAST_ERROR.try_with(|e| e.borrow().0).unwrap_or(EMM_OK)
}

/// Opens the manager of `device` into `*out`. `name` is "default", "pool" or
/// "hostonly" (NULL: `EMM_MEMORY_MANAGER`, else the one configured, else "pool").
/// Handles for one device share its manager with every other emm user in the
/// process (Python, PyTorch). Choosing a different name after another manager served
/// memory fails with `EMM_ERR_ALREADY_IN_USE`. Release the handle with
/// `emm_manager_destroy`.
#[no_mangle]
pub unsafe extern "C" fn emm_manager_create(
    name: *const c_char,
    device: c_int,
    out: *mut *mut emm_manager,
) -> emm_status {
    guard(|| {
        if out.is_null() {
            return invalid("emm_manager_create: `out` is null");
        }
        let name = if name.is_null() {
            None
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            match unsafe { CStr::from_ptr(name) }.to_str() {
                Ok(s) => Some(s.to_owned()),
                Err(_) => return invalid("emm_manager_create: the name is not UTF-8"),
            }
        };
        match manager_for(name.as_deref(), device) {
            Ok((manager, ctx)) => {
                let h = MANAGERS.insert(emm_manager {
                    manager,
                    ctx,
                    device: Mutex::new(HashMap::new()),
                    host: Mutex::new(HashMap::new()),
                    ipc: Mutex::new(HashMap::new()),
                    managed: Mutex::new(HashMap::new()),
                });
                // SAFETY: `out` is non-null and writable per the contract.
                unsafe { *out = h };
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// The live manager handles.
static MANAGERS: handles::Handles<emm_manager> = handles::Handles::new();

/// Releases a handle and everything it still holds. A NULL handle does nothing; a
/// handle that is not live (destroyed already, or not from `emm_manager_create`)
/// is left alone, and `emm_last_error_code()` says `EMM_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn emm_manager_destroy(m: *mut emm_manager) {
    let _ = guard(|| {
        if m.is_null() {
            return EMM_OK;
        }
        match MANAGERS.remove(m) {
            Some(h) => {
                drop(h);
                EMM_OK
            }
            None => invalid(format!(
                "emm_manager_destroy: {m:p} is not a live manager handle (destroyed already, or not from emm_manager_create)"
            )),
        }
    });
}

/// The manager behind a live handle; null, foreign and destroyed handles are
/// `EMM_ERR_INVALID_ARGUMENT` (nothing is read through them).
pub(crate) fn handle(m: *const emm_manager) -> Result<Arc<emm_manager>, emm_status> {
    if m.is_null() {
        return Err(invalid("the manager handle is null"));
    }
    MANAGERS.get(m).ok_or_else(|| {
        invalid(format!(
            "{m:p} is not a live manager handle (destroyed already, or not from emm_manager_create)"
        ))
    })
}

/// `guard` around `f` on the manager behind `m`; a null handle is refused.
pub(crate) fn with_manager(
    m: *const emm_manager,
    f: impl FnOnce(&emm_manager) -> emm_status,
) -> emm_status {
    guard(|| match handle(m) {
        Ok(h) => f(&h),
        Err(c) => c,
    })
}

/// The name of the manager behind `m` (static storage; NULL for a handle that is
/// not live).
#[no_mangle]
pub unsafe extern "C" fn emm_manager_name(m: *const emm_manager) -> *const c_char {
    if emm_sys::forked() {
        return core::ptr::null(); // the handle table is the parent's
    }
    match handle(m).map(|h| h.manager.name().to_owned()) {
        Ok(n) => match n.as_str() {
            "default" => c"default".as_ptr(),
            "pool" => c"pool".as_ptr(),
            "hostonly" => c"hostonly".as_ptr(),
            _ => c"other".as_ptr(),
        },
        Err(_) => core::ptr::null(),
    }
}

/// Allocates `size` bytes of device memory ordered on `stream` (NULL: the legacy
/// default stream) into `*out_ptr`. `emm_free` frees it on that stream unless told
/// another.
#[no_mangle]
pub unsafe extern "C" fn emm_alloc(
    m: *mut emm_manager,
    size: usize,
    stream: *mut c_void,
    out_ptr: *mut u64,
) -> emm_status {
    with_manager(m, |h| {
        if out_ptr.is_null() {
            return invalid("emm_alloc: `out_ptr` is null");
        }
        match emm_core::alloc_from(h.manager.as_ref(), size, stream_of(stream)) {
            Ok(a) => {
                let p = a.ptr();
                if size > 0 {
                    lock(&h.device).insert(p, a);
                }
                // SAFETY: non-null and writable per the contract.
                unsafe { *out_ptr = p };
                EMM_OK
            }
            Err(e) => fail_alloc(e, size, h.manager.as_ref()),
        }
    })
}

/// `emm_alloc` returning the address: 0 when `size` is 0 (`emm_last_error_code()`
/// is then `EMM_OK`) or on failure (it is then the failure's code). For bindings
/// that pay for every argument they convert, such as Python's ctypes. Since ABI 200.
#[no_mangle]
pub unsafe extern "C" fn emm_alloc_ptr(
    m: *mut emm_manager,
    size: usize,
    stream: *mut c_void,
) -> u64 {
    let mut out = 0u64;
    // SAFETY: `out` is a live local, so `out_ptr` is non-null and writable; `m` and
    // `stream` are passed on under the caller's contract.
    match unsafe { emm_alloc(m, size, stream, &mut out) } {
        EMM_OK => out,
        _ => 0,
    }
}

/// Frees `ptr` (from `emm_alloc` on this handle), ordered on `stream` (NULL: the
/// stream it was allocated on). 0 is ignored. Where the driver refuses the free
/// (`EMM_ERR_DRIVER`), nothing was freed: `ptr` stays allocated and this handle's,
/// and `emm_free` may be called for it again once the fault clears.
#[no_mangle]
pub unsafe extern "C" fn emm_free(
    m: *mut emm_manager,
    ptr: u64,
    stream: *mut c_void,
) -> emm_status {
    with_manager(m, |h| {
        if ptr == 0 {
            return EMM_OK;
        }
        let removed = lock(&h.device).remove(&ptr);
        match removed {
            Some(mut a) => {
                if !stream.is_null() {
                    a.set_stream(CUstream(stream));
                }
                match a.free() {
                    Ok(()) => EMM_OK,
                    Err(not_freed) => {
                        // Still allocated: the handle keeps it for a retry.
                        let emm_core::NotFreed { allocation, error } = *not_freed;
                        lock(&h.device).insert(ptr, allocation);
                        fail(error)
                    }
                }
            }
            None if lock(&h.managed).contains_key(&ptr) => invalid(format!(
                "emm_free: {ptr:#x} is managed memory from emm_alloc_managed; free it with emm_free_managed"
            )),
            None => invalid(format!(
                "emm_free: {ptr:#x} was not allocated through this handle (or was freed already)"
            )),
        }
    })
}

/// Pinned host memory of `size` bytes into `*out_host`: `flags` bit 0 mapped, bit 1
/// portable, bit 2 write-combined. `out_dev` (may be NULL) gets the device address
/// of mapped memory.
#[no_mangle]
pub unsafe extern "C" fn emm_host_alloc(
    m: *mut emm_manager,
    size: usize,
    flags: u32,
    out_host: *mut *mut c_void,
    out_dev: *mut u64,
) -> emm_status {
    with_manager(m, |h| {
        if out_host.is_null() {
            return invalid("emm_host_alloc: `out_host` is null");
        }
        let f = HostAllocFlags {
            mapped: flags & 1 != 0,
            portable: flags & 2 != 0,
            write_combined: flags & 4 != 0,
        };
        match h.manager.memhostalloc(size, f) {
            Ok(mem) => {
                let host = mem.host_ptr();
                // SAFETY: out pointers are writable per the contract (out_dev may be null).
                unsafe {
                    *out_host = host.cast();
                    if !out_dev.is_null() {
                        *out_dev = mem.device_ptr().unwrap_or(0);
                    }
                }
                lock(&h.host).insert(host as usize, mem);
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Frees pinned host memory from `emm_host_alloc` on this handle.
#[no_mangle]
pub unsafe extern "C" fn emm_host_free(m: *mut emm_manager, host: *mut c_void) -> emm_status {
    with_manager(m, |h| match lock(&h.host).remove(&(host as usize)) {
        Some(mem) => {
            drop(mem);
            EMM_OK
        }
        None => invalid(format!(
            "emm_host_free: {host:p} was not allocated through this handle"
        )),
    })
}

/// Free and total bytes of the device (or of the manager's limit).
#[no_mangle]
pub unsafe extern "C" fn emm_memory_info(
    m: *mut emm_manager,
    free: *mut usize,
    total: *mut usize,
) -> emm_status {
    with_manager(m, |h| {
        if free.is_null() || total.is_null() {
            return invalid("emm_memory_info: null output pointer");
        }
        match h.manager.get_memory_info() {
            Ok(i) => {
                // SAFETY: both are non-null and writable per the contract.
                unsafe {
                    *free = i.free;
                    *total = i.total;
                }
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Statistics of a manager, filled by `emm_get_stats` (emm-core's `ManagerStats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct emm_stats {
    /// Bytes in allocations held by callers.
    pub allocated_bytes: u64,
    /// Peak of `allocated_bytes`.
    pub allocated_bytes_peak: u64,
    /// Bytes held from the device.
    pub reserved_bytes: u64,
    /// Peak of `reserved_bytes`.
    pub reserved_bytes_peak: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Allocations made from the driver.
    pub upstream_allocs: u64,
}

/// Fills `out` with the manager's statistics.
#[no_mangle]
pub unsafe extern "C" fn emm_get_stats(m: *mut emm_manager, out: *mut emm_stats) -> emm_status {
    with_manager(m, |h| {
        if out.is_null() {
            return invalid("emm_get_stats: `out` is null");
        }
        let s = h.manager.stats();
        // SAFETY: non-null and writable per the contract.
        unsafe {
            *out = emm_stats {
                allocated_bytes: s.allocated_bytes as u64,
                allocated_bytes_peak: s.allocated_bytes_peak as u64,
                reserved_bytes: s.reserved_bytes as u64,
                reserved_bytes_peak: s.reserved_bytes_peak as u64,
                allocations: s.allocations,
                upstream_allocs: s.upstream_allocs,
            }
        };
        EMM_OK
    })
}

/// Every counter the manager keeps, as one line of text (in a build with the
/// `call-timing` feature, followed by one `name: value` line per process-wide hook
/// counter), NUL-terminated and truncated to `len`, in `buf`; `*written` (may be NULL) gets the full length; `buf` may be
/// NULL to ask for the length.
#[no_mangle]
pub unsafe extern "C" fn emm_manager_report(
    m: *mut emm_manager,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> emm_status {
    with_manager(m, |h| {
        let text = h.manager.report() + &timing::report();
        let bytes = text.as_bytes();
        if !buf.is_null() && len > 0 {
            let n = bytes.len().min(len - 1);
            // SAFETY: the caller gives `len` writable bytes at `buf`; n < len.
            unsafe {
                core::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        if !written.is_null() {
            // SAFETY: non-null and writable per the contract.
            unsafe { *written = bytes.len() };
        }
        EMM_OK
    })
}

/// Gives cached memory back to the device; `*released` (may be NULL) gets the bytes.
#[no_mangle]
pub unsafe extern "C" fn emm_trim(m: *mut emm_manager, released: *mut usize) -> emm_status {
    with_manager(m, |h| {
        match h.manager.release_cached() {
            Ok(n) => {
                if !released.is_null() {
                    // SAFETY: non-null and writable per the contract.
                    unsafe { *released = n };
                }
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// IPC: exports `[ptr+offset, ptr+offset+len)` of an allocation of this handle as
/// handle bytes into `buf` (`cap` bytes); `*written` gets their length. With `buf`
/// NULL only `*written` is set (to the size needed). Another process opens the bytes
/// with `emm_ipc_open`.
#[no_mangle]
pub unsafe extern "C" fn emm_ipc_export(
    m: *mut emm_manager,
    ptr: u64,
    offset: usize,
    len: usize,
    buf: *mut u8,
    cap: usize,
    written: *mut usize,
) -> emm_status {
    with_manager(m, |h| {
        if written.is_null() {
            return invalid("emm_ipc_export: `written` is null");
        }
        let map = lock(&h.device);
        let Some(a) = map.get(&ptr) else {
            return invalid(format!(
                "emm_ipc_export: {ptr:#x} was not allocated through this handle"
            ));
        };
        let bytes = match a
            .view(offset, len)
            .and_then(|v| h.manager.get_ipc_handle(v))
        {
            Ok(hd) => hd.to_bytes(),
            Err(e) => return fail(e),
        };
        // SAFETY: non-null and writable per the contract.
        unsafe { *written = bytes.len() };
        if buf.is_null() {
            return EMM_OK;
        }
        if cap < bytes.len() {
            return invalid(format!(
                "emm_ipc_export: the buffer holds {cap} bytes, the handle needs {}",
                bytes.len()
            ));
        }
        // SAFETY: `buf` holds `cap` >= len writable bytes.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
        EMM_OK
    })
}

/// Opens IPC handle bytes from another process; `*out_ptr` gets the device address
/// (staged into this handle's manager when the memory is on another device). Close
/// it with `emm_ipc_close`.
#[no_mangle]
pub unsafe extern "C" fn emm_ipc_open(
    m: *mut emm_manager,
    buf: *const u8,
    len: usize,
    out_ptr: *mut u64,
) -> emm_status {
    with_manager(m, |h| {
        if buf.is_null() || out_ptr.is_null() {
            return invalid("emm_ipc_open: null pointer argument");
        }
        // SAFETY: `buf` holds `len` readable bytes per the contract.
        let bytes = unsafe { core::slice::from_raw_parts(buf, len) };
        let opened =
            IpcHandle::from_bytes(bytes).and_then(|hd| hd.open(&h.ctx, h.manager.as_ref()));
        match opened {
            Ok(mem) => {
                let p = mem.ptr();
                lock(&h.ipc).insert(p, mem);
                // SAFETY: non-null and writable per the contract.
                unsafe { *out_ptr = p };
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Closes memory opened by `emm_ipc_open` on this handle.
#[no_mangle]
pub unsafe extern "C" fn emm_ipc_close(m: *mut emm_manager, ptr: u64) -> emm_status {
    with_manager(m, |h| match lock(&h.ipc).remove(&ptr) {
        Some(mem) => {
            mem.close();
            EMM_OK
        }
        None => invalid(format!(
            "emm_ipc_close: {ptr:#x} was not opened through this handle"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_codes_with_messages_and_null_arguments_are_rejected() {
        // SAFETY: null handles and pointers are what is being tested.
        unsafe {
            assert_eq!(
                emm_alloc(
                    core::ptr::null_mut(),
                    16,
                    core::ptr::null_mut(),
                    core::ptr::null_mut()
                ),
                EMM_ERR_INVALID_ARGUMENT
            );
            let mut buf = [0 as c_char; 64];
            let n = emm_last_error(buf.as_mut_ptr(), buf.len());
            assert_eq!(n, "the manager handle is null".len());
            assert_eq!(
                CStr::from_ptr(buf.as_ptr()).to_str().unwrap(),
                "the manager handle is null"
            );
            assert_eq!(emm_last_error_code(), EMM_ERR_INVALID_ARGUMENT);
            // Truncation keeps a NUL terminator.
            let mut tiny = [1 as c_char; 4];
            emm_last_error(tiny.as_mut_ptr(), 4);
            assert_eq!(CStr::from_ptr(tiny.as_ptr()).to_bytes(), b"the");
            assert_eq!(
                emm_manager_create(core::ptr::null(), 0, core::ptr::null_mut()),
                EMM_ERR_INVALID_ARGUMENT
            );
            emm_manager_destroy(core::ptr::null_mut());
            assert!(emm_manager_name(core::ptr::null()).is_null());
            // The address-returning form: 0, and the failure's code and message.
            assert_eq!(emm_abi_version(), ABI_VERSION);
            assert_eq!(
                emm_alloc_ptr(core::ptr::null_mut(), 16, core::ptr::null_mut()),
                0
            );
            assert_eq!(emm_last_error_code(), EMM_ERR_INVALID_ARGUMENT);
            let n = emm_last_error(buf.as_mut_ptr(), buf.len());
            assert_eq!(n, "the manager handle is null".len());
        }
    }

    #[test]
    fn typed_errors_map_to_their_codes() {
        let mut out: *mut emm_manager = core::ptr::null_mut();
        // SAFETY: `out` is a live local; the name may be null.
        let code = unsafe { emm_manager_create(core::ptr::null(), -1, &mut out) };
        assert_eq!(code, EMM_ERR_INVALID_ARGUMENT);
        assert!(out.is_null());
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` holds 256 writable bytes.
        let msg = unsafe {
            emm_last_error(buf.as_mut_ptr(), buf.len());
            CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
        };
        assert_eq!(msg, "invalid device ordinal: found -1, expected 0 or more");
        let internal = EmmError::Internal {
            operation: "test",
            detail: "unreachable state".into(),
        };
        assert_eq!(fail(internal), EMM_ERR_INTERNAL);
        assert_eq!(emm_last_error_code(), EMM_ERR_INTERNAL);
        let arg = EmmError::InvalidArgument {
            what: "event",
            found: "id 7".into(),
            expected: "an event of this pool".into(),
        };
        assert_eq!(fail(arg), EMM_ERR_INVALID_ARGUMENT);
    }

    #[test]
    fn out_of_memory_reports_requested_free_and_total() {
        let (mut r, mut f, mut t) = (0usize, 0usize, 0usize);
        let code = fail(EmmError::OutOfMemory {
            what: "device",
            manager: "pool".into(),
            requested: 96 << 30,
            free: 1 << 30,
            total: 80 << 30,
            detail: String::new(),
        });
        assert_eq!(code, EMM_ERR_OUT_OF_MEMORY);
        // SAFETY: live locals; null outputs are allowed.
        unsafe {
            assert_eq!(emm_last_oom(&mut r, &mut f, &mut t), EMM_OK);
            assert_eq!((r, f, t), (96 << 30, 1 << 30, 80 << 30));
            assert_eq!(
                emm_last_oom(core::ptr::null_mut(), &mut f, core::ptr::null_mut()),
                EMM_OK
            );
        }
        // Another failure replaces it.
        invalid("something else");
        // SAFETY: as above.
        let again = unsafe { emm_last_oom(&mut r, &mut f, &mut t) };
        assert_eq!(again, EMM_ERR_INVALID_ARGUMENT);
    }

    #[test]
    fn configure_validates_keys_and_values() {
        // SAFETY: NUL-terminated literals and nulls.
        unsafe {
            assert_eq!(
                emm_configure(c"pool_limt".as_ptr(), c"1".as_ptr()),
                EMM_ERR_INVALID_ARGUMENT
            );
            let mut buf = [0 as c_char; 256];
            emm_last_error(buf.as_mut_ptr(), buf.len());
            let msg = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
            assert!(msg.contains("known keys: manager, pool_limit"), "{msg}");
            assert_eq!(
                emm_configure(c"pool_limit".as_ptr(), c"lots".as_ptr()),
                EMM_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                emm_configure(core::ptr::null(), c"1".as_ptr()),
                EMM_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                emm_configure(c"manager".as_ptr(), c"rmm".as_ptr()),
                EMM_ERR_UNKNOWN_MANAGER
            );
        }
    }

    #[test]
    fn a_panic_becomes_a_status() {
        let code = guard(|| panic!("boom"));
        assert_eq!(code, EMM_ERR_PANIC);
        assert_eq!(emm_last_error_code(), EMM_ERR_PANIC);
    }
}

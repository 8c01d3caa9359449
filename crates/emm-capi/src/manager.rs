//! Manager handles (`emm_manager_*`) and what they hand out: device and host
//! memory, statistics, trim.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

use crate::ffi::*;
use crate::guard::guard;
use crate::status::*;
use emm_core::{
    DeviceAllocation, HostAllocFlags, HostMemory, IpcMemory, ManagedMemory, MemoryManager,
};
use emm_driver::Context;
use emm_sys::CUstream;

/// One `emm_ipc_open`'s memory on a manager handle.
pub(crate) struct Opened {
    pub(crate) mem: IpcMemory,
    /// A close of it was refused: it may be partly closed, and the next close
    /// of its address takes it before memory opened there since.
    pub(crate) refused: bool,
}

/// A manager handle (opaque; from `emm_manager_create`): the shared manager of one
/// device plus what this handle handed out, so callers free by pointer.
pub struct emm_manager {
    pub(crate) manager: Arc<dyn MemoryManager>,
    pub(crate) ctx: Context,
    pub(crate) device: Mutex<HashMap<u64, DeviceAllocation>>,
    pub(crate) host: Mutex<HashMap<usize, HostMemory>>,
    /// Memory opened from other processes by `emm_ipc_open`, by address: a
    /// list, since a driver may give one address to every open of the same
    /// handle (each needs its close).
    pub(crate) ipc: Mutex<HashMap<u64, Vec<Opened>>>,
    /// Managed memory (`emm_alloc_managed`), kept apart from device memory.
    pub(crate) managed: Mutex<HashMap<u64, ManagedMemory>>,
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
static MANAGERS: crate::handles::Handles<emm_manager> = crate::handles::Handles::new();

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

/// The name of the manager behind `m`, as it was registered (static storage, kept
/// for the life of the process; NULL for a handle that is not live).
#[no_mangle]
pub unsafe extern "C" fn emm_manager_name(m: *const emm_manager) -> *const c_char {
    if emm_sys::forked() {
        return core::ptr::null(); // the handle table is the parent's
    }
    match handle(m).map(|h| h.manager.name().to_owned()) {
        Ok(n) => interned(&n).as_ptr(),
        Err(_) => core::ptr::null(),
    }
}

/// `name` as a C string in static storage: each distinct name is made once and
/// kept (managers' names are few: the built-in three and those registered). A
/// name holding a NUL byte, which C cannot read, is cut there.
fn interned(name: &str) -> &'static std::ffi::CStr {
    static NAMES: Mutex<Vec<&'static std::ffi::CStr>> = Mutex::new(Vec::new());
    let name = name.split('\0').next().unwrap_or_default();
    let mut names = lock(&NAMES);
    if let Some(c) = names.iter().find(|c| c.to_bytes() == name.as_bytes()) {
        return c;
    }
    let c: &'static std::ffi::CStr = match std::ffi::CString::new(name) {
        Ok(c) => Box::leak(c.into_boxed_c_str()),
        Err(_) => c"",
    };
    names.push(c);
    c
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
/// portable, bit 2 write-combined; any other bit is `EMM_ERR_INVALID_ARGUMENT`.
/// `out_dev` (may be NULL) gets the device address of mapped memory.
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
        if flags & !7 != 0 {
            return invalid(format!(
                "emm_host_alloc: flags {flags:#x} has bits past the three it knows (1 mapped, 2 portable, 4 write-combined)"
            ));
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
        let text = h.manager.report() + &crate::bridge::timing::report();
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

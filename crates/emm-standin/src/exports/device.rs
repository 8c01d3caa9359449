//! Devices, primary contexts, the current-context stack, `cuMemGetInfo`.

use core::ffi::{c_char, c_int, c_uint};

use emm_sys::{CUcontext, CUdevice, CUdevice_attribute, CUresult, CUuuid};

use crate::context::{self, ctx_device, ctx_handle};
use crate::state::{call, put, State};

fn check_device(st: &State, d: CUdevice) -> Result<i32, CUresult> {
    if (0..st.config.devices).contains(&d.0) {
        Ok(d.0)
    } else {
        Err(CUresult::ERROR_INVALID_DEVICE)
    }
}

fn ctx_ptr(h: u64) -> CUcontext {
    CUcontext(h as usize as *mut core::ffi::c_void)
}

/// `cuDeviceGetCount`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    // SAFETY: forwarded to the caller.
    call("cuDeviceGetCount", |st| unsafe {
        put(n, st.config.devices)
    })
}

/// `cuDeviceGet`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) -> CUresult {
    call("cuDeviceGet", |st| {
        let o = check_device(st, CUdevice(ordinal))?;
        // SAFETY: forwarded to the caller.
        unsafe { put(d, CUdevice(o)) }
    })
}

/// `cuDeviceGetName`: `emm stand-in N (host memory)`, truncated to `len`.
///
/// # Safety
/// `name` must hold `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, d: CUdevice) -> CUresult {
    call("cuDeviceGetName", |st| {
        let o = check_device(st, d)?;
        if name.is_null() || len <= 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let text = format!("emm stand-in {o} (host memory)");
        let n = text.len().min(len as usize - 1);
        // SAFETY: `name` holds `len` > n bytes per the caller's contract.
        unsafe {
            core::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), name, n);
            *name.add(n) = 0;
        }
        Ok(())
    })
}

/// `cuDeviceGetUuid`: `emm-standin-dev` followed by the ordinal.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(u: *mut CUuuid, d: CUdevice) -> CUresult {
    call("cuDeviceGetUuid", |st| {
        let o = check_device(st, d)?;
        let mut bytes = [0 as c_char; 16];
        for (b, c) in bytes.iter_mut().zip(b"emm-standin-dev") {
            *b = *c as c_char;
        }
        bytes[15] = o as c_char;
        // SAFETY: forwarded to the caller.
        unsafe { put(u, CUuuid { bytes }) }
    })
}

/// `cuDeviceGetAttribute`: the values of [`crate::context::attribute`].
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    v: *mut c_int,
    a: CUdevice_attribute,
    d: CUdevice,
) -> CUresult {
    call("cuDeviceGetAttribute", |st| {
        let o = check_device(st, d)?;
        let x = context::attribute(a, o, &st.config).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(v, x) }
    })
}

/// `cuDeviceTotalMem_v2`: the configured capacity.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(t: *mut usize, d: CUdevice) -> CUresult {
    call("cuDeviceTotalMem_v2", |st| {
        check_device(st, d)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(t, st.config.capacity) }
    })
}

/// `cuDeviceCanAccessPeer`: any two distinct devices can (it is all host memory).
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    v: *mut c_int,
    d: CUdevice,
    p: CUdevice,
) -> CUresult {
    call("cuDeviceCanAccessPeer", |st| {
        let (a, b) = (check_device(st, d)?, check_device(st, p)?);
        // SAFETY: forwarded to the caller.
        unsafe { put(v, c_int::from(a != b)) }
    })
}

/// `cuDevicePrimaryCtxRetain`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(c: *mut CUcontext, d: CUdevice) -> CUresult {
    call("cuDevicePrimaryCtxRetain", |st| {
        let o = check_device(st, d)?;
        if c.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let h = st.contexts.retain(o);
        // SAFETY: forwarded to the caller.
        unsafe { put(c, ctx_ptr(h)) }
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: releasing more often than retained is
/// `CUDA_ERROR_INVALID_CONTEXT`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(d: CUdevice) -> CUresult {
    call("cuDevicePrimaryCtxRelease_v2", |st| {
        let o = check_device(st, d)?;
        st.contexts.release(o)
    })
}

/// `cuDevicePrimaryCtxReset_v2` (what `numba.cuda.close()` calls last): the
/// device is checked and the context gets a new `cuCtxGetId` (a reset context
/// is a new one under the same handle). The model keeps the context's
/// allocations and retain count: a real reset destroys the allocations, which the
/// stand-in leaves alive so that a manager's later frees of them stay valid frees.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(d: CUdevice) -> CUresult {
    call("cuDevicePrimaryCtxReset_v2", |st| {
        let o = check_device(st, d)? as usize;
        let resets = &mut st.contexts.resets;
        if resets.len() <= o {
            resets.resize(o + 1, 0);
        }
        resets[o] += 1;
        Ok(())
    })
}

/// `cuCtxGetId` (CUDA 12.0): a context's id, unique in the process; the
/// primary context of device `d` after `r` resets is `(d + 1) << 32 | r`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(c: CUcontext, id: *mut u64) -> CUresult {
    call("cuCtxGetId", |st| {
        let h = if c.is_null() {
            context::current()
        } else {
            check_ctx(st, c)?
        };
        let d = ctx_device(h, st.config.devices).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        let resets = st.contexts.resets.get(d as usize).copied().unwrap_or(0);
        // SAFETY: forwarded to the caller.
        unsafe { put(id, ((d as u64 + 1) << 32) | resets) }
    })
}

fn check_ctx(st: &State, c: CUcontext) -> Result<u64, CUresult> {
    let h = c.0 as u64;
    ctx_device(h, st.config.devices)
        .map(|_| h)
        .ok_or(CUresult::ERROR_INVALID_CONTEXT)
}

/// `cuCtxSetCurrent`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(c: CUcontext) -> CUresult {
    call("cuCtxSetCurrent", |st| {
        let h = if c.is_null() { 0 } else { check_ctx(st, c)? };
        context::set_current(h);
        Ok(())
    })
}

/// `cuCtxGetCurrent`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(c: *mut CUcontext) -> CUresult {
    // SAFETY: forwarded to the caller.
    call("cuCtxGetCurrent", |_| unsafe {
        put(c, ctx_ptr(context::current()))
    })
}

/// `cuCtxPushCurrent_v2`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(c: CUcontext) -> CUresult {
    call("cuCtxPushCurrent_v2", |st| {
        let h = check_ctx(st, c)?;
        context::push(h);
        Ok(())
    })
}

/// `cuCtxPopCurrent_v2`: an empty stack is `CUDA_ERROR_INVALID_CONTEXT`.
///
/// # Safety
/// A non-null `c` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(c: *mut CUcontext) -> CUresult {
    call("cuCtxPopCurrent_v2", |_| {
        let h = context::pop();
        if h == 0 {
            return Err(CUresult::ERROR_INVALID_CONTEXT);
        }
        if !c.is_null() {
            // SAFETY: forwarded to the caller.
            unsafe { put(c, ctx_ptr(h)) }?;
        }
        Ok(())
    })
}

/// `cuCtxSynchronize`: every stream and event completes; pools give back memory
/// above their release thresholds.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    call("cuCtxSynchronize", |st| {
        st.contexts.current_device(st.config.devices)?;
        st.streams.sync_all();
        st.pools.on_sync(&mut st.mem);
        Ok(())
    })
}

/// `cuCtxGetDevice`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(d: *mut CUdevice) -> CUresult {
    call("cuCtxGetDevice", |st| {
        let o = st.contexts.current_device(st.config.devices)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(d, CUdevice(o)) }
    })
}

/// `cuCtxEnablePeerAccess`: from the current context's device to `peer`'s.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    call("cuCtxEnablePeerAccess", |st| {
        let from = st.contexts.current_device(st.config.devices)?;
        let to = ctx_device(check_ctx(st, peer)?, st.config.devices)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        if flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if from == to {
            return Err(CUresult::ERROR_INVALID_DEVICE);
        }
        if st.contexts.peers.contains(&(from, to)) {
            return Err(CUresult::ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        st.contexts.peers.push((from, to));
        Ok(())
    })
}

/// `cuMemGetInfo_v2`: capacity minus what is charged, and the capacity.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    call("cuMemGetInfo_v2", |st| {
        let d = st.contexts.current_device(st.config.devices)?;
        let cap = st.config.capacity;
        // SAFETY: forwarded to the caller.
        unsafe {
            put(free, cap.saturating_sub(st.mem.used_on(d)))?;
            put(total, cap)
        }
    })
}

/// The handle of device `d`'s primary context, for tests.
pub fn primary_context(d: i32) -> CUcontext {
    ctx_ptr(ctx_handle(d))
}

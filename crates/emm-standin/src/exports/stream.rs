//! Streams and events.

use core::ffi::{c_int, c_uint};

use emm_sys::{CUevent, CUresult, CUstream};

use crate::state::{call, put};

fn id<T>(p: *mut T) -> u64 {
    p as u64
}

/// `cuStreamCreateWithPriority`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    s: *mut CUstream,
    _flags: c_uint,
    _priority: c_int,
) -> CUresult {
    call("cuStreamCreateWithPriority", |st| {
        let d = st.contexts.current_device(st.config.devices)?;
        if s.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let h = st.new_handle();
        st.streams.create_stream(h, d);
        // SAFETY: forwarded to the caller.
        unsafe { put(s, CUstream(h as usize as *mut _)) }
    })
}

/// `cuStreamCreate`: `cuStreamCreateWithPriority` at the default priority (0).
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(s: *mut CUstream, flags: c_uint) -> CUresult {
    // SAFETY: forwarded to the caller.
    unsafe { cuStreamCreateWithPriority(s, flags, 0) }
}

/// `cuStreamDestroy_v2`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    call("cuStreamDestroy_v2", |st| {
        st.streams.destroy_stream(id(s.0))
    })
}

/// `cuStreamSynchronize`: the stream completes; pools give back memory above
/// their release thresholds.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    call("cuStreamSynchronize", |st| {
        st.streams.sync_stream(id(s.0))?;
        st.pools.on_sync(&mut st.mem);
        Ok(())
    })
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while the `not_ready` knob says so.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    call("cuStreamQuery", |st| {
        let r = st.streams.query_stream(id(s.0));
        if r.is_success() {
            Ok(())
        } else {
            Err(r)
        }
    })
}

/// `cuStreamIsCapturing`: active (1) for the stream the `capturing` knob names,
/// none (0) for every other; the stream handle is checked.
///
/// # Safety
/// `status` must be writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: CUstream, status: *mut c_int) -> CUresult {
    call("cuStreamIsCapturing", |st| {
        st.streams.check_stream(id(s.0))?;
        if status.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let capturing = st.streams.capturing == Some(id(s.0));
        // SAFETY: non-null and writable per the contract.
        unsafe { *status = c_int::from(capturing) };
        Ok(())
    })
}

thread_local! {
    /// The thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static CAPTURE_MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(0) };
}

/// `cuThreadExchangeStreamCaptureMode`: swaps the thread's mode (0 global, 1
/// thread-local, 2 relaxed) with `*mode`; a mode outside those is refused.
///
/// # Safety
/// `mode` must be readable and writable.
#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    call("cuThreadExchangeStreamCaptureMode", |_st| {
        if mode.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and readable per the contract.
        let want = unsafe { *mode };
        if !(0..=2).contains(&want) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let old = CAPTURE_MODE.with(|m| m.replace(want));
        // SAFETY: writable per the contract.
        unsafe { *mode = old };
        Ok(())
    })
}

/// `cuStreamWaitEvent`: nothing to wait for; both handles are checked.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(s: CUstream, e: CUevent, _flags: c_uint) -> CUresult {
    call("cuStreamWaitEvent", |st| st.streams.wait(id(s.0), id(e.0)))
}

/// `cuEventCreate`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(e: *mut CUevent, flags: c_uint) -> CUresult {
    call("cuEventCreate", |st| {
        st.contexts.current_device(st.config.devices)?;
        if e.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let h = st.new_handle();
        st.streams.create_event(h, flags);
        // SAFETY: forwarded to the caller.
        unsafe { put(e, CUevent(h as usize as *mut _)) }
    })
}

/// `cuEventDestroy_v2`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    call("cuEventDestroy_v2", |st| st.streams.destroy_event(id(e.0)))
}

/// `cuEventRecord`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(e: CUevent, s: CUstream) -> CUresult {
    call("cuEventRecord", |st| st.streams.record(id(e.0), id(s.0)))
}

/// `cuEventSynchronize`: the event completes; pools give back memory above their
/// release thresholds.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    call("cuEventSynchronize", |st| {
        st.streams.sync_event(id(e.0))?;
        st.pools.on_sync(&mut st.mem);
        Ok(())
    })
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` while the `not_ready` knob says so.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    call("cuEventQuery", |st| {
        let r = st.streams.query_event(id(e.0));
        if r.is_success() {
            Ok(())
        } else {
            Err(r)
        }
    })
}

/// `cuEventElapsedTime`: host time between the two records, in milliseconds.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) -> CUresult {
    call("cuEventElapsedTime", |st| {
        let t = st.streams.elapsed(id(a.0), id(b.0))?;
        // SAFETY: forwarded to the caller.
        unsafe { put(ms, t) }
    })
}

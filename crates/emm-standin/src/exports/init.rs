//! `cuInit`, versions, error names, and the stand-in's control function.

use core::ffi::{c_char, c_int, c_uint, CStr};
use std::collections::HashMap;
use std::ffi::CString;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use emm_sys::CUresult;

use crate::state::{call, lock, put};

/// The version `cuDriverGetVersion` reports (CUDA 12.8).
pub const DRIVER_VERSION: c_int = 12080;

/// `cuInit`: flags must be 0.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    call("cuInit", |st| {
        if flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        st.initialized = true;
        crate::fork::watch();
        Ok(())
    })
}

/// `cuDriverGetVersion`.
///
/// # Safety
/// `v` must be valid for a write (see [the module docs](crate::exports)).
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // SAFETY: forwarded to the caller.
    call("cuDriverGetVersion", |_| unsafe { put(v, DRIVER_VERSION) })
}

fn texts() -> &'static HashMap<i32, (CString, CString)> {
    static T: OnceLock<HashMap<i32, (CString, CString)>> = OnceLock::new();
    T.get_or_init(|| {
        (0..1000)
            .map(CUresult)
            .filter_map(|c| {
                let name = c.name()?;
                let text = format!("{name} (emm stand-in driver: host memory, no GPU)");
                Some((c.0, (CString::new(name).ok()?, CString::new(text).ok()?)))
            })
            .collect()
    })
}

/// The name or description of `code` (picked from its pair of texts) into `*p`;
/// null and `CUDA_ERROR_INVALID_VALUE` for an unknown code.
///
/// # Safety
/// `p` must be valid for a write.
unsafe fn error_text(
    function: &'static str,
    code: CUresult,
    p: *mut *const c_char,
    pick: impl Fn(&(CString, CString)) -> *const c_char,
) -> CUresult {
    call(function, |_| {
        let s = texts().get(&code.0).map_or(core::ptr::null(), &pick);
        // SAFETY: forwarded to the caller.
        unsafe { put(p, s) }?;
        if s.is_null() {
            Err(CUresult::ERROR_INVALID_VALUE)
        } else {
            Ok(())
        }
    })
}

/// `cuGetErrorName`: a static string, or `CUDA_ERROR_INVALID_VALUE` for an
/// unknown code.
///
/// # Safety
/// `p` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, p: *mut *const c_char) -> CUresult {
    // SAFETY: forwarded to the caller.
    unsafe { error_text("cuGetErrorName", code, p, |t| t.0.as_ptr()) }
}

/// `cuGetErrorString`: a static description.
///
/// # Safety
/// `p` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, p: *mut *const c_char) -> CUresult {
    // SAFETY: forwarded to the caller.
    unsafe { error_text("cuGetErrorString", code, p, |t| t.1.as_ptr()) }
}

/// The stand-in's control function (not a CUDA symbol): runs one command of
/// [`crate::control`] and writes its answer to `out` (which may be null).
/// Unknown or malformed commands are `CUDA_ERROR_INVALID_VALUE`. Not counted and
/// never failed by injected faults.
///
/// # Safety
/// `command` must be a NUL-terminated string; a non-null `out` must be valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn emmStandinControl(command: *const c_char, out: *mut u64) -> CUresult {
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        if command.is_null() {
            return CUresult::ERROR_INVALID_VALUE;
        }
        // SAFETY: non-null and NUL-terminated per the caller's contract.
        let Ok(cmd) = unsafe { CStr::from_ptr(command) }.to_str() else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        let r = crate::control::run(&mut lock(), cmd);
        match r {
            Ok(v) => {
                if !out.is_null() {
                    // SAFETY: non-null and valid for a write per the caller's contract.
                    unsafe { out.write_unaligned(v) };
                }
                CUresult::SUCCESS
            }
            Err(e) => e,
        }
    }))
    .unwrap_or(CUresult::ERROR_UNKNOWN)
}

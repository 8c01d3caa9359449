//! Small conversions at the C boundary: C strings, stream handles, locks that
//! survive a poisoned mutex.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use crate::status::*;
use emm_sys::CUstream;

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

pub(crate) fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, emm_status> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: the caller passes a NUL-terminated string that outlives the call.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

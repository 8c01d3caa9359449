//! Small conversions at the C boundary: C strings, stream handles, a device
//! ordinal to its manager, locks that survive a poisoned mutex.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

use emm_core::{EmmError, MemoryManager};
use emm_driver::Context;
use emm_sys::CUstream;

use crate::status::emm_status;
use crate::status::invalid;

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

/// Writes a table to a caller's array, as `emm_settings` and `emm_stat_names`
/// do: up to `capacity` of `entries` to `out`, and how many there are to
/// `*count` (`capacity` 0 with `out` NULL asks the count).
/// `EMM_ERR_INVALID_ARGUMENT`, with nothing written, when `count` is NULL or
/// `out` is NULL with `capacity` above 0; `what` names the function.
///
/// # Safety
///
/// `out` is NULL or points to `capacity` writable `T`; `count` is NULL or points
/// to a writable `size_t`.
pub(crate) unsafe fn write_table<T>(
    what: &str,
    entries: &[T],
    out: *mut T,
    capacity: usize,
    count: *mut usize,
) -> emm_status
where
    T: Copy,
{
    if count.is_null() {
        return invalid(format!("{what}: `count` is null"));
    }
    if out.is_null() && capacity > 0 {
        return invalid(format!("{what}: `out` is null with capacity {capacity}"));
    }
    for (i, e) in entries.iter().take(capacity).enumerate() {
        // SAFETY: `out` holds `capacity` entries (the caller's contract), and
        // `i < capacity`.
        unsafe { out.add(i).write(*e) };
    }
    // SAFETY: `count` is not null (checked) and points to a `size_t`.
    unsafe { count.write(entries.len()) };
    crate::status::EMM_OK
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

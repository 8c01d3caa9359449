//! Memory tools over the C ABI: PyTorch-named counters, the peak reset, the
//! allocation history and snapshots (JSON text the library allocates; free it
//! with `emm_string_free`).

use std::ffi::{c_char, CStr, CString};

use emm_core::EmmError;

use crate::manager::{emm_manager, with_manager};
use crate::status::{emm_status, fail, invalid, EMM_OK};

/// Hands `text` to the caller as a NUL-terminated string of the library's
/// (`out`), with its length without the NUL (`len`, may be null).
fn give_string(text: String, out: *mut *mut c_char, len: *mut usize, what: &str) -> emm_status {
    if out.is_null() {
        return invalid(format!("{what}: `out` is null"));
    }
    let n = text.len();
    let Ok(c) = CString::new(text) else {
        return invalid(format!("{what}: the text holds a NUL byte (a bug in emm)"));
    };
    // SAFETY: `out` is non-null and writable per the contract; `len` when non-null.
    unsafe {
        *out = c.into_raw();
        if !len.is_null() {
            *len = n;
        }
    }
    EMM_OK
}

/// Frees a string the library returned (`emm_memory_stats_json`,
/// `emm_memory_snapshot_json`). NULL is ignored.
#[no_mangle]
pub unsafe extern "C" fn emm_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from CString::into_raw in give_string and is freed once.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Memory tools: one counter by its name into `*value` (an unknown name:
/// `EMM_ERR_INVALID_ARGUMENT`). Counters are named as in PyTorch's `memory_stats`
/// where they mean the same (e.g. "reserved_bytes.all.current"), emm's own under
/// "emm." (e.g. "emm.thread_cached_bytes"); `emm_stat_names` lists every name with
/// what it counts.
/// In the pool, "allocated" excludes blocks parked in thread caches (they count as
/// "active"); the allocated peaks are sampled at every locked allocation and every
/// query (a peak reached by thread-cache hits alone and undone before the next
/// sample is missed).
#[no_mangle]
pub unsafe extern "C" fn emm_memory_stat(
    m: *mut emm_manager,
    key: *const c_char,
    value: *mut u64,
) -> emm_status {
    with_manager(m, |h| {
        if key.is_null() || value.is_null() {
            return invalid("emm_memory_stat: null argument");
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let Ok(key) = unsafe { CStr::from_ptr(key) }.to_str() else {
            return invalid("emm_memory_stat: the key is not UTF-8");
        };
        match h.manager.memory_stats().iter().find(|(k, _)| *k == key) {
            Some(&(_, v)) => {
                // SAFETY: non-null and writable per the contract.
                unsafe { *value = v };
                EMM_OK
            }
            None => invalid(format!(
                "emm_memory_stat: the {} manager keeps no counter {key:?}",
                h.manager.name()
            )),
        }
    })
}

/// Every counter (see `emm_memory_stat`) as one JSON object
/// (`{"allocated_bytes.all.current": 1024, ...}`) into `*out`, which the caller
/// frees with `emm_string_free`; `*len` (may be NULL) gets its length.
#[no_mangle]
pub unsafe extern "C" fn emm_memory_stats_json(
    m: *mut emm_manager,
    out: *mut *mut c_char,
    len: *mut usize,
) -> emm_status {
    with_manager(m, |h| {
        let text = emm_core::stats_json(&h.manager.memory_stats());
        give_string(text, out, len, "emm_memory_stats_json")
    })
}

/// Sets every peak counter to its current value.
#[no_mangle]
pub unsafe extern "C" fn emm_reset_peak_stats(m: *mut emm_manager) -> emm_status {
    with_manager(m, |h| {
        h.manager.reset_peak_stats();
        EMM_OK
    })
}

/// Keeps the latest `max_entries` allocation events for `emm_memory_snapshot_json`
/// (0: stop and drop them). `EMM_ERR_UNSUPPORTED` for managers without a history.
#[no_mangle]
pub unsafe extern "C" fn emm_record_memory_history(
    m: *mut emm_manager,
    max_entries: usize,
) -> emm_status {
    with_manager(m, |h| match h.manager.record_history(max_entries) {
        Ok(()) => EMM_OK,
        Err(e) => fail(e),
    })
}

/// The manager's segments, blocks, recorded history and counters as JSON into
/// `*out`, which the caller frees with `emm_string_free`; `*len` (may be NULL) gets
/// its length:
///
/// ```text
/// {"segments": [{"address", "total_size", "stream", "large", "expandable",
///                "blocks": [{"address", "size", "requested_size", "allocated"}]}],
///  "trace": [{"action", "addr", "size", "stream", "time_us", "device_free"}],
///  "stats": {...}}
/// ```
///
/// taken at one time (the calling thread's cached blocks go back to the pool first;
/// other threads' cached blocks show as allocated). Actions: alloc, free_requested,
/// free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom.
/// `EMM_ERR_UNSUPPORTED` for managers without segments of their own.
#[no_mangle]
pub unsafe extern "C" fn emm_memory_snapshot_json(
    m: *mut emm_manager,
    out: *mut *mut c_char,
    len: *mut usize,
) -> emm_status {
    with_manager(m, |h| match h.manager.snapshot() {
        Some(s) => give_string(s.to_json(), out, len, "emm_memory_snapshot_json"),
        None => fail(EmmError::Unsupported {
            manager: h.manager.name().to_owned(),
            operation: "snapshot",
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::library::emm_last_error_code;
    use crate::status::EMM_ERR_INVALID_ARGUMENT;

    #[test]
    fn null_handles_and_outputs_are_refused() {
        // SAFETY: null handles and pointers are what is being tested.
        unsafe {
            let mut v = 0u64;
            assert_eq!(
                emm_memory_stat(core::ptr::null_mut(), c"num_ooms".as_ptr(), &mut v),
                EMM_ERR_INVALID_ARGUMENT
            );
            let mut s: *mut c_char = core::ptr::null_mut();
            assert_eq!(
                emm_memory_snapshot_json(core::ptr::null_mut(), &mut s, core::ptr::null_mut()),
                EMM_ERR_INVALID_ARGUMENT
            );
            assert!(s.is_null());
            assert_eq!(
                emm_reset_peak_stats(core::ptr::null_mut()),
                EMM_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                emm_record_memory_history(core::ptr::null_mut(), 10),
                EMM_ERR_INVALID_ARGUMENT
            );
            assert_eq!(emm_last_error_code(), EMM_ERR_INVALID_ARGUMENT);
            emm_string_free(core::ptr::null_mut());
        }
    }

    #[test]
    fn strings_round_trip() {
        let mut s: *mut c_char = core::ptr::null_mut();
        let mut n = 0usize;
        assert_eq!(give_string("{}".into(), &mut s, &mut n, "t"), EMM_OK);
        assert_eq!(n, 2);
        // SAFETY: `s` came from give_string; freed once.
        unsafe {
            assert_eq!(CStr::from_ptr(s).to_str(), Ok("{}"));
            emm_string_free(s);
        }
    }
}

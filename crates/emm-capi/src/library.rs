//! The library as a whole: its ABI version, configuration in code, and the
//! calling thread's last error.

use std::ffi::{c_char, c_int};

use crate::ffi::*;
use crate::guard::guard;
use crate::status::*;

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
/// `pool_release_threshold`); 312 added `torch.cuda.MemPool` for emm's object
/// (`emm_torch_graph_pool_create`, `emm_torch_graph_pool_info`); 313 added
/// `emm_configure_check`; 314 added `emm_device_count`.
#[no_mangle]
pub extern "C" fn emm_abi_version() -> c_int {
    ABI_VERSION
}

/// The number of CUDA devices the driver sees, in `*out` (a device ordinal is
/// below it): for checking ordinals before anything is configured or created.
/// No driver is `EMM_ERR_DRIVER`. Since ABI 314.
#[no_mangle]
pub unsafe extern "C" fn emm_device_count(out: *mut c_int) -> emm_status {
    guard(|| {
        if out.is_null() {
            return invalid("emm_device_count: `out` is null");
        }
        match emm_driver::Device::count() {
            Ok(n) => {
                // SAFETY: `out` is non-null and writable per the contract.
                unsafe { *out = c_int::try_from(n).unwrap_or(c_int::MAX) };
                EMM_OK
            }
            Err(e) => fail(e.into()),
        }
    })
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
    with_key_value("emm_configure", key, value, emm::configure)
}

/// Whether `emm_configure(key, value)` would take the value, applying nothing:
/// `EMM_OK` for a known key with a value that parses (for "manager", a registered
/// name), else `EMM_ERR_INVALID_ARGUMENT` (`EMM_ERR_UNKNOWN_MANAGER`) saying why.
/// Whether a manager has been created, which may refuse a change with
/// `EMM_ERR_ALREADY_IN_USE`, is not asked. A caller with several settings checks
/// them all first, so that a bad one applies none. Since ABI 313.
#[no_mangle]
pub unsafe extern "C" fn emm_configure_check(
    key: *const c_char,
    value: *const c_char,
) -> emm_status {
    with_key_value("emm_configure_check", key, value, emm::check_configuration)
}

/// `f(key, value)` under the guard, the two C strings read first (a null or
/// unreadable one is the status of `what`'s argument), its error as a status.
/// `key` and `value` are the caller's pointers under its entry point's
/// contract (null or NUL-terminated), as `c_str` reads them.
fn with_key_value(
    what: &str,
    key: *const c_char,
    value: *const c_char,
    f: impl FnOnce(&str, &str) -> emm_core::Result<()>,
) -> emm_status {
    guard(|| {
        let key = match c_str(key, &format!("{what}: `key`")) {
            Ok(k) => k,
            Err(c) => return c,
        };
        let value = match c_str(value, &format!("{what}: `value`")) {
            Ok(v) => v,
            Err(c) => return c,
        };
        match f(key, value) {
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
        return crate::status::invalid(
            "emm_last_oom: the last failure on this thread was not out of memory",
        );
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

#[cfg(test)]
mod tests {
    // The library's entry points as a program calls them, with manager handles.
    use super::*;
    use crate::manager::*;
    use emm_core::EmmError;
    use std::ffi::{c_char, CStr};

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

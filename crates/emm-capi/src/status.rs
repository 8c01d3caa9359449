//! The plumbing every entry point shares: the status codes and the ABI version,
//! the calling thread's last error and out-of-memory figures, the mapping of
//! [`EmmError`] to a status, and [`guard`] (no panic and no forked child crosses
//! the boundary).

use std::cell::RefCell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use emm_core::{EmmError, MemoryManager};

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
    pub(crate) static LAST_ERROR: RefCell<(emm_status, String)> = const { RefCell::new((EMM_OK, String::new())) };
    /// Requested, free and total bytes of the last failure when it was out of memory.
    pub(crate) static LAST_OOM: std::cell::Cell<Option<(usize, usize, usize)>> = const { std::cell::Cell::new(None) };
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
    crate::log::output::init();
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

#[cfg(test)]
mod tests {
    // The C surface as a program sees it (the entry points of every module).
    use super::*;
    use crate::*;
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

//! The plumbing every entry point shares: the status codes and the ABI version,
//! the calling thread's last error and out-of-memory figures, the mapping of
//! [`EmmError`] to a status, and [`guard`](crate::guard::guard) (no panic and no forked child crosses
//! the boundary).

use std::cell::RefCell;
use std::ffi::c_int;

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
pub const ABI_VERSION: c_int = 314;

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

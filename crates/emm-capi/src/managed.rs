//! Managed memory over the C ABI (since ABI 304): `emm_alloc_managed` and
//! `emm_free_managed`, Numba's `memallocmanaged` for C callers.
//!
//! A handle keeps its managed allocations apart from its device allocations:
//! `emm_free` refuses a managed address (and says which function frees it), so a
//! managed block can never reach a manager's device pool.

use std::ffi::c_uint;

use emm_core::ManagedAttach;

use crate::ffi::lock;
use crate::manager::{emm_manager, with_manager};
use crate::status::{emm_status, fail_alloc, invalid, EMM_OK};

/// `flags` of `emm_alloc_managed`: accessible from any stream on any device
/// (`CU_MEM_ATTACH_GLOBAL`). Since ABI 304.
pub const EMM_MEM_ATTACH_GLOBAL: c_uint = 1;
/// `flags` of `emm_alloc_managed`: attached to the host (`CU_MEM_ATTACH_HOST`).
/// Since ABI 304.
pub const EMM_MEM_ATTACH_HOST: c_uint = 2;

/// Allocates `size` bytes of managed memory (`cuMemAllocManaged`; Numba's
/// `memallocmanaged`): one address valid on the host and on every device, into
/// `*out`. `flags` is exactly one of `EMM_MEM_ATTACH_GLOBAL` (accessible from any
/// stream on any device) and `EMM_MEM_ATTACH_HOST` (attached to the host); anything
/// else is `EMM_ERR_INVALID_ARGUMENT`. `size` 0 sets `*out` to 0 and allocates
/// nothing. Never pooled: one driver allocation per call, freed at once by
/// `emm_free_managed` (`emm_free` refuses it, and the other way round). Counted
/// apart from `emm_get_stats`, under the `emm.managed_*` names of
/// `emm_memory_stat` (see `emm_stat_names`). `EMM_ERR_UNSUPPORTED` where the driver or device has no
/// managed memory; `EMM_ERR_OUT_OF_MEMORY` (see `emm_last_oom`) when it cannot be
/// had. Since ABI 304.
#[no_mangle]
pub unsafe extern "C" fn emm_alloc_managed(
    m: *mut emm_manager,
    size: usize,
    flags: c_uint,
    out: *mut u64,
) -> emm_status {
    with_manager(m, |h| {
        if out.is_null() {
            return invalid("emm_alloc_managed: `out` is null");
        }
        let Some(attach) = ManagedAttach::from_driver_flags(flags) else {
            return invalid(format!(
                "emm_alloc_managed: flags {flags:#x} are not EMM_MEM_ATTACH_GLOBAL (1) or EMM_MEM_ATTACH_HOST (2)"
            ));
        };
        match emm_core::alloc_managed_from(h.manager.as_ref(), size, attach) {
            Ok(mem) => {
                let p = mem.ptr();
                if mem.size() > 0 {
                    lock(&h.managed).insert(p, mem);
                }
                // SAFETY: non-null and writable per the contract.
                unsafe { *out = p };
                EMM_OK
            }
            Err(e) => fail_alloc(e, size, h.manager.as_ref()),
        }
    })
}

/// Frees managed memory from `emm_alloc_managed` on this handle (0 does nothing;
/// device memory from `emm_alloc` is refused with `EMM_ERR_INVALID_ARGUMENT`).
/// Since ABI 304.
#[no_mangle]
pub unsafe extern "C" fn emm_free_managed(m: *mut emm_manager, ptr: u64) -> emm_status {
    with_manager(m, |h| {
        if ptr == 0 {
            return EMM_OK;
        }
        // The handle's lock is released before the free runs (and before the
        // device map is looked at: one lock at a time).
        let removed = lock(&h.managed).remove(&ptr);
        match removed {
            Some(mem) => {
                drop(mem);
                EMM_OK
            }
            None if lock(&h.device).contains_key(&ptr) => invalid(format!(
                "emm_free_managed: {ptr:#x} is device memory from emm_alloc; free it with emm_free"
            )),
            None => invalid(format!(
                "emm_free_managed: {ptr:#x} was not allocated with emm_alloc_managed through this handle (or was freed already)"
            )),
        }
    })
}

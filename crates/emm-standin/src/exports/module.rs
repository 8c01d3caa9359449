//! Modules and kernels: not supported. There is no device to run code on, so
//! `cuModuleLoadData` and `cuLaunchKernel` return `CUDA_ERROR_NOT_SUPPORTED`, and
//! since no module can exist, the calls that take one return
//! `CUDA_ERROR_INVALID_HANDLE`.

use core::ffi::{c_char, c_uint, c_void};

use emm_sys::{CUfunction, CUmodule, CUresult, CUstream};

use crate::state::call;

/// `cuModuleLoadData`: `CUDA_ERROR_NOT_SUPPORTED` (no kernels on a host).
///
/// # Safety
/// None beyond the C ABI (nothing is read).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(_m: *mut CUmodule, _image: *const c_void) -> CUresult {
    call("cuModuleLoadData", |_| Err(CUresult::ERROR_NOT_SUPPORTED))
}

/// `cuModuleUnload`: `CUDA_ERROR_INVALID_HANDLE` (no module can exist).
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(_m: CUmodule) -> CUresult {
    call("cuModuleUnload", |_| Err(CUresult::ERROR_INVALID_HANDLE))
}

/// `cuModuleGetFunction`: `CUDA_ERROR_INVALID_HANDLE` (no module can exist).
///
/// # Safety
/// None beyond the C ABI (nothing is read).
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    _f: *mut CUfunction,
    _m: CUmodule,
    _name: *const c_char,
) -> CUresult {
    call("cuModuleGetFunction", |_| {
        Err(CUresult::ERROR_INVALID_HANDLE)
    })
}

/// `cuLaunchKernel`: `CUDA_ERROR_NOT_SUPPORTED` (no kernels on a host).
///
/// # Safety
/// None beyond the C ABI (nothing is read).
#[no_mangle]
#[allow(clippy::too_many_arguments)] // reason: the C signature
pub unsafe extern "C" fn cuLaunchKernel(
    _f: CUfunction,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    _s: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    call("cuLaunchKernel", |_| Err(CUresult::ERROR_NOT_SUPPORTED))
}

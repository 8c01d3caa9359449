//! `cuGetProcAddress` and `cuGetProcAddress_v2`: the driver's entry points by
//! name and API version, as the NVIDIA Python bindings (`cuda-bindings`, used by
//! numba-cuda) resolve every function (they `dlsym` only `cuGetProcAddress_v2`).
//!
//! A caller asks for the base name (`cuMemAlloc`) and the CUDA version it was
//! built for (`3020` for 3.2); the driver answers the newest variant introduced at
//! or before that version (`cuMemAlloc_v2`). The table below (`entries!`) lists each exported
//! function under its base name with the version its ABI appeared in (the
//! versions of `cudaTypedefs.h`); a variant the stand-in does not implement (the
//! 32-bit `cuMemAlloc` of CUDA 2.0, say) is simply absent, so asking for it is
//! `CUDA_ERROR_NOT_FOUND` with `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`, and an
//! unknown name is `CUDA_ERROR_NOT_FOUND` with
//! `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`; `*pfn` is null then. The flags pick
//! legacy or per-thread default-stream variants; the model has one default stream
//! that runs everything at call time, so both get the same functions.

use core::ffi::{c_char, c_int, c_void, CStr};
use std::collections::HashMap;
use std::sync::OnceLock;

use emm_sys::CUresult;

use crate::state::{call, put};

use super::{copy, device, init, memory, mempool, module, stream, vmm};

/// `CU_GET_PROC_ADDRESS_DEFAULT | LEGACY_STREAM | PER_THREAD_DEFAULT_STREAM`.
const KNOWN_FLAGS: u64 = 0b11;

/// `CUdriverProcAddressQueryResult`.
mod query {
    pub const SUCCESS: i32 = 0;
    pub const SYMBOL_NOT_FOUND: i32 = 1;
    pub const VERSION_NOT_SUFFICIENT: i32 = 2;
}

macro_rules! entries {
    ($($name:literal => [$($version:literal : $f:path),+ $(,)?],)*) => {
        /// Every entry point `cuGetProcAddress` hands out: base name, then (CUDA
        /// version of the variant, the function) in rising version order.
        fn table() -> HashMap<&'static str, Vec<(c_int, usize)>> {
            let mut t = HashMap::new();
            $( t.insert($name, vec![$(($version, $f as *const () as usize)),+]); )*
            t
        }
    };
}

entries! {
    "cuGetErrorString" => [6000: init::cuGetErrorString],
    "cuGetErrorName" => [6000: init::cuGetErrorName],
    "cuInit" => [2000: init::cuInit],
    "cuDriverGetVersion" => [2020: init::cuDriverGetVersion],
    "cuGetProcAddress" => [11030: cuGetProcAddress, 12000: cuGetProcAddress_v2],
    "cuDeviceGet" => [2000: device::cuDeviceGet],
    "cuDeviceGetCount" => [2000: device::cuDeviceGetCount],
    "cuDeviceGetName" => [2000: device::cuDeviceGetName],
    // `_v2` (11.4) differs only in what MIG devices report: same signature.
    "cuDeviceGetUuid" => [9020: device::cuDeviceGetUuid, 11040: device::cuDeviceGetUuid],
    "cuDeviceTotalMem" => [3020: device::cuDeviceTotalMem_v2],
    "cuDeviceGetAttribute" => [2000: device::cuDeviceGetAttribute],
    "cuDeviceCanAccessPeer" => [4000: device::cuDeviceCanAccessPeer],
    "cuDevicePrimaryCtxRetain" => [7000: device::cuDevicePrimaryCtxRetain],
    "cuDevicePrimaryCtxRelease" => [11000: device::cuDevicePrimaryCtxRelease_v2],
    "cuDevicePrimaryCtxReset" => [11000: device::cuDevicePrimaryCtxReset_v2],
    "cuCtxSetCurrent" => [4000: device::cuCtxSetCurrent],
    "cuCtxGetCurrent" => [4000: device::cuCtxGetCurrent],
    "cuCtxPushCurrent" => [4000: device::cuCtxPushCurrent_v2],
    "cuCtxPopCurrent" => [4000: device::cuCtxPopCurrent_v2],
    "cuCtxSynchronize" => [2000: device::cuCtxSynchronize],
    "cuCtxGetDevice" => [2000: device::cuCtxGetDevice],
    "cuCtxGetId" => [12000: device::cuCtxGetId],
    "cuCtxEnablePeerAccess" => [4000: device::cuCtxEnablePeerAccess],
    "cuMemGetInfo" => [3020: device::cuMemGetInfo_v2],
    "cuMemAlloc" => [3020: memory::cuMemAlloc_v2],
    "cuMemAllocManaged" => [6000: memory::cuMemAllocManaged],
    "cuMemFree" => [3020: memory::cuMemFree_v2],
    "cuMemGetAddressRange" => [3020: memory::cuMemGetAddressRange_v2],
    "cuMemHostAlloc" => [2020: memory::cuMemHostAlloc],
    "cuMemFreeHost" => [2000: memory::cuMemFreeHost],
    "cuMemHostRegister" => [6050: memory::cuMemHostRegister_v2],
    "cuMemHostUnregister" => [4000: memory::cuMemHostUnregister],
    "cuMemHostGetDevicePointer" => [3020: memory::cuMemHostGetDevicePointer_v2],
    "cuPointerGetAttribute" => [4000: memory::cuPointerGetAttribute],
    "cuIpcGetMemHandle" => [4010: memory::cuIpcGetMemHandle],
    "cuIpcOpenMemHandle" => [11000: memory::cuIpcOpenMemHandle_v2],
    "cuIpcCloseMemHandle" => [4010: memory::cuIpcCloseMemHandle],
    "cuMemcpyHtoD" => [3020: copy::cuMemcpyHtoD_v2],
    "cuMemcpyDtoH" => [3020: copy::cuMemcpyDtoH_v2],
    "cuMemcpyDtoD" => [3020: copy::cuMemcpyDtoD_v2],
    "cuMemcpyHtoDAsync" => [3020: copy::cuMemcpyHtoDAsync_v2],
    "cuMemcpyDtoHAsync" => [3020: copy::cuMemcpyDtoHAsync_v2],
    "cuMemcpyDtoDAsync" => [3020: copy::cuMemcpyDtoDAsync_v2],
    "cuMemcpyPeer" => [4000: copy::cuMemcpyPeer],
    "cuMemsetD8" => [3020: copy::cuMemsetD8_v2],
    "cuMemsetD8Async" => [3020: copy::cuMemsetD8Async],
    "cuMemsetD32" => [3020: copy::cuMemsetD32_v2],
    "cuMemsetD32Async" => [3020: copy::cuMemsetD32Async],
    "cuMemAllocAsync" => [11020: mempool::cuMemAllocAsync],
    "cuMemAllocFromPoolAsync" => [11020: mempool::cuMemAllocFromPoolAsync],
    "cuMemFreeAsync" => [11020: mempool::cuMemFreeAsync],
    "cuDeviceGetDefaultMemPool" => [11020: mempool::cuDeviceGetDefaultMemPool],
    "cuMemPoolCreate" => [11020: mempool::cuMemPoolCreate],
    "cuMemPoolDestroy" => [11020: mempool::cuMemPoolDestroy],
    "cuMemPoolSetAttribute" => [11020: mempool::cuMemPoolSetAttribute],
    "cuMemPoolGetAttribute" => [11020: mempool::cuMemPoolGetAttribute],
    "cuMemPoolTrimTo" => [11020: mempool::cuMemPoolTrimTo],
    "cuMemPoolSetAccess" => [11020: mempool::cuMemPoolSetAccess],
    "cuMemPoolExportToShareableHandle" => [11020: mempool::cuMemPoolExportToShareableHandle],
    "cuMemPoolImportFromShareableHandle" => [11020: mempool::cuMemPoolImportFromShareableHandle],
    "cuMemPoolExportPointer" => [11020: mempool::cuMemPoolExportPointer],
    "cuMemPoolImportPointer" => [11020: mempool::cuMemPoolImportPointer],
    "cuModuleLoadData" => [2000: module::cuModuleLoadData],
    "cuModuleUnload" => [2000: module::cuModuleUnload],
    "cuModuleGetFunction" => [2000: module::cuModuleGetFunction],
    "cuLaunchKernel" => [4000: module::cuLaunchKernel],
    "cuStreamCreate" => [2000: stream::cuStreamCreate],
    "cuStreamCreateWithPriority" => [5050: stream::cuStreamCreateWithPriority],
    "cuStreamDestroy" => [4000: stream::cuStreamDestroy_v2],
    "cuStreamSynchronize" => [2000: stream::cuStreamSynchronize],
    "cuStreamQuery" => [2000: stream::cuStreamQuery],
    "cuStreamIsCapturing" => [10000: stream::cuStreamIsCapturing],
    "cuThreadExchangeStreamCaptureMode" => [10010: stream::cuThreadExchangeStreamCaptureMode],
    "cuStreamWaitEvent" => [3020: stream::cuStreamWaitEvent],
    "cuEventCreate" => [2000: stream::cuEventCreate],
    "cuEventDestroy" => [4000: stream::cuEventDestroy_v2],
    "cuEventRecord" => [2000: stream::cuEventRecord],
    "cuEventSynchronize" => [2000: stream::cuEventSynchronize],
    "cuEventQuery" => [2000: stream::cuEventQuery],
    "cuEventElapsedTime" => [2000: stream::cuEventElapsedTime],
    "cuMemAddressReserve" => [10020: vmm::cuMemAddressReserve],
    "cuMemAddressFree" => [10020: vmm::cuMemAddressFree],
    "cuMemCreate" => [10020: vmm::cuMemCreate],
    "cuMemExportToShareableHandle" => [10020: vmm::cuMemExportToShareableHandle],
    "cuMemImportFromShareableHandle" => [10020: vmm::cuMemImportFromShareableHandle],
    "cuMemRelease" => [10020: vmm::cuMemRelease],
    "cuMemMap" => [10020: vmm::cuMemMap],
    "cuMemUnmap" => [10020: vmm::cuMemUnmap],
    "cuMemSetAccess" => [10020: vmm::cuMemSetAccess],
    "cuMemGetAllocationGranularity" => [10020: vmm::cuMemGetAllocationGranularity],
}

/// The function `cuGetProcAddress` answers for `name` at `version`, or the
/// `CUdriverProcAddressQueryResult` saying why none.
pub fn lookup(name: &str, version: c_int) -> Result<usize, i32> {
    static TABLE: OnceLock<HashMap<&'static str, Vec<(c_int, usize)>>> = OnceLock::new();
    let variants = TABLE
        .get_or_init(table)
        .get(name)
        .ok_or(query::SYMBOL_NOT_FOUND)?;
    variants
        .iter()
        .rev()
        .find(|(since, _)| *since <= version)
        .map(|&(_, f)| f)
        .ok_or(query::VERSION_NOT_SUFFICIENT)
}

/// Both versions' body: `*pfn` (and `*status` when not null) always written.
///
/// # Safety
/// `symbol` is null or NUL-terminated; `pfn` and a non-null `status` are valid
/// for writes.
unsafe fn resolve(
    function: &'static str,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    call(function, |_| {
        if symbol.is_null() || pfn.is_null() || flags & !KNOWN_FLAGS != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and NUL-terminated per the caller's contract.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        let found = lookup(name, version);
        let (f, q) = match found {
            Ok(f) => (f as *mut c_void, query::SUCCESS),
            Err(q) => (core::ptr::null_mut(), q),
        };
        if trace() {
            eprintln!("emm-standin: cuGetProcAddress({name}, {version}) -> {q}");
        }
        // SAFETY: forwarded to the caller.
        unsafe { put(pfn, f) }?;
        if !status.is_null() {
            // SAFETY: non-null and valid for a write per the caller's contract.
            unsafe { put(status, q) }?;
        }
        found.map(|_| ()).map_err(|_| CUresult::ERROR_NOT_FOUND)
    })
}

/// `EMM_STANDIN_TRACE_PROCS=1`: every lookup is printed to stderr (which
/// functions a binding asks for, and which the stand-in lacks).
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var("EMM_STANDIN_TRACE_PROCS").is_ok_and(|v| v == "1"))
}

/// `cuGetProcAddress` (CUDA 11.3's signature).
///
/// # Safety
/// `symbol` must be NUL-terminated; `pfn` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: forwarded to the caller.
    unsafe {
        resolve(
            "cuGetProcAddress",
            symbol,
            pfn,
            version,
            flags,
            core::ptr::null_mut(),
        )
    }
}

/// `cuGetProcAddress_v2` (CUDA 12.0): also reports a
/// `CUdriverProcAddressQueryResult` through `status` when it is not null.
///
/// # Safety
/// `symbol` must be NUL-terminated; `pfn` and a non-null `status` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: forwarded to the caller.
    unsafe { resolve("cuGetProcAddress_v2", symbol, pfn, version, flags, status) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(name: &str, version: c_int, flags: u64) -> (CUresult, usize, c_int) {
        let name = std::ffi::CString::new(name).unwrap();
        let mut f: *mut c_void = core::ptr::dangling_mut();
        let mut status: c_int = -1;
        // SAFETY: a NUL-terminated name and writable out-pointers.
        let r = unsafe { cuGetProcAddress_v2(name.as_ptr(), &mut f, version, flags, &mut status) };
        (r, f as usize, status)
    }

    #[test]
    fn names_resolve_to_the_newest_variant_the_version_allows() {
        // Works before cuInit, as the driver's does (the bindings call it first).
        let alloc = memory::cuMemAlloc_v2 as *const () as usize;
        assert_eq!(
            get("cuMemAlloc", 3020, 0),
            (CUresult::SUCCESS, alloc, query::SUCCESS)
        );
        assert_eq!(
            get("cuMemAlloc", 12080, 2),
            (CUresult::SUCCESS, alloc, query::SUCCESS)
        );
        // Only the 32-bit variant existed in CUDA 2.0: the stand-in has none.
        assert_eq!(
            get("cuMemAlloc", 2000, 0),
            (CUresult::ERROR_NOT_FOUND, 0, query::VERSION_NOT_SUFFICIENT)
        );
        let v1 = cuGetProcAddress as *const () as usize;
        let v2 = cuGetProcAddress_v2 as *const () as usize;
        assert_eq!(get("cuGetProcAddress", 11030, 0).1, v1);
        assert_eq!(get("cuGetProcAddress", 12000, 0).1, v2);
    }

    #[test]
    fn unknown_names_and_bad_arguments_are_errors_not_crashes() {
        assert_eq!(
            get("cuGraphLaunch", 12080, 0),
            (CUresult::ERROR_NOT_FOUND, 0, query::SYMBOL_NOT_FOUND)
        );
        assert_eq!(get("cuMemAlloc_v2", 12080, 0).2, query::SYMBOL_NOT_FOUND);
        assert_eq!(get("cuMemAlloc", 12080, 4).0, CUresult::ERROR_INVALID_VALUE);
        let name = c"cuInit";
        // SAFETY: null out-pointers are refused before any write.
        let r = unsafe { cuGetProcAddress(name.as_ptr(), core::ptr::null_mut(), 12080, 0) };
        assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
        let mut f: *mut c_void = core::ptr::null_mut();
        // SAFETY: as above; the symbol is null.
        let r = unsafe { cuGetProcAddress(core::ptr::null(), &mut f, 12080, 0) };
        assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
        // The status pointer is optional.
        // SAFETY: a NUL-terminated name and a writable `f`.
        let r =
            unsafe { cuGetProcAddress_v2(name.as_ptr(), &mut f, 12080, 0, core::ptr::null_mut()) };
        assert_eq!(r, CUresult::SUCCESS);
        assert_eq!(f as usize, init::cuInit as *const () as usize);
    }

    #[test]
    fn every_entry_is_a_function_the_library_exports() {
        for (name, variants) in table() {
            for &(version, f) in &variants {
                assert!(f != 0 && version >= 2000, "{name} {version}");
                assert_eq!(lookup(name, version), Ok(f), "{name} {version}");
            }
        }
    }
}

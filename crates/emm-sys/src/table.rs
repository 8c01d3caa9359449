//! The driver's function table, resolved at run time.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use libloading::Library;

use crate::types::*;
use crate::LoadError;

macro_rules! driver_table {
    (
        required { $( $(#[$rm:meta])* $rname:ident = $rsym:literal ( $($rarg:ty),* ); )* }
        optional { $( $(#[$om:meta])* $oname:ident = $osym:literal ( $($oarg:ty),* ); )* }
    ) => {
        /// The driver's entry points.
        ///
        /// Each field is the raw C function; calling one is `unsafe` and its
        /// preconditions are those of the CUDA driver API documentation of the
        /// symbol named in the field's docs. Required symbols are plain function
        /// pointers (a driver lacking one fails to load with
        /// [`LoadError::MissingSymbol`]); optional ones are `Option`s, `None` when the
        /// driver predates them.
        ///
        /// The table keeps its `Library` alive: the pointers stay valid as long as
        /// the `Driver` (or a clone of its `Arc<Library>`) lives.
        #[allow(missing_docs)]
        pub struct Driver {
            library: Arc<Library>,
            path: String,
            $( $(#[$rm])* #[doc = concat!("`", $rsym, "`")] pub $rname: unsafe extern "C" fn($($rarg),*) -> CUresult, )*
            $( $(#[$om])* #[doc = concat!("`", $osym, "` (optional)")] pub $oname: Option<unsafe extern "C" fn($($oarg),*) -> CUresult>, )*
        }

        impl Driver {
            /// Names of the optional symbols this driver lacks.
            pub fn missing_optional(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $( if self.$oname.is_none() { missing.push($osym); } )*
                missing
            }

            /// Resolves every symbol of the table in `library`.
            ///
            /// # Safety
            /// `library` must be a CUDA driver library: the symbols found are called
            /// with the signatures of `cuda.h`.
            pub(crate) unsafe fn from_library(library: Library, path: String) -> Result<Driver, LoadError> {
                $(
                    // SAFETY: the caller vouches that this is the CUDA driver, whose
                    // symbol has exactly this C signature.
                    let $rname = unsafe {
                        library.get::<unsafe extern "C" fn($($rarg),*) -> CUresult>(concat!($rsym, "\0").as_bytes())
                    }
                    .map(|s| *s)
                    .map_err(|e| LoadError::MissingSymbol { path: path.clone(), symbol: $rsym, reason: e.to_string() })?;
                )*
                $(
                    // SAFETY: as above; a missing optional symbol is `None`.
                    let $oname = unsafe {
                        library.get::<unsafe extern "C" fn($($oarg),*) -> CUresult>(concat!($osym, "\0").as_bytes())
                    }
                    .ok()
                    .map(|s| *s);
                )*
                Ok(Driver { library: Arc::new(library), path, $($rname,)* $($oname,)* })
            }
        }
    };
}

driver_table! {
    required {
        init = "cuInit"(c_uint);
        driver_get_version = "cuDriverGetVersion"(*mut c_int);
        get_error_name = "cuGetErrorName"(CUresult, *mut *const c_char);
        get_error_string = "cuGetErrorString"(CUresult, *mut *const c_char);

        device_get_count = "cuDeviceGetCount"(*mut c_int);
        device_get = "cuDeviceGet"(*mut CUdevice, c_int);
        device_get_name = "cuDeviceGetName"(*mut c_char, c_int, CUdevice);
        device_get_uuid = "cuDeviceGetUuid"(*mut CUuuid, CUdevice);
        device_get_attribute = "cuDeviceGetAttribute"(*mut c_int, CUdevice_attribute, CUdevice);
        device_total_mem = "cuDeviceTotalMem_v2"(*mut usize, CUdevice);
        device_can_access_peer = "cuDeviceCanAccessPeer"(*mut c_int, CUdevice, CUdevice);

        device_primary_ctx_retain = "cuDevicePrimaryCtxRetain"(*mut CUcontext, CUdevice);
        device_primary_ctx_release = "cuDevicePrimaryCtxRelease_v2"(CUdevice);
        ctx_set_current = "cuCtxSetCurrent"(CUcontext);
        ctx_get_current = "cuCtxGetCurrent"(*mut CUcontext);
        ctx_push_current = "cuCtxPushCurrent_v2"(CUcontext);
        ctx_pop_current = "cuCtxPopCurrent_v2"(*mut CUcontext);
        ctx_synchronize = "cuCtxSynchronize"();
        ctx_get_device = "cuCtxGetDevice"(*mut CUdevice);
        ctx_enable_peer_access = "cuCtxEnablePeerAccess"(CUcontext, c_uint);

        mem_alloc = "cuMemAlloc_v2"(*mut CUdeviceptr, usize);
        mem_free = "cuMemFree_v2"(CUdeviceptr);
        mem_get_info = "cuMemGetInfo_v2"(*mut usize, *mut usize);
        mem_get_address_range = "cuMemGetAddressRange_v2"(*mut CUdeviceptr, *mut usize, CUdeviceptr);
        mem_host_alloc = "cuMemHostAlloc"(*mut *mut c_void, usize, c_uint);
        mem_free_host = "cuMemFreeHost"(*mut c_void);
        mem_host_register = "cuMemHostRegister_v2"(*mut c_void, usize, c_uint);
        mem_host_unregister = "cuMemHostUnregister"(*mut c_void);
        mem_host_get_device_pointer = "cuMemHostGetDevicePointer_v2"(*mut CUdeviceptr, *mut c_void, c_uint);

        memcpy_htod = "cuMemcpyHtoD_v2"(CUdeviceptr, *const c_void, usize);
        memcpy_dtoh = "cuMemcpyDtoH_v2"(*mut c_void, CUdeviceptr, usize);
        memcpy_dtod = "cuMemcpyDtoD_v2"(CUdeviceptr, CUdeviceptr, usize);
        memcpy_htod_async = "cuMemcpyHtoDAsync_v2"(CUdeviceptr, *const c_void, usize, CUstream);
        memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2"(*mut c_void, CUdeviceptr, usize, CUstream);
        memcpy_dtod_async = "cuMemcpyDtoDAsync_v2"(CUdeviceptr, CUdeviceptr, usize, CUstream);
        memcpy_peer = "cuMemcpyPeer"(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize);
        memset_d8 = "cuMemsetD8_v2"(CUdeviceptr, u8, usize);
        memset_d32 = "cuMemsetD32_v2"(CUdeviceptr, c_uint, usize);
        memset_d8_async = "cuMemsetD8Async"(CUdeviceptr, u8, usize, CUstream);
        memset_d32_async = "cuMemsetD32Async"(CUdeviceptr, c_uint, usize, CUstream);

        stream_create_with_priority = "cuStreamCreateWithPriority"(*mut CUstream, c_uint, c_int);
        stream_destroy = "cuStreamDestroy_v2"(CUstream);
        stream_synchronize = "cuStreamSynchronize"(CUstream);
        stream_query = "cuStreamQuery"(CUstream);
        stream_wait_event = "cuStreamWaitEvent"(CUstream, CUevent, c_uint);

        event_create = "cuEventCreate"(*mut CUevent, c_uint);
        event_destroy = "cuEventDestroy_v2"(CUevent);
        event_record = "cuEventRecord"(CUevent, CUstream);
        event_synchronize = "cuEventSynchronize"(CUevent);
        event_query = "cuEventQuery"(CUevent);
        event_elapsed_time = "cuEventElapsedTime"(*mut f32, CUevent, CUevent);

        module_load_data = "cuModuleLoadData"(*mut CUmodule, *const c_void);
        module_unload = "cuModuleUnload"(CUmodule);
        module_get_function = "cuModuleGetFunction"(*mut CUfunction, CUmodule, *const c_char);
        launch_kernel = "cuLaunchKernel"(
            CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream,
            *mut *mut c_void, *mut *mut c_void
        );

        ipc_get_mem_handle = "cuIpcGetMemHandle"(*mut CUipcMemHandle, CUdeviceptr);
        ipc_open_mem_handle = "cuIpcOpenMemHandle_v2"(*mut CUdeviceptr, CUipcMemHandle, c_uint);
        ipc_close_mem_handle = "cuIpcCloseMemHandle"(CUdeviceptr);

        pointer_get_attribute = "cuPointerGetAttribute"(*mut c_void, CUpointer_attribute, CUdeviceptr);
    }
    optional {
        ctx_get_id = "cuCtxGetId"(CUcontext, *mut u64);
        mem_alloc_managed = "cuMemAllocManaged"(*mut CUdeviceptr, usize, c_uint);
        mem_alloc_async = "cuMemAllocAsync"(*mut CUdeviceptr, usize, CUstream);
        mem_free_async = "cuMemFreeAsync"(CUdeviceptr, CUstream);
        mem_alloc_from_pool_async = "cuMemAllocFromPoolAsync"(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
        device_get_default_mem_pool = "cuDeviceGetDefaultMemPool"(*mut CUmemoryPool, CUdevice);
        mem_pool_create = "cuMemPoolCreate"(*mut CUmemoryPool, *const CUmemPoolProps);
        mem_pool_destroy = "cuMemPoolDestroy"(CUmemoryPool);
        mem_pool_set_attribute = "cuMemPoolSetAttribute"(CUmemoryPool, CUmemPool_attribute, *mut c_void);
        mem_pool_get_attribute = "cuMemPoolGetAttribute"(CUmemoryPool, CUmemPool_attribute, *mut c_void);
        mem_pool_trim_to = "cuMemPoolTrimTo"(CUmemoryPool, usize);
        mem_pool_set_access = "cuMemPoolSetAccess"(CUmemoryPool, *const CUmemAccessDesc, usize);
        mem_pool_export_to_shareable_handle = "cuMemPoolExportToShareableHandle"(*mut c_void, CUmemoryPool, i32, u64);
        mem_pool_import_from_shareable_handle = "cuMemPoolImportFromShareableHandle"(*mut CUmemoryPool, *mut c_void, i32, u64);
        mem_pool_export_pointer = "cuMemPoolExportPointer"(*mut CUmemPoolPtrExportData, CUdeviceptr);
        mem_pool_import_pointer = "cuMemPoolImportPointer"(*mut CUdeviceptr, CUmemoryPool, *mut CUmemPoolPtrExportData);

        mem_create = "cuMemCreate"(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64);
        mem_release = "cuMemRelease"(CUmemGenericAllocationHandle);
        mem_map = "cuMemMap"(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64);
        mem_unmap = "cuMemUnmap"(CUdeviceptr, usize);
        mem_set_access = "cuMemSetAccess"(CUdeviceptr, usize, *const CUmemAccessDesc, usize);
        mem_address_reserve = "cuMemAddressReserve"(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
        mem_address_free = "cuMemAddressFree"(CUdeviceptr, usize);
        mem_get_allocation_granularity = "cuMemGetAllocationGranularity"(*mut usize, *const CUmemAllocationProp, i32);
        /// Exports a `cuMemCreate` handle (made with that handle type requested) as
        /// an OS handle: for `POSIX_FILE_DESCRIPTOR`, an `int` the caller owns.
        mem_export_to_shareable_handle = "cuMemExportToShareableHandle"(*mut c_void, CUmemGenericAllocationHandle, i32, u64);
        /// Imports an exported OS handle as a new `cuMemCreate`-style handle (for
        /// `POSIX_FILE_DESCRIPTOR` the `void *` is the fd value itself).
        mem_import_from_shareable_handle = "cuMemImportFromShareableHandle"(*mut CUmemGenericAllocationHandle, *mut c_void, i32);

        /// Whether a stream is capturing a graph: 0 no, 1 active, 2 invalidated
        /// (`CUstreamCaptureStatus`).
        stream_is_capturing = "cuStreamIsCapturing"(CUstream, *mut c_int);
        /// Swaps the calling thread's capture interaction mode (0 global, 1
        /// thread-local, 2 relaxed: `CUstreamCaptureMode`) with `*mode`.
        thread_exchange_stream_capture_mode = "cuThreadExchangeStreamCaptureMode"(*mut c_int);

        /// Only in `emm-standin`, the test driver: runs a control command.
        standin_control = "emmStandinControl"(*const c_char, *mut u64);
    }
}

impl Driver {
    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The library handle, for callers that must keep it alive independently.
    pub fn library(&self) -> &Arc<Library> {
        &self.library
    }

    /// `true` when every symbol of the stream-ordered allocator is present.
    pub fn has_stream_ordered_allocator(&self) -> bool {
        self.mem_alloc_async.is_some()
            && self.mem_free_async.is_some()
            && self.mem_alloc_from_pool_async.is_some()
            && self.mem_pool_create.is_some()
            && self.mem_pool_destroy.is_some()
            && self.mem_pool_trim_to.is_some()
            && self.mem_pool_get_attribute.is_some()
            && self.mem_pool_set_attribute.is_some()
    }

    /// `true` when every symbol of virtual memory management is present.
    pub fn has_virtual_memory_management(&self) -> bool {
        self.mem_create.is_some()
            && self.mem_release.is_some()
            && self.mem_map.is_some()
            && self.mem_unmap.is_some()
            && self.mem_set_access.is_some()
            && self.mem_address_reserve.is_some()
            && self.mem_address_free.is_some()
            && self.mem_get_allocation_granularity.is_some()
    }

    /// The driver's name for `code` (`cuGetErrorName`), or the name this crate knows,
    /// or `"CUDA_ERROR_UNRECOGNIZED"`.
    pub fn error_name(&self, code: CUresult) -> String {
        let mut p: *const c_char = core::ptr::null();
        // SAFETY: `p` is a valid out-pointer; on success the driver points it at a
        // static NUL-terminated string.
        let r = unsafe { (self.get_error_name)(code, &mut p) };
        if r.is_success() && !p.is_null() {
            // SAFETY: non-null and NUL-terminated per the driver's contract; static.
            return unsafe { core::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned();
        }
        code.name().unwrap_or("CUDA_ERROR_UNRECOGNIZED").to_owned()
    }

    /// The driver's description of `code` (`cuGetErrorString`).
    pub fn error_string(&self, code: CUresult) -> String {
        let mut p: *const c_char = core::ptr::null();
        // SAFETY: as in `error_name`.
        let r = unsafe { (self.get_error_string)(code, &mut p) };
        if r.is_success() && !p.is_null() {
            // SAFETY: as in `error_name`.
            return unsafe { core::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned();
        }
        format!("unrecognized CUresult {}", code.0)
    }

    /// The driver's version as `cuDriverGetVersion` reports it (e.g. 13000 for 13.0).
    pub fn version(&self) -> Result<i32, CUresult> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer.
        let r = unsafe { (self.driver_get_version)(&mut v) };
        if r.is_success() {
            Ok(v)
        } else {
            Err(r)
        }
    }
}

impl core::fmt::Debug for Driver {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("missing_optional", &self.missing_optional())
            .finish_non_exhaustive()
    }
}

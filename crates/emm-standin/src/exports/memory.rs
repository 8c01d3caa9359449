//! Device and host allocations, pointer queries and legacy IPC.

use core::ffi::{c_uint, c_void};

use emm_sys::{
    mem_attach, memory_type, CUdeviceptr, CUipcMemHandle, CUpointer_attribute as P, CUresult,
};

use crate::context::ctx_handle;
use crate::memory::RegionKind;
use crate::state::{call, put, State};

const IPC_MAGIC: &[u8; 8] = b"EMMSTIPC";

fn device(st: &State) -> Result<i32, CUresult> {
    st.contexts.current_device(st.config.devices)
}

/// `cuMemAlloc_v2`: a fresh host mapping, charged against the capacity.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut CUdeviceptr, size: usize) -> CUresult {
    call("cuMemAlloc_v2", |st| {
        let d = device(st)?;
        if p.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let cap = st.config.capacity;
        let ptr = st.mem.alloc_device(d, size, cap)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, ptr) }
    })
}

/// `cuMemAllocManaged`: a fresh host mapping (host and device memory at one
/// address), charged against the capacity like `cuMemAlloc`. `flags` must be
/// exactly `CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST` (else
/// `CUDA_ERROR_INVALID_VALUE`, as the driver does); a device made to report no
/// managed memory (`managed 0`) answers `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    p: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    call("cuMemAllocManaged", |st| {
        let d = device(st)?;
        if p.is_null() || (flags != mem_attach::GLOBAL && flags != mem_attach::HOST) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if !st.config.managed {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        let cap = st.config.capacity;
        let ptr = st.mem.alloc_managed(d, size, flags, cap)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, ptr) }
    })
}

/// `cuMemFree_v2`: a pointer not from `cuMemAlloc` or `cuMemAllocManaged` (or freed already) is
/// `CUDA_ERROR_INVALID_VALUE` and counted (`double_frees`, `invalid_frees`).
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    call("cuMemFree_v2", |st| {
        device(st)?;
        if st.ipc_open.contains_key(&ptr) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        st.mem.free_device(ptr)
    })
}

/// `cuMemGetAddressRange_v2`: base and size of the allocation (or VMM mapping)
/// containing `ptr`; either out-pointer may be null.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    ptr: CUdeviceptr,
) -> CUresult {
    call("cuMemGetAddressRange_v2", |st| {
        device(st)?;
        let (b, r) = st
            .mem
            .find(ptr)
            .filter(|(_, r)| r.kind.is_device())
            .ok_or(CUresult::ERROR_NOT_FOUND)?;
        // SAFETY: forwarded to the caller; null ones are skipped.
        unsafe {
            if !base.is_null() {
                put(base, b)?;
            }
            if !size.is_null() {
                put(size, r.size)?;
            }
        }
        Ok(())
    })
}

/// `cuMemHostAlloc`: plain host memory, recorded as pinned.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    p: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    call("cuMemHostAlloc", |st| {
        device(st)?;
        if p.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let ptr = st.mem.alloc_host(size)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, ptr as usize as *mut c_void) }
    })
}

/// `cuMemFreeHost`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    call("cuMemFreeHost", |st| st.mem.free_host(p as u64))
}

/// `cuMemHostRegister_v2`: records the range as pinned.
///
/// # Safety
/// None beyond the C ABI (the range is only recorded, never touched).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    call("cuMemHostRegister_v2", |st| {
        device(st)?;
        st.mem.register_host(p as u64, size)
    })
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    call("cuMemHostUnregister", |st| st.mem.unregister_host(p as u64))
}

/// `cuMemHostGetDevicePointer_v2`: the same address (unified addressing).
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    d: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    call("cuMemHostGetDevicePointer_v2", |st| {
        if flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        match st.mem.find(p as u64) {
            Some((_, r)) if !r.kind.is_device() => {
                // SAFETY: forwarded to the caller.
                unsafe { put(d, p as u64) }
            }
            _ => Err(CUresult::ERROR_INVALID_VALUE),
        }
    })
}

/// `cuPointerGetAttribute`: context, memory type (managed memory is device
/// memory, as the driver says; `IS_MANAGED` tells it apart), device and host
/// pointer (both for managed memory), managed, ordinal, range start and size, mapped, mempool handle. 32-bit
/// attributes write 4 bytes, pointers and sizes 8.
///
/// # Safety
/// `v` must be valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(v: *mut c_void, a: P, ptr: CUdeviceptr) -> CUresult {
    call("cuPointerGetAttribute", |st| {
        let (base, r) = st.mem.find(ptr).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let dev = r.kind.is_device();
        let managed = matches!(r.kind, RegionKind::Managed { .. });
        // SAFETY: forwarded to the caller; each write has the attribute's C type.
        unsafe {
            match a {
                P::CONTEXT => put(v.cast::<u64>(), ctx_handle(r.device)),
                P::MEMORY_TYPE => put(
                    v.cast::<u32>(),
                    if dev {
                        memory_type::DEVICE
                    } else {
                        memory_type::HOST
                    },
                ),
                P::DEVICE_POINTER => put(v.cast::<u64>(), ptr),
                P::HOST_POINTER if !dev || managed => put(v.cast::<u64>(), ptr),
                P::IS_MANAGED => put(v.cast::<u32>(), u32::from(managed)),
                P::DEVICE_ORDINAL => put(v.cast::<i32>(), r.device),
                P::RANGE_START_ADDR => put(v.cast::<u64>(), base),
                P::RANGE_SIZE => put(v.cast::<usize>(), r.size),
                P::MAPPED => put(v.cast::<u32>(), 1),
                P::MEMPOOL_HANDLE => put(
                    v.cast::<u64>(),
                    match r.kind {
                        RegionKind::Async { pool, .. } => pool,
                        _ => 0,
                    },
                ),
                _ => Err(CUresult::ERROR_INVALID_VALUE),
            }
        }
    })
}

/// `cuIpcGetMemHandle`: for the base of a `cuMemAlloc` allocation; the handle
/// names this process and the address.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(h: *mut CUipcMemHandle, ptr: CUdeviceptr) -> CUresult {
    call("cuIpcGetMemHandle", |st| {
        device(st)?;
        match st.mem.find(ptr) {
            Some((b, r)) if b == ptr && r.kind == RegionKind::Device => {}
            _ => return Err(CUresult::ERROR_INVALID_VALUE),
        }
        let mut bytes = [0u8; 64];
        bytes[..8].copy_from_slice(IPC_MAGIC);
        bytes[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        bytes[16..24].copy_from_slice(&ptr.to_le_bytes());
        let reserved = bytes.map(|b| b as core::ffi::c_char);
        // SAFETY: forwarded to the caller.
        unsafe { put(h, CUipcMemHandle { reserved }) }
    })
}

/// `cuIpcOpenMemHandle_v2`: within this process, the same address (counted until
/// closed); a handle of another process is `CUDA_ERROR_NOT_SUPPORTED`, since the
/// model's memory is private to its process.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    p: *mut CUdeviceptr,
    h: CUipcMemHandle,
    _flags: c_uint,
) -> CUresult {
    call("cuIpcOpenMemHandle_v2", |st| {
        device(st)?;
        let b = h.reserved.map(|c| c as u8);
        if &b[..8] != IPC_MAGIC {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if u32::from_le_bytes([b[8], b[9], b[10], b[11]]) != std::process::id() {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[16..24]);
        let ptr = u64::from_le_bytes(w);
        match st.mem.find(ptr) {
            Some((base, r)) if base == ptr && r.kind == RegionKind::Device => {}
            _ => return Err(CUresult::ERROR_INVALID_VALUE),
        }
        *st.ipc_open.entry(ptr).or_insert(0) += 1;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, ptr) }
    })
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(ptr: CUdeviceptr) -> CUresult {
    call("cuIpcCloseMemHandle", |st| {
        match st.ipc_open.get_mut(&ptr) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    st.ipc_open.remove(&ptr);
                }
                Ok(())
            }
            None => {
                st.mem.invalid_frees += 1;
                Err(CUresult::ERROR_INVALID_VALUE)
            }
        }
    })
}

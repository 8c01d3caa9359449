//! Virtual memory management. With the `vmm` knob off, `cuMemCreate` and
//! `cuMemAddressReserve` are `CUDA_ERROR_NOT_SUPPORTED`.

use core::ffi::c_void;

use emm_sys::{
    handle_type, CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle,
    CUresult,
};

use crate::state::{call, put, State};
use crate::vmm::GRANULARITY;

fn enabled(st: &State) -> Result<i32, CUresult> {
    let d = st.contexts.current_device(st.config.devices)?;
    if st.config.vmm {
        Ok(d)
    } else {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
}

/// `cuMemAddressReserve`: `PROT_NONE` address space; the address hint is ignored.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    p: *mut CUdeviceptr,
    size: usize,
    align: usize,
    _addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    call("cuMemAddressReserve", |st| {
        enabled(st)?;
        if p.is_null() || flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let base = st.vmm.reserve(size, align)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, base) }
    })
}

/// `cuMemAddressFree`: the whole reservation, nothing mapped in it.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    call("cuMemAddressFree", |st| {
        st.vmm.free_reservation(&mut st.mem, ptr, size)
    })
}

/// `cuMemCreate`: physical memory (a memfd) charged against the capacity.
///
/// # Safety
/// `prop` must point to a `CUmemAllocationProp`; `h` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    h: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    call("cuMemCreate", |st| {
        enabled(st)?;
        if h.is_null() || prop.is_null() || flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and pointing to a prop per the caller's contract.
        let prop = unsafe { prop.read_unaligned() };
        let d = prop.location.id;
        if !(0..st.config.devices).contains(&d) {
            return Err(CUresult::ERROR_INVALID_DEVICE);
        }
        let exportable = prop.requested_handle_types & handle_type::POSIX_FILE_DESCRIPTOR != 0;
        if prop.requested_handle_types & !handle_type::POSIX_FILE_DESCRIPTOR != 0 {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        let handle = st.new_handle();
        let cap = st.config.capacity;
        st.vmm
            .create(&mut st.mem, handle, size, d, cap, exportable)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(h, handle) }
    })
}

/// `cuMemExportToShareableHandle`: POSIX file descriptors only, of a handle made
/// with that type requested; `*h` (an `int`) gets a new descriptor of the
/// handle's memfd, which the caller closes.
///
/// # Safety
/// `h` must be valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    h: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: i32,
    flags: u64,
) -> CUresult {
    call("cuMemExportToShareableHandle", |st| {
        if kind != handle_type::POSIX_FILE_DESCRIPTOR {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        if h.is_null() || flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let fd = st.vmm.export(handle)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(h.cast::<i32>(), fd) }
    })
}

/// `cuMemImportFromShareableHandle`: the `void *` is the descriptor's value; a
/// new handle over the same memory (shared for real: the descriptor may come from
/// another process through `pidfd_getfd`). The caller keeps (and closes) its
/// descriptor.
///
/// # Safety
/// `h` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    h: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    kind: i32,
) -> CUresult {
    call("cuMemImportFromShareableHandle", |st| {
        let d = enabled(st)?;
        if kind != handle_type::POSIX_FILE_DESCRIPTOR {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        if h.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let fd = i32::try_from(os_handle as usize).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        let handle = st.new_handle();
        st.vmm.import(fd, handle, d)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(h, handle) }
    })
}

/// `cuMemRelease`: the memory goes when its last mapping does; a second release
/// is `CUDA_ERROR_INVALID_VALUE`, counted as a double free.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(h: CUmemGenericAllocationHandle) -> CUresult {
    call("cuMemRelease", |st| st.vmm.release(&mut st.mem, h))
}

/// `cuMemMap`: inside a reservation, over nothing mapped.
///
/// # Safety
/// None beyond the C ABI (the range is checked against the reservations).
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    h: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    call("cuMemMap", |st| {
        if flags != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        st.vmm.map(&mut st.mem, ptr, size, offset, h)
    })
}

/// `cuMemUnmap`: whole mappings only.
///
/// # Safety
/// None beyond the C ABI (the range is checked).
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    call("cuMemUnmap", |st| st.vmm.unmap(&mut st.mem, ptr, size))
}

/// `cuMemSetAccess`: the range must be mapped; afterwards copies may use it.
///
/// # Safety
/// `desc` must point to `count` descriptors.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    call("cuMemSetAccess", |st| {
        // SAFETY: forwarded to the caller.
        unsafe { super::mempool::check_access(st, desc, count) }?;
        st.vmm.set_access(&mut st.mem, ptr, size)
    })
}

/// `cuMemGetAllocationGranularity`: 2 MiB, minimum and recommended.
///
/// # Safety
/// `g` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    g: *mut usize,
    prop: *const CUmemAllocationProp,
    _option: i32,
) -> CUresult {
    call("cuMemGetAllocationGranularity", |st| {
        // Needs no current context (the prop names the device).
        if !st.config.vmm {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        if prop.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // SAFETY: forwarded to the caller.
        unsafe { put(g, GRANULARITY) }
    })
}

//! The stream-ordered allocator and memory pools. With the `mempools` knob off,
//! every call here is `CUDA_ERROR_NOT_SUPPORTED`.

use core::ffi::c_void;

use emm_sys::{
    handle_type, CUdevice, CUdeviceptr, CUmemAccessDesc, CUmemPoolProps, CUmemPoolPtrExportData,
    CUmemPool_attribute, CUmemoryPool, CUresult, CUstream,
};

use crate::mempool::AttrValue;
use crate::state::{call, put, State};

fn enabled(st: &State) -> Result<i32, CUresult> {
    let d = st.contexts.current_device(st.config.devices)?;
    if st.config.mempools {
        Ok(d)
    } else {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
}

fn pool_ptr(h: u64) -> CUmemoryPool {
    CUmemoryPool(h as usize as *mut c_void)
}

/// Checks `count` access descriptors (shared by `cuMemPoolSetAccess` and
/// `cuMemSetAccess`): present, and each naming a device that exists.
///
/// # Safety
/// A non-null `desc` must point at `count` descriptors.
pub(crate) unsafe fn check_access(
    st: &State,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> Result<(), CUresult> {
    if desc.is_null() || count == 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    for i in 0..count {
        // SAFETY: the caller passes `count` descriptors.
        let d = unsafe { desc.add(i).read_unaligned() };
        if !(0..st.config.devices).contains(&d.location.id) {
            return Err(CUresult::ERROR_INVALID_DEVICE);
        }
    }
    Ok(())
}

/// `cuMemAllocAsync`: from the current device's default pool.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    p: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    call("cuMemAllocAsync", |st| {
        let d = enabled(st)?;
        st.streams.check_stream(s.0 as u64)?;
        if p.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let fresh = st.new_handle();
        let pool = st.pools.default_pool(d, || fresh);
        let cap = st.config.capacity;
        let ptr = st.pools.alloc(&mut st.mem, pool, size, cap)?;
        st.streams.queued(s.0 as u64)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, ptr) }
    })
}

/// `cuMemAllocFromPoolAsync`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    p: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    call("cuMemAllocFromPoolAsync", |st| {
        enabled(st)?;
        st.streams.check_stream(s.0 as u64)?;
        if p.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let cap = st.config.capacity;
        let ptr = st.pools.alloc(&mut st.mem, pool.0 as u64, size, cap)?;
        st.streams.queued(s.0 as u64)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, ptr) }
    })
}

/// `cuMemFreeAsync`: the block returns to its pool's cache; a pointer not
/// allocated from a pool (or freed already) is `CUDA_ERROR_INVALID_VALUE`, counted.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    call("cuMemFreeAsync", |st| {
        enabled(st)?;
        st.streams.check_stream(s.0 as u64)?;
        st.pools.free(&mut st.mem, ptr)?;
        st.streams.queued(s.0 as u64)
    })
}

/// `cuDeviceGetDefaultMemPool`.
///
/// # Safety
/// See [the module docs](crate::exports).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(p: *mut CUmemoryPool, d: CUdevice) -> CUresult {
    call("cuDeviceGetDefaultMemPool", |st| {
        if !st.config.mempools {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        if !(0..st.config.devices).contains(&d.0) {
            return Err(CUresult::ERROR_INVALID_DEVICE);
        }
        let fresh = st.new_handle();
        let h = st.pools.default_pool(d.0, || fresh);
        // SAFETY: forwarded to the caller.
        unsafe { put(p, pool_ptr(h)) }
    })
}

/// `cuMemPoolCreate`: exportable when the properties ask for POSIX file
/// descriptors; `max_size` is honoured.
///
/// # Safety
/// `props` must point to a `CUmemPoolProps`; `p` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    p: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    call("cuMemPoolCreate", |st| {
        enabled(st)?;
        if props.is_null() || p.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and pointing to a CUmemPoolProps per the caller's contract.
        let props = unsafe { props.read_unaligned() };
        if !(0..st.config.devices).contains(&props.location.id) {
            return Err(CUresult::ERROR_INVALID_DEVICE);
        }
        let exportable = props.handle_types & handle_type::POSIX_FILE_DESCRIPTOR != 0;
        let h = st.new_handle();
        st.pools
            .create(h, props.location.id, exportable, props.max_size as u64);
        // SAFETY: forwarded to the caller.
        unsafe { put(p, pool_ptr(h)) }
    })
}

/// `cuMemPoolDestroy`: deferred until the pool's last allocation is freed, as the
/// driver documents; the default pool cannot be destroyed.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    call("cuMemPoolDestroy", |st| {
        st.pools.destroy(&mut st.mem, pool.0 as u64)
    })
}

/// `cuMemPoolSetAttribute`: `int` for the reuse flags, `cuuint64_t` for the rest.
///
/// # Safety
/// `v` must point to a value of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    a: CUmemPool_attribute,
    v: *mut c_void,
) -> CUresult {
    call("cuMemPoolSetAttribute", |st| {
        if v.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let value = if a.0 <= 3 {
            // SAFETY: an `int` attribute; the caller passes an `int`.
            u64::from(unsafe { v.cast::<i32>().read_unaligned() } as u32)
        } else {
            // SAFETY: a 64-bit attribute; the caller passes a `cuuint64_t`.
            unsafe { v.cast::<u64>().read_unaligned() }
        };
        st.pools.set_attribute(pool.0 as u64, a, value)
    })
}

/// `cuMemPoolGetAttribute`: reserved and used bytes (current and high), the
/// release threshold, the reuse flags.
///
/// # Safety
/// `v` must be valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    a: CUmemPool_attribute,
    v: *mut c_void,
) -> CUresult {
    call("cuMemPoolGetAttribute", |st| {
        match st.pools.get_attribute(pool.0 as u64, a)? {
            // SAFETY: forwarded to the caller; the width matches the attribute.
            AttrValue::Int(x) => unsafe { put(v.cast::<i32>(), x) },
            // SAFETY: as above.
            AttrValue::U64(x) => unsafe { put(v.cast::<u64>(), x) },
        }
    })
}

/// `cuMemPoolTrimTo`.
///
/// # Safety
/// None beyond the C ABI.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    call("cuMemPoolTrimTo", |st| {
        st.pools.trim(&mut st.mem, pool.0 as u64, keep as u64)
    })
}

/// `cuMemPoolSetAccess`: the descriptors are checked; access is always granted.
///
/// # Safety
/// `desc` must point to `count` descriptors.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    call("cuMemPoolSetAccess", |st| {
        st.pools.check(pool.0 as u64)?;
        // SAFETY: forwarded to the caller.
        unsafe { check_access(st, desc, count) }
    })
}

/// `cuMemPoolExportToShareableHandle`: POSIX file descriptors only (a memfd that
/// names the pool; see [`crate::mempool`]).
///
/// # Safety
/// `h` must be valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportToShareableHandle(
    h: *mut c_void,
    pool: CUmemoryPool,
    kind: i32,
    _flags: u64,
) -> CUresult {
    call("cuMemPoolExportToShareableHandle", |st| {
        if kind != handle_type::POSIX_FILE_DESCRIPTOR {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        if h.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let fd = st.pools.export(pool.0 as u64)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(h.cast::<i32>(), fd) }
    })
}

/// `cuMemPoolImportFromShareableHandle`: within this process only (another
/// process's pool is `CUDA_ERROR_NOT_SUPPORTED`).
///
/// # Safety
/// `p` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportFromShareableHandle(
    p: *mut CUmemoryPool,
    h: *mut c_void,
    kind: i32,
    _flags: u64,
) -> CUresult {
    call("cuMemPoolImportFromShareableHandle", |st| {
        enabled(st)?;
        if kind != handle_type::POSIX_FILE_DESCRIPTOR {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        if p.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let handle = st.new_handle();
        st.pools.import(h as usize as i32, handle)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, pool_ptr(handle)) }
    })
}

/// `cuMemPoolExportPointer`.
///
/// # Safety
/// `data` must be valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportPointer(
    data: *mut CUmemPoolPtrExportData,
    ptr: CUdeviceptr,
) -> CUresult {
    call("cuMemPoolExportPointer", |st| {
        let reserved = st.pools.export_pointer(&st.mem, ptr)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(data, CUmemPoolPtrExportData { reserved }) }
    })
}

/// `cuMemPoolImportPointer`: the same address within this process; closed by
/// `cuMemFreeAsync`.
///
/// # Safety
/// `data` must point to export data; `p` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportPointer(
    p: *mut CUdeviceptr,
    pool: CUmemoryPool,
    data: *mut CUmemPoolPtrExportData,
) -> CUresult {
    call("cuMemPoolImportPointer", |st| {
        enabled(st)?;
        if data.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null and pointing to export data per the caller's contract.
        let d = unsafe { data.read_unaligned() };
        let ptr = st
            .pools
            .import_pointer(&st.mem, pool.0 as u64, &d.reserved)?;
        // SAFETY: forwarded to the caller.
        unsafe { put(p, ptr) }
    })
}

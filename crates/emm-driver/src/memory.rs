//! Device, host and IPC memory operations.
//!
//! The free functions are thin `Result` wrappers over single driver calls; each
//! makes its context current for the call. [`DeviceBuffer`] and [`PinnedBuffer`] are
//! plain owned allocations (no memory manager involved) for tools and tests.

use core::ffi::c_void;

use emm_sys::{
    CUdeviceptr, CUipcMemHandle, CUpointer_attribute, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
};

use crate::context::Context;
use crate::error::{check, optional, DriverError, Result};
use crate::stream::Stream;

/// `cuMemAlloc`: `size` bytes of device memory (`size` > 0).
pub fn alloc(ctx: &Context, size: usize) -> Result<CUdeviceptr> {
    if size == 0 {
        return Err(DriverError::invalid(
            "allocation size",
            0,
            "the driver allocates at least one byte",
        ));
    }
    let _g = ctx.push()?;
    let drv = ctx.driver();
    let mut p: CUdeviceptr = 0;
    // SAFETY: the context is current; `p` is a valid out-pointer.
    check(drv, "cuMemAlloc_v2", unsafe {
        (drv.mem_alloc)(&mut p, size)
    })?;
    Ok(p)
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` must come from [`alloc`] or [`alloc_managed`] in `ctx`, be freed once, and no queued work may
/// still use it.
pub unsafe fn free(ctx: &Context, ptr: CUdeviceptr) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemFree_v2", unsafe { (drv.mem_free)(ptr) })
}

/// `cuMemAllocManaged`: `size` bytes (> 0) of managed memory, one address valid
/// on the host and on every device, with the [`emm_sys::mem_attach`] `flags`
/// (`GLOBAL` or `HOST`). Freed with [`free`]. A driver without the entry point is
/// [`DriverError::Unsupported`].
pub fn alloc_managed(ctx: &Context, size: usize, flags: u32) -> Result<CUdeviceptr> {
    if size == 0 {
        return Err(DriverError::invalid(
            "managed allocation size",
            0,
            "the driver allocates at least one byte",
        ));
    }
    let drv = ctx.driver();
    let f = optional(drv, drv.mem_alloc_managed, "cuMemAllocManaged")?;
    let _g = ctx.push()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: the context is current; `p` is a valid out-pointer; the driver
    // checks `flags`.
    check(drv, "cuMemAllocManaged", unsafe { f(&mut p, size, flags) })?;
    Ok(p)
}

/// `cuMemHostAlloc`: `size` bytes of page-locked host memory with
/// [`emm_sys::host_alloc`] `flags`.
pub fn host_alloc(ctx: &Context, size: usize, flags: u32) -> Result<*mut u8> {
    if size == 0 {
        return Err(DriverError::invalid(
            "pinned allocation size",
            0,
            "at least one byte is needed",
        ));
    }
    let _g = ctx.push()?;
    let drv = ctx.driver();
    let mut p: *mut c_void = core::ptr::null_mut();
    // SAFETY: the context is current; `p` is a valid out-pointer.
    check(drv, "cuMemHostAlloc", unsafe {
        (drv.mem_host_alloc)(&mut p, size, flags)
    })?;
    Ok(p.cast())
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` must come from [`host_alloc`] and be freed once, with no queued work using it.
pub unsafe fn free_host(ctx: &Context, ptr: *mut u8) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemFreeHost", unsafe {
        (drv.mem_free_host)(ptr.cast())
    })
}

/// `cuMemHostRegister`: page-locks an existing host range.
///
/// # Safety
/// `[ptr, ptr+len)` must be a live host allocation that outlives the registration.
pub unsafe fn host_register(ctx: &Context, ptr: *mut u8, len: usize, flags: u32) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemHostRegister_v2", unsafe {
        (drv.mem_host_register)(ptr.cast(), len, flags)
    })
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `ptr` must have been registered with [`host_register`] and not yet unregistered.
pub unsafe fn host_unregister(ctx: &Context, ptr: *mut u8) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemHostUnregister", unsafe {
        (drv.mem_host_unregister)(ptr.cast())
    })
}

/// `cuMemHostGetDevicePointer`: the device address of mapped host memory.
pub fn host_device_pointer(ctx: &Context, ptr: *mut u8) -> Result<CUdeviceptr> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    let mut d: CUdeviceptr = 0;
    // SAFETY: the driver validates `ptr` and returns an error for unmapped memory.
    check(drv, "cuMemHostGetDevicePointer_v2", unsafe {
        (drv.mem_host_get_device_pointer)(&mut d, ptr.cast(), 0)
    })?;
    Ok(d)
}

/// `(base, size)` of the allocation that contains `ptr` (`cuMemGetAddressRange`).
pub fn address_range(ctx: &Context, ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    let (mut base, mut size) = (0, 0);
    // SAFETY: out-pointers are valid; the driver validates `ptr`.
    check(drv, "cuMemGetAddressRange_v2", unsafe {
        (drv.mem_get_address_range)(&mut base, &mut size, ptr)
    })?;
    Ok((base, size))
}

/// A 64-bit pointer attribute of `ptr` (e.g. [`CUpointer_attribute::RANGE_START_ADDR`]).
pub fn pointer_attribute_u64(
    ctx: &Context,
    attr: CUpointer_attribute,
    ptr: CUdeviceptr,
) -> Result<u64> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    let mut v: u64 = 0;
    // SAFETY: every 64-bit-valued attribute fits `v`; 32-bit ones write its low half.
    check(drv, "cuPointerGetAttribute", unsafe {
        (drv.pointer_get_attribute)((&mut v as *mut u64).cast(), attr, ptr)
    })?;
    Ok(v)
}

/// Copies `src` to device memory at `dst`.
///
/// # Safety
/// `dst` must be valid device memory of at least `src.len()` bytes.
pub unsafe fn copy_htod(ctx: &Context, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller; `src` is valid for its length.
    check(drv, "cuMemcpyHtoD_v2", unsafe {
        (drv.memcpy_htod)(dst, src.as_ptr().cast(), src.len())
    })
}

/// Copies device memory at `src` into `dst`.
///
/// # Safety
/// `src` must be valid device memory of at least `dst.len()` bytes.
pub unsafe fn copy_dtoh(ctx: &Context, dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller; `dst` is valid for its length.
    check(drv, "cuMemcpyDtoH_v2", unsafe {
        (drv.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// Copies `len` bytes of device memory at `src` to host memory at `dst`, which
/// need not be initialised (a fresh pinned buffer).
///
/// # Safety
/// `src` must be valid device memory and `dst` valid, writable host memory, each
/// of at least `len` bytes.
pub unsafe fn copy_dtoh_raw(
    ctx: &Context,
    dst: *mut u8,
    src: CUdeviceptr,
    len: usize,
) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemcpyDtoH_v2", unsafe {
        (drv.memcpy_dtoh)(dst.cast(), src, len)
    })
}

/// Copies `len` bytes between device addresses.
///
/// # Safety
/// Both ranges must be valid device memory of `len` bytes.
pub unsafe fn copy_dtod(
    ctx: &Context,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemcpyDtoD_v2", unsafe {
        (drv.memcpy_dtod)(dst, src, len)
    })
}

/// Queues a host→device copy on `stream`.
///
/// # Safety
/// `dst` must be valid for `len` bytes and `src` must stay valid and unchanged until
/// the copy completes (pinned memory for a truly asynchronous copy).
pub unsafe fn copy_htod_async(
    dst: CUdeviceptr,
    src: *const u8,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    let ctx = stream.context();
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemcpyHtoDAsync_v2", unsafe {
        (drv.memcpy_htod_async)(dst, src.cast(), len, stream.raw())
    })
}

/// Queues a device→host copy on `stream`.
///
/// # Safety
/// `src` must be valid for `len` bytes and `dst` must stay valid, and not be read,
/// until the copy completes.
pub unsafe fn copy_dtoh_async(
    dst: *mut u8,
    src: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    let ctx = stream.context();
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemcpyDtoHAsync_v2", unsafe {
        (drv.memcpy_dtoh_async)(dst.cast(), src, len, stream.raw())
    })
}

/// Queues a device→device copy on `stream`.
///
/// # Safety
/// Both ranges must be valid device memory of `len` bytes until the copy completes.
pub unsafe fn copy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    let ctx = stream.context();
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemcpyDtoDAsync_v2", unsafe {
        (drv.memcpy_dtod_async)(dst, src, len, stream.raw())
    })
}

/// Copies `len` bytes from `src` in `src_ctx` to `dst` in `dst_ctx` (across devices).
///
/// # Safety
/// Both ranges must be valid device memory of `len` bytes in their contexts.
pub unsafe fn copy_peer(
    dst_ctx: &Context,
    dst: CUdeviceptr,
    src_ctx: &Context,
    src: CUdeviceptr,
    len: usize,
) -> Result<()> {
    let _g = dst_ctx.push()?;
    let drv = dst_ctx.driver();
    // SAFETY: forwarded to the caller; both contexts are retained.
    check(drv, "cuMemcpyPeer", unsafe {
        (drv.memcpy_peer)(dst, dst_ctx.raw(), src, src_ctx.raw(), len)
    })
}

/// Sets `len` bytes at `dst` to `value`.
///
/// # Safety
/// `dst` must be valid device memory of `len` bytes.
pub unsafe fn memset_d8(ctx: &Context, dst: CUdeviceptr, value: u8, len: usize) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemsetD8_v2", unsafe {
        (drv.memset_d8)(dst, value, len)
    })
}

/// Queues setting `count` 32-bit words at `dst` to `value` on `stream`.
///
/// # Safety
/// `dst` must be 4-byte aligned device memory of `4 * count` bytes until the set completes.
pub unsafe fn memset_d32_async(
    dst: CUdeviceptr,
    value: u32,
    count: usize,
    stream: &Stream,
) -> Result<()> {
    let ctx = stream.context();
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemsetD32Async", unsafe {
        (drv.memset_d32_async)(dst, value, count, stream.raw())
    })
}

/// Queues setting `len` bytes at `dst` to `value` on `stream`.
///
/// # Safety
/// `dst` must be valid device memory of `len` bytes until the set completes.
pub unsafe fn memset_d8_async(
    dst: CUdeviceptr,
    value: u8,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    let ctx = stream.context();
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemsetD8Async", unsafe {
        (drv.memset_d8_async)(dst, value, len, stream.raw())
    })
}

/// The legacy IPC handle (`cuIpcGetMemHandle`) of the allocation whose base is `base`.
pub fn ipc_get_handle(ctx: &Context, base: CUdeviceptr) -> Result<[u8; 64]> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out-pointer; the driver validates `base`.
    check(drv, "cuIpcGetMemHandle", unsafe {
        (drv.ipc_get_mem_handle)(&mut h, base)
    })?;
    Ok(h.reserved.map(|b| b as u8))
}

/// Opens a legacy IPC handle of another process in `ctx` (`cuIpcOpenMemHandle`).
pub fn ipc_open_handle(ctx: &Context, handle: &[u8; 64]) -> Result<CUdeviceptr> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    let h = CUipcMemHandle {
        reserved: handle.map(|b| b as core::ffi::c_char),
    };
    let mut p: CUdeviceptr = 0;
    // SAFETY: the driver validates the handle's bytes and fails on garbage.
    check(drv, "cuIpcOpenMemHandle_v2", unsafe {
        (drv.ipc_open_mem_handle)(&mut p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    })?;
    Ok(p)
}

/// Closes a mapping made by [`ipc_open_handle`].
///
/// # Safety
/// `ptr` must come from [`ipc_open_handle`] and be closed once, with no work using it.
pub unsafe fn ipc_close_handle(ctx: &Context, ptr: CUdeviceptr) -> Result<()> {
    let _g = ctx.push()?;
    let drv = ctx.driver();
    // SAFETY: forwarded to the caller.
    check(drv, "cuIpcCloseMemHandle", unsafe {
        (drv.ipc_close_mem_handle)(ptr)
    })
}

/// Device memory from `cuMemAlloc`, freed on drop. No memory manager is involved.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    len: usize,
    ctx: Context,
}

impl DeviceBuffer {
    /// `len` bytes (> 0) of uninitialised device memory.
    pub fn new(ctx: &Context, len: usize) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer {
            ptr: alloc(ctx, len)?,
            len,
            ctx: ctx.clone(),
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_host(ctx: &Context, data: &[u8]) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::new(ctx, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: buffers hold at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Copies `data` (exactly `len` bytes) into the buffer.
    pub fn copy_from_host(&self, data: &[u8]) -> Result<()> {
        if data.len() != self.len {
            return Err(DriverError::invalid(
                "host source length",
                self.len,
                data.len(),
            ));
        }
        // SAFETY: the buffer holds `len` bytes.
        unsafe { copy_htod(&self.ctx, self.ptr, data) }
    }

    /// Copies the buffer (exactly `len` bytes) into `out`.
    pub fn copy_to_host(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.len {
            return Err(DriverError::invalid(
                "host destination length",
                self.len,
                out.len(),
            ));
        }
        // SAFETY: the buffer holds `len` bytes.
        unsafe { copy_dtoh(&self.ctx, out, self.ptr) }
    }

    /// The buffer's bytes as a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: we allocated `ptr` and free it once; synchronous cuMemFree waits
        // for work using it.
        if let Err(e) = unsafe { free(&self.ctx, self.ptr) } {
            self.ctx.record_drop_error(e);
        }
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    ctx: Context,
}

// SAFETY: the buffer owns its memory exclusively; moving it moves that ownership.
unsafe impl Send for PinnedBuffer {}
// SAFETY: `&PinnedBuffer` gives only shared (read) access to the bytes.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` bytes (> 0) of zeroed pinned host memory with [`emm_sys::host_alloc`] flags.
    pub fn new(ctx: &Context, len: usize, flags: u32) -> Result<PinnedBuffer> {
        let ptr = host_alloc(ctx, len, flags)?;
        // SAFETY: the driver returned `len` writable bytes.
        unsafe { core::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuffer {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes, owned by `self`.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: we allocated `ptr` and free it once.
        if let Err(e) = unsafe { free_host(&self.ctx, self.ptr) } {
            self.ctx.record_drop_error(e);
        }
    }
}

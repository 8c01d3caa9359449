//! CUDA's stream-ordered allocator: [`MemPool`], `cuMemAllocAsync`, `cuMemFreeAsync`.
//!
//! Every entry point here is optional in the driver; on a driver without it each
//! call returns [`DriverError::Unsupported`].

use core::ffi::c_void;

use emm_sys::{
    handle_type, CUdeviceptr, CUmemAccessDesc, CUmemLocation, CUmemPoolProps,
    CUmemPoolPtrExportData, CUmemPool_attribute, CUmemoryPool, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
};

use crate::context::Context;
use crate::error::{check, optional, DriverError, Result};
use crate::stream::Stream;

/// A memory pool of the stream-ordered allocator: one the caller created
/// (destroyed on drop), imported from another process (destroyed on drop), or the
/// device's default pool (never destroyed).
#[derive(Debug)]
pub struct MemPool {
    raw: CUmemoryPool,
    ctx: Context,
    owned: bool,
}

// SAFETY: the handle is an opaque identifier usable from any thread.
unsafe impl Send for MemPool {}
// SAFETY: as above; pool calls are thread-safe in the driver.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// Creates a pool on `ctx`'s device; `exportable` enables POSIX file-descriptor
    /// export for IPC.
    pub fn create(ctx: &Context, exportable: bool) -> Result<MemPool> {
        let drv = ctx.driver();
        let create = optional(drv, drv.mem_pool_create, "cuMemPoolCreate")?;
        let props = CUmemPoolProps {
            alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            handle_types: if exportable {
                handle_type::POSIX_FILE_DESCRIPTOR
            } else {
                handle_type::NONE
            },
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.device().ordinal() as i32,
            },
            ..CUmemPoolProps::default()
        };
        let _g = ctx.push()?;
        let mut raw = CUmemoryPool::NULL;
        // SAFETY: `props` is a fully initialised CUmemPoolProps; `raw` a valid out-pointer.
        check(drv, "cuMemPoolCreate", unsafe { create(&mut raw, &props) })?;
        Ok(MemPool {
            raw,
            ctx: ctx.clone(),
            owned: true,
        })
    }

    /// The device's default pool (what `cuMemAllocAsync` uses).
    pub fn device_default(ctx: &Context) -> Result<MemPool> {
        let drv = ctx.driver();
        let get = optional(
            drv,
            drv.device_get_default_mem_pool,
            "cuDeviceGetDefaultMemPool",
        )?;
        let mut raw = CUmemoryPool::NULL;
        // SAFETY: `raw` is a valid out-pointer.
        check(drv, "cuDeviceGetDefaultMemPool", unsafe {
            get(&mut raw, ctx.device().raw())
        })?;
        Ok(MemPool {
            raw,
            ctx: ctx.clone(),
            owned: false,
        })
    }

    /// The raw handle.
    pub fn raw(&self) -> CUmemoryPool {
        self.raw
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Hands an owned pool to its context instead of destroying it now
    /// ([`Context::free_later`]): for an owner that is going while memory of
    /// the pool it handed over too is not yet freed (the context frees memory
    /// before it destroys pools). A pool not owned (the device's default) is
    /// only let go.
    pub fn hand_over(mut self) {
        if !self.owned {
            return;
        }
        self.owned = false;
        // SAFETY: we owned this pool and give it up here, once (`owned` is
        // cleared, so our drop does not destroy it); its owner is going and
        // uses it no more.
        unsafe {
            self.ctx
                .free_later(crate::doomed::Orphan::MemPool(self.raw))
        };
    }

    /// Queues an allocation of `size` bytes on `stream`.
    pub fn alloc_async(&self, size: usize, stream: &Stream) -> Result<CUdeviceptr> {
        if size == 0 {
            return Err(DriverError::invalid(
                "allocation size",
                0,
                "at least one byte is needed",
            ));
        }
        let drv = self.ctx.driver();
        let f = optional(
            drv,
            drv.mem_alloc_from_pool_async,
            "cuMemAllocFromPoolAsync",
        )?;
        let _g = self.ctx.push()?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: pool and stream are alive and of the same context.
        check(drv, "cuMemAllocFromPoolAsync", unsafe {
            f(&mut p, size, self.raw, stream.raw())
        })?;
        Ok(p)
    }

    /// A `u64` attribute (release threshold, reserved and used bytes).
    pub fn attribute(&self, attr: CUmemPool_attribute) -> Result<u64> {
        let drv = self.ctx.driver();
        let f = optional(drv, drv.mem_pool_get_attribute, "cuMemPoolGetAttribute")?;
        let mut v: u64 = 0;
        // SAFETY: callers pass 64-bit attributes; `v` is a valid out-pointer of that size.
        check(drv, "cuMemPoolGetAttribute", unsafe {
            f(self.raw, attr, (&mut v as *mut u64).cast())
        })?;
        Ok(v)
    }

    /// Sets a `u64` attribute (the release threshold, or resets a high-water mark with 0).
    pub fn set_attribute(&self, attr: CUmemPool_attribute, mut value: u64) -> Result<()> {
        let drv = self.ctx.driver();
        let f = optional(drv, drv.mem_pool_set_attribute, "cuMemPoolSetAttribute")?;
        // SAFETY: callers pass 64-bit attributes; `value` is of that size.
        check(drv, "cuMemPoolSetAttribute", unsafe {
            f(self.raw, attr, (&mut value as *mut u64).cast())
        })
    }

    /// Releases reserved memory above `keep` bytes back to the device.
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        let drv = self.ctx.driver();
        let f = optional(drv, drv.mem_pool_trim_to, "cuMemPoolTrimTo")?;
        // SAFETY: the pool is alive.
        check(drv, "cuMemPoolTrimTo", unsafe { f(self.raw, keep) })
    }

    /// Exports the pool as a new POSIX file descriptor, owned by the caller. A
    /// negative descriptor from the driver is an error, never owned.
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        let drv = self.ctx.driver();
        let f = optional(
            drv,
            drv.mem_pool_export_to_shareable_handle,
            "cuMemPoolExportToShareableHandle",
        )?;
        let mut fd: i32 = -1;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the out-handle is an `int`.
        check(drv, "cuMemPoolExportToShareableHandle", unsafe {
            f(
                (&mut fd as *mut i32).cast(),
                self.raw,
                handle_type::POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        if fd < 0 {
            return Err(crate::DriverError::InvalidArgument {
                what: "descriptor from cuMemPoolExportToShareableHandle",
                asked: "a file descriptor".into(),
                found: fd.to_string(),
            });
        }
        // SAFETY: the driver made a fresh descriptor for the caller, who owns it.
        Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
    }

    /// Imports a pool exported by another process as file descriptor `fd` (valid in
    /// this process) and grants `ctx`'s device read-write access to it.
    pub fn import_fd(ctx: &Context, fd: i32) -> Result<MemPool> {
        let drv = ctx.driver();
        let f = optional(
            drv,
            drv.mem_pool_import_from_shareable_handle,
            "cuMemPoolImportFromShareableHandle",
        )?;
        let _g = ctx.push()?;
        let mut raw = CUmemoryPool::NULL;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the handle is the fd value itself.
        check(drv, "cuMemPoolImportFromShareableHandle", unsafe {
            f(
                &mut raw,
                fd as isize as *mut c_void,
                handle_type::POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        let pool = MemPool {
            raw,
            ctx: ctx.clone(),
            owned: true,
        };
        Ok(pool)
    }

    /// Grants `ctx`'s device read-write access to the pool's memory.
    pub fn set_access(&self, ctx: &Context) -> Result<()> {
        let drv = self.ctx.driver();
        let f = optional(drv, drv.mem_pool_set_access, "cuMemPoolSetAccess")?;
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.device().ordinal() as i32,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid descriptor.
        check(drv, "cuMemPoolSetAccess", unsafe { f(self.raw, &desc, 1) })
    }

    /// The export data of `ptr`, an allocation of this (exportable) pool.
    pub fn export_pointer(&self, ptr: CUdeviceptr) -> Result<[u8; 64]> {
        let drv = self.ctx.driver();
        let f = optional(drv, drv.mem_pool_export_pointer, "cuMemPoolExportPointer")?;
        let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
        // SAFETY: `data` is a valid out-pointer; the driver validates `ptr`.
        check(drv, "cuMemPoolExportPointer", unsafe { f(&mut data, ptr) })?;
        Ok(data.reserved)
    }

    /// Maps an exported pointer of this imported pool into this process.
    pub fn import_pointer(&self, data: &[u8; 64]) -> Result<CUdeviceptr> {
        let drv = self.ctx.driver();
        let f = optional(drv, drv.mem_pool_import_pointer, "cuMemPoolImportPointer")?;
        let mut d = CUmemPoolPtrExportData { reserved: *data };
        let mut p: CUdeviceptr = 0;
        let _g = self.ctx.push()?;
        // SAFETY: the driver validates the export data against the pool.
        check(drv, "cuMemPoolImportPointer", unsafe {
            f(&mut p, self.raw, &mut d)
        })?;
        Ok(p)
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let drv = self.ctx.driver();
        if let Some(destroy) = drv.mem_pool_destroy {
            // SAFETY: we own this pool and destroy it once.
            let r = unsafe { destroy(self.raw) };
            if let Err(e) = check(drv, "cuMemPoolDestroy", r) {
                let gone = e.is_shutting_down();
                self.ctx.record_drop_error(e);
                if !gone {
                    // SAFETY: we own this pool, its destruction just failed,
                    // and nobody uses it after its owner's drop.
                    unsafe {
                        self.ctx
                            .free_later(crate::doomed::Orphan::MemPool(self.raw))
                    };
                }
            }
        }
    }
}

/// Queues a free of `ptr` on `stream` (`cuMemFreeAsync`).
///
/// # Safety
/// `ptr` must come from the stream-ordered allocator, be freed once, and work on
/// other streams that uses it must be ordered before `stream`'s free.
pub unsafe fn free_async(ptr: CUdeviceptr, stream: &Stream) -> Result<()> {
    let ctx = stream.context();
    let drv = ctx.driver();
    let f = optional(drv, drv.mem_free_async, "cuMemFreeAsync")?;
    let _g = ctx.push()?;
    // SAFETY: forwarded to the caller.
    check(drv, "cuMemFreeAsync", unsafe { f(ptr, stream.raw()) })
}

/// Queues an allocation from the device's default pool on `stream` (`cuMemAllocAsync`).
pub fn alloc_async(size: usize, stream: &Stream) -> Result<CUdeviceptr> {
    if size == 0 {
        return Err(DriverError::invalid(
            "allocation size",
            0,
            "at least one byte is needed",
        ));
    }
    let ctx = stream.context();
    let drv = ctx.driver();
    let f = optional(drv, drv.mem_alloc_async, "cuMemAllocAsync")?;
    let _g = ctx.push()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: the stream is alive; `p` is a valid out-pointer.
    check(drv, "cuMemAllocAsync", unsafe {
        f(&mut p, size, stream.raw())
    })?;
    Ok(p)
}

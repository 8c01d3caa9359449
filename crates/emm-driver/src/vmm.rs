//! Sharing virtual-memory allocations (`cuMemCreate` handles) with another process
//! by POSIX file descriptor: [`export_fd`] in the exporter, [`ImportedRange`] in
//! the importer (imports the pieces, reserves a fresh address range, maps them
//! one after another and grants access; undone on drop).
//!
//! The descriptors are plain fds: moving them between processes (`pidfd_getfd`,
//! `SCM_RIGHTS`) is the caller's business.

use core::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};

use emm_sys::{
    handle_type, CUdevice_attribute, CUdeviceptr, CUmemAccessDesc, CUmemGenericAllocationHandle,
    CUmemLocation, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_LOCATION_TYPE_DEVICE,
};

use crate::error::{check, optional, DriverError, Result};
use crate::{Context, Device};

/// Whether `device` can export and import `cuMemCreate` memory as POSIX file
/// descriptors (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`,
/// and the driver has both entry points).
pub fn supports_fd_export(device: Device) -> bool {
    let Ok(drv) = crate::driver() else {
        return false;
    };
    drv.mem_export_to_shareable_handle.is_some()
        && drv.mem_import_from_shareable_handle.is_some()
        && device
            .attribute(CUdevice_attribute::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
            .is_ok_and(|v| v != 0)
}

/// Exports `handle` (made by `cuMemCreate` with
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` requested) as a new file
/// descriptor of this process, owned by the caller.
pub fn export_fd(ctx: &Context, handle: CUmemGenericAllocationHandle) -> Result<OwnedFd> {
    let drv = ctx.driver();
    let f = optional(
        drv,
        drv.mem_export_to_shareable_handle,
        "cuMemExportToShareableHandle",
    )?;
    let _g = ctx.push()?;
    let mut fd: i32 = -1;
    // SAFETY: for POSIX_FILE_DESCRIPTOR the out-handle is an `int`.
    check(drv, "cuMemExportToShareableHandle", unsafe {
        f(
            (&mut fd as *mut i32).cast(),
            handle,
            handle_type::POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    if fd < 0 {
        return Err(DriverError::InvalidArgument {
            what: "descriptor from cuMemExportToShareableHandle",
            asked: "a file descriptor".into(),
            found: fd.to_string(),
        });
    }
    // SAFETY: the driver made a fresh descriptor for the caller, who owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pieces of another process's memory mapped one after another at a fresh
/// address range of this process, readable and writable by the context's device.
/// Dropping it waits for the context, then unmaps, releases and frees the range.
#[derive(Debug)]
pub struct ImportedRange {
    ctx: Context,
    /// The imported handles, in order.
    handles: Vec<CUmemGenericAllocationHandle>,
    /// The reservation, once made.
    reserved: Option<(CUdeviceptr, usize)>,
    /// The mappings made, in order.
    mapped: Vec<(CUdeviceptr, usize)>,
}

// SAFETY: driver handles and addresses are plain values usable from any thread.
unsafe impl Send for ImportedRange {}
// SAFETY: as above; `&self` methods only read them.
unsafe impl Sync for ImportedRange {}

impl ImportedRange {
    /// Imports each `(fd, len)` (a descriptor valid in this process, of `len`
    /// bytes, from [`export_fd`] in some process), and maps them contiguously in a
    /// fresh reservation in `ctx`. The descriptors stay the caller's. What was done
    /// before a failure is undone.
    pub fn import(ctx: &Context, pieces: &[(i32, usize)]) -> Result<ImportedRange> {
        let drv = ctx.driver();
        let import = optional(
            drv,
            drv.mem_import_from_shareable_handle,
            "cuMemImportFromShareableHandle",
        )?;
        let reserve = optional(drv, drv.mem_address_reserve, "cuMemAddressReserve")?;
        let map = optional(drv, drv.mem_map, "cuMemMap")?;
        let access = optional(drv, drv.mem_set_access, "cuMemSetAccess")?;
        let total = pieces
            .iter()
            .try_fold(0usize, |t, &(_, len)| t.checked_add(len))
            .filter(|&t| t > 0)
            .ok_or_else(|| DriverError::InvalidArgument {
                what: "pieces to import",
                asked: format!("{} pieces", pieces.len()),
                found: "no bytes, or more than the address space".into(),
            })?;
        let _g = ctx.push()?;
        let mut out = ImportedRange {
            ctx: ctx.clone(),
            handles: Vec::with_capacity(pieces.len()),
            reserved: None,
            mapped: Vec::with_capacity(pieces.len()),
        };
        for &(fd, _) in pieces {
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer; for POSIX_FILE_DESCRIPTOR the OS handle is
            // the descriptor's value; the driver does not take it over.
            check(drv, "cuMemImportFromShareableHandle", unsafe {
                import(
                    &mut h,
                    fd as isize as *mut c_void,
                    handle_type::POSIX_FILE_DESCRIPTOR,
                )
            })?;
            out.handles.push(h);
        }
        let mut base: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address or alignment asked.
        check(drv, "cuMemAddressReserve", unsafe {
            reserve(&mut base, total, 0, 0, 0)
        })?;
        out.reserved = Some((base, total));
        let mut at = base;
        for (&h, &(_, len)) in out.handles.iter().zip(pieces) {
            // SAFETY: `[at, at+len)` lies in the reservation made above and is not
            // mapped; `h` is a live imported handle (the driver checks its size).
            check(drv, "cuMemMap", unsafe { map(at, len, 0, h, 0) })?;
            out.mapped.push((at, len));
            at += len as u64;
        }
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.device().ordinal() as i32,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `[base, base+total)` was just mapped, piece by piece; one valid
        // descriptor.
        check(drv, "cuMemSetAccess", unsafe {
            access(base, total, &desc, 1)
        })?;
        Ok(out)
    }

    /// The start of the mapped range in this process.
    pub fn base(&self) -> CUdeviceptr {
        self.reserved.map_or(0, |(b, _)| b)
    }

    /// Its length (the pieces' lengths added).
    pub fn size(&self) -> usize {
        self.reserved.map_or(0, |(_, s)| s)
    }
}

impl Drop for ImportedRange {
    fn drop(&mut self) {
        let drv = self.ctx.driver();
        let Ok(_g) = self.ctx.push() else {
            return;
        };
        if !self.mapped.is_empty() {
            // The importer's work on the memory is done before it goes.
            if let Err(e) = self.ctx.synchronize_keeping_deferred() {
                self.ctx.record_drop_error(e);
            }
        }
        if let Some(unmap) = drv.mem_unmap {
            for &(at, len) in &self.mapped {
                // SAFETY: each mapping made by `import` is undone once.
                if let Err(e) = check(drv, "cuMemUnmap", unsafe { unmap(at, len) }) {
                    self.ctx.record_drop_error(e);
                }
            }
        }
        if let Some(release) = drv.mem_release {
            for &h in &self.handles {
                // SAFETY: each imported handle is released once, after its mapping.
                if let Err(e) = check(drv, "cuMemRelease", unsafe { release(h) }) {
                    self.ctx.record_drop_error(e);
                }
            }
        }
        if let (Some((base, size)), Some(free)) = (self.reserved, drv.mem_address_free) {
            // SAFETY: the reservation is freed once, after its mappings.
            if let Err(e) = check(drv, "cuMemAddressFree", unsafe { free(base, size) }) {
                self.ctx.record_drop_error(e);
            }
        }
    }
}

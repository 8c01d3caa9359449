//! Sharing virtual-memory allocations (`cuMemCreate` handles) with another process
//! by POSIX file descriptor: [`export_fd`] in the exporter, [`ImportedRange`] in
//! the importer (imports the pieces, reserves a fresh address range, maps them
//! one after another and grants access; undone on drop).
//!
//! The descriptors are plain fds: moving them between processes (`pidfd_getfd`,
//! `SCM_RIGHTS`) is the caller's business.

use core::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
        let lens: Vec<usize> = pieces.iter().map(|&(_, len)| len).collect();
        Self::import_each(ctx, &lens, |i| Ok::<_, DriverError>(CallersFd(pieces[i].0)))
    }

    /// [`ImportedRange::import`] with each piece's descriptor asked of `take`
    /// (by the piece's index) just before the piece is imported, and dropped
    /// right after: a range of many pieces never needs more than one of them
    /// open at once (an 8 GiB block of 8 MiB pieces has 1,024, the default
    /// limit of open descriptors). `take`'s error is returned as it is; what
    /// was done before it is undone.
    pub fn import_each<F: AsRawFd, E: From<DriverError>>(
        ctx: &Context,
        lens: &[usize],
        mut take: impl FnMut(usize) -> core::result::Result<F, E>,
    ) -> core::result::Result<ImportedRange, E> {
        let drv = ctx.driver();
        let import = optional(
            drv,
            drv.mem_import_from_shareable_handle,
            "cuMemImportFromShareableHandle",
        )?;
        let reserve = optional(drv, drv.mem_address_reserve, "cuMemAddressReserve")?;
        let map = optional(drv, drv.mem_map, "cuMemMap")?;
        let access = optional(drv, drv.mem_set_access, "cuMemSetAccess")?;
        // What `close` needs to undo it, asked for before anything is made.
        optional(drv, drv.mem_unmap, "cuMemUnmap")?;
        optional(drv, drv.mem_release, "cuMemRelease")?;
        optional(drv, drv.mem_address_free, "cuMemAddressFree")?;
        let total = lens
            .iter()
            .try_fold(0usize, |t, &len| t.checked_add(len))
            .filter(|&t| t > 0)
            .ok_or_else(|| DriverError::InvalidArgument {
                what: "pieces to import",
                asked: format!("{} pieces", lens.len()),
                found: "no bytes, or more than the address space".into(),
            })?;
        let _g = ctx.push()?;
        let mut out = ImportedRange {
            ctx: ctx.clone(),
            handles: Vec::with_capacity(lens.len()),
            reserved: None,
            mapped: Vec::with_capacity(lens.len()),
        };
        for i in 0..lens.len() {
            let fd = take(i)?;
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: valid out-pointer; for POSIX_FILE_DESCRIPTOR the OS handle is
            // the descriptor's value (open while `fd` lives); the driver does not
            // take it over.
            check(drv, "cuMemImportFromShareableHandle", unsafe {
                import(
                    &mut h,
                    fd.as_raw_fd() as isize as *mut c_void,
                    handle_type::POSIX_FILE_DESCRIPTOR,
                )
            })?;
            drop(fd);
            out.handles.push(h);
        }
        let mut base: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address or alignment asked.
        check(drv, "cuMemAddressReserve", unsafe {
            reserve(&mut base, total, 0, 0, 0)
        })?;
        out.reserved = Some((base, total));
        let mut at = base;
        for (&h, &len) in out.handles.iter().zip(lens) {
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

impl ImportedRange {
    /// Undoes the import now: waits for the context (the importer's work on
    /// the memory is done before it goes), unmaps the pieces, releases their
    /// handles and frees the range. What the driver refuses stays, for another
    /// `close` or the drop, and the first refusal is returned; what was undone
    /// is not undone twice. After `Ok` nothing is left and the drop does
    /// nothing.
    pub fn close(&mut self) -> Result<()> {
        let drv = self.ctx.driver();
        if !self.mapped.is_empty() {
            self.ctx.synchronize_keeping_deferred()?;
        }
        let mut first = None;
        if !self.mapped.is_empty() {
            let unmap = optional(drv, drv.mem_unmap, "cuMemUnmap")?;
            self.mapped.retain(|&(at, len)| {
                // SAFETY: each mapping made by `import` is undone once (it
                // leaves `mapped` when the driver took it back).
                let r = check(drv, "cuMemUnmap", unsafe { unmap(at, len) });
                r.map_err(|e| first.get_or_insert(e)).is_err()
            });
        }
        if !self.handles.is_empty() {
            let release = optional(drv, drv.mem_release, "cuMemRelease")?;
            self.handles.retain(|&h| {
                // SAFETY: each imported handle is released once; memory of one
                // still mapped goes with that mapping.
                let r = check(drv, "cuMemRelease", unsafe { release(h) });
                r.map_err(|e| first.get_or_insert(e)).is_err()
            });
        }
        // The range is freed last, and only once nothing of the import is
        // left: while a refused piece is kept, so is its address, and no
        // later import in this process is given it (a caller that keeps this
        // range by its address, as the C ABI does, finds it unshared).
        if let (true, true, Some((base, size))) = (
            self.mapped.is_empty(),
            self.handles.is_empty(),
            self.reserved,
        ) {
            let free = optional(drv, drv.mem_address_free, "cuMemAddressFree")?;
            // SAFETY: the reservation is freed once, after its mappings.
            match check(drv, "cuMemAddressFree", unsafe { free(base, size) }) {
                Ok(()) => self.reserved = None,
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for ImportedRange {
    /// [`ImportedRange::close`]; what the driver refuses is handed to the
    /// context ([`Context::free_later`]), which releases it again later, and
    /// the first refusal is recorded for the context's next call.
    fn drop(&mut self) {
        let Err(e) = self.close() else {
            return;
        };
        let shutting_down = e.is_shutting_down();
        self.ctx.record_drop_error(e);
        if shutting_down {
            // The driver has torn down with everything it held (the process
            // is exiting): nothing is left to hand over.
            return;
        }
        let ctx = &self.ctx;
        // SAFETY (of each `free_later` below): each mapping, handle and reservation
        // is live in this context (its release was refused, or not tried
        // after the context's wait failed: the context waits for itself
        // again before it undoes a mapping handed to it, so work still
        // queued on one is done first), handed over once (drained from this
        // range), and this range, its only user, is going. The context
        // releases mappings before handles before reservations.
        for (addr, len) in self.mapped.drain(..) {
            // SAFETY: see above.
            unsafe { ctx.free_later(crate::Orphan::Mapping { addr, len }) };
        }
        for h in self.handles.drain(..) {
            // SAFETY: see above.
            unsafe { ctx.free_later(crate::Orphan::Handle(h)) };
        }
        if let Some((addr, size)) = self.reserved.take() {
            // SAFETY: see above.
            unsafe { ctx.free_later(crate::Orphan::Reservation { addr, size }) };
        }
    }
}

/// A descriptor the caller of [`ImportedRange::import`] keeps open.
struct CallersFd(i32);

impl AsRawFd for CallersFd {
    fn as_raw_fd(&self) -> i32 {
        self.0
    }
}

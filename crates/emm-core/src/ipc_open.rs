//! Opening an [`IpcHandle`] in this process: [`IpcHandle::open`] maps the
//! exporter's memory, or stages it through a buffer of the importing manager when
//! the memory lives on another device (NBEP 7 "Staged IPC"); the result is an
//! [`IpcMemory`].
//!
//! Apart from `ipc.rs` (the handle itself: its kinds, bytes and export) because
//! opening needs a [`MemoryManager`], whose trait in turn names [`IpcHandle`]: the
//! handle sits below the trait, opening above it.

use emm_driver::memory;
use emm_driver::mempool::MemPool;
use emm_driver::vmm::ImportedRange;
use emm_driver::{Context, Device};
use emm_sys::CUdeviceptr;

use crate::error::Result;
use crate::ipc::{at_offset, invalid, IpcHandle};
use crate::manager::MemoryManager;
use crate::pointer::DeviceAllocation;

impl IpcHandle {
    /// Opens the handle in `ctx` (another process than the exporter). When `ctx` is
    /// on another device than the memory, the data is staged through a buffer that
    /// `manager` allocates on `ctx`'s device (NBEP 7 "Staged IPC").
    ///
    /// A range outside the exported allocation (a handle built in code rather than
    /// parsed) is [`EmmError::InvalidIpcHandle`](crate::EmmError::InvalidIpcHandle),
    /// before anything is mapped.
    pub fn open(&self, ctx: &Context, manager: &dyn MemoryManager) -> Result<IpcMemory> {
        self.validate()?;
        let uuid = self.device_uuid();
        if ctx.device().uuid()? == uuid {
            let (ptr, mapping) = self.map(ctx)?;
            return Ok(IpcMemory {
                ptr,
                size: self.size(),
                inner: Inner::Mapped(Some(mapping)),
            });
        }
        let src_dev = Device::all()?
            .into_iter()
            .find(|d| d.uuid().map(|u| u == uuid).unwrap_or(false))
            .ok_or_else(|| {
                invalid(format!(
                    "the memory lives on device {}, which this process cannot see",
                    fmt_uuid(&uuid)
                ))
            })?;
        let src_ctx = Context::primary(src_dev)?;
        let (src_ptr, mapping) = self.map(&src_ctx)?;
        let staging = manager.memalloc(self.size())?;
        // SAFETY: the source mapping covers `size` bytes at `src_ptr` (checked when
        // the handle was parsed/opened); staging holds `size` bytes.
        let copied =
            unsafe { memory::copy_peer(ctx, staging.ptr(), &src_ctx, src_ptr, self.size()) };
        drop(mapping); // closes the source mapping whatever the copy did
        copied?;
        Ok(IpcMemory {
            ptr: staging.ptr(),
            size: self.size(),
            inner: Inner::Staged(staging),
        })
    }

    fn map(&self, ctx: &Context) -> Result<(CUdeviceptr, Mapping)> {
        match self {
            IpcHandle::Legacy { handle, offset, .. } => {
                let base = memory::ipc_open_handle(ctx, handle)?;
                let mapping = Mapping::Legacy {
                    ctx: ctx.clone(),
                    base,
                };
                check_imported(ctx, base, *offset, self.size())?;
                Ok((at_offset(base, *offset)?, mapping))
            }
            IpcHandle::MemPool {
                export,
                pool_fd,
                pid,
                offset,
                ..
            } => {
                let fd = crate::fd::take_fd(*pid, *pool_fd)?;
                let imported = MemPool::import_fd(ctx, fd.raw());
                drop(fd);
                let pool = imported?;
                pool.set_access(ctx).ok(); // the owner device may already have access
                let ptr = pool.import_pointer(export)?;
                let mapping = Mapping::Pool {
                    ctx: ctx.clone(),
                    ptr,
                    pool,
                };
                check_imported(ctx, ptr, *offset, self.size())?;
                Ok((at_offset(ptr, *offset)?, mapping))
            }
            IpcHandle::Vmm {
                pid,
                pieces,
                offset,
                ..
            } => {
                // Every descriptor is taken first (each a duplicate in this
                // process, closed once the pieces are imported).
                let taken = pieces
                    .iter()
                    .map(|&(fd, _)| crate::fd::take_fd(*pid, fd))
                    .collect::<Result<Vec<_>>>()?;
                let local: Vec<(i32, usize)> = taken
                    .iter()
                    .zip(pieces)
                    .map(|(t, &(_, len))| (t.raw(), len))
                    .collect();
                let range = ImportedRange::import(ctx, &local)?;
                drop(taken);
                let ptr = at_offset(range.base(), *offset)?;
                Ok((ptr, Mapping::Vmm(range)))
            }
        }
    }
}

/// The driver knows the real extent of an opened allocation starting at `ptr`: the
/// shared range must lie in it too (a handle can claim a larger allocation than the
/// exporter's). Where the driver cannot say, the handle's own check stands.
fn check_imported(ctx: &Context, ptr: CUdeviceptr, offset: usize, size: usize) -> Result<()> {
    if let Ok((real_base, real_size)) = memory::address_range(ctx, ptr) {
        let fits = usize::try_from(ptr.saturating_sub(real_base))
            .ok()
            .and_then(|s| s.checked_add(offset))
            .and_then(|s| s.checked_add(size))
            .is_some_and(|end| end <= real_size);
        if !fits {
            return Err(invalid(format!(
                "range {offset}+{size} lies outside the opened allocation of {real_size} bytes"
            )));
        }
    }
    Ok(())
}

fn fmt_uuid(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

enum Mapping {
    Legacy {
        ctx: Context,
        base: CUdeviceptr,
    },
    Pool {
        ctx: Context,
        ptr: CUdeviceptr,
        pool: MemPool,
    },
    /// Imported virtual-memory pieces; unmapped and released by its own drop.
    Vmm(#[allow(dead_code)] ImportedRange), // reason: held for its Drop
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match self {
            Mapping::Legacy { ctx, base } => {
                // SAFETY: `base` came from cuIpcOpenMemHandle and is closed once.
                if let Err(e) = unsafe { memory::ipc_close_handle(ctx, *base) } {
                    ctx.record_drop_error(e);
                }
            }
            Mapping::Pool { ctx, ptr, pool } => {
                // An imported pointer is freed in the importer before the exporter
                // frees it; synchronizing makes the free complete before the pool goes.
                let stream = emm_driver::Stream::legacy(ctx);
                // SAFETY: `ptr` was imported from `pool` and is freed once.
                let r = unsafe { emm_driver::mempool::free_async(*ptr, &stream) }
                    .and_then(|()| stream.synchronize());
                if let Err(e) = r {
                    ctx.record_drop_error(e);
                }
                let _ = pool; // dropped after the free
            }
            Mapping::Vmm(_) => {} // `ImportedRange`'s drop undoes the import
        }
    }
}

enum Inner {
    Mapped(Option<Mapping>),
    /// The staging buffer, owned by the importing manager; released on drop.
    Staged(#[allow(dead_code)] DeviceAllocation), // reason: held for its Drop
}

/// Device memory opened from an [`IpcHandle`]: a mapping of the exporter's memory
/// (closed on drop), or a staged copy owned by the importing manager.
pub struct IpcMemory {
    ptr: CUdeviceptr,
    size: usize,
    inner: Inner,
}

impl core::fmt::Debug for IpcMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IpcMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("staged", &self.is_staged())
            .finish()
    }
}

impl IpcMemory {
    /// The device address of the shared range in this process.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Its size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// `true` when the memory is a staged copy rather than a mapping.
    pub fn is_staged(&self) -> bool {
        matches!(self.inner, Inner::Staged(_))
    }

    /// Closes the mapping now (or releases the staging copy).
    pub fn close(mut self) {
        if let Inner::Mapped(m) = &mut self.inner {
            drop(m.take());
        }
    }
}

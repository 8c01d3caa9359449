//! Opening an [`IpcHandle`] in this process: [`IpcHandle::open`] maps the
//! exporter's memory, or stages it through a buffer of the importing manager when
//! the memory lives on another device (NBEP 7 "Staged IPC"); the result is an
//! [`IpcMemory`].
//!
//! Apart from `ipc.rs` (the handle itself: its kinds, bytes and export) because
//! opening needs a [`MemoryManager`], whose trait in turn names [`IpcHandle`]: the
//! handle sits below the trait, opening above it.

use std::os::fd::AsRawFd as _;

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
        if self.size() == 0 {
            // Nothing to copy: an empty range opens as it does on its own device
            // (no staging buffer; `memalloc(0)` has no address to copy to).
            close_source(ctx, mapping);
            return Ok(IpcMemory {
                ptr: 0,
                size: 0,
                inner: Inner::Mapped(None),
            });
        }
        let staging = manager.memalloc(self.size())?;
        // SAFETY: the source mapping covers `size` bytes at `src_ptr` (checked when
        // the handle was parsed/opened); staging holds `size` bytes.
        let copied =
            unsafe { memory::copy_peer(ctx, staging.ptr(), &src_ctx, src_ptr, self.size()) };
        // The source mapping is closed whatever the copy did.
        close_source(ctx, mapping);
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
                    base: Some(base),
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
                let imported = MemPool::import_fd(ctx, fd.as_raw_fd());
                drop(fd);
                let pool = imported?;
                pool.set_access(ctx).ok(); // the owner device may already have access
                let ptr = pool.import_pointer(export)?;
                let mapping = Mapping::Pool {
                    ctx: ctx.clone(),
                    ptr: Some(ptr),
                    size: self.size(),
                    pool: Some(pool),
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
                // Each descriptor is taken (a duplicate in this process) just
                // before its piece is imported and closed right after: a block
                // of many pieces needs one descriptor open at a time here.
                let lens: Vec<usize> = pieces.iter().map(|&(_, len)| len).collect();
                let range = ImportedRange::import_each(ctx, &lens, |i| {
                    crate::fd::take_fd(*pid, pieces[i].0)
                })?;
                let ptr = at_offset(range.base(), *offset)?;
                Ok((ptr, Mapping::Vmm(range)))
            }
        }
    }
}

/// Closes the mapping of the source device's memory that a staged open copied
/// from. A refusal is recorded on `ctx`, the caller's context, for its next
/// call: the source's is another device's primary context, which the caller
/// may never call on. The mapping's drop then tries once more (recording a
/// second refusal on the source's context, handing over what it may).
fn close_source(ctx: &Context, mut mapping: Mapping) {
    if let Err(e) = mapping.close() {
        ctx.record_drop_error(e);
    }
}

/// The driver knows the real extent of an opened allocation starting at `ptr`: the
/// shared range must lie in it too (a handle can claim a larger allocation than the
/// exporter's, and the staged path copies the range). Where the driver cannot say,
/// its error is returned: the handle's own claim is not taken on trust.
fn check_imported(ctx: &Context, ptr: CUdeviceptr, offset: usize, size: usize) -> Result<()> {
    let (real_base, real_size) = memory::address_range(ctx, ptr)?;
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
    Ok(())
}

fn fmt_uuid(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

enum Mapping {
    Legacy {
        ctx: Context,
        /// `None` once closed.
        base: Option<CUdeviceptr>,
    },
    Pool {
        ctx: Context,
        /// The imported pointer, `None` once its free was queued.
        ptr: Option<CUdeviceptr>,
        /// The bytes shared through it (what a pointer handed to the context
        /// counts).
        size: usize,
        /// The imported pool, `None` once closed (after the free completed).
        pool: Option<MemPool>,
    },
    /// Imported virtual-memory pieces.
    Vmm(ImportedRange),
}

impl Mapping {
    /// Undoes the mapping. A refusal leaves what was not undone for another
    /// `close` or the drop (nothing is undone twice) and is returned.
    fn close(&mut self) -> emm_driver::Result<()> {
        match self {
            Mapping::Legacy { ctx, base } => {
                if let Some(b) = *base {
                    // SAFETY: `b` came from cuIpcOpenMemHandle and is closed once
                    // (`base` is cleared when the driver took it back).
                    unsafe { memory::ipc_close_handle(ctx, b) }?;
                    *base = None;
                }
            }
            Mapping::Pool { ctx, ptr, pool, .. } => {
                // An imported pointer is freed in the importer before the exporter
                // frees it; the wait makes the free complete before the pool goes.
                // The library's own wait, in a drop too: the errors other drops
                // recorded on the context stay for their callers.
                let stream = emm_driver::Stream::legacy(ctx);
                if let Some(p) = *ptr {
                    // SAFETY: `p` was imported from `pool` and is freed once
                    // (`ptr` is cleared when the free was queued).
                    unsafe { emm_driver::mempool::free_async(p, &stream) }?;
                    *ptr = None;
                }
                if pool.is_some() {
                    stream.synchronize_keeping_deferred()?;
                    *pool = None;
                }
            }
            Mapping::Vmm(range) => range.close()?,
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match self {
            // `ImportedRange`'s own drop closes it and hands what is left to the
            // context.
            Mapping::Vmm(_) => {}
            Mapping::Legacy { .. } | Mapping::Pool { .. } => {
                let Err(e) = self.close() else {
                    return;
                };
                let shutting_down = e.is_shutting_down();
                match self {
                    Mapping::Legacy { ctx, .. } => ctx.record_drop_error(e),
                    Mapping::Pool {
                        ctx,
                        ptr,
                        size,
                        pool,
                    } => {
                        ctx.record_drop_error(e);
                        // A pointer whose free was refused goes to the context,
                        // and its pool with it, destroyed after the pointer is
                        // freed (the context frees memory before pools). A free
                        // that was queued needs nothing more: the pool's own
                        // drop destroys it, and the driver releases a pool
                        // once its frees complete.
                        if let (false, Some(p)) = (shutting_down, ptr.take()) {
                            // SAFETY: `p` was imported from `pool` in `ctx` and
                            // its free was refused, so it is live; it is handed
                            // over once (`ptr` is cleared) and this mapping, its
                            // only user, is going.
                            unsafe {
                                ctx.free_later(emm_driver::Orphan::StreamOrdered {
                                    ptr: p,
                                    size: *size,
                                })
                            };
                            if let Some(pool) = pool.take() {
                                pool.hand_over();
                            }
                        }
                    }
                    Mapping::Vmm(_) => {}
                }
            }
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

    /// Closes the mapping now, or gives the staging copy back to its manager.
    /// The driver's or the manager's refusal is returned, and what it refused
    /// stays for another `close`: the memory may be partly closed then (some
    /// pieces of a virtual-memory range unmapped, a pool pointer's free
    /// queued), so the address is not to be used again either way; nothing
    /// is undone twice. Call `close` again, or drop it, which tries once more
    /// and records a refusal for the context's next call (what a
    /// virtual-memory mapping still holds, or a pool pointer whose free was
    /// refused and its pool, is handed to the context,
    /// [`Context::free_later`]; a staging copy's manager keeps what it could
    /// not free, as for any allocation dropped). After `Ok` the drop does
    /// nothing.
    pub fn close(&mut self) -> Result<()> {
        // Taken out while it closes; what the driver or the manager refused
        // goes back.
        match core::mem::replace(&mut self.inner, Inner::Mapped(None)) {
            Inner::Mapped(None) => {}
            Inner::Mapped(Some(mut mapping)) => {
                if let Err(e) = mapping.close() {
                    self.inner = Inner::Mapped(Some(mapping));
                    return Err(e.into());
                }
            }
            Inner::Staged(staging) => {
                if let Err(not_freed) = staging.free() {
                    let crate::pointer::NotFreed { allocation, error } = *not_freed;
                    self.inner = Inner::Staged(allocation);
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// `false` once [`IpcMemory::close`] succeeded, and for an empty range
    /// opened from another device (nothing was mapped or staged).
    pub fn is_open(&self) -> bool {
        matches!(self.inner, Inner::Mapped(Some(_)) | Inner::Staged(_))
    }
}

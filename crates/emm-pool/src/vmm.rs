//! Virtual memory for the pool's expandable segment: reserve address space once,
//! back it with memory in pieces as the pool grows, give pieces back when free.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use emm_core::{EmmError, Result};
use emm_default::{HostUpstream, Upstream};
use emm_driver::{check, optional, Context};
use emm_sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemLocation,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOCATION_TYPE_PINNED,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, CU_MEM_LOCATION_TYPE_DEVICE,
};

/// Address-space reservation and mapping.
pub trait VirtualMemory: Send + Sync {
    /// Reserves `size` bytes of address space.
    fn reserve(&self, size: usize) -> Result<CUdeviceptr>;
    /// Backs `[addr, addr+len)` with memory.
    fn map(&self, addr: CUdeviceptr, len: usize) -> Result<()>;
    /// Releases a range given to `map` whole, after waiting for the device.
    fn unmap(&self, addr: CUdeviceptr, len: usize) -> Result<()>;
    /// As `unmap`, for a range the device is known to be done with (the caller
    /// waited for the work queued on it): no synchronization.
    fn unmap_done(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.unmap(addr, len)
    }
    /// Maps at `dst` (unmapped, in a reservation) the memory mapped at `src` (the
    /// start of a range `map` or `alias` mapped whole, `len` bytes): the same memory
    /// at two addresses. The memory is released when its last mapping is unmapped.
    /// The default: unsupported (the pool then maps new memory instead).
    fn alias(&self, _src: CUdeviceptr, _dst: CUdeviceptr, _len: usize) -> Result<()> {
        Err(EmmError::Unsupported {
            manager: "pool".into(),
            operation: "alias",
        })
    }
    /// Maps `pieces` one after another at `dst` and up: piece `i` of `len` bytes is
    /// new memory (`None`, as `map`) or the memory mapped at `src` (`Some(src)`, as
    /// `alias`; `len` must be that mapping's length), each piece its own memory so
    /// that it can move later. Returns how many pieces, from the first, were
    /// mapped, and the error that stopped it. The default maps them one by one; the
    /// driver's grants access once over the whole range (one `cuMemSetAccess`
    /// instead of one a piece).
    fn map_pieces(
        &self,
        dst: CUdeviceptr,
        pieces: &[(Option<CUdeviceptr>, usize)],
    ) -> (usize, Result<()>) {
        let mut at = dst;
        for (i, &(src, len)) in pieces.iter().enumerate() {
            let r = match src {
                None => self.map(at, len),
                Some(src) => self.alias(src, at, len),
            };
            if let Err(e) = r {
                return (i, Err(e));
            }
            at += len as u64;
        }
        (pieces.len(), Ok(()))
    }
    /// Exports the pieces mapped behind `[addr, addr+len)` (a live block of the
    /// expandable segment) for another process (see `export.rs`). The default:
    /// unsupported.
    fn export_range(
        &self,
        _addr: CUdeviceptr,
        _len: usize,
    ) -> Result<crate::export::ExportedRange> {
        Err(EmmError::Unsupported {
            manager: "pool".into(),
            operation: "export of virtual memory",
        })
    }
}

/// Reservations; mappings (address → handle, length); how many mappings each
/// handle has (a handle is released with its last mapping; 0: every mapping is
/// gone but releasing the handle failed, retried by the next unmap and on drop).
type VmmState = (
    Vec<(CUdeviceptr, usize)>,
    HashMap<CUdeviceptr, (u64, usize)>,
    HashMap<u64, usize>,
);

/// The driver's virtual memory management (`cuMemAddressReserve`, `cuMemCreate`,
/// `cuMemMap`, `cuMemSetAccess`); reservations are freed on drop.
pub struct DriverVmm {
    pub(crate) ctx: Context,
    pub(crate) state: Mutex<VmmState>,
    /// Pieces are created exportable as POSIX file descriptors (see `export.rs`).
    pub(crate) exportable: bool,
    /// Descriptors of exported pieces (see `export.rs`).
    pub(crate) exports: crate::export::ExportedFds,
    /// Some handle's release failed after its last mapping went (see
    /// [`VmmState`]): the next unmap retries it.
    orphans: std::sync::atomic::AtomicBool,
}

impl DriverVmm {
    /// VMM in `ctx`, or `None` when the driver or device lacks it.
    pub fn new(ctx: &Context) -> Option<DriverVmm> {
        if !ctx.device().supports_virtual_memory().unwrap_or(false) {
            return None;
        }
        Some(DriverVmm {
            ctx: ctx.clone(),
            state: Mutex::new((Vec::new(), HashMap::new(), HashMap::new())),
            exportable: false,
            exports: Default::default(),
            orphans: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn prop(&self) -> CUmemAllocationProp {
        CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ctx.device().ordinal() as i32,
            },
            requested_handle_types: if self.exportable {
                emm_sys::handle_type::POSIX_FILE_DESCRIPTOR
            } else {
                emm_sys::handle_type::NONE
            },
            ..CUmemAllocationProp::default()
        }
    }

    /// The driver's recommended granularity (2 MiB on current GPUs).
    pub fn granularity(&self) -> Result<usize> {
        let drv = self.ctx.driver();
        let f = optional(
            drv,
            drv.mem_get_allocation_granularity,
            "cuMemGetAllocationGranularity",
        )?;
        let mut g = 0usize;
        let prop = self.prop();
        // SAFETY: valid out-pointer and a fully initialised prop.
        check(drv, "cuMemGetAllocationGranularity", unsafe {
            f(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        })?;
        Ok(g)
    }
}

impl DriverVmm {
    /// `map_pieces` of the driver: each piece created (or looked up) and mapped,
    /// then one `cuMemSetAccess` over what was mapped. `Err((n, e))`: the first `n`
    /// pieces are mapped and accessible, the rest are not mapped.
    fn map_pieces_once(
        &self,
        dst: CUdeviceptr,
        pieces: &[(Option<CUdeviceptr>, usize)],
    ) -> std::result::Result<usize, (usize, EmmError)> {
        let drv = self.ctx.driver();
        let fns = (|| {
            Ok::<_, EmmError>((
                optional(drv, drv.mem_create, "cuMemCreate")?,
                optional(drv, drv.mem_map, "cuMemMap")?,
                optional(drv, drv.mem_set_access, "cuMemSetAccess")?,
                optional(drv, drv.mem_release, "cuMemRelease")?,
                optional(drv, drv.mem_unmap, "cuMemUnmap")?,
            ))
        })();
        let (create, map, access, release, unmap) = fns.map_err(|e| (0, e))?;
        let _g = self.ctx.push().map_err(|e| (0, EmmError::from(e)))?;
        let prop = self.prop();
        // (address, length, handle, whether this call created the handle)
        let mut done: Vec<(CUdeviceptr, usize, u64, bool)> = Vec::with_capacity(pieces.len());
        let mut failure = None;
        let mut at = dst;
        for &(src, page) in pieces {
            let (h, created) = match src {
                None => {
                    let mut h = 0u64;
                    // SAFETY: valid out-pointer and prop; each piece's length is a
                    // multiple of the granularity.
                    if let Err(e) = check(drv, "cuMemCreate", unsafe {
                        create(&mut h, page, &prop, 0)
                    }) {
                        failure = Some(EmmError::from(e));
                        break;
                    }
                    (h, true)
                }
                Some(src) => {
                    let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    match st.1.get(&src) {
                        Some(&(h, l)) if l == page => (h, false),
                        _ => {
                            failure = Some(EmmError::InvalidArgument {
                                what: "address to alias",
                                found: format!("{src:#x} ({page} bytes)"),
                                expected: "the start of a range this pool mapped whole".into(),
                            });
                            break;
                        }
                    }
                }
            };
            // SAFETY: `[at, at+page)` lies in our reservation and is not mapped; `h`
            // is a live handle of `page` bytes.
            if let Err(e) = check(drv, "cuMemMap", unsafe { map(at, page, 0, h, 0) }) {
                if created {
                    // SAFETY: the handle was created above, never mapped; released once.
                    let _ = unsafe { release(h) };
                }
                failure = Some(e.into());
                break;
            }
            done.push((at, page, h, created));
            at += page as u64;
        }
        let desc = CUmemAccessDesc {
            location: prop.location,
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let n = done.len();
        let len = (at - dst) as usize;
        if n > 0 {
            // SAFETY: `[dst, dst + len)` was just mapped, piece by piece; one valid
            // descriptor.
            if let Err(e) = check(drv, "cuMemSetAccess", unsafe { access(dst, len, &desc, 1) }) {
                for &(at, page, h, created) in &done {
                    // SAFETY: each mapping made above is undone once, and each handle
                    // created above released once (aliased handles stay mapped at
                    // their source).
                    unsafe {
                        let _ = unmap(at, page);
                        if created {
                            let _ = release(h);
                        }
                    }
                }
                return Err((0, e.into()));
            }
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            for &(at, page, h, _) in &done {
                st.1.insert(at, (h, page));
                *st.2.entry(h).or_insert(0) += 1;
            }
        }
        match failure {
            None => Ok(n),
            Some(e) => Err((n, e)),
        }
    }
}

impl VirtualMemory for DriverVmm {
    fn reserve(&self, size: usize) -> Result<CUdeviceptr> {
        let drv = self.ctx.driver();
        let f = optional(drv, drv.mem_address_reserve, "cuMemAddressReserve")?;
        let _g = self.ctx.push()?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address or alignment asked.
        check(drv, "cuMemAddressReserve", unsafe {
            f(&mut p, size, 0, 0, 0)
        })?;
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push((p, size));
        Ok(p)
    }

    fn map(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        let drv = self.ctx.driver();
        let create = optional(drv, drv.mem_create, "cuMemCreate")?;
        let map = optional(drv, drv.mem_map, "cuMemMap")?;
        let access = optional(drv, drv.mem_set_access, "cuMemSetAccess")?;
        let release = optional(drv, drv.mem_release, "cuMemRelease")?;
        let unmap = optional(drv, drv.mem_unmap, "cuMemUnmap")?;
        let _g = self.ctx.push()?;
        let prop = self.prop();
        let mut h = 0u64;
        // SAFETY: valid out-pointer and prop; `len` is a multiple of the granularity.
        check(drv, "cuMemCreate", unsafe { create(&mut h, len, &prop, 0) })?;
        // SAFETY: `[addr, addr+len)` lies in our reservation and is not mapped.
        if let Err(e) = check(drv, "cuMemMap", unsafe { map(addr, len, 0, h, 0) }) {
            // SAFETY: the handle was created above and is released once.
            let _ = unsafe { release(h) };
            return Err(e.into());
        }
        let desc = CUmemAccessDesc {
            location: prop.location,
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one valid descriptor.
        if let Err(e) = check(drv, "cuMemSetAccess", unsafe {
            access(addr, len, &desc, 1)
        }) {
            // SAFETY: undo the map and the handle made above, once each.
            unsafe {
                let _ = unmap(addr, len);
                let _ = release(h);
            }
            return Err(e.into());
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.1.insert(addr, (h, len));
        st.2.insert(h, 1);
        Ok(())
    }

    fn alias(&self, src: CUdeviceptr, dst: CUdeviceptr, len: usize) -> Result<()> {
        let drv = self.ctx.driver();
        let map = optional(drv, drv.mem_map, "cuMemMap")?;
        let access = optional(drv, drv.mem_set_access, "cuMemSetAccess")?;
        let unmap = optional(drv, drv.mem_unmap, "cuMemUnmap")?;
        let h = match self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .get(&src)
        {
            Some(&(h, l)) if l == len => h,
            _ => {
                return Err(EmmError::InvalidArgument {
                    what: "address to alias",
                    found: format!("{src:#x} ({len} bytes)"),
                    expected: "the start of a range this pool mapped whole".into(),
                })
            }
        };
        let _g = self.ctx.push()?;
        // SAFETY: `[dst, dst+len)` lies in our reservation and is not mapped; `h` is
        // a live handle of exactly `len` bytes (mapped at `src`).
        check(drv, "cuMemMap", unsafe { map(dst, len, 0, h, 0) })?;
        let desc = CUmemAccessDesc {
            location: self.prop().location,
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one valid descriptor.
        if let Err(e) = check(drv, "cuMemSetAccess", unsafe { access(dst, len, &desc, 1) }) {
            // SAFETY: undo the mapping made above, once; the handle stays mapped
            // at `src`.
            let _ = unsafe { unmap(dst, len) };
            return Err(e.into());
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.1.insert(dst, (h, len));
        *st.2.entry(h).or_insert(0) += 1;
        Ok(())
    }

    fn export_range(&self, addr: CUdeviceptr, len: usize) -> Result<crate::export::ExportedRange> {
        self.export_pieces(addr, len)
    }

    fn map_pieces(
        &self,
        dst: CUdeviceptr,
        pieces: &[(Option<CUdeviceptr>, usize)],
    ) -> (usize, Result<()>) {
        match self.map_pieces_once(dst, pieces) {
            Ok(n) => (n, Ok(())),
            Err((n, e)) => (n, Err(e)),
        }
    }

    fn unmap(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        // Unmapping waits for nothing: the pool only unmaps blocks freed in stream
        // order; make sure the device is done with them first.
        {
            let _g = self.ctx.push()?;
            self.ctx.synchronize()?;
        }
        self.unmap_done(addr, len)
    }

    fn unmap_done(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        let drv = self.ctx.driver();
        let unmap = optional(drv, drv.mem_unmap, "cuMemUnmap")?;
        let release = optional(drv, drv.mem_release, "cuMemRelease")?;
        let Some((h, l)) = self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .get(&addr)
            .copied()
        else {
            return Err(EmmError::InvalidArgument {
                what: "address to unmap",
                found: format!("{addr:#x} ({len} bytes)"),
                expected: "the start of a range this pool mapped".into(),
            });
        };
        let _g = self.ctx.push()?;
        // SAFETY: `[addr, addr+l)` was mapped by `map` or `alias` with handle `h`;
        // each mapping is undone once; the caller waited for the work queued on it.
        check(drv, "cuMemUnmap", unsafe { unmap(addr, l) })?;
        let last = {
            // Forgotten once gone: a mapping the driver kept is still known.
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.1.remove(&addr);
            match st.2.get_mut(&h) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    st.2.remove(&h);
                    true
                }
            }
        };
        if last {
            // SAFETY: the handle's last mapping is gone; it is released once.
            if let Err(e) = check(drv, "cuMemRelease", unsafe { release(h) }) {
                // The mapping is gone (its address range may be mapped again);
                // the handle is kept for a retry, so its memory is not lost.
                self.state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .2
                    .insert(h, 0);
                self.orphans
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(error = %e, addr, len, "releasing an unmapped piece's memory failed; retried by the next unmap and on drop");
            } else {
                self.exports.forget(h);
            }
        }
        self.release_orphans();
        Ok(())
    }
}

impl DriverVmm {
    /// Retries releasing the handles whose mappings are all gone but whose release
    /// failed (see [`VmmState`]); those that fail again stay for the next try.
    fn release_orphans(&self) {
        use std::sync::atomic::Ordering;
        if !self.orphans.swap(false, Ordering::Relaxed) {
            return;
        }
        let drv = self.ctx.driver();
        let Some(release) = drv.mem_release else {
            return;
        };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let orphans: Vec<u64> =
            st.2.iter()
                .filter(|(_, &n)| n == 0)
                .map(|(&h, _)| h)
                .collect();
        for h in orphans {
            // SAFETY: `h` has no mapping left and was not released (its release
            // failed); it is released once, here or on a later retry.
            match check(drv, "cuMemRelease", unsafe { release(h) }) {
                Ok(()) => {
                    st.2.remove(&h);
                    self.exports.forget(h);
                }
                Err(_) => self.orphans.store(true, Ordering::Relaxed),
            }
        }
    }
}

impl Drop for DriverVmm {
    fn drop(&mut self) {
        let drv = self.ctx.driver();
        let (reservations, mapped, handles) =
            std::mem::take(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
        let (Some(unmap), Some(release), Some(free)) =
            (drv.mem_unmap, drv.mem_release, drv.mem_address_free)
        else {
            return;
        };
        let _ = self.ctx.synchronize();
        for (addr, (_, len)) in mapped {
            // SAFETY: each mapping is undone once.
            if let Err(e) = check(drv, "cuMemUnmap", unsafe { unmap(addr, len) }) {
                self.ctx.record_drop_error(e);
            }
        }
        for h in handles.into_keys() {
            // SAFETY: each handle is released once, after all its mappings.
            if let Err(e) = check(drv, "cuMemRelease", unsafe { release(h) }) {
                self.ctx.record_drop_error(e);
            }
        }
        for (addr, size) in reservations {
            // SAFETY: each reservation is freed once, after its mappings.
            if let Err(e) = check(drv, "cuMemAddressFree", unsafe { free(addr, size) }) {
                self.ctx.record_drop_error(e);
            }
        }
    }
}

/// Virtual memory for the host stand-in: address space from a counter, memory
/// accounted against the stand-in's capacity.
pub struct HostVmm {
    upstream: Arc<HostUpstream>,
    /// Mapping address → (backing block, length), and mappings per backing block.
    pieces: Mutex<HostPieces>,
}

type HostPieces = (
    HashMap<CUdeviceptr, (CUdeviceptr, usize)>,
    HashMap<CUdeviceptr, usize>,
);

impl HostVmm {
    /// Accounts mappings against `upstream`'s capacity.
    pub fn new(upstream: Arc<HostUpstream>) -> Self {
        HostVmm {
            upstream,
            pieces: Mutex::new((HashMap::new(), HashMap::new())),
        }
    }
}

static NEXT_VA: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 56);

impl VirtualMemory for HostVmm {
    fn reserve(&self, size: usize) -> Result<CUdeviceptr> {
        use std::sync::atomic::Ordering;
        // Made-up address ranges from 2^56 up, a gigabyte apart, never past 2^63:
        // they can neither wrap nor overlap.
        let step = (size as u64)
            .checked_add(1 << 30)
            .filter(|&s| s < 1 << 62)
            .ok_or(EmmError::InvalidSize {
                requested: size,
                reason: "larger than the host stand-in's address space",
            })?;
        NEXT_VA
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |va| {
                va.checked_add(step).filter(|&end| end <= 1 << 63)
            })
            .map_err(|_| EmmError::OutOfMemory {
                what: "address space",
                manager: "pool over the host stand-in".into(),
                requested: size,
                free: 0,
                total: 0,
                detail: "the host stand-in's made-up address space is used up".into(),
            })
    }
    fn map(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        let backing = self.upstream.alloc(len)?;
        let mut p = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        p.0.insert(addr, (backing, len));
        p.1.insert(backing, 1);
        Ok(())
    }
    fn alias(&self, src: CUdeviceptr, dst: CUdeviceptr, len: usize) -> Result<()> {
        let mut p = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        let backing = match p.0.get(&src) {
            Some(&(b, l)) if l == len => b,
            _ => {
                return Err(EmmError::InvalidArgument {
                    what: "address to alias",
                    found: format!("{src:#x} ({len} bytes)"),
                    expected: "the start of a range this pool mapped whole".into(),
                })
            }
        };
        p.0.insert(dst, (backing, len));
        *p.1.entry(backing).or_insert(0) += 1;
        Ok(())
    }
    fn unmap(&self, addr: CUdeviceptr, _len: usize) -> Result<()> {
        let (piece, last) = {
            let mut p = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
            let piece = p.0.remove(&addr);
            let last = match piece.and_then(|(b, _)| p.1.get_mut(&b)) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    if let Some((b, _)) = piece {
                        p.1.remove(&b);
                    }
                    true
                }
            };
            (piece, last)
        };
        match piece {
            // SAFETY: the backing block came from `alloc(len)` of this upstream and
            // its last mapping is gone.
            Some((b, l)) if last => unsafe { self.upstream.free(b, l) },
            Some(_) => Ok(()),
            None => Err(EmmError::InvalidArgument {
                what: "address to unmap",
                found: format!("{addr:#x}"),
                expected: "the start of a range this pool mapped".into(),
            }),
        }
    }
}

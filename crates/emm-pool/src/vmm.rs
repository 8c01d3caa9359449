//! Virtual memory for the pool's expandable segment: reserve address space once,
//! back it with memory in pieces as the pool grows, give pieces back when free.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use emm_core::{EmmError, Result};
use emm_default::{HostUpstream, Upstream};
use emm_driver::{check, optional, Context, Orphan};
use emm_sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemLocation,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOCATION_TYPE_PINNED,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, CU_MEM_LOCATION_TYPE_DEVICE,
};

use crate::growth_phases::{self, Phase};

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
    /// Retries what the driver refused earlier and this virtual memory kept
    /// rather than forgot: mappings the pool no longer knows (the rollback of a
    /// failed growth whose unmap failed too, a piece a reset failed to unmap, see
    /// [`VirtualMemory::abandon_all`]) are unmapped, and memory whose mappings are
    /// gone but whose release failed is released. What fails again stays kept for
    /// the next try; the first failure is returned. The pool calls it before it
    /// maps and on trim. The default keeps nothing.
    fn settle(&self) -> Result<()> {
        Ok(())
    }
    /// The pool no longer knows any of its mappings (a reset gave its pieces back,
    /// and those the driver refused to unmap were forgotten by the pool): every
    /// mapping still held is kept for [`VirtualMemory::settle`] to unmap, so that
    /// its memory is not lost and its range can be mapped again. The default
    /// keeps nothing.
    fn abandon_all(&self) {}
}

/// What [`DriverVmm`] knows of the driver's state.
#[derive(Default)]
pub(crate) struct VmmState {
    /// Address reservations: base and size.
    reservations: Vec<(CUdeviceptr, usize)>,
    /// Mappings: address → (handle, length).
    pub(crate) mapped: HashMap<CUdeviceptr, (u64, usize)>,
    /// Mappings per handle: a handle is released with its last mapping; 0: every
    /// mapping is gone but releasing the handle failed (an orphan, released by
    /// [`VirtualMemory::settle`] or on drop).
    handles: HashMap<u64, usize>,
    /// Addresses of `mapped` the pool no longer knows (a rollback's unmap failed,
    /// or the pool abandoned them, see [`VirtualMemory::abandon_all`]): unmapped
    /// by [`VirtualMemory::settle`], before the next map and on trim.
    abandoned: Vec<CUdeviceptr>,
}

/// The driver's virtual memory management (`cuMemAddressReserve`, `cuMemCreate`,
/// `cuMemMap`, `cuMemSetAccess`); reservations are freed on drop.
///
/// What the driver refuses to give back is kept, never forgotten: a mapping
/// whose unmap failed while a failed growth was rolled back (a lost context),
/// and a handle whose release failed, are retried by [`VirtualMemory::settle`]
/// (before every map, and on the pool's trim) and on drop.
pub struct DriverVmm {
    pub(crate) ctx: Context,
    pub(crate) state: Mutex<VmmState>,
    /// Pieces are created exportable as POSIX file descriptors (see `export.rs`).
    pub(crate) exportable: bool,
    /// Descriptors of exported pieces (see `export.rs`).
    pub(crate) exports: crate::export::ExportedFds,
    /// Something is kept for a retry: an abandoned mapping or an orphan handle
    /// (see [`VmmState`]).
    pending: AtomicBool,
    /// Held through a retry (`settle`): the pool's helper thread also settles
    /// after its unmaps, and a map must not find the flag cleared while the
    /// other thread is still unmapping what it was set for.
    settling: Mutex<()>,
}

impl DriverVmm {
    /// VMM in `ctx`, or `None` when the driver or device lacks it; the error of
    /// the driver's answer when asking failed (a pool made then would go without
    /// its expandable segment for its whole life over a fault that may clear).
    pub fn new(ctx: &Context) -> emm_core::Result<Option<DriverVmm>> {
        if !ctx.device().supports_virtual_memory()? {
            return Ok(None);
        }
        Ok(Some(DriverVmm {
            ctx: ctx.clone(),
            state: Mutex::new(VmmState::default()),
            exportable: false,
            exports: Default::default(),
            pending: AtomicBool::new(false),
            settling: Mutex::new(()),
        }))
    }

    fn state(&self) -> MutexGuard<'_, VmmState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mappings and orphan handles kept for a retry (see [`VirtualMemory::settle`]):
    /// `(abandoned mappings, their bytes, orphan handles)`. For tests and reports.
    pub fn kept(&self) -> (usize, usize, usize) {
        let st = self.state();
        let bytes = st
            .abandoned
            .iter()
            .filter_map(|a| st.mapped.get(a))
            .map(|&(_, l)| l)
            .sum();
        let orphans = st.handles.values().filter(|&&n| n == 0).count();
        (st.abandoned.len(), bytes, orphans)
    }

    /// Undoes the mapping of handle `h` at `[at, at+page)` just made by a growth
    /// that failed (`created`: the growth created `h`, which goes with it). What
    /// the driver refuses is kept, not forgotten: a mapping that stays is
    /// abandoned (its range unmapped by the next settle, before anything is mapped
    /// there again), a handle whose release fails is an orphan.
    fn roll_back(&self, at: CUdeviceptr, page: usize, h: u64, created: bool) {
        let drv = self.ctx.driver();
        let (Some(unmap), Some(_)) = (drv.mem_unmap, drv.mem_release) else {
            return;
        };
        // SAFETY: `[at, at+page)` was mapped with `h` by the caller just now and
        // is undone once (a failure keeps it, for `settle` to undo once).
        if let Err(e) = check(drv, "cuMemUnmap", unsafe { unmap(at, page) }) {
            let mut st = self.state();
            st.mapped.insert(at, (h, page));
            *st.handles.entry(h).or_insert(0) += 1;
            st.abandoned.push(at);
            self.pending.store(true, Ordering::Release);
            tracing::warn!(error = %e, addr = at, len = page, "undoing a mapping of a failed growth failed; it is kept and unmapped before the next map or on trim");
            return;
        }
        if created {
            self.release_or_keep(h);
        }
    }

    /// Releases handle `h`, whose mappings are all gone; a failure keeps it as an
    /// orphan for `settle`.
    fn release_or_keep(&self, h: u64) {
        let drv = self.ctx.driver();
        let Some(release) = drv.mem_release else {
            return;
        };
        // SAFETY: `h` is a live handle with no mapping left, released once (a
        // failure keeps it, for `settle` to release once).
        if let Err(e) = check(drv, "cuMemRelease", unsafe { release(h) }) {
            self.state().handles.insert(h, 0);
            self.pending.store(true, Ordering::Release);
            tracing::warn!(error = %e, "releasing a piece's memory failed; it is kept and released on the next trim, map or unmap");
        } else {
            self.exports.forget(h);
        }
    }

    /// Unmaps the mapping at `addr` (known in `mapped`; the device is done with
    /// it), forgets it, and releases its handle with its last mapping (an orphan
    /// if that fails). A failed unmap leaves it mapped and known.
    fn unmap_known(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        let drv = self.ctx.driver();
        let unmap = optional(drv, drv.mem_unmap, "cuMemUnmap")?;
        let Some((h, l)) = self.state().mapped.get(&addr).copied() else {
            return Err(EmmError::InvalidArgument {
                what: "address to unmap",
                found: format!("{addr:#x} ({len} bytes)"),
                expected: "the start of a range this pool mapped".into(),
            });
        };
        let _g = self.ctx.push()?;
        growth_phases::timed(Phase::Unmap, || {
            // SAFETY: `[addr, addr+l)` was mapped by `map` or `alias` with handle
            // `h`; each mapping is undone once; the caller waited for the work
            // queued on it.
            check(drv, "cuMemUnmap", unsafe { unmap(addr, l) })
        })?;
        let last = {
            // Forgotten once gone: a mapping the driver kept is still known.
            let mut st = self.state();
            st.mapped.remove(&addr);
            match st.handles.get_mut(&h) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    st.handles.remove(&h);
                    true
                }
            }
        };
        if last {
            self.release_or_keep(h);
        }
        Ok(())
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
        let (create, map, access, _, _) = fns.map_err(|e| (0, e))?;
        let _g = self.ctx.push().map_err(|e| (0, EmmError::from(e)))?;
        // What an earlier failure left mapped goes first (a failure again is not
        // this call's: should it be in the way, the map below says so).
        let _ = self.settle();
        let prop = self.prop();
        // (address, length, handle, whether this call created the handle)
        let mut done: Vec<(CUdeviceptr, usize, u64, bool)> = Vec::with_capacity(pieces.len());
        let mut failure = None;
        let mut at = dst;
        for &(src, page) in pieces {
            let (h, created) = match src {
                None => {
                    let mut h = 0u64;
                    if let Err(e) = growth_phases::timed(Phase::Create, || {
                        // SAFETY: valid out-pointer and prop; each piece's length is a
                        // multiple of the granularity.
                        check(drv, "cuMemCreate", unsafe {
                            create(&mut h, page, &prop, 0)
                        })
                    }) {
                        failure = Some(EmmError::from(e));
                        break;
                    }
                    (h, true)
                }
                Some(src) => {
                    let st = self.state();
                    match st.mapped.get(&src) {
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
            if let Err(e) = growth_phases::timed(Phase::Map, || {
                // SAFETY: `[at, at+page)` lies in our reservation and is not mapped; `h`
                // is a live handle of `page` bytes.
                check(drv, "cuMemMap", unsafe { map(at, page, 0, h, 0) })
            }) {
                if created {
                    // Created above, never mapped: released (or kept) once.
                    self.release_or_keep(h);
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
            if let Err(e) = growth_phases::timed(Phase::Access, || {
                // SAFETY: `[dst, dst + len)` was just mapped, piece by piece; one valid
                // descriptor.
                check(drv, "cuMemSetAccess", unsafe { access(dst, len, &desc, 1) })
            }) {
                // Each mapping made above is undone once, and each handle created
                // above released once (aliased handles stay mapped at their
                // source); what the driver refuses is kept for `settle`.
                for &(at, page, h, created) in &done {
                    self.roll_back(at, page, h, created);
                }
                return Err((0, e.into()));
            }
            let mut st = self.state();
            for &(at, page, h, _) in &done {
                st.mapped.insert(at, (h, page));
                *st.handles.entry(h).or_insert(0) += 1;
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
        self.state().reservations.push((p, size));
        Ok(p)
    }

    fn map(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        let drv = self.ctx.driver();
        let create = optional(drv, drv.mem_create, "cuMemCreate")?;
        let map = optional(drv, drv.mem_map, "cuMemMap")?;
        let access = optional(drv, drv.mem_set_access, "cuMemSetAccess")?;
        optional(drv, drv.mem_release, "cuMemRelease")?;
        optional(drv, drv.mem_unmap, "cuMemUnmap")?;
        let _g = self.ctx.push()?;
        // What an earlier failure left mapped goes first (see `map_pieces_once`).
        let _ = self.settle();
        let prop = self.prop();
        let mut h = 0u64;
        // SAFETY: valid out-pointer and prop; `len` is a multiple of the granularity.
        check(drv, "cuMemCreate", unsafe { create(&mut h, len, &prop, 0) })?;
        // SAFETY: `[addr, addr+len)` lies in our reservation and is not mapped.
        if let Err(e) = check(drv, "cuMemMap", unsafe { map(addr, len, 0, h, 0) }) {
            // Created above, never mapped: released (or kept) once.
            self.release_or_keep(h);
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
            // The map and the handle made above are undone once each (what the
            // driver refuses is kept for `settle`).
            self.roll_back(addr, len, h, true);
            return Err(e.into());
        }
        let mut st = self.state();
        st.mapped.insert(addr, (h, len));
        st.handles.insert(h, 1);
        Ok(())
    }

    fn alias(&self, src: CUdeviceptr, dst: CUdeviceptr, len: usize) -> Result<()> {
        let drv = self.ctx.driver();
        let map = optional(drv, drv.mem_map, "cuMemMap")?;
        let access = optional(drv, drv.mem_set_access, "cuMemSetAccess")?;
        optional(drv, drv.mem_unmap, "cuMemUnmap")?;
        let h = match self.state().mapped.get(&src) {
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
        // What an earlier failure left mapped goes first (see `map_pieces_once`).
        let _ = self.settle();
        // SAFETY: `[dst, dst+len)` lies in our reservation and is not mapped; `h` is
        // a live handle of exactly `len` bytes (mapped at `src`).
        check(drv, "cuMemMap", unsafe { map(dst, len, 0, h, 0) })?;
        let desc = CUmemAccessDesc {
            location: self.prop().location,
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one valid descriptor.
        if let Err(e) = check(drv, "cuMemSetAccess", unsafe { access(dst, len, &desc, 1) }) {
            // The mapping made above is undone once (or kept for `settle`); the
            // handle stays mapped at `src`.
            self.roll_back(dst, len, h, false);
            return Err(e.into());
        }
        let mut st = self.state();
        st.mapped.insert(dst, (h, len));
        *st.handles.entry(h).or_insert(0) += 1;
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
            // Errors recorded by other drops stay for their callers.
            self.ctx.synchronize_keeping_deferred()?;
        }
        self.unmap_done(addr, len)
    }

    fn unmap_done(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.unmap_known(addr, len)?;
        // What an earlier failure kept goes too (its failure again is not this
        // call's: it stays kept).
        let _ = self.settle();
        Ok(())
    }

    fn settle(&self) -> Result<()> {
        let _one_at_a_time = self.settling.lock().unwrap_or_else(|p| p.into_inner());
        if !self.pending.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let drv = self.ctx.driver();
        let Some(release) = drv.mem_release else {
            return Ok(());
        };
        let mut first: Option<EmmError> = None;
        let abandoned = std::mem::take(&mut self.state().abandoned);
        for addr in abandoned {
            let len = self.state().mapped.get(&addr).map_or(0, |&(_, l)| l);
            if len == 0 {
                continue; // gone meanwhile
            }
            if let Err(e) = self.unmap_known(addr, len) {
                self.state().abandoned.push(addr);
                self.pending.store(true, Ordering::Release);
                first.get_or_insert(e);
            }
        }
        let mut st = self.state();
        let orphans: Vec<u64> = st
            .handles
            .iter()
            .filter(|(_, &n)| n == 0)
            .map(|(&h, _)| h)
            .collect();
        for h in orphans {
            // SAFETY: `h` has no mapping left and was not released (its release
            // failed); it is released once, here or on a later retry.
            match check(drv, "cuMemRelease", unsafe { release(h) }) {
                Ok(()) => {
                    st.handles.remove(&h);
                    self.exports.forget(h);
                }
                Err(e) => {
                    self.pending.store(true, Ordering::Release);
                    first.get_or_insert(e.into());
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn abandon_all(&self) {
        let mut st = self.state();
        let known: Vec<CUdeviceptr> = st.mapped.keys().copied().collect();
        for addr in known {
            if !st.abandoned.contains(&addr) {
                st.abandoned.push(addr);
            }
        }
        if !st.abandoned.is_empty() {
            self.pending.store(true, Ordering::Release);
        }
    }
}

impl Drop for DriverVmm {
    /// Unmaps what is still mapped, releases every handle and frees the
    /// reservations. After a lost context the driver refuses all of it: the first
    /// failure is recorded on the context (reported once, by its next call), the
    /// others are logged, and what was refused is handed to the context
    /// ([`Context::free_later`]), which releases it again later, mappings
    /// before handles before reservations (a reservation with a mapping the
    /// driver kept is not freed here: the driver would refuse that too).
    fn drop(&mut self) {
        let drv = self.ctx.driver();
        let VmmState {
            reservations,
            mapped,
            handles,
            abandoned: _,
        } = std::mem::take(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
        let (Some(unmap), Some(release), Some(free)) =
            (drv.mem_unmap, drv.mem_release, drv.mem_address_free)
        else {
            return;
        };
        // Leaves the errors recorded by other drops for their callers.
        let _ = self.ctx.synchronize_keeping_deferred();
        let mut first = None;
        let mut failed = 0usize;
        let mut stuck = Vec::new();
        // A driver shutting down (the process exiting) frees it all itself:
        // its refusals are not logged one by one.
        let mut note = |e: emm_driver::DriverError| {
            failed += 1;
            if first.is_none() {
                first = Some(e);
            } else if !e.is_shutting_down() {
                tracing::error!(error = %e, "releasing the pool's virtual memory failed");
            }
        };
        // What the driver refuses is handed to the context, which releases it
        // again later (its next synchronize or a manager's trim, or emm's last
        // retain of it) instead of leaking it with this pool.
        // SAFETY (of each `free_later` below): the mapping, handle or
        // reservation is live in this context (its release was just refused),
        // handed over once, and this pool, its only user, is going.
        let ctx = &self.ctx;
        for (addr, (_, len)) in mapped {
            // SAFETY: each mapping is undone once.
            if let Err(e) = check(drv, "cuMemUnmap", unsafe { unmap(addr, len) }) {
                if e.is_shutting_down() {
                    // The driver has torn down with everything it held (the
                    // process is exiting): nothing is left to undo or report.
                    self.ctx.record_drop_error(e);
                    return;
                }
                stuck.push(addr);
                // SAFETY: see above.
                unsafe { ctx.free_later(Orphan::Mapping { addr, len }) };
                note(e);
            }
        }
        for h in handles.into_keys() {
            // SAFETY: each handle is released once, after its mappings were undone
            // (the memory of one the driver kept mapped goes with that mapping).
            if let Err(e) = check(drv, "cuMemRelease", unsafe { release(h) }) {
                // SAFETY: see above.
                unsafe { ctx.free_later(Orphan::Handle(h)) };
                note(e);
            }
        }
        for (addr, size) in reservations {
            if stuck
                .iter()
                .any(|&m| (addr..addr + size as u64).contains(&m))
            {
                // Freed by the context after the mapping inside it is undone.
                // SAFETY: see above.
                unsafe { ctx.free_later(Orphan::Reservation { addr, size }) };
                continue;
            }
            // SAFETY: each reservation is freed once, after its mappings.
            if let Err(e) = check(drv, "cuMemAddressFree", unsafe { free(addr, size) }) {
                // SAFETY: see above.
                unsafe { ctx.free_later(Orphan::Reservation { addr, size }) };
                note(e);
            }
        }
        if let Some(e) = first {
            if failed > 1 && !e.is_shutting_down() {
                tracing::error!(
                    failed,
                    "{failed} driver calls failed releasing the pool's virtual memory; the first is reported"
                );
            }
            self.ctx.record_drop_error(e);
        }
    }
}

/// The granularity the host stand-in's virtual memory stands for: a GPU's
/// recommended one (2 MiB on current GPUs). A pool maps pieces of its
/// `large_round`, and gets the stand-in's virtual memory only where that is a
/// multiple of this (`pool::upstream::host_parts`), as over the driver.
pub(crate) const HOST_GRANULARITY: usize = 2 << 20;

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
    fn abandon_all(&self) {
        // Host memory never refuses to go: whatever is still mapped (the old
        // mappings of moved pieces a reset forgot) is given back now.
        let (mapped, _) =
            std::mem::take(&mut *self.pieces.lock().unwrap_or_else(|e| e.into_inner()));
        let mut backing: HashMap<CUdeviceptr, usize> = HashMap::new();
        for (b, l) in mapped.into_values() {
            backing.insert(b, l);
        }
        for (b, l) in backing {
            // SAFETY: each backing block came from `alloc(l)` of this upstream; all
            // its mappings are forgotten just above, so it is freed once, here.
            if let Err(e) = unsafe { self.upstream.free(b, l) } {
                tracing::error!(error = %e, "freeing a piece forgotten by a reset failed");
            }
        }
    }
}

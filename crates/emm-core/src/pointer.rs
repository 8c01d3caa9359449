//! Owned memory handed out by managers: [`DeviceAllocation`] (with borrowed
//! [`DeviceView`]s), [`PinnedMemory`] and [`MappedMemory`].
//!
//! Each owns its memory and gives it back to its manager when dropped, exactly once,
//! on the stream it was allocated on. A plugin builds them from its own pointers
//! with a release callback ([`DeviceAllocation::from_raw_parts`]), as NBEP 7's
//! `MemoryPointer(..., finalizer)` allows, or with a shared releaser
//! ([`DeviceAllocation::with_releaser`]) that costs no allocation per block.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use emm_sys::{CUdeviceptr, CUstream, CU_STREAM_LEGACY};

use crate::error::{EmmError, Result};

/// Gives device memory back to whoever made it. Implemented by managers.
///
/// `release` is called once per allocation, from the thread that drops it. It must
/// not panic (a panic is caught and logged, and the memory is then lost).
pub trait DeviceRelease: Send + Sync {
    /// Takes back a block. A failure has no caller to go to: the manager keeps it
    /// (recorded on its context, logged) and keeps what it could not free for a
    /// later retry where it can.
    fn release(&self, block: Released);

    /// Takes back a block and says whether that worked (what
    /// [`DeviceAllocation::free`] calls). On `Err` nothing was freed and the
    /// manager still counts the block as handed out: the caller still owns it and
    /// may free it again once the fault clears. The default calls
    /// [`DeviceRelease::release`] and succeeds.
    fn try_release(&self, block: Released) -> Result<()> {
        self.release(block);
        Ok(())
    }
}

/// What a dropped [`DeviceAllocation`] gives back to its manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The block's address.
    pub ptr: CUdeviceptr,
    /// Its size as requested.
    pub size: usize,
    /// The stream it was last ordered on.
    pub stream: CUstream,
    /// The upstream allocation containing it.
    pub base: CUdeviceptr,
    /// That allocation's size.
    pub base_size: usize,
    /// The value the manager stored when it made the allocation.
    pub token: usize,
}

type Callback = Box<dyn FnOnce(CUdeviceptr, usize, CUstream) + Send>;

enum Releaser {
    Shared(Arc<dyn DeviceRelease>, usize),
    Borrowed(*const dyn DeviceRelease, usize),
    Callback(Callback),
    Nothing,
}

/// Device memory owned by the caller, given back to its manager on drop.
///
/// Remembers the stream it was allocated on (the stream-ordered path; the legacy
/// default stream for NBEP 7's synchronous `memalloc`) and, for IPC, the base and
/// size of the upstream allocation that contains it.
pub struct DeviceAllocation {
    ptr: CUdeviceptr,
    size: usize,
    stream: CUstream,
    base: CUdeviceptr,
    base_size: usize,
    releaser: Releaser,
}

// SAFETY: the allocation is an owned address range; releasers are Send + Sync (shared)
// or Send (callback, run once from the dropping thread).
unsafe impl Send for DeviceAllocation {}
// SAFETY: `&DeviceAllocation` exposes only plain values; the releaser runs only in Drop.
unsafe impl Sync for DeviceAllocation {}

impl core::fmt::Debug for DeviceAllocation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceAllocation")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("stream", &self.stream)
            .field("base", &format_args!("{:#x}", self.base))
            .finish()
    }
}

impl DeviceAllocation {
    /// An allocation whose release goes to a shared releaser (a manager), with a
    /// `token` the manager uses to find its bookkeeping. `base`/`base_size` name the
    /// upstream allocation that contains `[ptr, ptr+size)`.
    ///
    /// # Safety
    /// `[ptr, ptr+size)` must be device memory (or, for a host stand-in, host memory)
    /// owned by `owner` until `owner.release` is called for it, and lie within
    /// `[base, base+base_size)`.
    pub unsafe fn with_releaser(
        ptr: CUdeviceptr,
        size: usize,
        stream: CUstream,
        base: CUdeviceptr,
        base_size: usize,
        owner: Arc<dyn DeviceRelease>,
        token: usize,
    ) -> DeviceAllocation {
        Self::with_parts(
            ptr,
            size,
            stream,
            (base, base_size),
            Releaser::Shared(owner, token),
        )
    }

    /// As [`DeviceAllocation::with_releaser`], but borrowing the releaser instead of
    /// counting a reference to it: no shared atomic is touched per allocation, which
    /// keeps many threads from contending on one cache line.
    ///
    /// # Safety
    /// As for [`DeviceAllocation::with_releaser`], and `owner` must stay alive (not
    /// move or drop) until this allocation is dropped or turned into raw parts.
    pub unsafe fn with_borrowed_releaser(
        ptr: CUdeviceptr,
        size: usize,
        stream: CUstream,
        base: CUdeviceptr,
        base_size: usize,
        owner: *const dyn DeviceRelease,
        token: usize,
    ) -> DeviceAllocation {
        Self::with_parts(
            ptr,
            size,
            stream,
            (base, base_size),
            Releaser::Borrowed(owner, token),
        )
    }

    fn with_parts(
        ptr: CUdeviceptr,
        size: usize,
        stream: CUstream,
        (base, base_size): (CUdeviceptr, usize),
        releaser: Releaser,
    ) -> DeviceAllocation {
        DeviceAllocation {
            ptr,
            size,
            stream,
            base,
            base_size,
            releaser,
        }
    }

    /// An allocation released by `finalizer(ptr, size, stream)`, as NBEP 7's
    /// `MemoryPointer` with a finalizer.
    ///
    /// # Safety
    /// `[ptr, ptr+size)` must be memory that stays valid until `finalizer` runs.
    pub unsafe fn from_raw_parts(
        ptr: CUdeviceptr,
        size: usize,
        stream: CUstream,
        finalizer: impl FnOnce(CUdeviceptr, usize, CUstream) + Send + 'static,
    ) -> DeviceAllocation {
        Self::with_parts(
            ptr,
            size,
            stream,
            (ptr, size),
            Releaser::Callback(Box::new(finalizer)),
        )
    }

    /// Records that this allocation lies inside the upstream allocation
    /// `[base, base+base_size)` (for IPC export of sub-allocations).
    pub fn set_base(&mut self, base: CUdeviceptr, base_size: usize) {
        self.base = base;
        self.base_size = base_size;
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The stream the memory is ordered on (and will be released on).
    pub fn stream(&self) -> CUstream {
        self.stream
    }

    /// Moves the allocation to `stream`: it will be released there. The caller
    /// orders `stream` after all work on the old stream that uses the memory.
    pub fn set_stream(&mut self, stream: CUstream) {
        self.stream = stream;
    }

    /// `(base, size)` of the upstream allocation containing this one.
    pub fn base(&self) -> (CUdeviceptr, usize) {
        (self.base, self.base_size)
    }

    /// A view of the whole allocation.
    pub fn as_view(&self) -> DeviceView<'_> {
        DeviceView {
            ptr: self.ptr,
            len: self.size,
            parent: self,
        }
    }

    /// A view of `[offset, offset+len)`; borrows the allocation, so it cannot
    /// outlive it.
    pub fn view(&self, offset: usize, len: usize) -> Result<DeviceView<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(DeviceView {
                ptr: self.ptr + offset as u64,
                len,
                parent: self,
            }),
            _ => Err(EmmError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Gives the allocation back to its manager now, on its stream, as dropping it
    /// would, but reports a failed free instead of recording it: on `Err` nothing
    /// was freed and the allocation comes back ([`NotFreed`]) with the error,
    /// still owned by the caller, to be freed again (or dropped) once the fault
    /// clears. Managers that cannot tell (a finalizer from
    /// [`DeviceAllocation::from_raw_parts`]) release as on drop and succeed.
    ///
    /// In a child forked after CUDA was initialised the allocation comes back
    /// with [`EmmError::Forked`]: the manager it names is the parent's.
    pub fn free(mut self) -> core::result::Result<(), Box<NotFreed>> {
        if let Err(error) = crate::error::check_not_forked() {
            return Err(Box::new(NotFreed {
                allocation: self,
                error,
            }));
        }
        if matches!(self.releaser, Releaser::Callback(_) | Releaser::Nothing) {
            drop(self); // the finalizer runs as on drop; it cannot report
            return Ok(());
        }
        let releaser = core::mem::replace(&mut self.releaser, Releaser::Nothing);
        let (ptr, size) = (self.ptr, self.size);
        let block = |token| Released {
            ptr,
            size,
            stream: self.stream,
            base: self.base,
            base_size: self.base_size,
            token,
        };
        let outcome = match &releaser {
            Releaser::Shared(owner, token) => {
                catch_unwind(AssertUnwindSafe(|| owner.try_release(block(*token))))
            }
            Releaser::Borrowed(owner, token) => catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: the constructor's contract keeps `owner` alive until the
                // allocation is dropped or turned into raw parts; `self` is neither
                // yet.
                unsafe { (**owner).try_release(block(*token)) }
            })),
            Releaser::Callback(_) | Releaser::Nothing => Ok(Ok(())),
        };
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                self.releaser = releaser;
                Err(Box::new(NotFreed {
                    allocation: self,
                    error,
                }))
            }
            Err(_) => {
                tracing::error!(
                    ptr = format_args!("{ptr:#x}"),
                    size,
                    "a release callback panicked; the block is lost"
                );
                Err(Box::new(NotFreed {
                    allocation: self,
                    error: EmmError::Internal {
                        operation: "DeviceAllocation::free",
                        detail: format!(
                            "the manager's release of {ptr:#x} ({size} bytes) panicked; the block is lost"
                        ),
                    },
                }))
            }
        }
    }

    /// Gives up ownership without releasing: returns `(ptr, size, stream)`.
    /// The caller becomes responsible for the memory.
    pub fn into_raw(mut self) -> (CUdeviceptr, usize, CUstream) {
        self.releaser = Releaser::Nothing;
        (self.ptr, self.size, self.stream)
    }
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        let releaser = core::mem::replace(&mut self.releaser, Releaser::Nothing);
        if emm_sys::forked() {
            // The manager is the parent's, copied by fork (its locks perhaps held
            // by a parent thread that does not exist here): leave it alone.
            core::mem::forget(releaser);
            return;
        }
        let (ptr, size, stream) = (self.ptr, self.size, self.stream);
        let (base, base_size) = (self.base, self.base_size);
        let block = move |token| Released {
            ptr,
            size,
            stream,
            base,
            base_size,
            token,
        };
        let outcome = catch_unwind(AssertUnwindSafe(move || match releaser {
            Releaser::Shared(owner, token) => owner.release(block(token)),
            // SAFETY: the constructor's contract keeps `owner` alive until now.
            Releaser::Borrowed(owner, token) => unsafe { (*owner).release(block(token)) },
            Releaser::Callback(f) => f(ptr, size, stream),
            Releaser::Nothing => {}
        }));
        if outcome.is_err() {
            tracing::error!(
                ptr = format_args!("{ptr:#x}"),
                size,
                "a release callback panicked; the block is lost"
            );
        }
    }
}

/// A free that did not happen ([`DeviceAllocation::free`]): the allocation, still
/// owned by the caller and still counted by its manager, and why.
#[derive(Debug)]
pub struct NotFreed {
    /// The allocation, to free again (or drop) once the fault clears.
    pub allocation: DeviceAllocation,
    /// Why the manager could not free it.
    pub error: EmmError,
}

/// A borrowed window `[ptr, ptr+len)` of a [`DeviceAllocation`].
#[derive(Clone, Copy, Debug)]
pub struct DeviceView<'a> {
    ptr: CUdeviceptr,
    len: usize,
    parent: &'a DeviceAllocation,
}

impl<'a> DeviceView<'a> {
    /// The device address of the view's first byte.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The view's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for an empty view.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocation this view borrows.
    pub fn parent(&self) -> &'a DeviceAllocation {
        self.parent
    }

    /// Offset of the view from the start of the upstream allocation (for IPC).
    pub fn offset_in_base(&self) -> usize {
        (self.ptr - self.parent.base) as usize
    }

    /// A narrower view, relative to this one.
    pub fn view(&self, offset: usize, len: usize) -> Result<DeviceView<'a>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceView {
                ptr: self.ptr + offset as u64,
                len,
                parent: self.parent,
            }),
            _ => Err(EmmError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }
}

/// The flags of NBEP 7's `memhostalloc(size, mapped, portable, wc)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostAllocFlags {
    /// Also map into the device's address space (gives [`MappedMemory`]).
    pub mapped: bool,
    /// Pinned for every context.
    pub portable: bool,
    /// Write-combined.
    pub write_combined: bool,
}

impl HostAllocFlags {
    /// The `CU_MEMHOSTALLOC_*` bits.
    pub fn driver_flags(self) -> u32 {
        use emm_sys::host_alloc::*;
        (if self.mapped { DEVICEMAP } else { 0 })
            | (if self.portable { PORTABLE } else { 0 })
            | (if self.write_combined {
                WRITECOMBINED
            } else {
                0
            })
    }
}

type HostCallback = Box<dyn FnOnce(*mut u8, usize) + Send>;

/// Page-locked host memory, released by its manager on drop.
pub struct PinnedMemory {
    host: *mut u8,
    size: usize,
    release: Option<HostCallback>,
}

// SAFETY: owned host memory; the callback is Send.
unsafe impl Send for PinnedMemory {}
// SAFETY: `&PinnedMemory` exposes only the address and size.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// Pinned memory released by `release(host, size)`.
    ///
    /// # Safety
    /// `[host, host+size)` must be page-locked memory valid until `release` runs.
    pub unsafe fn from_raw_parts(
        host: *mut u8,
        size: usize,
        release: impl FnOnce(*mut u8, usize) + Send + 'static,
    ) -> Self {
        PinnedMemory {
            host,
            size,
            release: Some(Box::new(release)),
        }
    }

    /// The host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl core::fmt::Debug for PinnedMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PinnedMemory")
            .field("host", &self.host)
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            if emm_sys::forked() {
                core::mem::forget(f); // the parent's, as for `DeviceAllocation`
                return;
            }
            let (h, s) = (self.host, self.size);
            if catch_unwind(AssertUnwindSafe(move || f(h, s))).is_err() {
                tracing::error!(size = s, "a pinned-memory release callback panicked");
            }
        }
    }
}

/// Pinned host memory also mapped into the device's address space.
#[derive(Debug)]
pub struct MappedMemory {
    pinned: PinnedMemory,
    device: CUdeviceptr,
}

impl MappedMemory {
    /// Mapped memory: `pinned`'s bytes are visible to the device at `device`.
    pub fn new(pinned: PinnedMemory, device: CUdeviceptr) -> Self {
        MappedMemory { pinned, device }
    }

    /// The host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.pinned.host
    }

    /// The device address of the same bytes.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.device
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.pinned.size
    }
}

/// What `memhostalloc` and `mempin` return: mapped when asked for, else pinned.
#[derive(Debug)]
#[non_exhaustive]
pub enum HostMemory {
    /// Page-locked, not mapped.
    Pinned(PinnedMemory),
    /// Page-locked and mapped.
    Mapped(MappedMemory),
}

impl HostMemory {
    /// The host address.
    pub fn host_ptr(&self) -> *mut u8 {
        match self {
            HostMemory::Pinned(p) => p.host_ptr(),
            HostMemory::Mapped(m) => m.host_ptr(),
        }
    }

    /// The device address, for mapped memory.
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        match self {
            HostMemory::Pinned(_) => None,
            HostMemory::Mapped(m) => Some(m.device_ptr()),
        }
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        match self {
            HostMemory::Pinned(p) => p.size(),
            HostMemory::Mapped(m) => m.size(),
        }
    }
}

/// The stream NBEP 7's synchronous calls use: the legacy default stream.
pub const SYNC_STREAM: CUstream = CU_STREAM_LEGACY;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counter(AtomicUsize);
    impl DeviceRelease for Counter {
        fn release(&self, b: Released) {
            assert_eq!(b.token, 7);
            assert_eq!((b.base, b.base_size), (0x800, 4096));
            self.0.fetch_add(b.size, Ordering::SeqCst);
        }
    }

    #[test]
    fn drop_releases_once_and_views_are_checked() {
        let c = Arc::new(Counter(AtomicUsize::new(0)));
        // SAFETY: a fake address, never dereferenced.
        let a = unsafe {
            DeviceAllocation::with_releaser(0x1000, 256, SYNC_STREAM, 0x800, 4096, c.clone(), 7)
        };
        let v = a.view(16, 32).unwrap();
        assert_eq!(v.ptr(), 0x1010);
        assert_eq!(v.offset_in_base(), 0x810);
        assert_eq!(v.view(8, 8).unwrap().ptr(), 0x1018);
        assert!(matches!(v.view(30, 8), Err(EmmError::OutOfRange { .. })));
        assert!(matches!(
            a.view(250, 7),
            Err(EmmError::OutOfRange {
                offset: 250,
                len: 7,
                size: 256
            })
        ));
        assert!(a.view(usize::MAX, 2).is_err());
        drop(a);
        assert_eq!(c.0.load(Ordering::SeqCst), 256);
    }

    /// Refuses frees while `refuse` is set; counts the bytes it took back.
    struct Refusing {
        refuse: std::sync::atomic::AtomicBool,
        freed: AtomicUsize,
        dropped: AtomicUsize,
    }
    impl DeviceRelease for Refusing {
        fn release(&self, b: Released) {
            self.dropped.fetch_add(b.size, Ordering::SeqCst);
        }
        fn try_release(&self, b: Released) -> Result<()> {
            assert_eq!(b.token, 3);
            if self.refuse.load(Ordering::SeqCst) {
                return Err(EmmError::Internal {
                    operation: "test",
                    detail: "refused".into(),
                });
            }
            self.freed.fetch_add(b.size, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn free_reports_a_refused_release_and_hands_the_allocation_back() {
        let r = Arc::new(Refusing {
            refuse: std::sync::atomic::AtomicBool::new(true),
            freed: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
        });
        // SAFETY: a fake address, never dereferenced.
        let a = unsafe {
            DeviceAllocation::with_releaser(0x1000, 256, SYNC_STREAM, 0x1000, 256, r.clone(), 3)
        };
        let NotFreed {
            allocation: back,
            error: e,
        } = *a.free().unwrap_err();
        assert!(matches!(e, EmmError::Internal { .. }), "{e}");
        assert_eq!((back.ptr(), back.size()), (0x1000, 256));
        assert_eq!(r.freed.load(Ordering::SeqCst), 0);
        r.refuse.store(false, Ordering::SeqCst);
        back.free().unwrap();
        assert_eq!(r.freed.load(Ordering::SeqCst), 256);
        assert_eq!(
            r.dropped.load(Ordering::SeqCst),
            0,
            "released once, by free"
        );
        // A finalizer cannot refuse: free runs it and succeeds.
        let ran = Arc::new(AtomicUsize::new(0));
        let seen = ran.clone();
        // SAFETY: as above.
        let f = unsafe {
            DeviceAllocation::from_raw_parts(0x10, 8, SYNC_STREAM, move |_, s, _| {
                seen.fetch_add(s, Ordering::SeqCst);
            })
        };
        f.free().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 8);
    }

    #[test]
    fn a_panicking_finalizer_does_not_escape_drop() {
        // SAFETY: a fake address, never dereferenced.
        let a = unsafe {
            DeviceAllocation::from_raw_parts(0x10, 8, SYNC_STREAM, |_, _, _| panic!("boom"))
        };
        drop(a); // must not unwind
                 // SAFETY: as above.
        let raw = unsafe {
            DeviceAllocation::from_raw_parts(0x10, 8, SYNC_STREAM, |_, _, _| panic!("never"))
        };
        assert_eq!(raw.into_raw().0, 0x10);
    }

    #[test]
    fn host_flags_map_to_driver_bits() {
        let f = HostAllocFlags {
            mapped: true,
            portable: true,
            write_combined: true,
        };
        assert_eq!(f.driver_flags(), 0x7);
        assert_eq!(HostAllocFlags::default().driver_flags(), 0);
    }
}

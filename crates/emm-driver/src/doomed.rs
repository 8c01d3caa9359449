//! What the driver refused to destroy or free when its owner went, kept
//! process-wide by raw context and retried, instead of leaked: streams and
//! events whose destruction failed in their drop, and memory a manager handed
//! over as it was dropped ([`Orphan`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use emm_sys::{CUcontext, CUdeviceptr, CUevent, CUmemoryPool, CUstream, Driver};

use crate::error::{check, Result};

/// Memory whose release the driver refused where nobody is left to try again
/// (a memory manager being dropped): handed to its context with
/// [`crate::Context::free_later`], and released by the context's next retry.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orphan {
    /// Device or managed memory from `cuMemAlloc`/`cuMemAllocManaged`
    /// (released with `cuMemFree`).
    Device {
        /// The allocation's address.
        ptr: CUdeviceptr,
        /// Its size.
        size: usize,
    },
    /// Memory from the stream-ordered allocator (`cuMemAllocAsync` or a pool):
    /// released with `cuMemFreeAsync` on the legacy default stream.
    StreamOrdered {
        /// The allocation's address.
        ptr: CUdeviceptr,
        /// Its size.
        size: usize,
    },
    /// Page-locked host memory from `cuMemHostAlloc` (`cuMemFreeHost`).
    Host {
        /// The allocation's address.
        addr: usize,
        /// Its size.
        size: usize,
    },
    /// A caller's host range registered with `cuMemHostRegister` (`mempin`)
    /// whose unregistration the driver refused (`cuMemHostUnregister`); the
    /// range is the caller's memory, pinned until then. A range the driver no
    /// longer holds registered (`CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`) is done.
    Registration {
        /// The range's start.
        addr: usize,
        /// Its length.
        len: usize,
    },
    /// A mapping of `len` bytes at `addr` (`cuMemUnmap`).
    Mapping {
        /// The mapping's address.
        addr: CUdeviceptr,
        /// Its length.
        len: usize,
    },
    /// A physical allocation handle (`cuMemRelease`); its memory is counted
    /// with its mappings.
    Handle(u64),
    /// A memory pool of the stream-ordered allocator (`cuMemPoolDestroy`),
    /// destroyed after the memory handed over with it is freed.
    MemPool(CUmemoryPool),
    /// An address reservation (`cuMemAddressFree`): freed only once no kept
    /// [`Orphan::Mapping`] lies inside it.
    Reservation {
        /// The reservation's base.
        addr: CUdeviceptr,
        /// Its size.
        size: usize,
    },
}

impl Orphan {
    /// Bytes of memory it holds (0 for a handle, a reservation and a pool: a
    /// handle's memory is its mappings', a reservation holds address space
    /// only, a pool's memory is its blocks').
    pub fn bytes(&self) -> usize {
        match *self {
            Orphan::Device { size, .. }
            | Orphan::StreamOrdered { size, .. }
            | Orphan::Host { size, .. } => size,
            Orphan::Mapping { len, .. } | Orphan::Registration { len, .. } => len,
            Orphan::Reservation { .. } | Orphan::Handle(_) | Orphan::MemPool(_) => 0,
        }
    }

    /// The order of release: memory first, then mappings are undone before
    /// handles are released, both before reservations are freed; pools last.
    fn phase(&self) -> u8 {
        match self {
            Orphan::Mapping { .. } => 1,
            Orphan::Handle(_) => 2,
            Orphan::Reservation { .. } => 3,
            Orphan::MemPool(_) => 4,
            _ => 0,
        }
    }
}

/// Something whose destruction or release failed, kept for a retry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Doomed {
    /// A stream the caller created.
    Stream(CUstream),
    /// An event.
    Event(CUevent),
    /// Memory an owner handed over.
    Orphan(Orphan),
}

impl Doomed {
    fn phase(&self) -> u8 {
        match self {
            Doomed::Orphan(o) => o.phase(),
            _ => 0,
        }
    }
}

/// A [`Doomed`] handle on the list, and whether a refusal of its retry was
/// returned to a caller already.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kept {
    /// The handle.
    pub(crate) what: Doomed,
    /// A refusal of a retry of it was returned already:
    /// [`crate::Context::synchronize`] returns one per handle, not one at every
    /// call while the driver keeps refusing.
    pub(crate) reported: bool,
}

impl Kept {
    /// `what`, no refusal of it returned yet.
    pub(crate) fn new(what: Doomed) -> Kept {
        Kept {
            what,
            reported: false,
        }
    }
}

/// Every context's doomed handles, by raw handle and the context id its
/// retain read (`cuCtxGetId`; 0 where the driver has none, [`UNKNOWN_ID`]
/// where the call failed): a stream, event or piece of memory is retried by
/// the next [`crate::Context::synchronize`] or manager's trim (streams and
/// events also by the next stream or event creation) of any
/// [`crate::Context`] of that raw context (two retains of a primary context
/// share it: a library's handle and its caller's), and last at the release of
/// emm's last retain of it. Process-wide for that reason. A reset context
/// keeps its handle but gets a new id: what was kept for the old one went
/// with it, and is dropped, never freed in the new one (whose memory may sit
/// at the same addresses).
static DOOMED: Mutex<Vec<(Key, Kept)>> = Mutex::new(Vec::new());
/// `DOOMED` holds something: one atomic load on the paths that retry.
static HAS_DOOMED: AtomicBool = AtomicBool::new(false);
/// emm's retains of each raw context (`crate::Context::primary`), so that only
/// the release of the last one takes the last chance at its doomed handles.
static RETAINS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A raw context and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    /// The raw handle.
    pub(crate) raw: usize,
    /// `cuCtxGetId`'s answer, 0 where the driver has none, [`UNKNOWN_ID`]
    /// where it failed.
    pub(crate) id: u64,
}

impl Key {
    pub(crate) fn new(ctx: CUcontext, id: u64) -> Key {
        Key {
            raw: ctx.0 as usize,
            id,
        }
    }
}

/// Which doomed handles a retry takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    /// Streams and events only: safe where work may be being captured into a
    /// graph (their creation), where freeing memory (`cuMemFree` synchronizes
    /// the device) is not.
    Handles,
    /// Everything.
    All,
}

/// Whether a retry may undo the mappings handed to the context: their owner
/// may have handed them over because its own wait was refused, with the
/// device's work on them still queued, so a mapping is undone only after a
/// wait of the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MappingWait {
    /// The caller waited for the context just before.
    Waited,
    /// Wait here first, once, if a mapping is among those taken.
    Wait,
    /// No wait here (a trim's quiet retry, where a device-wide wait would
    /// cost every trim and break another thread's capture): mappings come
    /// back not attempted, for a retry that waits.
    Skip,
}

/// Which refusals of a retry are returned to its caller (the others are
/// logged at debug level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// The first of those of handles not reported before ([`Kept::reported`]).
    Once,
    /// The first of all.
    Every,
    /// None: the caller has no use for them (a trim, a stream's creation),
    /// and the handles stay unreported for a caller that does.
    Never,
}

impl Doomed {
    fn taken_by(&self, which: Which) -> bool {
        which == Which::All || !matches!(self, Doomed::Orphan(_))
    }
}

/// The id of a context whose `cuCtxGetId` failed when emm retained it: it
/// matches no context, so what is kept under it is never released (only
/// dropped at emm's last retain of the raw context).
pub(crate) const UNKNOWN_ID: u64 = u64::MAX;

/// Whether anything waits for a retry (one atomic load).
pub(crate) fn any() -> bool {
    HAS_DOOMED.load(Ordering::Acquire)
}

/// Takes the doomed handles of `key` (`key.id`: the context's id now) that
/// `which` names out of [`DOOMED`]; those of the same raw context under
/// another id (it was reset since, or its id was unknown) are dropped, logged.
pub(crate) fn take(key: Key, which: Which) -> Vec<Kept> {
    if !any() {
        return Vec::new();
    }
    let mut list = DOOMED.lock().unwrap_or_else(|p| p.into_inner());
    let mut mine = Vec::new();
    let mut stale = 0usize;
    list.retain(|&(k, d)| {
        if k.raw != key.raw {
            return true;
        }
        if k.id != key.id || k.id == UNKNOWN_ID {
            stale += 1;
            return false;
        }
        if d.what.taken_by(which) {
            mine.push(d);
            return false;
        }
        true
    });
    HAS_DOOMED.store(!list.is_empty(), Ordering::Release);
    drop(list);
    if stale > 0 {
        tracing::warn!(
            stale,
            "handles kept for a retry are dropped unreleased: their context was reset since (or its id was unknown), and their addresses may be another owner's now"
        );
    }
    mine
}

/// Drops every handle kept for raw context `raw`, unreleased; how many.
pub(crate) fn forget(raw: CUcontext) -> usize {
    let raw = raw.0 as usize;
    let mut list = DOOMED.lock().unwrap_or_else(|p| p.into_inner());
    let before = list.len();
    list.retain(|(k, _)| k.raw != raw);
    HAS_DOOMED.store(!list.is_empty(), Ordering::Release);
    before - list.len()
}

/// Puts `handle` of `key` on [`DOOMED`].
pub(crate) fn put(key: Key, handle: Kept) {
    let mut list = DOOMED.lock().unwrap_or_else(|p| p.into_inner());
    list.push((key, handle));
    HAS_DOOMED.store(true, Ordering::Release);
}

/// How many handles of raw context `raw` wait, and the bytes of their memory
/// ([`Orphan::bytes`]).
pub(crate) fn count(raw: CUcontext) -> (usize, usize) {
    let raw = raw.0 as usize;
    DOOMED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(k, _)| k.raw == raw)
        .fold((0, 0), |(n, b), (_, d)| {
            let bytes = match d.what {
                Doomed::Orphan(o) => o.bytes(),
                _ => 0,
            };
            (n + 1, b + bytes)
        })
}

/// One more of emm's retains of raw context `raw`.
pub(crate) fn retained(raw: CUcontext) {
    let raw = raw.0 as usize;
    let mut list = RETAINS.lock().unwrap_or_else(|p| p.into_inner());
    match list.iter_mut().find(|(r, _)| *r == raw) {
        Some((_, n)) => *n += 1,
        None => list.push((raw, 1)),
    }
}

/// One of emm's retains of raw context `raw` goes; whether it was the last.
pub(crate) fn released(raw: CUcontext) -> bool {
    let raw = raw.0 as usize;
    let mut list = RETAINS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(i) = list.iter().position(|(r, _)| *r == raw) else {
        return true;
    };
    list[i].1 = list[i].1.saturating_sub(1);
    if list[i].1 == 0 {
        list.swap_remove(i);
        true
    } else {
        false
    }
}

/// Destroys or releases each of `handles` (of a context the caller keeps
/// retained and current) once, mappings before handles before reservations; the
/// outcome of each. A reservation with a mapping still kept inside it is not
/// freed (the driver would refuse it): it comes back as not attempted (`None`).
/// Mappings are undone only after a wait of the context (`wait`); one not
/// undone for that comes back with the wait's refusal, or not attempted. A
/// pool is not destroyed in a call where a stream-ordered free was refused
/// (the pointer may be the pool's own, handed over with it): it comes back
/// not attempted.
pub(crate) fn destroy(
    drv: &'static Driver,
    mut handles: Vec<Kept>,
    wait: MappingWait,
) -> Vec<(Kept, Option<Result<()>>)> {
    handles.sort_by_key(|k| k.what.phase());
    let any_mapping = handles
        .iter()
        .any(|k| matches!(k.what, Doomed::Orphan(Orphan::Mapping { .. })));
    // `Some(Ok)`: mappings may be undone; `Some(Err)`: the wait's refusal;
    // `None`: not attempted.
    let mappings: Option<Result<()>> = match wait {
        MappingWait::Waited => Some(Ok(())),
        MappingWait::Wait if any_mapping => {
            // SAFETY: the caller keeps the context current.
            Some(check(drv, "cuCtxSynchronize", unsafe {
                (drv.ctx_synchronize)()
            }))
        }
        MappingWait::Wait => Some(Ok(())),
        MappingWait::Skip => None,
    };
    let mut free_refused = false;
    let mut stuck_mappings: Vec<(CUdeviceptr, usize)> = Vec::new();
    let mut out = Vec::with_capacity(handles.len());
    for k in handles {
        let d = k.what;
        if let Doomed::Orphan(Orphan::Reservation { addr, size }) = d {
            let end = addr.saturating_add(size as u64);
            if stuck_mappings
                .iter()
                .any(|&(m, _)| (addr..end).contains(&m))
            {
                out.push((k, None));
                continue;
            }
        }
        let r = match (d, &mappings) {
            (Doomed::Orphan(Orphan::Mapping { .. }), Some(Err(e))) => Some(Err(e.clone())),
            (Doomed::Orphan(Orphan::Mapping { .. }), None) => None,
            (Doomed::Orphan(Orphan::MemPool(_)), _) if free_refused => None,
            _ => Some(destroy_one(drv, d)),
        };
        match (d, &r) {
            (Doomed::Orphan(Orphan::Mapping { addr, len }), Some(Err(_)) | None) => {
                stuck_mappings.push((addr, len));
            }
            (Doomed::Orphan(Orphan::StreamOrdered { .. }), Some(Err(_))) => free_refused = true,
            _ => {}
        }
        out.push((k, r));
    }
    out
}

/// One destruction or release of `d`.
fn destroy_one(drv: &'static Driver, d: Doomed) -> Result<()> {
    // Each handle was created in this context and its destruction or release
    // failed, so it is still live; it is destroyed at most once more here (a
    // failure puts it back on the list, a success drops it). Orphans were
    // handed over by owners that no longer use them (`Context::free_later`'s
    // contract).
    match d {
        Doomed::Stream(s) => {
            // SAFETY: a live stream of this context, destroyed once (above).
            check(drv, "cuStreamDestroy_v2", unsafe {
                (drv.stream_destroy)(s)
            })
        }
        Doomed::Event(e) => {
            // SAFETY: a live event of this context, destroyed once (above).
            check(drv, "cuEventDestroy_v2", unsafe { (drv.event_destroy)(e) })
        }
        Doomed::Orphan(Orphan::Device { ptr: p, .. }) => {
            // SAFETY: live device memory of this context, freed once (above).
            check(drv, "cuMemFree_v2", unsafe { (drv.mem_free)(p) })
        }
        Doomed::Orphan(Orphan::StreamOrdered { ptr: p, .. }) => {
            let f = crate::error::optional(drv, drv.mem_free_async, "cuMemFreeAsync")?;
            // SAFETY: live stream-ordered memory of this context, freed once
            // (above), ordered after all work of the legacy default stream.
            check(drv, "cuMemFreeAsync", unsafe {
                f(p, emm_sys::CUstream::NULL)
            })
        }
        Doomed::Orphan(Orphan::Host { addr: p, .. }) => {
            // SAFETY: live page-locked host memory of this context, freed once.
            check(drv, "cuMemFreeHost", unsafe {
                (drv.mem_free_host)(p as *mut core::ffi::c_void)
            })
        }
        Doomed::Orphan(Orphan::Registration { addr, .. }) => {
            // SAFETY: a range this context registered, whose unregistration was
            // refused; its owner no longer uses it pinned, and it is unregistered
            // at most once more (above). The driver checks the address.
            match check(drv, "cuMemHostUnregister", unsafe {
                (drv.mem_host_unregister)(addr as *mut core::ffi::c_void)
            }) {
                Err(e) if e.code() == Some(emm_sys::CUresult::ERROR_HOST_MEMORY_NOT_REGISTERED) => {
                    Ok(())
                }
                other => other,
            }
        }
        Doomed::Orphan(Orphan::Mapping { addr, len }) => {
            let f = crate::error::optional(drv, drv.mem_unmap, "cuMemUnmap")?;
            // SAFETY: a live mapping of this context, undone once (above).
            check(drv, "cuMemUnmap", unsafe { f(addr, len) })
        }
        Doomed::Orphan(Orphan::Handle(h)) => {
            let f = crate::error::optional(drv, drv.mem_release, "cuMemRelease")?;
            // SAFETY: a live handle, released once (above), after its
            // mappings were undone or handed over before it.
            check(drv, "cuMemRelease", unsafe { f(h) })
        }
        Doomed::Orphan(Orphan::MemPool(p)) => {
            let f = crate::error::optional(drv, drv.mem_pool_destroy, "cuMemPoolDestroy")?;
            // SAFETY: a live pool of this context whose destruction failed,
            // destroyed once (above).
            check(drv, "cuMemPoolDestroy", unsafe { f(p) })
        }
        Doomed::Orphan(Orphan::Reservation { addr, size }) => {
            let f = crate::error::optional(drv, drv.mem_address_free, "cuMemAddressFree")?;
            // SAFETY: a live reservation with no kept mapping inside (checked by
            // `destroy`), freed once (above).
            check(drv, "cuMemAddressFree", unsafe { f(addr, size) })
        }
    }
}

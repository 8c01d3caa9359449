//! [`RawArray`] (runtime type and rank, for the C ABI and Python) and the typed
//! [`MemArray`] over it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use emm_core::{DeviceAllocation, HostAllocFlags, HostMemory, MemoryManager};
use emm_driver::{memory, Context, Event, Stream};
use emm_sys::CUstream;

use crate::dlpack::*;
use crate::dtype::{DataType, Element};
use crate::indexer::Indexer;
use crate::ArrayError;

/// Which copy of the data is current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The host mirror.
    Host,
    /// The device copy.
    Device,
}

/// The largest rank supported.
pub const MAX_RANK: usize = 4;

/// `bytes` of zeroed host memory, or an out-of-memory error (never an abort) when
/// the heap refuses.
fn heap_zeroed(bytes: usize) -> Result<Vec<u64>, ArrayError> {
    let words = bytes.div_ceil(8).max(1);
    let mut v: Vec<u64> = Vec::new();
    v.try_reserve_exact(words)
        .map_err(|_| emm_core::EmmError::OutOfMemory {
            what: "host",
            manager: "heap".into(),
            requested: bytes,
            free: 0,
            total: 0,
            detail: "the host heap refused the allocation".into(),
        })?;
    v.resize(words, 0);
    Ok(v)
}

enum HostBuf {
    /// Plain host memory (8-byte aligned), when no GPU manager is attached.
    Heap(Vec<u64>),
    /// Pinned memory from the manager.
    Pinned(HostMemory),
}

impl HostBuf {
    fn ptr(&self) -> *mut u8 {
        match self {
            HostBuf::Heap(v) => v.as_ptr() as *mut u8,
            HostBuf::Pinned(h) => h.host_ptr(),
        }
    }
}

/// An n-dimensional array of runtime element type and rank (≤ 4), with a host
/// mirror and a device copy. Shared through `Arc<Mutex<RawArray>>` by the typed
/// [`MemArray`], the C ABI and DLPack exports.
pub struct RawArray {
    dtype: DataType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    len: usize,
    host: HostBuf,
    device: Option<DeviceAllocation>,
    /// The stream the device block was allocated on, when [`RawArray::move_to`]
    /// was given one: kept alive until the block is freed on it (declared
    /// after `device`, so dropped after it).
    block_stream: Option<Arc<Stream>>,
    side: Side,
    manager: Option<(Arc<dyn MemoryManager>, Context)>,
    pending: Option<Event>,
    locks: BTreeSet<u64>,
    /// The locks held by DLPack exports (also in `locks`): only their deleters
    /// release them, not [`RawArray::unlock`].
    export_locks: BTreeSet<u64>,
    next_lock: u64,
    exports: Arc<AtomicUsize>,
    /// Export locks whose deleters ran, to be taken out of `locks` when the
    /// array is next locked: a deleter never waits for the array's mutex (it
    /// may run on a thread inside `with_host`, which holds it).
    released: Arc<Mutex<Vec<u64>>>,
}

impl Drop for RawArray {
    /// Waits for a pending copy before the buffers go: the device block is
    /// freed in order on the stream it was allocated on, and the pinned host
    /// mirror at once, neither after a copy queued on another stream. A failed
    /// wait is recorded on the context (reported by its next call), and the
    /// whole device is waited for instead.
    fn drop(&mut self) {
        let Some(e) = self.pending.take() else {
            return;
        };
        if let Err(err) = e.synchronize_keeping_deferred() {
            if let Some((_, ctx)) = &self.manager {
                let device_wide = ctx.synchronize_keeping_deferred();
                ctx.record_drop_error(err);
                if let Err(sync) = device_wide {
                    ctx.record_drop_error(sync);
                }
            }
        }
    }
}

/// Deleters run so far by every DLPack export of this process (for tests).
pub static DLPACK_DELETERS_RUN: AtomicUsize = AtomicUsize::new(0);

impl core::fmt::Debug for RawArray {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RawArray")
            .field("dtype", &self.dtype.name())
            .field("shape", &self.shape)
            .field("side", &self.side)
            .field("locks", &self.locks)
            .finish()
    }
}

impl RawArray {
    /// A zeroed array on the host. With `manager`, its host mirror is pinned
    /// memory of that manager and its device copy will come from it too.
    pub fn new(
        dtype: DataType,
        shape: &[usize],
        manager: Option<(Arc<dyn MemoryManager>, Context)>,
    ) -> Result<RawArray, ArrayError> {
        DataType::from_code(dtype.code, dtype.bits)?;
        if shape.is_empty() || shape.len() > MAX_RANK {
            return Err(ArrayError::UnsupportedRank {
                rank: shape.len(),
                max: MAX_RANK,
            });
        }
        if let Some((m, ctx)) = &manager {
            let context_device = ctx.device().ordinal();
            if let Some(manager_device) = m.context().map(|c| c.device().ordinal()) {
                if manager_device != context_device {
                    return Err(ArrayError::DeviceMismatch {
                        manager_device,
                        context_device,
                    });
                }
            }
        }
        // Extents, strides and bytes must fit `isize` (no allocation is larger,
        // and DLPack's `int64_t` extents and strides are then never negative).
        const MAX: usize = isize::MAX as usize;
        let too_large = || ArrayError::TooLarge {
            shape: shape.to_vec(),
            element_bytes: dtype.size(),
        };
        if shape.iter().any(|&s| s > MAX) {
            return Err(too_large());
        }
        let len = shape
            .iter()
            .try_fold(1usize, |a, &s| a.checked_mul(s))
            .ok_or_else(too_large)?;
        let bytes = len
            .checked_mul(dtype.size())
            .filter(|&b| b <= MAX)
            .ok_or_else(too_large)?;
        // An empty shape (a zero extent) still has strides over the others, and
        // they can overflow where the element count does not (`[0, 2^40, 2^40]`).
        let mut strides = vec![0usize; shape.len()];
        let mut acc = 1usize;
        for d in (0..shape.len()).rev() {
            strides[d] = acc;
            acc = acc
                .checked_mul(shape[d].max(1))
                .filter(|&a| a <= MAX)
                .ok_or_else(too_large)?;
        }
        let host = match &manager {
            Some((m, _)) if bytes > 0 => {
                let h = m.memhostalloc(
                    bytes,
                    HostAllocFlags {
                        portable: true,
                        ..Default::default()
                    },
                )?;
                // SAFETY: the manager gave `bytes` writable bytes.
                unsafe { core::ptr::write_bytes(h.host_ptr(), 0, bytes) };
                HostBuf::Pinned(h)
            }
            _ => HostBuf::Heap(heap_zeroed(bytes)?),
        };
        Ok(RawArray {
            dtype,
            shape: shape.to_vec(),
            strides,
            len,
            host,
            device: None,
            block_stream: None,
            side: Side::Host,
            manager,
            pending: None,
            locks: BTreeSet::new(),
            export_locks: BTreeSet::new(),
            next_lock: 1,
            exports: Arc::new(AtomicUsize::new(0)),
            released: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` without elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// The current side.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Live locks (DLPack exports and explicit locks).
    pub fn locks(&self) -> Vec<u64> {
        self.locks.iter().copied().collect()
    }

    /// Takes a lock: mutations fail until [`RawArray::unlock`] with the id.
    pub fn lock(&mut self) -> u64 {
        let id = self.next_lock;
        self.next_lock += 1;
        self.locks.insert(id);
        id
    }

    /// Releases lock `id`, one [`RawArray::lock`] took. A DLPack export's lock
    /// is its deleter's to release ([`ArrayError::ExportLock`]): released here,
    /// the consumer's tensor could change under it.
    pub fn unlock(&mut self, id: u64) -> Result<(), ArrayError> {
        self.take_released();
        if self.export_locks.contains(&id) {
            return Err(ArrayError::ExportLock { id });
        }
        if self.locks.remove(&id) {
            Ok(())
        } else {
            Err(ArrayError::UnknownLock {
                id,
                live: self.locks(),
            })
        }
    }

    /// Takes out the export locks whose deleters ran since the array was last
    /// locked.
    pub(crate) fn take_released(&mut self) {
        let ids = std::mem::take(&mut *self.released.lock().unwrap_or_else(|p| p.into_inner()));
        for id in ids {
            self.export_locks.remove(&id);
            self.locks.remove(&id);
        }
    }

    fn check_unlocked(&self, op: &'static str) -> Result<(), ArrayError> {
        if self.locks.is_empty() {
            Ok(())
        } else {
            Err(ArrayError::Locked {
                op,
                locks: self.locks(),
            })
        }
    }

    fn check_host_ready(&mut self, op: &'static str) -> Result<(), ArrayError> {
        if self.side != Side::Host {
            return Err(ArrayError::WrongSide {
                op,
                current: self.side,
            });
        }
        if let Some(e) = &self.pending {
            if !e.query().map_err(emm_core::EmmError::from)? {
                return Err(ArrayError::CopyPending { op });
            }
            self.pending = None;
        }
        Ok(())
    }

    fn context(&self, operation: &'static str) -> Result<&Context, ArrayError> {
        self.manager
            .as_ref()
            .map(|(_, c)| c)
            .ok_or(ArrayError::NoDevice { operation })
    }

    /// Moves the data to `side` on `stream` (`None`: the legacy default stream
    /// of the array's context). Returns `false` when it was already there
    /// (nothing copied). With `wait`, the copy has finished on return;
    /// otherwise host access waits for it (and fails with
    /// [`ArrayError::CopyPending`] until it has). A stream of another device
    /// is [`ArrayError::ForeignStream`].
    ///
    /// The device block is allocated on the stream of the first copy that
    /// needs it and belongs to it, as a stream-ordered allocator's blocks do:
    /// kernels using [`RawArray::data_ptr`] go on that stream (or are ordered
    /// before it), and the block is freed on it, after them, when the array
    /// goes. The array keeps that stream (its `Arc`) alive until then.
    pub fn move_to(
        &mut self,
        side: Side,
        stream: Option<&Arc<Stream>>,
        wait: bool,
    ) -> Result<bool, ArrayError> {
        let raw = match stream {
            None => CUstream::NULL,
            Some(s) => {
                // An array without a device has nothing to compare; it moves
                // nowhere but to the host it is on (or says `NoDevice`).
                if let Some((_, ctx)) = &self.manager {
                    if s.context() != ctx {
                        return Err(ArrayError::ForeignStream {
                            array_device: ctx.device().ordinal(),
                            stream_device: s.context().device().ordinal(),
                        });
                    }
                }
                s.raw()
            }
        };
        let had_block = self.device.is_some();
        // SAFETY: `raw` is null (the legacy default stream) or a live stream of
        // the array's context (checked above); if the call allocates the
        // device block on it, the array keeps the stream alive (below) until
        // the block is freed on it, and the copy queued on it is waited for
        // before the array hands out its host data, copies again or drops its
        // buffers.
        let moved = unsafe { self.move_to_raw(side, raw, wait) };
        if !had_block && self.device.is_some() {
            self.block_stream = stream.cloned();
        }
        moved
    }

    /// [`RawArray::move_to`] on a raw stream handle (null: the legacy default
    /// stream), for foreign code that holds only the handle (the C ABI).
    ///
    /// # Safety
    /// `stream` must be null, a default-stream handle, or a live stream of the
    /// array's context that outlives this call and the copy queued on it, and,
    /// where this call allocates the device block on it (the array's first
    /// move to the device), the array itself: the block is freed on it when
    /// the array goes.
    pub unsafe fn move_to_raw(
        &mut self,
        side: Side,
        stream: CUstream,
        wait: bool,
    ) -> Result<bool, ArrayError> {
        if self.side == side {
            return Ok(false);
        }
        self.check_unlocked("move_to")?;
        let ctx = self.context("move_to")?.clone();
        let stream_raw = if stream.is_null() {
            emm_core::SYNC_STREAM
        } else {
            stream
        };
        // SAFETY: the caller's stream belongs to the array's context (or is a
        // default stream) and outlives this call (`move_to_raw`'s contract).
        let s = unsafe { Stream::from_raw(&ctx, stream_raw) };
        let bytes = self.nbytes();
        if bytes > 0 {
            let (m, _) = self.manager.as_ref().ok_or(ArrayError::NoDevice {
                operation: "move_to",
            })?;
            if self.device.is_none() {
                // On the copy's stream, which the block belongs to from now
                // on: it is freed there when the array goes, after the work
                // queued there (the caller's kernels on `data_ptr()`). Through
                // the process's out-of-memory hook: another manager's cache
                // can make room.
                self.device = Some(emm_core::alloc_from(m.as_ref(), bytes, stream_raw)?);
            }
            let dev = self.device.as_ref().map(DeviceAllocation::ptr).unwrap_or(0);
            let host = self.host.ptr();
            // A copy still pending (on this stream or another) is ordered before
            // this one, which reads or writes the same buffers.
            if let Some(p) = &self.pending {
                if s.wait_event(p).is_err() {
                    p.synchronize().map_err(emm_core::EmmError::from)?;
                }
            }
            // The event that marks the copy's end, made before the copy is
            // queued: a copy must not run untracked.
            let done = if wait {
                None
            } else {
                Some(Event::sync_only(&ctx).map_err(emm_core::EmmError::from)?)
            };
            // SAFETY: host and device buffers both hold `bytes` bytes and are owned
            // by the array, which outlives the copy: the copy is ordered after any
            // earlier one (above), and the array waits for it (its event, or the
            // stream when recording the event fails) before handing out the host
            // data, copying again or dropping its buffers (`Drop`). Only where the
            // driver fails that wait too (a faulted stream, whose work has stopped)
            // does `move_to` return the error with the copy untracked.
            unsafe {
                match side {
                    Side::Device => memory::copy_htod_async(dev, host, bytes, &s),
                    Side::Host => memory::copy_dtoh_async(host, dev, bytes, &s),
                }
            }
            .map_err(emm_core::EmmError::from)?;
            match done {
                None => s.synchronize().map_err(emm_core::EmmError::from)?,
                Some(e) => {
                    if let Err(rec) = e.record(&s) {
                        // Untracked, the copy is waited for here.
                        tracing::debug!(error = %rec, "recording a copy's event failed; waiting for its stream");
                        s.synchronize().map_err(emm_core::EmmError::from)?;
                        self.pending = None;
                    } else {
                        self.pending = Some(e);
                    }
                }
            }
            if wait {
                self.pending = None;
            }
        }
        self.side = side;
        Ok(true)
    }

    /// Waits for a pending copy. A failed wait keeps it pending (host access
    /// still refused), not forgotten.
    pub fn synchronize(&mut self) -> Result<(), ArrayError> {
        if let Some(e) = &self.pending {
            e.synchronize().map_err(emm_core::EmmError::from)?;
        }
        self.pending = None;
        Ok(())
    }

    fn offset(&self, idx: &[usize]) -> Result<usize, ArrayError> {
        if idx.len() != self.shape.len() {
            return Err(ArrayError::OutOfBounds {
                index: idx.to_vec(),
                shape: self.shape.clone(),
            });
        }
        let mut off = 0;
        for d in 0..idx.len() {
            if idx[d] >= self.shape[d] {
                return Err(ArrayError::OutOfBounds {
                    index: idx.to_vec(),
                    shape: self.shape.clone(),
                });
            }
            off += idx[d] * self.strides[d];
        }
        Ok(off * self.dtype.size())
    }

    /// Copies the element at `idx` into `out` (its size); host side only.
    pub fn get_bytes(&mut self, idx: &[usize], out: &mut [u8]) -> Result<(), ArrayError> {
        self.check_host_ready("get")?;
        let off = self.offset(idx)?;
        if out.len() != self.dtype.size() {
            return Err(ArrayError::TypeMismatch {
                expected: self.dtype.name(),
                found: out.len(),
            });
        }
        // SAFETY: `off + size <= nbytes` (checked index); the host buffer holds nbytes.
        unsafe {
            core::ptr::copy_nonoverlapping(self.host.ptr().add(off), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// Writes the element at `idx`; host side only, not while locked.
    pub fn set_bytes(&mut self, idx: &[usize], value: &[u8]) -> Result<(), ArrayError> {
        self.check_unlocked("set")?;
        self.check_host_ready("set")?;
        let off = self.offset(idx)?;
        if value.len() != self.dtype.size() {
            return Err(ArrayError::TypeMismatch {
                expected: self.dtype.name(),
                found: value.len(),
            });
        }
        // SAFETY: as in `get_bytes`.
        unsafe {
            core::ptr::copy_nonoverlapping(value.as_ptr(), self.host.ptr().add(off), value.len())
        };
        Ok(())
    }

    /// The host mirror's bytes (host side, no copy pending).
    pub fn host_bytes(&mut self) -> Result<&[u8], ArrayError> {
        self.check_host_ready("read the host mirror")?;
        let n = self.nbytes();
        // SAFETY: the host buffer holds `n` initialised bytes owned by `self`.
        Ok(unsafe { core::slice::from_raw_parts(self.host.ptr(), n) })
    }

    /// The host mirror's bytes, writable (host side, no copy pending, not locked).
    pub fn host_bytes_mut(&mut self) -> Result<&mut [u8], ArrayError> {
        self.check_unlocked("write the host mirror")?;
        self.check_host_ready("write the host mirror")?;
        let n = self.nbytes();
        // SAFETY: as above, and `&mut self` is exclusive.
        Ok(unsafe { core::slice::from_raw_parts_mut(self.host.ptr(), n) })
    }

    /// The raw pointer of the current side, for kernels and foreign code.
    pub fn data_ptr(&self) -> u64 {
        match self.side {
            Side::Host => self.host.ptr() as u64,
            Side::Device => self.device.as_ref().map_or(0, DeviceAllocation::ptr),
        }
    }

    fn dl_device(&self) -> Result<DLDevice, ArrayError> {
        Ok(match (self.side, &self.host) {
            (Side::Device, _) => DLDevice {
                device_type: KDL_CUDA,
                device_id: self.context("DLPack export")?.device().ordinal() as i32,
            },
            (Side::Host, HostBuf::Pinned(_)) => DLDevice {
                device_type: KDL_CUDA_HOST,
                device_id: 0,
            },
            (Side::Host, HostBuf::Heap(_)) => DLDevice {
                device_type: KDL_CPU,
                device_id: 0,
            },
        })
    }

    /// `(device_type, device_id)` as `__dlpack_device__` returns it.
    pub fn dlpack_device(&self) -> Result<(i32, i32), ArrayError> {
        let d = self.dl_device()?;
        Ok((d.device_type, d.device_id))
    }

    /// Number of DLPack exports whose deleter has run.
    pub fn deleters_run(&self) -> usize {
        self.exports.load(Ordering::Acquire)
    }
}

#[repr(C)]
struct ExportVersioned {
    tensor: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
    array: Arc<Mutex<RawArray>>,
    lock: u64,
    count: Arc<AtomicUsize>,
    released: Arc<Mutex<Vec<u64>>>,
}

#[repr(C)]
struct ExportLegacy {
    tensor: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    array: Arc<Mutex<RawArray>>,
    lock: u64,
    count: Arc<AtomicUsize>,
    released: Arc<Mutex<Vec<u64>>>,
}

/// Locks the shared array, taking out the export locks whose deleters ran
/// meanwhile. Every access to a shared [`RawArray`] goes through this (the C
/// ABI's too).
pub fn lock_array(a: &Mutex<RawArray>) -> MutexGuard<'_, RawArray> {
    let mut g = a.lock().unwrap_or_else(|p| p.into_inner());
    g.take_released();
    g
}

/// A deleter's end of an export: its lock queued for release (taken out at
/// the array's next locking, now when the array is free), without waiting for
/// the array's mutex, which a thread running this inside `with_host` holds.
fn release(
    array: &Arc<Mutex<RawArray>>,
    released: &Mutex<Vec<u64>>,
    lock: u64,
    count: &AtomicUsize,
) {
    released
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(lock);
    if let Ok(mut a) = array.try_lock() {
        a.take_released();
    }
    count.fetch_add(1, Ordering::AcqRel);
    DLPACK_DELETERS_RUN.fetch_add(1, Ordering::AcqRel);
}

unsafe extern "C" fn delete_versioned(t: *mut DLManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` is the first field of a boxed `ExportVersioned` (repr(C)) made by
    // `export_versioned`; DLPack calls the deleter once.
    let b = unsafe { Box::from_raw(t.cast::<ExportVersioned>()) };
    release(&b.array, &b.released, b.lock, &b.count);
}

unsafe extern "C" fn delete_legacy(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for `ExportLegacy`.
    let b = unsafe { Box::from_raw(t.cast::<ExportLegacy>()) };
    release(&b.array, &b.released, b.lock, &b.count);
}

/// A tensor, its shape and strides, the export's lock id, the deleter counter
/// and the queue its deleter releases the lock through.
type Parts = (
    DLTensor,
    Vec<i64>,
    Vec<i64>,
    u64,
    Arc<AtomicUsize>,
    Arc<Mutex<Vec<u64>>>,
);

fn tensor_parts(array: &Arc<Mutex<RawArray>>) -> Result<Parts, ArrayError> {
    let mut a = lock_array(array);
    a.synchronize()?; // the consumer sees finished data
    let device = a.dl_device()?;
    // `RawArray::new` keeps both below `isize::MAX`; checked again so an extent or
    // stride is never reported negative.
    let to_i64 = |v: &[usize]| -> Result<Vec<i64>, ArrayError> {
        v.iter()
            .map(|&s| {
                i64::try_from(s).map_err(|_| ArrayError::TooLarge {
                    shape: a.shape.clone(),
                    element_bytes: a.dtype.size(),
                })
            })
            .collect()
    };
    let shape = to_i64(&a.shape)?;
    let strides = to_i64(&a.strides)?;
    let t = DLTensor {
        data: a.data_ptr() as *mut core::ffi::c_void,
        device,
        ndim: a.shape.len() as i32,
        dtype: DLDataType {
            code: a.dtype.code,
            bits: a.dtype.bits,
            lanes: 1,
        },
        shape: core::ptr::null_mut(),
        strides: core::ptr::null_mut(),
        byte_offset: 0,
    };
    let lock = a.lock();
    a.export_locks.insert(lock);
    Ok((
        t,
        shape,
        strides,
        lock,
        a.exports.clone(),
        a.released.clone(),
    ))
}

/// Exports the array's current side as a `DLManagedTensorVersioned`. The export
/// holds a lock and keeps the array alive until its deleter runs (exactly once,
/// called by the consumer).
pub fn export_versioned(
    array: &Arc<Mutex<RawArray>>,
) -> Result<*mut DLManagedTensorVersioned, ArrayError> {
    let (dl_tensor, shape, strides, lock, count, released) = tensor_parts(array)?;
    let mut b = Box::new(ExportVersioned {
        tensor: DLManagedTensorVersioned {
            version: DLPACK_VERSION,
            manager_ctx: core::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor,
        },
        shape,
        strides,
        array: array.clone(),
        lock,
        count,
        released,
    });
    b.tensor.dl_tensor.shape = b.shape.as_mut_ptr();
    b.tensor.dl_tensor.strides = b.strides.as_mut_ptr();
    let p = Box::into_raw(b);
    // SAFETY: `p` is a fresh, valid box.
    unsafe { (*p).tensor.manager_ctx = p.cast() };
    Ok(p.cast())
}

/// Exports the array's current side as a legacy `DLManagedTensor` (for consumers
/// that predate DLPack 1.0). Same ownership rules as [`export_versioned`].
pub fn export_legacy(array: &Arc<Mutex<RawArray>>) -> Result<*mut DLManagedTensor, ArrayError> {
    let (dl_tensor, shape, strides, lock, count, released) = tensor_parts(array)?;
    let mut b = Box::new(ExportLegacy {
        tensor: DLManagedTensor {
            dl_tensor,
            manager_ctx: core::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        shape,
        strides,
        array: array.clone(),
        lock,
        count,
        released,
    });
    b.tensor.dl_tensor.shape = b.shape.as_mut_ptr();
    b.tensor.dl_tensor.strides = b.strides.as_mut_ptr();
    let p = Box::into_raw(b);
    // SAFETY: `p` is a fresh, valid box.
    unsafe { (*p).tensor.manager_ctx = p.cast() };
    Ok(p.cast())
}

/// A typed `N`-dimensional array of `T` with a host mirror and a device copy,
/// every byte from an emm manager.
///
/// ```no_run
/// use emm_array::{MemArray, Side};
/// let ctx = emm_driver::Context::on_device(0)?;
/// let manager = emm_core::memory_manager(&ctx)?;
/// let a = MemArray::<f32, 2>::new([4, 8], manager, &ctx)?;
/// a.set([1, 2], 3.5)?;
/// let stream = std::sync::Arc::new(emm_driver::Stream::new(&ctx)?);
/// a.move_to(Side::Device, Some(&stream), true)?; // copies once; the block is the stream's
/// assert!(!a.move_to(Side::Device, None, true)?); // already there
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct MemArray<T: Element, const N: usize> {
    raw: Arc<Mutex<RawArray>>,
    indexer: Indexer<N>,
    _t: core::marker::PhantomData<T>,
}

impl<T: Element, const N: usize> MemArray<T, N> {
    /// A zeroed array whose memory comes from `manager` (pinned host mirror, device
    /// copy on first move).
    pub fn new(
        shape: [usize; N],
        manager: Arc<dyn MemoryManager>,
        ctx: &Context,
    ) -> Result<Self, ArrayError> {
        Self::build(shape, Some((manager, ctx.clone())))
    }

    /// A zeroed array with a plain host mirror and no device (for tests and tools).
    pub fn on_host(shape: [usize; N]) -> Result<Self, ArrayError> {
        Self::build(shape, None)
    }

    fn build(
        shape: [usize; N],
        m: Option<(Arc<dyn MemoryManager>, Context)>,
    ) -> Result<Self, ArrayError> {
        let indexer = Indexer::new(shape).ok_or_else(|| ArrayError::TooLarge {
            shape: shape.to_vec(),
            element_bytes: T::DTYPE.size(),
        })?;
        let raw = RawArray::new(T::DTYPE, &shape, m)?;
        Ok(MemArray {
            raw: Arc::new(Mutex::new(raw)),
            indexer,
            _t: core::marker::PhantomData,
        })
    }

    fn lock(&self) -> MutexGuard<'_, RawArray> {
        lock_array(&self.raw)
    }

    /// The indexer (shape and strides), small enough to pass to a kernel.
    pub fn indexer(&self) -> Indexer<N> {
        self.indexer
    }

    /// The shared raw array (for exports and the C ABI).
    pub fn raw(&self) -> &Arc<Mutex<RawArray>> {
        &self.raw
    }

    /// The current side.
    pub fn side(&self) -> Side {
        self.lock().side()
    }

    /// Checked read of one element (host side).
    pub fn get(&self, idx: [usize; N]) -> Result<T, ArrayError> {
        let mut v = T::default();
        // SAFETY: `T` is a plain numeric type; its bytes are a valid view of it.
        let bytes = unsafe {
            core::slice::from_raw_parts_mut(
                (&mut v as *mut T).cast::<u8>(),
                core::mem::size_of::<T>(),
            )
        };
        self.lock().get_bytes(&idx, bytes)?;
        Ok(v)
    }

    /// Checked write of one element (host side, not locked).
    pub fn set(&self, idx: [usize; N], value: T) -> Result<(), ArrayError> {
        // SAFETY: as in `get`.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                (&value as *const T).cast::<u8>(),
                core::mem::size_of::<T>(),
            )
        };
        self.lock().set_bytes(&idx, bytes)
    }

    /// Runs `f` on the host mirror as a slice (host side).
    pub fn with_host<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R, ArrayError> {
        let mut g = self.lock();
        let bytes = g.host_bytes()?;
        // SAFETY: the buffer is 8-byte (heap) or page (pinned) aligned and holds
        // `len` elements of `T`.
        let s = unsafe {
            core::slice::from_raw_parts(
                bytes.as_ptr().cast::<T>(),
                bytes.len() / core::mem::size_of::<T>(),
            )
        };
        Ok(f(s))
    }

    /// Runs `f` on the host mirror as a mutable slice (host side, not locked).
    pub fn with_host_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R, ArrayError> {
        let mut g = self.lock();
        let bytes = g.host_bytes_mut()?;
        // SAFETY: as in `with_host`, and the guard gives exclusive access.
        let s = unsafe {
            core::slice::from_raw_parts_mut(
                bytes.as_mut_ptr().cast::<T>(),
                bytes.len() / core::mem::size_of::<T>(),
            )
        };
        Ok(f(s))
    }

    /// See [`RawArray::move_to`].
    pub fn move_to(
        &self,
        side: Side,
        stream: Option<&Arc<Stream>>,
        wait: bool,
    ) -> Result<bool, ArrayError> {
        self.lock().move_to(side, stream, wait)
    }

    /// See [`RawArray::move_to_raw`].
    ///
    /// # Safety
    /// As [`RawArray::move_to_raw`]'s.
    pub unsafe fn move_to_raw(
        &self,
        side: Side,
        stream: CUstream,
        wait: bool,
    ) -> Result<bool, ArrayError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.lock().move_to_raw(side, stream, wait) }
    }

    /// Waits for a pending copy.
    pub fn synchronize(&self) -> Result<(), ArrayError> {
        self.lock().synchronize()
    }

    /// The raw pointer of the current side, unchecked: for kernels.
    pub fn data_ptr(&self) -> u64 {
        self.lock().data_ptr()
    }

    /// Takes a lock (as the C ABI and Python do); mutations fail until unlocked.
    pub fn lock_id(&self) -> u64 {
        self.lock().lock()
    }

    /// Releases a lock.
    pub fn unlock(&self, id: u64) -> Result<(), ArrayError> {
        self.lock().unlock(id)
    }

    /// Exports as `DLManagedTensorVersioned` (see [`export_versioned`]).
    pub fn to_dlpack(&self) -> Result<*mut DLManagedTensorVersioned, ArrayError> {
        export_versioned(&self.raw)
    }

    /// Exports as a legacy `DLManagedTensor` (see [`export_legacy`]).
    pub fn to_dlpack_legacy(&self) -> Result<*mut DLManagedTensor, ArrayError> {
        export_legacy(&self.raw)
    }

    /// DLPack deleters run for this array so far.
    pub fn deleters_run(&self) -> usize {
        self.lock().deleters_run()
    }
}

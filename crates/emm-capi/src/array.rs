//! MemArray over the C ABI: runtime type and rank, lock ids, DLPack export.

use std::ffi::c_int;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use ::emm_array::{
    export_legacy, export_versioned, ArrayError, DataType, RawArray, Side, MAX_RANK,
};

use crate::ffi::stream_of;
use crate::guard::guard;
use crate::handles::Handles;
use crate::manager::{emm_manager, handle};
use crate::status::{emm_status, invalid, set_error, EMM_OK};

/// An array handle (opaque; from `emm_array_create`).
pub struct emm_array {
    raw: Arc<Mutex<RawArray>>,
}

fn fail_array(e: ArrayError) -> emm_status {
    let code = match &e {
        ArrayError::Memory(m) => return crate::status::fail(m.clone()),
        ArrayError::UnsupportedType { .. }
        | ArrayError::UnsupportedRank { .. }
        | ArrayError::OutOfBounds { .. }
        | ArrayError::TypeMismatch { .. }
        | ArrayError::UnknownLock { .. }
        | ArrayError::ExportLock { .. }
        | ArrayError::DeviceMismatch { .. }
        | ArrayError::ForeignStream { .. }
        | ArrayError::TooLarge { .. } => crate::status::EMM_ERR_INVALID_ARGUMENT,
        ArrayError::NoDevice { .. } => crate::status::EMM_ERR_UNSUPPORTED,
        _ => crate::status::EMM_ERR_OTHER,
    };
    set_error(code, e.to_string())
}

/// The live array handles.
static ARRAYS: Handles<emm_array> = Handles::new();

/// The array behind a live handle; null, foreign and destroyed handles are
/// `EMM_ERR_INVALID_ARGUMENT` (nothing is read through them).
fn array_handle(a: *const emm_array) -> Result<Arc<emm_array>, emm_status> {
    if a.is_null() {
        return Err(invalid("the array handle is null"));
    }
    ARRAYS.get(a).ok_or_else(|| {
        invalid(format!(
            "{a:p} is not a live array handle (destroyed already, or not from emm_array_create)"
        ))
    })
}

/// The index rank and the element size an element access must pass for `a`.
fn check_element(a: &RawArray, rank: c_int, size: usize, what: &str) -> Result<(), emm_status> {
    if usize::try_from(rank).ok() != Some(a.shape().len()) {
        return Err(invalid(format!(
            "{what}: {rank} indices for an array of rank {}",
            a.shape().len()
        )));
    }
    if size != a.dtype().size() {
        return Err(invalid(format!(
            "{what}: an element of {size} bytes for an array of {} ({} bytes)",
            a.dtype().name(),
            a.dtype().size()
        )));
    }
    Ok(())
}

/// `guard` around `f` on the array behind `a`; null and unknown handles are refused.
fn with_array(a: *const emm_array, f: impl FnOnce(&emm_array) -> emm_status) -> emm_status {
    guard(|| match array_handle(a) {
        Ok(h) => f(&h),
        Err(c) => c,
    })
}

fn lock(a: &emm_array) -> std::sync::MutexGuard<'_, RawArray> {
    ::emm_array::lock_array(&a.raw)
}

/// MemArray: creates a zeroed n-dimensional array of DLPack type `(code, bits)` with
/// `rank` (1..4) extents from `shape`, with a host mirror and a device copy from
/// manager `m` (pinned host memory and device memory; NULL: host only). Mutations
/// fail while a lock (explicit, or a DLPack export) lives.
#[no_mangle]
pub unsafe extern "C" fn emm_array_create(
    m: *mut emm_manager,
    code: u8,
    bits: u8,
    rank: c_int,
    shape: *const usize,
    out: *mut *mut emm_array,
) -> emm_status {
    guard(|| {
        if out.is_null() || shape.is_null() {
            return invalid("emm_array_create: null pointer argument");
        }
        let Some(rank) = usize::try_from(rank).ok().filter(|&r| r <= MAX_RANK) else {
            return invalid(format!(
                "emm_array_create: rank {rank}, expected 1..={MAX_RANK}"
            ));
        };
        // SAFETY: the caller passes `rank` extents at `shape`.
        let shape = unsafe { core::slice::from_raw_parts(shape, rank) };
        let mgr = if m.is_null() {
            None
        } else {
            match handle(m) {
                Ok(h) => Some((h.manager.clone(), h.ctx.clone())),
                Err(c) => return c,
            }
        };
        match RawArray::new(DataType { code, bits }, shape, mgr) {
            Ok(raw) => {
                // SAFETY: non-null and writable per the contract.
                unsafe {
                    *out = ARRAYS.insert(emm_array {
                        raw: Arc::new(Mutex::new(raw)),
                    })
                };
                EMM_OK
            }
            Err(e) => fail_array(e),
        }
    })
}

/// Releases an array handle (DLPack exports keep the data alive until their
/// deleters run). NULL does nothing.
#[no_mangle]
pub unsafe extern "C" fn emm_array_destroy(a: *mut emm_array) {
    let _ = guard(|| {
        if a.is_null() {
            return EMM_OK;
        }
        match ARRAYS.remove(a) {
            Some(h) => {
                drop(h);
                EMM_OK
            }
            None => invalid(format!(
                "emm_array_destroy: {a:p} is not a live array handle (destroyed already, or not from emm_array_create)"
            )),
        }
    });
}

/// Moves the array to `side` (0 host, 1 device) on `stream`; `wait` non-zero waits
/// for the copy; `*moved` (may be NULL) gets 0 when it was already there.
/// `stream` is NULL (the legacy default stream) or a stream of the array's
/// context that outlives the copy; the first move to the device allocates the
/// array's device block on it and frees it there when the array is destroyed,
/// so that stream must outlive the array too.
#[no_mangle]
pub unsafe extern "C" fn emm_array_move(
    a: *mut emm_array,
    side: c_int,
    stream: *mut c_void,
    wait: c_int,
    moved: *mut c_int,
) -> emm_status {
    with_array(a, |a| {
        let side = match side {
            0 => Side::Host,
            1 => Side::Device,
            s => return invalid(format!("emm_array_move: side {s} (0 host, 1 device)")),
        };
        // SAFETY: the C contract (above): `stream` is NULL, a default stream
        // or a live stream of the array's context that outlives the copy and,
        // where the block is allocated on it, the array.
        match unsafe { lock(a).move_to_raw(side, stream_of(stream), wait != 0) } {
            Ok(m) => {
                if !moved.is_null() {
                    // SAFETY: non-null and writable per the contract.
                    unsafe { *moved = c_int::from(m) };
                }
                EMM_OK
            }
            Err(e) => fail_array(e),
        }
    })
}

/// Data pointer, side (0 host, 1 device) and DLPack device of the array.
#[no_mangle]
pub unsafe extern "C" fn emm_array_info(
    a: *mut emm_array,
    data: *mut u64,
    side: *mut c_int,
    device_type: *mut c_int,
    device_id: *mut c_int,
) -> emm_status {
    with_array(a, |a| {
        if data.is_null() || side.is_null() || device_type.is_null() || device_id.is_null() {
            return invalid("emm_array_info: null output pointer");
        }
        let g = lock(a);
        match g.dlpack_device() {
            Ok((t, i)) => {
                // SAFETY: all four are non-null and writable per the contract.
                unsafe {
                    *data = g.data_ptr();
                    *side = c_int::from(g.side() == Side::Device);
                    *device_type = t;
                    *device_id = i;
                }
                EMM_OK
            }
            Err(e) => fail_array(e),
        }
    })
}

/// Reads element `idx` (`rank` indices) into `out` (`size` bytes: the element size).
#[no_mangle]
pub unsafe extern "C" fn emm_array_get(
    a: *mut emm_array,
    idx: *const usize,
    rank: c_int,
    out: *mut c_void,
    size: usize,
) -> emm_status {
    with_array(a, |a| {
        if idx.is_null() || out.is_null() {
            return invalid("emm_array_get: null pointer argument");
        }
        // Checked before any slice is made over the caller's memory.
        if let Err(c) = check_element(&lock(a), rank, size, "emm_array_get") {
            return c;
        }
        // SAFETY: the caller passes `rank` indices and `size` writable bytes.
        let (idx, out) = unsafe {
            (
                core::slice::from_raw_parts(idx, rank as usize),
                core::slice::from_raw_parts_mut(out.cast::<u8>(), size),
            )
        };
        match lock(a).get_bytes(idx, out) {
            Ok(()) => EMM_OK,
            Err(e) => fail_array(e),
        }
    })
}

/// Writes element `idx` from `value` (`size` bytes); fails while locked.
#[no_mangle]
pub unsafe extern "C" fn emm_array_set(
    a: *mut emm_array,
    idx: *const usize,
    rank: c_int,
    value: *const c_void,
    size: usize,
) -> emm_status {
    with_array(a, |a| {
        if idx.is_null() || value.is_null() {
            return invalid("emm_array_set: null pointer argument");
        }
        // Checked before any slice is made over the caller's memory.
        if let Err(c) = check_element(&lock(a), rank, size, "emm_array_set") {
            return c;
        }
        // SAFETY: the caller passes `rank` indices and `size` readable bytes.
        let (idx, value) = unsafe {
            (
                core::slice::from_raw_parts(idx, rank as usize),
                core::slice::from_raw_parts(value.cast::<u8>(), size),
            )
        };
        match lock(a).set_bytes(idx, value) {
            Ok(()) => EMM_OK,
            Err(e) => fail_array(e),
        }
    })
}

/// Takes a lock; mutations fail until `emm_array_unlock(id)`.
#[no_mangle]
pub unsafe extern "C" fn emm_array_lock(a: *mut emm_array, id: *mut u64) -> emm_status {
    with_array(a, |a| {
        if id.is_null() {
            return invalid("emm_array_lock: `id` is null");
        }
        // SAFETY: non-null and writable per the contract.
        unsafe { *id = lock(a).lock() };
        EMM_OK
    })
}

/// Releases lock `id`.
#[no_mangle]
pub unsafe extern "C" fn emm_array_unlock(a: *mut emm_array, id: u64) -> emm_status {
    with_array(a, |a| match lock(a).unlock(id) {
        Ok(()) => EMM_OK,
        Err(e) => fail_array(e),
    })
}

/// DLPack export of the current side into `*out`: a `DLManagedTensorVersioned*`
/// when `versioned` is non-zero, else the legacy `DLManagedTensor*`. The export
/// locks the array and keeps it alive until its deleter runs (the consumer's, or
/// `emm_dlpack_delete` for an export nobody consumed).
#[no_mangle]
pub unsafe extern "C" fn emm_array_to_dlpack(
    a: *mut emm_array,
    versioned: c_int,
    out: *mut *mut c_void,
) -> emm_status {
    with_array(a, |a| {
        if out.is_null() {
            return invalid("emm_array_to_dlpack: `out` is null");
        }
        let r = if versioned != 0 {
            export_versioned(&a.raw).map(|p| p.cast::<c_void>())
        } else {
            export_legacy(&a.raw).map(|p| p.cast::<c_void>())
        };
        match r {
            Ok(p) => {
                // SAFETY: non-null and writable per the contract.
                unsafe { *out = p };
                EMM_OK
            }
            Err(e) => fail_array(e),
        }
    })
}

/// Runs the deleter of a DLPack export made by `emm_array_to_dlpack` with the same
/// `versioned` that nobody consumed. NULL does nothing.
#[no_mangle]
pub unsafe extern "C" fn emm_dlpack_delete(tensor: *mut c_void, versioned: c_int) {
    let _ = guard(|| {
        if tensor.is_null() {
            return EMM_OK;
        }
        // SAFETY: `tensor` came from emm_array_to_dlpack with the same `versioned`
        // and its deleter has not run.
        unsafe {
            if versioned != 0 {
                let t = tensor.cast::<::emm_array::dlpack::DLManagedTensorVersioned>();
                if let Some(d) = (*t).deleter {
                    d(t);
                }
            } else {
                let t = tensor.cast::<::emm_array::dlpack::DLManagedTensor>();
                if let Some(d) = (*t).deleter {
                    d(t);
                }
            }
        }
        EMM_OK
    });
}

/// Deleters run so far for this array's exports (0 for a handle that is not live).
#[no_mangle]
pub unsafe extern "C" fn emm_array_deleters_run(a: *mut emm_array) -> u64 {
    match array_handle(a) {
        Ok(h) => lock(&h).deleters_run() as u64,
        Err(_) => 0,
    }
}

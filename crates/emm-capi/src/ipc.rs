//! IPC through a manager handle: export, open, close.

use crate::ffi::*;
use crate::manager::*;
use crate::status::*;
use emm_core::IpcHandle;

/// IPC: exports `[ptr+offset, ptr+offset+len)` of an allocation of this handle as
/// handle bytes into `buf` (`cap` bytes); `*written` gets their length. With `buf`
/// NULL only `*written` is set (to the size needed). Another process opens the bytes
/// with `emm_ipc_open`.
#[no_mangle]
pub unsafe extern "C" fn emm_ipc_export(
    m: *mut emm_manager,
    ptr: u64,
    offset: usize,
    len: usize,
    buf: *mut u8,
    cap: usize,
    written: *mut usize,
) -> emm_status {
    with_manager(m, |h| {
        if written.is_null() {
            return invalid("emm_ipc_export: `written` is null");
        }
        let map = lock(&h.device);
        let Some(a) = map.get(&ptr) else {
            return invalid(format!(
                "emm_ipc_export: {ptr:#x} was not allocated through this handle"
            ));
        };
        let bytes = match a
            .view(offset, len)
            .and_then(|v| h.manager.get_ipc_handle(v))
        {
            Ok(hd) => hd.to_bytes(),
            Err(e) => return fail(e),
        };
        // SAFETY: non-null and writable per the contract.
        unsafe { *written = bytes.len() };
        if buf.is_null() {
            return EMM_OK;
        }
        if cap < bytes.len() {
            return invalid(format!(
                "emm_ipc_export: the buffer holds {cap} bytes, the handle needs {}",
                bytes.len()
            ));
        }
        // SAFETY: `buf` holds `cap` >= len writable bytes.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
        EMM_OK
    })
}

/// Opens IPC handle bytes from another process; `*out_ptr` gets the device address
/// (staged into this handle's manager when the memory is on another device). Close
/// it with `emm_ipc_close`.
#[no_mangle]
pub unsafe extern "C" fn emm_ipc_open(
    m: *mut emm_manager,
    buf: *const u8,
    len: usize,
    out_ptr: *mut u64,
) -> emm_status {
    with_manager(m, |h| {
        if buf.is_null() || out_ptr.is_null() {
            return invalid("emm_ipc_open: null pointer argument");
        }
        // SAFETY: `buf` holds `len` readable bytes per the contract.
        let bytes = unsafe { core::slice::from_raw_parts(buf, len) };
        let opened =
            IpcHandle::from_bytes(bytes).and_then(|hd| hd.open(&h.ctx, h.manager.as_ref()));
        match opened {
            Ok(mem) => {
                let p = mem.ptr();
                lock(&h.ipc).entry(p).or_default().push(Opened {
                    mem,
                    refused: false,
                });
                // SAFETY: non-null and writable per the contract.
                unsafe { *out_ptr = p };
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Closes memory opened by `emm_ipc_open` on this handle: one close for each
/// open (a driver may give one address to every open of a handle). A close the
/// driver refuses returns its status and keeps the record, to be closed again;
/// the memory may be partly closed by then (not to be used again), and what
/// was undone is not undone twice. The next close of that address takes it
/// first, before memory opened at the same address since.
#[no_mangle]
pub unsafe extern "C" fn emm_ipc_close(m: *mut emm_manager, ptr: u64) -> emm_status {
    with_manager(m, |h| {
        let taken = {
            let mut map = lock(&h.ipc);
            let taken = map.get_mut(&ptr).and_then(|opened| {
                let i = opened
                    .iter()
                    .rposition(|o| o.refused)
                    .or(opened.len().checked_sub(1))?;
                Some(opened.remove(i))
            });
            if map.get(&ptr).is_some_and(Vec::is_empty) {
                map.remove(&ptr);
            }
            taken
        };
        let Some(Opened { mut mem, .. }) = taken else {
            return invalid(format!(
                "emm_ipc_close: {ptr:#x} was not opened through this handle (or closed as often as it was opened)"
            ));
        };
        // Closed outside the lock: the close waits for the device.
        match mem.close() {
            Ok(()) => EMM_OK,
            Err(e) => {
                lock(&h.ipc)
                    .entry(ptr)
                    .or_default()
                    .push(Opened { mem, refused: true });
                fail(e)
            }
        }
    })
}

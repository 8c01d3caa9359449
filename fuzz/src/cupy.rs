//! CuPy's C-function allocator (`emm_cupy_set_hooks`, `emm_cupy_malloc`,
//! `emm_cupy_free`), driven by a program of up to 64 calls read from the input
//! over the stand-in driver. Sizes, devices and addresses are fuzzed; the hooks
//! given are this target's stand-ins for CuPy's current-stream function (which
//! returns what the input chose: no stream, the legacy or the per-thread default
//! stream, or -1 with "a Python exception set") and for `PyErr_SetString` (which
//! records what was raised), or null.
//!
//! Checked after every call: without hooks, a null address and a failure; with
//! them, an address, or `EMM_CUPY_FAILED` with exactly one exception raised
//! (none when the stream function failed: CuPy raises its own), of the
//! out-of-memory type when the status says out of memory and of the error type
//! otherwise, with a message; a block handed out overlaps no block held; a block
//! held is freed when asked on its device, and an address not held is refused;
//! hooks refused leave the ones in force. At the end every block is freed and
//! the devices' allocated bytes are back where they were.

use std::ffi::{c_char, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;

use emm_capi::*;

use crate::abi::{device, hooks_allocated, lock, program, serial, status, Blocks};
use crate::cursor::Cursor;

/// The type objects a program may give, as (out of memory, other error):
/// addresses only, never read.
const TYPES: [(usize, usize); 2] = [(0x1000, 0x2000), (0x3000, 0x4000)];

/// What the stand-in for CuPy's current-stream function returns.
static STREAM: AtomicIsize = AtomicIsize::new(0);

/// The exceptions raised through the stand-in for `PyErr_SetString`: type and
/// message.
static RAISED: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());

/// The type pair of the hooks in force, once this process set any.
static IN_FORCE: Mutex<Option<(usize, usize)>> = Mutex::new(None);

unsafe extern "C" fn current_stream() -> isize {
    STREAM.load(Ordering::Relaxed)
}

/// # Safety
/// `msg` is a NUL-terminated string (emm's contract for `raise`).
unsafe extern "C" fn raise(exc_type: *mut c_void, msg: *const c_char) {
    // SAFETY: emm passes a NUL-terminated string that outlives the call.
    let msg = unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    lock(&RAISED).push((exc_type as usize, msg));
}

/// A size as CuPy passes it (`size_t`): none, small, large or past any device.
fn size(c: &mut Cursor<'_>) -> usize {
    match c.u8() % 8 {
        0 => 0,
        1 => usize::MAX >> (c.u8() % 8),
        2 => (1usize << (c.u8() % 36)) + usize::from(c.u8()),
        _ => usize::from(c.u8()) * 4096 + usize::from(c.u8()),
    }
}

/// Runs the program in `data` against CuPy's allocator.
pub fn cupy_hooks(data: &[u8]) {
    let _one = serial();
    let before = hooks_allocated();
    let mut held = Blocks::default();
    program(data, |c| step(c, &mut held));
    for (ptr, device, _) in held.0.drain(..) {
        emm_cupy_free(null_mut(), ptr as *mut c_void, device);
        let code = emm_last_error_code();
        status("emm_cupy_free (end)", code);
        assert_eq!(code, EMM_OK, "a held block of device {device} not freed");
    }
    assert_eq!(
        hooks_allocated(),
        before,
        "allocated bytes after freeing everything"
    );
}

fn step(c: &mut Cursor<'_>, held: &mut Blocks) {
    match c.u8() % 8 {
        0..=3 => malloc(c, held),
        4 | 5 => free(c, held),
        6 => set_hooks(c),
        _ => {
            // Null and the failure value: ignored, whatever the device.
            let p = [null_mut(), EMM_CUPY_FAILED as *mut c_void][usize::from(c.u8() % 2)];
            emm_cupy_free(null_mut(), p, device(c));
        }
    }
}

fn malloc(c: &mut Cursor<'_>, held: &mut Blocks) {
    let stream = [0, 1, 2, -1][usize::from(c.u8() % 4)];
    let (n, d) = (size(c), device(c));
    STREAM.store(stream, Ordering::Relaxed);
    lock(&RAISED).clear();
    let p = emm_cupy_malloc(null_mut(), n, d);
    let raised = std::mem::take(&mut *lock(&RAISED));
    let Some((oom_type, error_type)) = *lock(&IN_FORCE) else {
        // No hooks yet in this process (no other target sets them).
        assert!(p.is_null(), "{p:p} without hooks");
        status("emm_cupy_malloc (no hooks)", emm_last_error_code());
        assert_eq!(emm_last_error_code(), EMM_ERR_INVALID_ARGUMENT);
        assert!(raised.is_empty(), "raised without hooks: {raised:?}");
        return;
    };
    if stream == -1 {
        assert_eq!(p as isize, EMM_CUPY_FAILED, "an address without a stream");
        assert!(raised.is_empty(), "raised over CuPy's own: {raised:?}");
        return;
    }
    if p as isize == EMM_CUPY_FAILED {
        let code = emm_last_error_code();
        status("emm_cupy_malloc", code);
        assert_ne!(code, EMM_OK, "a failure with status 0");
        let want = if code == EMM_ERR_OUT_OF_MEMORY {
            oom_type
        } else {
            error_type
        };
        assert_eq!(raised.len(), 1, "one exception per failure: {raised:?}");
        assert_eq!(raised[0].0, want, "the type raised for status {code}");
        assert!(!raised[0].1.is_empty(), "an exception without a message");
        return;
    }
    assert!(raised.is_empty(), "raised with an address: {raised:?}");
    assert!(n == 0 || !p.is_null(), "a null block for {n} bytes");
    if n > 0 {
        held.take(p as u64, d, n);
    }
}

fn free(c: &mut Cursor<'_>, held: &mut Blocks) {
    let pick = c.u8();
    let (ptr, d, mine) = if pick % 4 != 0 && !held.0.is_empty() {
        let (p, d, _) = held.0[usize::from(pick) % held.0.len()];
        // Its own device most of the time, else any.
        let d = if c.u8() % 4 != 0 { d } else { device(c) };
        (p, d, held.0.iter().any(|&(q, e, _)| q == p && e == d))
    } else {
        let p = c.u64() | 1; // never null, never a block's (aligned) address
        (p, device(c), false)
    };
    if ptr as isize == EMM_CUPY_FAILED {
        return;
    }
    emm_cupy_free(null_mut(), ptr as *mut c_void, d);
    let code = emm_last_error_code();
    status("emm_cupy_free", code);
    if mine {
        assert_eq!(code, EMM_OK, "a held block not freed on its device");
        held.0.retain(|&(p, _, _)| p != ptr);
    } else {
        assert_ne!(code, EMM_OK, "{ptr:#x} freed on device {d}, not held there");
    }
}

fn set_hooks(c: &mut Cursor<'_>) {
    let (oom, error) = TYPES[usize::from(c.u8() % 2)];
    let pick = c.u8() % 8;
    // The type objects are addresses emm only passes back to `raise`.
    let code = match pick {
        0 => emm_cupy_set_hooks(None, Some(raise), oom as *mut c_void, error as *mut c_void),
        1 => emm_cupy_set_hooks(
            Some(current_stream),
            None,
            oom as *mut c_void,
            error as *mut c_void,
        ),
        2 => emm_cupy_set_hooks(
            Some(current_stream),
            Some(raise),
            null_mut(),
            error as *mut c_void,
        ),
        3 => emm_cupy_set_hooks(
            Some(current_stream),
            Some(raise),
            oom as *mut c_void,
            null_mut(),
        ),
        _ => emm_cupy_set_hooks(
            Some(current_stream),
            Some(raise),
            oom as *mut c_void,
            error as *mut c_void,
        ),
    };
    status("emm_cupy_set_hooks", code);
    if pick < 4 {
        assert_eq!(code, EMM_ERR_INVALID_ARGUMENT, "hooks with a null accepted");
    } else {
        assert_eq!(code, EMM_OK, "hooks refused");
        *lock(&IN_FORCE) = Some((oom, error));
    }
}

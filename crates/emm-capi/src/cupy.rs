//! CuPy's C-function allocator (`emm_cupy_set_hooks`, `emm_cupy_malloc`,
//! `emm_cupy_free`), over the bridge's devices.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use emm_sys::CUstream;

use crate::guard::guard;
use crate::status::{emm_status, invalid, EMM_ERR_INVALID_ARGUMENT, EMM_ERR_OUT_OF_MEMORY, EMM_OK};

use crate::bridge::devices::*;

/// Raises a Python exception of `type` with message `msg` (CPython's
/// `PyErr_SetString`); called with the GIL held.
pub type emm_raise_fn = Option<unsafe extern "C" fn(exc_type: *mut c_void, msg: *const c_char)>;

/// Returns CuPy's current stream, or -1 with a Python exception set (the C function
/// behind `cupy_backends.cuda.stream.get_current_stream_ptr`); called with the GIL
/// held.
pub type emm_stream_fn = Option<unsafe extern "C" fn() -> isize>;

/// What `emm_cupy_malloc` needs from the Python side, set once by
/// `emm_cupy_set_hooks`.
struct CupyHooks {
    current_stream: unsafe extern "C" fn() -> isize,
    raise: unsafe extern "C" fn(*mut c_void, *const c_char),
    oom_type: *mut c_void,
    error_type: *mut c_void,
}

impl CupyHooks {
    /// Whether `self` holds the same functions and types as `other`, by address.
    fn same(&self, other: &CupyHooks) -> bool {
        self.current_stream as usize == other.current_stream as usize
            && self.raise as usize == other.raise as usize
            && self.oom_type == other.oom_type
            && self.error_type == other.error_type
    }
}

/// The hooks in force, one of [`MADE`]'s.
static CUPY_HOOKS: AtomicPtr<CupyHooks> = AtomicPtr::new(core::ptr::null_mut());

/// Every set of hooks `emm_cupy_set_hooks` was given, each made once and never
/// freed, so a reader never sees freed hooks: a few bytes for each different
/// set, however often sets are given again.
static MADE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The address `emm_cupy_malloc` returns on failure, with a Python exception set
/// (`(void *)EMM_CUPY_FAILED`): CuPy's `_call_malloc` returns `intptr_t` and checks
/// for an exception when it is -1.
pub const EMM_CUPY_FAILED: isize = -1;

/// Gives `emm_cupy_malloc` CuPy's current-stream function and the means to raise
/// Python exceptions: `raise` (CPython's `PyErr_SetString`) with `oom_type` for out
/// of memory and `error_type` for other failures (Python type objects, which the
/// caller keeps alive for the life of the process). Giving the hooks in force
/// again changes nothing; each different set given is kept for the life of the
/// process (a few bytes), so a reader never sees freed hooks.
#[no_mangle]
pub extern "C" fn emm_cupy_set_hooks(
    current_stream: emm_stream_fn,
    raise: emm_raise_fn,
    oom_type: *mut c_void,
    error_type: *mut c_void,
) -> emm_status {
    guard(|| {
        let (Some(current_stream), Some(raise)) = (current_stream, raise) else {
            return invalid("emm_cupy_set_hooks: `current_stream` or `raise` is null");
        };
        if oom_type.is_null() || error_type.is_null() {
            return invalid("emm_cupy_set_hooks: `oom_type` or `error_type` is null");
        }
        let hooks = CupyHooks {
            current_stream,
            raise,
            oom_type,
            error_type,
        };
        let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
        let known = made.iter().find(|&&p| {
            // SAFETY: the addresses in MADE come from Box::into_raw and are never
            // freed.
            unsafe { &*(p as *const CupyHooks) }.same(&hooks)
        });
        let p = match known {
            Some(&p) => p as *mut CupyHooks,
            None => {
                let p = Box::into_raw(Box::new(hooks));
                made.push(p as usize);
                p
            }
        };
        CUPY_HOOKS.store(p, Ordering::Release);
        EMM_OK
    })
}

/// CuPy's C-function allocator (`cupy.cuda.memory.CFunctionAllocator`): `size`
/// bytes on `device`, ordered on CuPy's current stream. `param` is unused. Called by
/// CuPy with the GIL held. On failure returns `EMM_CUPY_FAILED` (-1 as an address)
/// with a Python exception set (out of memory: the `oom_type` of
/// `emm_cupy_set_hooks`); null when no hooks were set (nothing can be raised then:
/// only the Python bindings install this function, after setting the hooks).
///
/// The GIL stays held for the whole allocation, as around CuPy's own pool: the
/// pool's out-of-memory ladder synchronizes the device, so a pending host callback
/// on a stream that needs the GIL (`Stream.launch_host_func` with a Python
/// function) would wait on it; CuPy's `cudaFree` under its own pool has the same
/// hazard.
#[no_mangle]
pub extern "C" fn emm_cupy_malloc(param: *mut c_void, size: usize, device: c_int) -> *mut c_void {
    let _ = param; // CuPy's opaque argument; emm's state is process-wide
    let hooks = CUPY_HOOKS.load(Ordering::Acquire);
    if hooks.is_null() {
        set_no_hooks();
        return core::ptr::null_mut();
    }
    // SAFETY: non-null pointers in CUPY_HOOKS are MADE's, which are never freed.
    let hooks = unsafe { &*hooks };
    // SAFETY: the function was given by emm_cupy_set_hooks as CuPy's current-stream
    // function; CuPy calls this allocator with the GIL held, as that function needs.
    let stream = unsafe { (hooks.current_stream)() };
    if stream == -1 {
        // The stream function set a Python exception: let CuPy raise it.
        return EMM_CUPY_FAILED as *mut c_void;
    }
    let mut out = Err(EMM_OK);
    let code = guard(
        || match live_alloc(device, size, CUstream(stream as *mut c_void)) {
            Ok(p) => {
                out = Ok(p);
                EMM_OK
            }
            Err(code) => code,
        },
    );
    match out {
        Ok(p) => p as *mut c_void,
        Err(_) => {
            let exc = if code == EMM_ERR_OUT_OF_MEMORY {
                hooks.oom_type
            } else {
                hooks.error_type
            };
            let msg = crate::status::last_error_message();
            let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
            // SAFETY: `raise` is PyErr_SetString per emm_cupy_set_hooks, called with
            // the GIL held (CuPy holds it around its allocator) with a live type
            // object and a NUL-terminated string that outlives the call.
            unsafe { (hooks.raise)(exc, msg.as_ptr()) };
            EMM_CUPY_FAILED as *mut c_void
        }
    }
}

fn set_no_hooks() {
    crate::status::set_error(
        EMM_ERR_INVALID_ARGUMENT,
        "emm_cupy_malloc: emm_cupy_set_hooks was not called".into(),
    );
}

/// CuPy's C-function allocator: frees `ptr` (from `emm_cupy_malloc`) on the stream
/// it was allocated on, as CuPy's own pool does. Null and `EMM_CUPY_FAILED` are
/// ignored; an address emm did not hand out is reported through emm's log
/// (`emm_last_error` too), as CuPy's free returns nothing.
#[no_mangle]
pub extern "C" fn emm_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let _ = param; // CuPy's opaque argument; emm's state is process-wide
    if ptr.is_null() || ptr as isize == EMM_CUPY_FAILED {
        return;
    }
    let code = guard(|| live_free("emm_cupy_free", device, ptr as u64, None));
    if code != EMM_OK {
        let msg = crate::status::last_error_message();
        tracing::error!("CuPy freed memory emm could not free: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn stream() -> isize {
        0
    }

    unsafe extern "C" fn raise(_: *mut c_void, _: *const c_char) {}

    /// The only test of this binary that sets the (process-wide) hooks.
    #[test]
    fn hooks_given_again_make_nothing_new_and_different_ones_replace_them() {
        let (oom, error) = (8usize as *mut c_void, 16usize as *mut c_void);
        let set = |error: *mut c_void| {
            assert_eq!(
                emm_cupy_set_hooks(Some(stream), Some(raise), oom, error),
                EMM_OK
            );
            CUPY_HOOKS.load(Ordering::Acquire)
        };
        let first = set(error);
        assert!(!first.is_null());
        for _ in 0..3 {
            assert_eq!(set(error), first, "the same hooks made new ones");
        }
        let other = set(oom);
        assert_ne!(other, first, "different hooks did not replace the old");
        // SAFETY: non-null pointers in CUPY_HOOKS are never freed.
        assert_eq!(unsafe { &*other }.error_type, oom);
        for _ in 0..3 {
            assert_eq!(set(error), first, "a set given again was made again");
            assert_eq!(set(oom), other, "a set given again was made again");
        }
        assert_eq!(MADE.lock().unwrap().len(), 2);
    }
}

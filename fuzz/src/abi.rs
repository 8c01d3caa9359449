//! What the targets that call the C ABI share: a program of calls read from the
//! input ([`program`]), a call's status checked ([`status`]), `emm_last_error`'s
//! message ([`message`]), one such target at a time ([`serial`]), a device as a
//! caller may pass one ([`device`]), the blocks an input holds ([`Blocks`]), and
//! the framework hooks' allocated bytes ([`hooks_allocated`]).

use std::ffi::{c_char, c_int};
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard, OnceLock};

use emm_capi::*;

use crate::cursor::Cursor;

/// `emm_last_error`'s message.
pub(crate) fn message() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` holds 256 writable bytes.
    let n = unsafe { emm_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8_lossy(&buf[..n.min(255)]).into_owned()
}

/// A call's status is a typed one; a failure names itself.
#[track_caller]
pub(crate) fn status(what: &str, code: emm_status) {
    static TRACE: OnceLock<bool> = OnceLock::new();
    if *TRACE.get_or_init(|| std::env::var_os("EMM_FUZZ_TRACE").is_some()) {
        eprintln!(
            "{what}: {code} {}",
            if code == EMM_OK {
                String::new()
            } else {
                message()
            }
        );
    }
    assert_ne!(code, EMM_ERR_PANIC, "{what}: {}", message());
    assert_ne!(code, EMM_ERR_INTERNAL, "{what}: {}", message());
    if code != EMM_OK {
        assert!((1..=10).contains(&code), "{what}: unknown status {code}");
        assert_eq!(emm_last_error_code(), code, "{what}: last error code");
        assert!(!message().is_empty(), "{what}: a failure without a message");
    }
}

/// One C ABI target at a time: the targets share the process's managers (the
/// C ABI's pool on device 0, the framework hooks' devices), whose allocated
/// bytes each checks at its end (the replay test runs them on parallel
/// threads).
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    lock(&SERIAL)
}

/// `m`'s guard, also after a panic while it was held (a finding in another
/// input must not fail every later one).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Device 0's allocated bytes of the devices behind the framework hooks (read
/// through `emm_torch_memory_stats`; CuPy's allocator uses the same devices).
pub(crate) fn hooks_allocated() -> u64 {
    let keys: [*const c_char; 1] = [c"allocated_bytes.all.current".as_ptr()];
    let mut value = 0u64;
    // SAFETY: one name, room for one value; `found` may be null.
    let code = unsafe { emm_torch_memory_stats(0, keys.as_ptr(), &mut value, 1, null_mut()) };
    status("emm_torch_memory_stats", code);
    value
}

/// Runs `step` over `data` until the input is read or 64 steps ran.
pub(crate) fn program(data: &[u8], mut step: impl FnMut(&mut Cursor<'_>)) {
    let mut c = Cursor(data);
    let mut steps = 0;
    while !c.done() && steps < 64 {
        steps += 1;
        step(&mut c);
    }
}

/// A device: 0 most of the time, else one the stand-in may not have.
pub(crate) fn device(c: &mut Cursor<'_>) -> c_int {
    match c.u8() % 8 {
        0 => -1,
        1 => 1,
        2 => c.u64() as c_int,
        _ => 0,
    }
}

/// The blocks an input holds: address, device, bytes.
#[derive(Default)]
pub(crate) struct Blocks(pub(crate) Vec<(u64, c_int, usize)>);

impl Blocks {
    /// A block handed out: it must not overlap any held on its device.
    pub(crate) fn take(&mut self, ptr: u64, device: c_int, size: usize) {
        for &(p, d, n) in &self.0 {
            assert!(
                d != device || ptr + size as u64 <= p || p + n as u64 <= ptr,
                "[{ptr:#x}, +{size}) overlaps the held [{p:#x}, +{n}) on device {device}"
            );
        }
        self.0.push((ptr, device, size));
    }
}

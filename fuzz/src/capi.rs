//! The C ABI's argument checks: a small program read from the input calls
//! `emm_capi`'s functions with fuzzed sizes, offsets, lengths, strings, ranks,
//! indices, handles and pointers, over the stand-in driver (host memory). Every
//! buffer handed over is as large as the length passed with it (the C contract);
//! the values themselves are anything.
//!
//! Checked after every call: no `EMM_ERR_PANIC` or `EMM_ERR_INTERNAL`, and a
//! failure leaves its code and a message for `emm_last_error`. At the end of an
//! input everything it allocated is freed, and the manager's allocated bytes are
//! back where they were. `EMM_FUZZ_TRACE=1` prints each call's status.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use emm_capi::*;

use crate::abi::{message, program, serial, status};
use crate::cursor::Cursor;

/// The manager every input works on: the process's `pool` on device 0, made once.
fn manager() -> *mut emm_manager {
    static M: OnceLock<usize> = OnceLock::new();
    *M.get_or_init(|| {
        let mut m: *mut emm_manager = null_mut();
        // SAFETY: `m` is a live local; the name is a NUL-terminated literal.
        let code = unsafe { emm_manager_create(c"pool".as_ptr(), 0, &mut m) };
        assert_eq!(code, EMM_OK, "no manager on the stand-in: {}", message());
        m as usize
    }) as *mut emm_manager
}

fn allocated(m: *mut emm_manager) -> u64 {
    let mut s = emm_stats::default();
    // SAFETY: `s` is a live local.
    status("emm_get_stats", unsafe { emm_get_stats(m, &mut s) });
    s.allocated_bytes
}

/// What an input holds at a time (all released at its end).
#[derive(Default)]
struct Held {
    device: Vec<u64>,
    host: Vec<*mut c_void>,
    arrays: Vec<*mut emm_array>,
    exported: Vec<Vec<u8>>,
}

impl Held {
    /// A pointer to pass: one this input holds, or any value.
    fn pointer(&self, c: &mut Cursor<'_>) -> u64 {
        let pick = c.u8();
        if pick % 2 == 0 && !self.device.is_empty() {
            let p = self.device[usize::from(pick / 2) % self.device.len()];
            p.wrapping_add(u64::from(c.u8() % 4) * u64::from(c.u8()))
        } else {
            c.u64()
        }
    }
    fn array(&self, c: &mut Cursor<'_>) -> *mut emm_array {
        let pick = c.u8();
        match self.arrays.len() {
            0 => pick as usize as *mut emm_array,
            n if pick < 240 => self.arrays[usize::from(pick) % n],
            _ => (c.u64() as usize) as *mut emm_array,
        }
    }
}

/// Runs the program in `data` against the C ABI.
pub fn capi_args(data: &[u8]) {
    let _one = serial();
    let m = manager();
    let before = allocated(m);
    let mut held = Held::default();
    program(data, |c| {
        // SAFETY: every pointer passed is null, a live local or buffer at least as
        // large as the length passed with it, or a handle/address value that the
        // C ABI looks up before any use (its contract for foreign values).
        unsafe { step(m, c, &mut held) };
    });
    // SAFETY: as in the loop: each pointer and handle is this input's own.
    unsafe {
        for p in held.device.drain(..) {
            status("emm_free (end)", emm_free(m, p, null_mut()));
        }
        for h in held.host.drain(..) {
            status("emm_host_free (end)", emm_host_free(m, h));
        }
        for a in held.arrays.drain(..) {
            emm_array_destroy(a);
            status("emm_array_destroy (end)", emm_last_error_code());
        }
    }
    assert_eq!(
        allocated(m),
        before,
        "allocated bytes after freeing everything"
    );
}

unsafe fn step(m: *mut emm_manager, c: &mut Cursor<'_>, held: &mut Held) {
    match c.u8() % 20 {
        0 => {
            let (k, v) = (c.string(), c.string());
            let key = if c.u8() == 0 { null() } else { k.as_ptr() };
            // SAFETY: NUL-terminated strings (or null).
            status("emm_configure", unsafe { emm_configure(key, v.as_ptr()) });
        }
        1 => {
            let name = c.string();
            let device = c.u64() as c_int;
            let name_ptr = if c.u8() % 4 == 0 {
                null()
            } else {
                name.as_ptr()
            };
            let mut out: *mut emm_manager = null_mut();
            let out_ptr: *mut *mut emm_manager = if c.u8() == 0 { null_mut() } else { &mut out };
            // SAFETY: a NUL-terminated name (or null); `out` a live local (or null).
            let code = unsafe { emm_manager_create(name_ptr, device, out_ptr) };
            status("emm_manager_create", code);
            if code == EMM_OK {
                assert!(!out.is_null());
                // SAFETY: a handle just created, destroyed once.
                unsafe { emm_manager_destroy(out) };
                status("emm_manager_destroy", emm_last_error_code());
            }
        }
        2 => {
            let size = c.size();
            let mut p = 0u64;
            // SAFETY: `p` is a live local.
            let code = unsafe { emm_alloc(m, size, null_mut(), &mut p) };
            status("emm_alloc", code);
            if code == EMM_OK && size > 0 {
                assert_ne!(p, 0, "an allocation of {size} bytes at 0");
                held.device.push(p);
            }
        }
        3 => {
            let p = held.pointer(c);
            // SAFETY: any address value is looked up first.
            let code = unsafe { emm_free(m, p, null_mut()) };
            status("emm_free", code);
            if code == EMM_OK {
                held.device.retain(|&q| q != p);
            } else {
                assert!(
                    !held.device.contains(&p),
                    "emm_free refused a live allocation: {}",
                    message()
                );
            }
        }
        4 => {
            let p = held.pointer(c);
            let (offset, len) = (c.size(), c.size());
            let cap = usize::from(c.u8());
            let mut buf = vec![0u8; cap];
            let buf_ptr = if c.u8() % 4 == 0 {
                null_mut()
            } else {
                buf.as_mut_ptr()
            };
            let mut written = 0usize;
            // SAFETY: `buf` holds `cap` bytes (or is null); `written` is a live local.
            let code = unsafe { emm_ipc_export(m, p, offset, len, buf_ptr, cap, &mut written) };
            status("emm_ipc_export", code);
            if code == EMM_OK && !buf_ptr.is_null() {
                assert!(written <= cap);
                buf.truncate(written);
                let h = emm_core::IpcHandle::from_bytes(&buf);
                assert!(h.is_ok(), "an exported handle does not decode: {h:?}");
                held.exported.push(buf);
            }
        }
        5 => {
            let mut bytes = match held.exported.len() {
                n if n > 0 && c.u8() % 2 == 0 => held.exported[usize::from(c.u8()) % n].clone(),
                _ => c.bytes(255),
            };
            if let Some(b) = bytes.get_mut(usize::from(c.u8())) {
                *b ^= c.u8();
            }
            let mut p = 0u64;
            // SAFETY: `bytes` holds `len` bytes; `p` a live local.
            let code = unsafe { emm_ipc_open(m, bytes.as_ptr(), bytes.len(), &mut p) };
            status("emm_ipc_open", code);
            if code == EMM_OK {
                // SAFETY: memory this handle just opened.
                status("emm_ipc_close", unsafe { emm_ipc_close(m, p) });
            }
        }
        6 => {
            let p = held.pointer(c);
            // SAFETY: any address value is looked up first.
            status("emm_ipc_close", unsafe { emm_ipc_close(m, p) });
        }
        7 => {
            let len = usize::from(c.u8());
            let mut buf = vec![0x55 as c_char; len];
            let ptr = if c.u8() % 4 == 0 {
                null_mut()
            } else {
                buf.as_mut_ptr()
            };
            // SAFETY: `buf` holds `len` bytes (or is null).
            let n = unsafe { emm_last_error(ptr, len) };
            if !ptr.is_null() && len > 0 {
                let nul = buf.iter().position(|&b| b == 0);
                assert_eq!(nul, Some(n.min(len - 1)), "emm_last_error's terminator");
            }
        }
        8 => {
            let key = c.string();
            let mut v = 0u64;
            let out: *mut u64 = if c.u8() == 0 { null_mut() } else { &mut v };
            // SAFETY: a NUL-terminated key; `v` a live local (or null).
            status("emm_memory_stat", unsafe {
                emm_memory_stat(m, key.as_ptr(), out)
            });
        }
        9 => {
            let len = usize::from(c.u8());
            let mut buf = vec![0x55 as c_char; len];
            let ptr = if c.u8() % 4 == 0 {
                null_mut()
            } else {
                buf.as_mut_ptr()
            };
            let mut written = 0usize;
            // SAFETY: `buf` holds `len` bytes (or is null); `written` a live local.
            let code = unsafe { emm_manager_report(m, ptr, len, &mut written) };
            status("emm_manager_report", code);
            if code == EMM_OK && !ptr.is_null() && len > 0 {
                let nul = buf.iter().position(|&b| b == 0);
                assert_eq!(nul, Some(written.min(len - 1)), "the report's terminator");
            }
        }
        10 => {
            let size = c.size() % (1 << 20);
            let flags = u32::from(c.u8());
            let mut host: *mut c_void = null_mut();
            let mut dev = 0u64;
            // SAFETY: live locals.
            let code = unsafe { emm_host_alloc(m, size, flags, &mut host, &mut dev) };
            status("emm_host_alloc", code);
            if code == EMM_OK {
                held.host.push(host);
            }
        }
        11 => {
            let h = match held.host.pop() {
                Some(h) if c.u8() % 2 == 0 => h,
                other => {
                    held.host.extend(other);
                    c.u64() as usize as *mut c_void
                }
            };
            let was_held = held.host.contains(&h);
            // SAFETY: any address value is looked up first.
            let code = unsafe { emm_host_free(m, h) };
            status("emm_host_free", code);
            assert!(!was_held || code == EMM_OK);
            held.host.retain(|&x| x != h);
        }
        12 => {
            let (code_, bits) = (c.u8() % 8, c.u8());
            let rank = match c.u8() % 8 {
                7 => c.u64() as c_int,
                r => c_int::from(r) - 1,
            };
            let mut shape = [0usize; 4];
            for s in &mut shape {
                // Small, or too large for any machine: an array the stand-in
                // could map lazily but that emm then zeroes (a 100 GiB one) would
                // only measure memset.
                *s = match c.u8() % 8 {
                    0 => {
                        [1 << 62, isize::MAX as usize, 1 << 63, usize::MAX][usize::from(c.u8() % 4)]
                    }
                    1 => 0,
                    _ => usize::from(c.u8() % 16),
                };
            }
            let with_manager = c.u8() % 2 == 0;
            let mgr = if with_manager { m } else { null_mut() };
            let mut out: *mut emm_array = null_mut();
            // SAFETY: `shape` holds 4 >= any accepted rank extents; `out` a live local.
            let code =
                unsafe { emm_array_create(mgr, code_, bits, rank, shape.as_ptr(), &mut out) };
            status("emm_array_create", code);
            if code == EMM_OK {
                held.arrays.push(out);
            }
        }
        13 => {
            let a = held.array(c);
            let rank = match c.u8() % 8 {
                7 => c.u64() as c_int,
                r => c_int::from(r) - 1,
            };
            let mut idx = [0usize; 8];
            for i in &mut idx {
                *i = if c.u8() % 4 == 0 {
                    c.usize()
                } else {
                    usize::from(c.u8() % 16)
                };
            }
            let size = usize::from(c.u8() % 33);
            let mut buf = [0u8; 32];
            // SAFETY: `idx` holds 8 indices (more than any accepted rank), `buf`
            // 32 >= `size` bytes; the handle is looked up first.
            let code = unsafe {
                if c.u8() % 2 == 0 {
                    emm_array_get(a, idx.as_ptr(), rank, buf.as_mut_ptr().cast(), size)
                } else {
                    emm_array_set(a, idx.as_ptr(), rank, buf.as_ptr().cast(), size)
                }
            };
            status("emm_array_get/set", code);
        }
        14 => {
            let a = held.array(c);
            let mut id = 0u64;
            // SAFETY: `id` a live local; the handle is looked up first.
            let code = unsafe { emm_array_lock(a, &mut id) };
            status("emm_array_lock", code);
            let unlock = if c.u8() % 2 == 0 { id } else { c.u64() };
            // SAFETY: the handle is looked up first.
            status("emm_array_unlock", unsafe { emm_array_unlock(a, unlock) });
            if code == EMM_OK && unlock != id {
                // SAFETY: as above.
                status("emm_array_unlock", unsafe { emm_array_unlock(a, id) });
            }
        }
        15 => {
            let a = held.array(c);
            let versioned = c_int::from(c.u8() % 2);
            let mut t: *mut c_void = null_mut();
            // SAFETY: `t` a live local; the handle is looked up first.
            let code = unsafe { emm_array_to_dlpack(a, versioned, &mut t) };
            status("emm_array_to_dlpack", code);
            if code == EMM_OK {
                // SAFETY: an export just made with this `versioned`, deleted once.
                unsafe { emm_dlpack_delete(t, versioned) };
            }
        }
        16 => {
            let a = held.array(c);
            let side = match c.u8() % 4 {
                3 => c.u64() as c_int,
                s => c_int::from(s),
            };
            let mut moved = 0;
            // SAFETY: `moved` a live local; the handle is looked up first.
            let code = unsafe { emm_array_move(a, side, null_mut(), 1, &mut moved) };
            status("emm_array_move", code);
        }
        17 => {
            let a = held.array(c);
            let live = held.arrays.contains(&a);
            // SAFETY: the handle is looked up first.
            unsafe { emm_array_destroy(a) };
            let code = emm_last_error_code();
            status("emm_array_destroy", code);
            assert_eq!(code == EMM_OK, live || a.is_null(), "destroying {a:p}");
            held.arrays.retain(|&x| x != a);
        }
        18 => {
            let n = usize::from(c.u8());
            // SAFETY: the manager handle is live.
            let code = unsafe { emm_record_memory_history(m, n) };
            status("emm_record_memory_history", code);
            let mut s: *mut c_char = null_mut();
            let mut len = 0usize;
            // SAFETY: live locals; the string is freed once.
            unsafe {
                let code = if c.u8() % 2 == 0 {
                    emm_memory_snapshot_json(m, &mut s, &mut len)
                } else {
                    emm_memory_stats_json(m, &mut s, &mut len)
                };
                status("emm_memory_*_json", code);
                if code == EMM_OK {
                    let text = std::ffi::CStr::from_ptr(s).to_bytes();
                    assert_eq!(text.len(), len);
                    assert_eq!(text.first(), Some(&b'{'));
                }
                emm_string_free(s);
            }
        }
        _ => {
            let (mut free, mut total, mut released) = (0usize, 0usize, 0usize);
            // SAFETY: live locals and the live manager; foreign handle values are
            // looked up first.
            unsafe {
                status("emm_memory_info", emm_memory_info(m, &mut free, &mut total));
                status("emm_trim", emm_trim(m, &mut released));
                let foreign = c.u64() as usize as *mut emm_manager;
                let mut p = 0u64;
                let code = emm_alloc(foreign, 64, null_mut(), &mut p);
                status("emm_alloc (foreign handle)", code);
                if foreign != m {
                    assert_eq!(code, EMM_ERR_INVALID_ARGUMENT, "a foreign handle");
                } else if code == EMM_OK {
                    held.device.push(p);
                }
            }
        }
    }
}

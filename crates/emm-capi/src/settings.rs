//! The list of settings, for C and Python: `emm_settings`. Each setting is
//! declared once, by the crate that reads it (`emm_core::setting`); this file
//! only copies their descriptions out.

use std::ffi::{c_char, c_int, CString};
use std::sync::Mutex;

use crate::ffi::write_table;
use crate::guard::guard;
use crate::status::emm_status;

/// One setting, as `emm_settings` describes it. The strings are the library's,
/// NUL-terminated, valid until the process ends; do not free them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct emm_setting {
    /// The key of `emm_configure` (e.g. "pool_limit").
    pub name: *const c_char,
    /// The environment variable that overrides it (e.g. "EMM_POOL_LIMIT").
    pub env: *const c_char,
    /// What the value is: "manager", "bytes", "bytes_or_max", "bool", "count"
    /// or "ratio".
    pub kind: *const c_char,
    /// The default, as users write it ("" where it depends on the device).
    pub default_value: *const c_char,
    /// What it does.
    pub doc: *const c_char,
    /// 1: `emm_configure` may change it while managers serve; 0: before the
    /// first manager only.
    pub runtime: c_int,
}

/// The C strings of one key, kept for the life of the process (a key's strings
/// are made once; the table only grows, with the keys of managers registered
/// later).
struct Interned {
    name: &'static str,
    strings: [CString; 5],
    runtime: bool,
}

static INTERNED: Mutex<Vec<Interned>> = Mutex::new(Vec::new());

fn c_string(s: &str) -> CString {
    // (Keys and docs are Rust literals; a NUL inside one would be cut there.)
    CString::new(s.split('\0').next().unwrap_or_default()).unwrap_or_default()
}

/// Describes every setting `emm_configure` knows: the router's `manager`, then
/// those of the registered managers (the built-in ones are registered first),
/// in the order of the documentation. Writes up to `capacity` entries to `out`
/// and the number of settings to `*count`; call with `capacity` 0 (and `out`
/// NULL) to learn the count. `EMM_ERR_INVALID_ARGUMENT` when `count` is NULL, or
/// `out` is NULL with `capacity` above 0.
#[no_mangle]
pub unsafe extern "C" fn emm_settings(
    out: *mut emm_setting,
    capacity: usize,
    count: *mut usize,
) -> emm_status {
    guard(|| {
        let keys = emm::settings();
        let mut table = INTERNED.lock().unwrap_or_else(|p| p.into_inner());
        let mut entries = Vec::with_capacity(keys.len());
        for k in &keys {
            let at = match table.iter().position(|t| t.name == k.name) {
                Some(at) => at,
                None => {
                    table.push(Interned {
                        name: k.name,
                        strings: [k.name, k.env, k.kind.name(), k.default, k.doc].map(c_string),
                        runtime: k.runtime,
                    });
                    table.len() - 1
                }
            };
            // The strings stay in `INTERNED` for the life of the process.
            let t = &table[at];
            entries.push(emm_setting {
                name: t.strings[0].as_ptr(),
                env: t.strings[1].as_ptr(),
                kind: t.strings[2].as_ptr(),
                default_value: t.strings[3].as_ptr(),
                doc: t.strings[4].as_ptr(),
                runtime: c_int::from(t.runtime),
            });
        }
        // SAFETY: the caller's contract for `out`, `capacity` and `count`.
        unsafe { write_table("emm_settings", &entries, out, capacity, count) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::EMM_OK;
    use std::ffi::CStr;

    fn text(p: *const c_char) -> String {
        // SAFETY: the library's NUL-terminated, process-long strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn every_setting_is_described_and_bad_arguments_are_refused() {
        let mut n = 0usize;
        // SAFETY: a valid `count`, no entries asked for.
        let status = unsafe { emm_settings(core::ptr::null_mut(), 0, &mut n) };
        assert_eq!(status, EMM_OK);
        assert!(n >= 9, "{n}");
        let blank = emm_setting {
            name: core::ptr::null(),
            env: core::ptr::null(),
            kind: core::ptr::null(),
            default_value: core::ptr::null(),
            doc: core::ptr::null(),
            runtime: -1,
        };
        let mut out = vec![blank; n + 2];
        let mut m = 0usize;
        // SAFETY: `out` holds `out.len()` entries.
        let status = unsafe { emm_settings(out.as_mut_ptr(), out.len(), &mut m) };
        assert_eq!(status, EMM_OK);
        assert_eq!(m, n);
        assert!(out[n].name.is_null(), "nothing past the count is written");
        assert_eq!(text(out[0].name), "manager");
        let limit = out[..n]
            .iter()
            .find(|s| text(s.name) == "pool_limit")
            .unwrap();
        assert_eq!(text(limit.env), "EMM_POOL_LIMIT");
        assert_eq!(text(limit.kind), "bytes_or_max");
        assert_eq!(limit.runtime, 1);
        assert!(!text(limit.doc).is_empty());
        for s in &out[..n] {
            assert!(text(s.env).starts_with("EMM_"));
            assert!(matches!(s.runtime, 0 | 1));
        }
        // A second call hands out the same strings.
        let mut again = vec![blank; 1];
        // SAFETY: one entry.
        let status = unsafe { emm_settings(again.as_mut_ptr(), 1, &mut m) };
        assert_eq!(status, EMM_OK);
        assert_eq!(again[0].name, out[0].name);
        // SAFETY: null arguments, refused.
        unsafe {
            assert_eq!(
                emm_settings(core::ptr::null_mut(), 0, core::ptr::null_mut()),
                crate::status::EMM_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                emm_settings(core::ptr::null_mut(), 3, &mut m),
                crate::status::EMM_ERR_INVALID_ARGUMENT
            );
        }
    }
}

//! The statistic names, for C, C++ and Python: `emm_stat_names`, a copy out of
//! emm-core's one table (`emm_core::stat_names::STAT_NAMES`).

use std::ffi::{c_char, c_int, CString};
use std::sync::OnceLock;

use emm_core::stat_names::{is_torch, STAT_NAMES};

use crate::ffi::write_table;
use crate::guard::guard;
use crate::status::emm_status;

/// One statistic name, as `emm_stat_names` describes it. The strings are the
/// library's, NUL-terminated, valid until the process ends; do not free them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct emm_stat_name {
    /// The name `emm_memory_stat`, `emm_memory_stats_json` and
    /// `emm_torch_memory_stats` use (e.g. "reserved_bytes.all.current").
    pub name: *const c_char,
    /// What it counts.
    pub doc: *const c_char,
    /// 1: one of PyTorch's `torch.cuda.memory_stats` keys, same meaning; 0: emm's
    /// own (named `emm.*`).
    pub torch: c_int,
}

fn table() -> &'static [(CString, CString, bool)] {
    static TABLE: OnceLock<Vec<(CString, CString, bool)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let c = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
        STAT_NAMES
            .iter()
            .map(|&(name, doc)| (c(name), c(doc), is_torch(name)))
            .collect()
    })
}

/// Every statistic name a manager may report (which of them a manager reports
/// depends on the manager), with what it counts. Writes up to `capacity`
/// entries to `out` and the number of names to `*count`; call with `capacity` 0
/// (and `out` NULL) to learn the count. `EMM_ERR_INVALID_ARGUMENT` when `count` is
/// NULL, or `out` is NULL with `capacity` above 0.
#[no_mangle]
pub unsafe extern "C" fn emm_stat_names(
    out: *mut emm_stat_name,
    capacity: usize,
    count: *mut usize,
) -> emm_status {
    guard(|| {
        let entries: Vec<emm_stat_name> = table()
            .iter()
            .map(|(name, doc, torch)| emm_stat_name {
                name: name.as_ptr(),
                doc: doc.as_ptr(),
                torch: c_int::from(*torch),
            })
            .collect();
        // SAFETY: the caller's contract for `out`, `capacity` and `count`.
        unsafe { write_table("emm_stat_names", &entries, out, capacity, count) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::EMM_OK;
    use std::ffi::CStr;

    #[test]
    fn the_table_comes_out_whole() {
        let mut n = 0usize;
        // SAFETY: a valid `count`, no entries asked for.
        let status = unsafe { emm_stat_names(core::ptr::null_mut(), 0, &mut n) };
        assert_eq!(status, EMM_OK);
        assert_eq!(n, STAT_NAMES.len());
        let blank = emm_stat_name {
            name: core::ptr::null(),
            doc: core::ptr::null(),
            torch: -1,
        };
        let mut out = vec![blank; n];
        // SAFETY: `out` holds `n` entries.
        let status = unsafe { emm_stat_names(out.as_mut_ptr(), n, &mut n) };
        assert_eq!(status, EMM_OK);
        for (e, &(name, doc)) in out.iter().zip(STAT_NAMES) {
            // SAFETY: the library's NUL-terminated strings.
            let (got, got_doc) = unsafe { (CStr::from_ptr(e.name), CStr::from_ptr(e.doc)) };
            assert_eq!(
                (got.to_str().unwrap(), got_doc.to_str().unwrap()),
                (name, doc)
            );
            assert_eq!(e.torch, c_int::from(!name.starts_with("emm.")));
        }
        // SAFETY: a null `count`, refused.
        let status = unsafe { emm_stat_names(core::ptr::null_mut(), 0, core::ptr::null_mut()) };
        assert_eq!(status, crate::status::EMM_ERR_INVALID_ARGUMENT);
    }
}

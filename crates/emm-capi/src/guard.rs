//! [`guard`], around every entry point: the log output installed on first use,
//! no panic across the boundary, and nothing done in a forked child.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::status::{emm_status, fail, set_error, EMM_ERR_PANIC, EMM_OK, LAST_ERROR};

/// Runs `f`, turning a panic into `EMM_ERR_PANIC`; installs the log output on
/// first use. In a child forked after CUDA was initialised `f` does not run:
/// `EMM_ERR_FORKED` (the managers, handles and tables are the parent's, copied by
/// fork, their locks perhaps held by parent threads that do not exist here).
pub(crate) fn guard(f: impl FnOnce() -> emm_status) -> emm_status {
    if let Err(e) = emm_core::check_not_forked() {
        return fail(e);
    }
    match catch_unwind(AssertUnwindSafe(|| {
        crate::log::init();
        f()
    })) {
        Ok(code) => {
            if code == EMM_OK {
                let _ = LAST_ERROR.try_with(|e| e.borrow_mut().0 = EMM_OK);
            }
            code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_error(
                EMM_ERR_PANIC,
                format!("a panic was caught at the C boundary (a bug in emm): {what}"),
            )
        }
    }
}

//! Soak (issue 36 item 5) through the C ABI: the engine of
//! `crates/emm/tests/common/soak.rs` (random allocate, free, stream, trim and
//! limit churn from several threads over the stand-in, invariants after every
//! phase) driving `emm_alloc`, `emm_free`, `emm_trim` and `emm_get_stats` on the
//! process's `pool` manager.
//!
//! Short in CI (`EMM_SOAK_SECS`, default 8 s); `EMM_SOAK_SEED` replays a seed.

use std::ptr::null_mut;

use emm_capi::*;
use emm_sys::CUstream;

mod common;
use common::{last_message, serial, standin};

#[path = "../../emm/tests/common/soak.rs"]
mod soak;
use soak::{Config, Target};

/// Seconds by default: within CI's minute with the façade's soak.
const CI_SECS: u64 = 8;

/// The C ABI's manager handle (the process's `pool`).
struct Capi(*mut emm_manager);

// SAFETY: the C ABI's handles may be used from any thread (its contract).
unsafe impl Sync for Capi {}

fn status(what: &str, code: emm_status) -> Result<(), String> {
    if code == EMM_OK {
        Ok(())
    } else {
        Err(format!("{what}: status {code}: {}", last_message()))
    }
}

impl Target for Capi {
    fn alloc(&self, size: usize, stream: CUstream) -> Result<u64, String> {
        let mut ptr = 0u64;
        // SAFETY: a live handle and out-pointer.
        status("emm_alloc", unsafe {
            emm_alloc(self.0, size, stream.0, &mut ptr)
        })?;
        Ok(ptr)
    }
    fn free(&self, ptr: u64, _size: usize, stream: CUstream) -> Result<(), String> {
        // SAFETY: `ptr` came from `emm_alloc` of this handle and is freed once.
        status("emm_free", unsafe { emm_free(self.0, ptr, stream.0) })
    }
    fn trim(&self) -> Result<(), String> {
        let mut released = 0usize;
        // SAFETY: a live handle and out-pointer.
        let code = unsafe { emm_trim(self.0, &mut released) };
        if code == EMM_OK {
            return Ok(());
        }
        // A refused free may be reported by the first call after it.
        // SAFETY: as above.
        status("emm_trim", unsafe { emm_trim(self.0, &mut released) })
    }
    fn bytes(&self) -> Result<(u64, u64), String> {
        let mut st = emm_stats::default();
        // SAFETY: a live handle and out-pointer.
        status("emm_get_stats", unsafe { emm_get_stats(self.0, &mut st) })?;
        Ok((st.allocated_bytes, st.reserved_bytes))
    }
}

#[test]
fn soak_the_c_abi() {
    let _serial = serial();
    let s = standin();
    s.reset().unwrap();
    s.control("capacity 8G").unwrap();
    let ctx = emm_driver::Context::on_device(0).unwrap();
    let cfg = Config::from_env(CI_SECS);
    let base = s.control("live_bytes").unwrap();
    let mut m: *mut emm_manager = null_mut();
    // SAFETY: a live out-pointer.
    let code = unsafe { emm_manager_create(c"pool".as_ptr(), 0, &mut m) };
    assert_eq!(code, EMM_OK, "{}", last_message());
    let target = Capi(m);
    let mut device = soak::StandInDevice { s: &s, base };
    let r = soak::soak("capi/pool", &target, &ctx, &mut device, cfg);
    s.control("capacity 8G").unwrap();
    let r = r.unwrap_or_else(|e| panic!("{e}"));
    assert!(r.allocs > 0 && r.frees > 0, "nothing was churned");
    // SAFETY: the handle is destroyed once.
    unsafe { emm_manager_destroy(m) };
}

//! Frees the driver refuses, through the C ABI on `emm-standin` (the stand-in
//! driver: host memory, no GPU): `emm_free` returns the failure and keeps the
//! block for a retry; a handle destroyed while frees fail leaves the blocks with
//! the manager, which frees them at its next trim. Nothing leaks, nothing is freed
//! twice. Its own test binary: it chooses the `hostonly` manager for the process.
//!
//! Build the stand-in first with `cargo build -p emm-standin` (`cargo xtask ci`
//! does).

use std::ptr::null_mut;

use emm_capi::*;

mod common;
use common::{case, last_message, open_manager, serial, standin};

/// The manager's allocated bytes, through `emm_get_stats`.
fn allocated(m: *mut emm_manager) -> u64 {
    let mut st = emm_stats::default();
    // SAFETY: `st` is a live local.
    case("stats", unsafe { emm_get_stats(m, &mut st) }, EMM_OK);
    st.allocated_bytes
}

/// `(live device bytes, double frees, invalid frees)` of the stand-in.
fn counters(s: &emm_sys::StandIn<'_>) -> (u64, u64, u64) {
    (
        s.control("live_bytes").unwrap(),
        s.control("double_frees").unwrap(),
        s.control("invalid_frees").unwrap(),
    )
}

#[test]
fn a_refused_free_is_returned_and_the_block_kept_for_a_retry() {
    let _serial = serial();
    let s = standin();
    s.reset().unwrap();
    let mut m = open_manager(c"hostonly");
    // SAFETY: live locals, as the contract asks.
    unsafe {
        let base = counters(&s);
        let before = allocated(m);
        let mut p = 0u64;
        case("alloc", emm_alloc(m, 1 << 20, null_mut(), &mut p), EMM_OK);
        assert_eq!(allocated(m), before + (1 << 20));

        // Every free fails: the status says so, and the block is still there.
        s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
        case("free refused", emm_free(m, p, null_mut()), EMM_ERR_DRIVER);
        let msg = last_message();
        assert!(
            msg.contains(&format!("{p:#x}")) && msg.contains("CUDA_ERROR_UNKNOWN"),
            "{msg}"
        );
        assert!(msg.contains("free it again"), "{msg}");
        assert_eq!(allocated(m), before + (1 << 20), "still allocated");
        assert_eq!(counters(&s), (base.0 + (1 << 20), base.1, base.2));
        case(
            "free refused again",
            emm_free(m, p, null_mut()),
            EMM_ERR_DRIVER,
        );

        // The fault clears: the same pointer frees, once.
        s.control("fail_frees off").unwrap();
        case("free retried", emm_free(m, p, null_mut()), EMM_OK);
        assert_eq!(allocated(m), before);
        assert_eq!(counters(&s), base, "nothing leaked, nothing freed twice");
        case(
            "freed: now unknown",
            emm_free(m, p, null_mut()),
            EMM_ERR_INVALID_ARGUMENT,
        );

        // A lost context refuses the free the same way; back, it frees.
        case("alloc", emm_alloc(m, 1 << 20, null_mut(), &mut p), EMM_OK);
        s.control("lose_context").unwrap();
        case(
            "free, context lost",
            emm_free(m, p, null_mut()),
            EMM_ERR_DRIVER,
        );
        s.reset().unwrap();
        case("free, context back", emm_free(m, p, null_mut()), EMM_OK);
        assert_eq!(allocated(m), before);
        assert_eq!(counters(&s), base);

        // A handle destroyed while frees fail: its blocks go to the manager (the
        // frees are reported by its next call), and its next trim frees them.
        case("alloc", emm_alloc(m, 2 << 20, null_mut(), &mut p), EMM_OK);
        s.control("fail_frees CUDA_ERROR_UNKNOWN").unwrap();
        emm_manager_destroy(m);
        s.control("fail_frees off").unwrap();
        case(
            "reopen",
            emm_manager_create(c"hostonly".as_ptr(), 0, &mut m),
            EMM_OK,
        );
        assert_eq!(allocated(m), before + (2 << 20), "kept, not lost");
        let mut released = 0usize;
        let code = emm_trim(m, &mut released);
        if code != EMM_OK {
            // The destroy's failed free, reported by the first call after it.
            case("trim reports the failed free", code, EMM_ERR_DRIVER);
            case("trim", emm_trim(m, &mut released), EMM_OK);
        }
        assert_eq!(allocated(m), before);
        assert_eq!(counters(&s), base, "nothing leaked, nothing freed twice");
        emm_manager_destroy(m);
    }
}

/// A free by address (PyTorch's and CuPy's hooks) that the manager refuses says
/// so, and the block is kept, not lost: the caller takes the address as freed,
/// so emm frees it again itself, at the next free on the device or at
/// `emm_torch_empty_cache`. It used to return `EMM_OK` and leave the block
/// allocated for good (its error surfacing at some later, unrelated call). The
/// kept address is emm's: freeing it again is refused, not a second free.
#[test]
fn a_refused_free_by_address_is_said_and_the_block_freed_again_later() {
    let _serial = serial();
    let s = standin();
    s.reset().unwrap();
    let mib = 1u64 << 20;
    let live = |s: &emm_sys::StandIn<'_>| s.control("live_bytes").unwrap();
    let refuse = |s: &emm_sys::StandIn<'_>, on: bool| {
        let cmd = if on {
            "fail_frees CUDA_ERROR_UNKNOWN"
        } else {
            "fail_frees off"
        };
        s.control(cmd).unwrap();
    };
    // The process's manager is `hostonly` (as for the other cases): it frees
    // through the driver, where the pool would cache the block.
    let m = open_manager(c"hostonly");
    // Warm: the device's state and the manager exist before the counts.
    let p = emm_torch_alloc(mib as isize, 0, null_mut());
    assert!(!p.is_null(), "{}", last_message());
    case("release", emm_torch_release(p, 0), EMM_OK);
    let base = counters(&s);

    // Kept: the address is emm's; the next free on the device frees it.
    let p = emm_torch_alloc(mib as isize, 0, null_mut());
    assert!(!p.is_null(), "{}", last_message());
    refuse(&s, true);
    case("refused", emm_torch_release(p, 0), EMM_ERR_DRIVER);
    let msg = last_message();
    assert!(
        msg.contains("CUDA_ERROR_UNKNOWN")
            && msg.contains("emm keeps the block")
            && msg.contains("do not free the address again"),
        "{msg}"
    );
    assert_eq!(live(&s), base.0 + mib, "kept, still allocated");
    refuse(&s, false);
    case(
        "the kept address freed again: refused",
        emm_torch_release(p, 0),
        EMM_ERR_INVALID_ARGUMENT,
    );
    assert_eq!(
        live(&s),
        base.0 + mib,
        "still kept, not freed by the caller"
    );
    let q = emm_torch_alloc(4096, 0, null_mut());
    assert!(!q.is_null(), "{}", last_message());
    case("another free", emm_torch_release(q, 0), EMM_OK);
    assert_eq!(counters(&s), base, "the kept block freed with it");

    // So does emptying the cache, which counts its bytes.
    let p = emm_torch_alloc(mib as isize, 0, null_mut());
    refuse(&s, true);
    case("refused", emm_torch_release(p, 0), EMM_ERR_DRIVER);
    // Refused again while the fault lasts: still kept.
    let mut released = 0usize;
    // SAFETY: `released` is a live local.
    let code = unsafe { emm_torch_empty_cache(0, &mut released) };
    case("empty cache while refused", code, EMM_ERR_DRIVER);
    assert_eq!(live(&s), base.0 + mib);
    refuse(&s, false);
    // SAFETY: as above.
    case(
        "empty cache",
        unsafe { emm_torch_empty_cache(0, &mut released) },
        EMM_OK,
    );
    assert!(released >= mib as usize, "released {released}");
    assert_eq!(counters(&s), base, "nothing leaked, nothing freed twice");
    // SAFETY: the live handle made above, destroyed once.
    unsafe { emm_manager_destroy(m) };
    s.reset().unwrap();
}

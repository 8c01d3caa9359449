//! Closing memory opened through the C ABI's IPC calls, with the `hostonly`
//! manager (pool pointers: a close that is refused may leave an opening partly
//! closed) on `emm-standin`. A process of its own: the process's manager is
//! chosen by its first allocation, and `hostile.rs` serves `default`.
//!
//! Build the stand-in first with `cargo build -p emm-standin` (`cargo xtask ci`
//! does).

use std::ptr::null_mut;

use emm_capi::*;

mod common;
use common::{case, open_manager, serial, shared_block, standin};

/// A close refused after it undid part of an opening (a pool pointer's
/// free queued, the wait refused) keeps that record, and the next close of
/// the address takes it before memory opened there since, which stays
/// open: the stand-in gives every open of a pool pointer one address.
#[test]
fn a_partly_closed_opening_is_closed_before_a_newer_one_at_its_address() {
    let _serial = serial();
    let s = standin();
    s.reset().unwrap();
    let m = open_manager(c"hostonly");
    // SAFETY: live locals, as the contract asks.
    unsafe {
        let (p, buf) = shared_block(m);
        let w = buf.len();
        let (mut a, mut b) = (0u64, 0u64);
        case("open 1", emm_ipc_open(m, buf.as_ptr(), w, &mut a), EMM_OK);
        let frees = || s.control("calls cuMemFreeAsync").unwrap();
        let f0 = frees();
        s.control("fail cuStreamSynchronize 1 CUDA_ERROR_UNKNOWN")
            .unwrap();
        case("close refused", emm_ipc_close(m, a), EMM_ERR_DRIVER);
        assert_eq!(frees(), f0 + 1, "the pointer's free was queued");
        case("open 2", emm_ipc_open(m, buf.as_ptr(), w, &mut b), EMM_OK);
        assert_eq!(a, b, "one address for both opens");
        case("close the first again", emm_ipc_close(m, a), EMM_OK);
        assert_eq!(
            frees(),
            f0 + 1,
            "the partly closed opening was taken: its free is not queued twice, and the newer one's not yet"
        );
        case("close the second", emm_ipc_close(m, b), EMM_OK);
        assert_eq!(frees(), f0 + 2);
        case(
            "a third close",
            emm_ipc_close(m, b),
            EMM_ERR_INVALID_ARGUMENT,
        );
        case("free", emm_free(m, p, null_mut()), EMM_OK);
        emm_manager_destroy(m);
    }
    assert_eq!(s.control("double_frees").unwrap(), 0);
    assert_eq!(s.control("invalid_frees").unwrap(), 0);
}

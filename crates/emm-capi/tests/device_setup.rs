//! A device whose set-up for PyTorch's hooks the driver refused once, on
//! `emm-standin`: set up again at the next call. Its own test binary: the
//! devices' states are process-wide, and a device made here (the stand-in's
//! fourth) would be a device that disappeared for the other files' cases.

use std::ptr::null_mut;

use emm_capi::*;

mod common;
use common::{case, last_message, serial, standin};

/// A device whose set-up failed once (the driver refused its context) is set up
/// at the next call once the fault has cleared: the failure is not kept for the
/// life of the process, as it was (every later call on the device failed with
/// the first call's error while `emm_alloc` on it worked).
#[test]
fn a_device_whose_set_up_failed_once_is_set_up_at_the_next_call() {
    let _serial = serial();
    let standin = standin();
    assert_eq!(standin.control("devices 4").unwrap(), 4);
    // Device 3: no other case of this file sets it up.
    standin
        .control("fail cuDevicePrimaryCtxRetain 1 CUDA_ERROR_OUT_OF_MEMORY")
        .unwrap();
    let p = emm_torch_alloc(4096, 3, null_mut());
    assert!(p.is_null(), "the refused set-up fails the call");
    assert_ne!(emm_last_error_code(), EMM_OK);
    assert!(
        last_message().contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{}",
        last_message()
    );
    let p = emm_torch_alloc(4096, 3, null_mut());
    assert!(
        !p.is_null(),
        "set up once the fault cleared: {}",
        last_message()
    );
    case("release", emm_torch_release(p, 3), EMM_OK);
    standin.reset().unwrap();
}

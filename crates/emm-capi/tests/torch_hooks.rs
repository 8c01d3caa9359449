//! PyTorch's allocator hooks through the C ABI, as emm's own allocator object and
//! the pluggable allocator call them, on `emm-standin` (found next to the test
//! executable; `cargo build -p emm-standin` first, as `cargo xtask ci` does):
//! `Tensor.record_stream` orders the free after the other stream, a release frees
//! once on the device that holds the block. PyTorch's memory tools read and reset the
//! device's counters and give idle memory back. Hostile inputs to the same
//! functions are in `hostile.rs`. The process's manager is the default (`pool`): no case names one.

use std::ffi::c_void;
use std::ptr::null_mut;

use emm_capi::*;

mod common;
use common::{case, cases, last_message, serial, side_stream, standin, torch_stats, TOOL_NAMES};

/// `emm_torch_record_stream`: a foreign address is refused; a block used on a
/// side stream is freed only after its own stream waits for that stream (an
/// event recorded there, `cuStreamWaitEvent` on its own), and by synchronizing
/// the side stream where the event fails, by synchronizing the device where
/// that fails too; where even that fails the block is kept live (never reused
/// while in use), the free says so, and a later release frees it.
#[test]
fn torch_record_stream_orders_the_free_after_the_other_stream_on_the_standin() {
    let _serial = serial();
    let standin = standin();
    let before = cases();
    let inv = EMM_ERR_INVALID_ARGUMENT;
    let calls = |f: &str| standin.calls(f).unwrap();
    let (_ctx, side) = side_stream();
    let side_ptr = side.raw().0;

    case(
        "null address",
        emm_torch_record_stream(null_mut(), 0, side_ptr),
        EMM_OK,
    );
    case(
        "foreign address",
        emm_torch_record_stream(0x10 as *mut c_void, 0, side_ptr),
        inv,
    );
    case(
        "device out of range",
        emm_torch_record_stream(0x10 as *mut c_void, -1, side_ptr),
        inv,
    );

    // Used on the side stream (twice: noted once), and on its own (nothing).
    let p = emm_torch_alloc(4096, 0, null_mut());
    assert!(!p.is_null(), "{}", last_message());
    case("record", emm_torch_record_stream(p, 0, side_ptr), EMM_OK);
    case(
        "record again",
        emm_torch_record_stream(p, 0, side_ptr),
        EMM_OK,
    );
    case(
        "own stream",
        emm_torch_record_stream(p, 0, null_mut()),
        EMM_OK,
    );
    let (waits, records) = (calls("cuStreamWaitEvent"), calls("cuEventRecord"));
    emm_torch_free(p, 4096, 0, null_mut());
    assert_eq!(
        calls("cuStreamWaitEvent"),
        waits + 1,
        "one wait, for the side stream"
    );
    assert_eq!(calls("cuEventRecord"), records + 1);
    case(
        "freed: no longer recordable",
        emm_torch_record_stream(p, 0, side_ptr),
        inv,
    );

    // Not used elsewhere: no wait at the free.
    let q = emm_torch_alloc(4096, 0, null_mut());
    assert!(!q.is_null(), "{}", last_message());
    let waits = calls("cuStreamWaitEvent");
    emm_torch_free(q, 4096, 0, null_mut());
    assert_eq!(
        calls("cuStreamWaitEvent"),
        waits,
        "no other stream, no wait"
    );

    // The event fails: the side stream is synchronized instead.
    let r = emm_torch_alloc(4096, 0, null_mut());
    case("record r", emm_torch_record_stream(r, 0, side_ptr), EMM_OK);
    standin
        .fail_nth("cuEventRecord", 1, emm_sys::CUresult::ERROR_LAUNCH_FAILED)
        .unwrap();
    let syncs = calls("cuStreamSynchronize");
    emm_torch_free(r, 4096, 0, null_mut());
    assert_eq!(calls("cuStreamSynchronize"), syncs + 1);
    case("r is freed", emm_torch_record_stream(r, 0, side_ptr), inv);

    // Both fail: the device is synchronized, then the block is freed, once.
    let allocated = || torch_stats(0, &["allocated_bytes.all.current"]).1[0];
    let base = allocated();
    let t = emm_torch_alloc(4096, 0, null_mut());
    case("record t", emm_torch_record_stream(t, 0, side_ptr), EMM_OK);
    standin
        .fail_nth("cuEventRecord", 1, emm_sys::CUresult::ERROR_LAUNCH_FAILED)
        .unwrap();
    standin
        .fail_nth(
            "cuStreamSynchronize",
            1,
            emm_sys::CUresult::ERROR_LAUNCH_FAILED,
        )
        .unwrap();
    let ctx_syncs = calls("cuCtxSynchronize");
    case(
        "t freed after a device sync",
        emm_torch_release(t, 0),
        EMM_OK,
    );
    assert_eq!(calls("cuCtxSynchronize"), ctx_syncs + 1);
    assert_eq!(allocated(), base, "t's bytes are back");
    case("t is freed", emm_torch_release(t, 0), inv);

    // All three fail: the block is kept, live, and the status says so; a
    // later release frees it.
    let u = emm_torch_alloc(4096, 0, null_mut());
    case("record u", emm_torch_record_stream(u, 0, side_ptr), EMM_OK);
    for f in ["cuEventRecord", "cuStreamSynchronize", "cuCtxSynchronize"] {
        standin
            .fail_nth(f, 1, emm_sys::CUresult::ERROR_LAUNCH_FAILED)
            .unwrap();
    }
    case("u kept", emm_torch_release(u, 0), EMM_ERR_DRIVER);
    assert!(last_message().contains("kept"), "{}", last_message());
    assert_eq!(allocated(), base + 4096, "u is still allocated");
    let again = emm_torch_alloc(4096, 0, null_mut());
    assert_ne!(again, u, "a kept block is never handed out again");
    emm_torch_free(again, 4096, 0, null_mut());
    let waits = calls("cuStreamWaitEvent");
    case("u released again", emm_torch_release(u, 0), EMM_OK);
    assert_eq!(
        calls("cuStreamWaitEvent"),
        waits + 1,
        "still waits for the side stream"
    );
    assert_eq!(allocated(), base);
    standin.reset().unwrap();
    println!("{} record_stream stand-in cases", cases() - before);
}

/// `emm_torch_release` (the deleter of emm's own PyTorch allocator object):
/// frees once, on the device named or (-1) whichever holds it, after the work
/// of the streams it was used on; a null address does nothing; a foreign or
/// freed address, or a device without it, is refused and frees nothing.
#[test]
fn torch_release_frees_once_on_the_device_that_holds_it_on_the_standin() {
    let _serial = serial();
    let standin = standin();
    let before = cases();
    let inv = EMM_ERR_INVALID_ARGUMENT;
    let calls = |f: &str| standin.calls(f).unwrap();
    let (_ctx, side) = side_stream();
    let side_ptr = side.raw().0;

    case("null", emm_torch_release(null_mut(), 0), EMM_OK);
    case(
        "null, any device",
        emm_torch_release(null_mut(), -1),
        EMM_OK,
    );
    case("foreign", emm_torch_release(0x10 as *mut c_void, 0), inv);
    case(
        "foreign, any device",
        emm_torch_release(0x10 as *mut c_void, -1),
        inv,
    );
    case(
        "device out of range",
        emm_torch_release(0x10 as *mut c_void, 64),
        inv,
    );

    // Allocated on the side stream, released with no stream named (its own
    // stream, as `emm_cupy_free` frees), once.
    let p = emm_torch_alloc(8192, 0, side_ptr);
    assert!(!p.is_null(), "{}", last_message());
    case("release", emm_torch_release(p, 0), EMM_OK);
    case("double release", emm_torch_release(p, 0), inv);
    case("double release, any device", emm_torch_release(p, -1), inv);
    let again = emm_torch_alloc(8192, 0, side_ptr);
    assert!(!again.is_null(), "{}", last_message());

    // -1 finds the device; a device emm never used is not set up by a free,
    // and frees nothing.
    case("another device", emm_torch_release(again, 1), inv);
    case("any device", emm_torch_release(again, -1), EMM_OK);
    case("gone", emm_torch_release(again, -1), inv);

    // A use on another stream is waited for, as emm_torch_free does.
    let q = emm_torch_alloc(4096, 0, null_mut());
    case("record q", emm_torch_record_stream(q, 0, side_ptr), EMM_OK);
    let waits = calls("cuStreamWaitEvent");
    case("release q", emm_torch_release(q, -1), EMM_OK);
    assert_eq!(
        calls("cuStreamWaitEvent"),
        waits + 1,
        "one wait, for the side stream"
    );
    standin.reset().unwrap();
    println!("{} torch_release stand-in cases", cases() - before);
}

/// PyTorch's memory tools for emm's own allocator object
/// (`emm_torch_memory_stats`, `emm_torch_reset_peak_stats`,
/// `emm_torch_empty_cache`, `emm_torch_cache_info`) read and reset the counters
/// of the manager behind `emm_torch_alloc` on the device asked, and idle memory
/// goes back to the device. Device 1 of a two-device stand-in, which no other
/// case of this file allocates on. Bad arguments are in `hostile.rs`.
#[test]
fn torch_memory_tools_read_and_reset_the_devices_manager_on_the_standin() {
    let _serial = serial();
    let standin = standin();
    assert_eq!(standin.control("devices 2").unwrap(), 2);
    let before = cases();
    let names = TOOL_NAMES;
    let mut released = usize::MAX;

    // Allocated: the counters say so, in one read; the peak stays after the
    // free until reset; the idle memory goes back to the device.
    let big = emm_torch_alloc(3 << 20, 1, null_mut());
    assert!(!big.is_null(), "{}", last_message());
    let (code, v, found) = torch_stats(1, &names);
    case("stats while allocated", code, EMM_OK);
    assert_eq!(found, 3, "the pool keeps the first three names: {v:?}");
    assert!(v[0] >= 3 << 20 && v[1] >= v[0] && v[2] >= v[0], "{v:?}");
    assert_eq!(v[3], 0, "a name the manager does not keep reads 0");
    let mut largest = 0usize;
    // SAFETY: `largest` is writable.
    case(
        "cache_info",
        unsafe { emm_torch_cache_info(1, &mut largest) },
        EMM_OK,
    );
    let capacity = standin.control("capacity").unwrap();
    let used = standin.control("used_bytes 1").unwrap();
    assert_eq!(
        largest as u64,
        capacity - used,
        "with the device's free memory above the idle bytes, the free memory"
    );

    case("release", emm_torch_release(big, 1), EMM_OK);
    let (_, after, _) = torch_stats(1, &names);
    assert!(after[0] < 3 << 20 && after[1] >= 3 << 20, "{after:?}");
    case("reset peak", emm_torch_reset_peak_stats(1), EMM_OK);
    let (_, reset, _) = torch_stats(1, &names);
    assert_eq!(
        reset[1], reset[0],
        "the peak is the current value after a reset"
    );
    // With the device's free memory below what the manager holds idle, the idle
    // bytes (reserved, not active; the pool counts blocks in a thread's cache as
    // active) are the answer.
    let (_, idle, _) = torch_stats(
        1,
        &["reserved_bytes.all.current", "active_bytes.all.current"],
    );
    let idle = idle[0] - idle[1];
    assert!(idle >= 2, "nothing idle to tell the two answers apart");
    let used = standin.control("used_bytes 1").unwrap();
    standin
        .control(&format!("capacity {}", used + idle / 2))
        .unwrap();
    // SAFETY: `largest` is writable.
    let code = unsafe { emm_torch_cache_info(1, &mut largest) };
    standin.control(&format!("capacity {capacity}")).unwrap();
    case("cache_info idle", code, EMM_OK);
    assert_eq!(largest as u64, idle, "the idle bytes, not the free memory");

    // SAFETY: `released` is writable.
    case(
        "empty all",
        unsafe { emm_torch_empty_cache(-1, &mut released) },
        EMM_OK,
    );
    let (_, emptied, _) = torch_stats(1, &names);
    assert!(released >= 3 << 20, "released {released}");
    assert!(emptied[2] < reset[2], "{emptied:?} after {reset:?}");
    standin.control("devices 1").unwrap();
    standin.reset().unwrap();
    println!("{} torch memory-tool stand-in cases", cases() - before);
}

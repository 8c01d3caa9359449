//! CUDA graph pools through the C ABI on `emm-standin`, as emm's allocator
//! object for PyTorch drives them: a capture's allocations come from the pool
//! and stay out of the process's manager; a free of the manager's on a capturing
//! stream waits for the capture to end; the pool's memory goes back only after
//! the last release and once nothing in it lives; bad calls are refused with a
//! reason. The stand-in reports a stream as capturing when its `capturing` knob
//! names it: here the stream a null stream stands for (`emm_core::SYNC_STREAM`).

mod common;

use std::ffi::c_int;
use std::ptr::null_mut;

use common::{case, cases, last_message, serial, standin};
use emm_capi::*;

const MIB: isize = 1 << 20;

/// The knob's command that makes the stream of a null `stream` capture.
fn capture_null_stream() -> String {
    format!("capturing {}", emm_core::SYNC_STREAM.0 as u64)
}

fn reserved(device: c_int) -> u64 {
    let key = c"reserved_bytes.all.current";
    let mut v = 0u64;
    // SAFETY: one name and one writable value.
    let code = unsafe { emm_torch_memory_stats(device, &key.as_ptr(), &mut v, 1, null_mut()) };
    assert_eq!(code, EMM_OK, "{}", last_message());
    v
}

#[test]
fn a_capture_allocates_from_its_pool_and_holds_the_managers_frees_until_it_ends() {
    let _serial = serial();
    let standin = standin();
    let before = cases();
    let calls = |f: &str| standin.control(&format!("calls {f}")).unwrap();
    let inv = EMM_ERR_INVALID_ARGUMENT;
    let (a, b) = (7u64, 0u64);

    // Bad calls first: nothing begun yet.
    case("end unknown", emm_torch_graph_pool_end(0, a, b), inv);
    case(
        "release unknown",
        emm_torch_graph_pool_release(0, a, b),
        inv,
    );
    case("begin device 64", emm_torch_graph_pool_begin(64, a, b), inv);
    let p = emm_torch_graph_pool_alloc(MIB, 0, null_mut(), a, b);
    assert!(p.is_null());
    case("alloc from an unknown pool", emm_last_error_code(), inv);

    // Before the capture: a block of the process's manager.
    let m = emm_torch_alloc(MIB, 0, null_mut());
    assert!(!m.is_null(), "{}", last_message());
    let reserved_before = reserved(0);

    case("begin", emm_torch_graph_pool_begin(0, a, b), EMM_OK);
    standin.control(&capture_null_stream()).unwrap();
    let exchanges = calls("cuThreadExchangeStreamCaptureMode");
    let g1 = emm_torch_graph_pool_alloc(MIB, 0, null_mut(), a, b);
    assert!(!g1.is_null(), "{}", last_message());
    assert_eq!(
        calls("cuThreadExchangeStreamCaptureMode"),
        exchanges + 2,
        "the new segment was not allocated in the relaxed capture mode (and the mode restored)"
    );
    assert_ne!(g1, m);
    assert!(
        reserved(0) >= reserved_before + (2 << 20),
        "the pool's segment is not in the device's reserved bytes"
    );
    let neg = emm_torch_graph_pool_alloc(-1, 0, null_mut(), a, b);
    assert!(neg.is_null());
    case("negative size", emm_last_error_code(), inv);
    let zero = emm_torch_graph_pool_alloc(0, 0, null_mut(), a, b);
    assert!(zero.is_null());

    // The manager's free on the capturing stream waits: its block is not handed
    // out again while the capture runs.
    let records = calls("cuEventRecord");
    case("release m", emm_torch_release(m, 0), EMM_OK);
    assert_eq!(
        calls("cuEventRecord"),
        records,
        "the held free recorded an event"
    );
    let m2 = emm_torch_alloc(MIB, 0, null_mut());
    assert!(!m2.is_null(), "{}", last_message());
    assert_ne!(m2, m, "a free held for the capture was reused during it");
    let records = calls("cuEventRecord");
    case("release m2", emm_torch_release(m2, 0), EMM_OK);

    // A block of the pool goes back to the pool at once, for the capture to reuse
    // on the same stream.
    case("release g1", emm_torch_release(g1, 0), EMM_OK);
    let g2 = emm_torch_graph_pool_alloc(MIB, 0, null_mut(), a, b);
    assert_eq!(
        g2, g1,
        "the pool did not reuse its freed block on the stream"
    );
    let (mut live, mut count) = ([null_mut(); 4], usize::MAX);
    // SAFETY: four writable slots and a writable count.
    let code = unsafe { emm_torch_graph_pool_live(0, a, b, live.as_mut_ptr(), 4, &mut count) };
    case("live blocks", code, EMM_OK);
    assert_eq!((count, live[0]), (1, g2), "the pool's live blocks");
    // SAFETY: a null count is refused before anything is written.
    let code = unsafe { emm_torch_graph_pool_live(0, a, b, null_mut(), 0, null_mut()) };
    case("live blocks, null count", code, inv);
    assert_eq!(
        calls("cuEventRecord"),
        records,
        "a free during the capture recorded an event"
    );

    standin.control("capturing off").unwrap();
    case("end", emm_torch_graph_pool_end(0, a, b), EMM_OK);
    case("end again", emm_torch_graph_pool_end(0, a, b), inv);
    // The held frees went ahead: the manager hands one of them out again.
    let m3 = emm_torch_alloc(MIB, 0, null_mut());
    assert!(
        m3 == m || m3 == m2,
        "the held frees did not go back ({m3:?})"
    );
    case("release m3", emm_torch_release(m3, 0), EMM_OK);

    // Released with a live block: nothing goes back until it is freed. (The
    // manager's idle memory goes first, so that only the pool's frees count.)
    let mut released = 0usize;
    // SAFETY: `released` is writable.
    case(
        "empty the manager",
        unsafe { emm_torch_empty_cache(0, &mut released) },
        EMM_OK,
    );
    let frees = calls("cuMemFree_v2");
    case(
        "release the pool",
        emm_torch_graph_pool_release(0, a, b),
        EMM_OK,
    );
    let after_release = emm_torch_graph_pool_alloc(MIB, 0, null_mut(), a, b);
    assert!(after_release.is_null());
    case("alloc after release", emm_last_error_code(), inv);
    // SAFETY: `released` is writable.
    case(
        "empty with a live block",
        unsafe { emm_torch_empty_cache(0, &mut released) },
        EMM_OK,
    );
    assert_eq!(
        calls("cuMemFree_v2"),
        frees,
        "a segment with a live block was freed"
    );
    case("release g2", emm_torch_release(g2, 0), EMM_OK);
    // SAFETY: `released` is writable.
    case(
        "empty",
        unsafe { emm_torch_empty_cache(0, &mut released) },
        EMM_OK,
    );
    assert_eq!(
        calls("cuMemFree_v2"),
        frees + 1,
        "the pool's segment did not go back"
    );
    assert!(released >= 2 << 20, "released {released}");
    standin.reset().unwrap();
    println!("{} graph pool stand-in cases", cases() - before);
}

#[test]
fn a_capture_that_never_ended_lets_its_held_frees_go_when_its_pool_is_released() {
    let _serial = serial();
    let standin = standin();
    let (a, b) = (0u64, 99u64);
    case("begin", emm_torch_graph_pool_begin(0, a, b), EMM_OK);
    standin.control(&capture_null_stream()).unwrap();
    let m = emm_torch_alloc(MIB, 0, null_mut());
    assert!(!m.is_null(), "{}", last_message());
    case("release m", emm_torch_release(m, 0), EMM_OK);
    // The capture fails: PyTorch never calls endAllocateToPool, and the graph
    // that owned the pool is dropped.
    standin.control("capturing off").unwrap();
    case(
        "release the pool",
        emm_torch_graph_pool_release(0, a, b),
        EMM_OK,
    );
    // No capture routes any more: the held free went with the release.
    case(
        "begin another",
        emm_torch_graph_pool_begin(0, a, b + 1),
        EMM_OK,
    );
    let again = emm_torch_alloc(MIB, 0, null_mut());
    assert_eq!(
        again, m,
        "the free held for the failed capture never went back"
    );
    case("release again", emm_torch_release(again, 0), EMM_OK);
    case("end another", emm_torch_graph_pool_end(0, a, b + 1), EMM_OK);
    case(
        "release another",
        emm_torch_graph_pool_release(0, a, b + 1),
        EMM_OK,
    );
    // A free on a stream that is not capturing goes ahead while a capture routes.
    case(
        "begin a third",
        emm_torch_graph_pool_begin(0, a, b + 2),
        EMM_OK,
    );
    let n = emm_torch_alloc(MIB, 0, null_mut());
    case("release n", emm_torch_release(n, 0), EMM_OK);
    let n2 = emm_torch_alloc(MIB, 0, null_mut());
    assert_eq!(n2, n, "a free on a stream that was not capturing was held");
    case("release n2", emm_torch_release(n2, 0), EMM_OK);
    case("end a third", emm_torch_graph_pool_end(0, a, b + 2), EMM_OK);
    case(
        "release a third",
        emm_torch_graph_pool_release(0, a, b + 2),
        EMM_OK,
    );
    standin.reset().unwrap();
}

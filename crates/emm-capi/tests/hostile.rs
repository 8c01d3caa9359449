//! Hostile inputs for the C ABI, calling the `extern "C"` functions directly: null
//! pointers, foreign and destroyed handles (never dereferenced: handles are looked
//! up in a registry of live ones), extreme sizes and shapes. Every case ends in a
//! typed status, never `EMM_ERR_PANIC` and never undefined behaviour.
//!
//! The manager cases run on `emm-standin` (found next to the test executable, as
//! in `crates/emm/tests/standin.rs`); build it first with
//! `cargo build -p emm-standin` (`cargo xtask ci` does).

use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};

use ::emm_array::dlpack::DLManagedTensorVersioned;
use emm_capi::*;

mod common;
use common::{case, cases, last_message};

/// Handles that no `emm_*_create` returned: a small integer, a high address and a
/// pointer to something else entirely. None of them may be read through.
fn foreign() -> Vec<usize> {
    let elsewhere = Box::leak(Box::new([0u64; 64]));
    vec![
        0x1,
        0xdead_beef_0000,
        usize::MAX & !7,
        elsewhere.as_ptr() as usize,
    ]
}

/// What the fake `raise` of CuPy's hooks was given: the exception type and message.
static RAISED: std::sync::Mutex<Vec<(usize, String)>> = std::sync::Mutex::new(Vec::new());
/// What the fake current-stream function returns.
static STREAM: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
const OOM_TYPE: usize = 0x1000;
const ERROR_TYPE: usize = 0x2000;

unsafe extern "C" fn fake_stream() -> isize {
    STREAM.load(std::sync::atomic::Ordering::SeqCst)
}

unsafe extern "C" fn fake_raise(exc_type: *mut c_void, msg: *const std::ffi::c_char) {
    // SAFETY: emm passes a NUL-terminated message that outlives the call.
    let msg = unsafe { std::ffi::CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    RAISED.lock().unwrap().push((exc_type as usize, msg));
}

fn raised() -> Vec<(usize, String)> {
    std::mem::take(&mut *RAISED.lock().unwrap())
}

/// CuPy's C-function allocator: no hooks, bad hooks, a failing stream function,
/// out of memory raised as the out-of-memory type, foreign and repeated frees.
/// Only this test sets the (process-wide) hooks.
unsafe fn cupy_cases(inv: emm_status) {
    let failed = EMM_CUPY_FAILED as *mut c_void;
    assert!(emm_cupy_malloc(null_mut(), 64, 0).is_null());
    case("cupy malloc without hooks", emm_last_error_code(), inv);
    case(
        "cupy hooks null",
        emm_cupy_set_hooks(
            None,
            Some(fake_raise),
            OOM_TYPE as *mut c_void,
            OOM_TYPE as *mut c_void,
        ),
        inv,
    );
    case(
        "cupy hooks null type",
        emm_cupy_set_hooks(
            Some(fake_stream),
            Some(fake_raise),
            null_mut(),
            OOM_TYPE as *mut c_void,
        ),
        inv,
    );
    case(
        "cupy hooks",
        emm_cupy_set_hooks(
            Some(fake_stream),
            Some(fake_raise),
            OOM_TYPE as *mut c_void,
            ERROR_TYPE as *mut c_void,
        ),
        EMM_OK,
    );
    let p = emm_cupy_malloc(null_mut(), 4096, 0);
    assert!(!p.is_null() && p != failed, "{p:p}: {}", last_message());
    assert!(raised().is_empty());
    emm_cupy_free(null_mut(), p, 0);
    case("cupy free", emm_last_error_code(), EMM_OK);
    emm_cupy_free(null_mut(), p, 0);
    case("cupy double free", emm_last_error_code(), inv);
    emm_cupy_free(null_mut(), 0x10 as *mut c_void, 0);
    case("cupy free foreign", emm_last_error_code(), inv);
    // Null and the failure value are ignored (CuPy frees what malloc returned).
    emm_cupy_free(null_mut(), failed, 0);
    emm_cupy_free(null_mut(), null_mut(), 0);
    // Out of memory: the failure value, and the out-of-memory type raised.
    assert_eq!(emm_cupy_malloc(null_mut(), usize::MAX / 2, 0), failed);
    let r = raised();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, OOM_TYPE, "{r:?}");
    assert!(!r[0].1.is_empty());
    case(
        "cupy malloc huge",
        emm_last_error_code(),
        EMM_ERR_OUT_OF_MEMORY,
    );
    // Another failure (a device out of range) raises the other type.
    assert_eq!(emm_cupy_malloc(null_mut(), 64, -3), failed);
    let r = raised();
    assert_eq!(
        r.iter().map(|x| x.0).collect::<Vec<_>>(),
        [ERROR_TYPE],
        "{r:?}"
    );
    assert!(r[0].1.contains("-3"), "{r:?}");
    // The stream function failed (it set a Python exception): nothing more raised.
    STREAM.store(-1, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(emm_cupy_malloc(null_mut(), 64, 0), failed);
    assert!(raised().is_empty());
    STREAM.store(0, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn null_and_foreign_manager_handles_are_invalid_arguments() {
    let before = cases();
    let mut handles = vec![0usize];
    handles.extend(foreign());
    for h in handles {
        let m = h as *mut emm_manager;
        let inv = EMM_ERR_INVALID_ARGUMENT;
        let (mut p, mut n, mut f, mut t) = (0u64, 0usize, 0usize, 0usize);
        let mut host: *mut c_void = null_mut();
        let mut st = emm_stats::default();
        let mut buf = [0u8; 64];
        // SAFETY: every output is a live local; the handles are what is tested.
        unsafe {
            case("emm_alloc", emm_alloc(m, 16, null_mut(), &mut p), inv);
            assert_eq!(emm_alloc_ptr(m, 16, null_mut()), 0);
            case("emm_alloc_ptr", emm_last_error_code(), inv);
            case("emm_free", emm_free(m, 0x1000, null_mut()), inv);
            case(
                "emm_alloc_managed",
                emm_alloc_managed(m, 16, EMM_MEM_ATTACH_GLOBAL, &mut p),
                inv,
            );
            case("emm_free_managed", emm_free_managed(m, 0x1000), inv);
            case(
                "emm_host_alloc",
                emm_host_alloc(m, 16, 0, &mut host, null_mut()),
                inv,
            );
            case(
                "emm_host_free",
                emm_host_free(m, 0x1000 as *mut c_void),
                inv,
            );
            case("emm_memory_info", emm_memory_info(m, &mut f, &mut t), inv);
            case("emm_get_stats", emm_get_stats(m, &mut st), inv);
            case(
                "emm_manager_report",
                emm_manager_report(m, null_mut(), 0, &mut n),
                inv,
            );
            case("emm_trim", emm_trim(m, &mut n), inv);
            case(
                "emm_ipc_export",
                emm_ipc_export(m, 0x1000, 0, 16, buf.as_mut_ptr(), buf.len(), &mut n),
                inv,
            );
            case(
                "emm_ipc_open",
                emm_ipc_open(m, buf.as_ptr(), buf.len(), &mut p),
                inv,
            );
            case("emm_ipc_close", emm_ipc_close(m, 0x1000), inv);
            assert!(emm_manager_name(m).is_null());
            let mut a: *mut emm_array = null_mut();
            let shape = [4usize];
            let want = if h == 0 { EMM_OK } else { inv }; // null: a host-only array
            case(
                "emm_array_create with the handle",
                emm_array_create(m, 2, 32, 1, shape.as_ptr(), &mut a),
                want,
            );
            emm_array_destroy(a);
            emm_manager_destroy(m);
            if h != 0 {
                case("emm_manager_destroy", emm_last_error_code(), inv);
            }
        }
    }
    println!("{} manager-handle cases", cases() - before);
}

/// `emm_configure_check` says whether `emm_configure` would take a value and
/// applies nothing: null and unknown keys, values that do not parse and
/// unknown managers are refused with a message naming them.
#[test]
fn a_configuration_check_refuses_what_configure_would_and_applies_nothing() {
    let inv = EMM_ERR_INVALID_ARGUMENT;
    // SAFETY: NUL-terminated literals or null, as the contract allows.
    unsafe {
        case("null key", emm_configure_check(null(), c"1".as_ptr()), inv);
        case(
            "null value",
            emm_configure_check(c"pool_limit".as_ptr(), null()),
            inv,
        );
        case(
            "unknown key",
            emm_configure_check(c"pool_limt".as_ptr(), c"1".as_ptr()),
            inv,
        );
        assert!(last_message().contains("pool_limt"), "{}", last_message());
        case(
            "bad value",
            emm_configure_check(c"pool_limit".as_ptr(), c"banana".as_ptr()),
            inv,
        );
        assert!(last_message().contains("banana"), "{}", last_message());
        case(
            "unknown manager",
            emm_configure_check(c"manager".as_ptr(), c"poool".as_ptr()),
            EMM_ERR_UNKNOWN_MANAGER,
        );
        case(
            "good",
            emm_configure_check(c"pool_thread_cache".as_ptr(), c"2M".as_ptr()),
            EMM_OK,
        );
        case(
            "a manager",
            emm_configure_check(c"EMM_MEMORY_MANAGER".as_ptr(), c"hostonly".as_ptr()),
            EMM_OK,
        );
    }
}

#[test]
fn null_and_foreign_array_handles_are_invalid_arguments() {
    let before = cases();
    let mut handles = vec![0usize];
    handles.extend(foreign());
    // A destroyed array too.
    let mut dead: *mut emm_array = null_mut();
    let shape = [2usize, 3];
    // SAFETY: live locals; a null manager makes a host-only array.
    unsafe {
        case(
            "create",
            emm_array_create(null_mut(), 2, 32, 2, shape.as_ptr(), &mut dead),
            EMM_OK,
        );
        emm_array_destroy(dead);
    }
    handles.push(dead as usize);
    for h in handles {
        let a = h as *mut emm_array;
        let inv = EMM_ERR_INVALID_ARGUMENT;
        let (mut d, mut side, mut dt, mut di, mut id, mut moved) = (0u64, 0, 0, 0, 0u64, 0);
        let idx = [0usize, 0];
        let mut v = [0u8; 4];
        let mut t: *mut c_void = null_mut();
        // SAFETY: every output is a live local; the handles are what is tested.
        unsafe {
            case(
                "info",
                emm_array_info(a, &mut d, &mut side, &mut dt, &mut di),
                inv,
            );
            case(
                "get",
                emm_array_get(a, idx.as_ptr(), 2, v.as_mut_ptr().cast(), 4),
                inv,
            );
            case(
                "set",
                emm_array_set(a, idx.as_ptr(), 2, v.as_ptr().cast(), 4),
                inv,
            );
            case("lock", emm_array_lock(a, &mut id), inv);
            case("unlock", emm_array_unlock(a, 1), inv);
            case("move", emm_array_move(a, 1, null_mut(), 1, &mut moved), inv);
            case("to_dlpack", emm_array_to_dlpack(a, 1, &mut t), inv);
            assert!(t.is_null());
            assert_eq!(emm_array_deleters_run(a), 0);
            emm_array_destroy(a);
            if h != 0 {
                case("destroy", emm_last_error_code(), inv);
            }
        }
    }
    println!("{} array-handle cases", cases() - before);
}

#[test]
fn extreme_shapes_are_invalid_arguments_and_dlpack_extents_stay_non_negative() {
    let before = cases();
    let inv = EMM_ERR_INVALID_ARGUMENT;
    let huge: &[(&[usize], u8, u8)] = &[
        (&[1 << 63], 1, 8),  // 2^63 uint8 elements
        (&[1 << 63], 2, 32), // 2^63 float32: bytes overflow
        (&[usize::MAX], 1, 8),
        (&[usize::MAX, usize::MAX], 2, 64), // element count overflows
        (&[1 << 32, 1 << 32], 2, 32),
        (&[1 << 62, 4], 1, 8),           // 2^64 elements
        (&[1 << 62, 2], 1, 8),           // 2^63 bytes: above isize::MAX
        (&[0, 1 << 40, 1 << 40], 2, 32), // empty, but its strides overflow
        (&[0, 1 << 63], 2, 32),          // empty, but an extent is negative as int64
        (&[0, usize::MAX], 1, 8),
        (&[1 << 40, 1 << 40, 0, 2], 1, 8), // strides 2^80 over an empty array
    ];
    for (shape, code, bits) in huge {
        let mut a: *mut emm_array = null_mut();
        // SAFETY: `shape` holds `len` extents; `a` is a live local.
        let s = unsafe {
            emm_array_create(
                null_mut(),
                *code,
                *bits,
                shape.len() as c_int,
                shape.as_ptr(),
                &mut a,
            )
        };
        case(&format!("shape {shape:?}"), s, inv);
        assert!(a.is_null());
    }
    // Ranks: 0, negative, above the maximum, and one far beyond the single extent
    // passed (it must not be read).
    let one = [4usize];
    for rank in [0, -1, 5, c_int::MAX, c_int::MIN] {
        let mut a: *mut emm_array = null_mut();
        // SAFETY: a rank the library must refuse before reading `one`.
        let s = unsafe { emm_array_create(null_mut(), 2, 32, rank, one.as_ptr(), &mut a) };
        case(&format!("rank {rank}"), s, inv);
    }
    // Unsupported types.
    for (code, bits) in [(99u8, 32u8), (2, 7), (0, 0)] {
        let mut a: *mut emm_array = null_mut();
        // SAFETY: as above.
        let s = unsafe { emm_array_create(null_mut(), code, bits, 1, one.as_ptr(), &mut a) };
        case(&format!("type ({code}, {bits})"), s, inv);
    }
    // Null arguments.
    let mut a: *mut emm_array = null_mut();
    // SAFETY: nulls are what is tested.
    unsafe {
        case(
            "null shape",
            emm_array_create(null_mut(), 2, 32, 1, null(), &mut a),
            inv,
        );
        case(
            "null out",
            emm_array_create(null_mut(), 2, 32, 1, one.as_ptr(), null_mut()),
            inv,
        );
    }
    // A large empty array is fine, and its DLPack extents and strides are
    // non-negative.
    let shape = [0usize, 1 << 40, 3];
    // SAFETY: live locals.
    unsafe {
        case(
            "empty [0, 2^40, 3]",
            emm_array_create(null_mut(), 1, 8, 3, shape.as_ptr(), &mut a),
            EMM_OK,
        );
        // Element access: wrong rank, wrong size (usize::MAX), out of bounds.
        let idx = [0usize, 0, 0];
        let mut v = [0u8; 8];
        case(
            "get rank 2",
            emm_array_get(a, idx.as_ptr(), 2, v.as_mut_ptr().cast(), 1),
            inv,
        );
        case(
            "get rank -1",
            emm_array_get(a, idx.as_ptr(), -1, v.as_mut_ptr().cast(), 1),
            inv,
        );
        case(
            "get size usize::MAX",
            emm_array_get(a, idx.as_ptr(), 3, v.as_mut_ptr().cast(), usize::MAX),
            inv,
        );
        case(
            "set size 1<<63",
            emm_array_set(a, idx.as_ptr(), 3, v.as_ptr().cast(), 1 << 63),
            inv,
        );
        case(
            "get out of bounds",
            emm_array_get(a, idx.as_ptr(), 3, v.as_mut_ptr().cast(), 1),
            inv,
        );
        case(
            "get null idx",
            emm_array_get(a, null(), 3, v.as_mut_ptr().cast(), 1),
            inv,
        );
        case(
            "move side 7",
            emm_array_move(a, 7, null_mut(), 1, null_mut()),
            inv,
        );
        let mut t: *mut c_void = null_mut();
        case("to_dlpack", emm_array_to_dlpack(a, 1, &mut t), EMM_OK);
        let m = t.cast::<DLManagedTensorVersioned>();
        let dl = &(*m).dl_tensor;
        let n = usize::try_from(dl.ndim).unwrap();
        let ext = core::slice::from_raw_parts(dl.shape, n);
        let str_ = core::slice::from_raw_parts(dl.strides, n);
        assert_eq!(ext, &[0, 1 << 40, 3]);
        assert!(ext.iter().chain(str_).all(|&v| v >= 0), "{ext:?} {str_:?}");
        emm_dlpack_delete(t, 1);
        assert_eq!(emm_array_deleters_run(a), 1);
        emm_array_destroy(a);
    }
    println!("{} shape cases", cases() - before);
}

mod standin {
    use super::*;
    use crate::common::{
        open_manager, serial, shared_block, side_stream, standin, torch_stats, use_standin,
        TOOL_NAMES,
    };

    #[test]
    fn the_device_count_is_the_drivers() {
        let _serial = serial();
        let s = standin();
        s.reset().unwrap();
        let mut n = -1;
        // SAFETY: a live local, then a null the contract refuses.
        unsafe {
            case("count", emm_device_count(&mut n), EMM_OK);
            case(
                "count null",
                emm_device_count(null_mut()),
                EMM_ERR_INVALID_ARGUMENT,
            );
        }
        let want = emm_driver::Device::count().unwrap();
        assert_eq!(usize::try_from(n).unwrap(), want);
        assert!(n >= 1);
    }

    /// A driver may give one address to every open of a handle (the stand-in
    /// does, as it counts opens): each open needs its close, and the first close
    /// leaves the second open mapped. A close the driver refuses says so and
    /// keeps the record for another try.
    #[test]
    fn each_ipc_open_needs_its_close_and_a_refused_close_stays_open() {
        let _serial = serial();
        let s = standin();
        s.reset().unwrap();
        let m = open_manager(c"default");
        // SAFETY: live locals, as the contract asks.
        unsafe {
            let (p, buf) = shared_block(m);
            let w = buf.len();
            let (mut a, mut b) = (0u64, 0u64);
            case("open 1", emm_ipc_open(m, buf.as_ptr(), w, &mut a), EMM_OK);
            case("open 2", emm_ipc_open(m, buf.as_ptr(), w, &mut b), EMM_OK);
            assert_eq!(a, b, "the stand-in gives one address to both opens");
            assert_eq!(s.control("ipc_open").unwrap(), 2, "both opens are live");
            case("close 1", emm_ipc_close(m, a), EMM_OK);
            assert_eq!(
                s.control("ipc_open").unwrap(),
                1,
                "the second open stays mapped"
            );

            s.control("fail cuIpcCloseMemHandle 1 CUDA_ERROR_UNKNOWN")
                .unwrap();
            case("close refused", emm_ipc_close(m, b), EMM_ERR_DRIVER);
            let msg = last_message();
            assert!(msg.contains("cuIpcCloseMemHandle"), "{msg}");
            assert_eq!(
                s.control("ipc_open").unwrap(),
                1,
                "still open after the refusal"
            );
            case("close again", emm_ipc_close(m, b), EMM_OK);
            assert_eq!(s.control("ipc_open").unwrap(), 0);
            case(
                "a third close",
                emm_ipc_close(m, b),
                EMM_ERR_INVALID_ARGUMENT,
            );
            case("free", emm_free(m, p, null_mut()), EMM_OK);
            emm_manager_destroy(m);
        }
    }

    #[test]
    fn extreme_sizes_and_stale_handles_on_the_standin() {
        let _serial = serial();
        use_standin();
        let before = cases();
        let inv = EMM_ERR_INVALID_ARGUMENT;
        let mut m = open_manager(c"default");
        // SAFETY: live locals and nulls, as the contract allows.
        unsafe {
            case(
                "create device -1",
                emm_manager_create(null(), -1, &mut m),
                inv,
            );
            let mut p = 0u64;
            case("alloc 0", emm_alloc(m, 0, null_mut(), &mut p), EMM_OK);
            assert_eq!(p, 0);
            case("free 0", emm_free(m, 0, null_mut()), EMM_OK);
            for size in [usize::MAX, 1 << 63, (1 << 63) + 1, isize::MAX as usize] {
                let s = emm_alloc(m, size, null_mut(), &mut p);
                assert!(
                    s == EMM_ERR_OUT_OF_MEMORY || s == inv,
                    "alloc {size:#x}: {s} {}",
                    last_message()
                );
                case(&format!("alloc {size:#x}"), s, s);
                assert_eq!(emm_alloc_ptr(m, size, null_mut()), 0);
                assert_ne!(emm_last_error_code(), EMM_OK);
            }
            case(
                "alloc null out",
                emm_alloc(m, 16, null_mut(), null_mut()),
                inv,
            );
            case("alloc 256", emm_alloc(m, 256, null_mut(), &mut p), EMM_OK);
            let mut w = 0usize;
            let mut buf = [0u8; 512];
            for (off, len) in [(usize::MAX, 1), (1, usize::MAX), (200, 57), (0, 1 << 63)] {
                let s = emm_ipc_export(m, p, off, len, buf.as_mut_ptr(), buf.len(), &mut w);
                assert!(
                    s == inv || s == EMM_ERR_UNSUPPORTED,
                    "export {off}+{len}: {s}"
                );
                case(&format!("ipc export {off}+{len}"), s, s);
            }
            for bytes in [
                &[][..],
                &[0u8; 7][..],
                &[0xffu8; 300][..],
                b"EMMIPC\x02\x02",
            ] {
                let mut q = 0u64;
                // An empty slice still passes a non-null pointer.
                let ptr = if bytes.is_empty() {
                    buf.as_ptr()
                } else {
                    bytes.as_ptr()
                };
                case(
                    "ipc open garbage",
                    emm_ipc_open(m, ptr, bytes.len(), &mut q),
                    EMM_ERR_IPC,
                );
            }
            case("free unknown", emm_free(m, p + 16, null_mut()), inv);
            case("free", emm_free(m, p, null_mut()), EMM_OK);
            case("double free", emm_free(m, p, null_mut()), inv);
            let mut host: *mut c_void = null_mut();
            for size in [0usize, usize::MAX] {
                let s = emm_host_alloc(m, size, 7, &mut host, null_mut());
                assert!(
                    s == inv || s == EMM_ERR_OUT_OF_MEMORY || s == EMM_ERR_DRIVER,
                    "{s}"
                );
                case(&format!("host alloc {size:#x}"), s, s);
            }
            // A flag bit past the three known ones is refused, not ignored.
            for flags in [8u32, 0x80, 1 << 31] {
                case(
                    &format!("host alloc flags {flags:#x}"),
                    emm_host_alloc(m, 16, flags, &mut host, null_mut()),
                    inv,
                );
                assert!(last_message().contains("flags"), "{}", last_message());
            }
            // The name the manager was registered under, kept.
            let name = emm_manager_name(m);
            assert!(!name.is_null());
            assert_eq!(std::ffi::CStr::from_ptr(name).to_str(), Ok("default"));
            assert_eq!(emm_manager_name(m), name, "one string a name");
            // Torch's pair: negative and absurd sizes, devices out of range.
            assert!(emm_torch_alloc(-1, 0, null_mut()).is_null());
            case("torch alloc -1", emm_last_error_code(), inv);
            assert!(emm_torch_alloc(isize::MAX, 0, null_mut()).is_null());
            let s = emm_last_error_code();
            assert!(s == EMM_ERR_OUT_OF_MEMORY || s == inv, "{s}");
            case("torch alloc isize::MAX", s, s);
            assert!(emm_torch_alloc(16, -1, null_mut()).is_null());
            case("torch alloc device -1", emm_last_error_code(), inv);
            assert!(emm_torch_alloc(16, 1 << 20, null_mut()).is_null());
            case("torch alloc device 2^20", emm_last_error_code(), inv);
            // A device in range that has no manager (the stand-in has one device):
            // every call says why, not only the first.
            for round in 0..2 {
                assert!(emm_torch_alloc(16, 7, null_mut()).is_null());
                let s = emm_last_error_code();
                assert!(s != EMM_OK && s != inv, "round {round}: {s}");
                case(&format!("torch alloc device 7, round {round}"), s, s);
                // Another failure in between must not leak into the next report.
                emm_torch_free(0x10 as *mut c_void, 16, 0, null_mut());
            }
            emm_torch_free(0x10 as *mut c_void, 16, 0, null_mut());
            case("torch free foreign", emm_last_error_code(), inv);
            cupy_cases(inv);
            // A destroyed handle is refused, not read.
            emm_manager_destroy(m);
            case(
                "use after destroy",
                emm_alloc(m, 16, null_mut(), &mut p),
                inv,
            );
            assert!(emm_manager_name(m).is_null());
            emm_manager_destroy(m);
            case("destroy twice", emm_last_error_code(), inv);
        }
        println!("{} stand-in cases", cases() - before);
    }

    const GLOBAL: std::ffi::c_uint = EMM_MEM_ATTACH_GLOBAL;

    fn managed_stat(m: *mut emm_manager) -> u64 {
        let mut v = u64::MAX;
        // SAFETY: a live handle, a NUL-terminated key and a live output.
        let s = unsafe { emm_memory_stat(m, c"emm.managed_bytes.current".as_ptr(), &mut v) };
        assert_eq!(s, EMM_OK, "{}", last_message());
        v
    }

    #[test]
    fn managed_memory_refuses_bad_flags_sizes_and_frees_on_the_standin() {
        let _serial = serial();
        let standin = standin();
        let before = cases();
        let inv = EMM_ERR_INVALID_ARGUMENT;
        let live0 = standin.control("live_managed").unwrap();
        let mut m: *mut emm_manager = null_mut();
        // SAFETY: live locals and nulls, as the contract allows.
        unsafe {
            // The manager the other stand-in test of this binary names too (a process
            // has one; the tests may run in either order).
            case(
                "create",
                emm_manager_create(c"default".as_ptr(), 0, &mut m),
                EMM_OK,
            );
            let base = managed_stat(m);
            let mut p = 1u64;
            case(
                "null out",
                emm_alloc_managed(m, 16, GLOBAL, null_mut()),
                inv,
            );
            for flags in [0, 3, 4, 5, 0x8000_0000, std::ffi::c_uint::MAX] {
                case(
                    &format!("flags {flags:#x}"),
                    emm_alloc_managed(m, 16, flags, &mut p),
                    inv,
                );
                assert!(
                    last_message().contains("EMM_MEM_ATTACH_GLOBAL"),
                    "{}",
                    last_message()
                );
            }
            case("size 0", emm_alloc_managed(m, 0, GLOBAL, &mut p), EMM_OK);
            assert_eq!(p, 0);
            case("free 0", emm_free_managed(m, 0), EMM_OK);
            for size in [usize::MAX, 1 << 63, (1 << 63) + 1, isize::MAX as usize] {
                let s = emm_alloc_managed(m, size, GLOBAL, &mut p);
                assert!(
                    s == inv || s == EMM_ERR_OUT_OF_MEMORY,
                    "size {size:#x}: {s}"
                );
                case(&format!("size {size:#x}"), s, s);
            }
            // More than the stand-in's device holds: out of memory, with figures.
            let mut free = 0usize;
            let mut total = 0usize;
            case("info", emm_memory_info(m, &mut free, &mut total), EMM_OK);
            let big = total + (1 << 30);
            case(
                "past the device",
                emm_alloc_managed(m, big, GLOBAL, &mut p),
                EMM_ERR_OUT_OF_MEMORY,
            );
            let (mut r, mut f, mut t) = (0usize, 0usize, 0usize);
            case("last oom", emm_last_oom(&mut r, &mut f, &mut t), EMM_OK);
            assert_eq!((r, t), (big, total));
            // After a failure that was not out of memory, the refusal says so
            // (its own code and message, not the earlier call's).
            case("not oom", emm_free_managed(m, 0x10), inv);
            case(
                "last oom after another failure",
                emm_last_oom(&mut r, &mut f, &mut t),
                inv,
            );
            assert!(
                last_message().contains("emm_last_oom")
                    && last_message().contains("not out of memory"),
                "{}",
                last_message()
            );
            // A real one: the host's address is the device's (stand-in memory).
            for flags in [EMM_MEM_ATTACH_GLOBAL, EMM_MEM_ATTACH_HOST] {
                case("alloc", emm_alloc_managed(m, 4096, flags, &mut p), EMM_OK);
                assert!(p != 0 && p % 256 == 0, "{p:#x}");
                core::ptr::write_bytes(p as *mut u8, 0x5A, 4096);
                assert_eq!(*((p + 4095) as *const u8), 0x5A);
                assert_eq!(managed_stat(m), base + 4096);
                case("emm_free of managed", emm_free(m, p, null_mut()), inv);
                assert!(
                    last_message().contains("emm_free_managed"),
                    "{}",
                    last_message()
                );
                case("free", emm_free_managed(m, p), EMM_OK);
                case("double free", emm_free_managed(m, p), inv);
                case("foreign", emm_free_managed(m, p + 256), inv);
                assert_eq!(managed_stat(m), base);
            }
            // Device memory is not freed by emm_free_managed, nor the other way round.
            let mut d = 0u64;
            case(
                "alloc device",
                emm_alloc(m, 4096, null_mut(), &mut d),
                EMM_OK,
            );
            case("free_managed of device", emm_free_managed(m, d), inv);
            assert!(last_message().contains("emm_free"), "{}", last_message());
            case("free device", emm_free(m, d, null_mut()), EMM_OK);
            // Destroying the handle frees what it still holds.
            case("held", emm_alloc_managed(m, 8192, GLOBAL, &mut p), EMM_OK);
            assert_eq!(standin.control("live_managed").unwrap(), live0 + 1);
            emm_manager_destroy(m);
            assert_eq!(standin.control("live_managed").unwrap(), live0);
            case(
                "after destroy",
                emm_alloc_managed(m, 16, GLOBAL, &mut p),
                inv,
            );
            case("free after destroy", emm_free_managed(m, p), inv);
        }
        println!("{} managed stand-in cases", cases() - before);
    }

    /// `emm_torch_record_stream` with a stream handle the driver does not know is
    /// refused and records nothing, and a stream destroyed after it was recorded
    /// makes the release synchronize the device and free the block: one release
    /// reclaims the bytes either way, and a second one is refused.
    #[test]
    fn torch_record_stream_of_a_garbage_or_dead_stream_keeps_no_block() {
        let _serial = serial();
        let standin = standin();
        let before = cases();
        let inv = EMM_ERR_INVALID_ARGUMENT;
        let calls = |f: &str| standin.calls(f).unwrap();
        let allocated = || torch_stats(0, &["allocated_bytes.all.current"]).1[0];
        let p = emm_torch_alloc(4096, 0, null_mut());
        assert!(!p.is_null(), "{}", last_message());
        let base = allocated() - 4096;
        let garbage = 0xdead_beef_usize as *mut c_void;
        case(
            "garbage stream",
            emm_torch_record_stream(p, 0, garbage),
            inv,
        );
        assert!(
            last_message().contains("0xdeadbeef")
                && last_message().contains("nothing was recorded"),
            "{}",
            last_message()
        );
        let waits = calls("cuStreamWaitEvent");
        case("release", emm_torch_release(p, 0), EMM_OK);
        assert_eq!(
            calls("cuStreamWaitEvent"),
            waits,
            "nothing recorded, nothing waited for"
        );
        assert_eq!(allocated(), base, "the bytes are back");
        case("second release", emm_torch_release(p, 0), inv);

        // Valid when recorded, destroyed before the release.
        let q = emm_torch_alloc(4096, 0, null_mut());
        let (ctx, side) = side_stream();
        case(
            "record",
            emm_torch_record_stream(q, 0, side.raw().0),
            EMM_OK,
        );
        drop(side);
        let ctx_syncs = calls("cuCtxSynchronize");
        case(
            "release after the stream went",
            emm_torch_release(q, 0),
            EMM_OK,
        );
        assert_eq!(
            calls("cuCtxSynchronize"),
            ctx_syncs + 1,
            "the device was synchronized"
        );
        assert_eq!(allocated(), base, "the bytes are back");
        case("second release", emm_torch_release(q, 0), inv);

        // The default streams are never asked about: during a capture in another
        // stream the driver answers a question about the legacy stream with
        // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (906), which must not refuse them.
        standin
            .control("fail_always cuStreamIsCapturing 906")
            .unwrap();
        let (_ctx2, side2) = side_stream();
        let r = emm_torch_alloc(4096, 0, side2.raw().0);
        assert!(!r.is_null(), "{}", last_message());
        let asked = calls("cuStreamIsCapturing");
        for (what, s) in [
            ("null stream", null_mut()),
            ("legacy stream", emm_sys::CU_STREAM_LEGACY.0),
            ("per-thread stream", emm_sys::CU_STREAM_PER_THREAD.0),
        ] {
            case(what, emm_torch_record_stream(r, 0, s), EMM_OK);
        }
        assert_eq!(
            calls("cuStreamIsCapturing"),
            asked,
            "no default stream was asked about"
        );
        standin.reset().unwrap();
        case("release", emm_torch_release(r, 0), EMM_OK);
        assert_eq!(allocated(), base, "the bytes are back");
        drop(side2);
        drop(ctx);
        standin.reset().unwrap();
        println!("{} garbage-stream stand-in cases", cases() - before);
    }

    /// PyTorch's memory tools for emm's own allocator object refuse bad
    /// arguments: a device outside `0..64`, null keys or names or outputs; a
    /// device emm has not set up reads 0, and a question does not set it up.
    /// Device 1 of a two-device stand-in, which no other case of this binary
    /// allocates on. What the tools read and give back is in `torch_hooks.rs`.
    #[test]
    fn torch_memory_tools_refuse_bad_devices_and_null_outputs_on_the_standin() {
        let _serial = serial();
        let standin = standin();
        assert_eq!(standin.control("devices 2").unwrap(), 2);
        let before = cases();
        let inv = EMM_ERR_INVALID_ARGUMENT;
        let names = TOOL_NAMES;
        let mut released = usize::MAX;

        // Not set up: zeros, nothing to reset or give back, and still not set up
        // afterwards.
        let (code, v, found) = torch_stats(1, &names);
        case("stats before any allocation", code, EMM_OK);
        assert_eq!((v, found), (vec![0; 4], 0));
        case("reset before", emm_torch_reset_peak_stats(1), EMM_OK);
        // SAFETY: `released` is writable.
        case(
            "empty before",
            unsafe { emm_torch_empty_cache(1, &mut released) },
            EMM_OK,
        );
        assert_eq!(released, 0);
        assert_eq!(torch_stats(1, &names).2, 0, "a question set the device up");

        // Bad arguments.
        case("device 64", torch_stats(64, &names).0, inv);
        case("device -1", torch_stats(-1, &names).0, inv);
        case("reset device 64", emm_torch_reset_peak_stats(64), inv);
        // SAFETY: null outputs are refused before anything is written.
        unsafe {
            case(
                "empty device -2",
                emm_torch_empty_cache(-2, null_mut()),
                inv,
            );
            case(
                "null keys",
                emm_torch_memory_stats(1, null(), [0u64; 1].as_mut_ptr(), 1, null_mut()),
                inv,
            );
            let null_name = [null::<std::ffi::c_char>()];
            case(
                "null name",
                emm_torch_memory_stats(
                    1,
                    null_name.as_ptr(),
                    [0u64; 1].as_mut_ptr(),
                    1,
                    null_mut(),
                ),
                inv,
            );
            case(
                "no names",
                emm_torch_memory_stats(1, null(), null_mut(), 0, null_mut()),
                EMM_OK,
            );
            case(
                "cache_info null out",
                emm_torch_cache_info(1, null_mut()),
                inv,
            );
        }

        assert_eq!(torch_stats(1, &names).2, 0, "a refusal set the device up");
        standin.control("devices 1").unwrap();
        standin.reset().unwrap();
        println!("{} torch memory-tool refusals", cases() - before);
    }
}

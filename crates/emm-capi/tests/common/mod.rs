//! What the C ABI's test files share: checking a status (with the thread's count
//! of cases), the last error's message, and pointing the driver at `emm-standin`
//! (found next to the test executable; `cargo build -p emm-standin` builds it,
//! `cargo xtask ci` does).

#![allow(dead_code)] // each test file uses its own part

use std::cell::Cell;
use std::path::PathBuf;

use emm_capi::*;

thread_local! {
    static CASES: Cell<usize> = const { Cell::new(0) };
}

/// Asserts that a call returned `want`, with a message and a matching
/// `emm_last_error_code` when it failed, and never `EMM_ERR_PANIC`.
#[track_caller]
pub fn case(what: &str, got: emm_status, want: emm_status) {
    assert_eq!(got, want, "{what}: {}", last_message());
    assert_ne!(got, EMM_ERR_PANIC, "{what}");
    if got != EMM_OK {
        assert_eq!(emm_last_error_code(), got, "{what}");
        assert!(!last_message().is_empty(), "{what}: no message");
    }
    CASES.with(|c| c.set(c.get() + 1));
}

/// A handle on manager `name` of device 0, its creation checked as a case.
#[track_caller]
pub fn open_manager(name: &std::ffi::CStr) -> *mut emm_manager {
    let mut m: *mut emm_manager = std::ptr::null_mut();
    // SAFETY: a NUL-terminated name and a live out-pointer, as the contract asks.
    let made = unsafe { emm_manager_create(name.as_ptr(), 0, &mut m) };
    case("create", made, EMM_OK);
    m
}

/// The calling thread's last error message.
pub fn last_message() -> String {
    let mut buf = vec![0u8; 512];
    // SAFETY: `buf` holds 512 writable bytes.
    let n = unsafe { emm_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n.min(511));
    String::from_utf8_lossy(&buf).into_owned()
}

/// Cases checked so far on this thread.
pub fn cases() -> usize {
    CASES.with(Cell::get)
}

fn standin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("libemm_standin.so")
}

/// Points the driver at the stand-in (once, before the first test touches the
/// driver).
pub fn use_standin() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let path = standin_path();
        assert!(
            path.is_file(),
            "{} is missing: run `cargo build -p emm-standin`",
            path.display()
        );
        // `cargo xtask ci` sets the same library; a driver set by hand is used as is.
        if std::env::var_os(emm_sys::DRIVER_PATH_ENV).is_none() {
            std::env::set_var(emm_sys::DRIVER_PATH_ENV, &path);
        }
    });
    println!(
        "driver: {:?} (emm-standin is host memory, not a GPU)",
        std::env::var_os(emm_sys::DRIVER_PATH_ENV)
    );
}

/// Held by each stand-in case for its whole run: they count the stand-in's calls,
/// inject faults into them and change its knobs, which cases running at once
/// would see from each other.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The stand-in's control handle (after `use_standin`).
pub fn standin() -> emm_sys::StandIn<'static> {
    use_standin();
    emm_sys::driver()
        .expect("the stand-in loads")
        .stand_in()
        .expect("the loaded driver is emm-standin")
}

/// Device 0 of the stand-in and a stream of its own (the context must outlive
/// the stream).
pub fn side_stream() -> (emm_driver::Context, emm_driver::Stream) {
    let ctx = emm_driver::Context::on_device(0).expect("device 0 of the stand-in");
    let side = emm_driver::Stream::new(&ctx).expect("a side stream");
    (ctx, side)
}

/// The names the memory-tool tests read: three the pool keeps, one no manager does.
pub const TOOL_NAMES: [&str; 4] = [
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "no.such.counter",
];

/// The counters `emm_torch_memory_stats` reads for the names asked, in one read
/// (the stand-in's device `device`), and how many the manager keeps.
pub fn torch_stats(device: std::ffi::c_int, names: &[&str]) -> (emm_status, Vec<u64>, usize) {
    let owned: Vec<std::ffi::CString> = names
        .iter()
        .map(|n| std::ffi::CString::new(*n).unwrap())
        .collect();
    let keys: Vec<*const std::ffi::c_char> = owned.iter().map(|k| k.as_ptr()).collect();
    let mut values = vec![u64::MAX; names.len()];
    let mut found = usize::MAX;
    // SAFETY: `keys` and `values` hold `names.len()` elements; the names are
    // NUL-terminated and outlive the call.
    let code = unsafe {
        emm_torch_memory_stats(
            device,
            keys.as_ptr(),
            values.as_mut_ptr(),
            names.len(),
            &mut found,
        )
    };
    (code, values, found)
}

/// A 1 MiB block allocated through `m` and its IPC handle bytes: `(address,
/// handle bytes)`, each call checked.
pub fn shared_block(m: *mut emm_manager) -> (u64, Vec<u8>) {
    let mut p = 0u64;
    let mut buf = [0u8; 512];
    let mut w = 0usize;
    // SAFETY: `m` is a live handle of the caller's; live locals for the outputs.
    unsafe {
        case(
            "alloc",
            emm_alloc(m, 1 << 20, std::ptr::null_mut(), &mut p),
            EMM_OK,
        );
        case(
            "export",
            emm_ipc_export(m, p, 0, 1 << 20, buf.as_mut_ptr(), buf.len(), &mut w),
            EMM_OK,
        );
    }
    (p, buf[..w].to_vec())
}

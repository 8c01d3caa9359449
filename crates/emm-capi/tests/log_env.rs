//! An invalid `EMM_LOG`: the library falls back to `warn` and says so once, on
//! standard error and to a caller that captures warnings (`emm_capture_warnings`,
//! `emm_take_warning`). The library reads `EMM_LOG` once per process, so the
//! test runs itself again as a child with the variable set.

use std::ffi::{c_char, c_int, CStr};
use std::process::Command;

use emm_capi::*;

const CHILD: &str = "EMM_LOG_TEST_CHILD";
const BAD: &str = "emm=notalevel";
/// `EMM_LOG_WARN` of `emm.h`: the level of a warning in `emm_take_warning`.
const EMM_LOG_WARN: c_int = 2;

/// Every warning queued now, in order.
fn take_all() -> Vec<(c_int, String)> {
    let mut out = Vec::new();
    loop {
        let mut buf = [0 as c_char; 1024];
        let (mut len, mut level) = (0usize, 0 as c_int);
        // SAFETY: `buf`, `len` and `level` are live locals of the stated sizes.
        let code = unsafe { emm_take_warning(buf.as_mut_ptr(), buf.len(), &mut len, &mut level) };
        assert_eq!(code, EMM_OK);
        if len == 0 {
            return out;
        }
        // SAFETY: emm_take_warning wrote a NUL-terminated message into `buf`.
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
        out.push((level, text.to_string_lossy().into_owned()));
    }
}

#[test]
fn an_invalid_emm_log_is_replaced_by_warn_and_said_once() {
    if std::env::var_os(CHILD).is_some() {
        // The child: EMM_LOG is invalid. Capturing installs the log output.
        emm_capture_warnings(1);
        emm_capture_warnings(1); // a second call says nothing more
        let notices: Vec<_> = take_all()
            .into_iter()
            .filter(|(_, t)| t.contains("EMM_LOG"))
            .collect();
        assert_eq!(notices.len(), 1, "{notices:?}");
        let (level, text) = &notices[0];
        assert_eq!(*level, EMM_LOG_WARN);
        assert!(
            text.contains(&format!("EMM_LOG={BAD:?}"))
                && text.contains("is not a valid log filter")
                && text.contains("using `warn` instead"),
            "{text}"
        );
        // `warn` is in force: a warning is captured, an info event is not.
        tracing::warn!("after the fallback");
        tracing::info!("below warn");
        let rest = take_all();
        assert_eq!(rest, vec![(EMM_LOG_WARN, "after the fallback".to_owned())]);
        return;
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let out = Command::new(exe)
        .args([
            "--exact",
            "an_invalid_emm_log_is_replaced_by_warn_and_said_once",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("EMM_LOG", BAD)
        .output()
        .expect("the test runs itself");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran the test: {stdout}"
    );
    let said: Vec<&str> = stderr.lines().filter(|l| l.contains("EMM_LOG")).collect();
    assert_eq!(said.len(), 1, "said once on stderr: {stderr}");
    assert!(
        said[0].starts_with("emm: WARN")
            && said[0].contains(&format!("EMM_LOG={BAD:?}"))
            && said[0].contains("using `warn` instead"),
        "{}",
        said[0]
    );
}

const QUIET_CHILD: &str = "EMM_LOG_TEST_FULL_STDERR";

/// With standard error unwritable (`/dev/full`: every write fails), the log's
/// lines are dropped: the invalid `EMM_LOG` notice at the first call, and the
/// warning or error an entry point logs after its guard. They used to panic
/// (`eprintln!`): at the first call inside the guard, a correct status became
/// `EMM_ERR_PANIC`; after the guard (`emm_cupy_free`'s error), the panic crossed
/// the C boundary and aborted the process.
#[cfg(target_os = "linux")]
#[test]
fn an_unwritable_standard_error_drops_log_lines_without_a_panic() {
    if std::env::var_os(QUIET_CHILD).is_some() {
        // A pool never begun: invalid argument, logged as a warning.
        let code = emm_torch_graph_pool_release(0, 7, 7);
        assert_eq!(code, EMM_ERR_INVALID_ARGUMENT, "{code}");
        // An address emm never gave (no driver here, or not emm's): an error
        // logged after the guard.
        emm_cupy_free(std::ptr::null_mut(), 0x1234 as *mut _, 0);
        let code = emm_last_error_code();
        assert!(code != EMM_OK && code != EMM_ERR_PANIC, "{code}");
        return;
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(exe)
        .args([
            "--exact",
            "an_unwritable_standard_error_drops_log_lines_without_a_panic",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(QUIET_CHILD, "1")
        .env("EMM_LOG", BAD)
        .stderr(full)
        .output()
        .expect("the test runs itself");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed ({:?}):\n{stdout}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran the test: {stdout}"
    );
}

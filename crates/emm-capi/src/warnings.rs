//! The C functions of the log output (`log.rs`): capture warnings for the
//! program, and take them one by one.

use std::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

use crate::guard::guard;
use crate::log::{init, queue, CAPTURE, DROPPED, EMM_LOG_ERROR, QUEUE_CAP};
use crate::status::{emm_status, invalid, EMM_OK};

/// Warnings: `on` != 0 queues emm's warnings and errors for `emm_take_warning`
/// instead of printing them on standard error; 0 prints them (the default). Returns
/// the previous setting.
#[no_mangle]
pub extern "C" fn emm_capture_warnings(on: c_int) -> c_int {
    init();
    c_int::from(CAPTURE.swap(on != 0, Ordering::Relaxed))
}

/// Takes the oldest queued warning: copies it (NUL-terminated) into `buf` of `cap`
/// bytes, sets `*len` to its length and `*level` (may be NULL) to `EMM_LOG_ERROR`
/// or `EMM_LOG_WARN`, and removes it; `*len` is 0 when none is queued. With `buf`
/// NULL or `cap <= *len` it stays queued and the call returns
/// `EMM_ERR_INVALID_ARGUMENT` with `*len` the length needed (without the NUL). The
/// queue keeps the newest 256; when older ones were dropped, the next message
/// taken is an error saying how many.
#[no_mangle]
pub unsafe extern "C" fn emm_take_warning(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
    level: *mut c_int,
) -> emm_status {
    guard(|| {
        if len.is_null() {
            return invalid("emm_take_warning: `len` is null");
        }
        let mut q = queue();
        let dropped = DROPPED.load(Ordering::Relaxed);
        let notice = (dropped > 0).then(|| {
            (
                EMM_LOG_ERROR,
                format!(
                    "{dropped} earlier message(s) of emm were dropped: the queue keeps the newest {QUEUE_CAP}; take them more often (emm_take_warning)"
                ),
            )
        });
        let Some((code, text)) = notice.as_ref().or(q.front()) else {
            // SAFETY: `len` is non-null and writable per the contract.
            unsafe { *len = 0 };
            return EMM_OK;
        };
        let n = text.len();
        // SAFETY: `len` is non-null and writable per the contract.
        unsafe { *len = n };
        if buf.is_null() || cap <= n {
            return invalid(format!(
                "emm_take_warning: the message needs {} bytes, the buffer holds {cap}",
                n + 1
            ));
        }
        // SAFETY: `buf` holds `cap` > n writable bytes; `level` is null or writable.
        unsafe {
            core::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
            if !level.is_null() {
                *level = *code;
            }
        }
        if notice.is_some() {
            DROPPED.fetch_sub(dropped, Ordering::Relaxed);
        } else {
            q.pop_front();
        }
        EMM_OK
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::*;

    /// The queue is the process's: its tests take turns.
    static QUEUE_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Every message in the queue, oldest first, as `(level, text)`.
    fn take_all() -> Vec<(c_int, String)> {
        let mut out = Vec::new();
        let mut buf = [0 as c_char; 512];
        let (mut len, mut level) = (0usize, 0);
        loop {
            // SAFETY: live locals of the stated sizes.
            let s = unsafe { emm_take_warning(buf.as_mut_ptr(), buf.len(), &mut len, &mut level) };
            assert_eq!(s, EMM_OK);
            if len == 0 {
                return out;
            }
            // SAFETY: NUL-terminated by the call.
            let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
            out.push((level, text.to_string_lossy().into_owned()));
        }
    }

    #[test]
    fn messages_dropped_from_a_full_queue_are_said_to_be() {
        let _turn = QUEUE_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        init();
        let before = emm_capture_warnings(1);
        take_all();
        for i in 0..QUEUE_CAP + 44 {
            tracing::error!("flood {i}");
        }
        let got = take_all();
        emm_capture_warnings(before);
        let (level, notice) = &got[0];
        assert_eq!(*level, EMM_LOG_ERROR);
        let n: u64 = notice.split(' ').next().unwrap().parse().unwrap();
        assert!(
            n >= 44 && notice.contains("dropped") && notice.contains("256"),
            "{notice}"
        );
        // Another test's message may take a place in the queue meanwhile.
        let flood: Vec<usize> = got[1..]
            .iter()
            .filter_map(|(_, t)| t.strip_prefix("flood ")?.parse().ok())
            .collect();
        assert!(flood[0] >= 44, "the oldest were dropped: {flood:?}");
        assert!(flood.windows(2).all(|w| w[1] == w[0] + 1), "in order");
        assert_eq!(flood.last(), Some(&(QUEUE_CAP + 43)), "the newest kept");
        assert!(take_all().is_empty(), "said once");
    }

    #[test]
    fn an_invalid_filter_falls_back_to_warn_and_says_why() {
        let (f, notice) = filter_from(None);
        assert_eq!((f.to_string(), notice), ("warn".to_owned(), None));
        let (f, notice) = filter_from(Some("emm_pool=trace".into()));
        assert_eq!((f.to_string(), notice), ("emm_pool=trace".to_owned(), None));
        let (f, notice) = filter_from(Some("emm=notalevel".into()));
        assert_eq!(f.to_string(), "warn");
        let notice = notice.expect("a rejected value is reported");
        assert!(
            notice.starts_with("EMM_LOG=\"emm=notalevel\" is not a valid log filter (")
                && notice.contains("using `warn` instead"),
            "{notice}"
        );
        use std::os::unix::ffi::OsStringExt as _;
        let (f, notice) = filter_from(Some(std::ffi::OsString::from_vec(vec![0x66, 0xff])));
        assert_eq!(f.to_string(), "warn");
        assert!(notice.unwrap().contains("not valid UTF-8"));
    }

    #[test]
    fn captured_warnings_are_taken_in_order_and_not_lost_to_a_short_buffer() {
        let _turn = QUEUE_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        init();
        let before = emm_capture_warnings(1);
        // The router's override warning, as NBEP 7 asks for, through the queue.
        tracing::warn!(requested = "pool", "EMM_MEMORY_MANAGER=default overrides");
        tracing::error!("second");
        tracing::info!("not captured: below warn");
        let mut len = 0usize;
        let mut level = 0;
        let mut small = [0 as c_char; 4];
        // SAFETY: the buffers are live locals of the stated sizes.
        unsafe {
            assert_eq!(
                emm_take_warning(small.as_mut_ptr(), small.len(), &mut len, &mut level),
                crate::status::EMM_ERR_INVALID_ARGUMENT
            );
            let first = "EMM_MEMORY_MANAGER=default overrides (requested=\"pool\")";
            assert_eq!(len, first.len());
            let mut buf = [0 as c_char; 128];
            assert_eq!(
                emm_take_warning(buf.as_mut_ptr(), buf.len(), &mut len, &mut level),
                EMM_OK
            );
            assert_eq!(std::ffi::CStr::from_ptr(buf.as_ptr()).to_str(), Ok(first));
            assert_eq!(level, EMM_LOG_WARN);
            emm_take_warning(buf.as_mut_ptr(), buf.len(), &mut len, &mut level);
            assert_eq!(
                std::ffi::CStr::from_ptr(buf.as_ptr()).to_str(),
                Ok("second")
            );
            assert_eq!(level, EMM_LOG_ERROR);
            assert_eq!(
                emm_take_warning(buf.as_mut_ptr(), buf.len(), &mut len, &mut level),
                EMM_OK
            );
            assert_eq!(len, 0);
        }
        emm_capture_warnings(before);
    }
}

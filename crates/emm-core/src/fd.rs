//! Taking a file descriptor from another process (`pidfd_open` + `pidfd_getfd`).
//!
//! Chosen over `SCM_RIGHTS` on a Unix socket because an [`crate::IpcHandle`] must
//! stay plain bytes that any channel (a pipe, a file, Python's multiprocessing) can
//! carry; the price is Linux 5.6+ and ptrace permission over the exporter (same user
//! and the default `kernel.yama.ptrace_scope` ≤ 1, or `CAP_SYS_PTRACE`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{EmmError, Result};

/// A descriptor duplicated into this process; closed on drop.
#[derive(Debug)]
pub(crate) struct TakenFd(OwnedFd);

impl TakenFd {
    pub(crate) fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }
}

#[cfg(target_os = "linux")]
pub(crate) fn take_fd(pid: u32, fd: i32) -> Result<TakenFd> {
    let fail = |step: &str| EmmError::InvalidIpcHandle {
        reason: format!(
            "cannot take file descriptor {fd} of process {pid}: {step} failed: {}",
            std::io::Error::last_os_error()
        ),
    };
    if pid == std::process::id() {
        // Same process (tests, or a handle opened by its exporter): duplicate locally.
        // SAFETY: dup has no memory preconditions; a bad fd gives -1.
        let d = unsafe { libc::dup(fd) };
        if d < 0 {
            return Err(fail("dup"));
        }
        // SAFETY: `d` is a fresh descriptor we own.
        return Ok(TakenFd(unsafe { OwnedFd::from_raw_fd(d) }));
    }
    // SAFETY: raw syscall with integer arguments; failure is -1 with errno.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(fail("pidfd_open"));
    }
    // SAFETY: `pidfd` is a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: raw syscall with integer arguments; failure is -1 with errno.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(fail("pidfd_getfd"));
    }
    // SAFETY: `got` is a fresh descriptor we own.
    Ok(TakenFd(unsafe { OwnedFd::from_raw_fd(got as i32) }))
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn take_fd(pid: u32, fd: i32) -> Result<TakenFd> {
    Err(EmmError::InvalidIpcHandle {
        reason: format!("taking fd {fd} of process {pid} needs Linux's pidfd_getfd"),
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_of_this_process_is_duplicated() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let t = take_fd(std::process::id(), f.as_raw_fd()).unwrap();
        assert_ne!(t.raw(), f.as_raw_fd());
    }

    #[test]
    fn a_bad_descriptor_is_a_typed_error() {
        let e = take_fd(std::process::id(), 987_654).unwrap_err();
        assert!(e.to_string().contains("987654"), "{e}");
        let e = take_fd(u32::MAX - 1, 3).unwrap_err();
        assert!(e.to_string().contains("pidfd_open"), "{e}");
    }
}

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

impl AsRawFd for TakenFd {
    fn as_raw_fd(&self) -> i32 {
        self.0.as_raw_fd()
    }
}

/// Takes a duplicate of descriptor `fd` of process `pid`. Errors:
/// [`EmmError::IpcExporterGone`] when no process has that pid,
/// [`EmmError::IpcDescriptorRefused`] when the process will not give it (ptrace
/// permission, or a kernel without `pidfd_getfd`), and
/// [`EmmError::InvalidIpcHandle`] when the process has no such descriptor open
/// (a stale or foreign handle).
#[cfg(target_os = "linux")]
pub(crate) fn take_fd(pid: u32, fd: i32) -> Result<TakenFd> {
    if pid == std::process::id() {
        // Same process (tests, or a handle opened by its exporter): duplicate locally.
        // SAFETY: fcntl with integer arguments; a bad fd gives -1.
        let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if d < 0 {
            let err = std::io::Error::last_os_error();
            if let Some(detail) = out_of_descriptors(&err) {
                return Err(EmmError::IpcDescriptorRefused { pid, fd, detail });
            }
            return Err(EmmError::InvalidIpcHandle {
                reason: format!(
                    "file descriptor {fd} of this process (the exporter, {pid}) is not open: {err} (a stale handle: the exporter freed what it shared)"
                ),
            });
        }
        // SAFETY: `d` is a fresh descriptor we own.
        return Ok(TakenFd(unsafe { OwnedFd::from_raw_fd(d) }));
    }
    let Ok(raw_pid) = libc::pid_t::try_from(pid) else {
        return Err(EmmError::IpcExporterGone {
            pid,
            fd,
            detail: format!("{pid} is not a process id on this system"),
        });
    };
    // SAFETY: raw syscall with integer arguments; failure is -1 with errno.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
    if pidfd < 0 {
        let err = std::io::Error::last_os_error();
        if let Some(detail) = out_of_descriptors(&err) {
            return Err(EmmError::IpcDescriptorRefused { pid, fd, detail });
        }
        return Err(match err.raw_os_error() {
            Some(libc::ESRCH) => EmmError::IpcExporterGone {
                pid,
                fd,
                detail: format!("no process has that id (pidfd_open: {err}): the exporter exited"),
            },
            _ => EmmError::IpcDescriptorRefused {
                pid,
                fd,
                detail: format!(
                    "pidfd_open failed: {err} (pidfd_open needs Linux 5.3, pidfd_getfd 5.6)"
                ),
            },
        });
    }
    // SAFETY: `pidfd` is a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: raw syscall with integer arguments; failure is -1 with errno.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        let err = std::io::Error::last_os_error();
        if let Some(detail) = out_of_descriptors(&err) {
            return Err(EmmError::IpcDescriptorRefused { pid, fd, detail });
        }
        return Err(match err.raw_os_error() {
            Some(libc::ESRCH) => EmmError::IpcExporterGone {
                pid,
                fd,
                detail: format!("the process exited (pidfd_getfd: {err})"),
            },
            Some(libc::EBADF) => EmmError::InvalidIpcHandle {
                reason: format!(
                    "process {pid} has no file descriptor {fd} open (pidfd_getfd: {err}): a stale handle (the exporter freed what it shared) or one of another process"
                ),
            },
            Some(libc::EPERM) => EmmError::IpcDescriptorRefused {
                pid,
                fd,
                detail: format!(
                    "pidfd_getfd refused: {err}; it needs ptrace permission over the exporter ({}; or CAP_SYS_PTRACE, or run both as the same user)",
                    ptrace_scope()
                ),
            },
            _ => EmmError::IpcDescriptorRefused {
                pid,
                fd,
                detail: format!("pidfd_getfd failed: {err} (it needs Linux 5.6)"),
            },
        });
    }
    // SAFETY: `got` is a fresh descriptor we own.
    Ok(TakenFd(unsafe { OwnedFd::from_raw_fd(got as i32) }))
}

/// What to say when `err` is this process (`EMFILE`) or the system (`ENFILE`)
/// out of file descriptors; `None` for any other error.
#[cfg(target_os = "linux")]
fn out_of_descriptors(err: &std::io::Error) -> Option<String> {
    match err.raw_os_error() {
        Some(libc::EMFILE) => {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `lim` is a valid out-pointer.
            let limits = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
                format!(
                    "its limit is {} (hard limit {})",
                    lim.rlim_cur, lim.rlim_max
                )
            } else {
                "its limit could not be read".into()
            };
            Some(format!(
                "this process has as many file descriptors open as it may ({err}; {limits}): raise it (`ulimit -n`, RLIMIT_NOFILE) or close some"
            ))
        }
        Some(libc::ENFILE) => Some(format!(
            "the system has as many file descriptors open as it may ({err}; /proc/sys/fs/file-max)"
        )),
        _ => None,
    }
}

/// Yama's ptrace setting as a phrase for error messages.
#[cfg(target_os = "linux")]
fn ptrace_scope() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(v) => {
            let v = v.trim();
            let what = match v {
                "0" => "any process of the same user",
                "1" => "only descendants, or processes that allowed it with prctl(PR_SET_PTRACER)",
                "2" => "only with CAP_SYS_PTRACE",
                "3" => "never",
                _ => "unknown",
            };
            format!("kernel.yama.ptrace_scope is {v}: {what}")
        }
        Err(_) => "no Yama ptrace_scope on this system".into(),
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn take_fd(pid: u32, fd: i32) -> Result<TakenFd> {
    Err(EmmError::IpcDescriptorRefused {
        pid,
        fd,
        detail: "taking another process's descriptor needs Linux's pidfd_getfd".into(),
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_of_this_process_is_duplicated() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let t = take_fd(std::process::id(), f.as_raw_fd()).unwrap();
        assert_ne!(t.as_raw_fd(), f.as_raw_fd());
    }

    #[test]
    fn a_bad_descriptor_is_a_typed_error() {
        let e = take_fd(std::process::id(), 987_654).unwrap_err();
        assert!(
            matches!(&e, EmmError::InvalidIpcHandle { reason } if reason.contains("987654") && reason.contains("stale")),
            "{e}"
        );
        let e = take_fd(u32::MAX - 1, 3).unwrap_err();
        assert!(
            matches!(e, EmmError::IpcExporterGone { pid, fd: 3, .. } if pid == u32::MAX - 1),
            "{e}"
        );
        assert!(e.to_string().contains("process 4294967294"), "{e}");
    }

    /// Set in the child of `out_of_descriptors_is_said_so`.
    const FD_LIMIT_CHILD: &str = "EMM_TEST_FD_LIMIT_CHILD";

    #[test]
    fn out_of_descriptors_is_said_so() {
        // The descriptor limit is the process's: the check runs in a child (this
        // test binary again, running only `out_of_descriptors_child`).
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fd::tests::out_of_descriptors_child",
                "--nocapture",
            ])
            .env(FD_LIMIT_CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("checked: 1 passed"),
            "the child ran no check: {text}"
        );
    }

    #[test]
    fn out_of_descriptors_child() {
        if std::env::var_os(FD_LIMIT_CHILD).is_none() {
            return; // only in the child of `out_of_descriptors_is_said_so`
        }
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let limit = f.as_raw_fd() as u64 + 1;
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: valid pointers; this child process runs this one test.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            lim.rlim_cur = limit;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
        // Every free number below the limit taken: no descriptor is left.
        let mut fill = Vec::new();
        while let Ok(g) = std::fs::File::open("/proc/self/stat") {
            fill.push(g);
        }
        let e = take_fd(std::process::id(), f.as_raw_fd()).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, EmmError::IpcDescriptorRefused { .. }),
            "not a stale handle: {text}"
        );
        assert!(
            text.contains("as many file descriptors open as it may")
                && text.contains(&format!("its limit is {limit}"))
                && !text.contains("stale"),
            "{text}"
        );
        println!("checked: 1 passed ({text})");
    }

    #[test]
    fn an_exited_process_is_exporter_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap(); // reaped: the pid names no process now
        let e = take_fd(pid, 0).unwrap_err();
        assert!(
            matches!(&e, EmmError::IpcExporterGone { pid: p, .. } if *p == pid),
            "{e}"
        );
        println!("{e}");
    }

    #[test]
    fn a_descriptor_the_other_process_lacks_or_refuses_is_typed() {
        // A child of ours: ptrace permission holds for the same user under Yama
        // scopes 0 and 1 (a parent may trace its descendants).
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let e = take_fd(child.id(), 987_654).unwrap_err();
        let _ = child.kill();
        let _ = child.wait();
        println!("{e}");
        match e {
            EmmError::InvalidIpcHandle { reason } => {
                assert!(reason.contains("no file descriptor 987654"), "{reason}")
            }
            // Where ptrace is locked down (scope 2 or 3, seccomp), the refusal
            // itself is what is typed.
            EmmError::IpcDescriptorRefused {
                fd: 987_654,
                detail,
                ..
            } => {
                assert!(detail.contains("pidfd"), "{detail}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

//! The operating-system calls behind the model: anonymous mappings for device
//! memory, address reservations and memfd-backed physical handles for VMM.
//!
//! Every function returns `None` (or `false`) instead of failing loudly; callers
//! turn that into a `CUresult`.

use core::ffi::c_void;

/// Maps `len` bytes of zeroed, lazily committed, read-write memory (page aligned).
pub(crate) fn map_anon(len: usize) -> Option<u64> {
    // SAFETY: a fresh anonymous private mapping at an address the kernel picks
    // touches no existing memory.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// Unmaps `[addr, addr+len)`.
///
/// # Safety
/// The range must be a mapping made here that nothing uses any more.
pub(crate) unsafe fn unmap(addr: u64, len: usize) -> bool {
    // SAFETY: forwarded to the caller.
    unsafe { libc::munmap(addr as *mut c_void, len.max(1)) == 0 }
}

/// Reserves `len` bytes of inaccessible address space aligned to `align` (a power
/// of two, at least a page). Returns the aligned start; the whole reservation is
/// exactly `[start, start+len)` (the slack around it is given back).
pub(crate) fn reserve(len: usize, align: usize) -> Option<u64> {
    let total = len.checked_add(align)?;
    // SAFETY: a fresh inaccessible mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let raw = p as u64;
    let start = raw.div_ceil(align as u64) * align as u64;
    let head = (start - raw) as usize;
    let tail = total - head - len;
    // SAFETY: both slack pieces lie in the mapping made above and are unused.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((start + len as u64) as *mut c_void, tail);
        }
    }
    Some(start)
}

/// Puts `[addr, addr+len)` back to reserved, inaccessible address space.
///
/// # Safety
/// The range must lie in a reservation made by [`reserve`] and nothing may use it.
pub(crate) unsafe fn unreserve_into(addr: u64, len: usize) -> bool {
    // SAFETY: MAP_FIXED over a range the caller owns.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// A memfd of `len` bytes: the physical memory of one `cuMemCreate` handle.
pub(crate) fn memfd(len: usize) -> Option<i32> {
    let name = c"emm-standin-physical";
    // SAFETY: a valid NUL-terminated name; the new fd is ours.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is the memfd made above.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        // SAFETY: as above; closed once.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// Maps `len` bytes of `fd` from `offset` over `[addr, addr+len)`, shared, read-write.
///
/// # Safety
/// The range must lie in a reservation of [`reserve`] and not be mapped.
pub(crate) unsafe fn map_fd_fixed(addr: u64, len: usize, fd: i32, offset: usize) -> bool {
    // SAFETY: MAP_FIXED over a reserved range the caller owns.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            offset as libc::off_t,
        )
    };
    p != libc::MAP_FAILED
}

/// A new close-on-exec descriptor of what `fd` names.
pub(crate) fn dup(fd: i32) -> Option<i32> {
    // SAFETY: fcntl with integer arguments; a bad fd gives -1.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    (d >= 0).then_some(d)
}

/// The size and identity (device, inode) of the file behind `fd`.
pub(crate) fn identity(fd: i32) -> Option<(usize, (u64, u64))> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; a bad fd gives -1.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    let size = usize::try_from(st.st_size).ok()?;
    Some((size, (st.st_dev, st.st_ino)))
}

/// Whether `fd` is a physical handle's memfd ([`memfd`]'s name).
pub(crate) fn is_physical(fd: i32) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|l| {
        l.to_string_lossy()
            .starts_with("/memfd:emm-standin-physical")
    })
}

/// Closes `fd`.
pub(crate) fn close(fd: i32) {
    // SAFETY: the caller owns `fd` and closes it once.
    unsafe { libc::close(fd) };
}

//! Copies and memsets. They run at call time; device ranges must lie in live,
//! accessible ranges of the model (else `CUDA_ERROR_INVALID_VALUE`), so a copy to
//! freed memory is caught instead of corrupting the host.

use core::ffi::{c_uint, c_void};

use emm_sys::{CUcontext, CUdeviceptr, CUresult, CUstream};

use crate::state::{call, State};

fn dev_range(st: &State, p: CUdeviceptr, len: usize) -> Result<(), CUresult> {
    st.contexts.current_device(st.config.devices)?;
    if st.mem.covers(p, len) {
        Ok(())
    } else {
        Err(CUresult::ERROR_INVALID_VALUE)
    }
}

fn host(p: *const c_void, len: usize) -> Result<(), CUresult> {
    if p.is_null() && len > 0 {
        Err(CUresult::ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// Copies `len` bytes.
///
/// # Safety
/// Both ranges are valid for `len` bytes (checked for device ranges, the
/// caller's contract for host ones).
unsafe fn copy(dst: u64, src: u64, len: usize) {
    if len > 0 {
        // SAFETY: forwarded to the caller; `copy` allows overlap.
        unsafe { core::ptr::copy(src as *const u8, dst as *mut u8, len) };
    }
}

macro_rules! copy_fn {
    ($(#[$m:meta])* $name:ident ($($arg:ident : $ty:ty),*) $stream:expr; |$st:ident| $check:block => ($dst:expr, $src:expr, $len:expr)) => {
        $(#[$m])*
        ///
        /// # Safety
        /// Host buffers must hold `len` bytes (see [the module docs](crate::exports)).
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            call(stringify!($name), |$st| {
                $check
                let s: Option<CUstream> = $stream;
                if let Some(s) = s {
                    $st.streams.queued(s.0 as u64)?;
                }
                // SAFETY: device ranges were checked above; host ranges are the caller's contract.
                unsafe { copy($dst, $src, $len) };
                Ok(())
            })
        }
    };
}

copy_fn! {
    /// `cuMemcpyHtoD_v2`.
    cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, len: usize) None;
    |st| { dev_range(st, dst, len)?; host(src, len)?; } => (dst, src as u64, len)
}
copy_fn! {
    /// `cuMemcpyDtoH_v2`.
    cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, len: usize) None;
    |st| { dev_range(st, src, len)?; host(dst, len)?; } => (dst as u64, src, len)
}
copy_fn! {
    /// `cuMemcpyDtoD_v2`.
    cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, len: usize) None;
    |st| { dev_range(st, dst, len)?; dev_range(st, src, len)?; } => (dst, src, len)
}
copy_fn! {
    /// `cuMemcpyHtoDAsync_v2` (runs at call time).
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, len: usize, stream: CUstream) Some(stream);
    |st| { dev_range(st, dst, len)?; host(src, len)?; } => (dst, src as u64, len)
}
copy_fn! {
    /// `cuMemcpyDtoHAsync_v2` (runs at call time).
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, len: usize, stream: CUstream) Some(stream);
    |st| { dev_range(st, src, len)?; host(dst, len)?; } => (dst as u64, src, len)
}
copy_fn! {
    /// `cuMemcpyDtoDAsync_v2` (runs at call time).
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, len: usize, stream: CUstream) Some(stream);
    |st| { dev_range(st, dst, len)?; dev_range(st, src, len)?; } => (dst, src, len)
}
copy_fn! {
    /// `cuMemcpyPeer`: both contexts must be primary contexts of the model.
    cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, len: usize) None;
    |st| {
        for c in [dst_ctx, src_ctx] {
            crate::context::ctx_device(c.0 as u64, st.config.devices).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        }
        dev_range(st, dst, len)?;
        dev_range(st, src, len)?;
    } => (dst, src, len)
}

fn fill(
    st: &mut State,
    dst: CUdeviceptr,
    bytes: usize,
    stream: Option<CUstream>,
    f: impl FnOnce(u64),
) -> Result<(), CUresult> {
    dev_range(st, dst, bytes)?;
    if let Some(s) = stream {
        st.streams.queued(s.0 as u64)?;
    }
    f(dst);
    Ok(())
}

fn set8(dst: u64, v: u8, n: usize) {
    // SAFETY: callers checked that `[dst, dst+n)` is a live accessible range.
    unsafe { core::ptr::write_bytes(dst as *mut u8, v, n) };
}

fn set32(dst: u64, v: c_uint, n: usize) -> Result<(), CUresult> {
    if dst % 4 != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    for i in 0..n {
        // SAFETY: callers checked `[dst, dst+4n)`; `dst` is 4-byte aligned.
        unsafe { (dst as *mut u32).add(i).write(v) };
    }
    Ok(())
}

/// `cuMemsetD8_v2`.
///
/// # Safety
/// None beyond the C ABI (the range is checked).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    call("cuMemsetD8_v2", |st| {
        fill(st, dst, n, None, |d| set8(d, v, n))
    })
}

/// `cuMemsetD8Async` (runs at call time).
///
/// # Safety
/// None beyond the C ABI (the range is checked).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    v: u8,
    n: usize,
    s: CUstream,
) -> CUresult {
    call("cuMemsetD8Async", |st| {
        fill(st, dst, n, Some(s), |d| set8(d, v, n))
    })
}

/// `cuMemsetD32_v2`: `n` 32-bit words; `dst` must be 4-byte aligned.
///
/// # Safety
/// None beyond the C ABI (the range is checked).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult {
    call("cuMemsetD32_v2", |st| {
        let mut r = Ok(());
        fill(st, dst, n.saturating_mul(4), None, |d| r = set32(d, v, n))?;
        r
    })
}

/// `cuMemsetD32Async` (runs at call time).
///
/// # Safety
/// None beyond the C ABI (the range is checked).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    v: c_uint,
    n: usize,
    s: CUstream,
) -> CUresult {
    call("cuMemsetD32Async", |st| {
        let mut r = Ok(());
        fill(st, dst, n.saturating_mul(4), Some(s), |d| {
            r = set32(d, v, n)
        })?;
        r
    })
}

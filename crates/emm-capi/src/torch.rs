//! PyTorch's allocator hooks: the pluggable allocator's pair (`emm_torch_alloc`,
//! `emm_torch_free`), the deleter of emm's own object (`emm_torch_release`) and
//! `Tensor.record_stream` (`emm_torch_record_stream`), over the bridge's devices.

use std::ffi::{c_int, c_void};

use crate::bridge::timing::{self, Hook};
use crate::ffi::stream_of;
use crate::guard::guard;
use crate::status::{emm_status, invalid, ssize_t, EMM_OK};

use crate::bridge::devices::*;

/// PyTorch's pluggable allocator (`torch.cuda.memory.CUDAPluggableAllocator`), on
/// the process's manager (`EMM_MEMORY_MANAGER`, else the one configured, else
/// "pool"): allocates `size` bytes on `device` ordered on `stream`. Returns NULL on
/// failure; `emm_last_error` says why. (emm's own allocator object, which
/// `emm.torch.install()` sets up, raises `torch.OutOfMemoryError` with that reason;
/// PyTorch's `CUDAPluggableAllocator` does not check, and hands out a tensor at
/// address 0.)
#[no_mangle]
pub extern "C" fn emm_torch_alloc(
    size: ssize_t,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let mut out: *mut c_void = core::ptr::null_mut();
    let _ = timing::timed(Hook::Alloc, || {
        guard(|| {
            let Ok(size) = usize::try_from(size) else {
                return invalid(format!("emm_torch_alloc: negative size {size}"));
            };
            match live_alloc(device, size, stream_of(stream)) {
                Ok(p) => {
                    out = p as *mut c_void;
                    EMM_OK
                }
                Err(code) => code,
            }
        })
    });
    out
}

/// PyTorch's pluggable allocator: frees `ptr` from `emm_torch_alloc`, ordered on
/// `stream` (`size` is not needed: emm knows it).
#[no_mangle]
pub extern "C" fn emm_torch_free(
    ptr: *mut c_void,
    size: ssize_t,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = size; // named in the generated header; emm knows each block's size
    let _ = timing::timed(Hook::Free, || {
        guard(|| {
            if ptr.is_null() {
                return EMM_OK;
            }
            live_free(
                "emm_torch_free",
                device,
                ptr as u64,
                Some(stream_of(stream)),
            )
        })
    });
}

/// Frees `ptr` from [`emm_torch_alloc`] on `device` (-1: whichever device holds
/// it), ordered on the stream it was allocated on, after the work queued so far on
/// every other stream it was used on ([`emm_torch_record_stream`]): the deleter of
/// the tensors of emm's own PyTorch allocator object (`emm.torch.install()`, built
/// from `python/emm/_torch_native.cpp`), which knows neither the size nor the
/// stream, and cannot pass a status on. A null `ptr` does nothing; an address emm
/// did not hand out on that device (or on any, for -1) is
/// `EMM_ERR_INVALID_ARGUMENT` and frees nothing (a device emm never used is not
/// set up for it). Where the work of a stream it was used on cannot be waited
/// for (the stream was destroyed), the block is freed after a synchronization of
/// the device (or, while a CUDA graph capture runs, once the captures end), with a
/// warning; only if that fails too is the status an error, and the block then
/// stays live for a later release. A free the manager refuses (a driver call
/// failed) returns that status and the block is kept: emm frees it again at the
/// next free on its device (at most every 64th while the fault lasts) or at
/// `emm_torch_empty_cache`; the address is emm's from then on, and releasing it
/// again is refused. Every failure is also logged as a warning (`EMM_LOG`).
/// Since ABI 306.
#[no_mangle]
pub extern "C" fn emm_torch_release(ptr: *mut c_void, device: c_int) -> emm_status {
    timing::timed(Hook::Free, || {
        let code = guard(|| {
            if ptr.is_null() {
                return EMM_OK;
            }
            let what = "emm_torch_release";
            if device == -1 {
                return live_free_any(what, ptr as u64);
            }
            // Only a device emm has set up can hold it (a free sets none up).
            known_device(device)
                .and_then(|d| free_known(what, d, ptr as u64, None))
                .unwrap_or_else(|| {
                    invalid(format!(
                        "{what}: {:#x} is not an emm allocation of device {device}",
                        ptr as u64
                    ))
                })
        });
        if code != EMM_OK {
            let msg = crate::status::last_error_message();
            tracing::warn!("a tensor's free failed: {msg}");
        }
        code
    })
}

/// PyTorch's `Tensor.record_stream`: the allocation at `ptr` (from
/// `emm_torch_alloc` on `device`; the base address of the tensor's storage) is
/// used on `stream` as well as on the stream it was allocated on. Its free then
/// makes its own stream wait for the work queued on `stream` up to that moment
/// (an event and `cuStreamWaitEvent`; nothing blocks on the host), so the memory
/// is not reused while that work may still touch it. PyTorch's pluggable allocator
/// does not forward `record_stream` calls (it has no Python setting for them), so
/// `emm.torch.install()` routes `torch.Tensor.record_stream` here. A null `ptr` or
/// the allocation's own stream does nothing; an address emm did not hand out is
/// `EMM_ERR_INVALID_ARGUMENT` (PyTorch's own allocator ignores memory it did not
/// allocate, and so does `emm.torch`), and so is a stream handle the driver does
/// not know (`cuStreamIsCapturing` refuses it): nothing is recorded then. Since
/// ABI 305.
#[no_mangle]
pub extern "C" fn emm_torch_record_stream(
    ptr: *mut c_void,
    device: c_int,
    stream: *mut c_void,
) -> emm_status {
    guard(|| {
        if ptr.is_null() {
            return EMM_OK;
        }
        live_record_stream(device, ptr as u64, stream_of(stream))
    })
}

//! Tags, pause and resume over the C ABI (since ABI 310): regions that tag the
//! allocations made while they are open, and a tag's memory given back to the
//! device and mapped again at the same addresses (sleep mode for RL and
//! serving). See `emm_core::tags` for the semantics.

use std::ffi::{c_char, c_int};

use emm_core::{Keep, PauseReport, Tag};

use crate::ffi::c_str;
use crate::guard::guard;
use crate::status::{emm_status, fail, invalid, EMM_OK};

/// `keep` of `emm_pause`: the tagged blocks' contents are not kept (after the
/// resume they hold whatever fresh memory holds). Since ABI 310.
pub const EMM_KEEP_NOTHING: c_int = 0;
/// `keep` of `emm_pause`: the live tagged blocks' bytes are copied to pinned host
/// memory first and back by `emm_resume`. Since ABI 310.
pub const EMM_KEEP_HOST: c_int = 1;

/// Opens a region: allocations made from now on, by every thread of the
/// process on every device, carry the tag named `tag` (interned on first use)
/// until the region is closed by `emm_region_exit(*region)`. The open regions
/// form one process-wide stack: the tag of the most recently opened region still
/// open is current; closing one takes it out wherever it is. An empty name, one
/// longer than 255 bytes, or a null `region` is `EMM_ERR_INVALID_ARGUMENT`.
/// Since ABI 310.
///
/// # Safety
/// `tag` is a NUL-terminated string; `region` points to writable memory.
#[no_mangle]
pub unsafe extern "C" fn emm_region_enter(tag: *const c_char, region: *mut u64) -> emm_status {
    guard(|| {
        let name = match c_str(tag, "emm_region_enter: `tag`") {
            Ok(n) => n,
            Err(c) => return c,
        };
        if region.is_null() {
            return invalid("emm_region_enter: `region` is null");
        }
        match Tag::named(name) {
            Ok(t) => {
                let id = emm_core::tags::enter_region(t);
                // SAFETY: non-null and writable per the contract.
                unsafe { *region = id };
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Closes the region `emm_region_enter` returned in `*region`. A region that is
/// not open (closed already, or never opened) is `EMM_ERR_INVALID_ARGUMENT`.
/// Since ABI 310.
#[no_mangle]
pub extern "C" fn emm_region_exit(region: u64) -> emm_status {
    guard(|| {
        if emm_core::tags::exit_region(region) {
            EMM_OK
        } else {
            invalid(format!(
                "emm_region_exit: region {region} is not open (closed already, or not from emm_region_enter)"
            ))
        }
    })
}

/// The `n` tags named by `tags`, or the status of the first bad name.
///
/// # Safety
/// `tags` points to `n` NUL-terminated strings (or is null with `n` 0).
unsafe fn tag_list(
    tags: *const *const c_char,
    n: usize,
    what: &str,
) -> Result<Vec<Tag>, emm_status> {
    if n == 0 {
        return Err(invalid(format!("{what}: no tag given (`n` is 0)")));
    }
    if tags.is_null() {
        return Err(invalid(format!("{what}: `tags` is null")));
    }
    (0..n)
        .map(|i| {
            // SAFETY: `tags` holds `n` pointers per the contract.
            let p = unsafe { *tags.add(i) };
            let name = c_str(p, what)?;
            Tag::named(name).map_err(fail)
        })
        .collect()
}

fn report(r: PauseReport, bytes: *mut usize, copied: *mut usize) {
    for (p, v) in [(bytes, r.bytes), (copied, r.copied_bytes)] {
        if !p.is_null() {
            // SAFETY: non-null and writable per the contract.
            unsafe { *p = v };
        }
    }
}

/// Pauses the `n` tags named by `tags` on every device and manager of the
/// process: allocating under them fails with `EMM_ERR_TAG_STATE` until
/// `emm_resume`, and the device memory of their blocks goes back to the device
/// while their addresses stay reserved. `keep` is `EMM_KEEP_NOTHING` or
/// `EMM_KEEP_HOST` (the live blocks' bytes copied to pinned host memory first).
/// `*bytes` (may be NULL) receives the bytes given back, `*copied` (may be NULL)
/// those copied. Refusals change nothing; after a driver failure in the middle,
/// a tag some manager could not give its memory back to stays paused (see
/// `emm_tag_stats`), and `emm_resume` finishes the job. `"default"`, a tag
/// already paused, memory that cannot be paused (no virtual memory management),
/// or a CUDA graph capture (or `use_mem_pool`) in progress through PyTorch's allocator object is
/// `EMM_ERR_TAG_STATE`; a synchronization the driver refuses (a capture begun
/// elsewhere) is `EMM_ERR_DRIVER`. Since ABI 310.
///
/// # Safety
/// `tags` points to `n` NUL-terminated strings; `bytes` and `copied` are null or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn emm_pause(
    tags: *const *const c_char,
    n: usize,
    keep: c_int,
    bytes: *mut usize,
    copied: *mut usize,
) -> emm_status {
    guard(|| {
        let keep = match keep {
            EMM_KEEP_NOTHING => Keep::Nothing,
            EMM_KEEP_HOST => Keep::Host,
            k => {
                return invalid(format!(
                    "emm_pause: `keep` is {k}, expected EMM_KEEP_NOTHING (0) or EMM_KEEP_HOST (1)"
                ))
            }
        };
        // SAFETY: forwarded to the caller.
        let tags = match unsafe { tag_list(tags, n, "emm_pause") } {
            Ok(t) => t,
            Err(c) => return c,
        };
        if crate::bridge::devices::any_capture_routing() {
            return fail(tags[0].state_error(
                "pause",
                "a CUDA graph capture or torch.cuda.use_mem_pool is in progress (a pause synchronizes the device, which would invalidate a capture): pause after it ends",
            ));
        }
        match emm::pause(&tags, keep) {
            Ok(r) => {
                report(r, bytes, copied);
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// Resumes the `n` tags named by `tags`: fresh device memory under their blocks,
/// at the same addresses, and the bytes a pause kept copied back; then they
/// allocate again. `*bytes` and `*copied` (each may be NULL) receive the bytes
/// mapped and copied back. A tag that is not paused is `EMM_ERR_TAG_STATE`; a
/// device too full is `EMM_ERR_OUT_OF_MEMORY`, after which the tags stay paused and
/// a later call resumes what is left. Since ABI 310.
///
/// # Safety
/// As `emm_pause`.
#[no_mangle]
pub unsafe extern "C" fn emm_resume(
    tags: *const *const c_char,
    n: usize,
    bytes: *mut usize,
    copied: *mut usize,
) -> emm_status {
    guard(|| {
        // SAFETY: forwarded to the caller.
        let tags = match unsafe { tag_list(tags, n, "emm_resume") } {
            Ok(t) => t,
            Err(c) => return c,
        };
        match emm::resume(&tags) {
            Ok(r) => {
                report(r, bytes, copied);
                EMM_OK
            }
            Err(e) => fail(e),
        }
    })
}

/// The memory under the tag named `tag`, summed over every manager of the
/// process: bytes handed out, bytes of device memory held (paused memory
/// excluded), bytes paused, bytes of pinned host memory held for its copies (a
/// pause's, and the buffers kept after a resume for the next pause until a trim),
/// and whether the tag is paused (1) or not (0). Any output may be NULL. Since
/// ABI 310.
///
/// # Safety
/// `tag` is a NUL-terminated string; each output is null or writable.
#[no_mangle]
pub unsafe extern "C" fn emm_tag_stats(
    tag: *const c_char,
    allocated: *mut usize,
    reserved: *mut usize,
    paused_bytes: *mut usize,
    host_copy_bytes: *mut usize,
    paused: *mut c_int,
) -> emm_status {
    guard(|| {
        let name = match c_str(tag, "emm_tag_stats: `tag`") {
            Ok(n) => n,
            Err(c) => return c,
        };
        // (Looked up, not interned: asking about a name uses up no tag.)
        let t = emm_core::tags::find(name);
        let (mut a, mut r, mut p, mut h) = (0, 0, 0, 0);
        for (_, s) in emm::tag_stats() {
            if s.tag == name {
                a += s.allocated_bytes;
                r += s.reserved_bytes;
                p += s.paused_bytes;
                h += s.host_copy_bytes;
            }
        }
        for (out, v) in [
            (allocated, a),
            (reserved, r),
            (paused_bytes, p),
            (host_copy_bytes, h),
        ] {
            if !out.is_null() {
                // SAFETY: non-null and writable per the contract.
                unsafe { *out = v };
            }
        }
        if !paused.is_null() {
            // SAFETY: non-null and writable per the contract.
            unsafe { *paused = c_int::from(t.is_some_and(Tag::is_paused)) };
        }
        EMM_OK
    })
}

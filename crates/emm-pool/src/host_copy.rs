//! [`HostCopy`]: a block's bytes kept in pinned host memory while its tag is
//! paused (see `arena/pause.rs`).

use emm_core::Result;
use emm_driver::Context;
use emm_sys::CUdeviceptr;

/// `len` bytes of page-locked host memory holding a copy of device memory.
pub(crate) struct HostCopy {
    ptr: *mut u8,
    len: usize,
    ctx: Context,
}

// SAFETY: the buffer is owned by this value alone (allocated in `save`, freed in
// `Drop`), and the context handle may be used from any thread.
unsafe impl Send for HostCopy {}

impl HostCopy {
    /// Copies `len` bytes at `src` (device memory the device is done with) into a
    /// new pinned buffer.
    pub(crate) fn save(ctx: &Context, src: CUdeviceptr, len: usize) -> Result<HostCopy> {
        let ptr = emm_driver::memory::host_alloc(ctx, len.max(1), 0)?;
        let copy = HostCopy {
            ptr,
            len,
            ctx: ctx.clone(),
        };
        // SAFETY: `ptr` holds `len` bytes (allocated above, owned by `copy`), and
        // the caller passes device memory of `len` bytes at `src`.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(copy.ptr, len);
            emm_driver::memory::copy_dtoh(ctx, dst, src)?;
        }
        Ok(copy)
    }

    /// Copies the kept bytes to `dst` (device memory of at least `len` bytes).
    pub(crate) fn restore(&self, dst: CUdeviceptr) -> Result<()> {
        // SAFETY: `ptr` holds `len` initialised bytes (written by `save`); the
        // caller passes device memory of that size at `dst`.
        unsafe {
            let src = std::slice::from_raw_parts(self.ptr, self.len);
            emm_driver::memory::copy_htod(&self.ctx, dst, src)?;
        }
        Ok(())
    }

    /// Bytes kept.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `host_alloc` in `save` and is freed once, here;
        // the copies into and out of it were synchronous.
        if let Err(e) = unsafe { emm_driver::memory::free_host(&self.ctx, self.ptr) } {
            tracing::error!(error = %e, bytes = self.len, "freeing the pinned copy of a paused block failed; its host memory stays held");
        }
    }
}

//! [`HostCopy`]: a block's bytes kept in pinned host memory while its tag is
//! paused (see `arena/pause.rs`).
//!
//! Pinning is what costs: on an H100, allocating 1 GiB of pinned memory took
//! 365-398 ms and copying a GiB into it or out of it 19.5 ms, where a pageable
//! buffer took 674-811 ms out (its pages touched for the first time) and 119-132
//! ms in (run 177). So a tag's pool keeps its pinned buffers after a resume, for
//! the next pause to copy into (an RL loop pauses the same tensors every step),
//! until a trim (`empty_cache`) gives them back.

use emm_core::Result;
use emm_driver::Context;
use emm_sys::CUdeviceptr;

/// A pinned host buffer of `capacity` bytes, the first `len` of which hold a copy
/// of device memory.
pub(crate) struct HostCopy {
    ptr: *mut u8,
    capacity: usize,
    len: usize,
    ctx: Context,
}

// SAFETY: the buffer is owned by this value alone (allocated in `new`, freed in
// `Drop`), and the context handle may be used from any thread.
unsafe impl Send for HostCopy {}

impl HostCopy {
    /// A new pinned buffer of `capacity` bytes, holding nothing yet.
    pub(crate) fn new(ctx: &Context, capacity: usize) -> Result<HostCopy> {
        let ptr = emm_driver::memory::host_alloc(ctx, capacity.max(1), 0)?;
        Ok(HostCopy {
            ptr,
            capacity: capacity.max(1),
            len: 0,
            ctx: ctx.clone(),
        })
    }

    /// Copies `len` bytes at `src` (device memory the device is done with) into
    /// the buffer; `len` beyond the capacity is an internal error.
    pub(crate) fn save(&mut self, src: CUdeviceptr, len: usize) -> Result<()> {
        if len > self.capacity {
            return Err(emm_core::EmmError::Internal {
                operation: "keeping a block in host memory",
                detail: format!("{len} bytes into a buffer of {}", self.capacity),
            });
        }
        // SAFETY: `ptr` holds `capacity` >= `len` writable bytes, owned by
        // `self` (perhaps not initialised yet: the raw copy writes them without
        // reading); the caller passes device memory of `len` bytes at `src`.
        unsafe { emm_driver::memory::copy_dtoh_raw(&self.ctx, self.ptr, src, len)? };
        self.len = len;
        Ok(())
    }

    /// Copies the kept bytes to `dst` (device memory of at least `len` bytes).
    pub(crate) fn restore(&self, dst: CUdeviceptr) -> Result<()> {
        // SAFETY: `ptr` holds `len` initialised bytes (written by `save`, which
        // set `len`; 0 before, an empty slice); the caller passes device memory
        // of that size at `dst`.
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

    /// Bytes the buffer holds room for (pinned host memory held).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `host_alloc` in `new` and is freed once, here;
        // the copies into and out of it were synchronous.
        if let Err(e) = unsafe { emm_driver::memory::free_host(&self.ctx, self.ptr) } {
            tracing::error!(error = %e, bytes = self.capacity, "freeing the pinned copy of a paused block failed; its host memory stays held");
        }
    }
}

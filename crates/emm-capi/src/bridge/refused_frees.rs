//! Frees by address that the manager refused (a driver call failed): the caller
//! (PyTorch's allocator, CuPy) takes the address as freed and never frees it
//! again, so emm keeps each such block and frees it again itself: on a later
//! free on its device (every [`RETRY_EVERY`] frees while any is kept, so a
//! fault that lasts costs a retry now and then, not one a free) and at
//! `emm_torch_empty_cache`. A block is never lost and never freed twice; its
//! address is emm's until then, and the caller must not free it again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use emm_core::{DeviceAllocation, EmmError, NotFreed};

use crate::ffi::lock;

/// One device's blocks whose free was refused, kept to be freed again.
#[derive(Default)]
pub(crate) struct RefusedFrees {
    blocks: Mutex<Vec<DeviceAllocation>>,
    /// Whether `blocks` holds any: the free path reads this, not the lock.
    any: AtomicBool,
    /// Frees on the device since the last retry while blocks are kept.
    frees: AtomicU32,
}

/// Frees on a device between two retries of its kept blocks.
pub(crate) const RETRY_EVERY: u32 = 64;

impl RefusedFrees {
    /// Keeps the block a refused free gave back; the refusal's error.
    pub(crate) fn keep(&self, refused: NotFreed) -> EmmError {
        let NotFreed { allocation, error } = refused;
        lock(&self.blocks).push(allocation);
        self.any.store(true, Ordering::Release);
        error
    }

    /// Blocks kept now, and their bytes.
    pub(crate) fn held(&self) -> (usize, usize) {
        let blocks = lock(&self.blocks);
        (
            blocks.len(),
            blocks.iter().map(DeviceAllocation::size).sum(),
        )
    }

    /// Frees every kept block again: the bytes freed, or the first refusal's
    /// error (the blocks refused again stay kept).
    pub(crate) fn retry(&self) -> Result<usize, EmmError> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(0);
        }
        let taken = std::mem::take(&mut *lock(&self.blocks));
        let (mut freed, mut first) = (0usize, None);
        for a in taken {
            let size = a.size();
            match a.free() {
                Ok(()) => freed = freed.saturating_add(size),
                Err(refused) => {
                    let e = self.keep(*refused);
                    first.get_or_insert(e);
                }
            }
        }
        let blocks = lock(&self.blocks);
        self.any.store(!blocks.is_empty(), Ordering::Release);
        drop(blocks);
        first.map_or(Ok(freed), Err)
    }

    /// [`RefusedFrees::retry`] on every [`RETRY_EVERY`]-th call while blocks
    /// are kept (the free path's: one atomic load when none is).
    pub(crate) fn retry_if_due(&self) -> Result<usize, EmmError> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(0);
        }
        if self.frees.fetch_add(1, Ordering::Relaxed) % RETRY_EVERY != 0 {
            return Ok(0);
        }
        self.retry()
    }
}

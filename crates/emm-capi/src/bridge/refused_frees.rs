//! Frees by address that the manager refused (a driver call failed): the caller
//! (PyTorch's allocator, CuPy) takes the address as freed and never frees it
//! again, so emm keeps each such block and frees it again itself: at the next
//! free on its device, at `emm_torch_empty_cache`, and when the address is freed
//! again. A block is never lost and never freed twice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use emm_core::{DeviceAllocation, EmmError, NotFreed};

use crate::ffi::lock;

/// One device's blocks whose free was refused, kept to be freed again.
#[derive(Default)]
pub(crate) struct RefusedFrees {
    blocks: Mutex<Vec<DeviceAllocation>>,
    /// Whether `blocks` holds any: the free path reads this, not the lock.
    any: AtomicBool,
}

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

    /// Frees the kept block at `ptr` again: `None` when none is kept there.
    pub(crate) fn retry_at(&self, ptr: u64) -> Option<Result<(), EmmError>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let a = {
            let mut blocks = lock(&self.blocks);
            let i = blocks.iter().position(|a| a.ptr() == ptr)?;
            let a = blocks.swap_remove(i);
            self.any.store(!blocks.is_empty(), Ordering::Release);
            a
        };
        Some(a.free().map_err(|refused| self.keep(*refused)))
    }
}

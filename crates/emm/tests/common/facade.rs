//! A manager through the façade as the soak tests drive it: the blocks it handed
//! out, by address.

use std::collections::HashMap;
use std::sync::Mutex;

use emm::{DeviceAllocation, MemoryManager};
use emm_sys::CUstream;

use super::soak::Target;

/// A manager through the façade: the blocks it handed out, by address.
pub struct Facade {
    pub m: Box<dyn MemoryManager>,
    blocks: Mutex<HashMap<u64, DeviceAllocation>>,
}

impl Facade {
    /// `m`, holding nothing yet.
    pub fn new(m: Box<dyn MemoryManager>) -> Facade {
        Facade {
            m,
            blocks: Mutex::new(HashMap::new()),
        }
    }
}

impl Target for Facade {
    fn alloc(&self, size: usize, stream: CUstream) -> Result<u64, String> {
        let a = if stream.0.is_null() {
            self.m.memalloc(size)
        } else {
            self.m.memalloc_async(size, stream)
        }
        .map_err(|e| e.to_string())?;
        let ptr = a.ptr();
        if let Some(old) = self
            .blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr, a)
        {
            return Err(format!(
                "{ptr:#x} handed out while a block of {} bytes is live there",
                old.size()
            ));
        }
        Ok(ptr)
    }
    fn free(&self, ptr: u64, size: usize, _stream: CUstream) -> Result<(), String> {
        let a = self
            .blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr)
            .ok_or_else(|| format!("freeing {ptr:#x}, which is not live"))?;
        if a.size() != size {
            return Err(format!("{ptr:#x} has {} bytes, not {size}", a.size()));
        }
        drop(a);
        Ok(())
    }
    fn trim(&self) -> Result<(), String> {
        // A free refused under a limit may be reported by the first call after
        // it; the next one succeeds.
        self.m
            .release_cached()
            .or_else(|_| self.m.release_cached())
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn bytes(&self) -> Result<(u64, u64), String> {
        let (st, managed) = (self.m.stats(), self.m.managed_stats());
        Ok((
            st.allocated_bytes as u64,
            (st.reserved_bytes + managed.allocated_bytes + managed.pending_bytes) as u64,
        ))
    }
}

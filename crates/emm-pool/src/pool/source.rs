//! What the arena takes memory from: the pool's upstream and virtual memory.

use emm_core::{EmmError, Result};
use emm_default::Upstream;
use emm_driver::Context;
use emm_sys::CUdeviceptr;

use crate::arena::SegmentSource;
use crate::events::EventId;
use crate::growth_phases::{self, Phase};
use crate::host_copy::HostCopy;
use crate::unmapper::{UnmapJob, Unmapper};
use crate::vmm::VirtualMemory;

/// The arena's [`SegmentSource`]: segments from the pool's upstream, the
/// expandable segment from its virtual memory (when it has any), copies to host
/// memory through its context (when it serves a real one), old mappings of
/// moved pieces unmapped by its helper thread (when it has one).
pub(super) struct SourceAdapter<'a>(
    pub(super) &'a dyn Upstream,
    pub(super) Option<&'a dyn VirtualMemory>,
    pub(super) Option<&'a Context>,
    pub(super) Option<&'a Unmapper>,
);

impl<'a> SourceAdapter<'a> {
    fn vmm(&self, operation: &'static str) -> Result<&'a dyn VirtualMemory> {
        self.1.ok_or(EmmError::Unsupported {
            manager: "pool".into(),
            operation,
        })
    }
}

impl SegmentSource for SourceAdapter<'_> {
    fn reserve(&self, size: usize) -> Result<Option<CUdeviceptr>> {
        match self.1 {
            Some(v) => v.reserve(size).map(Some),
            None => Ok(None),
        }
    }
    fn unmap(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.vmm("unmap")?.unmap(addr, len)
    }
    fn unmap_done(&self, addr: CUdeviceptr, len: usize) -> Result<()> {
        self.vmm("unmap")?.unmap_done(addr, len)
    }
    fn unmap_later(
        &self,
        maps: &[(CUdeviceptr, usize)],
        event: Option<EventId>,
    ) -> Option<std::sync::Arc<UnmapJob>> {
        let job = UnmapJob::new(maps.to_vec(), event);
        self.3?.submit(&job).then_some(job)
    }
    fn map_pieces(
        &self,
        dst: CUdeviceptr,
        pieces: &[(Option<CUdeviceptr>, usize)],
    ) -> (usize, Result<()>) {
        match self.vmm("map_pieces") {
            Ok(v) => {
                // The helper does not unmap in between (see `unmapper.rs`).
                let _quiet = growth_phases::timed(Phase::Turn, || self.3.map(Unmapper::quiet));
                v.map_pieces(dst, pieces)
            }
            Err(e) => (0, Err(e)),
        }
    }
    fn save(&self, addr: CUdeviceptr, len: usize, into: Option<HostCopy>) -> Result<HostCopy> {
        let ctx = self.2.ok_or(EmmError::Unsupported {
            manager: "pool over the host stand-in (its memory holds no bytes)".into(),
            operation: "a pause that keeps contents",
        })?;
        let mut copy = match into {
            Some(c) if c.capacity() >= len => c,
            _ => HostCopy::new(ctx, len)?,
        };
        copy.save(addr, len)?;
        Ok(copy)
    }
    fn alloc_segment(&self, size: usize) -> Result<CUdeviceptr> {
        self.0.alloc(size)
    }
    fn free_segment(&self, base: CUdeviceptr, size: usize) -> Result<()> {
        // SAFETY: the arena gives back only segments it took from this upstream,
        // once, and only when every block in them is free.
        unsafe { self.0.free(base, size) }
    }
    fn device_info(&self) -> (usize, usize) {
        self.0
            .mem_info()
            .map(|i| (i.free, i.total))
            .unwrap_or((0, 0))
    }
}

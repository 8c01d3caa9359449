//! [`PoolManager`] as an emm plugin: the [`MemoryManager`] interface over the
//! pool's own API (`manager.rs`): allocation, host and managed memory through
//! the composed managers, IPC export, reset, statistics and tags.

use std::sync::atomic::Ordering;

use emm_core::{
    DeferGuard, DeviceAllocation, DeviceView, EmmError, HostAllocFlags, HostMemory, IpcHandle,
    Keep, ManagedAttach, ManagedMemory, ManagedStats, ManagerStats, MemoryInfo, MemoryManager,
    MemorySnapshot, PauseReport, Result, StatList, Tag, TagStats, SYNC_STREAM,
};
use emm_default::{HostOnly, Managed};
use emm_driver::Context;
use emm_sys::CUstream;

use super::manager::PoolManager;
use crate::settings;

impl MemoryManager for PoolManager {
    fn name(&self) -> &str {
        self.core.name
    }

    fn initialize(&self) -> Result<()> {
        Ok(())
    }

    fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
        self.memalloc_async(size, SYNC_STREAM)
    }

    fn memalloc_async(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        self.alloc(size, stream)
    }

    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        self.core
            .host
            .as_ref()
            .ok_or_else(|| self.no_host("memhostalloc"))?
            .memhostalloc(size, flags)
    }

    fn memallocmanaged(&self, size: usize, attach: ManagedAttach) -> Result<ManagedMemory> {
        self.core
            .managed
            .as_ref()
            .ok_or_else(|| self.no_host("memallocmanaged"))?
            .memallocmanaged(size, attach, &|| self.release_cached().unwrap_or(0))
    }

    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        let host = self
            .core
            .host
            .as_ref()
            .ok_or_else(|| self.no_host("mempin"))?;
        // SAFETY: forwarded to the caller.
        unsafe { host.mempin(ptr, len, mapped) }
    }

    fn get_memory_info(&self) -> Result<MemoryInfo> {
        self.core.upstream.mem_info()
    }

    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle> {
        let ctx = self
            .core
            .ctx
            .as_ref()
            .ok_or_else(|| self.no_host("get_ipc_handle"))?;
        // Large blocks, and the small ones placed in the expandable segment when no
        // small segment had room (see `Arena::try_alloc`), are virtual memory,
        // which legacy IPC cannot export: exported by file descriptor where the
        // pool made its pieces exportable (see `export.rs`).
        let base = view.parent().base().0;
        if let Some(t) = self
            .tags
            .all()
            .iter()
            .find(|t| t.core.lock().is_expandable(base))
        {
            return Err(t.tag.state_error(
                "export",
                "blocks allocated under a tag other than `default` cannot be exported to another process: a pause would take their memory from under the importer",
            ));
        }
        // The pool whose expandable segment holds the block: the pool's own or
        // a stream's.
        let owner = std::iter::once(&self.core)
            .chain(self.streams.all().map(|p| &p.core))
            .find(|c| c.vmm.is_some() && c.lock().is_expandable(base));
        if let Some(core) = owner {
            if let Some(vmm) = core.vmm.as_deref() {
                if !core.config.exportable {
                    return Err(EmmError::Unsupported {
                        manager: "pool (a block of its expandable segment, which legacy IPC cannot export: build it with exportable: true, EMM_POOL_EXPORTABLE=1, to export it by file descriptor (emm.numba_plugin does), or with expandable: false, EMM_POOL_EXPANDABLE=0, for legacy IPC of every block)".into(),
                        operation: "get_ipc_handle",
                    });
                }
                let exported = vmm.export_range(view.ptr(), view.len())?;
                return Ok(IpcHandle::Vmm {
                    pid: std::process::id(),
                    pieces: exported.pieces,
                    offset: exported.offset,
                    size: view.len(),
                    device_uuid: ctx.device().uuid()?,
                });
            }
        }
        IpcHandle::export_legacy(ctx, view.parent().base().0, view.ptr(), view.len())
    }

    fn reset(&self) -> Result<()> {
        emm_core::check_not_forked()?;
        // Every stream's work on the pool's memory is done before its segments and
        // events go back (any upstream: the event source synchronizes the device).
        // First: a reset that fails here has changed nothing (its blocks are
        // still the callers', and come back when freed), rather than invalidated
        // blocks it never gave back.
        // Every pool's event source (a stand-in's may know only its own
        // pool's streams), before any memory goes back.
        let siblings = self.sibling_cores();
        self.core.events.synchronize_all()?;
        for c in &siblings {
            c.events.synchronize_all()?;
        }
        for c in std::iter::once(&self.core).chain(&siblings) {
            c.generation.fetch_add(1, Ordering::AcqRel);
            c.give_back_all("reset");
        }
        if let Some(h) = &self.core.host {
            h.flush();
        }
        if let Some(m) = &self.core.managed {
            m.reset();
        }
        Ok(())
    }

    fn defer_cleanup(&self) -> DeferGuard {
        let host = self.core.host.clone();
        let managed = self.core.managed.clone();
        self.core.defer.guard(move || {
            if let Some(h) = host {
                h.flush_if_needed();
            }
            if let Some(m) = managed {
                m.flush();
            }
        })
    }

    /// [`PoolManager::trim`] and the pinned host and managed memory cached; the
    /// driver's refusal to take a wholly free segment back is the error (the
    /// segment is kept, still reserved, and given back by a later trim), as
    /// `hostonly`'s is, not `Ok` with fewer bytes.
    fn release_cached(&self) -> Result<usize> {
        emm_core::check_not_forked()?;
        if let Some(ctx) = &self.core.ctx {
            ctx.retry_destroys_in_trim();
        }
        let (trimmed, refusal) = self.trim_reporting();
        let released = trimmed
            + self.core.host.as_ref().map_or(0, HostOnly::flush)
            + self
                .core
                .managed
                .as_ref()
                .map_or(0, Managed::release_cached);
        match refusal {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    fn context(&self) -> Option<&Context> {
        self.core.ctx.as_ref()
    }

    fn report(&self) -> String {
        format!("{:?}", PoolManager::stats(self))
    }

    fn memory_stats(&self) -> StatList {
        let mut list = PoolManager::stats(self).to_list();
        list.extend(MemoryManager::managed_stats(self).to_list());
        list
    }

    fn reset_peak_stats(&self) {
        PoolManager::reset_peak_stats(self);
        if let Some(m) = &self.core.managed {
            m.reset_peak();
        }
    }

    fn managed_stats(&self) -> ManagedStats {
        self.core
            .managed
            .as_ref()
            .map(Managed::stats)
            .unwrap_or_default()
    }

    fn record_history(&self, max_entries: usize) -> Result<()> {
        PoolManager::record_history(self, max_entries);
        Ok(())
    }

    fn snapshot(&self) -> Option<MemorySnapshot> {
        Some(PoolManager::snapshot(self))
    }

    fn pause_tag(&self, tag: Tag, keep: Keep) -> Result<PauseReport> {
        self.tags.pause(tag, &self.core.config, keep == Keep::Host)
    }

    fn check_pause_tag(&self, tag: Tag) -> Result<()> {
        self.tags.check_pause(tag)
    }

    fn resume_tag(&self, tag: Tag) -> Result<PauseReport> {
        self.tags.resume(tag)
    }

    fn tag_stats(&self) -> Vec<TagStats> {
        self.tags.stats()
    }

    fn setting_changed(&self, name: &str) -> Result<()> {
        if name == settings::LIMIT.key().name {
            self.set_limit(settings::LIMIT.get(None)?);
        } else if name == settings::RELEASE_THRESHOLD.key().name {
            self.set_release_threshold(settings::RELEASE_THRESHOLD.get(usize::MAX)?);
        }
        Ok(())
    }

    fn stats(&self) -> ManagerStats {
        let s = PoolManager::stats(self);
        ManagerStats {
            allocated_bytes: s.allocated_bytes,
            allocated_bytes_peak: s.allocated_bytes_peak,
            reserved_bytes: s.reserved_bytes,
            reserved_bytes_peak: s.reserved_bytes_peak,
            allocations: s.allocations,
            upstream_allocs: s.num_device_alloc as u64,
            upstream_frees: s.num_device_free as u64,
        }
    }
}

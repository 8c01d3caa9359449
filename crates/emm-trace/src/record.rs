//! Recording a workload: [`RecordingManager`] wraps any manager and writes every
//! device allocation and free in emm's CSV (`op,id,size,stream`), so users can
//! replay their own workload with `emm replay`. The façade (`emm`) wraps every
//! manager it builds when `EMM_RECORD=path` is set ([`RECORD_ENV`]).

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use emm_core::{
    DeferGuard, DeviceAllocation, DeviceView, HostAllocFlags, HostMemory, IpcHandle, Keep,
    ManagedAttach, ManagedMemory, ManagedStats, ManagerStats, MemoryInfo, MemoryManager,
    MemorySnapshot, PauseReport, Result, StatList, Tag, TagStats,
};
use emm_driver::Context;
use emm_sys::CUstream;

/// `EMM_RECORD`: the file the façade records every allocation and free into.
pub const RECORD_ENV: &str = "EMM_RECORD";

struct Log {
    out: Box<dyn Write + Send>,
    streams: HashMap<usize, usize>,
}

impl Log {
    fn stream_id(&mut self, s: CUstream) -> usize {
        let raw = s.0 as usize;
        if raw <= 2 {
            return 0; // null, legacy and per-thread default streams
        }
        let next = self.streams.len() + 1;
        *self.streams.entry(raw).or_insert(next)
    }

    fn line(&mut self, op: char, id: u64, size: usize, stream: usize) {
        if let Err(e) = writeln!(self.out, "{op},{id},{size},{stream}") {
            tracing::warn!(error = %e, "writing the allocation trace failed");
        }
    }
}

/// A manager that records every device allocation and free of the manager it wraps.
pub struct RecordingManager {
    inner: Arc<dyn MemoryManager>,
    log: Arc<Mutex<Log>>,
    next: AtomicU64,
}

impl RecordingManager {
    /// Records `inner`'s traffic into `out` (a header line is written first).
    pub fn new(
        inner: Arc<dyn MemoryManager>,
        mut out: Box<dyn Write + Send>,
    ) -> std::io::Result<Self> {
        writeln!(out, "op,id,size,stream")?;
        Ok(RecordingManager {
            inner,
            log: Arc::new(Mutex::new(Log {
                out,
                streams: HashMap::new(),
            })),
            next: AtomicU64::new(0),
        })
    }

    /// Records `inner`'s traffic into the file at `path` (created, or truncated).
    pub fn to_file(inner: Arc<dyn MemoryManager>, path: &std::path::Path) -> std::io::Result<Self> {
        let f = std::fs::File::create(path)?;
        Self::new(inner, Box::new(std::io::LineWriter::new(f)))
    }

    /// Flushes the trace.
    pub fn flush(&self) -> std::io::Result<()> {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .out
            .flush()
    }

    fn wrap(&self, inner: DeviceAllocation, size: usize, stream: CUstream) -> DeviceAllocation {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let sid = {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            let sid = log.stream_id(stream);
            log.line('a', id, size, sid);
            sid
        };
        let (ptr, base) = (inner.ptr(), inner.base());
        let log = self.log.clone();
        // SAFETY: the wrapper owns `inner`, which owns the memory, until the
        // finalizer drops it.
        let mut outer = unsafe {
            DeviceAllocation::from_raw_parts(ptr, size, stream, move |_, size, _| {
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .line('f', id, size, sid);
                drop(inner);
            })
        };
        outer.set_base(base.0, base.1);
        outer
    }
}

impl MemoryManager for RecordingManager {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn interface_version(&self) -> u32 {
        self.inner.interface_version()
    }
    fn initialize(&self) -> Result<()> {
        self.inner.initialize()
    }
    fn memalloc(&self, size: usize) -> Result<DeviceAllocation> {
        let a = self.inner.memalloc(size)?;
        let s = a.stream();
        Ok(self.wrap(a, size, s))
    }
    fn memalloc_async(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation> {
        let a = self.inner.memalloc_async(size, stream)?;
        Ok(self.wrap(a, size, stream))
    }
    fn memhostalloc(&self, size: usize, flags: HostAllocFlags) -> Result<HostMemory> {
        self.inner.memhostalloc(size, flags)
    }
    /// Forwarded, not recorded: traces hold device memory only.
    fn memallocmanaged(&self, size: usize, attach: ManagedAttach) -> Result<ManagedMemory> {
        self.inner.memallocmanaged(size, attach)
    }
    fn managed_stats(&self) -> ManagedStats {
        self.inner.managed_stats()
    }
    unsafe fn mempin(&self, ptr: *mut u8, len: usize, mapped: bool) -> Result<HostMemory> {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.mempin(ptr, len, mapped) }
    }
    fn get_memory_info(&self) -> Result<MemoryInfo> {
        self.inner.get_memory_info()
    }
    fn get_ipc_handle(&self, view: DeviceView<'_>) -> Result<IpcHandle> {
        self.inner.get_ipc_handle(view)
    }
    fn reset(&self) -> Result<()> {
        self.inner.reset()
    }
    fn defer_cleanup(&self) -> DeferGuard {
        self.inner.defer_cleanup()
    }
    fn release_cached(&self) -> Result<usize> {
        self.inner.release_cached()
    }
    fn context(&self) -> Option<&Context> {
        self.inner.context()
    }
    // What the wrapped manager knows and does beyond allocating: asked of it, so
    // that recording changes nothing a program sees.
    fn stats(&self) -> ManagerStats {
        self.inner.stats()
    }
    fn report(&self) -> String {
        self.inner.report()
    }
    fn memory_stats(&self) -> StatList {
        self.inner.memory_stats()
    }
    fn reset_peak_stats(&self) {
        self.inner.reset_peak_stats()
    }
    fn record_history(&self, max_entries: usize) -> Result<()> {
        self.inner.record_history(max_entries)
    }
    fn snapshot(&self) -> Option<MemorySnapshot> {
        self.inner.snapshot()
    }
    fn pause_tag(&self, tag: Tag, keep: Keep) -> Result<PauseReport> {
        self.inner.pause_tag(tag, keep)
    }
    fn check_pause_tag(&self, tag: Tag) -> Result<()> {
        self.inner.check_pause_tag(tag)
    }
    fn resume_tag(&self, tag: Tag) -> Result<PauseReport> {
        self.inner.resume_tag(tag)
    }
    fn tag_stats(&self) -> Vec<TagStats> {
        self.inner.tag_stats()
    }
    fn setting_changed(&self, name: &str) -> Result<()> {
        self.inner.setting_changed(name)
    }
}

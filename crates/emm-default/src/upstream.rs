//! Where managers get raw memory from: [`Upstream`], with the driver
//! ([`DriverUpstream`]) and a host-memory stand-in ([`HostUpstream`]) for machines
//! without a GPU (CI, replay).

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use emm_core::{EmmError, MemoryInfo, Result};
use emm_driver::{memory, Context};
use emm_sys::CUdeviceptr;

/// A source of raw memory blocks for a manager.
pub trait Upstream: Send + Sync {
    /// A short name for reports (`cuMemAlloc`, `host`).
    fn name(&self) -> &'static str;

    /// `size` (> 0) bytes, 256-byte aligned. Out of memory is
    /// [`EmmError::OutOfMemory`] (or a driver error whose `is_out_of_memory` holds).
    fn alloc(&self, size: usize) -> Result<CUdeviceptr>;

    /// Gives back a block from [`Upstream::alloc`].
    ///
    /// # Safety
    /// `ptr` came from `alloc(size)` of this upstream, is freed once, and no work
    /// still uses it.
    unsafe fn free(&self, ptr: CUdeviceptr, size: usize) -> Result<()>;

    /// Free and total bytes.
    fn mem_info(&self) -> Result<MemoryInfo>;

    /// The context the memory lives in, for a real device.
    fn context(&self) -> Option<&Context> {
        None
    }

    /// Hands over a block whose [`Upstream::free`] failed, from a manager that
    /// is going and cannot try again: the upstream frees it later (the
    /// driver's upstream through its context's retries,
    /// [`Context::free_later`]). Returns `false` when it cannot (the default):
    /// the block then stays allocated.
    ///
    /// # Safety
    /// As [`Upstream::free`]'s, and the free of `ptr` failed: nobody uses or
    /// frees it again.
    unsafe fn free_later(&self, _ptr: CUdeviceptr, _size: usize) -> bool {
        false
    }
}

/// Device memory from `cuMemAlloc` / `cuMemFree` in one context.
#[derive(Debug, Clone)]
pub struct DriverUpstream {
    ctx: Context,
}

impl DriverUpstream {
    /// An upstream serving `ctx`.
    pub fn new(ctx: &Context) -> Self {
        DriverUpstream { ctx: ctx.clone() }
    }
}

impl Upstream for DriverUpstream {
    fn name(&self) -> &'static str {
        "cuMemAlloc"
    }

    fn alloc(&self, size: usize) -> Result<CUdeviceptr> {
        Ok(memory::alloc(&self.ctx, size)?)
    }

    unsafe fn free(&self, ptr: CUdeviceptr, _size: usize) -> Result<()> {
        // SAFETY: forwarded to the caller.
        Ok(unsafe { memory::free(&self.ctx, ptr) }?)
    }

    fn mem_info(&self) -> Result<MemoryInfo> {
        let (free, total) = self.ctx.mem_info()?;
        Ok(MemoryInfo { free, total })
    }

    fn context(&self) -> Option<&Context> {
        Some(&self.ctx)
    }

    unsafe fn free_later(&self, ptr: CUdeviceptr, size: usize) -> bool {
        // SAFETY: `ptr` came from `cuMemAlloc` in this context, its free failed
        // and nobody uses it again (the caller's contract).
        unsafe {
            self.ctx
                .free_later(emm_driver::Orphan::Device { ptr, size })
        };
        true
    }
}

/// Host memory standing in for a device of `capacity` bytes: for tests and replay
/// on machines without a GPU. It checks its callers: a double or foreign free is
/// counted in [`HostUpstream::misuse`] instead of corrupting the heap.
#[derive(Debug)]
pub struct HostUpstream {
    capacity: usize,
    used: AtomicUsize,
    live: Mutex<HashMap<u64, usize>>,
    allocs: AtomicUsize,
    misuse: AtomicUsize,
    touch: bool,
}

impl HostUpstream {
    /// A stand-in device of `capacity` bytes. With `touch`, blocks are really
    /// allocated from the host heap (so data can be written to them); without it,
    /// addresses are handed out from a counter and no host memory is used (replay
    /// of traces larger than the host).
    pub fn new(capacity: usize, touch: bool) -> Self {
        HostUpstream {
            capacity,
            used: AtomicUsize::new(0),
            live: Mutex::new(HashMap::new()),
            allocs: AtomicUsize::new(0),
            misuse: AtomicUsize::new(0),
            touch,
        }
    }

    /// Bytes currently allocated.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Blocks currently allocated.
    pub fn live_blocks(&self) -> usize {
        self.live.lock().map(|l| l.len()).unwrap_or(0)
    }

    /// Allocations made so far.
    pub fn alloc_count(&self) -> usize {
        self.allocs.load(Ordering::Acquire)
    }

    /// Frees of pointers that were not live (double or foreign frees).
    pub fn misuse(&self) -> usize {
        self.misuse.load(Ordering::Acquire)
    }

    fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size, 256).ok()
    }

    /// The block behind a reservation of `size` bytes (already counted in `used`):
    /// host memory with `touch`, else a made-up address.
    fn block(&self, size: usize) -> Result<CUdeviceptr> {
        if self.touch {
            let layout = Self::layout(size).ok_or(EmmError::InvalidSize {
                requested: size,
                reason: "too large for the host",
            })?;
            // SAFETY: `layout` has a non-zero size (`alloc` refuses 0).
            let p = unsafe { std::alloc::alloc(layout) };
            if p.is_null() {
                return Err(EmmError::OutOfMemory {
                    what: "host stand-in",
                    manager: "host stand-in".into(),
                    requested: size,
                    free: 0,
                    total: self.capacity,
                    detail: "the host heap refused".into(),
                });
            }
            Ok(p as u64)
        } else {
            fake_address(size).ok_or_else(|| EmmError::OutOfMemory {
                what: "device",
                manager: "host stand-in".into(),
                requested: size,
                free: self.capacity - self.used().min(self.capacity),
                total: self.capacity,
                detail: format!(
                    "the stand-in's made-up addresses ({FAKE_BASE:#x}..{FAKE_END:#x}) cannot hold the block without wrapping"
                ),
            })
        }
    }
}

/// The next made-up address (shared by every [`HostUpstream`] of the process, so
/// blocks of two stand-ins never share an address).
static FAKE_ADDRESS: AtomicU64 = AtomicU64::new(FAKE_BASE);
/// The first made-up address.
const FAKE_BASE: u64 = 1 << 40;
/// Made-up addresses stay below this (positive as `i64` too, and far from wrapping).
const FAKE_END: u64 = 1 << 63;

/// A made-up address for a block of `size` bytes: 512-byte aligned, with a 512-byte
/// gap after it, never wrapping and never overlapping another block (addresses only
/// grow). `None` when the range below [`FAKE_END`] cannot hold it.
fn fake_address(size: usize) -> Option<u64> {
    let span = u64::try_from(size)
        .ok()?
        .checked_next_multiple_of(512)?
        .checked_add(512)?;
    let mut cur = FAKE_ADDRESS.load(Ordering::Acquire);
    loop {
        let next = cur.checked_add(span).filter(|&n| n <= FAKE_END)?;
        match FAKE_ADDRESS.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(cur),
            Err(seen) => cur = seen,
        }
    }
}

impl Upstream for HostUpstream {
    fn name(&self) -> &'static str {
        "host"
    }

    fn alloc(&self, size: usize) -> Result<CUdeviceptr> {
        if size == 0 {
            return Err(EmmError::InvalidSize {
                requested: 0,
                reason: "upstream blocks hold at least one byte",
            });
        }
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            let next = cur.checked_add(size).filter(|&n| n <= self.capacity);
            let Some(next) = next else {
                return Err(EmmError::OutOfMemory {
                    what: "device",
                    manager: "host stand-in".into(),
                    requested: size,
                    free: self.capacity - cur.min(self.capacity),
                    total: self.capacity,
                    detail: String::new(),
                });
            };
            match self
                .used
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
        let ptr = match self.block(size) {
            Ok(p) => p,
            Err(e) => {
                self.used.fetch_sub(size, Ordering::AcqRel);
                return Err(e);
            }
        };
        if let Ok(mut l) = self.live.lock() {
            l.insert(ptr, size);
        }
        self.allocs.fetch_add(1, Ordering::AcqRel);
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: CUdeviceptr, size: usize) -> Result<()> {
        let recorded = self.live.lock().ok().and_then(|mut l| l.remove(&ptr));
        if recorded != Some(size) {
            if let (Some(real), Ok(mut l)) = (recorded, self.live.lock()) {
                l.insert(ptr, real); // wrong size: keep the block live, report the misuse
            }
            self.misuse.fetch_add(1, Ordering::AcqRel);
            return Err(EmmError::InvalidArgument {
                what: "block to free",
                found: match recorded {
                    Some(real) => format!("{ptr:#x} of {size} bytes, allocated with {real} bytes"),
                    None => format!("{ptr:#x} of {size} bytes, which is not live"),
                },
                expected:
                    "a live block of this upstream, freed with the size it was allocated with"
                        .into(),
            });
        }
        if self.touch {
            if let Some(layout) = Self::layout(size) {
                // SAFETY: the block was allocated with this layout (same size) and is
                // freed once (it was live until just now).
                unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            }
        }
        self.used.fetch_sub(size, Ordering::AcqRel);
        Ok(())
    }

    fn mem_info(&self) -> Result<MemoryInfo> {
        Ok(MemoryInfo {
            free: self.capacity - self.used().min(self.capacity),
            total: self.capacity,
        })
    }
}

impl Drop for HostUpstream {
    fn drop(&mut self) {
        if self.touch {
            let live = self.live.get_mut().map(std::mem::take).unwrap_or_default();
            for (ptr, size) in live {
                if let Some(layout) = Self::layout(size) {
                    // SAFETY: each live block was allocated with this layout and not freed.
                    unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
                }
            }
        }
    }
}

impl<U: Upstream + ?Sized> Upstream for std::sync::Arc<U> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn alloc(&self, size: usize) -> Result<CUdeviceptr> {
        (**self).alloc(size)
    }
    unsafe fn free(&self, ptr: CUdeviceptr, size: usize) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { (**self).free(ptr, size) }
    }
    fn mem_info(&self) -> Result<MemoryInfo> {
        (**self).mem_info()
    }
    fn context(&self) -> Option<&Context> {
        (**self).context()
    }
    unsafe fn free_later(&self, ptr: CUdeviceptr, size: usize) -> bool {
        // SAFETY: forwarded to the caller.
        unsafe { (**self).free_later(ptr, size) }
    }
}

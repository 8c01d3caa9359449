//! What each of the pool's calls costs the host over a recorded trace: every
//! allocation and free of a replay over the host stand-in timed, as a histogram.
//!
//! ```sh
//! cargo run --release -p emm-trace --example call_costs -- \
//!     crates/emm-trace/tests/fixtures/deeplab_h200.csv [PASSES] [COLD_KIB]
//! ```
//!
//! A replay calls the pool back to back, so the pool's trees and maps stay in the
//! host's caches; inside a training job the step's own work (Python, PyTorch's
//! dispatcher, the kernels' launches) runs between two calls and evicts them.
//! `COLD_KIB` > 0 touches that many KiB of other memory before each call (not
//! timed): at 8192, DeepLabV3's recorded requests cost about what PyTorch's hooks
//! measured in the job on an H200 (`docs/benchmarks.md`, forty-seventh session).
//! The pool's settings come from the environment (`EMM_POOL_*`), as in a job.
//!
//! Each call's heap operations (the process allocator's allocations, frees and
//! reallocations made inside it: a B-tree node split or merged, a list grown) are
//! counted too, and the calls split by how many they made: a call that touches
//! the heap touches memory no earlier call warmed. The count is the process's, so
//! another thread's operations meanwhile (the pool's unmapping helper) count too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::hint::black_box;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use emm_core::{DeviceAllocation, ManagerStats, MemoryManager};
use emm_pool::{PoolConfig, PoolManager};
use emm_sys::CUstream;
use emm_trace::{replay, DriverCalls, ReplayOptions, ReplayTarget, Trace};

/// The system allocator, counting its operations.
struct CountingAlloc;

/// Heap operations (allocations, frees, reallocations) of the whole process so far.
static HEAP_OPS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method hands its arguments unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; the count is a relaxed atomic add, which neither
// allocates nor unwinds.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP_OPS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's `layout` obligations are passed on as they are.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP_OPS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP_OPS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; `new_size` is the caller's, as `realloc` asks.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Times `f` and counts the heap operations made while it ran.
fn measured<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    let ops = HEAP_OPS.load(Ordering::Relaxed);
    let t = Instant::now();
    let r = f();
    let ns = t.elapsed().as_nanos() as u64;
    (r, ns, HEAP_OPS.load(Ordering::Relaxed) - ops)
}

/// Upper bounds (ns) of the histogram's buckets; the last one is open.
const BOUNDS: [u64; 7] = [500, 1_000, 2_000, 4_000, 8_000, 16_000, 64_000];

/// Calls and nanoseconds per bucket of [`BOUNDS`], and by heap operations made
/// (0, 1, 2, 3 or more).
#[derive(Default)]
struct Histogram {
    calls: [u64; 8],
    ns: [u64; 8],
    heap_calls: [u64; 4],
    heap_ns: [u64; 4],
}

impl Histogram {
    fn add(&mut self, ns: u64, heap_ops: u64) {
        let b = BOUNDS
            .iter()
            .position(|&hi| ns < hi)
            .unwrap_or(BOUNDS.len());
        self.calls[b] += 1;
        self.ns[b] += ns;
        let h = usize::try_from(heap_ops).map_or(3, |h| h.min(3));
        self.heap_calls[h] += 1;
        self.heap_ns[h] += ns;
    }

    fn print(&self, name: &str) {
        let calls: u64 = self.calls.iter().sum();
        let ns: u64 = self.ns.iter().sum();
        println!(
            "{name}: {calls} calls, {:.0} ns on the mean",
            ns as f64 / calls.max(1) as f64
        );
        let mut lo = 0;
        for (b, (&n, &t)) in self.calls.iter().zip(&self.ns).enumerate() {
            let range = match BOUNDS.get(b) {
                Some(&hi) => format!("{:.1}-{:.1} us", lo as f64 / 1e3, hi as f64 / 1e3),
                None => format!(">= {:.1} us", lo as f64 / 1e3),
            };
            println!("  {range:>14} {n:>9} calls {:>9.1} ms", t as f64 / 1e6);
            lo = BOUNDS.get(b).copied().unwrap_or(lo);
        }
        for (h, (&n, &t)) in self.heap_calls.iter().zip(&self.heap_ns).enumerate() {
            let ops = if h == 3 {
                "3+".to_string()
            } else {
                h.to_string()
            };
            println!(
                "  {ops:>2} heap ops {n:>9} calls {:>9.1} ms, {:>7.0} ns on the mean",
                t as f64 / 1e6,
                t as f64 / n.max(1) as f64
            );
        }
    }
}

/// Memory touched before each call, one write a cache line, so that the call
/// finds the pool's structures out of the caches as a job's would.
struct Cold(RefCell<Vec<u8>>);

impl Cold {
    fn touch(&self) {
        let mut buf = self.0.borrow_mut();
        for i in (0..buf.len()).step_by(64) {
            buf[i] = buf[i].wrapping_add(1);
        }
        black_box(&mut *buf);
    }
}

/// The pool, every call timed.
struct Timed {
    pool: PoolManager,
    cold: Cold,
    allocs: RefCell<Histogram>,
    frees: RefCell<Histogram>,
}

/// A block whose drop (the free) is timed too.
struct Block<'a> {
    alloc: Option<DeviceAllocation>,
    owner: &'a Timed,
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        self.owner.cold.touch();
        let alloc = self.alloc.take();
        let ((), ns, ops) = measured(|| drop(alloc));
        self.owner.frees.borrow_mut().add(ns, ops);
    }
}

impl<'a> ReplayTarget for &'a Timed {
    type Block = Block<'a>;

    fn alloc(&self, size: usize, stream: CUstream) -> Result<Block<'a>, String> {
        self.cold.touch();
        let (r, ns, ops) = measured(|| self.pool.memalloc_async(size, stream));
        self.allocs.borrow_mut().add(ns, ops);
        let alloc = r.map_err(|e| e.to_string())?;
        Ok(Block {
            alloc: Some(alloc),
            owner: self,
        })
    }

    fn stats(&self) -> ManagerStats {
        MemoryManager::stats(&self.pool)
    }

    fn driver_calls(&self) -> DriverCalls {
        DriverCalls::of(&self.pool)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: call_costs TRACE [PASSES, default 20] [COLD_KIB, default 0]");
        return ExitCode::from(2);
    };
    let number = |i: usize, default: usize| -> Result<usize, String> {
        args.get(i).map_or(Ok(default), |s| {
            s.parse()
                .map_err(|e| format!("argument {} ({s:?}): {e}", i + 1))
        })
    };
    let result = number(1, 20)
        .and_then(|passes| Ok((passes, number(2, 0)?)))
        .and_then(|(passes, cold_kib)| run(Path::new(path), passes, cold_kib));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("call_costs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &Path, passes: usize, cold_kib: usize) -> Result<(), String> {
    let trace = Trace::open(path, None)
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or_else(|| format!("{}: no trace in the file", path.display()))?;
    let config = PoolConfig::from_env().map_err(|e| e.to_string())?;
    let target = Timed {
        pool: PoolManager::host(1 << 40, config).map_err(|e| e.to_string())?,
        cold: Cold(RefCell::new(vec![0; cold_kib << 10])),
        allocs: RefCell::default(),
        frees: RefCell::default(),
    };
    let options = ReplayOptions {
        passes: u32::try_from(passes.max(1)).unwrap_or(u32::MAX),
        ..ReplayOptions::default()
    };
    // Stream 0 is the legacy default stream; the others stand-in streams, as
    // `emm replay` makes them over the stand-in.
    let mut streams = |n: u64| {
        if n == 0 {
            emm_core::SYNC_STREAM
        } else {
            CUstream((0x1000 + n as usize * 0x100) as *mut _)
        }
    };
    let r =
        replay(&trace, &&target, &mut streams, &options, &mut |_| {}).map_err(|e| e.to_string())?;
    let last = r.passes.last().ok_or("the replay made no pass")?;
    println!(
        "{}: {} passes, {} KiB touched before each call; reserved/live {:.4} after the last",
        path.display(),
        r.passes.len(),
        cold_kib,
        last.peak_reserved_bytes as f64 / last.peak_live_bytes.max(1) as f64
    );
    target.allocs.borrow().print("allocations");
    target.frees.borrow().print("frees");
    for (name, v) in target.pool.memory_stats() {
        if name.starts_with("emm.")
            && [
                "thread_cache_hits",
                "locked_allocs",
                "locked_frees",
                "misses",
            ]
            .iter()
            .any(|k| name.ends_with(k))
        {
            println!("  {name} = {v}");
        }
    }
    Ok(())
}

//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`,
//! PyTorch 2.11), to replay a trace through it with no GPU: how much it would
//! reserve, with which settings, and whether it fits under a limit.
//!
//! The model follows the allocator's rules, each function in `state.rs` naming the
//! one it follows: sizes rounded to 512 bytes (or `roundup_power2_divisions`);
//! a small pool (requests up to 1 MiB, packed into 2 MiB segments) and a large one
//! (1-10 MiB requests share 20 MiB segments, larger ones get their size rounded to
//! 2 MiB); best fit per stream; splitting (`should_split`) and merging on free;
//! `max_split_size_mb` and oversize blocks; `expandable_segments` (one growing
//! segment per stream and pool, 2 MiB pages for the small pool and 20 MiB for the
//! large, pages unmapped only when the cache is emptied); and on a refused segment
//! the retries that free oversize blocks, then every unsplit cached segment
//! (`release_cached_blocks`), as `malloc` does. Frees are immediate: a replay
//! records no use of a block on another stream (`record_stream`).
//!
//! ```
//! use emm_trace::torch_model::{TorchConf, TorchModel};
//! let trace = emm_trace::Trace::from_text("t.csv", "op,id,size,stream\na,1,3000000,0\nf,1,3000000,0\n")?;
//! let model = TorchModel::new(TorchConf::default());
//! let mut streams = |n: u64| emm_sys::CUstream(n as *mut _);
//! let r = emm_trace::replay(&trace, &model, &mut streams, &Default::default(), &mut |_| {})?;
//! assert_eq!(r.peak_reserved_bytes, 20 << 20); // a 3 MB request takes a 20 MiB segment
//! # Ok::<(), emm_trace::TraceError>(())
//! ```

mod conf;
mod state;

use std::sync::{Arc, Mutex, MutexGuard};

use emm_core::{fmt_bytes, ManagerStats, SnapshotSegment};
use emm_sys::CUstream;

pub use conf::{ConfError, TorchConf, NO_MAX_SPLIT};
pub use state::{Limit, Stats};

use crate::target::{DriverCalls, ReplayTarget};
use state::State;

/// An H100 80GB's total memory as `cudaMemGetInfo` reports it (gpu-verification
/// run 162), the device size the model assumes unless told.
pub const DEFAULT_DEVICE_BYTES: u64 = 85_017_493_504;

/// PyTorch's caching allocator on one device, as a replay target.
pub struct TorchModel {
    state: Arc<Mutex<State>>,
    name: String,
}

impl TorchModel {
    /// The allocator with `conf` on an 80 GB device ([`DEFAULT_DEVICE_BYTES`]).
    pub fn new(conf: TorchConf) -> TorchModel {
        TorchModel::with_device(conf, DEFAULT_DEVICE_BYTES, None)
    }

    /// The allocator with `conf` on a device of `device_bytes`, under `limit`.
    pub fn with_device(conf: TorchConf, device_bytes: u64, limit: Option<Limit>) -> TorchModel {
        let name = if conf.expandable_segments {
            "pytorch-expandable"
        } else {
            "pytorch-native"
        };
        // `per_process_memory_fraction` caps as `setMemoryFraction` does, unless a
        // limit is given.
        let limit = limit.or_else(|| {
            conf.memory_fraction
                .map(|f| Limit::Fraction((f * device_bytes as f64) as u64))
        });
        TorchModel {
            state: Arc::new(Mutex::new(State::new(conf, device_bytes, limit))),
            name: name.to_owned(),
        }
    }

    /// `pytorch-native` or `pytorch-expandable`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `torch.cuda.empty_cache()`: every unsplit cached segment and every whole
    /// free page of the expandable segments given back.
    pub fn empty_cache(&self) {
        lock(&self.state).release_cached_blocks();
    }

    /// The allocator's own counters.
    pub fn counters(&self) -> state::Stats {
        lock(&self.state).stats()
    }
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// A block handed out by a [`TorchModel`]; dropping it frees it (`raw_delete`).
pub struct TorchBlock {
    state: Arc<Mutex<State>>,
    index: Option<usize>,
}

impl Drop for TorchBlock {
    fn drop(&mut self) {
        if let Some(i) = self.index.take() {
            lock(&self.state).free(i);
        }
    }
}

impl ReplayTarget for TorchModel {
    type Block = TorchBlock;

    fn alloc(&self, size: usize, stream: CUstream) -> Result<TorchBlock, String> {
        if size == 0 {
            // `raw_alloc` of nothing hands out a null pointer and takes no block.
            return Ok(TorchBlock {
                state: self.state.clone(),
                index: None,
            });
        }
        let mut s = lock(&self.state);
        match s.malloc(size as u64, stream.0 as u64) {
            Ok((i, _)) => Ok(TorchBlock {
                state: self.state.clone(),
                index: Some(i),
            }),
            Err(r) => {
                let st = s.stats();
                Err(format!(
                    "CUDA out of memory in the model of PyTorch's allocator ({}): tried to allocate {} ({} requested; a new segment would be {}), with {} reserved, {} of it allocated",
                    self.name,
                    fmt_bytes(r.size as usize),
                    fmt_bytes(size),
                    fmt_bytes(r.alloc_size as usize),
                    fmt_bytes(st.reserved as usize),
                    fmt_bytes(st.allocated as usize),
                ))
            }
        }
    }

    fn stats(&self) -> ManagerStats {
        let s = lock(&self.state).stats();
        ManagerStats {
            allocated_bytes: s.allocated as usize,
            allocated_bytes_peak: s.allocated_peak as usize,
            reserved_bytes: s.reserved as usize,
            reserved_bytes_peak: s.reserved_peak as usize,
            allocations: s.allocations,
            upstream_allocs: s.device_allocs,
            upstream_frees: s.device_frees,
        }
    }

    fn driver_calls(&self) -> DriverCalls {
        let s = lock(&self.state).stats();
        DriverCalls {
            allocs: s.device_allocs,
            frees: s.device_frees,
            ..DriverCalls::default()
        }
    }

    fn block_address(&self, block: &TorchBlock) -> Option<u64> {
        block.index.map(|i| lock(&self.state).ptr(i))
    }

    fn segments(&self) -> Option<Vec<SnapshotSegment>> {
        Some(lock(&self.state).segments())
    }
}

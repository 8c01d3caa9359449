//! What a replay drives ([`ReplayTarget`]): any memory manager, or a model of an
//! allocator such as [`TorchModel`](crate::TorchModel); and the driver calls it
//! reports ([`DriverCalls`]).

use emm_core::stat_names as stat;
use emm_core::{DeviceAllocation, ManagerStats, MemoryManager, SnapshotSegment};
use emm_sys::CUstream;

/// An allocator a trace can be replayed through.
pub trait ReplayTarget {
    /// What an allocation holds; dropping it frees the allocation.
    type Block;
    /// Allocates `size` bytes ordered on `stream`; the error's text on failure.
    fn alloc(&self, size: usize, stream: CUstream) -> Result<Self::Block, String>;
    /// The allocator's counters now.
    fn stats(&self) -> ManagerStats;
    /// The driver calls it counted so far.
    fn driver_calls(&self) -> DriverCalls;

    /// Where `block` starts, to find it among [`segments`](ReplayTarget::segments);
    /// `None` where the target does not say (the default).
    fn block_address(&self, block: &Self::Block) -> Option<u64> {
        let _ = block;
        None
    }

    /// The allocator's segments and their blocks now, in address order, for a map
    /// of its memory ([`ReplayOptions::peak_map`](crate::ReplayOptions::peak_map));
    /// `None` where it keeps no segments of its own (the default). Taking them
    /// must not change what the allocator does next.
    fn segments(&self) -> Option<Vec<SnapshotSegment>> {
        None
    }

    /// The make-up of the allocator's reserved bytes at its peak, as
    /// `emm.peak_slack.*` statistics (emm's pool keeps them; see
    /// `emm_pool::PeakSlack`); empty where it keeps none (the default).
    fn peak_slack(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

impl<M: MemoryManager + ?Sized> ReplayTarget for M {
    type Block = DeviceAllocation;

    fn alloc(&self, size: usize, stream: CUstream) -> Result<DeviceAllocation, String> {
        self.memalloc_async(size, stream).map_err(|e| e.to_string())
    }

    fn stats(&self) -> ManagerStats {
        MemoryManager::stats(self)
    }

    fn driver_calls(&self) -> DriverCalls {
        DriverCalls::of(self)
    }

    fn block_address(&self, block: &DeviceAllocation) -> Option<u64> {
        Some(block.ptr())
    }

    /// The manager's [`snapshot`](MemoryManager::snapshot), taken from a thread of
    /// its own: emm's pool first returns the calling thread's cache of freed blocks
    /// to the pool, which would change the replay asking (it runs on one thread).
    /// From another thread those cached blocks show as allocated; the replay knows
    /// which blocks are live. `None` also where the thread cannot be started.
    fn segments(&self) -> Option<Vec<SnapshotSegment>> {
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("emm-replay-snapshot".into())
                .spawn_scoped(s, || self.snapshot())
                .ok()?
                .join()
                .ok()
                .flatten()
        })
        .map(|m| m.segments)
    }

    fn peak_slack(&self) -> Vec<(&'static str, u64)> {
        self.memory_stats()
            .into_iter()
            .filter(|(name, _)| name.starts_with(PEAK_SLACK_PREFIX))
            .collect()
    }
}

/// The prefix of the statistics that say where a pool's peak went.
const PEAK_SLACK_PREFIX: &str = "emm.peak_slack.";

/// Calls a manager made to the driver for device memory, from the counters of its
/// [`MemoryManager::memory_stats`] (a counter the manager does not keep is 0).
///
/// The counters are the manager's own, so the sum is near the calls made, not
/// exact: emm's pool counts a growth of its expandable segment in `allocs` as
/// well as its pieces in `pieces_mapped`, and giving that whole segment back
/// (one unmap a piece) as one of `frees`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// Memory taken from the driver (`num_device_alloc`: a `cuMemAlloc`, a
    /// stream-ordered allocation, a segment or a growth of the pool).
    pub allocs: u64,
    /// Memory given back (`num_device_free`).
    pub frees: u64,
    /// Pieces of an expandable segment mapped with new memory
    /// (`emm.pieces_mapped`).
    pub pieces_mapped: u64,
    /// Pieces of an expandable segment whose memory was mapped again elsewhere
    /// (`emm.pieces_moved`).
    pub pieces_moved: u64,
    /// Old mappings unmapped (`emm.pieces_unmapped`).
    pub pieces_unmapped: u64,
}

impl DriverCalls {
    /// The counters `manager` keeps now.
    pub fn of<M: MemoryManager + ?Sized>(manager: &M) -> Self {
        let mut d = DriverCalls::default();
        for (name, v) in manager.memory_stats() {
            match name {
                stat::NUM_DEVICE_ALLOC => d.allocs = v,
                stat::NUM_DEVICE_FREE => d.frees = v,
                stat::PIECES_MAPPED => d.pieces_mapped = v,
                stat::PIECES_MOVED => d.pieces_moved = v,
                stat::PIECES_UNMAPPED => d.pieces_unmapped = v,
                _ => {}
            }
        }
        d
    }

    /// The sum of the counters: about the calls made (see [`DriverCalls`]).
    pub fn total(&self) -> u64 {
        self.allocs
            .saturating_add(self.frees)
            .saturating_add(self.pieces_mapped)
            .saturating_add(self.pieces_moved)
            .saturating_add(self.pieces_unmapped)
    }

    /// The calls made since `earlier` was taken.
    pub fn since(&self, earlier: &DriverCalls) -> DriverCalls {
        DriverCalls {
            allocs: self.allocs.saturating_sub(earlier.allocs),
            frees: self.frees.saturating_sub(earlier.frees),
            pieces_mapped: self.pieces_mapped.saturating_sub(earlier.pieces_mapped),
            pieces_moved: self.pieces_moved.saturating_sub(earlier.pieces_moved),
            pieces_unmapped: self.pieces_unmapped.saturating_sub(earlier.pieces_unmapped),
        }
    }
}

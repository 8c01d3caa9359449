//! A stream-aware caching pool for device and pinned host memory, as an emm plugin.
//!
//! See [`PoolManager`] for the design. The pool runs over any upstream: the driver
//! (`cuMemAlloc`), or the host stand-in ([`PoolUpstream::Host`]) for CI and for
//! replaying traces without a GPU. Recording and replaying traces live in
//! `emm-trace`.
//!
//! ```no_run
//! use emm_core::MemoryManager;
//! let ctx = emm_driver::Context::on_device(0)?;
//! let stream = emm_driver::Stream::new(&ctx)?;
//! let pool = emm_pool::PoolManager::new(&ctx)?;
//! let block = pool.memalloc_async(1 << 20, stream.raw())?; // ordered on `stream`
//! drop(block); // back in the pool; the next 1 MiB request on `stream` reuses it
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

mod arena;
pub mod call_work;
mod counters;
mod events;
mod export;
mod family;
mod fasthash;
mod graph;
pub mod growth_phases;
mod heap;
mod history;
mod host_copy;
mod kind;
mod lagged_events;
mod owner_lock;
mod pool;
mod refused;
pub mod settings;
mod slack;
mod stream_key;
mod thread_cache;
mod unmapper;
mod vmm;
mod vmm_export;

pub use arena::{
    ArenaStats, SegmentPolicy, DEFAULT_EXPAND_STEP, DEFAULT_LEGACY_MERGE, DEFAULT_PIECE_PAGES,
    DEFAULT_PIECE_SHARE,
};
pub use counters::Counts;
pub use events::{DriverEvents, EventId, EventSource, HostEvents};
pub use export::ExportedRange;
pub use graph::{
    GraphPool, GraphPoolStats, GRAPH_MEDIUM_MAX, GRAPH_MEDIUM_SEGMENT, GRAPH_ROUND,
    GRAPH_SMALL_MAX, GRAPH_SMALL_SEGMENT,
};
pub use kind::{round_size, Kind, ROUND, SMALL_MAX};
pub use lagged_events::LaggedEvents;
pub use pool::{
    PoolConfig, PoolManager, PoolStats, PoolUpstream, DEFAULT_STREAM_POOLS,
    DEFAULT_THREAD_CACHE_KEEP, DEFAULT_THREAD_CACHE_LARGEST, MAX_STREAM_CACHES, MAX_STREAM_POOLS,
};
pub use slack::PeakSlack;
pub use vmm::{DriverVmm, HostVmm, VirtualMemory};

// The README's examples are compiled as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

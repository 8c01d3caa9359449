//! The NBEP 7 memory-manager plugin interface, in Rust.
//!
//! | item | NBEP 7 | here |
//! |---|---|---|
//! | [`MemoryManager`] | `BaseCUDAMemoryManager` | a trait with every NBEP 7 method, a stream-ordered `memalloc_async`, and an out-of-memory hook (`release_cached`) |
//! | [`DeviceAllocation`], [`DeviceView`] | `MemoryPointer`, views | owned memory released on `Drop`; borrowed views that cannot outlive it |
//! | [`PinnedMemory`], [`MappedMemory`] | same names | owned pinned host memory, mapped or not |
//! | [`ManagedMemory`], [`ManagedAttach`] | `ManagedMemory`, `attach_global` (Numba's `memallocmanaged`, beyond NBEP 7) | owned managed memory, counted apart in [`ManagedStats`] |
//! | [`IpcHandle`] | `IpcHandle` | legacy handles with base + offset (sub-allocations export correctly), mempool handles, staged opening across devices, bytes round trip |
//! | [`MemoryInfo`] | `MemoryInfo` | `get_memory_info` returns a `Result`; [`EmmError::Unsupported`] is the one "unsupported" error |
//! | [`DeferGuard`] | `defer_cleanup()` | a guard value; guards nest and are released during unwinding |
//! | [`Router`], [`set_memory_manager`] | `set_memory_manager`, `NUMBA_CUDA_MEMORY_MANAGER` | one manager per context; `EMM_MEMORY_MANAGER` selects by name and wins, with a warning |
//! | [`conformance`] | numba-cuda's tests | a suite any manager runs against itself |
//! | [`Region`], [`Tag`], [`Router::pause`] | (beyond NBEP 7; vLLM's sleep mode) | allocations tagged by region; a tag's memory given back and mapped again at the same addresses |
//! | [`config`], [`configure`] | (RMM's `reinitialize`) | every `EMM_*` variable as a key settable in code before first use; the environment wins |
//!
//! Architecture invariant: this crate allocates no device memory itself; managers do.
//!
//! Writing a plugin: implement [`MemoryManager`], hand out [`DeviceAllocation`]s made
//! with [`DeviceAllocation::with_releaser`] (no allocation per block) or
//! [`DeviceAllocation::from_raw_parts`] (a finalizer closure), compose
//! `emm_default::HostOnly` for host memory, register a factory with
//! [`register_manager`], and run [`conformance::run`] in a GPU test.
//! `emm-hostonly` is a complete example.
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

pub mod config;
mod config_store;
pub mod conformance;
mod error;
mod fd;
mod host_clock;
mod ipc;
mod ipc_open;
pub mod managed;
mod manager;
mod pointer;
mod router;
pub mod setting;
mod snapshot;
pub mod stat_names;
pub mod tags;
mod units;

pub use config::configure;
pub use config_store::MANAGER_ENV;
pub use error::{check_not_forked, fmt_bytes, EmmError, Result};
pub use host_clock::HostClock;
pub use ipc::IpcHandle;
pub use ipc_open::IpcMemory;
pub use managed::{ManagedAttach, ManagedMemory, ManagedStats};
pub use manager::{
    check_interface_version, DeferGuard, DeferState, ManagerStats, MemoryInfo, MemoryManager,
    INTERFACE_VERSION, SUPPORTED_INTERFACE_VERSIONS,
};
pub use pointer::{
    DeviceAllocation, DeviceRelease, DeviceView, HostAllocFlags, HostMemory, MappedMemory,
    NotFreed, PinnedMemory, Released, SYNC_STREAM,
};
pub use router::{
    alloc_from, alloc_managed_from, memory_manager, pause, register_manager, resume,
    set_memory_manager, tag_stats, ManagerFactory, Router, DEFAULT_MANAGER,
};
pub use snapshot::{
    stats_json, MemorySnapshot, SnapshotBlock, SnapshotSegment, StatList, TraceAction, TraceEntry,
};
pub use tags::{Keep, PauseReport, Region, Tag, TagStats};
pub use units::parse_bytes;

pub use emm_driver;
pub use emm_sys::{CUdeviceptr, CUstream};

// The README's examples are compiled (and run) as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

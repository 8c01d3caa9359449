//! emm's built-in manager and the reusable host-memory half.
//!
//! - [`DefaultManager`]: NBEP 7's default (Numba's `NumbaCUDAMemoryManager`):
//!   `cuMemAlloc`, frees queued and flushed past a count or a byte ratio
//!   ([`PendingConfig`], `EMM_MAX_PENDING_DEALLOCS_COUNT` /
//!   `EMM_MAX_PENDING_DEALLOCS_RATIO`), `defer_cleanup` nesting, flush-and-retry on
//!   out-of-memory.
//! - [`HostOnly`]: pinned, mapped and `mempin` host memory with a size-tracking
//!   queue, which plugins that manage only device memory compose.
//! - [`Managed`]: managed memory (`cuMemAllocManaged`, Numba's `memallocmanaged`),
//!   never pooled, counted apart from device memory; every built-in manager
//!   composes one.
//! - [`Upstream`]: where raw blocks come from: [`DriverUpstream`] (`cuMemAlloc`) or
//!   [`HostUpstream`], a host-memory stand-in for machines without a GPU.
//!
//! ```no_run
//! use emm_core::MemoryManager;
//! let ctx = emm_driver::Context::on_device(0)?;
//! let manager = emm_default::DefaultManager::new(&ctx)?;
//! manager.initialize()?;
//! let block = manager.memalloc(1 << 20)?;
//! assert_eq!(block.size(), 1 << 20);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

mod config;
mod host;
mod managed;
mod manager;
mod upstream;

pub use config::{PendingConfig, COUNT_ENV, MAX_COUNT, MAX_RATIO, RATIO_ENV, SETTINGS};
pub use host::HostOnly;
pub use managed::Managed;
pub use manager::{DefaultManager, DefaultStats};
pub use upstream::{DriverUpstream, HostUpstream, Upstream};

// The README's examples are compiled as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

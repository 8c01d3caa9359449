//! Safe handles over the CUDA driver, for emm.
//!
//! | module | what it holds |
//! |---|---|
//! | [`Device`] | ordinals, names, UUIDs, attributes, total memory |
//! | [`Context`], [`ContextGuard`] | the device's primary context (retained while used) and a push/pop guard |
//! | [`Stream`], [`Event`] | created streams, the legacy and per-thread default streams, events |
//! | [`Module`], [`Function`] | PTX loaded from memory and kernel launch |
//! | [`memory`] | copies, memset, pinned host memory, legacy IPC, plain owned buffers |
//! | [`mempool`] | the stream-ordered allocator (optional in the driver) |
//!
//! Every fallible call returns [`DriverError`], which names the driver call, the
//! `CUresult` and the driver's own text. `Drop` never panics: a failure while
//! releasing is logged through `tracing` and returned by the next fallible call on
//! the same context ([`Context::check_deferred`]).
//!
//! Architecture invariant: this crate knows nothing of memory managers.
//!
//! ```no_run
//! use emm_driver::{Context, Device, Stream};
//! let dev = Device::get(0)?;
//! let ctx = Context::primary(dev)?;
//! let stream = Stream::new(&ctx)?;
//! let buf = emm_driver::memory::DeviceBuffer::from_host(&ctx, &[1, 2, 3, 4])?;
//! assert_eq!(buf.to_vec()?, vec![1, 2, 3, 4]);
//! stream.synchronize()?;
//! # Ok::<(), emm_driver::DriverError>(())
//! ```
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

mod context;
mod device;
mod doomed;
mod error;
pub mod memory;
pub mod mempool;
mod module;
mod stream;
pub mod vmm;

pub use context::{Context, ContextGuard};
pub use device::Device;
pub use doomed::Orphan;
pub use error::{check, driver, optional, DriverError, Result};
pub use module::{Function, LaunchConfig, Module};
pub use stream::{stream_is_capturing, Event, RelaxedCapture, Stream};

pub use emm_sys as sys;

// The README's examples are compiled and run as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

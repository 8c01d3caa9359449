//! Allocation traces for emm: reading them, replaying them through any
//! [`MemoryManager`](emm_core::MemoryManager) or through a model of PyTorch's
//! caching allocator ([`TorchModel`]), and recording them.
//!
//! Formats, detected from the content ([`Trace::open`]):
//! - emm's CSV: header `op,id,size,stream`, `op` `a` (allocate) or `f` (free);
//! - RMM's replay log (`logging_resource_adaptor`):
//!   `Thread,Time,Action,Pointer,Size,Stream`;
//! - PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()` pickles), with
//!   allocations from before the recording reconstructed ([`snapshot`]).
//!
//! Text traces are streamed: one line at a time, each at most [`MAX_LINE`] bytes,
//! so a file of any size is read in bounded memory. Malformed lines are counted and
//! the first few kept ([`Diagnostics`]); binary input, a missing header or a trace
//! without a usable event is a [`TraceError`].
//!
//! ```
//! let trace = emm_trace::Trace::from_text("t.csv", "op,id,size,stream\na,1,512,0\nf,1,512,0\n")?;
//! let summary = emm_trace::scan(&trace)?;
//! assert_eq!((summary.requests, summary.peak_live_bytes), (1, 512));
//! # Ok::<(), emm_trace::TraceError>(())
//! ```
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

mod details;
mod diagnostics;
mod driver_costs;
mod error;
mod nesting;
mod op;
mod peak_map;
mod pickle;
pub mod record;
mod replay;
mod sampling;
pub mod snapshot;
pub mod synth;
mod target;
mod text;
pub mod torch_model;
mod trace;

pub use details::{Frame, ReservedPoint, StackId, TraceDetails, MAX_FRAMES};
pub use diagnostics::{Diagnostics, KEPT_LINE_ERRORS};
pub use driver_costs::DriverCosts;
pub use error::{excerpt, LineError, TraceError};
pub use op::{Format, Op};
pub use peak_map::{LiveBlock, PeakMap};
pub use record::{RecordingManager, RECORD_ENV};
pub use replay::{
    replay, scan, PassResult, ReplayOptions, ReplayResult, SteadyRule, SteadyStop, Summary,
    DEADLINE_EVERY,
};
pub use sampling::Sample;
pub use snapshot::TorchFigures;
pub use target::{DriverCalls, ReplayTarget};
pub use text::{GIVE_UP_AFTER_BAD, MAX_LINE};
pub use torch_model::TorchModel;
pub use trace::{Events, FormatChoice, Trace};

// The README's examples are compiled and run as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

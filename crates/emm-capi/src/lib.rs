//! The C ABI of emm. The header, `include/emm.h`, is generated from this crate by
//! cbindgen (`cargo xtask header`; `cbindgen.toml` holds its settings): the doc
//! comments of the exported items are the header's documentation, written for C
//! readers. `cargo xtask ci` checks that the committed header is the generated one
//! and that the library exports exactly the functions it declares.
//!
//! Conventions:
//! - Every function returns an [`emm_status`]: `EMM_OK` (0) or an error code. The
//!   message of the last failure on the calling thread is copied out by
//!   [`emm_last_error`].
//! - Device pointers are `uint64_t`; streams are `CUstream`/`cudaStream_t` values
//!   passed as `void*` (`NULL` is the legacy default stream).
//! - No Rust panic crosses the boundary: each entry point catches it and returns
//!   `EMM_ERR_PANIC`.
//! - Managers come from emm's process-wide router, so C, C++, Python and PyTorch in
//!   one process share one manager per device. Without a choice the manager is
//!   `pool`, for every entry point ([`emm_manager_create`] with a null name and
//!   PyTorch's [`emm_torch_alloc`] alike).
//! - Configuration: [`emm_configure`] sets any `EMM_*` setting before the first
//!   allocation (the environment wins).
//! - Out of memory is `EMM_ERR_OUT_OF_MEMORY`; [`emm_last_oom`] gives the bytes
//!   requested, free and total.
//! - Log output: see the [`log`] module (`EMM_LOG`, default `warn`, on standard
//!   error; or queued for [`emm_take_warning`]).
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)
#![allow(non_camel_case_types)] // reason: C names in the ABI
#![allow(clippy::missing_safety_doc)] // reason: the contract of each pointer argument is in its doc comment, which is include/emm.h's

// One concern per module. `status` (codes, last error, `guard`) and `ffi` are the
// plumbing every other module imports; nothing imports from this index, which only
// declares and re-exports.
mod array;
mod bridge;
mod cupy;
mod ffi;
mod graph_hooks;
mod guard;
mod handles;
mod ipc;
mod library;
pub mod log;
mod managed;
mod manager;
mod settings;
mod stat_names;
mod status;
mod tags;
mod tools;
mod torch;
mod torch_tools;
mod warnings;

pub use array::*;
pub use cupy::*;
pub use graph_hooks::*;
pub use ipc::*;
pub use library::*;
pub use managed::{
    emm_alloc_managed, emm_free_managed, EMM_MEM_ATTACH_GLOBAL, EMM_MEM_ATTACH_HOST,
};
pub use manager::*;
pub use settings::*;
pub use stat_names::*;
pub use status::{
    emm_status, ssize_t, ABI_VERSION, EMM_ERR_ALREADY_IN_USE, EMM_ERR_DRIVER, EMM_ERR_FORKED,
    EMM_ERR_INTERNAL, EMM_ERR_INVALID_ARGUMENT, EMM_ERR_IPC, EMM_ERR_OTHER, EMM_ERR_OUT_OF_MEMORY,
    EMM_ERR_PANIC, EMM_ERR_TAG_STATE, EMM_ERR_UNKNOWN_MANAGER, EMM_ERR_UNSUPPORTED, EMM_OK,
};
pub use tags::*;
pub use tools::*;
pub use torch::*;
pub use torch_tools::*;
pub use warnings::{emm_capture_warnings, emm_take_warning};

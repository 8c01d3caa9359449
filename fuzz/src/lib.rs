//! Coverage-guided fuzz targets for emm, shared by the AFL++ binaries
//! (`src/bin/<target>.rs`, built with `cargo afl build --features afl`) and the
//! corpus replay test (`tests/replay.rs`, a plain `cargo test`): both call the same
//! functions, so every file of `corpus/<target>/` is checked on every CI run.
//!
//! Each target takes any bytes and must not panic: a panic (a failed invariant
//! included) is a finding. See `docs/fuzzing.md`.

mod abi;
mod capi;
mod cupy;
mod cursor;
mod ipc;
mod pool;
mod torch;
mod trace;

pub use capi::capi_args;
pub use cupy::cupy_hooks;
pub use ipc::ipc_handle;
pub use pool::pool_ops;
pub use torch::torch_hooks;
pub use trace::{csv_trace, pickle_snapshot, rmm_log};

/// A target: its name (also its corpus folder and binary) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("pickle_snapshot", pickle_snapshot),
    ("csv_trace", csv_trace),
    ("rmm_log", rmm_log),
    ("ipc_handle", ipc_handle),
    ("capi_args", capi_args),
    ("pool_ops", pool_ops),
    ("torch_hooks", torch_hooks),
    ("cupy_hooks", cupy_hooks),
];

/// Points emm at the stand-in driver when no driver was chosen: the
/// `EMM_FUZZ_STANDIN` path, else `target/debug/libemm_standin.so` of the main
/// workspace (`cargo build -p emm-standin` there). Call it before any thread
/// starts (the first thing in `main`, or once in a test).
pub fn init() {
    if std::env::var_os(emm_sys::DRIVER_PATH_ENV).is_some() {
        return;
    }
    let path = std::env::var_os("EMM_FUZZ_STANDIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/debug/libemm_standin.so")
        });
    std::env::set_var(emm_sys::DRIVER_PATH_ENV, path);
}

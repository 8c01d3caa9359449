//! A fault-injecting stand-in for the CUDA driver: host memory, no GPU.
//!
//! Built as `libemm_standin.so`, it exports every entry point `emm_sys::Driver`
//! resolves (same names, `_v2` suffixes and C signatures) and is selected at run
//! time with `EMM_CUDA_DRIVER=/path/to/libemm_standin.so`. CI has no GPU; with this
//! library every driver-facing path of emm runs there, and tests can make the
//! driver fail on purpose.
//!
//! | module | models |
//! |---|---|
//! | [`memory`] | the address map: device memory is host memory (one lazily committed mapping per allocation), managed memory likewise (`cuMemAllocManaged`, charged like `cuMemAlloc`, freed by `cuMemFree`), a capacity per device, double and invalid frees counted |
//! | [`vmm`] | `cuMemAddressReserve` (`PROT_NONE`), `cuMemCreate` (memfd), `cuMemMap` (`MAP_FIXED \| MAP_SHARED`), access, unmap, release; 2 MiB granularity; `cuMemExportToShareableHandle` (a new descriptor of the memfd) and `cuMemImportFromShareableHandle` (maps that memfd) |
//! | [`mempool`] | the stream-ordered allocator: default and created pools, release threshold, trim, attributes, export and import within one process |
//! | [`streams`] | streams and events, run at call time, with a knob that makes queries report `CUDA_ERROR_NOT_READY` |
//! | [`context`] | devices (1 by default), primary contexts with retain counts, the per-thread current-context stack, device attributes |
//! | [`faults`] | failures of the N-th call of a named function or of the k-th call of a class of calls (any, frees, events), failing frees, a lost context (now or at the k-th call), call counters |
//! | [`fork`] | a child forked after `cuInit`: every call but the version, error-text and `cuGetProcAddress` queries fails with `CUDA_ERROR_NOT_INITIALIZED`, as on the real driver |
//! | [`control`] | the command language of `emmStandinControl` |
//! | [`exports`] | the C entry points, and `cuGetProcAddress`/`cuGetProcAddress_v2` over them (base name and CUDA version → the newest variant implemented; `CUDA_ERROR_NOT_FOUND` otherwise), through which the NVIDIA bindings (numba-cuda) resolve every function when a `libcuda.so.1` link to this library is on `LD_LIBRARY_PATH` |
//!
//! Not modelled: kernels (`cuModuleLoadData` and `cuLaunchKernel` return
//! `CUDA_ERROR_NOT_SUPPORTED`: there is no device to run code on) and anything
//! across processes (legacy IPC handles and mempool exports open only in the
//! process that made them; another process gets `CUDA_ERROR_NOT_SUPPORTED`,
//! because the model's memory is private to its process), except VMM memory
//! exported as a file descriptor: a physical handle is a memfd, so a descriptor
//! another process takes with `pidfd_getfd` maps the same memory there.
//!
//! # Knobs
//!
//! Read from the environment when the library first runs a call, and changed at
//! run time through `CUresult emmStandinControl(const char *command, unsigned long
//! long *out)` (see [`control`] for the commands; `emm_sys::Driver::stand_in`
//! wraps it):
//!
//! | variable | meaning |
//! |---|---|
//! | `EMM_STANDIN_CAPACITY` | bytes per device (`8G` by default; K/M/G suffixes) |
//! | `EMM_STANDIN_DEVICES` | device count (1 by default) |
//! | `EMM_STANDIN_VMM`, `EMM_STANDIN_MEMPOOLS`, `EMM_STANDIN_MANAGED` | `0` makes devices report no VMM / no memory pools / no managed memory |
//! | `EMM_STANDIN_NOT_READY` | queries after each record that report `CUDA_ERROR_NOT_READY` |
//! | `EMM_STANDIN_FAIL` | `name:nth:code[,…]`: the nth call of `name` fails with `code` |
//! | `EMM_STANDIN_FAIL_FREES` | every free fails with this code |
//! | `EMM_STANDIN_TRACE_PROCS` | `1`: every `cuGetProcAddress` lookup is printed to stderr |
//!
//! Every entry point runs under `catch_unwind` (a panic would be
//! `CUDA_ERROR_UNKNOWN`), and the whole model sits behind one lock.
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

mod config;
pub mod context;
pub mod control;
pub mod exports;
pub mod faults;
pub mod fork;
pub mod memory;
pub mod mempool;
mod os;
mod recent;
pub mod state;
pub mod streams;
pub mod vmm;

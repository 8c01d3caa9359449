//! The C entry points: every symbol `emm_sys::Driver` resolves, with the same
//! names (`_v2` suffixes included) and C signatures, plus `emmStandinControl`,
//! `cuStreamCreate`, `cuDevicePrimaryCtxReset_v2` (numba-cuda calls them), and
//! `cuGetProcAddress`/`_v2` over all of them ([`procaddress`]).
//!
//! Each one runs inside [`crate::state::call`], so it is counted, can be made to
//! fail, never unwinds into C, and sees the model under one lock.
//!
//! # Safety (every function here)
//! The C caller's contract of `cuda.h`: out-pointers are valid for writes of their
//! type (null is answered with `CUDA_ERROR_INVALID_VALUE`), in-pointers are valid
//! for reads, and host buffers of copies hold the given number of bytes.

#![allow(non_snake_case)] // reason: the driver API's C names

pub mod copy;
pub mod device;
pub mod init;
pub mod memory;
pub mod mempool;
pub mod module;
pub mod procaddress;
pub mod stream;
pub mod vmm;

//! The framework bridge: what the allocator hooks of PyTorch and CuPy keep
//! between calls, in Rust without C types (the shims convert): the devices and
//! their live allocations by address (`devices.rs`), the private pools of CUDA
//! graph captures (`graph_pools.rs`) and PyTorch's protocol over them
//! (`graph_capture.rs`), the address table (`live_table.rs`), the
//! other streams an allocation is used on (`stream_uses.rs`) and the hooks'
//! timing counters (`timing.rs`). No `extern "C"` here, and no `pub const`
//! (cbindgen would put it in the header).

pub(crate) mod devices;
pub(crate) mod graph_capture;
pub(crate) mod graph_pools;
pub(crate) mod live_table;
pub(crate) mod refused_frees;
pub(crate) mod stream_uses;
#[cfg(test)]
mod test_driver;
pub(crate) mod timing;

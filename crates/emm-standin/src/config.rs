//! What the model pretends to be ([`Config`]): capacity, devices and the features
//! they report. The model holds one (`State::config`, set from `EMM_STANDIN_*` in
//! `state.rs`); its parts, such as device attributes (`context.rs`), read it.

/// Default capacity per device: 8 GiB of accounting (memory is committed lazily).
pub const DEFAULT_CAPACITY: usize = 8 << 30;

/// What the model pretends to be.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bytes per device; allocations past it are `CUDA_ERROR_OUT_OF_MEMORY`.
    pub capacity: usize,
    /// Devices (1 or 2).
    pub devices: i32,
    /// Whether devices report virtual memory management.
    pub vmm: bool,
    /// Whether devices report memory pools.
    pub mempools: bool,
    /// Whether devices report managed memory (`cuMemAllocManaged`).
    pub managed: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            capacity: DEFAULT_CAPACITY,
            devices: 1,
            vmm: true,
            mempools: true,
            managed: true,
        }
    }
}

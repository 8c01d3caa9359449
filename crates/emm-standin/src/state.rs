//! The process-wide model behind one lock, its configuration (read from the
//! environment here; [`Config`] itself is in `config.rs`, which the model's parts
//! read too), and [`call`], the wrapper every exported entry point runs in
//! (counting, fault injection, no panic across the C ABI).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, MutexGuard, OnceLock};

use emm_sys::CUresult;

pub use crate::config::{Config, DEFAULT_CAPACITY};
use crate::context::Contexts;
use crate::faults::{parse_code, Faults};
use crate::memory::Memory;
use crate::mempool::Pools;
use crate::streams::Streams;
use crate::vmm::Vmm;

/// The whole model.
#[derive(Debug, Default)]
pub struct State {
    /// `cuInit` was called.
    pub initialized: bool,
    /// The configuration.
    pub config: Config,
    /// Planned faults and call counters.
    pub faults: Faults,
    /// The address map.
    pub mem: Memory,
    /// Reservations and physical handles.
    pub vmm: Vmm,
    /// Memory pools.
    pub pools: Pools,
    /// Streams and events.
    pub streams: Streams,
    /// Primary contexts.
    pub contexts: Contexts,
    /// Legacy IPC handles opened: address → open count.
    pub ipc_open: HashMap<u64, u64>,
    next_handle: u64,
}

impl State {
    /// A fresh handle value (non-null, never reused).
    pub fn new_handle(&mut self) -> u64 {
        self.next_handle += 0x10;
        0x5100_0000 + self.next_handle
    }

    /// The model configured from `EMM_STANDIN_*` variables.
    fn from_env() -> State {
        let mut st = State::default();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let Some(c) = var("EMM_STANDIN_CAPACITY").and_then(|v| parse_bytes(&v)) {
            st.config.capacity = c;
        }
        if let Some(n) = var("EMM_STANDIN_DEVICES").and_then(|v| v.parse::<i32>().ok()) {
            st.config.devices = n.clamp(1, 8);
        }
        if let Some(v) = var("EMM_STANDIN_VMM") {
            st.config.vmm = v != "0";
        }
        if let Some(v) = var("EMM_STANDIN_MEMPOOLS") {
            st.config.mempools = v != "0";
        }
        if let Some(v) = var("EMM_STANDIN_MANAGED") {
            st.config.managed = v != "0";
        }
        if let Some(n) = var("EMM_STANDIN_NOT_READY").and_then(|v| v.parse().ok()) {
            st.streams.not_ready_after_record = n;
        }
        if let Some(code) = var("EMM_STANDIN_FAIL_FREES").and_then(|v| parse_code(&v)) {
            st.faults.fail_frees(Some(code));
        }
        // `name:nth:code[,name:nth:code…]`
        for item in var("EMM_STANDIN_FAIL").unwrap_or_default().split(',') {
            let mut p = item.split(':');
            if let (Some(name), Some(nth), Some(code)) = (p.next(), p.next(), p.next()) {
                if let (Ok(nth), Some(code)) = (nth.parse(), parse_code(code)) {
                    st.faults.fail_nth(name, nth, code);
                }
            }
        }
        st
    }
}

/// Parses `1234`, `64K`, `512M`, `8G` (binary units).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();

/// The model, locked (a poisoned lock is taken over: the model stays usable).
pub fn lock() -> MutexGuard<'static, State> {
    STATE
        .get_or_init(|| Mutex::new(State::from_env()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Calls that work before `cuInit`.
const BEFORE_INIT: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
];

/// Runs entry point `name`: refuses it in a child forked after `cuInit` (as the
/// real driver does, see [`crate::fork`]), counts the call, injects a planned
/// fault, checks `cuInit` was called, then runs `f` on the locked model. A panic
/// becomes `CUDA_ERROR_UNKNOWN`.
pub fn call(name: &'static str, f: impl FnOnce(&mut State) -> Result<(), CUresult>) -> CUresult {
    if crate::fork::in_forked_child() && !crate::fork::WORK_AFTER_FORK.contains(&name) {
        return CUresult::ERROR_NOT_INITIALIZED;
    }
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut st = lock();
        if let Some(code) = st.faults.on_call(name) {
            return code;
        }
        if !st.initialized && !BEFORE_INIT.contains(&name) {
            return CUresult::ERROR_NOT_INITIALIZED;
        }
        match f(&mut st) {
            Ok(()) => CUresult::SUCCESS,
            Err(e) => e,
        }
    }))
    .unwrap_or(CUresult::ERROR_UNKNOWN)
}

/// Writes `v` through the out-pointer `p`, or fails with `CUDA_ERROR_INVALID_VALUE`
/// when it is null.
///
/// # Safety
/// A non-null `p` must be valid for a write of `T` (the C caller's contract).
pub unsafe fn put<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes per the caller's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_parse_with_units() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("8G"), Some(8 << 30));
        assert_eq!(parse_bytes("x"), None);
    }
}

//! Devices, primary contexts (with retain counts) and each thread's stack of
//! current contexts.

use std::cell::RefCell;
use std::sync::Mutex;

use emm_sys::{CUdevice_attribute as A, CUresult};

use crate::config::Config;

/// The handle of device `d`'s primary context: a fixed non-null value per device.
pub fn ctx_handle(d: i32) -> u64 {
    0xC0_0000 + d as u64 * 0x100
}

/// The device whose primary context `h` is, when `h` is one.
pub fn ctx_device(h: u64, devices: i32) -> Option<i32> {
    (0..devices).find(|&d| ctx_handle(d) == h)
}

thread_local! {
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

// Drivers are called from thread-local destructors (a pool's per-thread cache
// giving blocks back at thread exit), after this thread's `STACK` may be gone; the
// stack of such a thread lives in `LATE`, keyed by its kernel thread id, and is
// removed when it empties.
static LATE: Mutex<Vec<(i64, Vec<u64>)>> = Mutex::new(Vec::new());

fn with_stack<R>(f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
    if STACK.try_with(|_| ()).is_ok() {
        // Alive a moment ago on this same thread, so alive now.
        return STACK.with(|s| f(&mut s.borrow_mut()));
    }
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = i64::from(unsafe { libc::gettid() });
    let mut late = LATE.lock().unwrap_or_else(|p| p.into_inner());
    let i = match late.iter().position(|(t, _)| *t == tid) {
        Some(i) => i,
        None => {
            late.push((tid, Vec::new()));
            late.len() - 1
        }
    };
    let r = f(&mut late[i].1);
    if late[i].1.is_empty() {
        late.swap_remove(i);
    }
    r
}

/// The calling thread's current context, 0 when none.
pub fn current() -> u64 {
    with_stack(|s| s.last().copied().unwrap_or(0))
}

/// `cuCtxSetCurrent`: replaces the top of the stack (null pops).
pub fn set_current(h: u64) {
    with_stack(|s| {
        if h == 0 {
            s.pop();
        } else if let Some(top) = s.last_mut() {
            *top = h;
        } else {
            s.push(h);
        }
    });
}

/// `cuCtxPushCurrent`.
pub fn push(h: u64) {
    with_stack(|s| s.push(h));
}

/// `cuCtxPopCurrent`: the popped context, 0 when the stack was empty.
pub fn pop() -> u64 {
    with_stack(|s| s.pop().unwrap_or(0))
}

/// Primary contexts: one retain count per device.
#[derive(Debug, Default)]
pub struct Contexts {
    /// Retains per device.
    pub refs: Vec<u32>,
    /// Resets per device (`cuDevicePrimaryCtxReset`): a reset context is a new
    /// one, with a new `cuCtxGetId`.
    pub resets: Vec<u64>,
    /// Peer access enabled, as `(from, to)` device pairs.
    pub peers: Vec<(i32, i32)>,
}

impl Contexts {
    /// `cuDevicePrimaryCtxRetain`.
    pub fn retain(&mut self, d: i32) -> u64 {
        let i = d as usize;
        if self.refs.len() <= i {
            self.refs.resize(i + 1, 0);
        }
        self.refs[i] += 1;
        ctx_handle(d)
    }

    /// `cuDevicePrimaryCtxRelease`.
    pub fn release(&mut self, d: i32) -> Result<(), CUresult> {
        match self.refs.get_mut(d as usize) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Ok(())
            }
            _ => Err(CUresult::ERROR_INVALID_CONTEXT),
        }
    }

    /// `true` while device `d`'s primary context is retained.
    pub fn active(&self, d: i32) -> bool {
        self.refs.get(d as usize).is_some_and(|&n| n > 0)
    }

    /// Retains outstanding over every device.
    pub fn total_refs(&self) -> u64 {
        self.refs.iter().map(|&n| u64::from(n)).sum()
    }

    /// The device of the calling thread's current context, which must be retained.
    pub fn current_device(&self, devices: i32) -> Result<i32, CUresult> {
        let h = current();
        if h == 0 {
            return Err(CUresult::ERROR_INVALID_CONTEXT);
        }
        let d = ctx_device(h, devices).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        if !self.active(d) {
            return Err(CUresult::ERROR_CONTEXT_IS_DESTROYED);
        }
        Ok(d)
    }
}

/// A device attribute's value in the model (device `d`, with the knobs of
/// `config`); `None` for one it does not know.
pub fn attribute(a: A, d: i32, config: &Config) -> Option<i32> {
    let (vmm, mempools) = (config.vmm, config.mempools);
    Some(match a {
        A::MAX_THREADS_PER_BLOCK => 1024,
        A::WARP_SIZE => 32,
        A::CLOCK_RATE => 1_000_000,
        A::MULTIPROCESSOR_COUNT => 2,
        A::INTEGRATED => 0,
        A::CAN_MAP_HOST_MEMORY => 1,
        A::PCI_BUS_ID => 0x10 + d,
        A::PCI_DEVICE_ID => 0,
        A::UNIFIED_ADDRESSING => 1,
        A::COMPUTE_CAPABILITY_MAJOR => 9,
        A::COMPUTE_CAPABILITY_MINOR => 0,
        A::MANAGED_MEMORY | A::CONCURRENT_MANAGED_ACCESS => i32::from(config.managed),
        A::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => i32::from(vmm),
        A::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => 1,
        A::MEMORY_POOLS_SUPPORTED => i32::from(mempools),
        A::MEMPOOL_SUPPORTED_HANDLE_TYPES => {
            if mempools {
                emm_sys::handle_type::POSIX_FILE_DESCRIPTOR
            } else {
                0
            }
        }
        A(n) if (1..=150).contains(&n) => 0,
        _ => return None,
    })
}

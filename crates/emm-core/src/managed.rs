//! Managed (unified) memory: [`ManagedAttach`], the owned [`ManagedMemory`] that
//! [`MemoryManager::memallocmanaged`](crate::MemoryManager::memallocmanaged) hands
//! out, and its counters, [`ManagedStats`].
//!
//! NBEP 7 does not list managed memory, but Numba calls `memallocmanaged(size,
//! attach_global)` on its memory manager for `cuda.managed_array`: one address
//! that the host and every device may use, whose pages the driver migrates.
//!
//! Managed memory is **not** device memory in a manager's
//! [`ManagerStats`](crate::ManagerStats): `allocated_bytes` and `reserved_bytes`
//! count what the manager holds of the device (what snapshots and PyTorch's tools
//! sum up), while managed pages live on the host or the device as they are used,
//! and may exceed the device (oversubscription). Managers count it apart, in
//! [`ManagedStats`] (`emm.managed_*` in `memory_stats`).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::stat_names as stat;
use emm_sys::{mem_attach, CUdeviceptr};

/// Where new managed memory is attached (`cuMemAllocManaged`'s flags; Numba's
/// `attach_global`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ManagedAttach {
    /// `CU_MEM_ATTACH_GLOBAL`: accessible from any stream on any device (Numba's
    /// `attach_global=True`, its default).
    #[default]
    Global,
    /// `CU_MEM_ATTACH_HOST`: attached to the host; devices without concurrent
    /// managed access must not touch it until it is attached to a stream
    /// (`attach_global=False`).
    Host,
}

impl ManagedAttach {
    /// Numba's `attach_global` flag: `true` is [`Global`](Self::Global).
    pub fn from_global(attach_global: bool) -> Self {
        if attach_global {
            ManagedAttach::Global
        } else {
            ManagedAttach::Host
        }
    }

    /// The `CU_MEM_ATTACH_*` bits.
    pub fn driver_flags(self) -> u32 {
        match self {
            ManagedAttach::Global => mem_attach::GLOBAL,
            ManagedAttach::Host => mem_attach::HOST,
        }
    }

    /// The attachment for `CU_MEM_ATTACH_*` bits, `None` unless they are exactly
    /// `GLOBAL` or `HOST` (what `cuMemAllocManaged` accepts).
    pub fn from_driver_flags(flags: u32) -> Option<Self> {
        match flags {
            mem_attach::GLOBAL => Some(ManagedAttach::Global),
            mem_attach::HOST => Some(ManagedAttach::Host),
            _ => None,
        }
    }
}

type ManagedCallback = Box<dyn FnOnce(CUdeviceptr, usize) + Send>;

/// Managed memory owned by the caller, given back to its manager on drop.
///
/// The same address is valid on the host ([`host_ptr`](Self::host_ptr)) and on
/// every device ([`ptr`](Self::ptr)). The host must not touch it while a kernel
/// runs on a device without concurrent managed access
/// (`emm_driver::Device::concurrent_managed_access`): synchronize first.
pub struct ManagedMemory {
    ptr: CUdeviceptr,
    size: usize,
    attach: ManagedAttach,
    release: Option<ManagedCallback>,
}

// SAFETY: an owned address range; the callback is Send and runs once, from Drop.
unsafe impl Send for ManagedMemory {}
// SAFETY: `&ManagedMemory` exposes only the address, size and attachment; the
// callback is taken only through `&mut self` in Drop.
unsafe impl Sync for ManagedMemory {}

impl ManagedMemory {
    /// Managed memory released by `release(ptr, size)`.
    ///
    /// # Safety
    /// `[ptr, ptr+size)` must be managed memory (or, on a stand-in, host memory)
    /// that stays valid until `release` runs.
    pub unsafe fn from_raw_parts(
        ptr: CUdeviceptr,
        size: usize,
        attach: ManagedAttach,
        release: impl FnOnce(CUdeviceptr, usize) + Send + 'static,
    ) -> Self {
        ManagedMemory {
            ptr,
            size,
            attach,
            release: Some(Box::new(release)),
        }
    }

    /// A zero-length allocation that owns nothing (address 0), as managers return
    /// for a request of 0 bytes.
    pub fn empty(attach: ManagedAttach) -> Self {
        ManagedMemory {
            ptr: 0,
            size: 0,
            attach,
            release: None,
        }
    }

    /// The address, as a device pointer.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The same address, as a host pointer.
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Where it was attached when allocated.
    pub fn attach(&self) -> ManagedAttach {
        self.attach
    }
}

impl core::fmt::Debug for ManagedMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ManagedMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("attach", &self.attach)
            .finish()
    }
}

impl Drop for ManagedMemory {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            if emm_sys::forked() {
                // The releasing manager is the parent's, copied by fork.
                core::mem::forget(f);
                return;
            }
            let (p, s) = (self.ptr, self.size);
            if catch_unwind(AssertUnwindSafe(move || f(p, s))).is_err() {
                tracing::error!(
                    ptr = format_args!("{p:#x}"),
                    size = s,
                    "a managed-memory release callback panicked; the memory is lost"
                );
            }
        }
    }
}

/// What a manager counts of managed memory (kept apart from its device memory;
/// see [the module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagedStats {
    /// Bytes in managed allocations held by callers.
    pub allocated_bytes: usize,
    /// Peak of `allocated_bytes`.
    pub allocated_bytes_peak: usize,
    /// Managed allocations held by callers.
    pub live: usize,
    /// Managed allocations served so far.
    pub allocations: u64,
    /// Bytes freed by callers whose `cuMemFree` waits for the last
    /// `defer_cleanup` guard.
    pub pending_bytes: usize,
}

impl ManagedStats {
    /// The counters under the names `memory_stats` gives them (`emm.managed_*`).
    pub fn to_list(&self) -> crate::StatList {
        vec![
            (stat::MANAGED_BYTES_CURRENT, self.allocated_bytes as u64),
            (stat::MANAGED_BYTES_PEAK, self.allocated_bytes_peak as u64),
            (stat::MANAGED_ALLOCATIONS_CURRENT, self.live as u64),
            (stat::MANAGED_ALLOCATIONS_ALLOCATED, self.allocations),
            (stat::MANAGED_PENDING_BYTES, self.pending_bytes as u64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn attach_flags_round_trip_and_others_are_refused() {
        for a in [ManagedAttach::Global, ManagedAttach::Host] {
            assert_eq!(ManagedAttach::from_driver_flags(a.driver_flags()), Some(a));
        }
        assert_eq!(ManagedAttach::Global.driver_flags(), 1);
        assert_eq!(ManagedAttach::Host.driver_flags(), 2);
        for bad in [0, 3, 4, 5, u32::MAX] {
            assert_eq!(ManagedAttach::from_driver_flags(bad), None, "{bad}");
        }
        assert_eq!(ManagedAttach::from_global(true), ManagedAttach::Global);
        assert_eq!(ManagedAttach::from_global(false), ManagedAttach::Host);
        assert_eq!(ManagedAttach::default(), ManagedAttach::Global);
    }

    #[test]
    fn drop_releases_once_and_a_panicking_release_does_not_escape() {
        let freed = Arc::new(AtomicUsize::new(0));
        let f = freed.clone();
        // SAFETY: a fake address, never dereferenced.
        let m = unsafe {
            ManagedMemory::from_raw_parts(0x4000, 300, ManagedAttach::Host, move |p, s| {
                assert_eq!((p, s), (0x4000, 300));
                f.fetch_add(s, Ordering::SeqCst);
            })
        };
        assert_eq!(m.host_ptr() as usize, 0x4000);
        assert_eq!(m.attach(), ManagedAttach::Host);
        drop(m);
        assert_eq!(freed.load(Ordering::SeqCst), 300);
        // SAFETY: as above.
        let p = unsafe {
            ManagedMemory::from_raw_parts(0x10, 8, ManagedAttach::Global, |_, _| panic!("boom"))
        };
        drop(p); // must not unwind
        let e = ManagedMemory::empty(ManagedAttach::Global);
        assert_eq!((e.ptr(), e.size()), (0, 0));
    }
}

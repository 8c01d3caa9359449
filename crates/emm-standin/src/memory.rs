//! The address map: every range the model hands out (device allocations, managed
//! allocations, pool allocations, VMM mappings, pinned and registered host memory),
//! the device's accounting against its capacity, and the bookkeeping of bad frees.
//!
//! Device memory is host memory: an anonymous, lazily committed mapping per
//! allocation (page aligned, so 256-byte alignment holds), so bytes written by a
//! copy can be read back.

use std::collections::{BTreeMap, HashSet};

use emm_sys::CUresult;

use crate::os;

/// Bytes each device allocation is rounded to for accounting.
pub const ACCOUNTING_UNIT: usize = 512;

/// Rounds `n` up to a multiple of `unit` (a power of two), `None` on overflow.
pub fn align_up(n: usize, unit: usize) -> Option<usize> {
    Some(n.checked_add(unit - 1)? & !(unit - 1))
}

/// What a range of the address map is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// `cuMemAlloc`.
    Device,
    /// `cuMemAllocManaged` with these `CU_MEM_ATTACH_*` flags: host and device
    /// memory at one address (here it is host memory anyway).
    Managed {
        /// `CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST`.
        flags: u32,
    },
    /// `cuMemAllocAsync`/`cuMemAllocFromPoolAsync`: a block of `block` bytes of pool `pool`.
    Async {
        /// The pool's handle.
        pool: u64,
        /// The block's size (at least the region's).
        block: usize,
    },
    /// A VMM mapping of physical handle `handle`.
    Vmm {
        /// The `cuMemCreate` handle.
        handle: u64,
    },
    /// `cuMemHostAlloc`: pinned host memory (plain host memory here).
    HostAlloc,
    /// `cuMemHostRegister`: the caller's memory.
    HostRegistered,
}

impl RegionKind {
    /// `true` for device memory (as opposed to host memory); managed memory is
    /// device memory that the host may also touch.
    pub fn is_device(self) -> bool {
        matches!(
            self,
            RegionKind::Device
                | RegionKind::Managed { .. }
                | RegionKind::Async { .. }
                | RegionKind::Vmm { .. }
        )
    }

    /// `true` for memory `cuMemFree` takes back: `cuMemAlloc` and
    /// `cuMemAllocManaged` allocations.
    pub fn is_freed_by_mem_free(self) -> bool {
        matches!(self, RegionKind::Device | RegionKind::Managed { .. })
    }
}

/// One range of the address map.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    /// Bytes the range covers.
    pub size: usize,
    /// What it is.
    pub kind: RegionKind,
    /// The device ordinal it belongs to.
    pub device: i32,
    /// Bytes of the host mapping behind it (to unmap), 0 when not ours.
    pub map_len: usize,
    /// `false` for a VMM mapping before `cuMemSetAccess`.
    pub access: bool,
}

/// The address map and the per-device accounting.
#[derive(Debug, Default)]
pub struct Memory {
    regions: BTreeMap<u64, Region>,
    /// Bases freed since they were last handed out.
    freed: HashSet<u64>,
    /// Bytes in use per device (allocations, pool reservations, physical handles).
    pub used: Vec<usize>,
    /// Frees of an address that was already freed.
    pub double_frees: u64,
    /// Frees of an address that was never handed out (or is not a base).
    pub invalid_frees: u64,
}

impl Memory {
    /// Takes `bytes` of `device`'s `capacity`, or fails with out-of-memory.
    pub fn charge(&mut self, device: i32, bytes: usize, capacity: usize) -> Result<(), CUresult> {
        let d = device as usize;
        if self.used.len() <= d {
            self.used.resize(d + 1, 0);
        }
        match self.used[d].checked_add(bytes) {
            Some(n) if n <= capacity => {
                self.used[d] = n;
                Ok(())
            }
            _ => Err(CUresult::ERROR_OUT_OF_MEMORY),
        }
    }

    /// Gives `bytes` of `device` back.
    pub fn uncharge(&mut self, device: i32, bytes: usize) {
        if let Some(u) = self.used.get_mut(device as usize) {
            *u = u.saturating_sub(bytes);
        }
    }

    /// Bytes in use on `device`.
    pub fn used_on(&self, device: i32) -> usize {
        self.used.get(device as usize).copied().unwrap_or(0)
    }

    /// Adds a range; the caller made sure it overlaps nothing.
    pub fn insert(&mut self, base: u64, region: Region) {
        self.freed.remove(&base);
        self.regions.insert(base, region);
    }

    /// Removes the range that starts at `base`, counting a double or invalid free
    /// when there is none (or when `accept` rejects its kind).
    pub fn remove(
        &mut self,
        base: u64,
        accept: impl Fn(RegionKind) -> bool,
    ) -> Result<Region, CUresult> {
        match self.regions.get(&base) {
            Some(r) if accept(r.kind) => {
                let r = *r;
                self.regions.remove(&base);
                self.freed.insert(base);
                Ok(r)
            }
            Some(_) => {
                self.invalid_frees += 1;
                Err(CUresult::ERROR_INVALID_VALUE)
            }
            None => {
                if self.freed.contains(&base) {
                    self.double_frees += 1;
                } else {
                    self.invalid_frees += 1;
                }
                Err(CUresult::ERROR_INVALID_VALUE)
            }
        }
    }

    /// Forgets a range without counting it as a free (used by VMM unmapping).
    pub fn forget(&mut self, base: u64) -> Option<Region> {
        self.regions.remove(&base)
    }

    /// The range containing `ptr`, with its base.
    pub fn find(&self, ptr: u64) -> Option<(u64, Region)> {
        let (&base, r) = self.regions.range(..=ptr).next_back()?;
        (ptr < base + r.size.max(1) as u64).then_some((base, *r))
    }

    /// Mutable access to the range starting at `base`.
    pub fn get_mut(&mut self, base: u64) -> Option<&mut Region> {
        self.regions.get_mut(&base)
    }

    /// Ranges overlapping `[start, start+len)`, with their bases.
    pub fn overlapping(&self, start: u64, len: usize) -> Vec<(u64, Region)> {
        let end = start.saturating_add(len as u64);
        let mut out: Vec<(u64, Region)> = self
            .regions
            .range(start..end)
            .map(|(b, r)| (*b, *r))
            .collect();
        if let Some((b, r)) = self.find(start) {
            if b < start {
                out.insert(0, (b, r));
            }
        }
        out
    }

    /// `true` when `[ptr, ptr+len)` is covered by accessible ranges (adjacent ranges,
    /// such as consecutive VMM mappings, may together cover it).
    pub fn covers(&self, ptr: u64, len: usize) -> bool {
        let end = ptr.saturating_add(len as u64);
        let mut cur = ptr;
        if len == 0 {
            return self.find(ptr).is_some_and(|(_, r)| r.access);
        }
        while cur < end {
            match self.find(cur) {
                Some((base, r)) if r.access => cur = base + r.size as u64,
                _ => return false,
            }
        }
        true
    }

    /// `(count, bytes)` of live ranges whose kind `pick` selects.
    pub fn live(&self, pick: impl Fn(RegionKind) -> bool) -> (u64, u64) {
        self.regions
            .values()
            .filter(|r| pick(r.kind))
            .fold((0, 0), |(n, b), r| (n + 1, b + r.size as u64))
    }

    /// `cuMemAlloc`: a fresh mapping of `size` bytes on `device`.
    pub fn alloc_device(
        &mut self,
        device: i32,
        size: usize,
        capacity: usize,
    ) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let charged = align_up(size, ACCOUNTING_UNIT).ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
        self.charge(device, charged, capacity)?;
        let Some(base) = os::map_anon(size) else {
            self.uncharge(device, charged);
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        };
        self.insert(
            base,
            Region {
                size,
                kind: RegionKind::Device,
                device,
                map_len: size,
                access: true,
            },
        );
        Ok(base)
    }

    /// `cuMemAllocManaged`: like `cuMemAlloc` (a fresh mapping charged against
    /// `device`'s capacity, as if every page were resident on the device: the
    /// model does not oversubscribe), recorded as managed with `flags`.
    pub fn alloc_managed(
        &mut self,
        device: i32,
        size: usize,
        flags: u32,
        capacity: usize,
    ) -> Result<u64, CUresult> {
        let base = self.alloc_device(device, size, capacity)?;
        if let Some(r) = self.regions.get_mut(&base) {
            r.kind = RegionKind::Managed { flags };
        }
        Ok(base)
    }

    /// `cuMemFree`: unmaps a `cuMemAlloc` or `cuMemAllocManaged` allocation.
    pub fn free_device(&mut self, ptr: u64) -> Result<(), CUresult> {
        let r = self.remove(ptr, RegionKind::is_freed_by_mem_free)?;
        // SAFETY: the mapping was made by `alloc_device` and its range just left the map.
        unsafe { os::unmap(ptr, r.map_len) };
        self.uncharge(
            r.device,
            align_up(r.size, ACCOUNTING_UNIT).unwrap_or(r.size),
        );
        Ok(())
    }

    /// `cuMemHostAlloc`: plain host memory, recorded as pinned.
    pub fn alloc_host(&mut self, size: usize) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let base = os::map_anon(size).ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
        self.insert(
            base,
            Region {
                size,
                kind: RegionKind::HostAlloc,
                device: 0,
                map_len: size,
                access: true,
            },
        );
        Ok(base)
    }

    /// `cuMemFreeHost`.
    pub fn free_host(&mut self, ptr: u64) -> Result<(), CUresult> {
        let r = self.remove(ptr, |k| k == RegionKind::HostAlloc)?;
        // SAFETY: the mapping was made by `alloc_host` and just left the map.
        unsafe { os::unmap(ptr, r.map_len) };
        Ok(())
    }

    /// `cuMemHostRegister`: records the caller's range as pinned.
    pub fn register_host(&mut self, ptr: u64, size: usize) -> Result<(), CUresult> {
        if ptr == 0 || size == 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if !self.overlapping(ptr, size).is_empty() {
            return Err(CUresult::ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.insert(
            ptr,
            Region {
                size,
                kind: RegionKind::HostRegistered,
                device: 0,
                map_len: 0,
                access: true,
            },
        );
        Ok(())
    }

    /// `cuMemHostUnregister`.
    pub fn unregister_host(&mut self, ptr: u64) -> Result<(), CUresult> {
        match self.regions.get(&ptr) {
            Some(r) if r.kind == RegionKind::HostRegistered => {
                self.regions.remove(&ptr);
                Ok(())
            }
            _ => Err(CUresult::ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_and_double_free() {
        let mut m = Memory::default();
        let p = m.alloc_device(0, 1000, 1 << 20).unwrap();
        assert_eq!(p % 256, 0);
        assert_eq!(m.used_on(0), 1024);
        assert!(m.covers(p + 10, 990));
        assert!(!m.covers(p + 10, 991));
        assert_eq!(m.find(p + 999).map(|(b, _)| b), Some(p));
        m.free_device(p).unwrap();
        assert_eq!(m.used_on(0), 0);
        assert_eq!(m.free_device(p), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(m.double_frees, 1);
        assert_eq!(m.free_device(12345), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(m.invalid_frees, 1);
    }

    #[test]
    fn managed_memory_is_charged_and_freed_by_mem_free() {
        let mut m = Memory::default();
        let p = m.alloc_managed(0, 1000, 1, 1 << 20).unwrap();
        assert_eq!(m.used_on(0), 1024);
        let (_, r) = m.find(p).unwrap();
        assert_eq!(r.kind, RegionKind::Managed { flags: 1 });
        assert!(r.kind.is_device());
        assert_eq!(
            m.alloc_managed(0, 2 << 20, 1, 1 << 20),
            Err(CUresult::ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(
            m.alloc_managed(0, 0, 1, 1 << 20),
            Err(CUresult::ERROR_INVALID_VALUE)
        );
        m.free_device(p).unwrap();
        assert_eq!(m.used_on(0), 0);
        assert_eq!(m.free_device(p), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(m.double_frees, 1);
    }

    #[test]
    fn capacity_is_enforced() {
        let mut m = Memory::default();
        let a = m.alloc_device(0, 4096, 8192).unwrap();
        assert_eq!(
            m.alloc_device(0, 8192, 8192),
            Err(CUresult::ERROR_OUT_OF_MEMORY)
        );
        m.free_device(a).unwrap();
    }
}

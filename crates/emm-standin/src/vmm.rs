//! Virtual memory management: reservations are inaccessible `PROT_NONE`
//! mappings, physical handles are memfds (charged against the device's capacity
//! at `cuMemCreate`), and `cuMemMap` maps a memfd over the reservation with
//! `MAP_FIXED | MAP_SHARED`. A mapping is reachable by copies only after
//! `cuMemSetAccess`, as on a GPU.

use std::collections::{BTreeMap, HashMap, HashSet};

use emm_sys::CUresult;

use crate::memory::{Memory, Region, RegionKind};
use crate::os;

/// The allocation granularity (minimum and recommended): 2 MiB, as on current GPUs.
pub const GRANULARITY: usize = 2 << 20;

/// One `cuMemCreate` handle.
#[derive(Debug)]
pub struct Physical {
    fd: i32,
    /// Bytes.
    pub size: usize,
    /// The device it was made on.
    pub device: i32,
    released: bool,
    maps: u32,
}

/// Reservations and physical handles.
#[derive(Debug, Default)]
pub struct Vmm {
    reservations: BTreeMap<u64, usize>,
    handles: HashMap<u64, Physical>,
    gone: HashSet<u64>,
}

impl Vmm {
    /// `cuMemAddressReserve`.
    pub fn reserve(&mut self, size: usize, align: usize) -> Result<u64, CUresult> {
        if size == 0 || size % GRANULARITY != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let align = if align == 0 { GRANULARITY } else { align };
        if !align.is_power_of_two() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let base =
            os::reserve(size, align.max(GRANULARITY)).ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
        self.reservations.insert(base, size);
        Ok(base)
    }

    /// `cuMemAddressFree`: the whole reservation, with nothing mapped in it.
    pub fn free_reservation(
        &mut self,
        mem: &mut Memory,
        base: u64,
        size: usize,
    ) -> Result<(), CUresult> {
        match self.reservations.get(&base) {
            Some(&s) if s == size => {}
            _ => {
                mem.invalid_frees += 1;
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
        }
        if mem
            .overlapping(base, size)
            .iter()
            .any(|(_, r)| matches!(r.kind, RegionKind::Vmm { .. }))
        {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        self.reservations.remove(&base);
        // SAFETY: the reservation was made by `reserve` and nothing is mapped in it.
        unsafe { os::unmap(base, size) };
        Ok(())
    }

    /// `cuMemCreate`: charges `size` bytes and makes a memfd of that size.
    pub fn create(
        &mut self,
        mem: &mut Memory,
        handle: u64,
        size: usize,
        device: i32,
        capacity: usize,
    ) -> Result<(), CUresult> {
        if size == 0 || size % GRANULARITY != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        mem.charge(device, size, capacity)?;
        let Some(fd) = os::memfd(size) else {
            mem.uncharge(device, size);
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        };
        self.handles.insert(
            handle,
            Physical {
                fd,
                size,
                device,
                released: false,
                maps: 0,
            },
        );
        Ok(())
    }

    /// `cuMemRelease`: the memory goes when its last mapping does.
    pub fn release(&mut self, mem: &mut Memory, handle: u64) -> Result<(), CUresult> {
        match self.handles.get_mut(&handle) {
            Some(p) if !p.released => {
                p.released = true;
                if p.maps == 0 {
                    self.drop_handle(mem, handle);
                }
                Ok(())
            }
            _ => {
                if self.gone.contains(&handle) || self.handles.contains_key(&handle) {
                    mem.double_frees += 1;
                } else {
                    mem.invalid_frees += 1;
                }
                Err(CUresult::ERROR_INVALID_VALUE)
            }
        }
    }

    fn drop_handle(&mut self, mem: &mut Memory, handle: u64) {
        if let Some(p) = self.handles.remove(&handle) {
            os::close(p.fd);
            mem.uncharge(p.device, p.size);
            self.gone.insert(handle);
        }
    }

    /// `cuMemMap`.
    pub fn map(
        &mut self,
        mem: &mut Memory,
        ptr: u64,
        size: usize,
        offset: usize,
        handle: u64,
    ) -> Result<(), CUresult> {
        let p = self
            .handles
            .get(&handle)
            .filter(|p| !p.released)
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        if size == 0
            || size % GRANULARITY != 0
            || offset % GRANULARITY != 0
            || offset.checked_add(size).is_none_or(|e| e > p.size)
        {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let inside = self
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&b, &s)| ptr + size as u64 <= b + s as u64);
        if !inside {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if !mem.overlapping(ptr, size).is_empty() {
            return Err(CUresult::ERROR_ALREADY_MAPPED);
        }
        // SAFETY: `[ptr, ptr+size)` lies in one of our reservations and overlaps no
        // mapping (both checked above).
        if !unsafe { os::map_fd_fixed(ptr, size, p.fd, offset) } {
            return Err(CUresult::ERROR_MAP_FAILED);
        }
        let device = p.device;
        if let Some(p) = self.handles.get_mut(&handle) {
            p.maps += 1;
        }
        mem.insert(
            ptr,
            Region {
                size,
                kind: RegionKind::Vmm { handle },
                device,
                map_len: size,
                access: false,
            },
        );
        Ok(())
    }

    /// `cuMemSetAccess`: every mapping in the range becomes reachable.
    pub fn set_access(&self, mem: &mut Memory, ptr: u64, size: usize) -> Result<(), CUresult> {
        if !mem.covers_mapped(ptr, size) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        for (base, _) in mem.overlapping(ptr, size) {
            if let Some(r) = mem.get_mut(base) {
                r.access = true;
            }
        }
        Ok(())
    }

    /// `cuMemUnmap`: every mapping in the range, each wholly inside it.
    pub fn unmap(&mut self, mem: &mut Memory, ptr: u64, size: usize) -> Result<(), CUresult> {
        let end = ptr.saturating_add(size as u64);
        let hits = mem.overlapping(ptr, size);
        let whole = hits.iter().all(|(b, r)| {
            matches!(r.kind, RegionKind::Vmm { .. }) && *b >= ptr && b + r.size as u64 <= end
        });
        if hits.is_empty() || !whole {
            mem.invalid_frees += 1;
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        for (base, r) in hits {
            mem.forget(base);
            // SAFETY: the mapping lies in our reservation and just left the map.
            unsafe { os::unreserve_into(base, r.size) };
            if let RegionKind::Vmm { handle } = r.kind {
                let done = self.handles.get_mut(&handle).is_some_and(|p| {
                    p.maps = p.maps.saturating_sub(1);
                    p.released && p.maps == 0
                });
                if done {
                    self.drop_handle(mem, handle);
                }
            }
        }
        Ok(())
    }

    /// `(count, bytes)` of physical handles not yet freed.
    pub fn live_handles(&self) -> (u64, u64) {
        self.handles
            .values()
            .fold((0, 0), |(n, b), p| (n + 1, b + p.size as u64))
    }

    /// Reservations not yet freed.
    pub fn live_reservations(&self) -> u64 {
        self.reservations.len() as u64
    }
}

impl Memory {
    /// `true` when `[ptr, ptr+len)` is covered by VMM mappings (accessible or not).
    pub fn covers_mapped(&self, ptr: u64, len: usize) -> bool {
        let end = ptr.saturating_add(len as u64);
        let mut cur = ptr;
        while cur < end {
            match self.find(cur) {
                Some((base, r)) if matches!(r.kind, RegionKind::Vmm { .. }) => {
                    cur = base + r.size as u64
                }
                _ => return false,
            }
        }
        len > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_create_map_access_unmap_release() {
        let mut mem = Memory::default();
        let mut v = Vmm::default();
        let base = v.reserve(8 * GRANULARITY, 0).unwrap();
        assert_eq!(base % GRANULARITY as u64, 0);
        v.create(&mut mem, 1, 2 * GRANULARITY, 0, 1 << 30).unwrap();
        v.map(&mut mem, base, 2 * GRANULARITY, 0, 1).unwrap();
        assert!(!mem.covers(base, 16));
        v.set_access(&mut mem, base, 2 * GRANULARITY).unwrap();
        assert!(mem.covers(base, 2 * GRANULARITY));
        // SAFETY: the range was just mapped read-write.
        unsafe { *(base as *mut u8) = 7 };
        v.release(&mut mem, 1).unwrap();
        assert_eq!(v.live_handles().0, 1, "still mapped");
        assert_eq!(
            v.free_reservation(&mut mem, base, 8 * GRANULARITY),
            Err(CUresult::ERROR_INVALID_VALUE)
        );
        v.unmap(&mut mem, base, 2 * GRANULARITY).unwrap();
        assert_eq!(v.live_handles().0, 0);
        assert_eq!(mem.used_on(0), 0);
        v.free_reservation(&mut mem, base, 8 * GRANULARITY).unwrap();
        assert_eq!(v.release(&mut mem, 1), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(mem.double_frees, 1);
    }
}

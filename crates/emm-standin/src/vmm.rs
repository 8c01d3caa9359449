//! Virtual memory management: reservations are inaccessible `PROT_NONE`
//! mappings, physical handles are memfds (charged against the device's capacity
//! at `cuMemCreate`), and `cuMemMap` maps a memfd over the reservation with
//! `MAP_FIXED | MAP_SHARED`. A mapping is reachable by copies only after
//! `cuMemSetAccess`, as on a GPU.

use std::collections::{BTreeMap, HashMap};

use emm_sys::CUresult;

use crate::memory::{Memory, Region, RegionKind};
use crate::os;
use crate::recent::Recent;

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
    /// Made with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` requested: it can be
    /// exported (`cuMemExportToShareableHandle`).
    pub exportable: bool,
    /// Counted against the device's capacity (made here by `cuMemCreate`; an
    /// imported handle is charged to its exporter).
    charged: bool,
    /// The memfd's (device, inode): imports of it find their exporter by it.
    id: (u64, u64),
}

/// Reservations and physical handles.
#[derive(Debug, Default)]
pub struct Vmm {
    reservations: BTreeMap<u64, usize>,
    handles: HashMap<u64, Physical>,
    /// Handles released last (a second release is a double free).
    gone: Recent,
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

    /// `cuMemCreate`: charges `size` bytes and makes a memfd of that size;
    /// `exportable`: the prop requested POSIX file descriptors.
    pub fn create(
        &mut self,
        mem: &mut Memory,
        handle: u64,
        size: usize,
        device: i32,
        capacity: usize,
        exportable: bool,
    ) -> Result<(), CUresult> {
        if size == 0 || size % GRANULARITY != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        mem.charge(device, size, capacity)?;
        let Some(fd) = os::memfd(size) else {
            mem.uncharge(device, size);
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        };
        let id = os::identity(fd).map_or((0, 0), |(_, id)| id);
        self.handles.insert(
            handle,
            Physical {
                fd,
                size,
                device,
                released: false,
                maps: 0,
                exportable,
                charged: true,
                id,
            },
        );
        Ok(())
    }

    /// `cuMemExportToShareableHandle` (POSIX file descriptor): a new descriptor of
    /// the handle's memfd, which the caller owns. A handle made without the
    /// exportable handle type is `CUDA_ERROR_NOT_PERMITTED`, as on a GPU.
    pub fn export(&self, handle: u64) -> Result<i32, CUresult> {
        let p = self
            .handles
            .get(&handle)
            .filter(|p| !p.released)
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        if !p.exportable {
            return Err(CUresult::ERROR_NOT_PERMITTED);
        }
        os::dup(p.fd).ok_or(CUresult::ERROR_OPERATING_SYSTEM)
    }

    /// `cuMemImportFromShareableHandle` (POSIX file descriptor): a new handle over
    /// the memfd `fd` names (a duplicate is kept; the caller still owns `fd`). The
    /// memory is shared for real, so a descriptor taken from another process with
    /// `pidfd_getfd` maps that process's memory. Its device is the exporter's
    /// when this process made it, else `device`; it is charged to no device (its
    /// exporter was). A descriptor that is not a stand-in memfd is
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub fn import(&mut self, fd: i32, handle: u64, device: i32) -> Result<(), CUresult> {
        if !os::is_physical(fd) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let (size, id) = os::identity(fd).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if size == 0 || size % GRANULARITY != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let device = self
            .handles
            .values()
            .find(|p| p.id == id)
            .map_or(device, |p| p.device);
        let own = os::dup(fd).ok_or(CUresult::ERROR_OPERATING_SYSTEM)?;
        self.handles.insert(
            handle,
            Physical {
                fd: own,
                size,
                device,
                released: false,
                maps: 0,
                exportable: true,
                charged: false,
                id,
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
                if self.gone.contains(handle) || self.handles.contains_key(&handle) {
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
            if p.charged {
                mem.uncharge(p.device, p.size);
            }
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
        v.create(&mut mem, 1, 2 * GRANULARITY, 0, 1 << 30, false)
            .unwrap();
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

    #[test]
    fn an_exported_handle_imports_to_the_same_memory() {
        let mut mem = Memory::default();
        let mut v = Vmm::default();
        let g = GRANULARITY;
        v.create(&mut mem, 1, 2 * g, 0, 1 << 30, false).unwrap();
        assert_eq!(v.export(1), Err(CUresult::ERROR_NOT_PERMITTED));
        v.create(&mut mem, 2, 2 * g, 0, 1 << 30, true).unwrap();
        assert_eq!(v.export(9), Err(CUresult::ERROR_INVALID_HANDLE));
        let fd = v.export(2).unwrap();
        v.import(fd, 3, 5).unwrap();
        os::close(fd); // the import keeps its own descriptor
        assert_eq!(mem.used_on(0), 4 * g, "an import is charged to nobody");
        let base = v.reserve(8 * g, 0).unwrap();
        v.map(&mut mem, base, 2 * g, 0, 2).unwrap();
        v.map(&mut mem, base + 2 * g as u64, 2 * g, 0, 3).unwrap();
        v.set_access(&mut mem, base, 4 * g).unwrap();
        // SAFETY: both ranges were just mapped read-write.
        unsafe {
            *((base + 100) as *mut u8) = 42;
            assert_eq!(*((base + 2 * g as u64 + 100) as *const u8), 42);
        }
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(
            v.import(f.as_raw_fd(), 4, 0),
            Err(CUresult::ERROR_INVALID_VALUE)
        );
        v.unmap(&mut mem, base, 4 * g).unwrap();
        for h in [1, 2, 3] {
            v.release(&mut mem, h).unwrap();
        }
        assert_eq!(v.live_handles().0, 0);
        assert_eq!(mem.used_on(0), 0);
        v.free_reservation(&mut mem, base, 8 * g).unwrap();
    }
}

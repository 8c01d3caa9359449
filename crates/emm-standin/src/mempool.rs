//! The stream-ordered allocator: memory pools (each device's default pool and
//! created ones) that cache freed blocks, give them back above their release
//! threshold at synchronization points, and report the attributes the managers
//! read.
//!
//! Export and import are modelled within one process: the shareable handle is a
//! memfd named `emm-standin-pool-<pid>-<pool>` (importing resolves it through
//! `/proc/self/fd`), and pointer export data names the pool and the address.
//! Importing from another process returns `CUDA_ERROR_NOT_SUPPORTED`: the model's
//! memory is private to its process.

use std::collections::HashMap;

use emm_sys::{CUmemPool_attribute as Attr, CUresult};

use crate::memory::{align_up, Memory, Region, RegionKind, ACCOUNTING_UNIT};
use crate::os;

const EXPORT_MAGIC: &[u8; 8] = b"EMMSTDIN";

/// One pool.
#[derive(Debug, Default)]
pub struct Pool {
    /// The device it serves.
    pub device: i32,
    cached: Vec<(u64, usize)>,
    reserved: u64,
    reserved_high: u64,
    used: u64,
    used_high: u64,
    threshold: u64,
    max_size: u64,
    exportable: bool,
    is_default: bool,
    destroyed: bool,
    /// For an imported pool: the pool it was exported from.
    imported_from: Option<u64>,
}

/// Every pool, and the pointers imported into this process.
#[derive(Debug, Default)]
pub struct Pools {
    pools: HashMap<u64, Pool>,
    defaults: HashMap<i32, u64>,
    /// Imported pointers: address → how many imports are open.
    imported: HashMap<u64, u64>,
}

impl Pools {
    /// Creates a pool under `handle`.
    pub fn create(&mut self, handle: u64, device: i32, exportable: bool, max_size: u64) {
        self.pools.insert(
            handle,
            Pool {
                device,
                exportable,
                max_size,
                ..Pool::default()
            },
        );
    }

    /// The default pool of `device`, made under `handle` on first use.
    pub fn default_pool(&mut self, device: i32, handle: impl FnOnce() -> u64) -> u64 {
        if let Some(&h) = self.defaults.get(&device) {
            return h;
        }
        let h = handle();
        self.pools.insert(
            h,
            Pool {
                device,
                is_default: true,
                ..Pool::default()
            },
        );
        self.defaults.insert(device, h);
        h
    }

    fn live_pool(&mut self, handle: u64) -> Result<&mut Pool, CUresult> {
        self.pools
            .get_mut(&handle)
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::ERROR_INVALID_VALUE)
    }

    /// `cuMemAllocFromPoolAsync`: a cached block of fitting size, else a new one
    /// (giving the pool's cached blocks back first when the device is full).
    pub fn alloc(
        &mut self,
        mem: &mut Memory,
        handle: u64,
        size: usize,
        capacity: usize,
    ) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let want = align_up(size, ACCOUNTING_UNIT).ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
        let pool = self.live_pool(handle)?;
        let device = pool.device;
        let fit = pool
            .cached
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| *s >= want && *s / 2 <= want)
            .min_by_key(|(_, (_, s))| *s)
            .map(|(i, _)| i);
        let (base, block) = match fit {
            Some(i) => pool.cached.swap_remove(i),
            None => {
                if pool.max_size != 0 && pool.reserved + want as u64 > pool.max_size {
                    release_cached(pool, mem, 0);
                    if pool.reserved + want as u64 > pool.max_size {
                        return Err(CUresult::ERROR_OUT_OF_MEMORY);
                    }
                }
                if mem.charge(device, want, capacity).is_err() {
                    release_cached(pool, mem, 0);
                    mem.charge(device, want, capacity)?;
                }
                let Some(base) = os::map_anon(want) else {
                    mem.uncharge(device, want);
                    return Err(CUresult::ERROR_OUT_OF_MEMORY);
                };
                pool.reserved += want as u64;
                pool.reserved_high = pool.reserved_high.max(pool.reserved);
                (base, want)
            }
        };
        pool.used += block as u64;
        pool.used_high = pool.used_high.max(pool.used);
        mem.insert(
            base,
            Region {
                size,
                kind: RegionKind::Async {
                    pool: handle,
                    block,
                },
                device,
                map_len: block,
                access: true,
            },
        );
        Ok(base)
    }

    /// `cuMemFreeAsync`: the block goes back to its pool's cache (or an imported
    /// pointer is closed).
    pub fn free(&mut self, mem: &mut Memory, ptr: u64) -> Result<(), CUresult> {
        if let Some(n) = self.imported.get_mut(&ptr) {
            *n -= 1;
            if *n == 0 {
                self.imported.remove(&ptr);
            }
            return Ok(());
        }
        let r = mem.remove(ptr, |k| matches!(k, RegionKind::Async { .. }))?;
        let RegionKind::Async { pool, block } = r.kind else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        let Some(p) = self.pools.get_mut(&pool) else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        p.used = p.used.saturating_sub(block as u64);
        p.cached.push((ptr, block));
        if p.destroyed {
            release_cached(p, mem, 0);
            if p.used == 0 {
                self.pools.remove(&pool);
            }
        }
        Ok(())
    }

    /// A synchronization point: each pool keeps at most its release threshold.
    pub fn on_sync(&mut self, mem: &mut Memory) {
        for p in self.pools.values_mut() {
            let keep = p.threshold;
            release_cached(p, mem, keep);
        }
    }

    /// `cuMemPoolTrimTo`.
    pub fn trim(&mut self, mem: &mut Memory, handle: u64, keep: u64) -> Result<(), CUresult> {
        let p = self.live_pool(handle)?;
        release_cached(p, mem, keep);
        Ok(())
    }

    /// `cuMemPoolDestroy`: immediate when nothing is allocated from the pool, else
    /// when the last allocation is freed (as the driver documents).
    pub fn destroy(&mut self, mem: &mut Memory, handle: u64) -> Result<(), CUresult> {
        let p = self.live_pool(handle)?;
        if p.is_default {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        p.destroyed = true;
        release_cached(p, mem, 0);
        if p.used == 0 {
            self.pools.remove(&handle);
        }
        Ok(())
    }

    /// `cuMemPoolGetAttribute`, written as `u64` (attributes 4–8) or `i32` (1–3).
    pub fn get_attribute(&mut self, handle: u64, attr: Attr) -> Result<AttrValue, CUresult> {
        let p = self.live_pool(handle)?;
        Ok(match attr {
            Attr::REUSE_FOLLOW_EVENT_DEPENDENCIES
            | Attr::REUSE_ALLOW_OPPORTUNISTIC
            | Attr::REUSE_ALLOW_INTERNAL_DEPENDENCIES => AttrValue::Int(1),
            Attr::RELEASE_THRESHOLD => AttrValue::U64(p.threshold),
            Attr::RESERVED_MEM_CURRENT => AttrValue::U64(p.reserved),
            Attr::RESERVED_MEM_HIGH => AttrValue::U64(p.reserved_high),
            Attr::USED_MEM_CURRENT => AttrValue::U64(p.used),
            Attr::USED_MEM_HIGH => AttrValue::U64(p.used_high),
            _ => return Err(CUresult::ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemPoolSetAttribute`: the release threshold, or a reset of a high-water mark.
    pub fn set_attribute(&mut self, handle: u64, attr: Attr, value: u64) -> Result<(), CUresult> {
        let p = self.live_pool(handle)?;
        match attr {
            Attr::REUSE_FOLLOW_EVENT_DEPENDENCIES
            | Attr::REUSE_ALLOW_OPPORTUNISTIC
            | Attr::REUSE_ALLOW_INTERNAL_DEPENDENCIES => {}
            Attr::RELEASE_THRESHOLD => p.threshold = value,
            Attr::RESERVED_MEM_HIGH if value == 0 => p.reserved_high = p.reserved,
            Attr::USED_MEM_HIGH if value == 0 => p.used_high = p.used,
            _ => return Err(CUresult::ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    /// Checks a pool handle for `cuMemPoolSetAccess`.
    pub fn check(&mut self, handle: u64) -> Result<i32, CUresult> {
        self.live_pool(handle).map(|p| p.device)
    }

    /// `cuMemPoolExportToShareableHandle`: a memfd whose name identifies the pool.
    pub fn export(&mut self, handle: u64) -> Result<i32, CUresult> {
        let p = self.live_pool(handle)?;
        if !p.exportable {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let name = format!("emm-standin-pool-{}-{handle}\0", std::process::id());
        // SAFETY: `name` is NUL-terminated; the new fd is handed to the caller.
        let fd = unsafe { libc::memfd_create(name.as_ptr().cast(), 0) };
        if fd < 0 {
            return Err(CUresult::ERROR_OPERATING_SYSTEM);
        }
        Ok(fd)
    }

    /// `cuMemPoolImportFromShareableHandle`: resolves the memfd's name; a pool of
    /// another process is `CUDA_ERROR_NOT_SUPPORTED`.
    pub fn import(&mut self, fd: i32, new_handle: u64) -> Result<(), CUresult> {
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        let link = link.to_string_lossy();
        let rest = link
            .split("emm-standin-pool-")
            .nth(1)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let mut parts = rest.split(['-', ' ']);
        let pid: u32 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let src: u64 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if pid != std::process::id() {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        let device = self.live_pool(src)?.device;
        self.pools.insert(
            new_handle,
            Pool {
                device,
                imported_from: Some(src),
                ..Pool::default()
            },
        );
        Ok(())
    }

    /// `cuMemPoolExportPointer`.
    pub fn export_pointer(&self, mem: &Memory, ptr: u64) -> Result<[u8; 64], CUresult> {
        let Some((base, r)) = mem.find(ptr) else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        let RegionKind::Async { pool, .. } = r.kind else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        if base != ptr || !self.pools.get(&pool).is_some_and(|p| p.exportable) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let mut out = [0u8; 64];
        out[..8].copy_from_slice(EXPORT_MAGIC);
        out[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        out[16..24].copy_from_slice(&pool.to_le_bytes());
        out[24..32].copy_from_slice(&ptr.to_le_bytes());
        Ok(out)
    }

    /// `cuMemPoolImportPointer`.
    pub fn import_pointer(
        &mut self,
        mem: &Memory,
        handle: u64,
        data: &[u8; 64],
    ) -> Result<u64, CUresult> {
        if &data[..8] != EXPORT_MAGIC {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&data[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let pid = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
        if pid != std::process::id() {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        let (src, ptr) = (word(16), word(24));
        if self.live_pool(handle)?.imported_from != Some(src) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        match mem.find(ptr) {
            Some((b, r)) if b == ptr && r.kind.is_device() => {}
            _ => return Err(CUresult::ERROR_INVALID_VALUE),
        }
        *self.imported.entry(ptr).or_insert(0) += 1;
        Ok(ptr)
    }

    /// Pools not destroyed (or destroyed with allocations still out), defaults excluded.
    pub fn live_pools(&self) -> u64 {
        self.pools.values().filter(|p| !p.is_default).count() as u64
    }

    /// `(blocks, bytes)` cached in pools (reserved but not allocated).
    pub fn cached(&self) -> (u64, u64) {
        self.pools.values().fold((0, 0), |(n, b), p| {
            (
                n + p.cached.len() as u64,
                b + p.cached.iter().map(|c| c.1 as u64).sum::<u64>(),
            )
        })
    }
}

/// A pool attribute's value and its C width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrValue {
    /// An `int` attribute.
    Int(i32),
    /// A `cuuint64_t` attribute.
    U64(u64),
}

fn release_cached(p: &mut Pool, mem: &mut Memory, keep: u64) {
    p.cached.sort_by_key(|c| core::cmp::Reverse(c.1));
    while p.reserved > keep {
        let Some((base, block)) = p.cached.pop() else {
            break;
        };
        // SAFETY: the block's mapping was made by `alloc` and is cached, not in use.
        unsafe { os::unmap(base, block) };
        p.reserved -= block as u64;
        mem.uncharge(p.device, block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_cached_and_released_above_the_threshold() {
        let mut mem = Memory::default();
        let mut pools = Pools::default();
        pools.create(7, 0, true, 0);
        let a = pools.alloc(&mut mem, 7, 1000, 1 << 20).unwrap();
        pools.free(&mut mem, a).unwrap();
        let b = pools.alloc(&mut mem, 7, 1000, 1 << 20).unwrap();
        assert_eq!(a, b, "the cached block is reused");
        assert_eq!(
            pools.get_attribute(7, Attr::USED_MEM_CURRENT),
            Ok(AttrValue::U64(1024))
        );
        let data = pools.export_pointer(&mem, b).unwrap();
        let fd = pools.export(7).unwrap();
        pools.import(fd, 8).unwrap();
        os::close(fd);
        assert_eq!(pools.import_pointer(&mem, 8, &data), Ok(b));
        pools.free(&mut mem, b).unwrap(); // the import
        pools.free(&mut mem, b).unwrap(); // the allocation
        assert_eq!(pools.free(&mut mem, b), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(mem.double_frees, 1);
        pools.on_sync(&mut mem);
        assert_eq!(mem.used_on(0), 0);
        pools.destroy(&mut mem, 8).unwrap();
        pools.destroy(&mut mem, 7).unwrap();
        assert_eq!(pools.live_pools(), 0);
    }
}

//! [`Device`]: an ordinal and its properties.

use core::ffi::{c_char, c_int};

use emm_sys::{CUdevice, CUdevice_attribute, CUuuid};

use crate::error::{check, driver, DriverError, Result};

/// A CUDA device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    raw: CUdevice,
    ordinal: i32,
}

impl Device {
    /// The number of devices the driver sees.
    pub fn count() -> Result<usize> {
        let drv = driver()?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        check(drv, "cuDeviceGetCount", unsafe {
            (drv.device_get_count)(&mut n)
        })?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The device of `ordinal`; an ordinal past [`Device::count`] is an
    /// [`DriverError::InvalidArgument`] that says how many there are.
    pub fn get(ordinal: usize) -> Result<Device> {
        let n = Device::count()?;
        if ordinal >= n {
            return Err(DriverError::invalid(
                "device ordinal",
                ordinal,
                format!("{n} device(s)"),
            ));
        }
        let drv = driver()?;
        let mut raw = CUdevice(0);
        let ord = ordinal as c_int; // < n, which came from a c_int
                                    // SAFETY: `raw` is a valid out-pointer and `ord` is in range.
        check(drv, "cuDeviceGet", unsafe {
            (drv.device_get)(&mut raw, ord)
        })?;
        Ok(Device { raw, ordinal: ord })
    }

    /// Every device, in ordinal order.
    pub fn all() -> Result<Vec<Device>> {
        (0..Device::count()?).map(Device::get).collect()
    }

    /// Wraps a raw handle whose ordinal is `ordinal` (handles equal ordinals in
    /// every driver so far; this keeps both for clarity).
    pub fn from_raw(raw: CUdevice) -> Device {
        Device {
            raw,
            ordinal: raw.0,
        }
    }

    /// The raw handle.
    pub fn raw(self) -> CUdevice {
        self.raw
    }

    /// The ordinal.
    pub fn ordinal(self) -> usize {
        self.ordinal as usize
    }

    /// The marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(self) -> Result<String> {
        let drv = driver()?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer is 256 bytes and we pass its length.
        check(drv, "cuDeviceGetName", unsafe {
            (drv.device_get_name)(buf.as_mut_ptr(), 256, self.raw)
        })?;
        buf[255] = 0; // the driver NUL-terminates; make sure of it
                      // SAFETY: `buf` is NUL-terminated (last byte forced to 0 above).
        Ok(unsafe { core::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The device's UUID.
    pub fn uuid(self) -> Result<[u8; 16]> {
        let drv = driver()?;
        let mut u = CUuuid::default();
        // SAFETY: `u` is a valid out-pointer.
        check(drv, "cuDeviceGetUuid", unsafe {
            (drv.device_get_uuid)(&mut u, self.raw)
        })?;
        Ok(u.bytes.map(|b| b as u8))
    }

    /// Total device memory in bytes.
    pub fn total_memory(self) -> Result<usize> {
        let drv = driver()?;
        let mut t = 0usize;
        // SAFETY: `t` is a valid out-pointer.
        check(drv, "cuDeviceTotalMem_v2", unsafe {
            (drv.device_total_mem)(&mut t, self.raw)
        })?;
        Ok(t)
    }

    /// A device attribute.
    pub fn attribute(self, attr: CUdevice_attribute) -> Result<i32> {
        let drv = driver()?;
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; an unknown attribute is a driver error.
        check(drv, "cuDeviceGetAttribute", unsafe {
            (drv.device_get_attribute)(&mut v, attr, self.raw)
        })?;
        Ok(v)
    }

    /// `(major, minor)` compute capability.
    pub fn compute_capability(self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(CUdevice_attribute::COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(CUdevice_attribute::COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// `true` when both the driver and the device support the stream-ordered
    /// allocator (`cuMemAllocAsync` and memory pools).
    pub fn supports_memory_pools(self) -> Result<bool> {
        let drv = driver()?;
        if !drv.has_stream_ordered_allocator() {
            return Ok(false);
        }
        Ok(self.attribute(CUdevice_attribute::MEMORY_POOLS_SUPPORTED)? != 0)
    }

    /// `true` when both the driver and the device support managed memory
    /// (`cuMemAllocManaged`).
    pub fn supports_managed_memory(self) -> Result<bool> {
        let drv = driver()?;
        if drv.mem_alloc_managed.is_none() {
            return Ok(false);
        }
        Ok(self.attribute(CUdevice_attribute::MANAGED_MEMORY)? != 0)
    }

    /// `true` when the host may touch managed memory while kernels run on this
    /// device (`CONCURRENT_MANAGED_ACCESS`); otherwise only after synchronizing.
    pub fn concurrent_managed_access(self) -> Result<bool> {
        Ok(self.attribute(CUdevice_attribute::CONCURRENT_MANAGED_ACCESS)? != 0)
    }

    /// `true` when both the driver and the device support virtual memory management.
    pub fn supports_virtual_memory(self) -> Result<bool> {
        let drv = driver()?;
        if !drv.has_virtual_memory_management() {
            return Ok(false);
        }
        Ok(self.attribute(CUdevice_attribute::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? != 0)
    }

    /// Whether this device can access `peer`'s memory directly.
    pub fn can_access_peer(self, peer: Device) -> Result<bool> {
        let drv = driver()?;
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        check(drv, "cuDeviceCanAccessPeer", unsafe {
            (drv.device_can_access_peer)(&mut v, self.raw, peer.raw)
        })?;
        Ok(v != 0)
    }
}

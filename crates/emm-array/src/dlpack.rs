//! The DLPack ABI (`dlpack.h` v1.x), defined from the public header.

#![allow(non_camel_case_types)] // reason: the C names of dlpack.h

use core::ffi::c_void;

/// The DLPack version this crate produces.
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 1 };

/// `kDLCPU`.
pub const KDL_CPU: i32 = 1;
/// `kDLCUDA`.
pub const KDL_CUDA: i32 = 2;
/// `kDLCUDAHost` (pinned host memory).
pub const KDL_CUDA_HOST: i32 = 3;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const FLAG_READ_ONLY: u64 = 1;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// `DLDeviceType`.
    pub device_type: i32,
    /// Device ordinal (0 for host memory).
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// `DLDataTypeCode`.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// The data pointer.
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements.
    pub strides: *mut i64,
    /// Offset of the first element from `data`, in bytes.
    pub byte_offset: u64,
}

/// `DLManagedTensor` (legacy, unversioned).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor and what it holds; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version of this struct.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor and what it holds; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_dlpack_h() {
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(size_of::<DLManagedTensor>(), 64);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
        assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    }
}

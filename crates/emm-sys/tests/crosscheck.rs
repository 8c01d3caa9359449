//! Cross-checks the hand-written ABI against `cuda-driver-sys` (CUDA 10.2 bindings).
//!
//! `cuda-driver-sys` is a dev-dependency only, and `.cargo/config.toml` overrides its
//! `links = "cuda"` build script, so this test binary links no libcuda either. Only
//! types and constants are compared; no driver function is referenced.

use core::mem::size_of;
use cuda_driver_sys as c;
use emm_sys::*;

macro_rules! same_results {
    ($( $ours:ident => $theirs:ident, )*) => {
        $( assert_eq!(CUresult::$ours.0, c::cudaError_enum::$theirs as i32, stringify!($ours)); )*
    };
}

#[test]
fn result_codes_match() {
    same_results! {
        SUCCESS => CUDA_SUCCESS,
        ERROR_INVALID_VALUE => CUDA_ERROR_INVALID_VALUE,
        ERROR_OUT_OF_MEMORY => CUDA_ERROR_OUT_OF_MEMORY,
        ERROR_NOT_INITIALIZED => CUDA_ERROR_NOT_INITIALIZED,
        ERROR_DEINITIALIZED => CUDA_ERROR_DEINITIALIZED,
        ERROR_PROFILER_DISABLED => CUDA_ERROR_PROFILER_DISABLED,
        ERROR_NO_DEVICE => CUDA_ERROR_NO_DEVICE,
        ERROR_INVALID_DEVICE => CUDA_ERROR_INVALID_DEVICE,
        ERROR_INVALID_IMAGE => CUDA_ERROR_INVALID_IMAGE,
        ERROR_INVALID_CONTEXT => CUDA_ERROR_INVALID_CONTEXT,
        ERROR_CONTEXT_ALREADY_CURRENT => CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
        ERROR_MAP_FAILED => CUDA_ERROR_MAP_FAILED,
        ERROR_UNMAP_FAILED => CUDA_ERROR_UNMAP_FAILED,
        ERROR_ARRAY_IS_MAPPED => CUDA_ERROR_ARRAY_IS_MAPPED,
        ERROR_ALREADY_MAPPED => CUDA_ERROR_ALREADY_MAPPED,
        ERROR_NO_BINARY_FOR_GPU => CUDA_ERROR_NO_BINARY_FOR_GPU,
        ERROR_ALREADY_ACQUIRED => CUDA_ERROR_ALREADY_ACQUIRED,
        ERROR_NOT_MAPPED => CUDA_ERROR_NOT_MAPPED,
        ERROR_ECC_UNCORRECTABLE => CUDA_ERROR_ECC_UNCORRECTABLE,
        ERROR_UNSUPPORTED_LIMIT => CUDA_ERROR_UNSUPPORTED_LIMIT,
        ERROR_CONTEXT_ALREADY_IN_USE => CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
        ERROR_PEER_ACCESS_UNSUPPORTED => CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        ERROR_INVALID_PTX => CUDA_ERROR_INVALID_PTX,
        ERROR_INVALID_GRAPHICS_CONTEXT => CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
        ERROR_NVLINK_UNCORRECTABLE => CUDA_ERROR_NVLINK_UNCORRECTABLE,
        ERROR_JIT_COMPILER_NOT_FOUND => CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
        ERROR_INVALID_SOURCE => CUDA_ERROR_INVALID_SOURCE,
        ERROR_FILE_NOT_FOUND => CUDA_ERROR_FILE_NOT_FOUND,
        ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND => CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
        ERROR_SHARED_OBJECT_INIT_FAILED => CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
        ERROR_OPERATING_SYSTEM => CUDA_ERROR_OPERATING_SYSTEM,
        ERROR_INVALID_HANDLE => CUDA_ERROR_INVALID_HANDLE,
        ERROR_ILLEGAL_STATE => CUDA_ERROR_ILLEGAL_STATE,
        ERROR_NOT_FOUND => CUDA_ERROR_NOT_FOUND,
        ERROR_NOT_READY => CUDA_ERROR_NOT_READY,
        ERROR_ILLEGAL_ADDRESS => CUDA_ERROR_ILLEGAL_ADDRESS,
        ERROR_LAUNCH_OUT_OF_RESOURCES => CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        ERROR_LAUNCH_TIMEOUT => CUDA_ERROR_LAUNCH_TIMEOUT,
        ERROR_PEER_ACCESS_ALREADY_ENABLED => CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        ERROR_PEER_ACCESS_NOT_ENABLED => CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        ERROR_PRIMARY_CONTEXT_ACTIVE => CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
        ERROR_CONTEXT_IS_DESTROYED => CUDA_ERROR_CONTEXT_IS_DESTROYED,
        ERROR_ASSERT => CUDA_ERROR_ASSERT,
        ERROR_TOO_MANY_PEERS => CUDA_ERROR_TOO_MANY_PEERS,
        ERROR_HOST_MEMORY_ALREADY_REGISTERED => CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        ERROR_HOST_MEMORY_NOT_REGISTERED => CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        ERROR_HARDWARE_STACK_ERROR => CUDA_ERROR_HARDWARE_STACK_ERROR,
        ERROR_ILLEGAL_INSTRUCTION => CUDA_ERROR_ILLEGAL_INSTRUCTION,
        ERROR_MISALIGNED_ADDRESS => CUDA_ERROR_MISALIGNED_ADDRESS,
        ERROR_INVALID_ADDRESS_SPACE => CUDA_ERROR_INVALID_ADDRESS_SPACE,
        ERROR_INVALID_PC => CUDA_ERROR_INVALID_PC,
        ERROR_LAUNCH_FAILED => CUDA_ERROR_LAUNCH_FAILED,
        ERROR_COOPERATIVE_LAUNCH_TOO_LARGE => CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        ERROR_NOT_PERMITTED => CUDA_ERROR_NOT_PERMITTED,
        ERROR_NOT_SUPPORTED => CUDA_ERROR_NOT_SUPPORTED,
        ERROR_SYSTEM_NOT_READY => CUDA_ERROR_SYSTEM_NOT_READY,
        ERROR_SYSTEM_DRIVER_MISMATCH => CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
        ERROR_STREAM_CAPTURE_UNSUPPORTED => CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        ERROR_UNKNOWN => CUDA_ERROR_UNKNOWN,
    }
}

#[test]
fn attributes_and_flags_match() {
    use c::CUdevice_attribute_enum as A;
    assert_eq!(
        CUdevice_attribute::MAX_THREADS_PER_BLOCK.0,
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK as i32
    );
    assert_eq!(
        CUdevice_attribute::WARP_SIZE.0,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE as i32
    );
    assert_eq!(
        CUdevice_attribute::CLOCK_RATE.0,
        A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE as i32
    );
    assert_eq!(
        CUdevice_attribute::MULTIPROCESSOR_COUNT.0,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32
    );
    assert_eq!(
        CUdevice_attribute::INTEGRATED.0,
        A::CU_DEVICE_ATTRIBUTE_INTEGRATED as i32
    );
    assert_eq!(
        CUdevice_attribute::CAN_MAP_HOST_MEMORY.0,
        A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY as i32
    );
    assert_eq!(
        CUdevice_attribute::PCI_BUS_ID.0,
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as i32
    );
    assert_eq!(
        CUdevice_attribute::PCI_DEVICE_ID.0,
        A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID as i32
    );
    assert_eq!(
        CUdevice_attribute::UNIFIED_ADDRESSING.0,
        A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING as i32
    );
    assert_eq!(
        CUdevice_attribute::COMPUTE_CAPABILITY_MAJOR.0,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as i32
    );
    assert_eq!(
        CUdevice_attribute::COMPUTE_CAPABILITY_MINOR.0,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as i32
    );
    assert_eq!(
        CUdevice_attribute::MANAGED_MEMORY.0,
        A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY as i32
    );
    assert_eq!(
        CUdevice_attribute::CONCURRENT_MANAGED_ACCESS.0,
        A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS as i32
    );
    assert_eq!(
        CUdevice_attribute::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.0,
        A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED as i32
    );
    assert_eq!(
        CUdevice_attribute::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED.0,
        A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED as i32
    );

    use c::CUpointer_attribute_enum as P;
    assert_eq!(
        CUpointer_attribute::CONTEXT.0,
        P::CU_POINTER_ATTRIBUTE_CONTEXT as i32
    );
    assert_eq!(
        CUpointer_attribute::MEMORY_TYPE.0,
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as i32
    );
    assert_eq!(
        CUpointer_attribute::DEVICE_POINTER.0,
        P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER as i32
    );
    assert_eq!(
        CUpointer_attribute::HOST_POINTER.0,
        P::CU_POINTER_ATTRIBUTE_HOST_POINTER as i32
    );
    assert_eq!(
        CUpointer_attribute::IS_MANAGED.0,
        P::CU_POINTER_ATTRIBUTE_IS_MANAGED as i32
    );
    assert_eq!(
        CUpointer_attribute::DEVICE_ORDINAL.0,
        P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as i32
    );
    assert_eq!(
        CUpointer_attribute::RANGE_START_ADDR.0,
        P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as i32
    );
    assert_eq!(
        CUpointer_attribute::RANGE_SIZE.0,
        P::CU_POINTER_ATTRIBUTE_RANGE_SIZE as i32
    );
    assert_eq!(
        CUpointer_attribute::MAPPED.0,
        P::CU_POINTER_ATTRIBUTE_MAPPED as i32
    );
    assert_eq!(
        memory_type::DEVICE,
        c::CUmemorytype_enum::CU_MEMORYTYPE_DEVICE as u32
    );
    assert_eq!(
        memory_type::HOST,
        c::CUmemorytype_enum::CU_MEMORYTYPE_HOST as u32
    );

    assert_eq!(host_alloc::PORTABLE, c::CU_MEMHOSTALLOC_PORTABLE);
    assert_eq!(host_alloc::DEVICEMAP, c::CU_MEMHOSTALLOC_DEVICEMAP);
    assert_eq!(host_alloc::WRITECOMBINED, c::CU_MEMHOSTALLOC_WRITECOMBINED);
    assert_eq!(host_register::PORTABLE, c::CU_MEMHOSTREGISTER_PORTABLE);
    assert_eq!(host_register::DEVICEMAP, c::CU_MEMHOSTREGISTER_DEVICEMAP);
    assert_eq!(host_register::IOMEMORY, c::CU_MEMHOSTREGISTER_IOMEMORY);
    assert_eq!(
        stream_flags::NON_BLOCKING,
        c::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32
    );
    assert_eq!(
        event_flags::BLOCKING_SYNC,
        c::CUevent_flags_enum::CU_EVENT_BLOCKING_SYNC as u32
    );
    assert_eq!(
        event_flags::DISABLE_TIMING,
        c::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32
    );
    assert_eq!(
        event_flags::INTERPROCESS,
        c::CUevent_flags_enum::CU_EVENT_INTERPROCESS as u32
    );
    use c::CUmemAttach_flags_enum as M;
    assert_eq!(mem_attach::GLOBAL, M::CU_MEM_ATTACH_GLOBAL as u32);
    assert_eq!(mem_attach::HOST, M::CU_MEM_ATTACH_HOST as u32);
    assert_eq!(mem_attach::SINGLE, M::CU_MEM_ATTACH_SINGLE as u32);
    assert_eq!(
        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
        c::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32
    );
}

#[test]
fn struct_layouts_match() {
    assert_eq!(size_of::<CUipcMemHandle>(), size_of::<c::CUipcMemHandle>());
    assert_eq!(size_of::<CUuuid>(), size_of::<c::CUuuid>());
    assert_eq!(size_of::<CUdevice>(), size_of::<c::CUdevice>());
    assert_eq!(size_of::<CUdeviceptr>(), size_of::<c::CUdeviceptr>());
    assert_eq!(size_of::<CUresult>(), size_of::<c::CUresult>());
    assert_eq!(size_of::<CUstream>(), size_of::<c::CUstream>());
    assert_eq!(size_of::<CUcontext>(), size_of::<c::CUcontext>());
}

//! `#[repr(C)]` types, handle newtypes and constants of the CUDA driver API.
//!
//! Values are those of `cuda.h` (CUDA 12.x/13.x). Enumerations the driver may extend
//! are open newtypes: a value this crate does not name is still a valid value.

use core::ffi::{c_char, c_int, c_void};
use core::fmt;

/// A driver status code (`CUresult`).
///
/// Open: any `i32` is a valid value, so a code a newer driver returns is never
/// undefined behaviour; [`CUresult::name`] falls back to `None` for codes this crate
/// does not know.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a CUresult reports whether the driver call worked"]
pub struct CUresult(pub i32);

macro_rules! cu_results {
    ($( $(#[$m:meta])* $name:ident = $value:expr ),* $(,)?) => {
        impl CUresult {
            $( $(#[$m])* #[allow(missing_docs)] pub const $name: CUresult = CUresult($value); )*

            /// The `CUDA_ERROR_*` name of this code, or `None` for a code this crate
            /// does not know (the driver can still describe it, see
            /// `Driver::error_name`).
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some(concat!("CUDA_", stringify!($name))), )*
                    _ => None,
                }
            }
        }
    };
}

cu_results! {
    SUCCESS = 0,
    ERROR_INVALID_VALUE = 1,
    ERROR_OUT_OF_MEMORY = 2,
    ERROR_NOT_INITIALIZED = 3,
    ERROR_DEINITIALIZED = 4,
    ERROR_PROFILER_DISABLED = 5,
    ERROR_STUB_LIBRARY = 34,
    ERROR_DEVICE_UNAVAILABLE = 46,
    ERROR_NO_DEVICE = 100,
    ERROR_INVALID_DEVICE = 101,
    ERROR_DEVICE_NOT_LICENSED = 102,
    ERROR_INVALID_IMAGE = 200,
    ERROR_INVALID_CONTEXT = 201,
    ERROR_CONTEXT_ALREADY_CURRENT = 202,
    ERROR_MAP_FAILED = 205,
    ERROR_UNMAP_FAILED = 206,
    ERROR_ARRAY_IS_MAPPED = 207,
    ERROR_ALREADY_MAPPED = 208,
    ERROR_NO_BINARY_FOR_GPU = 209,
    ERROR_ALREADY_ACQUIRED = 210,
    ERROR_NOT_MAPPED = 211,
    ERROR_ECC_UNCORRECTABLE = 214,
    ERROR_UNSUPPORTED_LIMIT = 215,
    ERROR_CONTEXT_ALREADY_IN_USE = 216,
    ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    ERROR_INVALID_PTX = 218,
    ERROR_INVALID_GRAPHICS_CONTEXT = 219,
    ERROR_NVLINK_UNCORRECTABLE = 220,
    ERROR_JIT_COMPILER_NOT_FOUND = 221,
    ERROR_UNSUPPORTED_PTX_VERSION = 222,
    ERROR_INVALID_SOURCE = 300,
    ERROR_FILE_NOT_FOUND = 301,
    ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302,
    ERROR_SHARED_OBJECT_INIT_FAILED = 303,
    ERROR_OPERATING_SYSTEM = 304,
    ERROR_INVALID_HANDLE = 400,
    ERROR_ILLEGAL_STATE = 401,
    ERROR_NOT_FOUND = 500,
    ERROR_NOT_READY = 600,
    ERROR_ILLEGAL_ADDRESS = 700,
    ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    ERROR_LAUNCH_TIMEOUT = 702,
    ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    ERROR_CONTEXT_IS_DESTROYED = 709,
    ERROR_ASSERT = 710,
    ERROR_TOO_MANY_PEERS = 711,
    ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    ERROR_HARDWARE_STACK_ERROR = 714,
    ERROR_ILLEGAL_INSTRUCTION = 715,
    ERROR_MISALIGNED_ADDRESS = 716,
    ERROR_INVALID_ADDRESS_SPACE = 717,
    ERROR_INVALID_PC = 718,
    ERROR_LAUNCH_FAILED = 719,
    ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    ERROR_NOT_PERMITTED = 800,
    ERROR_NOT_SUPPORTED = 801,
    ERROR_SYSTEM_NOT_READY = 802,
    ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
    ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    ERROR_UNKNOWN = 999,
}

impl CUresult {
    /// `true` for `CUDA_SUCCESS`.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl fmt::Display for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown CUresult {}", self.0),
        }
    }
}

macro_rules! pointer_handle {
    ($( $(#[$m:meta])* $name:ident ),* $(,)?) => {$(
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        pub struct $name(pub *mut c_void);

        impl $name {
            /// The null handle.
            pub const NULL: $name = $name(core::ptr::null_mut());
            /// `true` for the null handle.
            pub fn is_null(self) -> bool {
                self.0.is_null()
            }
        }

        // SAFETY: driver handles are opaque identifiers; the driver API is thread-safe
        // and accepts a handle from any thread.
        unsafe impl Send for $name {}
        // SAFETY: as above; sharing the identifier shares no Rust-visible state.
        unsafe impl Sync for $name {}
    )*};
}

pointer_handle! {
    /// A context handle (`CUcontext`).
    CUcontext,
    /// A stream handle (`CUstream`). See [`CU_STREAM_LEGACY`] and [`CU_STREAM_PER_THREAD`].
    CUstream,
    /// An event handle (`CUevent`).
    CUevent,
    /// A module handle (`CUmodule`).
    CUmodule,
    /// A kernel handle (`CUfunction`).
    CUfunction,
    /// A memory pool handle (`CUmemoryPool`).
    CUmemoryPool,
}

/// The legacy default stream (`CU_STREAM_LEGACY`), which synchronizes with every
/// blocking stream of its context.
#[allow(clippy::manual_dangling_ptr)] // reason: 0x1 is the driver's sentinel value, not a dangling pointer
pub const CU_STREAM_LEGACY: CUstream = CUstream(0x1 as *mut c_void);
/// The per-thread default stream (`CU_STREAM_PER_THREAD`).
pub const CU_STREAM_PER_THREAD: CUstream = CUstream(0x2 as *mut c_void);

/// A device ordinal handle (`CUdevice`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CUdevice(pub c_int);

/// A device address (`CUdeviceptr`).
pub type CUdeviceptr = u64;

/// A handle to physical memory made by `cuMemCreate`.
pub type CUmemGenericAllocationHandle = u64;

/// A device attribute (`CUdevice_attribute`), open.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CUdevice_attribute(pub c_int);

#[allow(missing_docs)]
impl CUdevice_attribute {
    pub const MAX_THREADS_PER_BLOCK: Self = Self(1);
    pub const WARP_SIZE: Self = Self(10);
    pub const CLOCK_RATE: Self = Self(13);
    pub const MULTIPROCESSOR_COUNT: Self = Self(16);
    pub const INTEGRATED: Self = Self(18);
    pub const CAN_MAP_HOST_MEMORY: Self = Self(19);
    pub const PCI_BUS_ID: Self = Self(33);
    pub const PCI_DEVICE_ID: Self = Self(34);
    pub const UNIFIED_ADDRESSING: Self = Self(41);
    pub const COMPUTE_CAPABILITY_MAJOR: Self = Self(75);
    pub const COMPUTE_CAPABILITY_MINOR: Self = Self(76);
    /// 1 when the device can allocate managed memory (`cuMemAllocManaged`).
    pub const MANAGED_MEMORY: Self = Self(83);
    /// 1 when the host and the device may access managed memory at the same time
    /// (else the host must not touch it while a kernel runs).
    pub const CONCURRENT_MANAGED_ACCESS: Self = Self(89);
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: Self = Self(102);
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: Self = Self(103);
    pub const MEMORY_POOLS_SUPPORTED: Self = Self(115);
    pub const MEMPOOL_SUPPORTED_HANDLE_TYPES: Self = Self(119);
}

/// A memory-pool attribute (`CUmemPool_attribute`), open.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CUmemPool_attribute(pub c_int);

#[allow(missing_docs)]
impl CUmemPool_attribute {
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: Self = Self(1);
    pub const REUSE_ALLOW_OPPORTUNISTIC: Self = Self(2);
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: Self = Self(3);
    /// `u64`: bytes the pool keeps reserved at a synchronization point.
    pub const RELEASE_THRESHOLD: Self = Self(4);
    /// `u64`: bytes currently reserved from the device.
    pub const RESERVED_MEM_CURRENT: Self = Self(5);
    /// `u64`: high-water mark of reserved bytes.
    pub const RESERVED_MEM_HIGH: Self = Self(6);
    /// `u64`: bytes currently handed out to allocations.
    pub const USED_MEM_CURRENT: Self = Self(7);
    /// `u64`: high-water mark of used bytes.
    pub const USED_MEM_HIGH: Self = Self(8);
}

/// A pointer attribute (`CUpointer_attribute`), open.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CUpointer_attribute(pub c_int);

#[allow(missing_docs)]
impl CUpointer_attribute {
    pub const CONTEXT: Self = Self(1);
    pub const MEMORY_TYPE: Self = Self(2);
    pub const DEVICE_POINTER: Self = Self(3);
    pub const HOST_POINTER: Self = Self(4);
    pub const IS_MANAGED: Self = Self(8);
    pub const DEVICE_ORDINAL: Self = Self(9);
    pub const RANGE_START_ADDR: Self = Self(11);
    pub const RANGE_SIZE: Self = Self(12);
    pub const MAPPED: Self = Self(13);
    pub const MEMPOOL_HANDLE: Self = Self(17);
}

/// `CUmemorytype` values, as returned for [`CUpointer_attribute::MEMORY_TYPE`].
pub mod memory_type {
    /// Host memory.
    pub const HOST: u32 = 1;
    /// Device memory.
    pub const DEVICE: u32 = 2;
    /// A CUDA array.
    pub const ARRAY: u32 = 3;
    /// Unified (managed) memory.
    pub const UNIFIED: u32 = 4;
}

/// `CU_MEMHOSTALLOC_*` flags of `cuMemHostAlloc`.
pub mod host_alloc {
    /// Pinned for every context, not just the current one.
    pub const PORTABLE: u32 = 0x1;
    /// Mapped into the device's address space.
    pub const DEVICEMAP: u32 = 0x2;
    /// Write-combined: fast for the device to read, slow for the host to read.
    pub const WRITECOMBINED: u32 = 0x4;
}

/// `CU_MEMHOSTREGISTER_*` flags of `cuMemHostRegister`.
pub mod host_register {
    /// Pinned for every context.
    pub const PORTABLE: u32 = 0x1;
    /// Mapped into the device's address space.
    pub const DEVICEMAP: u32 = 0x2;
    /// The range is I/O memory.
    pub const IOMEMORY: u32 = 0x4;
    /// The device only reads the range.
    pub const READ_ONLY: u32 = 0x8;
}

/// `CU_MEM_ATTACH_*` flags of `cuMemAllocManaged` (`CUmemAttach_flags`): exactly
/// one of [`GLOBAL`](mem_attach::GLOBAL) and [`HOST`](mem_attach::HOST).
pub mod mem_attach {
    /// Accessible from any stream on any device.
    pub const GLOBAL: u32 = 0x1;
    /// Attached to the host: devices without concurrent managed access must not
    /// touch it until it is attached to a stream.
    pub const HOST: u32 = 0x2;
    /// Attached to one stream (only for `cuStreamAttachMemAsync`, not an
    /// allocation flag).
    pub const SINGLE: u32 = 0x4;
}

/// `CU_STREAM_*` flags of `cuStreamCreateWithPriority`.
pub mod stream_flags {
    /// Synchronizes with the legacy default stream.
    pub const DEFAULT: u32 = 0x0;
    /// Does not synchronize with the legacy default stream.
    pub const NON_BLOCKING: u32 = 0x1;
}

/// `CU_EVENT_*` flags of `cuEventCreate`.
pub mod event_flags {
    /// Default behaviour (spins in synchronize, records timing).
    pub const DEFAULT: u32 = 0x0;
    /// `cuEventSynchronize` blocks instead of spinning.
    pub const BLOCKING_SYNC: u32 = 0x1;
    /// No timing data: cheapest to record and query.
    pub const DISABLE_TIMING: u32 = 0x2;
    /// Usable across processes (requires `DISABLE_TIMING`).
    pub const INTERPROCESS: u32 = 0x4;
}

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the only flag of `cuIpcOpenMemHandle`.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;

/// `CUmemAllocationHandleType` values.
pub mod handle_type {
    /// No export.
    pub const NONE: i32 = 0;
    /// A POSIX file descriptor (`int`).
    pub const POSIX_FILE_DESCRIPTOR: i32 = 0x1;
    /// A Win32 NT handle.
    pub const WIN32: i32 = 0x2;
    /// A Win32 KMT handle.
    pub const WIN32_KMT: i32 = 0x4;
    /// A fabric handle.
    pub const FABRIC: i32 = 0x8;
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: i32 = 0x1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: i32 = 0x1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: i32 = 0x3;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: i32 = 0x0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: i32 = 0x1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    /// A `CU_MEM_LOCATION_TYPE_*` value.
    pub type_: i32,
    /// The device ordinal for a device location.
    pub id: c_int,
}

/// `CUmemPoolProps` (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    /// [`CU_MEM_ALLOCATION_TYPE_PINNED`].
    pub alloc_type: i32,
    /// A [`handle_type`] bit set the pool can be exported as.
    pub handle_types: i32,
    /// Where the pool's memory lives.
    pub location: CUmemLocation,
    /// Windows only; null elsewhere.
    pub win32_security_attributes: *mut c_void,
    /// Largest size the pool may reach (0: no limit; CUDA 12.2+, ignored before).
    pub max_size: usize,
    /// Usage hints (CUDA 12.x+; 0 before).
    pub usage: u16,
    /// Must be zero.
    pub reserved: [u8; 54],
}

impl Default for CUmemPoolProps {
    fn default() -> Self {
        CUmemPoolProps {
            alloc_type: 0,
            handle_types: 0,
            location: CUmemLocation::default(),
            win32_security_attributes: core::ptr::null_mut(),
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        }
    }
}

/// `CUmemAllocationProp` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// [`CU_MEM_ALLOCATION_TYPE_PINNED`].
    pub type_: i32,
    /// A [`handle_type`] bit set the allocation can be exported as.
    pub requested_handle_types: i32,
    /// Where the memory lives.
    pub location: CUmemLocation,
    /// Windows only; null elsewhere.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags.compressionType`.
    pub compression_type: u8,
    /// `allocFlags.gpuDirectRDMACapable`.
    pub gpu_direct_rdma_capable: u8,
    /// `allocFlags.usage`.
    pub usage: u16,
    /// Must be zero.
    pub reserved: [u8; 4],
}

impl Default for CUmemAllocationProp {
    fn default() -> Self {
        CUmemAllocationProp {
            type_: 0,
            requested_handle_types: 0,
            location: CUmemLocation::default(),
            win32_handle_meta_data: core::ptr::null_mut(),
            compression_type: 0,
            gpu_direct_rdma_capable: 0,
            usage: 0,
            reserved: [0; 4],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    /// Who gets access.
    pub location: CUmemLocation,
    /// A `CU_MEM_ACCESS_FLAGS_*` value.
    pub flags: i32,
}

/// `CUmemPoolPtrExportData`: opaque export data of one pointer of an exported pool.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemPoolPtrExportData {
    /// Opaque bytes.
    pub reserved: [u8; 64],
}

/// `CUipcMemHandle`: opaque legacy IPC handle of a device allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUipcMemHandle {
    /// Opaque bytes.
    pub reserved: [c_char; 64],
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CUuuid {
    /// The 16 bytes of the UUID.
    pub bytes: [c_char; 16],
}

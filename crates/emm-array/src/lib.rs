//! MemArray: the typed host/device array of `amso-memarray.md`, on emm.
//!
//! | item | what it is |
//! |---|---|
//! | [`MemArray<T, N>`] | typed array: host mirror and device copy, `move_to` on a stream, checked access, locks |
//! | [`Element`] | the numeric types DLPack describes; anything else fails to compile |
//! | [`Indexer`], [`KernelIndexer`] | shape, row-major strides, linear ↔ multi-index; passed to kernels by value |
//! | [`RawArray`] | the same with runtime type and rank, for the C ABI and Python |
//! | [`dlpack`] | the DLPack ABI and zero-copy export, versioned and legacy |
//!
//! Locking: every DLPack export takes a lock that its deleter releases; explicit
//! locks ([`MemArray::lock_id`]) work the same way. While any lock lives, a
//! mutation (`set`, `move_to`, writing the host mirror) is
//! [`ArrayError::Locked`], not corruption.
#![doc(test(attr(deny(warnings), allow(dead_code))))] // a doc example that warns fails its doc test (items it only shows may go unused)

mod array;
pub mod dlpack;
mod dtype;
mod indexer;

pub use array::{
    export_legacy, export_versioned, lock_array, MemArray, RawArray, Side, DLPACK_DELETERS_RUN,
    MAX_RANK,
};
pub use dtype::{code, supported_names, DataType, Element, SUPPORTED};
pub use indexer::{Indexer, KernelIndexer};

/// A failed array operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ArrayError {
    /// The element type is not one DLPack arrays of emm support.
    #[error("unsupported element type (DLPack code {code}, {bits} bits); supported: {supported}")]
    UnsupportedType {
        /// DLPack type code asked for.
        code: u8,
        /// Bits asked for.
        bits: u8,
        /// The supported types.
        supported: String,
    },
    /// The rank is 0 or above [`MAX_RANK`].
    #[error("unsupported rank {rank}: arrays have 1 to {max} dimensions")]
    UnsupportedRank {
        /// Rank asked for.
        rank: usize,
        /// Largest rank.
        max: usize,
    },
    /// The shape's element count, byte count or a stride overflows what one
    /// allocation (and DLPack's `int64_t`) can hold: `isize::MAX`.
    #[error("an array of shape {shape:?} and {element_bytes}-byte elements is too large: its element count, byte count or a stride passes isize::MAX ({})", isize::MAX)]
    TooLarge {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Bytes an element.
        element_bytes: usize,
    },
    /// A manager of one device with a context of another: the memory would come
    /// from one device and be copied and exported as the other's.
    #[error("the manager serves device {manager_device} but the context given is device {context_device}")]
    DeviceMismatch {
        /// The manager's device.
        manager_device: usize,
        /// The context's device.
        context_device: usize,
    },
    /// An index outside the shape.
    #[error("index {index:?} is out of bounds for shape {shape:?}")]
    OutOfBounds {
        /// Index asked for.
        index: Vec<usize>,
        /// The shape.
        shape: Vec<usize>,
    },
    /// A value of the wrong size for the element type.
    #[error("element type is {expected}, value has {found} bytes")]
    TypeMismatch {
        /// The element type.
        expected: &'static str,
        /// Bytes given.
        found: usize,
    },
    /// Host access while the device copy is current.
    #[error("cannot {op}: the data is on the {current:?} side; move it to the host first")]
    WrongSide {
        /// The operation.
        op: &'static str,
        /// The current side.
        current: Side,
    },
    /// Host access before an asynchronous copy finished.
    #[error("cannot {op}: an asynchronous copy is still running; synchronize first")]
    CopyPending {
        /// The operation.
        op: &'static str,
    },
    /// A mutation while locked.
    #[error("cannot {op}: the array is locked by {locks:?} (DLPack exports or explicit locks)")]
    Locked {
        /// The operation.
        op: &'static str,
        /// Live lock ids.
        locks: Vec<u64>,
    },
    /// Unlock of an id that is not locked.
    #[error("lock {id} is not held (live locks: {live:?})")]
    UnknownLock {
        /// The id given.
        id: u64,
        /// Live lock ids.
        live: Vec<u64>,
    },
    /// Unlock of a DLPack export's lock: its deleter releases it, once the
    /// consumer is done with the tensor.
    #[error("lock {id} is a DLPack export's: its deleter releases it when the consumer is done with the tensor")]
    ExportLock {
        /// The id given.
        id: u64,
    },
    /// A device operation on an array without a manager.
    #[error(
        "{operation} needs a device, and the array has none: it was made without a memory manager"
    )]
    NoDevice {
        /// The operation asked for.
        operation: &'static str,
    },
    /// A copy asked on a stream of another device than the array's.
    #[error(
        "the stream given is device {stream_device}'s but the array is device {array_device}'s"
    )]
    ForeignStream {
        /// The array's device.
        array_device: usize,
        /// The stream's device.
        stream_device: usize,
    },
    /// The manager or driver failed.
    #[error(transparent)]
    Memory(#[from] emm_core::EmmError),
}

// The README's examples are compiled and run as doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! The crate's one error type, [`Error`], and its [`Result`] alias.
//!
//! Every fallible operation in `c10-core` returns [`Result`]. Variants are structured (they carry
//! the offending values) so callers can match on them and tests can assert on them; the `Display`
//! text follows the wording of the matching c10 `TORCH_CHECK` message where one exists.

use crate::device::{Device, DeviceType};

/// Errors raised by `c10-core`, as c10 raises `c10::Error` from `TORCH_CHECK`.
///
/// The enum is `#[non_exhaustive]`: new variants may be added without a breaking change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device string (`"cuda:0"`) could not be parsed, as c10's `Device(const std::string&)`.
    #[error("invalid device string {input:?}: {reason}")]
    InvalidDevice {
        /// The string that was given.
        input: String,
        /// What was expected instead.
        reason: &'static str,
    },

    /// The allocator could not obtain `requested` bytes, as c10's `alloc_cpu` "not enough memory".
    #[error("{device}: not enough memory: you tried to allocate {requested} bytes")]
    OutOfMemory {
        /// The number of bytes asked for.
        requested: usize,
        /// The device whose memory ran out.
        device: Device,
    },

    /// A byte count is too large to describe as an allocation (it overflows `usize` or `isize`
    /// once alignment and bookkeeping are added).
    #[error("allocation of {nbytes} bytes overflows the largest size an allocation can describe")]
    SizeOverflow {
        /// The number of bytes asked for.
        nbytes: usize,
    },

    /// A storage that is not resizable was asked to change size, as c10's
    /// "Trying to resize storage that is not resizable".
    #[error("trying to resize storage that is not resizable (from {nbytes} to {requested} bytes)")]
    NotResizable {
        /// The storage's current size in bytes.
        nbytes: usize,
        /// The size in bytes that was asked for.
        requested: usize,
    },

    /// `set_nbytes` asked for more bytes than the storage's allocation holds.
    #[error(
        "cannot set storage size to {requested} bytes: its allocation holds only {capacity} bytes"
    )]
    ExceedsCapacity {
        /// The size in bytes that was asked for.
        requested: usize,
        /// The size in bytes of the current allocation.
        capacity: usize,
    },

    /// A resizable storage was built, or a storage was resized, without an allocator, as c10's
    /// "For resizable storage, allocator must be provided".
    #[error("a resizable storage needs an allocator, but none was provided")]
    MissingAllocator,

    /// No allocator is registered for a device type, as c10's `GetAllocator`
    /// "Allocator for {type} is not set."
    #[error("allocator for {device_type} is not set")]
    NoAllocator {
        /// The device type that was looked up.
        device_type: DeviceType,
    },

    /// An allocator and a data pointer disagree on the device type.
    #[error("device type mismatch: expected {expected}, got {actual}")]
    DeviceMismatch {
        /// The device type that was required.
        expected: DeviceType,
        /// The device type that was found.
        actual: DeviceType,
    },

    /// `raw_allocate` is not possible for this allocator: it has no `raw_deleter`, or its data
    /// pointers are not "simple" (context equal to data), as c10's `Allocator::raw_allocate`.
    #[error("raw allocation is not supported by the {device_type} allocator: {reason}")]
    RawAllocationUnsupported {
        /// The allocator's device type.
        device_type: DeviceType,
        /// Why the raw allocation was refused.
        reason: &'static str,
    },

    /// A device allocator ran out of memory and explained why: the message carries its
    /// figures (e.g. the CUDA caching allocator's `CUDA out of memory. Tried to allocate ...`).
    #[error("{message}")]
    DeviceOutOfMemory {
        /// The number of bytes asked for.
        requested: usize,
        /// The device whose memory ran out.
        device: Device,
        /// The allocator's full message.
        message: String,
    },

    /// A device allocator failed for a reason other than memory (a driver error, a bad pointer).
    #[error("allocator for {device} failed: {message}")]
    AllocatorFailure {
        /// The device whose allocator failed.
        device: Device,
        /// What went wrong.
        message: String,
    },

    /// A scalar type name (`"float32"`) could not be parsed.
    #[error(
        "invalid scalar type {input:?}: expected a torch dtype name such as float32, int64, bool"
    )]
    InvalidScalarType {
        /// The string that was given.
        input: String,
    },
}

/// `std::result::Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

//! The crate's error type: out of memory, bad pointers, bad settings, device failures.

use thiserror::Error;

use crate::config::ConfigError;
use crate::device::{DeviceError, DevicePtr};
use crate::oom::OutOfMemoryError;

/// Everything the caching allocator can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// No memory for a request even after releasing the cache (PyTorch's `OutOfMemoryError`);
    /// holds every figure. The allocator stays usable.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemoryError>),
    /// A pointer that is not a live allocation of this allocator (freed twice, or foreign).
    #[error(
        "pointer {ptr:#x} is not an allocated block of the caching allocator of device {device}"
    )]
    InvalidPointer {
        /// The address given.
        ptr: DevicePtr,
        /// The device whose allocator was asked.
        device: u8,
    },
    /// A pointer that no device of the multi-device front has handed out (freed twice, or
    /// foreign).
    #[error("pointer {ptr:#x} is not an allocated block of any device's caching allocator")]
    UnknownPointer {
        /// The address given.
        ptr: DevicePtr,
    },
    /// A device index with no allocator behind it.
    #[error("no caching allocator for device {device}: {count} device(s) configured")]
    InvalidDevice {
        /// The index asked for.
        device: u8,
        /// How many devices the allocator manages.
        count: usize,
    },
    /// A per-process memory fraction outside `(0, 1]`.
    #[error("invalid memory fraction {fraction}: expected a value in (0, 1]")]
    InvalidFraction {
        /// The fraction given.
        fraction: f64,
    },
    /// A device call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A configuration that does not validate.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A private-pool call was refused (PyTorch's checks on `MempoolId_t`s).
    #[error(transparent)]
    Pool(#[from] crate::pool_types::PoolError),
    /// The configuration cannot change while the device's allocator holds memory
    /// ([`crate::DeviceCachingAllocator::set_config`]).
    #[error(
        "cannot change the allocator configuration of device {device} while it holds \
         {reserved} reserved bytes in {blocks} blocks: free every allocation and empty the cache \
         first"
    )]
    ConfigInUse {
        /// The device.
        device: u8,
        /// Its reserved bytes.
        reserved: usize,
        /// Its blocks (allocated, cached, or unmapped parts of expandable segments).
        blocks: usize,
    },
}

impl From<OutOfMemoryError> for Error {
    fn from(e: OutOfMemoryError) -> Self {
        Error::OutOfMemory(Box::new(e))
    }
}

/// `Result` with this crate's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

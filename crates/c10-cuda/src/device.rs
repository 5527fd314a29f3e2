//! The device-memory trait the caching allocator runs over (segments, events, virtual memory).
//!
//! The allocator never touches a device itself: everything it needs from CUDA goes through
//! [`DeviceMemory`]. Two implementations exist: [`crate::sim::SimDevice`] (a simulated device for
//! tests and trace replay) and `c10_cuda_driver::CudaDevice` (cudarc's driver API on a real GPU).
//! This is the shape cubecl uses for its pools (a storage trait tested on the host).
//!
//! The trait is object safe (every method takes `&self`, none is generic or returns `Self`),
//! and `Box<D>` and `Arc<D>` are devices when `D` is, `D = dyn DeviceMemory` included: a
//! `CachingAllocator<Box<dyn DeviceMemory>>` runs over devices picked at run time.

use std::sync::Arc;

use thiserror::Error;

/// A device virtual address, in bytes (CUDA's `CUdeviceptr`).
pub type DevicePtr = u64;

/// A stream handle as the allocator sees it (PyTorch's `cudaStream_t` inside `Block::stream`).
///
/// The value is opaque to the allocator: it only compares streams for equality and ordering
/// (the best-fit key is `(stream, size, address)`). [`StreamId::DEFAULT`] (0) is CUDA's legacy
/// default stream. On `c10_cuda_driver::CudaDevice` the value is the raw `CUstream` pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId(pub u64);

impl StreamId {
    /// CUDA's legacy default stream (`cudaStreamLegacy` / stream 0).
    pub const DEFAULT: StreamId = StreamId(0);
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An event handle created by [`DeviceMemory::create_event`] (CUDA's `cudaEvent_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// Free and total bytes of a device, as `cudaMemGetInfo` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes the device could still hand out (to anyone, not only this allocator).
    pub free: usize,
    /// Total bytes of device memory (`cudaDeviceProp::totalGlobalMem`).
    pub total: usize,
}

/// What a device call can fail with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device has no memory left for this request (`cudaErrorMemoryAllocation` /
    /// `CUDA_ERROR_OUT_OF_MEMORY`). The caching allocator reacts by releasing cache and retrying.
    #[error("device out of memory while allocating {size} bytes")]
    OutOfMemory {
        /// The size that was refused, in bytes.
        size: usize,
    },
    /// The backend cannot do this at all (e.g. virtual memory management on a device without it).
    #[error("not supported by this device backend: {what}")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
    },
    /// An address or handle that the device does not know (a bug in the caller).
    #[error("invalid {what}: {value:#x}")]
    Invalid {
        /// Which kind of handle ("address", "event", "stream").
        what: &'static str,
        /// The offending value.
        value: u64,
    },
    /// Any other driver failure, with the driver call and its message.
    #[error("CUDA driver call {call} failed: {message}")]
    Driver {
        /// The driver entry point, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The driver's error text.
        message: String,
    },
}

/// A device's memory, streams, events and virtual memory, as the caching allocator needs them.
///
/// Every method maps to one CUDA runtime/driver call (named in its docs). Methods take `&self`:
/// implementations are handles with interior mutability so that tests (and the host) can keep a
/// clone to drive event completion while the allocator owns another.
pub trait DeviceMemory: Send + Sync {
    /// The device index (`cudaGetDevice`), as in `cuda:N`.
    fn index(&self) -> u8;

    /// The c10 device type of this memory: [`c10_core::DeviceType::Cuda`] for a real GPU (the
    /// default), [`c10_core::DeviceType::Sim`] for the simulated device.
    fn device_type(&self) -> c10_core::DeviceType {
        c10_core::DeviceType::Cuda
    }

    /// Free and total bytes (`cudaMemGetInfo`).
    ///
    /// # Errors
    /// A driver failure.
    fn mem_get_info(&self) -> Result<MemInfo, DeviceError>;

    /// Allocates one segment of exactly `size` bytes (`cudaMalloc`); the address is at least
    /// 512-byte aligned.
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] when the device cannot satisfy it (the allocator then frees
    /// cache and retries); other variants for driver failures.
    fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError>;

    /// Frees a segment returned by [`DeviceMemory::malloc`] with the same `size` (`cudaFree`).
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for an address that is not a live segment.
    fn free(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError>;

    /// Creates an event (`cudaEventCreateWithFlags(cudaEventDisableTiming)`).
    ///
    /// # Errors
    /// A driver failure.
    fn create_event(&self) -> Result<EventId, DeviceError>;

    /// Records `event` on `stream` (`cudaEventRecord`): it completes when the work queued on
    /// `stream` so far completes.
    ///
    /// # Errors
    /// An unknown event or stream.
    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError>;

    /// Whether `event` has completed (`cudaEventQuery`: `cudaSuccess` -> true,
    /// `cudaErrorNotReady` -> false).
    ///
    /// # Errors
    /// An unknown event or a driver failure.
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError>;

    /// Blocks until `event` has completed (`cudaEventSynchronize`).
    ///
    /// # Errors
    /// An unknown event or a driver failure.
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError>;

    /// Destroys an event (`cudaEventDestroy`). Unknown events are ignored.
    fn destroy_event(&self, event: EventId);

    /// Whether virtual memory management (and so expandable segments) is available
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
    fn supports_virtual_memory(&self) -> bool;

    /// Reserves `size` bytes of virtual address space, mapping nothing (`cuMemAddressReserve`).
    /// `size` is a multiple of the page size the caller uses (2 MiB or 20 MiB).
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] without virtual memory; a driver failure.
    fn reserve_address_range(&self, size: usize) -> Result<DevicePtr, DeviceError>;

    /// Releases a range from [`DeviceMemory::reserve_address_range`] (`cuMemAddressFree`). Every
    /// page in it must be unmapped first.
    ///
    /// # Errors
    /// An unknown range or pages still mapped.
    fn release_address_range(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError>;

    /// Backs `[ptr, ptr + size)` inside a reserved range with physical memory
    /// (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`). Counts against device memory.
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] when no physical memory is left.
    fn map(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError>;

    /// Unmaps and releases the physical memory of `[ptr, ptr + size)` (`cuMemUnmap` +
    /// `cuMemRelease`), exactly a range earlier passed to [`DeviceMemory::map`].
    ///
    /// # Errors
    /// A range that is not mapped.
    fn unmap(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError>;

    /// Waits for the work queued on `stream` so far (`cudaStreamSynchronize`): what PyTorch's
    /// expandable segments do before they unmap pages of a segment, on the segment's stream
    /// (`ExpandableSegment::unmapHandles`). Events recorded on `stream` before it are complete
    /// afterwards, also those of blocks the unmapping has nothing to do with. The allocator
    /// calls it once per unmapped range, before the [`DeviceMemory::unmap`] calls.
    ///
    /// The default does nothing: for a backend whose [`DeviceMemory::unmap`] waits by itself
    /// (ours synchronizes the context) or a simulation whose events complete at once.
    ///
    /// # Errors
    /// A driver failure.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let _ = stream;
        Ok(())
    }
}

/// Forwards every [`DeviceMemory`] method of a smart pointer to its target, provided methods
/// included (so a boxed [`crate::SimDevice`] still reports [`c10_core::DeviceType::Sim`]).
macro_rules! forward_device_memory {
    ($($pointer:ident),+) => {$(
        #[doc = concat!(
            "Forwards to the pointed-to device, so that a `", stringify!($pointer),
            "<dyn DeviceMemory>` (a device chosen at run time) runs the caching allocator like ",
            "the device itself."
        )]
        impl<D: DeviceMemory + ?Sized> DeviceMemory for $pointer<D> {
            fn index(&self) -> u8 {
                (**self).index()
            }

            fn device_type(&self) -> c10_core::DeviceType {
                (**self).device_type()
            }

            fn mem_get_info(&self) -> Result<MemInfo, DeviceError> {
                (**self).mem_get_info()
            }

            fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError> {
                (**self).malloc(size)
            }

            fn free(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
                (**self).free(ptr, size)
            }

            fn create_event(&self) -> Result<EventId, DeviceError> {
                (**self).create_event()
            }

            fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
                (**self).record_event(event, stream)
            }

            fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
                (**self).query_event(event)
            }

            fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
                (**self).synchronize_event(event)
            }

            fn destroy_event(&self, event: EventId) {
                (**self).destroy_event(event);
            }

            fn supports_virtual_memory(&self) -> bool {
                (**self).supports_virtual_memory()
            }

            fn reserve_address_range(&self, size: usize) -> Result<DevicePtr, DeviceError> {
                (**self).reserve_address_range(size)
            }

            fn release_address_range(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
                (**self).release_address_range(ptr, size)
            }

            fn map(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
                (**self).map(ptr, size)
            }

            fn unmap(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
                (**self).unmap(ptr, size)
            }

            fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
                (**self).synchronize_stream(stream)
            }
        }
    )+};
}

forward_device_memory!(Box, Arc);

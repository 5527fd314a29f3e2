//! [`DeviceBuffer`]: an owned block of the caching allocator that returns itself on drop (the
//! RAII form of PyTorch's `raw_alloc_with_stream` / `raw_delete` pair).
//!
//! A framework that keeps device memory in its own types wants a handle, not an address to free
//! by hand. A `DeviceBuffer` holds the front ([`CachingAllocator`]) it came from, the block's
//! address, the requested size, the device and the stream it was allocated for; dropping it
//! calls [`CachingAllocator::raw_delete`], so a block can neither leak nor be freed twice.
//! Uses on other streams are recorded with [`DeviceBuffer::record_stream`] (PyTorch's
//! `Tensor.record_stream`): the block then goes back to the cache only after the work queued on
//! those streams at free time has finished.
//!
//! This file is backend-independent (the tests use [`crate::SimDevice`]); on a real GPU
//! `c10-cuda-driver` adds borrowed views that cudarc's kernel launches and copies accept.

use std::fmt;
use std::sync::Arc;

use crate::device::{DeviceMemory, DevicePtr, StreamId};
use crate::error::Result;
use crate::front::CachingAllocator;

/// An owned block of a [`CachingAllocator`]: `size` bytes at [`DeviceBuffer::ptr`] on one
/// device, allocated for one stream, returned to the allocator when dropped.
///
/// Zero bytes give an empty buffer at the null address (as PyTorch's allocator returns
/// `nullptr` for 0 bytes); it owns nothing.
pub struct DeviceBuffer<D: DeviceMemory> {
    front: Arc<CachingAllocator<D>>,
    ptr: DevicePtr,
    size: usize,
    device: u8,
    stream: StreamId,
}

impl<D: DeviceMemory> DeviceBuffer<D> {
    /// Allocates `size` bytes on `device` for use on `stream` (PyTorch's
    /// `raw_alloc_with_stream`): the block is reused by later requests on `stream` as soon as
    /// this buffer drops, with no synchronization, exactly as PyTorch reuses a tensor's block.
    ///
    /// # Errors
    /// As [`CachingAllocator::raw_alloc_with_stream`]: [`crate::Error::OutOfMemory`] (the
    /// allocator stays usable), [`crate::Error::InvalidDevice`], [`crate::Error::Device`].
    #[track_caller]
    pub fn new(
        front: &Arc<CachingAllocator<D>>,
        device: u8,
        size: usize,
        stream: StreamId,
    ) -> Result<Self> {
        let ptr = front.raw_alloc_with_stream(device, size, stream)?;
        Ok(DeviceBuffer {
            front: Arc::clone(front),
            ptr,
            size,
            device,
            stream,
        })
    }

    /// Takes ownership of a block from [`CachingAllocator::raw_alloc_with_stream`] (or
    /// [`DeviceBuffer::into_raw`]).
    ///
    /// # Safety
    /// `ptr` must be a live block of `front`, of at least `size` bytes, on `device`, allocated
    /// for `stream`, that nothing else frees: the buffer frees it on drop, and a second owner
    /// would free it again after it may have been handed to someone else.
    pub unsafe fn from_raw(
        front: &Arc<CachingAllocator<D>>,
        ptr: DevicePtr,
        size: usize,
        device: u8,
        stream: StreamId,
    ) -> Self {
        DeviceBuffer {
            front: Arc::clone(front),
            ptr,
            size,
            device,
            stream,
        }
    }

    /// Gives up ownership without freeing: returns the address, which the caller now frees with
    /// [`CachingAllocator::raw_delete`] (or hands back to [`DeviceBuffer::from_raw`]).
    pub fn into_raw(mut self) -> DevicePtr {
        // The drop that follows frees the null address, which the front ignores.
        std::mem::replace(&mut self.ptr, 0)
    }

    /// The block's device address (0 for an empty buffer).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The requested size in bytes (the block itself may be larger: PyTorch's `round_size`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the buffer holds zero bytes (and no block).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The device index (as in `cuda:N`).
    pub fn device(&self) -> u8 {
        self.device
    }

    /// The stream the block was allocated for (its "allocation stream" in PyTorch's terms).
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The front the block belongs to.
    pub fn front(&self) -> &Arc<CachingAllocator<D>> {
        &self.front
    }

    /// Marks the block as used on `stream` (PyTorch's `recordStream`): when the buffer drops,
    /// the block is cached again only once the work queued on `stream` by then has completed
    /// (an event per recorded stream, polled by later allocations). Recording the allocation
    /// stream itself changes nothing. A no-op for an empty buffer.
    ///
    /// # Errors
    /// As [`CachingAllocator::record_stream`]; never for a live buffer of a healthy front.
    pub fn record_stream(&self, stream: StreamId) -> Result<()> {
        if self.ptr == 0 {
            return Ok(());
        }
        self.front.record_stream(self.ptr, stream)
    }
}

impl<D: DeviceMemory> Drop for DeviceBuffer<D> {
    #[track_caller]
    fn drop(&mut self) {
        // The block is live and owned by this buffer: the free cannot fail. A drop cannot
        // report an error anyway; the front refuses a foreign pointer without touching state.
        let _ = self.front.raw_delete(self.ptr);
    }
}

impl<D: DeviceMemory> fmt::Debug for DeviceBuffer<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.device)
            .field("stream", &self.stream)
            .finish()
    }
}

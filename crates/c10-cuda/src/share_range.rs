//! What an IPC handle of a block must make reachable ([`ShareRange`]) and the allocator's one
//! call for it ([`DeviceCachingAllocator::ipc_share_range`], the first half of PyTorch's
//! `shareIpcHandle`). The rest of IPC (handles, opening, keep-alive, the backends' export) is
//! the `c10-cuda-ipc` crate's.

use crate::allocator::DeviceCachingAllocator;
use crate::device::{DeviceMemory, DevicePtr};
use crate::error::Error;

/// The device memory an IPC handle must make reachable: a whole segment, or the pages of an
/// expandable segment that cover a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareRange {
    /// A regular segment (`cudaMalloc`).
    Segment {
        /// The segment base (PyTorch's `getBaseAllocation`).
        base: DevicePtr,
        /// Bytes of the segment.
        size: usize,
    },
    /// Pages of an expandable segment.
    Expandable {
        /// Start of the segment's reserved range.
        reservation: DevicePtr,
        /// Bytes of the reserved range.
        reservation_size: usize,
        /// Bytes per page.
        page_size: usize,
        /// The first page covering the block.
        begin: DevicePtr,
        /// Bytes of the pages covering the block.
        len: usize,
    },
}

impl ShareRange {
    /// Where the mapped memory starts in the producer.
    pub fn start(&self) -> DevicePtr {
        match *self {
            ShareRange::Segment { base, .. } => base,
            ShareRange::Expandable { begin, .. } => begin,
        }
    }
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// The memory an IPC handle of the allocated block at `ptr` must make reachable, and the
    /// block's offset and size in it (the first half of PyTorch's `shareIpcHandle`).
    ///
    /// # Errors
    /// [`Error::InvalidPointer`] when `ptr` is not an allocated block of this allocator.
    pub fn ipc_share_range(&self, ptr: DevicePtr) -> crate::Result<(ShareRange, u64, u64)> {
        let Some(id) = self.blocks.allocated.get(ptr) else {
            return Err(Error::InvalidPointer {
                ptr,
                device: self.device.index(),
            });
        };
        let block = self.blocks.get(id);
        let (bptr, bsize) = (block.ptr, block.size);
        if let Some(segment) = block
            .expandable
            .and_then(|i| self.blocks.segments.get(i as usize))
            .and_then(Option::as_ref)
        {
            let page = segment.page as u64;
            let first = (bptr - segment.base) / page;
            let last = (bptr - segment.base + bsize as u64).div_ceil(page);
            let begin = segment.base + first * page;
            let range = ShareRange::Expandable {
                reservation: segment.base,
                reservation_size: segment.size(),
                page_size: segment.page,
                begin,
                len: ((last - first) * page) as usize,
            };
            return Ok((range, bptr - begin, bsize as u64));
        }
        let (base, size) = self.get_base_allocation(ptr)?;
        Ok((
            ShareRange::Segment { base, size },
            bptr - base,
            bsize as u64,
        ))
    }
}

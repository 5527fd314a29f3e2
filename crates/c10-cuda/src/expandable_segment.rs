//! One expandable segment's page table (PyTorch's `ExpandableSegment`): a reserved virtual
//! range and which of its pages are mapped to physical memory.

use crate::device::{DeviceError, DeviceMemory, DevicePtr, StreamId};
use crate::error::Result;

/// One expandable segment's page table (PyTorch's `ExpandableSegment`).
#[derive(Clone, Debug)]
pub(crate) struct ExpandableSegment {
    /// Start of the reserved virtual range.
    pub(crate) base: DevicePtr,
    /// Page size in bytes (2 MiB small pool, 20 MiB large pool).
    pub(crate) page: usize,
    /// Which pages are backed by physical memory.
    pub(crate) mapped: Vec<bool>,
}

impl ExpandableSegment {
    /// Bytes of reserved address space.
    pub(crate) fn size(&self) -> usize {
        self.mapped.len() * self.page
    }

    /// Maps the pages covering `[ptr, ptr + size)` (`ptr` page aligned, pages unmapped).
    /// Returns the mapped range, or size 0 when the device is out of memory (pages mapped by
    /// this call are unmapped again).
    pub(crate) fn map<D: DeviceMemory>(
        &mut self,
        device: &D,
        ptr: DevicePtr,
        size: usize,
    ) -> Result<(DevicePtr, usize)> {
        let begin = ((ptr - self.base) as usize) / self.page;
        let end = ((ptr - self.base) as usize + size).div_ceil(self.page);
        for i in begin..end {
            debug_assert!(!self.mapped[i], "page mapped twice");
            match device.map(self.page_ptr(i), self.page) {
                Ok(()) => self.mapped[i] = true,
                Err(DeviceError::OutOfMemory { .. }) => {
                    for j in (begin..i).rev() {
                        device.unmap(self.page_ptr(j), self.page)?;
                        self.mapped[j] = false;
                    }
                    return Ok((self.page_ptr(begin), 0));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok((self.page_ptr(begin), (end - begin) * self.page))
    }

    /// Unmaps the pages wholly inside `[ptr, ptr + size)`, after waiting for `stream` (the
    /// segment's, as PyTorch's `ExpandableSegment::unmapHandles` does); returns the unmapped
    /// range (size 0 when no whole page lies inside).
    pub(crate) fn unmap<D: DeviceMemory>(
        &mut self,
        device: &D,
        ptr: DevicePtr,
        size: usize,
        stream: StreamId,
    ) -> Result<(DevicePtr, usize)> {
        let off = (ptr - self.base) as usize;
        let begin = off.div_ceil(self.page);
        let end = (off + size) / self.page;
        if begin >= end {
            return Ok((ptr, 0));
        }
        device.synchronize_stream(stream)?;
        for i in begin..end {
            debug_assert!(self.mapped[i], "unmapping an unmapped page");
            device.unmap(self.page_ptr(i), self.page)?;
            self.mapped[i] = false;
        }
        Ok((self.page_ptr(begin), (end - begin) * self.page))
    }

    fn page_ptr(&self, i: usize) -> DevicePtr {
        self.base + (i * self.page) as u64
    }
}

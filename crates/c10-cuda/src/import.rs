//! Importing segments that existed before a replay began (rebuilding a recorded start state).

use crate::accounting::DeviceCall;
use crate::allocator::DeviceCachingAllocator;
use crate::block::{Block, BlockId};
use crate::device::{DeviceMemory, DevicePtr, StreamId};
use crate::error::Result;
use crate::pool_table::DEFAULT_SLOT;
use crate::stats::increase;

/// One block of a segment to import, in address order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportBlock {
    /// Bytes of the block (a multiple of 512).
    pub size: usize,
    /// Bytes requested by its allocation (for allocated blocks).
    pub requested: usize,
    /// Whether the block is allocated (live) or free (cached).
    pub allocated: bool,
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Creates a segment made of `blocks` (in address order) as if it had been allocated and
    /// split earlier: one device malloc of the blocks' total size, allocated blocks live (free
    /// them with [`Self::free`] at their addresses), free blocks cached in their pool (adjacent
    /// free blocks are merged, as the allocator would have). Stats count it all. Used by trace
    /// replay to rebuild a snapshot's start state; `small` picks the pool.
    ///
    /// Returns the segment's base address; block `i` starts at base + the sizes before it.
    ///
    /// # Errors
    /// [`crate::Error::Device`] when the device refuses the segment (out of memory included).
    pub fn import_segment(
        &mut self,
        stream: StreamId,
        small: bool,
        blocks: &[ImportBlock],
    ) -> Result<DevicePtr> {
        let total: usize = blocks.iter().map(|b| b.size).sum();
        let base = self.device.malloc(total)?;
        self.account(DeviceCall::Malloc, DEFAULT_SLOT, small, base, total, stream)?;
        let max_split = self.config.max_split_size_or_max();

        let rank = self.take_registration();
        // Merge runs of free blocks first.
        let mut merged: Vec<ImportBlock> = Vec::with_capacity(blocks.len());
        for b in blocks {
            match merged.last_mut() {
                Some(last) if !last.allocated && !b.allocated => last.size += b.size,
                _ => merged.push(*b),
            }
        }
        let split = merged.len() > 1;
        let mut ptr = base;
        let mut prev: Option<BlockId> = None;
        let mut free_ids = Vec::new();
        for b in &merged {
            let mut block = match prev {
                // The blocks after the first are pieces of its segment.
                Some(p) => self.blocks.get(p).piece(ptr, b.size),
                None => {
                    let mut first = Block::new(ptr, b.size, stream, small);
                    first.rank = rank;
                    first
                }
            };
            block.allocated = b.allocated;
            block.requested_size = b.requested;
            let id = self.blocks.splice(block, prev, None);
            if b.allocated {
                self.blocks.allocated.insert(ptr, id);
                let stats = self.accounting.kept_mut();
                increase(&mut stats.allocation, small, 1);
                increase(&mut stats.allocated_bytes, small, b.size as u64);
                increase(&mut stats.requested_bytes, small, b.requested as u64);
                if b.size >= max_split {
                    self.accounting.kept_mut().oversize_allocations.increase(1);
                }
            } else {
                free_ids.push(id);
                if split {
                    increase(&mut self.accounting.kept_mut().inactive_split, small, 1);
                    increase(
                        &mut self.accounting.kept_mut().inactive_split_bytes,
                        small,
                        b.size as u64,
                    );
                }
            }
            ptr += b.size as u64;
            prev = Some(id);
        }
        for id in free_ids {
            let pool = self.pools.block_pool_mut(DEFAULT_SLOT, small);
            pool.insert_into_blocks(id, self.blocks.get_mut(id));
        }
        Ok(base)
    }
}

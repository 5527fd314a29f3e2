//! Allocation hints: which end of a split free block an allocation takes.
//!
//! PyTorch always hands out the low addresses of a split block and keeps the remainder above
//! it ([`Placement::Low`], the default, what [`DeviceCachingAllocator::malloc`] does). With
//! [`Placement::High`] the allocation takes the high addresses and the remainder stays below.
//! A caller that sends one class of data low and another high keeps the classes apart inside
//! segments: Coop (Zhang et al., NeurIPS 2023) places cheap-to-recompute tensors from one end
//! of memory and expensive ones from the other, so that evicting a contiguous run of cheap
//! tensors frees one large block. The choice of block (best fit) is the same for both.

use crate::allocator::{DeviceCachingAllocator, Params};
use crate::block::BlockId;
use crate::device::DeviceMemory;
use crate::sizes::should_split;
use crate::stats::increase;

/// Which end of a split free block an allocation takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// The low addresses, remainder above: PyTorch's only behaviour.
    #[default]
    Low,
    /// The high addresses, remainder below.
    High,
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Splits the found (out of pool) block `found` so that its top `p.size` bytes form a block
    /// of their own, and returns that block; the remainder below keeps `found`'s id and goes
    /// back to the pool. Returns `found` unchanged when the rules do not split it. The stats
    /// end up as [`Self::alloc_found_block`] on the returned block leaves them after a low
    /// split.
    pub(crate) fn split_high(&mut self, p: &Params, found: BlockId) -> BlockId {
        let (size, ptr, already_split, expandable, next) = {
            let b = self.blocks.get(found);
            (b.size, b.ptr, b.is_split(), b.expandable.is_some(), b.next)
        };
        if p.no_split || !should_split(size, p.size, p.small, &self.config) {
            return found;
        }
        // The high part is a piece of the block's segment, linked after it.
        let high = self
            .blocks
            .get(found)
            .piece(ptr + (size - p.size) as u64, p.size);
        let hid = self.blocks.splice(high, Some(found), next);
        let pool = self.pools.block_pool_mut(p.pool, p.small);
        let low = self.blocks.get_mut(found);
        low.size = size - p.size;
        pool.insert_into_blocks(found, low);
        if !expandable {
            // Both parts count as inactive split blocks until the high one is handed out
            // (alloc_found_block then removes it, as for any already-split block).
            if already_split {
                increase(&mut self.accounting.kept_mut().inactive_split, p.small, 1);
            } else {
                increase(&mut self.accounting.kept_mut().inactive_split, p.small, 2);
                increase(
                    &mut self.accounting.kept_mut().inactive_split_bytes,
                    p.small,
                    size as u64,
                );
            }
        }
        hid
    }
}

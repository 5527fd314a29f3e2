//! The blocks of one device allocator: the block arena, the allocated blocks by address, the
//! page tables of expandable segments and the registration counter of new segments.

use crate::block::{Block, BlockArena, BlockId};
use crate::expandable_segment::ExpandableSegment;
use crate::ptr_map::PtrMap;

/// Every block of one device allocator and what names them.
#[derive(Debug)]
pub(crate) struct BlockStore {
    arena: BlockArena,
    /// Allocated blocks by address (PyTorch's `allocated_blocks`).
    pub(crate) allocated: PtrMap,
    /// The page tables of expandable segments, by [`Block::expandable`]; `None` once the
    /// segment's range was released.
    pub(crate) segments: Vec<Option<ExpandableSegment>>,
    /// The registration counter the next segment takes (PyTorch 2.15's
    /// `registration_counter`, one more for every `cudaMalloc`ed or reserved segment).
    next_registration: u64,
}

impl BlockStore {
    /// An empty store with room for `n` blocks (arena and pointer map).
    pub(crate) fn with_capacity(n: usize) -> BlockStore {
        BlockStore {
            arena: BlockArena::with_capacity(n),
            allocated: PtrMap::with_capacity(n),
            segments: Vec::new(),
            next_registration: 0,
        }
    }

    /// The block `id`.
    #[inline(always)]
    pub(crate) fn get(&self, id: BlockId) -> &Block {
        self.arena.get(id)
    }

    /// The block `id`, mutable.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, id: BlockId) -> &mut Block {
        self.arena.get_mut(id)
    }

    /// Stores a new block ([`BlockArena::insert`]).
    #[inline(always)]
    pub(crate) fn insert(&mut self, block: Block) -> BlockId {
        self.arena.insert(block)
    }

    /// Stores `block` between `before` and `after` ([`BlockArena::splice`]).
    #[inline(always)]
    pub(crate) fn splice(
        &mut self,
        block: Block,
        before: Option<BlockId>,
        after: Option<BlockId>,
    ) -> BlockId {
        self.arena.splice(block, before, after)
    }

    /// Cuts an allocated block of `size` bytes off the low end of free block `src`
    /// ([`BlockArena::split_off_low`]): the new block's id and the remainder.
    #[inline(always)]
    pub(crate) fn split_off_low<const PLAIN: bool>(
        &mut self,
        src: BlockId,
        size: usize,
        requested: usize,
    ) -> (BlockId, &mut Block) {
        self.arena.split_off_low::<PLAIN>(src, size, requested)
    }

    /// Deletes the block `id`.
    #[inline(always)]
    pub(crate) fn remove(&mut self, id: BlockId) {
        self.arena.remove(id)
    }

    /// Every live block with its id, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.arena.iter()
    }

    /// The next registration counter (counted from 0 per allocator).
    pub(crate) fn take_registration(&mut self) -> u64 {
        let r = self.next_registration;
        self.next_registration += 1;
        r
    }
}

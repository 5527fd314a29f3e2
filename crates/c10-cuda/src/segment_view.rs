//! A read-only view of the allocator's segments and their blocks in address order, with an
//! owner tag per allocated block: what a caller that makes room itself (a rematerializing
//! runtime, a defragmenter) needs to see where its data sits.
//!
//! PyTorch exposes the same facts only through `snapshot()` (segments with their blocks and
//! states); the tag has no PyTorch counterpart (the closest is the allocation's recorded
//! stack). The view borrows the allocator and allocates nothing.

use crate::allocator::DeviceCachingAllocator;
use crate::block::BlockId;
use crate::device::{DeviceMemory, DevicePtr, StreamId};
use crate::error::{Error, Result};

/// Which pool a segment belongs to (PyTorch's `small_blocks` / `large_blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    /// Blocks of at most 1 MiB, in 2 MiB segments.
    Small,
    /// Larger blocks, in 20 MiB segments or segments of the request's size.
    Large,
}

impl Pool {
    /// The pool of a block that is small (`true`) or not.
    pub fn of(small: bool) -> Self {
        if small { Pool::Small } else { Pool::Large }
    }

    /// `small` or `large`, as PyTorch's snapshots name the pools.
    pub fn name(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }
}

/// The state of one block (the `state` of a block in PyTorch's snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Handed out and not freed (`active_allocated`).
    Allocated,
    /// Freed, waiting for stream events before it can be reused (`active_pending_free`).
    PendingFree,
    /// Free and mapped: it can be handed out or merged with a free neighbour (`inactive`).
    Free,
    /// Free address range of an expandable segment with no physical memory behind it.
    Unmapped,
}

/// One block of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockView {
    /// Start address.
    pub ptr: DevicePtr,
    /// Bytes (a multiple of 512).
    pub size: usize,
    /// Bytes asked for when the block was last allocated (0 for a block never allocated).
    pub requested: usize,
    /// Its state.
    pub state: BlockState,
    /// The owner's tag of an allocated block ([`DeviceCachingAllocator::set_block_tag`]);
    /// `None` for untagged and free blocks.
    pub tag: Option<u64>,
}

/// One segment: a `cudaMalloc`ed range, or one expandable segment's reserved virtual range
/// (mapped and unmapped parts alike).
pub struct SegmentView<'a, D: DeviceMemory> {
    alloc: &'a DeviceCachingAllocator<D>,
    head: BlockId,
    /// Start address of the segment.
    pub address: DevicePtr,
    /// The allocation stream of its blocks.
    pub stream: StreamId,
    /// Its pool.
    pub pool: Pool,
    /// Whether it is an expandable segment (`expandable_segments:True`).
    pub expandable: bool,
}

impl<D: DeviceMemory> Clone for SegmentView<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: DeviceMemory> Copy for SegmentView<'_, D> {}

impl<D: DeviceMemory> std::fmt::Debug for SegmentView<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentView")
            .field("address", &format_args!("{:#x}", self.address))
            .field("stream", &self.stream)
            .field("pool", &self.pool)
            .field("expandable", &self.expandable)
            .finish_non_exhaustive()
    }
}

impl<'a, D: DeviceMemory> SegmentView<'a, D> {
    /// Its blocks from the lowest address up; they tile the segment without gaps.
    pub fn blocks(&self) -> Blocks<'a, D> {
        Blocks {
            alloc: self.alloc,
            next: Some(self.head),
        }
    }

    /// Bytes of the segment (its address range; for an expandable segment, mapped or not).
    /// Walks the blocks.
    pub fn size(&self) -> usize {
        self.blocks().map(|b| b.size).sum()
    }
}

/// The blocks of one segment in address order ([`SegmentView::blocks`]).
pub struct Blocks<'a, D: DeviceMemory> {
    alloc: &'a DeviceCachingAllocator<D>,
    next: Option<BlockId>,
}

impl<D: DeviceMemory> Iterator for Blocks<'_, D> {
    type Item = BlockView;

    fn next(&mut self) -> Option<BlockView> {
        let id = self.next?;
        let b = self.alloc.blocks.get(id);
        self.next = b.next;
        let state = if b.allocated {
            BlockState::Allocated
        } else if !b.mapped {
            BlockState::Unmapped
        } else if b.is_idle() {
            BlockState::Free
        } else {
            BlockState::PendingFree
        };
        Some(BlockView {
            ptr: b.ptr,
            size: b.size,
            requested: b.requested_size,
            state,
            tag: if b.allocated { b.tag } else { None },
        })
    }
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Every segment of both pools, each with its blocks in address order. Segments come in a
    /// deterministic order that is not their address order (sort by
    /// [`SegmentView::address`] if that matters). O(blocks) to walk in all.
    pub fn segments(&self) -> impl Iterator<Item = SegmentView<'_, D>> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.prev.is_none())
            .map(move |(id, b)| SegmentView {
                alloc: self,
                head: id,
                address: b.ptr,
                stream: b.stream,
                pool: Pool::of(b.small),
                expandable: b.expandable.is_some(),
            })
    }

    /// Tags the allocated block at `ptr` with `tag` (an owner's name for it: a storage id,
    /// say), shown in [`BlockView::tag`] until the block is freed. Replaces an earlier tag.
    ///
    /// # Errors
    /// [`Error::InvalidPointer`] when `ptr` is not an allocated block of this allocator.
    pub fn set_block_tag(&mut self, ptr: DevicePtr, tag: u64) -> Result<()> {
        let Some(id) = self.blocks.allocated.get(ptr) else {
            return Err(Error::InvalidPointer {
                ptr,
                device: self.device.index(),
            });
        };
        self.blocks.get_mut(id).tag = Some(tag);
        Ok(())
    }

    /// The tag of the allocated block at `ptr`, if it is one and has a tag.
    pub fn block_tag(&self, ptr: DevicePtr) -> Option<u64> {
        self.blocks
            .allocated
            .get(ptr)
            .and_then(|id| self.blocks.get(id).tag)
    }
}

//! Memory snapshots: segments and blocks as `torch.cuda.memory._snapshot()` reports them.
//!
//! [`DeviceCachingAllocator::snapshot`] walks the block lists; the plain structs here mirror
//! PyTorch's `SegmentInfo` / `BlockInfo` and the snapshot dictionary's keys, so the CLI can
//! write them as a pickle PyTorch's memory visualizer opens.

use crate::allocator::DeviceCachingAllocator;
use crate::device::{DeviceMemory, DevicePtr, StreamId};
use crate::history::{Frames, TraceAction, TraceEntry};

/// The state of a block in a snapshot (the `state` key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Handed out and not freed (`active_allocated`).
    ActiveAllocated,
    /// Freed by the user, waiting on stream events (`active_pending_free`).
    ActivePendingFree,
    /// Free and cached (`inactive`).
    Inactive,
}

impl BlockState {
    /// The snapshot spelling: `active_allocated`, `active_pending_free` or `inactive`.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }

    /// Parses the snapshot spelling.
    pub fn parse(s: &str) -> Option<BlockState> {
        [
            BlockState::ActiveAllocated,
            BlockState::ActivePendingFree,
            BlockState::Inactive,
        ]
        .into_iter()
        .find(|b| b.as_str() == s)
    }
}

/// One block of a segment (PyTorch's `BlockInfo` as the snapshot dict spells it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Bytes of the block.
    pub size: u64,
    /// Bytes requested by its last allocation.
    pub requested_size: u64,
    /// Allocated, pending free, or inactive.
    pub state: BlockState,
    /// The stack of the allocation that holds the block (PyTorch's `frames`,
    /// `context_when_allocated`); `None` when none is known. [`DeviceCachingAllocator::snapshot`]
    /// fills it for active blocks when history is recorded with a
    /// [`crate::history::RecordContext`] of `State` or more and the allocation had a stack;
    /// callers that know other stacks (a replay) attach them.
    pub frames: Option<Frames>,
}

/// One segment: a `cudaMalloc`ed range, or one contiguous mapped range of an expandable
/// segment (PyTorch's `SegmentInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Device index.
    pub device: u8,
    /// Start address.
    pub address: DevicePtr,
    /// Bytes of the segment (sum of its blocks).
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks (allocated or pending free).
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// The stream the segment serves.
    pub stream: StreamId,
    /// Large pool (`segment_type: 'large'`) or small (`'small'`).
    pub is_large: bool,
    /// Part of an expandable segment.
    pub is_expandable: bool,
    /// The private pool holding the segment, `(0, 0)` for the default pools (the snapshot's
    /// `segment_pool_id`, PyTorch's `SegmentInfo::owner_private_pool_id`).
    pub segment_pool_id: crate::pool_types::MempoolId,
    /// The blocks, in address order.
    pub blocks: Vec<BlockInfo>,
    /// The stack of the `cudaMalloc` (or first mapping) that made the segment (PyTorch's
    /// segment `frames`, `context_when_segment_allocated`); `None` when none was recorded.
    pub frames: Option<Frames>,
}

impl SegmentInfo {
    /// The snapshot's `segment_type`: `"large"` or `"small"`.
    pub fn segment_type(&self) -> &'static str {
        if self.is_large { "large" } else { "small" }
    }
}

/// A device's state and history (one device's part of `torch.cuda.memory._snapshot()`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSnapshot {
    /// Device index.
    pub device: u8,
    /// Segments sorted by address.
    pub segments: Vec<SegmentInfo>,
    /// The memory history (empty unless recording), oldest first, ending with the `snapshot`
    /// entry this call recorded.
    pub trace: Vec<TraceEntry>,
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Segments and blocks now, and the history so far (PyTorch's `snapshot()`). Records a
    /// `snapshot` trace entry whose size is the active bytes, as PyTorch does.
    pub fn snapshot(&mut self) -> DeviceSnapshot {
        let mut segments = Vec::new();
        let mut total_active = 0u64;
        for (_, head) in self.blocks.iter() {
            if !head.mapped {
                continue;
            }
            // A head is a mapped block without a mapped predecessor.
            if head.prev.is_some_and(|p| self.blocks.get(p).mapped) {
                continue;
            }
            let mut info = SegmentInfo {
                device: self.device.index(),
                address: head.ptr,
                total_size: 0,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: head.stream,
                is_large: !head.small,
                is_expandable: head.expandable.is_some(),
                segment_pool_id: self.pools.id_of(head.pool),
                blocks: Vec::new(),
                frames: self.history.segment_frames(head.ptr),
            };
            let mut cur = Some(head);
            while let Some(b) = cur.filter(|b| b.mapped) {
                let active = b.allocated || b.event_count > 0 || !b.stream_uses.is_empty();
                let state = if b.allocated {
                    BlockState::ActiveAllocated
                } else if active {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::Inactive
                };
                info.total_size += b.size as u64;
                if b.allocated {
                    info.allocated_size += b.size as u64;
                }
                if active {
                    info.active_size += b.size as u64;
                    info.requested_size += b.requested_size as u64;
                }
                info.blocks.push(BlockInfo {
                    address: b.ptr,
                    size: b.size as u64,
                    requested_size: b.requested_size as u64,
                    state,
                    frames: if active {
                        self.history.block_frames(b.ptr)
                    } else {
                        None
                    },
                });
                cur = b.next.map(|n| self.blocks.get(n));
            }
            total_active += info.active_size;
            segments.push(info);
        }
        segments.sort_by_key(|s| s.address);
        self.history
            .record(TraceAction::Snapshot, 0, total_active, StreamId::DEFAULT);
        DeviceSnapshot {
            device: self.device.index(),
            segments,
            trace: self.history(),
        }
    }
}

//! The one accounting path of device memory: every segment allocated or freed and every range
//! of expandable pages mapped or unmapped is counted by [`DeviceCachingAllocator::account`]
//! (what PyTorch writes out in `alloc_block`, `release_block`, `map_block` and `unmap_block`).

use crate::allocator::DeviceCachingAllocator;
use crate::device::{DeviceMemory, DevicePtr, StreamId};
use crate::error::Result;
use crate::history::TraceAction;
use crate::stats::{decrease, increase};

/// A change of the memory reserved from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceCall {
    /// A segment allocated (`cudaMalloc` in PyTorch's `alloc_block`; or a segment imported
    /// into a replay's start state).
    Malloc,
    /// A segment freed (`cudaFree` in PyTorch's `release_block`).
    Free,
    /// Pages mapped into an expandable segment (PyTorch's `map_block`).
    Map,
    /// Pages unmapped from an expandable segment (PyTorch's `unmap_block`).
    Unmap,
}

impl DeviceCall {
    /// The history entry of the call.
    fn action(self) -> TraceAction {
        match self {
            DeviceCall::Malloc => TraceAction::SegmentAlloc,
            DeviceCall::Free => TraceAction::SegmentFree,
            DeviceCall::Map => TraceAction::SegmentMap,
            DeviceCall::Unmap => TraceAction::SegmentUnmap,
        }
    }
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Counts `bytes` at `ptr` reserved (`Malloc`, `Map`) or given back (`Free`, `Unmap`) by the
    /// pools of slot `pool` (small or large) for `stream`, after the device call succeeded:
    /// reserved bytes, `num_device_alloc` / `num_device_free`, for whole segments `segment` and
    /// `oversize_segments`, the private pool's `reserved_bytes_by_private_pools` and
    /// `cudaMalloc_count` (a segment allocated counts one; pages mapped count none here, as
    /// PyTorch counts one per request in `alloc_block`; every release counts one back), and the
    /// history entry. The same updates as PyTorch's, in its order.
    ///
    /// # Errors
    /// [`crate::private_pool::PoolError::NoAllocationCounted`] when a private pool gives back
    /// memory while its `cudaMalloc_count` is 0 (after everything else was counted, as
    /// PyTorch's assertion fails there).
    pub(crate) fn account(
        &mut self,
        call: DeviceCall,
        pool: u32,
        small: bool,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<()> {
        let up = matches!(call, DeviceCall::Malloc | DeviceCall::Map);
        let stats = &mut self.stats;
        if up {
            increase(&mut stats.reserved_bytes, small, bytes as u64);
            stats.num_device_alloc += 1;
        } else {
            decrease(&mut stats.reserved_bytes, small, bytes as u64);
            stats.num_device_free += 1;
        }
        if matches!(call, DeviceCall::Malloc | DeviceCall::Free) {
            let oversize = bytes >= self.config.max_split_size_or_max();
            if up {
                increase(&mut stats.segment, small, 1);
                if oversize {
                    stats.oversize_segments.increase(1);
                }
            } else {
                decrease(&mut stats.segment, small, 1);
                if oversize {
                    stats.oversize_segments.decrease(1);
                }
            }
        }
        self.pool_reserved(pool, small, bytes, up);
        self.history
            .record(call.action(), ptr, bytes as u64, stream);
        match call {
            DeviceCall::Malloc => self.pool_counted_alloc(pool),
            DeviceCall::Map => {}
            DeviceCall::Free | DeviceCall::Unmap => self.pool_counted_release(pool)?,
        }
        Ok(())
    }
}

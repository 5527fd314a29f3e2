//! The counts of device memory: [`DeviceCall`] (what changed the memory reserved from the
//! device) and the stats each one changes ([`count_device_call`]). Every segment allocated or
//! freed and every range of expandable pages mapped or unmapped is counted through
//! `DeviceCachingAllocator::account` (`allocator.rs`), the one accounting path (what PyTorch
//! writes out in `alloc_block`, `release_block`, `map_block` and `unmap_block`).

use crate::history::TraceAction;
use crate::stats::{DeviceStats, decrease, increase};

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
    pub(crate) fn action(self) -> TraceAction {
        match self {
            DeviceCall::Malloc => TraceAction::SegmentAlloc,
            DeviceCall::Free => TraceAction::SegmentFree,
            DeviceCall::Map => TraceAction::SegmentMap,
            DeviceCall::Unmap => TraceAction::SegmentUnmap,
        }
    }
}

/// The stats `call` changes by `bytes` of the small or large pool: reserved bytes,
/// `num_device_alloc` / `num_device_free`, and for whole segments `segment` and (at or above
/// `max_split` bytes) `oversize_segments`, in PyTorch's order.
#[inline]
pub(crate) fn count_device_call(
    stats: &mut DeviceStats,
    call: DeviceCall,
    small: bool,
    bytes: usize,
    max_split: usize,
) {
    let up = matches!(call, DeviceCall::Malloc | DeviceCall::Map);
    if up {
        increase(&mut stats.reserved_bytes, small, bytes as u64);
        stats.num_device_alloc += 1;
    } else {
        decrease(&mut stats.reserved_bytes, small, bytes as u64);
        stats.num_device_free += 1;
    }
    if matches!(call, DeviceCall::Malloc | DeviceCall::Free) {
        let oversize = bytes >= max_split;
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
}

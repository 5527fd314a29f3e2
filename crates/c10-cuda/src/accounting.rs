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

/// What the allocator counts (PyTorch's `stats`, `allowed_memory_maximum` and the device's
/// total): the stats as kept, which only this sub-state reads (the pool stats and the
/// aggregates' peaks; the aggregates' `current`, `allocated` and `freed` are summed, and
/// `active` / `active_bytes` derived, when the stats are built, [`Accounting::stats`]), and the
/// memory limit.
#[derive(Debug)]
pub(crate) struct Accounting {
    kept: DeviceStats,
    /// `Some(bytes)` when a per-process memory fraction is set (`allowed_memory_maximum`).
    pub(crate) allowed_memory_maximum: Option<usize>,
    /// The device's total memory in bytes, as last reported.
    pub(crate) device_total: usize,
}

impl Accounting {
    /// Accounting from `kept` (fresh stats) on a device of `device_total` bytes, no limit.
    pub(crate) fn new(kept: DeviceStats, device_total: usize) -> Accounting {
        Accounting {
            kept,
            allowed_memory_maximum: None,
            device_total,
        }
    }

    /// The stats as PyTorch reports them (`getDeviceStats`), built now.
    pub(crate) fn stats(&self) -> DeviceStats {
        let mut stats = self.kept.clone();
        stats.materialize();
        stats
    }

    /// The stats as kept, to update (never to read an aggregate from: see [`Self::stats`]).
    #[inline(always)]
    pub(crate) fn kept_mut(&mut self) -> &mut DeviceStats {
        &mut self.kept
    }

    /// Bytes reserved from the device: `reserved_bytes.all.current`.
    #[inline]
    pub(crate) fn reserved_bytes(&self) -> usize {
        let [_, small, large] = &self.kept.reserved_bytes;
        (small.current + large.current) as usize
    }

    /// Bytes of live allocations: `allocated_bytes.all.current`.
    #[inline]
    pub(crate) fn allocated_bytes(&self) -> usize {
        let [_, small, large] = &self.kept.allocated_bytes;
        (small.current + large.current) as usize
    }

    /// [`count_device_call`] on the kept stats.
    #[inline]
    pub(crate) fn device_call(
        &mut self,
        call: DeviceCall,
        small: bool,
        bytes: usize,
        max_split: usize,
    ) {
        count_device_call(&mut self.kept, call, small, bytes, max_split);
    }

    /// `peak = current` everywhere (PyTorch's `resetPeakStats`), aggregates summed first.
    pub(crate) fn reset_peak(&mut self) {
        let reported = self.stats();
        self.kept.reset_kept_peak(&reported);
    }
}

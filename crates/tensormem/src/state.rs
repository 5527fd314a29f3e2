//! Summaries of state-only snapshots: the dump's segments imported into our allocator, so
//! `memory_stats()` and `memory_summary()` describe the recorded state.

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::StreamId;
use c10_cuda::import::ImportBlock;
use c10_cuda::snapshot::BlockState;
use c10_cuda::stats::DeviceStats;
use c10_cuda::{DeviceCachingAllocator, Error, SimDevice};

use crate::model::Snapshot;

/// The statistics of `device`'s segments in the dump, as our allocator counts them (blocks
/// allocated or pending free count as allocated). Expandable segments are counted as regular
/// segments of their mapped size.
///
/// # Errors
/// A simulated-device failure (not expected: the device is sized to fit the dump).
pub fn state_stats(snapshot: &Snapshot, device: u8) -> Result<DeviceStats, Error> {
    let total: u64 = snapshot.reserved_bytes();
    let sim = SimDevice::address_only(device, (total as usize).saturating_mul(2).max(1 << 30));
    let mut alloc = DeviceCachingAllocator::new(sim.clone(), AllocatorConfig::default())?;
    let mut segments: Vec<_> = snapshot
        .segments
        .iter()
        .filter(|s| s.device == device)
        .collect();
    segments.sort_by_key(|s| s.address);
    for s in segments {
        let mut blocks = Vec::new();
        let mut cursor = s.address;
        for b in &s.blocks {
            if b.address > cursor {
                blocks.push(ImportBlock {
                    size: (b.address - cursor) as usize,
                    requested: 0,
                    allocated: false,
                });
            }
            blocks.push(ImportBlock {
                size: b.size as usize,
                requested: b.requested_size as usize,
                allocated: b.state != BlockState::Inactive,
            });
            cursor = b.address + b.size;
        }
        let end = s.address + s.total_size;
        if end > cursor {
            blocks.push(ImportBlock {
                size: (end - cursor) as usize,
                requested: 0,
                allocated: false,
            });
        }
        blocks.retain(|b| b.size > 0);
        if blocks.is_empty() {
            continue;
        }
        sim.script_malloc(s.address, blocks.iter().map(|b| b.size).sum());
        alloc.import_segment(StreamId(s.stream), !s.is_large, &blocks)?;
    }
    Ok(alloc.stats())
}

//! Summaries of state-only snapshots: the dump's segments imported into our allocator, so
//! `memory_stats()` and `memory_summary()` describe the recorded state. A dump holds the state
//! at one moment: the current values are known; peaks, totals allocated and freed, OOMs,
//! retries and device (de)allocations are not, and are reported as unknown (`null` in JSON,
//! `unknown` in text), never as 0.

use std::collections::BTreeMap;

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
    Ok(imported(snapshot, device)?.stats())
}

/// The dump's segments of `device` as our allocator's snapshot (for the segment map of a
/// state-only page), imported as [`state_stats`] imports them.
///
/// # Errors
/// As [`state_stats`].
pub fn state_snapshot(
    snapshot: &Snapshot,
    device: u8,
) -> Result<c10_cuda::snapshot::DeviceSnapshot, Error> {
    Ok(imported(snapshot, device)?.snapshot())
}

/// Our allocator holding the dump's segments of `device`.
fn imported(snapshot: &Snapshot, device: u8) -> Result<DeviceCachingAllocator<SimDevice>, Error> {
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
    Ok(alloc)
}

/// What a state-only snapshot cannot tell, one line each (for the text report and the JSON
/// `unknown` list).
pub const UNKNOWN_IN_STATE: [&str; 3] = [
    "peaks and totals allocated/freed (memory_stats() *.peak, *.allocated, *.freed): a dump holds one moment",
    "CUDA OOMs, cudaMalloc retries, device allocations and frees, syncs (num_ooms, num_alloc_retries, \
     num_device_alloc, num_device_free, num_sync_all_streams, num_oom_rejections): no history",
    "the allocations over time, and what any allocator setting would need: no history (record one with \
     torch.cuda.memory._record_memory_history())",
];

/// Whether a dump gives `memory_stats()` key `key`: the `*.current` values do (and
/// `max_split_size` when `settings_recorded`); nothing else does.
pub fn known_in_state(key: &str, settings_recorded: bool) -> bool {
    key.ends_with(".current") || (key == "max_split_size" && settings_recorded)
}

/// `memory_stats()` of a state-only snapshot: every key, `None` where the dump cannot give it
/// (see [`known_in_state`]).
pub fn state_memory_stats(
    stats: &DeviceStats,
    settings_recorded: bool,
) -> BTreeMap<String, Option<i64>> {
    stats
        .memory_stats()
        .into_iter()
        .map(|(k, v)| {
            let known = known_in_state(&k, settings_recorded);
            (k, known.then_some(v))
        })
        .collect()
}

/// `memory_summary()` of a state-only snapshot: PyTorch's table with the current values, and
/// `unknown` in every cell a dump cannot give (peaks, totals allocated and freed, the OOM and
/// retry counters).
pub fn state_summary(device: u8, stats: &DeviceStats) -> String {
    let text = c10_cuda::summary::memory_summary(device, stats, false);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let fixed = if line.contains("CUDA OOMs:") {
            format!(
                "|  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  |",
                "", "unknown", "", "unknown"
            )
        } else {
            let cells: Vec<&str> = line.split(" | ").collect();
            let is_row = cells.len() == 5 && !line.contains("Cur Usage");
            if is_row {
                let unknown = format!("{:^10}", "unknown");
                format!(
                    "{} | {} | {unknown} | {unknown} | {unknown} |",
                    cells[0], cells[1]
                )
            } else {
                line.to_string()
            }
        };
        out.push_str(&fixed);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_keeps_its_width_and_says_unknown() {
        let stats = DeviceStats::default();
        let text = state_summary(0, &stats);
        let plain = c10_cuda::summary::memory_summary(0, &stats, false);
        assert_eq!(text.lines().count(), plain.lines().count());
        for (a, b) in text.lines().zip(plain.lines()) {
            assert_eq!(a.len(), b.len(), "{a}\n{b}");
        }
        assert!(text.contains("CUDA OOMs: unknown"));
        assert!(text.contains("cudaMalloc retries: unknown"));
        assert!(
            text.contains(
                "| Allocated memory      |      0 B   |  unknown   |  unknown   |  unknown   |"
            ),
            "{text}"
        );
    }

    #[test]
    fn only_current_values_are_known() {
        let stats = DeviceStats::default();
        let map = state_memory_stats(&stats, false);
        assert_eq!(map["allocated_bytes.all.current"], Some(0));
        for key in [
            "allocated_bytes.all.peak",
            "segment.large_pool.freed",
            "num_ooms",
            "num_alloc_retries",
            "max_split_size",
        ] {
            assert_eq!(map[key], None, "{key}");
        }
        assert_eq!(state_memory_stats(&stats, true)["max_split_size"], Some(-1));
    }
}

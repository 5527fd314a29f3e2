//! What-if sweeps: the same alloc/free sequence from an empty allocator under several
//! configurations.

use c10_cuda::Rules;
use c10_cuda::config::AllocatorConfig;

use crate::model::Snapshot;
use crate::replay::{Outcome, ReplayError, ReplayOptions, replay};

/// The standard configurations a sweep compares: PyTorch's default and the three knobs users
/// reach for against fragmentation.
pub const STANDARD_CONFIGS: [&str; 4] = [
    "",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "expandable_segments:True",
];

/// Replays `device`'s alloc/free sequence from empty under each configuration in `configs`,
/// following `rules`. `progress(config index, done, total)` reports progress.
///
/// # Errors
/// The first [`ReplayError`].
pub fn sweep(
    snapshot: &Snapshot,
    device: usize,
    configs: &[AllocatorConfig],
    capacity: usize,
    series: bool,
    rules: Rules,
    progress: &mut dyn FnMut(usize, usize, usize),
) -> Result<Vec<Outcome>, ReplayError> {
    configs
        .iter()
        .enumerate()
        .map(|(k, config)| {
            let opts = ReplayOptions {
                series,
                rules,
                ..ReplayOptions::new(config.clone(), capacity, true)
            };
            replay(snapshot, device, &opts, &mut |d, t| progress(k, d, t))
        })
        .collect()
}

/// The standard configurations, parsed.
pub fn standard_configs() -> Vec<AllocatorConfig> {
    STANDARD_CONFIGS
        .iter()
        .map(|s| s.parse().expect("the standard configurations are valid"))
        .collect()
}

//! What-if sweeps: the same job from an empty allocator under several configurations (the
//! whole job by default, or the recorded history alone).

use std::sync::Arc;

use c10_cuda::config::AllocatorConfig;

use crate::model::Snapshot;
use crate::replay::{Outcome, ReplayError, ReplayOptions, replay};
use crate::start_state::start_state;

/// The standard configurations a sweep compares: PyTorch's default and the three knobs users
/// reach for against fragmentation.
pub const STANDARD_CONFIGS: [&str; 4] = [
    "",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "expandable_segments:True",
];

/// Replays `device`'s job from empty under each configuration in `configs`, with `base`'s
/// device memory, series, rules and mode: the whole job (the blocks live when recording began
/// allocated first, then the history), or with `base.history_only` the recorded history
/// alone. The start state is rebuilt once for all configurations unless `base` carries one.
/// `progress(config index, done, total)` reports progress.
///
/// # Errors
/// The first [`ReplayError`].
pub fn sweep(
    snapshot: &Snapshot,
    device: usize,
    configs: &[AllocatorConfig],
    base: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize, usize),
) -> Result<Vec<Outcome>, ReplayError> {
    let start = Some(
        base.start
            .clone()
            .unwrap_or_else(|| Arc::new(start_state(snapshot, device, &base.config))),
    );
    configs
        .iter()
        .enumerate()
        .map(|(k, config)| {
            let opts = ReplayOptions {
                config: config.clone(),
                from_empty: true,
                start: start.clone(),
                ..base.clone()
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

//! Which PyTorch version's rules reproduce a recording: a parity replay under each supported
//! version ([`c10_cuda::TorchVersion::ALL`]), exactly as PyTorch behaves (bugs included:
//! [`Rules::pytorch_exact`]), and the one that reproduces most decisions.
//!
//! A snapshot does not say which PyTorch recorded it; the rules differ (e.g. torch 2.15 breaks
//! ties between equal-size free blocks by segment age, 2.7 by address), so the version whose
//! replay places the most allocations where PyTorch did is the one that recorded it. Ties go to
//! the newest version.

use c10_cuda::config::AllocatorConfig;
use c10_cuda::{Rules, TorchVersion};

use crate::model::Snapshot;
use crate::replay::{Outcome, ReplayError, ReplayOptions, replay};

/// One version's parity replay.
#[derive(Clone, Debug)]
pub struct VersionParity {
    /// The version.
    pub version: TorchVersion,
    /// Its replay (`parity` is set), or `None` when the version does not accept the
    /// configuration (`--alloc-conf` with a key or value it rejects).
    pub outcome: Option<Outcome>,
}

impl VersionParity {
    /// `(allocations at PyTorch's address, identical segment decisions)`; `(0, 0)` when the
    /// version could not replay.
    pub fn score(&self) -> (usize, usize) {
        self.outcome
            .as_ref()
            .and_then(|o| o.parity.as_ref())
            .map_or((0, 0), |p| {
                (p.alloc_address_match, p.segment_decision_match)
            })
    }

    /// Whether every allocation and segment decision matched.
    pub fn is_exact(&self) -> bool {
        self.outcome
            .as_ref()
            .and_then(|o| o.parity.as_ref())
            .is_some_and(|p| {
                p.alloc_address_match == p.alloc_total
                    && p.segment_decision_match == p.segment_decision_total
            })
    }
}

/// Replays `device`'s history in parity mode under every supported version, with the
/// configuration `config(version)` gives (`None`: that version rejects it). Returns the replays,
/// oldest version first, and the index of the best one (most allocations placed, then most
/// segment decisions; ties to the newest). `progress(version, done, total)` reports progress.
///
/// # Errors
/// The first [`ReplayError`].
pub fn detect(
    snapshot: &Snapshot,
    device: usize,
    base: &ReplayOptions,
    config: &dyn Fn(TorchVersion) -> Option<AllocatorConfig>,
    progress: &mut dyn FnMut(TorchVersion, usize, usize),
) -> Result<(Vec<VersionParity>, usize), ReplayError> {
    let mut runs = Vec::new();
    for version in TorchVersion::ALL {
        let outcome = match config(version) {
            Some(config) => {
                let opts = ReplayOptions {
                    config,
                    rules: Rules::pytorch_exact(version),
                    from_empty: false,
                    ..base.clone()
                };
                Some(replay(snapshot, device, &opts, &mut |d, t| {
                    progress(version, d, t)
                })?)
            }
            None => None,
        };
        runs.push(VersionParity { version, outcome });
    }
    let best = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.outcome.is_some())
        .max_by_key(|(i, r)| (r.score(), *i))
        .map_or(runs.len() - 1, |(i, _)| i);
    Ok((runs, best))
}

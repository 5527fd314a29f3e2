//! One script checked: does our allocator agree with the oracle, and if not, is the difference
//! one of our deliberate fixes ([`c10_cuda::rules::Fixes`])?
//!
//! Our default rules fix some PyTorch bugs on purpose. A script on which they diverge is run
//! again with every fix off ([`Rules::pytorch_exact`]): if that agrees with the oracle, the
//! difference is deliberate, and each fix whose removal alone changes our output is named.
//! Otherwise it is a real divergence (reported as the fix-free run's, which is what should
//! have matched).

use c10_cuda::rules::{Fixes, Rules, TorchVersion};

use crate::compare::order_sensitive;
use crate::compare::{Divergence, compare};
use crate::driver::{self, DriverError};
use crate::script::Script;
use crate::trace::Line;

/// How our allocator did on one script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every compared decision is the same.
    Agree,
    /// Different only because of our deliberate fixes (their names, from [`Fixes::LIST`]).
    Deliberate(Vec<&'static str>),
    /// A real divergence.
    Diverge(Divergence),
    /// PyTorch cannot be compared from some op on: it goes on with memory it freed (the named
    /// defect, see [`PYTORCH_DEFECTS`]); everything before agreed.
    PytorchDefect(&'static str),
}

/// The PyTorch defects a campaign counts instead of divergences, with what PyTorch does
/// (each read in PyTorch's source, c10/cuda/CUDACachingAllocator.cpp).
pub const PYTORCH_DEFECTS: &[(&str, &str)] = &[(
    "erased-pool-with-live-blocks",
    "release_cached_blocks erases a freeable private pool from graph_pools once its \
     cudaMalloc_count is 0 (`if (it->second->cudaMalloc_count == 0) { ... \
     graph_pools.erase(it->first); ... }`), which with expandable segments happens while blocks \
     of the pool are still allocated; freeing such a block or taking a snapshot then goes \
     through the erased PrivatePool (block->pool): a crash (SIGSEGV) or segments missing from \
     the snapshot",
)];

/// Checks `script` against the oracle's output `theirs` under `version`'s rules.
///
/// # Errors
/// [`DriverError`] when our side cannot run the script at all.
pub fn classify(
    script: &Script,
    theirs: &[Line],
    version: TorchVersion,
) -> Result<Outcome, DriverError> {
    let sensitive = order_sensitive(script);
    let ours = driver::run(script, Rules::new(version))?;
    let Some(first) = compare(theirs, &ours, sensitive) else {
        return Ok(Outcome::Agree);
    };
    let exact = driver::run(script, Rules::pytorch_exact(version))?;
    if let Some(d) = compare(theirs, &exact, sensitive) {
        return Ok(Outcome::Diverge(d));
    }
    // Which fixes make the difference: those whose removal alone changes our output.
    let mut names = Vec::new();
    for (i, (name, _)) in Fixes::LIST.iter().enumerate() {
        let without = Rules {
            version,
            fixes: Fixes::ALL.with(i, false),
        };
        if compare(&ours, &driver::run(script, without)?, sensitive).is_some() {
            names.push(*name);
        }
    }
    if names.is_empty() {
        // Only the fixes together change it (never seen so far): name the first divergence.
        let _ = first;
        names.push("several fixes together");
    }
    Ok(Outcome::Deliberate(names))
}

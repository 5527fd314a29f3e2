//! The committed fixtures of PyTorch's real allocator (`tests/oracle/torch-*.fixtures`, made by
//! `oracle-diff fixtures` from torch-oracle runs of torch 2.7.1 and 2.15.0): our allocator,
//! under each file's version rules, makes every decision the real one made. No download, no
//! oracle needed.

use std::path::PathBuf;

use c10_cuda::TorchVersion;
use oracle_diff::fixtures::{Case, check_case, decompress};
use oracle_diff::script::Op;
use rstest::rstest;

fn load(release: &str) -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("oracle")
        .join(format!("torch-{release}.fixtures"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    decompress(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every case agrees (cases marked `fixes none` under PyTorch-exact rules: they show one of our
/// deliberate fixes, and our default rules must differ there).
#[rstest]
#[case::torch_2_7_1("2.7.1", TorchVersion::V2_7)]
#[case::torch_2_15_0("2.15.0", TorchVersion::V2_15)]
fn fixtures_agree_with_the_real_allocator(#[case] release: &str, #[case] version: TorchVersion) {
    let cases = load(release);
    assert!(cases.len() >= 200, "{release}: {} cases", cases.len());
    let probes = cases.iter().filter(|c| !c.name.starts_with("seed")).count();
    assert!(probes >= 12, "{release}: {probes} probes");
    // Private pools (issue 16): generated scripts that begin pools, and the pool probes.
    let pooled = cases
        .iter()
        .filter(|c| {
            c.script
                .ops
                .iter()
                .any(|op| matches!(op, Op::PoolBegin { .. }))
        })
        .count();
    assert!(
        pooled >= 100,
        "{release}: only {pooled} cases use private pools"
    );
    for probe in [
        "pool_mempool_lifetime",
        "pool_scoped_empty_cache",
        "pool_capture_deferred_events",
    ] {
        assert!(
            cases.iter().any(|c| c.name == probe),
            "{release}: probe {probe} missing"
        );
    }
    let deliberate = cases.iter().filter(|c| !c.with_fixes).count();
    assert!(deliberate > 0, "{release}: no case shows a deliberate fix");
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| check_case(c, version).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from torch {release}; the first:\n{}",
        failures.len(),
        cases.len(),
        failures[0]
    );
    // A case marked as a deliberate difference does differ under our default rules.
    for c in cases.iter().filter(|c| !c.with_fixes) {
        let fixed = Case {
            with_fixes: true,
            ..c.clone()
        };
        assert!(
            check_case(&fixed, version).is_err(),
            "{release} {}: marked deliberate but our default rules agree",
            c.name
        );
    }
}

/// The fixtures tell the versions apart: under the other version's rules the version-specific
/// probes (ties, roundup lists, a fraction of 1.0, ...) differ.
#[rstest]
#[case::torch_2_7_1_under_2_15("2.7.1", TorchVersion::V2_15)]
#[case::torch_2_15_0_under_2_7("2.15.0", TorchVersion::V2_7)]
fn fixtures_differ_under_the_other_version(#[case] release: &str, #[case] other: TorchVersion) {
    let cases = load(release);
    let differ: Vec<&str> = cases
        .iter()
        .filter(|c| check_case(c, other).is_err())
        .map(|c| c.name.as_str())
        .collect();
    for probe in [
        "tie_oldest_segment",
        "tie_split_inherit",
        "roundup_gt_alone",
        "roundup_gt_after_key",
        "fraction_one",
        "gc_with_fraction_one",
        "expandable_new_segment_too_small",
        "pool_empty_cache_while_begun",
        "pool_two_begun_same_stream",
        "pool_capture_deferred_events",
        "fraction_rounding_observer",
    ] {
        assert!(
            differ.contains(&probe),
            "{release}: probe {probe} agrees under torch {other}'s rules too"
        );
    }
}

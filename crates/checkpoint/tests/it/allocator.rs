//! The caching allocator behind the runtime: storages routed through c10-cuda's allocator on
//! an address-only device, reporting reserved bytes; and the live driver's accounting, where
//! the hard budget counts the allocator's `allocated_bytes`. Reads `../shared/data/dtr-logs`
//! (skips locally when absent, fails under `CI=true`).

use crate::support;

use checkpoint::sim::{self, SimOptions, Status};
use checkpoint::{AllocatorBackend, Heuristic, NullBackend, budget_for_ratio, log};

/// Routing storages through the allocator changes no decision: same statuses, overheads and
/// counters as the plain simulator; the allocator holds at least the budgeted bytes.
#[test]
fn routing_through_the_allocator_changes_no_decision() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    for model in ["unet", "transformer"] {
        let lg = log::parse_file(&support::log_path(&dir, model)).unwrap();
        let base = sim::baseline(&lg).unwrap();
        for ratio in [0.3, 0.6, 0.9] {
            let options = SimOptions {
                budget: Some(budget_for_ratio(base.peak_bytes, ratio)),
                heuristic: Heuristic::DtrEq,
                remat_limit_ns: Some(base.compute_ns),
                ..SimOptions::default()
            };
            let (mut plain, _) = sim::run(&lg, &options, NullBackend).unwrap();
            let (mut routed, backend) =
                sim::run(&lg, &options, AllocatorBackend::new().unwrap()).unwrap();
            // Search time is wall-clock; everything else must be identical.
            plain.profile.search_ns = 0;
            routed.profile.search_ns = 0;
            assert_eq!(plain, routed, "{model} at {ratio}");
            let a = backend.report();
            assert!(a.peak_allocated_bytes >= plain.profile.peak_bytes);
            assert!(a.peak_reserved_bytes >= a.peak_allocated_bytes);
            assert!(a.requests > 0 && a.device_mallocs > 0);
            assert!((0.0..1.0).contains(&a.fragmentation()));
        }
    }
}

/// With the allocator doing the accounting (the live driver's mode), the budget holds for
/// the allocator's own allocated bytes, not only for the storages' bytes.
#[test]
fn budget_on_allocated_bytes_holds() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    for model in ["resnet32", "unet", "transformer"] {
        let lg = log::parse_file(&support::log_path(&dir, model)).unwrap();
        let base = sim::baseline(&lg).unwrap();
        for ratio in [0.5, 0.7, 1.0] {
            let budget = budget_for_ratio(base.peak_bytes, ratio);
            let options = SimOptions {
                budget: Some(budget),
                heuristic: Heuristic::DtrEq,
                ..SimOptions::default()
            };
            let backend = AllocatorBackend::new()
                .unwrap()
                .with_allocator_accounting(true);
            let (r, backend) = sim::run(&lg, &options, backend).unwrap();
            let a = backend.report();
            assert!(
                a.peak_allocated_bytes <= budget,
                "{model} at {ratio}: allocated peak {} over budget {budget} ({:?})",
                a.peak_allocated_bytes,
                r.status
            );
            assert!(matches!(r.status, Status::Ok | Status::Oom));
        }
    }
}

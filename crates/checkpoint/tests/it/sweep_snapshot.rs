//! Snapshots of the ResNet-32 sweep tables: every heuristic at the paper's ten ratios, and
//! h_DTR^eq routed through the caching allocator (reserved bytes and fragmentation). Reads
//! `../shared/data/dtr-logs` (skips locally when absent, fails under `CI=true`).

use crate::support;

use checkpoint::sweep::{self, SweepOptions};
use checkpoint::{Heuristic, log};

#[test]
fn resnet32_sweep_table() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    let lg = log::parse_file(&support::log_path(&dir, "resnet32")).expect("log parses");
    let options = SweepOptions {
        heuristics: Heuristic::ALL.to_vec(),
        ..SweepOptions::default()
    };
    let sw = sweep::sweep(&lg, &options).expect("sweeps");
    insta::assert_snapshot!(sweep::table(&sw, false));
}

#[test]
fn resnet32_sweep_with_allocator() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    let lg = log::parse_file(&support::log_path(&dir, "resnet32")).expect("log parses");
    let options = SweepOptions {
        heuristics: vec![Heuristic::DtrEq],
        with_allocator: true,
        ..SweepOptions::default()
    };
    let sw = sweep::sweep(&lg, &options).expect("sweeps");
    for r in &sw.runs {
        let a = r.allocator.expect("allocator report");
        // The allocator rounds up and caches: it never holds less than the budgeted bytes.
        assert!(a.peak_allocated_bytes >= r.result.profile.peak_bytes);
        assert!(a.peak_reserved_bytes >= a.peak_allocated_bytes);
    }
    insta::assert_snapshot!(sweep::table(&sw, true));
}

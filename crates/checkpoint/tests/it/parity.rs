//! Acceptance against simrd (the DTR paper's simulator, runtime "V2 eager optimized"): its
//! reference overheads with h_DTR^eq within 1% and its statuses, and the logs' no-eviction
//! peaks and compute sums from the reference. Reads `../shared/data/dtr-logs` (skips locally
//! when absent, fails under `CI=true`).

use crate::support;

use checkpoint::sim::{self, Status};
use checkpoint::sweep::{self, SweepOptions};
use checkpoint::{Heuristic, budget_for_ratio, log};
use rstest::rstest;

/// simrd's values with h_DTR^eq (`None`: OOM).
#[rstest]
#[case::resnet32_04("resnet32", 0.4, Some(1.1404))]
#[case::resnet32_06("resnet32", 0.6, Some(1.0737))]
#[case::transformer_04("transformer", 0.4, Some(1.0914))]
#[case::unet_04("unet", 0.4, None)]
#[case::unet_06("unet", 0.6, Some(1.1489))]
fn matches_simrd_dtr_eq(#[case] model: &str, #[case] ratio: f64, #[case] expected: Option<f64>) {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    let lg = log::parse_file(&support::log_path(&dir, model)).expect("log parses");
    let base = sim::baseline(&lg).expect("baseline runs");
    let options = SweepOptions {
        heuristics: vec![Heuristic::DtrEq],
        ..SweepOptions::default()
    };
    let budget = budget_for_ratio(base.peak_bytes, ratio);
    let run = sweep::run_budget(&lg, &base, Heuristic::DtrEq, budget, &options).expect("runs");
    match expected {
        Some(want) => {
            assert_eq!(run.status(), Status::Ok, "{model} at {ratio}");
            let got = run.overhead.expect("OK runs have an overhead");
            assert!(
                (got - want).abs() / want < 0.01,
                "{model} at {ratio}: overhead {got:.4}, simrd {want:.4}"
            );
            // Tighter than the 1% asked: we reproduce simrd's decisions exactly.
            assert!(
                (got - want).abs() < 5e-5,
                "{model} at {ratio}: {got:.5} vs {want}"
            );
        }
        None => assert_eq!(run.status(), Status::Oom, "{model} at {ratio}"),
    }
    assert!(run.result.profile.peak_bytes <= budget, "hard budget");
}

/// The reference's no-eviction peaks (GB = 1e9 bytes, 2 decimals) and summed op times (ms).
#[rstest]
#[case::unet("unet", 8.42, 435)]
#[case::densenet("tv_densenet121", 11.02, 355)]
#[case::transformer("transformer", 9.86, 276)]
#[case::resnet32("resnet32", 10.06, 292)]
fn no_eviction_peak_and_compute(#[case] model: &str, #[case] peak_gb: f64, #[case] ms: u64) {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    let lg = log::parse_file(&support::log_path(&dir, model)).expect("log parses");
    let base = sim::baseline(&lg).expect("baseline runs");
    let got = (base.peak_bytes as f64 / 1e9 * 100.0).round() / 100.0;
    assert_eq!(got, peak_gb, "{model}: peak {} bytes", base.peak_bytes);
    assert_eq!((base.compute_ns as f64 / 1e6).round() as u64, ms, "{model}");
    assert_eq!(
        base.compute_ns,
        lg.total_time_ns(),
        "baseline compute = sum of TIME"
    );
}

/// Exact baseline figures (simrd's `RuntimeV1` with no budget frees constants too; the
/// budgeted runtime never frees them, hence one eviction at ratio 1.0).
#[test]
fn exact_baselines() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    let want = [
        ("lstm", 5_595_127_736u64, 769_458_833u64),
        ("resnet32", 10_061_179_152, 291_905_487),
        ("transformer", 9_864_405_000, 276_259_118),
        ("tv_densenet121", 11_020_749_360, 355_299_140),
        ("unet", 8_415_764_640, 435_278_292),
    ];
    for (model, peak, compute) in want {
        let lg = log::parse_file(&support::log_path(&dir, model)).expect("log parses");
        let base = sim::baseline(&lg).expect("baseline runs");
        assert_eq!(
            (base.peak_bytes, base.compute_ns),
            (peak, compute),
            "{model}"
        );
    }
}

/// Every shared log sweeps ratios 0.1..1.0 under every heuristic within the hard budget, and
/// the DTR family never does worse than thrashing where simrd's paper shows OK at 1.0.
#[test]
fn every_log_sweeps_under_every_heuristic() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    for model in support::LOGS {
        let lg = log::parse_file(&support::log_path(&dir, model)).expect("log parses");
        let options = SweepOptions {
            heuristics: Heuristic::ALL.to_vec(),
            ..SweepOptions::default()
        };
        let sw = sweep::sweep(&lg, &options).expect("sweeps");
        assert_eq!(sw.runs.len(), 70, "{model}");
        for r in &sw.runs {
            assert!(
                r.result.profile.peak_bytes <= r.budget_bytes,
                "{model} {} {}: peak {} over budget {}",
                r.heuristic,
                r.ratio,
                r.result.profile.peak_bytes,
                r.budget_bytes
            );
            if r.ratio == 1.0 {
                assert_eq!(r.status(), Status::Ok, "{model} {} at 1.0", r.heuristic);
                // At 1.0 the only pressure is the constants the baseline frees and the budgeted
                // runtime keeps: the DTR family pays at most a few cheap remats for it.
                if matches!(r.heuristic, Heuristic::Dtr | Heuristic::DtrEq) {
                    assert!(r.overhead.unwrap() < 1.01, "{model} {}", r.heuristic);
                }
            }
            if r.status() == Status::Ok {
                assert!(r.overhead.unwrap() >= 1.0);
                assert!(r.overhead.unwrap() <= 2.0 + 1e-9);
            }
        }
        // h_DTR^eq runs every log at 0.5 (the paper's Figure 2 curves).
        let eq_half = sw
            .runs
            .iter()
            .find(|r| r.heuristic == Heuristic::DtrEq && r.ratio == 0.5)
            .unwrap();
        assert_eq!(eq_half.status(), Status::Ok, "{model}");
    }
}

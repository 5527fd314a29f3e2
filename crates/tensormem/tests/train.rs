//! `tensormem::train`: live DTR on the demo models.
//!
//! Its own test binary (not a module of `tests/it`): it installs simulated devices with
//! `aten::sim::install`, which is process-wide.

use std::sync::{Arc, OnceLock};

use c10_cuda::{CachingAllocator, SimDevice};
use checkpoint::live::CostModel;
use tensormem::train::{self, Model, TrainOptions};

fn front() -> &'static Arc<CachingAllocator<SimDevice>> {
    static FRONT: OnceLock<Arc<CachingAllocator<SimDevice>>> = OnceLock::new();
    FRONT.get_or_init(|| aten::sim::install(8, 1 << 30).expect("install simulated devices"))
}

fn small(model: Model, device: u8) -> TrainOptions {
    let mut o = TrainOptions {
        model,
        batch: 16,
        features: 8,
        width: 12,
        layers: 3,
        seq: 4,
        classes: 5,
        steps: 2,
        cost: CostModel::Estimated,
        device,
        ..TrainOptions::default()
    };
    if model == Model::Transformer {
        o.batch = 3;
    }
    o
}

/// Central differences of the loss against the analytic gradient `(p - p') / lr`.
fn gradient_check(model: Model, device: u8) {
    let mut o = small(model, device);
    o.lr = 1.0;
    let f = front();
    let params = train::init_params(&o).unwrap();
    let loss_at = |ps: Vec<aten::Tensor>| train::step(f, &o, ps, 0, None, None, None).unwrap();
    let (_, new, _) = loss_at(params.clone());
    for (k, p) in params.iter().enumerate() {
        let values = p.to_vec::<f32>().unwrap();
        let updated = new[k].to_vec::<f32>().unwrap();
        for idx in [0, values.len() / 2, values.len() - 1] {
            let grad = f64::from(values[idx] - updated[idx]);
            let eps = 1e-3f32;
            let shifted = |delta: f32| {
                let mut v = values.clone();
                v[idx] += delta;
                let mut ps: Vec<aten::Tensor> = params.clone();
                ps[k] = aten::Tensor::from_vec(v, p.sizes()).unwrap();
                f64::from(loss_at(ps).0)
            };
            let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * f64::from(eps));
            assert!(
                (numeric - grad).abs() <= 1e-3 + 0.05 * grad.abs(),
                "{model:?} parameter {k}[{idx}]: analytic {grad}, numeric {numeric}"
            );
        }
    }
}

#[test]
fn mlp_gradients_match_finite_differences() {
    gradient_check(Model::Mlp, 0);
}

#[test]
fn transformer_gradients_match_finite_differences() {
    gradient_check(Model::Transformer, 1);
}

/// Trains without a budget, then under each ratio of the baseline's peak: the losses must be
/// bit-identical, every recomputed value equal to its first computation (the hash check is on
/// in these runs, and a mismatch is an error), and the allocator's `allocated_bytes.all.peak`
/// (reset at the start of each run) within the budget.
fn budgets_keep_losses_bit_identical(o: &TrainOptions, ratios: &[f64]) {
    let f = front();
    let baseline = train::train(f, o, None, None, None).unwrap();
    assert_eq!(baseline.losses.len(), o.steps);
    assert_eq!(baseline.evictions, 0);
    assert_eq!(baseline.remats, 0);
    let mut remats = 0;
    for &r in ratios {
        let budget = checkpoint::budget_for_ratio(baseline.peak_allocated, r);
        let run = train::train(f, o, Some(budget), None, None)
            .unwrap_or_else(|e| panic!("ratio {r}: {e}"));
        let bits = |v: &[f32]| v.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&run.losses), bits(&baseline.losses), "ratio {r}");
        assert!(
            run.peak_allocated <= budget,
            "ratio {r}: peak {} over {budget}",
            run.peak_allocated
        );
        let stats = f.memory_stats(o.device).unwrap();
        assert_eq!(stats["allocated_bytes.all.peak"] as u64, run.peak_allocated);
        assert_eq!(
            stats["allocated_bytes.all.current"], 0,
            "the run left tensors behind"
        );
        assert!(run.hashed > 0);
        assert_eq!(run.remat_checked, run.remats, "ratio {r}");
        if o.cost == CostModel::Estimated {
            assert_eq!(run.base_compute_ns, baseline.base_compute_ns, "ratio {r}");
        }
        remats += run.remats;
    }
    assert!(remats > 0, "no budget made the runtime rematerialize");
}

#[test]
fn mlp_losses_are_bit_identical_under_budgets() {
    let mut o = small(Model::Mlp, 2);
    o.batch = 64;
    o.layers = 5;
    budgets_keep_losses_bit_identical(&o, &[0.9, 0.8, 0.7]);
}

#[test]
fn transformer_losses_are_bit_identical_under_budgets() {
    let mut o = small(Model::Transformer, 3);
    o.seq = 8;
    budgets_keep_losses_bit_identical(&o, &[0.95, 0.85]);
}

#[test]
fn measured_costs_give_the_same_losses() {
    let mut o = small(Model::Mlp, 4);
    o.batch = 64;
    o.cost = CostModel::Measured;
    budgets_keep_losses_bit_identical(&o, &[0.8]);
}

#[test]
fn the_smallest_feasible_budget_runs_under_itself() {
    let mut o = small(Model::Mlp, 5);
    o.batch = 64;
    o.layers = 5;
    let f = front();
    let baseline = train::train(f, &o, None, None, None).unwrap();
    let s = train::smallest_feasible(f, &o, &baseline, 6).unwrap();
    assert_eq!(s.tries, 6);
    assert!(s.ratio < 1.0, "no budget below the baseline peak ran");
    assert_eq!(
        s.budget,
        checkpoint::budget_for_ratio(baseline.peak_allocated, s.ratio)
    );
    assert!(s.run.peak_allocated <= s.budget);
    assert!(s.run.evictions > 0);
    assert!(s.run.overhead(&baseline) >= 1.0);
    assert!(s.run.overhead(&baseline) <= o.overhead_limit);
    assert_eq!(s.run.losses, baseline.losses);
    // Half the found ratio is out of memory or thrashing.
    let limit = Some(train::remat_limit(&o, &baseline));
    let low = checkpoint::budget_for_ratio(baseline.peak_allocated, s.ratio / 2.0);
    let err = train::train(f, &o, Some(low), limit, None).unwrap_err();
    assert!(train::is_infeasible(&err), "{err}");
}

#[test]
fn a_logged_step_replays_in_the_simulator() {
    let o = small(Model::Mlp, 6);
    let f = front();
    let path = std::env::temp_dir().join(format!("train-step-{}.log", std::process::id()));
    let sink = Box::new(std::fs::File::create(&path).unwrap());
    let params = train::init_params(&o).unwrap();
    let (_, new, profile) = train::step(f, &o, params, 0, None, None, Some(sink)).unwrap();
    drop(new);
    let lg = checkpoint::log::parse_file(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let base = checkpoint::sim::baseline(&lg).unwrap();
    // The log's TIMEs are the step's own (estimated) op costs.
    assert_eq!(base.compute_ns, profile.runtime.base_compute_ns);
    assert!(base.peak_bytes > 0 && base.peak_bytes <= profile.counters.peak_allocated);
    let options = checkpoint::sim::SimOptions {
        budget: Some(checkpoint::budget_for_ratio(base.peak_bytes, 0.8)),
        ..checkpoint::sim::SimOptions::default()
    };
    let (r, _) = checkpoint::sim::run(&lg, &options, checkpoint::NullBackend).unwrap();
    assert_eq!(r.status, checkpoint::Status::Ok);
    assert!(r.profile.evictions > 0);
}

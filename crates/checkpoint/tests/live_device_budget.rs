//! Live DTR under a device-memory budget: aten tensors on a host-backed simulated device whose
//! capacity is the budget. The results are bit-identical to the unbudgeted run, every
//! recomputed value passes the hash check, reserved bytes never pass the capacity, and a
//! capacity below what the program needs is out of memory, never an overshoot.
//!
//! Its own test binary: each case installs simulated devices of its capacity
//! (`aten::sim::install` is global), one case after the other in one test.

use std::sync::Arc;

use aten::{Generator, Tensor, TensorOptions};
use c10_core::Device;
use checkpoint::live::{CostModel, LiveConfig, LiveError, LiveResult, LiveRuntime};
use checkpoint::{Config, Error, Heuristic, Strategy};

const MIB: usize = 1 << 20;

/// Ten 2 MiB activations kept for a backward-like sweep that reads each again: the result's
/// bits.
fn program(rt: &LiveRuntime) -> LiveResult<Vec<u32>> {
    let x = Tensor::randn(&[512, 1024], &mut Generator::new(3), TensorOptions::new()).unwrap();
    let x = rt.checkpoint(x.mul_scalar(0.5).unwrap())?;
    let mut acts = Vec::new();
    let mut h = x.clone();
    for _ in 0..10 {
        h = h.mul(&x)?.tanh()?;
        acts.push(h.clone());
    }
    let mut g = h.clone();
    for a in acts.iter().rev() {
        g = g.mul(a)?.add(a)?;
    }
    let out = g.sum(&[0], false)?;
    drop((acts, h, g));
    Ok(out
        .value()?
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect())
}

#[derive(Debug)]
struct Run {
    bits: Vec<u32>,
    peak_reserved: u64,
    evictions: u64,
    remats: u64,
    checked: u64,
    misses: u64,
}

fn run(capacity: usize, device_budget: bool, strategy: Strategy) -> LiveResult<Run> {
    let front = aten::sim::install(1, capacity).expect("install");
    let config = LiveConfig {
        runtime: Config {
            heuristic: Heuristic::DtrEq,
            strategy,
            ..Config::default()
        },
        check_remat: true,
        cost: CostModel::Estimated,
        device_budget,
    };
    let rt = LiveRuntime::new(Arc::clone(&front), Device::sim(0), config)?;
    let bits = program(&rt)?;
    let p = rt.profile();
    drop(rt);
    let stats = front.memory_stats(0).unwrap();
    Ok(Run {
        bits,
        peak_reserved: stats["reserved_bytes.all.peak"] as u64,
        evictions: p.runtime.evictions,
        remats: p.runtime.remats,
        checked: p.counters.remat_checked,
        misses: p.runtime.misses,
    })
}

#[test]
fn a_device_budget_runs_bit_identical_under_its_capacity() {
    let base = run(1 << 30, false, Strategy::Window).unwrap();
    assert_eq!(base.evictions, 0);
    // 2 MiB tensors come from 20 MiB segments: the unbudgeted run needs more than two.
    assert!(
        base.peak_reserved > 40 * MIB as u64,
        "{}",
        base.peak_reserved
    );
    // One 20 MiB segment (ten activations at most) and room for the small pool's 2 MiB
    // segments; 30 MiB leaves no room for a second large segment either.
    for strategy in [Strategy::Callback, Strategy::Window] {
        for capacity in [24 * MIB, 30 * MIB] {
            let r = run(capacity, true, strategy)
                .unwrap_or_else(|e| panic!("{strategy} on {capacity}: {e}"));
            assert_eq!(r.bits, base.bits, "{strategy} on {capacity}");
            assert!(
                r.peak_reserved <= capacity as u64,
                "{strategy} on {capacity}"
            );
            assert!(r.misses > 0 && r.evictions > 0, "{strategy} on {capacity}");
            assert!(r.remats > 0, "{strategy} on {capacity}");
            // Every recomputed value was hashed and compared with its first computation.
            assert_eq!(r.checked, r.remats, "{strategy} on {capacity}");
        }
    }
    // With 20 MiB the one large segment leaves nothing for the small pool's segment of the
    // final sum, and every large block left is pinned or in use.
    let e = run(20 * MIB, true, Strategy::Window).unwrap_err();
    assert!(
        matches!(e, LiveError::Runtime(Error::OutOfMemory { budget, .. }) if budget == 20 * MIB as u64),
        "{e}"
    );
    // A byte budget and a device budget at once are refused.
    let front = aten::sim::install(1, 64 * MIB).unwrap();
    let config = LiveConfig {
        runtime: Config {
            budget: Some(1 << 20),
            ..Config::default()
        },
        device_budget: true,
        ..LiveConfig::default()
    };
    let e = LiveRuntime::new(front, Device::sim(0), config).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a device-memory budget is the device's capacity: set no byte budget with it"
    );
}

//! Live DTR on aten tensors over the host-backed simulated device: the hard budget on the
//! caching allocator's allocated bytes, bit-identical rematerialization (the hash check),
//! constants and pins, eager eviction and banishing, multi-output calls, copy-on-write with
//! the aliased-mutation refusal, loud failures, and a written log that replays in the
//! simulator.
//!
//! Its own test binary (not a module of `tests/it`): `aten::sim::install` is process-wide. One
//! install of 16 simulated devices for the whole binary (tests run in parallel); each test
//! owns one device index, so the allocator statistics it reads are its own.

use std::sync::{Arc, Mutex, OnceLock};

use aten::{Generator, Reduction, Tensor, TensorOptions};
use c10_core::ScalarType;
use c10_cuda::{CachingAllocator, SimDevice};
use checkpoint::live::{
    CheckpointTensor, CostModel, LiveConfig, LiveError, LiveResult, LiveRuntime, OutputMeta,
};
use checkpoint::{Config, Error, Heuristic, ReleasePolicy, StorageState, log, sim};

const MIB: usize = 1 << 20;

fn front() -> &'static Arc<CachingAllocator<SimDevice>> {
    static FRONT: OnceLock<Arc<CachingAllocator<SimDevice>>> = OnceLock::new();
    FRONT.get_or_init(|| aten::sim::install(16, 256 * MIB).expect("install simulated devices"))
}

fn config(budget: Option<u64>) -> LiveConfig {
    LiveConfig {
        runtime: Config {
            budget,
            heuristic: Heuristic::DtrEq,
            ..Config::default()
        },
        check_remat: true,
        cost: CostModel::Estimated,
        device_budget: false,
    }
}

fn runtime(device: u8, config: LiveConfig) -> LiveRuntime {
    let f = front();
    f.reset_peak_stats(device).unwrap();
    LiveRuntime::new(Arc::clone(f), c10_core::Device::sim(device), config).unwrap()
}

fn stat(device: u8, key: &str) -> u64 {
    front().memory_stats(device).unwrap()[key] as u64
}

fn randn(shape: &[i64], seed: u64) -> Tensor {
    Tensor::randn(shape, &mut Generator::new(seed), TensorOptions::new()).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// A deep chain with a backward-like sweep that needs every activation again, so a tight
/// budget forces evictions and rematerializations. Returns the bits of the result.
fn chain(rt: &LiveRuntime, depth: usize) -> LiveResult<Vec<u32>> {
    let x = rt.checkpoint(randn(&[32, 64], 1))?;
    let w = rt.checkpoint(randn(&[64, 64], 2).mul_scalar(0.125).unwrap())?;
    let wt = w.t()?;
    let mut acts: Vec<CheckpointTensor<'_>> = Vec::new();
    let mut h = x.clone();
    for _ in 0..depth {
        h = h.mm(&w)?.tanh()?;
        acts.push(h.clone());
    }
    let mut g = h.clone();
    for a in acts.iter().rev() {
        g = g.mul(a)?.mm(&wt)?;
    }
    let out = g.sum(&[0], false)?;
    drop((acts, h, g));
    Ok(bits(&out.value()?))
}

#[test]
fn budgeted_chain_is_bit_identical_and_stays_under_the_budget() {
    let dev = 0;
    let rt = runtime(dev, config(None));
    let expected = chain(&rt, 12).unwrap();
    let unbudgeted_peak = rt.profile().counters.peak_allocated;
    assert_eq!(rt.eviction_count(), 0);
    drop(rt);
    assert!(unbudgeted_peak > 0);
    let mut remats = 0;
    for ratio in [0.9, 0.6, 0.45] {
        let budget = (unbudgeted_peak as f64 * ratio) as u64;
        let rt = runtime(dev, config(Some(budget)));
        let got = chain(&rt, 12).unwrap_or_else(|e| panic!("ratio {ratio}: {e}"));
        assert_eq!(got, expected, "ratio {ratio}");
        let p = rt.profile();
        assert!(p.runtime.evictions > 0, "ratio {ratio}: no eviction");
        assert!(p.counters.peak_allocated <= budget);
        // Every recomputed value was hashed and compared with its first computation.
        assert_eq!(p.counters.remat_checked, p.runtime.remats);
        remats += p.runtime.remats;
        drop(rt);
        assert!(
            stat(dev, "allocated_bytes.all.peak") <= budget,
            "ratio {ratio}: allocator peak {} over {budget}",
            stat(dev, "allocated_bytes.all.peak")
        );
    }
    assert!(remats > 0, "no rematerialization at any budget");
}

#[test]
fn too_small_a_budget_is_out_of_memory_never_an_overshoot() {
    let dev = 1;
    let rt = runtime(dev, config(Some(40 * 1024)));
    let err = chain(&rt, 6).unwrap_err();
    assert!(
        matches!(err, LiveError::Runtime(Error::OutOfMemory { .. })),
        "{err}"
    );
    drop(rt);
    assert!(stat(dev, "allocated_bytes.all.peak") <= 40 * 1024);
}

#[test]
fn constants_and_pinned_tensors_are_never_evicted() {
    let dev = 2;
    let rt = runtime(dev, config(None));
    let x = rt.checkpoint(randn(&[64, 64], 3)).unwrap(); // 16 KiB
    let a = x.relu().unwrap();
    let b = a.exp().unwrap();
    b.pin().unwrap();
    let budget = stat(dev, "allocated_bytes.all.current");
    rt.set_memory_budget(budget).unwrap();
    let mut keep = Vec::new();
    for _ in 0..6 {
        keep.push(b.tanh().unwrap()); // evicts `a` first, then each time the previous one
        assert_eq!(a.storage_state(), StorageState::Evicted);
        assert_eq!(x.storage_state(), StorageState::Material);
        assert_eq!(b.storage_state(), StorageState::Material);
    }
    // Nothing evictable left but constants, pins and the locked input: out of memory.
    let err = b.mm(&x).and_then(|y| y.mm(&x)).unwrap_err();
    assert!(
        matches!(err, LiveError::Runtime(Error::OutOfMemory { .. })),
        "{err}"
    );
    assert_eq!(x.storage_state(), StorageState::Material);
    assert_eq!(b.storage_state(), StorageState::Material);
    assert!(stat(dev, "allocated_bytes.all.peak") <= budget);
}

#[test]
fn the_last_drop_evicts_at_once() {
    let dev = 3;
    let rt = runtime(dev, config(None));
    let x = rt.checkpoint(randn(&[256, 256], 4)).unwrap(); // 256 KiB
    let base = stat(dev, "allocated_bytes.all.current");
    let y = x.relu().unwrap();
    let view = y.t().unwrap();
    assert_eq!(stat(dev, "allocated_bytes.all.current"), base + 256 * 1024);
    drop(y);
    // The view still holds the alias pool.
    assert_eq!(view.storage_state(), StorageState::Material);
    drop(view);
    assert_eq!(stat(dev, "allocated_bytes.all.current"), base);
    let p = rt.profile();
    assert_eq!(p.runtime.eager_evictions, 1);
    assert_eq!(p.runtime.evictions, 0);
}

#[test]
fn banishing_frees_for_good() {
    let dev = 4;
    let mut cfg = config(None);
    cfg.runtime.release = ReleasePolicy::Banish;
    let rt = runtime(dev, cfg);
    let x = rt.checkpoint(randn(&[64, 64], 5)).unwrap();
    let base = stat(dev, "allocated_bytes.all.current");
    let y = x.relu().unwrap();
    let z = y.exp().unwrap();
    drop(y); // z depends on it only while z is undefined: z is defined, so y goes for good
    assert_eq!(stat(dev, "allocated_bytes.all.current"), base + 16 * 1024);
    assert!(rt.profile().runtime.banished >= 1);
    assert!(z.is_defined());
    drop(z);
    assert_eq!(stat(dev, "allocated_bytes.all.current"), base);
}

#[test]
fn a_multi_output_call_is_rematerialized_together() {
    let dev = 5;
    let rt = runtime(dev, config(None));
    let x = rt.checkpoint(randn(&[128, 64], 6)).unwrap();
    let (values, indices) = x.max_dim(1, false).unwrap();
    let (v0, i0) = (
        bits(&values.value().unwrap()),
        indices.value().unwrap().to_vec::<i64>().unwrap(),
    );
    // Evict both (one storage each, 512 + 1024 bytes) by squeezing the budget to the
    // constant, then lift it.
    rt.set_memory_budget(stat(dev, "allocated_bytes.all.current") - 1536)
        .unwrap();
    assert!(!values.is_defined() && !indices.is_defined());
    rt.unset_memory_budget();
    // Asking for one output reruns the call once and brings both back.
    assert_eq!(indices.value().unwrap().to_vec::<i64>().unwrap(), i0);
    assert!(values.is_defined());
    assert_eq!(rt.remat_count(), 1);
    assert_eq!(bits(&values.value().unwrap()), v0);
    assert_eq!(rt.profile().counters.remat_checked, 2);
}

#[test]
fn mutation_is_copy_on_write_and_refused_with_a_live_alias() {
    let dev = 6;
    let rt = runtime(dev, config(None));
    let x = rt.checkpoint(randn(&[16, 16], 7)).unwrap();
    let one = rt
        .checkpoint(Tensor::ones(&[16, 16], TensorOptions::new()).unwrap())
        .unwrap();
    let y = x.relu().unwrap();
    let before = bits(&y.value().unwrap());
    let dependent = y.exp().unwrap();
    let dependent_bits = bits(&dependent.value().unwrap());
    let view = y.t().unwrap();
    let alias = y.clone(); // the same handle: not another tensor
    let err = y.add_(&one).unwrap_err();
    assert!(
        matches!(
            err,
            LiveError::Runtime(Error::AliasedMutation {
                live_aliases: 1,
                ..
            })
        ),
        "{err}"
    );
    drop(view);
    let old = y.id();
    y.add_(&one).unwrap();
    assert_ne!(y.id(), old);
    assert_eq!(alias.id(), y.id(), "handle copies see the update");
    let after = y.value().unwrap().to_vec::<f32>().unwrap();
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(*a, f32::from_bits(*b) + 1.0);
    }
    // The old version lost its last reference (evicted at once); evict the dependent and the
    // new version too: the dependent is recomputed from the old version, recomputed from `x`.
    rt.set_memory_budget(stat(dev, "allocated_bytes.all.current") - 2048)
        .unwrap();
    assert!(!dependent.is_defined() && !y.is_defined());
    rt.unset_memory_budget();
    assert_eq!(bits(&dependent.value().unwrap()), dependent_bits);
    assert_eq!(rt.remat_count(), 2);
}

#[test]
fn the_hash_check_catches_a_nondeterministic_rematerialization() {
    let dev = 7;
    let rt = runtime(dev, config(None));
    let x = rt.checkpoint(randn(&[64, 64], 8)).unwrap();
    let calls = Arc::new(Mutex::new(0.0f64));
    let c = Arc::clone(&calls);
    let meta = OutputMeta::fresh(&[64, 64], ScalarType::Float);
    let y = rt
        .call("drifting", &[&x], &[meta], 1, move |i| {
            let mut n = c.lock().unwrap();
            *n += 1.0;
            Ok(vec![i[0].add_scalar(*n)?])
        })
        .unwrap()
        .pop()
        .unwrap();
    rt.set_memory_budget(stat(dev, "allocated_bytes.all.current") - 512)
        .unwrap();
    assert!(!y.is_defined());
    rt.unset_memory_budget();
    let err = y.value().unwrap_err();
    assert!(matches!(err, LiveError::RematMismatch { .. }), "{err}");
}

#[test]
fn a_closure_that_allocates_more_than_declared_fails_loudly() {
    let dev = 8;
    let rt = runtime(dev, config(None));
    let x = rt.checkpoint(randn(&[128, 128], 9)).unwrap(); // 64 KiB
    let budget = stat(dev, "allocated_bytes.all.current") + 64 * 1024;
    rt.set_memory_budget(budget).unwrap();
    let meta = OutputMeta::fresh(&[128, 128], ScalarType::Float);
    // exp then relu: a 64 KiB temporary nobody made room for.
    let err = rt
        .call("two kernels", &[&x], &[meta], 1, |i| {
            Ok(vec![i[0].exp()?.relu()?])
        })
        .unwrap_err();
    assert!(matches!(err, LiveError::BudgetExceeded { .. }), "{err}");
}

#[test]
fn a_closure_returning_something_else_than_declared_is_an_error() {
    let dev = 9;
    let rt = runtime(dev, config(None));
    let x = rt.checkpoint(randn(&[8, 4], 10)).unwrap();
    let wrong_shape = OutputMeta::fresh(&[4, 8], ScalarType::Float);
    let err = rt
        .call("relu", &[&x], &[wrong_shape], 1, |i| Ok(vec![i[0].relu()?]))
        .unwrap_err();
    assert!(matches!(err, LiveError::OutputMismatch { .. }), "{err}");
    let not_a_view = OutputMeta::view_of(0, &[8, 4], ScalarType::Float);
    let err = rt
        .call("relu", &[&x], &[not_a_view], 1, |i| Ok(vec![i[0].relu()?]))
        .unwrap_err();
    assert!(matches!(err, LiveError::OutputMismatch { .. }), "{err}");
    let err = x.mm(&x).unwrap_err();
    assert!(matches!(err, LiveError::InvalidArgument(_)), "{err}");
    // A handle of another runtime.
    let other = runtime(10, config(None));
    let z = other.checkpoint(randn(&[4, 8], 11)).unwrap();
    assert!(!rt.is_checkpoint(&z) && other.is_checkpoint(&z));
    let err = x.mm(&z).unwrap_err();
    assert!(matches!(err, LiveError::ForeignTensor { .. }), "{err}");
}

#[test]
fn the_prototype_api_and_counters() {
    let dev = 11;
    let rt = runtime(dev, config(None));
    rt.toggle_sampling(true);
    rt.toggle_ignore_small_tensors(true);
    assert!(rt.with_runtime(|r| r.config().sampling && r.config().ignore_small_tensors));
    let x = rt.checkpoint(randn(&[32, 32], 12)).unwrap();
    let y = x.mm(&x).unwrap().relu().unwrap();
    let plain = y.decheckpoint().unwrap();
    assert_eq!(plain.sizes(), &[32, 32]);
    assert_eq!(rt.base_compute_time(), 2 * 32 * 32 * 32 + 32 * 32);
    assert_eq!(rt.remat_compute_time(), 0);
    rt.set_memory_budget(1).unwrap_err(); // only pinned storages are left
    rt.unset_memory_budget();
    assert_eq!(rt.memory_budget(), None);
    assert_eq!(y.storage_state(), StorageState::Material);
}

#[test]
fn a_written_log_replays_in_the_simulator() {
    let dev = 12;
    let rt = runtime(dev, config(None));
    let path = std::env::temp_dir().join(format!("live-log-{}.log", std::process::id()));
    rt.new_log(Box::new(std::fs::File::create(&path).unwrap()));
    rt.annotate_log("START").unwrap();
    let got = chain(&rt, 8).unwrap();
    let one = rt
        .checkpoint(Tensor::ones(&[32, 64], TensorOptions::new()).unwrap())
        .unwrap();
    let h = rt.checkpoint(randn(&[32, 64], 13)).unwrap().relu().unwrap();
    h.add_(&one).unwrap();
    let copy = h.shallow_copy().unwrap();
    drop((h, copy, one));
    rt.close_log().unwrap();
    assert!(!got.is_empty());
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    for kind in ["CONSTANT", "CALL", "MUTATE", "COPY", "RELEASE", "ALIAS"] {
        assert!(
            text.contains(&format!("\"{kind}\"")),
            "no {kind} in the log"
        );
    }
    let lg = log::parse(&text).unwrap();
    let base = sim::baseline(&lg).unwrap();
    assert!(base.peak_bytes > 0);
    assert_eq!(base.compute_ns, rt.base_compute_time());
    let options = sim::SimOptions {
        budget: Some(base.peak_bytes / 2),
        ..sim::SimOptions::default()
    };
    let (r, _) = sim::run(&lg, &options, checkpoint::NullBackend).unwrap();
    assert_eq!(r.status, sim::Status::Ok);
    assert!(r.profile.peak_bytes <= base.peak_bytes / 2);
}

#[test]
fn nll_loss_and_reductions_through_the_runtime() {
    let dev = 13;
    let rt = runtime(dev, config(None));
    let logits = rt.checkpoint(randn(&[8, 5], 14)).unwrap();
    let target = rt
        .checkpoint(Tensor::from_vec(vec![0i64, 1, 2, 3, 4, 0, 1, 2], &[8]).unwrap())
        .unwrap();
    let loss = logits
        .log_softmax(1)
        .unwrap()
        .nll_loss(&target, Reduction::Mean)
        .unwrap();
    let direct = randn(&[8, 5], 14)
        .cross_entropy(
            &Tensor::from_vec(vec![0i64, 1, 2, 3, 4, 0, 1, 2], &[8]).unwrap(),
            Reduction::Mean,
        )
        .unwrap();
    assert_eq!(bits(&loss.value().unwrap()), bits(&direct));
    let s = logits.sum(&[-1], true).unwrap();
    assert_eq!(s.shape(), vec![8, 1]);
    let m = logits.mean(&[], false).unwrap();
    assert_eq!(m.shape(), Vec::<i64>::new());
    let v = logits
        .view(&[-1])
        .unwrap()
        .unsqueeze(0)
        .unwrap()
        .expand(&[3, -1])
        .unwrap();
    assert_eq!(v.shape(), vec![3, 40]);
    assert_eq!(v.value().unwrap().sizes(), &[3, 40]);
}

/// Large-pool blocks (above 1 MiB) may be handed out unsplit with up to 1 MiB more than asked:
/// the budget charges that up front, so the allocator's peak still stays under it.
#[test]
fn large_blocks_stay_under_the_budget() {
    let dev = 14;
    let program = |rt: &LiveRuntime| -> LiveResult<Vec<u32>> {
        let x = rt.checkpoint(randn(&[600, 1000], 15))?; // 2.4 MB: a large block
        let mut acts = Vec::new();
        let mut h = x.clone();
        for _ in 0..6 {
            h = h.tanh()?;
            acts.push(h.clone());
        }
        let mut g = h.clone();
        for a in acts.iter().rev() {
            g = g.mul(a)?;
        }
        drop((acts, h));
        Ok(bits(&g.sum(&[], false)?.value()?))
    };
    let rt = runtime(dev, config(None));
    let expected = program(&rt).unwrap();
    let peak = rt.profile().counters.peak_allocated;
    drop(rt);
    let budget = peak * 6 / 10;
    let rt = runtime(dev, config(Some(budget)));
    assert_eq!(program(&rt).unwrap(), expected);
    assert!(rt.remat_count() > 0);
    drop(rt);
    assert!(stat(dev, "allocated_bytes.all.peak") <= budget);
}

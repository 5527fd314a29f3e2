//! The runtime core's rules, checked through a live-like backend that computes real values:
//! hard budget, locks, pins, constants, alias pools, multi-output rematerialization, eager
//! eviction and banishing, copy-on-write, the prototype's API, and random programs under every
//! heuristic whose rematerialized values must equal the originals.

use checkpoint::backend::{Backend, RunRequest};
use checkpoint::{
    BoxError, Config, Error, Heuristic, OpSpec, OutputSpec, ReleasePolicy, Runtime, StorageId,
    StorageState, TensorId,
};
use proptest::prelude::*;

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stand-in for the live driver: every tensor has a value computed from its op and its
/// inputs' values; evicting a storage drops its tensors' values; a run with an input not in
/// memory, a recomputed value that differs from the first one, or bytes above the budget is
/// an error.
#[derive(Default)]
struct ValueBackend {
    values: Vec<Option<u64>>,
    truth: Vec<Option<u64>>,
    members: Vec<Vec<TensorId>>,
    live_bytes: u64,
    peak_bytes: u64,
    budget: Option<u64>,
    runs: u64,
    duplicate_runs: u64,
}

impl ValueBackend {
    fn with_budget(budget: Option<u64>) -> Self {
        ValueBackend {
            budget,
            ..Self::default()
        }
    }

    fn charge(&mut self, bytes: u64) -> Result<(), BoxError> {
        self.live_bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
        match self.budget {
            Some(b) if self.live_bytes > b => {
                Err(format!("{} bytes live over the budget {b}", self.live_bytes).into())
            }
            _ => Ok(()),
        }
    }

    fn value(&self, t: TensorId) -> Option<u64> {
        self.values.get(t.index()).copied().flatten()
    }
}

impl Backend for ValueBackend {
    fn allocate(&mut self, _storage: StorageId, bytes: u64) -> Result<(), BoxError> {
        self.charge(bytes)
    }

    fn free(&mut self, storage: StorageId, bytes: u64) -> Result<(), BoxError> {
        self.live_bytes -= bytes;
        if let Some(ts) = self.members.get(storage.index()) {
            for t in ts {
                self.values[t.index()] = None;
            }
        }
        Ok(())
    }

    fn run(&mut self, r: RunRequest<'_>) -> Result<u64, BoxError> {
        self.runs += 1;
        let mut h = mix(r.op.0 as u64, 17);
        for &a in r.args {
            let v = self
                .value(a)
                .ok_or_else(|| format!("op {} ran with input {a} not in memory", r.op))?;
            h = mix(h, v);
        }
        if r.duplicate_bytes > 0 {
            self.duplicate_runs += 1;
            self.charge(r.duplicate_bytes)?;
            self.live_bytes -= r.duplicate_bytes;
        }
        for (k, (&t, &s)) in r.outputs.iter().zip(r.output_storages).enumerate() {
            let v = mix(h, k as u64);
            let i = t.index();
            if self.values.len() <= i {
                self.values.resize(i + 1, None);
                self.truth.resize(i + 1, None);
            }
            if self.members.len() <= s.index() {
                self.members.resize(s.index() + 1, Vec::new());
            }
            if !self.members[s.index()].contains(&t) {
                self.members[s.index()].push(t);
            }
            match self.truth[i] {
                None => self.truth[i] = Some(v),
                Some(want) if want != v => {
                    return Err(format!("tensor {t} recomputed as {v:#x}, was {want:#x}").into());
                }
                Some(_) => {}
            }
            self.values[i] = Some(v);
        }
        Ok(r.known_cost)
    }
}

fn runtime(budget: Option<u64>, heuristic: Heuristic) -> Runtime<ValueBackend> {
    Runtime::new(
        ValueBackend::with_budget(budget),
        Config {
            budget,
            heuristic,
            ..Config::default()
        },
    )
}

fn call(rt: &mut Runtime<ValueBackend>, cost: u64, args: &[TensorId], bytes: u64) -> TensorId {
    rt.compute(OpSpec {
        cost,
        args,
        outputs: &[OutputSpec::fresh(bytes)],
    })
    .expect("call runs")
    .get(0)
}

#[test]
fn constants_and_pins_are_never_evicted_and_oom_names_the_figures() {
    let mut rt = runtime(Some(300), Heuristic::DtrEq);
    let c = rt.checkpoint(100).unwrap();
    let a = call(&mut rt, 10, &[c], 100);
    rt.pin(a).unwrap();
    // 100 (c) + 100 (a, pinned) + 100 fits; the next needs an eviction of b.
    let b = call(&mut rt, 10, &[a], 100);
    let d = call(&mut rt, 10, &[a], 100);
    assert!(!rt.is_defined(b).unwrap(), "b was the only candidate");
    assert!(rt.is_defined(c).unwrap() && rt.is_defined(a).unwrap());
    // d is locked as the input of the next call, c and a are pinned: nothing is left.
    let err = rt
        .compute(OpSpec {
            cost: 10,
            args: &[d],
            outputs: &[OutputSpec::fresh(100)],
        })
        .unwrap_err();
    match err {
        Error::OutOfMemory {
            requested,
            used,
            budget,
        } => assert_eq!((requested, used, budget), (100, 300, 300)),
        other => panic!("expected OOM, got {other}"),
    }
    // The failed call released its locks: d is a candidate again.
    assert_eq!(rt.pool_len(), 1);
    assert_eq!(rt.profile().peak_bytes, 300);
}

#[test]
fn inputs_of_the_running_call_are_locked() {
    let mut rt = runtime(Some(250), Heuristic::Lru);
    let c = rt.checkpoint(50).unwrap();
    let x = call(&mut rt, 10, &[c], 100);
    // Needs 100 more: only x could go, and x is the call's input.
    let r = rt.compute(OpSpec {
        cost: 10,
        args: &[x],
        outputs: &[OutputSpec::fresh(101)],
    });
    assert!(matches!(r, Err(Error::OutOfMemory { .. })));
    assert!(rt.is_defined(x).unwrap());
}

#[test]
fn views_share_their_storage_and_are_recomputed_after_it() {
    let mut rt = runtime(None, Heuristic::DtrEq);
    let c = rt.checkpoint(10).unwrap();
    let base = call(&mut rt, 100, &[c], 1000);
    let view = rt
        .compute(OpSpec {
            cost: 1,
            args: &[base],
            outputs: &[OutputSpec::alias_of(0)],
        })
        .unwrap()
        .get(0);
    assert!(rt.is_alias(view).unwrap());
    assert_eq!(rt.storage_of(view).unwrap(), rt.storage_of(base).unwrap());
    assert_eq!(rt.memory_bytes(), 1010, "a view allocates nothing");
    // Dropping the base keeps the pool alive (the view holds it).
    rt.release(base).unwrap();
    assert!(rt.is_defined(view).unwrap());
    // Squeeze: the pool (base + view) is the only candidate.
    rt.set_memory_budget(500).unwrap();
    assert!(!rt.is_defined(view).unwrap() && !rt.is_defined(base).unwrap());
    assert_eq!(rt.memory_bytes(), 10);
    rt.unset_memory_budget();
    let s = rt.uncheckpoint(view).unwrap();
    assert_eq!(rt.storage_state(s), Some(StorageState::Material));
    // The base's op, then the view's op.
    assert_eq!(rt.remat_count(), 2);
    assert_eq!(rt.remat_compute_time(), 101);
    assert!(!rt.is_defined(base).unwrap() || rt.is_defined(base).unwrap());
}

#[test]
fn multi_output_calls_rematerialize_together() {
    let mut rt = runtime(None, Heuristic::DtrEq);
    let c = rt.checkpoint(8).unwrap();
    let outs = rt
        .compute(OpSpec {
            cost: 50,
            args: &[c],
            outputs: &[OutputSpec::fresh(60), OutputSpec::fresh(100)],
        })
        .unwrap();
    let (a, b) = (outs.get(0), outs.get(1));
    rt.set_memory_budget(8).unwrap(); // evicts both pools
    assert!(!rt.is_defined(a).unwrap() && !rt.is_defined(b).unwrap());
    assert_eq!(rt.eviction_count(), 2);
    rt.unset_memory_budget();
    rt.rematerialize(b).unwrap();
    assert!(rt.is_defined(a).unwrap(), "the sibling came back with it");
    assert_eq!(rt.remat_count(), 1);
    assert_eq!(rt.memory_bytes(), 168);
    // Now a is in memory and b is evicted (same cost and staleness, b larger): recomputing b
    // computes a again, discarded.
    rt.set_memory_budget(108).unwrap();
    assert!(rt.is_defined(a).unwrap() && !rt.is_defined(b).unwrap());
    rt.set_memory_budget(1000).unwrap();
    rt.rematerialize(b).unwrap();
    assert_eq!(rt.backend().duplicate_runs, 1);
    assert_eq!(rt.memory_bytes(), 168);
    assert_eq!(
        rt.profile().peak_bytes,
        228,
        "the duplicate counts while the op runs"
    );
}

#[test]
fn release_policies() {
    for (policy, evicted, banished) in [
        (ReleasePolicy::Eager, 1, 0),
        (ReleasePolicy::Banish, 0, 2),
        (ReleasePolicy::Keep, 0, 0),
    ] {
        let mut rt = Runtime::new(
            ValueBackend::default(),
            Config {
                release: policy,
                ..Config::default()
            },
        );
        let c = rt.checkpoint(10).unwrap();
        let x = call(&mut rt, 5, &[c], 100);
        let y = call(&mut rt, 5, &[x], 100);
        rt.release(x).unwrap();
        rt.release(c).unwrap();
        let p = rt.profile();
        assert_eq!(p.eager_evictions, evicted, "{policy:?}");
        assert_eq!(p.banished, banished, "{policy:?}");
        match policy {
            // x is evicted but stays recomputable; the constant stays.
            ReleasePolicy::Eager => assert_eq!(rt.memory_bytes(), 110),
            // x and the constant are gone for good; y, no longer recomputable, is pinned.
            ReleasePolicy::Banish => {
                assert_eq!(rt.memory_bytes(), 100);
                let s = rt.storage_of(x).unwrap();
                assert_eq!(rt.storage_state(s), Some(StorageState::Banished));
                assert_eq!(rt.pool_len(), 0, "y is pinned");
            }
            ReleasePolicy::Keep => assert_eq!(rt.memory_bytes(), 210),
        }
        assert!(rt.is_defined(y).unwrap());
    }
}

#[test]
fn mutation_is_copy_on_write_and_refuses_live_aliases() {
    let mut rt = runtime(None, Heuristic::DtrEq);
    let c = rt.checkpoint(10).unwrap();
    let x = call(&mut rt, 5, &[c], 100);
    let view = rt
        .compute(OpSpec {
            cost: 1,
            args: &[x],
            outputs: &[OutputSpec::alias_of(0)],
        })
        .unwrap()
        .get(0);
    let err = rt.mutate(7, &[x, c], &[0]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::AliasedMutation {
                live_aliases: 1,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "cannot mutate tensor {x}: its storage {} has 1 other live alias(es)",
            rt.storage_of(x).unwrap()
        )
    );
    rt.release(view).unwrap();
    let new = rt.mutate(7, &[x, c], &[0]).unwrap().get(0);
    assert_ne!(rt.storage_of(new).unwrap(), rt.storage_of(x).unwrap());
    assert_eq!(rt.storage_bytes(rt.storage_of(new).unwrap()), Some(100));
    // The handle moved: the old version was released (and eagerly evicted).
    assert_eq!(rt.ext_refs(x).unwrap(), 0);
    assert!(!rt.is_defined(x).unwrap());
    assert_eq!(rt.memory_bytes(), 110);
    // The new version depends on the old one: rematerializing it recomputes both.
    rt.set_memory_budget(10).unwrap();
    rt.unset_memory_budget();
    rt.rematerialize(new).unwrap();
    assert_eq!(rt.remat_count(), 2);
}

#[test]
fn rematerialization_limit_stops_with_thrashing() {
    let mut rt = Runtime::new(
        ValueBackend::default(),
        Config {
            remat_limit_ns: Some(15),
            ..Config::default()
        },
    );
    let c = rt.checkpoint(1).unwrap();
    let a = call(&mut rt, 10, &[c], 10);
    let b = call(&mut rt, 10, &[a], 10);
    rt.set_memory_budget(1).unwrap();
    rt.unset_memory_budget();
    let err = rt.rematerialize(b).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Thrashing {
                remat_ns: 20,
                limit_ns: 15
            }
        ),
        "{err}"
    );
}

#[test]
fn prototype_api() {
    let mut rt = runtime(None, Heuristic::DtrEq);
    let x = rt.checkpoint(64).unwrap();
    assert!(rt.is_checkpoint(x));
    assert!(!rt.is_checkpoint(TensorId(99)));
    assert_eq!(rt.decheckpoint(TensorId(99)).unwrap(), None);
    assert!(matches!(
        rt.uncheckpoint(TensorId(99)),
        Err(Error::UnknownTensor(TensorId(99)))
    ));
    let y = call(&mut rt, 40, &[x], 64);
    rt.toggle_sampling(true);
    rt.toggle_ignore_small_tensors(true);
    assert!(rt.config().sampling && rt.config().ignore_small_tensors);
    rt.toggle_sampling(false);
    rt.toggle_ignore_small_tensors(false);
    rt.set_memory_budget(64).unwrap();
    assert!(!rt.is_defined(y).unwrap());
    rt.set_memory_budget(128).unwrap();
    assert_eq!(rt.decheckpoint(y).unwrap(), Some(rt.storage_of(y).unwrap()));
    assert_eq!(rt.base_compute_time(), 40);
    assert_eq!(rt.remat_compute_time(), 40);
    assert_eq!((rt.eviction_count(), rt.remat_count()), (1, 1));
    assert!(rt.search_time() > 0);
    rt.clear_checkpointpool();
    assert_eq!(rt.pool_len(), 0);
    rt.reset_profile();
    assert_eq!(rt.profile().remats, 0);
    assert_eq!(rt.profile().peak_bytes, 128);
    let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    rt.annotate_log("START").unwrap(); // no log yet: nothing happens
    rt.new_log(Box::new(Shared(buf.clone())));
    rt.annotate_log("START").unwrap();
    rt.log_mut().unwrap().constant("x1", 64).unwrap();
    assert_eq!(
        String::from_utf8(buf.lock().unwrap().clone()).unwrap(),
        "{\"ANNOTATION\":\"START\",\"INSTRUCTION\":\"ANNOTATE\"}\n\
         {\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"x1\"}\n\
         {\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"64\",\"NAME\":\"x1\"}\n"
    );
}

#[test]
fn malformed_calls_are_refused_before_recording() {
    let mut rt = runtime(None, Heuristic::DtrEq);
    let c = rt.checkpoint(1).unwrap();
    let bad_alias = rt.compute(OpSpec {
        cost: 1,
        args: &[c],
        outputs: &[OutputSpec::alias_of(1)],
    });
    assert!(matches!(
        bad_alias,
        Err(Error::BadAlias {
            output: 0,
            index: 1,
            args: 1
        })
    ));
    let unknown = rt.compute(OpSpec {
        cost: 1,
        args: &[TensorId(7)],
        outputs: &[OutputSpec::fresh(1)],
    });
    assert!(matches!(unknown, Err(Error::UnknownTensor(TensorId(7)))));
    assert!(matches!(
        rt.compute(OpSpec {
            cost: 1,
            args: &[c],
            outputs: &[]
        }),
        Err(Error::NoOutputs)
    ));
    assert_eq!(rt.tensor_count(), 1);
    assert!(matches!(rt.release(c), Ok(())));
    assert!(matches!(rt.release(c), Err(Error::NoReference(_))));
    assert!(matches!(rt.get(c), Err(Error::NoReference(_))));
}

#[test]
fn sampling_scans_about_sqrt_n_candidates() {
    let mut rt = runtime(None, Heuristic::DtrEq);
    let c = rt.checkpoint(1).unwrap();
    for _ in 0..100 {
        call(&mut rt, 10, &[c], 10);
    }
    assert_eq!(rt.pool_len(), 100);
    rt.toggle_sampling(true);
    rt.set_memory_budget(1 + 99 * 10).unwrap();
    assert_eq!(rt.profile().evaluations, 10, "ceil(sqrt(100)) candidates");
    rt.toggle_sampling(false);
    rt.set_memory_budget(1 + 98 * 10).unwrap();
    assert_eq!(rt.profile().evaluations, 10 + 99, "the whole pool");
}

#[test]
fn small_tensors_are_skipped_in_the_search() {
    for ignore in [true, false] {
        let mut rt = runtime(None, Heuristic::Lru);
        rt.toggle_ignore_small_tensors(ignore);
        let c = rt.checkpoint(1).unwrap();
        // The small ones are the least recently used: LRU would take them first.
        let small: Vec<TensorId> = (0..10).map(|_| call(&mut rt, 10, &[c], 2)).collect();
        let _big: Vec<TensorId> = (0..10).map(|_| call(&mut rt, 10, &[c], 1000)).collect();
        rt.set_memory_budget(1 + 20 + 9000).unwrap();
        let evicted_small = small
            .iter()
            .filter(|&&t| !rt.is_defined(t).unwrap())
            .count();
        // The average fresh storage is ~500 bytes: 2-byte storages are under 1% of it.
        assert_eq!(
            evicted_small,
            if ignore { 0 } else { 10 },
            "ignore = {ignore}"
        );
    }
}

#[test]
fn evict_one_is_a_free_memory_callback() {
    let mut rt = runtime(None, Heuristic::DtrEq);
    let c = rt.checkpoint(1).unwrap();
    let x = call(&mut rt, 10, &[c], 10);
    assert!(rt.evict_one().unwrap());
    assert!(!rt.is_defined(x).unwrap());
    assert!(!rt.evict_one().unwrap(), "only the pinned constant is left");
    assert_eq!(rt.used_bytes(), 1);
}

/// A random program step (indices are taken modulo the live handles).
#[derive(Clone, Debug)]
enum Step {
    Constant(u64),
    Call {
        args: Vec<usize>,
        outputs: Vec<(u64, bool)>,
        cost: u64,
    },
    Mutate(usize, usize, u64),
    Copy(usize),
    Release(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (1u64..200).prop_map(Step::Constant),
        6 => (
            proptest::collection::vec(0usize..64, 1..4),
            proptest::collection::vec((0u64..300, proptest::bool::weighted(0.2)), 1..4),
            1u64..1000
        )
            .prop_map(|(args, outputs, cost)| Step::Call { args, outputs, cost }),
        1 => (0usize..64, 0usize..64, 1u64..500).prop_map(|(a, b, c)| Step::Mutate(a, b, c)),
        1 => (0usize..64).prop_map(Step::Copy),
        3 => (0usize..64).prop_map(Step::Release),
    ]
}

/// Runs `steps`, then reads every live handle back. `Err` carries the runtime error that
/// stopped it (OOM and thrashing are expected under small budgets).
fn execute(rt: &mut Runtime<ValueBackend>, steps: &[Step]) -> Result<(), Error> {
    let mut handles: Vec<TensorId> = Vec::new();
    for s in steps {
        match s {
            Step::Constant(b) => handles.push(rt.checkpoint(*b)?),
            Step::Call {
                args,
                outputs,
                cost,
            } if !handles.is_empty() => {
                let args: Vec<TensorId> =
                    args.iter().map(|&i| handles[i % handles.len()]).collect();
                let outs: Vec<OutputSpec> = outputs
                    .iter()
                    .map(|&(b, alias)| {
                        if alias {
                            OutputSpec::alias_of(0)
                        } else {
                            OutputSpec::fresh(b)
                        }
                    })
                    .collect();
                let o = rt.compute(OpSpec {
                    cost: *cost,
                    args: &args,
                    outputs: &outs,
                })?;
                handles.extend(o.iter());
            }
            Step::Mutate(a, b, cost) if !handles.is_empty() => {
                let i = a % handles.len();
                let args = [handles[i], handles[b % handles.len()]];
                if args[0] == args[1] {
                    continue;
                }
                match rt.mutate(*cost, &args, &[0]) {
                    Ok(o) => handles[i] = o.get(0),
                    Err(Error::AliasedMutation { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Step::Copy(i) if !handles.is_empty() => {
                let t = handles[i % handles.len()];
                rt.get(t)?;
                handles.push(t);
            }
            Step::Release(i) if !handles.is_empty() => {
                let t = handles.swap_remove(i % handles.len());
                rt.release(t)?;
            }
            _ => {}
        }
    }
    for &t in &handles {
        rt.rematerialize(t)?;
        let v = rt.backend().value(t);
        assert!(
            v.is_some(),
            "a live handle {t} has no value after rematerialize"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Under every heuristic and release policy, random programs never exceed the budget
    /// (checked by the backend itself), never run an op with an input out of memory, and
    /// recompute exactly the values they first computed; the only failures are OOM and
    /// thrashing.
    #[test]
    fn random_programs_keep_the_budget_and_recompute_exact_values(
        steps in proptest::collection::vec(step(), 1..60),
        ratio in 0.05f64..1.2,
        h in 0usize..7,
        policy in 0usize..3,
        sampling in proptest::bool::ANY,
        small in proptest::bool::ANY,
    ) {
        let release = [ReleasePolicy::Eager, ReleasePolicy::Banish, ReleasePolicy::Keep][policy];
        let mut free = Runtime::new(ValueBackend::default(), Config { release, ..Config::default() });
        let unbudgeted = execute(&mut free, &steps);
        prop_assert!(
            matches!(unbudgeted, Ok(()) | Err(Error::Banished(_))),
            "no budget, no failure: {unbudgeted:?}"
        );
        let budget = (free.profile().peak_bytes as f64 * ratio) as u64;
        let mut rt = Runtime::new(
            ValueBackend::with_budget(Some(budget)),
            Config {
                budget: Some(budget),
                heuristic: Heuristic::ALL[h],
                release,
                sampling,
                ignore_small_tensors: small,
                remat_limit_ns: Some(free.profile().base_compute_ns * 4 + 1),
                ..Config::default()
            },
        );
        match execute(&mut rt, &steps) {
            Ok(()) | Err(Error::OutOfMemory { .. } | Error::Thrashing { .. } | Error::Banished(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error: {e}"),
        }
        prop_assert!(rt.profile().peak_bytes <= budget);
        prop_assert!(rt.backend().peak_bytes <= budget);
        prop_assert_eq!(rt.memory_bytes(), rt.backend().live_bytes);
        for i in 0..rt.tensor_count() {
            let t = TensorId(i as u32);
            prop_assert_eq!(rt.is_defined(t).unwrap(), rt.backend().value(t).is_some(), "tensor {}", t);
        }
    }
}

/// The live driver shares the runtime with the allocator's free-memory callback, which must be
/// `Send + Sync`: the runtime over a `Send` backend is `Send`.
#[test]
fn runtime_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Runtime<ValueBackend>>();
    assert_send::<Runtime<checkpoint::AllocatorBackend>>();
}

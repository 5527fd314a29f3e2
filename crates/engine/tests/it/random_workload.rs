//! MXNet's test 1: a random workload run on every engine equals a serial loop bit for bit
//! (values and write versions), across worker counts, contention levels and seeds; and, on
//! every engine too, pushes from many threads at once: random workloads pushed by several
//! threads on shared variables equal a serial replay, and each thread's order holds.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use engine::workloads::{SplitMix64, Workload};
use engine::{EngineExt, PushOptions, Var};

/// The value task `i` writes: `sum(reads) / (n + 1) + i % 7`.
fn step(i: usize, reads: &[f64]) -> f64 {
    reads.iter().sum::<f64>() / (reads.len() as f64 + 1.0) + (i % 7) as f64
}

fn initial(nvars: usize) -> Vec<f64> {
    (0..nvars).map(|v| v as f64 + 1.0).collect()
}

fn serial(w: &Workload) -> Vec<u64> {
    let mut vals = initial(w.nvars);
    let mut reads = Vec::new();
    for (i, t) in w.tasks().enumerate() {
        reads.clear();
        reads.extend(t.reads.iter().map(|&r| vals[r as usize]));
        if let Some(dst) = t.write {
            vals[dst as usize] = step(i, &reads);
        }
    }
    vals.iter().map(|v| v.to_bits()).collect()
}

/// The cells of a workload's variables, at their initial values.
fn cells(nvars: usize) -> Arc<Vec<AtomicU64>> {
    Arc::new(
        initial(nvars)
            .iter()
            .map(|v| AtomicU64::new(v.to_bits()))
            .collect(),
    )
}

fn on_engine(engine: &dyn engine::Engine, w: &Workload) -> (Vec<u64>, Vec<u64>) {
    let cells = cells(w.nvars);
    let vars: Vec<Var> = (0..w.nvars).map(|_| engine.new_variable()).collect();
    for (i, t) in w.tasks().enumerate() {
        let reads: Vec<Var> = t.reads.iter().map(|&r| vars[r as usize].clone()).collect();
        let writes: Vec<Var> = t.write.iter().map(|&v| vars[v as usize].clone()).collect();
        let (read_ids, write_id) = (t.reads.to_vec(), t.write);
        let cells = Arc::clone(&cells);
        engine
            .push_sync(
                move |_| {
                    let vals: Vec<f64> = read_ids
                        .iter()
                        .map(|&r| f64::from_bits(cells[r as usize].load(Ordering::Relaxed)))
                        .collect();
                    if let Some(dst) = write_id {
                        cells[dst as usize].store(step(i, &vals).to_bits(), Ordering::Relaxed);
                    }
                    Ok(())
                },
                &reads,
                &writes,
                PushOptions::default(),
            )
            .expect("push");
    }
    engine.wait_for_all().expect("no op fails");
    let values = cells.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let versions = vars.iter().map(Var::version).collect();
    (values, versions)
}

fn expected_versions(w: &Workload) -> Vec<u64> {
    let mut v = vec![0u64; w.nvars];
    for t in w.tasks() {
        if let Some(dst) = t.write {
            v[dst as usize] += 1;
        }
    }
    v
}

#[test]
fn random_workload_matches_serial_on_every_engine() {
    common::no_hang(|| {
        // 20 variables: heavy contention; 100: the reference's; 1000: light.
        for (nvars, ntasks) in [(20, 3000), (100, 4000), (1000, 3000)] {
            for seed in [1, 42, 7777] {
                let w = Workload::random("random", nvars, ntasks, seed);
                let want = serial(&w);
                let want_versions = expected_versions(&w);
                for (name, engine) in common::all_engines() {
                    let (got, versions) = on_engine(&*engine, &w);
                    assert_eq!(
                        got, want,
                        "{name}: values differ (nvars {nvars}, seed {seed})"
                    );
                    assert_eq!(
                        versions, want_versions,
                        "{name}: versions differ (nvars {nvars}, seed {seed})"
                    );
                }
            }
        }
    });
}

#[test]
fn pushes_from_many_threads_keep_each_threads_order_and_never_deadlock() {
    common::no_hang(|| {
        for (name, engine) in common::all_engines() {
            let (a, b) = (engine.new_variable(), engine.new_variable());
            let threads = 4;
            let per_thread = 500;
            let logs: Arc<Vec<parking_lot::Mutex<Vec<usize>>>> = Arc::new(
                (0..threads)
                    .map(|_| parking_lot::Mutex::new(Vec::new()))
                    .collect(),
            );
            let total = Arc::new(AtomicU64::new(0));
            std::thread::scope(|s| {
                for t in 0..threads {
                    let (engine, a, b) = (Arc::clone(&engine), a.clone(), b.clone());
                    let (logs, total) = (Arc::clone(&logs), Arc::clone(&total));
                    s.spawn(move || {
                        let own = engine.new_variable();
                        for i in 0..per_thread {
                            // Opposite variable orders on alternate threads: a cycle unless
                            // registration is ordered.
                            let shared = if t % 2 == 0 {
                                [a.clone(), b.clone()]
                            } else {
                                [b.clone(), a.clone()]
                            };
                            let (logs, total) = (Arc::clone(&logs), Arc::clone(&total));
                            let reads: &[Var] = if i % 3 == 0 { &shared } else { &shared[..1] };
                            let writes = if i % 3 == 0 {
                                vec![own.clone()]
                            } else {
                                vec![own.clone(), shared[1].clone()]
                            };
                            engine
                                .push_sync(
                                    move |_| {
                                        logs[t].lock().push(i);
                                        total.fetch_add(1, Ordering::Relaxed);
                                        Ok(())
                                    },
                                    reads,
                                    &writes,
                                    PushOptions::default(),
                                )
                                .expect("push");
                        }
                    });
                }
            });
            engine.wait_for_all().expect("no failure");
            assert_eq!(
                total.load(Ordering::Relaxed),
                (threads * per_thread) as u64,
                "{name}"
            );
            for log in logs.iter() {
                assert_eq!(
                    *log.lock(),
                    (0..per_thread).collect::<Vec<_>>(),
                    "{name}: thread order"
                );
            }
        }
    });
}

/// What task `i` of thread `t` does to the shared variables besides its own workload: reads
/// one (which must not change while it runs) and, every third task, adds [`delta`] to another
/// with a plain read-modify-write. Additions commute, so any interleaving of the threads that
/// keeps the engine's promise gives the serial replay's values.
#[derive(Debug, Clone, Copy)]
struct SharedUse {
    read: usize,
    write: Option<usize>,
}

fn shared_uses(t: u64, ntasks: usize, nshared: usize) -> Vec<SharedUse> {
    let mut rng = SplitMix64::new(0x5eed ^ (t << 20));
    let n = nshared as u64;
    (0..ntasks)
        .map(|i| {
            let read = (rng.next_u64() % n) as usize;
            let other = (read + 1 + (rng.next_u64() % (n - 1)) as usize) % nshared;
            SharedUse {
                read,
                write: (i % 3 == 0).then_some(other),
            }
        })
        .collect()
}

/// What task `i` of thread `t` adds to its shared variable.
fn delta(t: u64, i: usize) -> u64 {
    SplitMix64::new((t << 32) | i as u64).next_u64()
}

#[test]
fn random_workloads_pushed_from_many_threads_match_a_serial_replay_on_every_engine() {
    common::no_hang(|| {
        let (threads, ntasks, nprivate, nshared) = (4u64, 1500, 20, 6);
        for seed in [5, 2024] {
            // Each thread: its own random workload (heavy contention among its own variables,
            // non-commutative: its push order decides the values) plus shared uses.
            let loads: Vec<Workload> = (0..threads)
                .map(|t| Workload::random("thread", nprivate, ntasks, seed * 100 + t))
                .collect();
            let uses: Vec<Vec<SharedUse>> = (0..threads)
                .map(|t| shared_uses(seed * 100 + t, ntasks, nshared))
                .collect();
            // The serial replay: the threads one after another, each in its order.
            let want_private: Vec<Vec<u64>> = loads.iter().map(serial).collect();
            let want_private_versions: Vec<Vec<u64>> =
                loads.iter().map(expected_versions).collect();
            let mut want_shared = vec![0u64; nshared];
            let mut want_shared_versions = vec![0u64; nshared];
            for (t, thread_uses) in uses.iter().enumerate() {
                for (i, u) in thread_uses.iter().enumerate() {
                    if let Some(s) = u.write {
                        want_shared[s] = want_shared[s].wrapping_add(delta(t as u64, i));
                        want_shared_versions[s] += 1;
                    }
                }
            }
            for (name, engine) in common::all_engines() {
                let shared_vars: Vec<Var> = (0..nshared).map(|_| engine.new_variable()).collect();
                let shared: Arc<Vec<AtomicU64>> =
                    Arc::new((0..nshared).map(|_| AtomicU64::new(0)).collect());
                let torn = Arc::new(AtomicU64::new(0));
                let results: Vec<(Vec<u64>, Vec<u64>)> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads as usize)
                        .map(|t| {
                            let (engine, w, thread_uses) = (&engine, &loads[t], &uses[t]);
                            let (shared_vars, shared, torn) = (&shared_vars, &shared, &torn);
                            s.spawn(move || {
                                let cells = cells(w.nvars);
                                let vars: Vec<Var> =
                                    (0..w.nvars).map(|_| engine.new_variable()).collect();
                                for ((i, task), u) in w.tasks().enumerate().zip(thread_uses) {
                                    let mut reads: Vec<Var> = task
                                        .reads
                                        .iter()
                                        .map(|&r| vars[r as usize].clone())
                                        .collect();
                                    reads.push(shared_vars[u.read].clone());
                                    let mut writes: Vec<Var> = task
                                        .write
                                        .iter()
                                        .map(|&v| vars[v as usize].clone())
                                        .collect();
                                    writes.extend(u.write.map(|s| shared_vars[s].clone()));
                                    let (read_ids, write_id) = (task.reads.to_vec(), task.write);
                                    let (cells, shared, torn) =
                                        (Arc::clone(&cells), Arc::clone(shared), Arc::clone(torn));
                                    let u = *u;
                                    engine
                                        .push_sync(
                                            move |_| {
                                                let seen = shared[u.read].load(Ordering::SeqCst);
                                                let vals: Vec<f64> = read_ids
                                                    .iter()
                                                    .map(|&r| {
                                                        f64::from_bits(
                                                            cells[r as usize]
                                                                .load(Ordering::Relaxed),
                                                        )
                                                    })
                                                    .collect();
                                                if let Some(dst) = write_id {
                                                    cells[dst as usize].store(
                                                        step(i, &vals).to_bits(),
                                                        Ordering::Relaxed,
                                                    );
                                                }
                                                if let Some(s) = u.write {
                                                    let before = shared[s].load(Ordering::SeqCst);
                                                    std::thread::yield_now();
                                                    shared[s].store(
                                                        before.wrapping_add(delta(t as u64, i)),
                                                        Ordering::SeqCst,
                                                    );
                                                }
                                                if shared[u.read].load(Ordering::SeqCst) != seen {
                                                    torn.fetch_add(1, Ordering::SeqCst);
                                                }
                                                Ok(())
                                            },
                                            &reads,
                                            &writes,
                                            PushOptions::default(),
                                        )
                                        .expect("push");
                                }
                                engine.wait_for_all().expect("no op fails");
                                let values =
                                    cells.iter().map(|c| c.load(Ordering::Relaxed)).collect();
                                let versions = vars.iter().map(Var::version).collect();
                                (values, versions)
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                engine.wait_for_all().expect("no op fails");
                for (t, (values, versions)) in results.iter().enumerate() {
                    assert_eq!(
                        values, &want_private[t],
                        "{name}: thread {t}'s values (seed {seed})"
                    );
                    assert_eq!(
                        versions, &want_private_versions[t],
                        "{name}: thread {t}'s versions (seed {seed})"
                    );
                }
                let got: Vec<u64> = shared.iter().map(|c| c.load(Ordering::SeqCst)).collect();
                assert_eq!(got, want_shared, "{name}: shared values (seed {seed})");
                let versions: Vec<u64> = shared_vars.iter().map(Var::version).collect();
                assert_eq!(
                    versions, want_shared_versions,
                    "{name}: shared versions (seed {seed})"
                );
                assert_eq!(
                    torn.load(Ordering::SeqCst),
                    0,
                    "{name}: a read changed under its reader"
                );
            }
        }
    });
}

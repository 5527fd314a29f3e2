//! MXNet's test 1: a random workload run on every engine equals a serial loop bit for bit
//! (values and write versions), across worker counts, contention levels and seeds; and pushes
//! from many threads at once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use engine::workloads::Workload;
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

fn on_engine(engine: &dyn engine::Engine, w: &Workload) -> (Vec<u64>, Vec<u64>) {
    let cells: Arc<Vec<AtomicU64>> = Arc::new(
        initial(w.nvars)
            .iter()
            .map(|v| AtomicU64::new(v.to_bits()))
            .collect(),
    );
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
        for (name, engine) in common::threaded(2) {
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

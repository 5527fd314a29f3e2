//! Scheduling overhead on the four standard workloads (W1 independent, W2 chain, W3 random,
//! W4 fan), each task's body one atomic increment, on the naive, pooled and per-device engines
//! with 2 workers; one iteration = push every task, then `wait_for_all`.
//!
//! Targets (the figures, 2 cores, us per task): at least 2x faster than MXNet's
//! `ThreadedEnginePerDevice` with 2 CPU workers on every workload (W1 <= 0.435, W2 <= 0.34,
//! W3 <= 0.95, W4 <= 0.435), and the naive engine at or under MXNet's `NaiveEngine`
//! (0.39 / 0.39 / 0.42 / 0.40). Per-iteration time / ntasks gives us per task. The JSON-line
//! runner with StarPU side by side is `cargo xtask bench engine --peer starpu`.
//!
//! Measured on the development machine (2 cores, otherwise idle), median of 5 passes of
//! `cargo run --release -p engine --example engine-bench -- Wn 5 --threads 2 --engine E`,
//! us per task (MXNet per-device / naive from the issue in brackets):
//!
//! | workload | naive | pooled | per-device | MXNet per-device | MXNet naive |
//! |---|---|---|---|---|---|
//! | W1 | 0.100 | 0.147 | 0.173 | 0.87 | 0.39 |
//! | W2 | 0.051 | 0.150 | 0.166 | 0.68 | 0.39 |
//! | W3 | 0.147 | 0.474 | 0.488 | 1.90 | 0.42 |
//! | W4 | 0.048 | 0.159 | 0.172 | 0.87 | 0.40 |
//!
//! Every target holds: per-device 3.9x (W3) to 5.1x (W4) faster than MXNet's per-device engine,
//! naive under MXNet's naive everywhere. Under load from other processes the threaded figures
//! rise (W3 up to about 1.5 us was seen while two other builds ran).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_main};
use engine::workloads::Workload;
use engine::{Engine, EngineConfig, EngineExt, EngineKind, PushOptions, Var};

static COUNTER: AtomicU64 = AtomicU64::new(0);

type Lists = Vec<(Vec<Var>, Vec<Var>)>;

fn lists(engine: &dyn Engine, w: &Workload) -> Lists {
    let vars: Vec<Var> = (0..w.nvars).map(|_| engine.new_variable()).collect();
    w.tasks()
        .map(|t| {
            (
                t.reads.iter().map(|&r| vars[r as usize].clone()).collect(),
                t.write.iter().map(|&v| vars[v as usize].clone()).collect(),
            )
        })
        .collect()
}

fn run(engine: &dyn Engine, lists: &Lists) {
    for (reads, writes) in lists {
        engine
            .push_sync(
                |_| {
                    COUNTER.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                },
                reads,
                writes,
                PushOptions::default(),
            )
            .expect("push");
    }
    engine.wait_for_all().expect("no failures");
}

fn workloads(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    for w in [
        Workload::w1(),
        Workload::w2(),
        Workload::w3(),
        Workload::w4(),
    ] {
        group.throughput(Throughput::Elements(w.len() as u64));
        for kind in [EngineKind::Naive, EngineKind::Pooled, EngineKind::PerDevice] {
            let engine = EngineConfig::new(kind)
                .cpu_workers(2)
                .build()
                .expect("config");
            group.bench_function(format!("{}/{kind}", w.name), |b| {
                b.iter_batched(
                    || lists(&*engine, &w),
                    |l| {
                        run(&*engine, &l);
                        black_box(l)
                    },
                    BatchSize::PerIteration,
                );
            });
        }
    }
    group.finish();
}

/// The criterion group (in a module so the generated function may go undocumented).
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::workloads);
}
criterion_main!(group::benches);

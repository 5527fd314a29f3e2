//! Loading and replaying each shared PyTorch snapshot (`shared/data/snapshots/*.pickle`):
//! `load` (read + decode + build the model, as `tensormem replay` does), `replay_parity` (from
//! the recorded start state, comparing every decision) and `replay_from_empty` (the what-if
//! mode, one configuration), plus the loader side by side with CPython's `pickle.load`.
//!
//! Run: `cargo bench -p tensormem --bench replay`. The folder is found as in the tests
//! (`<workspace>/../shared`, or `$TENSORMEM_SHARED`); without it the bench prints "skipping".
//! With `python3` on PATH, a benchmark run (not `cargo test`) first prints the loader table:
//! best of 20 of `with open(f, 'rb') as fh: pickle.load(fh)`, timed inside Python with
//! `time.perf_counter`, against best of 20 of our `tensormem::load::load_path` (both open and
//! read the file, and drop the result inside the timing).
//!
//! Target: our loader at most 2x CPython's `pickle.load` on every file: met, worst 1.71.
//! Measured on the project's 2-core development VM (shared with other builds, so ±10%), release
//! build, CPython 3.11.7, same run (`cargo bench -p tensormem --bench replay -- nomatch` prints
//! only this table):
//!
//! | file | CPython ms | ours ms | ours / CPython |
//! |---|---:|---:|---:|
//! | diffusion_eval_state | 2.41 | 3.42 | 1.42 |
//! | expandable_segments_state | 0.014 | 0.019 | 1.33 |
//! | gpt2small_trainstep_steady | 3.35 | 4.42 | 1.32 |
//! | lm2.7b_ctx128_forward_fp32 | 6.45 | 8.07 | 1.25 |
//! | lm2.7b_ctx128_trainstep_fp32 | 25.8 | 24.7 | 0.96 |
//! | lm2.7b_ctx512_forward_bf16 | 10.5 | 11.7 | 1.12 |
//! | lm_small_forward_bf16 | 1.63 | 2.18 | 1.33 |
//! | lm_small_forward_from_empty | 0.134 | 0.229 | 1.71 |
//! | opt1.3b_inference_at_oom_state | 1.11 | 1.56 | 1.41 |
//!
//! Ours includes building the snapshot model from the decoded value; decoding alone is
//! `tensormem-pickle`'s `load` bench.
//!
//! Replay (criterion's estimates, same build; events = recorded trace entries; its `load` group
//! gives means, 5-20% above the bests in the table above):
//!
//! | file | events | parity ms | from empty ms |
//! |---|---:|---:|---:|
//! | gpt2small_trainstep_steady | 5,163 | 1.00 | 0.49 |
//! | lm2.7b_ctx128_forward_fp32 | 4,657 | 0.94 | 0.61 |
//! | lm2.7b_ctx128_trainstep_fp32 | 19,342 | 3.20 | 2.21 |
//! | lm2.7b_ctx512_forward_bf16 | 6,765 | 2.07 | 0.81 |
//! | lm_small_forward_bf16 | 2,043 | 0.24 | 0.14 |
//! | lm_small_forward_from_empty | 97 | 0.014 | 0.009 |
//!
//! A replay costs a fraction of a load (the parity replay of the 3.2 MB train step: 3.2 ms
//! against 25 ms): the trace is a few thousand allocator calls, while the pickle carries a
//! stack of frames for each of them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use tensormem::load::load_path;
use tensormem::model::Snapshot;
use tensormem::replay::{ReplayOptions, replay};

/// Timings per file for the CPython table.
const BEST_OF: usize = 20;

/// Best of `BEST_OF` `pickle.load` timings per file given on the command line, in ms.
const CPYTHON_TIMER: &str = r#"
import pickle, sys, time
n = int(sys.argv[1])
for path in sys.argv[2:]:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        with open(path, "rb") as f:
            pickle.load(f)
        best = min(best, time.perf_counter() - t)
    print(f"{best * 1e3:.6f}")
"#;

fn snapshots_dir() -> Option<PathBuf> {
    let dir = shared_data::expected_path().join("snapshots");
    dir.is_dir().then_some(dir)
}

fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    files
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// Whether criterion will measure (`cargo bench`), not just run each bench once (`cargo test`).
fn measuring() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test" || a == "--list")
}

/// Prints the loader table against CPython's `pickle.load`.
fn cpython_table(files: &[PathBuf]) {
    let python = Command::new("python3")
        .arg("-c")
        .arg(CPYTHON_TIMER)
        .arg(BEST_OF.to_string())
        .args(files)
        .output();
    let cpython: Vec<f64> = match python {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect(),
        Ok(out) => {
            eprintln!(
                "skipping the CPython comparison: python3 failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("skipping the CPython comparison: cannot run python3: {e}");
            return;
        }
    };
    if cpython.len() != files.len() {
        eprintln!("skipping the CPython comparison: python3 printed an unexpected answer");
        return;
    }
    println!("\nLoader vs CPython pickle.load (best of {BEST_OF}, ms; target ours/CPython <= 2.0)");
    println!(
        "{:<34} {:>11} {:>9} {:>7}",
        "file", "CPython ms", "ours ms", "ratio"
    );
    let mut worst: f64 = 0.0;
    for (path, &py) in files.iter().zip(&cpython) {
        let mut best = Duration::MAX;
        for _ in 0..BEST_OF {
            let t = Instant::now();
            let snap = load_path(path);
            drop(std::hint::black_box(snap));
            best = best.min(t.elapsed());
        }
        let ours = best.as_secs_f64() * 1e3;
        let ratio = ours / py;
        worst = worst.max(ratio);
        println!(
            "{:<34} {:>11.3} {:>9.3} {:>7.2}",
            stem(path),
            py,
            ours,
            ratio
        );
    }
    println!(
        "worst ratio {worst:.2} ({})\n",
        if worst <= 2.0 {
            "target met"
        } else {
            "TARGET MISSED"
        }
    );
}

fn options(snap: &Snapshot, from_empty: bool) -> ReplayOptions {
    ReplayOptions::new(snap.config(), 1 << 40, from_empty)
}

fn main() {
    let Some(dir) = snapshots_dir() else {
        eprintln!("skipping: no shared/data/snapshots folder (set TENSORMEM_SHARED)");
        return;
    };
    let files = snapshot_files(&dir);
    if measuring() {
        cpython_table(&files);
    }
    let mut c = Criterion::default().configure_from_args();

    let mut group = c.benchmark_group("load");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    for path in &files {
        group.bench_function(BenchmarkId::from_parameter(stem(path)), |b| {
            b.iter(|| load_path(path).expect("the snapshot loads"));
        });
    }
    group.finish();

    let snaps: Vec<(String, Snapshot, usize)> = files
        .iter()
        .filter_map(|p| {
            let snap = load_path(p).ok()?;
            let device = snap.main_device()?;
            Some((stem(p), snap, device))
        })
        .collect();
    for (group_name, from_empty) in [("replay_parity", false), ("replay_from_empty", true)] {
        let mut group = c.benchmark_group(group_name);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        group.sample_size(20);
        for (name, snap, device) in &snaps {
            let opts = options(snap, from_empty);
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| replay(snap, *device, &opts, &mut |_, _| {}).expect("replays"));
            });
        }
        group.finish();
    }
    c.final_summary();
}

//! Decoding each shared PyTorch snapshot (`shared/data/snapshots/*.pickle`), decode and drop
//! timed together as CPython's `pickle.loads(data)` statement is.
//!
//! Run: `cargo bench -p tensormem-pickle --bench load`. The folder is found as in the tests
//! (`<workspace>/../shared`, or `$TENSORMEM_SHARED`); without it the bench prints "skipping".
//!
//! Measured once, on the project's 2-core development VM (AMD EPYC, shared with other builds,
//! so ±10%), best of 100 runs each, release build, glibc malloc; CPython 3.11.2
//! `pickle.loads` on the same machine in the same minute (`min` of 100 `perf_counter` timings):
//!
//! | file | bytes | CPython ms | ours ms | ours / CPython |
//! |---|---:|---:|---:|---:|
//! | diffusion_eval_state | 279,395 | 2.30 | 2.46 | 1.07 |
//! | expandable_segments_state | 1,064 | 0.006 | 0.010 | 1.67 |
//! | gpt2small_trainstep_steady | 495,064 | 2.88 | 3.47 | 1.20 |
//! | lm2.7b_ctx128_forward_fp32 | 1,037,065 | 6.14 | 6.97 | 1.14 |
//! | lm2.7b_ctx128_trainstep_fp32 | 3,226,220 | 22.6 | 17.8 | 0.78 |
//! | lm2.7b_ctx512_forward_bf16 | 1,409,751 | 9.45 | 8.85 | 0.94 |
//! | lm_small_forward_bf16 | 468,434 | 1.53 | 1.80 | 1.17 |
//! | lm_small_forward_from_empty | 72,171 | 0.115 | 0.198 | 1.72 |
//! | opt1.3b_inference_at_oom_state | 110,501 | 1.09 | 1.46 | 1.35 |
//!
//! (serde-pickle 1.2 took about 2.7 s on the 3.2 MB file.) Where the time goes: the memo
//! references (one per shared frame, 768k in the largest file) and malloc (two allocations per
//! container or string, `Arc` + buffer); CPython's free lists make its small files cheap.

use std::path::PathBuf;

use criterion::Criterion;

fn snapshots_dir() -> Option<PathBuf> {
    let dir = shared_data::expected_path().join("snapshots");
    dir.is_dir().then_some(dir)
}

fn load(c: &mut Criterion) {
    let Some(dir) = snapshots_dir() else {
        eprintln!("skipping: no shared/data/snapshots folder (set TENSORMEM_SHARED)");
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    let mut group = c.benchmark_group("decode");
    for path in files {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let name = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        group.bench_function(&name, |b| {
            b.iter(|| tensormem_pickle::decode(std::hint::black_box(&bytes)).map(drop))
        });
    }
    group.finish();
}

// What `criterion_main!` expands to, without the undocumented `pub fn` of `criterion_group!`.
fn main() {
    let mut c = Criterion::default().configure_from_args();
    load(&mut c);
    c.final_summary();
}

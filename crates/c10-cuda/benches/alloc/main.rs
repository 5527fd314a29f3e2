//! Benchmarks of the caching allocator beside PyTorch's own (torch-oracle) and cubecl's.
//!
//! Criterion groups (on [`ours::FakeRuntime`], a device that does what torch-oracle's fake CUDA
//! runtime does):
//! - `warm_pair/<size>`: one `malloc` + `free` of the same size, served from the cache.
//! - `replay/<trace>`: the alloc/free sequence of a real PyTorch snapshot ([`trace`]), each
//!   replay from an empty allocator (the last replay's live blocks freed, `empty_cache`, the
//!   device's addresses reset, stats reset: torch-oracle's `--bench`); criterion reports
//!   events/s.
//! - `replay_warm/<trace>`: the same with segments cached from the previous replay, as in a
//!   steady training loop (torch-oracle's `--bench-warm`).
//! - `*_peer/*` (feature `bench-peer-cubecl`): the same work through cubecl-runtime 0.10's
//!   `MemoryManagement` ([`peer`]).
//!
//! Then the side-by-side table ([`table`]): every allocator, PyTorch 2.7.1 and 2.15.0 included
//! when torch-oracle is set up (`../shared/torch-oracle/setup.sh [VERSION]`; without it the
//! table says so and measures the rest), replays the same traces (and the warm-pair scripts:
//! 10,000 pairs of one size) in the same run under the same protocol ([`timing`]); ns per pair
//! (a replay's time / its allocations), the ratios, and the targets. `cargo xtask bench` runs
//! this with the peer.
//!
//! The snapshot pickles are read from `shared/data/snapshots` beside the workspace; when that
//! folder is absent the trace replays are skipped with a message. Under `cargo test`
//! (criterion's test mode) every benchmark runs once, unoptimized, and the side-by-side table
//! is left out.
//!
//! `TENSORMEM_ALLOC_PROFILE=TRACE:MODE:RUNS` skips all that and only replays one trace `RUNS`
//! times after one untimed replay (MODE: `cold`, `warm`, `new`, `front-cold`, `front-warm`,
//! `cubecl-cold`, `cubecl-warm`; TRACE: a shared trace or `warm_pair_512B`, `_1MiB`, `_20MiB`),
//! for callgrind: `valgrind --tool=callgrind --toggle-collect='*Runner*replay*' BENCH_BINARY`
//! counts the instructions of the replays alone.
//!
//! # Targets (issue 14)
//! - on every shared trace, at least 10x faster per pair than PyTorch 2.7.1 and 2.15.0
//!   (torch-oracle, same run);
//! - a warm pair at or under 50 ns;
//! - at least 5x faster per pair than cubecl on every trace of 1,000+ allocations.
//!
//! # Measured
//! 2026-12-02, `cargo xtask bench alloc --quick` on the development machine (2 x86-64 cores,
//! quiet: load average below 1), ns per pair, best replay, cold (warm in brackets):
//!
//! | trace | allocs | ours | torch 2.7.1 | torch 2.15.0 | cubecl 0.10 |
//! |---|---|---|---|---|---|
//! | lm_small_forward_from_empty | 36 | 37.0 (33.6) | 196.7 (172.5) | 247.0 (231.4) | 109.6 (114.3) |
//! | lm_small_forward_bf16 | 681 | 42.0 (42.4) | 190.6 (180.9) | 245.0 (253.4) | 118.8 (144.4) |
//! | gpt2small_trainstep_steady | 1721 | 37.9 (37.1) | 232.5 (236.0) | 345.3 (362.9) | 258.2 (254.4) |
//! | lm2.7b_ctx128_forward_fp32 | 2058 | 38.1 (42.9) | 209.5 (214.9) | 306.9 (334.9) | 681.5 (649.3) |
//! | lm2.7b_ctx512_forward_bf16 | 2702 | 40.6 (55.5) | 228.4 (235.1) | 357.3 (407.5) | 710.8 (683.9) |
//! | lm2.7b_ctx128_trainstep_fp32 | 6771 | 48.2 (55.2) | 294.9 (300.2) | 437.9 (458.4) | 795.7 (745.2) |
//! | warm_pair_1MiB (warm) | 10000 | 45.2 | 161.8 | 226.6 | 157.5 |
//!
//! Ratios: 4.2x to 6.4x torch 2.7.1, 5.8x to 9.8x torch 2.15.0, 6.8x to 17.9x cubecl on the
//! four traces of 1,000+ allocations; warm pair 44.6 to 47.3 ns in four runs (61 ns in one
//! disturbed run). Met: the cubecl target and (except that run) the 50 ns warm pair; missed:
//! the 10x torch targets. The ratio to PyTorch follows the instruction ratio: callgrind
//! (`TENSORMEM_ALLOC_PROFILE=warm_pair_512B:warm:1`, 2 replays) counts 1,010 instructions per
//! warm 512 B pair (1,080 before this round of work) against PyTorch's about 4,100: the free
//! index about 290 (its three-level bitmap about 110), `allocator.rs` 150, stats 120, slice
//! indexing and bounds checks about 160 (spread over every table), the block arena 85, the
//! pointer map 51. The traces: 762 to 896 instructions per pair (809 to 962 before). 10x needs
//! about 410; what is left is spread thin over the rules themselves (best fit, split, merge,
//! nine stat arrays, the pointer map), so it needs a different data layout, not trimming.
//! On real traces the wall time also goes to mispredicted data-dependent branches (callgrind's
//! branch simulation: about 6 per pair on the largest trace), which is why the branch-free peak
//! maxima, the quarter-full pointer map and the longer class lists (see `free_index.rs`) were
//! each worth more than their instruction counts suggest.
//!
//! Run: `cargo xtask bench` (with the peer), or
//! `cargo bench -p c10-cuda --bench alloc [--features bench-peer-cubecl]`; add
//! `-- --warm-up-time 1 --measurement-time 3` for a quicker criterion part, or a filter such as
//! `-- replay/` to run one criterion group (the side-by-side table always runs).
//! The op scripts given to torch-oracle are left in `target/alloc-bench/`.

mod oracle;
mod ours;
#[cfg(feature = "bench-peer-cubecl")]
mod peer;
mod table;
mod timing;
mod trace;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use c10_cuda::device::StreamId;
use criterion::{BenchmarkId, Criterion, Throughput};

use crate::ours::{Ours, Start};
use crate::timing::Runner;
use crate::trace::Trace;

/// Pairs of each warm-pair script of the side-by-side table.
const WARM_PAIRS: usize = 10_000;

/// Sizes of the criterion warm-pair benchmark: small pool, the small/large boundary, a 20 MiB
/// segment.
const WARM_SIZES: [(&str, usize); 3] = [("512B", 512), ("1MiB", 1 << 20), ("20MiB", 20 << 20)];

/// Times `iters` replays of `runner`, each after its reset (criterion's `iter_custom`).
fn time_replays(runner: &mut impl Runner, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        runner.reset();
        let start = Instant::now();
        runner.replay();
        total += start.elapsed();
    }
    total
}

fn bench_warm_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("warm_pair");
    for (label, size) in WARM_SIZES {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            let mut alloc = ours::new_allocator();
            let a = alloc
                .malloc(size, StreamId::DEFAULT)
                .expect("warm-up malloc");
            alloc.free(a.ptr).expect("warm-up free");
            b.iter(|| {
                let a = alloc
                    .malloc(black_box(size), StreamId::DEFAULT)
                    .expect("warm malloc");
                alloc.free(black_box(a.ptr)).expect("warm free");
            });
        });
    }
    group.finish();

    #[cfg(feature = "bench-peer-cubecl")]
    {
        let mut group = c.benchmark_group("warm_pair_peer");
        for (label, size) in WARM_SIZES {
            group.bench_function(BenchmarkId::from_parameter(label), |b| {
                let mut mm = peer::new_peer();
                drop(mm.reserve(size as u64).expect("warm-up reserve"));
                b.iter(|| {
                    let handle = mm.reserve(black_box(size as u64)).expect("reserve");
                    drop(black_box(handle));
                });
            });
        }
        group.finish();
    }
}

fn bench_replay(c: &mut Criterion, traces: &[Trace]) {
    for (group_name, start) in [("replay", Start::Cold), ("replay_warm", Start::Warm)] {
        let mut group = c.benchmark_group(group_name);
        for trace in traces {
            group.throughput(Throughput::Elements(trace.ops.len() as u64));
            group.bench_function(BenchmarkId::from_parameter(trace.name), |b| {
                let mut runner = Ours::new(trace, start);
                runner.replay();
                b.iter_custom(|iters| time_replays(&mut runner, iters));
            });
        }
        group.finish();
    }

    #[cfg(feature = "bench-peer-cubecl")]
    for (group_name, cold) in [("replay_peer", true), ("replay_warm_peer", false)] {
        let mut group = c.benchmark_group(group_name);
        for trace in traces {
            group.throughput(Throughput::Elements(trace.ops.len() as u64));
            group.bench_function(BenchmarkId::from_parameter(trace.name), |b| {
                let mut runner = peer::Cubecl::new(trace, cold);
                runner.replay();
                b.iter_custom(|iters| time_replays(&mut runner, iters));
            });
        }
        group.finish();
    }
}

/// Peak reserved bytes of ours and of the peer on one replay from empty, against the
/// live-bytes lower bound (MiB).
fn print_peaks(traces: &[Trace]) {
    let mib = |b: u64| format!("{:.1}", b as f64 / (1u64 << 20) as f64);
    println!("\npeak reserved, one replay from empty (MiB = 2^20 B; live: the peak of the live");
    println!("requests, each rounded up to 512 B: a lower bound)");
    println!("| trace | allocs | frees | ours | cubecl 0.10 | live |");
    println!("|---|---|---|---|---|---|");
    for t in traces {
        let mut ours = Ours::new(t, Start::Cold);
        ours.replay();
        let agg = c10_cuda::stats::StatType::Aggregate as usize;
        let peak = ours.allocator().stats().reserved_bytes[agg].peak as u64;
        #[cfg(feature = "bench-peer-cubecl")]
        let peer = mib(peer::Cubecl::peak_reserved(t));
        #[cfg(not(feature = "bench-peer-cubecl"))]
        let peer = "-".to_string();
        println!(
            "| {} | {} | {} | {} | {peer} | {} |",
            t.name,
            t.allocs(),
            t.frees(),
            mib(peak),
            mib(t.live_lower_bound)
        );
    }
    for t in traces.iter().filter(|t| t.skipped_frees > 0) {
        println!(
            "({}: {} frees of blocks from before the history skipped)",
            t.name, t.skipped_frees
        );
    }
}

/// `TENSORMEM_ALLOC_PROFILE=TRACE:MODE:RUNS`: replays only, for callgrind.
fn profile(spec: &str, traces: &[Trace], pairs: &[Trace]) -> Result<(), String> {
    let parts: Vec<&str> = spec.split(':').collect();
    let [name, mode, runs] = parts[..] else {
        return Err(format!(
            "TENSORMEM_ALLOC_PROFILE={spec}: expected TRACE:MODE:RUNS"
        ));
    };
    let runs: usize = runs
        .parse()
        .map_err(|_| format!("TENSORMEM_ALLOC_PROFILE: runs {runs:?} is not a number"))?;
    let trace = traces
        .iter()
        .chain(pairs)
        .find(|t| t.name == name)
        .ok_or_else(|| format!("TENSORMEM_ALLOC_PROFILE: no trace {name:?}"))?;
    let allocs = trace.allocs();
    let per = match mode {
        "cold" => timing::measure(&mut Ours::new(trace, Start::Cold), runs, allocs),
        "warm" => timing::measure(&mut Ours::new(trace, Start::Warm), runs, allocs),
        "new" => timing::measure(&mut Ours::new(trace, Start::New), runs, allocs),
        "front-cold" => timing::measure(&mut ours::Front::new(trace, true), runs, allocs),
        "front-warm" => timing::measure(&mut ours::Front::new(trace, false), runs, allocs),
        #[cfg(feature = "bench-peer-cubecl")]
        "cubecl-cold" => timing::measure(&mut peer::Cubecl::new(trace, true), runs, allocs),
        #[cfg(feature = "bench-peer-cubecl")]
        "cubecl-warm" => timing::measure(&mut peer::Cubecl::new(trace, false), runs, allocs),
        other => return Err(format!("TENSORMEM_ALLOC_PROFILE: unknown mode {other:?}")),
    };
    println!(
        "{name} {mode}: {runs} runs, {allocs} allocs: {:.1} ns/pair best, {:.1} median (wall)",
        per.wall_best, per.wall_median
    );
    Ok(())
}

fn main() {
    // Criterion's own rule: without `--bench` (as under `cargo test`), or with `--test`, every
    // benchmark runs once.
    let args: Vec<String> = std::env::args().collect();
    let measuring = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let traces = trace::load_traces().unwrap_or_else(|why| {
        eprintln!("alloc bench: trace replays skipped: {why}");
        Vec::new()
    });
    let pairs = trace::warm_pairs(if measuring { WARM_PAIRS } else { 10 });
    if let Ok(spec) = std::env::var("TENSORMEM_ALLOC_PROFILE") {
        if let Err(e) = profile(&spec, &traces, &pairs) {
            eprintln!("alloc bench: {e}");
            std::process::exit(2);
        }
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    bench_warm_pair(&mut c);
    if !traces.is_empty() {
        bench_replay(&mut c, &traces);
    }
    c.final_summary();
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("alloc-bench");
    if measuring {
        table::run(&traces, &pairs, &dir);
    } else {
        println!("\n(test mode: the side-by-side table runs under `cargo bench` only)");
    }
    print_peaks(&traces);
}

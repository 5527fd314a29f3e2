//! The side-by-side table: ours, PyTorch 2.7.1 and 2.15.0 (torch-oracle) and cubecl on the
//! same traces in the same run, every one timed by torch-oracle's `--bench` protocol
//! ([`crate::timing`]), with the ratios and the targets.
//!
//! Columns: `ours` is [`DeviceCachingAllocator`](c10_cuda::DeviceCachingAllocator)'s `malloc`
//! and `free` (what the targets are judged on); `front` is the same through the multi-device
//! front (`CachingAllocator::raw_alloc_with_stream` / `raw_delete`, the calls torch-oracle
//! times, with the device lock and the pointer-to-device map); `new` (cold only) replays on a
//! new allocator each time (built untimed) instead of emptying the cache.

use std::path::{Path, PathBuf};

use crate::oracle;
use crate::ours::{Front, Ours, Start};
use crate::timing::{PerPair, measure};
use crate::trace::Trace;

/// Replays per measurement: enough for about 400,000 allocations, between 30 and 5,000
/// (`$TENSORMEM_BENCH_RUNS` overrides).
fn runs_for(allocs: usize) -> usize {
    if let Some(n) = std::env::var("TENSORMEM_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    (400_000 / allocs.max(1)).clamp(30, 5000)
}

/// One measured cell: figures, or why there are none.
type Cell = Result<PerPair, String>;

/// The figures of one trace in one mode.
struct Row {
    name: String,
    allocs: usize,
    runs: usize,
    ours: PerPair,
    front: PerPair,
    /// Cold only.
    new: Option<PerPair>,
    torch: Vec<Cell>,
    cubecl: Cell,
}

fn peer(trace: &Trace, cold: bool, runs: usize) -> Cell {
    #[cfg(feature = "bench-peer-cubecl")]
    {
        Ok(measure(
            &mut crate::peer::Cubecl::new(trace, cold),
            runs,
            trace.allocs(),
        ))
    }
    #[cfg(not(feature = "bench-peer-cubecl"))]
    {
        let _ = (trace, cold, runs);
        Err("built without --features bench-peer-cubecl".into())
    }
}

/// Measures every allocator on `trace` in one mode; `script` is its op script for the oracle.
fn row(
    trace: &Trace,
    cold: bool,
    script: &Path,
    launcher: &Path,
    torch_ok: &mut [Option<String>],
) -> Row {
    let runs = runs_for(trace.allocs());
    let allocs = trace.allocs();
    let start = if cold { Start::Cold } else { Start::Warm };
    let ours = measure(&mut Ours::new(trace, start), runs, allocs);
    let mut torch = Vec::new();
    for (v, why_not) in oracle::VERSIONS.iter().zip(torch_ok.iter_mut()) {
        let cell = match why_not {
            Some(why) => Err(why.clone()),
            None => oracle::bench(launcher, v, script, !cold, runs, allocs),
        };
        if let Err(why) = &cell {
            if why_not.is_none() {
                eprintln!("alloc bench: torch-oracle {v}: {why}");
                *why_not = Some(why.clone());
            }
        }
        torch.push(cell);
    }
    let cubecl = peer(trace, cold, runs);
    let front = measure(&mut Front::new(trace, cold), runs, allocs);
    let new = cold.then(|| measure(&mut Ours::new(trace, Start::New), runs, allocs));
    Row {
        name: trace.name.to_string(),
        allocs,
        runs,
        ours,
        front,
        new,
        torch,
        cubecl,
    }
}

fn fig(cell: &Cell) -> String {
    match cell {
        Ok(p) => format!("{:.1} ({:.0})", p.wall_best, p.wall_median),
        Err(_) => "-".into(),
    }
}

fn ratio(cell: &Cell, ours: f64, pick: fn(&PerPair) -> f64) -> Option<f64> {
    cell.as_ref().ok().map(|p| pick(p) / ours)
}

fn x(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.1}x"))
}

fn print_rows(title: &str, rows: &[Row]) {
    println!("\n{title}");
    let torch_heads: Vec<String> = oracle::VERSIONS
        .iter()
        .map(|v| format!("torch {v} | /ours"))
        .collect();
    println!(
        "| trace | allocs | runs | ours | {} | cubecl 0.10 | /ours | ours front | ours new |",
        torch_heads.join(" | ")
    );
    println!(
        "|---|---|---|---|{}---|---|---|---|",
        "---|---|".repeat(oracle::VERSIONS.len())
    );
    for r in rows {
        let wall = |p: &PerPair| p.wall_best;
        let ours = Ok(r.ours);
        let torch: Vec<String> = r
            .torch
            .iter()
            .map(|c| format!("{} | {}", fig(c), x(ratio(c, r.ours.wall_best, wall))))
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.allocs,
            r.runs,
            fig(&ours),
            torch.join(" | "),
            fig(&r.cubecl),
            x(ratio(&r.cubecl, r.ours.wall_best, wall)),
            fig(&Ok(r.front)),
            r.new.map_or("-".into(), |n| fig(&Ok(n))),
        );
    }
}

fn print_cpu_ratios(title: &str, rows: &[Row]) {
    println!("\n{title}");
    let heads: Vec<String> = oracle::VERSIONS
        .iter()
        .map(|v| format!("torch {v}/ours"))
        .collect();
    println!(
        "| trace | ours cpu ns | {} | cubecl/ours | torch/ours front |",
        heads.join(" | ")
    );
    println!("|---|---|{}---|---|", "---|".repeat(oracle::VERSIONS.len()));
    let cpu = |p: &PerPair| p.cpu_best;
    for r in rows {
        let torch: Vec<String> = r
            .torch
            .iter()
            .map(|c| x(ratio(c, r.ours.cpu_best, cpu)))
            .collect();
        let front: Vec<String> = r
            .torch
            .iter()
            .map(|c| x(ratio(c, r.front.cpu_best, cpu)))
            .collect();
        println!(
            "| {} | {:.1} | {} | {} | {} |",
            r.name,
            r.ours.cpu_best,
            torch.join(" | "),
            x(ratio(&r.cubecl, r.ours.cpu_best, cpu)),
            front.join(", "),
        );
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

/// The worst (smallest) ratio of a cell to ours over `rows`, with its trace.
fn worst<'r>(
    rows: impl Iterator<Item = &'r Row>,
    cell: impl Fn(&'r Row) -> Option<&'r Cell>,
) -> Option<(f64, &'r str)> {
    rows.filter_map(|r| {
        let c = cell(r)?;
        ratio(c, r.ours.wall_best, |p| p.wall_best).map(|q| (q, r.name.as_str()))
    })
    .min_by(|a, b| a.0.total_cmp(&b.0))
}

fn is_pair(r: &Row) -> bool {
    r.name.starts_with("warm_pair")
}

fn print_targets(cold: &[Row], warm: &[Row]) {
    println!("\ntargets (wall clock, best replay; on shared cores see also the CPU-time ratios)");
    for (i, v) in oracle::VERSIONS.iter().enumerate() {
        for (mode, rows) in [("cold", cold), ("warm", warm)] {
            let traces = rows.iter().filter(|r| !is_pair(r));
            match worst(traces, |r| r.torch.get(i)) {
                Some((q, name)) => println!(
                    "  >= 10x torch {v} on every trace ({mode}): worst {q:.1}x ({name}), {}",
                    verdict(q >= 10.0)
                ),
                None => println!("  >= 10x torch {v} ({mode}): torch-oracle {v} not measured"),
            }
        }
    }
    let pair = warm
        .iter()
        .filter(|r| is_pair(r))
        .map(|r| (r.ours.wall_best, r.name.as_str()))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((ns, name)) = pair {
        println!(
            "  warm pair <= 50 ns: slowest {ns:.1} ns ({name}), {}",
            verdict(ns <= 50.0)
        );
    }
    let big = cold.iter().filter(|r| r.allocs >= 1000 && !is_pair(r));
    match worst(big, |r| Some(&r.cubecl)) {
        Some((q, name)) => println!(
            "  >= 5x cubecl on every trace of 1,000+ allocations (cold): worst {q:.1}x ({name}), {}",
            verdict(q >= 5.0)
        ),
        None => {
            println!("  >= 5x cubecl: the peer was not measured (--features bench-peer-cubecl)")
        }
    }
}

/// Measures and prints the side-by-side tables for `traces` (the shared ones) and `pairs`
/// (the warm-pair scripts, warm only); op scripts are written to `dir`.
pub fn run(traces: &[Trace], pairs: &[Trace], dir: &Path) {
    let launcher = oracle::launcher();
    let mut torch_ok: Vec<Option<String>> = vec![None; oracle::VERSIONS.len()];
    if !launcher.is_file() {
        let why = format!("torch-oracle not found at {}", launcher.display());
        torch_ok.fill(Some(why));
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("alloc bench: {}: {e}", dir.display());
        return;
    }
    let scripts: Vec<PathBuf> = match traces
        .iter()
        .chain(pairs)
        .map(|t| t.write_ops(dir))
        .collect::<Result<_, _>>()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("alloc bench: {e}");
            return;
        }
    };
    let (trace_scripts, pair_scripts) = scripts.split_at(traces.len());
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for (t, s) in traces.iter().zip(trace_scripts) {
        eprintln!("alloc bench: side by side: {} (cold, warm)", t.name);
        cold.push(row(t, true, s, &launcher, &mut torch_ok));
        warm.push(row(t, false, s, &launcher, &mut torch_ok));
    }
    for (t, s) in pairs.iter().zip(pair_scripts) {
        eprintln!("alloc bench: side by side: {} (warm)", t.name);
        warm.push(row(t, false, s, &launcher, &mut torch_ok));
    }
    println!(
        "\nns per alloc+free pair (a replay's time / its allocations): best replay (median), wall \
         clock; every allocator timed as torch-oracle --bench times PyTorch (op scripts in {})",
        dir.display()
    );
    print_rows(
        "cold: every replay from an empty allocator (torch-oracle --bench N)",
        &cold,
    );
    print_rows(
        "warm: segments cached from the previous replay, as in a steady training loop \
         (torch-oracle --bench-warm N)",
        &warm,
    );
    print_cpu_ratios("ratios by thread CPU time (best replay), cold", &cold);
    print_cpu_ratios("ratios by thread CPU time (best replay), warm", &warm);
    for (v, why) in oracle::VERSIONS.iter().zip(&torch_ok) {
        if let Some(why) = why {
            println!(
                "(torch {v} not measured: {why}; set it up with {})",
                oracle::SETUP
            );
        }
    }
    print_targets(&cold, &warm);
}

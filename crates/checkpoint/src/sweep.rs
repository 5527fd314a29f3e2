//! Budget sweeps as in the paper's simulated evaluation (simrd's `run_pareto`): the
//! unbudgeted baseline, then one run per (heuristic, budget ratio) with budget
//! `floor(ratio × baseline peak)` and a thrashing cutoff at `overhead_limit × baseline
//! compute`; plus the text table. With [`DeviceOptions`] every budget is a device's capacity
//! ([`crate::device_budget`]) and each eviction strategy runs at every budget.

use std::fmt::Write as _;
use std::time::Instant;

use c10_cuda::config::AllocatorConfig;

use crate::allocator_backend::{AllocatorBackend, AllocatorReport};
use crate::backend::NullBackend;
use crate::budget::budget_for_ratio;
use crate::device_budget::Strategy;
use crate::error::Error;
use crate::heuristic::Heuristic;
use crate::log::Log;
use crate::sim::{self, Baseline, RunResult, SimError, SimOptions, Status};

/// The paper's ratios: 0.1, 0.2, ..., 1.0 (each the double nearest to k/10, as Python's
/// literals).
pub fn paper_ratios() -> Vec<f64> {
    (1..=10).map(|k| k as f64 / 10.0).collect()
}

/// What to sweep.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// Budget ratios of the baseline peak.
    pub ratios: Vec<f64>,
    /// Explicit budgets in bytes, run after the ratios (their ratio is budget / peak).
    pub budgets: Vec<u64>,
    /// Heuristics, each run at every budget.
    pub heuristics: Vec<Heuristic>,
    /// A run stops with THRASH once its rematerialization compute exceeds
    /// `(overhead_limit - 1) × baseline compute` (simrd: 2.0).
    pub overhead_limit: f64,
    /// Route storages through the caching allocator and report reserved bytes.
    pub with_allocator: bool,
    /// The prototype's sqrt(n) sampling.
    pub sampling: bool,
    /// The prototype's small-tensor filter.
    pub ignore_small_tensors: bool,
    /// Seed of random choices.
    pub seed: u64,
    /// Treat every budget as a device's capacity (`None`: the budget counts bytes).
    pub device: Option<DeviceOptions>,
    /// Runs simulated at once, each on its own thread (`None`: the machine's available
    /// parallelism; `Some(1)`: one after the other). The runs are independent, so the results
    /// are the same for any count.
    pub threads: Option<usize>,
}

/// A device-memory budget sweep: the budget is the capacity of an address-only simulated
/// device under the caching allocator, and every strategy runs at every budget.
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// Eviction strategies, each run at every (heuristic, budget) (default
    /// [`Strategy::WindowMoveAll`] alone).
    pub strategies: Vec<Strategy>,
    /// The allocator's settings (PYTORCH_CUDA_ALLOC_CONF; PyTorch's defaults by default).
    pub alloc_conf: AllocatorConfig,
    /// Coop's partition of cheap and expensive storages ([`AllocatorBackend::with_partition`]).
    pub partition: bool,
    /// In-place updates keep the address ([`crate::Config::in_place`]).
    pub in_place: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            strategies: vec![Strategy::default()],
            alloc_conf: AllocatorConfig::default(),
            partition: false,
            in_place: false,
        }
    }
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            ratios: paper_ratios(),
            budgets: Vec::new(),
            heuristics: vec![Heuristic::DtrEq],
            overhead_limit: 2.0,
            with_allocator: false,
            sampling: false,
            ignore_small_tensors: false,
            seed: 0x5eed,
            device: None,
            threads: None,
        }
    }
}

/// One run of a sweep.
#[derive(Clone, Debug)]
pub struct SweepRun {
    /// The heuristic.
    pub heuristic: Heuristic,
    /// The strategy, under a device-memory budget.
    pub strategy: Option<Strategy>,
    /// The budget ratio (budget / baseline peak for explicit budgets).
    pub ratio: f64,
    /// The budget, bytes.
    pub budget_bytes: u64,
    /// The run.
    pub result: RunResult,
    /// `clock / baseline compute` for OK runs.
    pub overhead: Option<f64>,
    /// The allocator's figures (with `with_allocator`).
    pub allocator: Option<AllocatorReport>,
    /// Wall-clock time of the run, ns.
    pub wall_ns: u64,
}

impl SweepRun {
    /// How the run ended.
    pub fn status(&self) -> Status {
        self.result.status
    }
}

/// A whole sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// The unbudgeted run.
    pub baseline: Baseline,
    /// Runs, heuristic-major in the order asked.
    pub runs: Vec<SweepRun>,
}

/// Runs one budgeted simulation of `log`.
///
/// # Errors
/// [`SimError`] when the log is inconsistent or the allocator fails.
pub fn run_budget(
    log: &Log,
    baseline: &Baseline,
    heuristic: Heuristic,
    budget_bytes: u64,
    options: &SweepOptions,
) -> Result<SweepRun, SimError> {
    run_one(log, baseline, heuristic, None, budget_bytes, options)
}

/// Runs one simulation of `log` on a device of `capacity` bytes with `strategy`
/// (the settings of `options.device`, or PyTorch's defaults).
///
/// # Errors
/// [`SimError`] when the log is inconsistent or the allocator fails.
pub fn run_device_budget(
    log: &Log,
    baseline: &Baseline,
    heuristic: Heuristic,
    strategy: Strategy,
    capacity: u64,
    options: &SweepOptions,
) -> Result<SweepRun, SimError> {
    run_one(log, baseline, heuristic, Some(strategy), capacity, options)
}

fn run_one(
    log: &Log,
    baseline: &Baseline,
    heuristic: Heuristic,
    strategy: Option<Strategy>,
    budget_bytes: u64,
    options: &SweepOptions,
) -> Result<SweepRun, SimError> {
    let limit = baseline.compute_ns as f64 * (options.overhead_limit - 1.0);
    let device = strategy.map(|s| (s, options.device.clone().unwrap_or_default()));
    let mut sim_options = SimOptions {
        budget: Some(budget_bytes),
        heuristic,
        sampling: options.sampling,
        ignore_small_tensors: options.ignore_small_tensors,
        remat_limit_ns: Some(if limit <= 0.0 { 0 } else { limit as u64 }),
        seed: options.seed,
        ..SimOptions::default()
    };
    let backend_error = |e: c10_cuda::Error| SimError {
        line: 0,
        source: Error::Backend(Box::new(e)),
    };
    let start = Instant::now();
    let (result, allocator) = if let Some((strategy, d)) = device {
        sim_options.budget = None;
        sim_options.strategy = strategy;
        sim_options.in_place = d.in_place;
        let backend = AllocatorBackend::on_device(d.alloc_conf.clone(), budget_bytes)
            .map_err(backend_error)?
            .with_partition(d.partition);
        let (r, b) = sim::run(log, &sim_options, backend)?;
        (r, Some(b.report()))
    } else if options.with_allocator {
        let backend = AllocatorBackend::new().map_err(|e| SimError {
            line: 0,
            source: Error::Backend(Box::new(e)),
        })?;
        let (r, b) = sim::run(log, &sim_options, backend)?;
        (r, Some(b.report()))
    } else {
        let (r, _) = sim::run(log, &sim_options, NullBackend)?;
        (r, None)
    };
    let wall_ns = start.elapsed().as_nanos() as u64;
    let ratio = if baseline.peak_bytes == 0 {
        0.0
    } else {
        budget_bytes as f64 / baseline.peak_bytes as f64
    };
    Ok(SweepRun {
        heuristic,
        strategy,
        ratio,
        budget_bytes,
        overhead: result.overhead(baseline.compute_ns),
        result,
        allocator,
        wall_ns,
    })
}

/// The baseline, then every (heuristic, budget) of `options`.
///
/// # Errors
/// [`SimError`] when the log is inconsistent.
pub fn sweep(log: &Log, options: &SweepOptions) -> Result<Sweep, SimError> {
    let baseline = sim::baseline(log)?;
    let strategies: Vec<Option<Strategy>> = match &options.device {
        Some(d) => d.strategies.iter().copied().map(Some).collect(),
        None => vec![None],
    };
    // (heuristic, strategy, budget, the ratio asked for), in the order of the result.
    let mut jobs: Vec<(Heuristic, Option<Strategy>, u64, Option<f64>)> = Vec::new();
    for &h in &options.heuristics {
        for &strategy in &strategies {
            for &ratio in &options.ratios {
                let budget = budget_for_ratio(baseline.peak_bytes, ratio);
                jobs.push((h, strategy, budget, Some(ratio)));
            }
            for &budget in &options.budgets {
                jobs.push((h, strategy, budget, None));
            }
        }
    }
    let one = |&(h, strategy, budget, ratio): &(Heuristic, Option<Strategy>, u64, Option<f64>)| {
        let mut run = run_one(log, &baseline, h, strategy, budget, options)?;
        if let Some(r) = ratio {
            run.ratio = r;
        }
        Ok(run)
    };
    let threads = options
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, jobs.len().max(1));
    let results: Vec<Result<SweepRun, SimError>> = if threads == 1 {
        jobs.iter().map(one).collect()
    } else {
        // Thread k runs jobs k, k + threads, ...: neighbouring budgets cost about the same, so
        // the threads get about equal shares.
        let mut parts: Vec<Vec<(usize, Result<SweepRun, SimError>)>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|k| {
                        let (jobs, one) = (&jobs, &one);
                        scope.spawn(move || {
                            (k..jobs.len())
                                .step_by(threads)
                                .map(|i| (i, one(&jobs[i])))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
        let mut all: Vec<(usize, Result<SweepRun, SimError>)> = parts.drain(..).flatten().collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, r)| r).collect()
    };
    // The first failure in the order asked, as the one-at-a-time sweep would have stopped.
    let runs = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(Sweep { baseline, runs })
}

const GB: f64 = 1e9;

/// The sweep as a text table: one row per run with heuristic, ratio, budget (GB = 1e9 bytes),
/// status, overhead, peak (GB), evictions, remats; with `allocator` also the reserved peak, how
/// far it overshoots the budget, and the fragmentation at that peak.
pub fn table(sweep: &Sweep, allocator: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "baseline: peak {:.3} GB ({} bytes), compute {:.3} ms",
        sweep.baseline.peak_bytes as f64 / GB,
        sweep.baseline.peak_bytes,
        sweep.baseline.compute_ns as f64 / 1e6
    );
    let _ = write!(
        out,
        "{:<10} {:>5} {:>10} {:>6} {:>9} {:>9} {:>9} {:>7}",
        "heuristic", "ratio", "budget GB", "status", "overhead", "peak GB", "evictions", "remats"
    );
    if allocator {
        let _ = write!(out, " {:>11} {:>7} {:>6}", "reserved GB", "over", "frag");
    }
    out.push('\n');
    for r in &sweep.runs {
        let overhead = match r.overhead {
            Some(o) => format!("{o:.4}"),
            None => "-".into(),
        };
        let _ = write!(
            out,
            "{:<10} {:>5.2} {:>10.3} {:>6} {:>9} {:>9.3} {:>9} {:>7}",
            r.heuristic.name(),
            r.ratio,
            r.budget_bytes as f64 / GB,
            r.status().as_str(),
            overhead,
            r.result.profile.peak_bytes as f64 / GB,
            r.result.profile.evictions,
            r.result.profile.remats
        );
        if allocator {
            match &r.allocator {
                Some(a) => {
                    let over = if r.budget_bytes == 0 {
                        "-".to_string()
                    } else {
                        format!(
                            "{:+.1}%",
                            (a.peak_reserved_bytes as f64 / r.budget_bytes as f64 - 1.0) * 100.0
                        )
                    };
                    let _ = write!(
                        out,
                        " {:>11.3} {:>7} {:>5.1}%",
                        a.peak_reserved_bytes as f64 / GB,
                        over,
                        a.fragmentation() * 100.0
                    );
                }
                None => {
                    let _ = write!(out, " {:>11} {:>7} {:>6}", "-", "-", "-");
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The smallest ratio among `runs` (one strategy and heuristic) whose run completed with
/// overhead at most `limit` (the 1.5), with that overhead.
pub fn smallest_ratio<'a>(
    runs: impl IntoIterator<Item = &'a SweepRun>,
    limit: f64,
) -> Option<(f64, f64)> {
    runs.into_iter()
        .filter_map(|r| r.overhead.filter(|&o| o <= limit).map(|o| (r.ratio, o)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

/// A device-memory budget sweep as a text table: one row per run with strategy, heuristic,
/// ratio, device capacity (GB = 1e9 bytes), status, overhead, the allocator's peak reserved
/// and allocated bytes (GB), evictions, rematerializations, misses, fragmentation at the
/// reserved peak and search time (ms).
pub fn device_table(sweep: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "baseline: peak {:.3} GB ({} bytes), compute {:.3} ms",
        sweep.baseline.peak_bytes as f64 / GB,
        sweep.baseline.peak_bytes,
        sweep.baseline.compute_ns as f64 / 1e6
    );
    let _ = writeln!(
        out,
        "{:<14} {:<10} {:>5} {:>10} {:>6} {:>9} {:>11} {:>12} {:>9} {:>7} {:>7} {:>6} {:>9}",
        "strategy",
        "heuristic",
        "ratio",
        "device GB",
        "status",
        "overhead",
        "reserved GB",
        "allocated GB",
        "evictions",
        "remats",
        "misses",
        "frag",
        "search ms"
    );
    for r in &sweep.runs {
        let overhead = match r.overhead {
            Some(o) => format!("{o:.4}"),
            None => "-".into(),
        };
        let a = r.allocator.unwrap_or_default();
        let p = &r.result.profile;
        let _ = writeln!(
            out,
            "{:<14} {:<10} {:>5.2} {:>10.3} {:>6} {:>9} {:>11.3} {:>12.3} {:>9} {:>7} {:>7} {:>5.1}% {:>9.2}",
            r.strategy.map_or("-", Strategy::name),
            r.heuristic.name(),
            r.ratio,
            r.budget_bytes as f64 / GB,
            r.status().as_str(),
            overhead,
            a.peak_reserved_bytes as f64 / GB,
            a.peak_allocated_bytes as f64 / GB,
            p.evictions,
            p.remats,
            p.misses,
            a.fragmentation() * 100.0,
            p.search_ns as f64 / 1e6
        );
    }
    out
}

#[cfg(test)]
mod thread_tests {
    use super::*;

    #[test]
    fn any_thread_count_gives_the_same_sweep_in_the_same_order() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/resnet18-64.log.gz");
        let lg = crate::log::parse_file(&path).expect("corpus log");
        let base = SweepOptions {
            ratios: vec![0.3, 0.6, 0.9],
            budgets: vec![700_000_000],
            device: Some(DeviceOptions {
                strategies: vec![Strategy::Callback, Strategy::Window],
                ..DeviceOptions::default()
            }),
            ..SweepOptions::default()
        };
        let key = |sw: &Sweep| -> Vec<_> {
            sw.runs
                .iter()
                .map(|r| {
                    let p = &r.result.profile;
                    (
                        r.strategy,
                        r.ratio.to_bits(),
                        r.budget_bytes,
                        r.status(),
                        r.result.clock,
                        (p.evictions, p.remats, p.misses, p.scanned_blocks),
                        r.allocator.map(|a| a.peak_reserved_bytes),
                    )
                })
                .collect()
        };
        let one = sweep(
            &lg,
            &SweepOptions {
                threads: Some(1),
                ..base.clone()
            },
        )
        .unwrap();
        assert_eq!(one.runs.len(), 8);
        for threads in [Some(3), Some(64), None] {
            let many = sweep(
                &lg,
                &SweepOptions {
                    threads,
                    ..base.clone()
                },
            )
            .unwrap();
            assert_eq!(key(&many), key(&one), "{threads:?}");
        }
    }
}

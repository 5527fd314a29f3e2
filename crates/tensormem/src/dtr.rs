//! `tensormem dtr LOG`: Dynamic Tensor Rematerialization simulated on one of the DTR paper's
//! operator logs under hard budgets (the `checkpoint` crate), as a table, JSON or an SVG plot;
//! with `--device-budget` every budget is the capacity of a simulated device under the caching
//! allocator and each eviction strategy runs at every budget, beside the allocator-blind run;
//! with `--advise` the smallest device memory at which the model trains per strategy and
//! overhead limit ([`advise`], [`DtrAdvice`]: also what `tensormem.dtr_advise` returns).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use c10_cuda::config::AllocatorConfig;
use checkpoint::sweep::{self, DeviceOptions, Sweep, SweepOptions};
use checkpoint::{Heuristic, Strategy, log};
use plotters::prelude::*;
use serde::Serialize;

use crate::size::parse_size;

/// Options of `tensormem dtr`.
#[derive(clap::Args, Debug)]
pub struct DtrArgs {
    /// The operator log (one JSON object per line, as the DTR prototype writes them).
    pub log: PathBuf,
    /// Budget as a ratio of the log's no-eviction peak (default: 0.1, 0.2, ..., 1.0).
    #[arg(long, value_name = "R", conflicts_with = "budget")]
    pub ratio: Option<f64>,
    /// Budget in bytes, e.g. 4GB or 3.5GiB.
    #[arg(long, value_name = "BYTES")]
    pub budget: Option<String>,
    /// Eviction heuristics, by `checkpoint::Heuristic` name (the help text lists them).
    #[arg(
        long,
        value_name = "NAME",
        value_delimiter = ',',
        help = format!(
            "Heuristics: {} (comma-separated or repeated; default dtr-eq, or all of them with --sweep)",
            checkpoint::Heuristic::names()
        )
    )]
    pub heuristic: Vec<String>,
    /// Run every heuristic at every ratio 0.1..1.0 (narrowed by --heuristic, --ratio, --budget).
    #[arg(long)]
    pub sweep: bool,
    /// Route every storage through the caching allocator (address-only simulated device) and
    /// report reserved bytes, fragmentation and how far reserved overshoots the budget.
    #[arg(long)]
    pub with_allocator: bool,
    /// Print the runs as JSON.
    #[arg(long)]
    pub json: bool,
    /// Draw overhead against budget ratio, one line per heuristic, into an .svg file (with
    /// --advise: overhead against device memory per strategy, the limits and each smallest
    /// device memory within 1.5x marked).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Scan about sqrt(n) random candidates per eviction (the prototype's sampling).
    #[arg(long)]
    pub sampling: bool,
    /// Skip storages under 1% of the average size in the search.
    #[arg(long)]
    pub ignore_small_tensors: bool,
    /// Stop a run with THRASH once its compute passes this multiple of the baseline.
    #[arg(long, value_name = "X", default_value_t = 2.0)]
    pub overhead_limit: f64,
    /// Ratios step, step x 2, ..., 1.0 instead of 0.1, ..., 1.0 (e.g. 0.05).
    #[arg(long, value_name = "R", conflicts_with_all = ["ratio", "budget"])]
    pub step: Option<f64>,
    /// Every ratio or budget is the capacity of an address-only simulated device under the
    /// caching allocator: reserved bytes can never pass it, and the allocator's misses drive
    /// eviction (--strategy). The allocator-blind run is shown beside.
    #[arg(long)]
    pub device_budget: bool,
    /// Device-budget strategies, by `checkpoint::Strategy` name (the help text lists them).
    #[arg(
        long,
        value_name = "NAME",
        value_delimiter = ',',
        help = format!(
            "With --device-budget, how to make room on a miss: {} (comma-separated or repeated; \
             default window-move-all, or all of them with --sweep or --advise)",
            checkpoint::Strategy::names()
        ),
        requires = "device_budget"
    )]
    pub strategy: Vec<String>,
    /// With --device-budget, the caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF, e.g.
    /// "expandable_segments:True"; default PyTorch's).
    #[arg(long, value_name = "CONF", requires = "device_budget")]
    pub alloc_conf: Option<String>,
    /// With --device-budget, Coop's partition: storages cheap to recompute per byte take the
    /// low end of a split block, expensive ones the high end.
    #[arg(long, requires = "device_budget")]
    pub partition: bool,
    /// With --device-budget, in-place updates (MUTATE) keep the address when the old version
    /// dies with the update, instead of allocating a copy.
    #[arg(long, requires = "device_budget")]
    pub in_place: bool,
    /// With --device-budget: the smallest device memory at which the model trains under each
    /// strategy and overhead limit (1.1, 1.25, 1.5 and 2.0, those up to --overhead-limit),
    /// beside the allocator-blind run: every strategy (or --strategy) at ratios 0.05, 0.10,
    /// ..., 1.0 (or --step) of the no-eviction peak. Text, --json or --plot.
    #[arg(long, requires = "device_budget")]
    pub advise: bool,
}

/// The overhead limits `--advise` reports (those up to the run's thrashing cut).
pub const ADVISE_LIMITS: [f64; 4] = [1.1, 1.25, 1.5, 2.0];

/// The ratio step of `--advise` unless --step, --ratio or --budget says otherwise.
pub const ADVISE_STEP: f64 = 0.05;

/// The overhead limit of the smallest-budget summary (the 1.5).
pub const SUMMARY_OVERHEAD: f64 = 1.5;

impl DtrArgs {
    /// The sweep these options ask for.
    ///
    /// # Errors
    /// One line naming the bad option.
    pub fn options(&self) -> Result<SweepOptions, String> {
        let heuristics = if !self.heuristic.is_empty() {
            self.heuristic
                .iter()
                .map(|h| {
                    h.parse::<Heuristic>()
                        .map_err(|e| format!("--heuristic: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?
        } else if self.sweep && !self.device_budget {
            Heuristic::ALL.to_vec()
        } else {
            vec![Heuristic::DtrEq]
        };
        let step = self.step.or(
            (self.advise && self.ratio.is_none() && self.budget.is_none()).then_some(ADVISE_STEP),
        );
        let (ratios, budgets) = match (&self.ratio, &self.budget) {
            (Some(r), _) => {
                if !(r.is_finite() && *r > 0.0) {
                    return Err(format!("--ratio {r}: expected a ratio above 0 (e.g. 0.4)"));
                }
                (vec![*r], Vec::new())
            }
            (None, Some(b)) => {
                let bytes = parse_size(b).map_err(|e| format!("--budget: {e}"))?;
                (Vec::new(), vec![bytes as u64])
            }
            (None, None) => match step {
                Some(step) => {
                    if !(step.is_finite() && step > 0.0 && step <= 1.0) {
                        return Err(format!(
                            "--step {step}: expected a step in (0, 1] (e.g. 0.05)"
                        ));
                    }
                    let n = (1.0 / step + 1e-9).floor() as usize;
                    ((1..=n).map(|k| k as f64 * step).collect(), Vec::new())
                }
                None => (sweep::paper_ratios(), Vec::new()),
            },
        };
        let device = if self.device_budget {
            let strategies = if !self.strategy.is_empty() {
                self.strategy
                    .iter()
                    .map(|s| {
                        s.parse::<Strategy>()
                            .map_err(|e| format!("--strategy: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            } else if self.sweep || self.advise {
                Strategy::ALL.to_vec()
            } else {
                vec![Strategy::default()]
            };
            let alloc_conf = match &self.alloc_conf {
                Some(c) => AllocatorConfig::parse(c).map_err(|e| format!("--alloc-conf: {e}"))?,
                None => AllocatorConfig::default(),
            };
            Some(DeviceOptions {
                strategies,
                alloc_conf,
                partition: self.partition,
                in_place: self.in_place,
            })
        } else {
            None
        };
        if !(self.overhead_limit.is_finite() && self.overhead_limit >= 1.0) {
            return Err(format!(
                "--overhead-limit {}: expected a number of at least 1",
                self.overhead_limit
            ));
        }
        Ok(SweepOptions {
            ratios,
            budgets,
            heuristics,
            overhead_limit: self.overhead_limit,
            with_allocator: self.with_allocator,
            sampling: self.sampling,
            ignore_small_tensors: self.ignore_small_tensors,
            device,
            ..SweepOptions::default()
        })
    }
}

/// The allocator-blind sweep at the same budgets and heuristics (the reference of a
/// device-memory budget sweep).
fn blind_options(options: &SweepOptions) -> SweepOptions {
    SweepOptions {
        device: None,
        with_allocator: false,
        ..options.clone()
    }
}

/// Runs `tensormem dtr` and returns what it prints.
///
/// # Errors
/// One line naming the problem (bad option, unreadable or bad log with its line, plot).
pub fn run(args: &DtrArgs) -> Result<String, String> {
    let options = args.options()?;
    if let Some(p) = &args.plot {
        check_svg(p)?;
    }
    let name = args.log.display().to_string();
    let lg = log::parse_file(&args.log).map_err(|e| match e {
        log::LogError::Io { .. } => e.to_string(),
        other => format!("{name}: {other}"),
    })?;
    let sw = sweep::sweep(&lg, &options).map_err(|e| format!("{name}: {e}"))?;
    if options.device.is_some() {
        return device_report(args, &name, &lg, &options, &sw);
    }
    if let Some(p) = &args.plot {
        plot(p, &name, &sw, None).map_err(|e| format!("--plot {}: {e}", p.display()))?;
    }
    if args.json {
        let doc = json(&name, &lg, &options, &sw);
        return serde_json::to_string_pretty(&doc)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string());
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{name}: {} operator calls, thrashing cut at {}x",
        lg.op_count(),
        options.overhead_limit
    );
    cost_line(&mut out, &lg);
    out.push_str(&sweep::table(&sw, args.with_allocator));
    if args.with_allocator {
        if let Some((r, over)) = worst_overshoot(&sw) {
            let _ = writeln!(
                out,
                "reserved bytes overshoot the budget by up to {:.1}% in completed runs ({} at ratio {:.2}); the budgeted bytes never do",
                over * 100.0,
                r.heuristic,
                r.ratio
            );
        }
    }
    if let Some(p) = &args.plot {
        let _ = writeln!(out, "plot written to {}", p.display());
    }
    Ok(out)
}

/// `TIME holds: ...` when the log says what its costs are (`tensormem.record`'s `COST`
/// annotation); the prototype's logs hold measured nanoseconds and say nothing.
fn cost_line(out: &mut String, lg: &log::Log) {
    if let Some(c) = lg.cost_annotation() {
        let _ = writeln!(
            out,
            "TIME holds: {c} (overheads are ratios of it; \"ms\" below is TIME / 1e6)"
        );
    }
}

/// The completed run whose reserved peak exceeds its budget the most, with that excess as a
/// fraction.
fn worst_overshoot(sw: &Sweep) -> Option<(&sweep::SweepRun, f64)> {
    sw.runs
        .iter()
        .filter(|r| r.status() == checkpoint::Status::Ok)
        .filter_map(|r| {
            let a = r.allocator?;
            (r.budget_bytes > 0).then(|| {
                (
                    r,
                    a.peak_reserved_bytes as f64 / r.budget_bytes as f64 - 1.0,
                )
            })
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// `--device-budget`: the device sweep, the allocator-blind sweep beside it, the smallest budget
/// per strategy; table, JSON or plot.
fn device_report(
    args: &DtrArgs,
    name: &str,
    lg: &log::Log,
    options: &SweepOptions,
    sw: &Sweep,
) -> Result<String, String> {
    let blind = sweep::sweep(lg, &blind_options(options)).map_err(|e| format!("{name}: {e}"))?;
    if args.advise {
        return advise_report(args, name, lg, options, sw, &blind);
    }
    if let Some(p) = &args.plot {
        plot(p, name, sw, Some(&blind)).map_err(|e| format!("--plot {}: {e}", p.display()))?;
    }
    let d = options.device.as_ref().expect("a device sweep");
    let mut groups: Vec<(Option<Strategy>, Heuristic)> = Vec::new();
    for r in &sw.runs {
        if !groups.contains(&(r.strategy, r.heuristic)) {
            groups.push((r.strategy, r.heuristic));
        }
    }
    let smallest = |runs: &Sweep, s: Option<Strategy>, h: Heuristic| {
        sweep::smallest_ratio(
            runs.runs
                .iter()
                .filter(|r| r.heuristic == h && (s.is_none() || r.strategy == s)),
            SUMMARY_OVERHEAD,
        )
    };
    if args.json {
        let mut doc = json(name, lg, options, sw);
        doc["device_budget"] = serde_json::json!({
            "alloc_conf": d.alloc_conf.to_string(),
            "partition": d.partition,
            "in_place": d.in_place,
        });
        doc["blind_runs"] = json(name, lg, options, &blind)["runs"].clone();
        let summary: Vec<serde_json::Value> = groups
            .iter()
            .map(|&(s, h)| {
                let (ratio, overhead) = smallest(sw, s, h).unzip();
                let (blind_ratio, blind_overhead) = smallest(&blind, None, h).unzip();
                serde_json::json!({
                    "strategy": s.map(Strategy::name),
                    "heuristic": h.name(),
                    "overhead_limit": SUMMARY_OVERHEAD,
                    "smallest_ratio": ratio,
                    "overhead_there": overhead,
                    "blind_smallest_ratio": blind_ratio,
                    "blind_overhead_there": blind_overhead,
                })
            })
            .collect();
        doc["smallest"] = summary.into();
        return serde_json::to_string_pretty(&doc)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string());
    }
    let mut out = String::new();
    let conf = d.alloc_conf.to_string();
    let _ = writeln!(
        out,
        "{name}: {} operator calls, thrashing cut at {}x; device-memory budget: the budget is the device's capacity (allocator {}{}{})",
        lg.op_count(),
        options.overhead_limit,
        if conf.is_empty() {
            "default"
        } else {
            conf.as_str()
        },
        if d.partition {
            ", Coop's partition"
        } else {
            ""
        },
        if d.in_place { ", in-place updates" } else { "" },
    );
    cost_line(&mut out, lg);
    out.push_str(&sweep::device_table(sw));
    let over = sw
        .runs
        .iter()
        .filter(|r| {
            r.allocator
                .is_some_and(|a| a.peak_reserved_bytes > r.budget_bytes)
        })
        .count();
    let _ = writeln!(
        out,
        "reserved bytes over the device's capacity: {over} of {} runs",
        sw.runs.len()
    );
    let show = |x: Option<(f64, f64)>| match x {
        Some((r, o)) => format!("{r:.2} (overhead {o:.4})"),
        None => "none".into(),
    };
    for &(s, h) in &groups {
        let _ = writeln!(
            out,
            "smallest budget with overhead <= {SUMMARY_OVERHEAD}: {} {}: {}; allocator-blind {h}: {}",
            s.map_or("-", Strategy::name),
            h,
            show(smallest(sw, s, h)),
            show(smallest(&blind, None, h)),
        );
    }
    if let Some(p) = &args.plot {
        let _ = writeln!(out, "plot written to {}", p.display());
    }
    Ok(out)
}

/// One `--advise` answer: the smallest ratio (and the device bytes it is) at which a run's
/// sweep completes within `overhead_limit`, with the overhead there.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Advice {
    /// The overhead limit (compute / baseline compute) this answer is for.
    pub overhead_limit: f64,
    /// The smallest budget ratio (of the no-eviction peak) that completes within the limit.
    pub ratio: f64,
    /// That budget: the device's capacity, bytes.
    pub device_bytes: u64,
    /// The run's overhead there.
    pub overhead: f64,
}

/// One budget of a row's sweep.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AdvicePoint {
    /// Budget ratio of the no-eviction peak.
    pub ratio: f64,
    /// The device's capacity, bytes.
    pub device_bytes: u64,
    /// `OK`, `OOM` or `THRASH`.
    pub status: &'static str,
    /// Compute / baseline compute of a completed run (`None` otherwise).
    pub overhead: Option<f64>,
}

/// The answers for one strategy (or the allocator-blind run) and heuristic.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdviceRow {
    /// `"<strategy> <heuristic>"`, or `"allocator-blind <heuristic>"`.
    pub run: String,
    /// The strategy's name; `None` for the allocator-blind run.
    pub strategy: Option<&'static str>,
    /// The heuristic's name.
    pub heuristic: &'static str,
    /// One answer per limit of [`DtrAdvice::limits`], `None` where no budget trains within it.
    pub smallest: Vec<Option<Advice>>,
    /// Every budget of the sweep, smallest first.
    pub points: Vec<AdvicePoint>,
}

/// The best device-budget answer within [`SUMMARY_OVERHEAD`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BestAdvice {
    /// The row's [`AdviceRow::run`].
    pub run: String,
    /// Its answer at [`SUMMARY_OVERHEAD`].
    #[serde(flatten)]
    pub advice: Advice,
}

/// What `tensormem dtr --device-budget --advise` finds: per strategy and heuristic (and the
/// allocator-blind run), the smallest device memory at which the log's model trains within
/// each overhead limit. Its JSON form is what `--advise --json` prints and what
/// `tensormem.dtr_advise` returns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DtrAdvice {
    /// The log's name (a path, or what the caller named it).
    pub log: String,
    /// Operator calls in the log.
    pub operator_calls: usize,
    /// The log's `COST` annotation (what `TIME` holds), if any.
    pub cost: Option<String>,
    /// The no-eviction peak, bytes (ratio 1.0).
    pub peak_bytes: u64,
    /// Baseline compute (summed `TIME`).
    pub baseline_compute: u64,
    /// The caching allocator's settings (empty: PyTorch's defaults).
    pub alloc_conf: String,
    /// The budget ratios swept.
    pub ratios: Vec<f64>,
    /// The overhead limits answered (those up to the thrashing cut).
    pub limits: Vec<f64>,
    /// One row per strategy and heuristic, then the allocator-blind run per heuristic.
    pub advice: Vec<AdviceRow>,
    /// The strategy that trains on the least device memory within [`SUMMARY_OVERHEAD`] (among
    /// equals the least overhead); `None` when none does.
    pub best: Option<BestAdvice>,
}

/// The sweep options of an advice: `heuristics` (default h_DTR^eq), `strategies` (default
/// all), ratios `step, 2·step, ..., 1.0` (default [`ADVISE_STEP`]), the allocator's settings
/// and the thrashing cut (default 2.0).
///
/// # Errors
/// A message naming the bad argument (an unknown name, a step outside (0, 1], a bad allocator
/// setting, a cut below 1) with the command's option names.
pub fn advise_options(
    heuristics: &[String],
    strategies: &[String],
    step: Option<f64>,
    alloc_conf: Option<&str>,
    overhead_limit: f64,
) -> Result<SweepOptions, String> {
    let args = DtrArgs {
        log: PathBuf::new(),
        ratio: None,
        budget: None,
        heuristic: heuristics.to_vec(),
        sweep: false,
        with_allocator: false,
        json: true,
        plot: None,
        sampling: false,
        ignore_small_tensors: false,
        overhead_limit,
        step,
        device_budget: true,
        strategy: strategies.to_vec(),
        alloc_conf: alloc_conf.map(str::to_string),
        partition: false,
        in_place: false,
        advise: true,
    };
    args.options()
}

/// The smallest completing budget within each limit of the runs `runs` selects.
fn advice<'a>(
    runs: impl Iterator<Item = &'a sweep::SweepRun> + Clone,
    limits: &[f64],
) -> Vec<Option<Advice>> {
    limits
        .iter()
        .map(|&limit| {
            let (ratio, overhead) = sweep::smallest_ratio(runs.clone(), limit)?;
            let device_bytes = runs.clone().find(|r| r.ratio == ratio)?.budget_bytes;
            Some(Advice {
                overhead_limit: limit,
                ratio,
                device_bytes,
                overhead,
            })
        })
        .collect()
}

/// The points of a row, smallest budget first.
fn points<'a>(runs: impl Iterator<Item = &'a sweep::SweepRun>) -> Vec<AdvicePoint> {
    let mut p: Vec<AdvicePoint> = runs
        .map(|r| AdvicePoint {
            ratio: r.ratio,
            device_bytes: r.budget_bytes,
            status: r.status().as_str(),
            overhead: r.overhead,
        })
        .collect();
    p.sort_by_key(|a| a.device_bytes);
    p
}

/// Runs the device-budget sweep of `options` (it must have [`SweepOptions::device`]) and the
/// allocator-blind sweep beside it, and gives the advice.
///
/// # Errors
/// A message when `options` has no device budget or a sweep fails (an inconsistent log).
pub fn advise(lg: &log::Log, name: &str, options: &SweepOptions) -> Result<DtrAdvice, String> {
    if options.device.is_none() {
        return Err("the advice needs a device-memory budget sweep (--device-budget)".into());
    }
    let sw = sweep::sweep(lg, options).map_err(|e| format!("{name}: {e}"))?;
    let blind = sweep::sweep(lg, &blind_options(options)).map_err(|e| format!("{name}: {e}"))?;
    Ok(advice_of(name, lg, options, &sw, &blind))
}

/// The advice from the two sweeps.
fn advice_of(
    name: &str,
    lg: &log::Log,
    options: &SweepOptions,
    sw: &Sweep,
    blind: &Sweep,
) -> DtrAdvice {
    let limits: Vec<f64> = ADVISE_LIMITS
        .iter()
        .copied()
        .filter(|&l| l <= options.overhead_limit + 1e-9)
        .collect();
    let d = options.device.as_ref().expect("a device sweep");
    let mut rows: Vec<AdviceRow> = Vec::new();
    for &h in &options.heuristics {
        for &s in &d.strategies {
            let runs = sw
                .runs
                .iter()
                .filter(move |r| r.heuristic == h && r.strategy == Some(s));
            rows.push(AdviceRow {
                run: format!("{} {h}", s.name()),
                strategy: Some(s.name()),
                heuristic: h.name(),
                smallest: advice(runs.clone(), &limits),
                points: points(runs),
            });
        }
        let runs = blind.runs.iter().filter(move |r| r.heuristic == h);
        rows.push(AdviceRow {
            run: format!("allocator-blind {h}"),
            strategy: None,
            heuristic: h.name(),
            smallest: advice(runs.clone(), &limits),
            points: points(runs),
        });
    }
    let best = rows
        .iter()
        .filter(|r| r.strategy.is_some())
        .filter_map(|r| {
            r.smallest
                .iter()
                .flatten()
                .find(|x| (x.overhead_limit - SUMMARY_OVERHEAD).abs() < 1e-9)
                .map(|x| (r, *x))
        })
        // The least memory; among equals the least overhead.
        .min_by(|a, b| {
            (a.1.device_bytes, a.1.overhead)
                .partial_cmp(&(b.1.device_bytes, b.1.overhead))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .map(|(r, a)| BestAdvice {
            run: r.run.clone(),
            advice: a,
        });
    DtrAdvice {
        log: name.to_string(),
        operator_calls: lg.op_count(),
        cost: lg.cost_annotation().map(str::to_string),
        peak_bytes: sw.baseline.peak_bytes,
        baseline_compute: sw.baseline.compute_ns,
        alloc_conf: d.alloc_conf.to_string(),
        ratios: options.ratios.clone(),
        limits,
        advice: rows,
        best,
    }
}

impl DtrAdvice {
    /// As JSON (what `--advise --json` prints).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The text report of `--advise`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: {} operator calls; no-eviction peak {:.3} GB ({} bytes); device budgets at \
             ratios {:.2} to {:.2} of it under the caching allocator ({})",
            self.log,
            self.operator_calls,
            self.peak_bytes as f64 / 1e9,
            self.peak_bytes,
            self.ratios.first().copied().unwrap_or(0.0),
            self.ratios.last().copied().unwrap_or(0.0),
            if self.alloc_conf.is_empty() {
                "default"
            } else {
                self.alloc_conf.as_str()
            },
        );
        if let Some(c) = &self.cost {
            let _ = writeln!(
                out,
                "TIME holds: {c} (overheads are ratios of it; \"ms\" below is TIME / 1e6)"
            );
        }
        let _ = writeln!(
            out,
            "smallest device memory at which it trains, per overhead limit (ratio, GB, overhead):"
        );
        let width = self.advice.iter().map(|r| r.run.len()).max().unwrap_or(0);
        let mut line = format!("{:<width$}", "run");
        for l in &self.limits {
            let _ = write!(line, "  {:<24}", format!("<= {l}x"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
        for row in &self.advice {
            let mut line = format!("{:<width$}", row.run);
            for a in &row.smallest {
                let cell = match a {
                    Some(a) => format!(
                        "{:.2} {:.3} GB {:.3}x",
                        a.ratio,
                        a.device_bytes as f64 / 1e9,
                        a.overhead
                    ),
                    None => "does not train".into(),
                };
                let _ = write!(line, "  {cell:<24}");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        match &self.best {
            Some(b) => {
                let a = b.advice;
                let _ = writeln!(
                    out,
                    "best within {SUMMARY_OVERHEAD}x: {} trains on {:.3} GB ({} bytes, ratio {:.2}, overhead {:.3}x)",
                    b.run,
                    a.device_bytes as f64 / 1e9,
                    a.device_bytes,
                    a.ratio,
                    a.overhead
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "no strategy trains within {SUMMARY_OVERHEAD}x at these budgets"
                );
            }
        }
        out
    }

    /// Draws the advice into `path` (`.svg`): overhead (y) against device memory in GB (x),
    /// one line per row (the allocator-blind run dashed black; OOM and THRASH break a line),
    /// the overhead limits as dotted lines, and each row's smallest device memory within
    /// [`SUMMARY_OVERHEAD`] ringed.
    ///
    /// # Errors
    /// A message when the extension is not `.svg`, or drawing or writing fails.
    pub fn plot(&self, path: &Path) -> Result<(), String> {
        check_svg(path)?;
        let svg = self.svg_string((1000, 600))?;
        std::fs::write(path, svg).map_err(|e| format!("--plot {}: {e}", path.display()))
    }

    /// The SVG text of [`DtrAdvice::plot`], `size` pixels.
    ///
    /// # Errors
    /// A message when drawing fails.
    pub fn svg_string(&self, size: (u32, u32)) -> Result<String, String> {
        let err = |e: &dyn std::fmt::Display| e.to_string();
        let gb = |b: u64| b as f64 / 1e9;
        let x1 = self
            .advice
            .iter()
            .flat_map(|r| r.points.iter().map(|p| gb(p.device_bytes)))
            .fold(gb(self.peak_bytes), f64::max)
            .max(1e-9)
            * 1.02;
        let y_top = self
            .advice
            .iter()
            .flat_map(|r| r.points.iter().filter_map(|p| p.overhead))
            .chain(self.limits.iter().copied())
            .fold(1.1f64, f64::max);
        // Room above the curves for the legend (one row per line, about 20 px each).
        let plot_px = f64::from(size.1.saturating_sub(110).max(100));
        let legend_px = ((self.advice.len() + 1) * 20 + 16) as f64;
        let headroom = (plot_px / (plot_px - legend_px).max(plot_px / 3.0)).max(1.05);
        let y1 = 1.0 + (y_top - 1.0) * headroom + 0.02;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    format!("DTR device-budget advice: {}", self.log),
                    ("sans-serif", 20),
                )
                .margin(12)
                .x_label_area_size(44)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..x1, 1f64..y1)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc(format!(
                    "device memory (GB); no-eviction peak {:.3} GB",
                    gb(self.peak_bytes)
                ))
                .y_desc("overhead (compute / baseline)")
                .label_style(("sans-serif", 15))
                .axis_desc_style(("sans-serif", 15))
                .draw()
                .map_err(|e| err(&e))?;
            for &l in &self.limits {
                chart
                    .draw_series(DashedLineSeries::new(
                        [(0.0, l), (x1, l)],
                        2,
                        5,
                        RGBColor(150, 150, 150).stroke_width(1),
                    ))
                    .map_err(|e| err(&e))?;
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("{l}x"),
                        (x1 * 0.005, l),
                        ("sans-serif", 14)
                            .into_font()
                            .color(&RGBColor(110, 110, 110)),
                    )))
                    .map_err(|e| err(&e))?;
            }
            for (k, row) in self.advice.iter().enumerate() {
                let blind = row.strategy.is_none();
                let color = if blind {
                    BLACK.to_rgba()
                } else {
                    Palette99::pick(k).to_rgba()
                };
                let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
                for p in &row.points {
                    match p.overhead {
                        Some(o) => segments
                            .last_mut()
                            .expect("segment")
                            .push((gb(p.device_bytes), o)),
                        None => segments.push(Vec::new()),
                    }
                }
                let label = match row
                    .smallest
                    .iter()
                    .flatten()
                    .find(|a| (a.overhead_limit - SUMMARY_OVERHEAD).abs() < 1e-9)
                {
                    Some(a) => format!(
                        "{}: {:.3} GB within {SUMMARY_OVERHEAD}x",
                        row.run,
                        gb(a.device_bytes)
                    ),
                    None => format!("{}: none within {SUMMARY_OVERHEAD}x", row.run),
                };
                draw_run(&mut chart, segments, color, blind, &label)?;
                if let Some(a) = row
                    .smallest
                    .iter()
                    .flatten()
                    .find(|a| (a.overhead_limit - SUMMARY_OVERHEAD).abs() < 1e-9)
                {
                    chart
                        .draw_series(std::iter::once(Circle::new(
                            (gb(a.device_bytes), a.overhead),
                            7,
                            color.stroke_width(2),
                        )))
                        .map_err(|e| err(&e))?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font(("sans-serif", 16))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))?;
        }
        Ok(svg)
    }
}

/// `--device-budget --advise`: the advice's text or JSON, and its plot.
fn advise_report(
    args: &DtrArgs,
    name: &str,
    lg: &log::Log,
    options: &SweepOptions,
    sw: &Sweep,
    blind: &Sweep,
) -> Result<String, String> {
    let a = advice_of(name, lg, options, sw, blind);
    if let Some(p) = &args.plot {
        a.plot(p)?;
    }
    if args.json {
        return serde_json::to_string_pretty(&a)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string());
    }
    let mut out = a.text();
    if let Some(p) = &args.plot {
        let _ = writeln!(out, "plot written to {}", p.display());
    }
    Ok(out)
}

fn json(name: &str, lg: &log::Log, options: &SweepOptions, sw: &Sweep) -> serde_json::Value {
    let runs: Vec<serde_json::Value> = sw
        .runs
        .iter()
        .map(|r| {
            let p = &r.result.profile;
            let mut v = serde_json::json!({
                "strategy": r.strategy.map(Strategy::name),
                "heuristic": r.heuristic.name(),
                "ratio": r.ratio,
                "budget_bytes": r.budget_bytes,
                "status": r.status().as_str(),
                "overhead": r.overhead,
                "peak_bytes": p.peak_bytes,
                "evictions": p.evictions,
                "eager_evictions": p.eager_evictions,
                "remats": p.remats,
                "base_compute_ns": p.base_compute_ns,
                "remat_compute_ns": p.remat_compute_ns,
                "clock_ns": r.result.clock,
                "search_ns": p.search_ns,
                "stopped_at_line": r.result.stopped_at,
                "wall_ms": r.wall_ns as f64 / 1e6,
            });
            if r.strategy.is_some() {
                v["misses"] = p.misses.into();
                v["scanned_blocks"] = p.scanned_blocks.into();
                v["in_place"] = p.in_place.into();
            }
            if let Some(a) = &r.allocator {
                v["allocated_peak_bytes"] = a.peak_allocated_bytes.into();
                v["reserved_peak_bytes"] = a.peak_reserved_bytes.into();
                v["fragmentation"] = a.fragmentation().into();
                v["reserved_over_budget"] = if r.budget_bytes > 0 {
                    (a.peak_reserved_bytes as f64 / r.budget_bytes as f64 - 1.0).into()
                } else {
                    serde_json::Value::Null
                };
            }
            v
        })
        .collect();
    serde_json::json!({
        "log": name,
        "operator_calls": lg.op_count(),
        "cost": lg.cost_annotation(),
        "overhead_limit": options.overhead_limit,
        "baseline": {
            "peak_bytes": sw.baseline.peak_bytes,
            "compute_ns": sw.baseline.compute_ns,
        },
        "runs": runs,
    })
}

fn check_svg(path: &Path) -> Result<(), String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.eq_ignore_ascii_case("svg") => Ok(()),
        _ => Err(format!(
            "--plot {}: the plot file needs a .svg extension",
            path.display()
        )),
    }
}

/// The chart both DTR plots draw on: overhead against a budget ratio or device GB.
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws one run: its completed stretches (split where a budget failed) as dots joined by a
/// line, dashed for an allocator-blind run, with one legend entry.
fn draw_run(
    chart: &mut Chart<'_, '_>,
    segments: Vec<Vec<(f64, f64)>>,
    color: RGBAColor,
    dashed: bool,
    label: &str,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut labelled = false;
    for seg in segments.into_iter().filter(|s| !s.is_empty()) {
        chart
            .draw_series(
                seg.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )
            .map_err(|e| err(&e))?;
        let series = if dashed {
            chart.draw_series(DashedLineSeries::new(seg, 6, 4, color.stroke_width(2)))
        } else {
            chart.draw_series(LineSeries::new(seg, color.stroke_width(2)))
        }
        .map_err(|e| err(&e))?;
        if !labelled {
            labelled = true;
            series.label(label.to_owned()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
    }
    Ok(())
}

/// Overhead (y) against budget ratio (x), one line per heuristic (per strategy and heuristic
/// for a device-memory budget, with the allocator-blind runs of `blind` dashed); runs that
/// ended in OOM or THRASH break the line.
fn plot(path: &Path, title: &str, sw: &Sweep, blind: Option<&Sweep>) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut lines: Vec<(String, Vec<&sweep::SweepRun>, bool)> = Vec::new();
    let mut keys: Vec<(Option<Strategy>, Heuristic)> = Vec::new();
    for r in &sw.runs {
        if !keys.contains(&(r.strategy, r.heuristic)) {
            keys.push((r.strategy, r.heuristic));
        }
    }
    for &(s, h) in &keys {
        let label = match s {
            Some(s) => format!("{s} ({h})"),
            None => h.name().to_string(),
        };
        let runs = sw
            .runs
            .iter()
            .filter(|r| r.strategy == s && r.heuristic == h)
            .collect();
        lines.push((label, runs, false));
    }
    if let Some(b) = blind {
        let mut hs: Vec<Heuristic> = Vec::new();
        for r in &b.runs {
            if !hs.contains(&r.heuristic) {
                hs.push(r.heuristic);
            }
        }
        for h in hs {
            let runs = b.runs.iter().filter(|r| r.heuristic == h).collect();
            lines.push((format!("allocator-blind ({h})"), runs, true));
        }
    }
    let all = || lines.iter().flat_map(|l| l.1.iter());
    let x1 = all().map(|r| r.ratio).fold(1.0f64, f64::max);
    let y1 = all().filter_map(|r| r.overhead).fold(1.1f64, f64::max) * 1.02;
    let x_desc = if blind.is_some() {
        "device budget / no-eviction peak"
    } else {
        "budget / no-eviction peak"
    };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("DTR overhead: {title}"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x1, 1f64..y1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("overhead (compute / baseline)")
        .draw()
        .map_err(|e| err(&e))?;
    for (k, (label, runs, dashed)) in lines.into_iter().enumerate() {
        let color = if dashed {
            BLACK.to_rgba()
        } else {
            Palette99::pick(k).to_rgba()
        };
        let mut runs = runs;
        runs.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for r in runs {
            match r.overhead {
                Some(o) => segments.last_mut().expect("segment").push((r.ratio, o)),
                None => segments.push(Vec::new()),
            }
        }
        draw_run(&mut chart, segments, color, dashed, &label)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: DtrArgs,
    }

    fn args(line: &[&str]) -> DtrArgs {
        Wrap::try_parse_from(std::iter::once("dtr").chain(line.iter().copied()))
            .expect("valid arguments")
            .args
    }

    /// A 6-layer chain: forward activations kept for a backward pass that releases them.
    fn chain_log() -> String {
        chain_log_of(100)
    }

    /// [`chain_log`] with tensors of `bytes`.
    fn chain_log_of(bytes: u64) -> String {
        let mut w = checkpoint::LogWriter::new(Vec::new());
        w.annotate("START").unwrap();
        w.constant("x0", bytes).unwrap();
        for i in 1..=6 {
            let (prev, name) = (format!("x{}", i - 1), format!("x{i}"));
            w.call("f", &[prev], &[(name.as_str(), bytes, None)], 10)
                .unwrap();
        }
        w.annotate("BACKWARD").unwrap();
        w.call("loss", &["x6"], &[("g6", bytes, None)], 10).unwrap();
        for i in (1..=5).rev() {
            let (g, a, out) = (format!("g{}", i + 1), format!("x{i}"), format!("g{i}"));
            w.call(
                "f_backward",
                &[g.as_str(), a.as_str()],
                &[(out.as_str(), bytes, None)],
                20,
            )
            .unwrap();
            w.release(&g).unwrap();
            w.release(&format!("x{}", i + 1)).unwrap();
        }
        String::from_utf8(w.into_inner().unwrap()).unwrap()
    }

    fn write_log(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tensormem-dtr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn options_follow_the_flags() {
        let o = args(&["x.log"]).options().unwrap();
        assert_eq!(o.heuristics, [Heuristic::DtrEq]);
        assert_eq!(o.ratios.len(), 10);
        let o = args(&["x.log", "--sweep", "--ratio", "0.5"])
            .options()
            .unwrap();
        assert_eq!(o.heuristics.len(), 7);
        assert_eq!(o.ratios, [0.5]);
        let o = args(&["x.log", "--heuristic", "lru,dtr", "--budget", "4GB"])
            .options()
            .unwrap();
        assert_eq!(o.heuristics, [Heuristic::Lru, Heuristic::Dtr]);
        assert_eq!(
            (o.ratios.len(), o.budgets.as_slice()),
            (0, &[4_000_000_000][..])
        );
    }

    #[test]
    fn bad_options_are_one_line() {
        let e = args(&["x.log", "--heuristic", "belady"])
            .options()
            .unwrap_err();
        assert_eq!(
            e,
            "--heuristic: unknown heuristic 'belady' (use dtr, dtr-eq, dtr-local, lru, largest, msps or random)"
        );
        let e = args(&["x.log", "--ratio", "0"]).options().unwrap_err();
        assert_eq!(e, "--ratio 0: expected a ratio above 0 (e.g. 0.4)");
        let e = run(&args(&["x.log", "--plot", "out.png"])).unwrap_err();
        assert_eq!(e, "--plot out.png: the plot file needs a .svg extension");
        assert!(Wrap::try_parse_from(["dtr", "x.log", "--ratio", "0.5", "--budget", "1"]).is_err());
    }

    #[test]
    fn a_recorded_gzip_log_says_what_time_holds() {
        let p =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../checkpoint/corpus/resnet18-64.log.gz");
        let text = run(&args(&[p.to_str().unwrap(), "--ratio", "0.5"])).unwrap();
        assert!(text.contains(": 266 operator calls,"), "{text}");
        assert!(
            text.contains("\nTIME holds: roofline flop/s=1.5e+13 bytes/s=6.5e+11 launch_ns=1000 ("),
            "{text}"
        );
        let doc: serde_json::Value = serde_json::from_str(
            &run(&args(&[p.to_str().unwrap(), "--ratio", "0.5", "--json"])).unwrap(),
        )
        .unwrap();
        assert!(doc["cost"].as_str().unwrap().starts_with("roofline "));
        assert_eq!(doc["baseline"]["peak_bytes"], 1_484_381_416u64);
        let doc: serde_json::Value = serde_json::from_str(
            &run(&args(&[
                write_log("c.log", &chain_log()).to_str().unwrap(),
                "--json",
            ]))
            .unwrap(),
        )
        .unwrap();
        assert!(doc["cost"].is_null());
    }

    #[test]
    fn table_json_and_plot() {
        let p = write_log("chain.log", &chain_log());
        let text = run(&args(&[p.to_str().unwrap(), "--sweep"])).unwrap();
        assert!(
            text.contains(": 12 operator calls, thrashing cut at 2x\n"),
            "{text}"
        );
        assert!(text.contains("baseline: peak 0.000 GB (900 bytes), compute 0.000 ms"));
        assert!(
            text.contains("\ndtr-eq      0.60      0.000     OK    1.3588"),
            "{text}"
        );
        assert!(
            text.contains("\ndtr-eq      0.40      0.000    OOM         -"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3 + 70);
        let doc: serde_json::Value = serde_json::from_str(
            &run(&args(&[
                p.to_str().unwrap(),
                "--sweep",
                "--json",
                "--with-allocator",
            ]))
            .unwrap(),
        )
        .unwrap();
        let runs = doc["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 70);
        let r = &runs[13]; // dtr-eq at 0.4
        assert_eq!(r["heuristic"], "dtr-eq");
        assert_eq!(r["ratio"], 0.4);
        assert_eq!(r["budget_bytes"], 360);
        assert_eq!(r["status"], "OOM");
        assert!(r["overhead"].is_null());
        for key in [
            "peak_bytes",
            "evictions",
            "remats",
            "reserved_peak_bytes",
            "fragmentation",
        ] {
            assert!(!r[key].is_null(), "{key}");
        }
        let ok = &runs[15]; // dtr-eq at 0.6
        assert_eq!(
            (ok["status"].as_str(), ok["evictions"].as_u64()),
            (Some("OK"), Some(7))
        );
        assert!((ok["overhead"].as_f64().unwrap() - 1.3588).abs() < 1e-4);
        assert_eq!(doc["baseline"]["peak_bytes"], 900);
        let svg = p.with_extension("svg");
        let out = run(&args(&[
            p.to_str().unwrap(),
            "--sweep",
            "--plot",
            svg.to_str().unwrap(),
        ]))
        .unwrap();
        assert!(out.ends_with(&format!("plot written to {}\n", svg.display())));
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.contains("dtr-eq") && drawn.contains("<svg"));
    }

    #[test]
    fn advise_gives_the_smallest_device_memory_per_strategy_and_limit() {
        let p = write_log("chain12-advise.log", &chain_log_of(12 << 20));
        let path = p.to_str().unwrap();
        let o = args(&[path, "--device-budget", "--advise"])
            .options()
            .unwrap();
        assert_eq!(o.ratios.len(), 20);
        assert!((o.ratios[0] - 0.05).abs() < 1e-12 && (o.ratios[19] - 1.0).abs() < 1e-12);
        assert_eq!(o.device.as_ref().unwrap().strategies, Strategy::ALL);
        // Without --advise or --sweep: the default strategy alone, window-move-all.
        let one = args(&[path, "--device-budget"]).options().unwrap();
        assert_eq!(
            one.device.as_ref().unwrap().strategies,
            [Strategy::WindowMoveAll]
        );
        let doc: serde_json::Value = serde_json::from_str(
            &run(&args(&[path, "--device-budget", "--advise", "--json"])).unwrap(),
        )
        .unwrap();
        assert_eq!(doc["limits"], serde_json::json!([1.1, 1.25, 1.5, 2.0]));
        let rows = doc["advice"].as_array().unwrap();
        assert_eq!(rows.len(), Strategy::ALL.len() + 1);
        assert_eq!(rows.last().unwrap()["run"], "allocator-blind dtr-eq");
        // Each answer at 1.5 is the device report's smallest budget for that strategy, and a
        // looser limit never needs more memory.
        let full: serde_json::Value = serde_json::from_str(
            &run(&args(&[
                path,
                "--device-budget",
                "--sweep",
                "--step",
                "0.05",
                "--json",
            ]))
            .unwrap(),
        )
        .unwrap();
        for (row, summary) in rows.iter().zip(full["smallest"].as_array().unwrap()) {
            let at = |i: usize| row["smallest"][i]["ratio"].as_f64();
            assert_eq!(at(2), summary["smallest_ratio"].as_f64(), "{row}");
            for i in 1..4 {
                if let (Some(tight), Some(loose)) = (at(i - 1), at(i)) {
                    assert!(loose <= tight, "{row}");
                }
            }
            if let Some(a) = row["smallest"][2].as_object() {
                let bytes = a["device_bytes"].as_u64().unwrap() as f64;
                let peak = doc["peak_bytes"].as_u64().unwrap() as f64;
                assert!((bytes / peak - a["ratio"].as_f64().unwrap()).abs() < 1e-6);
            }
        }
        let blind = &full["smallest"][0]["blind_smallest_ratio"];
        assert_eq!(&rows.last().unwrap()["smallest"][2]["ratio"], blind);
        let text = run(&args(&[path, "--device-budget", "--advise"])).unwrap();
        assert!(
            text.contains("smallest device memory at which it trains"),
            "{text}"
        );
        assert!(
            text.contains("best within 1.5x: ") || text.contains("no strategy trains"),
            "{text}"
        );
        // --advise needs --device-budget.
        assert!(Wrap::try_parse_from(["dtr", path, "--advise"]).is_err());
    }

    #[test]
    fn advise_best_points_plot_and_library_agree() {
        let p = write_log("chain12-advise-plot.log", &chain_log_of(12 << 20));
        let path = p.to_str().unwrap();
        let line = [
            path,
            "--device-budget",
            "--advise",
            "--strategy",
            "window,callback",
        ];
        let printed = run(&args(&[&line[..], &["--json"]].concat())).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&printed).unwrap();
        let rows = doc["advice"].as_array().unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| r["run"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["window dtr-eq", "callback dtr-eq", "allocator-blind dtr-eq"]
        );
        assert_eq!(rows[2]["strategy"], serde_json::Value::Null);
        for r in rows {
            // Every budget of the sweep, smallest first; an OK point has an overhead.
            let pts = r["points"].as_array().unwrap();
            assert_eq!(pts.len(), 20);
            for w in pts.windows(2) {
                assert!(w[0]["device_bytes"].as_u64() < w[1]["device_bytes"].as_u64());
            }
            for p in pts {
                assert_eq!(p["status"] == "OK", p["overhead"].is_number(), "{p}");
            }
            // The answer at 1.5 is the smallest OK point within 1.5.
            let within = pts
                .iter()
                .find(|p| p["overhead"].as_f64().is_some_and(|o| o <= 1.5));
            assert_eq!(
                r["smallest"][2]["device_bytes"],
                within.map_or(serde_json::Value::Null, |p| p["device_bytes"].clone())
            );
        }
        // The best is the strategy row needing the least memory within 1.5x.
        let least = rows[..2]
            .iter()
            .filter_map(|r| r["smallest"][2]["device_bytes"].as_u64())
            .min();
        assert_eq!(doc["best"]["device_bytes"].as_u64(), least);
        assert_eq!(doc["best"]["overhead_limit"], 1.5);
        // The library gives the same document.
        let lg = log::parse_file(&p).unwrap();
        let options =
            advise_options(&[], &["window".into(), "callback".into()], None, None, 2.0).unwrap();
        let lib = advise(&lg, path, &options).unwrap();
        assert_eq!(serde_json::to_string_pretty(&lib).unwrap() + "\n", printed);
        assert_eq!(
            advise_options(&[], &["belady".into()], None, None, 2.0).unwrap_err(),
            "--strategy: unknown strategy 'belady' (use callback, window, window-total, window-score, window-first, window-deficit, window-move, window-move-all or window-move-ahead)"
        );
        // --plot draws overhead against device memory, one labelled line per row.
        let svg = p.with_extension("svg");
        let out = run(&args(
            &[&line[..], &["--plot", svg.to_str().unwrap()]].concat(),
        ))
        .unwrap();
        assert!(
            out.ends_with(&format!("plot written to {}\n", svg.display())),
            "{out}"
        );
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.starts_with("<svg"), "{}", &drawn[..60]);
        assert!(drawn.contains("device memory (GB)"));
        for r in rows {
            assert!(drawn.contains(r["run"].as_str().unwrap()), "{}", r["run"]);
        }
        assert!(drawn.contains("within 1.5x"));
        let e = run(&args(&[&line[..], &["--plot", "advice.png"]].concat())).unwrap_err();
        assert_eq!(e, "--plot advice.png: the plot file needs a .svg extension");
    }

    #[test]
    fn device_budget_runs_every_strategy_beside_the_blind_run() {
        // 12 MiB tensors: each a segment of its own (requests of 10 MiB and more).
        let p = write_log("chain12.log", &chain_log_of(12 << 20));
        let path = p.to_str().unwrap();
        let o = args(&[path, "--device-budget", "--sweep", "--step", "0.25"])
            .options()
            .unwrap();
        assert_eq!(o.ratios, [0.25, 0.5, 0.75, 1.0]);
        assert_eq!(o.heuristics, [Heuristic::DtrEq]);
        assert_eq!(o.device.as_ref().unwrap().strategies, Strategy::ALL);
        let doc: serde_json::Value = serde_json::from_str(
            &run(&args(&[
                path,
                "--device-budget",
                "--sweep",
                "--step",
                "0.25",
                "--json",
            ]))
            .unwrap(),
        )
        .unwrap();
        let runs = doc["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 4 * Strategy::ALL.len());
        assert_eq!(doc["blind_runs"].as_array().unwrap().len(), 4);
        assert_eq!(doc["baseline"]["peak_bytes"], 9 * (12u64 << 20));
        for r in runs {
            for key in [
                "strategy",
                "ratio",
                "budget_bytes",
                "status",
                "reserved_peak_bytes",
                "allocated_peak_bytes",
                "evictions",
                "remats",
                "search_ns",
                "fragmentation",
                "misses",
            ] {
                assert!(!r[key].is_null(), "{key}");
            }
            assert!(r.get("overhead").is_some());
            assert!(
                r["reserved_peak_bytes"].as_u64().unwrap() <= r["budget_bytes"].as_u64().unwrap()
            );
        }
        // At the no-eviction peak, 9 tensors of exactly 12 MiB fit on the device: no eviction.
        let at_one = &runs[3];
        assert_eq!(
            (
                at_one["strategy"].as_str(),
                at_one["ratio"].as_f64(),
                at_one["status"].as_str()
            ),
            (Some("callback"), Some(1.0), Some("OK"))
        );
        assert_eq!(at_one["reserved_peak_bytes"], 9 * (12u64 << 20));
        assert_eq!(at_one["evictions"], 0);
        let smallest = doc["smallest"].as_array().unwrap();
        assert_eq!(smallest.len(), Strategy::ALL.len());
        // The summary is the smallest ratio completing with overhead <= 1.5, per strategy.
        let smallest_of = |runs: &[serde_json::Value], strategy: Option<&str>| {
            runs.iter()
                .filter(|r| strategy.is_none() || r["strategy"].as_str() == strategy)
                .filter(|r| r["overhead"].as_f64().is_some_and(|o| o <= 1.5))
                .map(|r| r["ratio"].as_f64().unwrap())
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
        };
        let blind = doc["blind_runs"].as_array().unwrap();
        for (k, s) in Strategy::ALL.iter().enumerate() {
            assert_eq!(smallest[k]["strategy"], s.name());
            assert_eq!(
                smallest[k]["smallest_ratio"].as_f64(),
                smallest_of(runs, Some(s.name()))
            );
            assert_eq!(
                smallest[k]["blind_smallest_ratio"].as_f64(),
                smallest_of(blind, None)
            );
        }
        let text = run(&args(&[
            path,
            "--device-budget",
            "--strategy",
            "window,callback",
        ]))
        .unwrap();
        assert!(
            text.contains(
                "device-memory budget: the budget is the device's capacity (allocator default)"
            ),
            "{text}"
        );
        assert!(
            text.contains("reserved bytes over the device's capacity: 0 of 20 runs"),
            "{text}"
        );
        assert!(
            text.contains("\nsmallest budget with overhead <= 1.5: window dtr-eq: "),
            "{text}"
        );
        let svg = p.with_extension("svg");
        run(&args(&[
            path,
            "--device-budget",
            "--sweep",
            "--plot",
            svg.to_str().unwrap(),
        ]))
        .unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.contains("allocator-blind (dtr-eq)") && drawn.contains("window (dtr-eq)"));
        // Errors.
        let e = args(&[path, "--device-budget", "--strategy", "belady"])
            .options()
            .unwrap_err();
        assert_eq!(
            e,
            "--strategy: unknown strategy 'belady' (use callback, window, window-total, window-score, window-first, window-deficit, window-move, window-move-all or window-move-ahead)"
        );
        let e = args(&[path, "--step", "1.5"]).options().unwrap_err();
        assert_eq!(e, "--step 1.5: expected a step in (0, 1] (e.g. 0.05)");
        let e = args(&[path, "--device-budget", "--alloc-conf", "bogus:1"])
            .options()
            .unwrap_err();
        assert!(e.starts_with("--alloc-conf: "), "{e}");
        assert!(Wrap::try_parse_from(["dtr", path, "--strategy", "window"]).is_err());
    }

    #[test]
    fn bad_logs_name_file_and_line() {
        let text = chain_log().replacen("\"TIME\":\"10\"", "\"TIME\":\"ten\"", 2);
        let p = write_log("bad.log", &text);
        let e = run(&args(&[p.to_str().unwrap()])).unwrap_err();
        assert_eq!(
            e,
            format!("{}: line 4: field TIME is not a number: 'ten'", p.display())
        );
        let e = run(&args(&["/nonexistent/dtr.log"])).unwrap_err();
        assert!(e.starts_with("/nonexistent/dtr.log: "), "{e}");
    }
}

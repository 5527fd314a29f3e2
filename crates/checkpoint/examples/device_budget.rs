//! The device-memory budget report (issues 11 and 28), h_DTR^eq, on the five shared DTR logs
//! and the recorded corpus (`corpus/*.log.gz`), each log in the fit or the report half
//! (`corpus/README.md`; constants are fitted on the fit half only):
//! - the summary (default allocator; `CONF=expandable_segments:True` or any
//!   PYTORCH_CUDA_ALLOC_CONF string runs the strategies under those settings): per log, the
//!   smallest ratio (0.05 steps) completing with overhead <= 1.5 for the allocator-blind run
//!   (simrd) and each strategy asked (default `callback`, `window` and `window-move-all`, the
//!   best on issue 28's logs); the main
//!   strategy's distance to the blind run, its worst overhead against the blind run at
//!   ratios >= 0.5, and whether it is monotone (no failure above a completed ratio but one
//!   0.05 step of noise); then the misses per half;
//! - with `LAYOUTS=...` also the detailed tables per layout (allocator settings, Coop's
//!   partition, in-place updates) and strategy: the smallest ratio, the worst overhead against
//!   the blind run at ratios >= 0.5, the overheads at 0.5, 0.6, ..., 1.0, and against
//!   `callback` on the same layout.
//!
//! Run: `cargo run --release -p checkpoint --example device_budget [LOG ...]` (a log is a
//! shared-log prefix such as `unet`, or a corpus stem such as `resnet50-32`; default all);
//! `STRATEGIES=window,callback` chooses the strategies, `LAYOUTS=default,expandable` asks for
//! the detailed tables (`LAYOUTS=all`: every layout); `STATUS=1` prints per log and ratio how
//! each run ended (the overhead, or OOM/THRASH with the phase and the share of the log where
//! it stopped, the misses, evictions and remats), to find why a strategy misses; `MAIN=NAME`
//! gives that strategy (default `window-move-all`) the distance, worst-overhead, monotone and
//! misses columns.

use std::path::{Path, PathBuf};
use std::time::Instant;

use c10_cuda::config::AllocatorConfig;
use checkpoint::sweep::{self, DeviceOptions, SweepOptions, SweepRun};
use checkpoint::{Status, Strategy, log};

const LAYOUTS: [(&str, &str, bool, bool); 6] = [
    ("default", "", false, false),
    ("expandable", "expandable_segments:True", false, false),
    ("default+partition", "", true, false),
    (
        "expandable+partition",
        "expandable_segments:True",
        true,
        false,
    ),
    ("default+in-place", "", false, true),
    (
        "expandable+in-place",
        "expandable_segments:True",
        false,
        true,
    ),
];

/// The shared logs (all in the fit half).
const SHARED: [&str; 5] = ["unet", "tv_densenet121", "lstm", "transformer", "resnet32"];

/// The corpus logs of the fit half (`corpus/README.md`); the others are the report half.
const FIT: [&str; 7] = [
    "resnet50-32",
    "resnet50-64",
    "densenet201-32",
    "mobilenet_v3_large-64",
    "vit_b_16-32",
    "unet-8",
    "gpt-4",
];

fn shared_log(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{prefix}-")) && n.ends_with(".log"))
        })
        .collect();
    paths.sort();
    paths.into_iter().next()
}

/// Every log: (name, half, path).
fn all_logs() -> Vec<(String, &'static str, PathBuf)> {
    let mut out = Vec::new();
    let dir = shared_data::expected_path().join("dtr-logs");
    if dir.is_dir() {
        for name in SHARED {
            if let Some(p) = shared_log(&dir, name) {
                out.push((name.to_string(), "fit", p));
            }
        }
    } else {
        println!("(no {}: the shared logs are left out)", dir.display());
    }
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut stems: Vec<(String, PathBuf)> = std::fs::read_dir(&corpus)
        .expect("the corpus folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let stem = p
                .file_name()?
                .to_str()?
                .strip_suffix(".log.gz")?
                .to_string();
            Some((stem, p))
        })
        .collect();
    stems.sort();
    for (stem, p) in stems {
        let half = if FIT.contains(&stem.as_str()) {
            "fit"
        } else {
            "report"
        };
        out.push((stem, half, p));
    }
    out
}

/// One strategy's figures on one log.
struct Stat {
    strategy: Strategy,
    half: &'static str,
    /// Smallest ratio minus the blind one (`inf`: none completes where the blind run does).
    distance: f64,
    /// Worst overhead against the blind run at ratios >= 0.5.
    worst: f64,
    monotone: bool,
    ms: f64,
}

fn overheads(runs: &[SweepRun]) -> Vec<Option<f64>> {
    runs.iter().map(|r| r.overhead).collect()
}

/// The worst `overhead / blind overhead` at ratios >= 0.5 where the blind run completes
/// (`inf` when the strategy fails there).
fn worst_vs_blind(ratios: &[f64], o: &[Option<f64>], blind: &[Option<f64>]) -> f64 {
    let mut worst: f64 = 0.0;
    for (k, r) in ratios.iter().enumerate() {
        if *r >= 0.5 - 1e-9 {
            if let Some(b) = blind[k] {
                worst = worst.max(o[k].map_or(f64::INFINITY, |x| x / b));
            }
        }
    }
    worst
}

/// Ratios where the run fails although a run two or more steps smaller completed (one step of
/// noise allowed).
fn monotone_breaks(ratios: &[f64], runs: &[SweepRun]) -> Vec<f64> {
    let ok: Vec<bool> = runs.iter().map(|r| r.status() == Status::Ok).collect();
    (0..ratios.len())
        .filter(|&k| !ok[k] && (0..k.saturating_sub(1)).any(|j| ok[j]))
        .map(|k| ratios[k])
        .collect()
}

fn fmt_ratio(s: Option<(f64, f64)>) -> String {
    s.map_or("none".into(), |s| format!("{:.2}", s.0))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let strategies: Vec<Strategy> = match std::env::var("STRATEGIES") {
        Ok(v) => v
            .split(',')
            .map(|x| x.parse().expect("a strategy"))
            .collect(),
        Err(_) => vec![
            Strategy::Callback,
            Strategy::Window,
            Strategy::WindowMoveAll,
        ],
    };
    let layouts = std::env::var("LAYOUTS").ok();
    // The strategy whose distance, worst overhead, monotonicity and misses get columns.
    let main_strategy: Strategy =
        std::env::var("MAIN").map_or(Strategy::WindowMoveAll, |v| v.parse().expect("a strategy"));
    let main_name = main_strategy.name();
    // The allocator settings of the summary's strategy runs (PYTORCH_CUDA_ALLOC_CONF syntax).
    let conf = std::env::var("CONF").unwrap_or_default();
    let alloc_conf = AllocatorConfig::parse(&conf).expect("CONF parses");
    let ratios: Vec<f64> = (1..=20).map(|k| k as f64 * 0.05).collect();
    let plain = SweepOptions {
        ratios: ratios.clone(),
        ..SweepOptions::default()
    };
    let mut summary = Vec::new();
    let mut stats: Vec<Stat> = Vec::new();
    for (name, half, path) in all_logs() {
        if !args.is_empty() && !args.contains(&name) {
            continue;
        }
        let lg = log::parse_file(&path).expect("log parses");
        let blind = sweep::sweep(&lg, &plain).expect("blind sweep");
        let blind_o = overheads(&blind.runs);
        let ideal = sweep::smallest_ratio(&blind.runs, 1.5);
        let mut cells = Vec::new();
        let mut window = None;
        for &strategy in &strategies {
            let options = SweepOptions {
                device: Some(DeviceOptions {
                    strategies: vec![strategy],
                    alloc_conf: alloc_conf.clone(),
                    ..DeviceOptions::default()
                }),
                ..plain.clone()
            };
            let t = Instant::now();
            let sw = sweep::sweep(&lg, &options).expect("device sweep");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            for r in &sw.runs {
                let a = r.allocator.expect("allocator");
                assert!(a.peak_reserved_bytes <= r.budget_bytes, "{name} {strategy}");
            }
            let smallest = sweep::smallest_ratio(&sw.runs, 1.5);
            cells.push(fmt_ratio(smallest));
            let o = overheads(&sw.runs);
            let distance = match (smallest, ideal) {
                (Some(s), Some(i)) => s.0 - i.0,
                (None, Some(_)) => f64::INFINITY,
                _ => 0.0,
            };
            stats.push(Stat {
                strategy,
                half,
                distance,
                worst: worst_vs_blind(&ratios, &o, &blind_o),
                monotone: monotone_breaks(&ratios, &sw.runs).is_empty(),
                ms,
            });
            if strategy == main_strategy {
                let o = overheads(&sw.runs);
                window = Some((
                    smallest,
                    worst_vs_blind(&ratios, &o, &blind_o),
                    monotone_breaks(&ratios, &sw.runs),
                    ms,
                ));
            }
        }
        if std::env::var("STATUS").is_ok_and(|v| v == "1") {
            status_table(&name, &lg, &blind, &plain, &strategies);
        }
        summary.push((name.clone(), half, ideal, cells, window));
        if let Some(only) = &layouts {
            detail(&name, &lg, &plain, &blind, &strategies, only);
        }
    }
    println!(
        "\n== smallest device budget (ratio of the no-eviction peak, 0.05 steps) completing with overhead <= 1.5, h_DTR^eq, allocator settings {:?}",
        if conf.is_empty() { "default" } else { &conf }
    );
    let names: Vec<&str> = strategies.iter().map(|s| s.name()).collect();
    println!(
        "| half | log | blind | {} | {main_name} - blind | {main_name} worst / blind at >= 0.5 | {main_name} monotone | {main_name} sweep ms |",
        names.join(" | ")
    );
    println!(
        "|---|---|---:|{}---:|---:|---|---:|",
        "---:|".repeat(names.len())
    );
    let mut misses: Vec<(&str, String)> = Vec::new();
    for (name, half, ideal, cells, window) in &summary {
        let (dist, worst, mono, ms) = match window {
            Some((s, worst, breaks, ms)) => {
                let dist = match (s, ideal) {
                    (Some(s), Some(i)) => format!("{:+.2}", s.0 - i.0),
                    (None, Some(_)) => "none".into(),
                    _ => "-".into(),
                };
                let d = match (s, ideal) {
                    (Some(s), Some(i)) => s.0 - i.0,
                    (None, Some(_)) => f64::INFINITY,
                    _ => 0.0,
                };
                if d > 0.05 + 1e-9 || *worst > 1.10 || !breaks.is_empty() {
                    misses.push((
                        half,
                        format!("{name} (distance {dist}, worst {worst:.3}, breaks {breaks:?})"),
                    ));
                }
                (
                    dist,
                    if worst.is_finite() {
                        format!("{worst:.3}")
                    } else {
                        "fails".into()
                    },
                    if breaks.is_empty() {
                        "yes".to_string()
                    } else {
                        format!("no: fails at {breaks:?}")
                    },
                    format!("{ms:.0}"),
                )
            }
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {half} | {name} | {} | {} | {dist} | {worst} | {mono} | {ms} |",
            fmt_ratio(*ideal),
            cells.join(" | ")
        );
    }
    println!(
        "\n== per strategy and half: logs within 0.05 of blind / worst overhead at >= 0.5 within 1.10x of blind / monotone / all three; mean and largest distance to blind; summed sweep time"
    );
    println!(
        "| strategy | half | logs | within 0.05 | worst <= 1.10 | monotone | all three | mean distance | largest distance | sweep s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &strategy in &strategies {
        for half in ["fit", "report"] {
            let v: Vec<&Stat> = stats
                .iter()
                .filter(|s| s.strategy == strategy && s.half == half)
                .collect();
            if v.is_empty() {
                continue;
            }
            let within = |s: &Stat| s.distance <= 0.05 + 1e-9;
            let bounded = |s: &Stat| s.worst <= 1.10;
            let finite: Vec<f64> = v
                .iter()
                .map(|s| s.distance)
                .filter(|d| d.is_finite())
                .collect();
            let largest = v
                .iter()
                .map(|s| s.distance)
                .fold(f64::NEG_INFINITY, f64::max);
            println!(
                "| {strategy} | {half} | {} | {} | {} | {} | {} | {:+.3} | {} | {:.1} |",
                v.len(),
                v.iter().filter(|s| within(s)).count(),
                v.iter().filter(|s| bounded(s)).count(),
                v.iter().filter(|s| s.monotone).count(),
                v.iter()
                    .filter(|s| within(s) && bounded(s) && s.monotone)
                    .count(),
                finite.iter().sum::<f64>() / finite.len().max(1) as f64,
                if largest.is_finite() {
                    format!("{largest:+.2}")
                } else {
                    "none".into()
                },
                v.iter().map(|s| s.ms).sum::<f64>() / 1e3
            );
        }
    }
    for half in ["fit", "report"] {
        let m: Vec<&String> = misses
            .iter()
            .filter(|(h, _)| *h == half)
            .map(|(_, m)| m)
            .collect();
        let n = summary.iter().filter(|s| s.1 == half).count();
        println!(
            "{half} half: {main_name} misses a target (within 0.05 of blind, worst <= 1.10, monotone) on {} of {n} logs{}",
            m.len(),
            if m.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    m.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")
                )
            }
        );
    }
}

/// The detailed tables of one log, per layout and strategy.
/// Per ratio, how the blind run and each strategy's run ended (`STATUS=1`).
fn status_table(
    name: &str,
    lg: &log::Log,
    blind: &sweep::Sweep,
    plain: &SweepOptions,
    strategies: &[Strategy],
) {
    let backward = lg
        .events
        .iter()
        .find(|e| matches!(&e.event, log::Event::Annotate(a) if a == "BACKWARD"))
        .map(|e| e.line);
    let last = lg.events.last().map_or(1, |e| e.line).max(1);
    let cell = |r: &SweepRun| -> String {
        let p = &r.result.profile;
        let end = match r.overhead {
            Some(o) => format!("{o:.3}"),
            None => {
                let at = r.result.stopped_at.unwrap_or(0);
                let phase = match (at, backward) {
                    (0, _) => "final pins".to_string(),
                    (a, Some(b)) if a > b => format!("bwd {:.0}%", 100.0 * a as f64 / last as f64),
                    (a, _) => format!("fwd {:.0}%", 100.0 * a as f64 / last as f64),
                };
                format!("{} {phase}", r.status())
            }
        };
        let frag = r.allocator.map_or(String::new(), |a| {
            format!(" f{:.0}%", a.fragmentation() * 100.0)
        });
        format!("{end} m{} e{} r{}{frag}", p.misses, p.evictions, p.remats)
    };
    println!(
        "\n== {name}: how each run ended (overhead, or status, phase and where; misses, evictions, remats, fragmentation at the reserved peak)"
    );
    let mut head = "| ratio | blind".to_string();
    let mut runs: Vec<sweep::Sweep> = Vec::new();
    for &strategy in strategies {
        head.push_str(&format!(" | {strategy}"));
        let options = SweepOptions {
            device: Some(DeviceOptions {
                strategies: vec![strategy],
                ..DeviceOptions::default()
            }),
            ..plain.clone()
        };
        runs.push(sweep::sweep(lg, &options).expect("device sweep"));
    }
    println!("{head} |");
    for (k, r) in plain.ratios.iter().enumerate() {
        let mut line = format!("| {r:.2} | {}", cell(&blind.runs[k]));
        for sw in &runs {
            line.push_str(&format!(" | {}", cell(&sw.runs[k])));
        }
        println!("{line} |");
    }
}

fn detail(
    name: &str,
    lg: &log::Log,
    plain: &SweepOptions,
    blind: &sweep::Sweep,
    strategies: &[Strategy],
    only: &str,
) {
    let ratios = &plain.ratios;
    let blind_o = overheads(&blind.runs);
    println!(
        "\n== {name}: allocator-blind ideal {}",
        sweep::smallest_ratio(&blind.runs, 1.5)
            .map_or("none".into(), |(r, o)| format!("{r:.2} (overhead {o:.3})"))
    );
    println!(
        "| layout | strategy | smallest | overhead there | worst / blind at >= 0.5 | overheads at 0.5 .. 1.0 | vs callback: lower / higher, mean overhead | sweep ms |"
    );
    println!("|---|---|---:|---:|---:|---|---|---:|");
    for (lname, conf, partition, in_place) in LAYOUTS {
        if only != "all" && !only.split(',').any(|x| x == lname) {
            continue;
        }
        let mut callback: Option<Vec<Option<f64>>> = None;
        let mut rows = Vec::new();
        for &strategy in strategies {
            let options = SweepOptions {
                device: Some(DeviceOptions {
                    strategies: vec![strategy],
                    alloc_conf: AllocatorConfig::parse(conf).expect("config"),
                    partition,
                    in_place,
                }),
                ..plain.clone()
            };
            let t = Instant::now();
            let sw = sweep::sweep(lg, &options).expect("device sweep");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            for r in &sw.runs {
                let a = r.allocator.expect("allocator");
                assert!(a.peak_reserved_bytes <= r.budget_bytes, "{name} {strategy}");
            }
            let o = overheads(&sw.runs);
            if strategy == Strategy::Callback {
                callback = Some(o.clone());
            }
            rows.push((strategy, sweep::smallest_ratio(&sw.runs, 1.5), o, ms));
        }
        for (strategy, smallest, o, ms) in rows {
            let worst = worst_vs_blind(ratios, &o, &blind_o);
            let at: Vec<String> = (9..20)
                .step_by(2)
                .map(|k| o[k].map_or("-".into(), |x| format!("{x:.3}")))
                .collect();
            let vs = match (&callback, strategy) {
                (Some(c), s) if s != Strategy::Callback => {
                    let common: Vec<(f64, f64)> = o
                        .iter()
                        .zip(c)
                        .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
                        .collect();
                    let lower = common.iter().filter(|(a, b)| a < &(b - 1e-4)).count();
                    let higher = common.iter().filter(|(a, b)| a > &(b + 1e-4)).count();
                    let mean = |f: fn(&(f64, f64)) -> f64| {
                        common.iter().map(f).sum::<f64>() / common.len().max(1) as f64
                    };
                    format!(
                        "{lower} / {higher} of {}, {:.4} vs {:.4}",
                        common.len(),
                        mean(|x| x.0),
                        mean(|x| x.1)
                    )
                }
                _ => "-".into(),
            };
            println!(
                "| {lname} | {strategy} | {} | {} | {} | {} | {vs} | {ms:.0} |",
                fmt_ratio(smallest),
                smallest.map_or("-".into(), |s| format!("{:.3}", s.1)),
                if worst.is_finite() {
                    format!("{worst:.3}")
                } else {
                    "fails".into()
                },
                at.join(" ")
            );
        }
    }
}

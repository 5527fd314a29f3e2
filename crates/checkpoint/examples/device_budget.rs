//! The device-memory budget report: per shared DTR log and per layout (allocator settings,
//! Coop's partition, in-place updates) and strategy, the smallest device budget (0.05 steps of
//! the log's no-eviction peak) at which h_DTR^eq completes with overhead <= 1.5, against the
//! allocator-blind simulator, and the overheads at ratios 0.5 .. 1.0.
//!
//! Run: `cargo run --release -p checkpoint --example device_budget [LOG-PREFIX ...]`.

use std::path::PathBuf;
use std::time::Instant;

use c10_cuda::config::AllocatorConfig;
use checkpoint::sweep::{self, DeviceOptions, SweepOptions};
use checkpoint::{Heuristic, Strategy, budget_for_ratio, log, sim};

fn logs_dir() -> PathBuf {
    shared_data::expected_path().join("dtr-logs")
}

fn load(prefix: &str) -> log::Log {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(logs_dir())
        .expect("readable log folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{prefix}-")) && n.ends_with(".log"))
        })
        .collect();
    paths.sort();
    log::parse_file(&paths[0]).expect("log parses")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<&str> = if args.is_empty() {
        vec!["unet", "tv_densenet121", "lstm", "transformer", "resnet32"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    let ratios: Vec<f64> = match std::env::var("RATIOS") {
        Ok(r) => r.split(',').map(|x| x.parse().unwrap()).collect(),
        Err(_) => (1..=20).map(|k| k as f64 * 0.05).collect(),
    };
    let only = std::env::var("LAYOUTS").ok();
    let mut layouts: Vec<(&str, &str, bool, bool)> = vec![
        ("default", "", false, false),
        ("expandable", "expandable_segments:True", false, false),
        ("default+partition", "", true, false),
        ("default+in-place", "", false, true),
        (
            "expandable+in-place",
            "expandable_segments:True",
            false,
            true,
        ),
        (
            "expandable+partition",
            "expandable_segments:True",
            true,
            false,
        ),
    ];
    if let Some(only) = &only {
        layouts.retain(|l| only.split(',').any(|o| o == l.0));
    }
    for name in names {
        let lg = load(name);
        let base = sim::baseline(&lg).expect("baseline");
        let blind = SweepOptions {
            ratios: ratios.clone(),
            ..SweepOptions::default()
        };
        let bsw = sweep::sweep(&lg, &blind).expect("blind sweep");
        let smallest = |runs: &[(f64, Option<f64>)]| {
            runs.iter()
                .filter(|(_, o)| o.is_some_and(|o| o <= 1.5))
                .map(|(r, _)| *r)
                .fold(f64::INFINITY, f64::min)
        };
        let b: Vec<(f64, Option<f64>)> = bsw.runs.iter().map(|r| (r.ratio, r.overhead)).collect();
        println!("== {name}: blind smallest {:.2}", smallest(&b));
        for (lname, conf, partition, in_place) in &layouts {
            let strategies: Vec<Strategy> = match std::env::var("STRATEGIES") {
                Ok(v) => v.split(',').map(|x| x.parse().expect("strategy")).collect(),
                Err(_) => vec![Strategy::Callback, Strategy::default()],
            };
            for strategy in strategies {
                let options = SweepOptions {
                    device: Some(DeviceOptions {
                        strategies: vec![strategy],
                        alloc_conf: AllocatorConfig::parse(conf).unwrap(),
                        partition: *partition,
                        in_place: *in_place,
                    }),
                    ..SweepOptions::default()
                };
                let t = Instant::now();
                let mut runs = Vec::new();
                let mut worst_vs_blind: f64 = 0.0;
                let mut over_cap = 0;
                for (k, &ratio) in ratios.iter().enumerate() {
                    let budget = budget_for_ratio(base.peak_bytes, ratio);
                    let r = sweep::run_device_budget(
                        &lg,
                        &base,
                        Heuristic::DtrEq,
                        strategy,
                        budget,
                        &options,
                    )
                    .expect("run");
                    let a = r.allocator.unwrap();
                    if a.peak_reserved_bytes > budget || r.result.profile.peak_bytes > budget {
                        over_cap += 1;
                    }
                    if std::env::var("VERBOSE").is_ok() {
                        eprintln!(
                            "  {ratio:.2} {} {:?} peak {} alloc {} res {} ev {} remat {} miss {}",
                            r.status(),
                            r.overhead,
                            r.result.profile.peak_bytes,
                            a.peak_allocated_bytes,
                            a.peak_reserved_bytes,
                            r.result.profile.evictions,
                            r.result.profile.remats,
                            r.result.profile.misses
                        );
                    }
                    if ratio >= 0.5 - 1e-9 {
                        if let (Some(o), Some(bo)) = (r.overhead, bsw.runs[k].overhead) {
                            worst_vs_blind = worst_vs_blind.max(o / bo);
                        } else if bsw.runs[k].overhead.is_some() {
                            worst_vs_blind = f64::INFINITY;
                        }
                    }
                    runs.push((ratio, r.overhead));
                }
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if std::env::var("RAW").is_ok() {
                    let all: Vec<String> = runs
                        .iter()
                        .map(|(_, o)| o.map_or("-".into(), |o| format!("{o:.4}")))
                        .collect();
                    let bl: Vec<String> = bsw
                        .runs
                        .iter()
                        .map(|r| r.overhead.map_or("-".into(), |o| format!("{o:.4}")))
                        .collect();
                    println!(
                        "RAW {name} {lname} {} {} | {}",
                        strategy.name(),
                        all.join(","),
                        bl.join(",")
                    );
                }
                let o: Vec<String> = runs
                    .iter()
                    .filter(|(r, _)| *r >= 0.5 - 1e-9 && ((r * 20.0).round() as i64) % 2 == 0)
                    .map(|(_, o)| o.map_or("-".into(), |o| format!("{o:.3}")))
                    .collect();
                println!(
                    "{name:>15} {lname:<20} {:<8} smallest {:.2}  worst/blind@>=0.5 {:.3}  over-cap {over_cap}  {ms:.0} ms  [{}]",
                    strategy.name(),
                    smallest(&runs),
                    worst_vs_blind,
                    o.join(" ")
                );
            }
        }
    }
}

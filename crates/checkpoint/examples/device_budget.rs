//! The device-memory budget report (issue 11): per shared DTR log, h_DTR^eq,
//! - today: the counting budget on the simulated allocator (`--with-allocator`): the least
//!   device memory (reserved peak / no-eviction peak) of a run completing with overhead <= 1.5;
//! - the allocator-blind ideal (simrd): the smallest budget ratio completing with overhead
//!   <= 1.5;
//! - per layout (allocator settings, Coop's partition, in-place updates) and strategy, with
//!   every budget a device's capacity: the smallest ratio (0.05 steps) completing with
//!   overhead <= 1.5, the worst overhead against the blind run at ratios >= 0.5, the overheads
//!   at 0.5, 0.6, ..., 1.0, and against `callback` on the same layout: ratios where each is
//!   lower, and the mean overhead over the ratios where both complete.
//!
//! Run: `cargo run --release -p checkpoint --example device_budget [LOG-PREFIX ...]`;
//! `STRATEGIES=window,callback` and `LAYOUTS=default,expandable` narrow it down.

use std::path::PathBuf;
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

fn load(dir: &std::path::Path, prefix: &str) -> Option<log::Log> {
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
    Some(log::parse_file(paths.first()?).expect("log parses"))
}

fn overheads(runs: &[SweepRun]) -> Vec<Option<f64>> {
    runs.iter().map(|r| r.overhead).collect()
}

fn main() {
    let dir = shared_data::expected_path().join("dtr-logs");
    if !dir.is_dir() {
        println!("skipping: no {} (set TENSORMEM_SHARED)", dir.display());
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<&str> = if args.is_empty() {
        vec!["unet", "tv_densenet121", "lstm", "transformer", "resnet32"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    let strategies: Vec<Strategy> = match std::env::var("STRATEGIES") {
        Ok(v) => v
            .split(',')
            .map(|x| x.parse().expect("a strategy"))
            .collect(),
        Err(_) => Strategy::ALL.to_vec(),
    };
    let only = std::env::var("LAYOUTS").ok();
    let ratios: Vec<f64> = (1..=20).map(|k| k as f64 * 0.05).collect();
    for name in names {
        let Some(lg) = load(&dir, name) else {
            println!("skipping {name}: no such log");
            continue;
        };
        let plain = SweepOptions {
            ratios: ratios.clone(),
            ..SweepOptions::default()
        };
        let blind = sweep::sweep(&lg, &plain).expect("blind sweep");
        let counted = sweep::sweep(
            &lg,
            &SweepOptions {
                with_allocator: true,
                ..plain.clone()
            },
        )
        .expect("counting sweep");
        let peak = blind.baseline.peak_bytes as f64;
        let today = counted
            .runs
            .iter()
            .filter(|r| r.status() == Status::Ok && r.overhead.is_some_and(|o| o <= 1.5))
            .map(|r| {
                (
                    r.allocator.expect("allocator").peak_reserved_bytes as f64 / peak,
                    r.ratio,
                )
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let ideal = sweep::smallest_ratio(&blind.runs, 1.5);
        println!(
            "\n== {name}: today (counting budget) as device memory {}; allocator-blind ideal {}",
            today.map_or("none".into(), |(d, r)| format!(
                "{d:.3} (counting ratio {r:.2})"
            )),
            ideal.map_or("none".into(), |(r, o)| format!("{r:.2} (overhead {o:.3})"))
        );
        println!(
            "| layout | strategy | smallest | overhead there | worst / blind at >= 0.5 | overheads at 0.5 .. 1.0 | vs callback: lower / higher, mean overhead | sweep ms |"
        );
        println!("|---|---|---:|---:|---:|---|---|---:|");
        let blind_o = overheads(&blind.runs);
        for (lname, conf, partition, in_place) in LAYOUTS {
            if only
                .as_ref()
                .is_some_and(|o| !o.split(',').any(|x| x == lname))
            {
                continue;
            }
            let mut callback: Option<Vec<Option<f64>>> = None;
            let mut rows = Vec::new();
            for &strategy in &strategies {
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
                let sw = sweep::sweep(&lg, &options).expect("device sweep");
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
                let mut worst: f64 = 0.0;
                for (k, r) in ratios.iter().enumerate() {
                    if *r >= 0.5 - 1e-9 {
                        if let Some(b) = blind_o[k] {
                            worst = worst.max(o[k].map_or(f64::INFINITY, |x| x / b));
                        }
                    }
                }
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
                    smallest.map_or("none".into(), |s| format!("{:.2}", s.0)),
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
}

//! `tensormem dtr LOG`: Dynamic Tensor Rematerialization simulated on one of the DTR paper's
//! operator logs under hard budgets (the `checkpoint` crate), as a table, JSON or an SVG plot.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use checkpoint::sweep::{self, Sweep, SweepOptions};
use checkpoint::{Heuristic, log};
use plotters::prelude::*;

use tensormem::size::parse_size;

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
    /// Heuristics: dtr, dtr-eq, dtr-local, lru, largest, msps, random (comma-separated or
    /// repeated; default dtr-eq, or all of them with --sweep).
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
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
    /// Draw overhead against budget ratio, one line per heuristic, into an .svg file.
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
}

impl DtrArgs {
    fn options(&self) -> Result<SweepOptions, String> {
        let heuristics = if !self.heuristic.is_empty() {
            self.heuristic
                .iter()
                .map(|h| {
                    h.parse::<Heuristic>()
                        .map_err(|e| format!("--heuristic: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?
        } else if self.sweep {
            Heuristic::ALL.to_vec()
        } else {
            vec![Heuristic::DtrEq]
        };
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
            (None, None) => (sweep::paper_ratios(), Vec::new()),
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
            ..SweepOptions::default()
        })
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
    if let Some(p) = &args.plot {
        plot(p, &name, &sw).map_err(|e| format!("--plot {}: {e}", p.display()))?;
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

fn json(name: &str, lg: &log::Log, options: &SweepOptions, sw: &Sweep) -> serde_json::Value {
    let runs: Vec<serde_json::Value> = sw
        .runs
        .iter()
        .map(|r| {
            let p = &r.result.profile;
            let mut v = serde_json::json!({
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

/// Overhead (y) against budget ratio (x), one line per heuristic; runs that ended in OOM or
/// THRASH break the line.
fn plot(path: &Path, title: &str, sw: &Sweep) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut heuristics: Vec<Heuristic> = Vec::new();
    for r in &sw.runs {
        if !heuristics.contains(&r.heuristic) {
            heuristics.push(r.heuristic);
        }
    }
    let x1 = sw.runs.iter().map(|r| r.ratio).fold(1.0f64, f64::max);
    let y1 = sw
        .runs
        .iter()
        .filter_map(|r| r.overhead)
        .fold(1.1f64, f64::max)
        * 1.02;
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
        .x_desc("budget / no-eviction peak")
        .y_desc("overhead (compute / baseline)")
        .draw()
        .map_err(|e| err(&e))?;
    for (k, h) in heuristics.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let mut runs: Vec<&sweep::SweepRun> =
            sw.runs.iter().filter(|r| r.heuristic == *h).collect();
        runs.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for r in runs {
            match r.overhead {
                Some(o) => segments.last_mut().expect("segment").push((r.ratio, o)),
                None => segments.push(Vec::new()),
            }
        }
        let mut labelled = false;
        for seg in segments.into_iter().filter(|s| !s.is_empty()) {
            chart
                .draw_series(
                    seg.iter()
                        .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                )
                .map_err(|e| err(&e))?;
            let series = chart
                .draw_series(LineSeries::new(seg, color.stroke_width(2)))
                .map_err(|e| err(&e))?;
            if !labelled {
                labelled = true;
                series.label(h.name()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
        }
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
        let mut w = checkpoint::LogWriter::new(Vec::new());
        w.annotate("START").unwrap();
        w.constant("x0", 100).unwrap();
        for i in 1..=6 {
            let (prev, name) = (format!("x{}", i - 1), format!("x{i}"));
            w.call("f", &[prev], &[(name.as_str(), 100, None)], 10)
                .unwrap();
        }
        w.annotate("BACKWARD").unwrap();
        w.call("loss", &["x6"], &[("g6", 100, None)], 10).unwrap();
        for i in (1..=5).rev() {
            let (g, a, out) = (format!("g{}", i + 1), format!("x{i}"), format!("g{i}"));
            w.call(
                "f_backward",
                &[g.as_str(), a.as_str()],
                &[(out.as_str(), 100, None)],
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

//! The GPU bench of the GPU bundle (`cargo xtask gpu-bundle`): our caching allocator on
//! `CudaDevice` beside cudarc's stream-ordered allocation (`cuMemAllocAsync`/`cuMemFreeAsync` on
//! the device's default pool, what candle uses) and raw `cuMemAlloc`/`cuMemFree`, in one run:
//! ns per alloc+free pair and peak device memory (`cuMemGetInfo`) for warm pairs and the six
//! shared traces, and the largest trace with `expandable_segments:True` on the GPU against the
//! same replay on the simulated device.
//!
//! ```text
//! gpu-bench convert OUT_DIR          # here: the shared snapshots -> OUT_DIR/<trace>.ops
//! gpu-bench run TRACE_DIR [--json FILE] [--seconds S]   # on the GPU
//! ```
//!
//! The `.ops` files are torch-oracle's op scripts (`alloc ID SIZE [STREAM]`, `free ID`), written
//! by the alloc bench's trace reader, so this bench replays exactly the calls of the CPU bench.

#[allow(dead_code)]
// The alloc bench's trace reader, shared with c10-cuda's CPU bench.
#[path = "../../../c10-cuda/benches/alloc/trace.rs"]
mod trace;

mod backends;
mod ops;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use backends::{Backend, Driver, Ours, Raw, StreamOrdered};
use ops::{Op, Trace};

const GIB: f64 = (1u64 << 30) as f64;

/// The largest shared trace: replayed with `expandable_segments:True` as well.
const LARGEST: &str = "lm2.7b_ctx128_trainstep_fp32";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("convert") if args.len() == 2 => convert(Path::new(&args[1])),
        Some("run") if args.len() >= 2 => parse_run(&args[1..]).and_then(|o| run(&o)),
        _ => Err(
            "usage: gpu-bench convert OUT_DIR | gpu-bench run TRACE_DIR [--json FILE] \
                  [--seconds S]"
                .to_string(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the op script of every shared trace that is present into `out`.
fn convert(out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let traces = trace::load_traces()?;
    if traces.is_empty() {
        return Err(format!(
            "no shared trace found in {}",
            trace::snapshots_dir().display()
        ));
    }
    for t in &traces {
        let path = t.write_ops(out)?;
        println!(
            "{}: {} allocs, {} frees",
            path.display(),
            t.allocs(),
            t.frees()
        );
    }
    Ok(())
}

struct RunOptions {
    traces: PathBuf,
    json: Option<PathBuf>,
    /// Wall-time cap of one replay: a backend that takes longer is stopped and reported so.
    cap: Duration,
}

fn parse_run(args: &[String]) -> Result<RunOptions, String> {
    let mut options = RunOptions {
        traces: PathBuf::from(&args[0]),
        json: None,
        cap: Duration::from_secs(20),
    };
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--json" => options.json = Some(PathBuf::from(value()?)),
            "--seconds" => {
                let v = value()?;
                let s: f64 = v
                    .parse()
                    .map_err(|_| format!("--seconds {v}: not a number"))?;
                options.cap = Duration::from_secs_f64(s);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(options)
}

/// One measured replay.
#[derive(Clone, Debug)]
struct Row {
    workload: String,
    backend: &'static str,
    pairs: usize,
    /// Cold: first replay on a fresh allocator; warm: the same replay again on it.
    cold_ns_per_pair: Option<f64>,
    warm_ns_per_pair: Option<f64>,
    /// Peak of `total - free` from `cuMemGetInfo` (sampled after every allocation of a third,
    /// untimed replay on a fresh allocator), above the level before it, in bytes.
    peak_device_bytes: Option<u64>,
    note: String,
}

fn run(options: &RunOptions) -> Result<(), String> {
    let driver = Driver::open()?;
    println!("gpu-bench on {}", driver.describe());
    // The alloc bench's warm pairs (512 B, 1 MiB, 20 MiB); fewer of the 20 MiB ones, which
    // raw cuMemAlloc serves slowly.
    let mut traces: Vec<Trace> = trace::warm_pairs(20_000)
        .iter()
        .take(2)
        .map(Trace::from)
        .collect();
    traces.extend(trace::warm_pairs(2_000).iter().skip(2).map(Trace::from));
    for name in trace::TRACES {
        let path = options.traces.join(format!("{name}.ops"));
        match Trace::read(name, &path) {
            Ok(t) => traces.push(t),
            Err(e) => println!("{name}: skipped ({e})"),
        }
    }
    let mut rows = Vec::new();
    for t in &traces {
        for kind in ["ours", "cuMemAllocAsync", "cuMemAlloc"] {
            let row = measure(&driver, t, kind, options.cap);
            println!("{}", one_line(&row));
            rows.push(row);
        }
    }
    let expandable = traces
        .iter()
        .find(|t| t.name == LARGEST)
        .map(|t| expandable(&driver, t));
    let table = table(&rows, expandable.as_ref());
    println!("\n{table}");
    if let Some(path) = &options.json {
        let json = serde_json::json!({
            "device": driver.describe(),
            "rows": rows.iter().map(|r| serde_json::json!({
                "workload": r.workload,
                "backend": r.backend,
                "pairs": r.pairs,
                "cold_ns_per_pair": r.cold_ns_per_pair,
                "warm_ns_per_pair": r.warm_ns_per_pair,
                "peak_device_bytes": r.peak_device_bytes,
                "note": r.note,
            })).collect::<Vec<_>>(),
            "expandable": expandable.as_ref().map(|e| serde_json::json!({
                "trace": LARGEST,
                "gpu_peak_reserved": e.gpu_peak_reserved,
                "sim_peak_reserved": e.sim_peak_reserved,
                "gpu_peak_device_bytes": e.gpu_peak_device,
                "error": e.error,
            })),
        });
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json).unwrap_or_default(),
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    match expandable {
        Some(Expandable { error: Some(e), .. }) => Err(format!("expandable segments: {e}")),
        Some(e) if e.gpu_peak_reserved != e.sim_peak_reserved => Err(format!(
            "expandable segments: peak reserved {:?} on the GPU, {:?} simulated",
            e.gpu_peak_reserved, e.sim_peak_reserved
        )),
        _ if rows
            .iter()
            .any(|r| r.backend == "ours" && !r.note.is_empty()) =>
        {
            Err("a replay through our allocator failed (see the table)".into())
        }
        _ => Ok(()),
    }
}

/// Cold and warm timed replays and an untimed peak replay of `t` on backend `kind`.
fn measure(driver: &Driver, t: &Trace, kind: &'static str, cap: Duration) -> Row {
    let mut row = Row {
        workload: t.name.clone(),
        backend: kind,
        pairs: t.allocs,
        cold_ns_per_pair: None,
        warm_ns_per_pair: None,
        peak_device_bytes: None,
        note: String::new(),
    };
    let outcome = (|| -> Result<(), String> {
        let mut backend = new_backend(driver, kind, t.streams, "")?;
        row.cold_ns_per_pair = Some(replay(backend.as_mut(), t, None, cap)?);
        row.warm_ns_per_pair = Some(replay(backend.as_mut(), t, None, cap)?);
        drop(backend);
        driver.trim()?;
        let mut backend = new_backend(driver, kind, t.streams, "")?;
        let base = driver.used()?;
        let mut peak = base;
        replay(backend.as_mut(), t, Some((driver, &mut peak)), cap * 4)?;
        row.peak_device_bytes = Some(peak.saturating_sub(base));
        drop(backend);
        driver.trim()
    })();
    if let Err(e) = outcome {
        row.note = e;
        let _ = driver.trim();
    }
    row
}

fn new_backend(
    driver: &Driver,
    kind: &str,
    streams: u32,
    config: &str,
) -> Result<Box<dyn Backend>, String> {
    Ok(match kind {
        "ours" => Box::new(Ours::new(streams, config)?),
        "cuMemAllocAsync" => Box::new(StreamOrdered::new(driver, streams)?),
        _ => Box::new(Raw::new(driver)?),
    })
}

/// Replays `t` once; returns ns per pair. With `peak`, samples device use after every
/// allocation (untimed). Every block still live at the end (or at a failure) is freed.
fn replay(
    backend: &mut dyn Backend,
    t: &Trace,
    mut peak: Option<(&Driver, &mut u64)>,
    cap: Duration,
) -> Result<f64, String> {
    let mut live: Vec<Option<(u64, usize, u32)>> = vec![None; t.slots];
    let start = Instant::now();
    let mut result = Ok(());
    for (i, op) in t.ops.iter().enumerate() {
        let step = match *op {
            Op::Alloc { size, slot, stream } => backend.alloc(size, stream).map(|ptr| {
                live[slot as usize] = Some((ptr, size, stream));
            }),
            Op::Free { slot } => match live[slot as usize].take() {
                Some((ptr, size, stream)) => backend.free(ptr, size, stream),
                None => Ok(()),
            },
        };
        if let Err(e) = step {
            result = Err(e);
            break;
        }
        if let (Some((driver, peak)), Op::Alloc { .. }) = (peak.as_mut(), op) {
            match driver.used() {
                Ok(used) => **peak = (**peak).max(used),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if i % 4096 == 0 && start.elapsed() > cap {
            result = Err(format!("stopped after {:.0} s (cap)", cap.as_secs_f64()));
            break;
        }
    }
    let finished = backend.finish();
    let elapsed = start.elapsed();
    for (ptr, size, stream) in live.into_iter().flatten() {
        let _ = backend.free(ptr, size, stream);
    }
    let _ = backend.finish();
    result?;
    finished?;
    Ok(elapsed.as_nanos() as f64 / t.allocs.max(1) as f64)
}

/// The largest trace with `expandable_segments:True`, on the GPU and on the simulated device.
struct Expandable {
    gpu_peak_reserved: Option<u64>,
    sim_peak_reserved: Option<u64>,
    gpu_peak_device: Option<u64>,
    error: Option<String>,
}

fn expandable(driver: &Driver, t: &Trace) -> Expandable {
    const CONFIG: &str = "expandable_segments:True";
    let mut out = Expandable {
        gpu_peak_reserved: None,
        sim_peak_reserved: None,
        gpu_peak_device: None,
        error: None,
    };
    let outcome = (|| -> Result<(), String> {
        let _ = driver.trim();
        let mut gpu = Ours::new(t.streams, CONFIG)?;
        let base = driver.used()?;
        let mut peak = base;
        replay(
            &mut gpu,
            t,
            Some((driver, &mut peak)),
            Duration::from_secs(120),
        )?;
        out.gpu_peak_device = Some(peak.saturating_sub(base));
        out.gpu_peak_reserved = Some(gpu.peak_reserved()?);
        drop(gpu);
        let total = driver.total()?;
        out.sim_peak_reserved = Some(backends::simulated_peak_reserved(t, CONFIG, total)?);
        Ok(())
    })();
    out.error = outcome.err();
    out
}

fn fmt_ns(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

fn fmt_gib(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| format!("{:.3}", v as f64 / GIB))
}

fn one_line(r: &Row) -> String {
    format!(
        "{} {}: cold {} ns/pair, warm {} ns/pair, peak {} GiB{}",
        r.workload,
        r.backend,
        fmt_ns(r.cold_ns_per_pair),
        fmt_ns(r.warm_ns_per_pair),
        fmt_gib(r.peak_device_bytes),
        if r.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.note)
        }
    )
}

/// The markdown table of the run: one line per workload, each backend's ns per pair (cold /
/// warm) and peak, and the ratios of the others to ours (warm).
fn table(rows: &[Row], expandable: Option<&Expandable>) -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "| workload | pairs | ours cold/warm ns | async cold/warm ns | cuMemAlloc cold/warm ns | \
         async/ours (warm) | cuMemAlloc/ours (warm) | peak GiB ours / async / cuMemAlloc |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for chunk in rows.chunks(3) {
        let [ours, asynchronous, raw] = chunk else {
            continue;
        };
        let ratio = |r: &Row| match (r.warm_ns_per_pair, ours.warm_ns_per_pair) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
            _ => "-".into(),
        };
        let cell = |r: &Row| {
            if r.note.is_empty() {
                format!(
                    "{} / {}",
                    fmt_ns(r.cold_ns_per_pair),
                    fmt_ns(r.warm_ns_per_pair)
                )
            } else {
                format!("failed: {}", r.note)
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} / {} |",
            ours.workload,
            ours.pairs,
            cell(ours),
            cell(asynchronous),
            cell(raw),
            ratio(asynchronous),
            ratio(raw),
            fmt_gib(ours.peak_device_bytes),
            fmt_gib(asynchronous.peak_device_bytes),
            fmt_gib(raw.peak_device_bytes),
        );
    }
    if let Some(e) = expandable {
        let _ = writeln!(
            out,
            "\n{LARGEST} with expandable_segments:True: peak reserved {} GiB on the GPU, {} GiB \
             simulated, device use peak {} GiB{}",
            fmt_gib(e.gpu_peak_reserved),
            fmt_gib(e.sim_peak_reserved),
            fmt_gib(e.gpu_peak_device),
            e.error
                .as_ref()
                .map(|e| format!(" (FAILED: {e})"))
                .unwrap_or_default()
        );
    }
    out
}

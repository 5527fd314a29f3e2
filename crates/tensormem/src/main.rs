//! The `tensormem` command: replay PyTorch memory snapshots through our caching allocator.
//!
//! `tensormem` with no arguments runs the built-in demo; `tensormem replay FILE` replays a
//! snapshot (see `tensormem replay --help`). Errors print one line and exit with status 2.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use c10_cuda::config::AllocatorConfig;
use tensormem::replay::{ReplayOptions, replay};
use tensormem::report::{self, JsonReport};
use tensormem::size::parse_size;
use tensormem::train::{self, BudgetChoice, Model, TrainOptions};
use tensormem::{demo, load, plot, state, sweep};

mod dtr;

/// Replay real PyTorch memory snapshots through a Rust re-implementation of PyTorch's CUDA
/// caching allocator, and report what happened and what would happen under other settings.
#[derive(Parser)]
#[command(name = "tensormem", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a snapshot from torch.cuda.memory._dump_snapshot() (pickle) or its JSON export.
    Replay(ReplayArgs),
    /// Run the built-in demo workload (two training steps of a small transformer); the default.
    Demo,
    /// Simulate Dynamic Tensor Rematerialization on a DTR operator log under hard budgets.
    Dtr(dtr::DtrArgs),
    /// Train a small model live under Dynamic Tensor Rematerialization on the simulated
    /// device, without and with a hard budget, and compare losses, memory and compute.
    Train(TrainArgs),
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Hard budget on the caching allocator's allocated bytes, e.g. 4MiB (default: the
    /// smallest feasible budget, found by bisection).
    #[arg(long, value_name = "BYTES", conflicts_with = "ratio")]
    budget: Option<String>,
    /// Budget as a ratio of the unbudgeted run's peak allocated bytes, e.g. 0.5.
    #[arg(long, value_name = "R")]
    ratio: Option<f64>,
    /// SGD steps.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// The model: mlp or transformer.
    #[arg(long, default_value = "mlp")]
    model: String,
    /// Eviction heuristic: dtr, dtr-eq, dtr-local, lru, largest, msps, random.
    #[arg(long, value_name = "NAME", default_value = "dtr-eq")]
    heuristic: String,
    /// Op costs: measured (wall-clock ns of each op, as the prototype) or estimated (declared
    /// arithmetic work; deterministic eviction choices).
    #[arg(long, value_name = "MODEL", default_value = "measured")]
    cost: String,
    /// Write the last budgeted step's operator log in the DTR paper's format (replay it with
    /// `tensormem dtr FILE`).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Samples per step.
    #[arg(long)]
    batch: Option<i64>,
    /// Input features (mlp) or model width (transformer).
    #[arg(long)]
    features: Option<i64>,
    /// Hidden width (mlp).
    #[arg(long)]
    width: Option<i64>,
    /// Hidden layers (mlp).
    #[arg(long)]
    layers: Option<usize>,
    /// Tokens per sample (transformer).
    #[arg(long)]
    seq: Option<i64>,
    /// Learning rate (default: 0.05 for mlp, 0.03 for transformer).
    #[arg(long)]
    lr: Option<f64>,
    /// Seed of the data and the initial weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the debug check that hashes every value and compares each recomputation.
    #[arg(long)]
    no_check: bool,
    /// A budgeted step thrashes once its rematerialization passes (X - 1) times the baseline's
    /// compute per step.
    #[arg(long, value_name = "X", default_value_t = 2.0)]
    overhead_limit: f64,
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The snapshot file (.pickle, or .json with the same structure).
    file: PathBuf,
    /// Replay under this PYTORCH_CUDA_ALLOC_CONF string instead of the recorded settings.
    #[arg(long, value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Simulated device memory, e.g. 80GiB (default: 1 TiB, large enough for any recording).
    #[arg(long, value_name = "SIZE")]
    device_memory: Option<String>,
    /// Replay only the alloc/free sequence from an empty allocator (no recorded start state).
    #[arg(long)]
    from_empty: bool,
    /// Also replay from empty under the standard configurations and print one table.
    #[arg(long)]
    sweep: bool,
    /// Print the report as JSON (schema in the README).
    #[arg(long)]
    json: bool,
    /// Draw allocated and reserved bytes over the events into an .svg file.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Write our snapshot, with our memory history, as a PyTorch-format pickle.
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    /// Which device's history to replay (default: the one with the longest history).
    #[arg(long)]
    device: Option<usize>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line, like every other error: clap's message up to its usage block, joined.
            let text = e.to_string();
            let message: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            eprintln!("tensormem: error: {message} (see tensormem --help)");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        None | Some(Command::Demo) => {
            let mut out = Vec::new();
            demo::run(&mut out)
                .map_err(|e| e.to_string())
                .and_then(|()| emit(&out))
        }
        Some(Command::Replay(args)) => run_replay(args).and_then(|out| emit(out.as_bytes())),
        Some(Command::Dtr(args)) => dtr::run(&args).and_then(|out| emit(out.as_bytes())),
        Some(Command::Train(args)) => run_train(&args).and_then(|out| emit(out.as_bytes())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("tensormem: error: {msg}");
            ExitCode::from(2)
        }
    }
}

/// Writes the report to stdout. A closed pipe (`tensormem ... | head`) is not an error: the
/// reader has what it wanted (and `print!` would panic on it).
fn emit(out: &[u8]) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

fn progress_bar(len: u64, label: String) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>28} [{bar:40}] {pos}/{len} events")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(label);
    Some(bar)
}

/// Replays as `args` asks and returns the report text.
fn run_replay(args: ReplayArgs) -> Result<String, String> {
    let mut out = String::new();
    let name = args.file.display().to_string();
    let snap = load::load_path(&args.file).map_err(|e| e.to_string())?;
    let capacity = match &args.device_memory {
        Some(s) => parse_size(s).map_err(|e| format!("--device-memory: {e}"))?,
        None => 1usize << 40,
    };
    let config: AllocatorConfig = match &args.alloc_conf {
        Some(s) => s.parse().map_err(|e| format!("--alloc-conf: {e}"))?,
        None => snap.config(),
    };
    let device = match args.device {
        Some(d) if d < snap.traces.len() => Some(d),
        Some(d) => {
            return Err(format!(
                "--device {d}: the snapshot has traces for {} device(s)",
                snap.traces.len()
            ));
        }
        None => snap.main_device(),
    };
    let Some(device) = device else {
        // State only: summarize what the dump holds; the options that need a history fail.
        let wanted = [
            (args.from_empty, "--from-empty"),
            (args.sweep, "--sweep"),
            (args.plot.is_some(), "--plot"),
            (args.dump.is_some(), "--dump"),
        ];
        if let Some((_, flag)) = wanted.iter().find(|(on, _)| *on) {
            return Err(format!(
                "{flag}: {name} holds state only (no memory history to replay)"
            ));
        }
        let dev = snap.segments.first().map_or(0, |s| s.device);
        let stats = state::state_stats(&snap, dev).map_err(|e| e.to_string())?;
        if args.json {
            let doc = serde_json::json!({
                "file": name,
                "state_only": true,
                "segments": snap.segments.len(),
                "reserved_bytes": snap.reserved_bytes(),
                "allocated_bytes": snap.allocated_bytes(),
                "memory_stats": stats.memory_stats(),
            });
            let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
            let _ = writeln!(out, "{text}");
        } else {
            out.push_str(&report::describe_file(&name, &snap, None));
            out.push_str(
                "  state only: no history to replay; the dump's state as memory_summary() reports it:\n\n",
            );
            out.push_str(&c10_cuda::summary::memory_summary(dev, &stats, false));
        }
        return Ok(out);
    };

    let total = snap.traces[device].len() as u64;
    let bar = progress_bar(
        total,
        if args.from_empty {
            "replay (from empty)".into()
        } else {
            "replay (parity)".into()
        },
    );
    let opts = ReplayOptions {
        config: config.clone(),
        capacity,
        from_empty: args.from_empty,
        series: args.plot.is_some(),
        keep_history: args.dump.is_some(),
    };
    let main = replay(&snap, device, &opts, &mut |d, _| {
        if let Some(b) = &bar {
            b.set_position(d as u64);
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let sweep_rows = if args.sweep {
        let configs = sweep::standard_configs();
        let bar = progress_bar(total * configs.len() as u64, "sweep".into());
        let rows = sweep::sweep(
            &snap,
            device,
            &configs,
            capacity,
            args.plot.is_some(),
            &mut |k, d, _| {
                if let Some(b) = &bar {
                    b.set_position(k as u64 * total + d as u64);
                }
            },
        )
        .map_err(|e| e.to_string())?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        rows
    } else {
        Vec::new()
    };
    if let Some(path) = &args.plot {
        let mut curves = vec![&main];
        curves.extend(sweep_rows.iter());
        plot::plot(path, &name, &curves).map_err(|e| format!("--plot {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.dump {
        let bytes = c10_cuda::snapshot_pickle::snapshot_pickle(
            std::slice::from_ref(&main.snapshot),
            &config,
        );
        std::fs::write(path, bytes).map_err(|e| format!("--dump {}: {e}", path.display()))?;
    }
    if args.json {
        let doc = JsonReport::new(&name, device, &main, &sweep_rows);
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        let _ = writeln!(out, "{text}");
        return Ok(out);
    }
    out.push_str(&report::describe_file(&name, &snap, Some(device)));
    if main.parity.is_some() {
        out.push_str(&report::parity_text(&main));
    } else if sweep_rows.is_empty() {
        out.push_str(&report::sweep_table(std::slice::from_ref(&main), capacity));
    }
    if main.parity.is_none() && main.skipped_frees > 0 {
        let _ = writeln!(
            out,
            "  {} frees of blocks allocated before the trace began were skipped",
            main.skipped_frees
        );
    }
    if !sweep_rows.is_empty() {
        out.push_str(&report::sweep_table(&sweep_rows, capacity));
    }
    out.push_str(&report::summaries(&main, device as u8));
    if let Some(p) = &args.plot {
        let _ = writeln!(out, "\nplot written to {}", p.display());
    }
    if let Some(p) = &args.dump {
        let _ = writeln!(
            out,
            "snapshot written to {} (open it at https://pytorch.org/memory_viz)",
            p.display()
        );
    }
    Ok(out)
}

/// Runs `tensormem train` and returns the report.
fn run_train(args: &TrainArgs) -> Result<String, String> {
    let defaults = TrainOptions::default();
    let model: Model = args.model.parse().map_err(|e| format!("--model: {e}"))?;
    let mut o = TrainOptions {
        model,
        steps: args.steps,
        seed: args.seed,
        check_remat: !args.no_check,
        overhead_limit: args.overhead_limit,
        heuristic: args
            .heuristic
            .parse()
            .map_err(|e| format!("--heuristic: {e}"))?,
        cost: match args.cost.as_str() {
            "measured" => checkpoint::live::CostModel::Measured,
            "estimated" => checkpoint::live::CostModel::Estimated,
            other => {
                return Err(format!(
                    "--cost: unknown cost model {other:?} (expected measured or estimated)"
                ));
            }
        },
        ..defaults
    };
    if model == Model::Transformer {
        o.batch = 16;
        o.features = 64;
        o.lr = 0.03;
    }
    if let Some(lr) = args.lr {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(format!("--lr {lr}: expected a positive learning rate"));
        }
        o.lr = lr;
    }
    let positive = |name: &str, v: Option<i64>, slot: &mut i64| -> Result<(), String> {
        match v {
            Some(n) if n <= 0 => Err(format!("--{name} {n}: expected a positive number")),
            Some(n) => {
                *slot = n;
                Ok(())
            }
            None => Ok(()),
        }
    };
    positive("batch", args.batch, &mut o.batch)?;
    positive("features", args.features, &mut o.features)?;
    positive("width", args.width, &mut o.width)?;
    positive("seq", args.seq, &mut o.seq)?;
    if let Some(l) = args.layers {
        if l == 0 {
            return Err("--layers 0: expected at least one hidden layer".into());
        }
        o.layers = l;
    }
    if o.steps == 0 {
        return Err("--steps 0: expected at least one step".into());
    }
    if !(o.overhead_limit.is_finite() && o.overhead_limit >= 1.0) {
        return Err(format!(
            "--overhead-limit {}: expected a number of at least 1",
            o.overhead_limit
        ));
    }
    if let Some(r) = args.ratio {
        if !(r.is_finite() && r > 0.0) {
            return Err(format!("--ratio {r}: expected a ratio above 0 (e.g. 0.5)"));
        }
    }
    let budget_bytes = match &args.budget {
        Some(b) => Some(parse_size(b).map_err(|e| format!("--budget: {e}"))? as u64),
        None => None,
    };
    let open_log = || -> Result<Option<train::LogSink>, String> {
        match &args.log {
            Some(p) => {
                let f =
                    std::fs::File::create(p).map_err(|e| format!("--log {}: {e}", p.display()))?;
                Ok(Some(Box::new(std::io::BufWriter::new(f))))
            }
            None => Ok(None),
        }
    };
    let front = aten::sim::install(1, 1 << 36).map_err(|e| e.to_string())?;
    if o.cost == checkpoint::live::CostModel::Measured {
        // A warm-up run, so that the baseline's measured times are not those of a cold start.
        train::train(&front, &o, None, None, None).map_err(|e| e.to_string())?;
    }
    let baseline = train::train(&front, &o, None, None, None).map_err(|e| e.to_string())?;
    let limit = Some(train::remat_limit(&o, &baseline));
    let infeasible = |budget: u64, e: checkpoint::live::LiveError| {
        if train::is_infeasible(&e) {
            format!("budget {budget} bytes is infeasible for this model: {e}")
        } else {
            e.to_string()
        }
    };
    let outcome = (|| -> Result<_, String> {
        Ok(match (budget_bytes, args.ratio) {
            (Some(b), _) => {
                let run = train::train(&front, &o, Some(b), limit, open_log()?)
                    .map_err(|e| infeasible(b, e))?;
                (BudgetChoice::Bytes, run)
            }
            (None, Some(r)) => {
                let b = checkpoint::budget_for_ratio(baseline.peak_allocated, r);
                let run = train::train(&front, &o, Some(b), limit, open_log()?)
                    .map_err(|e| infeasible(b, e))?;
                (BudgetChoice::Ratio(r), run)
            }
            (None, None) => {
                let s = train::smallest_feasible(&front, &o, &baseline, 8)
                    .map_err(|e| e.to_string())?;
                let run = match open_log()? {
                    Some(sink) => train::train(&front, &o, Some(s.budget), limit, Some(sink))
                        .map_err(|e| infeasible(s.budget, e))?,
                    None => s.run,
                };
                (
                    BudgetChoice::Searched {
                        ratio: s.ratio,
                        tries: s.tries,
                    },
                    run,
                )
            }
        })
    })();
    if outcome.is_err() {
        // A failed run must not leave a partial log behind that `tensormem dtr` would accept.
        if let Some(p) = &args.log {
            let _ = std::fs::remove_file(p);
        }
    }
    let (choice, run) = outcome?;
    let mut out = train::report(&o, &baseline, &run, &choice);
    if baseline
        .losses
        .iter()
        .map(|l| l.to_bits())
        .ne(run.losses.iter().map(|l| l.to_bits()))
    {
        return Err("the losses with the budget differ from the losses without it".into());
    }
    if let Some(p) = &args.log {
        let _ = writeln!(
            out,
            "operator log of the last budgeted step written to {} (replay: tensormem dtr {})",
            p.display(),
            p.display()
        );
    }
    Ok(out)
}

//! The `tensormem` command: replay PyTorch memory snapshots through our caching allocator.
//!
//! `tensormem` with no arguments runs the built-in demo; `tensormem replay FILE` replays a
//! snapshot (see `tensormem replay --help`). Errors print one line and exit with status 2; a
//! replay whose own main replay ran out of memory prints its report and exits with status 1
//! ([`EXIT_REPLAY_OOM`]), and so does an advise run in which no setting fits the device memory
//! ([`EXIT_NO_FIT`]).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use tensormem::session::{self, ReplayReport, ReplayRequest};
use tensormem::size::parse_size;
use tensormem::train::{self, BudgetChoice, Model, TrainOptions};
use tensormem::window::Window;
use tensormem::{advise, demo, diff, dtr, dump, explain, html, load, plot};

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
    /// Exit status: 0; 1 when our replay ran out of memory (the report says how often); 2 on
    /// an error.
    Replay(ReplayArgs),
    /// Run the built-in demo workload (two training steps of a small transformer); the default.
    Demo,
    /// Simulate Dynamic Tensor Rematerialization on a DTR operator log under hard budgets.
    Dtr(dtr::DtrArgs),
    /// Train a small model live under Dynamic Tensor Rematerialization on the simulated
    /// device, without and with a hard budget, and compare losses, memory and compute.
    Train(TrainArgs),
    /// Search the allocator settings (PYTORCH_CUDA_ALLOC_CONF) for the one that needs the
    /// least device memory, and find the smallest device memory that runs it without OOM.
    /// Exit status: 0 when a setting runs the job without OOM on the device memory; 1 when
    /// none does (the report still prints: the fewest failures first); 2 on an error.
    Advise(AdviseArgs),
    /// Explain an out-of-memory error: the failed request, the free space per segment and
    /// pool, who holds the memory, and the setting that would have avoided it.
    Explain(ExplainArgs),
    /// Compare two snapshots: segments and bytes at the dump, peaks and fragmentation of each
    /// history's replay, and the call sites that grew or shrank.
    Diff(DiffArgs),
}

#[derive(clap::Args)]
struct DiffArgs {
    /// The first snapshot (.pickle or .json).
    a: PathBuf,
    /// The second snapshot.
    b: PathBuf,
    /// How many call-site changes to list (largest first; the JSON has as many).
    #[arg(long, value_name = "N", default_value_t = 10)]
    top: usize,
    /// Print the result as JSON (schema in the README).
    #[arg(long)]
    json: bool,
    /// Also write a self-contained HTML page of the comparison to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Measure from here: an event index (e.g. 1200) or a time since the trace's first event
    /// (e.g. 1.5s, 250ms, 800us), on each history. The job still replays from its start.
    #[arg(long, value_name = "EVENT|TIME")]
    since: Option<String>,
    /// Measure up to here: an event index (the events before it) or a time since the first
    /// event (the events at or before it); the replay stops there.
    #[arg(long, value_name = "EVENT|TIME")]
    until: Option<String>,
}

#[derive(clap::Args)]
struct AdviseArgs {
    /// The snapshot file (.pickle, or .json with the same structure); it needs a history.
    file: PathBuf,
    /// The device memory to fit, e.g. 40GiB (default: unconstrained).
    #[arg(long, value_name = "SIZE")]
    device_memory: Option<String>,
    /// How many settings the text report lists (the JSON has all).
    #[arg(long, value_name = "N", default_value_t = 5)]
    show: usize,
    /// Print the result as JSON (schema in the README).
    #[arg(long)]
    json: bool,
    /// Also write a self-contained HTML report to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Which device's history (default: the one with the longest history).
    #[arg(long)]
    device: Option<usize>,
    /// Replay the recorded history alone, leaving out the blocks live when recording began
    /// (the old behaviour: its advice can undercount the job's memory, and says so).
    #[arg(long)]
    history_only: bool,
    /// Measure from here: an event index (e.g. 1200) or a time since the trace's first event
    /// (e.g. 1.5s, 250ms, 800us). The job still replays from its start.
    #[arg(long, value_name = "EVENT|TIME")]
    since: Option<String>,
    /// Measure up to here: an event index (the events before it) or a time since the first
    /// event (the events at or before it); the replay stops there.
    #[arg(long, value_name = "EVENT|TIME")]
    until: Option<String>,
}

#[derive(clap::Args)]
struct ExplainArgs {
    /// The snapshot file (.pickle, or .json): one with an `oom` trace entry, or taken at OOM.
    file: PathBuf,
    /// How many call sites to list.
    #[arg(long, value_name = "N", default_value_t = 5)]
    top: usize,
    /// How many segments to list (the JSON has all).
    #[arg(long, value_name = "N", default_value_t = 8)]
    segments: usize,
    /// Print the result as JSON (schema in the README).
    #[arg(long)]
    json: bool,
    /// Explain the first oom entry at or after this event index or time (e.g. 1200, 1.5s).
    #[arg(long, value_name = "EVENT|TIME")]
    since: Option<String>,
    /// Explain an oom entry before this event index, or at or before this time.
    #[arg(long, value_name = "EVENT|TIME")]
    until: Option<String>,
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
    #[arg(
        long,
        value_name = "NAME",
        default_value = "dtr-eq",
        help = format!("Eviction heuristic: {}", checkpoint::Heuristic::names())
    )]
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
    /// The budget (--budget, --ratio or the search's) is the capacity of a host-backed
    /// simulated device: nothing is counted, the caching allocator's misses drive eviction and
    /// reserved bytes can never pass it.
    #[arg(long)]
    device_budget: bool,
    #[arg(
        long,
        value_name = "NAME",
        help = format!(
            "With --device-budget, how to make room on a miss: {}",
            checkpoint::Strategy::names()
        ),
        default_value = "window",
        requires = "device_budget"
    )]
    strategy: String,
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
    /// What-if: replay the whole job from an empty allocator under our own decisions (the
    /// blocks live when recording began are allocated first, then the history).
    #[arg(long)]
    from_empty: bool,
    /// Also replay the whole job from empty under the standard configurations and print one
    /// table.
    #[arg(long)]
    sweep: bool,
    /// With --from-empty or --sweep: replay the recorded history alone, leaving out the blocks
    /// live when recording began (undercounts the job's memory; the figures say so).
    #[arg(long)]
    history_only: bool,
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
    /// List the N call sites (top user frame) holding the most bytes at the reserved peak,
    /// at the end, and at each swept configuration's own peak.
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// With --top: group by the whole stack and print it.
    #[arg(long, requires = "top")]
    stack: bool,
    /// Write a self-contained HTML report (timelines, table, call sites, segment map).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Follow this PyTorch version's allocator rules (2.7 or 2.15). Without it, parity tries
    /// each version and keeps the one that reproduces the recording; what-if replays follow
    /// the detected version, or the newest.
    #[arg(long, value_name = "V")]
    torch_version: Option<String>,
    /// Measure from here: an event index (e.g. 1200) or a time since the trace's first event
    /// (e.g. 1.5s, 250ms, 800us). The job still replays from its start.
    #[arg(long, value_name = "EVENT|TIME")]
    since: Option<String>,
    /// Measure up to here: an event index (the events before it) or a time since the first
    /// event (the events at or before it); the replay stops there.
    #[arg(long, value_name = "EVENT|TIME")]
    until: Option<String>,
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
            ok(demo::run(&mut out)
                .map_err(|e| e.to_string())
                .and_then(|()| emit(&out)))
        }
        Some(Command::Replay(args)) => run_replay(args).and_then(|(out, ooms)| {
            emit(out.as_bytes())?;
            if ooms > 0 {
                return Ok(ExitCode::from(EXIT_REPLAY_OOM));
            }
            Ok(ExitCode::SUCCESS)
        }),
        Some(Command::Dtr(args)) => dtr::run(&args).and_then(|out| ok(emit(out.as_bytes()))),
        Some(Command::Train(args)) => run_train(&args).and_then(|out| ok(emit(out.as_bytes()))),
        Some(Command::Advise(args)) => run_advise(&args).and_then(|(out, fits)| {
            emit(out.as_bytes())?;
            if !fits {
                return Ok(ExitCode::from(EXIT_NO_FIT));
            }
            Ok(ExitCode::SUCCESS)
        }),
        Some(Command::Explain(args)) => run_explain(&args).and_then(|out| ok(emit(out.as_bytes()))),
        Some(Command::Diff(args)) => run_diff(&args).and_then(|out| ok(emit(out.as_bytes()))),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("tensormem: error: {msg}");
            ExitCode::from(2)
        }
    }
}

/// The exit status of `tensormem replay` when the report printed but our own main replay ran
/// out of memory (on a `--device-memory` too small for the job): scripts can test
/// `tensormem replay FILE --device-memory SIZE` for "fits".
const EXIT_REPLAY_OOM: u8 = 1;

/// The exit status of `tensormem advise` when the report printed but no setting runs the job
/// without OOM on the device memory (`--device-memory`, or the unconstrained 1 TiB): scripts
/// can test `tensormem advise FILE --device-memory SIZE` for "some setting fits".
const EXIT_NO_FIT: u8 = 1;

/// Success as an exit status.
fn ok(r: Result<(), String>) -> Result<ExitCode, String> {
    r.map(|()| ExitCode::SUCCESS)
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

/// Replays as `args` asks and returns the report text and the allocations that failed in the
/// main replay (0 for a state-only summary).
fn run_replay(args: ReplayArgs) -> Result<(String, usize), String> {
    let name = args.file.display().to_string();
    let snap = load::load_path(&args.file).map_err(|e| e.to_string())?;
    let req = ReplayRequest {
        alloc_conf: args.alloc_conf.clone(),
        device_memory: args.device_memory.clone(),
        from_empty: args.from_empty,
        sweep: args.sweep,
        history_only: args.history_only,
        device: args.device,
        top: args.top,
        full_stack: args.stack,
        series: args.plot.is_some() || args.html.is_some(),
        plot: args.plot.is_some(),
        keep_history: args.dump.is_some(),
        html: args.html.is_some(),
        torch_version: args.torch_version.clone(),
        window: Window::parse(args.since.as_deref(), args.until.as_deref())
            .map_err(|e| e.to_string())?,
    };
    let mut bars: Vec<(String, ProgressBar)> = Vec::new();
    let result = session::run(&snap, &name, &req, &mut |label, done, total| {
        if let Some((_, b)) = bars.iter().find(|(l, _)| l == label) {
            b.set_position(done as u64);
        } else if let Some(b) = progress_bar(total as u64, label.to_string()) {
            b.set_position(done as u64);
            bars.push((label.to_string(), b));
        }
    });
    for (_, b) in &bars {
        b.finish_and_clear();
    }
    let report = result.map_err(|e| e.to_string())?;
    let failed = match &report {
        ReplayReport::Replayed(r) => r.main.failed_allocs,
        ReplayReport::StateOnly(_) => 0,
    };
    let mut out = String::new();
    if let ReplayReport::Replayed(r) = &report {
        if let Some(path) = &args.plot {
            plot::plot(path, &name, &plot::curves(&r.main, &r.sweep))
                .map_err(|e| format!("--plot {}: {e}", path.display()))?;
        }
        if let Some(path) = &args.dump {
            let bytes = dump::dump_pickle(&snap, r.device, &r.main, &r.config);
            std::fs::write(path, bytes).map_err(|e| format!("--dump {}: {e}", path.display()))?;
        }
        if let Some(path) = &args.html {
            let page =
                html::replay_page(&snap, r, args.top.unwrap_or(10)).map_err(|e| e.to_string())?;
            std::fs::write(path, page).map_err(|e| format!("--html {}: {e}", path.display()))?;
        }
    }
    if let (ReplayReport::StateOnly(s), Some(path)) = (&report, &args.html) {
        let page = html::state_page(&snap, s, args.top.unwrap_or(10)).map_err(|e| e.to_string())?;
        std::fs::write(path, page).map_err(|e| format!("--html {}: {e}", path.display()))?;
    }
    if args.json {
        let text = serde_json::to_string_pretty(&report.json(&snap)).map_err(|e| e.to_string())?;
        let _ = writeln!(out, "{text}");
        return Ok((out, failed));
    }
    out.push_str(&report.text(&snap));
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
    if let Some(p) = &args.html {
        let _ = writeln!(out, "HTML report written to {}", p.display());
    }
    Ok((out, failed))
}

/// Runs `tensormem advise` and returns the report and whether some setting fits the device
/// memory.
fn run_advise(args: &AdviseArgs) -> Result<(String, bool), String> {
    let name = args.file.display().to_string();
    let snap = load::load_path(&args.file).map_err(|e| e.to_string())?;
    let device_memory = match &args.device_memory {
        Some(s) => Some(session::device_memory(Some(s)).map_err(|e| e.to_string())? as u64),
        None => None,
    };
    if args.show == 0 {
        return Err("--show: expected at least 1 setting".into());
    }
    let opts = advise::AdviseOptions {
        device_memory,
        show: args.show,
        device: args.device,
        history_only: args.history_only,
        window: Window::parse(args.since.as_deref(), args.until.as_deref())
            .map_err(|e| e.to_string())?,
        ..advise::AdviseOptions::default()
    };
    let advice = advise::advise(&snap, &name, &opts).map_err(|e| e.to_string())?;
    if let Some(path) = &args.html {
        let page = html::advise_page(&snap, &advice, 10).map_err(|e| e.to_string())?;
        std::fs::write(path, page).map_err(|e| format!("--html {}: {e}", path.display()))?;
    }
    let mut out = if args.json {
        let mut s = serde_json::to_string_pretty(&advice).map_err(|e| e.to_string())?;
        s.push('\n');
        s
    } else {
        advice.text()
    };
    if let (Some(p), false) = (&args.html, args.json) {
        let _ = writeln!(out, "HTML report written to {}", p.display());
    }
    Ok((out, advice.fits()))
}

/// Runs `tensormem diff` and returns the report.
fn run_diff(args: &DiffArgs) -> Result<String, String> {
    if args.top == 0 {
        return Err("--top: expected at least 1 call site".into());
    }
    let a_name = args.a.display().to_string();
    let b_name = args.b.display().to_string();
    let a = load::load_path(&args.a).map_err(|e| e.to_string())?;
    let b = load::load_path(&args.b).map_err(|e| e.to_string())?;
    let window =
        Window::parse(args.since.as_deref(), args.until.as_deref()).map_err(|e| e.to_string())?;
    let d =
        diff::diff_in(&a, &a_name, &b, &b_name, args.top, &window).map_err(|e| e.to_string())?;
    if let Some(path) = &args.html {
        std::fs::write(path, html::diff_page(&d))
            .map_err(|e| format!("--html {}: {e}", path.display()))?;
    }
    if args.json {
        let mut s = serde_json::to_string_pretty(&d).map_err(|e| e.to_string())?;
        s.push('\n');
        return Ok(s);
    }
    let mut out = d.text();
    if let Some(p) = &args.html {
        let _ = writeln!(out, "HTML report written to {}", p.display());
    }
    Ok(out)
}

/// Runs `tensormem explain` and returns the report.
fn run_explain(args: &ExplainArgs) -> Result<String, String> {
    let name = args.file.display().to_string();
    let snap = load::load_path(&args.file).map_err(|e| e.to_string())?;
    let opts = explain::ExplainOptions {
        top: args.top,
        show_segments: args.segments,
        window: Window::parse(args.since.as_deref(), args.until.as_deref())
            .map_err(|e| e.to_string())?,
    };
    let e = explain::explain(&snap, &name, &opts).map_err(|e| e.to_string())?;
    if args.json {
        let mut s = serde_json::to_string_pretty(&e).map_err(|e| e.to_string())?;
        s.push('\n');
        return Ok(s);
    }
    Ok(e.text(args.segments))
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
        device_budget: args.device_budget,
        strategy: args
            .strategy
            .parse()
            .map_err(|e| format!("--strategy: {e}"))?,
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

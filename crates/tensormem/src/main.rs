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
    /// Run the built-in demo workload (a small transformer training step); the default.
    Demo,
    /// Simulate Dynamic Tensor Rematerialization on a DTR operator log under hard budgets.
    Dtr(dtr::DtrArgs),
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
    /// Draw allocated and reserved bytes over the events into an .svg (or .png) file.
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
    let cli = Cli::parse();
    let result = match cli.command {
        None | Some(Command::Demo) => {
            let mut out = Vec::new();
            demo::run(&mut out)
                .map_err(|e| e.to_string())
                .and_then(|()| emit(&out))
        }
        Some(Command::Replay(args)) => run_replay(args).and_then(|out| emit(out.as_bytes())),
        Some(Command::Dtr(args)) => dtr::run(&args).and_then(|out| emit(out.as_bytes())),
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

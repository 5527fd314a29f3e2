//! `cargo xtask`: the project's task runner (CI, GPU tests, valgrind, benchmarks, soak, the
//! differential tests against PyTorch's real allocator).
//!
//! Every task is a sequence of named steps, each a `cargo` (or tool) command run from the
//! workspace root. A failing step stops the task and is named on stderr, so a CI log says
//! exactly what broke. See CONTRIBUTING.md for when to run which task.

mod gpu_bundle;
mod msrv;
mod steps;
mod tasks;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [args]

tasks:
  ci          fmt --check, clippy -D warnings, msrv, tests (nextest if installed), the Python
              module (venv + pip install + pytest), loom, doc tests, docs with warnings
              denied: exactly what CI runs
  msrv        the declared rust-version against every dependency's (cargo metadata), then
              cargo +VERSION check --workspace --all-targets when that toolchain is installed
              (says SKIPPED otherwise)
  python      only the Python module's step: venv, pip install ./crates/tensormem-py, pytest
  gpu-test    probe for a CUDA driver and device, then run the GPU-only tests and
              (where a CUDA build of torch exists) PyTorch on libtensormem_alloc.so;
              fails (non-zero) when no driver or no device is found
  gpu-bundle  build (release, here) every GPU test binary, the CUDA probe, the GPU bench and
              libtensormem_alloc.so into target/gpu-bundle/ (at most 48 MiB) with a run.sh
              that needs no cargo: for a machine with a GPU and no Rust toolchain
  valgrind    run the unsafe-heavy crates' tests under valgrind memcheck
  bench [F]   run the criterion benchmarks (optionally only those matching F), the
              allocator's with its cubecl peer and its side-by-side table
  bench alloc [--quick] [F]
              the caching allocator's bench alone: criterion groups (matching F), then
              one table of ns per alloc+free pair on the six shared traces, cold and warm,
              for ours, PyTorch 2.7.1 and 2.15.0 (torch-oracle --bench / --bench-warm, when
              set up: ../shared/torch-oracle/setup.sh [VERSION]) and cubecl, with the
              ratios and targets; --quick: the table only
  bench engine [--peer starpu]
              the engine's criterion bench, then engine-bench (W1..W4 x naive/pooled/
              per-device, 2 workers, 5 passes) with a table of medians; --peer starpu also
              builds and runs the same workloads on StarPU (needs libstarpu-dev)
  loom        the engine's loom models (RUSTFLAGS=\"--cfg loom\", release, own target dir)
  soak        run the caching allocator's property test for 10 million random steps, then
              the device-memory budget grid of every shared DTR log (release)
  oracle [--torch V] [--cases N] [--seed S] [--jobs J]
              differential tests against PyTorch's real allocator (torch-oracle, 2.7.1
              and 2.15.0): N random scripts per version (default 2000); fails on any
              divergence that is not a documented deliberate fix, or when the oracle is
              not set up (and says how)
  help        this text
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    // `cargo xtask <task> --help` prints the usage instead of running the task (a task takes
    // its own arguments, but none of them is `--help` or `-h`).
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match task.as_str() {
        "ci" => tasks::ci(),
        "msrv" => msrv::msrv(),
        "python" => tasks::python(),
        "gpu-test" => tasks::gpu_test(),
        "gpu-bundle" => gpu_bundle::gpu_bundle(),
        "valgrind" => tasks::valgrind(),
        "bench" if rest.first().map(String::as_str) == Some("engine") => {
            tasks::bench_engine(&rest[1..])
        }
        "bench" if rest.first().map(String::as_str) == Some("alloc") => {
            tasks::bench_alloc(&rest[1..])
        }
        "bench" => tasks::bench(rest),
        "loom" => tasks::loom(),
        "soak" => tasks::soak(),
        "oracle" => tasks::oracle(rest),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => {
            eprintln!("xtask: unknown task `{other}`\n");
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!(
                "\nxtask {task}: FAILED at step `{}`: {}",
                failure.step, failure.reason
            );
            ExitCode::FAILURE
        }
    }
}

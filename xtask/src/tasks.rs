//! The tasks themselves: which steps each runs, in which order.

use std::process::Command;

use crate::steps::{Failure, TaskResult, cargo, root, run, tool_available};

/// Crates whose tests exercise most of the project's `unsafe` code; `valgrind` runs these.
const UNSAFE_HEAVY: &[&str] = &[
    "c10-core",
    "c10-cuda",
    "c10-cuda-ipc",
    "c10-host-alloc",
    "aten",
];

/// `cargo xtask ci`: everything CI checks, in order, stopping at the first failure.
pub fn ci() -> TaskResult {
    let started = std::time::Instant::now();

    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    run("fmt", fmt)?;

    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]);
    run("clippy", clippy)?;

    crate::msrv::msrv()?;

    outside_cudarc()?;

    let mut tests = if tool_available("cargo-nextest", &["nextest", "--version"]) {
        let mut c = cargo();
        c.args([
            "nextest",
            "run",
            "--workspace",
            "--locked",
            "--no-fail-fast",
        ]);
        c
    } else {
        eprintln!("(cargo-nextest not installed: using cargo test)");
        let mut c = cargo();
        c.args([
            "test",
            "--workspace",
            "--all-targets",
            "--locked",
            "--no-fail-fast",
        ]);
        c
    };
    tests.env("INSTA_UPDATE", "no");
    // Each data test that skips (no ../shared/data) appends its name here; reported below.
    let skip_log = target_dir().join("data-test-skips.txt");
    let _ = std::fs::remove_file(&skip_log);
    let _ = std::fs::create_dir_all(target_dir());
    tests.env("TENSORMEM_DATA_SKIP_LOG", &skip_log);
    run("tests", tests)?;
    let data_tests = data_test_report(&skip_log);
    eprintln!("\n==> [data tests] {data_tests}");

    python()?;

    loom()?;

    let mut doctests = cargo();
    doctests.args(["test", "--workspace", "--doc", "--locked"]);
    doctests.env("INSTA_UPDATE", "no");
    run("doctests", doctests)?;

    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps", "--locked"]);
    doc.env("RUSTDOCFLAGS", "-D warnings");
    run("docs", doc)?;

    eprintln!(
        "\nxtask ci: all steps passed in {:.0} s; {data_tests}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `target/` (or `$CARGO_TARGET_DIR`).
pub(crate) fn target_dir() -> std::path::PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => root().join("target"),
    }
}

/// CI's check that c10-cuda's CUDA backend coexists with any cudarc: `tests/outside-cudarc`, a
/// crate outside the workspace with cudarc's `cuda-13000` and `dynamic-linking` features, must
/// build (`cargo check`) beside c10-cuda-driver's default features. Run from outside the workspace so that this
/// workspace's `.cargo/config.toml` (which pins CUDARC_CUDA_VERSION) does not apply, as it would
/// not for a user.
fn outside_cudarc() -> TaskResult {
    let mut check = cargo();
    check
        .current_dir(std::env::temp_dir())
        .args(["check", "--locked", "--manifest-path"])
        .arg(root().join("tests/outside-cudarc/Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir().join("outside-cudarc"))
        .env_remove("CUDARC_CUDA_VERSION");
    run(
        "outside crate: cudarc cuda-13000 + dynamic-linking beside c10-cuda-driver",
        check,
    )
}

/// One line saying whether the tests that read `../shared/data` ran or were skipped, from the
/// names the skipped ones logged.
fn data_test_report(skip_log: &std::path::Path) -> String {
    let skipped: Vec<String> = std::fs::read_to_string(skip_log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    if skipped.is_empty() {
        return "data tests: all ran (the real snapshots and DTR logs in ../shared/data were found)"
            .to_string();
    }
    let mut by_binary: std::collections::BTreeMap<String, usize> = Default::default();
    for line in &skipped {
        let binary = line.split_whitespace().next().unwrap_or("?").to_string();
        *by_binary.entry(binary).or_default() += 1;
    }
    let parts: Vec<String> = by_binary.iter().map(|(b, n)| format!("{b} {n}")).collect();
    format!(
        "data tests: {} SKIPPED because ../shared/data is missing ({}); set TENSORMEM_SHARED to a \
         shared/ folder to run them",
        skipped.len(),
        parts.join(", ")
    )
}

/// The Python module's step: a fresh venv in `target/py-venv`, `pip install
/// ./crates/tensormem-py pytest` (PyPI; maturin builds the extension once, in release mode,
/// into `target/`), then its pytest suite. Without `python3` (or its `venv` module) the step
/// is skipped with a message, and fails under `CI=true`. When that Python has torch, the venv
/// sees the folder torch is installed in (a `.pth` file) and `tensormem.record`'s tests run;
/// without torch they are skipped (listed by pytest's `-ra`).
pub fn python() -> TaskResult {
    let step = "python";
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has_venv = std::process::Command::new(&python)
        .args(["-c", "import venv, ensurepip"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_venv {
        let why = format!(
            "`{python}` with its venv module is needed to build and test the Python module \
             (Debian/Ubuntu: `apt-get install python3 python3-venv`; or set PYTHON)"
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err(Failure {
                step: step.into(),
                reason: why,
            });
        }
        eprintln!("\n==> [{step}] SKIPPED: {why}");
        return Ok(());
    }
    eprintln!(
        "\n==> [{step}] the tensormem Python module: a fresh venv, `pip install ./crates/tensormem-py` \
         (maturin builds the extension in release mode), then pytest"
    );
    // `tensormem.record`'s tests need torch: when this Python has it, the venv sees the
    // folder it is installed in (a `.pth` file, after the venv's own packages, so the
    // freshly built module wins); otherwise they are skipped and pytest -ra says so.
    let torch = std::process::Command::new(&python)
        .args([
            "-c",
            "import os, torch; print(torch.__version__); print(os.path.dirname(os.path.dirname(torch.__file__)))",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let out = String::from_utf8_lossy(&o.stdout).to_string();
            let mut lines = out.lines();
            Some((lines.next()?.to_string(), lines.next()?.to_string()))
        });
    match &torch {
        Some((v, dir)) => {
            eprintln!(
                "    torch {v} found for `{python}` ({dir}): the recorder's tests run with it"
            )
        }
        None => eprintln!(
            "    torch is not installed for `{python}`: tensormem.record's tests are SKIPPED \
             (pytest -ra lists them)"
        ),
    }
    let venv = target_dir().join("py-venv");
    let _ = std::fs::remove_dir_all(&venv);
    let mut mk = Command::new(&python);
    mk.current_dir(root()).arg("-m").arg("venv").arg(&venv);
    run("python: venv", mk)?;
    let bin = venv.join("bin");
    if let Some((_, dir)) = &torch {
        let purelib = std::process::Command::new(bin.join("python"))
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ])
            .output()
            .map_err(|e| Failure {
                step: step.into(),
                reason: format!("the venv's python: {e}"),
            })?;
        let purelib = String::from_utf8_lossy(&purelib.stdout).trim().to_string();
        std::fs::write(
            std::path::Path::new(&purelib).join("tensormem-ci-torch.pth"),
            format!("{dir}\n"),
        )
        .map_err(|e| Failure {
            step: step.into(),
            reason: format!("{purelib}/tensormem-ci-torch.pth: {e}"),
        })?;
    }
    let mut pip = Command::new(bin.join("python"));
    pip.current_dir(root())
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
        ])
        .args(["./crates/tensormem-py", "pytest"]);
    run("python: pip install ./crates/tensormem-py pytest", pip)?;
    let mut pytest = Command::new(bin.join("python"));
    pytest
        .current_dir(root())
        .args(["-m", "pytest", "-ra", "crates/tensormem-py/tests"]);
    run("python: pytest", pytest)
}

/// `cargo xtask gpu-test`: probe for a driver and a device, then run the GPU-only tests.
///
/// Fails loudly when the probe finds no CUDA driver library or no device, printing what it
/// probed, so a GPU CI job can never pass by skipping everything.
pub fn gpu_test() -> TaskResult {
    let mut probe = cargo();
    probe.args([
        "run",
        "--quiet",
        "-p",
        "c10-cuda-driver",
        "--example",
        "cuda-probe",
    ]);
    run("probe", probe)?;

    // The same scan as the GPU bundle's: every `[[test]]` requiring the `gpu-tests` feature.
    let targets = crate::gpu_bundle::gpu_test_targets(&root()).map_err(|reason| Failure {
        step: "gpu-tests: scan".into(),
        reason,
    })?;
    let mut crates: Vec<&str> = targets.iter().map(|t| t.krate.as_str()).collect();
    crates.dedup();
    for krate in crates {
        let mut tests = cargo();
        tests.args(["test", "-p", krate, "--features", "gpu-tests"]);
        for t in targets.iter().filter(|t| t.krate == krate) {
            tests.args(["--test", &t.target]);
        }
        tests.args(["--", "--test-threads=1"]);
        run(&format!("gpu-tests {krate}"), tests)?;
    }
    torch_pluggable()
}

/// The GPU test's last step: PyTorch running on `libtensormem_alloc.so` through
/// `CUDAPluggableAllocator` (`crates/c10-cuda-capi/tests/torch_pluggable.py`), where a Python
/// with a CUDA build of torch exists (`$TENSORMEM_TORCH_PYTHON`, else `python3`); skipped with a
/// message where none does.
fn torch_pluggable() -> TaskResult {
    let python = std::env::var("TENSORMEM_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    if !tool_available(
        &python,
        &[
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ],
    ) {
        eprintln!(
            "\n==> [torch pluggable allocator] SKIPPED: `{python}` has no CUDA build of torch \
             (set TENSORMEM_TORCH_PYTHON to a Python that has one)"
        );
        return Ok(());
    }
    let mut build = cargo();
    build.args(["build", "-p", "c10-cuda-capi"]);
    run("build libtensormem_alloc.so", build)?;
    let lib = target_dir().join("debug").join("libtensormem_alloc.so");
    let mut torch = Command::new(&python);
    torch
        .current_dir(target_dir())
        .arg(root().join("crates/c10-cuda-capi/tests/torch_pluggable.py"))
        .arg(&lib)
        .env_remove("TENSORMEM_ALLOC_BACKEND");
    run("torch pluggable allocator", torch)
}

/// `cargo xtask valgrind`: build the unsafe-heavy crates' tests, run each binary under memcheck.
pub fn valgrind() -> TaskResult {
    if !tool_available("valgrind", &["--version"]) {
        return Err(Failure {
            step: "valgrind".into(),
            reason: "valgrind is not installed (Debian/Ubuntu: `apt-get install valgrind`; \
                     Fedora: `dnf install valgrind`; macOS: not supported)"
                .into(),
        });
    }
    for krate in UNSAFE_HEAVY {
        let mut build = cargo();
        build.args(["test", "-p", krate, "--no-run", "--message-format=json"]);
        let out = build.output().map_err(|e| Failure {
            step: format!("build {krate}"),
            reason: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(Failure {
                step: format!("build {krate}"),
                reason: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let exes = test_executables(&stdout);
        if exes.is_empty() {
            return Err(Failure {
                step: format!("build {krate}"),
                reason: "no test executables found in cargo's output".into(),
            });
        }
        for exe in exes {
            let mut vg = Command::new("valgrind");
            vg.current_dir(root())
                .args([
                    "--tool=memcheck",
                    "--error-exitcode=1",
                    "--leak-check=full",
                    "--errors-for-leak-kinds=definite",
                    "--quiet",
                ])
                .arg(&exe)
                .arg("--test-threads=1")
                .env("PROPTEST_CASES", "32");
            let name = format!(
                "memcheck {}",
                std::path::Path::new(&exe)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or(exe.clone())
            );
            run(&name, vg)?;
        }
    }
    Ok(())
}

/// `cargo xtask bench [FILTER]`: the criterion benchmarks, in release mode.
pub fn bench(filter: &[String]) -> TaskResult {
    let mut c = cargo();
    // The allocator bench's cubecl peer is part of every full run (its side-by-side table).
    c.args([
        "bench",
        "--workspace",
        "--features",
        "c10-cuda/bench-peer-cubecl",
    ]);
    if !filter.is_empty() {
        c.arg("--").args(filter);
    }
    run("bench", c)
}

/// `cargo xtask bench alloc [--quick] [F]`: the caching allocator's bench alone (with the
/// cubecl peer): its criterion groups (optionally only those matching `F`), then the
/// side-by-side table against PyTorch 2.7.1 and 2.15.0 (torch-oracle, when set up) and cubecl.
/// `--quick` skips the criterion groups and prints the table only.
pub fn bench_alloc(args: &[String]) -> TaskResult {
    let mut c = cargo();
    c.args([
        "bench",
        "-p",
        "c10-cuda",
        "--bench",
        "alloc",
        "--features",
        "bench-peer-cubecl",
        "--",
    ]);
    if args.iter().any(|a| a == "--quick") {
        // A filter no criterion benchmark matches: only the table runs.
        c.arg("side-by-side-table-only");
    } else {
        c.args(args.iter().filter(|a| *a != "--quick"));
    }
    run("bench alloc", c)
}

/// `cargo xtask loom`: the engine's loom models, built with `--cfg loom` in release mode in
/// their own target directory (so the normal build is not invalidated).
pub fn loom() -> TaskResult {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::path::PathBuf::from(dir).join("loom"),
        None => root().join("target").join("loom"),
    };
    let mut c = cargo();
    c.args([
        "test",
        "-p",
        "engine",
        "--release",
        "--locked",
        "--test",
        "loom",
    ])
    .env("RUSTFLAGS", "--cfg loom")
    .env("CARGO_TARGET_DIR", target);
    run("loom", c)
}

/// MXNet's and StarPU's figures from the issue (2 cores, median us per task, first push to
/// wait_for_all): per-device engine with 2 CPU workers, StarPU 1.3 lws, naive engine.
const ENGINE_REFERENCE: [(&str, f64, f64, f64); 4] = [
    ("W1", 0.87, 1.91, 0.39),
    ("W2", 0.68, 2.65, 0.39),
    ("W3", 1.90, 11.37, 0.42),
    ("W4", 0.87, 1.86, 0.40),
];

/// Passes per engine and workload in `bench engine`.
const ENGINE_BENCH_REPS: &str = "5";

/// `cargo xtask bench engine [--peer starpu]`: the engine's criterion bench, then the
/// `engine-bench` example on W1..W4 for each engine with 2 workers, then (with `--peer starpu`)
/// the StarPU peer, and a table of median microseconds per task.
pub fn bench_engine(args: &[String]) -> TaskResult {
    let starpu = match args {
        [] => false,
        [flag, peer] if flag == "--peer" && peer == "starpu" => true,
        _ => {
            return Err(Failure {
                step: "bench engine".into(),
                reason: format!("unknown arguments {args:?} (expected: [--peer starpu])"),
            });
        }
    };
    let mut criterion = cargo();
    criterion.args(["bench", "-p", "engine", "--bench", "workloads"]);
    run("criterion", criterion)?;

    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "-p",
        "engine",
        "--example",
        "engine-bench",
    ]);
    run("build engine-bench", build)?;

    let workloads = ["W1", "W2", "W3", "W4"];
    let engines = ["naive", "pooled", "per-device"];
    let mut medians: Vec<(String, String, f64)> = Vec::new();
    for w in workloads {
        for e in engines {
            let mut c = cargo();
            c.args([
                "run",
                "--release",
                "--quiet",
                "-p",
                "engine",
                "--example",
                "engine-bench",
                "--",
            ])
            .args([w, ENGINE_BENCH_REPS, "--threads", "2", "--engine", e]);
            let m = run_json_bench(&format!("engine-bench {w} {e}"), c)?;
            medians.push((w.to_string(), e.to_string(), m));
        }
    }
    if starpu {
        match build_starpu_peer()? {
            Some(exe) => {
                for w in workloads {
                    let mut c = Command::new(&exe);
                    c.args([w, ENGINE_BENCH_REPS, "--threads", "2"]);
                    let m = run_json_bench(&format!("starpu {w}"), c)?;
                    medians.push((w.to_string(), "starpu".to_string(), m));
                }
            }
            None => eprintln!(
                "\n(skipping the StarPU peer: libstarpu-dev is not installed; \
                 Debian/Ubuntu: `apt-get install libstarpu-dev`)"
            ),
        }
    }
    let find = |w: &str, e: &str| {
        medians
            .iter()
            .find(|(mw, me, _)| mw == w && me == e)
            .map_or("-".to_string(), |(_, _, m)| format!("{m:.2}"))
    };
    println!(
        "\nmedian us per task, 2 workers (ours measured now; MXNet and StarPU* from the issue)"
    );
    println!(
        "| workload | naive | pooled | per-device | StarPU (now) | MXNet per-device* | StarPU* | MXNet naive* |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (w, mx, sp, mxn) in ENGINE_REFERENCE {
        println!(
            "| {w} | {} | {} | {} | {} | {mx:.2} | {sp:.2} | {mxn:.2} |",
            find(w, "naive"),
            find(w, "pooled"),
            find(w, "per-device"),
            find(w, "starpu"),
        );
    }
    Ok(())
}

/// Runs a bench printing one JSON line per pass; echoes the lines and returns the median of
/// `us_per_task`.
fn run_json_bench(name: &str, mut cmd: Command) -> Result<f64, Failure> {
    eprintln!("\n==> [{name}]");
    let out = cmd.current_dir(root()).output().map_err(|e| Failure {
        step: name.to_string(),
        reason: e.to_string(),
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    if !out.status.success() {
        return Err(Failure {
            step: name.to_string(),
            reason: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr)),
        });
    }
    let mut values: Vec<f64> = stdout
        .lines()
        .filter_map(|l| json_number(l, "us_per_task"))
        .collect();
    if values.is_empty() {
        return Err(Failure {
            step: name.to_string(),
            reason: "no us_per_task in the output".into(),
        });
    }
    values.sort_by(f64::total_cmp);
    Ok(values[values.len() / 2])
}

/// The number after `"key":` in a flat JSON line.
fn json_number(line: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let start = line.find(&pat)? + pat.len();
    let rest = &line[start..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// Builds `crates/engine/peer/starpu/starpu_bench.c` with `cc` and pkg-config; `None` when
/// StarPU's development files are not installed.
fn build_starpu_peer() -> Result<Option<std::path::PathBuf>, Failure> {
    let pkg = ["starpu-1.4", "starpu-1.3"]
        .into_iter()
        .find(|p| tool_available("pkg-config", &["--exists", p]));
    let Some(pkg) = pkg else {
        return Ok(None);
    };
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", pkg])
        .output()
        .map_err(|e| Failure {
            step: "starpu flags".into(),
            reason: e.to_string(),
        })?;
    let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => root().join("target"),
    };
    std::fs::create_dir_all(&target).map_err(|e| Failure {
        step: "starpu build".into(),
        reason: e.to_string(),
    })?;
    let exe = target.join("starpu_bench");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.current_dir(root())
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg("crates/engine/peer/starpu/starpu_bench.c")
        .args(flags.split_whitespace());
    run("build starpu peer", cc)?;
    Ok(Some(exe))
}

/// `cargo xtask soak`: the allocator's property test at 10 million random steps.
pub fn soak() -> TaskResult {
    let mut c = cargo();
    c.args([
        "test",
        "--release",
        "-p",
        "c10-cuda",
        "--test",
        "it",
        "--",
        "proptest_allocator::",
    ])
    .env("TENSORMEM_SOAK_STEPS", "10000000");
    run("soak", c)?;
    // DTR under a device-memory budget: every strategy and layout on every shared log at
    // 0.05 steps, and the figures of window on the default allocator.
    let mut d = cargo();
    d.args([
        "test",
        "--release",
        "-p",
        "checkpoint",
        "--test",
        "it",
        "--",
        "--ignored",
        "device_budget::",
    ]);
    run("soak (device budget)", d)
}

/// Pulls `"executable":"/path"` values out of cargo's JSON messages (no JSON dependency needed:
/// paths are JSON strings without escapes on the platforms valgrind supports).
fn test_executables(json_lines: &str) -> Vec<String> {
    const KEY: &str = "\"executable\":\"";
    json_lines
        .lines()
        .filter(|l| l.contains("\"test\":true"))
        .filter_map(|l| {
            let start = l.find(KEY)? + KEY.len();
            let end = l[start..].find('"')? + start;
            Some(l[start..end].to_string())
        })
        .collect()
}

/// The torch releases the differential tests compare against (torch-oracle's builds).
const ORACLE_RELEASES: [&str; 2] = ["2.7.1", "2.15.0"];

/// Where torch-oracle keeps its builds: `$TORCH_ORACLE_CACHE`, else `~/.cache/torch-oracle`.
fn oracle_cache() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("TORCH_ORACLE_CACHE") {
        return dir.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    std::path::Path::new(&home).join(".cache/torch-oracle")
}

/// `cargo xtask oracle [--torch V] [--cases N] [--seed S] [--jobs J]`: differential tests of
/// our allocator against PyTorch's real one (torch-oracle), `N` random scripts of 200-400 ops
/// per version (default 2000, both versions), through `oracle-diff fuzz` built in release mode.
/// Fails when a version's oracle is not built (saying how to set it up) and on any divergence
/// that is not one of our documented deliberate fixes; the last line sums up.
pub fn oracle(args: &[String]) -> TaskResult {
    let step = "oracle";
    let fail = |reason: String| Failure {
        step: step.into(),
        reason,
    };
    let mut torch = "all".to_string();
    let mut rest: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = |it: &mut std::slice::Iter<'_, String>| {
            it.next()
                .cloned()
                .ok_or_else(|| fail(format!("{a} needs a value")))
        };
        match a.as_str() {
            "--torch" => torch = value(&mut it)?,
            "--cases" | "--seed" | "--jobs" | "--first-case" | "--min-ops" | "--max-ops"
            | "--shrink" => {
                let v = value(&mut it)?;
                rest.push(a.clone());
                rest.push(v);
            }
            other => {
                return Err(fail(format!(
                    "unknown argument `{other}` (expected --torch V, --cases N, --seed S, \
                     --jobs J, --first-case K, --min-ops N, --max-ops N, --shrink N)"
                )));
            }
        }
    }
    if !rest.iter().any(|a| a == "--cases") {
        rest.extend(["--cases".to_string(), "2000".to_string()]);
    }
    let releases: Vec<&str> = if torch == "all" {
        ORACLE_RELEASES.to_vec()
    } else {
        let want: Vec<&str> = torch.split(',').collect();
        let mut out = Vec::new();
        for w in want {
            let r = ORACLE_RELEASES
                .iter()
                .find(|r| **r == w || r.starts_with(&format!("{w}.")))
                .ok_or_else(|| {
                    fail(format!(
                        "--torch {w}: expected one of {} or all",
                        ORACLE_RELEASES.join(", ")
                    ))
                })?;
            out.push(*r);
        }
        out
    };
    let cache = oracle_cache();
    let missing: Vec<&&str> = releases
        .iter()
        .filter(|r| !cache.join(r).join("bin/torch-oracle").is_file())
        .collect();
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|r| r.to_string()).collect();
        return Err(fail(format!(
            "torch-oracle is not set up for torch {} (looked in {}). Set it up with \
             `../shared/torch-oracle/setup.sh VERSION` for each (python3 with pip, gcc, g++ \
             and access to PyPI; see ../shared/torch-oracle/README.md), or point \
             TORCH_ORACLE_CACHE at a cache that has it",
            list.join(", "),
            cache.display()
        )));
    }
    let mut build = cargo();
    build.args(["build", "--release", "--locked", "-p", "oracle-diff"]);
    run("oracle: build oracle-diff", build)?;
    let exe = target_dir().join("release").join("oracle-diff");
    let mut fuzz = Command::new(exe);
    fuzz.current_dir(root())
        .args(["fuzz", "--torch", &releases.join(",")])
        .args(&rest);
    run("oracle: fuzz", fuzz)
}

#[cfg(test)]
mod tests {
    use super::{data_test_report, json_number, test_executables};

    #[test]
    fn data_test_report_says_what_was_skipped() {
        let dir = std::env::temp_dir().join(format!("xtask-skips-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skips.txt");
        let _ = std::fs::remove_file(&log);
        assert_eq!(
            data_test_report(&log),
            "data tests: all ran (the real snapshots and DTR logs in ../shared/data were found)"
        );
        std::fs::write(&log, "cli a\ncli b\noom_user c\n").unwrap();
        assert_eq!(
            data_test_report(&log),
            "data tests: 3 SKIPPED because ../shared/data is missing (cli 2, oom_user 1); set \
             TENSORMEM_SHARED to a shared/ folder to run them"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_numbers_from_bench_json_lines() {
        let line = r#"{"workload":"W1","us_per_task":0.4321,"cpu_s":0.1}"#;
        assert_eq!(json_number(line, "us_per_task"), Some(0.4321));
        assert_eq!(json_number(line, "cpu_s"), Some(0.1));
        assert_eq!(json_number(line, "missing"), None);
    }

    #[test]
    fn finds_test_executables_only() {
        let lines = r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/deps/a-1"}
{"reason":"compiler-artifact","profile":{"test":false},"executable":"/t/deps/b"}
{"reason":"compiler-artifact","profile":{"test":true},"executable":null}
{"reason":"build-finished","success":true}"#;
        assert_eq!(test_executables(lines), vec!["/t/deps/a-1".to_string()]);
    }
}

//! PyTorch's own allocator through torch-oracle (`../shared/torch-oracle`): its `--bench N`
//! (cold: every replay from an empty allocator) and `--bench-warm N` (segments cached between
//! replays) on the op script of a trace, parsed from the one JSON line it prints.
//!
//! The launcher is `$TORCH_ORACLE` when set, else `torch-oracle` in `shared/torch-oracle`
//! beside the workspace; it runs the build of one torch version from torch-oracle's cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::timing::PerPair;

/// The torch releases compared against (torch-oracle's builds).
pub const VERSIONS: [&str; 2] = ["2.7.1", "2.15.0"];

/// How to set torch-oracle up, for the message when it is not.
pub const SETUP: &str = "../shared/torch-oracle/setup.sh [VERSION] (python3 with pip, gcc, g++ \
                         and PyPI; see ../shared/torch-oracle/README.md)";

/// The torch-oracle launcher.
pub fn launcher() -> PathBuf {
    match std::env::var_os("TORCH_ORACLE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/torch-oracle/torch-oracle"),
    }
}

/// Runs `torch-oracle --torch VERSION --bench[-warm] RUNS SCRIPT` and reads its figures;
/// `allocs` is the trace's number of allocations (checked against the oracle's count).
///
/// Errors: the launcher is missing, the version is not set up (the launcher's own message,
/// which names the setup command), the run failed, or its output is not the expected line.
pub fn bench(
    launcher: &Path,
    version: &str,
    script: &Path,
    warm: bool,
    runs: usize,
    allocs: usize,
) -> Result<PerPair, String> {
    if !launcher.is_file() {
        return Err(format!("{} not found", launcher.display()));
    }
    let mode = if warm { "--bench-warm" } else { "--bench" };
    let out = Command::new(launcher)
        .args(["--torch", version, mode, &runs.to_string()])
        .arg(script)
        .output()
        .map_err(|e| format!("{}: {e}", launcher.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let first = stderr.lines().next().unwrap_or("").trim();
        return Err(format!("torch {version}: {} ({first})", out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("\"op\":\"bench\""))
        .ok_or_else(|| format!("torch {version}: no bench line in {stdout:?}"))?;
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("torch {version}: {e}: {line}"))?;
    let num = |key: &str| {
        v.get(key)
            .and_then(serde_json::Value::as_f64)
            .ok_or_else(|| format!("torch {version}: no {key} in {line}"))
    };
    if num("allocs")? as usize != allocs {
        return Err(format!(
            "torch {version}: the script has {} allocations, the trace {allocs}",
            num("allocs")?
        ));
    }
    if num("failed_allocs")? != 0.0 {
        return Err(format!(
            "torch {version}: {} allocations failed",
            num("failed_allocs")?
        ));
    }
    if v.get("va_reset") == Some(&serde_json::Value::Bool(false)) {
        return Err(format!(
            "torch {version}: a segment outlived emptyCache (va_reset false)"
        ));
    }
    Ok(PerPair {
        wall_best: num("wall_ns_per_pair_best")?,
        wall_median: num("wall_ns_per_pair_median")?,
        cpu_best: num("cpu_ns_per_pair_best")?,
        cpu_median: num("cpu_ns_per_pair_median")?,
    })
}

//! The tasks themselves: which steps each runs, in which order.

use std::process::Command;

use crate::steps::{Failure, TaskResult, cargo, root, run, tool_available};

/// Crates whose tests exercise most of the project's `unsafe` code; `valgrind` runs these.
const UNSAFE_HEAVY: &[&str] = &["c10-core", "c10-cuda"];

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
    run("tests", tests)?;

    let mut doctests = cargo();
    doctests.args(["test", "--workspace", "--doc", "--locked"]);
    doctests.env("INSTA_UPDATE", "no");
    run("doctests", doctests)?;

    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps", "--locked"]);
    doc.env("RUSTDOCFLAGS", "-D warnings");
    run("docs", doc)?;

    eprintln!(
        "\nxtask ci: all steps passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
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
        "c10-cuda",
        "--example",
        "cuda-probe",
    ]);
    run("probe", probe)?;

    let mut tests = cargo();
    tests.args([
        "test",
        "-p",
        "c10-cuda",
        "--features",
        "gpu-tests",
        "--test",
        "gpu",
        "--",
        "--test-threads=1",
    ]);
    run("gpu-tests", tests)
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
    c.args(["bench", "--workspace"]);
    if !filter.is_empty() {
        c.arg("--").args(filter);
    }
    run("bench", c)
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
        "proptest_allocator",
    ])
    .env("TENSORMEM_SOAK_STEPS", "10000000");
    run("soak", c)
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

#[cfg(test)]
mod tests {
    use super::test_executables;

    #[test]
    fn finds_test_executables_only() {
        let lines = r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/deps/a-1"}
{"reason":"compiler-artifact","profile":{"test":false},"executable":"/t/deps/b"}
{"reason":"compiler-artifact","profile":{"test":true},"executable":null}
{"reason":"build-finished","success":true}"#;
        assert_eq!(test_executables(lines), vec!["/t/deps/a-1".to_string()]);
    }
}

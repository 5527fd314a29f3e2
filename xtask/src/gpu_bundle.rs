//! `cargo xtask gpu-bundle`: every GPU check built here and packed for a machine that has a GPU
//! but no Rust toolchain (the `device` tool's), with a `run.sh` that needs no cargo.
//!
//! The GPU test targets are found by scanning, not listed: every `[[test]]` entry of a
//! `crates/*/Cargo.toml` with `required-features = ["gpu-tests"]` is one (one binary per crate,
//! `tests/gpu/main.rs`, whose modules are the GPU test files; a new file there cannot be left out,
//! and `cargo xtask gpu-test` uses the same scan). Layout of `target/gpu-bundle/`:
//!
//! ```text
//! run.sh  report.py  manifest.json
//! bin/cuda-probe  bin/gpu-bench          tests/<crate>-<target>   (release, stripped)
//! lib/libtensormem_alloc.so              py/torch_pluggable.py  py/torch_train.py
//! traces/<trace>.ops                     (the six shared traces, torch-oracle op scripts)
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::steps::{Failure, TaskResult, cargo, root, run, tool_available};

/// The most the bundle may weigh: the working tree travels with it and the device tool carries
/// 64 MiB in all.
pub const BUNDLE_LIMIT: u64 = 48 << 20;

/// The feature a GPU-only test target requires (`required-features` of its `[[test]]` entry).
const GPU_FEATURE: &str = "gpu-tests";

const RUN_SH: &str = include_str!("../bundle/run.sh");
const REPORT_PY: &str = include_str!("../bundle/report.py");

/// Python scripts of the bundle, relative to the workspace root.
const PY_SCRIPTS: [&str; 2] = [
    "crates/c10-cuda-capi/tests/torch_pluggable.py",
    "crates/c10-cuda-capi/tests/torch_train.py",
];

/// One GPU-only integration test target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTest {
    /// The package name (`c10-cuda-driver`).
    pub krate: String,
    /// The test target (its `[[test]]` name: `gpu`).
    pub target: String,
    /// Its source directory relative to the crate (`tests/gpu`): every file in it is GPU-only.
    pub dir: PathBuf,
}

/// Every GPU-only test target of the workspace at `root`, sorted by crate then target: the
/// `[[test]]` entries of `crates/*/Cargo.toml` whose `required-features` name `gpu-tests`.
///
/// # Errors
/// A crate folder or manifest that cannot be read, a manifest without a package name, or a GPU
/// `[[test]]` entry without a `name` or `path`.
pub fn gpu_test_targets(root: &Path) -> Result<Vec<GpuTest>, String> {
    let crates = root.join("crates");
    let mut out = Vec::new();
    let dirs = std::fs::read_dir(&crates).map_err(|e| format!("{}: {e}", crates.display()))?;
    let mut dirs: Vec<PathBuf> = dirs.filter_map(|d| d.ok().map(|d| d.path())).collect();
    dirs.sort();
    for dir in dirs {
        let manifest = dir.join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let targets = gpu_tests_of(&text).map_err(|e| format!("{}: {e}", manifest.display()))?;
        if targets.is_empty() {
            continue;
        }
        let krate = package_name(&manifest)?;
        for (target, path) in targets {
            let dir = Path::new(&path)
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            out.push(GpuTest {
                krate: krate.clone(),
                target,
                dir,
            });
        }
    }
    Ok(out)
}

/// `(name, path)` of each `[[test]]` entry of a manifest whose `required-features` name
/// [`GPU_FEATURE`] (a line-based reading of the TOML Cargo writes and we write: one key per line,
/// the features list on one line).
fn gpu_tests_of(manifest: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut entry: Option<(Option<String>, Option<String>, bool)> = None;
    let mut finish = |entry: Option<(Option<String>, Option<String>, bool)>| match entry {
        Some((name, path, true)) => match (name, path) {
            (Some(name), Some(path)) => {
                out.push((name, path));
                Ok(())
            }
            (name, _) => Err(format!(
                "a [[test]] entry requiring {GPU_FEATURE} needs a name and a path ({name:?})"
            )),
        },
        _ => Ok(()),
    };
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            finish(entry.take())?;
            if line == "[[test]]" {
                entry = Some((None, None, false));
            }
            continue;
        }
        let Some((name, path, gpu)) = entry.as_mut() else {
            continue;
        };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "name" => *name = Some(value.trim_matches('"').to_string()),
            "path" => *path = Some(value.trim_matches('"').to_string()),
            "required-features" => {
                *gpu = value
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .split(',')
                    .any(|f| f.trim().trim_matches('"') == GPU_FEATURE);
            }
            _ => {}
        }
    }
    finish(entry)?;
    Ok(out)
}

/// The `name` of a manifest's `[package]`.
fn package_name(manifest: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if in_package && let Some(rest) = line.strip_prefix("name") {
            let value = rest.trim_start().trim_start_matches('=').trim();
            return Ok(value.trim_matches('"').to_string());
        }
    }
    Err(format!("{}: no [package] name", manifest.display()))
}

/// `(target name, executable)` of each artifact with an executable in cargo's JSON messages.
pub fn artifacts(json_lines: &str) -> Vec<(String, String)> {
    json_lines
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|l| {
            let exe = string_field(l, "\"executable\":\"")?;
            let target = &l[l.find("\"target\":{")?..];
            let name = string_field(target, "\"name\":\"")?;
            Some((name, exe))
        })
        .collect()
}

/// The JSON string value right after `key` (which ends with the opening quote).
fn string_field(line: &str, key: &str) -> Option<String> {
    let start = line.find(key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}

/// The files of a bundle folder with their sizes, sorted by path, and the total in bytes.
pub fn bundle_files(dir: &Path) -> Result<(Vec<(String, u64)>, u64), String> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", d.display()))?;
            let path = entry.path();
            let meta = entry
                .metadata()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if meta.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap_or(&path);
                files.push((rel.to_string_lossy().into_owned(), meta.len()));
            }
        }
    }
    files.sort();
    let total = files.iter().map(|(_, n)| n).sum();
    Ok((files, total))
}

/// Refuses a bundle of `total` bytes over [`BUNDLE_LIMIT`], naming the largest files.
pub fn check_size(files: &[(String, u64)], total: u64) -> Result<(), String> {
    if total <= BUNDLE_LIMIT {
        return Ok(());
    }
    let mut largest: Vec<&(String, u64)> = files.iter().collect();
    largest.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let names: Vec<String> = largest
        .iter()
        .take(3)
        .map(|(f, n)| format!("{f} {}", mib(*n)))
        .collect();
    Err(format!(
        "the bundle would be {}, over the {} limit (largest: {}); not written",
        mib(total),
        mib(BUNDLE_LIMIT),
        names.join(", ")
    ))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The newest `GLIBC_x.y` symbol version a binary needs (read from its bytes: the version
/// strings of its dynamic symbols), so a bundle says which hosts it runs on.
pub fn glibc_needed(binary: &[u8]) -> Option<(u32, u32)> {
    let needle = b"GLIBC_2.";
    let mut best: Option<(u32, u32)> = None;
    let mut i = 0;
    while let Some(pos) = binary[i..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + i)
    {
        let rest = &binary[pos + needle.len()..];
        let digits: Vec<u8> = rest
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .copied()
            .collect();
        if let Ok(minor) = String::from_utf8_lossy(&digits).parse::<u32>() {
            best = best.max(Some((2, minor)));
        }
        i = pos + needle.len();
    }
    best
}

fn fail(step: &str) -> impl Fn(String) -> Failure + '_ {
    move |reason| Failure {
        step: step.to_string(),
        reason,
    }
}

/// Runs a cargo build with `--message-format=json-render-diagnostics` as step `name` and
/// returns its JSON messages (stdout); diagnostics and progress go to the terminal.
fn cargo_json(name: &str, mut cmd: Command) -> Result<String, Failure> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit());
    eprintln!("\n==> [{name}]");
    let out = cmd.output().map_err(|e| fail(name)(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(name)(format!("cargo failed ({})", out.status)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Copies `from` to `to`, stripped of symbols and debug info when `strip` is installed.
fn copy_stripped(from: &Path, to: &Path, strip: bool) -> Result<(), String> {
    std::fs::copy(from, to).map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))?;
    if strip {
        let status = Command::new("strip")
            .arg("--strip-all")
            .arg(to)
            .status()
            .map_err(|e| format!("strip {}: {e}", to.display()))?;
        if !status.success() {
            return Err(format!("strip {} failed ({status})", to.display()));
        }
    }
    Ok(())
}

/// Copies the executable of target `name` among cargo's `found` artifacts to `to` (stripped).
fn take_artifact(
    found: &[(String, String)],
    name: &str,
    to: &Path,
    strip: bool,
) -> Result<(), Failure> {
    let exe = found
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, e)| e.clone())
        .ok_or_else(|| fail("gpu-bundle")(format!("no executable for target {name}")))?;
    copy_stripped(Path::new(&exe), to, strip).map_err(fail("gpu-bundle"))
}

/// `cargo xtask gpu-bundle`: builds (release, `gpu-tests`) every GPU test binary, the CUDA
/// probe, the GPU bench and `libtensormem_alloc.so`, strips them, converts the shared traces,
/// and writes `target/gpu-bundle/` (see the module doc), refusing one over [`BUNDLE_LIMIT`].
pub fn gpu_bundle() -> TaskResult {
    let root = root();
    let target = crate::tasks::target_dir();
    let tests = gpu_test_targets(&root).map_err(fail("gpu-bundle: scan"))?;
    if tests.is_empty() {
        return Err(fail("gpu-bundle: scan")(
            "no GPU test target found (a [[test]] of crates/*/Cargo.toml with \
             required-features = [\"gpu-tests\"])"
                .into(),
        ));
    }
    // Always under the workspace's own `target/` (whatever CARGO_TARGET_DIR says): the device
    // tool carries paths relative to the repository root.
    let staging = root.join("target").join("gpu-bundle.tmp");
    let _ = std::fs::remove_dir_all(&staging);
    for sub in ["bin", "tests", "lib", "py", "traces"] {
        std::fs::create_dir_all(staging.join(sub))
            .map_err(|e| fail("gpu-bundle")(format!("{}: {e}", staging.display())))?;
    }
    let strip = tool_available("strip", &["--version"]);
    if !strip {
        eprintln!("(strip not found: the binaries are copied unstripped)");
    }

    // Test binaries, one cargo call per crate.
    let mut crates: Vec<&str> = tests.iter().map(|t| t.krate.as_str()).collect();
    crates.dedup();
    let mut listed = Vec::new();
    for krate in crates {
        let mut build = cargo();
        build.args([
            "test",
            "--release",
            "--locked",
            "-p",
            krate,
            "--features",
            "gpu-tests",
            "--no-run",
        ]);
        for t in tests.iter().filter(|t| t.krate == krate) {
            build.args(["--test", &t.target]);
        }
        let json = cargo_json(&format!("gpu-bundle: build {krate} GPU tests"), build)?;
        let found = artifacts(&json);
        for t in tests.iter().filter(|t| t.krate == krate) {
            let name = format!("{}-{}", t.krate, t.target);
            take_artifact(&found, &t.target, &staging.join("tests").join(&name), strip)?;
            listed.push(name);
        }
    }

    // The probe and the bench.
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "--locked",
        "-p",
        "c10-cuda-driver",
        "--example",
        "cuda-probe",
        "--example",
        "gpu-bench",
    ]);
    let json = cargo_json("gpu-bundle: build cuda-probe, gpu-bench", build)?;
    let found = artifacts(&json);
    for name in ["cuda-probe", "gpu-bench"] {
        take_artifact(&found, name, &staging.join("bin").join(name), strip)?;
    }

    // libtensormem_alloc.so.
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "--locked",
        "-p",
        "c10-cuda-capi",
        "--lib",
    ]);
    run("gpu-bundle: build libtensormem_alloc.so", build)?;
    let lib = target.join("release").join("libtensormem_alloc.so");
    copy_stripped(&lib, &staging.join("lib/libtensormem_alloc.so"), strip)
        .map_err(fail("gpu-bundle"))?;

    // The traces, converted here by the bench itself.
    let mut convert = Command::new(staging.join("bin/gpu-bench"));
    convert.arg("convert").arg(staging.join("traces"));
    let traces = match run("gpu-bundle: convert the shared traces", convert) {
        Ok(()) => "the six shared traces".to_string(),
        Err(e) => {
            eprintln!(
                "(no traces in the bundle: {}; the bench runs the warm pairs only)",
                e.reason
            );
            "none (../shared/data/snapshots not found)".to_string()
        }
    };

    // Scripts.
    let write = |rel: &str, text: &str| {
        let path = staging.join(rel);
        std::fs::write(&path, text).map_err(|e| fail("gpu-bundle")(format!("{rel}: {e}")))
    };
    write("run.sh", RUN_SH)?;
    write("report.py", REPORT_PY)?;
    for script in PY_SCRIPTS {
        let from = root.join(script);
        let name = Path::new(script).file_name().unwrap_or_default();
        std::fs::copy(&from, staging.join("py").join(name))
            .map_err(|e| fail("gpu-bundle")(format!("{}: {e}", from.display())))?;
    }
    set_executable(&staging.join("run.sh")).map_err(fail("gpu-bundle"))?;

    let glibc = std::fs::read_dir(staging.join("tests"))
        .into_iter()
        .flatten()
        .flatten()
        .chain(
            std::fs::read_dir(staging.join("bin"))
                .into_iter()
                .flatten()
                .flatten(),
        )
        .filter_map(|e| std::fs::read(e.path()).ok())
        .chain(std::fs::read(staging.join("lib/libtensormem_alloc.so")).ok())
        .filter_map(|bytes| glibc_needed(&bytes))
        .max();
    write(
        "manifest.json",
        &manifest(&listed, &traces, glibc, &git_commit(&root)),
    )?;

    let (files, total) = bundle_files(&staging).map_err(fail("gpu-bundle"))?;
    if let Err(e) = check_size(&files, total) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(fail("gpu-bundle: size")(e));
    }
    let dest = root.join("target").join("gpu-bundle");
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(&staging, &dest)
        .map_err(|e| fail("gpu-bundle")(format!("{}: {e}", dest.display())))?;
    eprintln!(
        "\ngpu-bundle: {} in {} files at {} (limit {}); {} GPU test binaries: {}",
        mib(total),
        files.len(),
        dest.display(),
        mib(BUNDLE_LIMIT),
        listed.len(),
        listed.join(", ")
    );
    eprintln!(
        "run it where a GPU is lent: the device tool's `run` with carry [\"target/gpu-bundle\"] \
         and command `bash target/gpu-bundle/run.sh`"
    );
    Ok(())
}

/// The bundle's `manifest.json`: what it holds and what it was built from.
pub fn manifest(tests: &[String], traces: &str, glibc: Option<(u32, u32)>, commit: &str) -> String {
    let mut out = String::from("{\n");
    let _ = writeln!(out, "  \"commit\": \"{commit}\",");
    let built = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let _ = writeln!(out, "  \"built\": \"unix {built}\",");
    let list: Vec<String> = tests.iter().map(|t| format!("\"{t}\"")).collect();
    let _ = writeln!(out, "  \"gpu_tests\": [{}],", list.join(", "));
    let _ = writeln!(out, "  \"traces\": \"{traces}\",");
    let glibc = glibc.map_or("unknown".to_string(), |(a, b)| format!("{a}.{b}"));
    let _ = writeln!(out, "  \"glibc_needed\": \"{glibc}\"");
    out.push_str("}\n");
    out
}

fn git_commit(root: &Path) -> String {
    Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<(), String> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_finds_every_gpu_test_target_of_the_workspace() {
        let found = gpu_test_targets(&root()).unwrap();
        let names: Vec<String> = found
            .iter()
            .map(|t| format!("{}/{} {}", t.krate, t.target, t.dir.display()))
            .collect();
        assert_eq!(
            names,
            ["aten/gpu tests/gpu", "c10-cuda-driver/gpu tests/gpu"]
        );
        // Exactly the GPU test files: those of the GPU targets' folders (their main.rs naming
        // each of them as a module), and no other test file of any crate asks for the feature (a
        // file cfg'd on it outside a GPU target would run nowhere).
        let mut gpu_files = Vec::new();
        for dir in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
            let crate_dir = dir.path();
            let gpu_dirs: Vec<PathBuf> = found
                .iter()
                .filter(|t| crate_dir.ends_with(crate_dir_name(&t.krate)))
                .map(|t| crate_dir.join(&t.dir))
                .collect();
            let mut stack = vec![crate_dir.join("tests")];
            while let Some(folder) = stack.pop() {
                for file in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                    let path = file.path();
                    if path.is_dir() {
                        stack.push(path);
                        continue;
                    }
                    if path.extension().is_none_or(|e| e != "rs") {
                        continue;
                    }
                    let text = std::fs::read_to_string(&path).unwrap();
                    let in_gpu = gpu_dirs.iter().any(|d| path.starts_with(d));
                    assert!(
                        !text.contains("feature = \"gpu-tests\""),
                        "{}: GPU tests go in a required-features target, not behind a cfg",
                        path.display()
                    );
                    if in_gpu {
                        let rel = path.strip_prefix(&crate_dir).unwrap().display().to_string();
                        gpu_files.push(format!("{}/{rel}", crate_dir_name_of(&crate_dir)));
                        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                        if stem != "main" {
                            let main =
                                std::fs::read_to_string(path.with_file_name("main.rs")).unwrap();
                            assert!(
                                main.contains(&format!("mod {stem};")),
                                "{} is not a module of its GPU binary",
                                path.display()
                            );
                        }
                    }
                }
            }
        }
        gpu_files.sort();
        assert_eq!(
            gpu_files,
            [
                "aten/tests/gpu/gpu.rs",
                "aten/tests/gpu/gpu_pinned_ipc.rs",
                "aten/tests/gpu/main.rs",
                "c10-cuda-driver/tests/gpu/gpu.rs",
                "c10-cuda-driver/tests/gpu/gpu_interop.rs",
                "c10-cuda-driver/tests/gpu/gpu_ipc.rs",
                "c10-cuda-driver/tests/gpu/gpu_pinned.rs",
                "c10-cuda-driver/tests/gpu/main.rs",
            ]
        );
    }

    /// The folder name of a crate of this workspace (the package name, here).
    fn crate_dir_name(krate: &str) -> &str {
        krate
    }

    fn crate_dir_name_of(dir: &Path) -> String {
        dir.file_name().unwrap().to_string_lossy().into_owned()
    }

    #[test]
    fn gpu_targets_are_recognized_by_their_required_features_only() {
        let manifest = "[package]\nname = \"x\"\n\n[[test]]\nname = \"gpu\"\n\
                        path = \"tests/gpu/main.rs\"\nrequired-features = [\"gpu-tests\"]\n\n\
                        [[test]]\nname = \"it\"\npath = \"tests/it/main.rs\"\n\n\
                        [[test]]\nname = \"both\"\npath = \"tests/b.rs\"\n\
                        required-features = [\"other\", \"gpu-tests\"]\n\n\
                        [[bench]]\nname = \"b\"\nrequired-features = [\"gpu-tests\"]\n\n\
                        [lints]\nworkspace = true\n";
        assert_eq!(
            gpu_tests_of(manifest).unwrap(),
            [
                ("gpu".to_string(), "tests/gpu/main.rs".to_string()),
                ("both".to_string(), "tests/b.rs".to_string()),
            ]
        );
        assert!(gpu_tests_of("[[test]]\nrequired-features = [\"gpu-tests\"]\n").is_err());
        assert!(gpu_tests_of("[[test]]\nname = \"t\"\n").unwrap().is_empty());
    }

    #[test]
    fn reads_package_names() {
        assert_eq!(
            package_name(&root().join("crates/c10-cuda-capi/Cargo.toml")).unwrap(),
            "c10-cuda-capi"
        );
        assert!(package_name(&root().join("no/such/Cargo.toml")).is_err());
    }

    #[test]
    fn finds_artifacts_with_their_target_names() {
        let lines = r#"{"reason":"compiler-artifact","package_id":"x","target":{"kind":["test"],"crate_types":["bin"],"name":"gpu_ipc","src_path":"/a"},"profile":{"test":true},"executable":"/t/release/deps/gpu_ipc-1"}
{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"c10_cuda"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","target":{"kind":["example"],"name":"cuda-probe"},"executable":"/t/release/examples/cuda-probe"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            artifacts(lines),
            vec![
                (
                    "gpu_ipc".to_string(),
                    "/t/release/deps/gpu_ipc-1".to_string()
                ),
                (
                    "cuda-probe".to_string(),
                    "/t/release/examples/cuda-probe".to_string()
                ),
            ]
        );
    }

    #[test]
    fn refuses_a_bundle_over_the_limit() {
        let files = vec![
            ("tests/a".to_string(), 30 << 20),
            ("bin/b".to_string(), 19 << 20),
            ("run.sh".to_string(), 100),
        ];
        let total = files.iter().map(|(_, n)| n).sum();
        assert_eq!(
            check_size(&files, total).unwrap_err(),
            "the bundle would be 49.0 MiB, over the 48.0 MiB limit (largest: tests/a 30.0 MiB, \
             bin/b 19.0 MiB, run.sh 0.0 MiB); not written"
        );
        assert!(check_size(&files[1..], (19 << 20) + 100).is_ok());
    }

    #[test]
    fn reads_the_newest_glibc_version_needed() {
        let bytes = b"\0GLIBC_2.2.5\0GLIBC_2.34\0GLIBC_2.17\0GLIBC_PRIVATE\0";
        assert_eq!(glibc_needed(bytes), Some((2, 34)));
        assert_eq!(glibc_needed(b"no versions"), None);
    }

    #[test]
    fn the_manifest_lists_the_tests_and_the_glibc_needed() {
        let m = manifest(
            &["c10-cuda-gpu".into(), "aten-gpu".into()],
            "the six shared traces",
            Some((2, 34)),
            "abc123",
        );
        assert!(
            m.contains("\"gpu_tests\": [\"c10-cuda-gpu\", \"aten-gpu\"],"),
            "{m}"
        );
        assert!(m.contains("\"glibc_needed\": \"2.34\""), "{m}");
        assert!(m.contains("\"commit\": \"abc123\""), "{m}");
    }

    #[test]
    fn run_sh_runs_every_test_binary_and_stops_at_the_probe() {
        // Every binary under tests/ is run: the list is not repeated in the script.
        assert!(RUN_SH.contains("for bin in \"$HERE\"/tests/*; do"));
        assert!(RUN_SH.contains("step probe 30 \"$HERE/bin/cuda-probe\""));
        assert!(RUN_SH.contains("exit 2"));
        for script in PY_SCRIPTS {
            let name = Path::new(script).file_name().unwrap().to_string_lossy();
            assert!(RUN_SH.contains(&format!("$HERE/py/{name}")), "{name}");
            assert!(root().join(script).is_file(), "{script}");
        }
    }
}

//! Builds `tests/c/abi_test.c` with the system C compiler (`$CC`, default `cc`) against
//! `libtensormem_alloc.so` and runs it on the simulated backend: allocations, frees,
//! record_stream, stats, errors, threads and a snapshot through the C ABI; then a panic injected
//! into each entry point (this crate's tests build the library with `inject-panic`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use tensormem_pickle::Value;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding `libtensormem_alloc.so`: Cargo puts the cdylib beside this test's
/// executable (`target/<profile>/deps`).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("libtensormem_alloc.so").exists(),
        "libtensormem_alloc.so is not in {} (cargo builds it with this test)",
        dir.display()
    );
    dir
}

/// Compiles the C program once per test run; returns its path.
fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        // One executable per test process: nextest runs each test in its own process, at once.
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("abi_test-{}", std::process::id()));
        let lib = library_dir();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let status = Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O0"])
            .arg("-I")
            .arg(crate_dir().join("include"))
            .arg(crate_dir().join("tests/c/abi_test.c"))
            .arg("-o")
            .arg(&out)
            .arg("-L")
            .arg(&lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .args(["-ltensormem_alloc", "-lpthread"])
            .status()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
        assert!(status.success(), "{cc} failed to build abi_test.c");
        out
    })
}

/// Runs the program with the simulated backend on a 1 GiB device.
fn run(args: &[&str], panic_in: Option<&str>) -> Output {
    let mut cmd = Command::new(program());
    // Cargo's LD_LIBRARY_PATH for tests may name `target/<profile>` first, where a
    // `cargo build` leaves the library without this crate's test feature: load ours.
    cmd.args(args)
        .env("LD_LIBRARY_PATH", library_dir())
        .env("TENSORMEM_ALLOC_BACKEND", "sim")
        .env("TENSORMEM_SIM_MEMORY", "1GiB")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .env_remove("TENSORMEM_ALLOC_INJECT_PANIC");
    if let Some(name) = panic_in {
        cmd.env("TENSORMEM_ALLOC_INJECT_PANIC", name);
    }
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_c_program_passes_on_the_simulated_backend() {
    let snapshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("abi_test_snapshot-{}.pickle", std::process::id()));
    let _ = std::fs::remove_file(&snapshot);
    let out = run(&["all", snapshot.to_str().unwrap()], None);
    assert!(
        out.status.success(),
        "abi_test failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), "abi_test: all 97 checks passed\n");

    // The snapshot it wrote is PyTorch's format, and its history has the C program's stack.
    let value = tensormem_pickle::decode(&std::fs::read(&snapshot).unwrap()).unwrap();
    let trace = value.get("device_traces").unwrap().as_list().unwrap()[0]
        .as_list()
        .unwrap();
    let alloc = trace
        .iter()
        .find(|e| e.get("action").and_then(Value::as_str) == Some("alloc"))
        .expect("an alloc entry");
    assert_eq!(alloc.get("size").and_then(Value::as_i64), Some(4 << 20));
    let frames: Vec<(String, String)> = alloc
        .get("frames")
        .unwrap()
        .as_list()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f.get("name").unwrap().as_str().unwrap().to_string(),
                f.get("filename").unwrap().as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        frames.first().map(|f| f.0.as_str()),
        Some("tm_malloc"),
        "the stack starts at the C entry point: {frames:?}"
    );
    assert!(
        frames
            .iter()
            .any(|(name, file)| name == "all" && file.ends_with("abi_test.c")),
        "the C caller is in the stack: {frames:?}"
    );
    let _ = std::fs::remove_file(&snapshot);
}

/// A panic inside each entry point comes back as its error value, with the panic's message in
/// `tm_last_error()`, and the allocator keeps working.
#[test]
fn an_injected_panic_becomes_an_error_return() {
    for name in [
        "tm_malloc",
        "tm_free",
        "tm_record_stream",
        "tm_set_config",
        "tm_memory_stats_json",
        "tm_snapshot_pickle",
    ] {
        let out = run(&["panic", name], Some(name));
        assert!(
            out.status.success(),
            "panic in {name}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).starts_with(&format!("abi_test: panic in {name} became an error")),
            "{}",
            text(&out.stdout)
        );
    }
}

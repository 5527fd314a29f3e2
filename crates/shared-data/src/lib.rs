//! Test support: where the shared data lives (`<workspace>/../shared/data`, the real PyTorch
//! snapshots and DTR logs) and the workspace rule for its absence: tests skip with a message,
//! except under `CI=true`, where a missing folder is a failure.
//!
//! Used as a dev-dependency by every crate whose tests or benches read the shared data.

use std::path::PathBuf;

/// `<workspace>/../shared/data`, or `$TENSORMEM_SHARED/data` when `TENSORMEM_SHARED` (a
/// `shared/` folder) is set. The path may not exist.
pub fn expected_path() -> PathBuf {
    if let Some(dir) = std::env::var_os("TENSORMEM_SHARED") {
        return PathBuf::from(dir).join("data");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("..")
        .join("shared")
        .join("data")
}

/// Whether the environment says this is a CI run (`CI=true`).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// `sub` inside the shared data folder (`""` for the folder itself), or `None` after printing
/// `skipping: ...` when it is absent.
///
/// # Panics
/// When the folder is absent and `CI=true`: CI must never skip.
pub fn dir(sub: &str) -> Option<PathBuf> {
    let dir = expected_path().join(sub);
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        !is_ci(),
        "shared data folder {} is missing, and CI=true forbids skipping",
        dir.display()
    );
    eprintln!(
        "skipping: shared data folder {} is missing (set TENSORMEM_SHARED to a shared/ folder)",
        dir.display()
    );
    record_skip();
    None
}

/// The environment variable naming a file to which each skipped data test appends its name
/// (set by `cargo xtask ci`, which then reports how many data tests were skipped).
pub const SKIP_LOG_ENV: &str = "TENSORMEM_DATA_SKIP_LOG";

/// Appends the test binary and the running test's name (its thread's name, as libtest and
/// nextest set it) to the
/// file named by [`SKIP_LOG_ENV`], if set. Best effort: a write failure loses one line only.
fn record_skip() {
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        record_skip_to(std::path::Path::new(&path));
    }
}

/// Appends `<test binary> <test name>` to `path`.
fn record_skip_to(path: &std::path::Path) {
    use std::io::Write as _;
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed>")
        .to_string();
    // The test binary (`cli-0123abcd`), without cargo's hash.
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| s.rsplit_once('-').map_or(s.clone(), |(b, _)| b.to_string()))
        .unwrap_or_default();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{binary} {name}");
    }
}

/// The real PyTorch memory snapshots (`../shared/data/snapshots`); see [`dir`].
///
/// # Panics
/// As [`dir`].
pub fn snapshots_dir() -> Option<PathBuf> {
    dir("snapshots")
}

/// The DTR paper's operator logs (`../shared/data/dtr-logs`); see [`dir`].
///
/// # Panics
/// As [`dir`].
pub fn dtr_logs_dir() -> Option<PathBuf> {
    dir("dtr-logs")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_skip_is_logged_with_the_test_name() {
        let path = std::env::temp_dir().join(format!("skip-log-{}.txt", std::process::id()));
        let _ = std::fs::remove_file(&path);
        super::record_skip_to(&path);
        super::record_skip_to(&path);
        let text = std::fs::read_to_string(&path).expect("written");
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        // libtest names the thread after the test; the binary is this crate's test binary.
        assert!(
            lines[0].ends_with("tests::a_skip_is_logged_with_the_test_name"),
            "{}",
            lines[0]
        );
        assert!(lines[0].starts_with("shared_data "), "{}", lines[0]);
    }

    #[test]
    fn the_default_path_is_beside_the_workspace() {
        if std::env::var_os("TENSORMEM_SHARED").is_none() {
            let p = super::expected_path();
            assert!(p.ends_with("shared/data"));
            // crates/shared-data/../../.. is the folder holding the checkout.
            assert!(p.starts_with(env!("CARGO_MANIFEST_DIR")));
        }
    }
}

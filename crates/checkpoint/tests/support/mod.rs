//! Locating `../shared/data/dtr-logs` for the tests that read the paper's logs: skip with a
//! message when the folder is absent, fail under `CI=true` (the workspace rule of
//! `tests/support.rs`, copied here so this crate depends on nothing for it).

#![allow(dead_code)]

use std::path::PathBuf;

/// `<workspace>/../shared/data`, or `$TENSORMEM_SHARED/data` when that is set.
pub fn expected_shared_data_path() -> PathBuf {
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

/// The DTR log folder, or `None` (after saying why) when it is absent and `CI` is not `true`.
///
/// # Panics
/// When the folder is absent under `CI=true`.
pub fn dtr_logs_dir() -> Option<PathBuf> {
    let dir = expected_shared_data_path().join("dtr-logs");
    if dir.is_dir() {
        return Some(dir);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    assert!(
        !ci,
        "shared data folder {} is missing, and CI=true forbids skipping",
        dir.display()
    );
    eprintln!(
        "skipping: shared data folder {} is missing (set TENSORMEM_SHARED to a shared/ folder)",
        dir.display()
    );
    None
}

/// The log whose file name starts with `prefix` (`resnet32`, `unet`, ...).
///
/// # Panics
/// When no such log exists in the folder.
pub fn log_path(dir: &std::path::Path, prefix: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("readable dtr-logs folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "log")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{prefix}-")))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no {prefix}-*.log in {}", dir.display()))
}

/// The five shared logs' prefixes.
pub const LOGS: [&str; 5] = ["lstm", "resnet32", "transformer", "tv_densenet121", "unet"];

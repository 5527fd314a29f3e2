//! Locating the paper's logs in `../shared/data/dtr-logs` for the tests (through the
//! `shared-data` crate: skip with a message when absent, fail under `CI=true`).

#![allow(dead_code)]

use std::path::PathBuf;

/// The DTR log folder, or `None` (after saying why) when it is absent and `CI` is not `true`.
///
/// # Panics
/// When the folder is absent under `CI=true`.
pub fn dtr_logs_dir() -> Option<PathBuf> {
    shared_data::dtr_logs_dir()
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

/// The corpus recorded by `tensormem.record` from real PyTorch models
/// (`crates/checkpoint/corpus/*.log.gz`, committed; see its README).
pub fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// Every corpus log as `(stem, path)` (`resnet50-32`, ...), sorted by name.
///
/// # Panics
/// When the corpus folder cannot be read.
pub fn corpus_logs() -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(corpus_dir())
        .expect("readable corpus folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p
                .file_name()?
                .to_str()?
                .strip_suffix(".log.gz")?
                .to_string();
            Some((name, p))
        })
        .collect();
    found.sort();
    found
}

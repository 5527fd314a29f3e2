//! Helpers shared by the cross-crate integration tests: locating `../shared/data`.
//!
//! Tests that read the shared data call [`shared_data_dir`]: when the folder is absent they skip
//! with a message, except under `CI=true`, where its absence is a failure.

use std::path::PathBuf;

/// Where the shared data folder is expected: `<workspace>/../shared/data`, or `$TENSORMEM_SHARED`
/// (a `shared/` folder) when set.
pub fn expected_shared_data_path() -> PathBuf {
    shared_data::expected_path()
}

/// The shared data folder, or `None` (after printing why) when it is absent and `CI` is not
/// `true`.
///
/// # Panics
/// When the folder is absent and the environment variable `CI` is `true`: CI must never skip.
pub fn shared_data_dir() -> Option<PathBuf> {
    shared_data::dir("")
}

//! The MSRV step: the `rust-version` the workspace declares must be at least what every
//! dependency declares, and the workspace must build with that toolchain when it is installed.
//!
//! What checks the declared version, and what does not:
//! - clippy's `incompatible_msrv` lint (on in the workspace lints, denied by CI's `-D warnings`)
//!   reads `rust-version` and flags standard-library items stabilised later, in library and
//!   binary code; it skips test code, and it does not know language features (let-chains, which
//!   the engine and xtask use, need 1.88);
//! - this step compares the declared version with the dependencies' `rust_version`
//!   (`cargo metadata`: the lock file's packages, all platforms);
//! - `cargo +VERSION check --workspace --all-targets` runs only where rustup lists that
//!   toolchain as installed; otherwise the step says it skipped it.

use std::process::Command;

use crate::steps::{Failure, TaskResult, cargo, root, run};
use crate::tasks::target_dir;

/// A Rust version, `major.minor.patch` (a missing patch is 0).
type Version = (u32, u32, u32);

/// `"1.88"` or `"1.88.0"` as a [`Version`]; `None` for anything else.
fn parse_version(text: &str) -> Option<Version> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// The `rust-version` of the `[workspace.package]` table of a workspace manifest, as written.
fn declared_rust_version(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
            continue;
        }
        if !in_package {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim() == "rust-version" {
            return Some(value.trim().trim_matches('"').to_string());
        }
    }
    None
}

/// The highest `rust_version` among the dependencies in `cargo metadata --format-version 1`
/// output (packages from a registry or git; path packages, the workspace's own, are skipped),
/// with the id (`name@version`) of one that declares it; `None` when none declares one.
fn highest_package_rust_version(metadata: &str) -> Option<(Version, String)> {
    const KEY: &str = "\"rust_version\":\"";
    const ID: &str = "\"id\":\"";
    let mut best: Option<(Version, String)> = None;
    let mut rest = metadata;
    let mut offset = 0;
    while let Some(at) = rest.find(KEY) {
        let start = offset + at + KEY.len();
        let end = start + metadata[start..].find('"')?;
        let version = parse_version(&metadata[start..end]);
        // The package's "id" comes before its "rust_version" in the package object.
        let id = metadata[..start].rfind(ID).map_or("", |i| {
            let id = &metadata[i + ID.len()..];
            &id[..id.find('"').unwrap_or(id.len())]
        });
        if let Some(version) = version
            && !id.starts_with("path+")
            && best.as_ref().is_none_or(|(b, _)| version > *b)
        {
            let name = id.rsplit_once('#').map_or(id, |(_, tail)| tail);
            best = Some((version, name.to_string()));
        }
        offset = end;
        rest = &metadata[end..];
    }
    best
}

/// `cargo xtask msrv` (and a step of `ci`): see the module docs.
pub fn msrv() -> TaskResult {
    let fail = |reason: String| Failure {
        step: "msrv".to_string(),
        reason,
    };
    let manifest = std::fs::read_to_string(root().join("Cargo.toml"))
        .map_err(|e| fail(format!("cannot read Cargo.toml: {e}")))?;
    let declared_text = declared_rust_version(&manifest)
        .ok_or_else(|| fail("no rust-version in [workspace.package]".into()))?;
    let declared = parse_version(&declared_text)
        .ok_or_else(|| fail(format!("rust-version {declared_text:?} is not a version")))?;

    eprintln!("\n==> [msrv] declared rust-version {declared_text}; cargo metadata --locked");
    let mut metadata = cargo();
    metadata.args(["metadata", "--format-version", "1", "--locked"]);
    let output = metadata
        .output()
        .map_err(|e| fail(format!("could not start cargo metadata: {e}")))?;
    if !output.status.success() {
        return Err(fail(format!(
            "cargo metadata failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let metadata = String::from_utf8_lossy(&output.stdout);
    if let Some(((major, minor, patch), id)) = highest_package_rust_version(&metadata) {
        if (major, minor, patch) > declared {
            return Err(fail(format!(
                "{id} needs Rust {major}.{minor}.{patch}, above the declared rust-version \
                 {declared_text}: raise it in Cargo.toml"
            )));
        }
        eprintln!(
            "==> [msrv] ok: the highest rust-version of a dependency is {major}.{minor}.{patch} \
             ({id})"
        );
    }

    let toolchain = declared_text.as_str();
    // Only an installed toolchain: `rustup run` could otherwise download one.
    let installed = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if let Some(name) = installed_toolchain(&installed, toolchain) {
        let mut check = Command::new("rustup");
        check
            .current_dir(root())
            .args(["run", &name, "cargo", "check", "--workspace"])
            .args(["--all-targets", "--locked"])
            .env("CARGO_TARGET_DIR", target_dir().join("msrv"));
        run(&format!("msrv: cargo +{name} check"), check)?;
    } else {
        eprintln!(
            "==> [msrv] toolchain {toolchain} not installed: `cargo +{toolchain} check` SKIPPED \
             (clippy's incompatible_msrv still checks std items in non-test code against it; \
             `rustup toolchain install {toolchain}` to run it)"
        );
    }
    Ok(())
}

/// The name of an installed toolchain for `version` (`1.88` matches `1.88-<host>`,
/// `1.88.0-<host>`, `1.88.1-<host>`) in `rustup toolchain list` output.
fn installed_toolchain(list: &str, version: &str) -> Option<String> {
    list.lines()
        .filter_map(|line| line.split_whitespace().next())
        .find(|name| {
            name.strip_prefix(version)
                .is_some_and(|rest| rest.starts_with('-') || rest.starts_with('.'))
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::{
        declared_rust_version, highest_package_rust_version, installed_toolchain, parse_version,
    };

    #[test]
    fn finds_an_installed_toolchain_of_the_version() {
        let list = "stable-x86_64-unknown-linux-gnu (default)\n1.88.0-x86_64-unknown-linux-gnu\n\
                    1.880-x86_64-unknown-linux-gnu\n";
        assert_eq!(
            installed_toolchain(list, "1.88").as_deref(),
            Some("1.88.0-x86_64-unknown-linux-gnu")
        );
        assert_eq!(installed_toolchain(list, "1.87"), None);
        assert_eq!(installed_toolchain("", "1.88"), None);
    }

    #[test]
    fn versions_parse_with_or_without_a_patch() {
        assert_eq!(parse_version("1.88"), Some((1, 88, 0)));
        assert_eq!(parse_version("1.88.0"), Some((1, 88, 0)));
        assert_eq!(parse_version(" 1.9.3 "), Some((1, 9, 3)));
        assert!(parse_version("1.9.3") < parse_version("1.88"));
        assert_eq!(parse_version("1"), None);
        assert_eq!(parse_version("1.88.0.1"), None);
        assert_eq!(parse_version("1.x"), None);
    }

    #[test]
    fn reads_the_workspace_package_rust_version_only() {
        let manifest = "[package]\nrust-version = \"1.70\"\n\n[workspace.package]\nversion = \
                        \"0.1.0\"\nrust-version = \"1.88\"\n[workspace.dependencies]\n";
        assert_eq!(declared_rust_version(manifest).as_deref(), Some("1.88"));
        assert_eq!(
            declared_rust_version("[package]\nrust-version = \"1.70\"\n"),
            None
        );
    }

    #[test]
    fn finds_the_highest_package_rust_version() {
        let metadata = r#"{"packages":[
{"name":"a","version":"1.0.0","id":"registry+https://x#a@1.0.0","targets":[{"name":"a"}],"rust_version":"1.85"},
{"name":"b","version":"0.9.1","id":"registry+https://x#libloading@0.9.1","rust_version":"1.88.0"},
{"name":"c","version":"2.0.0","id":"path+file:///w/c#2.0.0","rust_version":null},
{"name":"ours","version":"0.1.0","id":"path+file:///w/ours#0.1.0","rust_version":"1.95"},
{"name":"d","version":"1.0.0","id":"registry+https://x#d@1.0.0","rust_version":"1.9"}
],"resolve":{"nodes":[{"id":"registry+https://x#a@1.0.0"}]}}"#;
        assert_eq!(
            highest_package_rust_version(metadata),
            Some(((1, 88, 0), "libloading@0.9.1".to_string()))
        );
        assert_eq!(highest_package_rust_version(r#"{"packages":[]}"#), None);
    }
}

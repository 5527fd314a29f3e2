//! Running one named step (a child process) and reporting how it ended.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Why a task stopped: the step that failed and what happened.
#[derive(Debug)]
pub struct Failure {
    /// The step's name as printed in the log (e.g. `clippy`).
    pub step: String,
    /// What went wrong (exit status, or the reason the command could not start).
    pub reason: String,
}

/// The result of a task.
pub type TaskResult = Result<(), Failure>;

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The `cargo` that invoked us (as cargo sets `$CARGO`), else `cargo` from PATH.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Runs `cmd` as the step `name`, echoing the command line and the wall time.
pub fn run(name: &str, mut cmd: Command) -> TaskResult {
    eprintln!("\n==> [{name}] {}", describe(&cmd));
    let start = Instant::now();
    let status = cmd.status().map_err(|e| Failure {
        step: name.to_string(),
        reason: format!("could not start {:?}: {e}", cmd.get_program()),
    })?;
    let secs = start.elapsed().as_secs_f64();
    if status.success() {
        eprintln!("==> [{name}] ok in {secs:.1} s");
        Ok(())
    } else {
        Err(Failure {
            step: name.to_string(),
            reason: format!("{status} after {secs:.1} s"),
        })
    }
}

/// Whether `program --version` runs (used to detect optional tools such as nextest).
pub fn tool_available(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn describe(cmd: &Command) -> String {
    let envs: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v?.to_str()?)))
        .collect();
    let mut words = envs;
    words.push(
        Path::new(cmd.get_program())
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

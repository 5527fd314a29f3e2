//! Finding and running torch-oracle: PyTorch's real caching allocator on a fake CUDA runtime
//! (`../shared/torch-oracle`, built per torch version into `~/.cache/torch-oracle/<version>/`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use c10_cuda::rules::TorchVersion;

use crate::script::Script;
use crate::trace::{Line, LineError, parse_output};

/// Why the oracle could not answer.
#[derive(Debug, thiserror::Error)]
pub enum OracleError {
    /// The binary for this version is not built.
    #[error("torch-oracle for torch {release} is not set up: {binary} is missing. {}", setup_hint(.release))]
    Missing {
        /// The release (`2.15.0`).
        release: String,
        /// Where the binary was looked for.
        binary: PathBuf,
    },
    /// It could not be started or read.
    #[error("running {binary}: {source}")]
    Io {
        /// The binary.
        binary: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// It exited with an error (the allocator refused the configuration, or crashed).
    #[error("torch-oracle exited with {status}: {stderr}")]
    Failed {
        /// The exit status.
        status: String,
        /// The end of its stderr.
        stderr: String,
    },
    /// Its output could not be read.
    #[error(transparent)]
    Output(#[from] LineError),
}

/// How to set the oracle up, for the error message of [`OracleError::Missing`].
pub fn setup_hint(release: &str) -> String {
    format!(
        "Set it up with `../shared/torch-oracle/setup.sh {release}` (it needs python3 with pip, \
         gcc, g++ and access to PyPI; see ../shared/torch-oracle/README.md), or point \
         TORCH_ORACLE_CACHE at a cache that has it"
    )
}

/// The cache folder: `$TORCH_ORACLE_CACHE`, else `~/.cache/torch-oracle`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TORCH_ORACLE_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    Path::new(&home).join(".cache").join("torch-oracle")
}

/// How long one oracle run may take (a few hundred ops take milliseconds).
const ORACLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// One built oracle.
#[derive(Clone, Debug)]
pub struct Oracle {
    /// The rules it checks.
    pub version: TorchVersion,
    /// The `torch-oracle` binary.
    pub binary: PathBuf,
}

impl Oracle {
    /// The oracle for `version` (its checked release), if it is built.
    ///
    /// # Errors
    /// [`OracleError::Missing`], with how to set it up.
    pub fn find(version: TorchVersion) -> Result<Oracle, OracleError> {
        let release = version.checked_release();
        let binary = cache_dir().join(release).join("bin").join("torch-oracle");
        if binary.is_file() {
            Ok(Oracle { version, binary })
        } else {
            Err(OracleError::Missing {
                release: release.to_owned(),
                binary,
            })
        }
    }

    /// Runs `script` and returns its output lines (device calls included, full stats).
    ///
    /// The script's `env` lines are put in the process environment (so the oracle does not
    /// re-execute itself to apply them); inherited `PYTORCH_CUDA_ALLOC_CONF` and `FAKECUDA_*`
    /// variables are removed.
    ///
    /// # Errors
    /// [`OracleError`] when it cannot run, fails, or prints something unreadable.
    pub fn run(&self, script: &Script) -> Result<Vec<Line>, OracleError> {
        let text = self.run_text(script)?;
        Ok(parse_output(&text)?)
    }

    /// As [`Oracle::run`], the raw output.
    ///
    /// # Errors
    /// As [`Oracle::run`].
    pub fn run_text(&self, script: &Script) -> Result<String, OracleError> {
        let io = |source| OracleError::Io {
            binary: self.binary.clone(),
            source,
        };
        let mut cmd = Command::new(&self.binary);
        cmd.args(["--full-stats", "-"]);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k == "PYTORCH_CUDA_ALLOC_CONF" || k.starts_with("FAKECUDA_") {
                cmd.env_remove(k.as_ref());
            }
        }
        for (k, v) in &script.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(io)?;
        let body = script.to_string();
        {
            let mut stdin = child.stdin.take().expect("stdin was piped");
            stdin.write_all(body.as_bytes()).map_err(io)?;
        }
        // Read both pipes on threads and wait with a deadline: a script can make the real
        // allocator spin forever (seen once in 4000 random scripts with private pools).
        let mut stdout = child.stdout.take().expect("stdout was piped");
        let mut stderr = child.stderr.take().expect("stderr was piped");
        let out_reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut stdout, &mut v).map(|_| v)
        });
        let err_reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut stderr, &mut v).map(|_| v)
        });
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().map_err(io)? {
                break status;
            }
            if start.elapsed() > ORACLE_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(OracleError::Failed {
                    status: format!("timed out after {} s (killed)", ORACLE_TIMEOUT.as_secs()),
                    stderr: String::new(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        let joined = |h: std::thread::JoinHandle<std::io::Result<Vec<u8>>>| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("pipe reader panicked")))
        };
        let out = std::process::Output {
            status,
            stdout: joined(out_reader).map_err(io)?,
            stderr: joined(err_reader).map_err(io)?,
        };
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: String = err
                .lines()
                .filter(|l| !l.contains("GpuFabricInfo"))
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ");
            return Err(OracleError::Failed {
                status: out.status.to_string(),
                stderr: tail,
            });
        }
        String::from_utf8(out.stdout).map_err(|e| {
            io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.to_string(),
            ))
        })
    }
}

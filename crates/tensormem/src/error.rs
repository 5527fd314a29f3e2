//! The library's one error type for whole commands (replay, advise, explain): each message is
//! the line the CLI prints after `tensormem: error: `, and what the Python module raises.

use thiserror::Error;

use crate::load::LoadError;
use crate::replay::ReplayError;

/// Why a command could not run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The snapshot could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The replay could not run.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// An option's value is invalid; `option` is spelled as on the command line
    /// (`--device-memory`), and the Python module uses the same words.
    #[error("{option}: {message}")]
    Option {
        /// The option, e.g. `--alloc-conf`.
        option: &'static str,
        /// What is wrong with its value.
        message: String,
    },
    /// `--device` names a device the snapshot has no trace for.
    #[error("--device {device}: the snapshot has traces for {count} device(s)")]
    NoSuchDevice {
        /// The device asked for.
        device: usize,
        /// Devices with traces.
        count: usize,
    },
    /// The snapshot holds no history, and the request needs one.
    #[error("{what}: {file} holds state only (no memory history to replay)")]
    NeedsHistory {
        /// What needed it (an option such as `--sweep`, or a command such as `advise`).
        what: &'static str,
        /// The snapshot's name.
        file: String,
    },
    /// Writing an output file failed.
    #[error("{option} {path}: {message}")]
    Output {
        /// The option that named the file.
        option: &'static str,
        /// The path given.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// An invalid value for `option`.
    pub fn option(option: &'static str, message: impl std::fmt::Display) -> Error {
        Error::Option {
            option,
            message: message.to_string(),
        }
    }
}

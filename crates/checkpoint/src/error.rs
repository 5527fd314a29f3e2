//! The runtime's error enum (the log parser has its own, [`crate::log::LogError`]).

use crate::graph::{StorageId, TensorId};

/// What can go wrong in the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The hard budget cannot fit an allocation and nothing evictable is left (simrd's
    /// `MemoryError`; status OOM).
    #[error(
        "out of memory under the DTR budget: {requested} bytes requested with {used} of {budget} bytes in use and nothing evictable left"
    )]
    OutOfMemory {
        /// Bytes the operator needs (its fresh outputs).
        requested: u64,
        /// Bytes in use when the search gave up.
        used: u64,
        /// The budget, in bytes.
        budget: u64,
    },
    /// Rematerialization cost passed the limit (simrd's `RematExceededError`; status THRASH).
    #[error("thrashing: rematerialization took {remat_ns} ns, over the limit of {limit_ns} ns")]
    Thrashing {
        /// Rematerialization compute so far, in ns.
        remat_ns: u64,
        /// The limit, in ns.
        limit_ns: u64,
    },
    /// A tensor id this runtime never handed out.
    #[error("unknown tensor {0}")]
    UnknownTensor(TensorId),
    /// An alias output names an input index the call does not have.
    #[error("output {output} aliases input {index}, but the call has {args} inputs")]
    BadAlias {
        /// The output's position.
        output: usize,
        /// The input index it names.
        index: usize,
        /// The number of inputs.
        args: usize,
    },
    /// A call without outputs (nothing to rematerialize).
    #[error("a call must have at least one output")]
    NoOutputs,
    /// A reference count would go below zero, or a tensor without references was used.
    #[error("tensor {0} has no external reference left")]
    NoReference(TensorId),
    /// In-place update of a tensor whose storage other live tensors share (the prototype
    /// refuses it: copy-on-write would silently detach the views).
    #[error(
        "cannot mutate tensor {tensor}: its storage {storage} has {live_aliases} other live alias(es)"
    )]
    AliasedMutation {
        /// The tensor to mutate.
        tensor: TensorId,
        /// Its storage.
        storage: StorageId,
        /// Other tensors of the storage with external references.
        live_aliases: usize,
    },
    /// The tensor's storage was banished (freed for good), so it cannot be recomputed.
    #[error("tensor {0} was banished and cannot be rematerialized")]
    Banished(TensorId),
    /// The backend (allocator, device, operator) failed.
    #[error("backend: {0}")]
    Backend(#[source] BoxError),
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed error from a [`crate::Backend`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

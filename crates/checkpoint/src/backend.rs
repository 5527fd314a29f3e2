//! The driver interface: what the runtime core asks of whoever owns the real (or simulated)
//! storages and operators.
//!
//! The core decides *what* to compute, evict and free; a [`Backend`] does it. The simulated
//! driver ([`crate::sim`]) runs logged costs and allocates nothing ([`NullBackend`]) or routes
//! every storage through the caching allocator ([`crate::allocator_backend`]); the live driver
//! ([`crate::live_backend`], over `aten` tensors) keeps one rematerializer closure per [`OpId`]
//! and one tensor per [`TensorId`], and frees a storage's bytes when the core evicts it.

use crate::error::BoxError;
use crate::graph::{OpId, StorageId, TensorId};

/// One operator run the core asks for.
#[derive(Clone, Copy, Debug)]
pub struct RunRequest<'a> {
    /// The call.
    pub op: OpId,
    /// Its inputs, all defined and locked.
    pub args: &'a [TensorId],
    /// All its outputs, in order (a rematerialization recomputes every output).
    pub outputs: &'a [TensorId],
    /// The storage of each output (a view's is its base's).
    pub output_storages: &'a [StorageId],
    /// Outputs that were already in memory: the run computes them again and the backend
    /// discards the copies (simrd's "double-computed ephemeral tensors").
    pub duplicates: &'a [TensorId],
    /// Bytes of the duplicates (held only during the run).
    pub duplicate_bytes: u64,
    /// Whether this is a rematerialization (false for the program's own call).
    pub remat: bool,
    /// The cost the core knows for the call, in ns (the logged TIME; 0 before a live op first
    /// ran).
    pub known_cost: u64,
}

/// What a driver provides to the runtime core. Errors are boxed into
/// [`crate::Error::Backend`].
pub trait Backend {
    /// Gives `storage` its `bytes` (called after the budget made room, before the run that
    /// fills it).
    ///
    /// # Errors
    /// Whatever the backend's allocation can fail with.
    fn allocate(&mut self, storage: StorageId, bytes: u64) -> Result<(), BoxError>;

    /// Takes `storage`'s bytes back (eviction, eager eviction or banishing).
    ///
    /// # Errors
    /// Whatever the backend's free can fail with.
    fn free(&mut self, storage: StorageId, bytes: u64) -> Result<(), BoxError>;

    /// Runs the call and returns its cost in ns (measured for live ops, the logged TIME in
    /// simulation). The clock advances by this cost.
    ///
    /// # Errors
    /// Whatever running the operator can fail with.
    fn run(&mut self, request: RunRequest<'_>) -> Result<u64, BoxError>;

    /// Bytes in use as the backend's allocator counts them (PyTorch's
    /// `allocated_bytes.all.current`, what the prototype budgets), or `None` to let the core
    /// count storage bytes itself (the simulator's accounting). When `Some`, the hard budget
    /// applies to this figure.
    fn allocated_bytes(&self) -> Option<u64> {
        None
    }

    /// Bytes an allocation of `bytes` will add to [`Backend::allocated_bytes`] (the
    /// allocator's rounding); the identity by default.
    fn charged_bytes(&self, bytes: u64) -> u64 {
        bytes
    }
}

/// A backend that owns nothing and returns each call's known cost: the paper's simulator
/// (memory is the core's own count of bytes).
#[derive(Clone, Copy, Debug, Default)]
pub struct NullBackend;

impl Backend for NullBackend {
    #[inline]
    fn allocate(&mut self, _storage: StorageId, _bytes: u64) -> Result<(), BoxError> {
        Ok(())
    }

    #[inline]
    fn free(&mut self, _storage: StorageId, _bytes: u64) -> Result<(), BoxError> {
        Ok(())
    }

    #[inline]
    fn run(&mut self, request: RunRequest<'_>) -> Result<u64, BoxError> {
        Ok(request.known_cost)
    }
}

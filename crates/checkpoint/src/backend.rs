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

/// One allocation under a device-memory budget ([`Backend::try_allocate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// The storage to give bytes.
    pub storage: StorageId,
    /// Its bytes.
    pub bytes: u64,
    /// The compute of its operator, ns (what rematerializing it costs; a placement hint).
    pub compute_ns: u64,
}

/// Whether [`Backend::try_allocate`] gave the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocOutcome {
    /// Allocated.
    Done,
    /// The device could not serve it without growing past its capacity: the core makes room
    /// ([`Backend::plan_room`] or its heuristic) and asks again.
    Miss,
}

/// What [`Backend::make_room_by_moving`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Blocks copied.
    pub blocks: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Allocator blocks looked at.
    pub scanned: u64,
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

    /// The capacity of the device whose memory is the budget, bytes, or `None` when the
    /// backend has no device-memory budget (the core then counts bytes against
    /// [`crate::Config::budget`]). With `Some`, allocations go through
    /// [`Backend::try_allocate`] and a miss makes the core evict.
    fn device_capacity(&self) -> Option<u64> {
        None
    }

    /// Gives a storage its bytes if the device can without growing past its capacity
    /// (the caching allocator's `try_malloc`). The default allocates and never misses.
    ///
    /// # Errors
    /// Whatever the backend's allocation can fail with, other than a miss.
    fn try_allocate(&mut self, request: AllocRequest) -> Result<AllocOutcome, BoxError> {
        self.allocate(request.storage, request.bytes)
            .map(|()| AllocOutcome::Done)
    }

    /// After a miss: the storages whose freeing lets the missed request through at the least
    /// total cost, appended to `out` (nothing when no plan exists or the backend cannot
    /// plan). `cost(s)` is the cost of evicting storage `s`, or `None` when it cannot be
    /// evicted; a plan making `x` bytes more available than the request needs is credited
    /// `byte_credit · x` ([`c10_cuda::RoomOptions::byte_credit`]). With `whole_segment`, a
    /// small-pool request is planned at the size of the segment the allocator would create
    /// for it (its `alloc_size`, PyTorch's 2 MiB small segment; [`whole_segment`]). Returns the
    /// number of blocks looked at.
    ///
    /// # Errors
    /// Whatever the backend's planning can fail with.
    fn plan_room(
        &mut self,
        cost: &dyn Fn(StorageId) -> Option<f64>,
        byte_credit: f64,
        whole_segment: bool,
        out: &mut Vec<StorageId>,
    ) -> Result<u64, BoxError> {
        let _ = (cost, byte_credit, whole_segment, out);
        Ok(0)
    }

    /// Before [`Backend::plan_room`]: the bytes of the large-pool request known to follow the
    /// missed one (a replayed log's next request before its next release; 0: none known).
    /// The next large-pool plan is then also made for both requests at once and taken when it
    /// costs no more than the missed request's own plan plus the plan the next request alone
    /// would need now ([`crate::Strategy::WindowMoveAhead`]). The default ignores it.
    fn look_ahead(&mut self, bytes: u64) {
        let _ = bytes;
    }

    /// After a miss: copies live blocks elsewhere so that the freed addresses let the missed
    /// request through (`move_plan.rs`), instead of evicting. `movable(s)` says whether
    /// storage `s`'s block may move. Returns `None` when no such plan exists or the backend
    /// cannot move; otherwise the moves are done (each storage holds its new block) and the
    /// result says how many blocks and bytes were copied and how many blocks were looked at.
    /// With `new_segments` a copy that no cached block holds may take a new segment from the
    /// device's free bytes (the core asks so only when nothing is left to evict).
    ///
    /// # Errors
    /// Whatever the backend's allocation or free can fail with.
    fn make_room_by_moving(
        &mut self,
        movable: &dyn Fn(StorageId) -> bool,
        new_segments: bool,
    ) -> Result<Option<Moved>, BoxError> {
        let _ = (movable, new_segments);
        Ok(None)
    }

    /// After [`Backend::plan_room`]: copies those of the plan's `victims` for which
    /// `worth(s)` holds elsewhere, outside what the plan vacates, where the allocator's best
    /// fit can put them (`move_plan.rs`), and removes them from `victims` (the others are
    /// to be evicted). The default moves nothing.
    ///
    /// # Errors
    /// Whatever the backend's allocation or free can fail with.
    fn move_out(
        &mut self,
        victims: &mut Vec<StorageId>,
        worth: &dyn Fn(StorageId) -> bool,
    ) -> Result<Moved, BoxError> {
        let _ = (victims, worth);
        Ok(Moved::default())
    }

    /// Hands `from`'s bytes to `to` without copying (an in-place update that keeps the
    /// address); `from` must be evicted right after. Returns false when the backend cannot
    /// (the core then allocates `to` as usual).
    ///
    /// # Errors
    /// Whatever the backend can fail with.
    fn transfer(&mut self, from: StorageId, to: StorageId) -> Result<bool, BoxError> {
        let _ = (from, to);
        Ok(false)
    }

    /// Under a device budget: bytes held for the next [`Backend::run`] only (recomputed
    /// copies of outputs already in memory), freed by [`Backend::free_scratch`].
    ///
    /// # Errors
    /// As [`Backend::try_allocate`].
    fn try_allocate_scratch(&mut self, bytes: u64) -> Result<AllocOutcome, BoxError> {
        let _ = bytes;
        Ok(AllocOutcome::Done)
    }

    /// Frees what [`Backend::try_allocate_scratch`] took.
    ///
    /// # Errors
    /// As [`Backend::free`].
    fn free_scratch(&mut self) -> Result<(), BoxError> {
        Ok(())
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

/// `miss` as [`Backend::plan_room`] plans it with `whole_segment`: a small-pool request asks for
/// the room of the whole segment the allocator would create for it (`alloc_size`, 2 MiB), so
/// that the plan frees (or empties) a small segment once and the next small requests are served
/// from it, instead of a window of the request's size that the next small request misses
/// again. Large-pool requests are unchanged.
pub fn whole_segment(mut miss: c10_cuda::Miss) -> c10_cuda::Miss {
    if miss.request.pool == c10_cuda::Pool::Small {
        miss.request.size = miss.request.size.max(miss.request.alloc_size);
    }
    miss
}

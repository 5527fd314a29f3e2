//! Profiling counters (the prototype's base/remat compute and search time, simrd's telemetry
//! summary).

/// What a runtime has done so far. Times are ns; compute times are the operators' costs
/// (measured or logged), search time is wall-clock time spent choosing victims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// Compute of the program's own calls, ns (simrd's `model_compute`, the prototype's base
    /// compute time).
    pub base_compute_ns: u64,
    /// Compute spent rematerializing, ns (simrd's `remat_compute`).
    pub remat_compute_ns: u64,
    /// Wall-clock time spent in the eviction search, ns (the prototype's search time).
    pub search_ns: u64,
    /// Storages evicted by the heuristic under budget pressure.
    pub evictions: u64,
    /// Storages evicted because their last reference died (eager eviction).
    pub eager_evictions: u64,
    /// Storages freed for good (banishing).
    pub banished: u64,
    /// Calls rerun to rematerialize a tensor.
    pub remats: u64,
    /// Heuristic evaluations (simrd's `heuristic_eval_count`).
    pub evaluations: u64,
    /// Highest memory in bytes, duplicates of a running call included (simrd's `max_memory`).
    pub peak_bytes: u64,
    /// Bytes of constants created.
    pub constant_bytes: u64,
    /// Allocations the device could not serve at first (device-memory budget), each answered
    /// by evictions.
    pub misses: u64,
    /// Allocator blocks looked at by the window plans (device-memory budget).
    pub scanned_blocks: u64,
    /// In-place updates that kept their storage's address (device-memory budget).
    pub in_place: u64,
    /// Live blocks copied elsewhere to make room instead of evicting (device-memory budget,
    /// the moving strategies).
    pub moves: u64,
    /// Bytes those copies moved.
    pub moved_bytes: u64,
    /// Time charged for the copies, ns (on the clock, and counted with the
    /// rematerialization compute against the thrashing limit).
    pub move_ns: u64,
}

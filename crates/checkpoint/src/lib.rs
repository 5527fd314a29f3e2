//! Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021) under a HARD memory budget.
//!
//! One runtime core ([`Runtime`]) generic over a [`Backend`] that owns storages and runs
//! operators, used by two drivers:
//! - simulated ([`sim`]): the paper's operator logs ([`log`]), costs from `TIME`, sizes from
//!   `MEMORY`, with simrd's conventions (runtime "V2 eager optimized"), optionally routing every
//!   storage through c10-cuda's caching allocator ([`allocator_backend`]) to report reserved
//!   bytes and fragmentation;
//! - live ([`live`], over `aten` tensors on a caching-allocator device): one rematerializer
//!   closure per [`OpId`] ([`live_backend`]), costs measured per op (or declared), sizes from
//!   shape inference ([`live_ops`]), the budget on the allocator's own allocated bytes, and a
//!   debug check that every recomputed value is bit-identical to its first computation.
//!
//! Storages (alias pools) are the unit of eviction; multi-output calls rematerialize together;
//! constants and pinned storages are never evicted; inputs of the running call are locked; a
//! storage whose last reference dies is evicted at once (or banished); in-place updates are
//! copy-on-write. The budget is hard: [`Runtime::make_room`] evicts before every allocation
//! until it fits. Heuristics ([`Heuristic`]): h_DTR with exact e*, h_DTR^eq (union-find),
//! h_DTR^local, LRU, largest-first, MSPS, random; optional sqrt(n) sampling and small-tensor
//! filter. [`sweep`] runs the paper's budget sweeps.
//!
//! A device-memory budget ([`device_budget`]) makes the budget a device's capacity instead:
//! nothing is counted, storages are allocated with the caching allocator's `try_malloc`, and a
//! miss makes the core evict ([`Strategy`]: the heuristic's choice, or the allocator's cheapest
//! window over blocks tagged with their storages, Coop's sliding window, optionally copying
//! live blocks out of the way instead of evicting them), simulated
//! ([`AllocatorBackend::on_device`]) and live ([`live::LiveConfig::device_budget`]).
//!
//! ```
//! use checkpoint::{Config, Heuristic, NullBackend, OpSpec, OutputSpec, Runtime};
//!
//! let mut rt = Runtime::new(NullBackend, Config {
//!     budget: Some(300),
//!     heuristic: Heuristic::DtrEq,
//!     ..Config::default()
//! });
//! let x = rt.checkpoint(100)?; // an input: pinned, never evicted
//! let mut h = x;
//! for _ in 0..4 {
//!     // a chain of 100-byte activations, 10 ns each
//!     h = rt
//!         .compute(OpSpec { cost: 10, args: &[h], outputs: &[OutputSpec::fresh(100)] })?
//!         .get(0);
//! }
//! assert!(rt.profile().peak_bytes <= 300); // the budget is hard
//! assert!(rt.eviction_count() > 0);
//! # Ok::<(), checkpoint::Error>(())
//! ```

pub mod allocator_backend;
pub mod api;
pub mod backend;
pub mod budget;
pub mod device_budget;
pub mod error;
mod estar;
pub mod graph;
pub mod heuristic;
pub mod live;
pub mod live_backend;
pub mod live_ops;
pub mod log;
pub mod log_writer;
mod move_plan;
pub mod profile;
pub mod runtime;
pub mod sim;
pub mod sweep;
pub mod union_find;

pub use allocator_backend::{AllocatorBackend, AllocatorReport};
pub use backend::{AllocOutcome, AllocRequest, Backend, Moved, NullBackend, RunRequest};
pub use budget::budget_for_ratio;
pub use device_budget::Strategy;
pub use error::{BoxError, Error, Result};
pub use graph::{OpId, StorageId, StorageState, TensorId};
pub use heuristic::Heuristic;
pub use log::{Log, LogError};
pub use log_writer::LogWriter;
pub use profile::Profile;
pub use runtime::{Config, OpSpec, OutputSpec, Outputs, ReleasePolicy, Runtime};
pub use sim::{Baseline, RunResult, SimOptions, Status};

/// `a, b or c`: names joined for a help text or an error message.
pub(crate) fn names_sentence<const N: usize>(names: [&str; N]) -> String {
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

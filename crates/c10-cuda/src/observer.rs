//! Callbacks that watch the allocator: out-of-memory observers (PyTorch's
//! `attachOutOfMemoryObserver`) and allocator trace trackers (`attachAllocatorTraceTracker`).
//!
//! Both are attached to the thread-safe front ([`crate::CachingAllocator::attach_out_of_memory_observer`],
//! [`crate::CachingAllocator::attach_allocator_trace_tracker`]); a trace tracker can also be
//! attached to one [`crate::DeviceCachingAllocator`].

use std::sync::Arc;

use crate::oom::OutOfMemoryError;

/// What an out-of-memory observer is told: the arguments PyTorch passes to an
/// `OutOfMemoryObserver` (`device, alloc, device_total, device_free`), plus the request.
///
/// Checked against PyTorch 2.7.1 and 2.15.0 (the torch-oracle): `alloc` is the size of the
/// device allocation the allocator tried (the request rounded up to a segment size), not the
/// request; `device_total` is the per-process memory fraction's limit when one is set.
///
/// `#[non_exhaustive]`: made by the allocator ([`OomObservation::from_error`]); more figures
/// may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct OomObservation {
    /// Device index.
    pub device: u8,
    /// Bytes of the segment the allocator tried to get (PyTorch's `alloc_size`:
    /// [`crate::sizes::get_allocation_size`] of the rounded request: 2 MiB for requests up to
    /// 1 MiB, 20 MiB below 10 MiB, else the request rounded up to 2 MiB).
    pub alloc: u64,
    /// Bytes the allocator may use: the `set_per_process_memory_fraction` limit
    /// (`allowed_memory_maximum`) when one is set, else the device's total memory.
    pub device_total: u64,
    /// The device's free bytes (`cudaMemGetInfo`) when the allocation failed.
    pub device_free: u64,
    /// Bytes the caller asked for (not passed by PyTorch; it is in its error message).
    pub requested: u64,
}

impl OomObservation {
    /// The observation PyTorch would pass for `error`.
    pub fn from_error(error: &OutOfMemoryError) -> Self {
        OomObservation {
            device: error.device,
            alloc: error.segment_size,
            device_total: error.allowed.unwrap_or(error.device_total),
            device_free: error.device_free,
            requested: error.requested,
        }
    }
}

/// A function called when an allocation fails for lack of memory (PyTorch's
/// `OutOfMemoryObserver`, attached by `torch._C._cuda_attach_out_of_memory_observer`).
///
/// It runs on the allocating thread, after the failure is recorded (the `oom` trace entry,
/// `num_ooms`) and before the error is returned, with no allocator lock held: like PyTorch,
/// which releases the device lock first ("observers might need to hold the GIL"), it may call
/// back into the allocator, e.g. to take a snapshot, as PyTorch's memory docs show.
pub type OutOfMemoryObserver = Arc<dyn Fn(&OomObservation) + Send + Sync>;

pub use crate::history::TraceTracker;

//! PyTorch's pinned host caching allocator (`CachingHostAllocatorImpl`, torch 2.15) over a
//! page-locked memory trait: [`host_allocator`] (power-of-two buckets, event-gated reuse,
//! `empty_cache`, [`HostStats`] / `host_memory_stats()`, the background event thread, the c10-core
//! `Allocator` view) and [`pinned_memory`] (the [`PinnedMemory`] backend trait and
//! [`SimPinnedMemory`], host memory with the simulated device's events). The CUDA backend,
//! `CudaPinnedMemory`, is in `c10-cuda-driver`.
//!
//! Until the crate split these modules were `c10_cuda::host_allocator` and
//! `c10_cuda::pinned_memory`; their contents are unchanged.
//!
//! ```
//! use c10_cuda::SimDevice;
//! use c10_host_alloc::{CachingHostAllocator, HostAllocatorConfig, SimPinnedMemory};
//!
//! let pinned = SimPinnedMemory::new(SimDevice::host_backed(0, 1 << 30));
//! let host = CachingHostAllocator::new(pinned, HostAllocatorConfig::default());
//! let ptr = host.malloc(1000)?; // rounded up to a power of two
//! assert_eq!(host.block_size(ptr), Some(1024));
//! host.free(ptr)?; // no stream used it: cached at once, not given back
//! assert_eq!(host.cached_blocks(), 1);
//! host.empty_cache();
//! assert_eq!(host.cached_blocks(), 0);
//! # Ok::<(), c10_host_alloc::HostAllocatorError>(())
//! ```

pub mod host_allocator;
pub mod pinned_memory;

pub use host_allocator::*;
pub use pinned_memory::{PinnedMemory, SimPinnedMemory};

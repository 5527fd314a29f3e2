//! PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`) in Rust, over a
//! device-memory trait.
//!
//! The algorithm ([`DeviceCachingAllocator`]) reproduces PyTorch's decisions exactly: rounding
//! to 512 bytes (or `roundup_power2_divisions`), a small pool (blocks up to 1 MiB, 2 MiB
//! segments) and a large pool (20 MiB segments, or the request rounded to 2 MiB from 10 MiB),
//! best fit on `(stream, size, address)` (torch 2.15: the oldest segment first among equal
//! sizes; [`rules`] picks the PyTorch version), splitting and merging, oversize blocks
//! (`max_split_size`), the out-of-memory retry chain, `record_stream` with events, `empty_cache`,
//! garbage collection under a memory fraction, expandable segments, and private memory pools
//! ([`private_pool`]: `torch.cuda.MemPool`, `beginAllocateToPool`). It never touches a
//! device itself: everything goes through [`device::DeviceMemory`], implemented here by
//! [`sim::SimDevice`] (simulated, address-only or host-backed). [`DeviceBuffer`] is the RAII
//! handle of one block.
//!
//! Around it: [`CachingAllocator`], the thread-safe multi-device front with free-memory
//! callbacks, out-of-memory observers and trace trackers ([`observer`]) and c10-core's
//! `Allocator`; [`config::AllocatorConfig`] (PYTORCH_CUDA_ALLOC_CONF);
//! [`stats::DeviceStats`] with `memory_stats()`'s keys (123 under torch 2.15's rules, 122 under 2.7's); [`summary::memory_summary`];
//! [`snapshot`] and [`history`] in PyTorch's snapshot format, with the call sites of
//! allocations and frees ([`call_site`]); [`oom::OutOfMemoryError`].
//!
//! This crate has no CUDA dependency. The rest of PyTorch's CUDA memory layer lives in crates
//! above it:
//!
//! | crate | what |
//! |---|---|
//! | `c10-cuda-driver` | `CudaDevice` on cudarc's driver API, the runtime probe, cudarc interop views of a [`DeviceBuffer`], `CudaPinnedMemory`, the CUDA IPC backend (the only crate that names cudarc) |
//! | `c10-cuda-ipc` | sharing blocks with other processes (PyTorch's `shareIpcHandle` / `getIpcDevPtr`, the reference counters, `ipc_collect`), the simulated device's IPC backend; it uses [`share_range`] and [`shared_memory`] from here |
//! | `c10-host-alloc` | PyTorch's pinned host caching allocator and its backends' trait, with the simulated backend |
//!
//! For owners that make room themselves (a rematerializing runtime under a device-memory
//! budget): [`CappedDevice`] limits any device to a number of bytes;
//! [`DeviceCachingAllocator::try_malloc`] reports a [`Miss`] instead of raising out of memory;
//! [`DeviceCachingAllocator::segments`] shows every segment's blocks in address order with an
//! owner tag ([`DeviceCachingAllocator::set_block_tag`]); [`DeviceCachingAllocator::plan_room`]
//! finds the cheapest blocks to free for a miss (Coop's sliding window, whole segments,
//! expandable pages); [`Placement::High`] hands out the top of a split block.
//!
//! ```
//! use c10_cuda::config::AllocatorConfig;
//! use c10_cuda::device::StreamId;
//! use c10_cuda::{DeviceCachingAllocator, SimDevice};
//!
//! let device = SimDevice::address_only(0, 8 << 30); // an 8 GiB simulated GPU
//! let mut alloc = DeviceCachingAllocator::new(device, AllocatorConfig::default())?;
//! let a = alloc.malloc(1000, StreamId::DEFAULT)?; // rounded to 1024 bytes, small pool
//! assert_eq!(a.size, 1024);
//! alloc.free(a.ptr)?; // cached, not returned to the device
//! let stats = alloc.stats().memory_stats();
//! assert_eq!(stats["reserved_bytes.all.current"], 2 << 20); // one 2 MiB small segment
//! assert_eq!(stats["allocated_bytes.all.current"], 0);
//! alloc.empty_cache()?;
//! assert_eq!(alloc.reserved_bytes(), 0);
//! # Ok::<(), c10_cuda::Error>(())
//! ```
mod accounting;
mod address_space;
pub mod allocator;
mod block;
mod block_store;
pub mod buffer;
pub mod call_site;
pub mod capped;
pub mod config;
pub mod device;
pub mod error;
mod events;
mod expandable;
mod expandable_segment;
mod free_index;
pub mod front;
mod hash_order;
pub mod history;
mod host_memory;
pub mod import;
mod invariants;
pub mod mem_pool;
pub mod observer;
pub mod oom;
pub mod placement;
mod pool_table;
mod pool_types;
pub mod private_pool;
mod ptr_map;
mod reconfigure;
mod release;
pub mod room;
pub mod rules;
pub mod segment_view;
pub mod share_range;
#[cfg(target_os = "linux")]
pub mod shared_memory;
pub mod sim;
pub mod sizes;
pub mod snapshot;
#[cfg(feature = "pickle")]
pub mod snapshot_pickle;
pub mod stats;
pub mod summary;
pub mod thread_cache;
pub mod try_malloc;

pub use allocator::{Allocation, CacheInfo, DeviceCachingAllocator};
pub use buffer::DeviceBuffer;
pub use capped::CappedDevice;
pub use error::{Error, Result};
pub use front::{CachingAllocator, DeviceAllocator, FreeMemoryCallback};
pub use history::RecordContext;
pub use mem_pool::{MemPool, PoolGuard};
pub use observer::{OomObservation, OutOfMemoryObserver, TraceTracker};
pub use placement::Placement;
pub use private_pool::{MempoolId, PoolError, PoolInfo, StreamFilter};
pub use room::{RoomCost, RoomKind, RoomOptions, RoomPlan};
pub use rules::{Fixes, Rules, TorchVersion};
pub use segment_view::{BlockState, BlockView, Pool, SegmentView};
pub use share_range::ShareRange;
pub use sim::{SimDevice, SimMode};
pub use try_malloc::{MallocOutcome, Miss, Request};

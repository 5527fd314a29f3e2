//! PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`) in Rust.
#![allow(missing_docs)]
mod address_space;
pub mod allocator;
mod block;
pub mod config;
pub mod cuda;
pub mod device;
pub mod error;
mod expandable;
pub mod front;
pub mod history;
mod host_memory;
pub mod import;
mod invariants;
pub mod oom;
mod release;
pub mod sim;
pub mod sizes;
pub mod snapshot;
pub mod stats;
pub mod summary;

pub use allocator::{Allocation, CacheInfo, DeviceCachingAllocator};
pub use error::{Error, Result};
pub use front::{CachingAllocator, DeviceAllocator, FreeMemoryCallback};
pub use sim::{SimDevice, SimMode};

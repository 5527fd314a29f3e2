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
pub mod history;
mod host_memory;
pub mod import;
pub mod oom;
mod release;
pub mod sim;
pub mod sizes;
pub mod snapshot;
pub mod stats;
pub mod summary;

pub use allocator::{Allocation, CacheInfo, DeviceCachingAllocator};
pub use error::{Error, Result};
